"""Machine, thread and BLAS facts, and GEMM rates measured in the current process.

Everything here is measured or read at run time; nothing is assumed about the machine.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

import numpy as np

#: Environment variables that change which BLAS kernels or how many threads run.
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "OPENBLAS_L2_SIZE", "OPENBLAS_THREAD_TIMEOUT", "OMP_WAIT_POLICY")


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (plus family/model numbers, which name the core
    generation when the model string is generic)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:
                    break
    except OSError:
        return platform.processor() or "unknown"
    return (f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, "
            f"model {fields.get('model', '?')})")


def cpu_flags() -> list[str]:
    """The SIMD-relevant CPU flags (avx2, fma, avx512*) from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    return sorted(f for f in flags if f in ("avx2", "fma") or
                                  f.startswith("avx512"))
    except OSError:
        pass
    return []


def machine_info() -> dict:
    """CPU, cores, memory, load and library versions of this machine."""
    import torch

    try:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem_gib = None
    return {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cores": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
        else None,
        "memory_gib": round(mem_gib, 1) if mem_gib else None,
        "loadavg": list(os.getloadavg()),
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in BLAS_ENV},
    }


def blas_info() -> dict:
    """Which BLAS each side uses, read from the loaded libraries.

    torch: its build config (MKL or not). numpy/scipy and PySCF's bundled OpenBLAS
    (``libopenblas-r0-*.so`` behind ``libnp_helper``/``libmp``): threadpoolctl's report of every
    loaded BLAS (library, version, architecture = the kernel set OpenBLAS picked, threads), or
    numpy's build config when threadpoolctl is not installed.
    """
    import torch
    from pyscf import lib as pyscf_lib

    pyscf_lib.load_library("libmp")  # make sure PySCF's BLAS users are loaded before asking
    info = {
        "torch_blas": _torch_blas(),
        "torch_mkl": bool(torch.backends.mkl.is_available()),
        "torch_threads": torch.get_num_threads(),
        "pyscf_num_threads": pyscf_lib.num_threads(),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "OPENBLAS_THREAD_TIMEOUT": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
    }
    try:
        import threadpoolctl
    except ImportError:
        info["libraries"] = None
        info["numpy_config"] = _numpy_blas_config()
        return info
    info["libraries"] = [
        {**{k: lib.get(k) for k in ("internal_api", "prefix", "version", "architecture",
                                     "num_threads", "threading_layer")},
         "filepath": _package_path(lib.get("filepath") or "")}
        for lib in threadpoolctl.threadpool_info() if lib.get("user_api") == "blas"
    ]
    return info


def _torch_blas() -> str:
    """BLAS_INFO / LAPACK_INFO and the MKL line of ``torch.__config__.show()``."""
    import torch

    text = torch.__config__.show()
    parts = [line.strip(" -") for line in text.splitlines() if "Math Kernel Library" in line]
    for token in text.replace(",", " ").split():
        if token.startswith(("BLAS_INFO=", "LAPACK_INFO=")):
            parts.append(token)
    return "; ".join(parts) or "unknown"


def _package_path(path: str) -> str:
    """A library's path from its package folder on (``numpy.libs/libscipy_openblas...so``): the
    part that names the library, without the machine's install prefix."""
    parts = path.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1:])
    return parts[-1]


def _numpy_blas_config() -> str:
    """numpy's own report of the BLAS it was built against (used without threadpoolctl)."""
    try:
        config = np.show_config(mode="dicts")
        return str(config.get("Build Dependencies", {}).get("blas"))
    except TypeError:  # numpy < 1.26 has no mode=
        return "see numpy.show_config()"


def timed(fn, repeat: int) -> list[float]:
    """Wall seconds of ``repeat`` calls of ``fn`` after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def gflops(flops: float, seconds: list[float]) -> dict:
    """GFLOP/s at the median and at the best of ``seconds``."""
    return {"median": flops / statistics.median(seconds) / 1e9,
            "best": flops / min(seconds) / 1e9}


def torch_gemm_rate(m: int, k: int, n: int, dtype: str, repeat: int = 5) -> dict:
    """torch.matmul GFLOP/s for (m, k) x (k, n) in float64 or float32."""
    import torch

    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    a = torch.rand((m, k), dtype=dt, generator=gen)
    b = torch.rand((k, n), dtype=dt, generator=gen)
    return {"shape": [m, k, n], **gflops(2.0 * m * k * n, timed(lambda: a @ b, repeat))}


def numpy_gemm_rate(n: int, repeat: int = 5, k: int | None = None,
                    dtype: str = "float64") -> dict:
    """numpy matmul (GEMM of numpy's bundled OpenBLAS) GFLOP/s for (n, k) x (k, n);
    k defaults to n."""
    k = n if k is None else k
    rng = np.random.default_rng(0)
    a = rng.random((n, k)).astype(dtype)
    b = rng.random((k, n)).astype(dtype)
    return {"shape": [n, k, n], **gflops(2.0 * n * k * n, timed(lambda: a @ b, repeat))}


def pyscf_gemm_rate(n: int, repeat: int = 5) -> dict:
    """DGEMM GFLOP/s of PySCF's bundled OpenBLAS (``numpy_helper._dgemm`` -> libnp_helper's
    NPdgemm, the path of PySCF's C code), n x n x n."""
    from pyscf.lib import numpy_helper

    rng = np.random.default_rng(0)
    a, b, c = rng.random((n, n)), rng.random((n, n)), np.empty((n, n))
    return {"shape": [n, n, n],
            **gflops(2.0 * n**3, timed(lambda: numpy_helper._dgemm("N", "N", n, n, n, a, b, c),
                                       repeat))}


def first_touch(gib: float = 1.0) -> dict:
    """Seconds to write ``gib`` GiB of a new numpy array once (the first touch of its pages,
    one thread), then the same for a second array allocated right after the first is freed:
    on a VM that hands freed memory back to its host the first can cost ten times the second,
    and it changes every timing that allocates large arrays."""
    size = int(gib * 2**30) // 8
    times = []
    for _ in range(2):
        start = time.perf_counter()
        array = np.empty(size)
        array.fill(1.0)
        times.append(time.perf_counter() - start)
        del array
    return {"gib": gib, "new_s": times[0], "again_s": times[1]}


def gemm_rates(n: int = 2048, repeat: int = 5) -> dict:
    """The GEMM rates of this process: torch and numpy float64/float32, PySCF's DGEMM."""
    return {
        "torch_fp64": torch_gemm_rate(n, n, n, "float64", repeat),
        "torch_fp32": torch_gemm_rate(n, n, n, "float32", repeat),
        "numpy_fp64": numpy_gemm_rate(n, repeat),
        "numpy_fp32": numpy_gemm_rate(n, repeat, dtype="float32"),
        "pyscf_fp64": pyscf_gemm_rate(n, repeat),
    }
