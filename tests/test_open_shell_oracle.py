"""The open-shell NumPy oracle against pinned literals, and dfmp2 against the oracle.

Pinned NH2 values (references.md): QCEngine's ``qcengine/programs/tests/standard_suite_ref.py``
(MolSSI/QCEngine a97b46957b8e), system "nh2", aug-cc-pVDZ. Its ``scf_type`` is the SCF's ERIs
("pk" exact, "df" aug-cc-pVDZ-JKFIT), its ``corl_type`` the MP2's ("conv" exact 4-index,
"df" aug-cc-pVDZ-RI). The "conv SCF" values of references.md are pk SCF + DF-MP2; pk + conv
(full precision there) pins the oracle's exact-integral source.
"""

from __future__ import annotations

import numpy as np
import open_shell_oracle as oracle
import pytest
from pyscf import df, gto, scf
from pyscf.mp import dfump2

import dfmp2

from tolerances import TOL_8DP, TOL_COMPONENT_SUM, TOL_FP64, TOL_ORACLE, TOL_SEMICANONICAL

NH2 = "N; H 1 1.008; H 1 1.008 2 105.0"
E_SCF = {("uhf", "pk"): -55.57513805247548, ("rohf", "pk"): -55.570724348574,
         ("uhf", "df"): -55.57512538464817, ("rohf", "df"): -55.57071142443952}
AUX_RI = {"conv": None, "df": "aug-cc-pvdz-ri"}

# (reference, scf_type, corl_type, frozen, singles, ss, os or None, corr, tolerance)
PINNED = [
    ("uhf", "pk", "conv", 0, 0.0, -0.03520162545964887, None, -0.15485993330517828, TOL_FP64),
    ("uhf", "pk", "conv", 1, 0.0, -0.03445360441348938, None, -0.15242755400188052, TOL_FP64),
    ("rohf", "pk", "conv", 0, -0.0028296307982793997, -0.03541709278508698, None,
     -0.15949744108346664, TOL_FP64),
    ("rohf", "pk", "conv", 1, -0.0028059971624814647, -0.03466304269235235, None,
     -0.15702660833165538, TOL_FP64),
    ("uhf", "pk", "df", 0, 0.0, -0.03523329, None, -0.15484736, TOL_8DP),
    ("uhf", "pk", "df", 1, 0.0, -0.03448519, None, -0.15241501, TOL_8DP),
    ("rohf", "pk", "df", 0, -0.00282963, -0.03544835, None, -0.15948289, TOL_8DP),
    ("rohf", "pk", "df", 1, -0.002806, -0.03469422, None, -0.15701209, TOL_8DP),
    ("uhf", "df", "df", 0, 0.0, -0.03523134, -0.11960775, -0.15483909, TOL_8DP),
    ("uhf", "df", "df", 1, 0.0, -0.03448325, -0.11792353, -0.15240678, TOL_8DP),
    ("rohf", "df", "df", 0, -0.00282982, -0.03544639, -0.12119864, -0.15947485, TOL_8DP),
    ("rohf", "df", "df", 1, -0.00280619, -0.03469227, -0.11950562, -0.15700408, TOL_8DP),
]


def _scf(basis: str, reference: str, scf_type: str):
    mol = gto.M(atom=NH2, basis=basis, charge=0, spin=1, verbose=0)
    mf = scf.UHF(mol) if reference == "uhf" else scf.ROHF(mol)
    if scf_type == "df":
        mf = mf.density_fit(auxbasis="aug-cc-pvdz-jkfit")
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-8
    mf.kernel()
    assert mf.converged
    return mf


@pytest.fixture(scope="module")
def nh2_adz():
    """Converged NH2/aug-cc-pVDZ SCFs, built once per (reference, scf_type)."""
    cache = {}

    def get(reference: str, scf_type: str):
        if (reference, scf_type) not in cache:
            cache[reference, scf_type] = _scf("aug-cc-pvdz", reference, scf_type)
        return cache[reference, scf_type]
    return get


@pytest.mark.parametrize("reference, scf_type, corl_type, frozen, singles, ss, os_, corr, tol",
                         PINNED, ids=[f"{p[0]}-{p[1]}+{p[2]}-{'fc' if p[3] else 'ae'}"
                                      for p in PINNED])
