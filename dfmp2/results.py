"""The typed result of a run (Hartree throughout), its text summary and its JSON form.

A :class:`Result` holds energies and typed sub-records: :class:`MoleculeInfo` (what was
computed), :class:`ScfInfo` (the reference), :class:`Sizes`, :class:`Method` (every setting that
shaped the numbers, per element where PySCF resolves per element) and :class:`BackendInfo` (what
ran each op). ``to_dict`` is a QCSchema ``AtomicResult`` (schema v1) with dfmp2's records in
``extras``; ``summary`` is what a chemist reads, with the machinery under ``verbose``.
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import asdict, dataclass, field, fields, replace

from ._names import SCALED_METHODS, STABILITY_MODES, cartesian_elsewhere

__all__ = ["Result", "MoleculeInfo", "ScfInfo", "Sizes", "Method", "BackendInfo", "versions"]


@dataclass(frozen=True)
class MoleculeInfo:
    """The molecule as computed. ``formula`` in Hill order over real atoms; ``nghost`` counts
    ghost atoms (basis functions, no nucleus); ``qcschema`` is the QCSchema molecule (Bohr,
    whatever the input's unit); ``input_unit`` the unit the input's coordinates were read in
    ('angstrom' or 'bohr'; None for a ``Mole`` whose ``unit`` is another Bohr radius) and
    ``input_unit_source`` why: 'given' (``unit=``, ``--unit``), 'default' (Angstrom, none
    given), 'mole' (a ``Mole``'s own ``unit``) or 'qcschema' (Bohr, by QCSchema's definition);
    both None in a record from before they were kept."""

    formula: str
    natom: int
    nghost: int
    charge: int
    multiplicity: int
    nelectron: int
    nuclear_repulsion: float
    qcschema: dict
    input_unit: str | None = None
    input_unit_source: str | None = None


def _fixed(value: float, decimals: int, width: int = 0, plus: bool = False) -> str:
    """``value`` to ``decimals`` places, right-aligned in ``width`` (and signed with ``plus``),
    without a negative zero: a value that rounds to zero (a closed shell's ROHF singles,
    -1e-17 Eh; its UHF <S^2>) prints as 0."""
    if round(value, decimals) == 0:
        value = 0.0
    return f"{value:{'+' if plus else ''}{width}.{decimals}f}"


def _rate(gflops: float) -> str:
    """A GFLOP/s figure: whole numbers from 10 up, two significant digits below (a tiny
    molecule's 0.3 is not 0)."""
    return f"{gflops:.0f}" if gflops >= 10 else f"{gflops:.2g}"


@dataclass(frozen=True)
class ScfInfo:
    """The reference SCF: ``kind`` 'rhf', 'uhf', 'rohf', 'rks' or 'uks' (for KS ``xc`` names
    the functional), ``energy`` its total energy, ``cycles`` its iterations, ``homo``/``lumo``
    orbital energies over both spins (``lumo`` None without virtual orbitals),
    ``orbital_check`` what was verified of the orbitals before MP2, ``s2`` <S^2> of an
    unrestricted determinant and ``s2_deviation`` <S^2> - S(S+1) (None for restricted ones),
    ``restart`` what dfmp2's own SCF did with ``--chkfile`` (None without one), ``jk`` what
    built its J and K matrices, ``jk_stats`` for dfmp2's own J/K: calls, seconds and GFLOP of
    their products (None otherwise), ``grid`` the DFT grid of a KS reference
    (:func:`dfmp2.functionals.grid_record`; None for HF), ``solver`` what converged dfmp2's
    own SCF (PySCF's DIIS, or DIIS then PySCF's second-order solver when DIIS stalled, and
    whether a KS SCF stalled on its grid's noise was accepted: :func:`dfmp2.scf.run_scf`;
    None for an SCF object given to dfmp2), ``conv_tol_grad`` the orbital-gradient threshold
    it was converged to (PySCF's sqrt(conv_tol) where the object set none), ``hamiltonian``
    what an SCF object given to dfmp2 added to the molecule's Hamiltonian (X2C, its own
    one-electron terms, a solvent model: :func:`dfmp2.reference.hamiltonian_record`; None for
    the molecule's own); ``homo_spin``/``lumo_spin`` which spin ('alpha', 'beta', or 'both'
    where they tie) holds them in an unrestricted determinant (None for a restricted one);
    ``stability`` the stability analysis of dfmp2's own SCF (``--stability``;
    :func:`dfmp2.scf.run_scf`): its ``mode``, per analysis (``internal``, and ``rhf_to_uhf``
    for a closed-shell RHF or RKS) the lowest Hessian eigenvalue in Eh, whether it is stable
    and whether Davidson converged it, and the instabilities ``follows`` followed (eigenvalue,
    energy before and after, cycles of the SCF run again, whether it lowered the energy);
    None when no analysis ran; ``guess`` the initial guess of dfmp2's own SCF (None where a
    chkfile's orbitals started it, or for an SCF object given to dfmp2) and ``level_shift``
    the SCF's level shift in Eh (0: none)."""

    kind: str
    xc: str | None
    energy: float
    converged: bool
    cycles: int | None
    conv_tol: float
    homo: float
    lumo: float | None
    orbital_check: str
    s2: float | None = None
    s2_deviation: float | None = None
    restart: str | None = None
    jk: str | None = None
    jk_stats: dict | None = None
    grid: dict | None = None
    solver: str | None = None
    conv_tol_grad: float | None = None
    hamiltonian: str | None = None
    homo_spin: str | None = None
    lumo_spin: str | None = None
    stability: dict | None = None
    guess: str | None = None
    level_shift: float | None = None


@dataclass(frozen=True)
class Sizes:
    """Dimensions: basis functions, MOs, auxiliary functions (``naux_fit`` kept by the fit),
    active occupied/virtual orbitals and frozen ones (of the alpha spin for an open shell; the
    ``*_beta`` fields the beta ones, None for a closed shell), occupied orbitals of each spin
    (``nalpha``/``nbeta``, frozen ones included), occupied pairs evaluated (over all spin
    blocks)."""

    natom: int
    nbasis: int
    nmo: int
    naux: int
    naux_fit: int
    naux_dropped: int
    nocc: int
    nvir: int
    nalpha: int
    nbeta: int
    nfrozen_occ: int
    nfrozen_vir: int
    npairs: int
    nocc_beta: int | None = None
    nvir_beta: int | None = None
    nfrozen_occ_beta: int | None = None
    nfrozen_vir_beta: int | None = None

    @property
    def nfrozen(self) -> int:
        return self.nfrozen_occ + self.nfrozen_vir


@dataclass(frozen=True)
class Method:
    """Every setting that shaped the numbers. ``basis``, ``auxbasis`` and ``ecp`` map element
    symbols to what PySCF resolved (an even-tempered auxiliary set says so, with its beta);
    ``basis_name``/``auxbasis_name`` are the names as given (None for the RI default).
    ``metric`` says how the Coulomb metric was factored ('cholesky', 'eigh') and
    ``metric_condition`` its condition estimate; ``stage_precision`` where each pipeline stage
    computed and why (``{stage: {"placement", "reason"}}``); ``note`` explains a zero
    correlation energy (no active pairs); ``scaling`` what the scaled energy is (label, scales,
    source; :class:`dfmp2.functionals.Scaling`), its scales also in ``os_scale``/``ss_scale``;
    ``cartesian`` whether the orbital basis ran with Cartesian functions (PySCF's ``cart``: 6 d,
    10 f, ... per shell, another energy than the spherical default); ``core_rule`` the rule of
    a frozen core ('pyscf', 'psi4': :attr:`dfmp2.options.Options.core_rule`; None without
    one); ``qcschema_method`` the ``model.method`` of the QCSchema input the run answered
    (None for other runs): the record's ``model.method``, and for a scaled method
    (:data:`dfmp2._names.SCALED_METHODS`) its ``return_result`` the scaled total."""

    reference: str
    basis_name: str | None
    basis: dict
    auxbasis_name: str | None
    auxbasis: dict
    ecp: dict
    scf_type: str
    scf_auxbasis: str | dict | None
    fused_energy: bool
    precision: str
    os_scale: float
    ss_scale: float
    metric: str
    metric_condition: float | None
    int3c2e_expcutoff: float
    blocks: dict
    max_memory_mb: int
    stage_precision: dict = field(default_factory=dict)
    note: str | None = None
    scaling: dict = field(default_factory=dict)
    cartesian: bool = False
    core_rule: str | None = None
    qcschema_method: str | None = None


#: How far a reduced-precision MP2 step's correlation energy may lie from the float64 one,
#: relative to |E(corr)|, by what ran below float64 (``Method.stage_precision``; the largest
#: applies). Measured against float64 on the same orbitals (docs/performance.md, "Accuracy of
#: the reduced-precision paths"):
#: - ``pairs``: the pair products in float32, the sums in float64 (``--precision mixed``; the
#:   NKI pair kernels): 7e-10 to 5e-8 of |E(corr)| from water to (H2O)16 and C10H22;
#: - ``fp32``: the sums in float32 too (``--precision fp32``): up to 1e-7 of |E(corr)|, and
#:   earlier code 2e-5 on (H2O)8, so ten times the margin of ``pairs``;
#: - ``nki``: the transform or the fit on NKI in float32, whose rounding the metric's
#:   condition number amplifies up to the limits that move them to the host
#:   (``pipeline.TRANSFORM_HOST_CONDITION``): 1e-7 to 7e-7 on the cc-pVDZ ladder, about
#:   1.5e-6 for H2O aug-cc-pVTZ frozen core with an even-tempered fit (3.8e-7 Eh);
#: - ``bf16x3``: the NKI pair kernels' products as three bfloat16 matmuls: the bound 6 * 2^-18
#:   (2.3e-5) of ``--nki-matmul bf16x3``, with the float32 stages' share on top.
REDUCED_PRECISION_REL = {"pairs": 1e-6, "fp32": 1e-5, "nki": 5e-6, "bf16x3": 3e-5}

#: Decimals the summary prints of energies a float64 run computed (Hartree).
FULL_DECIMALS = 12


def precision_error(method: Method, e_corr: float) -> float:
    """How far the MP2 energies of a run with ``method`` may lie from float64 ones (Eh): 0.0
    when every stage ran in float64, else :data:`REDUCED_PRECISION_REL` of the weakest stage
    times ``|e_corr|``. A record from before stages were recorded goes by its precision."""
    placements = {stage: rec["placement"] for stage, rec in method.stage_precision.items()}
    if not placements and method.precision != "fp64":
        placements = {"pair_energy": f"pytorch {method.precision}"}
    rel = 0.0
    for stage, placement in placements.items():
        if placement.endswith("fp64"):
            continue
        if placement.endswith("bf16x3"):
            kind = "bf16x3"
        elif stage in ("transform", "fit"):
            kind = "nki"
        else:
            kind = "fp32" if method.precision == "fp32" else "pairs"
        rel = max(rel, REDUCED_PRECISION_REL[kind])
    return rel * abs(e_corr)


def decimals_for(error: float, most: int = FULL_DECIMALS) -> int:
    """Decimals to print of a value whose error may reach ``error``: ``most`` for 0.0, else
    the last decimal above the error (at least 1)."""
    if error <= 0.0:
        return most
    return max(1, min(most, math.floor(-math.log10(error))))


def interaction_error(level: str, error: float) -> float:
    """How far a counterpoise level's interaction energy may lie from float64's, given the
    complex's ``error`` (:func:`precision_error`): 0.0 for the reference's level ('hf', 'ks'),
    else twice it (the fragments' errors add up to about the complex's)."""
    return 0.0 if level in ("hf", "ks") else 2.0 * error


@dataclass(frozen=True)
class BackendInfo:
    """Which backend ran: requested and resolved backend, NKI mode, why, per-op records,
    the CPU BLAS choice, the precision of the NKI pair kernels' products and the NKI device's
    record (target, SPMD programs and cores, host<->device bytes, launches, pair shares per
    program, where B was during the pair stage; both None when no NKI kernel ran), ``device``
    where the MP2 step ran (``--device``: the host, or a CUDA device with its plan)."""

    requested: str
    resolved: str
    nki_mode: str | None
    resolution: str
    ops: dict
    cpu_blas: dict
    nki_matmul: str | None = None
    nki_device: dict | None = None
    device: dict | None = None


@dataclass(frozen=True)
class Result:
    """Energies of a DF-MP2 run, in Hartree, and how they were obtained.

    e_scf : the reference's total energy (``e_hf`` is it for an HF reference only);
    e_corr_os / e_corr_ss : opposite- and same-spin correlation (unscaled); e_singles : singles
    (ROHF-MBPT(2); zero otherwise); e_corr : e_singles + e_corr_os + e_corr_ss; e_tot :
    e_scf + e_corr (a double hybrid's: e_scf + e_scs, its total); e_scs : the scaled
    correlation energy os * E_OS + ss * E_SS (singles unscaled): SCS-MP2 unless
    ``method.scaling`` says otherwise (SOS-MP2, given scales, or a double hybrid's PT2 term);
    e_scs_tot : e_scf + e_scs; ``double_hybrid`` the record of a double-hybrid run
    (functional, KS part, scales, citation, energies; None otherwise), whose total
    ``e_return`` (and ``e_tot``) is then; otherwise ``e_return`` is the MP2 total;
    ``pair_energies`` the energy of every occupied pair when asked for
    (``extras.pair_energies``). ``environment`` is the record of what the ``dfmp2`` command
    set in the process environment (None from Python);
    ``distributed`` the record of a run over several ranks (``extras.distributed``; None on
    one process); ``interaction`` the counterpoise-corrected interaction energies of a
    ``--counterpoise`` run, with the uncorrected ones and the BSSE (``extras.interaction``,
    :mod:`dfmp2.counterpoise`); ``warnings``
    the WARNING lines the run logged (``extras.warnings``; a counterpoise run's include its
    fragments'); ``keywords`` the options the run was given, under their QCSchema keyword names
    (the record's ``keywords``: :func:`dfmp2.qcschema.keywords_of`; a QCSchema input's own).

    Two results are equal when they mean the same: every energy and record alike, wall times
    aside (``timings`` and the seconds of the SCF's J/K, stability and distributed records),
    which differ between two runs of one calculation, and so does a CUDA device's budget
    (``backend.device``'s ``memory_mb``: its free memory at the start, or the budget given).
    """

    e_scf: float
    e_corr_os: float
    e_corr_ss: float
    e_singles: float
    e_scs: float
    molecule: MoleculeInfo
    scf: ScfInfo
    sizes: Sizes
    method: Method
    backend: BackendInfo
    timings: dict
    versions: dict
    environment: dict | None = None
    distributed: dict | None = None
    interaction: dict | None = None
    double_hybrid: dict | None = None
    pair_energies: dict | None = None
    warnings: tuple[str, ...] = ()
    keywords: dict = field(default_factory=dict)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Result):
            return NotImplemented
        return _timeless(self) == _timeless(other)

    @property
    def e_hf(self) -> float | None:
        """The HF energy; None when the reference is Kohn-Sham (its energy is ``e_scf``)."""
        return self.e_scf if self.scf.kind in ("rhf", "uhf", "rohf") else None

    @property
    def e_doubles(self) -> float:
        return self.e_corr_os + self.e_corr_ss

    @property
    def e_corr(self) -> float:
        return self.e_singles + self.e_doubles

    @property
    def e_tot(self) -> float:
        """The total energy of the method that ran: the MP2 total ``e_scf + e_corr``, or a
        double hybrid's total ``e_scf + e_scs`` (its PT2 term scaled; the unscaled MP2 sum on
        KS orbitals means nothing there, and the record leaves it out). :class:`dfmp2.DFMP2`'s
        ``e_tot`` is PySCF's MP2 one, ``e_hf + e_corr``, on any reference."""
        return self.e_scs_tot if self.double_hybrid else self.e_scf + self.e_corr

    @property
    def e_scs_tot(self) -> float:
        return self.e_scf + self.e_scs

    @property
    def e_return(self) -> float:
        """The run's answer (``return_result``): the scaled total for a QCSchema input's
        scaled method (``method.qcschema_method`` scs-mp2, sos-mp2, custom-scs-mp2), else
        :attr:`e_tot` (the double hybrid's total for a double-hybrid run, else the MP2
        total)."""
        return self.e_scs_tot if self.method.qcschema_method in SCALED_METHODS else self.e_tot

    @property
    def dh_name(self) -> str | None:
        """A double-hybrid run's name as reported: the functional's ('B2PLYP'), with '(custom
        PT2 scales)' when the scales were changed, or 'custom double hybrid'; None otherwise."""
        return self.double_hybrid["label"] if self.double_hybrid else None

    @property
    def scaled_label(self) -> str:
        """'SCS-MP2', 'SOS-MP2', 'scaled MP2' or the double hybrid's name."""
        return self.method.scaling.get("label", "SCS-MP2")

    @property
    def precision_error(self) -> float:
        """How far this run's MP2 energies may lie from float64 ones, in Eh (0.0 for a float64
        run; :func:`precision_error`)."""
        return precision_error(self.method, self.e_corr)

    @property
    def corr_decimals(self) -> int:
        """Decimals printed of every energy that holds the correlation energy: 12 for a float64
        run, else down to the decimal that :attr:`precision_error` leaves."""
        return decimals_for(self.precision_error)

    def properties(self) -> dict:
        """QCSchema ``AtomicResultProperties`` names and values (Hartree)."""
        s = self.sizes
        dh = self.double_hybrid is not None  # MP2 parts on KS orbitals: no MP2 total
        return {
            "scf_total_energy": self.e_scf,
            "nuclear_repulsion_energy": self.molecule.nuclear_repulsion,
            "scf_iterations": self.scf.cycles,
            "mp2_same_spin_correlation_energy": self.e_corr_ss,
            "mp2_opposite_spin_correlation_energy": self.e_corr_os,
            "mp2_singles_energy": self.e_singles,
            "mp2_doubles_energy": None if dh else self.e_doubles,
            "mp2_correlation_energy": None if dh else self.e_corr,
            "mp2_total_energy": None if dh else self.e_tot,
            "return_energy": self.e_return,
            "calcinfo_nbasis": s.nbasis,
            "calcinfo_nmo": s.nmo,
            "calcinfo_nalpha": s.nalpha,
            "calcinfo_nbeta": s.nbeta,
            "calcinfo_natom": s.natom,
        }

    def to_dict(self) -> dict:
        """A QCSchema ``AtomicResult`` (schema v1 field names) with dfmp2's records in extras."""
        if self.method.qcschema_method:  # the input's model.method that the run answered
            method = self.method.qcschema_method
        elif self.double_hybrid:  # a known one by its name, its scales (if given) as keywords
            method = (self.double_hybrid.get("functional") or self.dh_name).lower()
        else:
            method = "mp2" if self.scf.xc is None else f"mp2 on {self.scf.kind}-{self.scf.xc}"
        basis = self.method.basis_name or ", ".join(sorted(set(self.method.basis.values())))
        return {
            "schema_name": "qcschema_output",
            "schema_version": 1,
            "driver": "energy",
            "model": {"method": method, "basis": basis},
            "keywords": dict(self.keywords),
            "molecule": self.molecule.qcschema,
            "success": True,
            "return_result": self.e_return,
            "properties": {k: v for k, v in self.properties().items() if v is not None},
            "extras": {
                **self._scaled_extras(),
                "molecule": {k: v for k, v in asdict(self.molecule).items() if k != "qcschema"},
                "scf": asdict(self.scf),
                "sizes": {**asdict(self.sizes), "nfrozen": self.sizes.nfrozen},
                "method": asdict(self.method),
                "backend": asdict(self.backend),
                "timings": self.timings,
                "versions": self.versions,
                "environment": self.environment,
                **({"distributed": self.distributed} if self.distributed else {}),
                **({"interaction": self.interaction} if self.interaction else {}),
                **({"double_hybrid": self.double_hybrid} if self.double_hybrid else {}),
                **({"pair_energies": self.pair_energies} if self.pair_energies else {}),
                "warnings": list(self.warnings),
            },
            "provenance": {
                "creator": "dfmp2",
                "version": self.versions.get("dfmp2", ""),
                "routine": "dfmp2.run",
            },
        }

    def _scaled_extras(self) -> dict:
        """The scaled energies under their name: ``scs_mp2_*`` (SCS-MP2's published scales),
        ``sos_mp2_*`` (SOS-MP2's), ``custom_scs_mp2_*`` for other scales (Psi4's name: its
        SCS-MP2 variables always hold the published scales) and for an input's custom-scs-mp2
        whatever its scales; none for a double hybrid (its record has them)."""
        if self.double_hybrid:
            return {}
        prefix = SCALED_NAMES[self.scaled_label]
        extras = {f"{prefix}_correlation_energy": self.e_scs,
                  f"{prefix}_total_energy": self.e_scs_tot}
        if self.method.qcschema_method == "custom-scs-mp2":  # Psi4 sets its CUSTOM SCS-MP2
            extras.update(custom_scs_mp2_correlation_energy=self.e_scs,  # variables whatever
                          custom_scs_mp2_total_energy=self.e_scs_tot)  # the scales are
        return extras

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: dict) -> Result:
        """The Result of a record :meth:`to_dict` wrote (``dfmp2 run --json``; a QCSchema
        AtomicResult of :func:`dfmp2.run_qcschema`, v1 or v2, reads the same way, its run's
        record in ``extras``). Raises :class:`~dfmp2.errors.InputError` with one line for a
        failed run's record, another program's, or one missing dfmp2's records."""
        from .errors import InputError

        data = _object(data, "a dfmp2 result")
        if data.get("success") is False:
            error = data.get("error")
            error = error.get("error_message", "no message") if isinstance(error, dict) else error
            raise InputError(f"the record is of a failed run, with no energies: {error}")
        provenance = data.get("provenance")
        creator = provenance.get("creator") if isinstance(provenance, dict) else None
        if creator != "dfmp2":
            raise InputError(f"not a dfmp2 result: its provenance.creator is {creator!r}")
        extras = _object(data.get("extras") or {}, "the record's extras")
        props = _object(data.get("properties") or {}, "the record's properties")
        missing = [k for k in ("molecule", "scf", "sizes", "method", "backend", "timings",
                               "versions") if k not in extras]
        missing += [f"properties.{k}" for k in _READ_PROPERTIES if k not in props]
        if missing:
            raise InputError(f"the record lacks dfmp2's {', '.join(missing)}: it was not "
                             "written by Result.to_dict (dfmp2 run --json)")
        if data.get("success") is not True:
            raise InputError(f"the record's success is {data.get('success')!r}, not true: "
                             "dfmp2 writes true on every result it saves")
        _check_shape(data)
        energies = {k: props[k] for k in _READ_PROPERTIES}
        dh = extras.get("double_hybrid")
        if dh is not None:
            energies["e_pt2"] = _object(dh, "extras.double_hybrid").get("e_pt2")
        else:
            energies["e_scs"] = next(
                (extras[f"{prefix}_correlation_energy"] for prefix in SCALED_NAMES.values()
                 if f"{prefix}_correlation_energy" in extras), None)
        for name, value in energies.items():
            if (not isinstance(value, (int, float)) or isinstance(value, bool)
                    or not math.isfinite(value)):
                raise InputError(f"the record's energy {name} is {value!r}, not a finite "
                                 "number")
        molecule = {**_object(extras["molecule"], "extras.molecule"),
                    "qcschema": data.get("molecule")}
        result = cls(
            e_scf=props["scf_total_energy"],
            e_corr_os=props["mp2_opposite_spin_correlation_energy"],
            e_corr_ss=props["mp2_same_spin_correlation_energy"],
            e_singles=props["mp2_singles_energy"],
            e_scs=energies["e_pt2"] if dh is not None else energies["e_scs"],
            molecule=_record(MoleculeInfo, molecule, "molecule"),
            scf=_checked_stability(_record(ScfInfo, extras["scf"], "scf")),
            sizes=_record(Sizes, extras["sizes"], "sizes"),
            method=_record(Method, extras["method"], "method"),
            backend=_record(BackendInfo, extras["backend"], "backend"),
            timings=_object(extras["timings"], "extras.timings"),
            versions=_object(extras["versions"], "extras.versions"),
            environment=extras.get("environment"), distributed=extras.get("distributed"),
            interaction=_interaction(extras), double_hybrid=dh,
            pair_energies=extras.get("pair_energies"), warnings=_warnings(extras),
            keywords=_keywords(data))
        _check_answers(data, result)
        return result

    @classmethod
    def from_json(cls, text: str) -> Result:
        """The Result of JSON text (str or UTF-8 bytes) :meth:`to_json` wrote
        (:meth:`from_dict`)."""
        from .errors import InputError
        from .qcschema import load_json

        if not isinstance(text, (str, bytes, bytearray)):
            raise InputError(f"Result.from_json takes JSON text (str or bytes), got "
                             f"{type(text).__name__}" + ("; a dict goes to Result.from_dict"
                                                         if isinstance(text, dict) else ""))
        return cls.from_dict(load_json(text, "the record"))

    @classmethod
    def read(cls, path) -> Result:
        """The Result saved in the JSON file ``path`` (``dfmp2 run --json PATH``)."""
        from ._files import check_readable_file
        from .errors import InputError

        check_readable_file(path, "result")
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read {str(path)!r}: "
                             f"{getattr(exc, 'strerror', None) or exc}") from None
        try:
            return cls.from_json(text)
        except InputError as exc:
            raise InputError(f"{path}: {exc}") from None

    def summary(self, verbose: bool = False, warnings: bool = True) -> str:
        """Readable text for a terminal: the molecule, the basis sets, the reference, then the
        energies; with ``verbose`` also the backend, BLAS and per-op records and stage times;
        with ``warnings`` the run's WARNING lines (``dfmp2 run`` leaves them out: it logged
        them as they came)."""
        mo, scf, s, m = self.molecule, self.scf, self.sizes, self.method
        ghosts = f" + {mo.nghost} ghost" if mo.nghost else ""
        frozen = _frozen_text(s) + _CORE_RULE_TEXT.get(m.core_rule, "")
        ref = scf.kind.upper() + (f" ({scf.xc})" if scf.xc else "")
        lines = [
            f"{mo.formula}  charge {mo.charge:+d}  multiplicity {mo.multiplicity}  "
            f"{_count(mo.natom - mo.nghost, 'atom')}{ghosts}  {s.nbasis} basis functions",
            f"  basis      {_per_element(m.basis)}"
            + ("  (Cartesian functions)" if m.cartesian else
               "  (spherical functions; Gaussian and Psi4 run this set Cartesian: --cartesian)"
               if cartesian_elsewhere(m.basis_name) else "")
            + (f"  ({s.nmo} orbitals: {s.nbasis - s.nmo} near-linearly dependent "
               f"{'combination' if s.nbasis - s.nmo == 1 else 'combinations'} dropped)"
               if s.nmo < s.nbasis else ""),
            f"  auxiliary  {_per_element(m.auxbasis)}  ({s.naux} functions"
            + (f", {s.naux_dropped} dropped" if s.naux_dropped else "") + ")",
        ]
        if m.ecp:
            lines.append("  ECP        " + ", ".join(
                f"{el}: {rec['name']} ({rec['core_electrons']} core electrons)"
                for el, rec in sorted(m.ecp.items())))
        scf_fit = f"density-fitted ({_per_element(m.scf_auxbasis)})" if m.scf_type == "df" \
            else "exact integrals"
        cycles = f" in {_count(scf.cycles, 'cycle')}" if scf.cycles is not None else ""
        lines += [
            f"  nuclear repulsion {mo.nuclear_repulsion:.10f} Eh",
            f"  {ref} {scf_fit}: {'converged' if scf.converged else 'NOT converged'}"
            f"{cycles} (conv_tol {scf.conv_tol:.0e}"
            + (f", orbital gradient {scf.conv_tol_grad:.0e})" if scf.conv_tol_grad else ")")
            + (f"; {scf.restart}" if scf.restart else "")
            + (f"; guess {scf.guess}" if scf.guess not in (None, "minao") else "")
            + (f"; level shift {scf.level_shift:g} Eh" if scf.level_shift else "")
            + (f"; {scf.solver}" if scf.solver and scf.solver != "DIIS (PySCF)" else ""),
            f"  HOMO {scf.homo:.6f} Eh{_spin_text(scf.homo_spin)}"
            + (f"  LUMO {scf.lumo:.6f} Eh{_spin_text(scf.lumo_spin)}" if scf.lumo is not None
               else "  LUMO none (no virtual orbitals)"),
            f"  MP2 space  {_mp2_space(s)} ({frozen})",
        ]
        if scf.stability is not None:
            lines.append(f"  stability  {_stability_text(scf.stability, scf.kind)}")
        if scf.hamiltonian:
            lines.append(f"  Hamiltonian  {scf.hamiltonian}")
        if scf.s2 is not None:
            spin = (mo.multiplicity - 1) / 2
            lines.append(f"  <S^2> {_fixed(scf.s2, 6)}  (S(S+1) = {spin * (spin + 1):.6f}, "
                         f"deviation {_fixed(scf.s2_deviation, 6, plus=True)})")
        if scf.grid is not None:
            lines.append(f"  DFT grid   {_grid_text(scf.grid)}")
        if (dh := self.double_hybrid) is not None:
            lines.append(f"  double hybrid {dh['functional'] or '(custom)'}: {dh['xc']}; PT2 "
                         f"{dh['c_os']:g} OS + {dh['c_ss']:g} SS, no singles ({dh['source']})")
        if m.note:
            lines.append(f"  note: {m.note}")
        if warnings:
            lines += [f"  warning: {text}" for text in self.warnings]
        d = self.corr_decimals
        if (reduced := self._reduced_precision_line()) is not None:
            lines.append(reduced)
        scf_label = "E(HF)" if self.e_hf is not None else f"E({scf.kind.upper()})"
        lines += [
            "",
            f"  {scf_label:<22s}{_fixed(self.e_scf, 12, 22)} Eh",
            f"  {'E(OS) opposite-spin':<22s}{_fixed(self.e_corr_os, d, 22)} Eh",
            f"  {'E(SS) same-spin':<22s}{_fixed(self.e_corr_ss, d, 22)} Eh",
            *([f"  {'E(singles)':<22s}{_fixed(self.e_singles, d, 22)} Eh"]
              if self.scf.kind == "rohf" else []),
        ]
        if dh is not None:
            name = self.dh_name
            lines += [
                f"  {'E(PT2) scaled':<22s}{_fixed(self.e_scs, d, 22)} Eh",
                f"  {f'E({name}) total':<22s}{_fixed(self.e_scs_tot, d, 22)} Eh",
            ]
        else:
            label = self.scaled_label
            lines += [
                f"  {'E(corr) MP2':<22s}{_fixed(self.e_corr, d, 22)} Eh",
                f"  {'E(MP2) total':<22s}{_fixed(self.e_tot, d, 22)} Eh",
                f"  {f'E(corr) {label}':<22s}{_fixed(self.e_scs, d, 22)} Eh"
                + (f"  (os {m.os_scale:g}, ss {m.ss_scale:g})" if label == "scaled MP2"
                   else ""),
                f"  {f'E({label}) total':<22s}{_fixed(self.e_scs_tot, d, 22)} Eh",
            ]
        if self.interaction:
            lines += ["", *_interaction_lines(self.interaction, self.precision_error)]
        if verbose:
            lines += ["", *self._machinery()]
        return "\n".join(lines)

    def _reduced_precision_line(self) -> str | None:
        """The summary's line for a run whose MP2 step did not run in float64 throughout: what
        ran below it and to which decimal its energies are printed; None for a float64 run."""
        if self.precision_error <= 0.0:
            return None
        below = [f"{stage} {rec['placement']}" for stage, rec in
                 self.method.stage_precision.items() if not rec["placement"].endswith("fp64")]
        what = ", ".join(below) or f"precision {self.method.precision}"
        return (f"  precision  {what}: MP2 energies printed to 1e-{self.corr_decimals} Eh, "
                f"below which its rounding may reach (--json keeps every digit)")

    def _machinery(self) -> list[str]:
        """The backend, BLAS, per-op and timing lines of ``summary(verbose=True)``."""
        m, b = self.method, self.backend
        nki_kinds = sorted({rec["placement"].split(" and ")[0].split()[1]
                            for rec in m.stage_precision.values()
                            if rec["placement"].startswith("nki")})  # fp32, bf16x3
        lines = [
            f"  SCF J/K: {self.scf.jk}",
            *([f"  SCF J/K time: {st['calls']} builds, {st['seconds']:.2f} s, "
               f"{_rate(st['gflop'] / st['seconds'])} GFLOP/s" if st["seconds"] > 0 else ""]
              if (st := self.scf.jk_stats) else []),
            f"  backend {b.resolved}" + (f" [{b.nki_mode}]" if b.nki_mode else "")
            + f" ({b.resolution})"
            + (f"  pair-kernel products {b.nki_matmul}" if b.resolved == "nki" else ""),
            f"  fused energy {'on' if m.fused_energy else 'off'}  precision {m.precision}"
            + (f" (its NKI stages in {' and '.join(nki_kinds)}: below)" if nki_kinds else "")
            + f"  metric {m.metric}"
            + (f" (condition {m.metric_condition:.1e})" if m.metric_condition else "")
            + f"  int3c2e cutoff exp(-{m.int3c2e_expcutoff:g})",
            f"  B storage {m.blocks['storage']} ({m.blocks['b_mb']} MB)  "
            f"max memory {m.max_memory_mb} MB",
        ]
        if (dev := b.nki_device) is not None:
            lines.append(
                f"  NKI device {dev['target'] or dev['target_source']} (LNC={dev['lnc']}, "
                f"{dev['cores']} core(s)): {dev['launches']} launches, {dev['programs']} "
                f"programs, {dev['uploaded_bytes'] / 1e6:.1f} MB up "
                f"({dev['resident_bytes'] / 1e6:.1f} MB kept), "
                f"{dev['downloaded_bytes'] / 1e6:.1f} MB down; pair shares "
                f"{dev['program_pairs']}; B {dev['b_placement'] or 'not used'}")
        if (dev := b.device) is not None:
            plan = dev.get("plan")
            lines.append(f"  device {dev['resolved']} ({dev['name']}; {dev['reason']})"
                         + (f": B {plan['b_placement']}, pair blocks of {plan['occ_block']}, "
                            f"{plan['device_mb']} MB planned" if plan else ""))
        if (dist := self.distributed) is not None:
            lines.append(
                f"  distributed over {dist['world_size']} ranks ({dist['backend']})"
                + (f": pair shares {dist['pair_shares']}, aux shares {dist['aux_shares']}, "
                   f"MB sent {[round(b / 1e6, 2) for b in dist['bytes_sent']]}"
                   if "pair_shares" in dist else f": {dist.get('note', '')}"))
        for stage, rec in m.stage_precision.items():
            lines.append(f"  {stage:<12s} {rec['placement']:<13s} {rec['reason']}")
        blas = b.cpu_blas
        if blas:  # the host's products: all of them on pytorch, the SCF's and others on nki
            lines.append(f"  CPU products through {blas['choice']} "
                         f"({blas['libraries'][blas['choice']]}; {blas.get('reason', '')})")
            if blas.get("pair_reduction") and b.resolved == "pytorch":
                lines.append(f"  pair-energy reduction: {blas['pair_reduction']}")
        threads = (blas or {}).get("threads")
        if threads:  # each pool's size as the result was assembled (dfmp2.threads.counts)
            openblas = ", ".join(f"{name} {count}" for name, count in threads["openblas"].items())
            lines.append(f"  threads: torch {threads['torch']}, PySCF's OpenMP "
                         f"{threads['pyscf_openmp']}" + (f", OpenBLAS of {openblas}" if openblas
                                                          else ""))
        for key, value in (self.environment or {}).items():
            lines.append(f"  environment {key}: {value}")
        for op, rec in b.ops.items():
            note = f"  FALLBACK: {rec['fallback']}" if rec.get("fallback") else ""
            if rec.get("host_calls"):
                note += f"  ({rec['host_calls']} on the host: {rec['host_reason']})"
            lines.append(f"    {op:<22s} {rec['backend']:<8s} {rec['mode']:<10s} "
                         f"{rec['calls']:>6d} calls{note}")
        lines.append("  time  " + "  ".join(f"{k} {v:.2f}s" for k, v in self.timings.items()))
        return lines

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        """One line (the dataclass's own would be thousands of characters): what ran and its
        answer, to the decimals the run vouches for."""
        m = self.method
        label = self.dh_name or (self.scaled_label if m.qcschema_method in SCALED_METHODS
                                 else "MP2")
        return (f"<dfmp2.Result {self.molecule.formula} {self.scf.kind.upper()}/"
                f"{m.basis_name or 'mixed basis'} {label} {self.e_return:.{self.corr_decimals}f} "
                f"Eh>")

    def _repr_pretty_(self, printer, cycle) -> None:
        """IPython and Jupyter show the summary for a cell that ends in a result."""
        printer.text(repr(self) if cycle else self.summary())


