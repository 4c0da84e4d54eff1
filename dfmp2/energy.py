"""Closed-shell DF-MP2 energy formulas and naive, obviously correct reference oracles.

With ``(ia|jb) = sum_Q B_ia^Q B_jb^Q`` and ``D_ij^ab = e_i + e_j - e_a - e_b``:

    E_OS = sum_ijab (ia|jb)^2 / D
    E_SS = sum_ijab (ia|jb) [(ia|jb) - (ib|ja)] / D
    E_MP2 = E_OS + E_SS,  E_SCS = 6/5 E_OS + 1/3 E_SS  (Grimme, J. Chem. Phys. 118, 9095 (2003))

The oracles hold every 4-index quantity at once; they exist to test the blocked pipeline.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

__all__ = ["scs_energy", "reference_pair_energies", "reference_dfmp2"]


def scs_energy(e_os: float, e_ss: float, os_scale: float = 1.2, ss_scale: float = 1 / 3):
    """Spin-component-scaled correlation energy ``os_scale * E_OS + ss_scale * E_SS``."""
    return os_scale * e_os + ss_scale * e_ss


def reference_pair_energies(ovL: np.ndarray, eps_occ: np.ndarray, eps_vir: np.ndarray):
    """(E_OS, E_SS) from B (nocc, nvir, naux) by the full 4-index sums, no symmetry used."""
    ovov = np.einsum("iaP,jbP->iajb", ovL, ovL)
    d = (eps_occ[:, None, None, None] + eps_occ[None, None, :, None]
         - eps_vir[None, :, None, None] - eps_vir[None, None, None, :])
    e_os = float(np.sum(ovov * ovov / d))
    e_ss = float(np.sum(ovov * (ovov - ovov.transpose(0, 3, 2, 1)) / d))
    return e_os, e_ss


def reference_dfmp2(mol, auxmol, occ_coeff, vir_coeff, eps_occ, eps_vir):
    """(E_OS, E_SS) by the textbook route: whole int3c2e, ``J^{-1/2}`` by eigh, einsums.

    Independent of dfmp2's blocking, registry and triangular fit.
    """
    pmol = mol + auxmol
    j3c = pmol.intor("int3c2e", shls_slice=(0, mol.nbas, 0, mol.nbas, mol.nbas, pmol.nbas))
    j2c = auxmol.intor("int2c2e")
    w, u = scipy.linalg.eigh(j2c)
    j2c_inv_sqrt = (u / np.sqrt(w)) @ u.T
    ovP = np.einsum("mnP,mi,na->iaP", j3c, occ_coeff, vir_coeff)
    return reference_pair_energies(ovP @ j2c_inv_sqrt, eps_occ, eps_vir)
