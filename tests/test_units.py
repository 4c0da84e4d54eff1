"""``--unit`` / ``unit=``: coordinates in Bohr run the molecule they name, whatever reads them
(an atom string, an xyz file, a Z-matrix, a batch, a counterpoise run); every record of the
geometry (the QCSchema molecule in Bohr, the nuclear repulsion, the summary) is the Angstrom
spelling's; the distance checks hold in either unit and say lengths in the unit given; a unit
that contradicts the input's own (a Mole's, a QCSchema input's Bohr) is one refused line."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from click.testing import CliRunner
from pyscf import gto, scf
from pyscf.lib import param

import dfmp2
from dfmp2 import qcschema
from dfmp2.cli import main
from dfmp2.counterpoise import run_counterpoise
from dfmp2.errors import InputError
from dfmp2.molecule import build_mole

from tolerances import TOL_COORDS, TOL_UNITS

WATER = "O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59"
H2_DIMER = "H 0 0 0; H 0 0 0.74; H 0 3.0 0; H 0 3.0 0.74"


def in_bohr(text: str) -> str:
    """An atom string's coordinates converted to Bohr with PySCF's Bohr radius (17 digits)."""
    entries = [entry.split() for entry in text.split(";")]
    return "; ".join(" ".join([fields[0], *(repr(float(x) / param.BOHR) for x in fields[1:])])
                     for fields in entries)


def xyz_text(atom_string: str) -> str:
    entries = [entry.strip() for entry in atom_string.split(";")]
    return f"{len(entries)}\nwater, Bohr\n" + "\n".join(entries) + "\n"


def _one_line(info) -> str:
    text = str(info.value)
    assert "\n" not in text and text
    return text


def _same_records(result, reference) -> None:
    """Energies, nuclear repulsion and the QCSchema molecule (Bohr) of two runs of a molecule."""
    for name in ("e_scf", "e_corr", "e_tot"):
        assert getattr(result, name) == pytest.approx(getattr(reference, name), abs=TOL_UNITS)
    mine, theirs = result.molecule, reference.molecule
    assert mine.nuclear_repulsion == pytest.approx(theirs.nuclear_repulsion, abs=TOL_UNITS)
    assert np.abs(np.subtract(mine.qcschema["geometry"], theirs.qcschema["geometry"])).max() \
        < TOL_COORDS
    assert mine.qcschema["symbols"] == theirs.qcschema["symbols"]


@pytest.fixture(scope="module")
def angstrom():
    return dfmp2.run(WATER, basis="sto-3g")


def test_an_atom_string_and_an_xyz_file_in_bohr_are_the_angstrom_molecule(angstrom, tmp_path):
    path = tmp_path / "water_bohr.xyz"
    path.write_text(xyz_text(in_bohr(WATER)))
    for geometry, unit in ((in_bohr(WATER), "bohr"), (path, "BOHR")):  # any case, as others
        result = dfmp2.run(geometry, basis="sto-3g", unit=unit)
        _same_records(result, angstrom)
        summary = [line for line in result.summary().splitlines() if "nuclear repulsion" in line]
        assert summary == [line for line in angstrom.summary().splitlines()
                           if "nuclear repulsion" in line]
        data = json.loads(result.to_json())  # the JSON's molecule is QCSchema's, in Bohr
        assert np.abs(np.subtract(data["molecule"]["geometry"],
                                  angstrom.molecule.qcschema["geometry"])).max() < TOL_COORDS


def test_the_unit_is_what_makes_the_molecule():
    """The Bohr numbers read as Angstrom (the default) are another, larger molecule; a Z-matrix's
    distances are in the unit too."""
    bohr = build_mole(in_bohr(WATER), basis="sto-3g", unit="bohr")
    assert bohr.unit == "Bohr"
    assert np.abs(bohr.atom_coords() - build_mole(WATER, basis="sto-3g").atom_coords()).max() \
        < TOL_COORDS
    misread = build_mole(in_bohr(WATER), basis="sto-3g")
    assert misread.energy_nuc() < 0.6 * bohr.energy_nuc()
    r = 0.96
    zmatrix = build_mole(f"O; H 1 {r / param.BOHR!r}; H 1 {r / param.BOHR!r} 2 104.5",
                         basis="sto-3g", unit="bohr")
    plain = build_mole(f"O; H 1 {r}; H 1 {r} 2 104.5", basis="sto-3g")
    assert np.abs(zmatrix.atom_coords() - plain.atom_coords()).max() < TOL_COORDS


def test_a_moles_own_unit_keeps_working_and_a_matching_unit_changes_nothing(angstrom):
    mol = gto.M(atom=in_bohr(WATER), unit="Bohr", basis="sto-3g", verbose=0)
    _same_records(dfmp2.run(mol), angstrom)
    for unit in ("bohr", "Bohr"):
        assert np.array_equal(build_mole(mol, unit=unit).atom_coords(), mol.atom_coords())
    as_angstrom = gto.M(atom=WATER, basis="sto-3g", verbose=0)  # PySCF's default unit
    assert build_mole(as_angstrom, unit="angstrom").unit == as_angstrom.unit


@pytest.mark.parametrize(("unit", "given"), [("angstrom", "Bohr"), ("bohr", "Angstrom"),
                                            ("bohr", "A")])
def test_a_unit_that_contradicts_a_given_moles_is_refused(unit, given):
    mol = gto.M(atom="H 0 0 0; H 0 0 1.4", unit=given, basis="sto-3g", verbose=0)
    with pytest.raises(InputError) as info:
        dfmp2.run(mol, unit=unit)
    assert f"unit={unit!r} contradicts the given Mole's own unit (mol.unit = {given!r})" in \
        _one_line(info)
    with pytest.raises(InputError, match="unit belongs to the SCF's molecule"):
        dfmp2.DFMP2(scf.RHF(mol), unit=unit)


def test_atoms_too_close_in_bohr_are_refused_with_lengths_in_bohr(tmp_path):
    """0.15 Bohr (0.079 Angstrom) is too close; 0.15 Angstrom is not: the check is the same
    physical distance in either unit, and says the unit given (and Angstrom beside Bohr)."""
    close = "H 0 0 0; H 0 0 0.15"
    assert build_mole(close, basis="sto-3g").natm == 2
    with pytest.raises(InputError) as info:
        build_mole(close, basis="sto-3g", unit="bohr")
    assert ("atoms 1 (H) and 2 (H) are closer than 0.189 Bohr = 0.1 Å (0.1500 Bohr = 0.0794 Å "
            "apart); remove the duplicate or fix the coordinates (Bohr)") in _one_line(info)
    path = tmp_path / "close.xyz"
    path.write_text(xyz_text("H 0 0 0; H 0 0 0"))
    with pytest.raises(InputError, match=r"close.xyz: atoms 1 \(H\) and 2 \(H\) coincide "
                                         r"\(0.0000 Bohr = 0.0000 Å apart\)"):
        build_mole(path, basis="sto-3g", unit="bohr")
    with pytest.raises(InputError, match=r"atoms 1 \(O\) and 2 \(H\) .*\(0.1000 Bohr = 0.0529 Å"):
        build_mole("O; H 1 0.1; H 1 1.8 2 104.5", basis="sto-3g", unit="bohr")
    given = gto.M(atom=close, unit="Bohr", basis="sto-3g", verbose=0)
    with pytest.raises(InputError, match=r"the given Mole: atoms 1 \(H\) and 2 \(H\) are closer "
                                         r"than 0.189 Bohr"):
        build_mole(given)
    with pytest.raises(InputError, match=r"z = 300000 Bohr = 158753 Å, beyond 100000 Å; give "
                                         "its position in Bohr"):
        build_mole("H 0 0 0; H 0 0 3e5", basis="sto-3g", unit="bohr")
    refused = CliRunner().invoke(main, ["run", close, "--unit", "bohr", "--basis", "sto-3g"])
    assert refused.exit_code == 1
    assert refused.stderr.count("\n") == 1 and "0.1500 Bohr = 0.0794 Å apart" in refused.stderr


def test_an_unknown_unit_names_the_choices():
    with pytest.raises(InputError, match=r"unit must be one of angstrom, bohr; got 'au'"):
        dfmp2.run(WATER, unit="au")
    with pytest.raises(InputError, match=r"unit must be one of angstrom, bohr; got 'nm'"):
        build_mole(WATER, unit="nm")
    refused = CliRunner().invoke(main, ["run", WATER, "--unit", "au"])
    assert refused.exit_code == 2 and "'angstrom', 'bohr'" in refused.stderr


def test_the_command_reads_an_atom_string_in_bohr(angstrom):
    result = CliRunner().invoke(main, ["run", in_bohr(WATER), "--unit", "bohr", "--basis",
                                       "sto-3g", "-q"])
    assert result.exit_code == 0, result.output
    assert float(result.stdout) == pytest.approx(angstrom.e_tot, abs=TOL_UNITS)


def test_a_batch_in_bohr_is_the_batch_in_angstrom(angstrom, tmp_path):
    """Two GEOMETRY arguments (an xyz file and an atom string, both in Bohr) with --unit bohr:
    each JSON's energy and QCSchema molecule are those of the Angstrom spelling."""
    path = tmp_path / "water.xyz"
    path.write_text(xyz_text(in_bohr(WATER)))
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(main, ["run", str(path), in_bohr(WATER), "--unit", "Bohr",
                                       "--basis", "sto-3g", "--json", str(out / "{index}.json")])
    assert result.exit_code == 0, result.output
    for index in (1, 2):
        data = json.loads((out / f"{index}.json").read_text())
        assert data["return_result"] == pytest.approx(angstrom.e_tot, abs=TOL_UNITS)
        assert data["properties"]["nuclear_repulsion_energy"] == pytest.approx(
            angstrom.molecule.nuclear_repulsion, abs=TOL_UNITS)
        assert np.abs(np.subtract(data["molecule"]["geometry"],
                                  angstrom.molecule.qcschema["geometry"])).max() < TOL_COORDS


