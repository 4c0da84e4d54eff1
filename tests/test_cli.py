"""The command line through click's CliRunner, once as a real subprocess, and every error case."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dfmp2.cli import main

from conftest import INPUTS
from tolerances import TOL_FP64, TOL_IDENTITY, TOL_PRINTED

WATER = str(INPUTS / "water.xyz")
WATER_XYZ = (INPUTS / "water.xyz").read_text()


def _invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_run_water_prints_every_energy_and_writes_json(tmp_path):
    out = tmp_path / "water.json"
    result = _invoke("run", WATER, "--backend", "pytorch", "--device", "cpu", "--json", str(out))
    assert result.exit_code == 0, result.output
    for label in ("E(HF)", "E(OS)", "E(SS)", "E(corr) MP2", "E(MP2) total", "E(corr) SCS-MP2"):
        assert label in result.stdout
    data = json.loads(out.read_text())
    props = data["properties"]
    assert data["schema_name"] == "qcschema_output" and data["driver"] == "energy"
    for key in ("scf_total_energy", "mp2_same_spin_correlation_energy",
                "mp2_opposite_spin_correlation_energy", "mp2_singles_energy",
                "mp2_doubles_energy", "mp2_correlation_energy", "mp2_total_energy",
                "return_energy"):
        assert isinstance(props[key], float), key
    assert props["mp2_singles_energy"] == 0.0
    assert props["mp2_doubles_energy"] == pytest.approx(
        props["mp2_same_spin_correlation_energy"] + props["mp2_opposite_spin_correlation_energy"],
        abs=TOL_PRINTED)
    assert props["mp2_total_energy"] == pytest.approx(
        props["scf_total_energy"] + props["mp2_correlation_energy"], abs=TOL_IDENTITY)
    assert props["return_energy"] == data["return_result"] == props["mp2_total_energy"]
    extras = data["extras"]
    assert extras["scs_mp2_total_energy"] == pytest.approx(
        props["scf_total_energy"] + extras["scs_mp2_correlation_energy"], abs=TOL_IDENTITY)
    assert {"nbasis", "naux", "nocc", "nvir", "nfrozen"} <= set(extras["sizes"])
    assert extras["backend"]["resolved"] == "pytorch"
    pair_op = extras["backend"]["ops"]["mp2_pair_sums"]
    assert pair_op["mode"] == pair_op["backend"] in ("pytorch", "numpy")
    assert pair_op["backend"] == ("numpy" if extras["backend"]["cpu_blas"]["choice"] == "numpy"
                                  else "pytorch")
    assert extras["method"]["precision"] == "fp64"
    assert {"scf", "metric", "transform", "fit", "pair_energy"} <= set(extras["timings"])
    assert {"dfmp2", "pyscf", "torch"} <= set(extras["versions"])


def test_cli_energy_equals_python_api():
    import dfmp2

    result = _invoke("run", WATER, "--frozen-core", "--scf-type", "conv", "-q")
    assert result.exit_code == 0
    api = dfmp2.run(WATER, frozen_core=True, scf_type="conv")
    assert float(result.stdout.strip()) == pytest.approx(api.e_tot, abs=TOL_FP64)


def test_frozen_option_and_unfused():
    result = _invoke("run", WATER, "--frozen", "1", "--no-fused-energy", "--json", "-")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["extras"]["sizes"]["nfrozen"] == 1
    assert data["extras"]["method"]["fused_energy"] is False
    assert "pair_sums_from_ovov" in data["extras"]["backend"]["ops"]


def test_info_lists_backends_with_reasons():
    result = _invoke("info")
    assert result.exit_code == 0
    assert "pyscf" in result.stdout and "torch" in result.stdout
    for mode in ("cpu", "cuda", "hardware", "simulator", "emulator"):
        assert mode in result.stdout
    emulator = [line for line in result.stdout.splitlines() if line.split()[1:2] == ["emulator"]]
    assert len(emulator) == 1 and emulator[0].endswith("opt in with --nki-emulator")
    opted = CliRunner().invoke(main, ["info", "--nki-emulator"])
    emulator = [line for line in opted.output.splitlines() if line.split()[1:2] == ["emulator"]]
    assert len(emulator) == 1 and emulator[0].endswith("opted in")  # not "opt in with" too
    assert "opt in with" not in emulator[0]


def test_real_subprocess_run(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "-m", "dfmp2", "run", WATER, "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "E(MP2) total" in proc.stdout
    assert json.loads(out.read_text())["properties"]["mp2_total_energy"] < -76.2


# --- errors: one line on stderr, exit 1, no traceback ------------------------------------------

def _write(tmp_path, text, name="bad.xyz"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


ERROR_CASES = {
    "missing file": (lambda p: ["run", str(p / "nope.xyz")], "does not exist"),
    "malformed count": (lambda p: ["run", _write(p, "three\n\nO 0 0 0\n")], "line 1"),
    "malformed atom line": (
        lambda p: ["run", _write(p, "2\nc\nO 0 0 0\nH 0 0.9\n")], "line 4: expected"),
    "bad coordinate": (
        lambda p: ["run", _write(p, "2\nc\nO 0 0 0\nH 0 0.9 x\n")], "line 4: coordinates"),
    "too few atoms": (lambda p: ["run", _write(p, "3\nc\nO 0 0 0\nH 0 0 1\n")], "line 5"),
    "huge coordinate": (
        lambda p: ["run", _write(p, "2\nc\nH 1e308 0 0\nH -1e308 0 0\n")],
        "atom 1 (H) has the coordinate x = 1e+308 Å, beyond 100000 Å"),
    "huge coordinate in an atom string": (lambda p: ["run", "H; H 1 1e200"], "beyond 100000 Å"),
    "unknown element": (
        lambda p: ["run", _write(p, "2\nc\nO 0 0 0\nXq 0 0 1\n")], "line 4: unknown element 'Xq'"),
    "unknown basis": (lambda p: ["run", WATER, "--basis", "cc-pvqq"], "basis 'cc-pvqq'"),
    "basis lacks element": (
        lambda p: ["run", "Kr 0 0 0", "--basis", "6-31g"], "no functions for element Kr"),
    "unknown auxbasis": (lambda p: ["run", WATER, "--auxbasis", "nonsense-ri"], "nonsense-ri"),
    "odd electrons for rhf": (lambda p: ["run", WATER, "--charge", "1"], "cannot have 2S = 0"),
    "no electrons": (lambda p: ["run", "H 0 0 0", "--charge", "1"], "leaves 0 electrons"),
    "rhf for an open shell": (
        lambda p: ["run", WATER, "--charge", "1", "--spin", "1", "--reference", "rhf"],
        "RHF reference needs 2S = 0"),
    "scf not converged": (lambda p: ["run", WATER, "--max-cycle", "2"], "did not converge"),
    "memory too small": (lambda p: ["run", str(INPUTS / "caffeine.xyz"), "--max-memory", "1"],
                         "too small"),
    "frozen too many": (lambda p: ["run", WATER, "--frozen", "5"], "freezes all 5"),
    "frozen core of an ion without one": (
        lambda p: ["run", "O 0 0 0", "--charge", "6", "--frozen-core"],
        "--frozen-core (frozen_core: 1 core orbital) freezes all 1 occupied orbitals; the "
        "chemical core is the neutral atoms'"),
    "frozen core of an open-shell ion without one": (
        lambda p: ["run", "O 0 0 0", "--charge", "7", "--spin", "1", "--frozen-core"],
        "--frozen-core (frozen_core: 1 core orbital) freezes every occupied orbital of both "
        "spins (1 alpha, 0 beta)"),
    "conv-tol-grad too loose": (lambda p: ["run", WATER, "--conv-tol-grad", "0.5"],
                                "conv_tol_grad (--conv-tol-grad, the SCF's orbital-gradient "
                                "threshold) must be above 0 and below 0.1, got 0.5"),
    "frozen and frozen core": (lambda p: ["run", WATER, "--frozen", "1", "--frozen-core"],
                               "--frozen-core) or frozen (--frozen), not both"),
    "json overwrites the input": (
        lambda p: ["run", _write(p, WATER_XYZ, "mol.xyz"), "--json", str(p / "mol.xyz")],
        "--json '{p}/mol.xyz' is the same file as the input"),
    "json and plot one file": (
        lambda p: ["run", WATER, "--json", str(p / "x.png"), "--plot", str(p / "x.png")],
        "--plot '{p}/x.png' is the same file as --json's file"),
    "json and chkfile one file": (
        lambda p: ["run", WATER, "--json", str(p / "c.out"), "--chkfile", str(p / "c.out")],
        "--chkfile '{p}/c.out' is the same file as --json's file"),
    "quiet and verbose": (lambda p: ["run", WATER, "-q", "-vv"],
                          "give -q (only the energy) or -vv (more detail), not both"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES), ids=list(ERROR_CASES))
def test_error_is_one_line_exit_1(tmp_path, case):
    make_args, expected = ERROR_CASES[case]
    result = CliRunner().invoke(main, make_args(tmp_path))
    assert result.exit_code == 1, (result.output, result.exception)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected.format(p=tmp_path) in lines[0]
    if case == "json overwrites the input":
        assert (tmp_path / "mol.xyz").read_text() == WATER_XYZ


@pytest.mark.parametrize("args", [
    ["run"], ["run", WATER, "--backend", "tpu"], ["run", WATER, "--frozen", "-1"],
    ["run", WATER, "--scf-type", "fast"], ["frobnicate"], ["run", WATER, "--dist-timeout", "nan"],
    ["run", WATER, "--dist-timeout", "inf"],
    ["run", WATER, "--threads", "0"],
])
def test_usage_errors_exit_2(args):
    """Usage errors exit 2 with one line naming the problem and the help to read, as every
    other input error does (click's own message is four lines)."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert lines[0].endswith("--help')") and "Usage:" not in result.output