#: The names a result's ``extras`` may use for dfmp2's own records (:meth:`Result.to_dict`;
#: some only for some runs): an input's extras must not use them (:mod:`dfmp2.qcschema`), or
#: reading the result back would take the input's value for dfmp2's.
RESULT_EXTRAS = ("scs_mp2_correlation_energy", "scs_mp2_total_energy",
                 "sos_mp2_correlation_energy", "sos_mp2_total_energy",
                 "custom_scs_mp2_correlation_energy", "custom_scs_mp2_total_energy",
                 "molecule", "scf",
                 "sizes", "method", "backend", "timings", "versions", "environment",
                 "distributed", "interaction", "double_hybrid", "pair_energies", "warnings")

#: The name of a scaled MP2 energy in ``extras`` (``*_correlation_energy``, ``*_total_energy``)
#: and of its level in a counterpoise record, by its label (:class:`dfmp2.functionals.Scaling`).
SCALED_NAMES = {"SCS-MP2": "scs_mp2", "SOS-MP2": "sos_mp2", "scaled MP2": "custom_scs_mp2"}

#: The properties :meth:`Result.from_dict` reads its energies from.
_READ_PROPERTIES = ("scf_total_energy", "mp2_opposite_spin_correlation_energy",
                    "mp2_same_spin_correlation_energy", "mp2_singles_energy")


