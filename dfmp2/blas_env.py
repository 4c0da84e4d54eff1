"""The one owner of the process environment: what the ``dfmp2`` command sets, once, before the
numerical libraries load (:func:`prepare_process`), and the record of it that goes into the
result. Only the CLI (and the benchmark harness, which mirrors it) calls this module; the library
itself never reads or writes the environment.

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

from .cpuinfo import choose_cpu_blas
from .cpuinfo import cpu_identity as _cpu

__all__ = ["prepare_process", "tune_pyscf_openblas", "shorten_openblas_spin",
           "OPENBLAS_THREAD_TIMEOUT"]

#: The ``OPENBLAS_THREAD_TIMEOUT`` the CLI sets (log2 of the cycles an idle worker spins).
OPENBLAS_THREAD_TIMEOUT = "20"

_ZEN3 = 0x19  # OpenBLAS 0.3.3 knows Zen 1/2 (family 0x17); 0x19 (Zen 3/4) and 0x1A (Zen 5) not


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


def prepare_process(cpu_blas: str) -> dict:
    """Set what must be set before numpy, torch and PySCF load, in the one order that works, and
    return the record of it (stored in the result's ``environment``).

    1. ``OPENBLAS_THREAD_TIMEOUT`` (read when numpy's OpenBLAS loads);
    2. ``OMP_WAIT_POLICY=PASSIVE`` when numpy's BLAS runs the products (torch's OpenMP threads
       must not spin while OpenBLAS works; libgomp reads it when torch loads);
    3. PySCF's bundled OpenBLAS loaded with Haswell kernels where it needs them.
    A value the user set is kept and recorded as such."""
    record = {"OPENBLAS_THREAD_TIMEOUT": shorten_openblas_spin()}
    if choose_cpu_blas(cpu_blas)[0] == "numpy":
        if "OMP_WAIT_POLICY" in os.environ:
            record["OMP_WAIT_POLICY"] = f"{os.environ['OMP_WAIT_POLICY']} (set by the user)"
        else:
            os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
            record["OMP_WAIT_POLICY"] = "PASSIVE (numpy's BLAS runs the products)"
    record["pyscf_openblas"] = tune_pyscf_openblas()
    return record
