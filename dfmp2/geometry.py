"""Geometry text -> :class:`Geometry`: xyz files and atom strings in the spellings chemists use.

Accepted, in xyz files and atom strings alike:

- element symbols in any case (``o``, ``O``), atomic numbers (``8``) and labels whose element is
  the leading letters (``O1``, ``H2a``);
- ghost atoms (basis functions, no nuclear charge, no electrons) in PySCF's spellings
  (``ghost-O``, ``ghostO``, ``X-O``, ``XO``) and Psi4's (``@O``, ``Gh(O)``), case-insensitive;
  they become PySCF's ``GHOST-O``. ``X`` alone is a dummy atom: refused among Cartesian
  atoms (it carries nothing there), a reference point in a Z-matrix (as in Gaussian and Psi4:
  ``X 1 1.0 2 90.`` for a linear molecule), where the entries become Cartesians and it is
  dropped;
- fields separated by blanks or commas (``O, 0, 0, 0``, ``O,0,0,0``);
- a UTF-8 byte order mark, Unicode minus signs (U+2212) and en dashes (U+2013) used as minus,
  Fortran exponents (``1.0D-01``, ``1.0d-1``).

Atom strings separate atoms by ``;`` or new lines and may be a Z-matrix (handed to PySCF). A
string that names an existing file is always read as an xyz file, whatever it contains.
Coordinates are read as numbers: their unit (Angstrom, or Bohr) is the run's ``unit``, which
:func:`dfmp2.molecule.build_mole` applies.
"""

from __future__ import annotations

import errno
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from pyscf.data.elements import ELEMENTS

from .errors import InputError

__all__ = ["GHOST_PREFIX", "Geometry", "atom_label", "parse_geometry", "read_xyz",
           "read_xyz_frames", "stated_charge_multiplicity"]

#: PySCF's spelling of a ghost atom: ``GHOST-O`` carries O's basis functions and nothing else.
GHOST_PREFIX = "GHOST-"

_SYMBOLS = {symbol.upper(): symbol for symbol in ELEMENTS[1:]}
_MINUS = str.maketrans({"\u2212": "-", "\u2013": "-"})
_BOM = "\ufeff"
_FORTRAN = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))[dD]([+-]?\d+)$")
_PSI4_GHOST = re.compile(r"^gh\((.+)\)$", re.IGNORECASE)
_LABEL = re.compile(r"^([A-Za-z]+)([^A-Za-z].*)?$")
_EXAMPLE = "'O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59'"
#: An ion's label (Na+, Cl-, Cl-1, O2-, Fe+3, Fe3+, Na⁺, Fe³⁺, Na(+), Cl^-): its letters, then a
#: charge sign with or without a number, bare, superscript, after '^' or in brackets; PySCF
#: would read the element and drop the sign.
_CHARGED = re.compile(r"^[A-Za-z]+\d*(?:[+-]\d*|[⁰¹²³⁴⁵⁶⁷⁸⁹]*[⁺⁻][⁰¹²³⁴⁵⁶⁷⁸⁹]*"
                      r"|\^\d*[+-]\d*|\(\s*\d*[+-]\d*\s*\))$")
#: A comment line that states a charge and multiplicity: two integers ('0 1', '-1 2'),
#: 'charge/mult 1/2', or 'charge=...' and/or 'mult[iplicity]=...' ('=' or ':' or a blank
#: between name and value); a number followed by a decimal point is not one ('charge 1.35').
_WHOLE = r"(?![.\d])"
_STATED_PAIR = re.compile(r"^\s*([+-]?\d+)[\s,]+([1-9]\d*)\s*$")
_STATED_BOTH = re.compile(r"\bcharge\s*/\s*mult(?:iplicity)?\s*[=:]?\s*([+-]?\d+)\s*[/,\s]\s*"
                          r"([1-9]\d*)" + _WHOLE, re.IGNORECASE)
_STATED_CHARGE = re.compile(r"\bcharge\s*[=:\s]\s*([+-]?\d+)" + _WHOLE, re.IGNORECASE)
_STATED_MULT = re.compile(r"\bmult(?:iplicity)?\s*[=:\s]\s*([1-9]\d*)" + _WHOLE,
                          re.IGNORECASE)


