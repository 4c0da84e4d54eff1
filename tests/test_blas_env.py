"""The process environment's one owner (the CLI side) and the CPU BLAS rule it shares with
linalg: PySCF's OpenBLAS asked which core it runs and corrected where that core predates
AVX2/FMA (on any vendor's CPU), never over the user's choice."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

import dfmp2.blas_env as blas_env
import dfmp2.cpuinfo as cpuinfo

#: What a child process runs: the CLI's set-up (``prepare_process``, as ``dfmp2 run`` calls it
#: before anything else loads), then PySCF's loaded OpenBLAS asked which core it runs, through
#: PySCF's own handle and plain ctypes (not through the module under test).
_CLI_SETUP_THEN_ASK = """
import ctypes, json
from dfmp2.blas_env import prepare_process
record = prepare_process("auto")
import pyscf.lib
corename = pyscf.lib.load_library("libnp_helper").openblas_get_corename
corename.restype = ctypes.c_char_p
print(json.dumps({"record": record, "core": corename().decode()}))
"""


def _cli_setup_in_child(**env_changes) -> tuple[dict, str]:
    """(the environment record, the core PySCF's OpenBLAS runs) of a fresh process that went
    through the CLI's set-up; ``env_changes``: variables to set (None: to remove)."""
    env = dict(os.environ)
    for key in ("OPENBLAS_CORETYPE", "OPENBLAS_THREAD_TIMEOUT", "OMP_WAIT_POLICY"):
        env.pop(key, None)
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    done = subprocess.run([sys.executable, "-c", _CLI_SETUP_THEN_ASK], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return answer["record"], answer["core"]


def _has_avx2_fma() -> bool:
    return {"avx2", "fma"} <= cpuinfo.cpu_identity()[2]


#: (core as openblas_get_corename() may name it, whether its kernels predate AVX2/FMA).
_CORES = [
    # the SSE-only cores OpenBLAS falls back to on CPUs newer than it knows
    ("Prescott", True), ("Barcelona", True), ("Katmai", True), ("Coppermine", True),
    ("Northwood", True), ("Banias", True), ("Atom", True), ("Core2", True), ("Penryn", True),
    ("Dunnington", True), ("Nehalem", True), ("Athlon", True), ("Opteron", True),
    ("Opteron_SSE3", True), ("Nano", True), ("Bobcat", True), ("Unknown", True),
    ("generic", True),
    # AVX or AVX+FMA without AVX2
    ("Sandybridge", True), ("Bulldozer", True), ("Piledriver", True), ("Steamroller", True),
    # any spelling openblas_get_corename() may use
    ("PRESCOTT", True), (" barcelona\n", True),
    # AVX2/FMA and newer: left alone
    ("Haswell", False), ("haswell", False), ("Zen", False), ("SkylakeX", False),
    ("Excavator", False), ("Cooperlake", False), ("SapphireRapids", False),
    # names the rule does not know are not touched
    ("neoversen1", False), ("", False),
]

#: The table's old cores, for the tests that check the loaded library independently of the rule.
_OLD_CORES = {core.strip().lower() for core, pre_avx2 in _CORES if pre_avx2}


@pytest.mark.parametrize("core, pre_avx2", _CORES)
def test_pre_avx2_core_rule(core, pre_avx2):
    assert blas_env.is_pre_avx2_core(core) is pre_avx2


def test_pyscf_openblas_after_the_cli_setup_runs_no_pre_avx2_core():
    """A fresh process through the CLI's set-up; then PySCF's own library is asked."""
    record, core = _cli_setup_in_child()
    facts = record["pyscf_openblas_core"]
    assert facts["loaded"] == core != ""
    assert facts["default"], record  # the probe answered
    assert f"chose {facts['default']}" in record["pyscf_openblas"]
    assert record["pyscf_openblas"].endswith(f": now {core}") or \
        record["pyscf_openblas"].endswith(f": runs {core}")
    assert os.path.basename(facts["library"]).startswith("libopenblas")
    if _has_avx2_fma():
        assert facts["avx2_fma"] is True
        assert core.lower() not in _OLD_CORES, record
        if facts["default"].lower() in _OLD_CORES:
            assert facts["OPENBLAS_CORETYPE"] == blas_env.CORRECTED_CORETYPE == core
        else:
            assert facts["OPENBLAS_CORETYPE"] is None and core == facts["default"]
    else:
        assert facts["avx2_fma"] is False and facts["OPENBLAS_CORETYPE"] is None
        assert core == facts["default"]
        if core.lower() in _OLD_CORES:
            assert "this CPU has no AVX2/FMA" in record["pyscf_openblas"]


def test_user_coretype_is_kept_and_recorded_with_the_cores_it_gave():
    """Even an old core the CLI would correct: the user's value wins and the probe is skipped.
    numpy's OpenBLAS reads the variable too (it runs dfmp2's products), so the record names its
    core as well, asked of numpy's library independently here."""
    record, core = _cli_setup_in_child(OPENBLAS_CORETYPE="Prescott")
    facts = record["pyscf_openblas_core"]
    assert record["pyscf_openblas"].startswith("OPENBLAS_CORETYPE=Prescott (set by the user)")
    assert facts["OPENBLAS_CORETYPE"] == "Prescott" and facts["default"] is None
    assert facts["loaded"] == core
    numpy_core = _numpy_core_in_child(OPENBLAS_CORETYPE="Prescott")
    assert facts["numpy_core"] == numpy_core
    assert record["pyscf_openblas"].endswith(f"numpy's OpenBLAS, which reads it too, runs "
                                             f"{numpy_core}")
    if platform.machine() in ("x86_64", "AMD64"):
        assert core == "Prescott" and numpy_core.lower() in _OLD_CORES


def test_an_empty_coretype_counts_as_unset():
    record, core = _cli_setup_in_child(OPENBLAS_CORETYPE="", OPENBLAS_THREAD_TIMEOUT="")
    assert record["pyscf_openblas_core"]["default"], record  # probed and corrected as if unset
    assert record["OPENBLAS_THREAD_TIMEOUT"] == ("OPENBLAS_THREAD_TIMEOUT="
                                                 f"{blas_env.OPENBLAS_THREAD_TIMEOUT} (idle "
                                                 "OpenBLAS workers sleep sooner)")
    if _has_avx2_fma():
        assert core.lower() not in _OLD_CORES


def _numpy_core_in_child(**env_changes) -> str:
    """The core numpy's OpenBLAS runs in a fresh process, asked through its library file in
    numpy.libs with plain ctypes (not through the module under test)."""
    code = ("import ctypes, glob, os, numpy\n"
            "libs = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "
            "'numpy.libs')\n"
            "handle = ctypes.CDLL(glob.glob(os.path.join(libs, '*openblas*'))[0])\n"
            "f = getattr(handle, 'scipy_openblas_get_corename64_', None) or "
            "handle.openblas_get_corename\n"
            "f.restype = ctypes.c_char_p\nprint(f().decode())\n")
    env = {**os.environ, **env_changes}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_probe_reports_pyscf_library_and_ignores_a_set_coretype(monkeypatch):
    helper = blas_env._pyscf_helper_path()
    assert helper is not None and os.path.basename(helper).startswith("libnp_helper")
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    default = blas_env.probe_pyscf_openblas(helper)
    assert "error" not in default, default
    assert default["core"] and os.path.dirname(default["library"]) == os.path.dirname(
        os.path.realpath(helper))
    assert default["version"] != "unknown"
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Prescott")
    assert blas_env.probe_pyscf_openblas(helper)["core"] == default["core"]


def test_probe_failure_is_an_error_record():
    answer = blas_env.probe_pyscf_openblas("/nonexistent/libnp_helper.so")
    assert "failed" in answer["error"] and "core" not in answer


def _decide(monkeypatch, cpu, default):
    """load_pyscf_openblas with the CPU, the probe's answer and the loading faked: the record,
    and the OPENBLAS_CORETYPE each load was asked for."""
    calls = []

    def fake_load(coretype):
        calls.append(coretype)
        core = coretype or default.get("core", "Haswell")
        return {"core": core, "config": "", "library": "/x/libopenblas-r0.3.3.so",
                "version": "0.3.3"}

    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.setattr(blas_env, "_cpu", lambda: cpu)
    monkeypatch.setattr(blas_env, "_pyscf_loaded", lambda: False)
    monkeypatch.setattr(blas_env, "_pyscf_helper_path", lambda: "/x/libnp_helper.so")
    monkeypatch.setattr(blas_env, "probe_pyscf_openblas", lambda helper: dict(default))
    monkeypatch.setattr(blas_env, "_load_pyscf", fake_load)
    return blas_env.load_pyscf_openblas(), calls


def test_correction_follows_the_library_not_the_vendor(monkeypatch):
    """Sapphire Rapids (Intel, 'Prescott') and Zen 5 (AMD, 'Barcelona') are both corrected; a
    modern default and a CPU without AVX2/FMA are left alone."""
    avx2 = {"avx2", "fma", "avx512f"}
    for cpu, default, coretype, summary in [
        (("GenuineIntel", 6, avx2), "Prescott", "Haswell",
         "PySCF's OpenBLAS 0.3.3 chose Prescott; loaded with OPENBLAS_CORETYPE=Haswell: "
         "now Haswell"),
        (("AuthenticAMD", 0x1A, avx2), "Barcelona", "Haswell",
         "PySCF's OpenBLAS 0.3.3 chose Barcelona; loaded with OPENBLAS_CORETYPE=Haswell: "
         "now Haswell"),
        (("GenuineIntel", 6, {"avx", "avx2", "fma"}), "Sandybridge", "Haswell",
         "PySCF's OpenBLAS 0.3.3 chose Sandybridge; loaded with OPENBLAS_CORETYPE=Haswell: "
         "now Haswell"),
        (("AuthenticAMD", 0x17, avx2), "Zen", None,
         "PySCF's OpenBLAS 0.3.3 chose Zen; kept: runs Zen"),
        (("GenuineIntel", 6, {"sse2", "avx"}), "Prescott", None,
         "PySCF's OpenBLAS 0.3.3 chose Prescott; kept, as this CPU has no AVX2/FMA: "
         "runs Prescott"),
    ]:
        record, calls = _decide(monkeypatch, cpu, {"core": default})
        assert calls == [coretype]
        assert record["summary"] == summary
        assert record["default"] == default and record["OPENBLAS_CORETYPE"] == coretype
        assert record["loaded"] == (coretype or default)
        assert "OPENBLAS_CORETYPE" not in os.environ


def test_failed_probe_loads_unchanged_and_says_so(monkeypatch):
    record, calls = _decide(monkeypatch, ("GenuineIntel", 6, {"avx2", "fma"}),
                            {"error": "the probe failed"})
    assert calls == [None] and record["default"] is None
    assert record["summary"].startswith("PySCF's OpenBLAS 0.3.3 not probed (the probe failed)")


def test_loading_with_a_coretype_restores_the_environment(monkeypatch):
    """The real loader; in this test process PySCF has loaded already, so nothing changes but
    the environment must be as before and the loaded library answers."""
    import pyscf.lib  # noqa: F401

    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    answer = blas_env._load_pyscf(blas_env.CORRECTED_CORETYPE)
    assert "OPENBLAS_CORETYPE" not in os.environ
    assert answer["core"] and os.path.basename(answer["library"]).startswith("libopenblas")


def test_cpu_reader_returns_a_vendor_on_linux():
    vendor, family, flags = blas_env._cpu()
    assert isinstance(vendor, str) and isinstance(family, int) and isinstance(flags, set)


def test_cpu_blas_rule(monkeypatch):
    """auto: numpy's OpenBLAS on AMD CPUs with AVX2/FMA and Intel CPUs with AVX-512, torch's
    BLAS otherwise (an AVX2-only Intel CPU was not measured);
    explicit choices pass through; the reason says what the rule rests on (measured on both)."""
    amd = ("AuthenticAMD", 0x1A, {"avx2", "fma"})
    intel = ("GenuineIntel", 6, {"avx2", "fma", "avx512f"})
    for cpu, blas, expected, evidence in [
            (amd, "scipy-openblas", "numpy", "measured on AMD EPYC"),
            (amd, "accelerate", "torch", "measured on AMD EPYC"),
            (intel, "scipy-openblas", "numpy", "measured on an Intel Xeon"),
            (("GenuineIntel", 6, {"avx2", "fma"}), "scipy-openblas", "torch", "not all of AVX2"),
            (("AuthenticAMD", 0x15, {"avx"}), "scipy-openblas", "torch", "not all of AVX2"),
            (("", 0, set()), "", "torch", "not measured on this CPU vendor")]:
        monkeypatch.setattr(cpuinfo, "cpu_identity", lambda cpu=cpu: cpu)
        monkeypatch.setattr(cpuinfo, "numpy_blas_name", lambda blas=blas: blas)
        choice, reason = cpuinfo.choose_cpu_blas("auto")
        assert choice == expected and reason.startswith("auto: ") and evidence in reason
        for explicit in ("torch", "numpy"):
            assert cpuinfo.choose_cpu_blas(explicit) == (explicit,
                                                          f"requested --cpu-blas {explicit}")


def test_cpu_blas_resolution_is_recorded(monkeypatch):
    from dfmp2.linalg import Dispatcher, DispatchPolicy

    monkeypatch.setattr(cpuinfo, "cpu_identity", lambda: ("AuthenticAMD", 0x19, {"avx2", "fma"}))
    monkeypatch.setattr(cpuinfo, "numpy_blas_name", lambda: "scipy-openblas")
    record = Dispatcher(DispatchPolicy("pytorch")).cpu_blas.as_dict()
    assert record["choice"] == "numpy" and "AuthenticAMD CPU (family 0x19)" in record["reason"]
    assert cpuinfo.CPU_BLAS_EVIDENCE["AuthenticAMD"] in record["reason"]
    assert set(record["libraries"]) == {"torch", "numpy"}
    assert record["cpu"] == cpuinfo.cpu_model() != ""


def test_thread_timeout_respects_the_user_and_a_loaded_numpy(monkeypatch):
    import numpy  # noqa: F401  - loaded, as in any test process

    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "24")
    assert "set by the user" in blas_env.shorten_openblas_spin()
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT")
    assert "numpy had loaded" in blas_env.shorten_openblas_spin()
    assert "OPENBLAS_THREAD_TIMEOUT" not in os.environ


def test_prepare_process_records_what_it_set_and_keeps_the_users(monkeypatch):
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "22")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(blas_env, "_load_pyscf", lambda coretype: {
        "core": "Zen", "config": "", "library": "/x/libopenblas.so", "version": "0.3.3"})
    import torch  # noqa: F401  - loaded before the set-up, as in any test process

    monkeypatch.setattr(blas_env, "ask_numpy_openblas", lambda: {"core": "SkylakeX"})
    record = blas_env.prepare_process("numpy")
    assert record["OPENBLAS_THREAD_TIMEOUT"] == "OPENBLAS_THREAD_TIMEOUT=22 (set by the user)"
    # torch loaded in this process before the CLI's set-up: its OpenMP runtime read the
    # environment already (a fresh process gets PASSIVE: test_the_cli_sets_a_passive_wait...)
    assert "torch" in sys.modules
    assert record["OMP_WAIT_POLICY"].startswith("unset: torch had loaded")
    assert "OMP_WAIT_POLICY" not in os.environ
    assert record["pyscf_openblas"] == ("OPENBLAS_CORETYPE=Zen (set by the user): "
                                        "PySCF's OpenBLAS 0.3.3 runs Zen; numpy's OpenBLAS, "
                                        "which reads it too, runs SkylakeX")
    assert record["pyscf_openblas_core"]["OPENBLAS_CORETYPE"] == "Zen"
    assert record["pyscf_openblas_core"]["loaded"] == "Zen"
    assert os.environ["OPENBLAS_CORETYPE"] == "Zen"
    json.dumps(record)  # it goes into the result's JSON
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert blas_env.prepare_process("numpy")["OMP_WAIT_POLICY"] == "ACTIVE (set by the user)"
    assert "OMP_WAIT_POLICY" not in blas_env.prepare_process("torch")