@pytest.mark.parametrize("command, variable", [("run", "DFMP2_NKI_EMULATOR"),
                                               ("info", "DFMP2_USE_SIMULATOR")])
def test_a_flags_bad_environment_variable_is_named(command, variable):
    """A flag's bad value can only come from its environment variable: the line names the
    variable, not the flag the user did not type."""
    args = [command, WATER] if command == "run" else [command]
    result = CliRunner().invoke(main, args, env={variable: "banana"})
    assert result.exit_code == 2
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: environment variable {variable} ")
    assert "'banana' is not a valid boolean" in lines[0] and "set it to 1 or 0" in lines[0]


def test_a_bare_command_shows_its_help():
    result = CliRunner().invoke(main, [])
    assert result.output.startswith("Usage: ") and "Commands:" in result.output


def test_error_subprocess_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dfmp2", "run", str(tmp_path / "x.xyz")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "does not exist" in proc.stderr


def test_importing_the_cli_loads_neither_numpy_nor_torch_nor_pyscf():
    """The CLI sets environment read by OpenBLAS and torch's OpenMP runtime when they load: numpy,
    torch and PySCF must load later."""
    code = ("import sys, dfmp2, dfmp2.cli; "
            "print(*(m in sys.modules for m in ('numpy', 'torch', 'pyscf')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.split() == ["False", "False", "False"], proc.stderr


def test_a_run_does_not_load_every_pyscf_module(tmp_path):
    """PySCF's SCF object answers a missing attribute by importing all of PySCF (its periodic
    code included) before it raises; the run asks for its optional attributes without that
    (dfmp2.reference.own_attribute), RHF and UHF, with a checkpoint file, and records the same
    SCF settings."""
    out = tmp_path / "r.json"
    code = ("import json, sys\n"
            "from dfmp2.cli import main\n"
            f"for extra in ([], ['--charge', '1', '--multiplicity', '2', '--chkfile', "
            f"{str(tmp_path / 'scf.chk')!r}]):\n"
            f"    main(['run', {WATER!r}, '-q', '--json', {str(out)!r}, *extra],"
            " standalone_mode=False)\n"
            "print('pyscf.__all__' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.stdout.split()[-1] == "False", proc.stderr
    scf = json.loads(out.read_text())["extras"]["scf"]
    assert (scf["kind"], scf["conv_tol"], scf["conv_tol_grad"], scf["guess"], scf["solver"],
            scf["level_shift"]) == ("uhf", 1e-10, 1e-7, "minao", "DIIS (PySCF)", 0.0)
    assert scf["jk"].startswith("dfmp2 DF J/K") and scf["cycles"] > 0


def test_own_attribute_is_getattr_without_pyscfs_fallback():
    from pyscf import gto, scf

    from dfmp2.reference import own_attribute

    mf = scf.RHF(gto.M(atom="He", basis="sto-3g", verbose=0))
    mf.level_shift = 0.25
    assert own_attribute(mf, "level_shift") == 0.25  # set on the object
    assert own_attribute(mf, "conv_tol", 1.0) == mf.conv_tol
    assert own_attribute(mf, "e_tot") == 0  # from the constructor
    assert own_attribute(mf, "not_an_attribute", "default") == "default"
    assert own_attribute(mf, "_not_private_either") is None
    with pytest.raises(AttributeError):  # PySCF's own lookup raises after its imports
        getattr(mf, "not_an_attribute")


def test_cli_shortens_openblas_spin_before_numpy_loads(tmp_path):
    """OPENBLAS_THREAD_TIMEOUT is set before numpy's OpenBLAS reads it (asked of the loaded
    library where it exports openblas_thread_timeout), and the JSON records it."""
    out = tmp_path / "r.json"
    code = (
        "import ctypes, json, os, sys\n"
        "os.environ.pop('OPENBLAS_THREAD_TIMEOUT', None)\n"
        "from dfmp2.cli import main\n"
        f"main(['run', {WATER!r}, '--cpu-blas', 'numpy', '-q', '--json', {str(out)!r}],"
        " standalone_mode=False)\n"
        "libs = {line.split()[-1] for line in open('/proc/self/maps')"
        " if 'openblas' in line and 'numpy' in line}\n"
        "read = [ctypes.CDLL(p).openblas_thread_timeout() for p in libs"
        " if hasattr(ctypes.CDLL(p), 'openblas_thread_timeout')]\n"
        "env = json.load(open(" + repr(str(out)) + "))['extras']['environment']\n"
        "print(os.environ['OPENBLAS_THREAD_TIMEOUT'],"
        " env['OPENBLAS_THREAD_TIMEOUT'].split()[0].split('=')[1], read)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    value, recorded, read = proc.stdout.splitlines()[-1].split(maxsplit=2)
    from dfmp2.blas_env import OPENBLAS_THREAD_TIMEOUT

    assert value == recorded == OPENBLAS_THREAD_TIMEOUT
    assert read.strip() in ("[]", f"[{OPENBLAS_THREAD_TIMEOUT}]")  # [] where numpy's is not OpenBLAS


def test_cpu_blas_numpy_sets_passive_omp_before_torch_loads():
    code = (
        "import os, sys\n"
        "os.environ.pop('OMP_WAIT_POLICY', None)\n"
        "from dfmp2.cli import main\n"
        f"main(['run', {WATER!r}, '--cpu-blas', 'numpy', '-q'], standalone_mode=False)\n"
        "print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-2:] == ["PASSIVE", "True"]


def test_log_lines_are_written_between_a_clear_and_a_redraw_of_the_status_line():
    import io
    import logging

    from dfmp2 import cli

    calls = []

    class Status:
        def clear(self):
            calls.append("clear")

        def redraw(self):
            calls.append("redraw")

    stream = io.StringIO()
    handler = cli._LogHandler(stream)
    handler.status = Status()
    handler.emit(logging.LogRecord("dfmp2", logging.INFO, __file__, 1, "hello", None, None))
    assert calls == ["clear", "redraw"] and stream.getvalue() == "hello\n"
    handler.status = None
    handler.emit(logging.LogRecord("dfmp2", logging.INFO, __file__, 1, "again", None, None))
    assert calls == ["clear", "redraw"] and stream.getvalue() == "hello\nagain\n"


def test_the_scf_record_names_its_gradient_threshold_and_a_small_rate(tmp_path):
    import json

    from dfmp2.results import _rate

    result = CliRunner().invoke(main, ["run", WATER, "--conv-tol-grad", "1e-8", "--json",
                                       str(tmp_path / "w.json")])
    assert result.exit_code == 0, result.output
    assert "(conv_tol 1e-10, orbital gradient 1e-08)" in result.output
    scf = json.loads((tmp_path / "w.json").read_text())["extras"]["scf"]
    assert scf["conv_tol_grad"] == 1e-8 and scf["conv_tol"] == 1e-10
    assert (_rate(0.3149), _rate(9.96), _rate(68.4)) == ("0.31", "10", "68")


def test_torchrun_options_on_one_process_say_so():
    result = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--dist-backend",
                                       "gloo", "--dist-timeout", "5"])
    assert result.exit_code == 0, result.output
    assert "--dist-backend and --dist-timeout apply under torchrun only" in result.stderr
    plain = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g"])
    assert "torchrun" not in plain.stderr


def test_json_to_a_device_or_a_read_fifo_is_written_and_to_an_unread_fifo_refused(tmp_path):
    """--json /dev/null (or /dev/stdout) is written as before; a FIFO nothing reads is refused
    before the run (opening it to check would wait for a reader)."""
    import os
    import threading

    ok = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--json", os.devnull,
                                   "-q"])
    assert ok.exit_code == 0, ok.output
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    refused = CliRunner().invoke(main, ["run", WATER, "--json", str(fifo)])
    assert refused.exit_code == 1 and "is a FIFO that nothing reads" in refused.output
    received = []

    def reader():  # the check's open and close reads as an empty write: open again
        while not received:
            with open(fifo) as handle:  # waits for a writer
                text = handle.read()
            if text:
                received.append(text)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    threading.Event().wait(0.5)  # the reader is waiting in open()
    written = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--json", str(fifo),
                                        "-q"])
    thread.join(timeout=60)
    assert written.exit_code == 0, written.output
    assert '"return_result"' in "".join(received)