@dataclass(frozen=True)
class Geometry:
    """Atoms in the run's unit (Angstrom unless it says Bohr): ``atoms`` is a tuple of (label,
    (x, y, z)) or, for a Z-matrix entry, (label, entry text); a label is an element symbol or
    ``GHOST-`` + symbol. ``where`` names the origin of each atom (file and line, or atom-string
    entry); ``source`` names the input."""

    atoms: tuple
    source: str
    comment: str = ""
    where: tuple = ()
    comment_where: str = ""  # an xyz frame's comment line: "path line 2"


def _element(token: str) -> str | None:
    """The element of an atom token (symbol, atomic number, or a label like ``O1``), or None."""
    if token.isdigit():
        z = int(token)
        return ELEMENTS[z] if 1 <= z < len(ELEMENTS) else None
    match = _LABEL.match(token)
    return _SYMBOLS.get(match.group(1).upper()) if match else None


def _ghost_body(token: str) -> str | None:
    """The atom inside a ghost spelling (``@O``, ``Gh(O)``, ``ghost-O``, ``X-O``), else None."""
    if token.startswith("@"):
        return token[1:]
    match = _PSI4_GHOST.match(token)
    if match:
        return match.group(1)
    upper = token.upper()
    if upper.startswith("GHOST"):
        return token[6:] if token[5:6] in ("-", "_") else token[5:]
    if upper.startswith("X-"):
        return token[2:]
    if upper.startswith("X") and token[1:2].isalpha() and _element(token) is None:
        return token[1:]  # PySCF's XO; Xe and its labels are xenon
    return None


def atom_label(token: str, where: str) -> str:
    """The PySCF label of one atom token: ``'O'`` or, for a ghost spelling, ``'GHOST-O'``."""
    token = token.strip()
    body = _ghost_body(token)
    element = _element(body.strip() if body is not None else token)
    if element is not None and _CHARGED.match(body.strip() if body is not None else token):
        raise InputError(
            f"{where}: atom {token!r} carries a charge sign, which dfmp2 would not apply to the "
            f"atom; write {element} and give the molecule's total charge with --charge "
            "(Python: charge=)")
    if element is not None:
        return GHOST_PREFIX + element if body is not None else element
    if re.fullmatch(r"[Xx]\d*", token):
        raise InputError(
            f"{where}: {token!r} is a dummy atom (no basis functions, no charge), which dfmp2 "
            "does not use; remove it, or write a ghost atom as @O, Gh(O), X-O or ghost-O"
        )
    raise InputError(
        f"{where}: unknown element {token!r}; write a symbol (O), an atomic number (8), a label "
        "(O1) or a ghost atom (@O, Gh(O), X-O, ghost-O)"
    )


def stated_charge_multiplicity(comment: str) -> tuple[int | None, int | None]:
    """The charge and multiplicity an xyz comment line states ('0 1', 'charge=-1 mult=2',
    'Charge: 1'), each None where it states none."""
    comment = comment.translate(_MINUS)
    pair = _STATED_PAIR.match(comment) or _STATED_BOTH.search(comment)
    if pair:
        return int(pair.group(1)), int(pair.group(2))
    charge, mult = _STATED_CHARGE.search(comment), _STATED_MULT.search(comment)
    return (int(charge.group(1)) if charge else None, int(mult.group(1)) if mult else None)


def _fields(line: str) -> list[str]:
    """Split one line into fields: blanks or commas separate, Unicode minus signs become '-'."""
    return line.translate(_MINUS).replace(",", " ").split()


def _number(field: str) -> float | None:
    """A float from a field, Fortran ``D`` exponents included; None when it is not a number."""
    try:
        return float(_FORTRAN.sub(r"\1e\2", field))
    except ValueError:
        return None


def _finite(field: str, value: float | None, where: str) -> None:
    if value is not None and not math.isfinite(value):
        raise InputError(
            f"{where}: coordinate {field!r} is not a finite number; give the atom's position"
        )