#: The (schema_name, schema_version) of the records dfmp2 writes: its own and a v1
#: AtomicResult, and a v2 AtomicResult (whose driver is in input_data.specification).
_RESULT_SCHEMAS = {("qcschema_output", 1), ("qcschema_atomic_result", 2)}


def _check_shape(data: dict) -> None:
    """A record :meth:`Result.from_dict` reads is one dfmp2 wrote: a v1 or v2 AtomicResult of
    an energy; one line naming what differs otherwise."""
    from .errors import InputError

    schema = (data.get("schema_name"), data.get("schema_version"))
    if schema not in _RESULT_SCHEMAS:
        raise InputError(f"schema_name {schema[0]!r} with schema_version {schema[1]!r} is not "
                         "an AtomicResult dfmp2 writes (qcschema_output 1, "
                         "qcschema_atomic_result 2)")
    if schema[1] == 2:
        driver = ((data.get("input_data") or {}).get("specification") or {}).get("driver")
    else:
        driver = data.get("driver")
    if driver != "energy":
        raise InputError(f"the record's driver is {driver!r}; dfmp2 computes energies only")


def _check_answers(data: dict, result: Result) -> None:
    """What a record states beside its parts is what its parts give, to :data:`TOTALS_AGREE`
    Eh: its MP2 total (``properties.mp2_total_energy``, but for a double hybrid, whose record
    leaves the unscaled sum out) the SCF energy plus the spin components and singles; its
    scaled correlation energy (a double hybrid's ``e_pt2``) its scales times its spin
    components plus the singles; its ``return_result`` (and ``properties.return_energy``,
    where written) the run's answer (:attr:`Result.e_return`). A file edited (or truncated into
    another run's) is refused in one line, not shown with other numbers than it states."""
    from .energy import scs_energy
    from .errors import InputError

    def agrees(value, want) -> bool:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and abs(value - want) <= TOTALS_AGREE)  # NaN fails too

    changed = "the file was changed after dfmp2 wrote it"
    props = data.get("properties") or {}
    if result.double_hybrid is None:
        total = props.get("mp2_total_energy")
        if not agrees(total, result.e_tot):
            raise InputError(f"the record's properties.mp2_total_energy {total!r} is not the "
                             f"sum of its parts ({result.e_tot!r}): {changed}")
        scales = (result.method.scaling.get("os_scale"), result.method.scaling.get("ss_scale"))
        name = "scaled correlation energy (extras)"
    else:
        scales = (result.double_hybrid.get("c_os"), result.double_hybrid.get("c_ss"))
        name = "extras.double_hybrid.e_pt2"
    if all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in scales):
        want = scs_energy(result.e_corr_os, result.e_corr_ss, *scales, result.e_singles)
        if not agrees(result.e_scs, want):
            raise InputError(f"the record's {name} {result.e_scs!r} is not its scales "
                             f"{scales[0]!r} x E(OS) + {scales[1]!r} x E(SS) ({want!r}): "
                             f"{changed}")
    for where, value in (("return_result", data.get("return_result")),
                         ("properties.return_energy", props.get("return_energy",
                                                                result.e_return))):
        if not agrees(value, result.e_return):
            raise InputError(f"the record's {where} {value!r} is not its run's answer "
                             f"({result.e_return!r}): {changed}")


