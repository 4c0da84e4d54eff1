"""The DF-MP2 pipeline: metric -> transform -> fit -> pair energy, each stage through linalg ops.

Indices: i, j active occupied; a, b active virtual; P, Q auxiliary. Every function is pure apart
from the optional ``progress(stage, done, total)`` callback.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from .blocking import BlockPlan
from .buffers import Buffers
from .errors import NotPositiveDefiniteError
from .integrals import OrbitalSpace, iter_int3c2e, metric, unpack_pairs
from .linalg import Dispatcher
from .storage import H5Store, IncoreStore

log = logging.getLogger(__name__)

__all__ = ["MetricFactor", "PairEnergies", "TensorB", "factor_metric", "transform", "fit_matrix",
           "fit", "pair_energies", "dfmp2_pair_energies", "LINDEP_THRESHOLD", "PRECISION_DTYPES"]

#: Eigenvalues of the Coulomb metric below this are dropped when Cholesky fails.
LINDEP_THRESHOLD = 1e-10

Progress = Callable[[str, int, int], None]


def _no_progress(stage: str, done: int, total: int) -> None:
    return None


@dataclass(frozen=True)
class MetricFactor:
    """Either the Cholesky factor ``lower`` (J = L L^T) or ``inv_sqrt`` (naux, nkept) = J^{-1/2}
    restricted to the kept eigenvectors. ``ndropped`` counts dropped eigenvalues."""

    lower: torch.Tensor | None
    inv_sqrt: torch.Tensor | None
    ndropped: int = 0

    @property
    def naux_fit(self) -> int:
        return self.lower.shape[0] if self.lower is not None else self.inv_sqrt.shape[1]


def factor_metric(j2c: torch.Tensor, la: Dispatcher) -> MetricFactor:
    """Cholesky of the metric; if it is not positive definite, ``J^{-1/2}`` from ``eigh`` with
    eigenvalues below :data:`LINDEP_THRESHOLD` dropped (logged, never clamped)."""
    try:
        return MetricFactor(la.cholesky(j2c), None)
    except NotPositiveDefiniteError as exc:
        w, u = la.eigh(j2c)
        keep = w > LINDEP_THRESHOLD
        ndropped = int((~keep).sum())
        log.warning(
            "the auxiliary metric is not positive definite (%s); using J^-1/2 from eigh and "
            "dropping %d of %d eigenvalues below %.0e",
            exc, ndropped, len(w), LINDEP_THRESHOLD,
        )
        return MetricFactor(None, u[:, keep] / torch.sqrt(w[keep]), ndropped)


def transform(mol, auxmol, space: OrbitalSpace, la: Dispatcher, aux_block: int,
              unpack_block: int, store, progress: Progress = _no_progress) -> None:
    """``(ia|P) = sum_{mu nu} C_mu,i C_nu,a (mu nu|P)`` streamed over auxiliary-shell blocks
    into ``store`` (float64).

    Per block of ``aux_block`` auxiliary functions: the packed integrals are unpacked
    ``unpack_block`` functions at a time, each square matrix is half transformed into its slot of
    ``(P, i, nu)`` by ``C_occ^T (mu nu|P)`` (the matrix is symmetric, so no transpose follows),
    then one full transform ``(P*i, nu) x (nu, a)``; all products through ``la.gemm``. Every
    intermediate lives in one buffer reused by all blocks (fresh arrays of this size cost page
    faults comparable to the GEMMs on the benchmark machine).
    """
    nocc, nvir, naux = space.nocc, space.nvir, auxmol.nao_nr()
    occ_coeff = torch.from_numpy(space.occ_coeff)
    vir_coeff = torch.from_numpy(space.vir_coeff)
    nao = occ_coeff.shape[0]
    buffers = Buffers()
    for p0, p1, packed in iter_int3c2e(mol, auxmol, aux_block):
        nblk = p1 - p0
        half_pim = buffers.get("half_pim", (nblk, nocc, nao))
        for s0 in range(0, nblk, unpack_block):
            s1 = min(s0 + unpack_block, nblk)
            square = buffers.get("square", (s1 - s0, nao, nao))
            unpack_pairs(packed[s0:s1], out=square.numpy())
            for q in range(s1 - s0):
                la.gemm(occ_coeff, square[q], trans_a=True, out=half_pim[s0 + q])  # (i, nu)
        full = la.gemm(half_pim.view(nblk * nocc, nao), vir_coeff,
                       out=buffers.get("full", (nblk * nocc, nvir)))  # (P*i, a)
        store.write_pia(p0, p1, full.view(nblk, nocc, nvir))
        progress("transform", p1, naux)


def fit_matrix(factor: MetricFactor, la: Dispatcher) -> torch.Tensor:
    """The (naux, naux_fit) matrix the fit multiplies by: ``L^{-T}`` (upper triangular; from one
    ``la.trsm`` on the identity) or ``J^{-1/2}`` from the eigh fallback."""
    if factor.lower is None:
        return factor.inv_sqrt
    lower = factor.lower
    return la.trsm(lower, torch.eye(lower.shape[0], dtype=lower.dtype))


def fit(store, factor: MetricFactor, la: Dispatcher, fit_occ: int,
        progress: Progress = _no_progress) -> None:
    """``B_ia^Q = sum_P (ia|P) [L^{-T}]_PQ`` (or ``(ia|P) J^{-1/2}``) for blocks of ``fit_occ``
    occupied orbitals, read from and written to ``store``.

    ``L^{-T}`` is formed once; each block is then one ``la.trmm``, in place in the rows read
    (a trsm per block ran at half the GEMM rate)."""
    nocc = store.nocc
    matrix = fit_matrix(factor, la)
    for i0 in range(0, nocc, fit_occ):
        i1 = min(i0 + fit_occ, nocc)
        rows = store.read_ia_slab(i0, i1)  # ((i1-i0)*nvir, naux)
        if factor.lower is not None:
            store.write_b(i0, i1, la.trmm(matrix, rows))
        else:
            store.write_b(i0, i1, la.gemm(rows, matrix))
        progress("fit", i1, nocc)
    store.finish_fit()


@dataclass(frozen=True)
class PairEnergies:
    """Opposite-spin and same-spin correlation energies (Hartree) and the pairs evaluated."""

    e_os: float
    e_ss: float
    npairs: int


def pair_energies(store, eps_occ: torch.Tensor, eps_vir: torch.Tensor, la: Dispatcher,
                  occ_block: int, fused: bool = True,
                  progress: Progress = _no_progress) -> PairEnergies:
    """Sum pair energies over blocks I <= J of occupied orbitals (i <= j symmetry).

    store : anything with ``nocc`` and ``read_b(i0, i1) -> (i1-i0, nvir, naux)`` (a storage
    object, or :class:`TensorB` around a tensor). The GEMMs run in B's dtype, the reduction in
    the dtype of ``eps_vir``. fused : one ``mp2_pair_energy`` op per block; else ``gemm`` for
    ``(ia|jb)`` and a separate ``pair_energy_from_ovov`` reduction. Block sums add in float64.
    """
    nocc = store.nocc
    starts = list(range(0, nocc, occ_block))
    nblocks = len(starts) * (len(starts) + 1) // 2
    total = torch.zeros(2, dtype=torch.float64)
    done = 0
    for bi, i0 in enumerate(starts):
        i1 = min(i0 + occ_block, nocc)
        ovL_i = store.read_b(i0, i1)
        for j0 in starts[bi:]:
            j1 = min(j0 + occ_block, nocc)
            ovL_j = ovL_i if j0 == i0 else store.read_b(j0, j1)
            args = (ovL_i, ovL_j, eps_occ[i0:i1], eps_occ[j0:j1], eps_vir, i0 == j0)
            total += la.mp2_pair_energy(*args) if fused else _unfused(la, *args)
            done += 1
            progress("pair energy", done, nblocks)
    e_os, e_ss = (float(x) for x in total)
    return PairEnergies(e_os, e_ss, nocc * (nocc + 1) // 2)


@dataclass(frozen=True)
class TensorB:
    """A B tensor (nocc, nvir, naux) in memory, read in occupied blocks."""

    ovL: torch.Tensor

    @property
    def nocc(self) -> int:
        return self.ovL.shape[0]

    def read_b(self, i0: int, i1: int) -> torch.Tensor:
        return self.ovL[i0:i1]


def _unfused(la: Dispatcher, ovL_i, ovL_j, eps_i, eps_j, eps_v, diagonal_block):
    ni, nv, naux = ovL_i.shape
    nj = ovL_j.shape[0]
    ovov = la.gemm(ovL_i.reshape(ni * nv, naux), ovL_j.reshape(nj * nv, naux), False, True)
    return la.pair_energy_from_ovov(ovov.view(ni, nv, nj, nv), eps_i, eps_j, eps_v,
                                    diagonal_block)


@dataclass
class StageTimer:
    """Wall time per pipeline stage in seconds."""

    seconds: dict[str, float] = field(default_factory=dict)

    def run(self, stage: str, fn, *args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start
        return result


#: dtypes of (stored B and pair GEMMs, pair-energy reduction) per precision.
PRECISION_DTYPES = {
    "fp64": (torch.float64, torch.float64),
    "mixed": (torch.float32, torch.float64),
    "fp32": (torch.float32, torch.float32),
}


def dfmp2_pair_energies(mol, auxmol, space: OrbitalSpace, plan: BlockPlan, la: Dispatcher,
                        fused: bool = True, precision: str = "fp64",
                        progress: Progress = _no_progress, timer: StageTimer | None = None,
                        scratch_dir: str | None = None) -> tuple[PairEnergies, MetricFactor]:
    """The whole post-SCF DF-MP2 step for a closed-shell reference.

    precision : 'fp64'; 'mixed' (B and the pair GEMMs in fp32, reduction and sums in fp64); or
    'fp32' (reduction of each block in fp32 too, block sums in fp64). The metric, transform and
    fit always run in fp64.
    """
    timer = timer or StageTimer()
    b_dtype, reduce_dtype = PRECISION_DTYPES[precision]
    j2c = timer.run("metric", lambda: torch.from_numpy(metric(auxmol)))
    factor = timer.run("metric", factor_metric, j2c, la)
    del j2c  # the planner counts the metric only until it is factored
    shape = (space.nocc, space.nvir, auxmol.nao_nr(), factor.naux_fit)
    # the store's allocation (the first touch of its pages, in core) counts as transform time
    store = timer.run("transform", lambda: H5Store(*shape, dtype=b_dtype, directory=scratch_dir)
                      if plan.outcore else IncoreStore(*shape, dtype=b_dtype))
    try:
        timer.run("transform", transform, mol, auxmol, space, la, plan.aux_block,
                  plan.unpack_block, store, progress)
        timer.run("fit", fit, store, factor, la, plan.fit_occ, progress)
        eps_occ = torch.from_numpy(np.ascontiguousarray(space.eps_occ)).to(reduce_dtype)
        eps_vir = torch.from_numpy(np.ascontiguousarray(space.eps_vir)).to(reduce_dtype)
        energies = timer.run("pair_energy", pair_energies, store, eps_occ, eps_vir, la,
                             plan.occ_block, fused, progress)
    finally:
        store.close()
    return energies, factor