def _atom_line(line: str, where: str):
    if "\ufffd" in line:  # what _read_lines made of bytes that are not UTF-8
        raise InputError(f"{where}: the atom line is not UTF-8 text: {line.strip()!r}")
    fields = _fields(line)
    if len(fields) != 4:
        raise InputError(f"{where}: expected 'Element x y z', got {line.strip()!r}")
    label = atom_label(fields[0], where)
    values = [_number(field) for field in fields[1:]]
    if any(value is None for value in values):
        raise InputError(
            f"{where}: coordinates must be numbers, got {' '.join(fields[1:])!r}"
        )
    for field, value in zip(fields[1:], values):
        _finite(field, value, where)
    return label, tuple(values)


#: A dummy atom's token (``X``, ``X1``): a Z-matrix's reference point, no atom.
_DUMMY = re.compile(r"[Xx]\d*")


def _zmatrix_entry(fields: list[str], k: int, where: str):
    """Entry ``k`` (1-based) of a Z-matrix: ``label``, then for k >= 2 ``i r``, for k >= 3
    ``j angle``, for k >= 4 ``l dihedral``; references are earlier entries (1-based, distinct),
    distances in the run's unit (Angstrom or Bohr), angles in degrees. PySCF gets the entry
    rebuilt from the parsed values only (it evaluates what it is given). A dummy atom's label
    is ``X``."""
    label = "X" if _DUMMY.fullmatch(fields[0].strip()) else atom_label(fields[0], where)
    nref = min(k - 1, 3)
    names = ("bond partner and distance", "angle partner and angle",
             "dihedral partner and dihedral")
    if len(fields) != 1 + 2 * nref:
        expected = " ".join(["label", *("i r", "j angle", "l dihedral")[:nref]])
        raise InputError(f"{where}: expected 'Element x y z' or, as Z-matrix entry {k}, "
                         f"'{expected}'; got {' '.join(fields)!r}")
    rest, refs = [], []
    for m in range(nref):
        ref_field, value_field = fields[1 + 2 * m], fields[2 + 2 * m]
        if not ref_field.isdigit() or not 1 <= int(ref_field) < k or int(ref_field) in refs:
            raise InputError(f"{where}: Z-matrix {names[m]}: {ref_field!r} must name a distinct "
                             f"earlier entry, 1 to {k - 1}")
        value = _number(value_field)
        if value is None:
            raise InputError(f"{where}: Z-matrix {names[m]}: {value_field!r} is not a number")
        _finite(value_field, value, where)
        if m == 0 and value <= 0:
            raise InputError(f"{where}: Z-matrix distance {value_field!r} must be positive")
        if m == 1 and (value < 0 or (k >= 4 and value > 180)):  # PySCF asserts on these
            raise InputError(f"{where}: Z-matrix angle {value_field!r} must be from 0 to 180 "
                             "degrees")
        refs.append(int(ref_field))
        rest += [ref_field, repr(value)]
    return label, " ".join([label, *rest])


def _read_lines(path: Path) -> list[str]:
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # pathlib's tests raise this one instead of False
            raise InputError(f"geometry file {str(path)[:80]!r}...: its name is too long for "
                             "the file system (a part over 255 bytes); give a shorter path"
                             ) from None
    if path.is_dir():
        raise InputError(f"{str(path)!r} is a directory, not an xyz file; name the file in it")
    if path.exists() and not path.is_file():
        raise InputError(f"geometry file {str(path)!r} is not a regular file (a device or a "
                         "pipe); give an xyz file")
    if not path.is_file():
        raise InputError(
            f"geometry file {str(path)!r} does not exist; give an xyz path or an atom string "
            f"such as {_EXAMPLE}"
        )
    try:
        data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")
    except OSError as exc:
        raise InputError(f"cannot read geometry file {str(path)!r}: {exc}") from None
    # line by line: a comment line in another encoding (Latin-1 "Ångström") is only text, and
    # an atom line that is not UTF-8 is named by its own parser with its line number
    return [raw.decode("utf-8", errors="replace") for raw in data.splitlines()]