#: How far a record's stated totals may lie from the sums of its parts (float64 rounding of a
#: sum of three or four terms; anything an edit would change is far larger).
TOTALS_AGREE = 1e-9


def _interaction(extras: dict) -> dict | None:
    """A record's ``extras.interaction`` (None without one), checked for what the summary
    prints of it: each level's E(int) and, where recorded (a record from before the fragments
    ran in their own basis has neither), its uncorrected E(int) and BSSE; the complex's and
    fragments' totals at every level, and where recorded the fragments' in their own basis;
    one line naming what is missing or not a number."""
    from .errors import InputError

    inter = extras.get("interaction")
    if inter is None:
        return None

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    where = "the record's extras.interaction"
    levels = _object(_object(inter, where).get("levels"), f"{where}.levels")
    energies = [("", inter)]  # E(int) per level, then the uncorrected E(int) and BSSE
    if "uncorrected" in inter or "bsse" in inter:  # recorded together
        energies += [(f"{name}.", _object(inter.get(name), f"{where}.{name}"))
                     for name in ("uncorrected", "bsse")]
    wanted = [(f"{prefix}{level}.{unit}", (record.get(level) or {}).get(unit))
              for prefix, record in energies for unit in ("eh", "kcal_mol") for level in levels]
    totals = inter.get("totals_eh")
    if totals is not None:
        parts = [("complex", _object(_object(totals, f"{where}.totals_eh").get("complex"),
                                     f"{where}.totals_eh.complex"))]
        for runs in ("fragments", "fragments_own_basis"):
            fragments = totals.get(runs)
            if runs not in totals and runs == "fragments_own_basis":
                continue  # a record from before the fragments ran in their own basis
            if not isinstance(fragments, list):
                raise InputError(f"{where}.totals_eh.{runs} is not a list: the file was "
                                 "changed after dfmp2 wrote it")
            parts += [(f"{runs}[{k}]", _object(f, f"{where}.totals_eh.{runs}[{k}]"))
                      for k, f in enumerate(fragments)]
        wanted += [(f"totals_eh.{name}.{level}", part.get(level))
                   for name, part in parts for level in levels]
    bad = [name for name, value in wanted if not number(value)]
    if bad:
        raise InputError(f"{where} lacks a number at {', '.join(bad)}: the file was changed "
                         "after dfmp2 wrote it")
    return inter


