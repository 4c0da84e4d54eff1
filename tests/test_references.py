"""Pinned literals from references.md (closed shells): Psi4, QCEngine standard suite, PySCF."""

from __future__ import annotations

import pytest
from pyscf import gto

import dfmp2

from tolerances import TOL_8DP, TOL_FP64

PSI4_WATER = "O; H 1 1.0; H 1 1.0 2 90.0"
QCDB_WATER = "O; H 1 0.958; H 1 0.958 2 104.5"
PYSCF_WATER = "O 0 0 0; H 0 -0.757 0.587; H 0 0.757 0.587"


def test_psi4_dfmp2_4_water_df_scf():
    r = dfmp2.run(PSI4_WATER, basis="cc-pvdz", scf_type="df")
    assert (r.sizes.nbasis, r.sizes.naux) == (24, 84)
    assert r.e_hf == pytest.approx(-76.0167614256151865, abs=TOL_FP64)
    assert r.e_corr_ss == pytest.approx(-0.0527406422061238, abs=TOL_FP64)
    assert r.e_corr_os == pytest.approx(-0.1562926850310142, abs=TOL_FP64)
    assert r.e_corr == pytest.approx(-0.2090333272371381, abs=TOL_FP64)
    assert r.e_tot == pytest.approx(-76.2257947528523232, abs=TOL_FP64)
    assert r.e_scs == pytest.approx(-0.2051314361059251, abs=TOL_FP64)


@pytest.mark.parametrize("basis, e_scf, e_tot", [
    ("cc-pvdz", -1.11639202566179, -1.1441651458266191),
    ("cc-pvtz", -1.11872756109405, -1.1511940290102121),
])
def test_psi4_dfmp2_2_h2(basis, e_scf, e_tot):
    r = dfmp2.run("H; H 1 0.9", basis=basis)
    assert r.e_hf == pytest.approx(e_scf, abs=TOL_FP64)
    assert r.e_tot == pytest.approx(e_tot, abs=TOL_FP64)


@pytest.mark.parametrize("scf_type, frozen_core, e_scf, e_ss, e_corr", [
    ("conv", False, -76.0413815332, -0.05674808, -0.22188894),
    ("conv", True, -76.0413815332, -0.0558821, -0.21939942),
    ("df", False, -76.04136132628614, -0.05674571, -0.22187976),
])
def test_qcdb_water_aug_cc_pvdz(scf_type, frozen_core, e_scf, e_ss, e_corr):
    r = dfmp2.run(QCDB_WATER, basis="aug-cc-pvdz", scf_type=scf_type, frozen_core=frozen_core)
    assert (r.sizes.nbasis, r.sizes.naux) == (41, 118)
    assert r.sizes.nfrozen == (1 if frozen_core else 0)
    assert r.e_hf == pytest.approx(e_scf, abs=TOL_8DP)
    assert r.e_corr_ss == pytest.approx(e_ss, abs=TOL_8DP)
    assert r.e_corr == pytest.approx(e_corr, abs=TOL_8DP)


@pytest.mark.parametrize("scf_type, frozen, e_corr", [
    ("conv", None, -0.20400482102770082),
    ("conv", [0], -0.20166760413156876),
    ("conv", [0, 1, 5], -0.13844381496025246),  # two occupied and one virtual frozen
    ("df", None, -0.20399004345216082),
])
def test_pyscf_water_values(scf_type, frozen, e_corr):
    r = dfmp2.run(PYSCF_WATER, basis="cc-pvdz", scf_type=scf_type, frozen=frozen)
    assert r.e_corr == pytest.approx(e_corr, abs=TOL_FP64)


@pytest.mark.parametrize("frozen, e_corr, e_tot", [
    (None, -0.280727901936, -78.258178687361),
    (2, -0.274767743344, -78.252218528769),
])
def test_pyscf_ethylene_def2_svp(frozen, e_corr, e_tot):
    mol = gto.M(
        atom="C 0 0 1.266; C 0 0 -1.266; H 0 1.756 2.328; H 0 -1.756 2.328; "
             "H 0 1.756 -2.328; H 0 -1.756 -2.328",
        unit="Bohr", basis="def2-svp", verbose=0,
    )
    r = dfmp2.run(mol, basis="def2-svp", scf_type="conv", frozen=frozen)
    assert r.method.auxbasis_name is None  # the RI default, resolved per element:
    assert r.method.auxbasis == {"C": "def2-svp-ri", "H": "def2-svp-ri"}
    assert r.e_corr == pytest.approx(e_corr, abs=TOL_FP64)
    assert r.e_tot == pytest.approx(e_tot, abs=TOL_FP64)
