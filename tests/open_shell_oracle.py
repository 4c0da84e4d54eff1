"""Independent NumPy oracle for open-shell MP2: UMP2 and ROHF-MBPT(2) as Psi4 defines it.

Uses only PySCF's SCF object, integrals (``intor``, ``ao2mo``, ``get_jk``) and NumPy/SciPy; never
dfmp2's pipeline and never PySCF's MP2 code (``mp.MP2(rohf)`` is UMP2 on unrotated ROHF orbitals).
Formulas: design/open-shell.md (Psi4 ``dfmp2/mp2.cc`` RODFMP2, ``libscf_solver/rohf.cc``).
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
from pyscf import ao2mo
from pyscf.df.addons import make_auxmol


def semicanonicalize(mf_rohf) -> dict:
    """Semicanonical orbitals of a converged ROHF: ``F^s = h + J[Da+Db] - K[Ds]`` in the ROHF MO
    basis, occ-occ and vir-vir blocks of each spin diagonalised separately (Psi4's rule).

    Returns ``coeff`` (C_a, C_b), each (nao, nmo); ``mo_energy`` (eps_a, eps_b), each (nmo,);
    ``nocc`` (n_a, n_b); ``f_ov`` (f_ia^a (n_a, nmo-n_a), f_ia^b (n_b, nmo-n_b)), semicanonical.
    """
    mol, c_ao_mo, mo_occ = mf_rohf.mol, mf_rohf.mo_coeff, mf_rohf.mo_occ
    nocc = (int(np.count_nonzero(mo_occ > 0)), int(np.count_nonzero(mo_occ > 1)))
    dm_spin = np.stack([c_ao_mo[:, :n] @ c_ao_mo[:, :n].T for n in nocc])  # (2, nao, nao)
    vj, vk = mf_rohf.get_jk(mol, dm_spin)  # DF Fock for a density-fitted ROHF
    hcore = mf_rohf.get_hcore()
    coeff, mo_energy, f_ov = [], [], []
    for s, n in enumerate(nocc):
        fock_mo = c_ao_mo.T @ (hcore + vj[0] + vj[1] - vk[s]) @ c_ao_mo  # (nmo, nmo)
        eps_o, u_o = np.linalg.eigh(fock_mo[:n, :n])
        eps_v, u_v = np.linalg.eigh(fock_mo[n:, n:])
        coeff.append(np.hstack([c_ao_mo[:, :n] @ u_o, c_ao_mo[:, n:] @ u_v]))
        mo_energy.append(np.concatenate([eps_o, eps_v]))
        f_ov.append(u_o.T @ fock_mo[:n, n:] @ u_v)
    return dict(coeff=tuple(coeff), mo_energy=tuple(mo_energy), nocc=nocc, f_ov=tuple(f_ov))


def singles(f_ia, eps_occ, eps_vir) -> float:
    """``-sum_ia f_ia^2 / (eps_a - eps_i)`` for one spin; f_ia (nocc, nvir), active orbitals."""
    return float(-np.sum(f_ia**2 / (eps_vir[None, :] - eps_occ[:, None])))


def conv_ovov(mol):
    """Exact ``(ia|jb)`` source: ``fn(co1, cv1, co2, cv2) -> (no1, nv1, no2, nv2)``."""
    def fn(co1, cv1, co2, cv2):
        shape = (co1.shape[1], cv1.shape[1], co2.shape[1], cv2.shape[1])
        return ao2mo.general(mol, (co1, cv1, co2, cv2), compact=False).reshape(shape)
    return fn


def df_ovov(mol, auxbasis):
    """Fitted ``(ia|jb) = sum_Q B_iaQ B_jbQ`` with ``B = (ia|P) J^{-1/2}``, textbook style."""
    auxmol = make_auxmol(mol, auxbasis)
    pmol = mol + auxmol
    j3c = pmol.intor("int3c2e", shls_slice=(0, mol.nbas, 0, mol.nbas,
                                            mol.nbas, mol.nbas + auxmol.nbas))  # (nao, nao, naux)
    w, v = scipy.linalg.eigh(auxmol.intor("int2c2e"))  # (naux,), (naux, naux)
    j_inv_half = (v / np.sqrt(w)) @ v.T  # (naux, naux)

    def b_ovL(co, cv):  # (no, nv, naux)
        return np.einsum("mnP,mi,na->iaP", j3c, co, cv, optimize=True) @ j_inv_half

    def fn(co1, cv1, co2, cv2):
        return np.einsum("iaQ,jbQ->iajb", b_ovL(co1, cv1), b_ovL(co2, cv2), optimize=True)
    return fn


def ump2_from_eri(ovov_fn, coeff_occ, coeff_vir, eps_occ, eps_vir) -> tuple[float, float]:
    """UMP2 doubles ``(E_OS, E_SS)`` from spin blocks of ``(ia|jb)``; each argument is an
    (alpha, beta) pair of active-orbital arrays (coeff (nao, n), eps (n,))."""
    def denom(s, t):  # (no_s, nv_s, no_t, nv_t)
        d_ia = eps_occ[s][:, None] - eps_vir[s][None, :]
        d_jb = eps_occ[t][:, None] - eps_vir[t][None, :]
        return d_ia[:, :, None, None] + d_jb[None, None, :, :]
    e_ss = 0.0
    for s in (0, 1):
        ovov = ovov_fn(coeff_occ[s], coeff_vir[s], coeff_occ[s], coeff_vir[s])
        e_ss += 0.5 * np.sum(ovov * (ovov - ovov.transpose(0, 3, 2, 1)) / denom(s, s))
    ovov = ovov_fn(coeff_occ[0], coeff_vir[0], coeff_occ[1], coeff_vir[1])
    e_os = np.sum(ovov**2 / denom(0, 1))
    return float(e_os), float(e_ss)


def _energies(mol, coeff, mo_energy, nocc, frozen, auxbasis, f_ov=None) -> dict:
    """Freeze the lowest ``frozen`` orbitals of each spin, then singles + doubles."""
    ovov_fn = conv_ovov(mol) if auxbasis is None else df_ovov(mol, auxbasis)
    c_o = [c[:, frozen:n] for c, n in zip(coeff, nocc)]
    c_v = [c[:, n:] for c, n in zip(coeff, nocc)]
    e_o = [e[frozen:n] for e, n in zip(mo_energy, nocc)]
    e_v = [e[n:] for e, n in zip(mo_energy, nocc)]
    e_s = 0.0 if f_ov is None else sum(singles(f[frozen:], eo, ev)
                                        for f, eo, ev in zip(f_ov, e_o, e_v))
    e_os, e_ss = ump2_from_eri(ovov_fn, c_o, c_v, e_o, e_v)
    return dict(singles=e_s, os=e_os, ss=e_ss, corr=e_s + e_os + e_ss)


def rohf_mbpt2(mf_rohf, frozen: int = 0, auxbasis: str | None = None) -> dict:
    """ROHF-MBPT(2): semicanonicalise, singles + UMP2 doubles; exact integrals when ``auxbasis``
    is None, DF otherwise. Returns dict(singles, os, ss, corr) in Hartree."""
    sc = semicanonicalize(mf_rohf)
    return _energies(mf_rohf.mol, sc["coeff"], sc["mo_energy"], sc["nocc"], frozen, auxbasis,
                     sc["f_ov"])


def ump2(mf_uhf, frozen: int = 0, auxbasis: str | None = None) -> dict:
    """UMP2 on converged UHF orbitals (singles 0); same conventions as :func:`rohf_mbpt2`."""
    nocc = tuple(int(np.count_nonzero(occ > 0)) for occ in mf_uhf.mo_occ)
    return _energies(mf_uhf.mol, tuple(mf_uhf.mo_coeff), tuple(mf_uhf.mo_energy), nocc, frozen,
                     auxbasis)
