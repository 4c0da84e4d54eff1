"""Metadata that reproduces the run: the orbital, auxiliary and ECP choices per element, and a
QCSchema molecule (ghost atoms included); PySCF's failures to find an RI basis are one line."""

from __future__ import annotations

import pytest
from pyscf import df, gto

from dfmp2.errors import InputError
from dfmp2.integrals import auxbasis_record, make_auxmol
from dfmp2.molecule import basis_record, build_mole, molecule_record

from tolerances import TOL_8DP

WATER = "O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59"
HI = "H 0 0 0; I 0 0 1.609"
ETB = "even-tempered (PySCF aug_etb, beta=2.0)"


def test_basis_record_names_the_basis_per_element_ghosts_under_their_element():
    mol = build_mole(WATER + "; @O 3 0 0; @Ne 5 0 0", basis="cc-pvdz")
    assert basis_record(mol) == {"H": "cc-pvdz", "Ne": "cc-pvdz", "O": "cc-pvdz"}
    mixed = build_mole(WATER + "; @O 3 0 0", basis={"O": "aug-cc-pvdz", "H": "cc-pvdz"})
    assert basis_record(mixed) == {"H": "cc-pvdz", "O": "aug-cc-pvdz"}
    assert mixed.nao_nr() == 2 * 23 + 2 * 5  # the ghost O has O's aug-cc-pVDZ functions


def test_basis_record_describes_explicit_shells():
    data = {"H": [[0, [1.0, 1.0]], [0, [0.2, 1.0]], [1, [0.5, 1.0]]], "default": "sto-3g"}
    mol = gto.M(atom=WATER, basis=data, verbose=0)
    assert basis_record(mol) == {"H": "user-given data [2s1p]", "O": "sto-3g"}


@pytest.mark.filterwarnings("ignore:Basis may be available")
def test_auxbasis_record_names_pyscf_even_tempered_fill_in():
    """def2-SVP-RI has no iodine: PySCF's default fills it with aug_etb functions."""
    mol = build_mole(HI, basis="def2-svp")
    record = auxbasis_record(mol)
    assert record == {"H": "def2-svp-ri", "I": ETB}
    beta = df.addons.aug_etb.__defaults__[0]
    assert f"beta={beta}" in record["I"]
    assert make_auxmol(mol).nao_nr() == df.addons.make_auxmol(mol, df.make_auxbasis(
        mol, mp2fit=True)).nao_nr()


def test_auxbasis_record_of_a_named_and_a_dict_auxbasis():
    mol = build_mole(WATER + "; @O 3 0 0")
    assert auxbasis_record(mol) == {"H": "cc-pvdz-ri", "O": "cc-pvdz-ri"}
    assert auxbasis_record(mol, "def2-universal-jkfit") == {"H": "def2-universal-jkfit",
                                                             "O": "def2-universal-jkfit"}
    spec = {"O": "cc-pvtz-ri", "default": "cc-pvdz-ri"}
    assert auxbasis_record(mol, spec) == {"H": "cc-pvdz-ri", "O": "cc-pvtz-ri"}
    assert make_auxmol(mol, spec).nao_nr() == gto.M(
        atom=WATER + "; O 3 0 0", basis={"O": "cc-pvtz-ri", "H": "cc-pvdz-ri"}).nao_nr()


@pytest.mark.parametrize("basis, expected", [
    ("6-311g**", "cc-pvtz-ri"), ("6-31g**", "cc-pvdz-ri"),  # PySCF's Pople table, per element
    ("pcseg-1", "even-tempered (PySCF aug_etb, beta=2.0)"),  # no named partner
])
def test_a_basis_gets_pyscfs_fitting_partner_alike_for_real_and_ghost_atoms(capfd, basis,
                                                                             expected):
    """6-311G** as one name fails PySCF's lookup (KeyError: '6311gststrifit'; it was refused),
    while the per-element lookup (a basis dict, a ghost's repair) maps it by its family: the
    complex and a fragment with ghosts are fitted in the same set."""
    mol = build_mole(WATER + "; GHOST-O 3 0 0", basis=basis)
    assert set(auxbasis_record(mol).values()) == {expected}
    by_dict = build_mole(WATER + "; GHOST-O 3 0 0", basis={"O": basis, "H": basis})
    assert make_auxmol(mol).nao_nr() == make_auxmol(by_dict).nao_nr()
    assert make_auxmol(mol, "cc-pvtz-ri").nao_nr() > 0
    assert capfd.readouterr().out == ""


def test_unknown_or_incomplete_auxbasis_keeps_stdout_clean(capfd):
    mol = build_mole(HI, basis="def2-svp")
    with pytest.raises(InputError, match=r"auxiliary basis 'def2-svp-ri': .*I.*--auxbasis") as info:
        make_auxmol(mol, "def2-svp-ri")  # no iodine in it: PySCF prints ETB advice to stdout
    assert "\n" not in str(info.value)
    # only the suggested sets that have iodine are named
    assert str(info.value).endswith("e.g. def2-universal-jkfit")
    with pytest.raises(InputError, match=r"auxiliary basis 'no-such-ri'.*--auxbasis"):
        make_auxmol(mol, "no-such-ri")
    with pytest.raises(InputError, match=r"SCF fitting basis 'no-such-jk'.*--scf-auxbasis.*"
                                         r"e\.g\. def2-universal-jkfit$"):
        make_auxmol(mol, "no-such-jk", jk=True)
    out, err = capfd.readouterr()
    assert out == "" and "basis-set-exchange" not in err


@pytest.mark.parametrize("text,charge,spin", [(WATER, 0, 0), (WATER + "; @O 3 0 0", 0, 0),
                                              ("O 0 0 0; H 0 0 0.97", 0, 1), (HI, 1, 1)])
