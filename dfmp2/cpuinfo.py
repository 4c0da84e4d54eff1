"""What CPU this is and which BLAS should run dfmp2's CPU products: a rule, no process state.

Shared by the CLI's environment set-up (:mod:`dfmp2.blas_env`) and the linear-algebra suite
(:mod:`dfmp2.linalg.cpu_blas`); it reads ``/proc/cpuinfo`` and numpy's build configuration and
never the environment.
"""

from __future__ import annotations

__all__ = ["cpu_identity", "cpu_model", "numpy_blas_name", "choose_cpu_blas", "CPU_BLAS_EVIDENCE"]


def cpu_identity() -> tuple[str, int, set[str]]:
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


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ('unknown' elsewhere)."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return "unknown"


def numpy_blas_name() -> str:
    """numpy's BLAS as its build configuration names it (e.g. 'scipy-openblas'), lower case."""
    import numpy as np

    config = getattr(np.__config__, "CONFIG", {}) or {}
    return str(config.get("Build Dependencies", {}).get("blas", {}).get("name", "")).lower()


#: What the ``auto`` rule of :func:`choose_cpu_blas` rests on, per CPU vendor: measured where a
#: machine was had, and said so where none was (no figure is assumed for a machine not measured).
CPU_BLAS_EVIDENCE = {
    "AuthenticAMD": (
        "measured on AMD EPYC Zen 5 (family 0x1A): DGEMM 2048^3 numpy's OpenBLAS 181-190 GFLOP/s, "
        "torch's MKL 82-105; Zen 4 (family 0x19): 99-104 against 89"
    ),
    "GenuineIntel": (
        "measured on an Intel Xeon with AVX-512 and AMX (family 6, model 167 as its hypervisor "
        "reports it): DGEMM 2048^3 numpy's OpenBLAS 151-181 GFLOP/s, torch's MKL 111-144; "
        "(H2O)16 DF-MP2 8.8 s against 10.5 s"
    ),
}
#: The CPU flags of the machines measured above, per vendor: every AMD CPU measured had
#: AVX2/FMA (MKL runs its generic code there); the Intel one had AVX-512, and on an AVX2-only
#: Intel CPU MKL's own AVX2 code was not measured against OpenBLAS.
_NEEDED_FLAGS = {"AuthenticAMD": frozenset({"avx2", "fma"}),
                 "GenuineIntel": frozenset({"avx2", "fma", "avx512f"})}


def choose_cpu_blas(requested: str) -> tuple[str, str]:
    """Resolve ``cpu_blas``: ('torch' | 'numpy', why). 'auto' takes numpy's OpenBLAS on an AMD
    CPU with AVX2 and FMA or an Intel CPU with AVX-512 (numpy's OpenBLAS ran DGEMM and the whole
    DF-MP2 faster than the MKL in torch's CPU wheel on both vendors' machines), and torch's BLAS
    otherwise (another numpy BLAS, another vendor, other CPUs: not measured); the reason names
    the evidence (:data:`CPU_BLAS_EVIDENCE`). A rule, not a timing: a timed pick was fooled by
    thread contention."""
    if requested != "auto":
        return requested, f"requested --cpu-blas {requested}"
    vendor, family, flags = cpu_identity()
    blas = numpy_blas_name()
    evidence = CPU_BLAS_EVIDENCE.get(vendor, "not measured on this CPU vendor")
    needed = _NEEDED_FLAGS.get(vendor, frozenset())
    flag_names = "/".join(sorted(f.upper() for f in needed))
    if vendor in CPU_BLAS_EVIDENCE and "openblas" in blas and needed <= flags:
        return "numpy", (
            f"auto: {vendor} CPU (family {family:#x}) with {flag_names} and numpy's BLAS is "
            f"{blas}; {evidence}"
        )
    return "torch", (
        f"auto: {vendor or 'unknown CPU vendor'}, numpy's BLAS {blas or 'unknown'}"
        f"{'' if needed <= flags else f', not all of {flag_names}'}; {evidence}"
    )