def test_the_cli_sets_a_passive_wait_policy_in_a_fresh_process():
    record, _core = _cli_setup_in_child()
    from dfmp2.cpuinfo import choose_cpu_blas

    if choose_cpu_blas("auto")[0] == "numpy":
        assert record["OMP_WAIT_POLICY"] == "PASSIVE (numpy's BLAS runs the products)"
    else:
        assert "OMP_WAIT_POLICY" not in record


@pytest.mark.parametrize("name", blas_env.THREAD_COUNT_VARIABLES)
def test_a_thread_count_that_is_not_a_number_is_unset_with_a_warning(monkeypatch, caplog,
                                                                      name):
    """Empty, words, zero and negative counts are unset with one warning each and recorded;
    whole numbers (and OpenMP's lists) are left as they are, without a word."""
    for value in ("", "four", "0", "-2", "2.5"):
        monkeypatch.setenv(name, value)
        caplog.clear()
        with caplog.at_level("WARNING", logger="dfmp2.blas_env"):
            done = blas_env.drop_unreadable_thread_counts()
        assert name not in os.environ
        assert done == {name: f"{value!r} unset (not a positive whole number)"}
        assert len(caplog.records) == 1 and f"{name}={value!r} is not a positive whole " \
            "number" in caplog.text
    for value in ("1", " 3", "16") + (("4,2",) if name == "OMP_NUM_THREADS" else ()):
        monkeypatch.setenv(name, value)
        caplog.clear()
        with caplog.at_level("WARNING", logger="dfmp2.blas_env"):
            assert blas_env.drop_unreadable_thread_counts() == {}
        assert os.environ[name] == value and not caplog.records


