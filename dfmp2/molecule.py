"""Geometry input -> a built PySCF ``Mole``, with every input problem named precisely.

Accepted geometry: a path to an xyz file, an atom string (Cartesian, or a Z-matrix), in Angstrom
or in Bohr (``unit``), or a ``pyscf.gto.Mole`` (in its own ``unit``); the spellings accepted are
listed in :mod:`dfmp2.geometry`. Effective core potentials (ECPs) are attached where PySCF's
library has one for the chosen basis, as ORCA and Psi4 do. The ``*_record`` functions describe
the built molecule for the result metadata.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import warnings

import numpy as np
from pyscf import gto
from pyscf.data import radii
from pyscf.data.elements import ELEMENTS
from pyscf.lib import param
from pyscf.lib.exceptions import BasisNotFoundError

from ._quiet import quiet
from .errors import InputError
from .geometry import (
    GHOST_PREFIX,
    Geometry,
    parse_geometry,
    read_xyz,
    stated_charge_multiplicity,
)
from .options import checked_choice

log = logging.getLogger(__name__)

__all__ = [
    "check_every_atom_has_functions",
    "DEFAULT_BASIS",
    "MIN_DISTANCE",
    "Geometry",
    "basis_record",
    "build_mole",
    "describe_shells",
    "basis_entry",
    "check_basis_files",
    "ecp_record",
    "element_of",
    "first_line",
    "ghost_basis",
    "is_ghost_label",
    "molecule_record",
    "parse_geometry",
    "quiet_pyscf",
    "read_xyz",
    "unit_name",
]

#: The orbital basis of an xyz path or atom string when none is given.
DEFAULT_BASIS = "cc-pvdz"
#: Atoms closer than this (Angstrom, whatever the input's unit) are refused: a duplicated line or
#: a unit mix-up, never a molecule (the shortest bond, H2, is 0.74 A).
MIN_DISTANCE = 0.1
#: Coordinates beyond this (Angstrom, whatever the input's unit) are refused: a unit mix-up or a
#: corrupted file, never a molecule (integrals and the distance search overflow long before
#: float64 does).
MAX_COORDINATE = 1e5


def first_line(exc: Exception) -> str:
    """The first non-empty line of an exception's message (PySCF's span several lines)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


@contextlib.contextmanager
def quiet_pyscf():
    """Keep PySCF's advice (install basis-set-exchange, ETB recipes printed to stdout, 'ECP not
    found' on stderr, its warnings) off the terminal while we turn its errors into ours; logged
    at DEBUG. This thread's output only (:mod:`dfmp2._quiet`). Where warnings are errors
    (``python -W error``), PySCF's basis-set-exchange advice would arrive as an exception, also
    on paths where PySCF goes on after it (an RI set lacking an element, generated instead):
    there its advice alone is ignored for the time inside, by the process-wide filter list
    (not thread-safe, which a process that turns warnings into errors accepts)."""
    with quiet() as captured, (_advice_ignored() if _advice_is_an_error()
                               else contextlib.nullcontext()):
        start = captured.tell()
        try:
            yield
        finally:
            said = captured.getvalue()[start:]
            if said.strip():
                log.debug("PySCF said: %s", " ".join(said.split()))


def _advice_is_an_error() -> bool:
    """Whether the filters turn PySCF's advice (a UserWarning) into an exception: the first
    filter that matches it decides, as in ``warnings`` (its module aside)."""
    text = "Basis may be available in basis-set-exchange"
    for action, message, category, _module, _line in warnings.filters:
        if (message is None or message.match(text)) and issubclass(UserWarning, category):
            return action == "error"
    return False


@contextlib.contextmanager
def _advice_ignored():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_PYSCF_ADVICE)
        yield


#: PySCF's advice to install basis-set-exchange, warned before the error it announces or the
#: fallback it takes.
_PYSCF_ADVICE = r"(Basis|ECP) may be available in basis-set-exchange"


def unghosted(label: str) -> str:
    """The real atom's label of a ghost's (``GHOST-O1`` -> ``O1``, ``X-H`` -> ``H``)."""
    return re.sub(r"^(GHOST-?|X-)", "", label, flags=re.IGNORECASE)


def element_of(label: str) -> str:
    """The element symbol of a PySCF atom label (``'GHOST-O'``, ``'X-O'``, ``'O1'`` -> ``'O'``)."""
    label = unghosted(label)
    match = re.match(r"[A-Za-z]+", label)
    symbol = match.group(0) if match else label
    return symbol[:1].upper() + symbol[1:].lower()


def _is_ghost(mol, atom: int) -> bool:
    return mol.atom_charge(atom) == 0 and mol.atom_nelec_core(atom) == 0


# ---------------------------------------------------------------- basis names and ECPs


def _label_spec(spec, label: str):
    """What PySCF uses for atom ``label`` from a basis or ECP input (a name, a dict with an optional
    'default', or explicit data), the way ``Mole.build`` resolves it; None if nothing."""
    if not isinstance(spec, dict):
        return spec
    for key in (label, re.sub(r"\d", "", label)):
        if key in spec:
            return spec[key]
    return spec.get("default")


