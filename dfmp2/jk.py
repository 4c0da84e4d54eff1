"""DF-J/K for PySCF's SCF drivers on dfmp2's own integrals, fit and linalg ops.

PySCF keeps its drivers (DIIS, guess, level shift, convergence checks); a density-fitted SCF
object asks its ``with_df`` for J and K once per iteration. :class:`DFJK` is such a ``with_df``:
a ``pyscf.df.DF`` whose three-index tensor is built once from :mod:`dfmp2.df`'s pieces
(:func:`fitted_cderi`: the metric factored as in the MP2 step, int3c2e streamed, the fit through
the registry's ``trmm``/``gemm``; :func:`fitted_cderi_file` when it does not fit in memory) and
whose J and K are registry ``gemm`` calls:

    B^Q_{mu nu} = sum_P [L^{-1}]_QP (P|mu nu)          J = L L^T the Coulomb metric
    J_{mu nu}  = sum_Q B^Q_{mu nu} rho_Q,  rho_Q = sum_{lam sig} B^Q_{lam sig} D_{lam sig}
    K          = sum_Q (B^Q C)(B^Q C)^T  with D = C C^T (C = C_occ sqrt(n_occ), or from eigh
                                          of D with the negative part subtracted)

In memory B is PySCF's ``_cderi`` (naux_fit, nao(nao+1)/2), so PySCF's own tools that read a DF
object (``loop``, ``get_naoaux``, ``ao2mo``) keep working; on disk ``loop`` reads the file.
Indices: mu, nu, lam, sig atomic orbitals; P, Q auxiliary functions; i occupied orbitals.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time

import numpy as np
import torch
from pyscf import df as pyscf_df
from pyscf import lib

from .blocking import JKPlan, jk_square_fits, plan_jk
from .buffers import empty, zeros
from .df import (
    MetricFactor,
    PairUnpacker,
    factor_metric,
    fit_matrix,
    iter_int3c2e,
    iter_int3c2e_pairs,
    metric,
    shell_row_pairs,
)
from .errors import InputError, ResourceError
from .integrals import make_auxmol
from .linalg import Dispatcher
from .storage import MatrixFile

log = logging.getLogger(__name__)

__all__ = [
    "DFJK",
    "JK_AUX_BLOCK",
    "K_PRECISIONS",
    "K_SQUARE_BLOCK",
    "UNPACK_BLOCK",
    "fitted_cderi",
    "fitted_cderi_file",
    "get_jk",
    "square_copy",
]


#: Precisions of K's products: float64, or float32 for the early iterations of an SCF (only
#: :func:`dfmp2.scf.run_scf` installs the convergence test that keeps float32 cycles from
#: converging; an SCF object whose K is still float32 is refused by the MP2 step).
K_PRECISIONS = ("fp64", "fp32")
#: Auxiliary functions per block of the DF-SCF build's int3c2e.
JK_AUX_BLOCK = 128
#: Auxiliary functions per block of K's products from the square copy: one ``Y = C^T B^Q``
#: product for all densities, then ``Y^T Y`` per density. Measured on the Intel Xeon (family 6,
#: model 167), (H2O)16 cc-pVDZ: a UHF build 1.29-1.34 s at 64 against 1.34-1.45 s at 128, an
#: RHF build 0.69-0.73 s at either.
K_SQUARE_BLOCK = 64
#: Auxiliary functions unpacked at a time from the packed tensor for K, by one thread per CPU
#: (:class:`dfmp2.df.PairUnpacker`), into arrays reused block after block. Measured on the
#: Intel Xeon (family 6, model 167), per J/K build from the packed tensor: C20H42 cc-pVDZ
#: 1.77-1.84 s at 16 against 1.84-1.94 s at 8 and 1.86-1.99 s at 32; (H2O)16 0.89-0.94 s at 16
#: against 1.0 s at 8. (8 in one thread was fastest for (H2O)16 on AMD EPYC Zen 4.)
UNPACK_BLOCK = 16
#: |eigenvalue| of a density matrix below this (relative to the largest) is dropped when K is
#: built from eigenvectors (an untagged density, e.g. PySCF's initial guess).
_DM_EIG_CUTOFF = 1e-14


def fitted_cderi(mol, auxmol, la: Dispatcher) -> np.ndarray:
    """``B`` (naux_fit, nao(nao+1)/2) float64: the fitted three-index integrals of a DF-SCF, in
    PySCF's packed ``_cderi`` layout, in memory (:func:`dfmp2.blocking.plan_jk` decided it
    fits). The metric is factored as in the MP2 step: after a Cholesky factorisation one trmm
    on the whole tensor; with ``J^{-1/2}`` (eigenvalues dropped) by AO pair blocks, so that one
    tensor is in memory."""
    nao = mol.nao_nr()
    npair = nao * (nao + 1) // 2
    factor = factor_metric(torch.from_numpy(metric(auxmol)), la)
    if factor.lower is None:
        fitted = zeros((factor.naux_fit, npair))
        for p0, p1, block in _fitted_pair_blocks(mol, auxmol, factor, la, max(1, npair // 16)):
            fitted[:, p0:p1] = block
        return fitted
    j3c = zeros((auxmol.nao_nr(), npair))  # pages touched up front: see dfmp2.buffers
    for p0, p1, packed in iter_int3c2e(mol, auxmol, JK_AUX_BLOCK):
        j3c[p0:p1] = packed
    # B^T = (P|mu nu)^T L^{-T}: one trmm on the (pairs, naux) view, in place
    la.trmm(fit_matrix(factor, la), torch.from_numpy(j3c).T)
    return j3c


def fitted_cderi_file(mol, auxmol, la: Dispatcher, plan: JKPlan,
                      directory: str | None = None) -> MatrixFile:
    """The fitted tensor of :func:`fitted_cderi` in a temporary file (:class:`MatrixFile`, rows
    the fitted auxiliary functions), for a tensor that does not fit in memory: fitted by blocks
    of ``plan.fit_pairs`` AO pairs (:func:`_fitted_pair_blocks`), written as columns. The file
    is closed when building fails (it is unlinked from the start: see :class:`MatrixFile`)."""
    directory = directory or tempfile.gettempdir()
    free = shutil.disk_usage(directory).free
    if plan.tensor_bytes > free:
        raise ResourceError(
            f"the DF-SCF's fitted integrals need {plan.tensor_bytes / 2**20:.0f} MB on disk and "
            f"{directory!r} has {free / 2**20:.0f} MB free; free space, choose another "
            "--scratch-dir or raise --max-memory")
    factor = factor_metric(torch.from_numpy(metric(auxmol)), la)
    nao = mol.nao_nr()
    store = MatrixFile(factor.naux_fit, nao * (nao + 1) // 2, directory)
    try:
        for p0, _p1, block in _fitted_pair_blocks(mol, auxmol, factor, la, plan.fit_pairs):
            store.write_columns(p0, block)
    except BaseException:
        store.close()
        raise
    return store


def _fitted_pair_blocks(mol, auxmol, factor: MetricFactor, la: Dispatcher, max_pairs: int):
    """Yield ``(p0, p1, block)``: the fitted tensor's columns p0:p1, (naux_fit, p1 - p0), for
    ranges of whole AO shell rows (:func:`dfmp2.df.iter_int3c2e_pairs`): int3c2e for every
    auxiliary function of those pairs, then ``L^{-T}`` by one in-place trmm on the (pairs,
    naux) view, or ``J^{-1/2}`` by one gemm. A block is valid until the next one."""
    upper = fit_matrix(factor, la) if factor.lower is not None else None
    for p0, p1, block in iter_int3c2e_pairs(mol, auxmol, max_pairs):
        if upper is None:  # J^{-1/2} restricted to the kept eigenvectors: B = V^T (P|..)
            yield p0, p1, la.gemm(factor.inv_sqrt, torch.from_numpy(block),
                                  trans_a=True).numpy()
        else:
            la.trmm(upper, torch.from_numpy(block).T)
            yield p0, p1, block


def _row_blocks(cderi, read_block: int):
    """``(q0, q1, rows)`` over the fitted tensor: the whole array once when it is in memory,
    else blocks of ``read_block`` auxiliary functions read from its :class:`MatrixFile` into one
    reused array."""
    if isinstance(cderi, np.ndarray):
        yield 0, cderi.shape[0], cderi
        return
    naux, npair = cderi.shape
    rows = np.empty((min(read_block, naux), npair))
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


def _k_factors(dm, dms: np.ndarray, dtype) -> tuple[np.ndarray, list[list[tuple[slice, float]]]]:
    """``(coeff, parts)``: the factors of every density of ``dms`` (nset, nao, nao) as columns
    of one (nao, R) matrix in ``dtype``, so that one product ``Y = coeff^T B^Q`` per block of
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
    return np.ascontiguousarray(coeff, dtype=dtype), parts


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


