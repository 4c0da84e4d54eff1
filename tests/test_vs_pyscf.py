"""Live comparison with PySCF's DF-MP2 on molecules of inputs/: same SCF object, same RI basis."""

from __future__ import annotations

import pytest
from pyscf import df, scf

import dfmp2
from dfmp2.molecule import build_mole

from conftest import INPUTS, pyscf_dfmp2
from tolerances import TOL_FP64, TOL_IDENTITY

MOLECULES = ["water", "ammonia", "methane", "water4", "benzene"]


def _scf(name: str, scf_type: str):
    mol = build_mole(INPUTS / f"{name}.xyz", basis="cc-pvdz")
    mf = scf.RHF(mol)
    if scf_type == "df":
        mf = mf.density_fit(auxbasis=df.make_auxbasis(mol))
    mf.conv_tol = 1e-10
    mf.verbose = 0
    mf.kernel()
    assert mf.converged
    return mf


@pytest.fixture(scope="module", params=[(m, s) for m in MOLECULES for s in ("conv", "df")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def scf_object(request):
    return _scf(*request.param)


@pytest.mark.parametrize("frozen_core", [False, True], ids=["all-electron", "frozen-core"])
def test_matches_pyscf(scf_object, frozen_core):
    from pyscf.data.elements import chemcore

    ref = pyscf_dfmp2(scf_object, "cc-pvdz-ri", frozen=chemcore(scf_object.mol) if frozen_core
                      else None)
    pt = dfmp2.DFMP2(scf_object, frozen_core=frozen_core, backend="pytorch").run()
    assert set(pt.result.method.auxbasis.values()) == {"cc-pvdz-ri"}  # resolved per element
    assert pt.e_corr_os == pytest.approx(ref.e_corr_os, abs=TOL_FP64)
    assert pt.e_corr_ss == pytest.approx(ref.e_corr_ss, abs=TOL_FP64)
    assert pt.e_corr == pytest.approx(ref.e_corr, abs=TOL_FP64)
    assert pt.e_tot == pytest.approx(ref.e_tot, abs=TOL_FP64)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_tiny_blocks_and_unfused_agree(fused):
    """Many aux blocks, fit blocks and occupied blocks give the same energy as PySCF."""
    mf = _scf("water4", "df")
    ref = pyscf_dfmp2(mf, "cc-pvdz-ri")
    # 8 MB leaves room for only a few occupied orbitals per pair block with B resident
    pt = dfmp2.DFMP2(mf, max_memory=8, fused_energy=fused, backend="pytorch").run()
    assert pt.result.method.blocks["occ_block"] < pt.result.sizes.nocc
    assert pt.e_corr == pytest.approx(ref.e_corr, abs=TOL_FP64)


def test_dfmp2_class_exposes_pyscf_names():
    mf = _scf("water", "conv")
    pt = dfmp2.DFMP2(mf, frozen=1, auxbasis="cc-pvdz-ri")
    e_corr, t2 = pt.kernel()
    assert t2 is None and e_corr == pt.e_corr == pt.emp2
    assert pt.e_tot == pytest.approx(mf.e_tot + pt.e_corr, abs=TOL_IDENTITY)
    assert pt.e_corr == pytest.approx(pt.e_corr_os + pt.e_corr_ss, abs=TOL_IDENTITY)
    assert pt.result.sizes.nfrozen == 1
