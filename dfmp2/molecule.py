"""Geometry input -> a built PySCF ``Mole``, with every input problem named precisely.

Accepted geometry: a path to an xyz file (count line, comment line, ``Element x y z`` in
Angstrom), an atom string in PySCF's format (``"O 0 0 0; H 0 0.76 0.59; ..."``, Cartesian or
Z-matrix), or an already built ``pyscf.gto.Mole`` (used as it is).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

from pyscf import gto
from pyscf.data.elements import ELEMENTS
from pyscf.lib.exceptions import BasisNotFoundError

from .errors import InputError

__all__ = ["Geometry", "read_xyz", "parse_geometry", "build_mole", "first_line", "quiet_pyscf"]

_SYMBOLS = {symbol.upper(): symbol for symbol in ELEMENTS[1:]}


@dataclass(frozen=True)
class Geometry:
    """Atoms in Angstrom: ``atoms`` is a tuple of (symbol, (x, y, z)); ``source`` names the origin."""

    atoms: tuple
    source: str
    comment: str = ""


def first_line(exc: Exception) -> str:
    """The first non-empty line of an exception's message (PySCF's span several lines)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


@contextlib.contextmanager
def quiet_pyscf():
    """Silence PySCF's advice to install basis-set-exchange while we turn its errors into ours."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Basis may be available in basis-set-exchange")
        yield


def _element(token: str, where: str) -> str:
    symbol = _SYMBOLS.get(token.strip().upper())
    if symbol is None:
        raise InputError(f"{where}: unknown element {token!r}")
    return symbol


def _atom_line(line: str, where: str):
    fields = line.split()
    if len(fields) != 4:
        raise InputError(f"{where}: expected 'Element x y z', got {line.strip()!r}")
    symbol = _element(fields[0], where)
    try:
        xyz = tuple(float(value) for value in fields[1:])
    except ValueError:
        raise InputError(
            f"{where}: coordinates must be numbers, got {' '.join(fields[1:])!r}"
        ) from None
    return symbol, xyz


def read_xyz(path: str | os.PathLike) -> Geometry:
    """Read an xyz file; errors name the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"geometry file {str(path)!r} does not exist")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read geometry file {str(path)!r}: {exc}") from None
    if not lines or not lines[0].strip():
        raise InputError(f"{path} line 1: expected the number of atoms, got an empty line")
    try:
        natm = int(lines[0].split()[0])
    except ValueError:
        raise InputError(
            f"{path} line 1: expected the number of atoms, got {lines[0].strip()!r}"
        ) from None
    if natm < 1:
        raise InputError(f"{path} line 1: the number of atoms must be positive, got {natm}")
    body = lines[2 : 2 + natm]
    atom_lines = [line for line in body if line.strip()]
    if len(atom_lines) < natm or any(not line.strip() for line in body):
        first_bad = next((k for k, line in enumerate(body) if not line.strip()), len(body))
        raise InputError(
            f"{path} line {first_bad + 3}: expected {natm} atom lines after the comment line, "
            f"found {first_bad}"
        )
    extra = [k for k, line in enumerate(lines[2 + natm :], start=3 + natm) if line.strip()]
    if extra:
        raise InputError(
            f"{path} line {extra[0]}: line 1 says {natm} atoms but more lines follow: "
            f"{lines[extra[0] - 1].strip()!r}"
        )
    atoms = tuple(_atom_line(line, f"{path} line {k}") for k, line in enumerate(body, start=3))
    comment = lines[1].strip() if len(lines) > 1 else ""
    return Geometry(atoms, str(path), comment)


def _looks_like_atom_string(text: str) -> bool:
    return ";" in text or "\n" in text or len(text.split()) >= 4


def parse_geometry(geometry) -> Geometry | gto.Mole:
    """A path, an atom string or a ``Mole`` -> :class:`Geometry` (or the ``Mole`` unchanged)."""
    if isinstance(geometry, gto.Mole):
        return geometry
    if isinstance(geometry, Geometry):
        return geometry
    if isinstance(geometry, os.PathLike):
        return read_xyz(geometry)
    if not isinstance(geometry, str):
        raise InputError(
            f"geometry must be an xyz path, an atom string or a pyscf Mole, got {type(geometry)}"
        )
    if not _looks_like_atom_string(geometry):
        return read_xyz(geometry)
    entries = [e for e in geometry.replace("\n", ";").split(";") if e.strip()]
    if not entries:
        raise InputError("the atom string is empty")
    atoms = []
    for k, entry in enumerate(entries, start=1):
        where = f"atom string entry {k}"
        fields = entry.split()
        if len(fields) == 4 and _is_cartesian(fields[1:]):
            atoms.append(_atom_line(entry, where))
        else:  # Z-matrix or another PySCF spelling: validate the element, let PySCF parse it
            atoms.append((_element(fields[0], where), entry.strip()))
    return Geometry(tuple(atoms), "atom string")


