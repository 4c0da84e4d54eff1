"""Counterpoise-corrected interaction energies (Boys and Bernardi, Mol. Phys. 19, 553 (1970)).

The complex, then each fragment alone in the complex's basis (the other fragments' atoms as
ghosts: their basis functions, no nuclei, no electrons), then each fragment alone in its own
basis (its atoms only, no ghosts), each a whole dfmp2 run with the same options (a fragment's
charge and 2S alike in both of its runs); at each level

    E_int       = E(complex) - sum_k E(fragment k in the complex's basis)   (CP-corrected)
    E_int(nocp) = E(complex) - sum_k E(fragment k in its own basis)         (uncorrected)
    BSSE        = E_int - E_int(nocp)
                = sum_k [E(fragment k in its own basis) - E(fragment k in the complex's basis)]

(what Gaussian's Counterpoise=2 and Psi4's nbody with bsse_type ['cp', 'nocp'] print; the BSSE
is positive where the ghosts' functions lower each fragment's energy, as they normally do) at
HF (the reference's energy), MP2 and SCS-MP2 (or the run's other scaled MP2: SOS-MP2, given
scales), or for a double-hybrid run (``--xc``) at its KS part and the double hybrid (KS plus
scaled PT2), in Hartree and kcal/mol (qcelemental's CODATA conversion factor).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, replace

from .errors import DFMP2Error, InputError
from .results import SCALED_NAMES

__all__ = ["Fragments", "answer_level", "levels", "parse_fragments", "run_counterpoise"]

def levels(result) -> dict[str, tuple[str, str]]:
    """The levels of a run's interaction energy: key -> (label, Result attribute of the
    total)."""
    if result.double_hybrid:
        name = result.dh_name
        return {"ks": (f"{result.scf.kind.upper()} (KS part)", "e_scf"),
                "double_hybrid": (name, "e_scs_tot")}
    label = result.scaled_label
    return {"hf": ("HF", "e_scf"), "mp2": ("MP2", "e_tot"),
            SCALED_NAMES[label]: (label, "e_scs_tot")}


def answer_level(result, scaled: bool = False) -> str:
    """The level whose interaction energy is a counterpoise run's answer (``-q`` prints it):
    the level of the run's own answer, MP2 or a double hybrid's, or its scaled MP2 where
    ``scaled`` (a QCSchema input's ``scs-mp2``, ``sos-mp2`` or ``custom-scs-mp2``)."""
    if result.double_hybrid:
        return "double_hybrid"
    return SCALED_NAMES[result.scaled_label] if scaled else "mp2"


@dataclass(frozen=True)
class Fragments:
    """Atom counts (in file order), charges and 2S of each fragment."""

    counts: tuple[int, ...]
    charges: tuple[int, ...]
    spins: tuple[int, ...]

    def ranges(self) -> list[tuple[int, int]]:
        """``(first, stop)`` atom indices of each fragment."""
        out, start = [], 0
        for count in self.counts:
            out.append((start, start + count))
            start += count
        return out


def _int_list(name: str, value, count: int | None = None) -> tuple[int, ...]:
    if isinstance(value, str):
        items = value.replace(" ", "").split(",")
        if "" in items:  # "3,,3" or "3,3,": a count left out is not a count of none
            raise InputError(f"{name} {value!r}: expected whole numbers separated by commas, "
                             "with none left empty")
    else:
        items = list(value)
    try:  # text is parsed; anything else must already be an integer (no float is cut)
        numbers = tuple(int(x) if isinstance(x, str) else x.__index__() for x in items)
    except (AttributeError, TypeError, ValueError):
        raise InputError(f"{name} {value!r}: expected whole numbers separated by commas"
                         ) from None
    if count is not None and len(numbers) != count:
        raise InputError(f"{name} {value!r}: {len(numbers)} values for {count} fragments")
    return numbers


def parse_fragments(counts, natom: int, electrons, charge: int, charges=None,
                    spins=None, spin: int | None = None) -> Fragments:
    """The fragments of a complex of ``natom`` atoms: ``counts`` atom counts in file order
    (e.g. "3,3"), summing to ``natom``, at least two; ``charges`` (default all 0, then summing
    to the complex's ``charge``) and ``spins`` 2S (default 0 or 1 by each fragment's electron
    count), which must couple to the complex's ``spin`` 2S when given (|S1 - S2| <= S <= S1 +
    S2 for two fragments). ``electrons[k]`` is the electron count of fragment k's atoms when
    neutral."""
    sizes = _int_list("--fragments", counts)
    if len(sizes) < 2 or any(n < 1 for n in sizes):
        raise InputError(f"--fragments {counts!r}: give at least two positive atom counts in "
                         "file order, e.g. --fragments 3,3")
    if sum(sizes) != natom:
        raise InputError(f"--fragments {counts!r} counts {sum(sizes)} atoms; the molecule has "
                         f"{natom}")
    n = len(sizes)
    q = _int_list("--fragment-charges", charges, n) if charges is not None else (0,) * n
    if charges is None and charge != 0:
        raise InputError(f"the complex has charge {charge}: give --fragment-charges (summing "
                         f"to {charge})")
    if sum(q) != charge:
        raise InputError(f"--fragment-charges {charges!r} sum to {sum(q)}; the complex's charge "
                         f"is {charge}")
    counts_e = [electrons[k] - q[k] for k in range(n)]
    s = _int_list("--fragment-spins", spins, n) if spins is not None else tuple(
        e % 2 for e in counts_e)
    for k, e in enumerate(counts_e):
        if e < 0:
            raise InputError(f"fragment {k + 1}: charge {q[k]:+d} takes away {electrons[k] - e} "
                             f"electrons of its {electrons[k]}; give --fragment-charges that "
                             "fit")
    for k, (e, two_s) in enumerate(zip(counts_e, s)):
        why = ("2S cannot be negative" if two_s < 0 else
               f"that is more unpaired electrons than its {e}" if two_s > e else
               "2S must have the parity of the electron count" if (e - two_s) % 2 else None)
        if why:
            raise InputError(f"fragment {k + 1}: {e} electrons cannot have 2S = {two_s} ({why}); "
                             "give --fragment-spins that fit")
    low, high = max(0, 2 * max(s) - sum(s)), sum(s)
    if spin is not None and not low <= spin <= high:
        raise InputError(f"fragment spins 2S = {','.join(map(str, s))} couple to a total 2S "
                         f"from {low} to {high}, not to the complex's 2S = {spin}; give "
                         "fragment spins (--fragment-spins) or a complex's 2S (--spin; a "
                         "QCSchema input's molecular_multiplicity) that match")
    return Fragments(sizes, q, s)


def _fragment_mole(mol, fragments: Fragments, k: int, own_basis: bool = False):
    """Fragment k of the built complex ``mol`` in the complex's basis: the other atoms as
    ghosts; with ``own_basis``, its atoms alone (an unbuilt Mole in Bohr with the complex's
    basis and ECP settings)."""
    from pyscf import gto

    from .geometry import GHOST_PREFIX
    from .molecule import ghost_basis, is_ghost_label

    first, stop = fragments.ranges()[k]
    atoms = []
    for index, (label, coords) in enumerate(mol._atom):
        if first <= index < stop:
            atoms.append((label, tuple(coords)))
        elif not own_basis:  # another fragment's atom as a ghost under its own label
            # (GHOST-O1 keeps O1's basis; an atom given as a ghost stays as it is)
            ghost = label if is_ghost_label(label) else GHOST_PREFIX + label
            atoms.append((ghost, tuple(coords)))
    frag = gto.Mole()
    frag.atom = atoms
    frag.unit = "Bohr"
    frag.basis = ghost_basis(mol.basis, [label for label, _ in atoms])
    frag.cart, frag.nucmod = mol.cart, mol.nucmod
    frag.ecp = mol.ecp
    frag.charge = fragments.charges[k]
    frag.spin = fragments.spins[k]
    return frag


def _in_basis(own_basis: bool) -> str:
    """What names a fragment's run in its own basis ('' for its run in the complex's)."""
    return " in its own basis" if own_basis else ""


@contextmanager
def _named(fragments: Fragments, k: int, own_basis: bool = False):
    """An error of fragment ``k``'s checks or run (``own_basis``: of its run in its own basis)
    names the fragment (the same type, the same attributes)."""
    try:
        yield
    except DFMP2Error as exc:
        first, stop = fragments.ranges()[k]
        atoms = f"atom {stop}" if stop - first == 1 else f"atoms {first + 1}-{stop}"
        raise _reworded(exc, f"fragment {k + 1} ({atoms}){_in_basis(own_basis)}: {exc}"
                        ) from None


@contextmanager
def _finished_said(complex_result, parts, own_parts):
    """A fragment's error also gives the totals of the runs finished before it (the complex,
    the fragments in the complex's basis, then in their own), which the failed counterpoise
    run cannot return."""
    try:
        yield
    except DFMP2Error as exc:
        if complex_result is None:  # a distributed run's other ranks: rank 0 says it
            raise
        d = min(10, complex_result.corr_decimals)  # no digit its precision does not vouch for
        done = [f"the complex {complex_result.e_return:.{d}f} Eh",
                *(f"fragment {k + 1}{_in_basis(own)} {p.e_return:.{d}f} Eh"
                  for own, runs in ((False, parts), (True, own_parts))
                  for k, p in enumerate(runs))]
        raise _reworded(exc, f"{exc}; finished before it: {', '.join(done)} (total energies)"
                        ) from None


def _warn_cores_apart(complex_mol, fragment_moles) -> None:
    """A WARNING where the fragments' frozen cores do not add up to the complex's: Psi4's rule
    gives a shell back to a molecule that would have no valence electron (Li+ alone, not Li+
    beside water), so its fragments freeze another core than the complex, as Psi4 run
    fragment by fragment does; PySCF's table freezes each atom's core alike everywhere."""
    import logging

    from .molecule import quiet_pyscf
    from .reference import core_orbitals

    def built(frag):  # the fragments' Moles are built in their own runs
        frag = frag.copy()
        frag.verbose = 0
        with quiet_pyscf():
            frag.build(dump_input=False, parse_arg=False)
        return frag

    whole = core_orbitals(complex_mol, "psi4")
    parts = [core_orbitals(built(frag), "psi4") for frag in fragment_moles]
    if sum(parts) != whole:
        logging.getLogger(__name__).warning(
            "the fragments freeze %s core orbitals (%s), the complex %d: Psi4's rule gives a "
            "shell back to a fragment that would have no valence electron, so E(int) compares "
            "two cores; PySCF's table (--frozen-core on a geometry) freezes them alike",
            sum(parts), " + ".join(map(str, parts)), whole)


def _reworded(exc: DFMP2Error, message: str) -> DFMP2Error:
    """``exc`` with ``message`` (the same type, the same other arguments and attributes)."""
    reworded = copy.copy(exc)
    reworded.args = (message, *exc.args[1:])
    return reworded


def run_counterpoise(geometry, fragments, fragment_charges=None, fragment_spins=None,
                     progress=None, environment=None, threads=None, **options):
    """The complex's :class:`~dfmp2.results.Result` with ``interaction`` set: the
    counterpoise-corrected interaction energies (module docstring), each fragment's energies
    and what the fragments were; its ``warnings`` those of every run, a fragment's named.
    ``fragments``: atom counts in file order ("3,3" or a sequence);
    ``fragment_charges``/``fragment_spins`` per fragment (see :func:`parse_fragments`);
    ``threads``: every thread pool held to it for all the runs, as :func:`dfmp2.run`'s;
    ``options``: those of :func:`dfmp2.run`, for every run."""
    from ._logged import kept_warnings
    from .threads import limit

    with limit(threads), kept_warnings() as warned:
        result = _counterpoise(geometry, fragments, fragment_charges, fragment_spins, progress,
                               environment, options)
    return None if result is None else replace(result, warnings=tuple(warned))


def _counterpoise(geometry, fragments, fragment_charges, fragment_spins, progress, environment,
                  options: dict):
    from qcelemental import constants

    from ._logged import labelled
    from .api import check_run, run, run_molecule, silenced
    from .options import Options

    opts = Options.from_kwargs(**options)
    with silenced():  # its warnings are the complex's run's, said there
        mol = run_molecule(geometry, options, opts)
    sizes = _int_list("--fragments", fragments)
    start, electrons = 0, []  # of each fragment when neutral (ECP cores excluded)
    for n in sizes:
        electrons.append(int(sum(mol.atom_charge(i)
                                 for i in range(start, min(mol.natm, start + n)))))
        start += n
    frags = parse_fragments(fragments, mol.natm, electrons, int(mol.charge), fragment_charges,
                            fragment_spins, int(mol.spin))
    if opts.frozen not in (None, 0, ()):  # freezing nothing is allowed
        raise InputError(f"frozen={opts.frozen!r} with a counterpoise correction: the complex's "
                         "lowest orbitals are not each fragment's, so the fragments would freeze "
                         "other orbitals than the complex; use frozen_core (--frozen-core: each "
                         "atom's core, alike in the complex and its fragments)")
    # every fragment's molecule and run are checked before any SCF: no complex result is
    # computed only to be lost to a fragment that cannot run (the fragments' own pair energies
    # are not asked for: the plot shows the complex's)
    nfrag = len(frags.counts)
    moles = [_fragment_mole(mol, frags, k) for k in range(nfrag)]
    own_moles = [_fragment_mole(mol, frags, k, own_basis=True) for k in range(nfrag)]
    if opts.core == "psi4":  # PySCF's table adds up atom by atom: alike by construction
        _warn_cores_apart(mol, moles)
    # each fragment's Mole carries the complex's basis and ECPs as resolved for the complex
    # (a -PP basis's partners, the ECPs of the elements it has): not named again for it
    # (ecp 'none' is passed on: the fragments say, as the complex does, what it means; their
    # Moles are in Bohr, whatever the complex's unit)
    per_fragment = [{**{key: v for key, v in options.items()
                        if key not in ("basis", "ecp", "unit")
                        or (key == "ecp" and str(v).strip().lower() == "none")},
                     "chkfile": None, "pair_energies": False,
                     "charge": frags.charges[k], "spin": frags.spins[k]}
                    for k in range(nfrag)]
    # (fragment, in its own basis, its Mole) of each fragment's run: every fragment in the
    # complex's basis, then every fragment in its own (the cheaper runs)
    runs = [(k, own, frag) for own, fragment_moles in ((False, moles), (True, own_moles))
            for k, frag in enumerate(fragment_moles)]
    check_run(geometry, options)  # the complex's own refusals, named as its run names them
    for k, own, frag in runs:
        with _named(frags, k, own):  # the fragment's molecule is built and checked here too
            check_run(frag, per_fragment[k])
    complex_result = run(geometry, progress=progress, environment=environment, **options)
    parts, own_parts = [], []  # the fragments' results in the complex's basis, in their own
    for k, own, frag in runs:
        stage = f"fragment {k + 1}/{nfrag}{_in_basis(own)}"
        report = (lambda s, d, t, _p=stage: progress(f"{_p} {s}", d, t)) if progress else None
        with _named(frags, k, own), _finished_said(complex_result, parts, own_parts), \
                labelled(f"fragment {k + 1}{_in_basis(own)}"):  # its lines and warnings say so
            (own_parts if own else parts).append(run(frag, progress=report, **per_fragment[k]))
    if complex_result is None:  # a distributed run's other ranks: rank 0 reports
        return None
    to_kcal = constants.conversion_factor("hartree", "kcal/mol")
    table = levels(complex_result)

    def totals_eh(result) -> dict:  # a run's total energy at each level
        return {lv: getattr(result, attr) for lv, (_label, attr) in table.items()}

    def energy(value_eh: float) -> dict:
        return {"eh": value_eh, "kcal_mol": value_eh * to_kcal}

    interaction = {
        "method": "counterpoise (Boys-Bernardi): every fragment in the complex's basis; "
                  "uncorrected: every fragment in its own basis",
        "fragments": [{"atoms": [first, stop], "natom": stop - first, "charge": q,
                       "multiplicity": s + 1}
                      for (first, stop), q, s in zip(frags.ranges(), frags.charges,
                                                     frags.spins)],
        "levels": {lv: label for lv, (label, _attr) in table.items()},
        "totals_eh": {"complex": totals_eh(complex_result),
                      "fragments": [totals_eh(part) for part in parts],
                      "fragments_own_basis": [totals_eh(part) for part in own_parts]},
        "hartree_to_kcal_mol": to_kcal,
    }
    # the correlation's parts: what opposite- and same-spin pairs add to the interaction
    for part, attr in (("reference", "e_scf"), ("singles", "e_singles"), ("os", "e_corr_os"),
                       ("ss", "e_corr_ss")):
        value = getattr(complex_result, attr) - sum(getattr(p, attr) for p in parts)
        interaction.setdefault("components", {})[part] = energy(value)
    totals = interaction["totals_eh"]

    def complex_less(fragments: str) -> dict:  # E(complex) - sum_k E(k) per level, Eh
        return {lv: totals["complex"][lv] - sum(f[lv] for f in totals[fragments])
                for lv in table}

    corrected, uncorrected = complex_less("fragments"), complex_less("fragments_own_basis")
    interaction.update({lv: energy(corrected[lv]) for lv in table})
    interaction["uncorrected"] = {lv: energy(uncorrected[lv]) for lv in table}
    interaction["bsse"] = {lv: energy(corrected[lv] - uncorrected[lv]) for lv in table}
    return replace(complex_result, interaction=interaction,
                   molecule=_with_fragments(complex_result.molecule, frags))


def _with_fragments(molecule, frags):
    """The complex's record with QCSchema's ``fragments``, ``fragment_charges`` and
    ``fragment_multiplicities`` (atom indices from 0), where its molecule has none of its own
    (an input's molecule is echoed as it was given)."""
    schema = molecule.qcschema
    if not isinstance(schema, dict) or schema.get("fragments"):
        return molecule
    return replace(molecule, qcschema={
        **schema, "fragments": [list(range(first, stop)) for first, stop in frags.ranges()],
        "fragment_charges": [float(q) for q in frags.charges],
        "fragment_multiplicities": [int(s) + 1 for s in frags.spins]})
