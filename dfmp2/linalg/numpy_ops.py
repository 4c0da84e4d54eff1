"""The pair-energy and trmm ops on numpy's BLAS (pytorch backend, ``cpu_blas='numpy'``, CPU).

Why a separate implementation: numpy's OpenBLAS keeps its worker threads spinning for a while
after each call. Any torch op run between two BLAS calls wakes torch's own OpenMP pool, whose
threads then share the cores with the spinning BLAS workers; on a 2-core machine this made
every torch copy or reduction between GEMMs several times slower. Here every elementwise step
is a single-threaded numpy ufunc or the compiled pass, and no wait policy has to be set before
torch loads.

The pair step runs one Python thread per BLAS thread (:func:`worker_count`), each its own
GEMMs on a single BLAS thread and its own reductions (both release the GIL): one GEMM on all
threads followed by a reduction on one left the other cores idle for the reduction, and its
small GEMMs (N = 4 nvir) split across 16 threads ran at a fraction of their rate.

The reduction also works a few pairs at a time (:data:`CHUNK_BYTES`): each GEMM writes
``(ia|jb)`` for a handful of pairs, and the reduction reads it back while it is still in cache.
It is one compiled pass over the block (``dfmp2/linalg/_pair_reduce.c``, built at install when a
C compiler is present) or, without it, numpy ufuncs; :data:`PAIR_REDUCTION` says which.
"""

from __future__ import annotations

import importlib.util
import numbers
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ..blocking import pair_block_bytes
from ..errors import BackendUnavailableError, InputError
from ..threads import numpy_blas_threads, single_threaded_numpy_blas
from . import torch_ops  # a module reference: torch_ops imports cpu_blas, which imports us

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
    "mp2_pair_sums",
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


