"""Effective core potentials: attached where PySCF's library has one for the basis, recorded,
and counted by the frozen core; never an all-electron run in a basis made for an ECP."""

from __future__ import annotations

import logging

import pytest
from pyscf import gto, scf
from pyscf.data.elements import chemcore_atm

from dfmp2.errors import InputError
from dfmp2.molecule import build_mole, ecp_record
from dfmp2.reference import frozen_mask

from tolerances import TOL_SCF_PIN

HI = "H 0 0 0; I 0 0 1.609"
#: PySCF 2.14 RHF, HI at 1.609 A. def2-SVP with its ECP (28 core electrons on I); the same
#: basis all-electron (what dfmp2 computed before ECPs were attached); LANL2DZ (46 core).
E_HI_DEF2SVP_ECP = -297.231531663359
E_HI_DEF2SVP_ALL_ELECTRON = -1996.902105556037
E_HI_LANL2DZ = -11.726080142136


def _hf(mol) -> float:
    mf = scf.RHF(mol)
    mf.verbose = 0
    mf.conv_tol = 1e-10
    mf.kernel()
    assert mf.converged
    return mf.e_tot


@pytest.fixture(scope="module")
def hi_def2svp():
    return build_mole(HI, basis="def2-svp")


def test_def2_basis_gets_its_ecp_automatically(hi_def2svp):
    assert ecp_record(hi_def2svp) == {"I": {"name": "def2-svp", "core_electrons": 28}}
    assert hi_def2svp.nelectron == 1 + 53 - 28
    assert abs(_hf(hi_def2svp) - E_HI_DEF2SVP_ECP) < TOL_SCF_PIN


def test_ecp_none_runs_all_electron(caplog):
    with caplog.at_level(logging.WARNING, logger="dfmp2.molecule"):
        mol = build_mole(HI, basis="def2-svp", ecp="none")
    assert ecp_record(mol) == {} and mol.nelectron == 54
    text = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "ecp='none': the I atoms run all-electron in def2-svp, a basis made for" in text
    assert abs(_hf(mol) - E_HI_DEF2SVP_ALL_ELECTRON) < TOL_SCF_PIN


def test_named_ecp_basis_lanl2dz():
    mol = build_mole(HI, basis="lanl2dz")
    assert ecp_record(mol) == {"I": {"name": "lanl2dz", "core_electrons": 46}}
    assert abs(_hf(mol) - E_HI_LANL2DZ) < TOL_SCF_PIN


def test_per_element_basis_dict_gets_the_pp_ecp():
    mol = build_mole(HI, basis={"H": "cc-pvdz", "I": "cc-pvdz-pp"})
    assert ecp_record(mol) == {"I": {"name": "cc-pvdz-pp", "core_electrons": 28}}


def test_a_named_ecp_applies_where_it_has_a_potential():
    mol = build_mole(HI, basis="def2-svp", ecp="lanl2dz")
    assert ecp_record(mol) == {"I": {"name": "lanl2dz", "core_electrons": 46}}
    assert mol.nelectron == 8


def test_light_elements_carry_no_ecp():
    mol = build_mole("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59", basis="def2-svp")
    assert ecp_record(mol) == {} and mol.nelectron == 10


def test_unknown_ecp_name_is_an_input_error():
    with pytest.raises(InputError, match=r"unknown ECP 'no-such-ecp'.*ecp='none'") as info:
        build_mole(HI, basis="def2-svp", ecp="no-such-ecp")
    assert "\n" not in str(info.value)


def test_ecp_without_a_potential_for_the_molecule_is_an_input_error():
    with pytest.raises(InputError, match=r"ECP 'cc-pvdz' has no potential for any element.*H, O"):
        build_mole("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59", ecp="cc-pvdz")


def test_ghost_atoms_carry_no_ecp():
    mol = build_mole(HI + "; @I 0 0 6", basis="def2-svp")
    assert [mol.atom_nelec_core(k) for k in range(3)] == [0, 28, 0]
    assert mol.nelectron == 26 and ecp_record(mol)["I"]["core_electrons"] == 28


