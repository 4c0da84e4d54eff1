"""The CLI's PySCF OpenBLAS tuning: only on CPUs that need it, never over the user's choice."""

from __future__ import annotations

import dfmp2.blas_env as blas_env


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
        monkeypatch.setattr(blas_env, "_cpu", lambda cpu=cpu: cpu)
        monkeypatch.setattr(blas_env, "_numpy_blas_name", lambda blas=blas: blas)
        choice, reason = blas_env.choose_cpu_blas("auto")
        assert choice == expected and reason.startswith("auto: ")
        for explicit in ("torch", "numpy"):
            assert blas_env.choose_cpu_blas(explicit) == (explicit,
                                                          f"requested --cpu-blas {explicit}")


def test_cpu_blas_resolution_is_recorded(monkeypatch):
    from dfmp2.linalg import DispatchPolicy, Dispatcher

    monkeypatch.setattr(blas_env, "_cpu", lambda: ("AuthenticAMD", 0x19, {"avx2"}))
    monkeypatch.setattr(blas_env, "_numpy_blas_name", lambda: "scipy-openblas")
    record = Dispatcher(DispatchPolicy("pytorch")).cpu_blas.as_dict()
    assert record["choice"] == "numpy" and "AMD CPU (family 0x19)" in record["reason"]
    assert set(record["libraries"]) == {"torch", "numpy"}


def test_thread_timeout_respects_the_user_and_a_loaded_numpy(monkeypatch):
    import os

    import numpy  # noqa: F401  - loaded, as in any test process

    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "24")
    assert "set by the user" in blas_env.shorten_openblas_spin()
    assert blas_env.openblas_thread_timeout() == "24"
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT")
    assert "numpy had loaded" in blas_env.shorten_openblas_spin()
    assert "OPENBLAS_THREAD_TIMEOUT" not in os.environ
    assert blas_env.openblas_thread_timeout().startswith("unset")
