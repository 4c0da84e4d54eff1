"""``--device``: the MP2 step on a torch device. CI has no GPU, so the device path runs here on
the CPU (the device is torch.device("cpu"), everything else as on CUDA) against the host
pipeline; the tests marked ``gpu`` run the same checks on a real CUDA device when there is
one."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

import dfmp2
from dfmp2 import api
from dfmp2.cli import main
from dfmp2.device import ComputeDevice, plan_device, resolve_device
from dfmp2.errors import BackendUnavailableError, InputError, ResourceError

from conftest import INPUTS
from tolerances import TOL_OUTCORE, TOL_PRECISION

WATER = str(INPUTS / "water.xyz")
WATER4 = str(INPUTS / "water4.xyz")
#: Device budgets (bytes): one that holds B, and one for water (B 64 kB) that holds only pair
#: blocks of two orbitals (the resident plan needs about 155 kB).
ROOMY, TIGHT = 4000 * 2**20, 100_000

CUDA = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="no CUDA device here (torch.cuda.is_available() is False)")


@pytest.fixture
def cpu_as_device(monkeypatch):
    """Runs take the device path with torch.device('cpu') as the device and a budget in MB."""
    def use(budget: int):
        def resolve(requested, backend, distributed=False, memory_mb=None, warn=False):
            return ComputeDevice(requested, torch.device("cpu"),
                                 "test: the device path on the CPU", "cpu", budget)
        monkeypatch.setattr(api, "resolve_device", resolve)
    return use


@pytest.mark.parametrize("kwargs", [
    {}, {"frozen_core": True}, {"charge": 1, "spin": 1}, {"charge": 1, "spin": 1,
                                                        "reference": "rohf"},
    {"fused_energy": False}, {"pair_energies": True},
], ids=["rhf", "frozen-core", "uhf", "rohf", "unfused", "pair-table"])
@pytest.mark.parametrize("budget", [ROOMY, TIGHT], ids=["resident", "streamed"])
def test_device_path_equals_host(cpu_as_device, kwargs, budget):
    host = dfmp2.run(WATER, device="cpu", **kwargs)  # explicit: auto takes a real GPU
    cpu_as_device(budget)
    dev = dfmp2.run(WATER, **kwargs)
    assert abs(dev.e_corr_os - host.e_corr_os) <= TOL_OUTCORE
    assert abs(dev.e_corr_ss - host.e_corr_ss) <= TOL_OUTCORE
    assert abs(dev.e_tot - host.e_tot) <= TOL_OUTCORE
    plan = dev.backend.device["plan"]
    assert plan["b_placement"] == ("device" if budget == ROOMY
                                   else "host, streamed per pair block")
    assert plan["occ_block"] == (dev.sizes.nocc if budget == ROOMY else 2)
    assert ("aux_block" in plan) == (budget == ROOMY)  # streamed: the host plan's blocks ran
    assert dev.method.stage_precision["pair_energy"]["placement"] == "cpu fp64"
    if kwargs.get("pair_energies"):
        assert dev.pair_energies["blocks"].keys() == host.pair_energies["blocks"].keys()


def test_an_ill_conditioned_fit_is_solved_on_the_device_too(cpu_as_device):
    """A fitting set whose metric's condition is above SOLVE_CONDITION (water, even-tempered,
    beta 1.3): the device path solves with the Cholesky factor, as the host does (its explicit
    L^-T was 1.4e-8 Eh from the host's E(corr))."""
    from pyscf import df, gto

    from dfmp2.df import SOLVE_CONDITION

    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    etb = df.aug_etb(mol, beta=1.3)
    host = dfmp2.run(mol, device="cpu", auxbasis=etb)
    assert host.method.metric_condition > SOLVE_CONDITION
    cpu_as_device(ROOMY)
    dev = dfmp2.run(mol, auxbasis=etb)
    assert dev.backend.device["plan"]["b_placement"] == "device"  # fitted there
    assert abs(dev.e_corr - host.e_corr) <= TOL_OUTCORE


def test_force_outcore_keeps_b_in_the_hdf5_file_on_a_device(cpu_as_device, tmp_path):
    """--force-outcore on a device run: B is written to the host's HDF5 file and its pair
    blocks stream to the device, though B would fit there; the records say so."""
    host = dfmp2.run(WATER, device="cpu")
    cpu_as_device(ROOMY)
    dev = dfmp2.run(WATER, force_outcore=True, scratch_dir=str(tmp_path))
    assert abs(dev.e_tot - host.e_tot) <= TOL_OUTCORE
    assert dev.backend.device["plan"]["b_placement"] == "host, streamed per pair block"
    assert dev.method.blocks["storage"] == "hdf5"
    fit = dev.method.stage_precision["fit"]
    assert fit == {"placement": "host fp64",
                   "reason": "--force-outcore: B in the host's HDF5 file, pair blocks streamed"}
    assert not list(tmp_path.iterdir())  # the file is gone after the run


@pytest.mark.parametrize("budget", [240_000, 270_000])
def test_a_transform_block_smaller_than_a_shell(cpu_as_device, budget):
    """Budgets whose transform block is smaller than oxygen's f shell (7 functions): the host
    buffers still hold the whole shells iter_int3c2e yields, and the plan counts them (it
    keeps B on the device only where those fit)."""
    host = dfmp2.run(WATER, device="cpu")
    cpu_as_device(budget)
    dev = dfmp2.run(WATER)
    assert dev.backend.device["plan"]["aux_block"] < 7
    assert abs(dev.e_tot - host.e_tot) <= TOL_OUTCORE


def test_unfused_sums_take_host_weights_for_device_integrals():
    """The unfused reduction gets host weights beside integrals on the device (meta tensors
    stand in for CUDA: a device mismatch raises before any arithmetic)."""
    from dfmp2.linalg import torch_ops

    ovov = torch.empty((2, 3, 2, 3), dtype=torch.float64, device="meta")
    eps = [torch.empty(n, dtype=torch.float64, device="meta") for n in (2, 2, 3, 3)]
    out = torch_ops.pair_sums_from_ovov(ovov, *eps, torch.ones((2, 2), dtype=torch.float64),
                                        True)
    assert out.device.type == "meta"


def test_device_path_in_mixed_precision(cpu_as_device):
    host = dfmp2.run(WATER4)
    cpu_as_device(ROOMY)
    mixed = dfmp2.run(WATER4, precision="mixed")
    assert abs(mixed.e_corr - host.e_corr) <= TOL_PRECISION
    assert (mixed.method.stage_precision["pair_energy"]["placement"]
            == "cpu fp32 products, fp64 sums")
    single = dfmp2.run(WATER4, precision="fp32")
    assert abs(single.e_corr - host.e_corr) <= TOL_PRECISION
    assert single.method.stage_precision["pair_energy"]["placement"] == "cpu fp32"


def test_the_device_plan():
    roomy = plan_device(100, [(20, 80)], 400, 2**30, 8)
    assert roomy.resident and roomy.occ_block == 20 and roomy.fit_occ == 20
    # B and the metric's fit matrix (6.4 MB) stay; one stage's work at a time beside them
    snug = plan_device(100, [(20, 80)], 400, 8 * 2**20, 8)
    assert snug.resident and 1 <= snug.fit_occ < 20 and snug.occ_block < 20
    assert snug.device_bytes <= 0.9 * 8 * 2**20
    # a transform block counts two unpacked blocks (the copy's and the products' buffers)
    kept = 20 * 80 * 400 * 8 + 400 * 400 * 8
    for plan in (roomy, snug):
        assert plan.device_bytes >= kept + plan.aux_block * (2 * 100 * 100
                                                             + 2 * 20 * 100 + 20 * 80) * 8
    tight = plan_device(100, [(20, 80)], 400, 3 * 2**20, 8)
    assert not tight.resident and 1 <= tight.occ_block < 20
    with pytest.raises(ResourceError, match="not even a pair block"):
        plan_device(100, [(20, 80)], 400, 2**16, 8)
    # whole shells of up to 9 functions: a block of aux_block rows may hold 8 more
    single = plan_device(100, [(20, 80)], 400, 16 * 2**20, 8)
    shells = plan_device(100, [(20, 80)], 400, 16 * 2**20, 8, max_shell=9)
    assert shells.resident and shells.aux_block == single.aux_block - 8
    assert shells.device_bytes >= kept + (shells.aux_block + 8) * (
        2 * 100 * 100 + 2 * 20 * 100 + 20 * 80) * 8


def test_resolution_and_refusals():
    auto = resolve_device("auto", "pytorch")
    assert (auto.device is None) == (not torch.cuda.is_available())
    assert resolve_device("cpu", "pytorch").device is None
    assert resolve_device("auto", "nki").device is None
    with pytest.raises(InputError, match="contradicts --backend nki"):
        resolve_device("cuda", "nki")
    with pytest.raises(InputError, match="not supported under torchrun"):
        resolve_device("cuda", "pytorch", distributed=True)
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailableError, match="--device cuda: torch"):
            resolve_device("cuda", "pytorch")