def test_frozen_core_counts_only_the_electrons_the_ecp_leaves(hi_def2svp):
    """I's chemical core is 18 orbitals (1s-4p); the def2 ECP replaces 14 of them (28 e)."""
    all_electron = build_mole(HI, basis="def2-svp", ecp="none")
    for mol, nfrozen in ((hi_def2svp, chemcore_atm[53] - 14), (all_electron, chemcore_atm[53])):
        nocc = mol.nelectron // 2
        mo_occ = [2.0] * nocc + [0.0] * (mol.nao_nr() - nocc)
        import numpy as np

        mask = frozen_mask(mol, np.array(mo_occ), frozen_core=True)
        assert np.count_nonzero(~mask) == nfrozen
        assert not mask[:nfrozen].any() and mask[nfrozen:].all()
    assert chemcore_atm[53] - 14 == 4


def test_mole_without_its_library_ecp_warns(caplog):
    given = gto.M(atom=HI, basis="def2-svp", verbose=0)
    with caplog.at_level(logging.WARNING, logger="dfmp2.molecule"):
        mol = build_mole(given)
    assert mol is given and ecp_record(mol) == {}
    text = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "no ECP for I" in text and "ecp='def2-svp'" in text and "ecp='none'" in text


def test_mole_with_its_ecp_does_not_warn(caplog):
    given = gto.M(atom=HI, basis="def2-svp", ecp="def2-svp", verbose=0)
    with caplog.at_level(logging.WARNING, logger="dfmp2.molecule"):
        build_mole(given)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_settings_given_with_a_mole_are_applied_to_a_copy():
    given = gto.M(atom=HI, basis="sto-3g", verbose=0)
    mol = build_mole(given, basis="def2-svp", ecp="def2-svp", charge=1, spin=1)
    assert ecp_record(mol) == {"I": {"name": "def2-svp", "core_electrons": 28}}
    assert (mol.basis, mol.charge, mol.spin, mol.nelectron) == ("def2-svp", 1, 1, 25)
    assert (given.basis, given.charge, given.spin, given.nelectron) == ("sto-3g", 0, 0, 54)
    assert not given.ecp and mol is not given
    none = build_mole(gto.M(atom=HI, basis="def2-svp", ecp="def2-svp", verbose=0), ecp="none")
    assert ecp_record(none) == {} and none.nelectron == 54


def test_pp_basis_gives_light_elements_the_all_electron_set():
    """cc-pVDZ-PP exists for iodine only: hydrogen takes cc-pVDZ (as ORCA and Psi4 do), iodine
    keeps the basis and its ECP, and the records say which element got what."""
    from dfmp2.molecule import basis_record

    mol = build_mole("H 0 0 0; I 0 0 1.609", basis="cc-pvdz-pp")
    assert basis_record(mol) == {"H": "cc-pvdz", "I": "cc-pvdz-pp"}
    assert ecp_record(mol) == {"I": {"name": "cc-pvdz-pp", "core_electrons": 28}}
    assert mol.nelectron == 26


@pytest.mark.parametrize("atoms, basis, ecp, core", [
    ("Ag 0 0 0; H 0 0 1.62", "aug-cc-pvdz-pp", "cc-pvdz-pp", {"Ag": 28}),  # two library files
    ("Ag 0 0 0; H 0 0 1.62", "AUG-CC-PVTZ-PP", "cc-pvtz-pp", {"Ag": 28}),
    (HI, "unc-def2-svp", "def2-svp", {"I": 28}),  # PySCF's uncontracted form
    (HI, "unc-cc-pvdz-pp", "cc-pvdz-pp", {"I": 28}),
    (HI, "ccpvdzpp", "ccpvdzpp", {"I": 28}),  # PySCF's spellings of cc-pVDZ-PP
    (HI, "cc_pvdz_pp", "cc_pvdz_pp", {"I": 28}),
    (HI, "ccecp-cc-pvdz", "ccecp", {"I": 46, "H": 0}),  # a ccECP basis: ccECP on every atom
])
def test_every_spelling_of_a_basis_made_for_an_ecp_gets_the_ecp(atoms, basis, ecp, core):
    """aug-cc-pVXZ-PP (which PySCF reads from two files), unc- forms and ccECP bases ran
    all-electron, silently: AgH in aug-cc-pVDZ-PP gave E(HF) -1198.3 Eh for -146.6."""
    mol = build_mole(atoms, basis=basis)
    record = ecp_record(mol)
    assert {e: r["core_electrons"] for e, r in record.items()} == core
    assert {r["name"] for r in record.values()} == {ecp}
    reference = gto.M(atom=atoms, basis=mol.basis, ecp=ecp, verbose=0)
    assert mol.nelectron == reference.nelectron
    assert mol.nao_nr() == reference.nao_nr()


