"""DF-J/K for PySCF's SCF drivers on dfmp2's own integrals, fit and linalg ops.

PySCF keeps its drivers (DIIS, guess, level shift, convergence checks); a density-fitted SCF
object asks its ``with_df`` for J and K once per iteration. :class:`DFJK` is such a ``with_df``:
a ``pyscf.df.DF`` whose three-index tensor is built once by :mod:`dfmp2.scf_integrals` (the
metric factored as in the MP2 step, int3c2e streamed, the fit through the registry's
``trmm``/``gemm``; in a temporary file when it does not fit in memory) and whose J and K are
registry ``gemm`` calls:

    B^Q_{mu nu} = sum_P [L^{-1}]_QP (P|mu nu)          J = L L^T the Coulomb metric
    J_{mu nu}  = sum_Q B^Q_{mu nu} rho_Q,  rho_Q = sum_{lam sig} B^Q_{lam sig} D_{lam sig}
    K          = sum_Q (B^Q C)(B^Q C)^T  with D = C C^T (C = C_occ sqrt(n_occ), or from eigh
                                          of D with the negative part subtracted)

The AO pairs whose integrals are zero for every auxiliary function (libcint's screening of
distant pairs) are left out of the fit, of J's products and of the tensor in memory or on disk
(:class:`dfmp2.df.PairColumns`). In memory, when K is float64 and it fits, B is held unpacked
only, (naux_fit, nao, nao), built over its own screened rows: K reads it without unpacking and
J takes its fitted density from K's products. Otherwise B is kept on the pairs that are not
zero, (naux_fit, pairs.ncol), with as many of its first rows unpacked instead as memory holds
(``head``, read as the unpacked tensor is), and K unpacks the others block by block every
build, with an unpacked copy of the whole where that fits too (no rows unpacked);
``layout='packed'`` keeps PySCF's ``_cderi`` (naux_fit, nao(nao+1)/2) instead.
PySCF's own tools that read a DF object (``loop``, ``get_naoaux``) keep working: ``loop`` gives
PySCF's packed blocks of any layout, in memory or on disk.
Indices: mu, nu, lam, sig atomic orbitals; P, Q auxiliary functions; i occupied orbitals.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from pyscf import df as pyscf_df
from pyscf import lib

from .blocking import (
    JKPlan,
    jk_lane_budget,
    jk_square_fits,
    jk_square_rows,
    jk_work_bytes,
    plan_jk,
)
from .buffers import zeros
from .df import PairColumns, PairUnpacker, shell_row_pairs
from .errors import InputError
from .integrals import make_auxmol
from .linalg import Dispatcher
from .scf_integrals import (
    JK_AUX_BLOCK,
    UNPACK_BLOCK,
    fitted_cderi,
    fitted_cderi_file,
    split_cderi,
)
from .threads import numpy_blas_threads, single_threaded_numpy_blas

log = logging.getLogger(__name__)

__all__ = [
    "DFJK",
    "JK_LAYOUTS",
    "K_PRECISIONS",
    "K_SQUARE_BLOCK",
    "get_jk",
    "plan_tensor",
    "square_copy",
]


#: Where an in-memory DF-SCF tensor is kept (:class:`DFJK`): 'auto' holds it unpacked only (in
#: float64; float32 K casts its blocks) when that fits, else packed on the AO pairs that are
#: not zero; 'packed' always holds PySCF's packed layout.
JK_LAYOUTS = ("auto", "packed")
#: Precisions of K's products: float64, or float32 for the early iterations of an SCF (only
#: :func:`dfmp2.scf.run_scf` installs the convergence test that keeps float32 cycles from
#: converging; an SCF object whose K is still float32 is refused by the MP2 step).
K_PRECISIONS = ("fp64", "fp32")
#: Auxiliary functions per block of K's products from the square copy: one ``Y = C^T B^Q``
#: product for all densities, then ``Y^T Y`` per density. Measured on the Intel Xeon (family 6,
#: model 167), (H2O)16 cc-pVDZ: a UHF build 1.29-1.34 s at 64 against 1.34-1.45 s at 128, an
#: RHF build 0.69-0.73 s at either.
K_SQUARE_BLOCK = 64
#: Auxiliary functions per block of a lane worker (:func:`_lanes`): its GEMMs on one
#: BLAS thread. (H2O)16's J/K build on the 2 cores of the Zen 4 machine (one process, medians
#: of 5, the prototype of `benchmarks/jk_threads.py` at commit 4879847): 0.864, 0.870 and
#: 0.858 s at 8, 16 and 32 against 0.92-1.04 s on the two BLAS threads; 8 keeps a worker's
#: arrays smallest.
LANE_BLOCK = 8
#: Least floating-point work of a build (about 3 R n^2 naux) for which it runs in lanes: below,
#: starting the workers costs more than they gain. Builds on 2 threads of the Zen 4 machine
#: (alternating, medians of 7): (H2O)4's (0.3 GFLOP) 18 ms in lanes against 11 ms in one pass,
#: (H2O)8's (4.2 GFLOP) 0.115 against 0.114 s, (H2O)12's (21 GFLOP) 0.33 against 0.36 s.
LANE_MIN_FLOPS = 4e9
#: |eigenvalue| of a density matrix below this (relative to the largest) is dropped when K is
#: built from eigenvectors (an untagged density, e.g. PySCF's initial guess).
_DM_EIG_CUTOFF = 1e-14


def _row_blocks(cderi, read_block: int):
    """``(q0, q1, rows)`` over the fitted tensor: the whole array once when it is in memory,
    else blocks of ``read_block`` auxiliary functions read from its :class:`MatrixFile` into one
    reused array."""
    if isinstance(cderi, np.ndarray):
        yield 0, cderi.shape[0], cderi
        return
    naux, width = cderi.shape
    rows = np.empty((min(read_block, naux), width))
    for q0 in range(0, naux, read_block):
        q1 = min(q0 + read_block, naux)
        yield q0, q1, cderi.read_rows(q0, q1, rows)


def _eigen_factors(dm: np.ndarray) -> list[tuple[np.ndarray, float]]:
    """``[(C, sign), ...]`` with ``dm = sum sign C C^T`` from ``eigh(dm)`` (positive and negative
    parts): the factors of a density PySCF did not tag with its orbitals (its initial guess)."""
    w, v = np.linalg.eigh((dm + dm.T) / 2)
    cut = _DM_EIG_CUTOFF * max(1.0, float(np.abs(w).max(initial=0.0)))
    factors = []
    for sign, keep in ((1.0, w > cut), (-1.0, w < -cut)):
        if keep.any():
            factors.append((v[:, keep] * np.sqrt(np.abs(w[keep])), sign))
    return factors


def _k_factors(dm, dms: np.ndarray) -> tuple[np.ndarray, list[list[tuple[slice, float]]]]:
    """``(coeff, parts)``: the factors of every density of ``dms`` (nset, nao, nao) as columns
    of one (nao, R) float64 matrix, so that one product ``Y = coeff^T B^Q`` per block of
    the tensor serves all of them (a UHF's two spins read the tensor once, in one product with
    twice the rows), and per density ``[(columns, sign), ...]`` with
    ``dms[k] = sum sign coeff[:, columns] coeff[:, columns]^T``.

    The columns are ``C_occ sqrt(n_occ)`` when PySCF tagged ``dm`` with its orbitals, else
    from :func:`_eigen_factors`. ROHF's two densities come from one set of orbitals (PySCF tags
    them as that set with occupations 2/1/0, or as the pair (C, C) with alpha and beta
    occupations): when the two spins share their orbitals, beta's occupied orbitals are among
    alpha's with the same weights, the shared columns come first and serve both (beta's
    columns are alpha's first ones)."""
    nset = dms.shape[0]
    mo_coeff, mo_occ = getattr(dm, "mo_coeff", None), getattr(dm, "mo_occ", None)
    blocks, parts = [], []

    def add(coeff, sign):
        start = sum(b.shape[1] for b in blocks)
        blocks.append(coeff)
        return slice(start, start + coeff.shape[1]), sign

    if mo_coeff is None or mo_occ is None:
        parts = [[add(c, sign) for c, sign in _eigen_factors(d)] for d in dms]
    else:
        mo_coeff, mo_occ = np.asarray(mo_coeff), np.asarray(mo_occ)
        if mo_coeff.ndim == 2 and nset == 2 and mo_occ.ndim == 1:  # ROHF, one set tagged
            mo_coeff = np.stack([mo_coeff, mo_coeff])
            mo_occ = np.stack([(mo_occ > 0), (mo_occ == 2)]).astype(float)
        mo_coeff = mo_coeff.reshape(nset, *mo_coeff.shape[-2:])
        mo_occ = mo_occ.reshape(nset, -1)
        shared = _shared_columns(mo_coeff, mo_occ)
        if shared is not None:
            alpha, _ = add(mo_coeff[0][:, shared] * np.sqrt(mo_occ[0][shared]), 1.0)
            parts = [[(alpha, 1.0)], [(slice(0, int((mo_occ[1] > 0).sum())), 1.0)]]
        else:
            for c, n in zip(mo_coeff, mo_occ):
                occupied = n > 0
                parts.append([add(c[:, occupied] * np.sqrt(n[occupied]), 1.0)])
    nao = dms.shape[-1]
    coeff = np.concatenate(blocks, axis=1) if blocks else np.zeros((nao, 0))
    return np.ascontiguousarray(coeff, dtype=np.float64), parts


