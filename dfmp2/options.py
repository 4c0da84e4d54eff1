"""Every knob of a run in one frozen dataclass, validated once when it is made."""

from __future__ import annotations

import numbers
import os
from dataclasses import MISSING, dataclass, fields

from ._names import (
    BACKENDS,
    CORE_RULES,
    CPU_BLAS_CHOICES,
    DEVICES,
    GUESSES,
    NKI_MATMULS,
    NKI_TARGETS,
    STABILITY_MODES,
    UNITS,
)
from .errors import InputError
from .functionals import parse_grid, resolve

__all__ = ["Options", "SCF_TYPES", "SCF_PRECISIONS", "REFERENCES", "PRECISIONS", "BACKENDS"]

SCF_TYPES = ("df", "conv")
REFERENCES = ("rhf", "uhf", "rohf")
PRECISIONS = ("fp64", "mixed", "fp32")
#: Precisions of a DF-SCF's K with dfmp2's J/K: float64 throughout, or float32 early iterations.
SCF_PRECISIONS = ("fp64", "mixed")
#: The options that take one of a few names, and those names.
CHOICES = {"scf_type": SCF_TYPES, "scf_precision": SCF_PRECISIONS, "backend": BACKENDS,
           "cpu_blas": CPU_BLAS_CHOICES, "device": DEVICES,
           "nki_matmul": NKI_MATMULS, "nki_target": NKI_TARGETS, "precision": PRECISIONS,
           "reference": REFERENCES, "core_rule": CORE_RULES, "stability": STABILITY_MODES,
           "guess": GUESSES, "unit": UNITS}