def test_the_cli_unsets_an_empty_omp_num_threads_before_libgomp_reads_it(tmp_path):
    """A run with OMP_NUM_THREADS empty (a cluster script's unset variable): dfmp2's warning,
    in the record too, and not libgomp's two lines."""
    from conftest import INPUTS

    out = tmp_path / "water.json"
    env = {**os.environ, "OMP_NUM_THREADS": ""}
    done = subprocess.run([sys.executable, "-m", "dfmp2", "run", str(INPUTS / "water.xyz"),
                           "--json", str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "libgomp" not in done.stderr
    assert "OMP_NUM_THREADS='' is not a positive whole number" in done.stderr
    record = json.loads(out.read_text())["extras"]
    assert record["environment"]["OMP_NUM_THREADS"] == "'' unset (not a positive whole number)"
    assert any("OMP_NUM_THREADS=''" in text for text in record["warnings"])


def test_linalg_imports_no_environment_module():
    """The library never touches the environment: linalg depends on the pure CPU rule only."""
    import ast
    import pathlib

    import dfmp2.linalg

    for path in pathlib.Path(dfmp2.linalg.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert "blas_env" not in node.module, path
            if isinstance(node, ast.Attribute) and node.attr == "environ":
                raise AssertionError(f"{path} touches os.environ")


def test_the_core_is_asked_under_each_builds_names(monkeypatch):
    """numpy 1.x's wheel names them openblas_get_corename64_/openblas_get_config64_ (they were
    missing: its core read as 'not OpenBLAS'); numpy 2's scipy_openblas_*64_; plain builds
    have no suffix."""
    from types import SimpleNamespace

    monkeypatch.setattr(blas_env, "_file_of", lambda function: "/lib/libopenblas64_.so")

    def library(prefix, suffix):
        def corename():
            return b"Zen"

        def config():
            return b"OpenBLAS 0.3.23.dev DYNAMIC_ARCH USE64BITINT"

        return SimpleNamespace(_name="lib.so", **{f"{prefix}get_corename{suffix}": corename,
                                                 f"{prefix}get_config{suffix}": config})

    for prefix, suffix in (("openblas_", ""), ("openblas_", "64_"), ("scipy_openblas_", "64_"),
                           ("scipy_openblas_", "")):
        answer = blas_env.ask_openblas(library(prefix, suffix))
        assert (answer["core"], answer["version"]) == ("Zen", "0.3.23"), (prefix, suffix)
    assert "error" in blas_env.ask_openblas(library("openblas_", "_64_"))
