"""Density fitting shared by the MP2 step and the DF-SCF: the Coulomb metric and its factor,
the fit matrix, and int3c2e streamed in blocks of auxiliary shells or of AO shell rows.

The MP2 step (:mod:`dfmp2.pipeline`) factors the metric of its RI basis and streams int3c2e
through its transform; the DF-SCF's J/K (:mod:`dfmp2.jk`) builds its fitted tensor from the
same pieces. Indices: mu, nu atomic orbitals; P, Q auxiliary functions.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import torch
from pyscf import gto, lib
from pyscf.gto import moleintor

from .errors import NotPositiveDefiniteError
from .linalg import Dispatcher
from .threads import available

log = logging.getLogger(__name__)

__all__ = [
    "INT3C_EXPCUTOFF",
    "LINDEP_THRESHOLD",
    "SOLVE_CONDITION",
    "fit_in_place",
    "solve_in_place",
    "solves",
    "MAX_UNPACK_THREADS",
    "METRIC_ON_HOST",
    "MetricFactor",
    "PairColumns",
    "PairUnpacker",
    "aux_shell_blocks",
    "cholesky_condition",
    "factor_metric",
    "fit_matrix",
    "host_ops",
    "iter_int3c2e",
    "iter_int3c2e_pairs",
    "metric",
    "nonzero_columns",
    "shell_row_pairs",
    "take_columns",
    "unpack_pairs",
]


#: libcint's primitive screening for int3c2e: primitive pairs whose Gaussian product prefactor
#: is below exp(-INT3C_EXPCUTOFF) are skipped (libcint's default is 60). Measured on (H2O)20
#: cc-pVDZ: int3c2e 11% faster at 40, largest change of an integral 4e-19 (2e-14 at 30).
INT3C_EXPCUTOFF = 40


def metric(auxmol) -> np.ndarray:
    """The Coulomb metric ``J_PQ = (P|Q)``, (naux, naux) float64."""
    return auxmol.intor("int2c2e", hermi=1)


def aux_shell_blocks(auxmol, max_functions: int) -> list[tuple[int, int, int, int]]:
    """Group auxiliary shells into blocks of at most ``max_functions`` functions (a block holds at
    least one whole shell). Returns (shell0, shell1, p0, p1) per block."""
    return _shell_range_blocks(auxmol, max_functions, 0, auxmol.nbas)


def iter_int3c2e(mol, auxmol, max_functions: int, shells: tuple[int, int] | None = None):
    """Yield ``(p0, p1, packed)`` for blocks of whole auxiliary shells (of the shells
    ``shells[0]:shells[1]`` only when given: one rank's share), where
    ``packed[P - p0, mu*(mu+1)/2 + nu] = (mu nu|P)`` for ``mu >= nu``: shape
    (p1 - p0, nao*(nao+1)/2), float64, C-contiguous (:func:`unpack_pairs` gives the square).

    One libcint optimiser serves every block, and every block is written into one reused buffer
    (fresh arrays of this size cost page faults comparable to the integrals on some hosts): a
    yielded block is valid until the next one is requested."""
    pmol = mol + auxmol
    if not pmol._env[gto.PTR_EXPCUTOFF]:  # unset (0): libcint's default; a user's value stays
        pmol._env[gto.PTR_EXPCUTOFF] = INT3C_EXPCUTOFF  # pmol is new: mol keeps its own _env
    intor = pmol._add_suffix("int3c2e")
    atm, bas, env = pmol._atm, pmol._bas, pmol._env
    ao_loc = moleintor.make_loc(bas, intor)
    cintopt = moleintor.make_cintopt(atm, bas, env, intor)
    nbas, nao = mol.nbas, mol.nao_nr()
    npair = nao * (nao + 1) // 2
    blocks = _shell_range_blocks(auxmol, max_functions, *(shells or (0, auxmol.nbas)))
    if not blocks:
        return
    packed = np.empty(max(p1 - p0 for _, _, p0, p1 in blocks) * npair)
    for shell0, shell1, p0, p1 in blocks:
        shls_slice = (0, nbas, 0, nbas, nbas + shell0, nbas + shell1)
        j3c = moleintor.getints3c(intor, atm, bas, env, shls_slice, 1, "s2ij", ao_loc, cintopt,
                                  out=packed[: (p1 - p0) * npair])  # (npair, P), F-order
        yield p0, p1, j3c.T


def _shell_range_blocks(auxmol, max_functions: int, shell0: int, shell1: int):
    """:func:`aux_shell_blocks` of the shells ``shell0:shell1`` alone (global offsets)."""
    offsets = auxmol.ao_loc_nr()
    blocks, start = [], shell0
    for shell in range(shell0, shell1):
        if shell > start and offsets[shell + 1] - offsets[start] > max_functions:
            blocks.append((start, shell, offsets[start], offsets[shell]))
            start = shell
    if shell1 > start:
        blocks.append((start, shell1, offsets[start], offsets[shell1]))
    return blocks


def shell_row_pairs(mol) -> list[tuple[int, int, int, int]]:
    """Per AO shell of ``mol``: (shell, shell + 1, p0, p1), the range of packed AO pairs
    (mu >= nu, ``mu(mu+1)/2 + nu``) whose row mu belongs to that shell."""
    ao_loc = mol.ao_loc_nr()
    return [(k, k + 1, int(ao_loc[k] * (ao_loc[k] + 1) // 2),
             int(ao_loc[k + 1] * (ao_loc[k + 1] + 1) // 2)) for k in range(mol.nbas)]


def iter_int3c2e_pairs(mol, auxmol, max_pairs: int):
    """Yield ``(p0, p1, block)`` for ranges of whole AO shell rows: ``block[P, p - p0] =
    (mu nu|P)`` for the packed pairs p0:p1 and every auxiliary function, shape (naux, p1 - p0),
    C-contiguous (the out-of-core fit's order: all P of some pairs). A range holds at most
    ``max_pairs`` pairs unless one shell row alone has more. One reused buffer: a block is
    valid until the next one is requested."""
    pmol = mol + auxmol
    if not pmol._env[gto.PTR_EXPCUTOFF]:
        pmol._env[gto.PTR_EXPCUTOFF] = INT3C_EXPCUTOFF
    intor = pmol._add_suffix("int3c2e")
    atm, bas, env = pmol._atm, pmol._bas, pmol._env
    ao_loc = moleintor.make_loc(bas, intor)
    cintopt = moleintor.make_cintopt(atm, bas, env, intor)
    nbas, naux = mol.nbas, auxmol.nao_nr()
    ranges, start = [], None
    for shell0, shell1, p0, p1 in shell_row_pairs(mol):
        if start is None:
            start = (shell0, p0)
        elif p1 - start[1] > max_pairs:
            ranges.append((start[0], shell0, start[1], p0))
            start = (shell0, p0)
        end = (shell1, p1)
    if start is not None:
        ranges.append((start[0], end[0], start[1], end[1]))
    buffer = np.empty(max(p1 - p0 for _, _, p0, p1 in ranges) * naux) if ranges else None
    for shell0, shell1, p0, p1 in ranges:
        shls_slice = (shell0, shell1, 0, shell1, nbas, nbas + auxmol.nbas)
        j3c = moleintor.getints3c(intor, atm, bas, env, shls_slice, 1, "s2ij", ao_loc, cintopt,
                                  out=buffer[: (p1 - p0) * naux])  # (pairs, P), F-order
        yield p0, p1, j3c.T


def unpack_pairs(packed: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Square symmetric blocks ``out[P, mu, nu]`` (n, nao, nao) from rows of
    :func:`iter_int3c2e`'s packed block (n, nao*(nao+1)/2). Runs in the calling thread only:
    an OpenMP pool woken between two BLAS calls competes with the BLAS's spinning workers
    (:class:`PairUnpacker` splits the rows over plain threads instead)."""
    with lib.with_omp_threads(1):
        return lib.unpack_tril(packed, out=out)


def take_columns(rows: np.ndarray, columns: np.ndarray, out: np.ndarray,
                 threads: int = 1) -> np.ndarray:
    """``out[:n] = rows[:, columns]`` for ``rows`` (n, m) float64 C-contiguous, ``columns``
    int32 and ``out`` float64 C-contiguous with rows of ``len(columns)`` (PySCF's compiled
    gather, which checks no index: a column beyond m is refused here). Runs in the calling
    thread only, as :func:`unpack_pairs` does, unless given more ``threads`` (PySCF's OpenMP
    ones: for a gather between two long products, not between short ones, whose BLAS workers
    are still spinning)."""
    count = rows.shape[0]
    if (rows.ndim != 2 or rows.dtype != np.float64 or not rows.flags.c_contiguous
            or out.dtype != np.float64 or not out.flags.c_contiguous
            or (columns.size and not 0 <= columns.min() <= columns.max() < rows.shape[1])):
        raise ValueError(f"take_columns: columns up to {columns.max(initial=-1)} of float64 "
                         f"C-contiguous rows {rows.shape} {rows.dtype} into {out.dtype}")
    with lib.with_omp_threads(threads):
        return lib.take_2d(rows, np.arange(count, dtype=np.int32), columns, out=out[:count])


class PairColumns:
    """The AO pairs a pair-screened tensor keeps as its columns: the tensor is (naux, ncol),
    column c < ``len(kept)`` holds the packed pair ``kept[c]`` (``mu(mu+1)/2 + nu``, mu >= nu,
    increasing), and the last column is zero.

    A pair whose integrals ``(mu nu|P)`` are exactly zero for every auxiliary function is not
    kept: libcint skips a shell pair whose primitive products are all below its cutoff
    (:data:`INT3C_EXPCUTOFF`), so 45.6% of C20H42 cc-pVDZ's pairs are zero and 25.7% of
    (H2O)16's. The fit acts on each pair's column alone, so a zero column stays zero and the
    fitted tensor of the kept pairs is the whole fitted tensor. Every pair not kept reads the
    zero column when a matrix is unpacked (``square_index``) or a packed row is rebuilt
    (``column``), so that neither needs a second pass to write zeros.

    nao : basis functions; npair : nao(nao+1)/2; ncol : ``len(kept) + 1``; column : (npair,)
    int32, the tensor column of each packed pair (the zero column for a pair not kept);
    square_index : (nao*nao,) int32, the tensor column of each (mu, nu)."""

    def __init__(self, nao: int, kept: np.ndarray):
        self.nao = int(nao)
        self.npair = self.nao * (self.nao + 1) // 2
        self.kept = np.asarray(kept, dtype=np.int32)
        if self.kept.ndim != 1 or np.any(np.diff(self.kept) <= 0) or (
                self.kept.size and not 0 <= self.kept[0] <= self.kept[-1] < self.npair):
            raise ValueError("PairColumns: kept must be increasing packed pair indices")
        self.ncol = self.kept.size + 1
        self.column = np.full(self.npair, self.kept.size, dtype=np.int32)
        self.column[self.kept] = np.arange(self.kept.size, dtype=np.int32)
        mu = np.arange(self.nao)
        big, small = np.maximum.outer(mu, mu), np.minimum.outer(mu, mu)
        self.square_index = self.column[big * (big + 1) // 2 + small].ravel()
        # compress()'s gather: the kept pairs, then any pair for the zero column (its value
        # is overwritten)
        self._source = np.append(self.kept, 0).astype(np.int32)
        self._screened = self.column == self.kept.size  # (npair,) bool: the pairs not kept

    @classmethod
    def every(cls, nao: int) -> PairColumns:
        """Every pair kept (no screening)."""
        return cls(nao, np.arange(nao * (nao + 1) // 2))

    @classmethod
    def nonzero_in(cls, nao: int, packed_rows: np.ndarray,
                   ao_loc: np.ndarray | None = None) -> PairColumns:
        """The pairs not zero in every row of ``packed_rows`` (n, npair); with ``ao_loc`` (the
        basis's shell offsets, nbas + 1) every pair of a shell pair with one such pair. libcint
        skips whole shell pairs, and a pair of a kept shell pair that is zero in these rows may
        vanish by symmetry for these auxiliary functions only (a p function perpendicular to a
        plane or an axis that holds every centre of the rows)."""
        nonzero = nonzero_columns(packed_rows)
        if ao_loc is not None:
            shell = np.repeat(np.arange(len(ao_loc) - 1), np.diff(ao_loc))  # (nao,)
            rows, cols = np.tril_indices(nao)  # packed order: mu(mu+1)/2 + nu, mu >= nu
            shell_pair = shell[rows] * (len(ao_loc) - 1) + shell[cols]
            kept_shell_pairs = np.zeros((len(ao_loc) - 1) ** 2, dtype=bool)
            kept_shell_pairs[shell_pair[nonzero]] = True
            nonzero = kept_shell_pairs[shell_pair]
        return cls(nao, np.flatnonzero(nonzero))

    @property
    def screened(self) -> int:
        """Pairs not kept."""
        return self.npair - self.kept.size

    def describe(self) -> str:
        """The kept pairs, in words (a run's record)."""
        if not self.screened:
            return f"all {self.npair} AO pairs (none is zero)"
        return f"{self.kept.size} of {self.npair} AO pairs (the others are zero)"

    def misses(self, packed_rows: np.ndarray) -> bool:
        """Whether ``packed_rows`` (n, npair) are nonzero at a pair that is not kept (their
        compressed copy would lose it)."""
        self._check_width(packed_rows, self.npair)
        if not self.screened:
            return False
        return bool(np.any(nonzero_columns(packed_rows)[self._screened]))

    def compress(self, packed_rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out`` (n, ncol), C-contiguous: the kept columns of ``packed_rows`` (n, npair), then
        the zero column (the caller has checked :meth:`misses`)."""
        self._check_width(packed_rows, self.npair)
        take_columns(packed_rows, self._source, out)
        out[:, -1] = 0.0
        return out

    def expand(self, rows: np.ndarray) -> np.ndarray:
        """PySCF's packed rows (n, npair) from the tensor's ``rows`` (n, ncol)."""
        self._check_width(rows, self.ncol)
        return take_columns(np.ascontiguousarray(rows), self.column,
                            np.empty((rows.shape[0], self.npair)))

    def of_pairs(self, packed: np.ndarray) -> np.ndarray:
        """(m, ncol) from packed vectors (m, npair): their kept entries and a zero (a density
        against which the tensor's columns are summed)."""
        self._check_width(packed, self.npair)
        out = np.zeros((packed.shape[0], self.ncol), dtype=packed.dtype)
        out[:, :-1] = packed[:, self.kept]
        return out

    def _check_width(self, rows: np.ndarray, width: int) -> None:
        if rows.ndim != 2 or rows.shape[1] != width:
            raise ValueError(f"PairColumns of {self.nao} functions: rows {rows.shape}, not "
                             f"(n, {width})")


def nonzero_columns(rows: np.ndarray) -> np.ndarray:
    """(m,) bool: the columns of float64 ``rows`` (n, m) with an entry whose bits are not all
    zero (a nonzero, a NaN, or -0.0, which is kept as if nonzero). An OR of the bits: 0.11 s
    against 0.16 s for ``np.any(rows != 0, axis=0)`` on a (3712, 54459) block."""
    bits = np.ascontiguousarray(rows, dtype=np.float64).view(np.int64)
    if bits.shape[0] == 0:
        return np.zeros(bits.shape[1], dtype=bool)
    return np.bitwise_or.reduce(bits, axis=0) != 0


#: At most this many threads unpack one block of pair rows (:class:`PairUnpacker`).
MAX_UNPACK_THREADS = 8


class PairUnpacker:
    """:func:`unpack_pairs` with the rows of a block split over ``threads`` threads: the
    calling one and a pool of ``threads - 1`` (PySCF's C unpacking, called through ctypes,
    releases the GIL). The default is PySCF's OpenMP thread count (``OMP_NUM_THREADS`` when
    set, else one per available CPU), up to :data:`MAX_UNPACK_THREADS`. Plain threads, not
    PySCF's OpenMP pool, which would compete with the BLAS's spinning workers between two
    products. Measured on a 2-core Intel Xeon (C20H42 cc-pVDZ, K from a packed tensor of 2366
    auxiliary functions): 1.76-1.84 s per J/K build unpacking 16 at a time in two threads,
    against 1.95-2.03 s for 8 at a time in one. Use it as a context manager: the pool ends
    with the ``with`` block."""

    def __init__(self, threads: int | None = None):
        if threads is None:
            threads = min(available(), MAX_UNPACK_THREADS)
        self.threads = max(1, int(threads))
        self._pool = ThreadPoolExecutor(self.threads - 1) if self.threads > 1 else None
        self._closed = False

    def __call__(self, packed: np.ndarray, out: np.ndarray,
                 pairs: PairColumns | None = None) -> np.ndarray:
        """``out[:n]`` (n, nao, nao) unpacked from ``packed`` (n, nao*(nao+1)/2), or with
        ``pairs`` from a pair-screened tensor's rows (n, pairs.ncol) (gathered by
        ``pairs.square_index``). Returns once every thread has finished writing, also when one
        of them raised."""
        if self._closed:
            raise RuntimeError("PairUnpacker used after close(); make a new one")
        rows = packed.shape[0]
        if pairs is None:
            work = unpack_pairs
        else:
            pairs._check_width(packed, pairs.ncol)

            def work(part, dest):
                take_columns(part, pairs.square_index, dest.reshape(-1, pairs.nao**2))
        parts = min(self.threads, rows)
        if parts < 2:
            work(packed, out[:rows])
            return out[:rows]
        bounds = np.linspace(0, rows, parts + 1).astype(int)
        futures = [self._pool.submit(work, packed[r0:r1], out[r0:r1])
                   for r0, r1 in zip(bounds[1:-1], bounds[2:])]
        try:
            work(packed[: bounds[1]], out[: bounds[1]])
        finally:
            wait(futures)  # no thread still writes into ``out`` when this returns or raises
        for future in futures:
            future.result()
        return out[:rows]

    def close(self) -> None:
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def __enter__(self) -> PairUnpacker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: Eigenvalues of the Coulomb metric below this are dropped when Cholesky fails, in the MP2
#: step (the DF-SCF's tensor drops PySCF's way: dfmp2.scf_integrals.SCF_LINDEP_THRESHOLD).
LINDEP_THRESHOLD = 1e-10
#: Above this condition number of the metric (LAPACK's estimate after Cholesky) the fit solves
#: with the Cholesky factor (triangular solves by blocks of rows, as PySCF does:
#: :func:`solves`, :func:`solve_in_place`) instead of multiplying by ``L^{-T}`` formed once
#: (:func:`fit_matrix`): water cc-pVDZ with an even-tempered fitting set (beta 1.3, condition
#: 4e17) had its DF-SCF energy 2.5e-6 Eh and its MP2 correlation energy 5.8e-9 Eh from PySCF's
#: through the explicit inverse, against 1e-11 or better up to a condition of 1e13 (beta 1.4).
SOLVE_CONDITION = 1e12


@dataclass(frozen=True)
class MetricFactor:
    """Either the Cholesky factor ``lower`` (J = L L^T) or ``inv_sqrt`` (naux, nkept) = J^{-1/2}
    restricted to the kept eigenvectors. ``ndropped`` counts dropped eigenvalues.

    condition : condition number of the metric as the fit uses it: LAPACK's estimate of the
    1-norm condition number (``?pocon``) after a Cholesky factorisation, ``w_max / w_min`` of
    the kept eigenvalues after eigh; None when not computed. method : 'cholesky' or 'eigh';
    reason : why that factorisation was used (LAPACK's failing pivot for eigh).
    """

    lower: torch.Tensor | None
    inv_sqrt: torch.Tensor | None
    ndropped: int = 0
    condition: float | None = None
    method: str = ""
    reason: str = ""

    @property
    def naux_fit(self) -> int:
        return self.lower.shape[0] if self.lower is not None else self.inv_sqrt.shape[1]


#: Why the metric stage of an NKI run is on the host (the reason recorded per op).
METRIC_ON_HOST = ("metric stage: fp64 on the host by design (LAPACK decides positive "
                  "definiteness; fp32 factors and inverses of the metric are not accurate enough)")


def host_ops(la, reason: str):
    """``la`` itself on the pytorch backend; on nki, its ops on the host in fp64 (recorded)."""
    return la.on_host(reason) if la.backend == "nki" else la


def factor_metric(j2c: torch.Tensor, la: Dispatcher,
                  lindep: float = LINDEP_THRESHOLD,
                  what: str = "the MP2 auxiliary basis") -> MetricFactor:
    """Cholesky of the metric (n, n) float64; if LAPACK's fp64 ``potrf`` finds it not positive
    definite, ``J^{-1/2}`` from ``eigh`` with eigenvalues below ``lindep`` dropped (logged,
    never clamped; :data:`LINDEP_THRESHOLD` by default, the DF-SCF's tensor PySCF's own).
    ``what`` names the fitting set in the warning: a run factors two metrics (the DF-SCF's
    JK fit and the MP2 step's), and the summary's metric line is the MP2 step's.

    The decision is LAPACK's on every backend: the pytorch ``cholesky`` op is LAPACK's potrf on
    the CPU, and an NKI run factors the metric on the host in fp64 (``la.on_host``, recorded),
    because the blocked NKI factorisation's fp32 trailing updates fail on ill-conditioned
    metrics that fp64 factors exactly (measured: H2O aug-cc-pVDZ with aug_etb, cond 1e9).
    """
    host = host_ops(la, METRIC_ON_HOST)
    try:
        lower = host.cholesky(j2c)
    except NotPositiveDefiniteError as exc:
        w, u = host.eigh(j2c)
        keep = w > lindep
        ndropped = int((~keep).sum())
        log.warning(
            "the metric of %s is not positive definite (%s); using J^-1/2 from eigh and "
            "dropping %d of %d eigenvalues below %.0e",
            what, exc, ndropped, len(w), lindep,
        )
        kept = w[keep]
        condition = float(kept[-1] / kept[0]) if kept.numel() else float("inf")
        reason = (f"{exc}: eigh, {ndropped} of {len(w)} eigenvalues below "
                  f"{lindep:.0e} dropped")
        return MetricFactor(None, u[:, keep] / torch.sqrt(kept), ndropped, condition, "eigh",
                            reason)
    return MetricFactor(lower, None, 0, cholesky_condition(j2c, lower), "cholesky",
                        "LAPACK potrf succeeded in fp64")


#: Bytes of one block of rows solved at a time by :func:`solve_in_place` (its only memory
#: beyond the rows themselves: the solve's result, copied back).
SOLVE_BLOCK_BYTES = 16 * 2**20


def solve_in_place(lower: torch.Tensor, rows: torch.Tensor, la) -> torch.Tensor:
    """``rows`` (m, naux) <- ``rows @ L^{-T}`` with the Cholesky factor ``lower`` (naux, naux),
    by ``la.trsm`` on blocks of rows of :data:`SOLVE_BLOCK_BYTES`, each copied back: the fit of a
    metric above :data:`SOLVE_CONDITION`, in the rows' own memory (a view, contiguous or not,
    on the host or a device; ``lower`` is moved to the rows' device). Returns ``rows``."""
    lower = lower.to(rows.device)
    step = max(1, SOLVE_BLOCK_BYTES // max(1, rows.shape[1] * rows.element_size()))
    for r0 in range(0, rows.shape[0], step):
        block = rows[r0:r0 + step]
        block.copy_(la.trsm(lower, block))
    return rows


def fit_in_place(factor: MetricFactor, la, rows: torch.Tensor,
                 upper: torch.Tensor | None = None) -> torch.Tensor:
    """``rows`` (m, naux), a view of the integrals, <- ``rows @ L^{-T}`` in place, for a
    Cholesky ``factor``: triangular solves with ``L`` where :func:`solves` says so
    (:func:`solve_in_place`), else one ``la.trmm`` with ``upper`` (:func:`fit_matrix`, made here
    when None). Returns ``rows``."""
    if solves(factor):
        return solve_in_place(factor.lower, rows, la)
    return la.trmm(fit_matrix(factor, la) if upper is None else upper, rows)


def solves(factor: MetricFactor) -> bool:
    """Whether the fit with ``factor`` solves with its Cholesky factor (:func:`solve_in_place`)
    instead of multiplying by ``L^{-T}`` (:func:`fit_matrix`): a metric whose condition is above
    :data:`SOLVE_CONDITION`."""
    return (factor.lower is not None and factor.condition is not None
            and factor.condition > SOLVE_CONDITION)


def cholesky_condition(a_nn: torch.Tensor, l_nn: torch.Tensor) -> float:
    """LAPACK's estimate (``dpocon``, O(n^2)) of the 1-norm condition number of the symmetric
    positive definite ``a_nn`` (n, n) from its lower Cholesky factor ``l_nn``; inf if singular."""
    from scipy.linalg import lapack

    a = a_nn.detach().to("cpu", torch.float64).numpy()
    if a.shape[0] == 0:
        return 1.0
    rcond, _info = lapack.dpocon(l_nn.detach().to("cpu", torch.float64).numpy(),
                                 float(np.abs(a).sum(axis=0).max()), uplo="L")
    return float("inf") if rcond == 0.0 else float(1.0 / rcond)


def fit_matrix(factor: MetricFactor, la: Dispatcher) -> torch.Tensor:
    """The (naux, naux_fit) matrix the fit multiplies by: ``L^{-T}`` (upper triangular; from one
    ``la.trsm`` on the identity, on the host in fp64 on nki) or ``J^{-1/2}`` from the eigh
    fallback."""
    if factor.lower is None:
        return factor.inv_sqrt
    lower = factor.lower
    # part of the metric stage: on nki, in fp64 on the host (an fp32 L^{-T} measured 2e-4 Eh off
    # at cond 2.9e9, against 5e-6 with this one)
    return host_ops(la, METRIC_ON_HOST).trsm(lower, torch.eye(lower.shape[0], dtype=lower.dtype))
