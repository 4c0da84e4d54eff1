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

import logging
from dataclasses import dataclass

import numpy as np
from pyscf import dft
from pyscf import scf as pyscf_scf
from pyscf.data.elements import chemcore

from .errors import ConvergenceError, InputError, OrbitalError

log = logging.getLogger(__name__)


def own_attribute(obj, name: str, default=None):
    """``obj.name``, or ``default`` where it has none, without PySCF's fallback: a PySCF SCF
    object (and a Mole, for names not starting with ``_``) answers a missing attribute by
    importing every PySCF module (``pyscf.__all__``, the periodic code included) to look for a
    method registered there (0.07 s on the Zen 4 machine after dfmp2's own imports, more where
    imports are slow); ``getattr(mf, name, default)`` pays that for an optional attribute."""
    try:
        return object.__getattribute__(obj, name)
    except AttributeError:
        return default


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
    "rohf_fock",
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
                     f"{_class_name(mf)}")


def _class_name(mf) -> str:
    """A refused SCF object's class as its module places it: PySCF's X2C classes are named
    UHF, UKS, ... like the one-component ones, but are two-component (GHF-like) methods."""
    cls = type(mf)
    where = cls.__module__.removeprefix("pyscf.")
    if where.startswith("x2c"):
        return f"{cls.__name__} of pyscf.{where} (two-component X2C, spinor orbitals)"
    return cls.__name__ if where.startswith(("scf.", "dft.")) else f"{where}.{cls.__name__}"


def hamiltonian_record(mf) -> str | None:
    """What an SCF object adds to its molecule's non-relativistic Hamiltonian, in words for the
    record: PySCF's spin-free X2C-1e (``mf.x2c()``), a one-electron Hamiltonian of its own (a
    ``get_hcore`` set on the object or its class: an external field, ...), a solvent model
    (``with_solvent``). None for the molecule's own. The MP2 step uses the object's orbitals and
    orbital energies with the molecule's two-electron integrals, as PySCF's DF-MP2 does."""
    from pyscf.x2c import sfx2c1e

    parts = []
    if isinstance(mf, sfx2c1e.SFX2C1E_SCF):
        parts.append("spin-free X2C-1e one-electron Hamiltonian (PySCF's x2c/sfx2c1e)")
    elif "get_hcore" in vars(mf) or type(mf).get_hcore is not pyscf_scf.hf.SCF.get_hcore:
        parts.append("the SCF object's own one-electron Hamiltonian (get_hcore: an external "
                     "field or another added term)")
    solvent = own_attribute(mf, "with_solvent", None)
    if solvent is not None:
        eps = getattr(solvent, "eps", None)
        parts.append(f"{type(solvent).__name__} solvent model"
                     + (f" (dielectric constant {eps:g})" if isinstance(eps, (int, float)) else "")
                     + " in the reference only: MP2 on its orbitals, no solvent response")
    return "; ".join(parts) or None


#: The occupations each kind of reference may hold.
_OCCUPATIONS = {"rhf": (0, 2), "rks": (0, 2), "uhf": (0, 1), "uks": (0, 1), "rohf": (0, 1, 2)}


def check_scf_object(mf) -> tuple[str, str | None]:
    """(kind, xc) of a converged SCF object with orbitals that belong to its molecule: real
    numpy arrays of the molecule's basis size, whole occupations of the kind's values
    (:data:`_OCCUPATIONS`) holding the molecule's electrons; an error naming what is wrong."""
    kind, xc = reference_kind(mf)
    if mf.mo_coeff is None or mf.mo_energy is None or mf.mo_occ is None:
        raise InputError("the SCF object has no orbitals: run mf.kernel() first")
    if not mf.converged:
        raise ConvergenceError(
            "the SCF object is not converged (mf.converged is False); DF-MP2 needs a converged "
            "SCF. An SCF object whose orbitals were read from a chkfile starts with converged "
            "False: if its SCF did converge, set mf.converged = True (dfmp2 checks the orbitals)")
    mol = mf.mol
    if mol.natm == 0:
        raise InputError("the SCF's molecule has no atoms (a model Hamiltonian): DF-MP2 needs "
                         "the atom-centred basis and fitting functions of a molecule")
    spins = _per_spin_arrays(mf, 2 if kind in ("uhf", "uks") else 1)
    nao = mol.nao_nr()
    for label, (c, eps, occ) in spins:
        if c.shape[0] != nao:
            raise OrbitalError(f"mf.mo_coeff{label} has {c.shape[0]} rows but mf.mol has {nao} "
                               "basis functions: the molecule or its basis changed after the "
                               "SCF; run the SCF of this molecule")
        if not (eps.shape == occ.shape == (c.shape[1],)):
            raise OrbitalError(f"mf.mo_energy{label} {eps.shape} and mf.mo_occ{label} "
                               f"{occ.shape} do not match mf.mo_coeff{label} {c.shape}")
        _check_occupations(occ, _OCCUPATIONS[kind], label, kind)
    held = sum(float(occ.sum()) for _label, (_c, _eps, occ) in spins)
    if held != mol.nelectron:
        raise OrbitalError(
            f"the SCF's occupations hold {held:g} electrons but mf.mol has {mol.nelectron} "
            f"(charge {mol.charge}): the molecule changed after the SCF, or mf.nelec overrode "
            "its electron count; give the molecule its charge and spin and run its SCF")
    return kind, xc


