"""Every geometry spelling a chemist brings gives the molecule of the plain spelling, and every bad
geometry is one InputError line naming the place and the value, never a traceback."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from pyscf import gto, scf

from dfmp2.errors import InputError
from dfmp2.molecule import build_mole, parse_geometry, read_xyz

from tolerances import TOL_IDENTITY

WATER = "O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59"
GHOST_WATER = "O 3 0 0; H 3 0.76 0.59; H 3 -0.76 0.59"


def _same(a, b) -> None:
    assert [a.atom_symbol(k) for k in range(a.natm)] == [b.atom_symbol(k) for k in range(b.natm)]
    assert np.abs(a.atom_coords() - b.atom_coords()).max() < TOL_IDENTITY
    assert (a.nao_nr(), a.nelectron, a.charge, a.spin) == (b.nao_nr(), b.nelectron, b.charge,
                                                          b.spin)
    assert np.array_equal(a.atom_charges(), b.atom_charges())


@pytest.fixture(scope="module")
def water():
    return build_mole(WATER, basis="sto-3g")


@pytest.mark.parametrize("text", [
    "8 0 0 0; 1 0 0.76 0.59; 1 0 -0.76 0.59",                      # atomic numbers
    "O1 0 0 0; H2a 0 0.76 0.59; h3 0 -0.76 0.59",                  # labels
    "O, 0, 0, 0; H, 0, 0.76, 0.59; H, 0, -0.76, 0.59",              # commas and blanks
    "O,0,0,0;H,0,0.76,0.59;H,0,-0.76,0.59",                         # commas only
    "\ufeffO 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59",                 # byte order mark
    "O 0 0 0; H 0 0.76 0.59; H 0 \u22120.76 0.59",                  # U+2212 minus
    "O 0 0 0; H 0 0.76 0.59; H 0 \u20130.76 0.59",                  # en dash as minus
    "O 0 0 0; H 0 7.6D-01 5.9d-1; H 0 -7.6D-1 0.59D0",              # Fortran exponents
    "O 0 0 0\nH 0 0.76 0.59\nH 0 -0.76 0.59\n",                     # lines
])
def test_atom_string_spellings_give_the_plain_molecule(text, water):
    _same(build_mole(text, basis="sto-3g"), water)


def test_xyz_file_spellings_give_the_plain_molecule(tmp_path, water):
    path = tmp_path / "water forms.xyz"  # a path with a space: the file wins over an atom string
    path.write_text("\ufeff3\ncomment\n8, 0, 0, 0\nH1 0 7.6D-01 0.59\nH2 0 \u22120.76 0.59\n",
                    encoding="utf-8")
    _same(build_mole(str(path), basis="sto-3g"), water)
    _same(build_mole(path, basis="sto-3g"), water)


def test_an_existing_file_wins_over_an_atom_string(tmp_path, monkeypatch, water):
    monkeypatch.chdir(tmp_path)
    name = "He 0 0 0"  # also a valid atom string
    (tmp_path / name).write_text("3\n\n" + WATER.replace("; ", "\n") + "\n")
    _same(build_mole(name, basis="sto-3g"), water)


def test_zmatrix_still_works_with_labels_and_ghosts():
    mol = build_mole("O1; H2 1 0.96; H3 1 0.96 2 104.5", basis="sto-3g")
    assert mol.natm == 3 and mol.nelectron == 10
    ghost = build_mole("O; H 1 0.96; H 1 0.96 2 104.5; @He 1 3.0 2 90.0 3 0.0", basis="sto-3g")
    assert ghost.nelectron == 10 and ghost.atom_charge(3) == 0
    assert ghost.nao_nr() == mol.nao_nr() + 1


@pytest.mark.parametrize("spelling", ["ghost-{}", "X-{}", "ghost{}", "@{}", "Gh({})",
                                      "GHOST-{}", "gh({})", "x-{}", "X{}"])
def test_ghost_spellings_give_identical_moles(spelling):
    plain = build_mole(WATER + "; GHOST-O 3 0 0; GHOST-H 3 0.76 0.59", basis="sto-3g")
    text = WATER + "; " + "; ".join(
        f"{spelling.format(s)} {xyz}"
        for s, xyz in (("O", "3 0 0"), ("H", "3 0.76 0.59")))
    mol = build_mole(text, basis="sto-3g")
    _same(mol, plain)
    assert mol._atom[3][0] == "GHOST-O" and mol._atom[4][0] == "GHOST-H"


def test_ghost_atoms_add_basis_functions_but_no_electrons_or_charge(tmp_path, water):
    path = tmp_path / "cp.xyz"
    path.write_text("6\ncounterpoise\n" + (WATER + "; @O 3 0 0; @H 3 0.76 0.59; @H 3 -0.76 0.59")
                    .replace("; ", "\n") + "\n")
    mol = build_mole(path, basis="sto-3g")
    assert mol.nao_nr() == 2 * water.nao_nr()
    assert mol.nelectron == water.nelectron == 10
    assert list(mol.atom_charges()) == [8, 1, 1, 0, 0, 0] and mol.charge == 0
    odd = build_mole("H 0 0 0; @H 0 0 0.74", basis="sto-3g", spin=1)  # one electron, a doublet
    assert odd.nelectron == 1
    with pytest.raises(InputError, match="1 electrons cannot have 2S = 0"):
        build_mole("H 0 0 0; @H 0 0 0.74", basis="sto-3g")


def test_counterpoise_monomer_in_dimer_basis_is_lower():
    def energy(text):
        mf = scf.RHF(build_mole(text, basis="cc-pvdz"))
        mf.verbose = 0
        return mf.kernel()

    dimer_basis = WATER + "; " + "; ".join("@" + e for e in GHOST_WATER.split("; "))
    assert energy(dimer_basis) < energy(WATER) - 1e-5


def test_dummy_atom_x_alone_is_refused_with_the_ghost_spellings():
    with pytest.raises(InputError, match=r"entry 2.*'X' is a dummy atom.*@O"):
        build_mole("O 0 0 0; X 0 0 1; H 0 0.76 0.59; H 0 -0.76 0.59")


@pytest.mark.parametrize("unit", ["angstrom", "bohr"])
def test_a_zmatrix_dummy_atom_is_a_reference_point(unit):
    """Gaussian's and Psi4's Z-matrices place a linear molecule's atoms through a dummy atom X:
    the entries become Cartesians and X is dropped (HCN: the molecule of its Cartesians), a
    ghost atom after it kept; X alone is refused."""
    zmat = build_mole("C; N 1 1.15; X 1 1.0 2 90.; H 1 1.06 3 90. 2 180.; @He 1 3.0 2 90. 3 0.",
                      basis="sto-3g", unit=unit)
    plain = build_mole("C 0 0 0; N 1.15 0 0; H -1.06 0 0; @He 0 0 3.0", basis="sto-3g",
                       unit=unit)
    _same(zmat, plain)
    with pytest.raises(InputError, match="dummy atoms .X. only"):
        build_mole("X; X 1 1.0", basis="sto-3g")


@pytest.mark.parametrize("zmat, message", [
    ("C; N 1 1.15; X 1 1.0 2 -90.; H 1 1.06 3 90. 2 180.", "entry 3 .*angle '-90.' must be"),
    ("C; N 1 1.15; X 1 1.0 2 90.; H 1 1.06 3 190. 2 180.", "entry 4 .*angle '190.' must be"),
    ("C; N 1 1.15; H 1 1.06 2 100.; H 1 1.06 2 190. 3 180.", "entry 4 .*angle '190.' must be"),
    ("C; X 1 1.0; X 2 1.0 1 0.; H 3 1.0 1 90. 2 0.", "entry 4 .*partners are at the same"),
    ("O; H 1 1.0; H 2 1.0 1 0.; H 3 1.0 1 90. 2 0.", "entry 4 .*partners are at the same"),
])
def test_a_zmatrix_pyscf_cannot_place_is_one_line(zmat, message):
    """Angles PySCF's from_zmatrix asserts on (below 0, or above 180 with a dihedral) were an
    AssertionError traceback where dummies made dfmp2 convert the Z-matrix itself (and an
    unhelpful 'AssertionError' line without them); an entry whose bond and angle partners
    coincide was placed at NaN, with numpy's warning, and the error named the atom's number
    among the atoms left, not the entry, with dummies or without (every Z-matrix is now
    converted by dfmp2, PySCF's own conversion)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=message):
            build_mole(zmat, basis="sto-3g")


def test_xenon_is_not_a_ghost():
    assert parse_geometry("Xe 0 0 0; xe 0 0 3").atoms[1][0] == "Xe"


# ---------------------------------------------------------------- bad input, one line each


def _one_line(info) -> str:
    text = str(info.value)
    assert "\n" not in text and text
    return text


def test_coinciding_atoms_name_the_pair_and_distance():
    with pytest.raises(InputError) as info:
        build_mole("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59; H 0 0.76 0.59")
    text = _one_line(info)
    assert "atoms 2 (H) and 4 (H) coincide (0.0000 Å apart)" in text


def test_atoms_closer_than_a_tenth_of_an_angstrom_ghosts_included(tmp_path):
    with pytest.raises(InputError) as info:
        build_mole(WATER + "; @O 0.05 0 0")
    assert "atoms 1 (O) and 4 (GHOST-O) are closer than 0.1 Å (0.0500 Å apart)" in _one_line(info)
    path = tmp_path / "close.xyz"
    path.write_text("2\n\nH 0 0 0\nH 0 0 0.09\n")
    with pytest.raises(InputError, match=r"close.xyz: atoms 1 \(H\) and 2 \(H\) .*0.0900 Å"):
        build_mole(path)


def test_close_atoms_in_a_zmatrix_and_in_a_given_mole():
    with pytest.raises(InputError, match=r"atoms 1 \(O\) and 2 \(H\) .*0.0500 Å"):
        build_mole("O; H 1 0.05; H 1 0.96 2 104.5")
    given = gto.M(atom="H 0 0 0; H 0 0 0", basis="sto-3g", verbose=0)
    with pytest.raises(InputError, match=r"the given Mole: atoms 1 \(H\) and 2 \(H\) coincide"):
        build_mole(given)


def test_non_finite_coordinates_name_the_line_and_value(tmp_path):
    path = tmp_path / "nan.xyz"
    path.write_text("2\n\nH 0 0 0\nH 0 nan 0.74\n")
    with pytest.raises(InputError) as info:
        build_mole(path)
    assert "nan.xyz line 4: coordinate 'nan' is not a finite number" in _one_line(info)
    with pytest.raises(InputError, match=r"atom string entry 2 \('H 0 0 inf'\): coordinate 'inf'"):
        build_mole("H 0 0 0; H 0 0 inf")
    with pytest.raises(InputError, match=r"entry 2 .*coordinate '-inf'"):
        build_mole("O; H 1 -inf")
    given = gto.M(atom=[("H", (0, 0, 0)), ("H", (0, 0, float("nan")))], basis="sto-3g",
                  verbose=0)
    with pytest.raises(InputError, match=r"given Mole: atom 2 \(H\) has the non-finite coord"):
        build_mole(given)


def test_more_electrons_than_the_basis_holds():
    with pytest.raises(InputError) as info:
        build_mole("H 0 0 0; H 0 0 0.74", basis="sto-3g", charge=-4)
    text = _one_line(info)
    assert "6 electrons (3 alpha, charge -4) do not fit in the 2 basis functions" in text
    assert "sto-3g" in text
    with pytest.raises(InputError, match=r"3 electrons \(3 alpha.*2 basis functions"):
        build_mole("H 0 0 0; H 0 0 0.74", basis="sto-3g", charge=-1, spin=3)


def test_directory_empty_and_missing_arguments_have_their_own_messages(tmp_path):
    with pytest.raises(InputError, match="is a directory, not an xyz file"):
        build_mole(str(tmp_path))
    for blank in ("", "   ", "\ufeff", "\n"):
        with pytest.raises(InputError, match="the geometry is empty"):
            build_mole(blank)
    with pytest.raises(InputError, match="does not exist"):
        build_mole(str(tmp_path / "no such file.xyz"))
    with pytest.raises(InputError, match="'/dev/null' is not a regular file"):
        build_mole("/dev/null")


def test_a_comment_line_in_another_encoding_is_only_text(tmp_path):
    """A Latin-1 comment ("Ångström") used to refuse the whole file; an atom line that is not
    UTF-8 is refused with its line number."""
    path = tmp_path / "latin.xyz"
    atoms = b"O 0 0 0\nH 0 0.757 0.587\nH 0 -0.757 0.587\n"
    path.write_bytes(b"\xef\xbb\xbf3\nwater in \xc5ngstr\xf6m\n" + atoms)  # a BOM as well
    geometry = read_xyz(path)
    assert [label for label, _ in geometry.atoms] == ["O", "H", "H"]
    path.write_bytes(b"3\nwater\n" + atoms.replace(b"H 0 -", b"H\xc5 0 -"))
    with pytest.raises(InputError, match="latin.xyz line 5: the atom line is not UTF-8"):
        read_xyz(path)


def test_unknown_element_and_bad_numbers_name_the_line(tmp_path):
    path = tmp_path / "bad.xyz"
    path.write_text("2\n\nH 0 0 0\nQq 0 0 1\n")
    with pytest.raises(InputError, match=r"bad.xyz line 4: unknown element 'Qq'"):
        read_xyz(path)
    with pytest.raises(InputError, match=r"entry 1 .*unknown element '0'"):
        build_mole("0 0 0 0; H 0 0 1")
    path.write_text("2\n\nH 0 0 0\nH 0 0 1.0E\n")
    with pytest.raises(InputError, match=r"line 4: coordinates must be numbers, got '0 0 1.0E'"):
        read_xyz(path)


def test_unknown_basis_keeps_stdout_clean(capfd):
    with pytest.raises(InputError, match=r"basis 'no-such-basis': not in PySCF's basis "
                                         r"library.*basissetexchange"):
        build_mole(WATER, basis="no-such-basis")
    out, err = capfd.readouterr()
    assert out == "" and "basis-set-exchange" not in err


def test_frozen_core_ignores_ghost_atoms():
    from dfmp2.reference import frozen_mask

    mol = build_mole(WATER + "; " + "; ".join("@" + e for e in GHOST_WATER.split("; ")))
    nocc = mol.nelectron // 2
    mo_occ = np.array([2.0] * nocc + [0.0] * (mol.nao_nr() - nocc))
    assert np.count_nonzero(~frozen_mask(mol, mo_occ, frozen_core=True)) == 1  # O 1s only


def test_a_single_atom_and_an_unbuilt_mole():
    assert build_mole("He", basis="sto-3g").nelectron == 2
    given = gto.Mole(atom=WATER, basis="sto-3g", verbose=0)
    mol = build_mole(given)
    assert mol._built and mol.nelectron == 10 and not given._built


@pytest.mark.parametrize("text, needle", [
    ("H 0 0 0; H 0 0 a", "coordinates must be numbers"),
    ("H 0 0 0; H 0 0 (1", "coordinates must be numbers"),
    ("H 0 0 0; H 0 0 1/0", "coordinates must be numbers"),
    ("H 0 0 0; H 0 0 0x10", "coordinates must be numbers"),
    ("H 0 0 0; H 0 0 len('abc')", "coordinates must be numbers"),
    ("H 0 0 0; H 0 0 __import__('os').getpid()", "coordinates must be numbers"),
    ("H 0 0 0; H 0 0 0.74 junk", "expected 'Element x y z'"),
    ("H 0 0 0\\tH 0 0 0.74", "expected 'Element x y z'"),
    ("N; H 1 1.008 junk", "'label i r'"),
    ("N; H 1 1/0", "is not a number"),
    ("N; H 1 1.0; H 2 1.0 2 105", "distinct earlier entry"),
    ("N; H 3 1.0", "earlier entry, 1 to 1"),
    ("N; H 1 -1.0", "must be positive"),
], ids=lambda v: v if len(v) < 30 else v[:30])
def test_atom_strings_are_parsed_never_evaluated(text, needle):
    """PySCF evaluates the fields of entries it takes for a Z-matrix: dfmp2 parses every
    entry itself, so junk is one InputError naming the entry, never a traceback, never a number
    PySCF made of an expression."""
    with pytest.raises(InputError, match="atom string entry") as info:
        build_mole(text, basis="sto-3g")
    assert needle in str(info.value)


def test_zmatrix_is_rebuilt_from_parsed_numbers():
    mol = build_mole("N; H 1 1.008; H 1 1.008D0 2 105.0", basis="sto-3g", spin=1)
    dist = np.linalg.norm(mol.atom_coord(1, unit="Angstrom") - mol.atom_coord(0, unit="Angstrom"))
    assert dist == pytest.approx(1.008, abs=TOL_IDENTITY)


def test_a_basis_dict_that_leaves_an_element_out_is_refused():
    """PySCF only warns and would run H as a bare nucleus: refused for a given Mole, for the
    SCF object given to DFMP2, and for an auxiliary basis dict (before the SCF)."""
    import dfmp2

    with pytest.raises(InputError, match="basis has no functions for H"):
        dfmp2.run(gto.M(atom=WATER, basis={"O": "cc-pvdz"}, verbose=0))
    mf = scf.RHF(gto.M(atom=WATER, basis={"O": "cc-pvdz"}, verbose=0)).run()
    with pytest.raises(InputError, match="SCF's basis has no functions for H"):
        dfmp2.DFMP2(mf).run()
    with pytest.raises(InputError, match="auxiliary basis .* no functions for H"):
        dfmp2.run(WATER, auxbasis={"O": "cc-pvdz-ri"}, max_cycle=1)


@pytest.mark.parametrize("token", ["Na+", "Cl-", "Cl-1", "O2-", "Fe+3", "H+", "gh(Na+)",
                                   "Na\u207a", "Cl\u207b", "Fe\u00b3\u207a", "Na(+)", "Cl(-)",
                                   "Na^+", "Cl^-"])
def test_an_atom_with_a_charge_sign_is_refused_not_run_neutral(token):
    """PySCF reads 'Na+' as Na and drops the sign: a cation would run as a neutral atom."""
    with pytest.raises(InputError, match=r"entry 1 .* carries a charge sign.* --charge"):
        build_mole(f"{token} 0 0 0; H 0 0 1.6", basis="sto-3g", spin=None)


@pytest.mark.parametrize("comment, stated", [
    ("1 2", (1, 2)), ("-1, 1", (-1, 1)), ("\u22122 1", (-2, 1)), ("charge=2 mult=1", (2, 1)),
    ("Charge: -1", (-1, None)), ("multiplicity 3", (None, 3)),
    ("water, B3LYP geometry", (None, None)), ("2 waters", (None, None)),
    ("charge density", (None, None)), ("1 0", (None, None)), ("0 1 2", (None, None)),
    ("water; Mulliken charge 1.35 on O", (None, None)), ("charge/multiplicity: 1/2", (1, 2)),
    ("Charge/Mult: -1 2", (-1, 2)), ("charge=\u22121", (-1, None)),
    ('Properties=species:S:1:pos:R:3 energy=-76.4 charge=0 pbc="F F F"', (0, None))])
def test_a_comment_lines_charge_and_multiplicity_are_read_as_stated(comment, stated):
    from dfmp2.geometry import stated_charge_multiplicity

    assert stated_charge_multiplicity(comment) == stated


def test_a_comment_line_stating_another_charge_is_refused_unless_one_was_asked(tmp_path,
                                                                                caplog):
    """An ion's xyz whose comment says 'charge=-1' would run neutral without a word; with no
    charge or spin asked that is refused, with them asked the run goes on and warns."""
    import logging

    path = tmp_path / "oh.xyz"
    path.write_text("2\ncharge=-1 mult=1\nO 0 0 0\nH 0 0 0.97\n")
    with pytest.raises(InputError, match=r"oh.xyz line 2 \(the comment line\) states charge -1, "
                                         r"but .* give --charge -1 --spin 0 to run .* or "
                                         r"--charge 0 --spin 0 to run it neutral"):
        build_mole(str(path), basis="sto-3g")
    assert build_mole(str(path), basis="sto-3g", charge=-1).nelectron == 10  # as stated
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        radical = build_mole(str(path), basis="sto-3g", spin=1)  # asked for: the radical
    assert radical.nelectron == 9 and "states charge -1 and multiplicity 1; the run is " \
                                      "charge 0, multiplicity 2, as asked" in caplog.text
    path.write_text("2\n0 2\nO 0 0 0\nH 0 0 0.97\n")  # what the run is: nothing said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        assert build_mole(str(path), basis="sto-3g", spin=1).spin == 1
    assert "comment" not in caplog.text


def test_a_charge_and_spin_given_as_zero_win_over_the_comment_line(tmp_path, caplog):
    """--charge 0 --spin 0 (Python charge=0, spin=0) is asked for: the run is neutral, with a
    warning, on the command line as from Python."""
    import logging

    from click.testing import CliRunner

    from dfmp2.cli import main

    path = tmp_path / "w.xyz"
    path.write_text("3\ncharge=-2\n" + WATER.replace("; ", "\n") + "\n")
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        assert build_mole(str(path), basis="sto-3g", charge=0, spin=0).nelectron == 10
    assert "states charge -2; the run is charge 0, multiplicity 1, as asked" in caplog.text
    out = tmp_path / "w.json"
    given = CliRunner().invoke(main, ["run", str(path), "--basis", "sto-3g", "--charge", "0",
                                      "--spin", "0", "--json", str(out), "-q"])
    assert given.exit_code == 0, given.output
    assert "states charge -2" in json.loads(out.read_text())["extras"]["warnings"][0]
    refused = CliRunner().invoke(main, ["run", str(path), "--basis", "sto-3g"])
    assert refused.exit_code == 1 and "states charge -2" in refused.output
