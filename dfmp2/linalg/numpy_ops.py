"""The pair-energy op on numpy's BLAS (the pytorch backend with ``cpu_blas='numpy'`` on CPU).

Why a separate implementation: numpy's OpenBLAS keeps its worker threads spinning for a while
after each call. Any torch op run between two BLAS calls wakes torch's own OpenMP pool, whose
threads then share the cores with the spinning BLAS workers; on a 2-core machine this made
every torch copy or reduction between GEMMs several times slower. Here every elementwise step
is a single-threaded numpy ufunc in the calling thread, so the only thread pool in play is the
BLAS's own, and no wait policy has to be set before torch loads.

The reduction also works on a few pairs at a time (:data:`CHUNK_BYTES`): each GEMM writes
``(ia|jb)`` for a handful of j, and the reduction reads it back while it is still in cache.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["mp2_pair_energy", "CHUNK_BYTES"]

#: Target size of one chunk of (ia|jb) in the reduction dtype. Measured on C20H42 cc-pVDZ
#: (nvir 409, naux 1708, 2 cores): 1-4 pairs per chunk reduce at ~2 ns per element against
#: ~4.5 ns for a whole row of 64 pairs, with the GEMMs at the same rate.
CHUNK_BYTES = 4 * 1024 * 1024


def mp2_pair_energy(ovL_i: torch.Tensor, ovL_j: torch.Tensor, eps_i: torch.Tensor,
                    eps_j: torch.Tensor, eps_v: torch.Tensor, diagonal_block: bool) -> torch.Tensor:
    """Same contract as :func:`dfmp2.linalg.torch_ops.mp2_pair_energy` (CPU tensors only).

    For each i: GEMMs ``B_J[chunk] (k*nv, naux) x B_i^T (naux, nv)`` give ``T[k, b, a] =
    (ia|jb)`` for a chunk of j (j >= i in a diagonal block), each reduced straight away.
    """
    b_i, b_j = ovL_i.numpy(), ovL_j.numpy()
    ni, nv, naux = b_i.shape
    nj = b_j.shape[0]
    jb_rows = b_j.reshape(nj * nv, naux)
    e_i, e_j, e_v = eps_i.numpy(), eps_j.numpy(), eps_v.numpy()
    chunk = int(max(1, min(nj, CHUNK_BYTES // (nv * nv * e_v.itemsize))))
    rows = _Rows(chunk, nv, gemm_dtype=b_i.dtype, reduce_dtype=e_v.dtype)
    total = np.zeros(2)
    for i in range(ni):
        first = i if diagonal_block else 0
        for k0 in range(first, nj, chunk):
            k1 = min(k0 + chunk, nj)
            t_kba = rows.gemm(jb_rows[k0 * nv : k1 * nv], b_i[i].T, k1 - k0)
            pair_ij = e_i[i] + e_j[k0:k1]
            total += rows.energy(t_kba, pair_ij, e_v, diagonal_block and k0 == i)
    return torch.from_numpy(total)


class _Rows:
    """Buffers for one chunk of pairs, allocated once per op call: fresh multi-megabyte arrays
    per chunk would cost page faults comparable to the arithmetic."""

    def __init__(self, chunk: int, nv: int, gemm_dtype, reduce_dtype):
        self.nv = nv
        self.t = np.empty((chunk, nv, nv), dtype=gemm_dtype)
        self.t_reduce = self.t if gemm_dtype == reduce_dtype else np.empty(
            (chunk, nv, nv), dtype=reduce_dtype)
        self.w = np.empty((chunk, nv, nv), dtype=reduce_dtype)
        self.swap = np.empty((chunk, nv, nv), dtype=reduce_dtype)

    def gemm(self, jb_rows: np.ndarray, ai_t: np.ndarray, nk: int) -> np.ndarray:
        """(ia|jb) for nk pairs as T (nk, nb, na) in the GEMM dtype."""
        out = self.t[:nk]
        np.matmul(jb_rows, ai_t, out=out.reshape(nk * self.nv, self.nv))
        return out

    def energy(self, t_kba: np.ndarray, pair_ij: np.ndarray, e_v: np.ndarray,
               first_is_diagonal: bool) -> np.ndarray:
        """[e_os, e_ss] (float64) of the pairs in ``t_kba``; ``pair_ij[k] = e_i + e_j[k]``.
        Every pair counts twice except the first when ``first_is_diagonal`` (the pair (i, i)).
        The sums are symmetric in a <-> b, so the (b, a) layout of T needs no transpose."""
        nk, nv = t_kba.shape[0], self.nv
        t = t_kba
        if t.dtype != self.t_reduce.dtype:
            t = self.t_reduce[:nk]
            np.copyto(t, t_kba)
        d = self.w[:nk]  # D = e_i + e_j - e_a - e_b, then W = T / D in place
        np.subtract((pair_ij.astype(d.dtype)[:, None] - e_v)[:, :, None], e_v, out=d)
        np.divide(t, d, out=d)
        w_rows = d.reshape(nk, 1, nv * nv)
        direct = np.matmul(w_rows, t.reshape(nk, nv * nv, 1)).reshape(nk)
        swap = self.swap[:nk]
        np.copyto(swap, t.transpose(0, 2, 1))
        exchange = np.matmul(w_rows, swap.reshape(nk, nv * nv, 1)).reshape(nk)
        weight = np.full(nk, 2.0)
        if first_is_diagonal:
            weight[0] = 1.0
        e_os = float(weight @ direct.astype(np.float64))
        return np.array([e_os, e_os - float(weight @ exchange.astype(np.float64))])