def test_a_failed_run_replaces_an_earlier_json_with_its_failure(tmp_path):
    """A run that fails after its output checks leaves a QCSchema FailedOperation-shaped record
    in its --json file, never an earlier run's result under its name."""
    import json

    out = tmp_path / "out.json"
    ok = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--json", str(out), "-q"])
    assert ok.exit_code == 0 and json.loads(out.read_text())["success"] is True
    failed = CliRunner().invoke(main, ["run", WATER, "--max-cycle", "2", "--json", str(out)])
    assert failed.exit_code == 1 and "did not converge" in failed.output
    record = json.loads(out.read_text())
    assert record["success"] is False and record["input_data"] is None
    assert record["error"]["error_type"] == "convergence_error"
    assert "did not converge" in record["error"]["error_message"]


def test_an_empty_json_path_is_named_as_empty():
    """It said "cannot write JSON to '': Is a directory"."""
    for command in (["run", WATER], ["nki-model", "--nocc", "5", "--nvir", "10", "--naux", "50"]):
        result = CliRunner().invoke(main, [*command, "--json", ""])
        assert result.exit_code == 1
        assert result.output == "error: JSON path is empty; give a file path\n"


def test_the_records_versions_are_plain_strings():
    import dfmp2

    versions = dfmp2.run(WATER, basis="sto-3g").to_dict()["extras"]["versions"]
    assert all(type(v) is str for v in versions.values()), versions
