"""Out-of-core B (HDF5) against in-core, and the precision options against fp64."""

from __future__ import annotations

import glob
import os

import pytest
from pyscf import scf

import dfmp2
from dfmp2.molecule import build_mole

from conftest import INPUTS
from tolerances import (
    TOL_FP32,
    TOL_FP32_FLOOR,
    TOL_FP32_SUMS_REL,
    TOL_FP64,
    TOL_OUTCORE,
    TOL_PRECISION,
)


@pytest.fixture(scope="module")
def water4_scf():
    mf = scf.RHF(build_mole(INPUTS / "water4.xyz")).density_fit()
    mf.conv_tol = 1e-10
    mf.verbose = 0
    return mf.run()


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("cpu_blas", ["torch", "numpy"])
def test_outcore_equals_incore(water4_scf, tmp_path, fused, cpu_blas):
    incore = dfmp2.DFMP2(water4_scf, backend="pytorch", cpu_blas=cpu_blas).run()
    outcore = dfmp2.DFMP2(water4_scf, backend="pytorch", max_memory=4, fused_energy=fused,
                          cpu_blas=cpu_blas, scratch_dir=str(tmp_path)).run()
    blocks = outcore.result.method.blocks
    assert blocks["storage"] == "hdf5" and blocks["occ_block"] < outcore.result.sizes.nocc
    assert outcore.e_corr_os == pytest.approx(incore.e_corr_os, abs=TOL_OUTCORE)
    assert outcore.e_corr_ss == pytest.approx(incore.e_corr_ss, abs=TOL_OUTCORE)
    assert os.listdir(tmp_path) == []  # the temporary file is gone


@pytest.mark.parametrize("precision, reduction", [("fp64", "compiled single pass"),
                                                  ("mixed", "compiled single pass"),
                                                  ("fp32", "numpy ufuncs")])
def test_the_pair_reduction_that_ran_is_recorded(water4_scf, precision, reduction):
    result = dfmp2.DFMP2(water4_scf, backend="pytorch", cpu_blas="numpy", device="cpu",
                         precision=precision).run().result
    assert result.backend.cpu_blas["pair_reduction"].startswith(reduction)
    assert "pair-energy reduction: " + reduction in result.summary(verbose=True)
    assert "pair-energy reduction" not in result.summary()  # machinery only under -v
    torch_blas = dfmp2.DFMP2(water4_scf, backend="pytorch", cpu_blas="torch").run().result
    assert "pair_reduction" not in torch_blas.backend.cpu_blas


def test_forced_outcore_cleans_up_after_an_error(water4_scf, tmp_path, monkeypatch):
    import dfmp2.pipeline

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(dfmp2.pipeline, "pair_energies", broken)
    with pytest.raises(RuntimeError, match="boom"):
        dfmp2.DFMP2(water4_scf, force_outcore=True, scratch_dir=str(tmp_path)).run()
    assert glob.glob(str(tmp_path / "*")) == []


def test_no_named_file_exists_while_the_run_works(water4_scf, tmp_path, monkeypatch):
    """The HDF5 file is unlinked once open, so a killed process (SIGKILL, the OOM killer)
    leaves nothing in the scratch directory: seen from inside the pair stage, which reads B
    from it."""
    from dfmp2.storage import H5Store

    seen, read_b = [], H5Store.read_b

    def watched(self, i0, i1):
        seen.append(os.listdir(tmp_path))
        return read_b(self, i0, i1)

    monkeypatch.setattr(H5Store, "read_b", watched)
    ooc = dfmp2.DFMP2(water4_scf, force_outcore=True, scratch_dir=str(tmp_path)).run()
    assert ooc.result.method.blocks["storage"] == "hdf5"
    assert seen and all(listing == [] for listing in seen)