def describe_shells(shells) -> str:
    """Explicit basis data in contracted notation, e.g. ``'user-given data [3s2p1d]'``."""
    counts: dict[int, int] = {}
    for shell in shells:
        primitives = shell[2:] if isinstance(shell[1], (int, np.integer)) else shell[1:]
        counts[shell[0]] = counts.get(shell[0], 0) + len(primitives[0]) - 1
    letters = "spdfghiklmnoqrtuvwxyz"
    shells_text = "".join(f"{n}{letters[ang]}" for ang, n in sorted(counts.items()))
    return f"user-given data [{shells_text}]"


def _load_ecp(name: str, element: str) -> list:
    """PySCF's ECP ``name`` for ``element`` (``[n_core, terms]``), ``[]`` when the name has none
    for it; an unknown name raises :class:`InputError`."""
    try:
        with quiet_pyscf():
            return gto.basis.load_ecp(name, element) or []
    except (BasisNotFoundError, RuntimeError, KeyError, ValueError, TypeError, OSError,
            UserWarning) as exc:  # UserWarning: python -W error, PySCF's advice before its error
        # TypeError: names PySCF maps to two library files (aug-cc-pVXZ-PP) it cannot read
        raise InputError(
            f"unknown ECP {name!r} (PySCF: {first_line(exc)}); give an ECP name from PySCF's "
            "library (def2-svp, lanl2dz, cc-pvdz-pp, ...) or ecp='none' for all electrons"
        ) from None


def _ecp_source(name: str) -> str:
    """The name under which PySCF's library keeps the ECP a basis name is made for: the name
    itself (def2-svp, lanl2dz, cc-pvdz-pp), without PySCF's ``unc-`` prefix (the uncontracted
    basis keeps its ECP); for a basis PySCF reads from two files (aug-cc-pVXZ-PP: cc-pVXZ-PP's
    file, then the diffuse functions) the first file's name, which holds the ECP; for a ccECP
    basis (ccecp-cc-pvdz, ccecp-aug-cc-pvtz, ...) its ccECP."""
    from pyscf.gto.basis import ALIAS

    stripped = re.sub(r"^unc-", "", name.strip(), flags=re.IGNORECASE)
    key = stripped.lower().replace("-", "").replace("_", "")
    files = ALIAS.get(key)
    if isinstance(files, tuple):  # the first file's name as PySCF spells it: cc-pvdz-pp
        first = os.path.splitext(os.path.basename(files[0]))[0]
        return first if first.lower().replace("-", "").replace("_", "") in ALIAS else stripped
    ccecp = re.match(r"(ccecp[a-z0-9]*?)(?:aug)?ccpv[a-z0-9]*z$", key)
    if ccecp and ccecp.group(1) in ALIAS:
        return ccecp.group(1)
    return stripped


def _library_ecps(basis, elements) -> dict[str, tuple[str, int]]:
    """Element -> (ECP name, core electrons) for the elements whose basis name has an ECP in
    PySCF's library (def2-* beyond Kr, lanl2dz, cc-pVXZ-PP and aug-cc-pVXZ-PP, ccECP bases,
    their ``unc-`` forms, ...: :func:`_ecp_source`)."""
    table = {}
    for element in elements:
        name = _label_spec(basis, element)
        if not isinstance(name, str):
            continue
        source = _ecp_source(name)
        try:
            data = _load_ecp(source, element)
        except InputError:  # not an ECP name at all: the basis itself is checked by the build
            continue
        if data:
            table[element] = (source, int(data[0]))
    return table


def _ecp_table(basis, ecp, elements) -> dict[str, tuple[str, int]]:
    """The ECPs to attach: ``ecp`` None = PySCF's library ECPs of the basis, ``'none'`` = all
    electrons, a name = that ECP for every element it has a potential for."""
    if ecp is None:
        return _library_ecps(basis, elements)
    if not isinstance(ecp, str) or not ecp.strip():
        raise InputError(f"ecp must be an ECP name or 'none', got {ecp!r}")
    if ecp.strip().lower() == "none":
        made_for = _library_ecps(basis, elements)
        if made_for:
            names = sorted({name for name, _ in made_for.values()})
            log.warning("ecp='none': the %s atoms run all-electron in %s, a basis made for "
                        "PySCF's %s ECP (its core electrons have no basis functions of their "
                        "own), so the energies mean little; for all electrons choose an "
                        "all-electron basis for them", ", ".join(made_for), ", ".join(names),
                        ", ".join(names))
        return {}
    table = {}
    for element in elements:
        data = _load_ecp(ecp, element)
        if data:
            table[element] = (ecp, int(data[0]))
    if not table:
        raise InputError(
            f"ECP {ecp!r} has no potential for any element of the molecule "
            f"({', '.join(sorted(elements))}); choose another ECP or ecp='none'"
        )
    return table


def ecp_record(mol) -> dict[str, dict]:
    """Per element that carries an ECP: ``{"name": <ECP name>, "core_electrons": n}``; ``{}``
    when the molecule is all-electron. Ghost atoms carry no ECP. Atoms of one element with
    different ECPs (labels I1 and I2 of a Mole) are recorded under their labels."""
    by_label: dict[str, dict] = {}
    bare: dict[str, dict] = {}  # real atoms without an ECP, kept if their element has one
    for atom in range(mol.natm):
        label = mol._atom[atom][0]
        if label not in mol._ecp and re.sub(r"\d", "", label) not in mol._ecp:
            if not _is_ghost(mol, atom):
                bare[label] = {"name": "none (all electrons)", "core_electrons": 0}
            continue
        spec = _label_spec(mol.ecp, label)
        name = spec if isinstance(spec, str) else "user-given ECP data"
        by_label[label] = {"name": name, "core_electrons": int(mol.atom_nelec_core(atom))}
    with_ecp = {element_of(label) for label in by_label}
    by_label.update({k: e for k, e in bare.items() if element_of(k) in with_ecp})
    record: dict[str, dict] = {}
    for label, entry in by_label.items():
        alike = [e for k, e in by_label.items() if element_of(k) == element_of(label)]
        record[element_of(label) if all(e == entry for e in alike) else label] = entry
    return record


