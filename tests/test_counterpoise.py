"""Counterpoise-corrected interaction energies: Psi4's dfmp2-1 formic acid dimer, three
fragments, charged fragments, the uncorrected interaction energy and the BSSE (each fragment in
its own basis), and every way to get the fragments wrong."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from qcelemental.models import v1

import dfmp2
from dfmp2.cli import main
from dfmp2.counterpoise import run_counterpoise
from dfmp2.errors import InputError

from conftest import INPUTS
from tolerances import (
    TOL_FP64,
    TOL_IDENTITY,
    TOL_KCAL_FACTOR_REL,
    TOL_OUTCORE,
    TOL_SEPARATE_FRAGMENT,
)

FORMIC = str(INPUTS / "formic_acid_dimer.xyz")
#: Psi4 tests/dfmp2-1 output.ref (references.md): CP-corrected DF-MP2 interaction energy from
#: its totals, and the dimer's SCS correlation energy.
PSI4_CP_MP2 = -0.0224119330
PSI4_DIMER_SCS_CORR = -0.9841695292


@pytest.fixture(scope="module")
def formic():
    return run_counterpoise(FORMIC, "5,5")


def test_formic_acid_dimer_matches_psi4(formic):
    inter = formic.interaction
    assert abs(inter["mp2"]["eh"] - PSI4_CP_MP2) <= TOL_FP64
    assert abs(formic.e_scs - PSI4_DIMER_SCS_CORR) <= TOL_FP64
    assert inter["hartree_to_kcal_mol"] == pytest.approx(627.5094740631,
                                                         rel=TOL_KCAL_FACTOR_REL)
    assert inter["mp2"]["kcal_mol"] == inter["mp2"]["eh"] * inter["hartree_to_kcal_mol"]
    totals = inter["totals_eh"]
    for level in ("hf", "mp2", "scs_mp2"):
        assert inter[level]["eh"] == \
            totals["complex"][level] - sum(f[level] for f in totals["fragments"])
    assert [f["atoms"] for f in inter["fragments"]] == [[0, 5], [5, 10]]


def test_a_fragment_is_the_monomer_in_the_complex_basis(formic):
    """Fragment 2 equals a plain run of the dimer with fragment 1's atoms written as ghosts."""
    lines = open(FORMIC).read().splitlines()[2:]
    ghosted = "; ".join(("@" + line.strip()) if k < 5 else line.strip()
                        for k, line in enumerate(lines))
    plain = dfmp2.run(ghosted)
    frag2 = formic.interaction["totals_eh"]["fragments"][1]
    assert abs(frag2["mp2"] - plain.e_tot) <= TOL_OUTCORE
    assert plain.molecule.nghost == 5


def test_three_fragments_and_charged_ones():
    # water, ammonium, water: charges 0, +1, 0
    geometry = ("O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.587; "
                "N 2.9 0 0; H 3.9 0 0; H 2.55 0.95 0; H 2.55 -0.47 0.82; H 2.55 -0.47 -0.82; "
                "O 5.8 0 0; H 5.8 0.757 0.587; H 5.8 -0.757 0.587")
    result = run_counterpoise(geometry, [3, 5, 3], fragment_charges="0,1,0", charge=1,
                              basis="sto-3g", auxbasis="def2-svp-ri")
    inter = result.interaction
    assert [f["charge"] for f in inter["fragments"]] == [0, 1, 0]
    assert len(inter["totals_eh"]["fragments"]) == 3
    assert inter["mp2"]["eh"] < 0.0  # bound


