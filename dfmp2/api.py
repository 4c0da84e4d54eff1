"""Python API: ``run(geometry, ...) -> Result`` and the PySCF-shaped ``DFMP2(mf).run()``.

``run`` builds the molecule, plans the MP2 step and checks its resources (all before the SCF, so
no SCF is computed only to be lost), runs the SCF and hands over to :func:`compute`, the
functional core that ``DFMP2`` also calls. Every setting given is applied or refused, never
ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace

import numpy as np
from pyscf import df as pyscf_df
from pyscf import gto
from pyscf import scf as pyscf_scf
from pyscf.soscf import newton_ah

from . import distributed
from ._files import check_writable_file
from ._logged import kept_warnings
from .blocking import MB, BlockPlan, plan_blocks, size_texts, usable_bytes
from .buffers import return_freed_memory
from .device import resolve_device
from .df import INT3C_EXPCUTOFF
from .energy import scs_energy
from .errors import InputError, NotComputedError, OrbitalError, ResourceError
from .functionals import check_grid, grid_record
from .integrals import auxbasis_record, make_auxmol
from .jk import DFJK
from .linalg import Dispatcher, DispatchPolicy, numpy_ops
from .molecule import (
    basis_record,
    build_mole,
    check_every_atom_has_functions,
    ecp_record,
    molecule_record,
    unit_name,
)
from .options import Options
from .pipeline import PRECISION_DTYPES, StageTimer, dfmp2_pair_energies
from .reference import (
    KINDS,
    Reference,
    check_scf_object,
    frozen_mask,
    frozen_per_spin,
    hamiltonian_record,
    own_attribute,
    reference_from_scf,
    reference_kind,
    rohf_fock,
    spin_contamination,
)
from .results import BackendInfo, Method, MoleculeInfo, Result, ScfInfo, Sizes, versions
from .scf import (
    check_guess,
    check_reference_spin,
    plan_scf,
    release_integrals,
    run_scf,
    scf_fit_record,
)
from .threads import checked_count as checked_thread_count
from .threads import counts as thread_counts
from .threads import limit as limit_threads

log = logging.getLogger(__name__)

__all__ = ["run", "compute", "DFMP2", "RunPlan", "plan_run", "check_orbitals",
           "ORTHONORMALITY_TOL", "LOOSE_CONV_TOL"]

#: Largest |C^T S C - 1| element accepted: canonical SCF orbitals are orthonormal to ~1e-13.
ORTHONORMALITY_TOL = 1e-8
#: The orbital check's Fock tolerance (Eh) is ten times the SCF's gradient threshold, within
#: these bounds: rotated or localised orbitals give elements of 1e-2 Eh and more.
CANONICAL_TOL_MIN, CANONICAL_TOL_MAX = 1e-6, 1e-3
#: Largest distance (Bohr) between an atom and its place in a density-fitted SCF's
#: ``with_df.auxmol`` (where its fitted integrals were built) that counts as the same place
#: (:func:`_same_atoms`'s, for a geometry read back from Angstrom).
FIT_GEOMETRY_TOL = 1e-8
#: An SCF converged more loosely than this (energy change, Eh) gets a WARNING (see
#: :func:`check_orbitals` for the measured error of E(corr)).
LOOSE_CONV_TOL = 1e-8
#: An overlap matrix whose smallest eigenvalue is below this makes orbitals that are not
#: orthonormal to ORTHONORMALITY_TOL a linear-dependency problem (the refusal says so): PySCF's
#: own threshold for dropping overlap eigenvalues (scf.hf.overlap_zero_eigenvalue_threshold).
LINDEP_OVERLAP = 1e-6
#: Molecule settings that a given ``Mole`` keeps unless they are passed explicitly (``unit``: a
#: Mole's own, which one passed with it must be).
MOLE_SETTINGS = ("basis", "charge", "spin", "ecp", "cartesian", "unit")
#: Options of the SCF that :class:`DFMP2` is given and cannot change (refused there, as the
#: molecule's are): its functional, grid, reference, fitting, precision, convergence (guess,
#: level shift) and stability analysis.
_SCF_SETTINGS = ("xc", "grid", "reference", "scf_type", "scf_auxbasis", "scf_precision",
                 "conv_tol", "conv_tol_grad", "max_cycle", "chkfile", "stability", "guess",
                 "level_shift")


def run(geometry, progress=None, environment: dict | None = None, threads: int | None = None,
        **options) -> Result:
    """DF-MP2 from a geometry: build the molecule, plan, run the SCF, then the MP2 pipeline.

    geometry : xyz path or atom string (in Angstrom, or in Bohr with ``unit='bohr'``), or a pyscf
    ``Mole`` (its basis, charge, spin and ECP are kept unless given here, and then applied to a
    copy; its coordinates are read in its own ``unit``, and a ``unit`` given here must be that
    one); options : fields of :class:`Options`;
    progress : optional callback ``progress(stage, done, total)``; environment : the record of
    what the ``dfmp2`` command set in the process environment, stored in the result; threads :
    hold every thread pool of the process to this many threads during the run and restore them
    afterwards (:func:`dfmp2.threads.limit`; None: as they are), recorded in the result's CPU
    BLAS record.
    """
    _check_callbacks(progress, environment)
    if progress is not None:  # counts as Python ints (some are numpy's), for JSON and the like
        given = progress

        def progress(stage: str, done, total) -> None:
            given(stage, int(done), int(total))

    with limit_threads(threads), kept_warnings() as warned:
        result = _run(geometry, progress, environment, options)
    if result is None:  # a distributed run's other ranks: rank 0 has the result
        return None
    return replace(result, warnings=tuple(warned),
                   keywords=_given_keywords(options, result.method),
                   molecule=replace(result.molecule,
                                    input_unit_source=_unit_source(geometry, options)))


def _given_keywords(options: dict, method: Method, given=None) -> dict:
    """The record's keywords of a run with ``options``: those ``given`` (None: every one of
    ``options``; the command line passes its defaults too), as checked (:class:`Options`),
    under their QCSchema keyword names, with what the run's ``method`` adds to run it again
    (:func:`dfmp2.qcschema.keywords_of`)."""
    from .qcschema import keywords_of

    opts = Options.from_kwargs(**options)
    return keywords_of({name: getattr(opts, name) for name in options
                        if given is None or name in given}, method)


def _unit_source(geometry, options: dict) -> str:
    """Why the input's coordinates were read in their unit (``MoleculeInfo.input_unit_source``):
    a ``Mole``'s own unit ('mole'), the ``unit`` given ('given'), else Angstrom ('default')."""
    if isinstance(geometry, gto.Mole):
        return "mole"
    return "given" if "unit" in options else "default"