def basis_record(mol) -> dict[str, str]:
    """The orbital basis per element as the run resolved it (ghost atoms under their element):
    a library name, or ``'user-given data [3s2p1d]'`` for explicit shells."""
    names: dict[str, list[str]] = {}
    for label, shells in sorted(mol._basis.items()):
        spec = _label_spec(mol.basis, label)
        name = spec if isinstance(spec, str) else describe_shells(shells)
        entry = names.setdefault(element_of(label), [])
        if name not in entry:
            entry.append(name)
    return {element: ", ".join(entry) for element, entry in sorted(names.items())}


def molecule_record(mol, multiplicity: int | None = None) -> dict:
    """The QCSchema molecule: symbols (no ghost prefix), geometry (flat, Bohr), real (False for
    ghost atoms), molecular_charge, molecular_multiplicity (``multiplicity`` when given: the
    SCF's own, which ``mf.nelec`` can set apart from the molecule's 2S + 1);
    ``qcelemental.models.Molecule(**r)`` accepts it."""
    return {
        "symbols": [element_of(mol.atom_symbol(k)) for k in range(mol.natm)],
        "geometry": mol.atom_coords(unit="Bohr").ravel().tolist(),
        "real": [not _is_ghost(mol, k) for k in range(mol.natm)],
        "molecular_charge": float(mol.charge),
        "molecular_multiplicity": int(mol.spin) + 1 if multiplicity is None else multiplicity,
    }


# ---------------------------------------------------------------- checks


def unit_name(unit) -> str | None:
    """The unit PySCF reads coordinates in for a ``Mole.unit`` of ``unit``, as
    :data:`dfmp2._names.UNITS` names it: 'bohr' for PySCF's atomic-unit names (B, Bohr, AU,
    any case), 'angstrom' for any other name (as PySCF reads it); for a number (the Bohr
    radius in the coordinates' unit) 'bohr' at 1, 'angstrom' at PySCF's Bohr radius in
    Angstrom, None otherwise."""
    if isinstance(unit, str):
        return "bohr" if gto.mole.is_au(unit) else "angstrom"
    for name, bohr_radius in (("bohr", 1.0), ("angstrom", param.BOHR)):
        if isinstance(unit, (int, float, np.floating)) and math.isclose(unit, bohr_radius):
            return name
    return None


#: Unit names as messages write them, and the length of one unit in Angstrom (PySCF's Bohr).
_UNIT_TEXT = {"angstrom": ("Å", "Angstrom", 1.0), "bohr": ("Bohr", "Bohr", param.BOHR)}


def _length(value: float, unit: str, spec: str = ".4f") -> str:
    """A length given in ``unit`` as a message writes it: ``0.0500 Å``, or in Bohr with its
    Angstrom beside it, ``0.0945 Bohr = 0.0500 Å``."""
    symbol, _name, angstrom = _UNIT_TEXT[unit]
    text = f"{value:{spec}} {symbol}"
    return text if unit == "angstrom" else f"{text} = {value * angstrom:{spec}} Å"


def _check_coordinates(labels, coords, source: str, unit: str = "angstrom") -> None:
    """Finite coordinates, none beyond MAX_COORDINATE and no two atoms (ghosts included)
    closer than MIN_DISTANCE; ``coords`` in ``unit`` ('angstrom' or 'bohr'), in which the
    messages give the lengths (Angstrom beside Bohr)."""
    from scipy.spatial import cKDTree

    _symbol, name, to_angstrom = _UNIT_TEXT[unit]
    coords = np.asarray(coords, dtype=float).reshape(-1, 3)
    bad = np.argwhere(~np.isfinite(coords))
    if bad.size:
        atom, axis = bad[0]
        raise InputError(
            f"{source}: atom {atom + 1} ({labels[atom]}) has the non-finite coordinate "
            f"{'xyz'[axis]} = {coords[atom, axis]}; give its position in {name}"
        )
    far = np.argwhere(np.abs(coords) * to_angstrom > MAX_COORDINATE)
    if far.size:
        atom, axis = far[0]
        raise InputError(
            f"{source}: atom {atom + 1} ({labels[atom]}) has the coordinate "
            f"{'xyz'[axis]} = {_length(coords[atom, axis], unit, 'g')}, beyond "
            f"{MAX_COORDINATE:g} Å; give its position in {name}"
        )
    pairs = cKDTree(coords).query_pairs(MIN_DISTANCE / to_angstrom, output_type="ndarray")
    if not len(pairs):
        return
    distances = np.linalg.norm(coords[pairs[:, 0]] - coords[pairs[:, 1]], axis=1)
    i, j = sorted(pairs[int(np.argmin(distances))])
    d = float(distances.min())
    how = ("coincide" if d < 1e-8 else
           f"are closer than {_length(MIN_DISTANCE / to_angstrom, unit, '.4g')}")
    raise InputError(
        f"{source}: atoms {i + 1} ({labels[i]}) and {j + 1} ({labels[j]}) {how} "
        f"({_length(d, unit)} apart); remove the duplicate or fix the coordinates ({name})"
    )