@pytest.mark.parametrize("kwargs, message", [
    ({"fragments": "5,4"}, "counts 9 atoms; the molecule has 10"),
    ({"fragments": "10"}, "at least two positive atom counts"),
    ({"fragments": "5,x"}, "expected whole numbers"),
    ({"fragments": "5,,5"}, "with none left empty"),
    ({"fragments": "5,5", "fragment_charges": "30,-30"},
     r"fragment 1: charge \+30 takes away 30 electrons of its 24"),
    ({"fragments": "5,5", "fragment_charges": "1,0"}, "sum to 1; the complex's charge is 0"),
    ({"fragments": "5,5", "fragment_charges": "0,0,0"}, "3 values for 2 fragments"),
    ({"fragments": "5,5", "fragment_spins": "1,0"},
     r"fragment 1: 24 electrons cannot have 2S = 1 \(2S must have the parity"),
    ({"fragments": "5,5", "fragment_spins": "-2,0"}, r"2S = -2 \(2S cannot be negative"),
    ({"fragments": "5,5", "fragment_spins": "26,0"}, "more unpaired electrons than its 24"),
    # 2S = 2 and 0 couple to 2 only: the singlet complex's fragments were accepted, E(int)
    # 176 kcal/mol off
    ({"fragments": "5,5", "fragment_spins": "2,0"},
     "couple to a total 2S from 2 to 2, not to the complex's 2S = 0"),
    ({"fragments": "5,5", "spin": 2}, "2S = 0,0 couple to a total 2S from 0 to 0, not to the "
                                      "complex's 2S = 2"),
])
def test_wrong_fragments_are_one_line(kwargs, message):
    fragments = kwargs.pop("fragments")
    with pytest.raises(InputError, match=message):
        run_counterpoise(FORMIC, fragments, **kwargs)


def test_what_a_fragment_cannot_run_is_refused_before_the_complexs_scf(monkeypatch):
    import dfmp2.api

    def no_scf(*_args, **_kwargs):
        raise AssertionError("an SCF ran before the fragments were checked")

    monkeypatch.setattr(dfmp2.api, "run_scf", no_scf)
    # frozen=N froze N orbitals in the complex and N in each fragment: E(int) MP2 -76 kcal/mol
    for frozen in (2, [0, 1]):
        with pytest.raises(InputError, match="frozen=.* with a counterpoise correction: .*"
                                             "use frozen_core"):
            run_counterpoise(FORMIC, "5,5", basis="sto-3g", frozen=frozen)
    # what concerns the complex is said as its own run says it, not as a fragment's
    with pytest.raises(InputError, match="^scratch directory '/nonexistent'"):
        run_counterpoise(FORMIC, "5,5", basis="sto-3g", scratch_dir="/nonexistent")
    # OH...OH as a closed-shell complex: each fragment is a doublet, which RHF cannot hold
    with pytest.raises(InputError, match=r"fragment 1 \(atoms 1-2\): an RHF reference needs "
                                         "2S = 0, got 2S = 1"):
        run_counterpoise("O 0 0 0; H 0 0 0.97; O 0 0 3; H 0 0 3.97", "2,2", basis="sto-3g",
                         reference="rhf")


def test_the_checks_before_the_scf_leave_their_warnings_to_the_runs(caplog):
    with caplog.at_level("WARNING", logger="dfmp2"):
        run_counterpoise("He 0 0 0; He 0 0 3.0", "1,1", basis="cc-pvdz", max_memory=10**9)
    beyond = [r for r in caplog.records if "is more than" in r.getMessage()]
    # the complex's run and each fragment's, in the complex's basis and in its own, each once
    assert len(beyond) == 5