def read_xyz(path: str | os.PathLike) -> Geometry:
    """Read an xyz file (count line, comment line, atom lines); errors name the file and line.
    A file of several frames is refused here (:func:`read_xyz_frames` reads them)."""
    frames = read_xyz_frames(path)
    if len(frames) > 1:
        raise InputError(f"{path} holds {len(frames)} frames (a multi-frame xyz): run it with "
                         "the dfmp2 command, which takes each frame in turn, or read the frames "
                         "with dfmp2.geometry.read_xyz_frames")
    return frames[0]


def read_xyz_frames(path: str | os.PathLike,
                    keep_errors: bool = False) -> list[Geometry | InputError]:
    """Every frame of an xyz file (one or more blocks of count line, comment line, atom lines,
    back to back; blank lines between blocks allowed); errors name the file and line.
    ``keep_errors``: a frame whose atom lines are wrong (an unknown element, a NaN coordinate)
    is its :class:`InputError` in the list, and the frames after it are read (a batch runs
    them); a file whose frames cannot be told apart (a wrong count line) still raises."""
    path = Path(path)
    lines = _read_lines(path)
    frames, start = [], 0
    while True:
        count_line = start + 1
        try:
            geometry, start = _read_frame(path, lines, start)
        except _AtomLinesError as exc:
            if not keep_errors:
                raise InputError(str(exc)) from None
            geometry, start = InputError(str(exc)), exc.end
        frames.append(geometry)
        natm = start - count_line - 1  # (the count line is line count_line, 1-based)
        while start < len(lines) and not lines[start].strip():
            start += 1
        if start >= len(lines):
            return frames
        if not _is_count_line(lines[start]):  # no count line: no next frame
            raise InputError(
                f"{path} line {start + 1}: line {count_line} says {natm} atoms "
                f"but more lines follow: {lines[start].strip()!r}")


def _is_count_line(line: str) -> bool:
    """Whether ``line`` can open another frame: a whole number, not followed by the three
    coordinates that make it an atom line with an atomic number (``2 0 0 3`` is helium)."""
    fields = _fields(line)
    if not fields[0].isdigit():
        return False
    return not (len(fields) >= 4 and all(_number(f) is not None for f in fields[1:4]))


class _AtomLinesError(InputError):
    """A frame's atom lines are wrong; ``end`` is the index after them (the next frame's)."""

    def __init__(self, message: str, end: int):
        super().__init__(message)
        self.end = end


def _read_frame(path: Path, lines: list[str], start: int) -> tuple[Geometry, int]:
    """The frame whose count line is ``lines[start]``, and the index after its atom lines."""
    first = start + 1  # 1-based line number of the count line
    if start >= len(lines) or not lines[start].strip():
        raise InputError(f"{path} line {first}: expected the number of atoms, got an empty line")
    try:
        natm = int(_fields(lines[start])[0])
    except ValueError:
        json_hint = (": this is JSON; a QCSchema AtomicInput runs with "
                     "dfmp2.run_qcschema(path) (the dfmp2 command takes it as GEOMETRY)"
                     if start == 0 and lines[start].lstrip(_BOM).lstrip().startswith("{")
                     else "")
        raise InputError(
            f"{path} line {first}: expected the number of atoms, got "
            f"{lines[start].strip()[:60]!r}{json_hint}") from None
    if natm < 1:
        raise InputError(f"{path} line {first}: the number of atoms must be positive, got "
                         f"{natm}")
    body = lines[start + 2: start + 2 + natm]
    if len(body) < natm or any(not line.strip() for line in body):
        bad = next((k for k, line in enumerate(body) if not line.strip()), len(body))
        raise InputError(
            f"{path} line {first + 2 + bad}: expected {natm} atom lines after the comment "
            f"line, found {bad}"
        )
    where = tuple(f"{path} line {k}" for k in range(first + 2, first + 2 + natm))
    try:
        atoms = tuple(_atom_line(line, w) for line, w in zip(body, where))
    except InputError as exc:
        raise _AtomLinesError(str(exc), start + 2 + natm) from None
    comment = lines[start + 1].strip() if len(lines) > start + 1 else ""
    return (Geometry(atoms, str(path), comment, where, f"{path} line {first + 1}"),
            start + 2 + natm)


