"""Every printed digit is one the run vouches for: a float64 run prints 12 decimals, a run whose
MP2 step ran below float64 (``--precision mixed``/``fp32``, NKI's float32 stages, bf16x3
products) prints its MP2 energies only to the decimal its rounding leaves, says so in one
line, and the error it claims holds against the float64 energies of the same orbitals."""

import json
import re
from dataclasses import replace

import pytest
from click.testing import CliRunner
from pyscf import gto, scf

import dfmp2
from dfmp2.cli import main
from dfmp2.results import (
    FULL_DECIMALS,
    REDUCED_PRECISION_REL,
    Result,
    decimals_for,
    precision_error,
)

from tolerances import TOL_IDENTITY

WATER = "O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692"


def _printed(summary: str, label: str) -> str:
    """The number printed on the summary's line that starts with ``label``."""
    line = next(line for line in summary.splitlines() if line.strip().startswith(label))
    return re.search(r"(-?\d+\.\d+) Eh", line).group(1)


@pytest.fixture(scope="module")
def water_mf():
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis="cc-pvdz-jkfit")
    mf.conv_tol = 1e-10
    mf.kernel()
    return mf


@pytest.fixture(scope="module")
def runs(water_mf):
    """The same orbitals' MP2 in float64, mixed and fp32, and on the NKI emulator."""
    out = {p: dfmp2.DFMP2(water_mf, precision=p).run().result for p in ("fp64", "mixed", "fp32")}
    out["nki"] = dfmp2.DFMP2(water_mf, backend="nki", nki_emulator=True).run().result
    return out


def test_a_float64_run_prints_every_decimal_and_no_precision_line(runs):
    fp64 = runs["fp64"]
    assert fp64.precision_error == 0.0 and fp64.corr_decimals == FULL_DECIMALS
    text = fp64.summary()
    assert "precision " not in text
    assert _printed(text, "E(corr) MP2") == f"{fp64.e_corr:.12f}"


@pytest.mark.parametrize("kind", ["mixed", "fp32", "nki"])
def test_a_reduced_precision_run_prints_only_the_digits_it_vouches_for(runs, kind):
    """The claimed error bounds the distance to float64 (so every printed digit holds, up to
    the rounding of the last one), and the summary prints no decimal below it."""
    fp64, run = runs["fp64"], runs[kind]
    error = run.precision_error
    assert 0.0 < error < 1e-5
    for attr in ("e_corr", "e_corr_os", "e_corr_ss", "e_tot", "e_scs"):
        assert abs(getattr(run, attr) - getattr(fp64, attr)) <= error, attr
    d = run.corr_decimals
    assert d == decimals_for(error) and 10.0 ** -d > error
    text = run.summary()
    assert _printed(text, "E(corr) MP2") == f"{run.e_corr:.{d}f}"
    assert _printed(text, "E(MP2) total") == f"{run.e_tot:.{d}f}"
    assert _printed(text, "E(OS) opposite-spin") == f"{run.e_corr_os:.{d}f}"
    # the SCF energy is float64's whatever the MP2 step ran in
    assert _printed(text, "E(HF)") == f"{run.e_scf:.12f}"
    line = next(line for line in text.splitlines() if line.strip().startswith("precision"))
    assert f"printed to 1e-{d} Eh" in line and "pair_energy" in line
    assert ("nki fp32" in line) is (kind == "nki")


def test_precision_error_by_what_ran_below_float64(runs):
    """The relative error of each kind of stage, and records without stage placements."""
    method = runs["fp64"].method
    stages = {s: {"placement": "pytorch fp64", "reason": ""} for s in method.stage_precision}

    def error(precision, **placements):
        records = {**stages, **{s: {"placement": p, "reason": ""} for s, p in placements.items()}}
        return precision_error(replace(method, precision=precision, stage_precision=records),
                               -2.0)

    assert error("fp64") == 0.0
    assert error("mixed", pair_energy="pytorch fp32") == 2.0 * REDUCED_PRECISION_REL["pairs"]
    assert error("fp32", pair_energy="pytorch fp32") == 2.0 * REDUCED_PRECISION_REL["fp32"]
    assert error("fp64", transform="nki fp32", pair_energy="nki fp32") == (
        2.0 * REDUCED_PRECISION_REL["nki"])
    assert error("fp64", pair_energy="nki bf16x3") == 2.0 * REDUCED_PRECISION_REL["bf16x3"]
    # a record written before stages were recorded goes by its precision
    assert precision_error(replace(method, precision="mixed", stage_precision={}), -2.0) == (
        2.0 * REDUCED_PRECISION_REL["pairs"])
    assert precision_error(replace(method, stage_precision={}), -2.0) == 0.0