def test_the_scf_opens_no_scratch_chkfile(tmp_path, monkeypatch):
    """PySCF's SCF constructor opens a named temporary chkfile in its TMPDIR; dfmp2's SCF
    closes it at once (a killed run left one per run)."""
    from pyscf import lib

    from dfmp2.options import Options
    from dfmp2.scf import make_scf

    monkeypatch.setattr(lib.param, "TMPDIR", str(tmp_path))
    for reference, xc in (("rhf", None), ("uhf", None), ("rohf", None), ("rhf", "B2PLYP")):
        mol = build_mole("O 0 0 0; H 0 0 0.97", basis="sto-3g", charge=-1 if reference ==
                         "rhf" else 0, spin=0 if reference == "rhf" else 1)
        mf = make_scf(mol, Options(reference=reference, xc=xc))
        assert mf.chkfile is None and os.listdir(tmp_path) == []


@pytest.mark.parametrize("precision, tol", [("mixed", TOL_PRECISION), ("fp32", TOL_FP32)])
def test_reduced_precision_error_is_small(water4_scf, precision, tol):
    ref = dfmp2.DFMP2(water4_scf, backend="pytorch").run()
    low = dfmp2.DFMP2(water4_scf, backend="pytorch", precision=precision).run()
    assert low.result.method.precision == precision
    assert low.e_corr == pytest.approx(ref.e_corr, abs=tol)
    assert low.e_corr != ref.e_corr  # it really ran in reduced precision


@pytest.mark.parametrize("kwargs", [{"cpu_blas": "torch"}, {"cpu_blas": "numpy"},
                                    {"fused_energy": False}, {"pair_energies": True}],
                         ids=["torch", "numpy", "unfused", "pair-table"])
def test_fp32_adds_each_pairs_terms_in_float64_on_every_path(water4_scf, kwargs):
    """--precision fp32 forms each pair's terms T^2/D in float32 and adds them up in float64
    on every host path (the torch reduction, the numpy one, the unfused one, the pair table;
    measured 2e-8 to 5e-8 of E(corr) here). The torch reduction's float32 dot over nvir^2
    terms of one sign drifted by 3.6e-6 here and 2.1e-5 on (H2O)8 (past the 1e-5 the summary
    prints to) on the torch and unfused paths, the default where the CPU BLAS is torch's; the
    numpy and pair-table paths stayed within this test before (numpy's float32 dot: 8.6e-8 on
    (H2O)8) and are kept as guards."""
    ref = dfmp2.DFMP2(water4_scf, backend="pytorch").run()
    low = dfmp2.DFMP2(water4_scf, backend="pytorch", precision="fp32", **kwargs).run()
    error = abs(low.e_corr - ref.e_corr) / abs(ref.e_corr)
    assert TOL_FP32_FLOOR < error < TOL_FP32_SUMS_REL  # float32 products, float64 sums


def test_mixed_outcore_stores_fp32(water4_scf, tmp_path):
    ref = dfmp2.DFMP2(water4_scf, precision="mixed").run()
    ooc = dfmp2.DFMP2(water4_scf, precision="mixed", force_outcore=True,
                      scratch_dir=str(tmp_path)).run()
    assert ooc.result.method.blocks["storage"] == "hdf5"
    assert ooc.e_corr == pytest.approx(ref.e_corr, abs=TOL_OUTCORE)


def test_unknown_precision_is_rejected():
    with pytest.raises(dfmp2.InputError, match="precision must be one of fp64, mixed, fp32"):
        dfmp2.Options(precision="fp16")


def test_precision_and_memory_from_the_cli(tmp_path):
    import json

    from click.testing import CliRunner

    from dfmp2.cli import main

    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"), "--precision", "mixed",
                                       "--max-memory", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["extras"]["method"]["precision"] == "mixed"
    assert data["extras"]["method"]["blocks"]["storage"] in ("incore", "hdf5")
    ref = dfmp2.run(INPUTS / "water.xyz")
    assert data["properties"]["mp2_correlation_energy"] == pytest.approx(ref.e_corr,
                                                                         abs=TOL_PRECISION)
    assert TOL_FP64 < TOL_PRECISION