def parse_atom_string(text: str) -> Geometry:
    """``"O 0 0 0; H 0 0.76 0.59; ..."`` (Cartesian) or a Z-matrix -> Geometry."""
    entries = [e for e in text.lstrip(_BOM).replace("\n", ";").split(";") if e.strip()]
    if not entries:
        raise InputError(f"the atom string is empty; give atoms such as {_EXAMPLE}")
    atoms, where = [], []
    # a Z-matrix starts with a label alone; otherwise every entry is 'Element x y z'
    zmatrix = len(_fields(entries[0])) == 1
    for k, entry in enumerate(entries, start=1):
        here = f"atom string entry {k} ({entry.strip()!r})"
        fields = _fields(entry)
        if zmatrix:  # validated and rebuilt here; PySCF converts it to Cartesians
            atoms.append(_zmatrix_entry(fields, k, here))
        else:
            atoms.append(_atom_line(entry, here))
        where.append(here)
    if zmatrix:
        atoms, where = _zmatrix_cartesian(atoms, where)
    return Geometry(tuple(atoms), "atom string", "", tuple(where))


def _zmatrix_cartesian(entries, where):
    """A Z-matrix (validated entries, :func:`_zmatrix_entry`) as Cartesian atoms in its own
    unit, by PySCF's ``from_zmatrix`` (what PySCF runs on any Z-matrix it is given), the dummy
    atoms dropped: a dummy is a reference point for the entries after it. An entry it cannot
    place is refused here, in one line, not left to numpy's warnings and NaN coordinates."""
    import numpy as np
    from pyscf.gto.mole import from_zmatrix

    with np.errstate(divide="ignore", invalid="ignore"):  # an entry it cannot place: NaN
        cartesian = from_zmatrix("\n".join(text for _, text in entries))
    for (_, xyz), here in zip(cartesian, where):
        if not np.isfinite(xyz).all():  # the first one (those placed from it follow)
            raise InputError(f"{here}: the Z-matrix does not place this entry (its bond and "
                             "angle partners are at the same point); choose other partners")
    kept = [(label, tuple(float(c) for c in xyz), here)
            for (label, _), (_, xyz), here in zip(entries, cartesian, where) if label != "X"]
    if not kept:
        raise InputError("the Z-matrix has dummy atoms (X) only; give at least one atom")
    return [(label, xyz) for label, xyz, _ in kept], [here for _, _, here in kept]


def _looks_like_atom_string(text: str) -> bool:
    if ";" in text or "\n" in text:
        return True
    if text.strip().lower().endswith(".xyz"):
        return False
    fields = _fields(text)
    if len(fields) == 1:  # one atom at the origin, e.g. "He" or "@He"
        try:
            atom_label(fields[0], "")
        except InputError:
            return False
        return True
    return len(fields) >= 4


def parse_geometry(geometry):
    """A path, an atom string, a :class:`Geometry` or a ``Mole`` -> :class:`Geometry` (a
    ``Mole`` is returned unchanged). An existing file always wins over an atom string."""
    from pyscf import gto

    if isinstance(geometry, (gto.Mole, Geometry)):
        return geometry
    if isinstance(geometry, os.PathLike):
        return read_xyz(geometry)
    if not isinstance(geometry, str):
        raise InputError(
            f"geometry must be an xyz path, an atom string or a pyscf Mole, got "
            f"{type(geometry).__name__}" + ("; a QCSchema AtomicInput runs with "
                                            "dfmp2.run_qcschema" * isinstance(geometry, dict))
        )
    if not geometry.lstrip(_BOM).strip():
        raise InputError(f"the geometry is empty; give an xyz path or an atom string such as "
                         f"{_EXAMPLE}")
    if os.path.isfile(geometry) or os.path.isdir(geometry):
        return read_xyz(geometry)
    text = geometry.lstrip(_BOM)
    return parse_atom_string(text) if _looks_like_atom_string(text) else read_xyz(geometry)
