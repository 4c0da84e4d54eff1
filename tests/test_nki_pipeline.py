"""The whole DF-MP2 through NKI kernel source on dfmp2's emulator, and the dispatch policy with
the real host wrappers (no real `nki` here: it is absent, so only the emulator can run)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from pyscf import scf

import dfmp2
from dfmp2.cli import main
from dfmp2.errors import BackendUnavailableError, InputError
from dfmp2.linalg import Dispatcher, DispatchPolicy
from dfmp2.molecule import build_mole

from conftest import INPUTS
from tolerances import TOL_FP32

pytestmark = pytest.mark.nki_emulated
#: Ops an NKI run computes on the device; the metric (cholesky, trsm) stays on the host in fp64.
NKI_OPS = ("gemm", "trmm", "mp2_pair_sums")
HOST_METRIC_OPS = ("cholesky", "trsm")


@pytest.fixture(scope="module", params=["water", "benzene"])
def scf_and_reference(request):
    mf = scf.RHF(build_mole(INPUTS / f"{request.param}.xyz")).density_fit()
    mf.conv_tol = 1e-10
    mf.verbose = 0
    mf.kernel()
    return mf, dfmp2.DFMP2(mf, backend="pytorch").run()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_nki_emulated_energy_matches_pytorch(scf_and_reference, fused):
    mf, ref = scf_and_reference
    pt = dfmp2.DFMP2(mf, backend="nki", nki_emulator=True, require_nki=fused,  # unfused: a
                     fused_energy=fused).run()                             # host reduction
    backend = pt.result.backend
    assert backend.resolved == "nki" and backend.nki_mode == "emulator"
    ops = backend.ops
    expected = ("gemm", "trmm", "mp2_pair_sums" if fused else "gemm")
    for op in expected:  # well-conditioned RI metrics: transform and fit on the device
        assert (ops[op]["backend"], ops[op]["mode"], ops[op]["fallback"]) == (
            "nki", "emulator", None), (op, ops[op])
    for op in HOST_METRIC_OPS:
        assert (ops[op]["mode"], ops[op]["host_calls"]) == ("host", ops[op]["calls"]), ops[op]
        assert "metric stage" in ops[op]["host_reason"]
    assert ("pair_sums_from_ovov" in ops) is (not fused)
    assert pt.e_corr_os == pytest.approx(ref.e_corr_os, abs=TOL_FP32)
    assert pt.e_corr_ss == pytest.approx(ref.e_corr_ss, abs=TOL_FP32)
    assert pt.e_corr == pytest.approx(ref.e_corr, abs=TOL_FP32)
    assert pt.e_corr != ref.e_corr  # fp32 on the device: not bit-identical to fp64


def test_cli_nki_emulator_records_modes_in_json(tmp_path):
    out = tmp_path / "w.json"
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"), "--backend", "nki",
                                       "--nki-emulator", "-v", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "backend nki [emulator]" in result.stdout
    backend = json.loads(out.read_text())["extras"]["backend"]
    assert backend["nki_mode"] == "emulator"
    modes = {op: backend["ops"][op]["mode"] for op in NKI_OPS}
    # the DF-SCF's J/K (gemm; its fit, trmm) run on the host in fp64, the MP2 stages on NKI
    assert modes == {"gemm": "host+emulator", "trmm": "host+emulator",
                     "mp2_pair_sums": "emulator"}
    for op in ("gemm", "trmm"):
        assert "DF-SCF fit, J and float64 K on the host" in backend["ops"][op]["host_reason"]


def test_cli_env_var_opts_into_the_emulator():
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"), "--backend", "nki", "-q"],
                                env={"DFMP2_NKI_EMULATOR": "1"})
    assert result.exit_code == 0, result.output


def test_explicit_nki_without_nki_names_the_extra_and_the_index():
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"), "--backend", "nki"])
    assert result.exit_code == 1
    message = result.stderr.strip()
    assert "dfmp2[nki]" in message and "pip.repos.neuron.amazonaws.com" in message
    assert "--nki-emulator" in message


def test_auto_without_opt_in_uses_pytorch_and_records_why():
    la = Dispatcher(DispatchPolicy("auto"))
    assert la.backend == "pytorch" and "nki" in la.resolution


def test_require_nki_env_var_turns_missing_nki_into_an_error():
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz")],
                                env={"DFMP2_REQUIRE_NKI": "1"})
    assert result.exit_code == 1 and "cannot run" in result.stderr


def test_simulator_request_without_real_nki_is_an_error():
    with pytest.raises(BackendUnavailableError, match="nki"):
        Dispatcher(DispatchPolicy("nki", nki_simulator=True))


def test_emulator_is_never_importable_as_nki_by_default():
    import importlib.util
    import sys

    Dispatcher(DispatchPolicy("pytorch"))
    assert "nki" not in sys.modules or getattr(sys.modules["nki"], "__dfmp2_emulator__", False)
    if "nki" not in sys.modules:
        assert importlib.util.find_spec("nki") is None


def _h2_lattice(nx, ny, nz, spacing=3.0, bond=0.74):
    """Atoms of nx*ny*nz H2 molecules (bond along z) on a cubic grid ``spacing`` Angstrom apart."""
    atoms = []
    for x in range(nx):
        for y in range(ny):
            for z in range(nz):
                for dz in (-bond / 2, bond / 2):
                    atoms.append(("H", (x * spacing, y * spacing, z * spacing + dz)))
    return atoms


def test_nvir_above_600_runs_on_the_emulator_without_fallback():
    """The Trainium issue's size check: 72 H2 molecules in cc-pVDZ (720 basis functions, 648
    virtuals, cc-pVDZ-RI naux 2016) with all but the two highest occupied orbitals frozen, every
    MP2 stage under require_nki on the emulator (the pair kernel at nvir > 600), within TOL_FP32
    of the fp64 PyTorch run on the same SCF. (Alkane chains of that size have RI metrics with
    condition numbers above TRANSFORM_HOST_CONDITION, so require_nki refuses them by design; a
    molecular cluster's metric is far better conditioned.) The SCF is converged loosely: both
    MP2 runs use its orbitals, and only their difference is tested."""
    from pyscf import gto

    from dfmp2.linalg import Dispatcher, DispatchPolicy
    from dfmp2.options import Options
    from dfmp2.scf import run_scf

    mol = gto.M(atom=_h2_lattice(3, 4, 6), basis="cc-pvdz", verbose=0)
    mf = run_scf(mol, Options(conv_tol=1e-7, conv_tol_grad=1e-3, scf_auxbasis="cc-pvdz-ri",
                              max_memory=8000), la=Dispatcher(DispatchPolicy("pytorch")))
    frozen = mol.nelectron // 2 - 2
    ref = dfmp2.DFMP2(mf, frozen=frozen, backend="pytorch").run()
    pt = dfmp2.DFMP2(mf, frozen=frozen, backend="nki", nki_emulator=True,
                     require_nki=True).run()
    assert pt.result.sizes.nvir > 600 and pt.result.sizes.nocc == 2
    ops = pt.result.backend.ops
    for op in ("gemm", "trmm", "mp2_pair_sums"):
        assert (ops[op]["backend"], ops[op]["mode"], ops[op]["fallback"], ops[op]["host_calls"]
                ) == ("nki", "emulator", None, 0), (op, ops[op])
    assert pt.e_corr == pytest.approx(ref.e_corr, abs=TOL_FP32)
    assert pt.e_corr != ref.e_corr


def test_bf16x3_pair_products_stay_within_the_fp32_budget(tmp_path):
    """--nki-matmul bf16x3: the pair kernels' three-bfloat16 products, recorded in the result,
    within TOL_FP32 of fp64 (the ladder in benchmarks/results/nki-precision-*.md measures more)."""
    out = tmp_path / "w.json"
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"), "--backend", "nki",
                                       "--nki-emulator", "--require-nki", "--nki-matmul",
                                       "bf16x3", "-v", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "pair-kernel products bf16x3" in result.stdout
    record = json.loads(out.read_text())
    assert record["extras"]["backend"]["nki_matmul"] == "bf16x3"
    ref = dfmp2.run(str(INPUTS / "water.xyz"), backend="pytorch")
    assert record["properties"]["mp2_correlation_energy"] == pytest.approx(ref.e_corr,
                                                                           abs=TOL_FP32)


def test_an_unknown_nki_matmul_is_refused_in_one_line():
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"), "--nki-matmul", "tf32"])
    assert result.exit_code == 2 and "tf32" in result.output
    with pytest.raises(dfmp2.errors.InputError, match="nki_matmul"):
        dfmp2.Options(nki_matmul="tf32")
    contradiction = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"), "--backend",
                                              "pytorch", "--nki-matmul", "bf16x3"])
    lines = contradiction.stderr.strip().splitlines()
    assert contradiction.exit_code == 1 and len(lines) == 1 and "contradicts" in lines[0]


@pytest.mark.parametrize("outcore", [False, True], ids=["in-core", "out-of-core"])
def test_b_stays_on_the_device_for_the_pair_stage(tmp_path, outcore):
    """The run's device record: B placed on the device once (in emulator mode only when it is
    in memory: the emulated device's memory is the host's), the pair work split over trn2's two
    programs, the fit's and transform's reused operands released after their stages; the energy
    within the fp32 budget either way."""
    from dfmp2.linalg import nki_ops

    out = tmp_path / "b.json"
    extra = ["--force-outcore"] if outcore else []
    result = CliRunner().invoke(main, ["run", str(INPUTS / "benzene.xyz"), "--backend", "nki",
                                       "--nki-emulator", "--require-nki", "-v", "--json",
                                       str(out), *extra])
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text())
    device = record["extras"]["backend"]["nki_device"]
    sizes = record["extras"]["sizes"]
    assert (device["target"], device["lnc"]) == ("trn2", 2)
    if outcore:  # emulated device memory is host memory: B out of core is not placed there
        assert record["extras"]["method"]["blocks"]["storage"] == "hdf5"
        assert device["b_placement"].startswith("uploaded per launch: B is out of core")
    else:
        assert device["b_placement"] == "device"
    b_bytes = nki_ops.resident_b_bytes(sizes["nocc"], sizes["nvir"], sizes["naux_fit"])
    # what stays kept at the end: B when placed (the fit's and transform's operands released)
    assert device["resident_bytes"] == (0 if outcore else b_bytes)
    pairs = sum(device["program_pairs"])
    assert pairs >= sizes["npairs"] and min(device["program_pairs"]) > 0
    assert device["programs"] > device["launches"]  # kernel[2] launches
    assert "NKI device trn2 (LNC=2" in result.stdout
    assert ("B uploaded per launch" if outcore else "B device") in result.stdout
    ref = dfmp2.run(str(INPUTS / "benzene.xyz"), backend="pytorch")
    assert record["properties"]["mp2_correlation_energy"] == pytest.approx(ref.e_corr,
                                                                           abs=TOL_FP32)


def test_nki_target_option_sets_the_device(tmp_path):
    """``--nki-target trn1`` on the (default trn2) emulator: one program per launch, launches
    over trn1's two cores, recorded as given by the option; a bad target is one line."""
    out = tmp_path / "t.json"
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"), "--backend", "nki",
                                       "--nki-emulator", "--require-nki", "--nki-target",
                                       "trn1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    device = json.loads(out.read_text())["extras"]["backend"]["nki_device"]
    assert (device["target"], device["lnc"], device["cores"]) == ("trn1", 1, 2)
    assert device["target_source"] == "option"
    assert device["programs"] == device["launches"]
    bad = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"), "--nki-target", "trn3"])
    assert bad.exit_code == 2 and "trn3" in bad.output
    with pytest.raises(InputError, match="nki_target"):
        dfmp2.run(str(INPUTS / "water.xyz"), nki_target="inf2")