@pytest.mark.parametrize("free_mb, memory_mb, auto_on_gpu", [
    (80_000, None, True), (100, None, False), (80_000, 100, False), (80_000, 1000, True)])
def test_auto_stays_on_the_host_when_the_gpu_is_full(monkeypatch, free_mb, memory_mb,
                                                      auto_on_gpu):
    """A fake CUDA device (torch's queries patched): auto takes it only with at least
    AUTO_MIN_BYTES for the run (free memory, or --device-memory); cuda takes it anyway."""
    from dfmp2 import device as device_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (free_mb * 2**20, 80 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "Fake GPU")
    auto = resolve_device("auto", "pytorch", memory_mb=memory_mb)
    assert (auto.device is not None) == auto_on_gpu
    if not auto_on_gpu:
        assert auto.reason.startswith("auto: CUDA device 0 has ") and "the host runs" in auto.reason
        assert device_module.AUTO_MIN_BYTES == 256 * 2**20
    forced = resolve_device("cuda", "pytorch", memory_mb=memory_mb)
    assert forced.device == torch.device("cuda", 0) and forced.name == "Fake GPU"


def test_device_memory_auto_cannot_apply_is_said_once(monkeypatch):
    """--device-memory with --device auto where no CUDA device runs the MP2 step (none here:
    torch's query patched): one warning, kept in the result, from dfmp2.run (before its SCF)
    and from DFMP2(mf); it was ignored without a word."""
    from pyscf import scf

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(api, "resolve_device", resolve_device)  # not DFMP2_TEST_AUTO_DEVICE's
    said = "--device-memory 100: no CUDA device runs the MP2 step"
    ran = dfmp2.run(WATER, basis="sto-3g", device_memory=100)
    assert [w for w in ran.warnings if said in w] == [ran.warnings[0]]
    assert len(ran.warnings) == 1 and "has no effect" in ran.warnings[0]
    from dfmp2.molecule import build_mole

    mf = scf.RHF(build_mole(WATER, basis="sto-3g")).run(conv_tol=1e-10)
    pt = dfmp2.DFMP2(mf, device_memory=100).run()
    assert sum(said in w for w in pt.result.warnings) == 1
    assert not any(said in w for w in dfmp2.run(WATER, basis="sto-3g").warnings)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cli_device_cuda_without_one_is_one_line():
    cli = CliRunner().invoke(main, ["run", WATER, "--device", "cuda"])
    assert cli.exit_code == 1 and "--device cuda: torch" in cli.output
    assert "Traceback" not in cli.output and len(cli.output.strip().splitlines()) == 1