def _per_spin_arrays(mf, nspin: int) -> list[tuple[str, tuple]]:
    """[(label, (mo_coeff, mo_energy, mo_occ)), ...] per spin ('' or '[0]', '[1]'), each a real
    numpy array; an :class:`OrbitalError` naming one that is not."""
    def spin_parts(name: str) -> list:
        value = getattr(mf, name)
        if nspin == 2 and (isinstance(value, (list, tuple)) and len(value) == 2
                           or isinstance(value, np.ndarray) and len(value) == 2
                           and value.ndim == (3 if name == "mo_coeff" else 2)):
            return [value[0], value[1]]
        return [value]

    parts = {name: spin_parts(name) for name in ("mo_coeff", "mo_energy", "mo_occ")}
    if nspin == 2 and any(len(p) != 2 for p in parts.values()):
        raise OrbitalError("an unrestricted SCF object needs alpha and beta orbitals "
                           "(mo_coeff, mo_energy and mo_occ of both spins)")
    for name, values in parts.items():
        for value in values:
            if not isinstance(value, np.ndarray):
                raise OrbitalError(f"mf.{name} holds a {type(value).__name__}, not a numpy "
                                   "array: pass the SCF's own arrays (or numpy.asarray of them)")
            if np.iscomplexobj(value) or not np.issubdtype(value.dtype, np.floating) \
                    and not np.issubdtype(value.dtype, np.integer):
                raise OrbitalError(f"mf.{name} is {value.dtype}: dfmp2 needs real orbitals (a "
                                   "real RHF, UHF, ROHF, RKS or UKS)")
    labels = ("",) if nspin == 1 else ("[0]", "[1]")
    return [(labels[k], tuple(np.asarray(parts[n][k]) for n in parts)) for k in range(nspin)]


def _check_occupations(occ: np.ndarray, allowed: tuple, label: str, kind: str) -> None:
    """Refuse occupations other than ``allowed`` (fractional or smeared ones)."""
    bad = ~np.isin(occ, allowed)
    if not bad.any():
        return
    values = sorted(set(occ[bad].tolist()))
    shown = ", ".join(repr(v) for v in values[:6]) + (", ..." if len(values) > 6 else "")
    deviation = float(np.max(np.abs(occ - np.rint(occ))))
    if deviation >= 1e-8:
        hint = " (fractional or smeared occupations: MP2 needs a single determinant)"
    elif np.isin(np.rint(occ), allowed).all():
        hint = (f"; they are whole numbers to {deviation:.1e} (smearing that left integer "
                "occupations?): if so, set mf.mo_occ = numpy.rint(mf.mo_occ)")
    else:  # whole numbers this reference cannot hold (1 in RHF: an open shell)
        hint = (" (whole numbers this reference type cannot hold: singly occupied orbitals "
                "need an open-shell UHF or ROHF object)")
    raise OrbitalError(f"mo_occ{label} of this {kind.upper()} reference must hold only "
                       f"{' and '.join(map(str, allowed))}; it holds {shown}{hint}")


#: Electrons of the noble gases that close periods 1-7 (0 before the first period).
_FULL_SHELL = (0, 2, 10, 18, 36, 54, 86, 118)