def _shared_columns(mo_coeff: np.ndarray, mo_occ: np.ndarray) -> np.ndarray | None:
    """For two densities of the same orbitals ``mo_coeff`` (2, nao, nmo), occupations
    ``mo_occ`` (2, nmo), where every orbital occupied in beta is occupied in alpha with the same
    weight (ROHF): alpha's occupied orbitals with beta's first, else None."""
    if mo_coeff.shape[0] != 2 or not np.array_equal(mo_coeff[0], mo_coeff[1]):
        return None
    alpha, beta = mo_occ[0] > 0, mo_occ[1] > 0
    if np.any(beta & ~alpha) or not np.array_equal(mo_occ[0][beta], mo_occ[1][beta]):
        return None
    return np.concatenate([np.flatnonzero(beta), np.flatnonzero(alpha & ~beta)])


def _k_blocks(cderi: np.ndarray, square: np.ndarray | None, dtype, unpack: PairUnpacker,
              pairs: PairColumns | None = None):
    """Yield ``(q*nao, nao)`` row blocks of the unpacked tensor for K in ``dtype``: slices of
    ``square`` ((naux, nao, nao), kept by :class:`DFJK` when memory allows) when it has that
    dtype, else blocks of :data:`UNPACK_BLOCK` auxiliary functions unpacked from ``cderi``
    (packed rows, or with ``pairs`` pair-screened ones) by ``unpack`` (and cast) into reused
    arrays. A block is valid until the next one is requested."""
    naux = cderi.shape[0]
    nao = _nao_of_pairs(cderi.shape[1]) if pairs is None else pairs.nao
    if square is not None and square.dtype == dtype:
        for q0 in range(0, naux, K_SQUARE_BLOCK):
            yield torch.from_numpy(square[q0:q0 + K_SQUARE_BLOCK].reshape(-1, nao))
        return
    unpacked = np.empty((UNPACK_BLOCK, nao, nao))
    cast = (None if dtype == np.float64 else  # float32 (K_PRECISIONS), cast by torch's threads
            torch.empty((UNPACK_BLOCK, nao, nao), dtype=torch.float32))
    for q0 in range(0, naux, UNPACK_BLOCK):
        q1 = min(q0 + UNPACK_BLOCK, naux)
        block = torch.from_numpy(unpack(cderi[q0:q1], unpacked, pairs))
        if cast is not None:
            block = cast[: q1 - q0].copy_(block)
        yield block.reshape(-1, nao)


def _nao_of_pairs(npair: int) -> int:
    """n from the packed pair count n(n+1)/2."""
    return int(round((np.sqrt(8 * npair + 1) - 1) / 2))


