"""The reference of a run as orbital spaces: one for a closed shell, one per spin otherwise.

``reference_from_scf(mf, frozen, frozen_core)`` turns a converged PySCF SCF object into a
:class:`Reference`: the kind ('rhf', 'rks', 'uhf', 'uks', 'rohf'), an :class:`OrbitalSpace` per
spin (active occupied and virtual orbitals with their energies) and the singles energy. The
pipeline takes the list of spaces and knows nothing else about spin; :mod:`dfmp2.energy` turns
the pair sums of the spaces into energies.

ROHF-MBPT(2) follows Psi4's definition (see ``shared/design/open-shell.md``): from the converged
ROHF densities the UHF-form Fock matrices ``F^a = h + J[Da + Db] - K[Da]`` and
``F^b = h + J[Da + Db] - K[Db]`` are formed, transformed to the ROHF orbitals, and their four
blocks (alpha occupied = doubly + singly occupied, alpha virtual, beta occupied = doubly occupied,
beta virtual = singly occupied + virtual) diagonalised separately. The semicanonical orbitals
feed the UMP2 doubles; the occupied-virtual Fock elements give the singles

    E_singles = - sum_sigma sum_ia (f^sigma_ia)^2 / (e^sigma_a - e^sigma_i)

over active orbitals; the frozen core is the lowest semicanonical orbitals of each spin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyscf import dft
from pyscf import scf as pyscf_scf
from pyscf.data.elements import chemcore

from .errors import ConvergenceError, InputError, OrbitalError

__all__ = [
    "KINDS",
    "check_scf_object",
    "OrbitalSpace",
    "Reference",
    "frozen_mask",
    "frozen_per_spin",
    "orbital_space",
    "reference_kind",
    "reference_from_scf",
    "semicanonical_rohf",
    "spin_contamination",
]

#: Reference kinds and whether they are spin-unrestricted in the MP2 sense (two spaces).
KINDS = {"rhf": False, "rks": False, "uhf": True, "uks": True, "rohf": True}


@dataclass(frozen=True)
class OrbitalSpace:
    """Active occupied and virtual orbitals of one spin (or of a closed shell).

    occ_coeff (nao, nocc), vir_coeff (nao, nvir), eps_occ (nocc,), eps_vir (nvir,);
    ``nfrozen_occ``/``nfrozen_vir`` count the frozen occupied and virtual orbitals.
    """

    occ_coeff: np.ndarray
    vir_coeff: np.ndarray
    eps_occ: np.ndarray
    eps_vir: np.ndarray
    nfrozen_occ: int
    nfrozen_vir: int

    @property
    def nocc(self) -> int:
        return self.occ_coeff.shape[1]

    @property
    def nvir(self) -> int:
        return self.vir_coeff.shape[1]

    @property
    def nmo(self) -> int:
        """Orbitals of this spin, frozen ones included."""
        return self.nocc + self.nvir + self.nfrozen_occ + self.nfrozen_vir


@dataclass(frozen=True)
class Reference:
    """A reference for MP2: ``kind`` (see :data:`KINDS`), ``spaces`` (one closed-shell space,
    or the alpha and beta spaces), ``e_singles`` (Hartree; ROHF only), ``nalpha``/``nbeta``
    (occupied orbitals of each spin, frozen ones included), ``xc`` (the functional of a KS
    reference)."""

    kind: str
    spaces: tuple[OrbitalSpace, ...]
    e_singles: float
    nalpha: int
    nbeta: int
    xc: str | None = None

    @property
    def has_pairs(self) -> bool:
        """Some space has active occupied and virtual orbitals (an empty one adds nothing)."""
        return any(s.nocc > 0 and s.nvir > 0 for s in self.spaces)


def reference_kind(mf) -> tuple[str, str | None]:
    """('rhf' | 'rks' | 'uhf' | 'uks' | 'rohf', xc) for a PySCF SCF object; an
    :class:`InputError` naming what is not supported."""
    xc = str(mf.xc) if isinstance(mf, dft.rks.KohnShamDFT) else None
    if isinstance(mf, pyscf_scf.rohf.ROHF):
        if xc is not None:
            raise InputError("ROKS orbitals are not supported: MP2 on KS orbitals needs an RKS "
                             "or UKS reference")
        return "rohf", None
    if isinstance(mf, pyscf_scf.uhf.UHF):
        return ("uks" if xc is not None else "uhf"), xc
    if isinstance(mf, pyscf_scf.hf.RHF):
        return ("rks" if xc is not None else "rhf"), xc
    raise InputError(f"DFMP2 needs an RHF, UHF, ROHF, RKS or UKS reference; got "
                     f"{type(mf).__name__}")


def check_scf_object(mf) -> tuple[str, str | None]:
    """(kind, xc) of a converged SCF object with orbitals; an error naming what is missing."""
    kind, xc = reference_kind(mf)
    if mf.mo_coeff is None or mf.mo_energy is None or mf.mo_occ is None:
        raise InputError("the SCF object has no orbitals: run mf.kernel() first")
    if not mf.converged:
        raise ConvergenceError("the SCF object is not converged; DF-MP2 needs a converged SCF")
    return kind, xc


def frozen_mask(mol, mo_occ: np.ndarray, frozen=None, frozen_core: bool = False,
                strict: bool = True) -> np.ndarray:
    """Boolean mask over the MOs of one spin, True = active. ``frozen``: None, an int n (the
    lowest n orbitals), or a list of MO indices (PySCF semantics); ``frozen_core``: the chemical
    core per element (ECP-covered cores excluded). ``strict``: an int that freezes every
    occupied orbital is an error (an open shell checks both spins together instead)."""
    nmo = len(mo_occ)
    mask = np.ones(nmo, dtype=bool)
    if frozen_core:
        frozen = chemcore(mol)
    if frozen is None:
        return mask
    if isinstance(frozen, (int, np.integer)):
        nocc = int(np.count_nonzero(mo_occ > 0))
        if strict and frozen >= nocc and nocc > 0:
            raise InputError(f"frozen={frozen} freezes all {nocc} occupied orbitals")
        mask[: int(frozen)] = False
        return mask
    if any(isinstance(k, (list, tuple, np.ndarray)) for k in frozen):
        raise InputError(f"frozen={list(frozen)} is a per-spin pair (alpha, beta): that needs an "
                         "open-shell (UHF or ROHF) reference; give one list for a closed shell")
    indices = np.asarray(sorted({int(k) for k in frozen}), dtype=int)
    if indices.size and (indices.max() >= nmo):
        raise InputError(f"frozen orbital index {indices.max()} out of range (nmo = {nmo})")
    mask[indices] = False
    return mask


def frozen_per_spin(frozen) -> tuple:
    """PySCF's UHF ``frozen``: an int or one list (the same for both spins), or a pair of
    lists ``[alpha list, beta list]``. Returns (alpha, beta)."""
    if (isinstance(frozen, (list, tuple)) and len(frozen) == 2
            and all(isinstance(f, (list, tuple, np.ndarray)) for f in frozen)):
        return tuple(frozen[0]), tuple(frozen[1])
    return frozen, frozen


def orbital_space(mo_coeff, mo_energy, mo_occ, active: np.ndarray,
                  allow_empty: bool = False) -> OrbitalSpace:
    """Split the orbitals of one spin into active occupied and active virtual blocks.

    allow_empty : an open-shell spin may have no active occupied or virtual orbital (its
    same-spin pairs are then empty); a closed shell needs both."""
    occupied = np.asarray(mo_occ) > 0
    occ = occupied & active
    vir = ~occupied & active
    if not allow_empty and not occ.any():
        raise InputError("no active occupied orbitals are left after freezing")
    if not allow_empty and not vir.any():
        raise InputError("no active virtual orbitals: the basis is too small for MP2")
    return OrbitalSpace(
        occ_coeff=np.ascontiguousarray(mo_coeff[:, occ]),
        vir_coeff=np.ascontiguousarray(mo_coeff[:, vir]),
        eps_occ=np.asarray(mo_energy[occ]),
        eps_vir=np.asarray(mo_energy[vir]),
        nfrozen_occ=int(np.count_nonzero(occupied & ~active)),
        nfrozen_vir=int(np.count_nonzero(~occupied & ~active)),
    )


def semicanonical_rohf(mf):
    """Psi4's semicanonical orbitals of a converged ROHF object.

    Returns ``[(mo_coeff, mo_energy, mo_occ, fock_mo), ...]`` for alpha and beta: orbitals
    (nao, nmo) with the occupied block first, their energies (nmo,), occupations 1/0 (nmo,) and
    the UHF-form Fock matrix in that basis (nmo, nmo), whose occupied-virtual block gives the
    singles."""
    mol = mf.mol
    c = np.asarray(mf.mo_coeff)
    occ = np.asarray(mf.mo_occ)
    dm_a = (c[:, occ > 0] @ c[:, occ > 0].T)
    dm_b = (c[:, occ > 1] @ c[:, occ > 1].T)
    vj, vk = mf.get_jk(mol, np.stack([dm_a, dm_b]))
    h = mf.get_hcore()
    spins = []
    for sigma, occupied in ((0, occ > 0), (1, occ > 1)):
        fock_ao = h + vj[0] + vj[1] - vk[sigma]
        blocks, energies = [], []
        for mask in (occupied, ~occupied):
            c_blk = c[:, mask]
            w, u = np.linalg.eigh(c_blk.T @ fock_ao @ c_blk)
            blocks.append(c_blk @ u)
            energies.append(w)
        mo_coeff = np.hstack(blocks)
        mo_occ = np.concatenate([np.ones(blocks[0].shape[1]), np.zeros(blocks[1].shape[1])])
        spins.append((mo_coeff, np.concatenate(energies), mo_occ,
                      mo_coeff.T @ fock_ao @ mo_coeff))
    return spins


def _singles(space_fock: np.ndarray, occ: np.ndarray, vir: np.ndarray, eps: np.ndarray) -> float:
    """``-sum_ia f_ia^2 / (e_a - e_i)`` over the active occupied ``occ`` and virtual ``vir``
    orbital indices of one spin."""
    f_ov = space_fock[np.ix_(occ, vir)]
    denom = eps[vir][None, :] - eps[occ][:, None]
    return float(-np.sum(f_ov * f_ov / denom))


def reference_from_scf(mf, frozen=None, frozen_core: bool = False) -> Reference:
    """The :class:`Reference` of a converged SCF object with the orbitals that ``frozen`` /
    ``frozen_core`` leave active (frozen per spin for open shells: see :func:`frozen_per_spin`).
    """
    kind, xc = check_scf_object(mf)
    mol = mf.mol
    if kind in ("rhf", "rks"):
        occ = np.asarray(mf.mo_occ)
        if not np.all((occ == 0) | (occ == 2)):
            raise OrbitalError(f"mo_occ must hold only 0 and 2 for a closed-shell reference; "
                               f"got {sorted(set(occ.tolist()))}")
        active = frozen_mask(mol, occ, frozen, frozen_core)
        space = orbital_space(np.asarray(mf.mo_coeff), np.asarray(mf.mo_energy), occ, active,
                              allow_empty=True)
        n = int(np.count_nonzero(occ > 0))
        return Reference(kind, (space,), 0.0, n, n, xc)
    if kind == "rohf":
        spins = semicanonical_rohf(mf)
    else:
        spins = [(np.asarray(mf.mo_coeff[s]), np.asarray(mf.mo_energy[s]),
                  np.asarray(mf.mo_occ[s]), None) for s in (0, 1)]
        for s, (_, _, occ, _) in enumerate(spins):
            if not np.all((occ == 0) | (occ == 1)):
                raise OrbitalError(f"mo_occ[{s}] must hold only 0 and 1 for a UHF reference; "
                                   f"got {sorted(set(occ.tolist()))}")
    spaces, e_singles = [], 0.0
    for (mo_coeff, mo_energy, mo_occ, fock_mo), frozen_s in zip(spins, frozen_per_spin(frozen)):
        active = frozen_mask(mol, mo_occ, frozen_s, frozen_core, strict=False)
        spaces.append(orbital_space(mo_coeff, mo_energy, mo_occ, active, allow_empty=True))
        if fock_mo is not None:
            occupied = mo_occ > 0
            e_singles += _singles(fock_mo, np.flatnonzero(occupied & active),
                                  np.flatnonzero(~occupied & active), mo_energy)
    nalpha, nbeta = (int(np.count_nonzero(s[2] > 0)) for s in spins)
    if nalpha and not any(space.nocc for space in spaces):
        raise InputError(f"frozen={frozen} freezes every occupied orbital of both spins "
                         f"({nalpha} alpha, {nbeta} beta)")
    return Reference(kind, tuple(spaces), e_singles, nalpha, nbeta, xc)


def spin_contamination(mf) -> tuple[float, float] | None:
    """(<S^2>, <S^2> - S(S+1)) of an unrestricted reference, None for restricted ones (their
    <S^2> is exact). For UKS this is the value of the KS determinant."""
    if not isinstance(mf, pyscf_scf.uhf.UHF):
        return None
    s2, _mult = mf.spin_square()
    s = mf.mol.spin / 2
    return float(s2), float(s2 - s * (s + 1))