def test_a_counterpoise_run_in_bohr_is_the_run_in_angstrom():
    """The complex is built in the unit given and its fragments from it (their Moles are in
    Bohr whatever the unit: the run's unit='angstrom', which the command passes, is not
    theirs)."""
    apart = run_counterpoise(H2_DIMER, "2,2", basis="sto-3g", unit="angstrom")
    bohr = run_counterpoise(in_bohr(H2_DIMER), "2,2", basis="sto-3g", unit="bohr")
    for level in apart.interaction["levels"]:
        assert bohr.interaction[level]["eh"] == pytest.approx(apart.interaction[level]["eh"],
                                                              abs=TOL_UNITS)
    _same_records(bohr, apart)


def _schema_input() -> dict:
    mol = build_mole(WATER, basis="sto-3g")
    return {"schema_name": "qcschema_input", "schema_version": 1, "driver": "energy",
            "molecule": {"symbols": ["O", "H", "H"],
                         "geometry": mol.atom_coords(unit="Bohr").ravel().tolist()},
            "model": {"method": "mp2", "basis": "sto-3g"}, "keywords": {}}


def test_a_qcschema_input_is_bohr_and_refuses_angstrom(tmp_path):
    path = tmp_path / "water.json"
    path.write_text(json.dumps(_schema_input()))
    refused = CliRunner().invoke(main, ["run", str(path), "--unit", "angstrom"])
    assert refused.exit_code == 1
    assert refused.stderr.count("\n") == 1 and (
        "--unit angstrom with a QCSchema input: its molecule.geometry is in Bohr by QCSchema's "
        "definition; leave --unit out") in refused.stderr
    with pytest.raises(InputError, match="--unit angstrom with a QCSchema input"):
        dfmp2.run_qcschema(_schema_input(), unit="ANGSTROM")
    job = qcschema.with_overrides(qcschema.read_input(_schema_input()), {"unit": "Bohr"})
    assert job.options["unit"] == "bohr" and "unit" not in job.input["keywords"]  # not echoed
    ran = CliRunner().invoke(main, ["run", str(path), "--unit", "bohr", "--json", "-"])
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.stdout)["keywords"] == {}