def square_copy(cderi: np.ndarray, dtype, pairs: PairColumns | None = None) -> np.ndarray:
    """``cderi`` (naux, nao(nao+1)/2), or with ``pairs`` the pair-screened (naux, pairs.ncol),
    unpacked into a new (naux, nao, nao) array of ``dtype``,
    zeroed by threads first (its pages touched in order, :mod:`dfmp2.buffers`: the unpacking's
    scattered first writes took 2.1-2.5 s for (H2O)16 cc-pVDZ's 2 GB on the Intel Xeon (family
    6, model 167), against 0.4-0.6 s for zeroing it and 0.3 s for the unpacking then); in
    float64 the unpacking threads write into it, in float32 blocks are cast into it. The
    DF-SCF's tensor itself is held unpacked only where that fits
    (:func:`dfmp2.scf_integrals.screened_cderi`)."""
    naux = cderi.shape[0]
    nao = _nao_of_pairs(cderi.shape[1]) if pairs is None else pairs.nao
    square = zeros((naux, nao, nao), dtype)
    with PairUnpacker() as unpack:
        if square.dtype == np.float64:  # the unpacking threads write into it
            for q0 in range(0, naux, UNPACK_BLOCK):
                unpack(cderi[q0:q0 + UNPACK_BLOCK], square[q0:q0 + UNPACK_BLOCK], pairs)
        else:  # unpacked, then cast, block by block
            for q0, cols in zip(range(0, naux, UNPACK_BLOCK),
                                _k_blocks(cderi, None, square.dtype, unpack, pairs)):
                square[q0:q0 + UNPACK_BLOCK] = cols.numpy().reshape(-1, nao, nao)
    return square


def get_jk(cderi, dm, la: Dispatcher, with_j: bool = True, with_k: bool = True,
           k_precision: str = "fp64", square: np.ndarray | None = None, k_la=None,
           counts: dict | None = None, read_block: int = JK_AUX_BLOCK,
           pairs: PairColumns | None = None, head: np.ndarray | None = None,
           lane_budget: int | None = None):
    """(vj, vk) of densities ``dm`` ((nao, nao) or (nset, nao, nao), symmetric) from the fitted
    tensor ``cderi`` float64, an array or a :class:`MatrixFile` read ``read_block`` auxiliary
    functions at a time: PySCF's packed layout (naux, nao(nao+1)/2), or with ``pairs`` the
    pair-screened one (naux, pairs.ncol) of :func:`dfmp2.scf_integrals.screened_cderi`; either
    result is None when not asked for.
    Every product is ``la.gemm``. J is float64 (but see ``k_precision``). K uses ``Y = C^T
    B^Q`` (B^Q symmetric; one product for all densities, :func:`_k_factors`) and per density
    ``K += Y^T Y`` of its rows, per block of auxiliary functions, accumulated in float64; with
    ``k_precision`` 'fp32' K's products run in float32 (for the early iterations of an SCF),
    and J's too for the rows held unpacked only (``square`` alone, or ``head``;
    :func:`_jk_from_square`): the J of rows on their AO pairs or packed stays float64.
    ``square``: the tensor unpacked, (naux, nao, nao), in float32 or float64, when memory
    allowed keeping it; K reads it when it has K's precision (the lanes: or float64, cast to
    float32 block by block) and otherwise unpacks ``cderi`` block by block. ``cderi`` None:
    ``square`` (float64) is the only tensor (:func:`_jk_from_square`).
    A tensor in memory runs in lanes (:func:`_lanes`: one worker per numpy BLAS thread, each
    its GEMMs on one BLAS thread) when :func:`_lane_workers` allows more than one within
    ``lane_budget`` bytes: what the caller's memory plan set aside for the build's work
    arrays (:meth:`DFJK.lane_budget`); None, K's unpacking arrays alone
    (:func:`dfmp2.blocking.jk_work_bytes`), the least any plan sets aside. Otherwise one pass.
    ``k_la``: the ops of K's products when they differ from
    ``la``'s (an NKI run's float32 K). ``counts``, when given, gets the floating-point
    operations the products need added to its ``'flops'``: ``4 naux c`` per density for J,
    with c the tensor's columns (n(n+1)/2 packed, the kept pairs when screened), and ``(2 R +
    sum_k r_k) naux n^2`` for K from the R columns of the joint factor matrix, r_k of them
    density k's (the symmetric ``Y^T Y`` counted once per element pair; ROHF's two densities
    share columns, so R < sum_k r_k there). ``head``: the tensor's first rows unpacked,
    (q, nao, nao) float64, read as a float64 ``square`` alone is (:func:`_jk_from_square`);
    ``cderi`` then holds the rows after them (its J and K added), and ``square`` must be
    None."""
    dms = np.asarray(dm)
    shape = dms.shape
    nao = shape[-1]
    dms = dms.reshape(-1, nao, nao)
    nset = dms.shape[0]
    if cderi is None and (square is None or square.dtype != np.float64):
        raise ValueError("get_jk needs the packed tensor or a float64 square one")
    if head is not None and (cderi is None or square is not None or head.dtype != np.float64
                             or head.shape[1:] != (nao, nao)):
        raise ValueError("get_jk: a head of unpacked rows goes with the tensor's other rows "
                         "and no square copy, (q, nao, nao) float64")
    naux = (square if cderi is None else cderi).shape[0]
    naux += 0 if head is None else head.shape[0]
    if pairs is not None and (pairs.nao != nao or (cderi is not None
                                                   and cderi.shape[1] != pairs.ncol)):
        raise ValueError(f"get_jk: pair columns of {pairs.nao} functions ({pairs.ncol} "
                         f"columns) for {nao} functions and a tensor of shape "
                         f"{None if cderi is None else cderi.shape}")
    width = nao * (nao + 1) // 2 if pairs is None else pairs.kept.size
    flops = 4 * naux * width * nset if with_j else 0
    coeff = parts = None
    k_la = la if k_la is None else k_la
    if with_k:
        coeff, parts = _k_factors(dm, dms)
        # Y = C^T B^Q for all densities at once (2 R n^2 per Q), then per density the symmetric
        # Y^T Y of its rows (r n^2: its upper triangle is the lower one; numpy's matmul runs
        # A^T A as a syrk): the flops K needs, whichever BLAS
        rank = sum(part.stop - part.start for density in parts for part, _ in density)
        flops += (2 * coeff.shape[1] + rank) * nao * nao * naux
    if counts is not None:
        counts["flops"] = counts.get("flops", 0) + flops
    dtype = {"fp64": np.float64, "fp32": np.float32}[k_precision]
    blocks = None
    if with_k and (cderi is None or isinstance(cderi, np.ndarray)):  # in memory: lanes?
        blocks = _SquareProducts(dms, coeff, parts, la, k_la, with_j, dtype)
        segments = _lane_segments(cderi, square, head, blocks.dtype)
        budget = jk_work_bytes(nao, UNPACK_BLOCK) if lane_budget is None else lane_budget
        workers = _lane_workers(blocks, naux, budget, any(not u for _, u, _ in segments))
        if workers > 1:
            vj, vk = _lanes(segments, pairs, blocks, dms, workers)
            return (vj.reshape(shape) if with_j else None), vk.reshape(shape)
    vj_head = vk_head = None
    if head is not None and head.shape[0]:
        vj_head, vk_head = _jk_from_square(head, dms, coeff, parts, la, k_la, with_j, dtype,
                                           blocks)
    if cderi is None:
        vj, vk = _jk_from_square(square, dms, coeff, parts, la, k_la, with_j, dtype, blocks)
        vj = vj.reshape(shape) if with_j else None
    else:
        if coeff is not None:
            coeff = coeff.astype(dtype, copy=False)
        vj_tril, vk = _jk_from_packed(cderi, dms, coeff, parts, la, k_la, with_j, square,
                                      read_block, pairs)
        vj = lib.unpack_tril(vj_tril, 1).reshape(shape) if with_j else None
    if vj_head is not None:
        vj += vj_head.reshape(shape)
    if vk_head is not None:
        vk += vk_head
    vk = vk.reshape(shape) if with_k else None
    return vj, vk


