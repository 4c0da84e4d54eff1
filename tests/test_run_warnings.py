"""A run's WARNING lines are part of its record: ``Result.warnings`` and the JSON's
``extras.warnings``, with ``-q`` as without, a counterpoise run's fragments named; ``dfmp2
show`` prints them; a program that set up no logging still sees them on stderr; one thread's
run keeps only its own."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner
from pyscf import df, scf

import dfmp2
from dfmp2._logged import kept_warnings
from dfmp2.cli import main
from dfmp2.errors import InputError
from dfmp2.molecule import build_mole
from dfmp2.results import Result

from conftest import INPUTS
from tolerances import TOL_SCF_TIGHT

WATER = str(INPUTS / "water.xyz")
#: PySCF's table would give this basis cc-pVDZ-RI, whose f functions on O cannot fit its f x f
#: products: dfmp2 warns (test_basis_records.py), and a small run says so every time.
SHORT_FIT = ["--basis", "6-31g(2df,p)", "--auxbasis", "cc-pvdz-ri"]
SHORT_FIT_TEXT = "fitting set reaches no higher angular momentum than the orbital basis on O"
DIMER = ("O -1.551007 -0.114520 0.000000; H -1.934259 0.762503 0.000000; "
         "H -0.599677 0.040712 0.000000; O 1.350625 0.111469 0.000000; "
         "H 1.680398 -0.373741 -0.758561; H 1.680398 -0.373741 0.758561")


@pytest.mark.parametrize("quiet", [False, True], ids=["default", "quiet"])
def test_the_json_keeps_the_warnings_the_terminal_showed(tmp_path, quiet):
    out = tmp_path / "w.json"
    ran = CliRunner().invoke(main, ["run", WATER, *SHORT_FIT, "--json", str(out),
                                    *(["-q"] if quiet else [])])
    assert ran.exit_code == 0, ran.output
    kept = json.loads(out.read_text())["extras"]["warnings"]
    assert len(kept) == 1 and SHORT_FIT_TEXT in kept[0]
    # -q shows errors only; without it the warning was logged once, not repeated in the summary
    assert (SHORT_FIT_TEXT in ran.stderr) is not quiet and "warning:" not in ran.stdout
    shown = CliRunner().invoke(main, ["show", str(out)])
    assert shown.exit_code == 0 and f"  warning: {kept[0]}" in shown.stdout.splitlines()


def test_a_run_without_warnings_records_none_and_reads_back():
    result = dfmp2.run(WATER, basis="sto-3g")
    assert result.warnings == () and result.to_dict()["extras"]["warnings"] == []
    again = Result.from_json(result.to_json())
    assert again.warnings == () and again.summary() == result.summary()
    older = result.to_dict()
    del older["extras"]["warnings"]  # a record written before warnings were kept
    assert Result.from_dict(older).warnings == ()
    for bad in ("one line", [1], {"a": "b"}):
        older["extras"]["warnings"] = bad
        with pytest.raises(InputError, match="extras.warnings is .* not a list of strings"):
            Result.from_dict(older)


def test_a_program_without_logging_set_up_still_sees_the_warning():
    """The record's handler on the ``dfmp2`` logger must not silence Python's last resort."""
    script = (f"import dfmp2; r = dfmp2.run({WATER!r}, basis='6-31g(2df,p)', "
              "auxbasis='cc-pvdz-ri'); print(len(r.warnings))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1" and done.stderr.count(SHORT_FIT_TEXT) == 1


def test_dfmp2_of_an_scf_object_keeps_its_warnings():
    mol = build_mole(WATER, basis="cc-pvdz")
    mf = scf.RHF(mol).density_fit(auxbasis="cc-pvdz-jkfit")
    mf.conv_tol = 1e-6
    mf.verbose = 0
    mf.kernel()
    pt = dfmp2.DFMP2(mf).run()
    assert any("converged to conv_tol = 1e-06" in text for text in pt.result.warnings)
    assert isinstance(mf.with_df, df.DF)


def test_a_loose_conv_tol_beside_a_tight_gradient_is_not_a_warning():
    """PySCF converges on both thresholds: conv_tol 1e-4 with dfmp2's gradient 1e-7 gives the
    default run's energies, so no warning of an error of 1e-3 Eh; a loose gradient beside it
    still is one."""
    loose = dfmp2.run(WATER, basis="sto-3g", conv_tol=1e-4)
    default = dfmp2.run(WATER, basis="sto-3g")
    assert not loose.warnings
    assert loose.e_tot == pytest.approx(default.e_tot, abs=TOL_SCF_TIGHT)
    warned = dfmp2.run(WATER, basis="sto-3g", conv_tol=1e-4, conv_tol_grad=1e-2).warnings
    assert any("converged to conv_tol = 1e-04" in text for text in warned)


def test_a_counterpoise_run_names_its_fragments_warnings():
    result = dfmp2.run_counterpoise(DIMER, "3,3", basis="6-31g(2df,p)", auxbasis="cc-pvdz-ri")
    assert len(result.warnings) == 5 and all(SHORT_FIT_TEXT in t for t in result.warnings)
    assert [t.split(":")[0] for t in result.warnings[1:]] == [
        "fragment 1", "fragment 2", "fragment 1 in its own basis", "fragment 2 in its own basis"]
    assert SHORT_FIT_TEXT in result.warnings[0] and not result.warnings[0].startswith("frag")


def test_the_terminal_names_a_counterpoise_fragments_lines_as_the_record_does():
    """On the command's stderr each fragment's warning carries the name it has in the record
    (five alike-looking lines otherwise), and a thread's label stays in that thread."""
    out = CliRunner().invoke(main, ["run", DIMER, *SHORT_FIT, "--counterpoise", "--fragments",
                                    "3,3"])
    assert out.exit_code == 0, out.output
    lines = [line for line in out.output.splitlines() if SHORT_FIT_TEXT in line]
    assert [line.split(":")[1].strip() for line in lines[1:]] == [
        "fragment 1", "fragment 2", "fragment 1 in its own basis", "fragment 2 in its own basis"]
    assert lines[0].startswith("WARNING: ") and "fragment" not in lines[0]
    from dfmp2._logged import LabelledFormatter, labelled

    record = logging.makeLogRecord({"msg": "m", "levelname": "WARNING",
                                    "levelno": logging.WARNING})
    seen = []
    with labelled("fragment 9"):
        thread = threading.Thread(target=lambda: seen.append(
            LabelledFormatter("%(message)s").format(record)))
        thread.start()
        thread.join()
        seen.append(LabelledFormatter("%(message)s").format(record))
    assert seen == ["m", "fragment 9: m"]


