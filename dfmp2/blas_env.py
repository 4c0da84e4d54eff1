"""The BLAS environment: what the ``dfmp2`` command sets before the libraries load, and which
CPU BLAS runs dfmp2's products (:func:`choose_cpu_blas`).

**PySCF's kernels.**
PySCF wheels bundle OpenBLAS 0.3.3, which predates AMD Zen 3 and later: it falls back to its
"Barcelona" kernels and runs DGEMM at about a third of the machine's rate (measured on this
project's benchmark machine, an AMD EPYC family 0x1A). ``OPENBLAS_CORETYPE=Haswell`` selects the
AVX2/FMA kernels these CPUs run well. The variable is read when a library loads, and numpy's own
(newer) OpenBLAS detects the CPU correctly, so numpy, scipy and torch load first, the variable is
set only while PySCF's library loads, and the previous environment is restored.

**OpenBLAS's idle workers.** After each call OpenBLAS's worker threads spin for
``2^OPENBLAS_THREAD_TIMEOUT`` cycles (default 2^28, about 0.1 s) before they sleep. The
transform alternates GEMMs with int3c2e blocks computed by libcint's OpenMP threads, which then
share the cores with the spinning workers: on (H2O)20 cc-pVDZ (13 int3c2e blocks) the integrals
took 1.8-2.1 s after GEMMs against 1.45-1.6 s alone, and 1.5-1.7 s with a timeout of 2^20
cycles (:data:`OPENBLAS_THREAD_TIMEOUT`). Sleeping workers cost a wake-up (microseconds) at the
next call, nothing next to the GEMMs of this program. The variable is read when OpenBLAS loads.
"""

from __future__ import annotations

import os
import sys

__all__ = ["tune_pyscf_openblas", "shorten_openblas_spin", "choose_cpu_blas",
           "OPENBLAS_THREAD_TIMEOUT", "openblas_thread_timeout"]

#: The ``OPENBLAS_THREAD_TIMEOUT`` the CLI sets (log2 of the cycles an idle worker spins).
OPENBLAS_THREAD_TIMEOUT = "20"

_ZEN3 = 0x19  # OpenBLAS 0.3.3 knows Zen 1/2 (family 0x17); 0x19 (Zen 3/4) and 0x1A (Zen 5) not


def _cpu() -> tuple[str, int, set[str]]:
    """(vendor, family, flags) of the first CPU from /proc/cpuinfo; ('', 0, set()) elsewhere."""
    vendor, family, flags = "", 0, set()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "vendor_id" and not vendor:
                    vendor = value.strip()
                elif key == "cpu family" and not family:
                    family = int(value.strip())
                elif key == "flags" and not flags:
                    flags = set(value.split())
                if vendor and family and flags:
                    break
    except (OSError, ValueError):
        pass
    return vendor, family, flags


def tune_pyscf_openblas() -> str:
    """Load PySCF's libraries with ``OPENBLAS_CORETYPE=Haswell`` where that is right; return what
    was done (for the result's provenance)."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return f"OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']} (set by the user)"
    vendor, family, flags = _cpu()
    if vendor != "AuthenticAMD" or family < _ZEN3 or not {"avx2", "fma"} <= flags:
        return "not needed on this CPU"
    import numpy  # noqa: F401  - numpy, scipy and torch pick their own kernels first
    import scipy.linalg  # noqa: F401
    import torch  # noqa: F401

    os.environ["OPENBLAS_CORETYPE"] = "Haswell"
    try:
        import pyscf.lib  # noqa: F401  - loads the bundled libopenblas
    finally:
        del os.environ["OPENBLAS_CORETYPE"]
    return f"Haswell for PySCF's bundled OpenBLAS (AMD family {family:#x})"


def shorten_openblas_spin() -> str:
    """Set ``OPENBLAS_THREAD_TIMEOUT`` to :data:`OPENBLAS_THREAD_TIMEOUT` unless it is set or
    numpy (and with it its OpenBLAS) has already loaded; return what was done."""
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return f"OPENBLAS_THREAD_TIMEOUT={os.environ['OPENBLAS_THREAD_TIMEOUT']} (set by the user)"
    if "numpy" in sys.modules:
        return "OPENBLAS_THREAD_TIMEOUT unset: numpy had loaded before the CLI could set it"
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = OPENBLAS_THREAD_TIMEOUT
    return f"OPENBLAS_THREAD_TIMEOUT={OPENBLAS_THREAD_TIMEOUT} (idle OpenBLAS workers sleep sooner)"


def openblas_thread_timeout() -> str:
    """The ``OPENBLAS_THREAD_TIMEOUT`` of this process's environment, as the result records it."""
    value = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
    return value if value is not None else "unset (OpenBLAS default: 28)"


def _numpy_blas_name() -> str:
    """numpy's BLAS as its build configuration names it (e.g. 'scipy-openblas'), lower case."""
    import numpy as np

    config = getattr(np.__config__, "CONFIG", {}) or {}
    return str(config.get("Build Dependencies", {}).get("blas", {}).get("name", "")).lower()


def choose_cpu_blas(requested: str) -> tuple[str, str]:
    """Resolve ``cpu_blas``: ('torch' | 'numpy', why). 'auto' takes numpy's OpenBLAS on AMD CPUs,
    where the MKL in torch's CPU wheel runs its generic AVX2 code (DGEMM 2048^3 on the AMD EPYC
    Zen 5 benchmark machine: MKL 82-105 GFLOP/s, numpy's OpenBLAS 181-190), and torch's MKL
    elsewhere. A rule, not a timing: a timed pick was fooled by thread contention."""
    if requested != "auto":
        return requested, f"requested --cpu-blas {requested}"
    vendor, family, _ = _cpu()
    blas = _numpy_blas_name()
    if vendor == "AuthenticAMD" and "openblas" in blas:
        return "numpy", f"auto: AMD CPU (family {family:#x}) and numpy's BLAS is {blas}"
    return "torch", f"auto: {vendor or 'unknown CPU vendor'}, numpy's BLAS {blas or 'unknown'}"