def _check_callbacks(progress, environment) -> None:
    """Before any work: ``progress`` takes (stage, done, total), ``environment`` is a dict that
    JSON can write (the result carries it into its summary and its JSON)."""
    if progress is not None:
        try:
            inspect.signature(progress).bind("stage", 0, 1)
        except TypeError:
            raise InputError("progress must be a function of (stage, done, total), got "
                             f"{progress!r}") from None
        except ValueError:  # a builtin without a signature: called as it is
            pass
    if environment is not None:
        if not isinstance(environment, dict):
            raise InputError(f"environment must be a dict of what was set, got {environment!r}")
        try:
            json.dumps(environment, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InputError(f"environment must be JSON data: {exc}") from None


def _run(geometry, progress, environment: dict | None, options: dict) -> Result:
    start = time.perf_counter()
    comm = distributed.current()
    opts, mol, auxmol, plan, la = _agreed_setup(geometry, options, comm)
    if comm is not None:
        return _run_ranks(comm, mol, auxmol, plan, opts, la, progress, environment, start)
    mf = run_scf(mol, opts, progress=progress, la=la)
    try:
        return compute(mf, opts, progress=progress, scf_seconds=time.perf_counter() - start,
                       auxmol=auxmol, plan=plan, own_scf=True, environment=environment, la=la)
    finally:  # the SCF's tensor (a temporary file when out of core) never outlives the run
        release_integrals(mf)


def check_run(geometry, options: dict) -> None:
    """Refuse, before any SCF, what :func:`run` of ``geometry`` with ``options`` would refuse
    before its SCF (the options, the molecule, the reference's spin, the auxiliary basis, the
    plan and its memory and scratch space; under torchrun on every rank alike). Its warnings
    are left to that run, which says them."""
    with silenced():
        _agreed_setup(geometry, options, distributed.current())


@contextlib.contextmanager
def silenced():
    """The ``dfmp2`` loggers at ERROR while the block runs: checks made ahead of a run leave
    their warnings to it (said once, and kept once in its record)."""
    logger = logging.getLogger("dfmp2")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _agreed_setup(geometry, options: dict, comm):
    """:func:`_setup`; under torchrun every rank stops alike, before any collective."""
    try:
        setup = _setup(geometry, options, comm)
    except Exception as exc:
        if comm is None:
            raise
        comm.agree(exc, "the input checks")  # raises it on every rank
    if comm is not None:
        comm.agree(None, "the input checks")
    return setup


def _setup(geometry, options: dict, comm):
    """Everything :func:`run` decides before the SCF: the options, the molecule, the
    auxiliary basis, the plan and its resources, the dispatcher. On a rank of a distributed run
    the chkfile (written by rank 0 alone) is checked on rank 0 only."""
    opts = Options.from_kwargs(**options)
    opts.scaling  # noqa: B018 -- a custom functional PySCF cannot evaluate fails here, not later
    check_grid(opts.grid)
    mol = run_molecule(geometry, options, opts)
    if isinstance(geometry, gto.Mole):  # the Mole's charge and spin are the run's (an
        # open-shell Mole gets UHF by default)
        opts = dataclasses.replace(opts, charge=int(mol.charge), spin=int(mol.spin))
    check_reference_spin(mol, opts.resolved_reference)
    check_guess(mol, opts.guess)
    _warn_beyond_physical_memory(opts.max_memory)
    auxmol = make_auxmol(mol, opts.auxbasis)
    world = comm.world_size if comm is not None else 1
    if comm is not None and opts.pair_energies:
        raise InputError("pair energies (--pair-energies, --plot) are computed on one process; "
                         "run without torchrun")
    plan = _plan_both(mol, auxmol, opts, world)
    check_scratch(plan, opts, auxmol.nao_nr(), world)
    if comm is None or comm.rank == 0:
        check_chkfile(opts.chkfile)
    la = _dispatcher(opts)
    resolve_device(opts.device, la.backend, comm is not None, opts.device_memory,  # refused
                   warn=True)                                                  # or said now
    return opts, mol, auxmol, plan, la


def run_molecule(geometry, options: dict, opts: Options):
    """The built molecule of ``run(geometry, **options)`` (``opts``: those options, checked): a
    ``Mole`` with the molecule settings given (:data:`MOLE_SETTINGS`), else its own; a geometry
    with the run's basis, ECP, functions and unit, and the charge and spin where given (where
    not, an xyz comment line may state them)."""
    if isinstance(geometry, gto.Mole):
        return build_mole(geometry, **{k: options[k] for k in MOLE_SETTINGS if k in options})
    return build_mole(geometry, basis=opts.basis, ecp=opts.ecp, cartesian=opts.cartesian,
                      unit=opts.unit,
                      **{k: getattr(opts, k) for k in ("charge", "spin") if k in options})


def _warn_beyond_physical_memory(max_memory_mb: int) -> None:
    """A WARNING when ``max_memory`` exceeds this machine's memory: the planner would keep in
    memory what does not fit there (the OS then swaps or kills the run)."""
    try:
        physical_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / MB
    except (ValueError, OSError, AttributeError):  # not a POSIX system that says
        return
    available, where = physical_mb, f"this machine's {physical_mb:.0f} MB of memory"
    limit_mb = _cgroup_limit_mb()
    if limit_mb is not None and limit_mb < physical_mb:
        available, where = limit_mb, f"the {limit_mb:.0f} MB limit of this process's cgroup"
    if max_memory_mb > available:
        log.warning("max_memory (--max-memory) %d MB is more than %s: what the plan keeps in "
                    "memory may not fit; give at most what the run may use", max_memory_mb,
                    where)


def _cgroup_limit_mb(cgroup_list: str = "/proc/self/cgroup",
                     root: str = "/sys/fs/cgroup") -> float | None:
    """The memory limit (MB) of this process's cgroup (a container, a Slurm or systemd job), v2
    or v1, as ``cgroup_list`` places it under ``root``; None where there is none or it cannot be
    read."""
    try:
        with open(cgroup_list) as lines:
            entries = [line.rstrip("\n").split(":", 2) for line in lines]
    except OSError:
        return None
    candidates = []
    for _id, controllers, path in (e for e in entries if len(e) == 3):
        if controllers == "":  # v2: the unified hierarchy
            candidates += [f"{root}{path}/memory.max", f"{root}/memory.max"]
        elif "memory" in controllers.split(","):  # v1
            candidates += [f"{root}/memory{path}/memory.limit_in_bytes",
                           f"{root}/memory/memory.limit_in_bytes"]
    for candidate in candidates:
        try:
            with open(os.path.normpath(candidate)) as limit:
                text = limit.read().strip()
        except OSError:
            continue
        if text.isdigit():  # 'max' (v2) or a huge number (v1): no limit
            return int(text) / MB
    return None


def _plan_both(mol, auxmol, opts: Options, world: int) -> RunPlan:
    """The MP2 step's plan (:func:`plan_run`) after the DF-SCF's (:func:`dfmp2.scf.plan_scf`),
    both before any integral. When ``max_memory`` is too small for either, the refusal is the
    one that needs more memory, so the least ``max_memory`` it names is enough for both."""
    try:
        plan_scf(mol, opts)
        scf_short = None
    except ResourceError as exc:
        scf_short = exc
    try:
        plan = plan_run(mol, auxmol, guess_occupations(mol, opts.resolved_reference), opts,
                        world)
    except ResourceError as exc:
        if scf_short is None or (exc.least_mb or 0) > (scf_short.least_mb or 0):
            raise
        raise scf_short from None
    if scf_short is not None:
        raise scf_short
    return plan


def _run_ranks(comm, mol, auxmol, plan: RunPlan, opts: Options, la: Dispatcher, progress,
               environment, start: float) -> Result | None:
    """:func:`run` on one rank of a distributed run (``docs/distributed.md``): rank 0 runs the
    SCF and prepares the reference, every rank takes part in the MP2 step, rank 0 returns the
    result and every other rank None. An error on rank 0 before the MP2 step ends every rank
    (:meth:`dfmp2.distributed.Comm.agree`)."""
    timer = StageTimer()
    mf = prep = spaces = error = None
    if comm.rank == 0:
        try:
            mf = run_scf(mol, opts, progress=progress, la=la)
            timer.seconds["scf"] = time.perf_counter() - start
            prep = _prepare(mf, opts, timer, auxmol, plan, own_scf=True)
            spaces = prep.ref.spaces if prep.ref.has_pairs else None
        except Exception as exc:  # an Interrupted (a signal) ends this rank at once
            error = exc
    try:
        comm.agree(error, "the SCF")
        spaces = distributed.share_spaces(comm, spaces)
        energies, record = None, {"world_size": comm.world_size, "backend": comm.backend,
                                  "note": "no pairs: nothing was distributed"}
        if spaces is not None:
            pair_energies, factor, record = distributed.distributed_pair_energies(
                mol, auxmol, spaces, la, comm, max_memory=opts.max_memory,
                precision=opts.precision, fused=opts.fused_energy,
                force_outcore=opts.force_outcore, scratch_dir=opts.scratch_dir,
                progress=progress)
            energies = (pair_energies, factor)
            timer.seconds.update({stage: seconds for stage, seconds in
                                  comm.stage_seconds.items()})
        if comm.rank != 0:
            return None
        device = resolve_device(opts.device, la.backend, True, opts.device_memory)
        return _assemble(mf, opts, prep, energies, timer, la, environment, distributed=record,
                         device=device)
    finally:  # the SCF's tensor (a temporary file when out of core) never outlives the run
        if mf is not None:
            release_integrals(mf)


def _dispatcher(opts: Options) -> Dispatcher:
    """The run's one dispatcher (SCF J/K and the MP2 step share it and its records)."""
    return Dispatcher(DispatchPolicy(opts.backend, opts.nki_simulator, opts.nki_emulator,
                                     opts.require_nki, opts.cpu_blas, opts.nki_matmul,
                                     opts.nki_target))


def guess_occupations(mol, reference: str) -> list[np.ndarray]:
    """Aufbau occupations per orbital space before the SCF: one array (2/0) for RHF, alpha and
    beta arrays (1/0) for UHF and ROHF (whose semicanonical spaces have the same counts)."""
    nao = mol.nao_nr()
    nalpha, nbeta = mol.nelec
    if reference == "rhf":
        return [np.array([2.0] * nalpha + [0.0] * (nao - nalpha))]
    return [np.array([1.0] * n + [0.0] * (nao - n)) for n in (nalpha, nbeta)]


@dataclass(frozen=True)
class RunPlan:
    """The MP2 step of one run, decided once: active ``(nocc, nvir)`` of each orbital space (one
    closed-shell space, or alpha and beta), the occupied orbitals per space before freezing,
    and the block plan (None when there are no pairs)."""

    spaces: tuple[tuple[int, int], ...]
    nocc_total: tuple[int, ...]
    blocks: BlockPlan | None

    @property
    def has_pairs(self) -> bool:
        return any(o and v for o, v in self.spaces)

    @property
    def ovx_per_aux(self) -> int:
        """Sum over the spaces of nocc * nvir."""
        return sum(o * v for o, v in self.spaces)


def plan_run(mol, auxmol, occupations: list[np.ndarray], opts: Options,
             world_size: int = 1) -> RunPlan:
    """The active orbitals and block sizes for the occupations of each orbital space (raises
    :class:`ResourceError` when ``max_memory`` is too small); with ``world_size`` ranks, one
    rank's blocks (:func:`dfmp2.distributed.plan_rank`: ``max_memory`` is per rank)."""
    frozen = [opts.frozen] if len(occupations) == 1 else frozen_per_spin(opts.frozen)
    dims, totals = [], []
    for mo_occ, frozen_s in zip(occupations, frozen):
        active = frozen_mask(mol, mo_occ, frozen_s, opts.core,
                             strict=len(occupations) == 1)
        occupied = mo_occ > 0
        dims.append((int(np.count_nonzero(occupied & active)),
                     int(np.count_nonzero(~occupied & active))))
        totals.append(int(np.count_nonzero(occupied)))
    blocks = None
    b_itemsize = 8 if opts.precision == "fp64" else 4
    used = [(o, v) for o, v in dims if o and v]
    if used and world_size > 1:
        blocks = distributed.plan_rank(mol.nao_nr(), used, auxmol.nao_nr(), world_size,
                                       opts.max_memory, b_itemsize, opts.force_outcore)
    elif used:
        blocks = plan_blocks(mol.nao_nr(), dims, auxmol.nao_nr(), opts.max_memory,
                             b_itemsize=b_itemsize, force_outcore=opts.force_outcore)
    return RunPlan(tuple(dims), tuple(totals), blocks)


def check_chkfile(path: str | None) -> None:
    """Before the SCF: a new checkpoint file can be created where ``path`` says, or an existing
    one rewritten."""
    if path is not None:
        check_writable_file(path, "chkfile", replaced=True)


def scratch_bytes(plan: RunPlan, naux: int, world_size: int = 1) -> int:
    """Bytes of the temporary HDF5 file: (ia|P) in fp64 plus B in the stored precision; of
    one rank's files with ``world_size`` ranks (its share of (ia|P) by auxiliary functions and
    its slice by occupied orbitals, and its slice of B)."""
    if plan.blocks is None or not plan.blocks.outcore:
        return 0
    if world_size > 1:
        slices = sum(-(-o // world_size) * v for o, v in plan.spaces if o and v)
        return 2 * slices * naux * 8 + plan.blocks.b_bytes
    return plan.ovx_per_aux * naux * 8 + plan.blocks.b_bytes


def check_scratch(plan: RunPlan, opts: Options, naux: int, world_size: int = 1) -> None:
    """Before the SCF: a given or needed scratch directory exists and a file can be made in it
    (tried, not inferred from permission bits), and an out-of-core run has room for its HDF5
    file there. A ``TMPDIR`` Python passed over (not a writable directory) gets a WARNING:
    temporary files go elsewhere, where nothing else would say."""
    given = os.environ.get("TMPDIR")
    if opts.scratch_dir is None and given and \
            os.path.realpath(given) != os.path.realpath(tempfile.gettempdir()):
        log.warning("TMPDIR %r is not a writable directory; temporary files go to %r (give "
                    "--scratch-dir, Python: scratch_dir=, to choose)", given,
                    tempfile.gettempdir())
    outcore = plan.blocks is not None and plan.blocks.outcore
    if opts.scratch_dir is None and not outcore:
        return
    directory = opts.scratch_dir or tempfile.gettempdir()
    if not os.path.isdir(directory):
        raise InputError(f"scratch directory {directory!r} does not exist or is not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix="dfmp2-check-"):
            pass
    except OSError as exc:
        raise InputError(f"scratch directory {directory!r} is not writable: creating a file "
                         f"there failed ({exc.strerror}); choose another with --scratch-dir"
                         ) from None
    need = scratch_bytes(plan, naux, world_size)
    free = shutil.disk_usage(directory).free
    if need > free:
        need_text, free_text = size_texts(need, free)
        raise ResourceError(
            f"scratch directory {directory!r} has {free_text} free; the out-of-core "
            f"integrals need {need_text}; free space or choose another --scratch-dir"
            + ("" if opts.force_outcore else " or raise --max-memory"))


def compute(mf, opts: Options, progress=None, scf_seconds: float | None = None,
            auxmol=None, plan: RunPlan | None = None, own_scf: bool = False,
            environment: dict | None = None, la: Dispatcher | None = None) -> Result:
    """The DF-MP2 step on a converged RHF, UHF, ROHF, RKS or UKS object ``mf``.

    auxmol, plan : from :func:`run` (built before the SCF) or made here; own_scf : the orbitals
    come from dfmp2's own SCF (their canonical form is then known, and only the cheap checks
    run); environment : stored in the result; la : the run's dispatcher (made here when None).
    """
    timer = StageTimer()
    if scf_seconds is not None:
        timer.seconds["scf"] = scf_seconds
    la = la if la is not None else _dispatcher(opts)
    prep = _prepare(mf, opts, timer, auxmol, plan, own_scf)
    device = resolve_device(opts.device, la.backend, False, opts.device_memory,
                            warn=not own_scf)  # dfmp2.run's said so before its SCF
    if device.device is not None:  # its host staging buffers count under --max-memory
        device = replace(device, host_bytes=int(usable_bytes(opts.max_memory)))
    energies = None
    if prep.ref.has_pairs:
        kwargs = {"fused": opts.fused_energy, "timer": timer, "precision": opts.precision,
                  "scratch_dir": opts.scratch_dir, "pair_table": opts.pair_energies,
                  "device": device}
        if progress is not None:
            kwargs["progress"] = progress
        energies = dfmp2_pair_energies(prep.mol, prep.auxmol, prep.ref.spaces,
                                       prep.plan.blocks, la, **kwargs)
    return _assemble(mf, opts, prep, energies, timer, la, environment, device=device)


@dataclass(frozen=True)
class _Prepared:
    """What :func:`compute` learns from the SCF object before the MP2 step."""

    mol: object
    auxmol: object
    kind: str
    xc: str | None
    orbital_check: str
    ref: Reference
    plan: RunPlan


def _prepare(mf, opts: Options, timer: StageTimer, auxmol, plan: RunPlan | None,
             own_scf: bool) -> _Prepared:
    """Checks of the SCF object and its orbitals, the MP2 reference (spaces, singles) and the
    run plan for its spaces."""
    kind, xc = check_scf_object(mf)
    check_float64_k(mf)
    mol = mf.mol
    check_every_atom_has_functions(mol, "the SCF's basis",
                                   "build the Mole with a basis for every element")
    # the check's Fock build is validation, not a DF-MP2 op: fp64 ops of its own, unrecorded
    check_ops = Dispatcher(DispatchPolicy("pytorch", cpu_blas=opts.cpu_blas))
    focks = None  # ROHF: one Fock build for the gradient check and the semicanonical orbitals
    if kind == "rohf":
        focks = timer.run("reference" if own_scf else "orbital_check", rohf_fock, mf)
    orbital_check = timer.run("orbital_check", check_orbitals, mf, fock=not own_scf,
                              la=check_ops, rohf_focks=focks)
    ref = timer.run("reference", reference_from_scf, mf, opts.frozen, opts.core, focks)
    if own_scf:  # ROHF's semicanonicalisation above was the last use of the SCF's J/K
        release_integrals(mf)
        return_freed_memory()  # the MP2 step's --max-memory budget is its own
    auxmol = auxmol if auxmol is not None else make_auxmol(mol, opts.auxbasis)
    dims = tuple((sp.nocc, sp.nvir) for sp in ref.spaces)
    if plan is None or plan.spaces != dims:
        plan = plan_run(mol, auxmol, _occupations(ref, mf), opts)
    log.debug("MP2 spaces (nocc, nvir) %s; block plan %s", dims,
              plan.blocks.as_dict() if plan.blocks else None)
    return _Prepared(mol, auxmol, kind, xc, orbital_check, ref, plan)


def _assemble(mf, opts: Options, prep: _Prepared, energies, timer: StageTimer,
              la: Dispatcher, environment: dict | None, distributed: dict | None = None,
              device=None) -> Result:
    """The :class:`Result` of a run from the SCF object, the prepared reference and the MP2
    step's ``(energies, factor)`` (None when there are no pairs)."""
    mol, auxmol, ref, plan = prep.mol, prep.auxmol, prep.ref, prep.plan
    scaling = opts.scaling
    if energies is not None:
        energies, factor = energies
        e_os, e_ss, npairs = energies.e_os, energies.e_ss, energies.npairs
        naux_fit, ndropped = factor.naux_fit, factor.ndropped
        metric, condition = factor.method, factor.condition
        stages, note = _pair_stage_as_run(energies.stages_dict(), la, opts.precision), None
    else:
        e_os = e_ss = 0.0
        npairs, naux_fit, ndropped, metric = 0, auxmol.nao_nr(), 0, "not needed"
        condition, stages = None, {}
        sp = ref.spaces[0]
        note = (f"no {'active occupied' if sp.nocc == 0 else 'virtual'} orbitals "
                f"({sp.nocc} occupied x {sp.nvir} virtual active): E(corr) = 0")
        log.warning("%s", note)
    if note is None and len(ref.spaces) == 2 and sum(s.nocc for s in ref.spaces) < 2:
        note = (f"one active electron ({ref.spaces[0].nocc} alpha, {ref.spaces[1].nocc} beta "
                "occupied): no pair to correlate, E(OS) = E(SS) = 0"
                + ("; the singles remain" if ref.kind == "rohf" else ""))
        log.info("%s", note)  # an exact zero (an H atom's), said in the summary, no warning
    first = ref.spaces[0]
    beta = ref.spaces[1] if len(ref.spaces) == 2 else None
    sizes = Sizes(
        natom=mol.natm, nbasis=mol.nao_nr(), nmo=first.nmo, naux=auxmol.nao_nr(),
        naux_fit=naux_fit, naux_dropped=ndropped, nocc=first.nocc, nvir=first.nvir,
        nalpha=ref.nalpha, nbeta=ref.nbeta, nfrozen_occ=first.nfrozen_occ,
        nfrozen_vir=first.nfrozen_vir, npairs=npairs,
        nocc_beta=beta.nocc if beta else None, nvir_beta=beta.nvir if beta else None,
        nfrozen_occ_beta=beta.nfrozen_occ if beta else None,
        nfrozen_vir_beta=beta.nfrozen_vir if beta else None)
    cpu_blas = la.cpu_blas.as_dict()
    on_device = device is not None and device.device is not None
    if ref.has_pairs and la.backend == "pytorch" and la.cpu_blas.choice == "numpy" \
            and opts.fused_energy and not opts.pair_energies and not on_device:
        # (a device reduces with torch's ops; the pair table with its own host op)
        cpu_blas["pair_reduction"] = numpy_ops.pair_reduction(
            PRECISION_DTYPES[opts.precision][1])
    cpu_blas["threads"] = thread_counts()
    method = Method(
        reference=prep.kind, basis_name=mol.basis if isinstance(mol.basis, str) else None,
        basis=basis_record(mol), auxbasis_name=_name(opts.auxbasis),
        auxbasis=auxbasis_record(mol, opts.auxbasis), ecp=ecp_record(mol),
        scf_type="df" if own_attribute(mf, "with_df", None) is not None else "conv",
        scf_auxbasis=scf_fit_record(mf),
        fused_energy=opts.fused_energy and not opts.pair_energies,  # the table's op runs then
        precision=opts.precision, os_scale=scaling.os, ss_scale=scaling.ss, metric=metric,
        metric_condition=condition, stage_precision=stages,
        int3c2e_expcutoff=float(mol._env[gto.PTR_EXPCUTOFF] or INT3C_EXPCUTOFF),
        blocks=plan.blocks.as_dict() if plan.blocks else {"storage": "none", "b_mb": 0.0},
        max_memory_mb=opts.max_memory, note=note, scaling=scaling.as_dict(),
        cartesian=bool(mol.cart), core_rule=opts.core or None)
    backend = BackendInfo(requested=opts.backend, resolved=la.backend, nki_mode=la.nki_mode,
                          resolution=la.resolution, ops=la.summary(), cpu_blas=cpu_blas,
                          nki_matmul=la.policy.nki_matmul if la.backend == "nki" else None,
                          nki_device=la.device_record() if la.backend == "nki" else None,
                          device=_device_record(device, energies))
    e_scs = scs_energy(e_os, e_ss, scaling.os, scaling.ss, ref.e_singles)
    return Result(
        e_scf=float(mf.e_tot), e_corr_os=e_os, e_corr_ss=e_ss, e_singles=ref.e_singles,
        e_scs=e_scs, double_hybrid=_double_hybrid_record(scaling, mf, e_scs),
        pair_energies=_pair_record(ref, energies.pairs if energies is not None else None,
                                   opts.pair_energies),
        molecule=_molecule_info(mol, _scf_nelec(mf)),
        scf=_scf_info(mf, prep.kind, prep.xc, prep.orbital_check),
        sizes=sizes, method=method, backend=backend,
        timings={k: round(v, 4) for k, v in timer.seconds.items()},
        versions=versions(), environment=environment, distributed=distributed,
    )


def _pair_stage_as_run(stages: dict, la: Dispatcher, precision: str) -> dict:
    """``stages`` with the pair stage as it ran on an NKI run whose fused pair kernel fell
    back to the host (its shape refused, or a crash the policy allowed) for some or every
    block: planned on NKI ('nki fp32' or 'nki bf16x3'), recorded as where it computed."""
    record, stage = la.records.get("mp2_pair_sums"), stages.get("pair_energy")
    if la.backend != "nki" or stage is None or record is None or record.fallback is None:
        return stages
    host = "host fp64" if precision == "fp64" else "host fp32"
    some = record.backend == "mixed"  # some blocks on NKI, the others on the host
    return {**stages, "pair_energy": {
        "placement": f"{stage['placement']} and {host}" if some else host,
        "reason": f"the NKI pair kernel fell back to the host for {'some' if some else 'every'} "
                  f"block: {record.fallback}"}}


def _pair_record(ref: Reference, pairs, wanted: bool) -> dict | None:
    """``Result.pair_energies`` (None unless asked for): per spin block the opposite- and
    same-spin energy of every ordered pair of active occupied orbitals (their sums over all
    entries are the block's E_OS and E_SS), and the orbital energies that label the rows and
    columns."""
    if not wanted:
        return None
    spaces = [{"orbital_energies": [float(e) for e in sp.eps_occ]} for sp in ref.spaces]
    blocks = {m.block: {"spaces": list(m.spaces), "os": m.os.tolist(), "ss": m.ss.tolist()}
              for m in pairs or ()}
    return {"convention": "energies of ordered pairs (i, j) of active occupied orbitals, "
                          "unscaled; a pair i != j of one space appears at [i, j] and [j, i] "
                          "with half its energy each, so every matrix sums to its block's "
                          "E_OS or E_SS; rows and columns are the orbitals of spaces[k] "
                          "(closed shell: one space; open shell: alpha, beta)",
            "spaces": spaces, "blocks": blocks}


def _device_record(device, energies) -> dict | None:
    """Where the MP2 step ran (:class:`dfmp2.device.ComputeDevice`) and, on a device, its plan
    (B on the device, or streamed from the host)."""
    if device is None:
        return None
    record = device.as_dict()
    if energies is None:  # no pairs: nothing ran on the device
        record["reason"] += "; no pair energies to compute, so nothing ran there"
        return record
    plan = getattr(energies, "device_plan", None)
    return {**record, **({"plan": plan} if plan else {})}


def _double_hybrid_record(scaling, mf, e_pt2: float) -> dict | None:
    """``Result.double_hybrid`` of a double-hybrid run (None otherwise): the functional, its KS
    part and PT2 scales, where they are published, and the energies (KS part, scaled PT2
    without singles, total)."""
    if not scaling.is_double_hybrid:
        return None
    e_ks = float(mf.e_tot)
    return {"functional": scaling.double_hybrid.name if scaling.double_hybrid else None,
            "label": scaling.label, "xc": scaling.xc, "c_os": scaling.os, "c_ss": scaling.ss,
            "source": scaling.source, "e_ks": e_ks, "e_pt2": e_pt2, "e_total": e_ks + e_pt2}


def _occupations(ref: Reference, mf) -> list[np.ndarray]:
    """Occupations per orbital space of a reference (for the planner)."""
    if not KINDS[ref.kind]:
        return [np.asarray(mf.mo_occ)]
    nmo = ref.spaces[0].nmo
    return [np.array([1.0] * n + [0.0] * (nmo - n)) for n in (ref.nalpha, ref.nbeta)]


def _name(basis):
    return basis if basis is None or isinstance(basis, str) else None


def check_orbitals(mf, fock: bool = True, la: Dispatcher | None = None,
                   rohf_focks: np.ndarray | None = None) -> str:
    """Refuse orbitals the formulas do not describe; return what was checked.

    Always, for each spin of an unrestricted reference: ``mo_coeff`` orthonormal in the overlap
    metric (largest |C^T S C - 1| element below :data:`ORTHONORMALITY_TOL`), occupations in
    aufbau order. With ``fock`` (orbitals not from dfmp2's own SCF), to a tolerance of ten times
    the SCF's orbital-gradient threshold kept within :data:`CANONICAL_TOL_MIN` and
    :data:`CANONICAL_TOL_MAX`: the two-electron integrals of an exact-integral SCF are the
    molecule's (:func:`check_two_electron_integrals`); the Fock matrix in the MO basis is
    diagonal with ``mo_energy`` on its diagonal (occupied-occupied, virtual-virtual and
    occupied-virtual blocks); for ROHF, whose orbitals dfmp2 semicanonicalises itself, the ROHF
    orbital gradient is below the tolerance, from ``rohf_focks`` when given (its Fock matrices,
    :func:`dfmp2.reference.rohf_fock`, built once for this and the semicanonical orbitals). A
    loosely converged SCF gets a WARNING."""
    unrestricted = isinstance(mf, pyscf_scf.uhf.UHF)
    spins = (0, 1) if unrestricted else (None,)
    s = mf.get_ovlp()

    def per_spin(value, spin):
        return np.asarray(value if spin is None else value[spin])

    for spin in spins:
        label = "" if spin is None else f"{'alpha' if spin == 0 else 'beta'} "
        c = per_spin(mf.mo_coeff, spin)
        dev = c.T @ s @ c - np.eye(c.shape[1])
        k = np.unravel_index(np.argmax(np.abs(dev)), dev.shape)
        if abs(dev[k]) > ORTHONORMALITY_TOL:
            smallest = float(np.linalg.eigvalsh(s)[0])
            advice = (f"the basis is nearly linearly dependent (smallest overlap eigenvalue "
                      f"{smallest:.1e}): run the SCF with its linear dependencies removed "
                      "(pyscf.scf.addons.remove_linear_dep_, or PySCF's default "
                      "remove_overlap_zero_eigenvalue), or use a less diffuse basis"
                      if smallest < LINDEP_OVERLAP else "pass the SCF's own canonical orbitals")
            raise OrbitalError(
                f"{label}mo_coeff is not orthonormal: (C^T S C - 1)[{k[0]}, {k[1]}] = "
                f"{dev[k]:.3e} (tolerance {ORTHONORMALITY_TOL:.0e}); {advice}")
        occ = per_spin(mf.mo_occ, spin)
        order = occ[:-1] >= occ[1:] if occ.size else np.array([True])
        if isinstance(mf, pyscf_scf.rohf.ROHF) and not np.all(order):
            # RHF and UHF take their spaces by mo_occ (an excited or core-hole determinant of
            # a MOM SCF runs, with reference._warn_inverted's WARNING); dfmp2's ROHF
            # semicanonicalisation is written for doubly, singly and empty shells in order
            raise OrbitalError("the ROHF occupied orbitals are not the lowest ones (mo_occ is "
                               "not in aufbau order), which dfmp2's ROHF-MBPT(2) does not "
                               "handle; pass the SCF's own canonical orbitals, or use UHF")
    conv_tol = float(own_attribute(mf, "conv_tol", 1e-9))
    grad_tol = own_attribute(mf, "conv_tol_grad", None) or conv_tol ** 0.5
    # PySCF converges on both thresholds: a tight gradient bounds the orbitals' error whatever
    # conv_tol (a conv_tol of 1e-4 beside a gradient of 1e-7 gives the default's energies)
    loose_grad = grad_tol > LOOSE_CONV_TOL ** 0.5  # the gradient that goes with conv_tol 1e-8
    if conv_tol > LOOSE_CONV_TOL and loose_grad:
        # E(corr) is linear in the orbitals' error. Measured on (H2O)4 cc-pVDZ against
        # conv_tol 1e-11 (gradients sqrt(conv_tol), PySCF's default): 2.3e-8 Eh at 1e-8,
        # 7.6e-7 at 1e-7 and 1e-6, 2.5e-6 at 1e-5.
        log.warning("the SCF was converged to conv_tol = %.0e Eh only: expect an error of up "
                    "to about %.0e Eh (10 x conv_tol) in E(corr); converge to 1e-9 or tighter",
                    conv_tol, 10 * conv_tol)
    elif loose_grad:
        log.warning("the SCF's orbital-gradient threshold is conv_tol_grad = %.0e only: "
                    "orbitals that loose can move E(corr) by more than 1e-8 Eh; converge to "
                    "1e-4 or tighter", grad_tol)
    if not fock:
        return "orthonormal (orbitals from dfmp2's own SCF)"
    check_two_electron_integrals(mf)
    tol = min(max(CANONICAL_TOL_MIN, 10 * grad_tol), CANONICAL_TOL_MAX)
    source = ("ten times the SCF's gradient threshold" if tol == 10 * grad_tol else
              f"ten times the SCF's gradient threshold {grad_tol:.0e}, kept within "
              f"{CANONICAL_TOL_MIN:.0e}-{CANONICAL_TOL_MAX:.0e}")
    advice = (f"(tolerance {tol:.0e}: {source}); pass the SCF's own canonical orbitals, "
              "converged")
    if isinstance(mf, pyscf_scf.rohf.ROHF):
        gradient = np.asarray(mf.get_grad(mf.mo_coeff, mf.mo_occ, rohf_focks))
        if gradient.size and np.abs(gradient).max() > tol:
            raise OrbitalError(f"the ROHF orbitals are not converged: largest orbital-gradient "
                               f"element {np.abs(gradient).max():.3e} {advice}")
        return (f"orthonormal, ROHF gradient below {tol:.0e} (semicanonicalised by dfmp2)")
    if mf.mol.nelectron < 2:  # PySCF's one-electron SCF: mo_energy are core-Hamiltonian ones
        return "orthonormal (one electron: no electron pairs)"
    fock_ao = fock_matrix(mf, la)
    for spin in spins:
        label = "" if spin is None else f"{'alpha' if spin == 0 else 'beta'} "
        c = per_spin(mf.mo_coeff, spin)
        f_mo = c.T @ per_spin(fock_ao, spin) @ c
        eps = per_spin(mf.mo_energy, spin)
        occ = per_spin(mf.mo_occ, spin) > 0
        for name, rows, cols in (("occupied-occupied", occ, occ),
                                 ("virtual-virtual", ~occ, ~occ),
                                 ("occupied-virtual", occ, ~occ)):
            i, j = np.flatnonzero(rows), np.flatnonzero(cols)
            diagonal = name != "occupied-virtual"  # its diagonal is mo_energy; F_ov is zero
            block = f_mo[np.ix_(i, j)] - (np.diag(eps[i]) if diagonal else 0.0)
            if block.size == 0:
                continue
            a, b = np.unravel_index(np.argmax(np.abs(block)), block.shape)
            if abs(block[a, b]) > tol:
                what = "diagonal minus mo_energy" if diagonal and a == b else "off-diagonal"
                raise OrbitalError(
                    f"the orbitals are not canonical: {label}{name} Fock block, {what} element "
                    f"F[{i[a]}, {j[b]}] = {block[a, b]:.3e} Eh {advice}; localised, rotated or "
                    "unconverged orbitals give another E(corr)")
    return f"orthonormal and canonical (Fock matrix diagonal to {tol:.0e} Eh)"


def check_two_electron_integrals(mf) -> None:
    """Refuse an SCF object whose two-electron integrals are not its molecule's: a
    density-fitted one whose fitted integrals were built at another geometry (PySCF keeps them
    when the molecule moves, ``mol.set_geom_``, until ``mf.reset()``: :func:`_check_fit_geometry`),
    or an exact-integral one whose stored ``mf._eri`` differ from the molecule's (a model or
    scaled Hamiltonian, or integrals kept from another geometry): DF-MP2 fits the molecule's
    own. The latter samples the first and last AOs' (mu mu|nu nu) integrals, one shell quartet
    each."""
    with_df = own_attribute(mf, "with_df", None)
    if with_df is not None:
        _check_fit_geometry(mf.mol, with_df)
    eri = own_attribute(mf, "_eri", None)
    if not isinstance(eri, np.ndarray) or with_df is not None:
        return
    mol = mf.mol
    n, last = mol.nao_nr(), mol.nbas - 1
    ao_last = n - 1 - int(mol.ao_loc_nr()[last])  # its index within the last shell
    npair = n * (n + 1) // 2
    samples = []
    for (p, sp), (q, sq) in (((0, 0), (0, 0)), ((n - 1, last), (n - 1, last)),
                             ((n - 1, last), (0, 0))):
        block = mol.intor("int2e", shls_slice=(sp, sp + 1, sp, sp + 1, sq, sq + 1, sq, sq + 1))
        ip, iq = (0 if sp == 0 else ao_last), (0 if sq == 0 else ao_last)
        pp, qq = p * (p + 1) // 2 + p, q * (q + 1) // 2 + q  # packed pair indices (pp|qq)
        if eri.ndim == 1 and eri.size == npair * (npair + 1) // 2:  # 8-fold packed
            big, small = max(pp, qq), min(pp, qq)
            stored = eri[big * (big + 1) // 2 + small]
        elif eri.ndim == 2 and eri.shape == (npair, npair):
            stored = eri[pp, qq]
        elif eri.ndim == 4 and eri.shape == (n,) * 4:
            stored = eri[p, p, q, q]
        else:
            raise InputError(f"the SCF object's mf._eri has shape {eri.shape}, not the "
                             f"molecule's {n} basis functions: DF-MP2 needs the molecule's "
                             "own Hamiltonian")
        samples.append((float(stored), float(block[ip, ip, iq, iq])))
    if any(abs(a - b) > 1e-10 * max(1.0, abs(b)) for a, b in samples):
        raise InputError("the SCF object's two-electron integrals (mf._eri) are not its "
                         "molecule's (a model or scaled Hamiltonian, or integrals kept from "
                         "another geometry: after mol.set_geom_, call mf.reset() and rerun the "
                         "SCF): DF-MP2 fits the molecule's own integrals, so its energy would "
                         "not belong to this SCF")


def _check_fit_geometry(mol, with_df) -> None:
    """Refuse a density-fitted SCF's ``with_df`` whose fitted integrals were built for atoms at
    other places than ``mol``'s: its ``auxmol`` (PySCF's copy of the molecule with the fitting
    basis, made when the integrals were) keeps the geometry they belong to. Nothing to compare
    before they are built, or for integrals given as a file alone (no ``auxmol``)."""
    auxmol = getattr(with_df, "auxmol", None)
    if auxmol is None or not getattr(auxmol, "_built", False):
        return
    if auxmol.natm != mol.natm:
        moved = f"{auxmol.natm} atoms against the molecule's {mol.natm}"
    else:
        shift = np.linalg.norm(auxmol.atom_coords() - mol.atom_coords(), axis=1)
        k = int(np.argmax(shift)) if shift.size else 0
        if not shift.size or shift[k] <= FIT_GEOMETRY_TOL:
            return
        moved = f"atom {k + 1} ({mol.atom_symbol(k)}) {shift[k]:.3g} Bohr from where it is now"
    raise InputError(f"the SCF object's fitted integrals (mf.with_df) were built at another "
                     f"geometry ({moved}): PySCF keeps them when the molecule moves "
                     "(mol.set_geom_), so that SCF's energy and orbitals are not this "
                     "molecule's; call mf.reset() and rerun the SCF")


def fock_matrix(mf, la: Dispatcher | None = None) -> np.ndarray:
    """The Fock matrix of ``mf``'s own density (per spin for UHF), for the orbital check.

    A plain density-fitted HF object (PySCF's own ``get_veff`` and ``get_fock``) whose fitted
    tensor is in memory as PySCF's packed one, or as a :class:`dfmp2.jk.DFJK`'s unpacked one
    (held alone, or copied in float64 beside the packed or pair-screened one), gets J and K from
    :func:`dfmp2.jk.get_jk` on that tensor with ``la``'s ops (dfmp2's BLAS); anything else
    (exact integrals, Kohn-Sham, solvent or other added potentials, a DFJK's pair-screened
    tensor without a float64 copy, a tensor on disk) asks the object's ``get_fock``, whose
    DFJK builds J and K with the run's ops."""
    from pyscf import dft

    from .jk import DFJK, get_jk

    with_df = own_attribute(mf, "with_df", None)
    cderi = getattr(with_df, "_cderi", None)
    square = getattr(with_df, "square", None) if isinstance(with_df, DFJK) else None
    if square is not None and square.dtype != np.float64:  # a float32 copy: K unpacks instead
        square = None
    plain = (type(mf).get_veff in (pyscf_scf.hf.RHF.get_veff, pyscf_scf.uhf.UHF.get_veff)
             and type(mf).get_fock in (pyscf_scf.hf.RHF.get_fock, pyscf_scf.uhf.UHF.get_fock)
             # a potential set on the object itself (mf.get_veff = ...) is the object's too
             and not {"get_veff", "get_fock", "get_jk", "get_j", "get_k"} & set(vars(mf)))
    if (la is None or not (isinstance(cderi, np.ndarray) or square is not None) or not plain
            or isinstance(mf, (dft.rks.KohnShamDFT, pyscf_scf.rohf.ROHF))):
        return mf.get_fock()  # solvent models and other potentials: the object's own Fock
    dm = mf.make_rdm1()
    budget = with_df.lane_budget() if isinstance(with_df, DFJK) and square is not None else None
    vj, vk = get_jk(cderi if isinstance(cderi, np.ndarray) else None, dm, la, square=square,
                    lane_budget=budget)
    h = mf.get_hcore()
    if isinstance(mf, pyscf_scf.uhf.UHF):
        return h + (vj[0] + vj[1]) - vk
    return h + vj - 0.5 * vk


def _scf_info(mf, kind: str, xc: str | None, orbital_check: str) -> ScfInfo:
    if isinstance(mf, pyscf_scf.uhf.UHF):
        eps = np.concatenate([np.asarray(mf.mo_energy[0]), np.asarray(mf.mo_energy[1])])
        occ = np.concatenate([np.asarray(mf.mo_occ[0]), np.asarray(mf.mo_occ[1])]) > 0
    else:
        eps, occ = np.asarray(mf.mo_energy), np.asarray(mf.mo_occ) > 0
    # PySCF's second-order driver (mf.newton()) leaves the DIIS count, 0, as its cycles
    newton = isinstance(mf, newton_ah._CIAH_SOSCF)
    cycles = None if newton else own_attribute(mf, "cycles", None)
    solver = own_attribute(mf, "solver", None) or (
        "second-order (Newton, PySCF's mf.newton()), its cycles not counted" if newton else None)
    s2 = spin_contamination(mf)
    homo_spin = lumo_spin = None
    if isinstance(mf, pyscf_scf.uhf.UHF):  # which spin holds the frontier orbitals
        per_spin = [(np.asarray(e), np.asarray(o) > 0) for e, o in zip(mf.mo_energy, mf.mo_occ)]
        homo_spin = _holder([e[o].max() if o.any() else -np.inf for e, o in per_spin], max)
        lumo_spin = _holder([e[~o].min() if (~o).any() else np.inf for e, o in per_spin], min)
    return ScfInfo(kind=kind, xc=xc, energy=float(mf.e_tot), converged=bool(mf.converged),
                   restart=own_attribute(mf, "restart", None), jk=_jk_record(mf),
                   jk_stats=_jk_stats(mf),
                   cycles=int(cycles) if cycles is not None else None,
                   conv_tol=float(mf.conv_tol), homo=float(eps[occ].max()),
                   lumo=float(eps[~occ].min()) if (~occ).any() else None,
                   orbital_check=orbital_check,
                   s2=s2[0] if s2 else None, s2_deviation=s2[1] if s2 else None,
                   grid=grid_record(mf) if xc is not None else None,
                   solver=solver,
                   conv_tol_grad=float(own_attribute(mf, "conv_tol_grad", None)
                                       or float(mf.conv_tol) ** 0.5),
                   hamiltonian=hamiltonian_record(mf), homo_spin=homo_spin,
                   lumo_spin=lumo_spin,
                   stability=own_attribute(mf, "stability_record", None),
                   guess=own_attribute(mf, "guess_record", None),
                   level_shift=float(own_attribute(mf, "level_shift", 0.0) or 0.0))


def _holder(values: list[float], pick) -> str:
    """'alpha' or 'beta': the spin whose value ``pick`` (max, min) chooses; 'both' where they
    agree to the 1e-6 Eh the summary prints (a closed shell's two spins differ by the SCF's
    convergence: 2e-8 Eh for water at an orbital gradient of 1e-7); None where neither spin
    has one (no virtual orbitals)."""
    if all(np.isinf(values)):
        return None
    if values[0] == values[1] or abs(values[0] - values[1]) <= 1e-6:
        return "both"
    return ("alpha", "beta")[values.index(pick(values))]


def check_float64_k(mf) -> None:
    """Refuse an SCF object whose dfmp2 J/K still built K in float32 when it converged (a
    :class:`dfmp2.jk.DFJK` with ``k_precision='fp32'`` run without :func:`dfmp2.scf.run_scf`'s
    convergence test): its orbitals are converged only to float32 noise (2e-6 Eh measured)."""
    with_df = own_attribute(mf, "with_df", None)
    if isinstance(with_df, DFJK) and with_df.k_precision != "fp64":
        raise InputError(
            f"the SCF object's K was still {with_df.k_precision} when it converged, so its "
            "orbitals are not converged in float64; rerun its SCF with DFJK(k_precision='fp64'), "
            "or let dfmp2.run (scf_precision='mixed') switch K to float64 before convergence")


def _jk_stats(mf) -> dict | None:
    """Calls, seconds and GFLOP of dfmp2's J/K during ``mf``'s SCF and its stability analysis
    (``extras.scf.stability.jk_builds`` counts the analysis's; None when PySCF's code or exact
    integrals built them)."""
    stats = getattr(own_attribute(mf, "with_df", None), "stats", None)
    if not isinstance(stats, dict) or not stats.get("calls"):
        return None
    return {"calls": stats["calls"], "seconds": stats["seconds"], "gflop": stats["flops"] / 1e9}


def _jk_record(mf) -> str:
    """What built the SCF's J and K: dfmp2's own SCF says (``mf.jk``); else PySCF's."""
    if own_attribute(mf, "jk", None):
        return mf.jk
    return "PySCF's DF J/K" if own_attribute(mf, "with_df", None) is not None else \
        "exact integrals (PySCF)"


def _hill_order(counts: dict[str, int]) -> list[str]:
    """The element symbols of ``counts`` in Hill order: with carbon, C, then H if present, then
    the others alphabetically; without carbon, all alphabetically."""
    if "C" not in counts:
        return sorted(counts)
    return ["C"] + (["H"] if "H" in counts else []) + sorted(s for s in counts
                                                             if s not in ("C", "H"))


def _same_atoms(mol, other) -> bool:
    """Whether two molecules have the same atoms (labels, charges) at the same places (to
    1e-8 Bohr), however their geometries were written."""
    for m in (mol, other):
        if not getattr(m, "_built", False):
            m.build(False, False)
    return (mol.natm == other.natm
            and [mol.atom_symbol(k) for k in range(mol.natm)]
            == [other.atom_symbol(k) for k in range(other.natm)]
            and np.array_equal(mol.atom_charges(), other.atom_charges())
            and np.allclose(mol.atom_coords(), other.atom_coords(), rtol=0, atol=1e-8))


def _scf_nelec(mf) -> tuple[int, int]:
    """(n_alpha, n_beta) the SCF object ran with: its own ``nelec`` where set (PySCF lets it
    override the molecule's charge and 2S), else the molecule's."""
    nelec = own_attribute(mf, "nelec", None)  # a tuple, or an array PySCF takes as well
    return tuple(int(n) for n in (mf.mol.nelec if nelec is None else nelec))


def _molecule_info(mol, nelec: tuple[int, int] | None = None) -> MoleculeInfo:
    """The record of the molecule; ``nelec`` (alpha, beta), when given, is the electron count
    and spin the SCF ran with (:func:`_scf_nelec`), and sets the multiplicity. Its input unit is
    the Mole's own (:func:`run` says where a geometry's came from)."""
    nalpha, nbeta = mol.nelec if nelec is None else nelec
    real = [mol.atom_charge(k) > 0 or _has_ecp_core(mol, k) for k in range(mol.natm)]
    counts: dict[str, int] = {}
    for k in range(mol.natm):
        if real[k]:
            symbol = mol.atom_pure_symbol(k)
            counts[symbol] = counts.get(symbol, 0) + 1
    order = _hill_order(counts)
    formula = "".join(f"{s}{counts[s] if counts[s] > 1 else ''}" for s in order)
    return MoleculeInfo(formula=formula, natom=mol.natm, nghost=real.count(False),
                        charge=int(mol.charge), multiplicity=int(nalpha - nbeta) + 1,
                        nelectron=int(nalpha + nbeta),
                        nuclear_repulsion=float(mol.energy_nuc()),
                        qcschema=molecule_record(mol, multiplicity=int(nalpha - nbeta) + 1),
                        input_unit=unit_name(mol.unit), input_unit_source="mole")


def _has_ecp_core(mol, k: int) -> bool:
    """An atom whose nuclear charge is carried by an ECP still counts as real."""
    return bool(mol.has_ecp()) and mol.atom_nelec_core(k) > 0


#: Why DFMP2 refuses a molecule or SCF setting.
_SCF_OWN = ("DFMP2(mf) takes the SCF object as it is given (its molecule, functional, grid, "
            "reference, fitting and convergence); set it on the SCF, or let dfmp2.run(geometry, "
            "...) run the SCF (for a double hybrid: dfmp2.run(geometry, xc='B2PLYP', ...))")


class DFMP2:
    """PySCF-shaped DF-MP2 for a converged RHF, UHF, ROHF, RKS or UKS object, dispatched on
    the reference: RHF/RKS closed shell; UHF/UKS unrestricted MP2 (no singles); ROHF
    ROHF-MBPT(2) with semicanonical orbitals and singles (Psi4's definition).

    >>> pt = dfmp2.DFMP2(mf, frozen=1, auxbasis="cc-pvdz-ri").run()
    >>> pt.e_corr, pt.e_corr_os, pt.e_corr_ss, pt.e_singles, pt.e_tot

    ``frozen`` follows PySCF (an int, or a list of MO indices; for UHF and ROHF the same for
    both spins, or a pair ``[alpha list, beta list]``); the fitting basis comes from
    ``auxbasis`` or, as in PySCF, from ``pt.with_df = df.DF(mol, auxbasis=...)``. ``threads``
    holds every thread pool of the process to that many threads while the energy is computed
    (as ``dfmp2.run(threads=)``; None: as they are). Other keyword
    arguments are :class:`Options` fields (``backend``, ``fused_energy``, ``max_memory``, ...),
    also accepted by :meth:`run` and :meth:`kernel`, which keep them on the object as PySCF's
    ``run(**kwargs)`` does (``pt.run(frozen=1)`` then ``pt.nocc`` counts the active orbitals
    of that energy, and a later ``pt.run()`` repeats it). Molecule settings
    (``basis``, ``charge``, ``spin``, ``ecp``) belong to the SCF and are refused here.
    """

    #: The object's own attributes; any other assignment is an :class:`Options` field (``pt.
    #: max_memory = 2000``, as PySCF users set them), kept in ``options``, or refused.
    _OWN = frozenset({"_scf", "mol", "frozen", "auxbasis", "threads", "with_df", "options",
                      "result", "e_corr", "e_corr_os", "e_corr_ss", "e_singles"})

    def __init__(self, mf, frozen=None, auxbasis=None, threads: int | None = None, **options):
        if not isinstance(mf, pyscf_scf.hf.SCF):
            raise InputError(f"DFMP2 needs a PySCF SCF object (RHF, UHF, ROHF, RKS or UKS), got "
                             f"{type(mf).__name__}; for a molecule run its SCF first "
                             "(scf.RHF(mol).run()), or call dfmp2.run(mol)")
        self._scf = mf
        self.mol = mf.mol
        self.frozen = frozen
        self.auxbasis = auxbasis
        self.threads = None if threads is None else checked_thread_count(threads)
        self.with_df = None
        self.options = options
        self.result: Result | None = None
        self.e_corr = self.e_corr_os = self.e_corr_ss = self.e_singles = None
        self._checked(dict(options), frozen, auxbasis)  # refused here, not at run()

    def __setattr__(self, name: str, value) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        elif name in MOLE_SETTINGS or name in _SCF_SETTINGS:
            raise AttributeError(f"DFMP2.{name}: {_SCF_OWN}")
        elif name in Options.field_names():  # applied by the next run(), as the keyword is
            self.options = {**self.options, name: value}  # a copy's options stay its own
        elif name in ("verbose", "stdout"):
            raise AttributeError(f"DFMP2.{name}: dfmp2 logs through Python's logging, not "
                                 "PySCF's logger (e.g. logging.getLogger('dfmp2')."
                                 "setLevel(logging.INFO))")
        elif type(self) is not DFMP2 or hasattr(type(self), name):  # a subclass's, a property
            object.__setattr__(self, name, value)
        else:
            raise AttributeError(f"DFMP2 has no setting {name!r}; its settings are the MP2 "
                                 f"step's options ({', '.join(self._settings())})")

    def __getattr__(self, name: str):  # only for names not found otherwise: Options fields
        if name != "options" and name in self._settings():
            return self.options.get(name, Options.default(name))
        if isinstance(getattr(type(self), name, None), property):
            # a property's own AttributeError (NotComputedError before run()) brought us here
            return object.__getattribute__(self, name)
        raise AttributeError(f"DFMP2 has no attribute {name!r}")

    def _checked(self, options: dict, frozen, auxbasis) -> Options:
        """The :class:`Options` of a run with ``options`` (the MP2 step's settings only: one
        line for an unknown name, a molecule's or an SCF's setting, or a bad value)."""
        unknown = sorted(set(options) - Options.field_names() - {"frozen", "auxbasis"})
        if unknown:
            raise InputError(f"DFMP2 has no setting {', '.join(map(repr, unknown))}; its "
                             f"settings are the MP2 step's options "
                             f"({', '.join(self._settings())})")
        refused = sorted(set(options) & set(MOLE_SETTINGS))
        scf_only = sorted(set(options) & set(_SCF_SETTINGS))
        if scf_only:
            raise InputError(f"{', '.join(scf_only)}: {_SCF_OWN}")
        if refused:
            verb = "belongs" if len(refused) == 1 else "belong"
            raise InputError(f"{', '.join(refused)} {verb} to the SCF's molecule; build the "
                             "Mole and SCF with them (DFMP2 cannot change them)")
        return Options.from_kwargs(frozen=frozen, auxbasis=auxbasis, **options)

    @staticmethod
    def _settings() -> list[str]:
        """The options a DFMP2 object applies (not the molecule's or the SCF's)."""
        return sorted(Options.field_names() - set(MOLE_SETTINGS) - set(_SCF_SETTINGS))

    @property
    def e_hf(self) -> float:
        """The reference's total energy (PySCF's name, also for a KS reference)."""
        return float(self._scf.e_tot)

    @property
    def e_tot(self) -> float:
        """PySCF's MP2 ``e_tot``: ``e_hf + e_corr``, the correlation unscaled on any reference
        (on a double hybrid's KS orbitals with its PT2 scales, its total is ``e_hf + e_scs``;
        :attr:`dfmp2.Result.e_tot` of ``dfmp2.run(..., xc=...)`` is that total)."""
        computed = self._computed()
        return computed.e_scf + computed.e_corr

    @property
    def e_scs(self) -> float:
        return self._computed().e_scs

    emp2 = property(lambda self: self.e_corr)
    #: PySCF's MP2 attributes read from the SCF object (dfmp2 uses its orbitals as they are).
    mo_coeff = property(lambda self: self._scf.mo_coeff)
    mo_energy = property(lambda self: self._scf.mo_energy)
    mo_occ = property(lambda self: self._scf.mo_occ)
    #: Whether an energy has been computed (PySCF's MP2 sets it after its kernel).
    converged = property(lambda self: self.result is not None)

    @property
    def nocc(self):
        """Active occupied orbitals as PySCF's MP2 counts them (frozen ones left out): an int
        for RHF/RKS, (alpha, beta) for UHF, UKS and ROHF."""
        return self._active_counts()[0]

    @property
    def nmo(self):
        """Active orbitals, occupied and virtual (PySCF's ``nmo``): an int or (alpha, beta)."""
        return self._active_counts()[1]

    def _active_counts(self) -> tuple:
        """(nocc, nmo) of the orbitals this object's ``frozen``/``frozen_core`` leave active."""
        kind, _ = reference_kind(self._scf)
        if self._scf.mo_occ is None:
            raise InputError("the SCF object has no orbitals yet: run it first (mf.run())")
        frozen = self.frozen
        frozen_core = Options.from_kwargs(**self.options).core
        mo_occ = np.asarray(self._scf.mo_occ)
        if not KINDS[kind]:
            active = frozen_mask(self.mol, mo_occ, frozen, frozen_core, strict=False)
            return int(np.count_nonzero(active & (mo_occ > 0))), int(np.count_nonzero(active))
        per_spin = (mo_occ > 0, mo_occ > 1) if kind == "rohf" else (mo_occ[0] > 0,
                                                                      mo_occ[1] > 0)
        counts = []
        for occupied, frozen_s in zip(per_spin, frozen_per_spin(frozen)):
            active = frozen_mask(self.mol, occupied.astype(float), frozen_s, frozen_core,
                                 strict=False)
            counts.append((int(np.count_nonzero(active & occupied)),
                           int(np.count_nonzero(active))))
        return tuple(c[0] for c in counts), tuple(c[1] for c in counts)

    def _computed(self) -> Result:
        if self.result is None:
            raise NotComputedError("no DF-MP2 energy yet: call run() (or kernel()) first")
        return self.result

    def _auxbasis(self, auxbasis):
        """The fitting basis from ``auxbasis`` and PySCF's ``with_df`` idiom (refused if the
        two disagree)."""
        with_df = self.with_df
        if with_df is None:
            return auxbasis
        if not isinstance(with_df, pyscf_df.DF):
            raise InputError(f"with_df must be a pyscf.df.DF object, got {type(with_df).__name__}")
        if with_df.mol is not self.mol and not _same_atoms(with_df.mol, self.mol):
            raise InputError("with_df was built for another molecule than the SCF's")
        from_df = with_df.auxbasis
        if from_df is None and auxbasis is None:  # PySCF would fit with its JK-fit default
            raise InputError("with_df has no auxbasis (PySCF's DF-MP2 would then fit with the "
                             "JK-fit partner of the basis); give df.DF(mol, auxbasis=...) or "
                             "DFMP2(mf, auxbasis=...)")
        if from_df is None:
            return auxbasis
        if auxbasis is not None and auxbasis != from_df:
            raise InputError(f"auxbasis={auxbasis!r} contradicts with_df.auxbasis={from_df!r}; "
                             "give one of them")
        return from_df

    def kernel(self, *orbitals, with_t2: bool = False, **options):
        """Compute and return ``(e_corr, None)``. PySCF returns ``(e_corr, t2)``; dfmp2 computes
        energies only, so ``with_t2=False`` (PySCF's energy-only call) is accepted and
        ``with_t2=True`` refused; PySCF's positional orbitals are refused (the SCF object's
        own are used)."""
        if any(value is not None for value in orbitals):  # PySCF's None: the SCF's own
            raise InputError("DFMP2.kernel takes no orbitals: dfmp2 uses the SCF object's own "
                             "(mo_energy, mo_coeff); set them on the SCF object instead")
        if with_t2:
            raise InputError("dfmp2 computes DF-MP2 energies only, never the t2 amplitudes; "
                             "call kernel() or kernel(with_t2=False)")
        merged = {**self.options, **options}
        frozen = merged.pop("frozen", self.frozen)
        auxbasis = merged.pop("auxbasis", self.auxbasis)
        threads = merged.pop("threads", self.threads)
        threads = None if threads is None else checked_thread_count(threads)
        opts = self._checked(merged, frozen, self._auxbasis(auxbasis))
        # kept, as PySCF's run(**kwargs) sets them: nocc, nmo and a later run() agree with
        # the energy computed here
        self.frozen, self.auxbasis, self.threads, self.options = frozen, auxbasis, threads, merged
        with limit_threads(threads), kept_warnings() as warned:
            result = compute(self._scf, opts)
        given = {**merged, **({} if frozen is None else {"frozen": frozen}),
                 **({} if opts.auxbasis is None else {"auxbasis": opts.auxbasis})}
        self.result = replace(result, warnings=tuple(warned),
                              keywords=_given_keywords(given, result.method))
        self.e_corr = self.result.e_corr
        self.e_corr_os = self.result.e_corr_os
        self.e_corr_ss = self.result.e_corr_ss
        self.e_singles = self.result.e_singles
        d = self.result.corr_decimals  # 12, or fewer where the MP2 step ran below float64
        log.info("E(DF-MP2) = %.*f  E_corr = %.*f", d, self.e_tot, d, self.e_corr)
        return self.e_corr, None

    def run(self, **options) -> "DFMP2":
        self.kernel(**options)
        return self