def _k_blocks(cderi: np.ndarray, square: np.ndarray | None, dtype, unpack: PairUnpacker):
    """Yield ``(q*nao, nao)`` row blocks of the unpacked tensor for K in ``dtype``: slices of
    ``square`` ((naux, nao, nao), kept by :class:`DFJK` when memory allows) when it has that
    dtype, else blocks of :data:`UNPACK_BLOCK` auxiliary functions unpacked from ``cderi`` by
    ``unpack`` (and cast) into reused arrays. A block is valid until the next one is
    requested."""
    naux, npair = cderi.shape
    nao = _nao_of_pairs(npair)
    if square is not None and square.dtype == dtype:
        for q0 in range(0, naux, K_SQUARE_BLOCK):
            yield torch.from_numpy(square[q0:q0 + K_SQUARE_BLOCK].reshape(-1, nao))
        return
    unpacked = np.empty((UNPACK_BLOCK, nao, nao))
    cast = np.empty((UNPACK_BLOCK, nao, nao), dtype) if dtype != np.float64 else None
    for q0 in range(0, naux, UNPACK_BLOCK):
        q1 = min(q0 + UNPACK_BLOCK, naux)
        block = unpack(cderi[q0:q1], unpacked)
        if cast is not None:
            block = cast[: q1 - q0]
            block[...] = unpacked[: q1 - q0]
        yield torch.from_numpy(block.reshape(-1, nao))


