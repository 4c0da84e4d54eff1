"""The DF-SCF's fitted three-index tensor, built once per SCF from :mod:`dfmp2.df`'s pieces:
int3c2e streamed, the metric factored as in the MP2 step, the fit through the registry's
``trmm``/``gemm``. In memory on the AO pairs that are not zero (:func:`screened_cderi`, some or
all rows unpacked in place where they fit: :func:`split_cderi`), or PySCF's packed layout
(:func:`fitted_cderi`); on disk when it does not fit (:func:`fitted_cderi_file`).
:mod:`dfmp2.jk` builds J and K from it.

    B^Q_{mu nu} = sum_P [L^{-1}]_QP (P|mu nu)          J = L L^T the Coulomb metric

Indices: mu, nu atomic orbitals; P, Q auxiliary functions.
"""

from __future__ import annotations

import itertools
import logging
import shutil
import tempfile

import numpy as np
import torch
from pyscf import lib

from .blocking import JKPlan, size_texts
from .buffers import zeros
from .df import (
    MetricFactor,
    PairColumns,
    PairUnpacker,
    factor_metric,
    fit_in_place,
    fit_matrix,
    iter_int3c2e,
    iter_int3c2e_pairs,
    metric,
    nonzero_columns,
    solves,
    take_columns,
)
from .errors import ResourceError
from .linalg import Dispatcher
from .storage import MatrixFile

log = logging.getLogger(__name__)

__all__ = [
    "JK_AUX_BLOCK",
    "UNPACK_BLOCK",
    "fitted_cderi",
    "fitted_cderi_file",
    "screened_cderi",
    "split_cderi",
    "unpack_in_place",
]


#: Auxiliary functions per block of the DF-SCF build's int3c2e.
JK_AUX_BLOCK = 128
#: Eigenvalues of a JK-fit metric that Cholesky refuses are dropped below this, as PySCF's
#: DF-SCF drops them (``pyscf.df.incore.LINEAR_DEP_THR``): the SCF's J and K are PySCF's. A
#: range-separated hybrid's long-range metric is singular: with the MP2 step's 1e-10 instead,
#: wB97X on two waters 30 Angstrom apart (cc-pVDZ) was 3.3e-8 Eh from PySCF's DF-SCF.
SCF_LINDEP_THRESHOLD = 1e-7
#: Auxiliary functions unpacked at a time from the packed or pair-screened tensor for K (and
#: in place, :func:`unpack_in_place`), by one thread per CPU
#: (:class:`dfmp2.df.PairUnpacker`), into arrays reused block after block. Measured on the
#: Intel Xeon (family 6, model 167), per J/K build from the packed tensor: C20H42 cc-pVDZ
#: 1.77-1.84 s at 16 against 1.84-1.94 s at 8 and 1.86-1.99 s at 32; (H2O)16 0.89-0.94 s at 16
#: against 1.0 s at 8. (8 in one thread was fastest for (H2O)16 on AMD EPYC Zen 4.)
UNPACK_BLOCK = 16


def scf_metric_factor(auxmol, la: Dispatcher) -> MetricFactor:
    """The JK-fit metric factored for the DF-SCF's tensor (:func:`dfmp2.df.factor_metric`,
    eigenvalues dropped as PySCF drops them, :data:`SCF_LINDEP_THRESHOLD`)."""
    return factor_metric(torch.from_numpy(metric(auxmol)), la, lindep=SCF_LINDEP_THRESHOLD,
                         what="the SCF's fitting basis")


