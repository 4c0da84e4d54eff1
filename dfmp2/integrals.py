"""The auxiliary basis: which RI basis a run uses, per element, and its PySCF ``Mole``.

The metric, its factor and int3c2e streaming are in :mod:`dfmp2.df`.
"""

from __future__ import annotations

import inspect
import logging

from pyscf import df, gto
from pyscf.lib.exceptions import BasisNotFoundError

from .errors import InputError
from .molecule import (
    basis_entry,
    basis_record,
    check_basis_files,
    check_every_atom_has_functions,
    describe_shells,
    element_of,
    first_line,
    ghost_basis,
    is_ghost_label,
    quiet_pyscf,
)

log = logging.getLogger(__name__)

__all__ = [
    "auxbasis_record",
    "make_auxmol",
    "resolve_auxbasis",
]


#: Fitting sets to suggest when PySCF has no partner for the orbital basis or cannot build the
#: one named, in order: MP2-fit (RI) sets, then def2-universal-jkfit; for a DF-SCF's JK fit
#: (:func:`make_auxmol` with ``jk=True``) JK-fit sets. Only those that cover every element of
#: the molecule are named (:func:`_aux_advice`).
_AUX_SUGGESTIONS = {False: ("cc-pvtz-ri", "def2-tzvpp-ri", "def2-universal-jkfit"),
                    True: ("cc-pvtz-jkfit", "def2-universal-jkfit")}
_AUX_ERRORS = (BasisNotFoundError, KeyError, RuntimeError, ValueError, TypeError, IndexError,
               AttributeError, AssertionError, UserWarning)  # UserWarning: python -W error


def _aux_advice(mol, jk: bool) -> str:
    """What to do when no fitting basis could be made for ``mol``: the option to set and the
    sets of :data:`_AUX_SUGGESTIONS` that PySCF's library has for every element of it."""
    flag = "--scf-auxbasis (Python: scf_auxbasis=)" if jk else "--auxbasis (Python: auxbasis=)"
    elements = sorted({element_of(atom[0]) for atom in mol._atom} - {"X"})

    def covers(name: str) -> bool:
        try:
            with quiet_pyscf():
                return all(gto.basis.load(name, element) for element in elements)
        except _AUX_ERRORS:
            return False

    fits = [name for name in _AUX_SUGGESTIONS[jk] if covers(name)]
    if fits:
        return f"choose one with {flag}, e.g. {' or '.join(fits)}"
    return (f"choose one with {flag} that has {', '.join(elements)} (none of "
            f"{', '.join(_AUX_SUGGESTIONS[jk])} has them all), or a dict per element")


def _quiet_copy(mol):
    """A shallow copy of ``mol`` that logs nothing (PySCF writes its logs to ``mol.stdout``)."""
    quiet = mol.copy(deep=False)
    quiet.verbose = 0
    return quiet


def resolve_auxbasis(mol, auxbasis=None):
    """The auxiliary basis input handed to PySCF: ``auxbasis`` itself, or, when None, PySCF's
    MP2-fit partner of the orbital basis per atom label (``df.make_auxbasis(mol, mp2fit=True)``:
    a name, or even-tempered shells for elements the named RI set lacks)."""
    if auxbasis is not None:
        return ghost_basis(auxbasis, [a[0] for a in mol._atom])
    try:
        return default_auxbasis(mol, mp2fit=True)
    except _AUX_ERRORS as exc:
        raise InputError(
            f"no default RI auxiliary basis for basis {_basis_text(mol)} "
            f"(PySCF: {type(exc).__name__}: {first_line(exc)}); {_aux_advice(mol, jk=False)}"
        ) from None


def default_auxbasis(mol, mp2fit: bool):
    """PySCF's fitting partner of mol's orbital basis (``df.make_auxbasis``: the MP2-fit or the
    JK-fit set), with a ghost atom's generated even-tempered set made as the real element's.
    PySCF generates those shells from the nuclear charge, which is zero for a ghost: ghost I in
    def2-SVP got 12 s shells where I has 50 of s to i, so a counterpoise fragment was not fitted
    in the complex's fitting basis (E(int) 2e-6 Eh off)."""
    with quiet_pyscf():
        try:
            spec = df.make_auxbasis(_quiet_copy(mol), mp2fit=mp2fit)
        except KeyError:  # a Pople name PySCF cannot look up as one name (6-311G**: its
            # '6311gststrifit'): the per-element lookup, which maps it by its family (6-311G
            # -> cc-pVTZ-RI), as for a basis dict and for ghosts below
            per_label = _quiet_copy(mol)
            per_label.basis = {label: mol.basis for label in {a[0] for a in mol._atom}}
            spec = df.make_auxbasis(per_label, mp2fit=mp2fit)
    if not isinstance(spec, dict):
        return spec
    real: dict[str, object] = {}
    for label in [a[0] for a in mol._atom]:
        if label in spec and not isinstance(spec[label], str) and is_ghost_label(label):
            element = element_of(label)
            if element not in real:
                atom = gto.Mole()  # the element alone, real, in the ghost's basis and ECP
                atom.atom = [(element, (0.0, 0.0, 0.0))]
                atom.basis = {element: basis_entry(mol.basis, label)}
                ecp = basis_entry(mol.ecp, element) if isinstance(mol.ecp, dict) else None
                atom.ecp = {element: ecp} if ecp else {}
                atom.spin, atom.verbose = None, 0
                with quiet_pyscf():
                    atom.build(dump_input=False, parse_arg=False)
                    real[element] = df.make_auxbasis(atom, mp2fit=mp2fit)[element]
            spec = {**spec, label: real[element]}
    return spec