#: Two atoms closer than this fraction of their covalent bond length (the sum of PySCF's
#: covalent radii) are a geometry squeezed by a unit mix-up (Angstrom read as Bohr: bonds at
#: 0.53 of their length; H2's at 0.63 of H-H's), not a molecule: a warning. The shortest
#: bonds between elements up to Ar are above it (N2 0.77, C2H2's triple bond 0.82).
SQUEEZED_BOND = 0.7
#: The same for a pair with a heavier element, whose covalent radii are those of single bonds:
#: Cr2's sextuple bond (1.68 A) is at 0.60 of its Cr-Cr length, a Cr-Cr quintuple bond at
#: 0.66; squeezed Fe(CO)5's Fe-C at 0.47, XeF2's Xe-F at 0.53.
SQUEEZED_HEAVY_BOND = 0.55
#: Bohr read as Angstrom stretches every bond 1.89 times: a geometry of three or more atoms
#: (noble gases aside: their covalent radii say nothing of their clusters) whose atoms'
#: nearest neighbours sit at a median of this range of multiples of their covalent bond
#: length, none nearer than :data:`STRETCHED_NEAREST`, is warned about (water in Bohr: 1.87
#: for every atom; CH4 1.98, NH3 1.87, HCN 1.94, formaldehyde 1.98). A bond scan that
#: stretches one bond keeps the others near 1; a symmetric stretch of every bond of a small
#: molecule (water's O-H at 1.75-1.99 A) cannot be told from Bohr and is warned about too,
#: which the message says.
STRETCHED_MEDIAN = (1.8, 2.05)
STRETCHED_NEAREST = 1.4
_NOBLE = frozenset({2, 10, 18, 36, 54, 86, 118})


def _warn_unit_mixup(mol, source: str, unit: str) -> None:
    """A warning where the real atoms' distances look like coordinates in the other unit
    (:data:`SQUEEZED_BOND`, :data:`SQUEEZED_HEAVY_BOND`, :data:`STRETCHED_MEDIAN`); ghost atoms
    are left out. For geometries read from text (a given Mole states its own unit)."""
    from scipy.spatial import cKDTree

    charges = np.array([gto.charge(mol.atom_pure_symbol(i)) for i in range(mol.natm)])
    real = [i for i in range(mol.natm) if not is_ghost_label(mol.atom_symbol(i))
            and mol.atom_charge(i) > 0]
    if len(real) < 2:
        return
    coords = mol.atom_coords()[real]  # Bohr
    z = charges[real]
    covalent = radii.COVALENT[z]
    _symbol, name, to_angstrom = _UNIT_TEXT[unit]
    to_unit = param.BOHR / to_angstrom  # Bohr -> the input's unit

    def length(bohr: float) -> str:
        return _length(bohr * to_unit, unit, ".3f")

    tree = cKDTree(coords)
    pairs = tree.sparse_distance_matrix(tree, SQUEEZED_BOND * 2 * float(covalent.max()),
                                        output_type="ndarray")
    pairs = pairs[pairs["i"] < pairs["j"]]
    if len(pairs):
        bonds = covalent[pairs["i"]] + covalent[pairs["j"]]
        light = (z[pairs["i"]] <= 18) & (z[pairs["j"]] <= 18)
        limit = np.where(light, SQUEEZED_BOND, SQUEEZED_HEAVY_BOND)
        squeezed = pairs["v"] / bonds / limit
        k = int(np.argmin(squeezed))
        if squeezed[k] < 1:
            i, j = real[pairs["i"][k]], real[pairs["j"][k]]
            log.warning("%s: atoms %d (%s) and %d (%s) are %s apart, less than %g of their "
                        "covalent bond length (%s): are the coordinates in another unit than "
                        "%s? (--unit, unit=)", source, i + 1, mol.atom_symbol(i), j + 1,
                        mol.atom_symbol(j), length(pairs["v"][k]), limit[k],
                        length(bonds[k]), name)
            return
    keep = ~np.isin(z, list(_NOBLE))
    if keep.sum() < 3 or unit != "angstrom":
        return
    # each atom's nearest neighbour, in multiples of their covalent bond length
    tree = cKDTree(coords[keep])
    distances, index = tree.query(coords[keep], k=2)
    nearest = distances[:, 1] / (covalent[keep] + covalent[keep][index[:, 1]])
    low, high = STRETCHED_MEDIAN
    if low <= np.median(nearest) <= high and nearest.min() >= STRETCHED_NEAREST:
        log.warning("%s: every atom's nearest neighbour is %.2f to %.2f times their covalent "
                    "bond length away (median %.2f), as if the coordinates were in Bohr: if "
                    "they are, give --unit bohr (unit='bohr'); a geometry stretched on "
                    "purpose is right as it is", source, nearest.min(), nearest.max(),
                    np.median(nearest))


def _check_electrons(nelectron: int, spin: int, charge: int, source: str) -> None:
    if nelectron <= 0:
        raise InputError(
            f"{source}: charge {charge:+d} leaves {nelectron} electrons; nothing to correlate"
        )
    if spin < 0:
        raise InputError(f"spin (2S) must be >= 0, got {spin}")
    if (nelectron - spin) % 2:
        parity = ("an odd count needs an odd 2S: --spin 1 (a doublet), 3, ..." if nelectron % 2
                  else "an even count needs an even 2S: --spin 0 (a singlet), 2, ...")
        raise InputError(
            f"{source}: {nelectron} electrons cannot have 2S = {spin} "
            f"(charge {charge:+d}); {parity}, or change --charge"
        )
    if spin > nelectron:
        raise InputError(f"{source}: 2S = {spin} exceeds the {nelectron} electrons")