def mp2_pair_sums(ovL_i: torch.Tensor, ovL_j: torch.Tensor, eps_i: torch.Tensor,
                  eps_j: torch.Tensor, eps_va: torch.Tensor, eps_vb: torch.Tensor,
                  weights: torch.Tensor, exchange: bool,
                  compiled: bool | None = None, workers: int | None = None) -> torch.Tensor:
    """Same contract as :func:`dfmp2.linalg.torch_ops.mp2_pair_sums` (CPU tensors only).

    ovL_i (ni, nva, naux), ovL_j (nj, nvb, naux); eps_i (ni,), eps_j (nj,), eps_va (nva,),
    eps_vb (nvb,); weights (ni, nj) float64; exchange needs nva == nvb. Returns the float64
    tensor ``[direct, exchange]`` (exchange 0.0 when not asked).

    For each group of occupied i (:data:`GROUP_ROWS`) and chunk of j (j >= the group's first i
    in a diagonal block, :func:`~dfmp2.linalg.torch_ops.is_diagonal_block`) one GEMM
    ``B_J[chunk] (k*nvb, naux) x B_group^T (naux, g*nva)`` gives ``(ia|jb)`` as
    ``[(j, b), (i, a)]``, reduced while the block is in cache; a chunk whose weights are all 0
    is skipped, GEMM included. The reduction is the compiled pass (``compiled`` None with a
    float64 ``eps_va``: fp64 and mixed precision; ``compiled=True`` forces it, and it sums in
    float64 whatever ``eps_va``'s dtype) or numpy ufuncs in ``eps_va``'s dtype, each pair's
    terms summed in float64 (``compiled=False``, and by default the fp32 precision).
    The tasks (a group and a chunk: one GEMM and its reduction) run on ``workers`` threads
    (None: numpy's BLAS threads, the run's count), at most as many as the planner's budget for
    the block (:func:`dfmp2.blocking.pair_block_bytes`) holds buffers for
    (:func:`worker_count`); every GEMM runs on one BLAS thread and the tasks' sums are added in
    their order, so the result has the same bits whatever the threads (``--threads`` too).
    Raises :class:`InputError` for operands of the wrong shape or off the CPU, and
    :class:`BackendUnavailableError` for ``compiled=True`` without the compiled pass.
    """
    ni, nj, nva, nvb, naux = torch_ops.check_pair_sums_args(
        ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, exchange)
    if ovL_i.device.type != "cpu" or ovL_j.device.type != "cpu":
        raise InputError(f"numpy mp2_pair_sums needs CPU tensors, got ovL_i on "
                         f"{ovL_i.device} and ovL_j on {ovL_j.device}")
    e_va = eps_va.numpy()
    if compiled is None:
        compiled = _pair_reduce is not None and e_va.dtype == np.float64
    elif compiled and _pair_reduce is None:
        raise BackendUnavailableError(
            f"the compiled pair reduction is not built here: {PAIR_REDUCTION}")
    total = np.zeros(2)
    if ni == 0 or nj == 0 or nva == 0 or nvb == 0:
        return torch.from_numpy(total)
    weights = torch.as_tensor(weights, dtype=torch.float64, device="cpu")
    diagonal_block = torch_ops.is_diagonal_block(ovL_i, ovL_j, weights)
    w_ij = weights.numpy()
    b_i, b_j = ovL_i.numpy(), ovL_j.numpy()
    group = min(GROUP_ROWS, ni)
    chunk = int(max(1, min(nj, CHUNK_BYTES // (group * nva * nvb * b_i.itemsize))))
    tasks = [(g0, min(g0 + group, ni), k0, k1) for g0 in range(0, ni, group)
             for k0, k1 in _chunks(g0, min(g0 + group, ni), nj, chunk, diagonal_block)
             if w_ij[g0:g0 + group, k0:k1].any()]  # a chunk of weights 0: no GEMM either
    block = _Block(b_i, b_j.reshape(nj * nvb, naux), eps_i.numpy(), eps_j.numpy(), e_va,
                   eps_vb.numpy(), w_ij, compiled, exchange, tasks, max(chunk, group), group)
    # the planner's budget for the block: its (ia|jb) block and row buffers, B aside
    budget = pair_block_bytes(max(ni, nj), max(nva, nvb), naux, 0)
    count = worker_count(numpy_blas_threads() if workers is None else workers, len(tasks),
                         block.bytes_per_worker(), budget)
    # every GEMM on one BLAS thread, in one worker too: OpenBLAS's bits depend on its threads
    with single_threaded_numpy_blas():
        if count <= 1:
            for t in range(len(tasks)):
                block.run(t)
        else:  # (an error or a signal cancels the tasks not begun: Executor.map's cleanup)
            with ThreadPoolExecutor(count) as pool:
                list(pool.map(block.run, range(len(tasks))))
    for task_sums in block.sums:  # in the tasks' order: the same sum whatever the workers
        total += task_sums
    return torch.from_numpy(total)


def worker_count(workers: int, ntasks: int, bytes_per_worker: int, budget: int) -> int:
    """Threads for a call of ``ntasks`` GEMM-and-reduction tasks: ``workers`` (the BLAS's
    thread count), no more than the tasks, and no more than the ``budget`` holds workers'
    buffers of ``bytes_per_worker`` (one at least)."""
    if isinstance(workers, bool) or not isinstance(workers, numbers.Integral) or workers < 1:
        raise InputError(f"mp2_pair_sums: workers must be a whole number >= 1, got {workers!r}")
    return max(1, min(int(workers), ntasks, budget // max(1, bytes_per_worker)))


class _Block:
    """One call's operands and its tasks (a group of i and a chunk of j: one GEMM and its
    reduction); :meth:`run` does one task into ``sums`` with the calling thread's buffers."""

    def __init__(self, b_i, jb_rows, e_i, e_j, e_va, e_vb, w_ij, compiled: bool,
                 exchange: bool, tasks, chunk: int, group: int):
        self.b_i, self.jb_rows, self.e_i, self.e_j = b_i, jb_rows, e_i, e_j
        self.e_va, self.e_vb, self.w_ij = e_va, e_vb, w_ij
        self.compiled, self.exchange = compiled, exchange
        self.e_va64, self.e_vb64 = (np.ascontiguousarray(e, dtype=np.float64)
                                    for e in (e_va, e_vb))
        self.tasks, self.chunk, self.group = tasks, chunk, group
        self.sums = np.zeros((len(tasks), 2))  # (ntasks, [direct, exchange])
        self._local = threading.local()

    def _rows(self) -> "_Rows":
        """The calling thread's buffers, made at its first task."""
        rows = getattr(self._local, "rows", None)
        if rows is None:
            rows = self._local.rows = _Rows(
                self.chunk, self.group, self.b_i.shape[1], len(self.e_vb),
                gemm_dtype=self.b_i.dtype, reduce_dtype=self.e_va.dtype,
                numpy_reduction=not self.compiled, exchange=self.exchange)
        return rows

    def bytes_per_worker(self) -> int:
        """The buffers of one thread (:class:`_Rows`)."""
        nva, nvb = self.b_i.shape[1], len(self.e_vb)
        block = self.chunk * self.group * nva * nvb * self.b_i.itemsize
        rows = 0 if self.compiled else (3 + (self.e_va.dtype != np.float64)) * (
            self.group * nva * nvb * self.e_va.itemsize)
        return block + rows

    def run(self, t: int) -> None:
        """``sums[t]``: the weighted [direct, exchange] sums of task ``t``."""
        g0, g1, k0, k1 = self.tasks[t]
        rows = self._rows()
        nva, naux = self.b_i.shape[1], self.b_i.shape[2]
        nvb = len(self.e_vb)
        weight = np.ascontiguousarray(self.w_ij[g0:g1, k0:k1].T)  # (nk, ng)
        ai_t = self.b_i[g0:g1].reshape((g1 - g0) * nva, naux).T
        t_kbga = rows.gemm(self.jb_rows[k0 * nvb : k1 * nvb], ai_t)
        pair_e = np.add.outer(self.e_j[k0:k1].astype(np.float64),
                              self.e_i[g0:g1].astype(np.float64))
        if self.compiled:
            self.sums[t] = _pair_reduce.pair_sums(t_kbga, k1 - k0, nvb, g1 - g0, nva, pair_e,
                                                  weight, self.e_va64, self.e_vb64,
                                                  self.exchange)
            return
        for k in range(k1 - k0):
            p0, p1 = _weighted_span(weight[k])
            if p0 < p1:
                t_gba = rows.pairs(t_kbga[k, :, p0:p1])
                self.sums[t] += rows.sums(t_gba, pair_e[k, p0:p1], self.e_va, self.e_vb,
                                          weight[k, p0:p1])


def pair_reduction(reduce_dtype: torch.dtype) -> str:
    """How :func:`mp2_pair_sums` reduces by default for this reduction dtype, and on how many
    threads with the BLAS's count now, for the record."""
    if _pair_reduce is None or reduce_dtype == torch.float64:
        how = PAIR_REDUCTION
    else:
        how = f"numpy ufuncs ({reduce_dtype} terms summed in float64)"
    workers = numpy_blas_threads()
    if workers > 1:
        how += f"; on up to {workers} threads, each running its GEMMs on one BLAS thread"
    return how


def _weighted_span(weight_g: np.ndarray) -> tuple[int, int]:
    """(p0, p1): the range between the first and last nonzero weight of one row (0, 0 if none).
    In a diagonal block the pairs used in a row of the group's own chunk (i <= j) are a
    prefix."""
    nonzero = np.flatnonzero(weight_g)
    if nonzero.size == 0:
        return 0, 0
    return int(nonzero[0]), int(nonzero[-1]) + 1


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

    def __init__(self, chunk: int, group: int, nva: int, nvb: int, gemm_dtype, reduce_dtype,
                 numpy_reduction: bool, exchange: bool):
        self.nva, self.nvb = nva, nvb
        self.block = np.empty(chunk * nvb * group * nva, dtype=gemm_dtype)
        if numpy_reduction:
            self.t = np.empty((group, nvb, nva), dtype=reduce_dtype)
            self.w = np.empty((group, nvb, nva), dtype=reduce_dtype)
            self.swap = np.empty((group, nvb, nva), dtype=reduce_dtype) if exchange else None
            # below float64 each pair's terms are added up in float64, as the compiled pass
            # and the torch reduction do (a float32 dot drifts with the number of terms)
            self.terms = (None if np.dtype(reduce_dtype) == np.float64 else
                          np.empty((group, nvb * nva), dtype=reduce_dtype))

    def gemm(self, jb_rows: np.ndarray, ai_t: np.ndarray) -> np.ndarray:
        """``(ia|jb)`` as (nk, nvb, ng, nva) for the nk j of ``jb_rows`` and ng i of ``ai_t``."""
        nk, ng = jb_rows.shape[0] // self.nvb, ai_t.shape[1] // self.nva
        out = self.block[: nk * self.nvb * ng * self.nva].reshape(nk * self.nvb, ng * self.nva)
        np.matmul(jb_rows, ai_t, out=out)
        return out.reshape(nk, self.nvb, ng, self.nva)

    def pairs(self, t_bga: np.ndarray) -> np.ndarray:
        """One j's pairs as contiguous M (ng, nvb, nva), ``M[g, b, a] = T_ab``, in the
        reduction dtype."""
        t = self.t[: t_bga.shape[1]]
        np.copyto(t, t_bga.transpose(1, 0, 2))
        return t

    def sums(self, m: np.ndarray, pair_ij: np.ndarray, e_va: np.ndarray, e_vb: np.ndarray,
             weight: np.ndarray) -> np.ndarray:
        """``sum_p weight[p] * [direct, exchange](pair p)`` (float64) from contiguous
        M (np, nvb, nva), ``M[p, b, a] = T_ab``, with ``pair_ij[p] = e_i + e_j``; the exchange
        entry is 0.0 unless the buffers were made for it."""
        npair = m.shape[0]
        d = self.w[:npair]  # D[p, b, a] = e_i + e_j - e_b - e_a, then W = M / D in place
        e_b = e_vb.astype(d.dtype, copy=False)
        np.subtract((pair_ij.astype(d.dtype)[:, None] - e_b)[:, :, None], e_va, out=d)
        np.divide(m, d, out=d)
        direct = self._pair_dots(d, m)
        result = np.array([float(weight @ direct.astype(np.float64)), 0.0])
        if self.swap is not None:
            swap = self.swap[:npair]  # M[p, b, a] -> T_ba = M[p, a, b] (nva == nvb)
            np.copyto(swap, m.transpose(0, 2, 1))
            result[1] = float(weight @ self._pair_dots(d, swap).astype(np.float64))
        return result

    def _pair_dots(self, w: np.ndarray, m: np.ndarray) -> np.ndarray:
        """(np,) ``sum_ba w_pba m_pba`` of contiguous (np, nvb, nva) blocks: one batched
        product in float64, or the float32 terms summed in float64."""
        npair, nab = w.shape[0], self.nva * self.nvb
        if self.terms is None:
            return np.matmul(w.reshape(npair, 1, nab), m.reshape(npair, nab, 1)).reshape(npair)
        terms = np.multiply(w.reshape(npair, nab), m.reshape(npair, nab),
                            out=self.terms[:npair])
        return terms.sum(axis=1, dtype=np.float64)


def trmm(u_nn: torch.Tensor, b_mn: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`dfmp2.linalg.torch_ops.trmm` (CPU tensors only): one BLAS ?trmm,
    in place (SciPy's BLAS wrapper; SciPy's wheel bundles its own scipy-openblas, the same
    OpenBLAS family as numpy's, with the same kernels on this machine).
    Measured on the fit of (H2O)20 cc-pVDZ (38000 x 1680): 0.57-0.71 s against 1.06-1.15 s for
    the blocked GEMMs of the torch implementation on numpy's BLAS. A C- or Fortran-ordered
    ``b_mn`` is worked on in place (the DF-SCF's fit passes the transposed view of its
    (naux, pairs) tensor)."""
    from scipy.linalg import blas

    b, u = b_mn.numpy(), u_nn.numpy().astype(b_mn.numpy().dtype, copy=False)
    routine = blas.dtrmm if b.dtype == np.float64 else blas.strmm
    if b.flags.f_contiguous and not b.flags.c_contiguous:
        # a Fortran-ordered b (the transposed view of a C-ordered (n, m) array): the BLAS
        # multiplies it from the right in place
        result = routine(1.0, np.asfortranarray(u), b, side=1, lower=0, trans_a=0, diag=0,
                         overwrite_b=1)
        if not np.shares_memory(result, b):
            np.copyto(b, result)
        return b_mn
    # b @ u = (u^T b^T)^T; b^T and u^T (lower) are Fortran-ordered views: nothing is copied
    result = routine(1.0, u.T, b.T, side=0, lower=1, trans_a=0, diag=0, overwrite_b=1)
    if not np.shares_memory(result, b):  # b was not C-contiguous: SciPy worked on a copy
        np.copyto(b, result.T)
    return b_mn