def _basis_text(mol) -> str:
    names = sorted(set(basis_record(mol).values()))
    return repr(names[0]) if len(names) == 1 else "(" + "; ".join(names) + ")"


def _etb_description() -> str:
    """How PySCF's ``aug_etb`` fills elements a named RI set lacks, with the beta it uses."""
    beta = inspect.signature(df.addons.aug_etb).parameters["beta"].default
    return f"even-tempered (PySCF aug_etb, beta={beta})"


def auxbasis_record(mol, auxbasis=None) -> dict[str, str]:
    """The MP2 auxiliary basis per element as :func:`make_auxmol` resolves it (ghost atoms under
    their element): a name, ``'even-tempered (PySCF aug_etb, beta=2.0)'`` where PySCF's default
    generated the functions, or ``'user-given data [..]'`` for explicit shells."""
    spec = resolve_auxbasis(mol, auxbasis)
    names: dict[str, list[str]] = {}
    for label in sorted({a[0] for a in mol._atom}):
        value = basis_entry(spec, label)
        if isinstance(value, str):
            name = value
        elif auxbasis is None:
            name = _etb_description()
        else:
            name = describe_shells(value)
        entry = names.setdefault(element_of(label), [])
        if name not in entry:
            entry.append(name)
    return {element: ", ".join(entry) for element, entry in sorted(names.items())}


def make_auxmol(mol, auxbasis=None, jk: bool = False):
    """The auxiliary molecule of the MP2 fit: ``auxbasis`` (a name, or a dict per element) or,
    when None, PySCF's MP2-fit partner of mol's basis (:func:`auxbasis_record` says which).
    Every PySCF failure becomes one :class:`InputError` line naming ``--auxbasis``; with ``jk``
    the molecule is that of a DF-SCF's JK fit, ``auxbasis`` given (its default is
    :func:`dfmp2.scf.jk_auxbasis`), and the line names ``--scf-auxbasis``."""
    spec = resolve_auxbasis(mol, auxbasis)
    what = "SCF fitting basis" if jk else "auxiliary basis"
    check_basis_files(spec, [atom[0] for atom in mol._atom], what)
    try:
        with quiet_pyscf():
            auxmol = df.addons.make_auxmol(_quiet_copy(mol), spec)
    except BasisNotFoundError as exc:
        raise InputError(
            f"{what} {_aux_text(auxbasis, spec)}: {first_line(exc)}; {_aux_advice(mol, jk)}"
        ) from None
    except _AUX_ERRORS as exc:
        raise InputError(
            f"{what} {_aux_text(auxbasis, spec)} could not be built (PySCF: "
            f"{type(exc).__name__}: {first_line(exc)}); {_aux_advice(mol, jk)}"
        ) from None
    check_every_atom_has_functions(
        auxmol, f"the {what} {_aux_text(auxbasis, spec)}",
        f"give an {what} for every element (a name, or a dict with every element)")
    if not jk:
        _warn_short_fit(mol, auxmol, spec)
    auxmol.verbose = mol.verbose
    return auxmol


def _max_l(mol) -> dict[str, int]:
    """The highest angular momentum of ``mol``'s functions per atom label."""
    out: dict[str, int] = {}
    for shell in range(mol.nbas):
        label = mol.atom_symbol(mol.bas_atom(shell))
        out[label] = max(out.get(label, 0), int(mol.bas_angular(shell)))
    return out


def _warn_short_fit(mol, auxmol, spec) -> None:
    """A WARNING where a named MP2 fitting set stops at the orbital basis's own highest angular
    momentum on an element: RI sets are made to reach at least one above it (cc-pVXZ-RI,
    def2-XVPP-RI, ...), and one that does not fits the products of those functions poorly.
    PySCF's table gives every Pople set cc-pVDZ-RI: water in 6-31G(2df,p) with it is 1.3e-3
    Eh from exact MP2 (cc-pVTZ-RI: 2e-5). Sets PySCF generates (even-tempered) are left be."""
    orbital, fitted = _max_l(mol), _max_l(auxmol)
    short = sorted({(element_of(label), orbital[label], fitted.get(label, -1))
                    for label in orbital
                    if isinstance(basis_entry(spec, label), str)
                    and fitted.get(label, -1) <= orbital[label]})
    if short:
        letters = "spdfghik"
        where = ", ".join(f"{el} (orbital basis to {letters[lo]}, fitting set to "
                          f"{letters[la] if la >= 0 else 'nothing'})" for el, lo, la in short)
        log.warning("the MP2 fitting set reaches no higher angular momentum than the orbital "
                    "basis on %s: it fits products of those functions poorly (water in "
                    "6-31G(2df,p) with cc-pVDZ-RI: E(corr) 1.3e-3 Eh off); give --auxbasis "
                    "(Python: auxbasis=) a set made for them, e.g. cc-pvtz-ri", where)


def _aux_text(auxbasis, spec) -> str:
    if auxbasis is None:
        names = sorted({v for v in spec.values() if isinstance(v, str)})
        return f"{', '.join(names) or 'generated'} (PySCF's default for the orbital basis)"
    return repr(auxbasis)