def test_each_thread_keeps_only_its_own_warnings():
    logger = logging.getLogger("dfmp2.test_threads")
    ready, kept = threading.Barrier(2), {}

    def work(name: str) -> None:
        with kept_warnings() as warned:
            ready.wait()
            logger.warning("from %s", name)
            with kept_warnings() as inner:  # a nested block: both keep it
                logger.warning("inner %s", name)
            ready.wait()
        kept[name] = (list(warned), list(inner))

    threads = [threading.Thread(target=work, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert kept == {name: ([f"from {name}", f"inner {name}"], [f"inner {name}"])
                    for name in ("a", "b")}
    assert not any(type(h).__name__ == "_Keeper" for h in logging.getLogger("dfmp2").handlers)


def test_the_commands_own_warnings_join_the_record(tmp_path):
    """A warning the command logs before the run (--dist-backend outside torchrun) is in the
    record as on the terminal."""
    out = tmp_path / "w.json"
    ran = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--dist-backend", "gloo",
                                    "--json", str(out)])
    assert ran.exit_code == 0, ran.output
    kept = json.loads(out.read_text())["extras"]["warnings"]
    assert len(kept) == 1 and "--dist-backend applies under torchrun only" in kept[0]
    assert ran.stderr.count("--dist-backend applies under torchrun only") == 1


def test_a_counterpoise_record_keeps_the_complexs_geometry_warning_once(tmp_path):
    path = tmp_path / "dimer.xyz"
    path.write_text("6\ncharge=1\n" + DIMER.replace("; ", "\n") + "\n")
    result = dfmp2.run_counterpoise(str(path), "3,3", basis="sto-3g", charge=0)
    stated = [text for text in result.warnings if "states charge 1" in text]
    assert len(stated) == 1, result.warnings


def test_the_clis_logging_set_up_keeps_another_threads_record(tmp_path):
    """The command replaces the dfmp2 logger's handlers (a notebook calling main() while a run
    goes on in a background thread): that run still keeps its warnings, and the keeper leaves
    the logger once the run is over."""
    from dfmp2._logged import keeper_handlers
    from dfmp2.cli import _configure_logging

    logger = logging.getLogger("dfmp2.test_cli_setup")
    opened, configured, kept = threading.Event(), threading.Event(), []

    def run() -> None:
        with kept_warnings() as warned:
            opened.set()
            configured.wait(timeout=60)
            logger.warning("after the set-up")
        kept.extend(warned)

    worker = threading.Thread(target=run)
    worker.start()
    opened.wait(timeout=60)
    restore = _configure_logging(0, quiet=True)
    configured.set()
    worker.join()
    restore()
    assert kept == ["after the set-up"]
    assert keeper_handlers(logging.getLogger("dfmp2")) == []


def test_no_virtual_orbitals_name_no_spin_for_the_lumo():
    result = dfmp2.run("He 0 0 0; He 0 0 3", basis="sto-3g", reference="uhf")
    assert result.scf.lumo is None and result.scf.lumo_spin is None
    assert result.scf.homo_spin == "both"


def test_a_counterpoise_record_without_its_numbers_is_refused_in_one_line():
    data = dfmp2.run_counterpoise(DIMER, "3,3", basis="sto-3g").to_dict()
    del data["extras"]["interaction"]["totals_eh"]["fragments"][1]["mp2"]
    with pytest.raises(InputError, match=r"extras.interaction lacks a number at "
                                         r"totals_eh.fragments\[1\].mp2: the file was changed"):
        Result.from_dict(data)


def test_a_tmpdir_python_passes_over_is_warned_about(monkeypatch, tmp_path):
    """TMPDIR naming no writable directory: Python's tempfile quietly takes /tmp instead."""
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path / "none"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # looked up again, past the missing one
    result = dfmp2.run(WATER, basis="sto-3g")
    assert any(f"TMPDIR {str(tmp_path / 'none')!r} is not a writable directory; temporary "
               "files go to" in text for text in result.warnings), result.warnings
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert not any("TMPDIR" in t for t in dfmp2.run(WATER, basis="sto-3g").warnings)


def test_a_singular_scf_fitting_metric_is_named_as_the_scfs():
    """A run factors two metrics, the DF-SCF's JK fit and the MP2 step's; the summary's metric
    line is the MP2 step's. HI in Cartesian def2-SVP: iodine's JK-fit set in Cartesian form is
    linearly dependent (eigenvalues dropped), the MP2 set is not (Cholesky): the warning must
    name the SCF's set, not read as the MP2 metric the record calls Cholesky."""
    result = dfmp2.run("H 0 0 0; I 0 0 1.609", basis="def2-svp", cartesian=True)
    assert len(result.warnings) == 1, result.warnings
    assert "metric of the SCF's fitting basis is not positive definite" in result.warnings[0]
    assert result.method.metric == "cholesky"