def _nao_of_pairs(npair: int) -> int:
    """n from the packed pair count n(n+1)/2."""
    return int(round((np.sqrt(8 * npair + 1) - 1) / 2))


def square_copy(cderi: np.ndarray, dtype) -> np.ndarray:
    """``cderi`` (naux, nao(nao+1)/2) unpacked into a new (naux, nao, nao) array of ``dtype``.
    In float64 the unpacking threads write straight into it, touching its small pages for the
    first time (one pass: (H2O)16 cc-pVDZ's 2 GB in 0.53-0.58 s against 0.81-1.06 s for zeroing
    it and copying unpacked blocks in, on the Intel Xeon of :data:`UNPACK_BLOCK`, pages already
    mapped by the machine); in float32 it is zeroed by threads first (see
    :mod:`dfmp2.buffers`) and blocks are cast into it."""
    naux, npair = cderi.shape
    nao = _nao_of_pairs(npair)
    with PairUnpacker() as unpack:
        if np.dtype(dtype) == np.float64:
            square = empty((naux, nao, nao), dtype)
            for q0 in range(0, naux, UNPACK_BLOCK):
                unpack(cderi[q0:q0 + UNPACK_BLOCK], square[q0:q0 + UNPACK_BLOCK])
            return square
        square = zeros((naux, nao, nao), dtype)
        for q0, cols in zip(range(0, naux, UNPACK_BLOCK), _k_blocks(cderi, None, dtype, unpack)):
            square[q0:q0 + UNPACK_BLOCK] = cols.numpy().reshape(-1, nao, nao)
    return square


