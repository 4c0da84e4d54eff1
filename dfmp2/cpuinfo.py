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
        "torch's MKL 82-105"
    ),
    "GenuineIntel": (
        "not measured on Intel (no Intel machine at hand): torch's MKL, Intel's own library, "
        "by default"
    ),
}


def choose_cpu_blas(requested: str) -> tuple[str, str]:
    """Resolve ``cpu_blas``: ('torch' | 'numpy', why). 'auto' takes numpy's OpenBLAS on AMD CPUs,
    where the MKL in torch's CPU wheel runs its generic AVX2 code, and torch's MKL elsewhere;
    the reason names the evidence (:data:`CPU_BLAS_EVIDENCE`: the AMD branch is measured, the
    Intel branch is not yet). A rule, not a timing: a timed pick was fooled by thread
    contention."""
    if requested != "auto":
        return requested, f"requested --cpu-blas {requested}"
    vendor, family, _ = cpu_identity()
    blas = numpy_blas_name()
    evidence = CPU_BLAS_EVIDENCE.get(vendor, "not measured on this CPU vendor")
    if vendor == "AuthenticAMD" and "openblas" in blas:
        return "numpy", (
            f"auto: AMD CPU (family {family:#x}) and numpy's BLAS is {blas}; {evidence}"
        )
    return "torch", (
        f"auto: {vendor or 'unknown CPU vendor'}, numpy's BLAS {blas or 'unknown'}; {evidence}"
    )
