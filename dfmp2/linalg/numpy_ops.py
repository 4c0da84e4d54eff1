"""The pair-energy and trmm ops on numpy's BLAS (pytorch backend, ``cpu_blas='numpy'``, CPU).

Why a separate implementation: numpy's OpenBLAS keeps its worker threads spinning for a while
after each call. Any torch op run between two BLAS calls wakes torch's own OpenMP pool, whose
threads then share the cores with the spinning BLAS workers; on a 2-core machine this made
every torch copy or reduction between GEMMs several times slower. Here every elementwise step
is a single-threaded numpy ufunc in the calling thread, so the only thread pool in play is the
BLAS's own, and no wait policy has to be set before torch loads.

The reduction also works a few pairs at a time (:data:`CHUNK_BYTES`): each GEMM writes
``(ia|jb)`` for a handful of pairs, and the reduction reads it back while it is still in cache.
It is one compiled pass over the block (``dfmp2/linalg/_pair_reduce.c``, built at install when a
C compiler is present) or, without it, numpy ufuncs; :data:`PAIR_REDUCTION` says which.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import torch

from ..errors import BackendUnavailableError

try:
    from . import _pair_reduce
except ImportError as exc:  # the optional C extension was not built (no C compiler at install)
    _pair_reduce = None
    _MISSING = (str(exc) if importlib.util.find_spec(f"{__package__}._pair_reduce") else
                "not built at install, as no C compiler was found; reinstall with one")

__all__ = [
    "CHUNK_BYTES",
    "GROUP_ROWS",
    "PAIR_REDUCTION",
    "mp2_pair_energy",
    "pair_reduction",
    "trmm",
]

#: How this install reduces (ia|jb) blocks to pair energies, for the run's record.
PAIR_REDUCTION = ("compiled single pass (dfmp2.linalg._pair_reduce)" if _pair_reduce is not None
                  else f"numpy ufuncs (the compiled pass is {_MISSING})")

#: Target size of the (ia|jb) block one GEMM writes. Measured on C20H42 cc-pVDZ (nvir 409,
#: naux 1708, 2 cores): a few megabytes reduce at ~2 ns per element against ~4.5 ns for a whole
#: row of 64 pairs, with the GEMMs at the same rate.
CHUNK_BYTES = 4 * 1024 * 1024
#: Occupied orbitals i per GEMM (its N = GROUP_ROWS * nvir). OpenBLAS ran B_J B_i^T at 150-165
#: GFLOP/s with N = nvir = 409 and 178-187 with N = 4 * nvir (2048^3: 181-190). In a diagonal
#: block the group's own j are one symmetric rank-k update (:func:`_chunks`), which also gives
#: the pairs j < i inside the group that the sum does not use.
GROUP_ROWS = 4


def mp2_pair_energy(ovL_i: torch.Tensor, ovL_j: torch.Tensor, eps_i: torch.Tensor,
                    eps_j: torch.Tensor, eps_v: torch.Tensor, diagonal_block: bool,
                    compiled: bool | None = None) -> torch.Tensor:
    """Same contract as :func:`dfmp2.linalg.torch_ops.mp2_pair_energy` (CPU tensors only).

    For each group of occupied i (:data:`GROUP_ROWS`) and chunk of j (j >= the group's first i
    in a diagonal block) one GEMM ``B_J[chunk] (k*nv, naux) x B_group^T (naux, g*nv)`` gives
    ``(ia|jb)`` as ``[(j, b), (i, a)]``, reduced while the block is in cache: by the compiled
    pass (``compiled`` None or True, float64 reductions only: fp64 and mixed precision) or by
    numpy ufuncs (``compiled=False``, and the fp32 precision, whose reduction is float32).
    """
    b_i, b_j = ovL_i.numpy(), ovL_j.numpy()
    ni, nv, naux = b_i.shape
    nj = b_j.shape[0]
    jb_rows = b_j.reshape(nj * nv, naux)
    e_i, e_j, e_v = eps_i.numpy(), eps_j.numpy(), eps_v.numpy()
    if compiled is None:
        compiled = _pair_reduce is not None and e_v.dtype == np.float64
    elif compiled and _pair_reduce is None:
        raise BackendUnavailableError(
            f"the compiled pair reduction is not built here: {PAIR_REDUCTION}")
    group = min(GROUP_ROWS, ni)
    chunk = int(max(1, min(nj, CHUNK_BYTES // (group * nv * nv * b_i.itemsize))))
    rows = _Rows(max(chunk, group), group, nv, gemm_dtype=b_i.dtype, reduce_dtype=e_v.dtype,
                 numpy_reduction=not compiled)
    e_v64 = np.ascontiguousarray(e_v, dtype=np.float64)
    total = np.zeros(2)
    for g0 in range(0, ni, group):
        g1 = min(g0 + group, ni)
        ai_t = b_i[g0:g1].reshape((g1 - g0) * nv, naux).T
        for k0, k1 in _chunks(g0, g1, nj, chunk, diagonal_block):
            t_kbga = rows.gemm(jb_rows[k0 * nv : k1 * nv], ai_t)
            pair_e, weight = _pair_weights(e_i[g0:g1], e_j[k0:k1], g0, k0, diagonal_block)
            if compiled:
                total += _pair_reduce.pair_sums(t_kbga, k1 - k0, nv, g1 - g0, pair_e, weight,
                                                e_v64)
                continue
            for k in range(k1 - k0):
                # the pairs used are a prefix of the group: i <= j in a diagonal block
                used = int(np.count_nonzero(weight[k]))
                t_gba = rows.pairs(t_kbga[k, :, :used])
                total += rows.energy(t_gba, pair_e[k, :used], e_v, weight[k, :used])
    return torch.from_numpy(total)


def pair_reduction(reduce_dtype: torch.dtype) -> str:
    """How :func:`mp2_pair_energy` reduces by default for this reduction dtype, for the record."""
    if _pair_reduce is None or reduce_dtype == torch.float64:
        return PAIR_REDUCTION
    return f"numpy ufuncs ({reduce_dtype} reduction; the compiled pass sums in float64)"


def _pair_weights(e_g: np.ndarray, e_k: np.ndarray, g0: int, k0: int, diagonal_block: bool):
    """``pair_e[k, g] = e_i + e_j`` and ``weight[k, g]`` (float64, (nk, ng)) for the pairs of
    i = g0 + g with j = k0 + k: 2 for i < j (or any pair of an off-diagonal block), 1 for i == j,
    0 for the pairs j < i that a diagonal block computes but does not use."""
    pair_e = np.add.outer(e_k.astype(np.float64), e_g.astype(np.float64))
    if not diagonal_block:
        return pair_e, np.full(pair_e.shape, 2.0)
    i = np.arange(g0, g0 + len(e_g))
    j = np.arange(k0, k0 + len(e_k))[:, None]
    return pair_e, np.where(i < j, 2.0, np.where(i == j, 1.0, 0.0))


def _chunks(g0: int, g1: int, nj: int, chunk: int, diagonal_block: bool):
    """The (k0, k1) ranges of j for the group g0:g1. In a diagonal block the first range is the
    group itself: ``B_group B_group^T`` has one operand twice, which numpy hands to the BLAS as
    a symmetric rank-k update at half the flops of the GEMM."""
    if not diagonal_block:
        return [(k0, min(k0 + chunk, nj)) for k0 in range(0, nj, chunk)]
    return [(g0, g1)] + [(k0, min(k0 + chunk, nj)) for k0 in range(g1, nj, chunk)]


class _Rows:
    """Buffers for one GEMM block and its pairs, allocated once per op call: fresh
    multi-megabyte arrays per block would cost page faults comparable to the arithmetic."""

    def __init__(self, chunk: int, group: int, nv: int, gemm_dtype, reduce_dtype,
                 numpy_reduction: bool):
        self.nv = nv
        self.block = np.empty(chunk * nv * group * nv, dtype=gemm_dtype)
        if numpy_reduction:
            self.t = np.empty((group, nv, nv), dtype=reduce_dtype)
            self.w = np.empty((group, nv, nv), dtype=reduce_dtype)
            self.swap = np.empty((group, nv, nv), dtype=reduce_dtype)

    def gemm(self, jb_rows: np.ndarray, ai_t: np.ndarray) -> np.ndarray:
        """``(ia|jb)`` as (nk, nb, ng, na) for the nk j of ``jb_rows`` and ng i of ``ai_t``."""
        nk, ng = jb_rows.shape[0] // self.nv, ai_t.shape[1] // self.nv
        out = self.block[: nk * self.nv * ng * self.nv].reshape(nk * self.nv, ng * self.nv)
        np.matmul(jb_rows, ai_t, out=out)
        return out.reshape(nk, self.nv, ng, self.nv)

    def pairs(self, t_bga: np.ndarray) -> np.ndarray:
        """One j's pairs as contiguous T (ng, nb, na) in the reduction dtype."""
        t = self.t[: t_bga.shape[1]]
        np.copyto(t, t_bga.transpose(1, 0, 2))
        return t

    def energy(self, t: np.ndarray, pair_ij: np.ndarray, e_v: np.ndarray,
               weight: np.ndarray) -> np.ndarray:
        """``sum_p weight[p] * [e_os, e_ss](pair p)`` (float64) from contiguous T (np, nv, nv),
        with ``pair_ij[p] = e_i + e_j``. The sums are symmetric in a <-> b, so the layout of
        each T (a, b) or (b, a) does not matter."""
        npair, nv = t.shape[0], self.nv
        d = self.w[:npair]  # D = e_i + e_j - e_a - e_b, then W = T / D in place
        np.subtract((pair_ij.astype(d.dtype)[:, None] - e_v)[:, :, None], e_v, out=d)
        np.divide(t, d, out=d)
        w_rows = d.reshape(npair, 1, nv * nv)
        direct = np.matmul(w_rows, t.reshape(npair, nv * nv, 1)).reshape(npair)
        swap = self.swap[:npair]
        np.copyto(swap, t.transpose(0, 2, 1))
        exchange = np.matmul(w_rows, swap.reshape(npair, nv * nv, 1)).reshape(npair)
        e_os = float(weight @ direct.astype(np.float64))
        return np.array([e_os, e_os - float(weight @ exchange.astype(np.float64))])


def trmm(u_nn: torch.Tensor, b_mn: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`dfmp2.linalg.torch_ops.trmm` (CPU tensors only): one BLAS ?trmm,
    in place (SciPy's BLAS wrapper; SciPy's wheel bundles its own scipy-openblas, the same
    OpenBLAS family as numpy's, with the same kernels on this machine).
    Measured on the fit of (H2O)20 cc-pVDZ (38000 x 1680): 0.57-0.71 s against 1.06-1.15 s for
    the blocked GEMMs of the torch implementation on numpy's BLAS."""
    from scipy.linalg import blas

    b, u = b_mn.numpy(), u_nn.numpy().astype(b_mn.numpy().dtype, copy=False)
    routine = blas.dtrmm if b.dtype == np.float64 else blas.strmm
    # b @ u = (u^T b^T)^T; b^T and u^T (lower) are Fortran-ordered views: nothing is copied
    result = routine(1.0, u.T, b.T, side=0, lower=1, trans_a=0, diag=0, overwrite_b=1)
    if not np.shares_memory(result, b):  # b was not C-contiguous: SciPy worked on a copy
        np.copyto(b, result.T)
    return b_mn