def test_molecule_record_is_a_valid_qcschema_molecule(text, charge, spin):
    from qcelemental.models import Molecule

    mol = build_mole(text, basis="def2-svp", charge=charge, spin=spin)
    record = molecule_record(mol)
    assert record["symbols"] == [s for s in ("O H H O" if "@O" in text else
                                             " ".join(mol.atom_pure_symbol(k) for k in
                                                      range(mol.natm))).split()]
    qc = Molecule(**record)
    assert list(qc.symbols) == record["symbols"]
    assert list(qc.real) == [not s.startswith("@") for s in text.replace(" ", "").split(";")]
    assert qc.molecular_charge == charge and qc.molecular_multiplicity == spin + 1
    # qcelemental rounds coordinates to 8 decimals (Bohr)
    assert abs(qc.geometry.ravel() - mol.atom_coords(unit="Bohr").ravel()).max() < TOL_8DP


def test_a_cartesian_basis_is_recorded():
    """cart=True runs 6 d functions per shell (another energy); only the basis-function count
    used to hint at it."""
    import dfmp2

    atom = "O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59"
    cart = dfmp2.run(gto.M(atom=atom, basis="cc-pvdz", cart=True), backend="pytorch")
    spherical = dfmp2.run(gto.M(atom=atom, basis="cc-pvdz"), backend="pytorch")
    assert (cart.method.cartesian, spherical.method.cartesian) == (True, False)
    assert cart.to_dict()["extras"]["method"]["cartesian"] is True
    assert "cc-pvdz  (Cartesian functions)" in cart.summary()
    assert "Cartesian" not in spherical.summary()


def test_auxbasis_record_finds_a_labelled_atoms_set_under_its_element():
    """PySCF gives atom O1 the basis of key 'O' (then 'default'); so does the record: the run
    fits in cc-pVTZ-RI on O, not in an even-tempered set."""
    mol = gto.M(atom="O1 0 0 0; H1 0 0.76 0.59; H 0 -0.76 0.59",
                basis={"O": "cc-pvtz", "H1": "aug-cc-pvdz", "H": "cc-pvdz"}, verbose=0)
    assert auxbasis_record(mol) == {"H": "cc-pvdz-ri, aug-cc-pvdz-ri", "O": "cc-pvtz-ri"}
    assert make_auxmol(mol).nao_nr() == df.addons.make_auxmol(
        mol, df.make_auxbasis(mol, mp2fit=True)).nao_nr()


def test_the_scf_fit_record_keeps_each_labelled_atoms_set():
    """Atoms O1 and O in cc-pVTZ and cc-pVDZ get cc-pVTZ-JKFIT and cc-pVDZ-JKFIT (as PySCF's
    DF-SCF): the record names both, in either order of the atoms (keyed by the element, the
    bare label's set overwrote O1's, and the summary named one set for both)."""
    from pyscf import scf

    from dfmp2.scf import scf_fit_record

    for atoms in ("O1 0 0 0; O 0 0 1.5", "O 0 0 0; O1 0 0 1.5"):
        mol = gto.M(atom=atoms, basis={"O1": "cc-pvtz", "O": "cc-pvdz"}, verbose=0)
        assert scf_fit_record(scf.RHF(mol).density_fit()) == {"O1": "cc-pvtz-jkfit",
                                                               "O": "cc-pvdz-jkfit"}
    ghost = build_mole(WATER + "; @O 3 0 0", basis="cc-pvdz")
    fit = scf.RHF(ghost).density_fit(auxbasis={"O": "cc-pvdz-jkfit", "GHOST-O": "weigend",
                                               "H": "cc-pvdz-jkfit"})
    assert scf_fit_record(fit) == {"O": "cc-pvdz-jkfit", "O (ghost)": "weigend",
                                   "H": "cc-pvdz-jkfit"}
    # a labelled atom's ghost is recorded under its label, whichever comes first: 'O (ghost)'
    # named GHOST-O1's set where GHOST-O had another
    labelled = gto.M(atom="O1 0 0 0; O 0 0 1.5; GHOST-O1 3 0 0; GHOST-O 0 3 0",
                     basis="sto-3g", verbose=0)
    fit = scf.RHF(labelled).density_fit(auxbasis={"O1": "a", "O": "a", "GHOST-O1": "b",
                                                  "GHOST-O": "c"})
    assert scf_fit_record(fit) == {"O1": "a", "O": "a", "GHOST-O1": "b", "O (ghost)": "c"}


def test_a_fitting_set_that_stops_at_the_orbital_basiss_angular_momentum_is_warned(caplog):
    """PySCF's table gives 6-31G(2df,p) cc-pVDZ-RI, whose f functions on O cannot fit f x f
    products well (1.3e-3 Eh in water's E(corr)); RI partners that reach one higher are not
    warned about, nor is an even-tempered set PySCF generates."""
    import logging

    def warned(basis, auxbasis=None):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dfmp2"):
            make_auxmol(build_mole(WATER, basis=basis), auxbasis)
        return caplog.text

    text = warned("6-31g(2df,p)")
    assert "fitting set reaches no higher angular momentum than the orbital basis on O " \
           "(orbital basis to f, fitting set to f)" in text and "cc-pvtz-ri" in text
    for basis, auxbasis in (("6-31g(2df,p)", "cc-pvtz-ri"), ("cc-pvtz", None), ("6-31g*", None),
                            ("def2-tzvpp", None), ("aug-cc-pvqz", None), ("pcseg-2", None)):
        assert "fitting set reaches" not in warned(basis, auxbasis), (basis, auxbasis)