def _check_capacity(mol, source: str) -> None:
    nalpha = (mol.nelectron + mol.spin) // 2
    nao = mol.nao_nr()
    if nalpha > nao:
        names = ", ".join(f"{e}: {b}" for e, b in basis_record(mol).items())
        raise InputError(
            f"{source}: {mol.nelectron} electrons ({nalpha} alpha, charge {mol.charge:+d}) do not "
            f"fit in the {nao} basis functions of basis {names}; choose a larger basis or "
            "check --charge"
        )


def check_every_atom_has_functions(mol, what: str, advice: str) -> None:
    """Every atom of ``mol`` (ghost atoms too) carries shells of ``what`` (the orbital or an
    auxiliary basis); PySCF only warns when a basis dict leaves an element out, and the run
    would then treat that atom as a bare nucleus (or leave it unfitted)."""
    covered = set(mol._bas[:, gto.ATOM_OF].tolist())
    missing = sorted({mol.atom_symbol(k) for k in range(mol.natm) if k not in covered})
    if missing:
        raise InputError(f"{what} has no functions for {', '.join(missing)}; {advice}")


def _check_built(mol, charge: int, spin: int, source: str) -> gto.Mole:
    """Electron count (ECPs and ghosts excluded by PySCF), 2S, basis capacity, geometry, every
    atom with basis functions."""
    check_every_atom_has_functions(
        mol, f"{source}: the basis", "give a basis (or a basis dict entry) for every element")
    labels = [mol.atom_symbol(k) for k in range(mol.natm)]
    # atoms on top of each other first: a duplicated atom is also why an electron count is off;
    # lengths in the Mole's unit (Angstrom where it is neither)
    unit = unit_name(mol.unit) or "angstrom"
    _check_coordinates(labels, mol.atom_coords(unit=_UNIT_TEXT[unit][1]), source, unit)
    _check_electrons(mol.nelectron, spin, charge, source)
    mol.spin = spin
    _check_capacity(mol, source)
    return mol


# ---------------------------------------------------------------- building


def _basis_problem(exc: Exception, basis) -> str:
    text = first_line(exc)
    missing = re.match(r"Basis set not found for (\S+) in (.+)$", text)
    if missing:
        element, name = missing.groups()
        if isinstance(basis, str) and basis.strip().lower().endswith(name.strip().lower()):
            name = basis.strip()  # PySCF names unc-cc-pvdz '-cc-pvdz'
        return f"has no functions for element {element} in {name}"
    if text.startswith("Basis set not found for"):
        return text.replace("Basis set not found for", "has no functions for element")
    return (f"not in PySCF's basis library (PySCF: {text}); check the spelling (e.g. cc-pvdz, "
            "def2-svp), or give a set PySCF lacks (cc-pV6Z, d-aug-, jun-cc-pVXZ, ...) as a "
            "file path in NWChem format, e.g. from basissetexchange.org")


def _build(mol, basis, source: str) -> gto.Mole:
    """``mol.build()`` quietly, spin inferred (the caller checks it); PySCF errors -> InputError."""
    try:
        labels = [a[0] for a in gto.format_atom(mol.atom, unit=1)]
    except Exception:  # noqa: BLE001 - a malformed geometry: the build below names it
        labels = []
    check_basis_files(mol.basis, labels, "basis")
    verbose, mol.verbose, mol.spin = mol.verbose, 0, None
    if not mol.ecp:  # Mole.build keeps a copied Mole's old ECP when the new one is empty
        mol._ecp, mol._ecpbas = {}, np.zeros((0, gto.BAS_SLOTS), dtype=np.int32)
    try:
        with quiet_pyscf():
            mol.build(dump_input=False, parse_arg=False)
    except BasisNotFoundError as exc:
        raise InputError(f"basis {basis!r}: {_basis_problem(exc, basis)}") from None
    except UserWarning as exc:  # python -W error: PySCF's advice before its BasisNotFoundError
        raise InputError(f"basis {basis!r}: {_basis_problem(exc, basis)}") from None
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError, AssertionError,
            SyntaxError) as exc:  # PySCF asserts on some basis names and evals basis numbers
        raise InputError(
            f"{source}: PySCF could not build the molecule: {type(exc).__name__}: "
            f"{first_line(exc) or 'no message'}"
        ) from None
    mol.verbose = verbose
    return mol


def ghost_basis(basis, labels):
    """A per-element basis dict (orbital or auxiliary) also covers the element's ghost atoms: PySCF
    looks a ghost up by its own label (``GHOST-O``) and would give it the 'default' entry. A
    ghost of a labelled atom (``GHOST-O1``) gets that atom's entry (``O1``), then its
    element's."""
    if not isinstance(basis, dict):
        return basis
    extra = {}
    for label in labels:
        if label in basis:
            continue
        real = unghosted(label)
        for key in (real, element_of(label)):
            if key in basis:
                extra[label] = basis[key]
                break
    return {**basis, **extra}