def test_the_record_says_which_unit_the_input_was_read_in_and_why(angstrom, tmp_path):
    """extras.molecule.input_unit and input_unit_source: Angstrom by default, either unit given
    (Python, the command line), a Mole's own, a QCSchema input's Bohr; read back from JSON."""
    mole = gto.M(atom=in_bohr(WATER), unit="Bohr", basis="sto-3g", verbose=0)
    cases = [(angstrom, ("angstrom", "default")),
             (dfmp2.run(WATER, basis="sto-3g", unit="Angstrom"), ("angstrom", "given")),
             (dfmp2.run(in_bohr(WATER), basis="sto-3g", unit="bohr"), ("bohr", "given")),
             (dfmp2.run(mole), ("bohr", "mole"))]
    for result, expected in cases:
        again = dfmp2.Result.from_json(result.to_json()).molecule
        assert (again.input_unit, again.input_unit_source) == expected
    path = tmp_path / "water.json"
    path.write_text(json.dumps(_schema_input()))
    for arguments, expected in (([WATER], ["angstrom", "default"]),
                                ([in_bohr(WATER), "--unit", "bohr"], ["bohr", "given"]),
                                ([str(path)], ["bohr", "qcschema"])):
        ran = CliRunner().invoke(main, ["run", *arguments, "--basis", "sto-3g", "--json", "-"])
        assert ran.exit_code == 0, ran.output
        molecule = json.loads(ran.stdout)["extras"]["molecule"]
        assert [molecule["input_unit"], molecule["input_unit_source"]] == expected