def _timeless(result: Result) -> tuple:
    """``result``'s fields without its wall times: ``timings``, and the seconds of the SCF's
    J/K (``scf.jk_stats``), of its stability analysis and of each rank of a distributed run;
    nor a CUDA device's free memory at the start (``backend.device``'s ``memory_mb``; what it
    changed, the device plan, stays) (:meth:`Result.__eq__`)."""
    def without(record: dict | None, key: str) -> dict | None:
        return None if record is None else {k: v for k, v in record.items() if k != key}

    scf = replace(result.scf, jk_stats=without(result.scf.jk_stats, "seconds"),
                  stability=without(result.scf.stability, "seconds"))
    kept = replace(result, timings={}, scf=scf,
                   distributed=without(result.distributed, "stage_seconds"),
                   backend=replace(result.backend,
                                   device=without(result.backend.device, "memory_mb")))
    return tuple(getattr(kept, f.name) for f in fields(kept))


def _keywords(data: dict) -> dict:
    """A record's keywords: ``keywords`` of a v1 AtomicResult (dfmp2's own record), those of
    ``input_data.specification`` of a v2 one; none in a record that has none."""
    if data.get("schema_version") == 2:
        spec = _object(data.get("input_data") or {}, "the record's input_data")
        keywords = _object(spec.get("specification") or {},
                           "the record's input_data.specification").get("keywords")
    else:
        keywords = data.get("keywords")
    return dict(_object(keywords or {}, "the record's keywords"))


