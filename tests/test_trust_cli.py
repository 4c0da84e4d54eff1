"""What a chemist meets at the terminal, as real subprocesses: inputs that used to crash or give a
wrong number, signals from a batch scheduler, a JSON file that cannot be written, the summary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import dfmp2
from dfmp2.cli import main
from dfmp2.errors import Interrupted

from conftest import INPUTS, open_files_under
from tolerances import TOL_OTHER_PROCESS, TOL_SCF_PIN

WATER = str(INPUTS / "water.xyz")


def _dfmp2(*args, timeout=300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dfmp2", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)


def _default_signals() -> None:
    """In a child before it starts: the signals dfmp2 handles back to their default actions (a
    job started in the background, or under nohup, ignores some, and a child inherits that)."""
    from dfmp2._command import SIGNALS

    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def _one_error_line(proc, *needles):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    for needle in needles:
        assert needle in lines[0], lines[0]


# -- the inputs, end to end -----------------------------------------------------------
def test_iodine_with_def2_gets_its_ecp():
    proc = _dfmp2("run", "H 0 0 0; I 0 0 1.609", "--basis", "def2-svp", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    # DF-SCF (def2-universal-jkfit); the exact-integral value, -297.231531663, is in test_ecp.py;
    # all electrons in the same basis would be -1996.9
    e_scf = data["properties"]["scf_total_energy"]
    assert e_scf == pytest.approx(-297.231517985, abs=TOL_SCF_PIN)
    ecp = data["extras"]["method"]["ecp"]
    assert ecp == {"I": {"name": "def2-svp", "core_electrons": 28}}


def test_iodine_all_electron_on_request_and_frozen_core_counts_the_ecp():
    proc = _dfmp2("run", "H 0 0 0; I 0 0 1.609", "--basis", "def2-svp", "--frozen-core")
    assert proc.returncode == 0, proc.stderr
    assert "ECP        I: def2-svp (28 core electrons)" in proc.stdout
    assert "(4 occupied and 0 virtual frozen: frozen core, PySCF's table)" in proc.stdout  # 4s4p
    assert "auxiliary  H: def2-svp-ri, I: even-tempered (PySCF aug_etb, beta=2.0)" in proc.stdout


def test_counterpoise_ghost_atoms_on_the_command_line():
    proc = _dfmp2("run", "O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.587; @O 3 0 0; Gh(H) 3 0.757 "
                  "0.587; ghost-H 3 -0.757 0.587", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["molecule"]["real"] == [True] * 3 + [False] * 3 and proc.stderr == ""
    assert data["extras"]["sizes"]["nbasis"] == 48 and data["extras"]["sizes"]["nocc"] == 5


@pytest.mark.parametrize("args, needles", [
    (["O 0 0 0; H 0 0 0.05; H 0 0.76 0.59"], ["0.0500", "1 (O)", "2 (H)"]),
    (["O 0 0 0; H 0 0 nan; H 0 0.76 0.59"], ["nan"]),
    ([WATER, "--auxbasis", "no-such-fit"], ["no-such-fit", "--auxbasis"]),
    ([str(INPUTS)], ["is a directory"]),
    ([""], ["empty"]),
    (["H 0 0 0; H 0 0 0.74", "--charge", "-4", "--basis", "sto-3g"], ["electrons"]),
    ([WATER, "--ecp", "no-such-ecp"], ["no-such-ecp"]),
    (["H 0 0 0; H 0 0 __import__('os').getpid()"], ["entry 2", "must be numbers"]),
    (["H 0 0 0; H 0 0 0.74 junk"], ["entry 2", "expected 'Element x y z'"]),
], ids=["close-atoms", "nan", "unknown-aux", "directory", "empty", "too-many-electrons",
        "unknown-ecp", "expression", "extra-field"])
def test_bad_input_is_one_line_and_exit_1(args, needles):
    _one_error_line(_dfmp2("run", *args), *needles)


def test_helium_sto3g_has_no_virtuals_and_says_so():
    proc = _dfmp2("run", "He 0 0 0", "--basis", "sto-3g", "--auxbasis", "def2-universal-jkfit")
    assert proc.returncode == 0, proc.stderr
    assert "note: no virtual orbitals" in proc.stdout
    assert "E(corr) MP2                   0.000000000000 Eh" in proc.stdout


# -- 9. nothing computed only to be lost ------------------------------------------------------
def test_unwritable_json_path_fails_before_the_scf(tmp_path):
    start = time.perf_counter()
    _one_error_line(_dfmp2("run", WATER, "--json", "/proc/dfmp2.json"),
                    "cannot write JSON to '/proc/dfmp2.json'")
    missing = tmp_path / "no" / "such" / "dir" / "r.json"
    _one_error_line(_dfmp2("run", WATER, "--json", str(missing)), "cannot write JSON")
    assert not missing.parent.exists()
    assert time.perf_counter() - start < 60


def test_a_json_path_checked_early_leaves_no_file(tmp_path):
    out = tmp_path / "r.json"
    proc = _dfmp2("run", "He 0 0 0", "--basis", "nonexistent-basis", "--json", str(out))
    assert proc.returncode == 1 and not out.exists()


def test_json_write_failure_after_the_run_still_prints_the_summary(tmp_path, monkeypatch):
    import shutil

    import dfmp2.api

    folder = tmp_path / "out"
    folder.mkdir()
    real_run = dfmp2.api.run

    def run_then_lose_the_folder(*args, **kwargs):
        result = real_run(*args, **kwargs)
        shutil.rmtree(folder)
        return result

    monkeypatch.setattr(dfmp2.api, "run", run_then_lose_the_folder)
    result = CliRunner().invoke(main, ["run", WATER, "--json", str(folder / "r.json")])
    assert result.exit_code == 1
    assert "E(MP2) total" in result.stdout
    assert "cannot write JSON" in result.stderr


@pytest.mark.parametrize("scf_type, limit_bytes", [("conv", 20_000), ("df", 100_000)],
                         ids=["mp2-hdf5-file", "scf-tensor-file"])
def test_a_temporary_file_that_cannot_be_written_is_one_line(tmp_path, scf_type, limit_bytes):
    """A file size limit (ulimit -f) stands for a disk that fills during the run, after the
    space checks: the MP2 step's HDF5 file (an exact-integral SCF) or the DF-SCF's tensor file
    stops at the limit with one line, and leaves nothing behind."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE,
                           (limit_bytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    proc = _dfmp2("run", str(INPUTS / "water.xyz"), "--force-outcore", "--scf-type", scf_type,
                  "--scratch-dir", str(tmp_path), "-q", preexec_fn=limit)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == (f"error: the temporary file in {str(tmp_path)!r} could not be "
                                   "written or read (File too large); free space there or give "
                                   "another scratch directory (scratch_dir, --scratch-dir)")
    assert list(tmp_path.iterdir()) == []


def test_every_refusal_of_a_temporary_file_becomes_the_same_line():
    from dfmp2.errors import ResourceError
    from dfmp2.storage import _scratch_io

    hdf5 = ("Can't synchronously write data (file write failed: time = now, filename = "
            "'/s/f.h5', errno = 28, error message = 'No space left on device', buf = 0x1)")
    for error, why in ((OSError(28, "No space left on device"), "No space left on device"),
                       (OSError(hdf5), "No space left on device"),
                       (RuntimeError("Can't decrement id ref count"),
                        "Can't decrement id ref count")):
        with pytest.raises(ResourceError, match=rf"^the temporary file in '/s' could not be "
                                                rf"written or read \({why}\); free space"):
            with _scratch_io("/s/f.h5"):
                raise error


def test_unwritable_scratch_dir_fails_before_the_scf():
    _one_error_line(_dfmp2("run", WATER, "--scratch-dir", "/proc"), "not writable")


def test_no_usable_temporary_directory_is_one_line_or_the_scratch_dir(tmp_path):
    """Every directory Python would take for temporary files refuses one (a full or read-only
    /tmp on a node): PySCF's import asked for one and ended the run in a traceback. Now one
    line, or, with --scratch-dir, that directory serves."""
    def command(*args):  # Python's candidates (TMPDIR, /tmp, ..., the cwd) are all unusable
        code = ("import sys, tempfile\n"
                f"tempfile._candidate_tempdir_list = lambda: [{str(tmp_path / 'none')!r}]\n"
                f"sys.argv = ['dfmp2', *{list(args)!r}]\n"
                "from dfmp2._command import main\nmain()\n")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL)

    _one_error_line(command("run", WATER, "--basis", "sto-3g", "-q"),
                    "no usable temporary directory", "set TMPDIR")
    _one_error_line(command("info"), "no usable temporary directory")
    proc = command("run", WATER, "--basis", "sto-3g", "-q", "--force-outcore", "--scratch-dir",
                   str(tmp_path))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert float(proc.stdout) < -74 and os.listdir(tmp_path) == []


