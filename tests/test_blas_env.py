"""The process environment's one owner (the CLI side) and the CPU BLAS rule it shares with
linalg: PySCF's OpenBLAS tuned only on CPUs that need it, never over the user's choice."""

from __future__ import annotations

import dfmp2.blas_env as blas_env
import dfmp2.cpuinfo as cpuinfo


def test_user_setting_is_respected(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    assert "set by the user" in blas_env.tune_pyscf_openblas()
    import os

    assert os.environ["OPENBLAS_CORETYPE"] == "Zen"


def test_not_applied_to_intel_or_old_amd(monkeypatch):
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    for cpu in [("GenuineIntel", 6, {"avx2", "fma"}), ("AuthenticAMD", 0x17, {"avx2", "fma"}),
                ("AuthenticAMD", 0x1A, {"sse2"})]:
        monkeypatch.setattr(blas_env, "_cpu", lambda cpu=cpu: cpu)
        assert blas_env.tune_pyscf_openblas() == "not needed on this CPU"


def test_applied_on_zen3_and_later_and_environment_restored(monkeypatch):
    import os

    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.setattr(blas_env, "_cpu", lambda: ("AuthenticAMD", 0x1A, {"avx2", "fma"}))
    assert "Haswell" in blas_env.tune_pyscf_openblas()
    assert "OPENBLAS_CORETYPE" not in os.environ


def test_cpu_reader_returns_a_vendor_on_linux():
    vendor, family, flags = blas_env._cpu()
    assert isinstance(vendor, str) and isinstance(family, int) and isinstance(flags, set)


def test_cpu_blas_rule(monkeypatch):
    """auto: numpy's OpenBLAS on AMD, torch's MKL otherwise; explicit choices pass through."""
    amd, intel = ("AuthenticAMD", 0x1A, {"avx2"}), ("GenuineIntel", 6, {"avx2"})
    for cpu, blas, expected in [(amd, "scipy-openblas", "numpy"), (amd, "accelerate", "torch"),
                                (intel, "scipy-openblas", "torch"), (("", 0, set()), "", "torch")]:
        monkeypatch.setattr(cpuinfo, "cpu_identity", lambda cpu=cpu: cpu)
        monkeypatch.setattr(cpuinfo, "numpy_blas_name", lambda blas=blas: blas)
        choice, reason = cpuinfo.choose_cpu_blas("auto")
        assert choice == expected and reason.startswith("auto: ")
        for explicit in ("torch", "numpy"):
            assert cpuinfo.choose_cpu_blas(explicit) == (explicit,
                                                          f"requested --cpu-blas {explicit}")


def test_cpu_blas_resolution_is_recorded(monkeypatch):
    from dfmp2.linalg import Dispatcher, DispatchPolicy

    monkeypatch.setattr(cpuinfo, "cpu_identity", lambda: ("AuthenticAMD", 0x19, {"avx2"}))
    monkeypatch.setattr(cpuinfo, "numpy_blas_name", lambda: "scipy-openblas")
    record = Dispatcher(DispatchPolicy("pytorch")).cpu_blas.as_dict()
    assert record["choice"] == "numpy" and "AMD CPU (family 0x19)" in record["reason"]
    assert set(record["libraries"]) == {"torch", "numpy"}
    assert record["cpu"] == cpuinfo.cpu_model() != ""


def test_thread_timeout_respects_the_user_and_a_loaded_numpy(monkeypatch):
    import os

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
    record = blas_env.prepare_process("numpy")
    assert record["OPENBLAS_THREAD_TIMEOUT"] == "OPENBLAS_THREAD_TIMEOUT=22 (set by the user)"
    assert record["OMP_WAIT_POLICY"].startswith("PASSIVE")
    assert record["pyscf_openblas"] == "OPENBLAS_CORETYPE=Zen (set by the user)"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert blas_env.prepare_process("numpy")["OMP_WAIT_POLICY"] == "ACTIVE (set by the user)"
    assert "OMP_WAIT_POLICY" not in blas_env.prepare_process("torch")


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