def test_ecp_none_warns_for_every_spelling_of_a_basis_made_for_one(caplog):
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        build_mole("Ag 0 0 0; H 0 0 1.62", basis="aug-cc-pvdz-pp", ecp="none")
    assert "a basis made for PySCF's cc-pvdz-pp ECP" in caplog.text


def test_a_pp_basis_without_an_element_it_has_an_ecp_for_names_that_basis():
    """PySCF's aug-cc-pVDZ-PP has no iodine: the error names that basis, not the all-electron
    partner the light elements get."""
    with pytest.raises(InputError, match="no functions for element I in aug-cc-pvdz-pp"):
        build_mole(HI, basis="aug-cc-pvdz-pp")


def test_atoms_of_one_element_with_different_ecps_are_recorded_under_their_labels():
    """A Mole with def2-SVP on I1 and LANL2DZ on I2: 28 and 46 core electrons, each recorded
    (the record kept the first count for both); I2's JK-fit set is not a ghost's, and each
    label's set is recorded under it, as its ECP is."""
    from dfmp2.scf import scf_fit_record

    mol = gto.M(atom="I1 0 0 0; I2 0 0 2.67", basis={"I1": "def2-svp", "I2": "lanl2dz"},
                ecp={"I1": "def2-svp", "I2": "lanl2dz"}, verbose=0)
    assert ecp_record(mol) == {"I1": {"name": "def2-svp", "core_electrons": 28},
                               "I2": {"name": "lanl2dz", "core_electrons": 46}}
    mf = scf.RHF(mol).density_fit(auxbasis={"I1": "def2-universal-jkfit",
                                            "I2": "def2-svp-jkfit"})
    assert scf_fit_record(mf) == {"I1": "def2-universal-jkfit", "I2": "def2-svp-jkfit"}


def test_a_missing_element_in_an_uncontracted_basis_names_the_basis_given():
    with pytest.raises(InputError, match="no functions for element I in unc-cc-pvdz$"):
        build_mole(HI, basis="unc-cc-pvdz")  # PySCF's own message says '-cc-pvdz'


@pytest.mark.parametrize("basis", ["def2-TZVPP", "def2-qzvpp", "pob-TZVPP", "ma-def2-SVPP"])
def test_a_basis_name_ending_in_pp_is_no_pseudopotential_set(basis):
    """def2-TZVPP's "PP" is polarisation: each element keeps it (it was cut to def2-TZV)."""
    from dfmp2.molecule import _pp_partner

    assert _pp_partner(basis, ["H", "O"]) == basis


def test_a_mole_with_one_iodine_under_an_ecp_warns_for_the_other(caplog):
    """Per atom: I1 with its ECP and I2 with another, no warning; I2 without one, a warning
    naming iodine (the record is per label when they differ)."""
    both = gto.M(atom="I1 0 0 0; I2 0 0 2.7", basis="def2-svp",
                 ecp={"I1": "def2-svp", "I2": "lanl2dz"}, verbose=0)
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        build_mole(both)
    assert "has no ECP" not in caplog.text
    one = gto.M(atom="I1 0 0 0; I2 0 0 2.7", basis="def2-svp", ecp={"I1": "def2-svp"},
                verbose=0, spin=None)
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        build_mole(one)
    assert "the given Mole has no ECP for I although" in caplog.text


def test_an_iodine_without_the_ecp_its_twin_carries_is_recorded_as_all_electron():
    mol = gto.M(atom="I1 0 0 0; I2 0 0 2.7", basis="def2-svp", ecp={"I1": "def2-svp"},
                verbose=0)
    assert ecp_record(mol) == {"I1": {"name": "def2-svp", "core_electrons": 28},
                               "I2": {"name": "none (all electrons)", "core_electrons": 0}}


def test_a_mole_keeping_its_own_ecp_under_a_new_basis_says_so(caplog):
    """LANL2DZ's 46-electron core kept under def2-SVP, made for a 28-electron one: a warning
    naming the ECP to pass; a Mole without an ECP of its own takes the new basis's."""
    own = gto.M(atom=HI, basis="lanl2dz", ecp="lanl2dz", verbose=0)
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        kept = build_mole(own, basis="def2-svp")
    assert ecp_record(kept)["I"]["core_electrons"] == 46
    assert "own ECP is kept for I" in caplog.text and "ecp='def2-svp'" in caplog.text
    bare = gto.M(atom=HI, basis="sto-3g", verbose=0)
    assert ecp_record(build_mole(bare, basis="def2-svp"))["I"]["core_electrons"] == 28
