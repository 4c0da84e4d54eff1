"""The SCF's initial guess (``guess``, ``--guess``) and level shift (``level_shift``,
``--level-shift``): the same energies from every guess and with a shift, the record, the
refusals, the command line and the QCSchema keywords."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import dfmp2
from dfmp2._names import GUESSES
from dfmp2.cli import main
from dfmp2.errors import InputError

from tolerances import TOL_ORBITAL_ENERGY, TOL_OTHER_GUESS

WATER = "O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.587"
OH = "O 0 0 0; H 0 0 0.97"


@pytest.fixture(scope="module")
def defaults():
    return {"rhf": dfmp2.run(WATER, basis="6-31g"),
            "uhf": dfmp2.run(OH, basis="6-31g", spin=1),
            "rohf": dfmp2.run(OH, basis="6-31g", spin=1, reference="rohf")}


@pytest.mark.parametrize("guess", [g for g in GUESSES if g != "minao"])
@pytest.mark.parametrize("reference", ["rhf", "uhf", "rohf"])
def test_every_guess_reaches_the_default_guess_energies(defaults, guess, reference):
    atom, spin = (WATER, 0) if reference == "rhf" else (OH, 1)
    result = dfmp2.run(atom, basis="6-31g", spin=spin, reference=reference, guess=guess)
    assert result.e_scf == pytest.approx(defaults[reference].e_scf, abs=TOL_OTHER_GUESS)
    assert result.e_tot == pytest.approx(defaults[reference].e_tot, abs=TOL_OTHER_GUESS)
    assert result.scf.guess == guess and result.scf.level_shift == 0.0
    assert f"; guess {guess}" in result.summary()


def test_a_level_shift_changes_the_path_not_the_energies(defaults):
    shifted = dfmp2.run(OH, basis="6-31g", spin=1, level_shift=0.5)
    assert shifted.e_tot == pytest.approx(defaults["uhf"].e_tot, abs=TOL_OTHER_GUESS)
    assert shifted.scf.cycles != defaults["uhf"].scf.cycles  # the shift did act
    assert shifted.scf.level_shift == 0.5 and "level shift 0.5 Eh" in shifted.summary()
    # the orbital energies are those of the unshifted Fock matrix
    assert shifted.scf.lumo == pytest.approx(defaults["uhf"].scf.lumo, abs=TOL_ORBITAL_ENERGY)
    assert defaults["uhf"].scf.guess == "minao" and "guess" not in defaults["uhf"].summary()


def test_a_chkfile_start_records_no_guess(tmp_path):
    path = str(tmp_path / "w.chk")
    dfmp2.run(WATER, basis="sto-3g", chkfile=path)
    again = dfmp2.run(WATER, basis="sto-3g", chkfile=path, guess="huckel")
    assert again.scf.guess is None and "converged SCF from chkfile" in again.scf.restart
    assert "--guess huckel not used: the checkpoint's SCF was converged" in again.scf.restart
    loose = str(tmp_path / "loose.chk")  # a guess that iterates: its orbitals are the guess
    dfmp2.run(WATER, basis="sto-3g", chkfile=loose, conv_tol=1e-6, conv_tol_grad=1e-3)
    iterated = dfmp2.run(WATER, basis="sto-3g", chkfile=loose, guess="huckel")
    assert iterated.scf.cycles >= 1 and iterated.scf.guess is None
    assert "--guess huckel not used: the checkpoint's orbitals are the initial guess" in (
        iterated.scf.restart)


def test_refusals_are_one_line():
    with pytest.raises(InputError, match="guess must be one of minao, atom"):
        dfmp2.run(WATER, basis="sto-3g", guess="sad")
    for shift in (-0.1, 2.5, float("nan"), True, "0.3"):
        with pytest.raises(InputError, match="level_shift"):
            dfmp2.run(WATER, basis="sto-3g", level_shift=shift)
    with pytest.raises(InputError, match="no atomic potential for ghost atoms"):
        dfmp2.run(WATER + "; ghost-H 0 0 3", basis="sto-3g",
                  guess="sap")
    from pyscf import gto, scf
    mf = scf.RHF(gto.M(atom=WATER, basis="sto-3g", verbose=0)).run()
    with pytest.raises(InputError, match="guess: DFMP2"):
        dfmp2.DFMP2(mf, guess="atom")


def test_the_command_line_and_psi4s_keywords(tmp_path):
    out = CliRunner().invoke(main, ["run", OH, "--basis", "6-31g", "--spin", "1", "--guess",
                                    "HUCKEL", "--level-shift", "0.2", "--json",
                                    str(tmp_path / "r.json")])
    assert out.exit_code == 0, out.output
    saved = json.loads((tmp_path / "r.json").read_text())["extras"]["scf"]
    assert saved["guess"] == "huckel" and saved["level_shift"] == 0.2
    bad = CliRunner().invoke(main, ["run", OH, "--spin", "1", "--level-shift", "-1"])
    assert bad.exit_code != 0 and "--level-shift" in bad.output
    schema = {"schema_name": "qcschema_input", "schema_version": 1,
              "molecule": {"symbols": ["O", "H"], "geometry": [0, 0, 0, 0, 0, 1.833],
                           "molecular_multiplicity": 2},
              "driver": "energy", "model": {"method": "mp2", "basis": "6-31g"},
              "keywords": {"guess": "SAD", "level_shift": 0.25}}
    path = tmp_path / "in.json"
    path.write_text(json.dumps(schema))
    out = CliRunner().invoke(main, ["run", str(path), "--json", str(tmp_path / "s.json")])
    assert out.exit_code == 0, out.output
    saved = json.loads((tmp_path / "s.json").read_text())["extras"]["scf"]
    assert saved["guess"] == "atom" and saved["level_shift"] == 0.25
    schema["keywords"] = {"guess": "GWH"}
    path.write_text(json.dumps(schema))
    out = CliRunner().invoke(main, ["run", str(path)])
    assert out.exit_code != 0 and "keyword guess='GWH'" in out.output


def test_sap_on_cartesian_d_shells_is_refused_before_the_scf():
    with pytest.raises(InputError, match="sap.*spherical functions only"):
        dfmp2.run(WATER, basis="6-31g*", cartesian=True, guess="sap")
    assert dfmp2.run(WATER, basis="6-31g", cartesian=True, guess="sap").scf.guess == "sap"


def test_an_scf_that_does_not_converge_under_a_level_shift_names_it():
    with pytest.raises(dfmp2.ConvergenceError, match="lower --level-shift 2 or drop it"):
        dfmp2.run(WATER, basis="sto-3g", level_shift=2.0, max_cycle=5)
    with pytest.raises(dfmp2.ConvergenceError) as plain:
        dfmp2.run(WATER, basis="sto-3g", max_cycle=2)
    assert "level" not in str(plain.value)