def psi4_core_orbitals(mol) -> int:
    """Psi4's FREEZE_CORE TRUE (``BasisSet::n_frozen_core``): each real atom freezes the
    electrons of the noble gas that closes the period before its own (He for Li-Ne, Ne for
    Na-Ar, Ar for K-Kr, ...: the noble gas of a period is in it, as Psi4's ``lower_bound``
    places it; from period 6 the (n-2)f shell too where the atom has filled it), less what its
    ECP covers (none below zero); when no valence electron would be left, the largest such
    shell is unfrozen once. Ghost atoms freeze nothing. Returns the frozen orbitals
    (electrons // 2)."""
    electrons, valence, largest = 0, -int(mol.charge), 0
    for atom in range(mol.natm):
        charge = int(round(mol.atom_charge(atom)))  # Z less the ECP's core electrons
        if charge <= 0:
            continue
        ecp = int(mol.atom_nelec_core(atom))
        z = charge + ecp
        period = next(p for p, closed in enumerate(_FULL_SHELL) if closed >= z)
        core = _FULL_SHELL[period - 1] + (14 if period > 5 and z - _FULL_SHELL[period - 1] >= 18
                                          else 0)
        largest = max(largest, period)
        core = max(core - ecp, 0)
        valence += charge - core
        electrons += core
    if valence <= 0 and largest > 1:
        electrons -= _FULL_SHELL[largest - 1] - _FULL_SHELL[largest - 2]
    return max(electrons, 0) // 2


def core_orbitals(mol, rule) -> int:
    """The frozen-core orbitals of ``mol`` by ``rule`` (:data:`CORE_RULES`; True is
    'pyscf'): PySCF's ``chemcore`` (ECP-covered cores excluded) or Psi4's."""
    return psi4_core_orbitals(mol) if rule == "psi4" else chemcore(mol)


def frozen_mask(mol, mo_occ: np.ndarray, frozen=None, frozen_core: bool | str = False,
                strict: bool = True) -> np.ndarray:
    """Boolean mask over the MOs of one spin, True = active. ``frozen``: None, an int n (the
    lowest n orbitals), or a list of MO indices (PySCF semantics: a negative one counts from the
    last MO); ``frozen_core``: False, or the rule of the frozen core (True or 'pyscf': the
    chemical core per element, ECP-covered cores excluded; 'psi4': :func:`psi4_core_orbitals`).
    ``strict``: an int that freezes every occupied orbital is an error (an open shell checks
    both spins together instead)."""
    nmo = len(mo_occ)
    mask = np.ones(nmo, dtype=bool)
    if frozen_core:
        frozen = core_orbitals(mol, frozen_core)
    if frozen is None:
        return mask
    if isinstance(frozen, (int, np.integer)):
        nocc = int(np.count_nonzero(mo_occ > 0))
        if strict and frozen >= nocc and nocc > 0:
            raise InputError(f"{_frozen_label(frozen, frozen_core)} freezes all {nocc} occupied "
                             "orbitals" + _CORE_HINT * bool(frozen_core))
        mask[: int(frozen)] = False
        return mask
    if any(isinstance(k, (list, tuple, np.ndarray)) for k in frozen):
        raise InputError(f"frozen={list(frozen)} is a per-spin pair (alpha, beta): that needs an "
                         "open-shell (UHF or ROHF) reference; give one list for a closed shell")
    given = [int(k) for k in frozen]  # a negative index counts from the last MO (PySCF's)
    outside = [k for k in given if not -nmo <= k < nmo]
    if outside:
        worst = max(outside, key=abs)
        raise InputError(f"frozen orbital index {worst} out of range (nmo = {nmo}: indices "
                         f"0 to {nmo - 1}, or -1 to -{nmo} from the last)")
    mask[np.asarray(sorted({k % nmo for k in given}), dtype=int)] = False
    nocc = int(np.count_nonzero(mo_occ > 0))
    if strict and nocc and not mask[mo_occ > 0].any():
        raise InputError(f"frozen={list(frozen)} freezes all {nocc} occupied orbitals")
    return mask


def frozen_per_spin(frozen) -> tuple:
    """PySCF's UHF ``frozen``: an int or one list (the same for both spins), or a pair of
    lists ``[alpha list, beta list]`` (a 2-D array too). Returns (alpha, beta)."""
    if isinstance(frozen, np.ndarray):
        frozen = frozen.tolist() if frozen.ndim else int(frozen)
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


def rohf_fock(mf) -> np.ndarray:
    """The UHF-form Fock matrices (2, nao, nao), alpha and beta, of an ROHF object's orbitals
    through its own potential (``get_hcore() + get_veff``): one J/K build, from which both its
    orbital gradient and its semicanonical orbitals come."""
    c = np.asarray(mf.mo_coeff)
    occ = np.asarray(mf.mo_occ)
    dms = np.stack([c[:, occ > 0] @ c[:, occ > 0].T, c[:, occ > 1] @ c[:, occ > 1].T])
    return np.asarray(mf.get_hcore()) + np.asarray(mf.get_veff(mf.mol, dms))