def _warnings(extras: dict) -> tuple[str, ...]:
    """A record's ``extras.warnings`` (a list of strings; a record from before they were kept
    has none)."""
    from .errors import InputError

    kept = extras.get("warnings", [])
    if not isinstance(kept, list) or not all(isinstance(text, str) for text in kept):
        raise InputError(f"the record's extras.warnings is {kept!r}, not a list of strings: "
                         "the file was changed after dfmp2 wrote it")
    return tuple(kept)


def _checked_stability(scf: ScfInfo) -> ScfInfo:
    """``scf`` whose ``stability`` record (when there) has what the summary prints of it: a
    known mode; per analysis a finite eigenvalue (or None: no rotations), the flags, and a
    verdict that agrees with the eigenvalue and its threshold; per follow its numbers and
    flag; else one line naming what is wrong."""
    from .errors import InputError

    record = scf.stability
    if record is None:
        return scf

    def bad(where: str, value) -> InputError:
        return InputError(f"the record's extras.scf.stability{where} is {value!r}: the file "
                          "was changed after dfmp2 wrote it")

    if record.get("mode") not in STABILITY_MODES or record.get("mode") == "none":
        raise bad(".mode", record.get("mode"))
    number = (int, float)
    for key in _STABILITY_NAMES:
        if key not in record:
            continue
        lowest = _object(record[key], f"the record's extras.scf.stability.{key}")
        value = lowest.get("lowest_eigenvalue")
        if value is not None and not (isinstance(value, number) and not isinstance(value, bool)
                                      and math.isfinite(value)):
            raise bad(f".{key}.lowest_eigenvalue", value)
        for flag in ("stable", "converged"):
            if not isinstance(lowest.get(flag), bool):
                raise bad(f".{key}.{flag}", lowest.get(flag))
        below = lowest.get("threshold", -1e-5)
        if not isinstance(below, number) or isinstance(below, bool):
            raise bad(f".{key}.threshold", below)
        if lowest["stable"] != (value is None or not value < below):
            raise bad(f".{key}.stable", lowest["stable"])
    follows = record.get("follows", [])
    if not isinstance(follows, list):
        raise bad(".follows", follows)
    wanted = {"eigenvalue": number, "from_energy": number, "energy": number, "cycles": int,
              "lowered": bool}
    for k, follow in enumerate(follows):
        follow = _object(follow, f"the record's extras.scf.stability.follows[{k}]")
        for name, kind in wanted.items():
            item = follow.get(name)
            if not isinstance(item, kind) or (kind is not bool and isinstance(item, bool)):
                raise bad(f".follows[{k}].{name}", item)
    return scf