def basis_entry(basis, label: str):
    """The basis entry PySCF gives the atom ``label``: the name, or its dict entry (by label,
    element or 'default')."""
    if not isinstance(basis, dict):
        return basis
    for key in (label, element_of(label), "default"):
        if key in basis:
            return basis[key]
    return None


def check_basis_files(basis, labels, what: str) -> None:
    """Every atom whose basis entry is a file path (PySCF's ``unc`` prefix and ``@`` contraction
    suffix aside) gets its own element's functions from it. PySCF reads an element's block
    from the element's line to the next ``#BASIS SET`` line (NWChem's or CP2K's format), and
    where it finds none, the whole file: right for a file of one element, wrong for a file of
    several, whose functions then all go to the element (water ran 2 Eh off with a file of H
    and C functions, and carbon got hydrogen's s shell from a CP2K file without those lines).
    So the lines PySCF takes must name no other element."""
    checked = set()
    for label in labels:
        element, path = element_of(label), _basis_file(basis_entry(basis, label))
        if path is None or (path, element) in checked:
            continue
        checked.add((path, element))
        try:
            with quiet_pyscf():
                gto.basis.load(path, element)  # what the build will do with it
            with open(path, errors="replace") as handle:
                text = handle.read()
        except Exception as exc:  # noqa: BLE001 - PySCF's readers evaluate the numbers
            raise InputError(f"{what} file {path!r}: PySCF could not read the {element} "
                             f"functions in it ({type(exc).__name__}: {first_line(exc)})"
                             ) from None
        block = _found_block(path, element)
        taken = block if block is not None else text.splitlines()
        others = sorted({line.split()[0].capitalize() for line in taken if _labelled(line)}
                        - {element})
        if others and block is not None:
            raise InputError(
                f"{what} file {path!r}: the block PySCF finds for {element} runs on into the "
                f"functions of {', '.join(others)} (no '#BASIS SET' line between them); add "
                "one before each element's block")
        if others:
            raise InputError(
                f"{what} file {path!r} has no block for element {element} that PySCF finds: "
                "it reads an element's block after a '#BASIS SET' line (as in files from the "
                "Basis Set Exchange in NWChem's format); add one, or give that element another "
                "basis (a dict per element)")


def _basis_file(entry) -> str | None:
    """The file a basis entry names, as PySCF reads the name (an ``@`` contraction suffix and
    an ``unc`` prefix stripped), or None when it names none."""
    if not isinstance(entry, str):
        return None
    name = entry.split("@")[0]
    if name[:3].lower() == "unc" and not os.path.isfile(name) and os.path.isfile(name[3:]):
        name = name[3:]
    return name if os.path.isfile(name) else None


def _found_block(path: str, element: str) -> list[str] | None:
    """The lines of ``element``'s block that PySCF's search finds in the file (after a ``#BASIS
    SET`` line, NWChem's format first, then CP2K's), or None when it finds none and reads the
    whole file."""
    from pyscf.gto.basis import parse_cp2k, parse_nwchem

    for reader in (parse_nwchem, parse_cp2k):
        try:
            block = reader.search_seg(path, element)
        except BasisNotFoundError:
            continue
        if block:
            return block
    return None


def _labelled(line: str) -> bool:
    """A line that names an element's block: the element, then a shell or a basis name (``O
    S``, ``O DZVP-GTH``); a line of a shell letter alone (``S``) is not one."""
    tokens = line.split()
    if len(tokens) < 2 or tokens[0].capitalize() not in ELEMENTS[1:]:
        return False
    try:
        float(tokens[1].replace("D", "E").replace("d", "e"))
    except ValueError:
        return True
    return False


def _check_basis_arg(basis) -> None:
    if isinstance(basis, str) and not basis.strip():
        raise InputError("the basis name is empty; give one, e.g. cc-pvdz or def2-svp")
    if not isinstance(basis, (str, dict)):
        raise InputError(f"basis must be a name or a dict element -> name, got {basis!r}")


def _pp_partner(basis, elements):
    """A named ``...-PP`` basis (cc-pVXZ-PP, aug-cc-pVXZ-PP; PySCF's spellings ccpvdzpp and
    cc_pvdz_pp too) exists only for the heavy elements its pseudopotentials cover; as in ORCA
    and Psi4, the elements its ECP has no potential for get the all-electron set of the same
    name without ``-PP`` (hydrogen in HI gets cc-pVDZ). Returns a dict per element then (the
    result records it), else ``basis`` unchanged."""
    if not isinstance(basis, str):
        return basis
    named = re.fullmatch(r"(.*?)[-_]pp", basis.strip(), flags=re.IGNORECASE)
    if named is None:  # PySCF's spelling without separators (ccpvdzpp); def2-TZVPP is no PP set
        named = re.fullmatch(r"((?:aug)?ccp(?:w)?c?v[dtq56]z)pp", basis.strip(),
                             flags=re.IGNORECASE)
    if named is None:
        return basis
    source = _ecp_source(basis)
    table = {}
    for element in elements:
        try:
            covered = bool(_load_ecp(source, element))
        except InputError:
            covered = False
        table[element] = basis if covered else named.group(1)
    if all(name == basis for name in table.values()):
        return basis
    log.info("basis %s: %s take the all-electron %s", basis,
             ", ".join(e for e, n in table.items() if n != basis), named.group(1))
    return table