def get_jk(cderi, dm, la: Dispatcher, with_j: bool = True, with_k: bool = True,
           k_precision: str = "fp64", square: np.ndarray | None = None, k_la=None,
           counts: dict | None = None, read_block: int = JK_AUX_BLOCK):
    """(vj, vk) of densities ``dm`` ((nao, nao) or (nset, nao, nao), symmetric) from the fitted
    tensor ``cderi`` (naux, nao(nao+1)/2) float64, an array or a :class:`MatrixFile` read
    ``read_block`` auxiliary functions at a time; either result is None when not asked for.
    Every product is ``la.gemm``. J is float64. K uses ``Y = C^T B^Q`` (B^Q symmetric; one
    product for all densities, :func:`_k_factors`) and per density ``K += Y^T Y`` of its rows,
    per block of auxiliary functions, accumulated in float64; with
    ``k_precision`` 'fp32' the products run in float32 (for the early iterations of an SCF).
    ``square``: the tensor unpacked, (naux, nao, nao), in float32 or float64, when memory
    allowed keeping it; K reads it when it has K's precision and otherwise unpacks ``cderi``
    block by block. ``k_la``: the ops of K's products when they differ from ``la``'s (an NKI
    run's float32 K). ``counts``, when given, gets the floating-point operations the products
    need added to its ``'flops'``: ``4 naux n(n+1)/2`` per density for J and
    ``(2 R + sum_k r_k) naux n^2`` for K from the R columns of the joint factor matrix, r_k of
    them density k's (the symmetric ``Y^T Y`` counted once per element pair; ROHF's two
    densities share columns, so R < sum_k r_k there)."""
    dms = np.asarray(dm)
    shape = dms.shape
    nao = shape[-1]
    dms = dms.reshape(-1, nao, nao)
    nset = dms.shape[0]
    naux, npair = cderi.shape
    flops = 0
    if with_j:
        dm_tril = lib.pack_tril(dms + dms.transpose(0, 2, 1))
        idx = np.arange(nao)
        dm_tril[:, idx * (idx + 1) // 2 + idx] *= 0.5
        dm_tril = torch.from_numpy(dm_tril)
        vj_tril = np.zeros((nset, npair))
        flops += 4 * naux * npair * nset
    if with_k:
        dtype = {"fp64": np.float64, "fp32": np.float32}[k_precision]
        coeff, parts = _k_factors(dm, dms, dtype)
        coeff = torch.from_numpy(coeff)
        # Y = C^T B^Q for all densities at once (2 R n^2 per Q), then per density the symmetric
        # Y^T Y of its rows (r n^2: its upper triangle is the lower one; numpy's matmul runs
        # A^T A as a syrk): the flops K needs, whichever BLAS
        rank = sum(part.stop - part.start for density in parts for part, _ in density)
        flops += (2 * coeff.shape[1] + rank) * nao * nao * naux
        vk = np.zeros((nset, nao, nao))
        k_la = la if k_la is None else k_la
    with PairUnpacker() as unpack:  # its threads start on first use: never with a square copy
        for q0, q1, rows in _row_blocks(cderi, read_block):
            if with_j:
                b = torch.from_numpy(rows)
                rho = la.gemm(b, dm_tril, trans_b=True)  # (q, nset)
                vj_tril += la.gemm(rho, b, trans_a=True).numpy()  # (nset, npair)
            if not with_k or coeff.shape[1] == 0:  # no K, or no occupied orbitals: K is zero
                continue
            for cols in _k_blocks(rows, None if square is None else square[q0:q1], dtype,
                                  unpack):
                # (q, mu, nu) as (q*mu, nu): B^Q is symmetric, so C^T cols^T is Y (i, q*mu)
                y = k_la.gemm(coeff, cols, trans_a=True, trans_b=True)
                for k, density in enumerate(parts):
                    for columns, sign in density:
                        if columns.stop > columns.start:
                            y_rows = y[columns].reshape(-1, nao)  # ((i, q), mu), contiguous
                            vk[k] += sign * k_la.gemm(y_rows, y_rows, trans_a=True).numpy()
    vj = lib.unpack_tril(vj_tril, 1).reshape(shape) if with_j else None
    vk = vk.reshape(shape) if with_k else None
    if counts is not None:
        counts["flops"] = counts.get("flops", 0) + flops
    return vj, vk


class DFJK(pyscf_df.DF):
    """A ``pyscf.df.DF`` whose integrals and J/K are dfmp2's (see the module docstring).

    Assign it to a density-fitted SCF object (``mf = scf.RHF(mol).density_fit(); mf.with_df =
    DFJK(mol, auxbasis, la)``); PySCF's driver then calls :meth:`get_jk` every iteration.
    ``la`` is the run's :class:`Dispatcher`: on the nki backend the fit, J and float64 K run on
    the host (the SCF's last iterations need float64) and float32 K on NKI's gemm, recorded per
    op.

    ``k_precision`` is the precision of K's products for the next calls: 'fp32' for the early
    iterations of an SCF, until its driver calls :meth:`use_fp64` (:func:`dfmp2.scf.run_scf`
    does so once the orbital gradient is small, and accepts convergence only on float64 K).
    ``plan`` (:func:`dfmp2.blocking.plan_jk`, made by :meth:`build` under ``max_memory``) puts
    the packed tensor in memory (``_cderi``, PySCF's layout) or in a temporary file in
    ``scratch_dir`` (``file``, a :class:`MatrixFile` read block by block each iteration and
    closed by :meth:`reset`). ``square`` is the tensor unpacked in K's precision, kept while it
    fits in ``max_memory`` next to the packed one in memory
    (:func:`dfmp2.blocking.jk_square_fits`; K otherwise unpacks it every iteration).
    ``k_calls`` counts K builds per precision; ``stats`` the J/K calls, their seconds and
    their products' flops.
    """

    _keys = {"la", "square", "k_precision", "k_calls", "stats", "plan", "file", "scratch_dir",
             "force_outcore"}

    def __init__(self, mol, auxbasis, la: Dispatcher, k_precision: str = "fp64",
                 scratch_dir: str | None = None, force_outcore: bool = False):
        if k_precision not in K_PRECISIONS:
            raise InputError(f"DFJK: k_precision {k_precision!r}; choose one of "
                             f"{', '.join(K_PRECISIONS)}")
        super().__init__(mol, auxbasis)
        self.la = la
        self.square = None
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
        if self._cderi is None:
            return
        dtype = np.dtype({"fp32": np.float32, "fp64": np.float64}[self.k_precision])
        if jk_square_fits(self.mol.nao_nr(), self._cderi.shape[0], dtype.itemsize,
                          self.max_memory, UNPACK_BLOCK):
            self.square = square_copy(self._cderi, dtype)

    def build(self):
        if self._cderi is not None or self.file is not None:
            return self
        self.auxmol = make_auxmol(self.mol, self.auxbasis)
        self.plan = plan_jk(self.mol.nao_nr(), self.auxmol.nao_nr(), self.max_memory,
                            max(p1 - p0 for *_, p0, p1 in shell_row_pairs(self.mol)),
                            UNPACK_BLOCK, self.force_outcore)
        if self.plan.outcore:
            self.file = fitted_cderi_file(self.mol, self.auxmol, self._ops(), self.plan,
                                          self.scratch_dir)
        else:
            self._cderi = fitted_cderi(self.mol, self.auxmol, self._ops())
        self._keep_square()
        log.info("DF-SCF integrals: naux %d (fit %d), %d AO pairs, %.0f MB packed %s%s",
                 self.auxmol.nao_nr(), self.tensor.shape[0], self.tensor.shape[1],
                 self.plan.tensor_bytes / 2**20, "on disk" if self.file else "in memory",
                 "" if self.square is None else
                 f" + {self.square.nbytes / 2**20:.0f} MB square ({self.square.dtype})")
        return self

    @property
    def tensor(self):
        """The fitted tensor: the in-memory array, or the :class:`MatrixFile` (None before
        :meth:`build`)."""
        return self.file if self.file is not None else self._cderi

    def get_naoaux(self):
        if self.file is not None:
            return self.file.shape[0]
        return super().get_naoaux()

    def loop(self, blksize=None):
        """PySCF's ``DF.loop``: blocks (q, nao(nao+1)/2) of the fitted tensor, from the file
        when it is on disk."""
        if self.tensor is None:
            self.build()
        if self.file is None:
            yield from super().loop(blksize)
            return
        for _, _, rows in _row_blocks(self.file, blksize or self.plan.read_block):
            yield rows

    def use_fp64(self) -> None:
        """K in float64 from now on (with a float64 square copy when it fits)."""
        if self.k_precision != "fp64":
            self.k_precision = "fp64"
            self._keep_square()

    def reset(self, mol=None):
        """Release the tensors: the square copy, the array, the file, and those of the copies
        PySCF made for range-separated integrals (its own reset only forgets them)."""
        self.square = None
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
        new.k_calls, new.stats = dict(self.k_calls), dict(self.stats)
        return new

    def get_jk(self, dm, hermi=1, with_j=True, with_k=True, direct_scf_tol=None, omega=None):
        if omega is not None or hermi != 1:  # range-separated or non-symmetric densities
            return super().get_jk(dm, hermi, with_j, with_k, omega=omega)
        if self.tensor is None:
            self.build()
        if with_k:
            self.k_calls[self.k_precision] += 1
        start = time.perf_counter()
        result = get_jk(self.tensor, dm, self._ops(), with_j, with_k, self.k_precision,
                        self.square, k_la=self._ops(self.k_precision), counts=self.stats,
                        read_block=self.plan.read_block)
        self.stats["calls"] += 1
        self.stats["seconds"] += time.perf_counter() - start
        return result