@pytest.mark.parametrize("atoms, unit, expected", [
    (WATER, "bohr", "less than 0.7 of their covalent bond length"),  # Angstrom as Bohr
    ("H 0 0 0; H 0 0 0.74", "bohr", "less than 0.7 of their covalent bond length"),
    ("O 0 0 0; H 0 1.436 1.115; H 0 -1.436 1.115", "angstrom",  # Bohr as Angstrom
     "as if the coordinates were in Bohr"),
    ("C 0 0 0; O 0 0 2.287; H 0 1.786 -1.041; H 0 -1.786 -1.041", "angstrom",  # H2CO too
     "as if the coordinates were in Bohr"),
    (WATER, "angstrom", None),
    ("O 0 0 0; H 0 1.436 1.115; H 0 -1.436 1.115", "bohr", None),
    ("H 0 0 0; H 0 0 2.5", "angstrom", None),  # a bond scan's stretched pair
    ("O 0 0 0; H 0 1.25 1.0; H 0 -1.25 1.0", "angstrom", None),  # a symmetric stretch
    ("H 0 0 0; H 0 0 1.0; H 0 0 2.0; H 0 0 3.0", "angstrom", None),  # an H4 chain
    ("Ne 0 0 0; Ne 3.1 0 0; Ne 1.55 2.68 0", "angstrom", None),  # a van der Waals trimer
    ("N 0 0 0; N 0 0 1.098", "angstrom", None),  # a triple bond
    ("Cr 0 0 0; Cr 0 0 1.68", "angstrom", None),  # Cr2's multiple bond, 0.60 of Cr-Cr's
    ("Cr 0 0 0; Cr 0 0 1.68", "bohr", "less than 0.55 of their covalent bond length"),
    ("Xe 0 0 0; F 0 0 1.977; F 0 0 -1.977", "bohr", "less than 0.55"),  # a noble gas's bond
    ("Xe 0 0 0; F 0 0 1.977; F 0 0 -1.977", "angstrom", None),
    (WATER + "; ghost-O 0 0 0.3", "angstrom", None),  # ghosts are no atoms
])
def test_distances_that_look_like_the_other_unit_are_a_warning(atoms, unit, expected, caplog):
    from dfmp2.molecule import build_mole

    heavy = any(element in atoms for element in ("Cr", "Xe"))
    with caplog.at_level(logging.WARNING, logger="dfmp2"):  # the molecule alone: no SCF
        build_mole(atoms, basis="def2-svp" if heavy else "sto-3g", unit=unit)
    warnings = [record.getMessage() for record in caplog.records]
    mixups = [w for w in warnings if "covalent bond length" in w]
    if expected is None:
        assert mixups == []
    else:
        [warning] = mixups
        assert expected in warning and "--unit" in warning


def test_a_counterpoise_run_says_a_unit_warning_once(tmp_path):
    """The fragments' runs (Moles built from the complex) do not repeat the input's."""
    path = tmp_path / "dimer_bohr.xyz"
    path.write_text("6\nwater dimer in Bohr\n"
                    "O 0 0 0\nH 0 1.436 1.115\nH 0 -1.436 1.115\n"
                    "O 0 0 6\nH 0 1.436 7.115\nH 0 -1.436 7.115\n")
    result = run_counterpoise(str(path), "3,3", basis="sto-3g")
    assert len([w for w in result.warnings if "as if the coordinates" in w]) == 1