def test_decimals_for_an_error():
    assert decimals_for(0.0) == FULL_DECIMALS
    assert decimals_for(2.0e-7) == 6 and decimals_for(9.9e-7) == 6 and decimals_for(1.0e-6) == 6
    assert decimals_for(3.3e-6) == 5
    assert decimals_for(1e-20) == FULL_DECIMALS and decimals_for(5.0) == 1
    assert decimals_for(3e-4, most=4) == 3 and decimals_for(0.0, most=4) == 4


def test_a_saved_mixed_record_shows_the_same_digits(runs, tmp_path):
    """``dfmp2 show`` reads the stage placements back and prints what the run printed."""
    path = tmp_path / "mixed.json"
    path.write_text(runs["mixed"].to_json())
    again = Result.read(path)
    assert again.corr_decimals == runs["mixed"].corr_decimals
    assert again.summary() == runs["mixed"].summary()
    # the JSON itself keeps every digit of the energies
    data = json.loads(path.read_text())
    assert data["properties"]["mp2_correlation_energy"] == pytest.approx(
        runs["mixed"].e_corr, abs=TOL_IDENTITY)
    assert data["properties"]["mp2_correlation_energy"] == runs["mixed"].e_corr


def test_cli_quiet_and_batch_rows_print_the_same_digits(tmp_path):
    water = tmp_path / "water.xyz"
    water.write_text("3\nwater\n" + WATER.replace("; ", "\n") + "\n")
    out = tmp_path / "run.json"
    quiet = CliRunner().invoke(main, ["run", str(water), "--precision", "mixed", "-q",
                                      "--json", str(out)])
    assert quiet.exit_code == 0, quiet.output
    result = Result.read(out)
    d = result.corr_decimals
    assert d < FULL_DECIMALS
    assert quiet.stdout.strip() == f"{result.e_tot:.{d}f}"
    batch = CliRunner().invoke(main, ["run", str(water), WATER, "--precision", "mixed",
                                      "--basis", "sto-3g"])
    assert batch.exit_code == 0, batch.output
    rows = [line.split() for line in batch.stdout.splitlines() if "H2O" in line]
    assert len(rows) == 2
    for row in rows:
        e_hf, *correlated = row[-4:]  # E(HF), E(corr), E(MP2) and E(SCS-MP2) totals
        assert len(e_hf.split(".")[1]) == FULL_DECIMALS
        assert all(len(value.split(".")[1]) < FULL_DECIMALS for value in correlated)


def test_counterpoise_levels_with_correlation_print_their_digits(runs):
    """The HF level of an interaction energy keeps 12 decimals; the correlated levels get
    the decimals twice the complex's error leaves (Eh and kcal/mol)."""
    run = runs["mixed"]
    inter = {"fragments": [{"atoms": (0, 1), "charge": 0, "multiplicity": 1},
                           {"atoms": (1, 3), "charge": 0, "multiplicity": 1}],
             "levels": {"hf": "HF", "mp2": "MP2"},
             "hf": {"eh": -0.001234567890123, "kcal_mol": -0.774703},
             "mp2": {"eh": -0.002345678901234, "kcal_mol": -1.471949},
             "hartree_to_kcal_mol": 627.5094740631}
    text = replace(run, interaction=inter).summary()
    assert "-0.001234567890 Eh" in text and "-0.7747 kcal/mol" in text
    d = decimals_for(2.0 * run.precision_error)
    dk = decimals_for(2.0 * run.precision_error * 627.5094740631, most=4)
    assert d < FULL_DECIMALS and dk < 4
    assert f"{-0.002345678901234:.{d}f} Eh" in text and f"{-1.471949:.{dk}f} kcal/mol" in text


def test_a_value_that_rounds_to_zero_prints_no_minus_sign():
    """A closed shell's ROHF singles (about -1e-17 Eh) and UHF <S^2> round to zero: printed as
    0, not -0; a real negative value keeps its sign."""
    from dfmp2.results import _fixed

    rohf = dfmp2.run(WATER, basis="sto-3g", reference="rohf")
    uhf = dfmp2.run(WATER, basis="sto-3g", reference="uhf")
    assert abs(rohf.e_singles) < 10.0**-FULL_DECIMALS
    assert _printed(rohf.summary(), "E(singles)") == "0.000000000000"
    s2_line = next(line for line in uhf.summary().splitlines() if "<S^2>" in line)
    assert "-0.000000" not in s2_line and "<S^2> 0.000000" in s2_line
    assert _fixed(-1e-17, 12, 22) == f"{0.0:22.12f}"
    assert _fixed(-4e-13, 12) == "0.000000000000"
    assert _fixed(-6e-13, 12) == "-0.000000000001" and _fixed(-1e-17, 6, plus=True) == "+0.000000"