def _is_cartesian(fields) -> bool:
    try:
        [float(value) for value in fields]
    except ValueError:
        return False
    return True


def _pyscf_atom(geometry: Geometry):
    if all(isinstance(xyz, tuple) for _, xyz in geometry.atoms):
        return [(symbol, xyz) for symbol, xyz in geometry.atoms]
    return "; ".join(
        xyz if isinstance(xyz, str) else f"{symbol} {xyz[0]} {xyz[1]} {xyz[2]}"
        for symbol, xyz in geometry.atoms
    )


def build_mole(geometry, basis: str = "cc-pvdz", charge: int = 0, spin: int = 0) -> gto.Mole:
    """Build a PySCF ``Mole`` (spherical functions, Angstrom), checking charge, spin and basis."""
    parsed = parse_geometry(geometry)
    if isinstance(parsed, gto.Mole):
        mol = parsed if parsed._built else parsed.build()
        _check_electrons(mol.nelectron, mol.spin, mol.charge, "the given Mole")
        return mol
    nuclear_charge = sum(ELEMENTS.index(symbol) for symbol, _ in parsed.atoms)
    _check_electrons(nuclear_charge - charge, spin, charge, parsed.source)
    mol = gto.Mole()
    mol.atom = _pyscf_atom(parsed)
    mol.basis = basis
    mol.charge = charge
    mol.spin = spin
    mol.unit = "Angstrom"
    mol.cart = False
    mol.verbose = 0
    try:
        with quiet_pyscf():
            mol.build(dump_input=False, parse_arg=False)
    except BasisNotFoundError as exc:
        raise InputError(f"basis {basis!r}: {_basis_problem(exc, basis)}") from None
    except (RuntimeError, ValueError, KeyError) as exc:
        raise InputError(f"{parsed.source}: PySCF could not build the molecule: {first_line(exc)}") from None
    return mol


def _basis_problem(exc: Exception, basis: str) -> str:
    text = first_line(exc)
    if text.startswith("Basis set not found for"):
        return text.replace("Basis set not found for", "has no functions for element")
    return f"unknown basis name (PySCF: {text})"


def _check_electrons(nelectron: int, spin: int, charge: int, source: str) -> None:
    if nelectron <= 0:
        raise InputError(
            f"{source}: charge {charge:+d} leaves {nelectron} electrons; nothing to correlate"
        )
    if spin < 0:
        raise InputError(f"spin (2S) must be >= 0, got {spin}")
    if (nelectron - spin) % 2:
        raise InputError(
            f"{source}: {nelectron} electrons cannot have 2S = {spin} "
            f"(charge {charge:+d}); for an odd electron count pass --spin 1 (a doublet) "
            "or change --charge"
        )
    if spin > nelectron:
        raise InputError(f"{source}: 2S = {spin} exceeds the {nelectron} electrons")


# --- TEMPORARY (replaced by helper A's branch at merge) ---
_build_mole_v1 = build_mole


def build_mole(geometry, basis=None, charge=None, spin=None, ecp=None):  # noqa: F811
    if isinstance(geometry, gto.Mole):
        mol = geometry if geometry._built else geometry.build()
        if basis is None and charge is None and spin is None:
            return mol
        mol = mol.copy()
        mol.basis = basis if basis is not None else mol.basis
        mol.charge = charge if charge is not None else mol.charge
        mol.spin = spin if spin is not None else mol.spin
        return mol.build(dump_input=False, parse_arg=False)
    return _build_mole_v1(geometry, basis or "cc-pvdz", charge or 0, spin or 0)


def ecp_record(mol):
    return {}


def basis_record(mol):
    return {mol.atom_pure_symbol(k): str(mol.basis) for k in range(mol.natm)}


def auxbasis_record(mol, auxbasis=None):
    return {mol.atom_pure_symbol(k): str(auxbasis or "default") for k in range(mol.natm)}


def molecule_record(mol):
    return {"symbols": [mol.atom_pure_symbol(k) for k in range(mol.natm)],
            "geometry": mol.atom_coords(unit="Bohr").ravel().tolist(),
            "real": [bool(mol.atom_charge(k)) for k in range(mol.natm)],
            "molecular_charge": mol.charge, "molecular_multiplicity": mol.spin + 1}
