"""QCSchema in and out: an ``AtomicInput`` (schema v1 or v2, detected) as a dfmp2 run, and its
result as an ``AtomicResult`` of the same version, validated by qcelemental's models.

Keywords take Psi4's names where Psi4 has one (:data:`PSI4_KEYWORDS`), so an input written for
Psi4 through QCEngine runs here unchanged, plus dfmp2's own option names (:data:`OWN_KEYWORDS`).
An unknown keyword, method, driver or value is an :class:`~dfmp2.errors.InputError` naming
the valid ones. Methods: ``mp2`` (``return_energy`` the MP2 total), ``scs-mp2`` and ``sos-mp2``
(the scaled total at the published scales, as Psi4 returns them), ``custom-scs-mp2`` (the
total at ``mp2_os_scale``/``mp2_ss_scale``, Psi4's), and the double hybrids of
:mod:`dfmp2.functionals` by name (``b2plyp``,
``dsd-pbep86``, ...: the double hybrid's total, on an RKS or UKS reference).
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
from dataclasses import dataclass, replace

from ._names import cartesian_elsewhere
from ._quiet import quiet
from .errors import DFMP2Error, InputError

__all__ = ["METHODS", "OWN_KEYWORDS", "PSI4_KEYWORDS", "SchemaJob", "answering", "input_echo",
           "in_input_terms", "input_fragments", "is_schema_input", "keywords_of",
           "method_options", "read_input", "result_dict", "retell_in_input_terms",
           "run_qcschema", "schema_version"]

#: Methods an input's ``model.method`` may name (case-insensitive) besides the double hybrids.
METHODS = ("mp2", "scs-mp2", "sos-mp2", "custom-scs-mp2")


#: Keywords that set the MP2 scales (Psi4's and dfmp2's own names).
_SCALE_KEYWORDS = {"mp2_os_scale", "mp2_ss_scale", "os_scale", "ss_scale"}


def method_options(method: str) -> dict:
    """The dfmp2 options a method name sets: ``sos`` for sos-mp2, ``xc`` for a double
    hybrid; an :class:`InputError` naming the valid methods otherwise."""
    from .functionals import DOUBLE_HYBRIDS, find_double_hybrid

    if method in METHODS:
        return {"sos": True} if method == "sos-mp2" else {}
    dh = find_double_hybrid(method) if method else None
    if dh is None:
        names = ", ".join([*METHODS, *(n.lower() for n in DOUBLE_HYBRIDS)])
        raise InputError(f"method {method!r}: dfmp2 runs {names}")
    return {"xc": dh.name}


def answering(result, job: "SchemaJob"):
    """``result`` as the answer to ``job``'s input: its ``method.qcschema_method`` the input's
    method, so that its ``e_return`` and record (:meth:`dfmp2.results.Result.to_dict`) are that
    method's answer (the scaled total of :data:`dfmp2._names.SCALED_METHODS`)."""
    return replace(result, method=replace(result.method, qcschema_method=job.method))