def _from_geometry(parsed: Geometry, basis, charge, spin, ecp, cartesian=None,
                   unit: str = "angstrom") -> gto.Mole:
    _check_stated(parsed, charge, spin)
    basis = DEFAULT_BASIS if basis is None else basis
    _check_basis_arg(basis)
    labels = [label for label, _ in parsed.atoms]
    basis = _pp_partner(basis, sorted({element_of(label) for label in labels}))
    if all(isinstance(xyz, tuple) for _, xyz in parsed.atoms):
        _check_coordinates(labels, [xyz for _, xyz in parsed.atoms], parsed.source, unit)
        atom = [(label, xyz) for label, xyz in parsed.atoms]
    else:
        atom = "; ".join(xyz if isinstance(xyz, str) else f"{label} {xyz[0]!r} {xyz[1]!r} "
                         f"{xyz[2]!r}" for label, xyz in parsed.atoms)
    real = sorted({label for label in labels if not label.startswith(GHOST_PREFIX)})
    mol = gto.Mole()
    mol.atom = atom
    mol.basis = ghost_basis(basis, labels)
    mol.ecp = {element: name for element, (name, _) in _ecp_table(basis, ecp, real).items()}
    mol.charge = 0 if charge is None else int(charge)
    mol.unit = _UNIT_TEXT[unit][1]
    mol.cart = bool(cartesian)
    mol.verbose = 0
    mol = _build(mol, basis, parsed.source)
    mol = _check_built(mol, mol.charge, 0 if spin is None else int(spin), parsed.source)
    _warn_unit_mixup(mol, parsed.source, unit)
    return mol


def _check_stated(parsed: Geometry, charge: int | None, spin: int | None) -> None:
    """An xyz comment line that states another charge or multiplicity than the run's (``None``:
    not given, 0): refused where neither was given (the file's ion or radical would run as a
    neutral closed shell, a different molecule), a WARNING where the caller gave them."""
    asked = charge is not None or spin is not None
    charge, spin = int(charge or 0), int(spin or 0)
    stated_charge, stated_mult = stated_charge_multiplicity(parsed.comment)
    said = [f"{name} {value}" for name, value, own in (
        ("charge", stated_charge, charge), ("multiplicity", stated_mult, spin + 1))
        if value is not None and value != own]
    if not said:
        return
    where = f"{parsed.comment_where} (the comment line)"
    if not asked:
        q = charge if stated_charge is None else stated_charge
        s = spin if stated_mult is None else stated_mult - 1
        raise InputError(
            f"{where} states {' and '.join(said)}, but dfmp2 takes the charge and spin only "
            f"from --charge and --spin (Python: charge=, spin=), which default to 0 (a neutral "
            f"singlet); give --charge {q} --spin {s} to run what the file states, or --charge "
            "0 --spin 0 to run it neutral")
    log.warning("%s states %s; the run is charge %d, multiplicity %d, as asked", where,
                " and ".join(said), charge, spin + 1)


def _warn_missing_ecps(mol) -> None:
    """A warning for the real atoms of a given Mole that carry no ECP although their basis
    name has one in PySCF's library (atom by atom: I1 may carry one and I2 not)."""
    missing = {}
    for k in range(mol.natm):
        label = mol._atom[k][0]
        if _is_ghost(mol, k) or label in mol._ecp or re.sub(r"\d", "", label) in mol._ecp:
            continue
        element = element_of(label)
        missing.update(_library_ecps(_label_spec(mol.basis, label), [element]))
    if missing:
        names = sorted({name for name, _ in missing.values()})
        log.warning(
            "the given Mole has no ECP for %s although PySCF's library has one for its basis %s: "
            "these atoms run all-electron in a basis made for an ECP; pass ecp=%r to attach it, "
            "or ecp='none' to keep all electrons", ", ".join(missing), ", ".join(names), names[0],
        )


def is_ghost_label(label: str) -> bool:
    return unghosted(label) != label


def _from_mole(given: gto.Mole, basis, charge, spin, ecp, cartesian=None,
               unit: str | None = None) -> gto.Mole:
    """Check a given ``Mole``; settings that are not None are applied to a rebuilt copy but
    ``unit``, which must be the Mole's own."""
    source = "the given Mole"
    if unit is not None and unit != unit_name(given.unit):
        raise InputError(
            f"unit={unit!r} contradicts the given Mole's own unit (mol.unit = {given.unit!r}), "
            "in which its coordinates are read; leave unit= out, or set mol.unit to the unit "
            "its coordinates are in")
    _check_integer("the given Mole's charge", given.charge)
    _check_integer("the given Mole's spin (2S)", given.spin)
    if given._built:
        _check_unchanged_since_build(given)
    if cartesian is not None and bool(cartesian) == bool(given.cart):
        cartesian = None  # as it is
    if given._built and basis is None and charge is None and spin is None and ecp is None \
            and cartesian is None:
        mol = _check_built(given, given.charge, given.spin, source)
    else:
        mol = given.copy()
        if cartesian is not None:
            mol.cart = bool(cartesian)
        labels = [a[0] for a in gto.format_atom(mol.atom, unit=1)]
        real = sorted({element_of(label) for label in labels if not is_ghost_label(label)})
        if basis is not None:
            _check_basis_arg(basis)
            basis = _pp_partner(basis, sorted({element_of(label) for label in labels}))
            mol.basis = ghost_basis(basis, labels)
        if charge is not None:
            mol.charge = int(charge)
        # a basis named here brings its library ECPs, as for a geometry (a Mole's own ECPs,
        # where it has some, are kept)
        if ecp is not None or (basis is not None and not given.ecp):
            mol.ecp = {e: name for e, (name, _) in _ecp_table(basis if basis is not None
                                                              else mol.basis, ecp,
                                                              real).items()}
        elif basis is not None:  # the Mole's own ECP stays: say where the basis wants another
            made_for = {e: name for e, (name, _) in _library_ecps(basis, real).items()
                        if _label_spec(given.ecp, e) not in (None, name)}
            if made_for:
                log.warning("the given Mole's own ECP is kept for %s, though its new basis is "
                            "made for PySCF's %s ECP; pass ecp=%r to take that one",
                            ", ".join(made_for), ", ".join(sorted(set(made_for.values()))),
                            sorted(set(made_for.values()))[0])
        spin = given.spin if spin is None else int(spin)
        mol = _build(mol, mol.basis, source)
        mol = _check_built(mol, mol.charge, mol.spin if spin is None else spin, source)
    if ecp is None:
        _warn_missing_ecps(mol)
    return mol


