"""DF-MP2 energy formulas: the spin algebra of the pair sums, and naive reference oracles.

Every backend implements one spin-neutral op, ``mp2_pair_sums`` (see
:func:`dfmp2.linalg.torch_ops.mp2_pair_sums`), returning for a block of occupied pairs (i, j)

    direct   = sum_ij w_ij sum_ab (ia|jb)^2 / D_ij^ab
    exchange = sum_ij w_ij sum_ab (ia|jb) (ib|ja) / D_ij^ab     (optional; needs nvir_i == nvir_j)

with ``(ia|jb) = sum_Q B_ia^Q B_jb^Q`` and ``D_ij^ab = e_i + e_j - e_a - e_b``. This module is
the only one that knows about spin: which pairs a block holds, their weights, and how the two
sums become opposite-spin and same-spin energies (:data:`CLOSED`, :data:`SAME`,
:data:`OPPOSITE`):

    closed shell (RHF): E_OS = sum_ij direct_ij,  E_SS = sum_ij (direct_ij - exchange_ij)
    same spin (σσ):     E_σσ = 1/2 sum_ij (direct_ij - exchange_ij)   (pairs i = j add 0)
    opposite spin (αβ): E_αβ = sum_ij direct_ij   (all pairs, rectangular, no exchange)

    E_MP2 = E_singles + E_OS + E_SS,  E_SCS = 6/5 E_OS + 1/3 E_SS + E_singles
    (Grimme, J. Chem. Phys. 118, 9095 (2003); singles unscaled)

The closed-shell and same-spin sums run over blocks I <= J of occupied orbitals; pairs i < j
stand for (i, j) and (j, i), so they weigh 2 (:func:`pair_weights`). The oracles hold every
4-index quantity at once; they exist to test the blocked pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

__all__ = [
    "CLOSED",
    "OPPOSITE",
    "SAME",
    "SpinBlock",
    "pair_weights",
    "reference_b",
    "reference_dfmp2",
    "reference_pair_energies",
    "reference_pair_sums",
    "reference_spin_energies",
    "scs_energy",
]


@dataclass(frozen=True)
class SpinBlock:
    """How one kind of pair block turns ``[direct, exchange]`` sums into (E_OS, E_SS).

    name : 'closed', 'same' or 'opposite'; triangular : the block runs over pairs I <= J of one
    orbital space (weights 2 above the diagonal, 1 on it, 0 below), else over all pairs of two
    spaces (weights 1); exchange : the op computes the exchange sum; os_factor, ss_factor :
    ``E_OS = os_factor * direct``, ``E_SS = ss_factor * (direct - exchange)``.
    """

    name: str
    triangular: bool
    exchange: bool
    os_factor: float
    ss_factor: float

    def energies(self, direct: float, exchange: float) -> tuple[float, float]:
        """(E_OS, E_SS) contributed by sums of this kind."""
        e_os = self.os_factor * direct
        e_ss = self.ss_factor * (direct - exchange) if self.exchange else 0.0
        return e_os, e_ss


#: RHF: both spins of every spatial pair.
CLOSED = SpinBlock("closed", triangular=True, exchange=True, os_factor=1.0, ss_factor=1.0)
#: αα or ββ of an open-shell reference.
SAME = SpinBlock("same", triangular=True, exchange=True, os_factor=0.0, ss_factor=0.5)
#: αβ of an open-shell reference: rectangular blocks, no exchange.
OPPOSITE = SpinBlock("opposite", triangular=False, exchange=False, os_factor=1.0,
                     ss_factor=0.0)


def pair_weights(i0: int, i1: int, j0: int, j1: int, triangular: bool):
    """Weights (i1-i0, j1-j0), float64 numpy, of the pairs (i, j) of orbitals i0:i1 x j0:j1.

    triangular (both ranges in the same space, blocks I <= J): 2 for i < j, 1 for i == j, 0 for
    i > j (those pairs are counted through (j, i)); otherwise 1 for every pair."""
    if not triangular:
        return np.ones((i1 - i0, j1 - j0))
    i = np.arange(i0, i1)[:, None]
    j = np.arange(j0, j1)[None, :]
    return np.where(i < j, 2.0, np.where(i == j, 1.0, 0.0))


def scs_energy(e_os: float, e_ss: float, os_scale: float = 1.2, ss_scale: float = 1 / 3,
               e_singles: float = 0.0):
    """Spin-component-scaled correlation energy ``os_scale E_OS + ss_scale E_SS + E_singles``."""
    return os_scale * e_os + ss_scale * e_ss + e_singles


def reference_pair_sums(ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, exchange: bool):
    """``[direct, exchange]`` of the ``mp2_pair_sums`` contract by whole 4-index einsums
    (float64 numpy; any array-likes in). ovL_i (ni, nva, naux), ovL_j (nj, nvb, naux),
    weights (ni, nj); the exchange sum is 0.0 when ``exchange`` is False."""
    b_i, b_j = (np.asarray(x, dtype=np.float64) for x in (ovL_i, ovL_j))
    e_i, e_j, e_a, e_b, w = (np.asarray(x, dtype=np.float64)
                             for x in (eps_i, eps_j, eps_va, eps_vb, weights))
    t = np.einsum("iaP,jbP->ijab", b_i, b_j)
    d = (e_i[:, None, None, None] + e_j[None, :, None, None]
         - e_a[None, None, :, None] - e_b[None, None, None, :])
    direct = float(np.einsum("ij,ijab->", w, t * t / d))
    if not exchange:
        return np.array([direct, 0.0])
    return np.array([direct, float(np.einsum("ij,ijab->", w, t * t.transpose(0, 1, 3, 2) / d))])


def reference_pair_energies(ovL: np.ndarray, eps_occ: np.ndarray, eps_vir: np.ndarray):
    """Closed-shell (E_OS, E_SS) from B (nocc, nvir, naux) by the full 4-index sums, no symmetry
    used."""
    ovov = np.einsum("iaP,jbP->iajb", ovL, ovL)
    d = (eps_occ[:, None, None, None] + eps_occ[None, None, :, None]
         - eps_vir[None, :, None, None] - eps_vir[None, None, None, :])
    e_os = float(np.sum(ovov * ovov / d))
    e_ss = float(np.sum(ovov * (ovov - ovov.transpose(0, 3, 2, 1)) / d))
    return e_os, e_ss


def reference_spin_energies(ovL_a, ovL_b, eps_occ_a, eps_vir_a, eps_occ_b, eps_vir_b):
    """Open-shell (E_OS, E_SS) from B of each spin, (nocc_σ, nvir_σ, naux), by whole 4-index
    sums over all i, j (no pair symmetry used): E_OS = E_αβ, E_SS = E_αα + E_ββ."""
    def same(ovL, e_o, e_v):
        t = np.einsum("iaP,jbP->ijab", ovL, ovL)
        d = e_o[:, None, None, None] + e_o[None, :, None, None] - e_v[:, None] - e_v[None, :]
        return 0.5 * float(np.sum(t * (t - t.transpose(0, 1, 3, 2)) / d))

    t_ab = np.einsum("iaP,jbP->ijab", ovL_a, ovL_b)
    d_ab = (eps_occ_a[:, None, None, None] + eps_occ_b[None, :, None, None]
            - eps_vir_a[:, None] - eps_vir_b[None, :])
    e_os = float(np.sum(t_ab * t_ab / d_ab))
    return e_os, same(ovL_a, eps_occ_a, eps_vir_a) + same(ovL_b, eps_occ_b, eps_vir_b)


def reference_dfmp2(mol, auxmol, occ_coeff, vir_coeff, eps_occ, eps_vir):
    """(E_OS, E_SS) by the textbook route: whole int3c2e, ``J^{-1/2}`` by eigh, einsums.

    Independent of dfmp2's blocking, registry and triangular fit.
    """
    return reference_pair_energies(reference_b(mol, auxmol, occ_coeff, vir_coeff), eps_occ,
                                   eps_vir)


def reference_b(mol, auxmol, occ_coeff, vir_coeff):
    """B (nocc, nvir, naux) = (ia|P) J^{-1/2} from the whole int3c2e tensor (textbook route)."""
    pmol = mol + auxmol
    j3c = pmol.intor("int3c2e", shls_slice=(0, mol.nbas, 0, mol.nbas, mol.nbas, pmol.nbas))
    j2c = auxmol.intor("int2c2e")
    w, u = scipy.linalg.eigh(j2c)
    j2c_inv_sqrt = (u / np.sqrt(w)) @ u.T
    ovP = np.einsum("mnP,mi,na->iaP", j3c, occ_coeff, vir_coeff)
    return ovP @ j2c_inv_sqrt
