"""Which BLAS runs the pytorch backend's CPU matrix products: torch's or numpy's.

The torch CPU wheel ships MKL and numpy ships OpenBLAS; which one is faster depends on the CPU
(on AMD processors MKL may take a slower code path). ``auto`` times one mid-size product in each
library, once per run, and keeps the faster; the choice and both rates are recorded in the
result. Both libraries compute the same IEEE products up to summation order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["CPU_BLAS_CHOICES", "CpuBlas", "numpy_matmul", "torch_matmul", "blas_libraries"]

CPU_BLAS_CHOICES = ("auto", "torch", "numpy")
#: Products smaller than this (in flops) always use torch: calibrating would cost more.
CALIBRATE_ABOVE_FLOPS = 2e8
_CALIBRATION_N = 768


def numpy_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None):
    """``a @ b`` for CPU tensors through numpy's BLAS (strided views are passed, not copied);
    ``out``, when given, is a contiguous tensor of the result's shape and dtype."""
    if out is None:
        return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))
    np.matmul(a.numpy(), b.numpy(), out=out.numpy())
    return out


def torch_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None):
    """``a @ b`` through torch (``out`` as in :func:`numpy_matmul`)."""
    return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)


def blas_libraries() -> dict[str, str]:
    """Names and versions of the BLAS libraries behind torch and numpy."""
    config = getattr(np.__config__, "CONFIG", {}) or {}
    blas = config.get("Build Dependencies", {}).get("blas", {})
    numpy_blas = " ".join(str(blas.get(k, "")) for k in ("name", "version")).strip() or "unknown"
    torch_blas = "MKL" if torch.backends.mkl.is_available() else "non-MKL BLAS"
    return {"torch": torch_blas, "numpy": numpy_blas}


def _gflops(matmul, a, b, repeat: int = 3) -> float:
    matmul(a, b)  # warm up (thread pools, page faults)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2.0 * a.shape[0] * a.shape[1] * b.shape[1] / best / 1e9


@dataclass
class CpuBlas:
    """The CPU matmul of one run. ``choice``: 'auto', 'torch' or 'numpy'; after the first large
    product ``selected`` names the library in use and ``rates`` holds the calibration (GFLOP/s
    per library and dtype)."""

    choice: str = "auto"
    selected: dict[str, str] = field(default_factory=dict)
    rates: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self):
        if self.choice not in CPU_BLAS_CHOICES:
            raise ValueError(
                f"unknown cpu_blas {self.choice!r}; choose one of {', '.join(CPU_BLAS_CHOICES)}")

    def matmul(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None):
        """``a @ b`` with the selected library (torch for CUDA tensors and small products)."""
        if a.device.type != "cpu" or self.choice == "torch":
            return torch_matmul(a, b, out)
        if self.choice == "numpy":
            return numpy_matmul(a, b, out)
        if a.shape[0] * a.shape[1] * b.shape[1] * 2 < CALIBRATE_ABOVE_FLOPS:
            return torch_matmul(a, b, out)
        key = str(a.dtype).replace("torch.", "")
        if key not in self.selected:
            self._calibrate(a.dtype, key)
        library = numpy_matmul if self.selected[key] == "numpy" else torch_matmul
        return library(a, b, out)

    def _calibrate(self, dtype, key: str) -> None:
        g = torch.Generator().manual_seed(0)
        a = torch.rand(_CALIBRATION_N, _CALIBRATION_N, generator=g, dtype=dtype)
        b = torch.rand(_CALIBRATION_N, _CALIBRATION_N, generator=g, dtype=dtype)
        rates = {"torch": _gflops(torch.matmul, a, b), "numpy": _gflops(numpy_matmul, a, b)}
        self.rates[key] = {name: round(rate, 1) for name, rate in rates.items()}
        self.selected[key] = max(rates, key=rates.get)

    def as_dict(self) -> dict:
        return {"choice": self.choice, "selected": dict(self.selected),
                "calibration_gflops": dict(self.rates), "libraries": blas_libraries()}