def _flag(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise InputError(f"keyword {name}={value!r}: expected true or false")


def _choice(name: str, value, table: dict):
    key = str(value).strip().lower()
    if key not in table:
        raise InputError(f"keyword {name}={value!r}: expected one of {', '.join(table)}")
    return table[key]


def _number(kind):
    """A keyword's finite number (a numeric string too); for ``int``, a whole one (60.9 grid
    points or 50.5 iterations are refused, not truncated)."""
    def convert(name: str, value):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise InputError(f"keyword {name}={value!r}: expected a number")
        try:
            number = float(value)
        except ValueError:
            raise InputError(f"keyword {name}={value!r}: expected a number") from None
        if not math.isfinite(number):
            raise InputError(f"keyword {name}={value!r}: expected a finite number")
        if kind is int:
            if number != int(number):
                raise InputError(f"keyword {name}={value!r}: expected a whole number")
            return int(number)
        return number
    return convert


def _convergence(name: str, value) -> float:
    """Psi4's convergence keywords: a threshold (1e-8), or a whole number n >= 1 meaning 1e-n
    (Psi4's own reading of ``e_convergence 8``)."""
    number = _number(float)(name, value)
    if number >= 1 and number == int(number):
        threshold = 10.0 ** -min(int(number), 400)
        if number > 16:  # below float64's resolution of an energy: no SCF converges to it
            raise InputError(f"keyword {name}={value!r}: a whole number n means 1e-n, and "
                             "that is below what a float64 energy resolves; give 6 to 12 "
                             "(1e-6 to 1e-12) or a threshold")
        return threshold
    return number


def _text(name: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"keyword {name}={value!r}: expected a name")
    return value.strip()


#: Psi4's SCF types and what dfmp2 runs for them (density fitting, or exact integrals).
_SCF_TYPES = {"df": "df", "mem_df": "df", "disk_df": "df", "dfdirect": "df", "pk": "conv",
              "direct": "conv", "out_of_core": "conv", "conv": "conv"}
_MP2_TYPES = {"df": "df"}
_REFERENCES = {"rhf": "rhf", "uhf": "uhf", "rohf": "rohf", "rks": "rhf", "uks": "uhf"}
#: Psi4's stability_analysis values: dfmp2's are the same (--stability).
_STABILITY = {"none": "none", "check": "check", "follow": "follow"}
#: Psi4's guesses dfmp2 (PySCF) has, and dfmp2's own names: AUTO is the program's default, SAD
#: a superposition of atomic SCF densities (PySCF's 'atom'), CORE the core Hamiltonian's.
_GUESSES = {"auto": "minao", "sad": "atom", "core": "1e", "huckel": "huckel",
            "modhuckel": "mod_huckel", "sap": "sap", "minao": "minao", "atom": "atom",
            "mod_huckel": "mod_huckel", "1e": "1e"}

#: Psi4 keyword -> (dfmp2 option, converter).
PSI4_KEYWORDS = {
    "scf_type": ("scf_type", lambda n, v: _choice(n, v, _SCF_TYPES)),
    "mp2_type": (None, lambda n, v: _choice(n, v, _MP2_TYPES)),  # dfmp2 computes DF-MP2 only
    "reference": ("reference", lambda n, v: _choice(n, v, _REFERENCES)),
    "freeze_core": ("frozen_core", _flag),
    "df_basis_mp2": ("auxbasis", _text),
    "df_basis_scf": ("scf_auxbasis", _text),
    "mp2_os_scale": ("os_scale", _number(float)),
    "mp2_ss_scale": ("ss_scale", _number(float)),
    "puream": ("cartesian", lambda n, v: not _flag(n, v)),
    "e_convergence": ("conv_tol", _convergence),
    "d_convergence": ("conv_tol_grad", _convergence),
    "maxiter": ("max_cycle", _number(int)),
    "stability_analysis": ("stability", lambda n, v: _choice(n, v, _STABILITY)),
    "guess": ("guess", lambda n, v: _choice(n, v, _GUESSES)),
    "level_shift": ("level_shift", _number(float)),
    "dft_radial_points": ("_radial", _number(int)),  # with dft_spherical_points: grid
    "dft_spherical_points": ("_angular", _number(int)),
}

#: Psi4's DFT grid defaults (when an input gives one of the two point counts).
PSI4_GRID = (75, 302)

#: dfmp2's own option names a keyword may use (``dfmp2 run --help`` says what each does).
OWN_KEYWORDS = ("backend", "precision", "max_memory", "cpu_blas", "fused_energy",
                "force_outcore", "scratch_dir", "scf_precision", "frozen", "core_rule", "ecp",
                "chkfile", "nki_emulator", "nki_simulator", "require_nki", "nki_matmul",
                "nki_target", "grid", "pair_energies", "os_scale", "ss_scale", "device",
                "device_memory", "cartesian")


@dataclass(frozen=True)
class SchemaJob:
    """One QCSchema input as a dfmp2 run: the molecule (an unbuilt PySCF ``Mole`` in Bohr),
    the run's options, the method, the schema version, the validated input (a dict of
    schema v1 field names) and, for a v2 input, its ``specification.program`` (v1 has no such
    field), which the result echoes."""

    mole: object
    options: dict
    method: str
    version: int
    input: dict
    program: str | None = None


def _models(version: int):
    try:
        from qcelemental.models import v1, v2
    except ImportError as exc:  # a dependency: only a broken install lacks it
        raise InputError(f"QCSchema needs qcelemental ({exc}); pip install qcelemental") from None
    return v1 if version == 1 else v2


def is_schema_input(geometry) -> bool:
    """Whether a GEOMETRY argument is a QCSchema input: a ``.json`` path or JSON text."""
    if not isinstance(geometry, (str, os.PathLike)):
        return False
    text = str(geometry)
    return text.lower().endswith(".json") or text.lstrip().startswith("{")


def schema_version(data: dict) -> int:
    """1 or 2, from ``schema_name``/``schema_version`` (v1: ``qcschema_input``; v2:
    ``qcschema_atomic_input``)."""
    name, version = data.get("schema_name"), data.get("schema_version")
    v1_names = name in ("qcschema_input", None) and version in (1, None)
    if v1_names and "model" in data:
        return 1
    if name == "qcschema_atomic_input" or version == 2 or "specification" in data:
        return 2
    if v1_names:
        raise InputError("QCSchema v1 AtomicInput without 'model': give model.method and "
                         "model.basis (e.g. {\"method\": \"mp2\", \"basis\": \"cc-pvdz\"})")
    raise InputError(f"not a QCSchema AtomicInput: schema_name {name!r}, schema_version "
                     f"{version!r} (expected qcschema_input v1 or qcschema_atomic_input v2)")


def read_input(source) -> SchemaJob:
    """A QCSchema ``AtomicInput`` (a dict, JSON text, or a path to a JSON file) as a
    :class:`SchemaJob`; raises :class:`InputError` with one line on anything dfmp2 cannot
    run."""
    data = _load(source)
    version = schema_version(data)
    models = _models(version)
    try:
        with quiet():  # qcelemental prints its warnings (this thread's output only)
            model = models.AtomicInput(**data)
    except Exception as exc:  # pydantic's validation error: keep its first lines
        raise InputError(f"invalid QCSchema v{version} AtomicInput: "
                         f"{_first_lines(exc)}") from None
    if version == 2:  # one form from here on: v1 field names
        spec = model.specification
        driver, method, basis = str(spec.driver.value), spec.model.method, spec.model.basis
        keywords, molecule = dict(spec.keywords), model.molecule
        as_v1, program = json.loads(model.convert_v(1).serialize("json")), spec.program
    else:
        driver, method, basis = str(model.driver.value), model.model.method, model.model.basis
        keywords, molecule = dict(model.keywords), model.molecule
        as_v1, program = json.loads(model.serialize("json")), None
    if driver != "energy":
        raise InputError(f"driver {driver!r}: dfmp2 computes energies (driver 'energy')")
    protocol = (as_v1.get("protocols") or {}).get("wavefunction") or "none"
    wavefunction = str(getattr(protocol, "value", protocol))  # an enum in the model's dict
    if wavefunction != "none":
        raise InputError(f"protocols.wavefunction {wavefunction!r}: dfmp2 returns no "
                         "wavefunction (its result has energies only); give 'none' or leave it "
                         "out")
    from .results import RESULT_EXTRAS

    taken = sorted(set(as_v1.get("extras") or {}) & set(RESULT_EXTRAS))
    if taken:
        raise InputError(f"extras {', '.join(map(repr, taken))}: names dfmp2's result uses for "
                         "its own records (the result keeps the input's extras beside them); "
                         "rename them")
    method = (method or "").strip().lower()
    by_method = method_options(method)
    if not isinstance(basis, str) or not basis.strip():
        raise InputError("model.basis must name an orbital basis set (e.g. 'cc-pvdz')")
    reference = str(keywords.get("reference", "")).strip().lower()
    if reference in ("rks", "uks") and "xc" not in by_method:
        raise InputError(f"keyword reference={reference!r} is a Kohn-Sham reference: it needs a "
                         f"double-hybrid method, not {method!r}")
    given = {k.lower() for k in keywords}
    if method in ("scs-mp2", "sos-mp2") and given & _SCALE_KEYWORDS:
        raise InputError(f"method {method!r} is {method.upper()} at its published scales (Psi4 "
                         f"returns them whatever {', '.join(sorted(given & _SCALE_KEYWORDS))} "
                         "say); for other scales use method 'custom-scs-mp2' (Psi4's), or 'mp2' "
                         "(the scaled energies are in extras)")
    if "xc" in by_method and given & {"mp2_os_scale", "mp2_ss_scale"}:
        raise InputError(f"keywords mp2_os_scale/mp2_ss_scale set custom SCS-MP2's scales (Psi4 "
                         f"ignores them for {method}); to change the double hybrid's PT2 "
                         "scales give dfmp2's own keywords os_scale and ss_scale")
    options = _psi4_conventions({"basis": basis.strip(), **keyword_options(keywords),
                                 **by_method}, keywords)
    return SchemaJob(_mole(molecule), options, method, version, as_v1, program)


#: Options an input's molecule or ``model.method`` sets, which a command line may not change for
#: a QCSchema input (its AtomicResult would echo values that did not run): where to set each.
INPUT_ONLY = {"charge": "molecule.molecular_charge", "spin": "molecule.molecular_multiplicity",
              "xc": "model.method", "sos": "model.method"}


#: Options of the machine a run uses (QCEngine's task memory and scratch directory): applied
#: but not echoed as keywords, since they change no number (the record has them in extras).
_RESOURCES = frozenset({"max_memory", "scratch_dir"})


#: Options a record states elsewhere than in its keywords: the orbital basis (``model.basis``),
#: those of the molecule and the method (:data:`INPUT_ONLY`: ``molecule``, ``model.method``,
#: ``extras.method.scaling``) and the input's unit (``extras.molecule.input_unit``).
_STATED_ELSEWHERE = frozenset({"basis", "unit", *INPUT_ONLY})


def keywords_of(options: dict, method=None) -> dict:
    """The keywords the record of a run given ``options`` (dfmp2 option names and values: those
    given to :func:`dfmp2.run` or on the command line) echoes, as a QCSchema input's run echoes
    the command line's (:func:`with_overrides`): each under the keyword that sets it
    (:func:`_keyword_of`), tuples as lists; not the machine's resources (:data:`_RESOURCES`),
    options given as None (their default), nor those stated elsewhere
    (:data:`_STATED_ELSEWHERE`). With the run's ``method`` (:class:`dfmp2.results.Method`),
    also what a QCSchema input would otherwise read Psi4's way (:func:`_psi4_conventions`), so
    that the keywords run the same calculation again: the rule of a frozen core
    (``core_rule``, where ``freeze_core`` alone means Psi4's core) and, for a basis Psi4 runs
    Cartesian, whether it ran so (``cartesian``); and ``--sos``'s scales (``os_scale`` and
    ``ss_scale`` 0), which a command line's ``model.method`` (mp2) does not say. A custom
    double hybrid (``xc`` an expression) has no ``model.method`` an input may name: its record
    does not run again."""
    from .options import chosen

    keywords = {_keyword_of(option): _json_value(chosen(option, value))
                for option, value in options.items()
                if value is not None and option not in _RESOURCES | _STATED_ELSEWHERE}
    if method is not None:
        if method.core_rule is not None and keywords.get("freeze_core"):
            keywords.setdefault("core_rule", method.core_rule)
        if cartesian_elsewhere(method.basis_name) and not any(
                _option_of(k) == "cartesian" for k in keywords):
            keywords["cartesian"] = bool(method.cartesian)
        if options.get("sos"):
            keywords.setdefault("os_scale", method.os_scale)
            keywords["ss_scale"] = method.ss_scale
    return keywords


def _json_value(value):
    """An option's value as JSON holds it: a tuple (``frozen``, ``grid``) as a list, a path as
    its text."""
    if isinstance(value, (tuple, list)):
        return [_json_value(item) for item in value]
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _option_of(keyword: str) -> str | None:
    """The dfmp2 option a keyword sets (None: none, e.g. mp2_type, or an unknown name; Psi4's
    grid point counts set ``grid``)."""
    key = keyword.lower()
    if key in PSI4_KEYWORDS:
        option = PSI4_KEYWORDS[key][0]
        return "grid" if option in ("_radial", "_angular") else option
    return key if key in OWN_KEYWORDS else None


def _keyword_of(option: str) -> str:
    """The keyword that sets ``option``: dfmp2's own name, else Psi4's."""
    if option in OWN_KEYWORDS:
        return option
    return next((name for name, (target, _) in PSI4_KEYWORDS.items() if target == option),
                option)


def with_overrides(job: SchemaJob, overrides: dict) -> SchemaJob:
    """``job`` with dfmp2 options that win over its input's (the command line's), applied to
    its options and echoed in the input its AtomicResult repeats, so that the result says what
    ran: ``basis`` as ``model.basis``, any other option but the machine's resources
    (:data:`_RESOURCES`) as its keyword (:func:`_keyword_of`) in place of those of the input
    that set it. Options of the molecule or the method (:data:`INPUT_ONLY`) are refused; a
    ``unit`` must be Bohr, the unit of QCSchema's geometry (it is the input's own: not echoed)."""
    from .options import checked_choice, chosen

    overrides = {option: chosen(option, value) for option, value in overrides.items()}
    for option in overrides:
        if option in INPUT_ONLY:
            raise InputError(f"--{option.replace('_', '-')} with a QCSchema input: set "
                             f"{INPUT_ONLY[option]} in the input instead")
    if "unit" in overrides and checked_choice("unit", overrides["unit"]) != "bohr":
        raise InputError(f"--unit {overrides['unit']} with a QCSchema input: its "
                         "molecule.geometry is in Bohr by QCSchema's definition; leave --unit "
                         "out")
    given = copy.deepcopy(job.input)
    model, keywords = dict(given["model"]), dict(given.get("keywords") or {})
    options = {**job.options, **overrides}
    for option, value in overrides.items():
        # frozen and frozen_core (with the input's core rule) are one setting: the command
        # line's replaces them all
        frozen_options = {"frozen", "frozen_core", "core_rule"}
        replaced = {option} | (frozen_options if option in frozen_options else set())
        for other in replaced - {option} - set(overrides):  # both given: Options refuses
            options.pop(other, None)
        if option == "basis":
            model["basis"] = value
            continue
        if option == "unit":  # Bohr, the input's own (checked above)
            continue
        named = [k for k in keywords if _option_of(k) in replaced]
        for name in named:
            del keywords[name]
        if option not in _RESOURCES or any(_option_of(k) == option for k in named):
            # a machine's resource is echoed only where the input named it
            keywords[_keyword_of(option)] = list(value) if isinstance(value, tuple) else value
    if options.get("scf_type") == "conv" and "scf_auxbasis" not in overrides:
        options.pop("scf_auxbasis", None)  # Psi4 ignores DF_BASIS_SCF under exact integrals
    given["model"], given["keywords"] = model, keywords
    options = _psi4_conventions(options, keywords)  # the echoed keywords mean what ran
    return replace(job, options=options, input=given)


def _psi4_conventions(options: dict, keywords: dict) -> dict:
    """``options`` as Psi4 reads the input they come from, where dfmp2's own defaults differ:
    ``freeze_core`` freezes Psi4's core (:func:`dfmp2.reference.psi4_core_orbitals`) unless
    a ``core_rule`` keyword names the rule, and a
    3-21G or 6-31G-family basis runs Cartesian unless a keyword (``puream``, ``cartesian``)
    says how. ``keywords``: the input's, or those its result echoes (the command line's
    included)."""
    if options.get("frozen_core") and not any(_option_of(k) == "core_rule" for k in keywords):
        options["core_rule"] = "psi4"
    if not any(_option_of(k) == "cartesian" for k in keywords):
        options.pop("cartesian", None)
        if cartesian_elsewhere(options["basis"]):
            options["cartesian"] = True
    return options


def keyword_options(keywords: dict) -> dict:
    """dfmp2 options from QCSchema keywords (Psi4's names, or dfmp2's own). Two keywords that
    set one option (``freeze_core`` and ``FREEZE_CORE``, ``mp2_os_scale`` and ``os_scale``)
    are refused: which one wins would depend on their order in the input."""
    options = {}
    setters: dict[str, str] = {}
    for name, value in keywords.items():
        key = name.lower()
        option = PSI4_KEYWORDS[key][0] if key in PSI4_KEYWORDS else (
            key if key in OWN_KEYWORDS else None)
        if option is not None and option in setters:
            raise InputError(f"keywords {setters[option]!r} and {name!r} both set "
                             f"{option.lstrip('_')}; give one of them")
        if option is not None:
            setters[option] = name
        if key in PSI4_KEYWORDS:
            option, convert = PSI4_KEYWORDS[key]
            converted = convert(name, value)
            if option is not None:
                options[option] = converted
        elif key in OWN_KEYWORDS:
            options[key] = value
        else:
            valid = sorted(PSI4_KEYWORDS) + sorted(OWN_KEYWORDS)
            raise InputError(f"unknown keyword {name!r}; valid keywords: {', '.join(valid)}")
    if options.get("scf_type") == "conv":  # Psi4 ignores DF_BASIS_SCF under exact integrals
        options.pop("scf_auxbasis", None)
    radial, angular = options.pop("_radial", None), options.pop("_angular", None)
    if radial is not None or angular is not None:
        if "grid" in options:
            raise InputError("keywords dft_radial_points/dft_spherical_points contradict grid; "
                             "give one of them")
        # a count given as 0 is a count (the grid's check refuses it), not "not given"
        options["grid"] = (PSI4_GRID[0] if radial is None else radial,
                           PSI4_GRID[1] if angular is None else angular)
    return options


def _mole(molecule):
    """An unbuilt PySCF ``Mole`` (Bohr) of a qcelemental Molecule: ghost atoms (``real``
    false) as ``GHOST-`` atoms, the charge and multiplicity as given."""
    from pyscf import gto

    from .geometry import GHOST_PREFIX

    geometry = molecule.geometry.reshape(-1, 3)
    real = list(molecule.real) if molecule.real is not None else [True] * len(geometry)
    for k, xyz in enumerate(geometry):
        if not all(math.isfinite(float(x)) for x in xyz):
            raise InputError(f"molecule.geometry: atom {k + 1} ({molecule.symbols[k]}) has a "
                             f"coordinate that is not a finite number ({list(map(float, xyz))})")
    if not any(real):
        raise InputError("molecule.real marks every atom a ghost: there are no electrons to "
                         "correlate")
    atoms = [((symbol.capitalize() if is_real else GHOST_PREFIX + symbol.capitalize()),
              tuple(float(x) for x in xyz))
             for symbol, xyz, is_real in zip(molecule.symbols, geometry, real)]
    whole = {}
    for field in ("molecular_charge", "molecular_multiplicity"):
        value = float(getattr(molecule, field))
        if value != round(value):  # qcelemental allows fractional ones; a run needs whole ones
            raise InputError(f"molecule.{field} {value:g}: dfmp2 needs a whole number (an "
                             "integer count of electrons and of unpaired ones)")
        whole[field] = int(round(value))
    mole = gto.Mole()
    mole.atom = atoms
    mole.unit = "Bohr"
    mole.charge = whole["molecular_charge"]
    mole.spin = whole["molecular_multiplicity"] - 1
    return mole


def result_dict(result, job: SchemaJob) -> dict:
    """The ``AtomicResult`` (as JSON-ready data) of ``result`` for ``job``'s input, in the
    input's schema version, validated by qcelemental: the input's molecule, model, keywords
    and id echoed, ``return_result`` the method's total energy."""
    # (the method answered: return_result and the extras that go with it, which the Result
    # keeps, so that a Result read back from this record writes it again)
    data = answering(result, job).to_dict()
    given = job.input
    data.update({
        "molecule": given["molecule"],
        "model": given["model"],
        "keywords": given.get("keywords", {}),
    })
    data["extras"]["molecule"]["input_unit_source"] = "qcschema"  # Bohr, by its definition
    for key, value in (given.get("extras") or {}).items():  # the input's extras pass through,
        data["extras"].setdefault(key, value)  # as QCEngine passes them (none is dfmp2's name)
    for key in ("id", "protocols"):
        if given.get(key) is not None:
            data[key] = given[key]
    v1 = _models(1)
    try:
        model = v1.AtomicResult(**data)
        if job.version == 2:  # v1 has no program: the input's, or dfmp2 where it gave none
            out = json.loads(model.convert_v(2).serialize("json"))
            out["input_data"]["specification"]["program"] = job.program or "dfmp2"
            return out
        return json.loads(model.serialize("json"))
    except Exception as exc:  # a result that does not validate is dfmp2's bug: say so
        raise RuntimeError(f"dfmp2's AtomicResult does not validate against qcelemental "
                           f"v{job.version}: {_first_lines(exc)}") from exc


def input_fragments(job: SchemaJob) -> tuple[str, str, str] | None:
    """The counterpoise fragments an input's molecule defines (``molecule.fragments`` of two
    or more, with their charges and multiplicities) as dfmp2's ``fragments``,
    ``fragment_charges`` and ``fragment_spins`` ("3,3", "0,0", "0,0"), or None when it defines
    one fragment (qcelemental's default). qcelemental's validation refuses fragments that are
    not consecutive atoms in order, which is how dfmp2 splits a complex."""
    molecule = job.input["molecule"]
    fragments = [list(f) for f in molecule.get("fragments") or []]
    if len(fragments) < 2:
        return None
    charges = [float(q) for q in molecule.get("fragment_charges") or [0.0] * len(fragments)]
    multiplicities = [float(m) for m in molecule.get("fragment_multiplicities")
                      or [1.0] * len(fragments)]
    if any(q != round(q) for q in charges + multiplicities):
        raise InputError(f"molecule.fragment_charges {charges} / fragment_multiplicities "
                         f"{multiplicities}: dfmp2 needs whole numbers")
    return (",".join(str(len(f)) for f in fragments), ",".join(str(int(q)) for q in charges),
            ",".join(str(int(m) - 1) for m in multiplicities))


def input_echo(job: SchemaJob) -> dict:
    """``job``'s input (with the overrides that ran, :func:`with_overrides`) as JSON data in
    the input's own schema version: what a failed run's record repeats as ``input_data``."""
    if job.version == 1:
        return copy.deepcopy(job.input)
    model = _models(1).AtomicInput(**job.input).convert_v(2)
    out = json.loads(model.serialize("json"))
    out["specification"]["program"] = job.program or "dfmp2"
    return out


def run_qcschema(source, **overrides) -> dict | None:
    """Run a QCSchema ``AtomicInput`` (dict, JSON text or path) and return the ``AtomicResult``
    of the same schema version as data. ``overrides``: dfmp2 options that win over the input's
    keywords (echoed in the result, :func:`with_overrides`), and :func:`dfmp2.run`'s own
    arguments (``progress``, ``environment``). Under torch.distributed every rank takes part
    and, as :func:`dfmp2.run`, rank 0 returns the result and every other rank None."""
    from .api import run
    from .options import Options

    fields = Options.field_names()
    job = with_overrides(read_input(source),
                         {k: v for k, v in overrides.items() if k in fields})
    try:
        result = run(job.mole, **job.options,  # run()'s own arguments (progress=, environment=)
                     **{k: v for k, v in overrides.items() if k not in fields})
    except DFMP2Error as exc:  # its advice in the input's terms too
        retell_in_input_terms(exc)
        raise
    if result is None:  # a distributed run's other ranks: rank 0 has the result
        return None
    return result_dict(result, job)


_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?![\w=-])(?! \(keyword)")
#: Flags that are not an option's name: the option, and the keyword value they stand for.
_FLAG_ALIASES = {"spherical": ("cartesian", False), "simulator": ("nki_simulator", True)}
#: Flags of what an input states in its own fields, not in keywords.
_INPUT_FIELDS = {**INPUT_ONLY, "multiplicity": "molecule.molecular_multiplicity",
                 "basis": "model.basis"}


def in_input_terms(message: str) -> str:
    """An error's ``message`` for a QCSchema input: a command-line flag of what the input
    states in its own fields (``--charge``, ``--spin``, ``--multiplicity``, ``--xc``, ``--sos``,
    ``--basis``) as that field, any other option's flag with the keyword that sets it
    ('--max-cycle (keyword maxiter)', '--no-fused-energy (keyword fused_energy false)'); the
    machine's resources, ``--unit`` (Bohr, the input's own) and other words as they are. A
    flag already followed by its keyword is left alone."""
    from .options import Options

    fields = Options.field_names()

    def term(match: re.Match) -> str:
        flag = match.group(1)
        if flag in _INPUT_FIELDS:
            return _INPUT_FIELDS[flag]
        negated = flag.startswith("no-")
        option = (flag[3:] if negated else flag).replace("-", "_")
        value = " false" if negated else ""
        if flag in _FLAG_ALIASES:
            option, given = _FLAG_ALIASES[flag]
            value = "" if given else " false"
        if option in fields and option not in _RESOURCES | {"unit"}:
            return f"{match.group(0)} (keyword {_keyword_of(option)}{value})"
        return match.group(0)

    return _FLAG.sub(term, message)


def retell_in_input_terms(exc: DFMP2Error) -> None:
    """``exc``'s message in the input's terms (:func:`in_input_terms`), in place, where it is
    one text (every dfmp2 error's; another is left as it is)."""
    if len(exc.args) == 1 and isinstance(exc.args[0], str):
        exc.args = (in_input_terms(exc.args[0]),)


def load_json(text, what: str):
    """``text`` (str or bytes) parsed as JSON, or one :class:`InputError` line naming ``what``
    and why not: not JSON (where), not UTF-8, nested too deeply for Python's parser."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{what} is not JSON: line {exc.lineno}, column {exc.colno}: "
                         f"{exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except RecursionError:
        raise InputError(f"{what} nests its JSON too deeply to read") from None
    except ValueError as exc:  # a number past Python's 4300-digit limit, and the like
        raise InputError(f"{what} holds JSON Python cannot read: {exc}") from None


def _load(source) -> dict:
    """The input as a dict: a dict, a QCSchema model object (qcelemental's AtomicInput, v1 or
    v2), JSON text, or the path of a JSON file."""
    if isinstance(source, dict):
        return source
    if callable(getattr(source, "serialize", None)):  # a qcelemental model, v1 or v2
        try:
            source = source.serialize("json")
        except Exception as exc:  # an object that only looks like one
            raise InputError(f"QCSchema input {type(source).__name__}: cannot be read "
                             f"({_first_lines(exc, 1)})") from None
    if not isinstance(source, (str, bytes, os.PathLike)):
        raise InputError(f"QCSchema input must be an AtomicInput (a dict, a qcelemental model, "
                         f"JSON text or a JSON file's path), got {type(source).__name__}")
    text = source
    if isinstance(source, (str, os.PathLike)) and not str(source).lstrip().startswith("{"):
        from ._files import check_readable_file

        check_readable_file(source, "QCSchema input")
        try:
            with open(source, encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise InputError(f"cannot read QCSchema input {str(source)!r}: "
                             f"{exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise InputError(f"QCSchema input {str(source)!r} is not UTF-8 text (byte "
                             f"{exc.start}: {exc.reason}); JSON files are UTF-8") from None
    data = load_json(text, "QCSchema input" if text is source
                     else f"QCSchema input {str(source)!r}")
    if not isinstance(data, dict):
        raise InputError("QCSchema input must be a JSON object (an AtomicInput)")
    return data


def _first_lines(exc: Exception, lines: int = 3) -> str:
    text = " ".join(str(exc).split("\n")[:lines])
    return " ".join(text.split())