@dataclass(frozen=True)
class Options:
    """Options of a DF-MP2 run. Energies in Hartree, memory in MB.

    basis : orbital basis name (PySCF spelling).
    auxbasis : MP2 fitting basis; None = the RI partner of ``basis`` (cc-pVDZ -> cc-pVDZ-RI).
    scf_type : 'df' (density-fitted SCF with the JK-fit basis ``scf_auxbasis``) or 'conv'.
    scf_auxbasis : JK-fit basis of a DF-SCF; None = PySCF's JK-fit partner of ``basis``.
    charge, spin : total charge and 2S (PySCF convention: 0 singlet, 1 doublet, ...).
    ecp : None (attach the ECP that PySCF's library has for ``basis``, e.g. def2-* on elements
        beyond Kr), 'none' (all electrons) or an ECP name.
    unit : 'angstrom' or 'bohr': the unit of the coordinates (and Z-matrix distances) of an xyz
        file or atom string (PySCF's ``Mole.unit``). A ``Mole`` keeps its own ``unit`` and a
        QCSchema input's geometry is in Bohr by definition: a unit given with either must be
        that one (it changes nothing), another is refused.
    cartesian : True for Cartesian functions (6 d, 10 f per shell), False for spherical ones
        (5 d, 7 f); None = spherical (PySCF's default) for a geometry, the ``Mole``'s own
        ``cart`` for a Mole. Gaussian and Psi4 run the 3-21G and 6-31G families Cartesian by
        default (their energies differ: water 6-31G* MP2 by 3.7e-3 Eh).
    reference : 'rhf', 'uhf' or 'rohf'; None = rhf for singlets, uhf otherwise.
    frozen : None (all electrons), an int (the lowest n orbitals), or a tuple of orbital indices
        (PySCF's ``frozen=`` semantics; may name virtual orbitals too); for UHF and ROHF the
        same for both spins, or a pair of tuples (alpha indices, beta indices). As in PySCF, an
        int larger than a spin's occupied count freezes that spin's lowest virtuals too.
    frozen_core : freeze the chemical core of each element, PySCF's ``chemcore`` table (0
        orbitals for H-Be, 1 for B-Mg, 5 for Al-Zn, 9 for Ga-Sr, ...: the alkali and
        alkaline-earth metals keep their outermost core shell correlated), or by ``core_rule``.
    core_rule : which frozen core ``frozen_core`` means: 'pyscf' (the table above) or 'psi4'
        (Psi4's FREEZE_CORE TRUE: the previous noble gas's shells, so Li-Be freeze 1, Na-Mg 5,
        K-Zn 9; :func:`dfmp2.reference.psi4_core_orbitals`), which a QCSchema input's
        ``freeze_core`` keyword sets.
    backend : 'auto', 'pytorch' or 'nki'; fused_energy : use the fused pair-energy op.
    cpu_blas : 'auto' (numpy's OpenBLAS on AMD CPUs with AVX2/FMA and Intel CPUs with
        AVX-512, else torch's), 'torch' (MKL in the CPU wheel) or 'numpy': whose BLAS runs the
        pytorch backend's CPU matrix products.
    nki_emulator, nki_simulator, require_nki : NKI execution policy (see dfmp2.linalg).
    nki_matmul : precision of the NKI pair kernels' (ia|jb) products, 'fp32' or 'bf16x3'.
    nki_target : 'auto', 'trn1' or 'trn2': the NeuronCore generation of the NKI launches (LNC,
        cores, device memory); auto reads the instance type (hardware) or the emulated target.
    max_memory : working-set budget in MB of the DF-SCF's J/K and of the MP2 step (in turn).
    precision : 'fp64' (default); 'mixed' (fp32 pair GEMMs, fp64 reduction and sums) or 'fp32'
        (fp32 GEMMs and each pair's terms in fp32, summed in fp64).
    force_outcore : keep B in a temporary HDF5 file even when it fits in memory, and the
        DF-SCF's fitted tensor in its temporary file.
    scratch_dir : directory of that file (default: the system's temporary directory).
    xc : None (HF reference, MP2) or a functional: a double hybrid's name (B2PLYP, B2GPPLYP,
        DSD-BLYP, DSD-PBEP86, ...; :data:`dfmp2.functionals.DOUBLE_HYBRIDS`) runs an RKS or
        UKS reference with its KS part and reports the double hybrid's energy; any other
        functional is the KS part of a custom double hybrid and needs both scales.
    grid : DFT grid of a KS reference: None (PySCF's level 3), a level 0-9, or
        "RADIAL,ANGULAR" points per atom (unpruned).
    os_scale, ss_scale : scales of the opposite- and same-spin energies in the scaled energy
        reported beside MP2 (None: SCS-MP2, Grimme's 6/5 and 1/3) or of a double hybrid's PT2
        term (None: the functional's own).
    device : 'auto' (a CUDA device when torch sees one, else the host), 'cpu' or 'cuda': where
        the MP2 step runs (:mod:`dfmp2.device`); device_memory : its budget on the device in MB
        (None: the device's free memory).
    pair_energies : keep the energy of every occupied pair (``Result.pair_energies``; host ops,
        one per block, instead of the fused pair sums).
    sos : the spin-opposite-scaled variant: same-spin scale 0 (SOS-MP2: opposite-spin 1.3).
    scf_precision : 'fp64' (default: float64 K in every cycle of a DF-SCF on dfmp2's J/K, the
        iterations of PySCF's own DF-SCF) or 'mixed' (K in float32 until the orbital gradient is
        below 1e-3, then float64; only a float64 cycle can converge, so the SCF energy is the
        float64 one, and the orbitals differ from it within the convergence tolerance).
    conv_tol, conv_tol_grad, max_cycle : SCF convergence (tight by default: the MP2 energy
        inherits the SCF's orbital error; conv_tol_grad None: 1e-7 for HF, 1e-6 for a KS
        reference, whose pruned DFT grid leaves a gradient noise of a few 1e-7 on open shells;
        a KS SCF stalled on that noise above 1e-6 is accepted up to
        :data:`dfmp2.scf.KS_STALL_LIMIT` (or sqrt(conv_tol) when smaller) with a warning; a
        given conv_tol_grad is never relaxed). conv_tol 1e-10 by default: the orbital gradient
        is what converges the orbitals (below 1e-7 the energy is within about g^2 of its
        stationary value), and a total energy of about 1000 Eh moves by 1e-11 to 3e-11 from
        cycle to cycle by rounding alone once it has settled ((H2O)16+ cc-pVDZ, UHF), so a
        1e-11 test there stops on whichever cycle the rounding happens to allow.
    chkfile : PySCF checkpoint file of the SCF: written when converged; one of the same
        molecule, basis, reference and functional already there is the SCF when converged to
        this run's tolerances (no cycle), else the initial guess; one of another calculation
        is refused.
    guess : the SCF's initial guess where no ``chkfile`` checkpoint gives one: 'minao'
        (PySCF's default), 'atom', 'huckel', 'mod_huckel', '1e' or 'sap' (PySCF's
        ``init_guess``); level_shift : Eh added to the virtual orbitals' energies in the SCF's
        iterations (PySCF's ``level_shift``; not in the converged orbitals and energies), 0 for
        none: a slower, steadier SCF for a small HOMO-LUMO gap.
    stability : 'none' (default), 'check' or 'follow': after the SCF converges, the lowest
        eigenvalues of its orbital-rotation Hessian (:mod:`dfmp2.stability`: within its own
        kind, and RHF -> UHF for a closed-shell RHF or RKS), in the record, with a warning for
        each instability; 'follow' rotates the orbitals along an internal instability and runs
        the SCF again from there, until it is stable (at most
        :data:`dfmp2.stability.MAX_FOLLOWS` times).
    """

    basis: str = "cc-pvdz"
    auxbasis: str | None = None
    scf_type: str = "df"
    scf_auxbasis: str | None = None
    scf_precision: str = "fp64"
    charge: int = 0
    spin: int = 0
    ecp: str | None = None
    unit: str = "angstrom"
    cartesian: bool | None = None
    reference: str | None = None
    frozen: int | tuple[int, ...] | None = None
    frozen_core: bool = False
    core_rule: str = "pyscf"
    backend: str = "auto"
    cpu_blas: str = "auto"
    fused_energy: bool = True
    nki_emulator: bool = False
    nki_simulator: bool = False
    require_nki: bool = False
    nki_matmul: str = "fp32"
    nki_target: str = "auto"
    max_memory: int = 4000
    precision: str = "fp64"
    force_outcore: bool = False
    scratch_dir: str | None = None
    xc: str | None = None
    grid: int | tuple[int, int] | str | None = None
    os_scale: float | None = None
    ss_scale: float | None = None
    sos: bool = False
    pair_energies: bool = False
    device: str = "auto"
    device_memory: int | None = None
    conv_tol: float = 1e-10
    conv_tol_grad: float | None = None
    max_cycle: int = 100
    chkfile: str | None = None
    stability: str = "none"
    guess: str = "minao"
    level_shift: float = 0.0

    def __post_init__(self):
        _check_types(self)
        _choice(self, "scf_type")
        _choice(self, "scf_precision")
        _choice(self, "stability")
        _choice(self, "guess")
        if (not isinstance(self.level_shift, numbers.Real) or _is_bool(self.level_shift)
                or not 0 <= self.level_shift <= MAX_LEVEL_SHIFT):
            raise InputError(f"level_shift (--level-shift) must be a number of Eh from 0 to "
                             f"{MAX_LEVEL_SHIFT:g}, got {self.level_shift!r}")
        object.__setattr__(self, "level_shift", float(self.level_shift))
        _choice(self, "unit")
        if self.scf_type == "conv":
            for name, value, default in (("scf_auxbasis", self.scf_auxbasis, None),
                                         ("scf_precision", self.scf_precision, "fp64")):
                if value != default:
                    flag = "--" + name.replace("_", "-")
                    raise InputError(f"{flag} {value} sets the density-fitted SCF, and "
                                     "--scf-type conv runs it on exact integrals; drop one "
                                     "of them")
        _choice(self, "backend")
        _choice(self, "cpu_blas")
        _choice(self, "device")
        if self.device_memory is not None:
            if (not isinstance(self.device_memory, numbers.Integral)
                    or isinstance(self.device_memory, bool) or self.device_memory <= 0):
                raise InputError(f"device_memory must be a positive number of MB, got "
                                 f"{self.device_memory!r}")
            object.__setattr__(self, "device_memory", int(self.device_memory))
            if self.device == "cpu":
                raise InputError("--device-memory sets the budget of a CUDA device, and --device "
                                 "cpu runs on the host; drop one of them")
        _choice(self, "nki_matmul")
        _choice(self, "nki_target")
        if self.backend == "pytorch" and self.nki_matmul != "fp32":
            raise InputError(f"--nki-matmul {self.nki_matmul} chooses the NKI pair kernels' "
                             "products and contradicts --backend pytorch; drop one of them")
        if self.backend == "pytorch" and self.nki_target != "auto":
            raise InputError(f"--nki-target {self.nki_target} chooses the Trainium generation "
                             "of the NKI kernels and contradicts --backend pytorch; drop one of "
                             "them")
        if self.nki_matmul != "fp32" and (not self.fused_energy or self.pair_energies):
            other = "--pair-energies" if self.pair_energies else "--no-fused-energy"
            raise InputError(f"--nki-matmul {self.nki_matmul} chooses the products of the fused "
                             f"NKI pair kernel, which {other} does not run; drop one of them")
        if self.require_nki and self.pair_energies:
            raise InputError("--pair-energies keeps every pair's energy by a host op, which "
                             "--require-nki forbids (no stage of the MP2 step may leave NKI); "
                             "drop one of them")
        if self.require_nki and not self.fused_energy:
            raise InputError("--no-fused-energy reduces the pair integrals by a host op, which "
                             "--require-nki forbids (no stage of the MP2 step may leave NKI); "
                             "drop one of them")
        if self.scratch_dir is not None:
            if not isinstance(self.scratch_dir, (str, os.PathLike)) or isinstance(
                    os.fspath(self.scratch_dir), bytes):
                raise InputError(f"scratch_dir must be a directory path (str or os.PathLike), "
                                 f"got {self.scratch_dir!r}")
            object.__setattr__(self, "scratch_dir", os.fspath(self.scratch_dir))
            if not self.scratch_dir.strip():
                raise InputError("scratch_dir (--scratch-dir) is empty; give a directory or "
                                 "leave it out for the system's temporary directory")
        _choice(self, "precision")
        if self.reference is not None:
            _choice(self, "reference")
        if not isinstance(self.basis, str) or not self.basis.strip():
            raise InputError(f"basis must be a basis-set name (or a file path), got "
                             f"{self.basis!r}; for a basis per element build a pyscf Mole "
                             "with mol.basis = {'O': ..., 'H': ...} and pass the Mole")
        if self.ecp is not None and (not isinstance(self.ecp, str) or not self.ecp.strip()):
            raise InputError(f"ecp must be an ECP name or 'none', got {self.ecp!r}")
        if self.cartesian is not None and not _is_bool(self.cartesian):
            raise InputError(f"cartesian must be True, False or None, got {self.cartesian!r}")
        if self.cartesian is not None:
            object.__setattr__(self, "cartesian", bool(self.cartesian))
        _choice(self, "core_rule")
        if self.core_rule != "pyscf" and not self.frozen_core:
            raise InputError(f"core_rule={self.core_rule!r} chooses which core frozen_core "
                             "freezes; it needs frozen_core=True")
        if self.frozen is not None and self.frozen_core:
            raise InputError("give either frozen_core (--frozen-core) or frozen (--frozen), not "
                             "both")
        if isinstance(self.frozen, (list, tuple)) and len(self.frozen) == 2 and all(
                isinstance(f, (list, tuple)) for f in self.frozen):
            _check_indices(self.frozen[0])
            _check_indices(self.frozen[1])
            object.__setattr__(self, "frozen", (tuple(self.frozen[0]), tuple(self.frozen[1])))
        elif isinstance(self.frozen, list):
            object.__setattr__(self, "frozen", tuple(self.frozen))
        if isinstance(self.frozen, tuple) and any(isinstance(f, list) for f in self.frozen):
            raise InputError(f"frozen: give a list of orbital indices, or a pair of lists (alpha, "
                             f"beta) for an open shell; got {self.frozen!r}")
        if isinstance(self.frozen, bool):
            raise InputError(f"frozen must be an int or a list of orbital indices, got {self.frozen}")
        if isinstance(self.frozen, int) and self.frozen < 0:
            raise InputError(f"frozen must be >= 0, got {self.frozen}")
        if isinstance(self.frozen, tuple) and not (
                len(self.frozen) == 2 and all(isinstance(f, tuple) for f in self.frozen)):
            _check_indices(self.frozen)
        for name in ("os_scale", "ss_scale"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, numbers.Real) or _is_bool(value):
                    raise InputError(f"{name} must be a number, got {value!r}")
                object.__setattr__(self, name, float(value))
        if self.xc is not None and self.reference == "rohf":
            raise InputError(f"--xc {self.xc} runs a Kohn-Sham reference: RKS or UKS "
                             "(--reference rhf or uhf); ROKS orbitals are not supported")
        object.__setattr__(self, "grid", parse_grid(self.grid))
        if self.grid is not None and self.xc is None:
            raise InputError("--grid sets the DFT grid of a Kohn-Sham reference; it needs --xc")
        resolve(self.xc, self.os_scale, self.ss_scale, self.sos, parse=False)
        if self.spin < 0:
            raise InputError(f"spin (2S) must be >= 0, got {self.spin}")
        for name in ("charge", "spin"):  # beyond any molecule's electron count (and C's long)
            if abs(getattr(self, name)) > MAX_ELECTRONS:
                raise InputError(f"{name} {getattr(self, name)} is beyond any molecule dfmp2 "
                                 f"can run (|{name}| <= {MAX_ELECTRONS})")
        if self.max_memory <= 0:
            raise InputError(f"max_memory must be a positive number of MB, got {self.max_memory}")
        if self.max_cycle < 1:
            raise InputError(f"max_cycle must be >= 1, got {self.max_cycle}")
        if self.conv_tol_grad is not None:
            if not isinstance(self.conv_tol_grad, numbers.Real) or _is_bool(self.conv_tol_grad):
                raise InputError(f"conv_tol_grad must be a number, got {self.conv_tol_grad!r}")
            object.__setattr__(self, "conv_tol_grad", float(self.conv_tol_grad))
        if not 0 < self.conv_tol < 1e-3:
            raise InputError(f"conv_tol (the SCF's energy tolerance) must be above 0 and below "
                             f"1e-3 Eh, got {self.conv_tol}")
        if not 0 < self.resolved_conv_tol_grad < 1e-1:
            raise InputError(f"conv_tol_grad (--conv-tol-grad, the SCF's orbital-gradient "
                             f"threshold) must be above 0 and below 0.1, got "
                             f"{self.conv_tol_grad}")
        # (PySCF also reads an MP2 fitting basis given as a list of shells, one set for every
        # element; the SCF's fitting record reads a name or a dict only)
        for name, kinds, words in (("scf_auxbasis", (str, dict), "a dict per element"),
                                   ("auxbasis", (str, dict, list, tuple),
                                    "a dict per element or a list of shells")):
            value = getattr(self, name)
            if value is not None and ((isinstance(value, str) and not value.strip())
                                      or not isinstance(value, kinds)):
                raise InputError(f"{name} (--{name.replace('_', '-')}) must be a basis-set name "
                                 f"or file (in Python also {words}, as PySCF reads them), "
                                 f"got {value!r}; leave it out for the default")
        if self.chkfile is not None:
            if not isinstance(self.chkfile, (str, os.PathLike)) or isinstance(
                    os.fspath(self.chkfile), bytes) or not os.fspath(self.chkfile).strip():
                raise InputError(f"chkfile must be a file path (str or os.PathLike), got "
                                 f"{self.chkfile!r}")
            object.__setattr__(self, "chkfile", os.fspath(self.chkfile))

    @property
    def core(self) -> bool | str:
        """The frozen core as :func:`dfmp2.reference.frozen_mask` takes it: False, or its
        rule (:attr:`core_rule`)."""
        return self.core_rule if self.frozen_core else False

    @property
    def resolved_reference(self) -> str:
        return self.reference or ("rhf" if self.spin == 0 else "uhf")

    @property
    def resolved_conv_tol_grad(self) -> float:
        """The SCF's orbital-gradient threshold: the one given, else 1e-7 (HF) or 1e-6 (KS)."""
        if self.conv_tol_grad is not None:
            return self.conv_tol_grad
        return 1e-6 if self.xc is not None else 1e-7

    @property
    def scaling(self):
        """The run's :class:`dfmp2.functionals.Scaling` (a custom functional is checked with
        PySCF here)."""
        return resolve(self.xc, self.os_scale, self.ss_scale, self.sos)

    @classmethod
    def default(cls, name: str):
        """The default of field ``name`` (the CLI takes its defaults from here)."""
        return _DEFAULTS[name]

    @classmethod
    def field_names(cls) -> frozenset[str]:
        """The names of the options."""
        return frozenset(_DEFAULTS)

    @classmethod
    def from_kwargs(cls, **kwargs) -> "Options":
        """Build from keyword arguments, naming any unknown one."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise InputError(
                f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(sorted(known))}"
            )
        return cls(**kwargs)


_DEFAULTS = {f.name: f.default for f in fields(Options) if f.default is not MISSING}


#: Bound on the SCF's level shift (Eh): above the 0.1-0.5 Eh a hard case needs; water's SCF
#: took 37 cycles at 2 Eh (10 unshifted) and did not converge in 100 at 9.9 Eh.
MAX_LEVEL_SHIFT = 2.0
#: Bound on |charge| and 2S: far above any molecule's electron count, far below the integer
#: range PySCF's C code takes.
MAX_ELECTRONS = 100_000


def _check_types(opts: Options) -> None:
    """Numbers and switches have the type of their default (bool is not taken for a number;
    numpy scalars are, and become Python numbers); ``frozen`` is None, an integer or a sequence
    of integers (a numpy array too), or a pair of such sequences, normalised to tuples."""
    for f in fields(opts):
        value, default = getattr(opts, f.name), f.default
        if isinstance(default, bool):
            ok = _is_bool(value)
            value = bool(value) if ok else value
        elif isinstance(default, float):
            ok = isinstance(value, numbers.Real) and not _is_bool(value)
            value = float(value) if ok else value
        elif isinstance(default, int):
            ok = isinstance(value, numbers.Integral) and not _is_bool(value)
            value = int(value) if ok else value
        else:
            continue
        if not ok:
            kind = {bool: "True or False", float: "a number", int: "an integer"}[type(default)]
            raise InputError(f"{f.name} must be {kind}, got {value!r}")
        object.__setattr__(opts, f.name, value)
    frozen = opts.frozen
    if frozen is None:
        return
    if isinstance(frozen, numbers.Integral) and not _is_bool(frozen):
        object.__setattr__(opts, "frozen", int(frozen))
        return
    if hasattr(frozen, "tolist"):  # a numpy array (this module does not import numpy: the CLI
        frozen = frozen.tolist()   # reads Options before numpy may load)
    if isinstance(frozen, range):
        frozen = list(frozen)
    if not isinstance(frozen, (list, tuple)):
        raise InputError(f"frozen must be an int or a list of orbital indices, got {frozen!r}")
    object.__setattr__(opts, "frozen", [
        [_index(k) for k in (f.tolist() if hasattr(f, "tolist") else f)]
        if isinstance(f, (list, tuple)) or hasattr(f, "tolist") and getattr(f, "ndim", 0)
        else _index(f) for f in frozen])


def _is_bool(value) -> bool:
    """Python's and numpy's booleans (numpy's is no ``bool`` subclass)."""
    return isinstance(value, bool) or type(value).__name__ in ("bool", "bool_")


def _index(value):
    """An orbital index as a Python int (numpy integers too); anything else is left for the
    range check to name."""
    if isinstance(value, numbers.Integral) and not _is_bool(value):
        return int(value)
    return value


def _check_indices(frozen) -> None:
    """Orbital indices are integers; a negative one counts from the last orbital, as PySCF's
    MP2 reads it (``frozen=[-1]``: the highest virtual; the range is checked against the
    orbitals, :func:`dfmp2.reference.frozen_mask`)."""
    if any(not isinstance(k, int) or isinstance(k, bool) for k in frozen):
        raise InputError(f"frozen orbital indices must be integers (a negative one counts from "
                         f"the last orbital), got {frozen}")


def chosen(name: str, value):
    """``value`` of the option ``name`` as :data:`CHOICES` spells it where it is one of them in
    another case or with blanks around it ('UHF' is 'uhf', as basis names are any case); any
    other value as it is."""
    valid = CHOICES.get(name, ())
    if isinstance(value, str) and value not in valid and value.strip().lower() in valid:
        return value.strip().lower()
    return value


def checked_choice(name: str, value):
    """``value`` of the option ``name`` as :data:`CHOICES` spells it (:func:`chosen`); one line
    naming the choices where it is none of them."""
    value = chosen(name, value)
    if value not in CHOICES[name]:
        raise InputError(f"{name} must be one of {', '.join(CHOICES[name])}; got {value!r}")
    return value


def _choice(options, name: str) -> None:
    """``options.name`` is one of :data:`CHOICES`' values for it, put as spelled there
    (:func:`checked_choice`)."""
    object.__setattr__(options, name, checked_choice(name, getattr(options, name)))