def _add_k(vk: np.ndarray, y: torch.Tensor, parts, nao: int, k_la) -> None:
    """``vk[k] += sign Y_c^T Y_c`` per density k and each of its parts (columns c, sign), from
    K's product ``y`` = C^T B^Q (R, q*nao): rows ((i, q), mu) of a part are contiguous."""
    for k, density in enumerate(parts):
        for columns, sign in density:
            if columns.stop > columns.start:
                y_rows = y[columns].reshape(-1, nao)
                vk[k] += sign * k_la.gemm(y_rows, y_rows, trans_a=True).numpy()


def _jk_from_packed(cderi, dms: np.ndarray, coeff, parts, la: Dispatcher, k_la, with_j: bool,
                    square, read_block: int, pairs: PairColumns | None):
    """(vj packed (nset, n(n+1)/2) or None, vk (nset, n, n) or None) from the packed or
    pair-screened tensor (:func:`get_jk`): per block of rows, J's two products on the rows and
    K's from the square copy or the rows unpacked."""
    nset, nao = dms.shape[0], dms.shape[-1]
    naux, width = cderi.shape
    if with_j:
        dm_tril = _packed_density(dms, pairs)
        vj_tril = np.zeros((nset, width))
    vk = None
    if coeff is not None:
        dtype = coeff.dtype
        vk = np.zeros((nset, nao, nao))
        coeff = torch.from_numpy(coeff)
    with PairUnpacker() as unpack:  # its threads start on first use: never with a square copy
        for q0, q1, rows in _row_blocks(cderi, read_block):
            if with_j:
                b = torch.from_numpy(rows)
                rho = la.gemm(b, dm_tril, trans_b=True)  # (q, nset)
                vj_tril += la.gemm(rho, b, trans_a=True).numpy()  # (nset, npair)
            if coeff is None or coeff.shape[1] == 0:  # no K, or no occupied orbitals: K is zero
                continue
            for cols in _k_blocks(rows, None if square is None else square[q0:q1], dtype,
                                  unpack, pairs):
                # (q, mu, nu) as (q*mu, nu): B^Q is symmetric, so C^T cols^T is Y (i, q*mu)
                _add_k(vk, k_la.gemm(coeff, cols, trans_a=True, trans_b=True), parts, nao, k_la)
    return (_packed_j(vj_tril, pairs) if with_j else None), vk