def fitted_cderi(mol, auxmol, la: Dispatcher) -> np.ndarray:
    """``B`` (naux_fit, nao(nao+1)/2) float64: the fitted three-index integrals of a DF-SCF, in
    PySCF's packed ``_cderi`` layout, in memory (:func:`dfmp2.blocking.plan_jk` decided it
    fits). The metric is factored as PySCF's DF-SCF factors it (:func:`scf_metric_factor`):
    after a Cholesky factorisation one trmm by ``L^{-T}`` on the whole tensor, or triangular
    solves where the metric is ill-conditioned (:func:`dfmp2.df.fit_in_place`); with ``J^{-1/2}``
    (eigenvalues dropped) by AO pair blocks, so that one tensor is in memory.
    :func:`screened_cderi` keeps only the pairs that are not zero."""
    nao = mol.nao_nr()
    npair = nao * (nao + 1) // 2
    factor = scf_metric_factor(auxmol, la)
    naux = factor.naux_fit
    # pages touched up front, in order, by threads: see dfmp2.buffers
    packed = zeros((naux, npair))
    if factor.lower is None:
        for p0, p1, _, block in _fitted_pair_blocks(mol, auxmol, factor, la,
                                                    max(1, npair // 16)):
            packed[:, p0:p1] = block
    else:
        for p0, p1, block in iter_int3c2e(mol, auxmol, JK_AUX_BLOCK):
            packed[p0:p1] = block
        # B^T = (P|mu nu)^T L^{-T}: on the (pairs, naux) view, in place
        fit_in_place(factor, la, torch.from_numpy(packed).T)
    return packed


def screened_cderi(mol, auxmol, la: Dispatcher) -> tuple[np.ndarray, PairColumns]:
    """``(B, pairs)``: the fitted tensor of :func:`fitted_cderi` on the AO pairs that are not
    zero (:class:`dfmp2.df.PairColumns`), (naux_fit, pairs.ncol) float64 in memory.

    The kept pairs are those of the AO shell pairs not zero in the first block of auxiliary
    shells; every later block is checked to be zero at the others before it is stored
    compressed, and the integrals are computed again with every pair kept when one is not (a
    whole shell pair that vanishes by symmetry for the first auxiliary functions only). The fit
    of the kept pairs is that of :func:`fitted_cderi` (:func:`dfmp2.df.fit_in_place`) on fewer
    columns. With ``J^{-1/2}`` (the metric refused by Cholesky) the tensor is fitted by AO pair
    blocks and every pair is kept. :func:`split_cderi` unpacks some or all of the rows in the
    same memory."""
    _, columns, pairs = split_cderi(mol, auxmol, la, lambda pairs, naux: 0)
    return columns, pairs


def split_cderi(mol, auxmol, la: Dispatcher,
                rows_unpacked) -> tuple[np.ndarray, np.ndarray, PairColumns]:
    """``(head, tail, pairs)``: the tensor of :func:`screened_cderi` with its first q rows
    unpacked, ``head`` (q, nao, nao), and the others on the AO pairs that are not zero,
    ``tail`` (naux_fit - q, pairs.ncol), both float64 in the memory of the build, q =
    ``rows_unpacked(pairs, naux_fit)`` (decided once the kept pairs are known; 0 <= q <=
    naux_fit): as much of the tensor unpacked as memory holds, all of it where it fits (the
    tensor unpacked only: ``tail`` empty). In place after the fit: the tail's rows are moved
    to their place behind the head's, last row first, then the head's are unpacked
    (:func:`unpack_in_place`). One basis function (its pair and the zero column are wider than
    its 1x1 square) is unpacked whole into new memory when any q > 0 is asked."""
    nao = mol.nao_nr()
    flat, naux, pairs, q = _fitted_columns(mol, auxmol, la, rows_unpacked)
    ncol = pairs.ncol
    if not q:  # nothing to unpack (nor to move)
        return np.empty((0, nao, nao)), flat[: naux * ncol].reshape(naux, ncol), pairs
    if ncol > nao * nao:  # one basis function: its pair and the zero column
        unpacked = zeros((naux, nao, nao))
        with PairUnpacker() as unpack:
            unpack(flat[: naux * ncol].reshape(naux, ncol), unpacked, pairs)
        return unpacked, np.empty((0, ncol)), pairs
    start, shift = q * ncol, q * (nao * nao - ncol)
    step = max(1, UNPACK_BLOCK * nao * nao // ncol)  # rows moved at a time (numpy buffers
    for r0 in reversed(range(q, naux, step)):  # a move onto its own source rows)
        r1 = min(r0 + step, naux)
        flat[r0 * ncol + shift: r1 * ncol + shift] = flat[r0 * ncol: r1 * ncol]
    tail = flat[start + shift: start + shift + (naux - q) * ncol].reshape(naux - q, ncol)
    head = unpack_in_place(flat[: q * nao * nao], q, nao, pairs=pairs)
    return head, tail, pairs


def _fitted_columns(mol, auxmol, la: Dispatcher, rows_unpacked):
    """``(flat, naux_fit, pairs, q)``: the fitted pair-screened tensor (naux_fit, pairs.ncol)
    at the start of ``flat``, memory for q = ``rows_unpacked(pairs, naux_fit)`` of its rows
    unpacked and the others as they are (:func:`_tensor_memory`); see
    :func:`screened_cderi`."""
    nao = mol.nao_nr()
    factor = scf_metric_factor(auxmol, la)
    naux = factor.naux_fit
    if factor.lower is None:
        pairs = PairColumns.every(nao)
        q = rows_unpacked(pairs, naux)
        flat = _tensor_memory(naux, pairs, q)
        columns = flat[: naux * pairs.ncol].reshape(naux, pairs.ncol)
        for p0, p1, _, block in _fitted_pair_blocks(mol, auxmol, factor, la,
                                                    max(1, pairs.npair // 16)):
            columns[:, p0:p1] = block  # kept = every pair: a pair's column is its index
    else:
        blocks = iter_int3c2e(mol, auxmol, JK_AUX_BLOCK)
        p0, p1, first = next(blocks)
        pairs = PairColumns.nonzero_in(nao, first, mol.ao_loc_nr())
        q = rows_unpacked(pairs, naux)
        flat = _screened_integrals(itertools.chain([(p0, p1, first)], blocks), pairs, naux, q)
        del first
        if flat is None:
            blocks.close()  # its int3c2e array goes before the next pass makes its own
            log.info("DF-SCF integrals: a later auxiliary block is not zero where the first "
                     "was; every AO pair kept")
            pairs = PairColumns.every(nao)
            q = rows_unpacked(pairs, naux)
            flat = _screened_integrals(iter_int3c2e(mol, auxmol, JK_AUX_BLOCK), pairs, naux, q)
        columns = flat[: naux * pairs.ncol].reshape(naux, pairs.ncol)
        # B^T = (P|mu nu)^T L^{-T}: on the (kept pairs, naux) view, in place (the zero column
        # stays zero)
        fit_in_place(factor, la, torch.from_numpy(columns).T)
    log.info("DF-SCF integrals: %s kept", pairs.describe())
    return flat, naux, pairs, q


def _tensor_memory(naux: int, pairs: PairColumns, rows_unpacked: int) -> np.ndarray:
    """The flat float64 memory of a pair-screened tensor (naux, pairs.ncol), or of the same
    tensor with its first ``rows_unpacked`` rows unpacked (at least as large), pages touched
    up front, in order, by threads (the unpacking's scattered writes into untouched pages took
    2-5 times as long on the benchmark machine: :mod:`dfmp2.buffers`)."""
    q = rows_unpacked
    return zeros((max(naux * pairs.ncol, q * pairs.nao**2 + (naux - q) * pairs.ncol),))


def _screened_integrals(blocks, pairs: PairColumns, naux: int, rows_unpacked: int):
    """The flat memory of :func:`_tensor_memory` with the int3c2e ``blocks`` (``(p0, p1,
    packed rows)`` of :func:`dfmp2.df.iter_int3c2e`) compressed into its (naux, pairs.ncol)
    start; None as soon as a block is not zero at a pair ``pairs`` does not keep."""
    flat = _tensor_memory(naux, pairs, rows_unpacked)
    columns = flat[: naux * pairs.ncol].reshape(naux, pairs.ncol)
    for p0, p1, block in blocks:
        if pairs.misses(block):
            return None
        pairs.compress(block, columns[p0:p1])
    return flat


def unpack_in_place(flat: np.ndarray, naux: int, nao: int, threads: int | None = None,
                    pairs: PairColumns | None = None) -> np.ndarray:
    """The square tensor (naux, nao, nao) from the packed rows (naux, nao(nao+1)/2), or with
    ``pairs`` the pair-screened rows (naux, pairs.ncol, no wider than nao*nao), at the start of
    ``flat`` (at least naux*nao*nao float64 elements), in the same memory.

    Blocks of :data:`UNPACK_BLOCK` rows are unpacked last to first: a block's square rows start
    at or beyond the end of every earlier block's packed rows, and the packed rows of later
    blocks they may cover have been unpacked already. A block whose square rows overlap its own
    packed rows (the first few) is copied aside first. ``threads``: the
    :class:`PairUnpacker`'s (its default when None)."""
    width = nao * (nao + 1) // 2 if pairs is None else pairs.ncol
    if width > nao * nao:
        raise ValueError(f"unpack_in_place: rows of {width} do not fit in place of {nao}x{nao}")
    packed = flat[: naux * width].reshape(naux, width)
    square = flat[: naux * nao * nao].reshape(naux, nao, nao)
    aside = np.empty((min(UNPACK_BLOCK, naux), width))
    with PairUnpacker(threads) as unpack:
        for q0 in reversed(range(0, naux, UNPACK_BLOCK)):
            q1 = min(q0 + UNPACK_BLOCK, naux)
            rows = packed[q0:q1]
            if q0 * nao * nao < q1 * width:
                np.copyto(aside[: q1 - q0], rows)
                rows = aside[: q1 - q0]
            unpack(rows, square[q0:q1], pairs)
    return square


def fitted_cderi_file(mol, auxmol, la: Dispatcher, plan: JKPlan,
                      directory: str | None = None) -> tuple[MatrixFile, PairColumns]:
    """``(file, pairs)``: the fitted tensor of :func:`screened_cderi` in a temporary file
    (:class:`MatrixFile`, rows the fitted auxiliary functions, ``pairs.ncol`` columns), for a
    tensor that does not fit in memory: fitted by blocks of ``plan.fit_pairs`` AO pairs
    (:func:`_fitted_pair_blocks`), each holding every auxiliary function, so a block's zero
    pairs are known exactly; its other columns are written after the previous block's, and the
    zero column last. The file is closed when building fails (it is unlinked from the start:
    see :class:`MatrixFile`)."""
    directory = directory or tempfile.gettempdir()
    free = shutil.disk_usage(directory).free
    if plan.tensor_bytes > free:
        need, room = size_texts(plan.tensor_bytes, free)
        raise ResourceError(
            f"the DF-SCF's fitted integrals need {need} on disk and "
            f"{directory!r} has {room} free; free space or choose another "
            "--scratch-dir" + ("" if plan.forced else " or raise --max-memory"))
    factor = scf_metric_factor(auxmol, la)
    nao = mol.nao_nr()
    npair = nao * (nao + 1) // 2
    store = MatrixFile(factor.naux_fit, npair + 1, directory)  # narrowed once written
    try:
        kept, written = [], 0
        for p0, _p1, nonzero, block in _fitted_pair_blocks(mol, auxmol, factor, la,
                                                           plan.fit_pairs, screen=True):
            store.write_columns(written, block)
            kept.append(p0 + nonzero)
            written += nonzero.size
        pairs = PairColumns(nao, np.concatenate(kept) if kept else np.zeros(0, int))
        store.write_columns(pairs.ncol - 1, np.zeros((factor.naux_fit, 1)))
        store.narrow(pairs.ncol)
    except BaseException:
        store.close()
        raise
    log.info("DF-SCF integrals: %s kept", pairs.describe())
    return store, pairs


def _fitted_pair_blocks(mol, auxmol, factor: MetricFactor, la: Dispatcher, max_pairs: int,
                        screen: bool = False):
    """Yield ``(p0, p1, kept, block)``: the fitted tensor's columns p0:p1, (naux_fit, p1 - p0),
    for ranges of whole AO shell rows (:func:`dfmp2.df.iter_int3c2e_pairs`): int3c2e for every
    auxiliary function of those pairs, then ``L^{-T}`` in place on the (pairs, naux) view
    (:func:`dfmp2.df.fit_in_place`), or ``J^{-1/2}`` by one gemm; ``kept`` is None. With ``screen``,
    the pairs whose integrals are zero for every auxiliary function are dropped before the fit:
    ``kept`` gives the offsets within p0:p1 of the block's columns. Two arrays of a range's
    size: the integrals and their copy without the zero pairs, fitted in place (by the trmm or
    the solves, or by the gemm into the integrals' array). A block is valid until the next one
    is requested."""
    upper = fit_matrix(factor, la) if factor.lower is not None and not solves(factor) else None
    spare = None
    for p0, p1, ints in iter_int3c2e_pairs(mol, auxmol, max_pairs):
        kept, block = None, ints
        if screen:
            kept = np.flatnonzero(nonzero_columns(ints)).astype(np.int32)
            if spare is None or spare.size < ints.size:  # no range is wider than max_pairs
                spare = zeros((ints.shape[0] * max(max_pairs, ints.shape[1]),))
            block = take_columns(ints, kept, spare[: ints.shape[0] * kept.size].reshape(
                ints.shape[0], kept.size), threads=lib.num_threads())
        if factor.lower is None:  # J^{-1/2} restricted to the kept eigenvectors: B = V^T (P|..)
            out = None
            if screen:  # into the integrals' array, free once they are copied
                nfit = factor.inv_sqrt.shape[1]
                out = torch.from_numpy(ints.reshape(-1)[: nfit * kept.size].reshape(
                    nfit, kept.size))
            yield p0, p1, kept, la.gemm(factor.inv_sqrt, torch.from_numpy(block),
                                        trans_a=True, out=out).numpy()
        else:
            fit_in_place(factor, la, torch.from_numpy(block).T, upper)
            yield p0, p1, kept, block