def test_oracle_nh2_pinned(nh2_adz, reference, scf_type, corl_type, frozen, singles, ss, os_,
                           corr, tol):
    mf = nh2_adz(reference, scf_type)
    assert mf.e_tot == pytest.approx(E_SCF[reference, scf_type], abs=TOL_FP64)
    energy = oracle.ump2 if reference == "uhf" else oracle.rohf_mbpt2
    e = energy(mf, frozen=frozen, auxbasis=AUX_RI[corl_type])
    assert e["singles"] == pytest.approx(singles, abs=tol)
    assert e["ss"] == pytest.approx(ss, abs=tol)
    assert e["corr"] == pytest.approx(corr, abs=tol)
    if os_ is not None:
        assert e["os"] == pytest.approx(os_, abs=tol)
    assert e["corr"] == pytest.approx(e["singles"] + e["os"] + e["ss"], abs=TOL_COMPONENT_SUM)


@pytest.fixture(scope="module")
def nh2_dz():
    """Converged NH2/cc-pVDZ SCFs with exact integrals: {"uhf": mf, "rohf": mf}."""
    return {ref: _scf("cc-pvdz", ref, "pk") for ref in ("uhf", "rohf")}


def test_semicanonical_blocks_are_diagonal(nh2_dz):
    """Occ-occ and vir-vir blocks of F^a, F^b are diagonal in the semicanonical basis."""
    mf = nh2_dz["rohf"]
    sc = oracle.semicanonicalize(mf)
    dm = np.stack([c[:, :n] @ c[:, :n].T for c, n in zip(sc["coeff"], sc["nocc"])])
    fock = mf.get_hcore() + mf.get_j(mf.mol, dm).sum(axis=0) - mf.get_k(mf.mol, dm)
    assert sc["nocc"] == (5, 4)
    for c, f_ao, eps, n, f_ov in zip(sc["coeff"], fock, sc["mo_energy"], sc["nocc"], sc["f_ov"]):
        f_mo = c.T @ f_ao @ c
        for block in (slice(0, n), slice(n, None)):
            assert np.allclose(f_mo[block, block], np.diag(eps[block]), atol=TOL_SEMICANONICAL)
        assert np.allclose(f_mo[:n, n:], f_ov, atol=TOL_SEMICANONICAL)
        assert np.allclose(c.T @ mf.get_ovlp() @ c, np.eye(c.shape[1]), atol=TOL_SEMICANONICAL)


@pytest.mark.parametrize("frozen", [None, 1])
def test_oracle_uhf_vs_pyscf_dfump2(nh2_dz, frozen):
    """The oracle's textbook fit equals PySCF's DFUMP2 (a valid live reference for UHF only)."""
    mf = nh2_dz["uhf"]
    pt = dfump2.DFUMP2(mf, frozen=frozen)
    pt.with_df = df.DF(mf.mol, auxbasis="cc-pvdz-ri")
    pt.kernel()
    e = oracle.ump2(mf, frozen=frozen or 0, auxbasis="cc-pvdz-ri")
    assert e["corr"] == pytest.approx(pt.e_corr, abs=TOL_ORACLE)
    assert e["os"] == pytest.approx(pt.e_corr_os, abs=TOL_ORACLE)
    assert e["ss"] == pytest.approx(pt.e_corr_ss, abs=TOL_ORACLE)


@pytest.mark.parametrize("frozen", [None, 1])
@pytest.mark.parametrize("reference", ["uhf", "rohf"])
def test_dfmp2_open_shell_vs_oracle(nh2_dz, reference, frozen):
    """dfmp2's PySCF-shaped API against the oracle (DF source, same RI basis); for ROHF the frozen
    core is the lowest semicanonical orbital of each spin."""
    mf = nh2_dz[reference]
    pt = dfmp2.DFMP2(mf, auxbasis="cc-pvdz-ri", frozen=frozen).run()
    energy = oracle.ump2 if reference == "uhf" else oracle.rohf_mbpt2
    e = energy(mf, frozen=frozen or 0, auxbasis="cc-pvdz-ri")
    assert pt.e_singles == pytest.approx(e["singles"], abs=TOL_ORACLE)
    assert pt.e_corr_os == pytest.approx(e["os"], abs=TOL_ORACLE)
    assert pt.e_corr_ss == pytest.approx(e["ss"], abs=TOL_ORACLE)
    assert pt.e_corr == pytest.approx(e["corr"], abs=TOL_ORACLE)
    if reference == "rohf":
        assert e["singles"] < -1e-4  # ROHF-MBPT(2) singles are not dropped