def semicanonical_rohf(mf, rohf_focks: np.ndarray | None = None):
    """Psi4's semicanonical orbitals of a converged ROHF object, from its Fock matrices
    ``rohf_focks`` (2, nao, nao) when already built (:func:`rohf_fock`).

    Returns ``[(mo_coeff, mo_energy, mo_occ, fock_mo), ...]`` for alpha and beta: orbitals
    (nao, nmo) with the occupied block first, their energies (nmo,), occupations 1/0 (nmo,) and
    the UHF-form Fock matrix in that basis (nmo, nmo), whose occupied-virtual block gives the
    singles."""
    c = np.asarray(mf.mo_coeff)
    occ = np.asarray(mf.mo_occ)
    if rohf_focks is None:
        rohf_focks = rohf_fock(mf)
    spins = []
    for sigma, occupied in ((0, occ > 0), (1, occ > 1)):
        fock_ao = rohf_focks[sigma]
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


#: What a refusal of --frozen-core adds: the core is the neutral atoms', and ions can lose it.
_CORE_HINT = ("; the chemical core is the neutral atoms' (PySCF's table), which this ion does "
              "not have: give --frozen N (frozen=) with fewer orbitals")


def _frozen_label(frozen, frozen_core: bool | str) -> str:
    """How a refusal names what froze the orbitals: the option the user gave."""
    if frozen_core == "psi4":
        return (f"freeze_core (Psi4's rule: {frozen} core orbital{'s' * (frozen != 1)})")
    if frozen_core:
        return f"--frozen-core (frozen_core: {frozen} core orbital{'s' * (frozen != 1)})"
    return f"frozen={list(frozen) if isinstance(frozen, (list, tuple)) else frozen}"


def reference_from_scf(mf, frozen=None, frozen_core: bool | str = False,
                       rohf_focks: np.ndarray | None = None) -> Reference:
    """The :class:`Reference` of a converged SCF object with the orbitals that ``frozen`` /
    ``frozen_core`` leave active (frozen per spin for open shells: see :func:`frozen_per_spin`);
    an ROHF object's Fock matrices ``rohf_focks`` (:func:`rohf_fock`) are built here if not
    given."""
    kind, xc = check_scf_object(mf)
    mol = mf.mol
    if kind in ("rhf", "rks"):
        occ = np.asarray(mf.mo_occ)
        active = frozen_mask(mol, occ, frozen, frozen_core)
        space = orbital_space(np.asarray(mf.mo_coeff), np.asarray(mf.mo_energy), occ, active,
                              allow_empty=True)
        n = int(np.count_nonzero(occ > 0))
        _warn_inverted((space,))
        return Reference(kind, (space,), 0.0, n, n, xc)
    if kind == "rohf":
        spins = semicanonical_rohf(mf, rohf_focks)
    else:
        spins = [(np.asarray(mf.mo_coeff[s]), np.asarray(mf.mo_energy[s]),
                  np.asarray(mf.mo_occ[s]), None) for s in (0, 1)]
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
        label = _frozen_label(core_orbitals(mol, frozen_core) if frozen_core else frozen,
                              frozen_core)
        raise InputError(f"{label} freezes every occupied orbital of both spins ({nalpha} "
                         f"alpha, {nbeta} beta)" + _CORE_HINT * bool(frozen_core))
    _warn_inverted(spaces)
    return Reference(kind, tuple(spaces), e_singles, nalpha, nbeta, xc)


def _warn_inverted(spaces) -> None:
    """A WARNING where an active occupied orbital lies at or above an active virtual one of the
    same spin (a non-aufbau or excited determinant): some MP2 denominators are then zero or
    negative."""
    for k, sp in enumerate(spaces):
        if sp.nocc and sp.nvir and sp.eps_occ.max() >= sp.eps_vir.min():
            spin = "" if len(spaces) == 1 else ("alpha " if k == 0 else "beta ")
            log.warning("the highest %soccupied orbital (%.6f Eh) lies above the lowest virtual "
                        "one (%.6f Eh): some MP2 denominators are zero or negative, and E(corr) "
                        "of such a (non-aufbau or excited) determinant may mean nothing", spin,
                        sp.eps_occ.max(), sp.eps_vir.min())


def spin_contamination(mf) -> tuple[float, float] | None:
    """(<S^2>, <S^2> - S(S+1)) of an unrestricted reference, None for restricted ones (their
    <S^2> is exact). For UKS this is the value of the KS determinant."""
    if not isinstance(mf, pyscf_scf.uhf.UHF):
        return None
    s2, _mult = mf.spin_square()
    nelec = own_attribute(mf, "nelec", None)  # the SCF's own, where set (a tuple or an array)
    nalpha, nbeta = mf.mol.nelec if nelec is None else nelec
    s = (nalpha - nbeta) / 2
    return float(s2), float(s2 - s * (s + 1))