def test_cli_counterpoise_prints_and_records(tmp_path, formic):
    out = tmp_path / "cp.json"
    result = CliRunner().invoke(main, ["run", FORMIC, "--counterpoise", "--fragments", "5,5",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "Counterpoise-corrected interaction energy, 2 fragments" in result.output
    assert "E(int) MP2" in result.output and "kcal/mol" in result.output
    # the totals E(int) is made of, the complex's then each fragment's, each to 12 decimals
    lines = result.stdout.splitlines()
    head = next(k for k, line in enumerate(lines) if line.lstrip().startswith("totals (Eh)"))
    assert lines[head].split()[2:] == ["complex", "fragment", "1", "fragment", "2"]
    totals = formic.interaction["totals_eh"]
    mp2 = next(line for line in lines[head:] if line.split()[0] == "E(MP2)").split()[1:]
    assert [float(v) for v in mp2] == pytest.approx(
        [totals["complex"]["mp2"], *(f["mp2"] for f in totals["fragments"])], abs=TOL_OUTCORE)
    assert all(len(v.split(".")[1]) == 12 for v in mp2)
    data = json.loads(out.read_text())
    v1.AtomicResult(**data)  # still a valid AtomicResult, its fragments QCSchema's
    molecule = data["molecule"]
    assert molecule["fragments"] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    assert molecule["fragment_charges"] == [0.0, 0.0]
    assert molecule["fragment_multiplicities"] == [1, 1]
    assert data["extras"]["interaction"]["mp2"]["eh"] == pytest.approx(
        formic.interaction["mp2"]["eh"], abs=TOL_OUTCORE)
    batch = CliRunner().invoke(main, ["run", FORMIC, FORMIC, "--counterpoise", "--fragments",
                                      "5,5", "-q"])
    assert batch.exit_code == 0, batch.output
    heads, *rows = [line for line in batch.stdout.splitlines() if line.strip()]
    assert heads.split()[-6:] == ["E(int)", "HF", "E(int)", "MP2", "E(int)", "SCS-MP2"]
    for row in rows:  # the table carries each entry's interaction energies (Eh)
        assert float(row.split()[-2]) == pytest.approx(formic.interaction["mp2"]["eh"],
                                                       abs=TOL_OUTCORE)
    for args, message in ((["--fragments", "5,5"], "belong to --counterpoise"),
                          (["--counterpoise"], "--counterpoise needs --fragments")):
        failed = CliRunner().invoke(main, ["run", FORMIC, *args])
        assert failed.exit_code == 1 and message in failed.output


def test_threads_hold_every_run_of_the_job_and_are_put_back():
    """run_counterpoise(threads=) as dfmp2.run(threads=): each run's record says the pools ran
    on that count, and the process's counts are back afterwards (it was refused as an unknown
    option)."""
    from dfmp2 import threads

    dimer = "He 0 0 0; He 0 0 3.0"
    with threads.limit(2):  # the pools at 2 around it, whatever the suite's environment
        before = threads.counts()
        assert before["torch"] == before["pyscf_openmp"] == 2
        result = run_counterpoise(dimer, "1,1", basis="sto-3g", auxbasis="def2-svp-ri",
                                  threads=1)
        assert result.backend.cpu_blas["threads"]["torch"] == 1
        assert result.backend.cpu_blas["threads"]["pyscf_openmp"] == 1
        assert set(result.backend.cpu_blas["threads"]["openblas"].values()) == {1}
        assert threads.counts() == before
    with pytest.raises(InputError, match="threads must be a whole number from 1"):
        run_counterpoise(dimer, "1,1", basis="sto-3g", auxbasis="def2-svp-ri", threads=0)


def test_a_one_atom_fragment_is_named_as_one():
    from dfmp2.results import _interaction_lines

    line = _interaction_lines({"levels": {}, "fragments": [
        {"atoms": [0, 1], "charge": 1, "multiplicity": 1},
        {"atoms": [1, 4], "charge": 0, "multiplicity": 1}]})[0]
    assert "atom 1 (charge +1, multiplicity 1), atoms 2-4 (charge +0" in line


@pytest.mark.parametrize("ghost", ["ghost-I", "X-I"])
def test_a_ghost_gets_the_generated_fitting_set_of_its_real_element(ghost):
    """def2-SVP-RI has no iodine: PySCF generates an even-tempered set from the nuclear charge,
    which is zero for a ghost (12 s shells instead of 50 of s to i), so a fragment's ghost atom
    was not fitted as in the complex."""
    from dfmp2.integrals import make_auxmol
    from dfmp2.molecule import build_mole
    from dfmp2.options import Options
    from dfmp2.scf import jk_auxbasis

    with_ghost = build_mole(f"H 0 0 0; H 0 0 0.74; {ghost} 0 0 3.5", basis="def2-svp")
    real = build_mole("H 0 0 0; H 0 0 0.74; I 0 0 3.5", basis="def2-svp", spin=1)
    for jk in (False, True):
        aux = [make_auxmol(m, jk_auxbasis(m, Options()) if jk else None, jk=jk)
               for m in (with_ghost, real)]
        shells = [[(a.bas_angular(b), tuple(a.bas_exp(b))) for b in range(a.nbas)
                   if a.bas_atom(b) == 2] for a in aux]
        assert len(shells[0]) > 12 and shells[0] == shells[1]


DIMER = ("O -1.551007 -0.114520 0.000000; H -1.934259 0.762503 0.000000; "
         "H -0.599677 0.040712 0.000000; O 1.350625 0.111469 0.000000; "
         "H 1.680398 -0.373741 -0.758561; H 1.680398 -0.373741 0.758561")


def test_a_ghost_keeps_its_atoms_labelled_basis():
    """A Mole whose basis is keyed by an atom's label (O1 in cc-pVDZ, the other O in STO-3G):
    O1's ghost in the other fragment had STO-3G, and E(int) MP2 was 4e-4 Eh off. Each fragment
    now equals a run of the same ghosted Mole built by hand."""
    from pyscf import gto

    basis = {"O1": "cc-pvdz", "O": "sto-3g", "H": "sto-3g"}
    mol = gto.M(atom=DIMER.replace("O -1.551007", "O1 -1.551007", 1), basis=basis, verbose=0)
    result = run_counterpoise(mol, "3,3")
    atoms = [(label, mol.atom_coord(k)) for k, (label, _) in enumerate(mol._atom)]
    for k, part in enumerate(result.interaction["totals_eh"]["fragments"]):
        ghosted = [(label if (k == 0) == (i < 3) else "GHOST-" + label, xyz)
                   for i, (label, xyz) in enumerate(atoms)]
        by_hand = gto.M(atom=ghosted, unit="Bohr", verbose=0,
                        basis={**basis, **{"GHOST-" + key: v for key, v in basis.items()}})
        assert by_hand.nao_nr() == mol.nao_nr() == 23
        assert part["mp2"] == pytest.approx(dfmp2.run(by_hand).e_tot, abs=TOL_FP64)


def test_a_mole_with_settings_given_beside_it_is_the_complex_they_make():
    """run_counterpoise(mole, charge=-1) ran the complex as an anion and its fragments from the
    Mole's own neutral charge; now the settings make the complex, and its fragments must sum
    to its charge and couple to its 2S."""
    from pyscf import gto

    fw = gto.M(atom="F 0 0 0; O 0 0 2.6; H 0 0.76 3.2; H 0 -0.76 3.2", basis="sto-3g",
               spin=1, verbose=0)
    with pytest.raises(InputError, match="the complex has charge -1: give --fragment-charges"):
        run_counterpoise(fw, "1,3", charge=-1, spin=0)
    anion = run_counterpoise(fw, "1,3", charge=-1, spin=0, fragment_charges="-1,0")
    assert [f["charge"] for f in anion.interaction["fragments"]] == [-1, 0]
    dimer = gto.M(atom=DIMER, basis="sto-3g", verbose=0)
    with pytest.raises(InputError, match="not to the complex's 2S = 2"):
        run_counterpoise(dimer, "3,3", spin=2)


@pytest.mark.parametrize("extra", [["--basis", "def2-svp", "--ecp", "def2-svp"],
                                   ["--basis", "cc-pvdz-pp"]])
def test_a_fragment_runs_in_the_complexs_basis_and_ecps_as_resolved(extra):
    """An ECP named for the complex has no potential for the water fragment (refused: 'no
    potential for any element'), and cc-pVDZ-PP's hydrogen takes cc-pVDZ in the complex only
    (refused in the fragment); each fragment now carries the complex's basis and ECPs."""
    result = CliRunner().invoke(main, ["run", "H 0 0 0; I 0 0 1.609; O 0 3.5 0; H 0 4.2 0.5; "
                                       "H 0 2.8 0.5", *extra, "--counterpoise", "--fragments",
                                       "2,3", "--json", "-"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)["extras"]
    assert record["method"]["ecp"] == {"I": {"name": extra[1], "core_electrons": 28}}
    assert abs(record["interaction"]["mp2"]["eh"]) < 0.01


def test_fragments_keep_the_complexs_cartesian_functions_and_ecp_none(caplog):
    """A cart=True complex's fragments had spherical functions (Ne2 cc-pVDZ: 30 against 28);
    with ecp='none' a fragment warned to pass the ECP the user had turned off."""
    import logging

    from pyscf import gto

    from dfmp2.counterpoise import Fragments, _fragment_mole

    ne2 = gto.M(atom="Ne 0 0 0; Ne 0 0 3.1", basis="cc-pvdz", cart=True, verbose=0)
    frag = _fragment_mole(ne2, Fragments((1, 1), (0, 0), (0, 0)), 0)
    frag.build(False, False)
    assert frag.nao_nr() == ne2.nao_nr() == 30
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        run_counterpoise("Ne 0 0 0; Xe 0 0 3.9", "1,1", basis="def2-svp", ecp="none")
    assert "has no ECP" not in caplog.text and "ecp='none'" in caplog.text


def _dimer_input(tmp_path, **molecule) -> str:
    from pyscf import gto

    mol = gto.M(atom=DIMER, verbose=0)
    data = {"schema_name": "qcschema_input", "schema_version": 1, "driver": "energy",
            "model": {"method": "mp2", "basis": "sto-3g"},
            "molecule": {"symbols": [mol.atom_symbol(k) for k in range(6)],
                         "geometry": mol.atom_coords().ravel().tolist(), **molecule}}
    path = tmp_path / "dimer.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_schema_inputs_fragments_are_the_counterpoise_fragments(tmp_path):
    """molecule.fragments of a QCSchema input: used when --fragments is not given, refused when
    --fragments says otherwise (it ran 2,4 against the input's 3,3, and its record echoed both),
    refused when not consecutive; an input without them needs --fragments."""
    given = _dimer_input(tmp_path, fragments=[[0, 1, 2], [3, 4, 5]])
    ran = CliRunner().invoke(main, ["run", given, "--counterpoise", "--json", "-"])
    assert ran.exit_code == 0, ran.output
    record = json.loads(ran.stdout)
    assert [f["atoms"] for f in record["extras"]["interaction"]["fragments"]] == [[0, 3], [3, 6]]
    for args, message in (
            (["--fragments", "2,4"], "--fragments 2,4 contradicts the input's molecule (3,3)"),
            (["--fragments", "3,3", "--fragment-spins", "1,1"], "--fragment-spins 1,1 "
                                                                "contradicts")):
        refused = CliRunner().invoke(main, ["run", given, "--counterpoise", *args])
        assert refused.exit_code == 1 and message in refused.output, refused.output
    apart = _dimer_input(tmp_path, fragments=[[0, 1, 3], [2, 4, 5]])  # qcelemental's refusal
    refused = CliRunner().invoke(main, ["run", apart, "--counterpoise"])
    assert refused.output.count("\n") == 1 and "non-contiguous fragments" in refused.output
    bare = _dimer_input(tmp_path)
    refused = CliRunner().invoke(main, ["run", bare, "--counterpoise"])
    assert refused.exit_code == 1 and "or molecule.fragments in the input" in refused.output


def test_a_fragment_that_fails_says_the_totals_finished_before_it():
    """The complex's SCF and MP2 had run; a fragment's failure then returned nothing of them."""
    from dfmp2.errors import ConvergenceError

    with pytest.raises(ConvergenceError, match=r"^fragment 2 \(atom 2\): .*did not converge.*; "
                                               r"finished before it: the complex -\d+\.\d{10} Eh"
                                               r", fragment 1 -\d+\.\d{10} Eh"):
        run_counterpoise("H 0 0 0; I 0 0 1.609", "1,1", basis="def2-svp", max_cycle=10)


def test_psi4s_rule_warns_where_a_fragment_gets_a_shell_back(caplog):
    """Li+ beside water: the complex freezes Li 1s and O 1s, the Li+ fragment alone keeps its
    1s (Psi4 gives the shell back to a molecule with no valence electron), so E(int) compares
    two cores: said in a WARNING. PySCF's table freezes them alike and says nothing."""
    import logging

    complex_ = "Li 0 0 0; O 0 0 1.9; H 0 0.76 2.5; H 0 -0.76 2.5"
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        dfmp2.run_counterpoise(complex_, "1,3", basis="sto-3g", charge=1,
                               fragment_charges="1,0", frozen_core=True, core_rule="psi4")
    assert "the fragments freeze 1 core orbitals (0 + 1), the complex 2" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        dfmp2.run_counterpoise("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59; O 0 0 3; H 0 0.76 3.59; "
                               "H 0 -0.76 3.59", "3,3", basis="sto-3g", frozen_core=True,
                               core_rule="psi4")
    assert "core orbitals" not in caplog.text


#: The water dimer of /work/shared/molecules/water2.xyz (O-O 3.0 A, Angstrom).
WATER2 = ("O -1.78894800 -0.11910924 -0.08296757; H -1.03948415 -0.02090672 -0.67024267; "
          "H -1.41501048 -0.46455171 0.72763225; O 1.21105200 -0.11910924 -0.08296757; "
          "H 1.75857811 0.02709306 0.68844145; H 1.27381251 0.69658385 -0.57989588")
WATER2_ARGS = [WATER2, "--counterpoise", "--fragments", "3,3", "--basis", "6-31g"]


@pytest.fixture(scope="module")
def water2():
    return run_counterpoise(WATER2, "3,3", basis="6-31g")


def test_uncorrected_energy_is_the_complex_less_the_fragments_computed_apart(water2):
    """Each fragment in its own basis is the monomer alone (PySCF's DF-RHF and DF-MP2 on the
    same fitting sets, and dfmp2.run of its atoms); E(int) uncorrected is the complex's total
    less theirs."""
    from pyscf import gto, scf

    from conftest import pyscf_dfmp2

    inter = water2.interaction
    own = inter["totals_eh"]["fragments_own_basis"]
    atoms = WATER2.split("; ")
    apart = []
    for k, fragment in enumerate(("; ".join(atoms[:3]), "; ".join(atoms[3:]))):
        mol = gto.M(atom=fragment, basis="6-31g", verbose=0)
        mf = scf.RHF(mol).density_fit(auxbasis="cc-pvdz-jkfit")
        mf.conv_tol = 1e-12
        mf.kernel()
        mp2 = pyscf_dfmp2(mf, "cc-pvdz-ri")
        apart.append({"hf": mf.e_tot, "mp2": mp2.e_tot})
        alone = dfmp2.run(fragment, basis="6-31g")
        assert alone.molecule.nghost == 0 and alone.method.auxbasis == {"H": "cc-pvdz-ri",
                                                                       "O": "cc-pvdz-ri"}
        assert abs(own[k]["scs_mp2"] - alone.e_scs_tot) <= TOL_SEPARATE_FRAGMENT
    for level, complex_total in (("hf", water2.e_scf), ("mp2", water2.e_tot)):
        for k in range(2):
            assert abs(own[k][level] - apart[k][level]) <= TOL_SEPARATE_FRAGMENT
        expected = complex_total - sum(part[level] for part in apart)
        assert abs(inter["uncorrected"][level]["eh"] - expected) <= TOL_SEPARATE_FRAGMENT
    to_kcal = inter["hartree_to_kcal_mol"]
    for level in ("hf", "mp2", "scs_mp2"):
        uncorrected = inter["uncorrected"][level]
        assert uncorrected["kcal_mol"] == uncorrected["eh"] * to_kcal
    # the CP-corrected E(int) is what it was: the fragments in the complex's basis
    assert inter["mp2"]["eh"] == water2.e_tot - sum(f["mp2"] for f in
                                                    inter["totals_eh"]["fragments"])


def test_bsse_is_the_corrected_less_the_uncorrected_energy_and_positive(water2):
    inter = water2.interaction
    totals = inter["totals_eh"]
    for level in ("hf", "mp2", "scs_mp2"):
        bsse = inter["bsse"][level]
        assert bsse["eh"] == inter[level]["eh"] - inter["uncorrected"][level]["eh"]
        # sum_k [E(k, own basis) - E(k, complex's basis)]: each ghost lowers its fragment
        per_fragment = [own[level] - ghosted[level] for own, ghosted in
                        zip(totals["fragments_own_basis"], totals["fragments"])]
        assert all(value > 0.0 for value in per_fragment)
        assert abs(bsse["eh"] - sum(per_fragment)) <= TOL_IDENTITY
        assert bsse["kcal_mol"] == bsse["eh"] * inter["hartree_to_kcal_mol"]
    assert inter["bsse"]["hf"]["eh"] > 0.0 and inter["bsse"]["mp2"]["eh"] > 0.0


def _counterpoise_section(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if "Counterpoise-corrected" in line)
    return lines[start:]


def test_summary_and_show_print_the_uncorrected_energy_and_the_bsse(tmp_path, water2):
    out = tmp_path / "cp.json"
    ran = CliRunner().invoke(main, ["run", *WATER2_ARGS, "--json", str(out)])
    assert ran.exit_code == 0, ran.output
    section = _counterpoise_section(ran.stdout)
    inter = water2.interaction
    rows = {line[:29].strip(): line[29:].split() for line in section}
    for level, label in inter["levels"].items():
        for name, values in ((f"E(int) uncorrected {label}", inter["uncorrected"]),
                             (f"BSSE {label}", inter["bsse"])):
            # '-0.007567207282 Eh -4.7485 kcal/mol': the decimals of the E(int) lines
            assert rows[name] == [f"{values[level]['eh']:.12f}", "Eh",
                                  f"{values[level]['kcal_mol']:.4f}", "kcal/mol"]
    # the Eh of every E(int), uncorrected and BSSE line ends in the same column
    ends = {line.index(" Eh ") for line in section if " Eh " in line}
    assert len(ends) == 1
    head = next(k for k, line in enumerate(section) if "own-basis totals (Eh)" in line)
    assert section[head].split()[3:] == ["fragment", "1", "fragment", "2"]
    own = [float(v) for v in section[head + 2].split()[1:]]  # E(MP2) in each fragment's basis
    assert own == pytest.approx([f["mp2"] for f in inter["totals_eh"]["fragments_own_basis"]],
                                abs=TOL_OUTCORE)
    shown = CliRunner().invoke(main, ["show", str(out)])
    assert shown.exit_code == 0, shown.output
    assert _counterpoise_section(shown.stdout) == section
    record = json.loads(out.read_text())["extras"]["interaction"]
    assert set(record["uncorrected"]) == set(record["bsse"]) == {"hf", "mp2", "scs_mp2"}
    assert len(record["totals_eh"]["fragments_own_basis"]) == 2


def test_quiet_prints_the_interaction_energy(tmp_path, water2):
    """-q of a counterpoise run: the CP-corrected E(int) at MP2 (a QCSchema input's scs-mp2:
    at SCS-MP2), in Eh, as -q prints a total."""
    quiet = CliRunner().invoke(main, ["run", *WATER2_ARGS, "-q"])
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stdout == f"{water2.interaction['mp2']['eh']:.12f}\n"
    given = _dimer_input(tmp_path, fragments=[[0, 1, 2], [3, 4, 5]])
    data = json.loads(open(given).read())
    data["model"]["method"] = "scs-mp2"
    (tmp_path / "scs.json").write_text(json.dumps(data))
    scs = CliRunner().invoke(main, ["run", str(tmp_path / "scs.json"), "--counterpoise", "-q"])
    assert scs.exit_code == 0, scs.output
    dimer = run_counterpoise(DIMER, "3,3", basis="sto-3g")
    assert float(scs.stdout) == pytest.approx(dimer.interaction["scs_mp2"]["eh"],
                                              abs=TOL_OUTCORE)


def test_a_record_from_before_the_own_basis_runs_still_loads(water2):
    from copy import deepcopy

    from dfmp2.results import Result

    data = deepcopy(water2.to_dict())  # (its interaction is the result's own dict)
    inter = data["extras"]["interaction"]
    for key in ("uncorrected", "bsse"):
        del inter[key]
    del inter["totals_eh"]["fragments_own_basis"]
    old = Result.from_dict(data)
    text = old.summary()
    assert "E(int) MP2" in text and "uncorrected" not in text and "BSSE" not in text
    assert _counterpoise_section(text) == _counterpoise_section(water2.summary())[:8]
    # what a record carries of them is checked, as every other number is
    for edit, message in (
            (lambda d: d["uncorrected"]["mp2"].pop("eh"), "lacks a number at uncorrected.mp2.eh"),
            (lambda d: d.pop("bsse"), r"extras.interaction.bsse is a JSON object, got NoneType"),
            (lambda d: d["totals_eh"]["fragments_own_basis"][1].pop("hf"),
             r"lacks a number at totals_eh.fragments_own_basis\[1\].hf"),
            (lambda d: d["totals_eh"].update(fragments_own_basis={}),
             "totals_eh.fragments_own_basis is not a list")):
        data = deepcopy(water2.to_dict())
        edit(data["extras"]["interaction"])
        with pytest.raises(InputError, match=message):
            Result.from_dict(data)


def test_a_fragment_that_fails_in_its_own_basis_fails_the_run(monkeypatch):
    """A fragment's run in its own basis fails the counterpoise run as its run in the
    complex's basis does: one line naming it, with the totals finished before it."""
    import dfmp2.api
    from dfmp2.errors import ConvergenceError

    real_run, calls = dfmp2.api.run, []

    def fifth_fails(geometry, **options):  # complex, 2 in the complex's basis, 2 in their own
        calls.append(geometry)
        if len(calls) == 5:
            raise ConvergenceError("SCF did not converge in 50 cycles")
        return real_run(geometry, **options)

    monkeypatch.setattr(dfmp2.api, "run", fifth_fails)
    with pytest.raises(ConvergenceError, match=(
            r"^fragment 2 \(atoms 4-6\) in its own basis: SCF did not converge in 50 cycles; "
            r"finished before it: the complex -\d+\.\d{10} Eh, fragment 1 -\d+\.\d{10} Eh, "
            r"fragment 2 -\d+\.\d{10} Eh, fragment 1 in its own basis -\d+\.\d{10} Eh "
            r"\(total energies\)$")):
        run_counterpoise(DIMER, "3,3", basis="sto-3g")
    assert len(calls[4].atom) == 3  # no ghost atoms
    calls.clear()
    failed = CliRunner().invoke(main, ["run", DIMER, "--counterpoise", "--fragments", "3,3",
                                       "--basis", "sto-3g"])
    assert failed.exit_code == 1
    assert failed.output.count("\n") == 1 and "in its own basis: SCF did not" in failed.output
