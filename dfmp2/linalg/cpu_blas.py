"""Which BLAS runs the pytorch backend's CPU matrix products: torch's (default) or numpy's.

The torch CPU wheel ships MKL and numpy ships OpenBLAS; on some CPUs numpy's is much faster in
isolation (AMD Zen 5 here: 172 vs 95 GFLOP/s for a 2048^3 DGEMM, where MKL takes an AVX2 path).
Inside the pipeline, though, OpenBLAS's threads and torch's OpenMP threads spin-wait against each
other when GEMMs and torch reductions alternate: measured on C10H22 cc-pVDZ, the pair step took
1.7 s through numpy against 0.9 s through torch, and 0.84 s through numpy only with
``OMP_WAIT_POLICY=PASSIVE`` set before torch loads. A timed choice cannot see that interaction,
so the library is an explicit option, recorded in the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .._names import CPU_BLAS_CHOICES
from . import numpy_ops

__all__ = ["CPU_BLAS_CHOICES", "CpuBlas", "numpy_matmul", "torch_matmul", "blas_libraries"]


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


#: Ops with their own implementation on numpy's BLAS.
_NUMPY_OPS = {"mp2_pair_energy": numpy_ops.mp2_pair_energy}


def blas_libraries() -> dict[str, str]:
    """Names and versions of the BLAS libraries behind torch and numpy."""
    config = getattr(np.__config__, "CONFIG", {}) or {}
    blas = config.get("Build Dependencies", {}).get("blas", {})
    numpy_blas = " ".join(str(blas.get(k, "")) for k in ("name", "version")).strip() or "unknown"
    torch_blas = "MKL" if torch.backends.mkl.is_available() else "non-MKL BLAS"
    return {"torch": torch_blas, "numpy": numpy_blas}


@dataclass(frozen=True)
class CpuBlas:
    """The CPU matmul of one run: ``choice`` 'torch' or 'numpy' (CUDA tensors always use torch)."""

    choice: str = "torch"

    def __post_init__(self):
        if self.choice not in CPU_BLAS_CHOICES:
            raise ValueError(
                f"unknown cpu_blas {self.choice!r}; choose one of {', '.join(CPU_BLAS_CHOICES)}")

    def matmul(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None):
        """``a @ b`` with the chosen library."""
        if self.choice == "numpy" and a.device.type == "cpu":
            return numpy_matmul(a, b, out)
        return torch_matmul(a, b, out)

    def run(self, op: str, torch_fn, args: tuple):
        """Run a pytorch-backend op whose products go through this BLAS: the op's numpy
        implementation when numpy is chosen and the operands are on the CPU (see
        :mod:`dfmp2.linalg.numpy_ops`), else ``torch_fn(*args, matmul=self.matmul)``."""
        if self.choice == "numpy" and op in _NUMPY_OPS and args[0].device.type == "cpu":
            return _NUMPY_OPS[op](*args)
        return torch_fn(*args, matmul=self.matmul)

    def as_dict(self) -> dict:
        return {"choice": self.choice, "libraries": blas_libraries()}