def test_b_over_the_device_budget_is_uploaded_per_launch(monkeypatch):
    from dfmp2.linalg import nki_runtime

    monkeypatch.setattr(nki_runtime, "RESIDENT_FRACTION", 1e-9)
    run = dfmp2.run(str(INPUTS / "water.xyz"), backend="nki", nki_emulator=True,
                    require_nki=True)
    device = run.backend.nki_device
    assert device["b_placement"].startswith("uploaded per launch: B takes")
    assert device["resident_bytes"] == 0
    ref = dfmp2.run(str(INPUTS / "water.xyz"), backend="pytorch")
    assert run.e_corr == pytest.approx(ref.e_corr, abs=TOL_FP32)
    # the host ran the SCF's products: the summary names its BLAS, but no host pair reduction
    verbose = run.summary(verbose=True)
    assert f"CPU products through {run.backend.cpu_blas['choice']} (" in verbose
    assert "pair-energy reduction" not in verbose


def test_the_pair_stage_record_says_where_it_ran(monkeypatch):
    """Planned on NKI, the pair stage is recorded on the host where it ran there: every pair's
    energy kept (a host op), or the fused kernel's shape refused under --backend auto."""
    from dfmp2.linalg import nki_ops

    water = str(INPUTS / "water.xyz")
    table = dfmp2.run(water, basis="sto-3g", backend="nki", nki_emulator=True,
                      pair_energies=True)
    assert table.method.stage_precision["pair_energy"]["placement"] == "host fp64"
    assert "precision fp64 (its NKI stages in fp32: below)" in table.summary(verbose=True)
    monkeypatch.setitem(nki_ops.SUPPORTS, "mp2_pair_sums",
                        lambda *args, **kwargs: "refused in this test")
    fell = dfmp2.run(water, basis="sto-3g", backend="auto", nki_emulator=True)
    assert fell.backend.ops["mp2_pair_sums"]["fallback"].endswith("refused in this test")
    stage = fell.method.stage_precision["pair_energy"]
    assert stage["placement"] == "host fp64" and "for every block" in stage["reason"]


@pytest.mark.parametrize("options, message", [
    ({"nki_matmul": "bf16x3", "fused_energy": False}, "which --no-fused-energy does not run"),
    ({"nki_matmul": "bf16x3", "pair_energies": True}, "which --pair-energies does not run"),
    ({"require_nki": True, "pair_energies": True}, "--pair-energies keeps every pair's energy"),
    ({"require_nki": True, "fused_energy": False},  # its reduction ran on the host, accepted
     "--no-fused-energy reduces the pair integrals by a host op, which --require-nki forbids"),
])
def test_nki_settings_that_would_not_apply_are_refused(options, message):
    with pytest.raises(InputError, match=message):
        dfmp2.run(str(INPUTS / "water.xyz"), backend="nki", nki_emulator=True, **options)