def _check_unchanged_since_build(mol: gto.Mole) -> None:
    """A built ``Mole`` whose settings were changed after ``build()`` (``mol.basis = ...``,
    ``mol.nelectron = 8``) holds tables of one molecule and settings of another: the energy
    would be the tables', the record the settings'. Refused, naming what to do."""
    tot = mol.tot_electrons()
    if mol._nelectron is not None and mol._nelectron != tot:
        raise InputError(f"the given Mole's nelectron {mol._nelectron} contradicts its charge "
                         f"{mol.charge} ({tot} electrons); set mol.charge instead and "
                         "call mol.build()")
    fresh = mol.copy()
    try:
        with quiet_pyscf():
            fresh.build(dump_input=False, parse_arg=False)
    except Exception as exc:  # noqa: BLE001 - settings that do not build again
        if _names_a_missing_file(mol.atom) or _names_a_missing_file(mol.basis):
            return  # a geometry or basis file since removed: the tables are what runs
        raise InputError(f"the given Mole's settings were changed after mol.build() and do not "
                         f"build any more ({first_line(exc)}); fix them and call mol.build()"
                         ) from None
    tables = ("_atm", "_bas", "_env", "_ecpbas")
    if any(np.shape(getattr(fresh, t)) != np.shape(getattr(mol, t))
           or not np.array_equal(getattr(fresh, t), getattr(mol, t), equal_nan=True)
           for t in tables):
        raise InputError("the given Mole's settings (atom, basis, ecp, ...) were changed after "
                         "mol.build(), so its integral tables are another molecule's; call "
                         "mol.build() after changing them")


def _names_a_missing_file(setting) -> bool:
    """Whether a Mole's atom or basis setting (a dict's values too) is a file path that is no
    longer there."""
    values = setting.values() if isinstance(setting, dict) else [setting]
    return any(isinstance(v, (str, os.PathLike)) and not os.path.exists(v)
               and (os.sep in str(v) or re.search(r"\.[A-Za-z]+$", str(v).strip()))
               for v in values)


def _check_integer(name: str, value) -> None:
    if value is None:
        return
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not ok and isinstance(value, float) and math.isfinite(value) and value.is_integer():
        ok = True
    if not ok:
        raise InputError(f"{name} must be an integer, got {value!r}")


def build_mole(geometry, basis=None, charge=None, spin=None, ecp=None,
               cartesian=None, unit=None) -> gto.Mole:
    """A built PySCF ``Mole``, every setting checked.

    Parameters
    ----------
    geometry : str, os.PathLike or pyscf.gto.Mole
        An xyz path, an atom string (Cartesian or Z-matrix) or a ``Mole``.
    basis : str or dict, optional
        Orbital basis; for a path or string None means ``'cc-pvdz'``, for a ``Mole`` None keeps
        its basis.
    charge, spin : int, optional
        Total charge and 2S; None means 0 (path or string) or the ``Mole``'s value. A given value
        is applied to a copy of the ``Mole`` (the caller's is never changed).
    ecp : str, optional
        None: the ECPs PySCF's library has for the basis name (def2-* beyond Kr, lanl2dz,
        cc-pVXZ-PP, ...); for a ``Mole``, its own ECPs, with a warning when its basis has library
        ECPs it lacks. ``'none'``: all electrons. Another name: that ECP on every element it has a
        potential for.
    cartesian : bool, optional
        Cartesian (True) or spherical (False) functions; None means spherical for a path or
        string and the ``Mole``'s own ``cart`` for a ``Mole``.
    unit : {'angstrom', 'bohr'}, optional
        The unit of a path's or string's coordinates (and Z-matrix distances), any case; None
        means Angstrom. A ``Mole`` keeps its own ``unit``: one given with it must be that one.

    Returns
    -------
    pyscf.gto.Mole

    Raises
    ------
    InputError
        One line naming the problem: the file and line, the atom pair and distance, the electron
        count against the basis size, an unknown basis or ECP name.
    """
    _check_integer("charge", charge)
    _check_integer("spin", spin)
    unit = None if unit is None else checked_choice("unit", unit)
    parsed = parse_geometry(geometry)
    if isinstance(parsed, gto.Mole):
        return _from_mole(parsed, basis, charge, spin, ecp, cartesian, unit)
    return _from_geometry(parsed, basis, charge, spin, ecp, cartesian, unit or "angstrom")