def _object(value, what: str) -> dict:
    """``value`` if it is a JSON object (a dict), else one line naming ``what`` it is."""
    from .errors import InputError

    if not isinstance(value, dict):
        raise InputError(f"{what} is a JSON object, got {type(value).__name__}")
    return value


def _record(kind, values: dict, name: str):
    """``kind`` (a record dataclass) from a JSON record's ``values``: fields it lacks name the
    record in one line; fields it does not know (a later dfmp2's, or a QCSchema echo's) are
    left out."""
    from dataclasses import MISSING, fields

    from .errors import InputError

    values = _object(values, f"extras.{name}")
    known = {f.name: f for f in fields(kind)}
    missing = [n for n, f in known.items() if n not in values and f.default is MISSING
               and f.default_factory is MISSING]
    if missing:
        raise InputError(f"the record's extras.{name} lacks {', '.join(missing)}: written by "
                         "another version of dfmp2 than this one")
    for field_name, value in values.items():
        if field_name in _MAY_BE_INFINITE and isinstance(value, float) and math.isinf(value):
            continue  # a singular metric's condition number
        if field_name in known and not _of_type(value, known[field_name].type):
            raise InputError(f"the record's extras.{name}.{field_name} is {value!r}, not "
                             f"{known[field_name].type}: the file was changed after dfmp2 "
                             "wrote it")
    return kind(**{n: v for n, v in values.items() if n in known})


#: Record fields that may hold an infinite float (never NaN).
_MAY_BE_INFINITE = frozenset({"metric_condition"})

#: JSON types of the annotations the records' fields carry (``float`` takes an int: JSON
#: writes 0.0 as 0 in some tools; a bool is no number here).
_JSON_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,),
               "dict": (dict,), "list": (list,), "tuple": (list,), "None": (type(None),)}


def _of_type(value, annotation) -> bool:
    """Whether a JSON value fits a record field's annotation (``"float | None"`` and the
    like); an annotation of other names (a nested record) is not checked here."""
    names = [part.strip() for part in str(annotation).split("|")]
    if not all(n in _JSON_TYPES for n in names):
        return True
    for n in names:
        if isinstance(value, bool) and n != "bool":
            continue
        if isinstance(value, _JSON_TYPES[n]):
            return not (isinstance(value, float) and not math.isfinite(value))
    return False