def _packed_density(dms: np.ndarray, pairs: PairColumns | None) -> torch.Tensor:
    """The densities (nset, n, n) as J's products on packed rows read them: (nset, n(n+1)/2)
    with the off-diagonal pairs counted twice, or with ``pairs`` on the pairs kept (nset,
    pairs.ncol)."""
    nao = dms.shape[-1]
    dm_tril = lib.pack_tril(dms + dms.transpose(0, 2, 1))
    idx = np.arange(nao)
    dm_tril[:, idx * (idx + 1) // 2 + idx] *= 0.5
    return torch.from_numpy(dm_tril if pairs is None else pairs.of_pairs(dm_tril))


def _packed_j(vj_rows: np.ndarray, pairs: PairColumns | None) -> np.ndarray:
    """J (nset, n(n+1)/2) packed from J on the tensor's columns: itself, or with ``pairs``
    (nset, pairs.ncol) taken to every pair (a pair not kept reads the zero column: its J is
    zero)."""
    return vj_rows if pairs is None else np.ascontiguousarray(vj_rows[:, pairs.column])


def _jk_from_square(square: np.ndarray, dms: np.ndarray, coeff, parts, la: Dispatcher, k_la,
                    with_j: bool, dtype=np.float64, blocks: _SquareProducts | None = None):
    """(vj (nset, n*n) or None, vk (nset, n, n) or None) from float64 rows held unpacked
    (naux, n, n): the square tensor alone, or the first rows (``head``), in one pass over
    blocks of :data:`K_SQUARE_BLOCK` auxiliary functions, with K's float64 factors ``coeff``
    (None: no K); ``blocks``: the call's products when :func:`get_jk` made them already.

    Per block (:class:`_SquareProducts`): K's product ``Y = C^T B^Q``; J's fitted density
    ``rho_Q = sum_{mu nu} B^Q_{mu nu} D_{mu nu}`` is ``sum_{i mu} Y_{i,Q mu} C_{mu i}`` summed
    with each part's sign, read from Y instead of a product of its own, when the factors
    reproduce the densities (``D = sum sign C C^T``: PySCF's tags name the orbitals K is built
    from, which J must not assume; else one product with the densities); then ``vj += rho^T B``
    and ``K += Y^T Y`` per density.
    ``dtype`` float32 (the early cycles of a mixed-precision SCF, with K's factors): each
    block is cast into a float32 array (one per call, or per lane, reused block after block)
    and J's and K's products all run in float32 on it with K's ops ``k_la`` (J then has K's
    float32 rounding, which those cycles tolerate; a call without K's factors, J alone or no
    occupied orbitals, stays float64 on ``la``); sums over blocks are float64. The lanes of
    :func:`_lanes` run the same blocks on worker threads."""
    naux, nao = square.shape[:2]
    nset = dms.shape[0]
    vj = np.zeros((nset, nao * nao)) if with_j else None
    vk = None if coeff is None else np.zeros((nset, nao, nao))
    if blocks is None:
        blocks = _SquareProducts(dms, coeff, parts, la, k_la, with_j, dtype)
    # Y (R, q*n) within what the planner counts for two densities' columns (R <= 2n)
    step = K_SQUARE_BLOCK if not blocks.products else max(
        1, min(K_SQUARE_BLOCK, 2 * nao * K_SQUARE_BLOCK // max(1, coeff.shape[1])))
    cast = (None if blocks.dtype == np.float64 else
            torch.empty((min(step, naux), nao, nao), dtype=torch.float32))
    for q0 in range(0, naux, step):
        rows = torch.from_numpy(square[q0:q0 + step])
        blocks.add(rows if cast is None else cast[:rows.shape[0]].copy_(rows), vj, vk)
    return vj, vk


class _SquareProducts:
    """J's and K's products of blocks of the unpacked tensor for one :func:`get_jk` call
    (:func:`_jk_from_square` says what they are): the call's constants, and :meth:`add`."""

    def __init__(self, dms: np.ndarray, coeff, parts, la: Dispatcher, k_la, with_j: bool,
                 dtype):
        self.nset, self.nao = dms.shape[0], dms.shape[-1]
        self.parts, self.with_j, self.la, self.k_la = parts, with_j, la, k_la
        self.products = coeff is not None and coeff.shape[1] > 0  # no occupied orbitals: K 0
        self.fused = with_j and self.products and _factors_reproduce(coeff, parts, dms)
        self.dtype = np.dtype(dtype) if self.products else np.dtype(np.float64)
        self.j_la = la if self.dtype == np.float64 else k_la  # float32 J where float32 K runs
        if with_j and not self.fused:
            self.dm_flat = torch.from_numpy(np.ascontiguousarray(
                dms.reshape(self.nset, self.nao * self.nao), self.dtype))
        self.rank = 0 if coeff is None else coeff.shape[1]
        if self.products:
            self.coeff_rows = np.ascontiguousarray(coeff.T, self.dtype)[:, :, None]  # (R,n,1)
            self.coeff = torch.from_numpy(np.ascontiguousarray(coeff, self.dtype))

    def add(self, block: torch.Tensor, vj, vk, with_j: bool = True) -> None:
        """Add the J (``vj``, (nset, n*n); unless ``with_j`` is false) and K (``vk``, (nset,
        n, n)) of ``block`` (q, n, n), in the call's precision."""
        q, nao = block.shape[0], self.nao
        flat = block.reshape(q, nao * nao)
        with_j = with_j and self.with_j
        if self.products:
            y = self.k_la.gemm(self.coeff, block.reshape(q * nao, nao), trans_a=True,
                               trans_b=True)
            if with_j and self.fused:
                per_column = np.matmul(y.numpy().reshape(-1, q, nao), self.coeff_rows)[:, :, 0]
                rho = np.zeros((self.nset, q), self.dtype)
                for k, density in enumerate(self.parts):
                    for columns, sign in density:
                        rho[k] += sign * per_column[columns].sum(axis=0)
                vj += self.j_la.gemm(torch.from_numpy(rho), flat).numpy()  # (nset, n*n)
            _add_k(vk, y, self.parts, nao, self.k_la)
        if with_j and not self.fused:
            rho = self.j_la.gemm(self.dm_flat, flat, trans_b=True)  # (nset, q)
            vj += self.j_la.gemm(rho, flat).numpy()  # (nset, n*n)

    def lane_bytes(self, unpacking: bool = False) -> int:
        """A lane worker's arrays (:func:`_lanes`), at most: its own J and K sums (float64,
        nset n^2 each); in the products' precision Y (R, q*n), J's product (nset, n^2), and K's
        product of one density (n, n) with its signed copy; a float32 block (q, n, n) when the
        products run in float32; with ``unpacking`` a float64 block (q, n, n) its rows are
        unpacked into and J's sum on the packed rows (nset, at most n(n+1)/2). Small ones (J's
        density, (nset, q)) aside."""
        n, q, size = self.nao, LANE_BLOCK, self.dtype.itemsize
        products = size * (self.rank * q * n + (self.nset + 2) * n * n)
        cast = size * q * n * n if self.dtype == np.float32 else 0
        unpacked = 8 * (q * n * n + self.nset * n * (n + 1) // 2) if unpacking else 0
        return 8 * 2 * self.nset * n * n + products + cast + unpacked


def _lane_workers(blocks: _SquareProducts, naux: int, budget: int,
                  unpacking: bool = False) -> int:
    """Worker threads of :func:`_lanes` for one call: numpy's BLAS threads (the run's count)
    when both J's and K's products run on numpy's BLAS on the host (the pytorch backend's CPU
    products with ``--cpu-blas`` numpy; NKI's and torch's products run as they are) and the
    build has :data:`LANE_MIN_FLOPS` of work, no more than the call has blocks of
    :data:`LANE_BLOCK`, and no more than ``budget`` bytes (what the planner sets aside for the
    build's work arrays, :func:`dfmp2.blocking.jk_lane_budget`) hold lanes' arrays of
    (``unpacking``: with a block to unpack rows into); 1 (no lanes) otherwise."""
    la = blocks.k_la
    if not (blocks.products and blocks.la is la and isinstance(la, Dispatcher)
            and la.backend == "pytorch" and la.host_backend["gemm"] == "numpy") \
            or 3 * blocks.rank * blocks.nao ** 2 * naux < LANE_MIN_FLOPS:
        return 1
    return max(1, min(numpy_blas_threads(), -(-naux // LANE_BLOCK),
                      budget // max(1, blocks.lane_bytes(unpacking))))


def _lane_segments(cderi, square, head, dtype) -> list[tuple[np.ndarray, bool, object]]:
    """The in-memory tensor's rows in order for :func:`_lanes`, as ``[(rows, unpacked,
    packed), ...]``: K reads ``rows``, held unpacked or (``unpacked`` false) on their AO pairs
    or packed; ``packed`` is the same rows packed or on their pairs (J's in float32 cycles) or
    None. ``square`` alone, read (or cast to float32); ``square`` as a copy of ``cderi`` in
    ``dtype`` or in float64, with ``cderi``; else ``head`` (its first rows unpacked, float64)
    when there is one, then ``cderi``'s rows."""
    if cderi is None:
        return [(square, True, None)]
    if square is not None and square.dtype in (dtype, np.float64):
        return [(square, True, cderi)]
    segments = [(head, True, None)] if head is not None and head.shape[0] else []
    return segments + [(cderi, False, cderi)]


def _lanes(segments, pairs: PairColumns | None, blocks: _SquareProducts, dms: np.ndarray,
           workers: int) -> tuple[np.ndarray | None, np.ndarray]:
    """(vj (nset, n*n) or None, vk (nset, n, n)) of the densities ``dms`` from the tensor's
    rows ``segments`` (:func:`_lane_segments`) on ``workers`` threads: the rows in blocks of
    :data:`LANE_BLOCK` (none across two segments), the blocks in ``workers`` contiguous lanes,
    each lane's blocks in order on one thread with numpy's BLAS on one thread, summed into the
    lane's own J and K, the lanes' sums then added in their order: the same bits for a given
    worker count, run after run (another count sums in another order).
    Each block goes to :meth:`_SquareProducts.add`, unpacked first by the lane's thread when
    it is on its AO pairs (with ``pairs``, else packed), cast to float32 into the lane's own
    array for float32 products. J is the one pass's (:func:`_jk_from_square`,
    :func:`_jk_from_packed`): with float32 products, J of the rows that are not held unpacked
    only comes from their packed rows in float64, else from K's products. A lane that fails
    (out of memory, a BLAS error, an interrupt) stops the others before their next block, and
    its error is raised."""
    nset, nao = dms.shape[0], blocks.nao
    tasks = [(rows, unpacked, packed, q0, min(q0 + LANE_BLOCK, rows.shape[0]))
             for rows, unpacked, packed in segments
             for q0 in range(0, rows.shape[0], LANE_BLOCK)]
    edges = [k * len(tasks) // workers for k in range(workers + 1)]
    packed_j = [packed for _, _, packed in segments if packed is not None] \
        if blocks.with_j and blocks.dtype != np.float64 else []
    dm_rows = _packed_density(dms, pairs) if packed_j else None
    failed = threading.Event()  # set by a lane that raised: the others stop

    def lane(k: int):
        try:
            return lane_sums(k)
        except BaseException:
            failed.set()
            raise

    def lane_sums(k: int):
        vj = np.zeros((nset, nao * nao)) if blocks.with_j else None
        vk = np.zeros((nset, nao, nao))
        vj_rows = np.zeros((nset, packed_j[0].shape[1])) if packed_j else None
        cast = (None if blocks.dtype == np.float64 else
                np.empty((LANE_BLOCK, nao, nao), np.float32))
        into = None  # the float64 block packed rows are unpacked into
        with PairUnpacker(1) as unpack:  # in this thread
            for rows, unpacked, packed, q0, q1 in tasks[edges[k]:edges[k + 1]]:
                if failed.is_set():
                    return None
                j_apart = packed_j and packed is not None
                if j_apart:  # float64, on the packed rows
                    b = torch.from_numpy(packed[q0:q1])
                    rho = blocks.la.gemm(b, dm_rows, trans_b=True)  # (q, nset)
                    vj_rows += blocks.la.gemm(rho, b, trans_a=True).numpy()
                if unpacked:
                    block = rows[q0:q1]
                else:
                    if into is None:
                        into = np.empty((LANE_BLOCK, nao, nao))
                    block = unpack(rows[q0:q1], into, pairs)
                if cast is not None and block.dtype != np.float32:
                    np.copyto(cast[:len(block)], block)
                    block = cast[:len(block)]
                blocks.add(torch.from_numpy(block), vj, vk, with_j=not j_apart)
        return vj, vk, vj_rows

    with single_threaded_numpy_blas(), ThreadPoolExecutor(workers) as pool:
        try:
            sums = list(pool.map(lane, range(workers)))  # raises once every lane has stopped
        except BaseException:  # an interrupt of this thread too: the lanes stop
            failed.set()
            raise
    vj, vk, vj_rows = sums[0]
    for lane_j, lane_k, lane_rows in sums[1:]:  # in the lanes' order
        vk += lane_k
        if vj is not None:
            vj += lane_j
        if vj_rows is not None:
            vj_rows += lane_rows
    if vj_rows is not None:
        vj += lib.unpack_tril(_packed_j(vj_rows, pairs), 1).reshape(nset, nao * nao)
    return vj, vk


#: Largest |D - sum sign C C^T| (relative to the scale of :func:`_factors_reproduce`) for
#: which J takes its fitted density from K's product (:func:`_jk_from_square`).
_FACTORS_REPRODUCE = 1e-12


def _factors_reproduce(coeff: np.ndarray, parts, dms: np.ndarray) -> bool:
    """Whether ``dms[k] = sum sign coeff[:, c] coeff[:, c]^T`` over density k's parts, to
    :data:`_FACTORS_REPRODUCE` relative to the larger of 1, max |D| and max (|C| |C|^T) (the
    size of the products' rounding): true for orbitals PySCF tagged its own densities with and
    for eigenvectors; false for a tag that names other orbitals than the density's, or NaN."""
    for dm, density in zip(dms, parts):
        made, size = np.zeros_like(dm), np.zeros_like(dm)
        for columns, sign in density:
            made += sign * (coeff[:, columns] @ coeff[:, columns].T)
            size += np.abs(coeff[:, columns]) @ np.abs(coeff[:, columns]).T
        scale = max(1.0, float(np.abs(dm).max(initial=0.0)), float(size.max(initial=0.0)))
        if not np.abs(made - dm).max(initial=0.0) <= _FACTORS_REPRODUCE * scale:
            return False
    return True


def plan_tensor(mol, auxmol, max_memory: float, force_outcore: bool = False) -> JKPlan:
    """Where :class:`DFJK` keeps ``mol``'s tensor fitted in ``auxmol`` under ``max_memory`` MB
    (:func:`dfmp2.blocking.plan_jk`; raises :class:`ResourceError` when even its smallest
    blocks do not fit), computed before any integral."""
    return plan_jk(mol.nao_nr(), auxmol.nao_nr(), max_memory,
                   max(p1 - p0 for *_, p0, p1 in shell_row_pairs(mol)), UNPACK_BLOCK,
                   force_outcore)


class DFJK(pyscf_df.DF):
    """A ``pyscf.df.DF`` whose integrals and J/K are dfmp2's (see the module docstring).

    Assign it to a density-fitted SCF object (``mf = scf.RHF(mol).density_fit(); mf.with_df =
    DFJK(mol, auxbasis, la)``); PySCF's driver then calls :meth:`get_jk` every iteration.
    ``la`` is the run's :class:`Dispatcher`: on the nki backend the fit, J and float64 K run on
    the host (the SCF's last iterations need float64) and float32 K on NKI's gemm, recorded per
    op.

    ``k_precision`` is the precision of K's products for the next calls (and of J's in calls
    that build K too, when the tensor is held unpacked only): 'fp32' for the early iterations
    of an SCF, until its driver calls :meth:`use_fp64` (:func:`dfmp2.scf.run_scf` does so
    once the orbital gradient is small, and accepts convergence only on float64 K).
    ``plan`` (:func:`dfmp2.blocking.plan_jk`, made by :meth:`build` under ``max_memory``) puts
    the tensor in memory or in a temporary file in ``scratch_dir`` (``file``, a
    :class:`MatrixFile` read block by block each iteration and closed by :meth:`reset`). In
    memory, with ``layout`` 'auto', the tensor is built in place by
    :func:`dfmp2.scf_integrals.split_cderi` with as many rows unpacked as fit
    (:func:`dfmp2.blocking.jk_square_rows`): all of them, the tensor held unpacked only
    (``square``, (naux, n, n) float64); some, ``head`` (q, n, n) and the others on the AO pairs
    that are not zero (``columns``, (naux - q, pairs.ncol), with ``pairs`` the
    :class:`dfmp2.df.PairColumns`); or none (``columns``, every row). With ``layout``
    'packed' it is PySCF's packed ``_cderi``. ``_cderi`` is None in the other
    layouts (:meth:`loop` gives PySCF's code packed blocks of any). Next to ``columns`` or
    ``_cderi``, ``square`` is the tensor unpacked in K's precision, kept while it fits in
    ``max_memory`` (:func:`dfmp2.blocking.jk_square_fits`; K otherwise unpacks it every
    iteration). ``k_calls`` counts K builds per precision; ``stats`` the J/K calls, their
    seconds and their products' flops.
    """

    _keys = {"la", "square", "k_precision", "k_calls", "stats", "plan", "file", "scratch_dir",
             "force_outcore", "layout", "columns", "pairs", "head"}

    def __init__(self, mol, auxbasis, la: Dispatcher, k_precision: str = "fp64",
                 scratch_dir: str | None = None, force_outcore: bool = False,
                 layout: str = "auto"):
        if k_precision not in K_PRECISIONS:
            raise InputError(f"DFJK: k_precision {k_precision!r}; choose one of "
                             f"{', '.join(K_PRECISIONS)}")
        if layout not in JK_LAYOUTS:
            raise InputError(f"DFJK: layout {layout!r}; choose one of {', '.join(JK_LAYOUTS)}")
        super().__init__(mol, auxbasis)
        self.layout = layout
        self.la = la
        self.square = None
        self.columns = None
        self.head = None
        self.pairs = None
        self.k_precision = k_precision
        self.k_calls = {"fp32": 0, "fp64": 0}
        self.stats = {"calls": 0, "seconds": 0.0, "flops": 0}
        self.plan = None
        self.file = None
        self.scratch_dir = scratch_dir
        self.force_outcore = force_outcore

    def _ops(self, k_precision: str = "fp64"):
        """The ops of the fit, J and float64 K: on the host on the nki backend (NKI computes
        in float32); with ``k_precision`` 'fp32', the run's own backend (float32 K)."""
        if self.la.backend == "nki" and k_precision == "fp64":
            return self.la.on_host("DF-SCF fit, J and float64 K on the host: the SCF's last "
                                   "iterations need float64")
        return self.la

    def _keep_square(self) -> None:
        """``square`` in K's precision when it fits next to the packed tensor in memory, else
        None."""
        self.square = None  # released before its successor is made
        tensor = self.tensor
        if not isinstance(tensor, np.ndarray) or self.head is not None:
            return
        dtype = np.dtype({"fp32": np.float32, "fp64": np.float64}[self.k_precision])
        if jk_square_fits(self.mol.nao_nr(), tensor.shape[0], dtype.itemsize,
                          self.max_memory, UNPACK_BLOCK):
            self.square = square_copy(tensor, dtype, self.pairs)

    def lane_budget(self) -> int:
        """Bytes the memory plan of the built tensor in memory sets aside for one J/K build's
        work arrays, which the lanes of :func:`get_jk` may fill
        (:func:`dfmp2.blocking.jk_lane_budget` for this layout)."""
        packed = self.tensor is not None
        return jk_lane_budget(self.mol.nao_nr(), self.get_naoaux(), K_SQUARE_BLOCK,
                              UNPACK_BLOCK, unpacked=self.square_only or self.head is not None,
                              packed=packed, copy=packed and self.square is not None)

    @property
    def square_only(self) -> bool:
        """Whether the tensor is held unpacked only (``square``, float64; no other)."""
        return self.tensor is None and self.square is not None

    def build(self):
        if self.tensor is not None or self.square_only:
            return self
        self.auxmol = make_auxmol(self.mol, self.auxbasis, jk=True)
        nao, naux = self.mol.nao_nr(), self.auxmol.nao_nr()
        self.plan = plan_tensor(self.mol, self.auxmol, self.max_memory, self.force_outcore)
        if self.plan.outcore:
            self.file, self.pairs = fitted_cderi_file(self.mol, self.auxmol, self._ops(),
                                                      self.plan, self.scratch_dir)
        elif self.layout == "packed":
            self._cderi = fitted_cderi(self.mol, self.auxmol, self._ops())
            self._keep_square()
        else:
            def rows(pairs, naux_fit):  # as many rows unpacked as fit beside the others
                return jk_square_rows(nao, naux_fit, pairs.ncol, self.max_memory,
                                      K_SQUARE_BLOCK, UNPACK_BLOCK, metric_naux=naux)

            head, tail, self.pairs = split_cderi(self.mol, self.auxmol, self._ops(), rows)
            if not tail.shape[0]:  # every row unpacked: the tensor is held unpacked only
                self.square = head
            elif head.shape[0]:
                self.head, self.columns = head, tail
            else:
                self.columns = tail
                self._keep_square()
        log.info("DF-SCF integrals: naux %d (fit %d), %d AO pairs, %s", naux,
                 self.get_naoaux(), nao * (nao + 1) // 2, self.describe())
        return self

    def describe(self) -> str:
        """Where the built tensor is, in words (the log and the run's record)."""
        if self.file is not None:
            return (f"{self.file.shape[0] * self.file.shape[1] * 8 / 2**20:.0f} MB on disk, "
                    f"{self.pairs.describe()}")
        if self.square_only:
            return f"{self.square.nbytes / 2**20:.0f} MB unpacked (float64) in memory"
        if self.head is not None:
            return (f"{self.head.nbytes / 2**20:.0f} MB unpacked (float64, the first "
                    f"{self.head.shape[0]} of {self.get_naoaux()} auxiliary functions) + "
                    f"{self.columns.nbytes / 2**20:.0f} MB on {self.pairs.describe()} in "
                    "memory")
        if self.columns is not None:
            return (f"{self.columns.nbytes / 2**20:.0f} MB in memory, {self.pairs.describe()}"
                    + ("" if self.square is None else
                       f" + {self.square.nbytes / 2**20:.0f} MB unpacked ({self.square.dtype})"))
        return (f"{self._cderi.nbytes / 2**20:.0f} MB packed in memory"
                + ("" if self.square is None else
                   f" + {self.square.nbytes / 2**20:.0f} MB unpacked ({self.square.dtype})"))

    @property
    def tensor(self):
        """The fitted tensor that is not unpacked: the :class:`MatrixFile`, the pair-screened
        ``columns`` (the rows after ``head`` where some are unpacked) or PySCF's packed
        ``_cderi`` (None before :meth:`build`, and when the tensor is held unpacked only)."""
        if self.file is not None:
            return self.file
        return self.columns if self.columns is not None else self._cderi

    def get_naoaux(self):
        if self.tensor is None and not self.square_only:
            self.build()
        if self.square_only:
            return self.square.shape[0]
        if self.tensor is not None:
            return self.tensor.shape[0] + (0 if self.head is None else self.head.shape[0])
        return super().get_naoaux()

    def loop(self, blksize=None):
        """PySCF's ``DF.loop``: blocks (q, nao(nao+1)/2) of the fitted tensor in PySCF's packed
        layout: from the file when it is on disk, packed from the square tensor when it is held
        unpacked only (and from its unpacked first rows, ``head``), expanded from the
        pair-screened rows otherwise."""
        if self.tensor is None and not self.square_only:
            self.build()
        unpacked = self.square if self.square_only else self.head
        if unpacked is not None:
            step = blksize or JK_AUX_BLOCK
            for q0 in range(0, unpacked.shape[0], step):
                yield lib.pack_tril(unpacked[q0:q0 + step])
            if self.square_only:
                return
        if self.columns is not None:
            step = blksize or JK_AUX_BLOCK
            for q0 in range(0, self.columns.shape[0], step):
                yield self.pairs.expand(self.columns[q0:q0 + step])
            return
        if self.file is None:
            yield from super().loop(blksize)
            return
        for _, _, rows in _row_blocks(self.file, blksize or self.plan.read_block):
            yield self.pairs.expand(rows)

    def use_fp64(self) -> None:
        """K in float64 from now on (with a float64 square copy when it fits)."""
        if self.k_precision != "fp64":
            self.k_precision = "fp64"
            if not self.square_only and self.head is None:
                self._keep_square()

    def reset(self, mol=None):
        """Release the tensors: the square copy, the array, the file, and those of the copies
        PySCF made for range-separated integrals (its own reset only forgets them)."""
        self.square = self.columns = self.pairs = self.head = None
        if self.file is not None:
            self.file.close()
            self.file = None
        for rsh in getattr(self, "_rsh_df", {}).values():
            rsh.reset()
        return super().reset(mol)

    def copy(self):
        """A copy that shares no tensor: it builds its own when asked (PySCF copies a DF object
        for range-separated integrals and resets the copy, which would release this one's)."""
        new = super().copy()
        new._cderi, new.file, new.square, new.plan = None, None, None, None
        new.columns, new.pairs, new.head = None, None, None
        # PySCF reads a range-separated copy through loop(): its packed layout, as before;
        # and the copy's reset must not reach this object's range-separated copies
        new.layout, new._rsh_df = "packed", {}
        new.k_calls, new.stats = dict(self.k_calls), dict(self.stats)
        return new

    def get_jk(self, dm, hermi=1, with_j=True, with_k=True, direct_scf_tol=None, omega=None):
        if omega is not None:  # range-separated: PySCF's copy of this object, its own tensor
            return super().get_jk(dm, hermi, with_j, with_k, omega=omega)
        if self.tensor is None and not self.square_only:
            self.build()
        if hermi != 1 and self._cderi is None and not np.iscomplexobj(dm):
            # PySCF's general code: K from loop(); its J without K would not read the tensor
            # (with _cderi None it recomputes the integrals), and J needs only the symmetric
            # part of the density (B^Q is symmetric)
            vj = vk = None
            if with_j:
                dms = np.asarray(dm)
                vj = get_jk(self.tensor, (dms + dms.swapaxes(-1, -2)) / 2, self._ops(),
                            with_k=False, square=self.square, read_block=self.plan.read_block,
                            pairs=self.pairs, head=self.head)[0]
            if with_k:
                vk = super().get_jk(dm, hermi, False, True)[1]
            return vj, vk
        if hermi != 1:  # non-symmetric densities: PySCF's general code reads loop()
            return super().get_jk(dm, hermi, with_j, with_k)
        if with_k:
            self.k_calls[self.k_precision] += 1
        start = time.perf_counter()
        in_memory = self.file is None
        result = get_jk(self.tensor, dm, self._ops(), with_j, with_k, self.k_precision,
                        self.square, k_la=self._ops(self.k_precision), counts=self.stats,
                        read_block=self.plan.read_block, pairs=self.pairs, head=self.head,
                        lane_budget=self.lane_budget() if in_memory else None)
        self.stats["calls"] += 1
        self.stats["seconds"] += time.perf_counter() - start
        return result