def test_record_on_the_host(tmp_path):
    out = tmp_path / "w.json"
    cli = CliRunner().invoke(main, ["run", WATER, "--device", "cpu", "--json", str(out), "-v"])
    assert cli.exit_code == 0, cli.output
    record = json.loads(out.read_text())["extras"]["backend"]["device"]
    assert record["requested"] == "cpu" and record["resolved"] == "host"
    assert "device host (" in cli.output


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("kwargs", [{}, {"charge": 1, "spin": 1}, {"device_memory": 1}],
                         ids=["rhf", "uhf", "streamed"])
def test_cuda_equals_host(kwargs):
    host = dfmp2.run(WATER4, device="cpu", **{k: v for k, v in kwargs.items()
                                              if k != "device_memory"})
    dev = dfmp2.run(WATER4, device="cuda", **kwargs)
    assert dev.backend.device["resolved"].startswith("cuda")
    assert dev.backend.ops["mp2_pair_sums"]["mode"] == "cuda"  # the records say where
    assert abs(dev.e_tot - host.e_tot) <= TOL_OUTCORE


def test_device_out_of_memory_is_one_line(cpu_as_device, monkeypatch):
    """Memory the plan did not count (another process on the GPU) ends the run with one line
    naming the device and what to do, not a traceback: through the API and the CLI."""
    from dfmp2 import pipeline

    def out_of_memory(*_args, **_kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")

    monkeypatch.setattr(pipeline, "_device_pair_energies", out_of_memory)
    cpu_as_device(ROOMY)
    with pytest.raises(ResourceError, match=r"^cpu ran out of memory in the MP2 step \(CUDA out "
                       r"of memory. Tried to allocate 2.00 GiB\); give it less with "
                       r"--device-memory MB, or run on the host with --device cpu$"):
        dfmp2.run(WATER)
    result = CliRunner().invoke(main, ["run", WATER])
    assert result.exit_code != 0 and "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and "cpu ran out of memory in the MP2 step" in errors[0]


def test_stage_timer_synchronises_before_reading_the_end():
    """A CUDA run's StageTimer calls its sync (torch.cuda.synchronize) once per stage, after
    the stage's work is queued; the host timer has none."""
    from dfmp2.pipeline import StageTimer

    calls = []
    timer = StageTimer(sync=lambda: calls.append("sync"))
    assert timer.run("fit", lambda: calls.append("work") or 7) == 7
    assert calls == ["work", "sync"] and timer.seconds["fit"] >= 0
    assert StageTimer().sync is None


def test_a_device_run_records_no_host_pair_reduction(cpu_as_device):
    """The compiled host reduction is recorded only where it ran: not on a device run, whose
    pair blocks are reduced by torch's ops there."""
    host = dfmp2.run(WATER, cpu_blas="numpy", device="cpu")  # auto takes a real GPU
    cpu_as_device(ROOMY)
    dev = dfmp2.run(WATER, cpu_blas="numpy")
    assert "pair_reduction" in host.backend.cpu_blas
    assert "pair_reduction" not in dev.backend.cpu_blas


def test_a_run_without_pairs_says_nothing_ran_on_the_device(cpu_as_device):
    cpu_as_device(ROOMY)
    atom = dfmp2.run("He 0 0 0", basis="sto-3g", auxbasis="def2-universal-jkfit")  # no virtuals
    assert atom.e_corr == 0.0 and "plan" not in atom.backend.device
    assert atom.backend.device["reason"].endswith("no pair energies to compute, so nothing ran "
                                                  "there")


def test_the_transforms_host_buffers_count_under_max_memory(cpu_as_device):
    """The device transform's two host staging buffers (pinned on CUDA) take at most half of
    --max-memory's usable bytes: a smaller budget, smaller blocks, the same energy."""
    from dfmp2.blocking import usable_bytes

    cpu_as_device(ROOMY)
    roomy = dfmp2.run(WATER4)
    small = dfmp2.run(WATER4, max_memory=20)
    nao = roomy.sizes.nbasis
    block = small.backend.device["plan"]["aux_block"]
    assert block < roomy.backend.device["plan"]["aux_block"]
    extra = 6  # oxygen's largest cc-pVDZ-RI shell has 7 functions: a block may run 6 over
    assert 2 * (block + extra) * nao * nao * 8 <= usable_bytes(20) / 2
    capped = plan_device(100, [(20, 80)], 400, 2**30, 8, max_shell=7, host_bytes=2**22)
    assert capped.resident and 2 * (capped.aux_block + 6) * 100 * 100 * 8 <= 2**21
    assert abs(small.e_tot - roomy.e_tot) <= TOL_OUTCORE
