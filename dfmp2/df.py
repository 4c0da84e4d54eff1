"""DF-J/K for PySCF's SCF drivers on dfmp2's own integrals, fit and linalg ops.

PySCF keeps its drivers (DIIS, guess, level shift, convergence checks); a density-fitted SCF
object asks its ``with_df`` for J and K once per iteration. :class:`DFJK` is such a ``with_df``:
a ``pyscf.df.DF`` whose three-index tensor is built once by dfmp2 (:func:`fitted_cderi`: the
metric factored as in the MP2 step, int3c2e streamed in auxiliary-shell blocks, the fit through
the registry's ``trmm``/``gemm``) and whose J and K are registry ``gemm`` calls:

    B^Q_{mu nu} = sum_P [L^{-1}]_QP (P|mu nu)          J = L L^T the Coulomb metric
    J_{mu nu}  = sum_Q B^Q_{mu nu} rho_Q,  rho_Q = sum_{lam sig} B^Q_{lam sig} D_{lam sig}
    K          = sum_Q (B^Q C)(B^Q C)^T  with D = C C^T (C = C_occ sqrt(n_occ), or from eigh
                                          of D with the negative part subtracted)

B is stored as PySCF's ``_cderi`` (naux_fit, nao(nao+1)/2), so PySCF's own tools that read a DF
object (``loop``, ``get_naoaux``, ``ao2mo``) keep working. Indices: mu, nu, lam, sig atomic
orbitals; P, Q auxiliary functions; i occupied orbitals.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from pyscf import df as pyscf_df
from pyscf import lib

from .errors import ResourceError
from .integrals import iter_int3c2e, make_auxmol, metric
from .linalg import Dispatcher
from .pipeline import factor_metric, fit_matrix

log = logging.getLogger(__name__)

__all__ = ["DFJK", "JK_AUX_BLOCK", "fitted_cderi", "get_jk", "jk_bytes"]

#: Auxiliary functions per block of J/K work (unpacked ``(q, nao, nao)`` at a time).
JK_AUX_BLOCK = 128
#: |eigenvalue| of a density matrix below this (relative to the largest) is dropped when K is
#: built from eigenvectors (an untagged density, e.g. PySCF's initial guess).
_DM_EIG_CUTOFF = 1e-14


def fitted_cderi(mol, auxmol, la: Dispatcher, max_memory_mb: float) -> np.ndarray:
    """``B`` (naux_fit, nao(nao+1)/2) float64: the fitted three-index integrals of a DF-SCF, in
    PySCF's packed ``_cderi`` layout. The metric is factored as in the MP2 step (Cholesky, or
    ``J^{-1/2}`` with dropped eigenvalues); raises :class:`ResourceError` when the tensor does not
    fit in ``max_memory_mb`` (the SCF keeps it in memory)."""
    nao, naux = mol.nao_nr(), auxmol.nao_nr()
    npair = nao * (nao + 1) // 2
    need = 8 * naux * npair
    if need > max_memory_mb * 1024 * 1024:
        raise ResourceError(
            f"the DF-SCF's fitted integrals need {need / 2**20:.0f} MB (naux {naux} x "
            f"{npair} AO pairs) and --max-memory is {max_memory_mb:.0f} MB; raise --max-memory "
            "or use --scf-type conv")
    factor = factor_metric(torch.from_numpy(metric(auxmol)), la)
    j3c = np.empty((naux, npair))
    for p0, p1, packed in iter_int3c2e(mol, auxmol, JK_AUX_BLOCK):
        j3c[p0:p1] = packed
    if factor.lower is None:  # J^{-1/2} restricted to the kept eigenvectors: B = V^T (P|..)
        inv_sqrt = factor.inv_sqrt  # (naux, nkept)
        return la.gemm(inv_sqrt, torch.from_numpy(j3c), trans_a=True).numpy()
    # B^T = (P|mu nu)^T L^{-T}: one trmm on the (pairs, naux) view, in place
    la.trmm(fit_matrix(factor, la), torch.from_numpy(j3c).T)
    return j3c


def _occupied_factors(dm: np.ndarray, mo_coeff, mo_occ) -> list[tuple[np.ndarray, float]]:
    """``[(C, sign), ...]`` with ``dm = sum sign C C^T``: ``C_occ sqrt(n)`` from the orbitals a
    PySCF density carries, else from ``eigh(dm)`` (positive and negative parts)."""
    if mo_coeff is not None:
        occupied = mo_occ > 0
        return [(np.ascontiguousarray(mo_coeff[:, occupied] * np.sqrt(mo_occ[occupied])), 1.0)]
    w, v = np.linalg.eigh((dm + dm.T) / 2)
    cut = _DM_EIG_CUTOFF * max(1.0, float(np.abs(w).max(initial=0.0)))
    factors = []
    for sign, keep in ((1.0, w > cut), (-1.0, w < -cut)):
        if keep.any():
            factors.append((np.ascontiguousarray(v[:, keep] * np.sqrt(np.abs(w[keep]))), sign))
    return factors


def _tagged_orbitals(dm, nset: int):
    """Per density of ``dm`` (nset, nao, nao): (mo_coeff, mo_occ) when PySCF tagged them, else
    (None, None). ROHF tags one set of orbitals with occupations 2/1/0 for two densities."""
    mo_coeff, mo_occ = getattr(dm, "mo_coeff", None), getattr(dm, "mo_occ", None)
    if mo_coeff is None or mo_occ is None:
        return [(None, None)] * nset
    mo_coeff, mo_occ = np.asarray(mo_coeff), np.asarray(mo_occ)
    if mo_coeff.ndim == 2 and nset == 2 and mo_occ.ndim == 1:  # ROHF: alpha and beta parts
        return [(mo_coeff, (mo_occ > 0).astype(float)), (mo_coeff, (mo_occ == 2).astype(float))]
    mo_coeff = mo_coeff.reshape(nset, *mo_coeff.shape[-2:])
    mo_occ = mo_occ.reshape(nset, -1)
    return list(zip(mo_coeff, mo_occ))


def get_jk(cderi: np.ndarray, dm, la: Dispatcher, with_j: bool = True, with_k: bool = True,
           square: np.ndarray | None = None, block: int = JK_AUX_BLOCK):
    """(vj, vk) of densities ``dm`` ((nao, nao) or (nset, nao, nao), symmetric) from ``cderi``
    (naux, nao(nao+1)/2); either is None when not asked for. ``square``: the same tensor
    unpacked, (naux, nao, nao), when memory allowed keeping it (K then skips the unpacking each
    iteration). Every product is ``la.gemm``; K uses ``Y = C^T B^Q`` (B^Q symmetric) and
    ``K += Y^T Y`` per block of auxiliary functions."""
    dms = np.asarray(dm)
    shape = dms.shape
    nao = shape[-1]
    dms = dms.reshape(-1, nao, nao)
    nset = dms.shape[0]
    vj = vk = None
    b = torch.from_numpy(cderi)
    if with_j:
        dm_tril = lib.pack_tril(dms + dms.transpose(0, 2, 1))
        idx = np.arange(nao)
        dm_tril[:, idx * (idx + 1) // 2 + idx] *= 0.5
        rho = la.gemm(b, torch.from_numpy(dm_tril), trans_b=True)  # (naux, nset)
        vj_tril = la.gemm(rho, b, trans_a=True).numpy()  # (nset, npair)
        vj = lib.unpack_tril(vj_tril, 1).reshape(shape)
    if with_k:
        factors = [_occupied_factors(d, c, n) for d, (c, n) in
                   zip(dms, _tagged_orbitals(dm, nset))]
        vk = np.zeros((nset, nao, nao))
        buffer = None if square is not None else np.empty((block, nao, nao))
        for q0 in range(0, cderi.shape[0], block):
            q1 = min(q0 + block, cderi.shape[0])
            if square is not None:
                unpacked = square[q0:q1]
            else:
                unpacked = lib.unpack_tril(cderi[q0:q1], out=buffer[: q1 - q0])
            # (q, mu, nu) as (nu, q*mu): B^Q is symmetric, so C^T times it gives Y (i, q, mu)
            cols = torch.from_numpy(unpacked.reshape((q1 - q0) * nao, nao))
            for k, parts in enumerate(factors):
                for coeff, sign in parts:
                    y = la.gemm(torch.from_numpy(coeff), cols, trans_a=True, trans_b=True)
                    y_rows = y.reshape(-1, nao)  # ((i, q), mu)
                    vk[k] += sign * la.gemm(y_rows, y_rows, trans_a=True).numpy()
        vk = vk.reshape(shape)
    return vj, vk


def jk_bytes(nao: int, naux: int) -> tuple[int, int]:
    """(packed, square) bytes of a DF-SCF's fitted tensor: ``8 X n(n+1)/2`` and ``8 X n^2``."""
    return 8 * naux * (nao * (nao + 1) // 2), 8 * naux * nao * nao


class DFJK(pyscf_df.DF):
    """A ``pyscf.df.DF`` whose integrals and J/K are dfmp2's (see the module docstring).

    Assign it to a density-fitted SCF object (``mf = scf.RHF(mol).density_fit(); mf.with_df =
    DFJK(mol, auxbasis, la)``); PySCF's driver then calls :meth:`get_jk` every iteration.
    ``la`` is the run's :class:`Dispatcher`: on the nki backend J and K run on the host in fp64
    (an fp32 J/K cannot converge an SCF to 1e-11 Eh), recorded per op.
    """

    _keys = {"la", "square"}

    def __init__(self, mol, auxbasis, la: Dispatcher):
        super().__init__(mol, auxbasis)
        self.la = la
        self.square = None

    def _ops(self):
        if self.la.backend == "nki":
            return self.la.on_host("DF-SCF J/K in fp64 on the host: fp32 J/K cannot converge "
                                   "the SCF to its tolerance")
        return self.la

    def build(self):
        if self._cderi is not None:
            return self
        self.auxmol = make_auxmol(self.mol, self.auxbasis)
        self._cderi = fitted_cderi(self.mol, self.auxmol, self._ops(), self.max_memory)
        packed, square = jk_bytes(self.mol.nao_nr(), self._cderi.shape[0])
        if packed + square <= self.max_memory * 2**20:
            self.square = lib.unpack_tril(self._cderi)
        log.info("DF-SCF integrals: naux %d (fit %d), %d AO pairs, %.0f MB packed%s",
                 self.auxmol.nao_nr(), self._cderi.shape[0], self._cderi.shape[1],
                 packed / 2**20, f" + {square / 2**20:.0f} MB square" if self.square is not None
                 else "")
        return self

    def reset(self, mol=None):
        self.square = None
        return super().reset(mol)

    def get_jk(self, dm, hermi=1, with_j=True, with_k=True, direct_scf_tol=None, omega=None):
        if omega is not None or hermi != 1:  # range-separated or non-symmetric densities
            return super().get_jk(dm, hermi, with_j, with_k, omega=omega)
        if self._cderi is None:
            self.build()
        return get_jk(self._cderi, dm, self._ops(), with_j, with_k, square=self.square)