def _grid_text(grid: dict) -> str:
    """'level 3 (nwchem_prune), 31016 points' or '99 radial x 302 angular (unpruned), ...'."""
    if grid.get("atom_grid"):
        radial, angular = grid["atom_grid"]
        what = f"{radial} radial x {angular} angular per atom"
    else:
        what = f"level {grid['level']}"
    prune = grid.get("prune")
    return f"{what} ({prune or 'unpruned'}), {grid['points']} points"


#: What the summary adds to its frozen orbitals for each rule of a frozen core.
_CORE_RULE_TEXT = {"pyscf": ": frozen core, PySCF's table",
                   "psi4": ": frozen core, Psi4's rule (previous noble gas)"}


def _frozen_text(s: Sizes) -> str:
    """'all electrons', '1 occupied and 0 virtual frozen', or per spin where the spins differ."""
    alpha = (s.nfrozen_occ, s.nfrozen_vir)
    beta = (s.nfrozen_occ_beta, s.nfrozen_vir_beta) if s.nocc_beta is not None else alpha
    if alpha == beta:
        return (f"{alpha[0]} occupied and {alpha[1]} virtual frozen" if any(alpha)
                else "all electrons")
    return (f"frozen: alpha {alpha[0]} occupied and {alpha[1]} virtual, beta {beta[0]} "
            f"occupied and {beta[1]} virtual")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _mp2_space(s: Sizes) -> str:
    """'5 occupied x 19 virtual', or per spin for an open shell."""
    if s.nocc_beta is None:
        return f"{s.nocc} occupied x {s.nvir} virtual"
    return (f"alpha {s.nocc} occupied x {s.nvir} virtual, beta {s.nocc_beta} occupied x "
            f"{s.nvir_beta} virtual")


def _per_element(record) -> str:
    """'cc-pvdz' when every element has the same entry, else 'H: cc-pvdz, I: def2-svp'."""
    if record is None or isinstance(record, str):
        return str(record)
    values = set(map(str, record.values()))
    if len(values) == 1:
        return values.pop()
    return ", ".join(f"{el}: {name}" for el, name in sorted(record.items()))


def versions() -> dict:
    """Versions of dfmp2 and the libraries that shaped the numbers."""
    import numpy
    import pyscf
    import torch

    from ._version import __version__

    return {"dfmp2": __version__, "pyscf": pyscf.__version__, "torch": str(torch.__version__),
            "numpy": numpy.__version__, "python": platform.python_version()}


#: How the summary names each stability analysis (:attr:`ScfInfo.stability`).
_STABILITY_NAMES = {"internal": "internal", "rhf_to_uhf": "RHF -> UHF"}


def _stability_text(record: dict, kind: str) -> str:
    """The summary's stability line: the instabilities followed (each one's eigenvalue and
    energy before and after), then per analysis of the SCF kept its lowest Hessian eigenvalue
    and verdict (``kind``: the reference's, 'rks' names RKS -> UKS)."""
    parts = []
    for k, follow in enumerate(record.get("follows", ()), 1):
        parts.append(f"internal instability {k} ({follow['eigenvalue']:.6f} Eh) followed: E "
                     f"{follow['from_energy']:.10f} -> {follow['energy']:.10f} Eh in "
                     f"{follow['cycles']} cycles"
                     + ("" if follow["lowered"] else ", not lower: the solution it left kept"))
    then = "then " if parts else ""
    for key, name in _STABILITY_NAMES.items():
        if key not in record:
            continue
        if key == "rhf_to_uhf" and kind == "rks":
            name = "RKS -> UKS"
        lowest = record[key]
        value = lowest["lowest_eigenvalue"]
        if value is None:
            parts.append(f"{then}{name} stable (no orbital rotations)")
        else:
            value = 0.0 if abs(value) < 5e-7 else value  # no "-0.000000"
            parts.append(f"{then}{name} {'stable' if lowest['stable'] else 'UNSTABLE'} (lowest "
                         f"Hessian eigenvalue {value:.6f} Eh"
                         + ("" if lowest["converged"] else ", not converged") + ")")
        then = ""
    return "; ".join(parts)


def _spin_text(spin: str | None) -> str:
    return "" if spin is None else " (both spins)" if spin == "both" else f" ({spin} spin)"


def _interaction_lines(inter: dict, error: float = 0.0) -> list[str]:
    """The counterpoise section of the summary: the fragments, their totals and E_int per
    level, then (a record from before the fragments ran in their own basis has none) their
    totals in their own basis, the uncorrected E_int and the BSSE per level, each to the
    decimals its :func:`interaction_error` leaves (``error``: the complex's)."""
    def atoms(first: int, stop: int) -> str:
        return f"atom {stop}" if stop - first == 1 else f"atoms {first + 1}-{stop}"

    def totals_table(heading: str, columns: list[tuple[str, dict]]) -> list[str]:
        """Each level's totals: one column per (name, totals by level); '' names no column."""
        rows = [f"  {heading:<22s}" + "".join(f"{name:>22s}" for name, _ in columns)]
        for level, label in inter["levels"].items():
            d = decimals_for(interaction_error(level, error) / 2)  # each run's own error
            rows.append(f"  {'E(' + label + ')':<22s}" + "".join(
                f"{values[level]:22.{d}f}" if name else " " * 22 for name, values in columns))
        return rows

    def energy_lines(prefix: str, values: dict) -> list[str]:
        """'<prefix> <level>  x Eh  y kcal/mol' per level, the Eh ending where the totals'
        first column does (past it where the label is longer than the column before it)."""
        rows = []
        for level, label in inter["levels"].items():
            level_error = interaction_error(level, error)
            d = decimals_for(level_error)
            dk = decimals_for(level_error * inter.get("hartree_to_kcal_mol", 627.5), most=4)
            name, eh = f"{prefix} {label}", f"{values[level]['eh']:.{d}f}"
            rows.append(f"  {name}{eh:>{max(44 - len(name), len(eh) + 1)}s} Eh "
                        f"{values[level]['kcal_mol']:12.{dk}f} kcal/mol")
        return rows

    frags = ", ".join(f"{atoms(*f['atoms'])} (charge {f['charge']:+d}, multiplicity "
                      f"{f['multiplicity']})" for f in inter["fragments"])
    lines = [f"  Counterpoise-corrected interaction energy, {len(inter['fragments'])} fragments "
             f"in the complex's basis: {frags}"]
    totals = inter.get("totals_eh")
    if totals:  # the totals E(int) is made of: the complex's, then each fragment's
        lines += totals_table("totals (Eh)", [
            ("complex", totals["complex"]),
            *((f"fragment {k + 1}", f) for k, f in enumerate(totals["fragments"]))])
    lines += energy_lines("E(int)", inter)
    if "uncorrected" not in inter:  # a record from before the fragments ran in their own basis
        return lines
    lines.append("  Uncorrected: each fragment in its own basis (no ghost atoms); "
                 "BSSE = E(int) - E(int) uncorrected")
    if totals and "fragments_own_basis" in totals:  # under the fragments' columns above
        lines += totals_table("own-basis totals (Eh)", [
            ("", {}), *((f"fragment {k + 1}", f)
                        for k, f in enumerate(totals["fragments_own_basis"]))])
    return lines + energy_lines("E(int) uncorrected", inter["uncorrected"]) + energy_lines(
        "BSSE", inter["bsse"])