# -- 10. signals ------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1,
                                 signal.SIGUSR2, signal.SIGQUIT],
                         ids=["SIGTERM", "SIGHUP", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGQUIT"])
def test_signal_removes_the_temporary_file_and_exits_128_plus_n(tmp_path, sig):
    """Every signal a terminal, a session or a batch scheduler sends (SGE and SLURM warn with
    SIGUSR1/2 before they kill) ends the run with its clean-up and one line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dfmp2", "run", str(INPUTS / "water8.xyz"), "--force-outcore",
         "--max-memory", "40", "--scratch-dir", str(tmp_path), "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        preexec_fn=_default_signals)  # not the ignored ones of a CI job run in the background
    deadline = time.monotonic() + 240
    try:  # its HDF5 file is unlinked once open: seen among the process's open files
        while not [p for p in open_files_under(tmp_path, [proc.pid]) if p.endswith(".h5")]:
            assert proc.poll() is None, "the run ended before it opened its HDF5 file"
            assert time.monotonic() < deadline
            time.sleep(0.002)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"interrupted by {sig.name}" in lines[0], err
    assert out == "" and os.listdir(tmp_path) == []


def test_a_signal_lost_inside_a_finaliser_stays_off_the_terminal_and_is_raised_again(monkeypatch):
    """The CI race: a signal arriving while Python runs a weakref callback or ``__del__``; the
    exception there is unraisable, and only the pending check may report it, once."""
    from dfmp2.cli import _raise_on_signals
    class RaisesInFinaliser:
        def __del__(self):
            raise Interrupted(signal.SIGTERM, "SIGTERM")

    class OtherFailure:
        def __del__(self):
            raise RuntimeError("a real bug in a finaliser")

    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(
        unraisable.exc_value))
    recorder = sys.unraisablehook
    restore, pending = _raise_on_signals()
    try:
        RaisesInFinaliser()
        assert reported == []
        OtherFailure()  # anything else still reaches the hook that was there before
        assert [type(exc) for exc in reported] == [RuntimeError]
        pending.signum = signal.SIGTERM
        with pytest.raises(Interrupted):
            pending.check()
    finally:
        restore()
    assert sys.unraisablehook is recorder


def test_a_signal_while_the_output_is_written_waits_for_it(tmp_path, monkeypatch):
    """The result exists: a SIGTERM while its JSON, plot or summary is written is held until
    they are (before, the process died there with no line, or ended 130 with no summary),
    then ends the command with 128 + n and one line saying the output was finished."""
    from dfmp2.results import Result

    summary = Result.summary
    before = signal.getsignal(signal.SIGTERM)

    def signalled_summary(self, verbose=False, warnings=True):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the output is written
        return summary(self, verbose, warnings)

    monkeypatch.setattr(Result, "summary", signalled_summary)
    out = tmp_path / "out.json"
    result = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--json", str(out)])
    assert result.exit_code == 128 + signal.SIGTERM
    assert "E(MP2) total" in result.stdout
    assert result.stderr.splitlines() == [
        "error: interrupted by SIGTERM while the output was written; it was finished first; "
        f"exit status {128 + signal.SIGTERM}"]
    assert Result.read(out).e_tot < 0  # the complete record
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are put back

    def unwritable(result, path):  # the signal, then an output that fails: both are said
        os.kill(os.getpid(), signal.SIGTERM)
        raise dfmp2.errors.InputError("cannot write the plot")

    monkeypatch.setattr(Result, "summary", summary)
    monkeypatch.setattr("dfmp2.plot.plot_pair_energies", unwritable)
    result = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--plot",
                                       str(tmp_path / "p.png"), "-q"])
    assert result.exit_code == 128 + signal.SIGTERM
    assert [line.split(":")[1].strip() for line in result.stderr.splitlines()] == [
        "cannot write the plot", "interrupted by SIGTERM while the output was written; it was "
        "finished first; exit status 143"]


# -- 11. what a chemist reads -----------------------------------------------------------------
def test_default_output_is_chemistry_verbose_adds_machinery_and_scf_cycles():
    plain = _dfmp2("run", WATER)
    assert plain.returncode == 0 and plain.stderr == ""
    assert plain.stdout.startswith("H2O  charge +0  multiplicity 1  3 atoms  24 basis functions")
    assert "calls" not in plain.stdout and "OPENBLAS" not in plain.stdout
    verbose = _dfmp2("run", WATER, "-v")
    assert "calls" in verbose.stdout and "environment OPENBLAS_THREAD_TIMEOUT" in verbose.stdout
    assert "INFO: SCF cycle  1  E = " in verbose.stderr and " dE = " in verbose.stderr
    assert " |g| = " in verbose.stderr and "SCF cycle" not in verbose.stdout
    debug = _dfmp2("run", WATER, "-vv")
    assert "SCF cycle  1" in debug.stderr and "DEBUG: MP2 spaces" in debug.stderr
    assert "DEBUG" not in verbose.stderr
    assert "SCF cycle" not in debug.stdout


def test_info_says_whether_the_compiled_reduction_was_built():
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 0
    assert "compiled pair reduction: built" in result.stdout or \
        "compiled pair reduction: NOT built" in result.stdout


def test_an_ignored_hangup_stays_ignored():
    """Under ``nohup`` (SIGHUP ignored from the start) the run's handlers leave SIGHUP alone, so
    closing the terminal does not stop it; a handled SIGINT still gets dfmp2's handler."""
    from dfmp2 import cli

    old_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # CI may ignore it
    try:
        restore, _pending = cli._raise_on_signals()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) not in (signal.default_int_handler,
                                                       signal.SIG_IGN)
        restore()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGHUP, old_hup)
        signal.signal(signal.SIGINT, old_int)


