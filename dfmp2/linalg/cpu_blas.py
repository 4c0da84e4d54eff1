"""Which BLAS runs the host's matrix products: torch's MKL or numpy's OpenBLAS.

The torch CPU wheel ships MKL and numpy ships OpenBLAS; numpy's was faster on every CPU measured
(AMD Zen 5: 181-190 against 82-105 GFLOP/s for a 2048^3 DGEMM, where MKL takes a generic AVX2
path; an Intel Xeon with AVX-512: 151-181 against 111-144, and the whole DF-MP2 1.2x).
OpenBLAS's worker threads spin for a while after each call, so with numpy chosen, no torch op may
run between two GEMMs (torch's OpenMP threads would share the cores with the spinning workers):
the ops with products inside have numpy implementations (the registry's ``numpy`` backend:
:mod:`dfmp2.linalg.numpy_ops`), and the pipeline's copies between GEMMs are numpy copies. ``auto`` picks by a rule
(:func:`dfmp2.cpuinfo.choose_cpu_blas`), recorded in the result with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .._names import CPU_BLAS_CHOICES
from ..cpuinfo import choose_cpu_blas, cpu_model
from ..errors import InputError

#: What ``auto`` resolves to.
RESOLVED_CHOICES = ("torch", "numpy")

__all__ = ["CPU_BLAS_CHOICES", "RESOLVED_CHOICES", "CpuBlas", "numpy_matmul", "torch_matmul", "blas_libraries"]


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


@dataclass(frozen=True)
class CpuBlas:
    """The CPU matmul of one run: ``choice`` 'torch' or 'numpy' (CUDA tensors always use torch),
    already resolved from 'auto' (:func:`resolve`); ``reason`` says why."""

    choice: str = "torch"
    reason: str = ""

    def __post_init__(self):
        if self.choice not in RESOLVED_CHOICES:
            raise InputError(
                f"unknown cpu_blas {self.choice!r}; choose one of {', '.join(RESOLVED_CHOICES)}")

    @classmethod
    def resolve(cls, requested: str) -> "CpuBlas":
        """The CpuBlas for ``requested`` ('auto', 'torch' or 'numpy')."""
        if requested not in CPU_BLAS_CHOICES:
            raise InputError(
                f"unknown cpu_blas {requested!r}; choose one of {', '.join(CPU_BLAS_CHOICES)}")
        return cls(*choose_cpu_blas(requested))

    def matmul(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None):
        """``a @ b`` with the chosen library."""
        if self.choice == "numpy" and a.device.type == "cpu":
            return numpy_matmul(a, b, out)
        return torch_matmul(a, b, out)

    def as_dict(self) -> dict:
        return {"choice": self.choice, "reason": self.reason, "libraries": blas_libraries(),
                "cpu": cpu_model()}