def test_a_run_under_nohup_survives_hangups():
    proc = subprocess.Popen(
        [sys.executable, "-m", "dfmp2", "run", WATER, "-q"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    deadline = time.monotonic() + 240
    while proc.poll() is None:  # hang-ups all through the run, its imports to its output
        proc.send_signal(signal.SIGHUP)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    out, err = proc.communicate()
    assert proc.returncode == 0 and err == "", (proc.returncode, err)
    assert float(out) == pytest.approx(dfmp2.run(WATER).e_tot, abs=TOL_OTHER_PROCESS)


def test_ctrl_c_before_the_run_starts_is_one_line_and_exit_130(monkeypatch):
    from dfmp2 import cli

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt  # as in the imports, before the run's handlers exist

    monkeypatch.setattr(cli, "_run_rank", interrupted)
    result = CliRunner().invoke(main, ["run", WATER])
    assert result.exit_code == 130, (result.output, result.exception)
    assert result.stderr.strip() == "error: interrupted by SIGINT; exit status 130"


def test_pyscfs_warnings_stay_off_the_terminal_outside_a_test_runner():
    """In a plain process (no test runner recording warnings) PySCF's basis-set-exchange advice,
    warned before the errors and fallbacks below, reaches neither stream."""
    unknown = _dfmp2("run", "H 0 0 0; H 0 0 0.74", "--basis", "no-such", "--ecp", "no-such-ecp")
    assert unknown.returncode == 1 and len(unknown.stderr.strip().splitlines()) == 1
    assert "basis-set-exchange. It is recommended" not in unknown.stderr
    fallback = _dfmp2("run", "H 0 0 0; I 0 0 1.609", "--basis", "def2-svp", "-q")
    assert fallback.returncode == 0 and fallback.stderr == ""


def test_a_json_write_that_fails_leaves_no_piece_and_no_earlier_result(tmp_path, monkeypatch):
    """A full disk mid-write: the file is written beside its target and renamed, so no piece
    of one is left; the earlier run's result at the path is replaced by a failure record (or
    removed, where not even that fits), so it never passes for this run's."""
    import errno
    import json

    import dfmp2._files as files
    from dfmp2._files import write_text_file

    target = tmp_path / "x.json"
    target.write_text('{"earlier": true}\n')
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode)))
    with pytest.raises(OSError):
        write_text_file(target, '{"new": true}\n')
    assert target.read_text() == '{"earlier": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]  # no .part left
    monkeypatch.undo()

    calls = []

    def full_once(path, text):  # the result does not fit; the small failure record does
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        write_text_file(path, text)

    monkeypatch.setattr(files, "write_text_file", full_once)
    ran = CliRunner().invoke(main, ["run", "H 0 0 0; H 0 0 0.74", "--basis", "sto-3g",
                                    "--json", str(target)])
    assert ran.exit_code == 1 and "No space left on device" in ran.stderr
    assert json.loads(target.read_text())["success"] is False
    monkeypatch.setattr(files, "write_text_file", lambda path, text: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    target.write_text('{"earlier": true}\n')
    ran = CliRunner().invoke(main, ["run", "H 0 0 0; H 0 0 0.74", "--basis", "sto-3g",
                                    "--json", str(target)])
    assert ran.exit_code == 1 and not target.exists()  # not even the record fitted


def test_devices_pipes_huge_numbers_and_long_names_are_one_line(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    for args, message in (
            (["show", "/dev/zero"], "result '/dev/zero' is not a regular file (a device or a "
                                    "pipe)"),
            (["show", str(fifo)], "is not a regular file (a device or a pipe)"),
            (["run", str(fifo)], "QCSchema input"),
            (["run", "a" * 300 + ".xyz"], "its name is too long for the file system")):
        ran = CliRunner().invoke(main, args)
        assert ran.exit_code == 1 and message in ran.stderr, (args, ran.output)
        assert len(ran.stderr.strip().splitlines()) == 1
    big = tmp_path / "big.json"
    big.write_text('{"schema_name": "qcschema_input", "keywords": {"maxiter": ' + "9" * 5000
                   + "}}")
    ran = CliRunner().invoke(main, ["run", str(big)])
    assert ran.exit_code == 1 and "holds JSON Python cannot read" in ran.stderr


def test_a_json_path_written_in_place_where_a_rename_cannot_go(tmp_path, monkeypatch):
    """A directory that takes no new file (read-only, or sticky and another user's) but a file
    that is writable, and /dev/stdout (a pipe, or the file a shell redirects to): written in
    place, as before, not refused after the run."""
    import dfmp2._files as files
    from dfmp2._files import write_text_file

    target = tmp_path / "out.json"
    target.write_text("old\n")

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    with monkeypatch.context() as patch:
        patch.setattr(files.os, "open", refused)  # no new file in the directory
        write_text_file(target, "new 1\n")
    assert target.read_text() == "new 1\n"
    with monkeypatch.context() as patch:
        patch.setattr(files.os, "replace", refused)  # sticky: no rename over another's file
        write_text_file(target, "new 2\n")
    assert target.read_text() == "new 2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    piped = subprocess.run(f"{sys.executable} -m dfmp2 run 'H 0 0 0; H 0 0 0.74' --basis sto-3g "
                           "-q --json /dev/stdout | cat", shell=True, capture_output=True,
                           text=True, timeout=300)
    assert piped.returncode == 0 and '"success": true' in piped.stdout, piped.stderr
    record = tmp_path / "r.json"
    record.write_text(piped.stdout.rsplit("}", 1)[0] + "}\n")  # the JSON before the -q line
    shown = subprocess.run(f"cat {record} | {sys.executable} -m dfmp2 show /dev/stdin",
                           shell=True, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0 and "E(MP2) total" in shown.stdout, shown.stderr


def test_json_to_the_file_standard_output_is_redirected_to_keeps_both(tmp_path):
    """--json /dev/stdout with the output redirected to a file (and --json /dev/stderr with
    the errors): the record is written through that stream, followed by the summary. It was
    opened again and written from the file's start, and the summary, flushed at exit, landed
    over the record's first bytes: a file no JSON reader takes, exit status 0."""
    command = f"{sys.executable} -m dfmp2 run 'H 0 0 0; H 0 0 0.74' --basis sto-3g"
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    ran = subprocess.run(f"{command} --json /dev/stdout > {out}", shell=True,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    text = out.read_text()
    record, summary = text.split("\n}\n", 1)
    assert json.loads(record + "\n}\n")["success"] and "E(MP2) total" in summary
    ran = subprocess.run(f"{command} --json /dev/stderr -q 2> {err}", shell=True,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0 and json.loads(err.read_text())["success"]


def test_choices_take_any_case_and_a_json_directory_path_must_exist(tmp_path):
    """'--reference UHF' is uhf, as basis names are any case; '--json out/' is a directory, so
    where there is none it is refused (it was written as a file named 'out')."""
    runner = CliRunner()
    ran = runner.invoke(main, ["run", WATER, "--basis", "sto-3g", "--reference", "UHF",
                               "--scf-type", "DF", "--json", str(tmp_path / "w.json"), "-q"])
    assert ran.exit_code == 0, ran.output
    assert json.loads((tmp_path / "w.json").read_text())["extras"]["scf"]["kind"] == "uhf"
    assert dfmp2.run(WATER, basis="sto-3g", reference=" ROHF", precision="FP64").scf.kind \
        == "rohf"
    one = runner.invoke(main, ["run", WATER, "--basis", "sto-3g", "--json",
                               str(tmp_path / "out") + "/"])
    assert one.exit_code == 1 and "ends in '/', a directory, and there is none" in one.output
    two = runner.invoke(main, ["run", WATER, WATER, "--basis", "sto-3g", "--json",
                               str(tmp_path / "out") + "/"])
    assert two.exit_code == 1 and "there is no directory of that name; create it" in two.output
    assert not (tmp_path / "out").exists()


def test_multiplicity_is_spin_plus_one_and_not_both():
    runner = CliRunner()
    oh = "O 0 0 0; H 0 0 0.97"
    ran = runner.invoke(main, ["run", oh, "--basis", "sto-3g", "--multiplicity", "2"])
    assert ran.exit_code == 0 and "multiplicity 2" in ran.stdout.splitlines()[0]
    both = runner.invoke(main, ["run", oh, "--multiplicity", "2", "--spin", "1"])
    assert both.exit_code == 1 and both.output.strip() == (
        "error: give --spin (2S) or --multiplicity (2S + 1), not both")
    zero = runner.invoke(main, ["run", oh, "--multiplicity", "0"])
    assert zero.exit_code == 1 and "at least 1; got 0" in zero.output


def test_an_open_shells_frontier_orbitals_name_their_spin():
    """UHF OH: the HOMO is a beta orbital (the alpha HOMO lies lower); a closed shell run as UHF
    has both spins' alike; a restricted reference names none."""
    oh = dfmp2.run("O 0 0 0; H 0 0 0.97", spin=1, basis="sto-3g")
    assert (oh.scf.homo_spin, oh.scf.lumo_spin) == ("beta", "beta")
    assert f"HOMO {oh.scf.homo:.6f} Eh (beta spin)  LUMO" in oh.summary()
    water = dfmp2.run(WATER, basis="sto-3g", reference="uhf")
    assert (water.scf.homo_spin, water.scf.lumo_spin) == ("both", "both")
    assert dfmp2.run(WATER, basis="sto-3g").scf.homo_spin is None
    assert {"run", "DFMP2", "run_counterpoise", "run_qcschema"} <= set(dir(dfmp2))  # lazy ones


def test_a_signal_before_the_run_begins_is_one_line(tmp_path):
    """SIGTERM in the command's first second (its imports, before the run's own handlers) ended
    the process with no line; SIGINT there printed a traceback. Both are one line now."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen([sys.executable, "-m", "dfmp2", "run", WATER, "--json",
                                 str(tmp_path / "w.json")], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                preexec_fn=_default_signals)
        time.sleep(0.4)  # python itself has started (~0.05 s), the heavy imports have not ended
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + sig, (proc.returncode, err)
        assert err.strip() == f"error: interrupted by {sig.name}; exit status {128 + sig}"
        assert out == "" and os.listdir(tmp_path) == []


_PROCESS_SCRIPT = """
import os, signal, sys
from dfmp2 import _command
{body}
"""


def _process_script(body: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _PROCESS_SCRIPT.format(body=body)],
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=_default_signals)


def test_the_console_command_puts_back_a_host_programs_handlers():
    """A program that runs the command in its own process (runpy, a notebook's %run -m dfmp2)
    has its own signal handlers back afterwards, and in a thread other than the main one the
    command runs with the handlers as they are (none can be set there)."""
    done = _process_script("""
import runpy, threading
def mine(signum, frame):
    print("host's handler", signum)
signal.signal(signal.SIGTERM, mine)
sys.argv = ["dfmp2", "--version"]
for where in ("main", "thread"):
    def work():
        try:
            runpy.run_module("dfmp2", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            print(where, "exit", exc.code)
    if where == "main":
        work()
    else:
        worker = threading.Thread(target=work)
        worker.start()
        worker.join()
    assert signal.getsignal(signal.SIGTERM) is mine
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
os.kill(os.getpid(), signal.SIGTERM)
""")
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if not line.startswith("dfmp2, version")]
    assert said == ["main exit 0", "thread exit 0", f"host's handler {signal.SIGTERM.value}"]


def test_a_second_signal_keeps_the_status_the_first_ones_line_said(monkeypatch):
    """SIGINT, then SIGTERM 20 ms later: the line said 'exit status 130' and the process ended
    with 143. The run's handler ignores a second signal, and the command's exits with the
    status already said."""
    from dfmp2 import cli
    from dfmp2._command import PROCESS

    monkeypatch.setattr(PROCESS, "status", None)  # as each command starts (cli._Main.invoke)
    old = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        restore, pending = cli._raise_on_signals()
        with pytest.raises(Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        os.kill(os.getpid(), signal.SIGUSR1)  # while the first one's clean-up runs: ignored
        time.sleep(0.05)
        assert pending.signum == signal.SIGTERM
        restore()
    finally:
        signal.signal(signal.SIGTERM, old)
    said = _process_script("""
signal.signal(signal.SIGTERM, _command.PROCESS.handler)
_command.PROCESS.status = 130  # what cli._interrupted says for a SIGINT
os.kill(os.getpid(), signal.SIGTERM)
print("not reached")
""")
    assert said.returncode == 130 and "not reached" not in said.stdout, said.stderr


def test_memory_a_limit_refuses_is_one_line(monkeypatch, tmp_path):
    """A process memory limit (ulimit -v) that refuses the plan's buffers, or any allocation
    the plan did not count, ends in one line naming --max-memory and the limit."""
    import errno
    import mmap

    from dfmp2 import buffers
    from dfmp2.errors import ResourceError

    def refused(*_args, **_kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    with monkeypatch.context() as patch:
        patch.setattr(mmap, "mmap", refused)
        with pytest.raises(ResourceError, match=r"cannot map 8 MiB of memory \(Cannot allocate "
                                                r"memory\); lower --max-memory .*\(ulimit -v\)"):
            buffers.zeros((1024, 1024))

    def exhausted(*_args, **_kwargs):
        raise MemoryError("Unable to allocate 3.2 GiB")

    from dfmp2 import api

    monkeypatch.setattr(api, "compute", exhausted)
    ran = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g"])
    assert ran.exit_code == 1 and ran.stderr.strip() == (
        "error: out of memory (Unable to allocate 3.2 GiB); lower --max-memory or raise the "
        "process's memory limit (ulimit -v)")

    def torch_exhausted(*_args, **_kwargs):  # torch's CPU allocator raises no MemoryError
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: "
                           "can't allocate memory: you tried to allocate 36691968 bytes. Error "
                           "code 12 (Cannot allocate memory)")

    monkeypatch.setattr(api, "compute", torch_exhausted)
    ran = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g"])
    assert ran.exit_code == 1 and ran.stderr.strip() == (
        "error: out of memory (torch could not allocate 36691968 bytes); lower --max-memory or "
        "raise the process's memory limit (ulimit -v)")


def test_a_scratch_path_too_long_for_its_files_is_one_line(tmp_path):
    """The scratch check's file name is short; the SCF tensor's longer one can pass the system's
    path limit (4096 bytes) in a directory that took the check's."""
    from dfmp2.errors import ResourceError
    from dfmp2.storage import MatrixFile

    folder = tmp_path
    while len(str(folder)) < 4068 - 241:
        folder = folder / ("x" * 240)
    folder = folder / ("y" * (4068 - len(str(folder)) - 1))
    folder.mkdir(parents=True)
    with pytest.raises(ResourceError, match=r"could not be written or read \(File name too "
                                            r"long\); .* --scratch-dir"):
        MatrixFile(2, 2, str(folder))


def test_a_failed_run_leaves_a_result_another_run_wrote_meanwhile(tmp_path, monkeypatch):
    """Two runs given one --json: the one that fails after the other has finished must not
    replace that finished result with its failure record (a result computed, then lost); an
    earlier run's result found at the output check is still replaced."""
    from dfmp2 import api
    from dfmp2.errors import InputError

    out = tmp_path / "r.json"
    out.write_text('{"earlier": true}')

    def fails(*_args, **_kwargs):
        raise InputError("boom")

    monkeypatch.setattr(api, "compute", fails)
    ran = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--json", str(out)])
    assert ran.exit_code == 1 and json.loads(out.read_text())["success"] is False

    def other_run_finishes_then_fails(*_args, **_kwargs):
        out.write_text('{"other run": true}')
        raise InputError("boom")

    monkeypatch.setattr(api, "compute", other_run_finishes_then_fails)
    ran = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--json", str(out)])
    assert ran.exit_code == 1 and json.loads(out.read_text()) == {"other run": True}
