"""``dfmp2`` command line: ``dfmp2 run GEOMETRY [options]`` and ``dfmp2 info``.

Exit status: 0 success, 1 a dfmp2 error (one line on stderr), 2 bad command-line usage.
The only place that reads ``DFMP2_*`` environment variables (through click's ``envvar=``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import signal
import stat
import sys

import click

from ._names import (
    BACKENDS,
    CPU_BLAS_CHOICES,
    DEVICES,
    DIST_BACKENDS,
    GUESSES,
    MAX_THREADS,
    NKI_MATMULS,
    NKI_TARGETS,
    SCALED_METHODS,
    STABILITY_MODES,
    UNITS,
)
from ._version import __version__
from .errors import DFMP2Error, InputError, Interrupted, ResourceError
from .options import (
    MAX_LEVEL_SHIFT,
    PRECISIONS,
    REFERENCES,
    SCF_PRECISIONS,
    SCF_TYPES,
    Options,
)
from .results import FULL_DECIMALS, decimals_for, interaction_error


def _configure_logging(verbose: int, quiet: bool):
    """Send the ``dfmp2`` loggers to stderr at the command's verbosity; return a function that
    puts back what was there (a command run inside Python, e.g. by a test runner or a notebook,
    leaves no logging set-up behind)."""
    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[
        min(verbose, 2)]
    handler = _LogHandler(sys.stderr)
    from ._logged import LabelledFormatter, keeper_handlers

    handler.setFormatter(LabelledFormatter("%(levelname)s: %(message)s"))
    handler.setLevel(level)

    root = logging.getLogger("dfmp2")
    saved = (root.handlers[:], root.level, root.propagate)
    root.handlers = [handler, *keeper_handlers(root)]  # a new list: see _logged
    # the logger lets every WARNING through, for the run's record (Result.warnings), and the
    # terminal's handler shows what the verbosity asks for
    root.setLevel(min(level, logging.WARNING))
    root.propagate = False

    def restore() -> None:  # (a run's keeper stays while its block is open, and only then)
        root.handlers = [*(h for h in saved[0] if h not in keeper_handlers(saved[0])),
                         *keeper_handlers(root)]
        root.setLevel(saved[1])  # through setLevel: it clears the loggers' isEnabledFor cache
        root.propagate = saved[2]

    return restore


class _TerminalProgress:
    """One self-overwriting status line on stderr, only when stderr is a terminal; the log
    lines of ``-v`` (:class:`_LogHandler`) are written between a :meth:`clear` and a
    :meth:`redraw` of it."""

    def __init__(self, enabled: bool):
        self.enabled = enabled and sys.stderr.isatty()
        self._last = ""

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        width = 30
        filled = int(width * done / max(total, 1))
        line = f"\r{stage:<12s} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        if line != self._last:
            sys.stderr.write(line)
            sys.stderr.flush()
            self._last = line

    def clear(self) -> None:
        """Blank the status line (it stays remembered for :meth:`redraw`)."""
        if self.enabled and self._last:
            sys.stderr.write("\r" + " " * len(self._last) + "\r")
            sys.stderr.flush()

    def redraw(self) -> None:
        if self.enabled and self._last:
            sys.stderr.write(self._last)
            sys.stderr.flush()

    def close(self) -> None:
        self.clear()
        self._last = ""


class _LogHandler(logging.StreamHandler):
    """The ``dfmp2`` loggers' handler on stderr: each record on a line of its own, the status
    line of the run (``status``, set while one is drawn) blanked before it and drawn again
    after it."""

    status: _TerminalProgress | None = None

    def emit(self, record: logging.LogRecord) -> None:
        status = self.status
        if status is not None:
            status.clear()
        super().emit(record)
        if status is not None:
            status.redraw()


def _show_logs_around(status: _TerminalProgress | None) -> None:
    """Give the ``dfmp2`` loggers' :class:`_LogHandler` the status line to write around (None:
    none any more)."""
    for handler in logging.getLogger("dfmp2").handlers:
        if isinstance(handler, _LogHandler):
            handler.status = status


class _UsageLine(click.UsageError):
    """A usage error shown as one line, as every other input error is, with the command's
    help named at its end (click's own shows the usage, a hint and the error on four)."""

    def show(self, file=None) -> None:
        message = self.format_message().rstrip(".")
        if message[:2].istitle():
            message = message[0].lower() + message[1:]
        where = f" (see '{self.ctx.command_path} --help')" if self.ctx is not None else ""
        click.echo(f"error: {message}{where}", err=True)


def _usage_line(exc: click.UsageError) -> click.UsageError:
    """``exc`` as one line; a bare command (no arguments: click's help) stays click's. A flag's
    bad value can only have come from its environment variable, which the line then names."""
    if isinstance(exc, getattr(click.exceptions, "NoArgsIsHelpError", ())):
        return exc
    param = getattr(exc, "param", None)
    envvar = getattr(param, "envvar", None)
    if (isinstance(exc, click.BadParameter) and getattr(param, "is_flag", False)
            and isinstance(envvar, str) and envvar in os.environ):
        return _UsageLine(f"environment variable {envvar} (it sets {param.opts[-1]}): "
                          f"{exc.message}; set it to 1 or 0, or unset it", exc.ctx)
    return _UsageLine(exc.format_message(), exc.ctx)


class _Main(click.Group):
    """The command group. A Ctrl-C while no run's signal handlers are installed (the imports
    and the BLAS checks of its first second, the output after it) ends as one during the run
    does: one line and exit status 130, instead of click's "Aborted!" and status 1 (under the
    console command, :mod:`dfmp2._command`'s handler says every signal's line itself). Usage
    errors, the group's and its commands', are one line (`_UsageLine`), exit status 2."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except _UsageLine:
            raise
        except click.UsageError as exc:
            raise _usage_line(exc) from None

    def invoke(self, ctx):
        from ._command import PROCESS

        PROCESS.status = None  # no interruption said yet (a program may run commands in turn)
        try:
            return super().invoke(ctx)
        except _UsageLine:
            raise
        except click.UsageError as exc:
            raise _usage_line(exc) from None
        except KeyboardInterrupt as exc:  # Python's SIGINT handler (the command run in a
            signum = getattr(exc, "signum", signal.SIGINT)  # program), or a run's Interrupted
            click.echo(f"error: interrupted by {signal.Signals(signum).name}; exit status "
                       f"{128 + signum}", err=True)
            raise click.exceptions.Exit(128 + signum) from None


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dfmp2")
def main():
    """Density-fitted MP2 (RI-MP2) energies on PySCF references."""


_D = Options.default


@main.command()
@click.argument("geometry", nargs=-1, required=True)
@click.option("--unit", type=click.Choice(UNITS, case_sensitive=False), default=_D("unit"),
              show_default=True,
              help="Unit of the coordinates (and Z-matrix distances) of an xyz file or atom "
                   "string. A QCSchema input's geometry is in Bohr by definition: --unit "
                   "angstrom is refused there.")
@click.option("--basis", default=_D("basis"), show_default=True, help="Orbital basis set.")
@click.option("--auxbasis", default=_D("auxbasis"),
              help="MP2 fitting basis [default: RI partner of --basis, e.g. cc-pvdz-ri].")
@click.option("--ecp", default=_D("ecp"), metavar="NAME|none",
              help="Effective core potentials [default: the ECP PySCF's library has for "
                   "--basis, e.g. def2-* beyond Kr]; 'none' for all electrons.")
@click.option("--cartesian/--spherical", default=_D("cartesian"),
              help="Cartesian (6d, 10f) or spherical (5d, 7f) functions [default: spherical, "
                   "as PySCF; Gaussian and Psi4 run 3-21G and 6-31G sets Cartesian, so "
                   "--cartesian gives their energies].")
@click.option("--scf-type", type=click.Choice(SCF_TYPES, case_sensitive=False),
              default=_D("scf_type"),
              show_default=True, help="Density-fitted SCF (JK-fit basis) or exact integrals.")
@click.option("--scf-auxbasis", default=_D("scf_auxbasis"),
              help="JK-fit basis of a DF-SCF [default: JK-fit partner of --basis].")
@click.option("--scf-precision", type=click.Choice(SCF_PRECISIONS, case_sensitive=False),
              default=_D("scf_precision"), show_default=True,
              help="K of a DF-SCF (and J, where its tensor is held unpacked) in float64 "
                   "throughout, or (mixed) in float32 until the orbital gradient is below "
                   "1e-3, then float64: the same SCF energy, orbitals that differ within the "
                   "convergence tolerance.")
@click.option("--charge", type=int, default=_D("charge"), show_default=True)
@click.option("--spin", type=int, default=_D("spin"), show_default=True,
              help="2S (number of unpaired electrons), PySCF convention.")
@click.option("--multiplicity", type=int, default=None,
              help="2S + 1, instead of --spin (--multiplicity 2: a doublet, --spin 1).")
@click.option("--reference", type=click.Choice(REFERENCES, case_sensitive=False),
              default=_D("reference"),
              help="SCF reference: rhf (singlets), uhf (unrestricted MP2) or rohf "
                   "(ROHF-MBPT(2), semicanonical orbitals and singles) [default: rhf for "
                   "singlets, uhf otherwise].")
@click.option("--frozen-core/--no-frozen-core", default=_D("frozen_core"), show_default=True,
              help="Freeze the chemical core of each element, PySCF's table: none for H-Be, "
                   "1s for B-Mg, 1s-2p for Al-Zn, ... (Li, Be, Na, Mg, K, Ca, ... keep their "
                   "outer core correlated); with an ECP only the core electrons it leaves.")
@click.option("--frozen", type=click.IntRange(min=0), default=_D("frozen"),
              help="Freeze the N lowest orbitals (instead of --frozen-core).")
@click.option("--backend", type=click.Choice(BACKENDS, case_sensitive=False), default=_D("backend"),
              show_default=True, help="Linear-algebra backend of the MP2 pipeline.")
@click.option("--cpu-blas", type=click.Choice(CPU_BLAS_CHOICES, case_sensitive=False),
              default=_D("cpu_blas"),
              show_default=True,
              help="Whose BLAS runs CPU matrix products: auto = numpy's OpenBLAS on AMD CPUs with "
                   "AVX2/FMA and Intel CPUs with AVX-512, torch's MKL otherwise. With numpy, "
                   "OMP_WAIT_POLICY=PASSIVE is set unless set; OPENBLAS_THREAD_TIMEOUT=20 is "
                   "set unless set.")
@click.option("--fused-energy/--no-fused-energy", default=_D("fused_energy"), show_default=True,
              help="Fused GEMM+reduction pair-energy op, or a GEMM then a separate reduction.")
@click.option("--nki-emulator", is_flag=True, envvar="DFMP2_NKI_EMULATOR",
              help="Run NKI kernels on dfmp2's NumPy emulator when the real nki is absent "
                   "(testing only; env DFMP2_NKI_EMULATOR=1).")
@click.option("--simulator", "nki_simulator", is_flag=True, envvar="DFMP2_USE_SIMULATOR",
              help="Run NKI kernels in the real nki.simulate (env DFMP2_USE_SIMULATOR=1).")
@click.option("--require-nki", is_flag=True, envvar="DFMP2_REQUIRE_NKI",
              help="Make any fallback from nki to pytorch an error (env DFMP2_REQUIRE_NKI=1).")
@click.option("--nki-matmul", type=click.Choice(NKI_MATMULS, case_sensitive=False),
              default=_D("nki_matmul"),
              show_default=True,
              help="Products of the NKI pair kernels: fp32, or bf16x3 (bfloat16 high and low "
                   "parts, three products in float32 PSUM: 3/4 of the fp32 TensorE time).")
@click.option("--nki-target", type=click.Choice(NKI_TARGETS, case_sensitive=False),
              default=_D("nki_target"),
              show_default=True,
              help="NeuronCore generation of the NKI launches: trn2 runs two SPMD programs per "
                   "launch (LNC=2), trn1 alternates its two cores; auto reads the instance type "
                   "(the emulated target with --nki-emulator).")
@click.option("--device", type=click.Choice(DEVICES, case_sensitive=False),
              default=_D("device"),
              show_default=True,
              help="Where the MP2 step runs: a CUDA device through torch, or the host; auto "
                   "takes a CUDA device when torch sees one.")
@click.option("--device-memory", type=click.IntRange(min=1), default=_D("device_memory"),
              metavar="MB", help="Memory budget on the device [default: its free memory].")
@click.option("--max-memory", type=click.IntRange(min=1), default=_D("max_memory"),
              show_default=True,
              help="Memory budget in MB of the DF-SCF's J/K and of the MP2 step.")
@click.option("--precision", type=click.Choice(PRECISIONS, case_sensitive=False),
              default=_D("precision"),
              show_default=True,
              help="mixed: fp32 pair GEMMs with fp64 reduction; fp32: each pair's terms in "
                   "fp32 too (summed in fp64).")
@click.option("--force-outcore", is_flag=True,
              help="Keep the fitted integrals (the MP2 step's and the DF-SCF's) in temporary "
                   "files even if they fit in memory.")
@click.option("--scratch-dir", type=click.Path(file_okay=False, exists=True),
              default=_D("scratch_dir"),
              help="Directory for the temporary HDF5 file [default: system temp dir].")
@click.option("--conv-tol-grad", type=click.FloatRange(min=0, min_open=True),
              default=_D("conv_tol_grad"),
              help="SCF orbital-gradient threshold [default: 1e-7; 1e-6 with --xc, where a "
                   "stall on the grid's noise is accepted up to 3.2e-6].")
@click.option("--max-cycle", type=click.IntRange(min=1), default=_D("max_cycle"),
              show_default=True, help="Maximum SCF iterations.")
@click.option("--threads", type=click.IntRange(min=1, max=MAX_THREADS), default=None, metavar="N",
              help="Threads of every pool the run uses (torch's, PySCF's OpenMP, each "
                   "OpenBLAS) [default: as the environment sets them, e.g. OMP_NUM_THREADS; "
                   "else one per CPU].")
@click.option("--chkfile", type=click.Path(dir_okay=False), default=_D("chkfile"),
              help="PySCF checkpoint of the SCF: written when converged; a checkpoint of the "
                   "same molecule, basis, reference and functional already there is the SCF "
                   "when converged to this run's tolerances (no cycle), else the initial "
                   "guess. With several geometries a path with {name} or {index}.")
@click.option("--guess", type=click.Choice(GUESSES, case_sensitive=False), default=_D("guess"),
              show_default=True,
              help="Initial guess of the SCF (PySCF's init_guess) where no --chkfile "
                   "checkpoint gives one: minao, atom (atomic SCF densities), huckel, "
                   "mod_huckel, 1e (core Hamiltonian), sap (atomic potentials). Another guess "
                   "can reach another SCF solution: --stability says whether it is a minimum.")
@click.option("--level-shift", type=click.FloatRange(0, MAX_LEVEL_SHIFT),
              default=_D("level_shift"), show_default=True, metavar="EH",
              help="Level shift of the SCF's virtual orbitals in Eh (0.1-0.5 steadies an SCF "
                   "with a small HOMO-LUMO gap); the converged energies are unshifted.")
@click.option("--stability", type=click.Choice(STABILITY_MODES, case_sensitive=False),
              default=_D("stability"), show_default=True,
              help="After the SCF converges: check = the lowest eigenvalues of its orbital "
                   "Hessian (within its kind, and RHF -> UHF for a closed-shell RHF), a warning "
                   "for each instability; follow = also rotate the orbitals along an internal "
                   "instability and converge again, until stable.")
@click.option("--xc", default=_D("xc"), metavar="NAME",
              help="Double hybrid on a Kohn-Sham reference (RKS, or UKS for open shells): "
                   "B2PLYP, B2GPPLYP, DSD-BLYP, DSD-PBEP86, DSD-PBEPBE, PBE0-DH, PBE0-2; or any "
                   "functional PySCF knows as the KS part of your own, with --os-scale and "
                   "--ss-scale.")
@click.option("--grid", default=_D("grid"), metavar="LEVEL|RADIAL,ANGULAR",
              help="DFT grid of --xc: PySCF's level 0-9 [default: 3], or radial,angular points "
                   "per atom, unpruned (e.g. 99,590).")
@click.option("--os-scale", type=float, default=_D("os_scale"),
              help="Opposite-spin scale of the scaled energy, 0 to 10 [default: SCS-MP2's 1.2; "
                   "SOS-MP2's 1.3; a double hybrid's own].")
@click.option("--ss-scale", type=float, default=_D("ss_scale"),
              help="Same-spin scale, 0 to 10 [default: SCS-MP2's 1/3; a double hybrid's own].")
@click.option("--sos", is_flag=True, default=_D("sos"),
              help="Spin-opposite scaling: same-spin scale 0 (SOS-MP2, opposite-spin 1.3).")
@click.option("--pair-energies", is_flag=True, default=_D("pair_energies"),
              help="Keep the energy of every occupied pair (in the JSON: "
                   "extras.pair_energies).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=True), default=None,
              metavar="PATH.png",
              help="Draw the pair-energy matrix (and a counterpoise run's interaction parts) to "
                   "this file; needs matplotlib (pip install 'dfmp2[plot]').")
@click.option("--counterpoise", is_flag=True,
              help="Counterpoise-corrected interaction energy: the complex, then each fragment "
                   "in the complex's basis, then in its own (the uncorrected interaction energy "
                   "and the BSSE) (needs --fragments, or a QCSchema input's "
                   "molecule.fragments).")
@click.option("--fragments", default=None, metavar="N1,N2,...",
              help="Atom counts of the fragments, in file order (e.g. 3,3).")
@click.option("--fragment-charges", default=None, metavar="Q1,Q2,...",
              help="Charge of each fragment [default: 0 each].")
@click.option("--fragment-spins", default=None, metavar="S1,S2,...",
              help="2S of each fragment [default: 0 or 1 by its electron count].")
@click.option("--dist-backend", type=click.Choice(("auto",) + DIST_BACKENDS, case_sensitive=False),
              default="auto",
              show_default=True,
              help="Under torchrun: the torch.distributed backend (auto: nccl when each rank "
                   "of a node has a CUDA device, xla with torch-xla on a Neuron device, else "
                   "gloo).")
@click.option("--dist-timeout", type=click.FloatRange(min=1.0, max=1e9), default=3600.0,
              callback=lambda _ctx, param, value: _finite(param, value),
              show_default=True,
              help="Under torchrun: seconds a rank waits in a collective (the other ranks wait "
                   "for rank 0's SCF within it) before the run ends with an error.")
@click.option("--json", "json_path", type=click.Path(allow_dash=True),
              default=None, help="Write the QCSchema AtomicResult to this file ('-': stdout, "
                                 "instead of the text summary).")
@click.option("-v", "--verbose", count=True,
              help="-v: SCF iterations, backend, BLAS and per-op records and timings; -vv: "
                   "debug detail.")
@click.option("-q", "--quiet", is_flag=True,
              help="Only errors and the run's total energy (MP2; a double hybrid's; a QCSchema "
                   "input's method's); a counterpoise run's: its CP-corrected interaction "
                   "energy at that level (Eh).")
def run(geometry, json_path, verbose, quiet, **options):
    """Run DF-MP2 on GEOMETRY (an xyz file or an atom string like "O 0 0 0; H 0 0 1; ...", in
    Angstrom or, with --unit bohr, in Bohr; or a QCSchema AtomicInput .json file, v1 or v2, in
    Bohr, whose keywords set the options: those given on the command line win, and --json
    writes an AtomicResult of the input's version).

    Several GEOMETRY arguments, or an xyz file of several frames, run one after another in this
    process and print one table; --json then names a directory or a path with {name} or {index}
    (each result its own file)."""
    from click.core import ParameterSource

    context = click.get_current_context()
    options["_explicit"] = {name for name in options if context.get_parameter_source(name) in
                            (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
    if quiet and verbose:  # one would be dropped without a word
        raise _fail(f"give -q (only the energy) or {'-' + 'v' * verbose} (more detail), not both")
    restore_logging = _configure_logging(verbose, quiet)
    try:
        _run_command(geometry, json_path, verbose, quiet, options)
    finally:
        restore_logging()


def _usable_tempdir(scratch_dir: str | None, hint: str = " or give --scratch-dir") -> None:
    """Before PySCF loads: its import asks Python for the temporary directory, which raises
    where none of TMPDIR, /tmp, /var/tmp, /usr/tmp and the current directory takes a file (all
    read-only or full). A given ``scratch_dir`` then serves as the temporary directory (it is
    where the run's temporary files go; :func:`dfmp2.api.check_scratch` tries it); else the
    run ends in one line."""
    import tempfile

    try:
        tempfile.gettempdir()
    except FileNotFoundError as exc:
        if scratch_dir is not None:
            tempfile.tempdir = scratch_dir
            return
        found = str(exc.strerror or exc)  # "No usable temporary directory found in [...]"
        raise _fail(f"{found[:1].lower()}{found[1:]}: none takes a new file (read-only or full); "
                    f"set TMPDIR to a writable directory{hint}") from None


def _plot_conflict(options) -> None:
    """Refuse, naming --plot, what keeping every pair's energy (which --plot implies)
    contradicts: the rules of :class:`dfmp2.options.Options` for --pair-energies."""
    matmul = options.get("nki_matmul")
    if options.get("require_nki"):
        why = "--require-nki forbids (no stage of the MP2 step may leave NKI)"
    elif matmul not in (None, "fp32"):
        why = (f"--nki-matmul {matmul} does not run (it chooses the products of the fused NKI "
               "pair kernel)")
    else:
        return
    raise _fail(f"--plot draws every pair's energy, kept by a host op, which {why}; drop one "
                "of them")


def _run_command(geometry, json_path, verbose, quiet, options) -> None:
    from .blas_env import prepare_process

    _usable_tempdir(options["scratch_dir"])
    dist_backend, dist_timeout = options.pop("dist_backend"), options.pop("dist_timeout")
    threads = options.pop("threads")
    options["_plot"] = options.pop("plot_path", None)
    if options["_plot"] is not None:  # it draws the pair energies: they are kept
        if not options.get("pair_energies"):  # (given too, the refusal names --pair-energies)
            _plot_conflict(options)
        options["pair_energies"] = True
    explicit = options.pop("_explicit", set(options))
    multiplicity = options.pop("multiplicity")
    from .qcschema import INPUT_ONLY, is_schema_input

    if multiplicity is not None:
        if any(is_schema_input(g) for g in geometry):
            raise _fail("--multiplicity with a QCSchema input: set "
                        f"{INPUT_ONLY['spin']} in the input instead")
        if "spin" in explicit:
            raise _fail("give --spin (2S) or --multiplicity (2S + 1), not both")
        if multiplicity < 1:
            raise _fail(f"--multiplicity is 2S + 1, at least 1; got {multiplicity}")
        options["spin"] = multiplicity - 1
        explicit = (explicit - {"multiplicity"}) | {"spin"}
    cp = {k: options.pop(k, None) for k in ("counterpoise", "fragments", "fragment_charges",
                                            "fragment_spins")}
    if not cp["counterpoise"] and any(cp[k] is not None for k in cp if k != "counterpoise"):
        raise _fail("--fragments, --fragment-charges and --fragment-spins belong to "
                    "--counterpoise; add it")
    if cp["counterpoise"] and cp["fragments"] is None and not all(
            is_schema_input(g) for g in geometry):  # a QCSchema input may define them
        raise _fail("--counterpoise needs --fragments (atom counts in file order, e.g. 3,3)")
    options["_counterpoise"] = cp if cp["counterpoise"] else None
    for name in {"charge", "spin"} - explicit:  # not given: an xyz comment line may say more
        options.pop(name, None)                 # (molecule._check_stated)
    if "unit" not in explicit:  # Angstrom, as not given: the record says it was the default
        options.pop("unit", None)
    from ._logged import kept_warnings

    with kept_warnings() as early:  # the command's own, before any run: each record keeps them
        environment = prepare_process(options["cpu_blas"])  # before numpy, torch, PySCF load
        from .distributed import init_from_environment

        try:  # under torchrun (its RANK, WORLD_SIZE, MASTER_ADDR/PORT): join the process group
            ranks = init_from_environment(os.environ, dist_backend, dist_timeout)
        except DFMP2Error as exc:
            raise _fail(exc) from None
        unused = sorted(f"--{name.replace('_', '-')}" for name in explicit
                        & {"dist_backend", "dist_timeout"})
        if ranks is None and unused:
            logging.getLogger("dfmp2.cli").warning(
                "%s %s under torchrun only; this run is one process", " and ".join(unused),
                "apply" if len(unused) > 1 else "applies")
    options["_early_warnings"] = tuple(early)
    from .threads import limit

    try:
        entries = _batch_entries(geometry)
        with limit(threads):
            if len(entries) == 1:  # {name} and {index} mean this one geometry's
                name = entries[0][0]
                json_path = _filled(json_path, name, ".json")
                options["_plot"] = _filled(options["_plot"], name, ".png")
                options["chkfile"] = _filled(options.get("chkfile"), name, ".chk")
                _run_rank(entries[0][1], json_path, verbose, quiet, options, environment,
                          ranks, explicit)
            else:
                _run_batch(entries, json_path, verbose, quiet, options, environment, ranks,
                           explicit, inputs=geometry)
    finally:
        if ranks is not None:
            ranks.close()


def _batch_entries(arguments) -> list[tuple[str, object]]:
    """``(name, geometry)`` of every job: each argument, an xyz file of several frames as one
    job per frame (named ``stem#k``; a frame whose atom lines are wrong is its error, which its
    job raises)."""
    from pathlib import Path

    from .geometry import read_xyz_frames

    entries = []
    for argument in arguments:
        path = Path(argument)
        if path.suffix.lower() != ".json" and os.path.isfile(argument):  # xyz, whatever its name
            try:
                frames = read_xyz_frames(path, keep_errors=True)
            except DFMP2Error:  # its own run names the problem; the other entries still run
                frames = []
            if len(frames) > 1:
                entries += [(f"{path.stem}#{k}", frame) for k, frame in enumerate(frames, 1)]
                continue
        entries.append((argument, argument))
    return entries


def _batch_json(json_path, name: str, index: int, suffix: str = ".json") -> str | None:
    """Where one result (or picture) of a batch goes: None, ``DIR/<name><suffix>`` or the path
    with ``{name}`` and ``{index}`` filled in."""
    if json_path is None:
        return None
    safe = "".join(c if c.isalnum() or c in "-_.#" else "_" for c in name.split("/")[-1])
    safe = safe.removesuffix(".xyz").removesuffix(".json").replace("#", "-")
    if len(safe) > 128:  # an atom string (a file system takes 255 bytes): its start and place
        safe = f"{safe[:100].rstrip('_.')}-{index}"
    if "{name}" in json_path or "{index}" in json_path:
        return json_path.replace("{name}", safe).replace("{index}", str(index))
    return os.path.join(json_path, safe + suffix)


def _filled(path, name: str, suffix: str):
    """``path`` with ``{name}`` and ``{index}`` filled in for a single geometry (index 1);
    any other path as it is."""
    if path is None or ("{name}" not in path and "{index}" not in path):
        return path
    return _batch_json(path, name, 1, suffix)


def _run_batch(entries, json_path, verbose, quiet, options, environment, ranks,
               explicit, inputs=()) -> None:
    """Every entry in turn in this process (the libraries load once); one table at the end,
    a failed entry its error line and a row saying so, exit status 1 if any failed. No output
    of any entry may be one of the ``inputs`` (the geometry arguments)."""
    owners = {os.path.realpath(arg): arg for arg in inputs if os.path.isfile(arg)}
    writes: dict[str, tuple[str, str]] = {}  # file -> the entry and the output that write it
    for flag, path, suffix in (("--json", json_path, ".json"), ("--plot", options.get("_plot"),
                               ".png"), ("--chkfile", options.get("chkfile"), ".chk")):
        if path is None:
            continue
        if "{name}" not in path and "{index}" not in path:
            if flag == "--chkfile":  # one SCF per geometry: a shared chkfile fits the first only
                raise _fail(f"--chkfile {path!r}: with {len(entries)} geometries each SCF "
                            "needs its own checkpoint; give a path with {name} or {index}")
            if path == "-":
                raise _fail(f"--json - writes one result to stdout; with {len(entries)} "
                            "geometries give a directory or a path with {name} or {index}")
            if not os.path.isdir(path):
                missing = ("there is no directory of that name; create it, or give"
                           if path.endswith(("/", os.sep)) else "give a directory or")
                raise _fail(f"{flag} {path!r}: with {len(entries)} geometries each result "
                            f"needs its own file; {missing} a path with {{name}} or {{index}}")
        if flag == "--plot":  # its file type and place, checked once for every entry
            first = _output_error(None, _batch_json(path, entries[0][0], 1, suffix))
            if first is not None:
                raise _fail(first)
        for index, (name, _geometry) in enumerate(entries, 1):
            target = _batch_json(path, name, index, suffix)
            key = os.path.realpath(target)
            if key in writes:
                other, other_flag = writes[key]
                raise _fail(f"{flag} {path!r}: {other}'s {other_flag} and {name}'s {flag} would "
                            f"both write {target}; give each its own path (with {{index}})")
            if key in owners:
                raise _fail(f"{flag} {path!r}: {name}'s {target} would overwrite the input "
                            f"{owners[key]!r}; give another path")
            writes[key] = (name, flag)
    leader = ranks is None or ranks.rank == 0
    rows = []
    # between entries (and in an entry's output checks, before its own handlers) a signal
    # also ends the batch with the finished rows, instead of killing it without a word
    restore, _pending = _raise_on_signals()
    try:
        for index, (name, geometry) in enumerate(entries, 1):
            collected: list = []
            failed = False
            try:
                if ranks is not None:
                    _same_entry(ranks, index)
                if leader and not quiet:
                    click.echo(f"[{index}/{len(entries)}] {name}", err=True)
                entry = {**options,
                         "_plot": _batch_json(options.get("_plot"), name, index, ".png"),
                         "chkfile": _batch_json(options.get("chkfile"), name, index, ".chk")}
                _run_rank(geometry, _batch_json(json_path, name, index), verbose, quiet,
                          entry, environment, ranks, explicit, collect=collected, label=name)
            except Interrupted as exc:  # before the entry's run began: nothing of it to keep
                if leader and rows:
                    click.echo(_batch_table(rows))
                raise _interrupted(exc, f" ({name}, before it ran)") from None
            except click.exceptions.Exit as exc:
                if exc.exit_code >= 128:  # a signal ends the batch: the finished rows first
                    done = collected[0] if collected else None  # its output was finished
                    if leader and (rows or done is not None):
                        rows.append((name, done, done is None))
                        click.echo(_batch_table(rows))
                    raise
                failed = True
            # an entry computed but not written (its error line says why) keeps its energies
            result = collected[0] if collected else None
            rows.append((name, result if result is not None or failed else "done on rank 0",
                         failed))
    finally:
        restore()
    if leader:
        click.echo(_batch_table(rows))
    if any(failed for _name, _result, failed in rows):
        raise click.exceptions.Exit(1)


def _same_entry(ranks, index: int) -> None:
    """Under torchrun, before each batch entry: every rank is at entry ``index`` (else the batch
    ends: a rank that left, or ranks out of step, would pair one entry's collectives with
    another's)."""
    import torch

    from .distributed import current

    try:
        seen = current().all_reduce(torch.tensor([index, -index], dtype=torch.int64), "MIN")
    except RuntimeError as exc:
        if not ranks.is_collective_error(exc):
            raise
        raise _fail(f"the batch stops at entry {index}: {ranks.collective_error(exc)}",
                    f" (rank {ranks.rank} of {ranks.world_size})") from None
    if int(seen[0]) != -int(seen[1]):
        raise _fail(f"the ranks are at different batch entries ({int(seen[0])} to "
                    f"{-int(seen[1])}); the batch stops",
                    f" (rank {ranks.rank} of {ranks.world_size})")


def _batch_table(rows) -> str:
    """One row per entry: the reference's energy, the correlation and totals (MP2 and the
    scaled MP2; or a double hybrid's PT2 term and total). Entries whose energies have other
    names (an SOS-MP2 input beside an MP2 one, a double hybrid beside either) get a table of
    their own, in order of appearance; failed entries are listed under the first."""
    width = max(12, *(len(name) for name, _, _ in rows))
    groups: dict[tuple, list] = {}
    for name, result, failed in rows:
        heads = _batch_columns(result)[0] if result is not None else None
        key = heads if heads is not None else next(iter(groups), None)
        groups.setdefault(key, []).append((name, result, failed))
    tables = []
    for heads, members in groups.items():
        heads = heads or _batch_columns(None)[0]
        lines = [f"{'geometry':<{width}s}  {'formula':<10s} {'nbas':>5s} "
                 + " ".join(f"{h:>20s}" for h in heads)]
        for name, result, failed in members:
            if result is None:
                lines.append(f"{name:<{width}s}  failed (its error is above)")
                continue
            lines.append(f"{name:<{width}s}  {result.molecule.formula:<10s} "
                         f"{result.sizes.nbasis:5d} "
                         + " ".join(f"{value(result):20.{d}f}"
                                    for value, d in zip(*_batch_columns(result)[1:]))
                         + ("  (output not written: its error is above)" if failed else ""))
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def _batch_columns(result) -> tuple[tuple[str, ...], tuple, tuple[int, ...]]:
    """(headings, a function per heading that reads it from a Result, the decimals each is
    printed to) of a batch row: the energies, then a counterpoise run's interaction energies
    (Eh) per level. The reference's energy has 12 decimals; those that hold the correlation
    energy the decimals its precision leaves (:attr:`Result.corr_decimals`)."""
    if result is not None and result.double_hybrid:
        heads, names = (("E(KS)", "E(PT2) scaled", f"E({result.dh_name}) total"),
                        ("e_scf", "e_scs", "e_scs_tot"))
    else:
        label = result.scaled_label if result is not None else "SCS-MP2"
        heads, names = (("E(HF)", "E(corr) MP2", "E(MP2) total", f"E({label}) total"),
                        ("e_scf", "e_corr", "e_tot", "e_scs_tot"))
    values = tuple((lambda r, n=n: getattr(r, n)) for n in names)
    corr = result.corr_decimals if result is not None else FULL_DECIMALS
    decimals = tuple(FULL_DECIMALS if n == "e_scf" else corr for n in names)
    inter = result.interaction if result is not None else None
    if inter:
        heads += tuple(f"E(int) {label}" for label in inter["levels"].values())
        values += tuple((lambda r, k=k: r.interaction[k]["eh"]) for k in inter["levels"])
        decimals += tuple(decimals_for(interaction_error(k, result.precision_error))
                          for k in inter["levels"])
    return heads, values, decimals


def _run_rank(geometry, json_path, verbose, quiet, options, environment, ranks,
              explicit=frozenset(), collect: list | None = None, label: str = "") -> None:
    """The run on this process: the only one, or one rank of a torchrun job (rank 0 alone
    prints, writes the JSON and shows progress; every rank's error names it). A QCSchema input
    sets the options from its keywords, under those in ``explicit`` (given on the command
    line)."""
    leader = ranks is None or ranks.rank == 0
    options = dict(options)  # a batch hands every entry the same dict
    plot_path = options.pop("_plot", None)
    early = options.pop("_early_warnings", ())
    who = "" if ranks is None else f" (rank {ranks.rank} of {ranks.world_size})"
    if label:  # a batch entry: its error line names it
        who = f" ({label})" if not who else who[:-1] + f", {label})"
    unwritable = (_output_error(json_path, plot_path, options.get("chkfile"), geometry)
                  if leader else None)
    if ranks is not None:  # rank 0 alone writes; every rank stops with it
        from .distributed import current

        try:
            current().agree(unwritable, "the output checks")
        except DFMP2Error as exc:
            raise _fail(exc, who) from None
    elif unwritable is not None:
        if _output_error(json_path, None, None, geometry) is None:
            # the JSON could be written (another output failed its check): an earlier run's
            # result there must not pass for this run's
            _record_failure(json_path, unwritable)
        raise _fail(unwritable, who)
    if not leader:  # rank 0 logs for the run; the others only their errors
        logging.getLogger("dfmp2").setLevel(logging.ERROR)
    terminal = _TerminalProgress(enabled=not quiet and leader)
    _show_logs_around(terminal)
    restore, pending = _raise_on_signals()

    def progress(stage: str, done: int, total: int) -> None:
        pending.check()  # a signal whose exception Python swallowed (in a __del__ or callback)
        terminal(stage, done, total)

    job = None
    # a failure is recorded in the JSON file once nothing else may be that file (the input's
    # chkfile keyword is checked against it below)
    record = json_path if leader else None
    stamp = _file_stamp(record)  # what is there now: a failure replaces only that
    computed = False  # once True (the result exists) the handlers stay until its output is out
    try:
        from . import qcschema
        from .api import run as run_dfmp2

        if isinstance(geometry, DFMP2Error):  # a batch's frame that could not be read
            raise geometry
        if qcschema.is_schema_input(geometry):
            job = qcschema.with_overrides(qcschema.read_input(geometry), {
                k: v for k, v in options.items() if k in explicit})  # echoed in its result
            given_chkfile = options.get("chkfile")
            options = {**job.options,  # and what the command adds (--counterpoise, --plot's)
                       **{k: v for k, v in options.items() if k.startswith("_")},
                       **({"pair_energies": True} if plot_path is not None else {})}
            if options.get("chkfile") not in (None, given_chkfile):  # the input's keyword
                clash = (_output_error(json_path, plot_path, options["chkfile"], geometry)
                         if leader else None)
                record = None if clash is not None else record
                if ranks is not None:
                    from .distributed import current

                    current().agree(clash, "the output checks")
                elif clash is not None:
                    raise clash
            geometry = job.mole
            if options.get("_counterpoise"):
                options["_counterpoise"] = _schema_fragments(options["_counterpoise"], job)
        counterpoise = options.pop("_counterpoise", None)
        try:
            if counterpoise:
                from .counterpoise import run_counterpoise

                result = run_counterpoise(
                    geometry, counterpoise["fragments"], counterpoise["fragment_charges"],
                    counterpoise["fragment_spins"], progress=progress,
                    environment=environment, **options)
            else:
                result = run_dfmp2(geometry, progress=progress, environment=environment,
                                   **options)
        finally:
            _show_logs_around(None)
            terminal.close()
        pending.check()  # also a signal swallowed in a finaliser after the last progress report
        pending.deferred = computed = True  # the result exists: a signal waits for its output
    except Interrupted as exc:
        _record_failure(record, exc, job, stamp)
        raise _interrupted(exc, who) from None
    except DFMP2Error as exc:
        if pending.signum is not None:  # the error came while a signal was being delivered
            signalled = Interrupted(pending.signum, signal.Signals(pending.signum).name)
            _record_failure(record, signalled, job, stamp)
            raise _interrupted(signalled, who) from None
        if job is not None:  # a QCSchema input: --charge and the like are its own fields
            from .qcschema import retell_in_input_terms

            retell_in_input_terms(exc)
        _record_failure(record, exc, job, stamp)
        raise _fail(exc, who) from None
    except (MemoryError, RuntimeError) as exc:
        # an allocation the memory plan did not count, or a limit: Python's MemoryError, or
        # torch's allocator's RuntimeError ("DefaultCPUAllocator: can't allocate memory")
        if isinstance(exc, MemoryError) or _TORCH_OUT_OF_MEMORY in str(exc):
            asked = re.search(r"you tried to allocate (\d+) bytes", str(exc))
            what = (str(exc) if isinstance(exc, MemoryError) else
                    f"torch could not allocate {asked.group(1)} bytes" if asked else
                    f"torch: {str(exc).splitlines()[0]}")
            short = ResourceError(f"out of memory ({what or 'an allocation failed'}); lower "
                                  "--max-memory or raise the process's memory limit "
                                  "(ulimit -v)")
            _record_failure(record, short, job, stamp)
            raise _fail(short, who) from None
        # a collective that timed out or lost a peer
        if ranks is None or not ranks.is_collective_error(exc):
            raise
        _record_failure(record, ranks.collective_error(exc), job, stamp)
        raise _fail(ranks.collective_error(exc), who) from None
    finally:
        if not computed:
            restore()
    if result is not None:  # the keywords the record echoes: those given (a QCSchema input's
        from dataclasses import replace  # with the command line's), not every default

        from .api import _given_keywords

        if job is not None:
            keywords = dict(job.input.get("keywords") or {})
        else:  # as checked, as dfmp2.run's record has them ('--grid 2': 2)
            fields = Options.field_names()
            keywords = _given_keywords({k: v for k, v in options.items() if k in fields},
                                       result.method, given=explicit)
        result = replace(result, keywords=keywords, warnings=(*early, *result.warnings))
    try:
        _emit_result(result, job, json_path, plot_path, quiet, verbose, collect, who)
    except click.exceptions.Exit:  # an output that could not be written (its line is out)
        if pending.signum is None:
            raise
    finally:
        if pending.signum is not None:  # a signal during the output, which was finished first:
            _said_interrupted(pending.signum, who)  # said before the handlers go back
        restore()
    if pending.signum is not None:
        raise click.exceptions.Exit(128 + pending.signum)


#: What torch's CPU allocator says when an allocation fails (a RuntimeError, not MemoryError).
_TORCH_OUT_OF_MEMORY = "can't allocate memory"


def _schema_fragments(cp: dict, job) -> dict:
    """The counterpoise settings of a QCSchema input: its molecule's fragments where the
    command line gives none; the command line's where the input defines none; refused where
    the two differ (the result echoes the input's molecule)."""
    from . import qcschema
    from .counterpoise import _int_list

    given = qcschema.input_fragments(job)
    if given is None:
        if cp["fragments"] is None:
            raise InputError("--counterpoise needs the fragments: give --fragments (atom counts "
                             "in file order, e.g. 3,3) or molecule.fragments in the input")
        return cp
    names = ("fragments", "fragment_charges", "fragment_spins")
    for name, value in zip(names, given):
        ours = cp[name]
        flag = f"--{name.replace('_', '-')}"
        if ours is not None and _int_list(flag, ours) != _int_list(flag, value):
            raise InputError(f"{flag} {ours} contradicts the input's molecule ({value}); "
                             "give one of them")
    return {**cp, **dict(zip(names, given))}


def _emit_result(result, job, json_path, plot_path, quiet, verbose, collect, who) -> None:
    """A finished run's output: its JSON (an AtomicResult of a QCSchema input's version), its
    plot, and its summary (a batch entry: kept for the batch's table). A file that cannot be
    written is one error line after the summary, which still carries every energy."""
    from . import qcschema

    if result is None:  # a rank other than 0: rank 0 reports
        if collect is not None:
            collect.append(None)
        return
    if job is not None:  # an AtomicResult of the input's schema version, validated
        import json

        text = json.dumps(qcschema.result_dict(result, job), indent=2)
        energy = qcschema.answering(result, job).e_return
    else:
        text, energy = result.to_json(), result.e_return
    decimals = result.corr_decimals
    if result.interaction:  # -q of a counterpoise run: E(int) at the level of that energy
        from .counterpoise import answer_level

        level = answer_level(result, scaled=job is not None
                             and job.method in SCALED_METHODS)
        energy = result.interaction[level]["eh"]
        decimals = decimals_for(interaction_error(level, result.precision_error))
    if json_path == "-":
        click.echo(text)
        return
    write_error = None
    if json_path:
        from ._files import write_text_file

        try:
            write_text_file(json_path, text + "\n")
        except OSError as exc:
            write_error = f"cannot write JSON to {json_path!r}: {exc.strerror}"
            # what was there is whole, but an earlier run's: it must not pass for this one's
            _record_failure(json_path, OSError(write_error))
    if plot_path is not None and write_error is None:
        from .plot import plot_pair_energies

        try:
            plot_pair_energies(result, plot_path)
        except InputError as exc:
            write_error = str(exc)
    if collect is not None:  # a batch entry: the batch prints one table (-v: and its summary)
        if verbose and not quiet:
            click.echo(f"== {who.strip(' ()') or 'entry'}\n"
                       f"{result.summary(verbose=True, warnings=False)}\n")
        collect.append(result)
    else:
        click.echo(f"{energy:.{decimals}f}" if quiet  # (warnings: logged above)
                   else result.summary(verbose=verbose >= 1, warnings=False))
    if write_error:  # the summary above (a batch: its row) still carries every energy
        raise _fail(write_error, who)


def _check_json_path(path) -> None:
    """Before any work: the JSON file can be created or overwritten."""
    error = _output_error(path, None)
    if error is not None:
        raise _fail(str(error))


def _finite(param, value):
    """A float option's value, refused as a usage error when NaN (click's ranges let it by) or
    infinite."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds", param=param)
    return value


def _output_error(json_path, plot_path, chkfile=None, geometry=None) -> InputError | None:
    """Before any work: the :class:`InputError` that writing the JSON or the plot would meet
    (None when both can be written), or that of two outputs, or an output and the input file,
    being one file (the later write would destroy the other)."""
    from ._files import check_writable_file

    owners: dict[str, str] = {}
    if isinstance(geometry, (str, os.PathLike)) and os.path.isfile(geometry):
        owners[os.path.realpath(geometry)] = f"the input {os.fspath(geometry)!r}"
    for flag, path in (("--json", json_path), ("--plot", plot_path), ("--chkfile", chkfile)):
        if path is None or path == "-":
            continue
        key = os.path.realpath(path)
        if key in owners:
            return InputError(f"{flag} {path!r} is the same file as {owners[key]}: one would "
                              "overwrite the other; give each its own path")
        owners[key] = f"{flag}'s file"
    try:
        if json_path is not None and json_path != "-":
            check_writable_file(json_path, "JSON")
        if plot_path is not None:
            from .plot import check_plot_path

            check_plot_path(plot_path)
    except InputError as exc:
        return exc
    return None


class _PendingSignal:
    """The last signal the handler saw. Python ignores an exception raised while it runs a
    ``__del__`` method or a weakref callback (and prints it through ``sys.unraisablehook``), so
    the CLI asks again at every progress report and once the run has returned, and its hook
    keeps such an ignored :class:`Interrupted` off the terminal."""

    def __init__(self):
        self.signum: int | None = None
        #: True once the run's result exists: a signal is recorded, not raised, until its
        #: output (JSON, plot, summary) is written
        self.deferred = False

    def check(self) -> None:
        if self.signum is not None:
            raise Interrupted(self.signum, signal.Signals(self.signum).name)


def _raise_on_signals():
    """Turn the :data:`~dfmp2._command.SIGNALS` (terminals', sessions' and batch schedulers')
    into :class:`Interrupted`, so ``finally`` blocks remove the temporary HDF5 file; return a
    function that restores the previous handlers, and the :class:`_PendingSignal` record. A
    signal the process ignores (SIGHUP under ``nohup``, SIGINT in a background job) stays
    ignored; a second signal while the first one's interruption is under way is ignored too
    (it would break into the clean-up, and the exit status the line states)."""
    from ._command import PROCESS, SIGNALS

    pending = _PendingSignal()

    def handler(signum, _frame):
        if pending.signum is not None or PROCESS.status is not None:  # one under way already
            return
        pending.signum = signum
        if not pending.deferred:
            pending.check()

    previous = {}
    for sig in SIGNALS:
        if signal.getsignal(sig) is signal.SIG_IGN:  # nohup, or a background job: stays ignored
            continue
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread (e.g. inside a test runner's worker thread)
            pass
    previous_hook = sys.unraisablehook

    def quiet_hook(unraisable):
        # an Interrupted raised inside a __del__ or weakref callback is lost here and raised
        # again by pending.check(); every other unraisable exception is reported as before
        if not isinstance(unraisable.exc_value, Interrupted):
            previous_hook(unraisable)

    if previous:
        sys.unraisablehook = quiet_hook

    def restore():
        for sig, old in previous.items():
            signal.signal(sig, old)
        if previous:
            sys.unraisablehook = previous_hook

    return restore, pending


def _said_interrupted(signum: int, who: str) -> None:
    """The line of a signal that came while the output was written (finished first); a later
    signal keeps its status (:data:`dfmp2._command.PROCESS`)."""
    from ._command import PROCESS

    click.echo(f"error{who}: interrupted by {signal.Signals(signum).name} while the output was "
               f"written; it was finished first; exit status {128 + signum}", err=True)
    PROCESS.status = 128 + signum


def _interrupted(exc: Interrupted, who: str = "") -> click.exceptions.Exit:
    from ._command import PROCESS

    click.echo(f"error{who}: {exc}; temporary files removed; exit status {128 + exc.signum}",
               err=True)
    PROCESS.status = 128 + exc.signum  # a later signal ends the process with this status
    return click.exceptions.Exit(128 + exc.signum)


def _file_stamp(path) -> tuple | None:
    """Which file is at ``path`` and how far it was written (inode, size, modification time);
    None where there is no regular file."""
    try:
        info = os.stat(path) if path and path != "-" else None
    except OSError:
        return None
    if info is None or not stat.S_ISREG(info.st_mode):
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _record_failure(json_path, exc: Exception, job=None, stamp=False) -> None:
    """A run that failed after its output checks replaces a file already at ``json_path`` with
    a QCSchema ``FailedOperation``-shaped record (``success`` false, the error's type and
    message, the QCSchema input when there was one), so that it never holds an earlier run's
    result under this run's name; where there was no file, none is made (the error line says
    what failed), nor is a device or FIFO written. A file that cannot be replaced now (a full
    disk) is removed. ``stamp``: the file as the run's output checks found it
    (:func:`_file_stamp`); one written since (by another run given the same path, which
    finished meanwhile) is that run's result and is left alone."""
    if not json_path or json_path == "-" or not os.path.isfile(json_path):
        return
    if stamp is not False and _file_stamp(json_path) != stamp:
        return
    import json

    from . import qcschema
    from .qcengine_harness import qcengine_error

    # QCEngine's error_type of the exception dfmp2's error becomes there: InputError is
    # input_error, and so on
    kind = qcengine_error(exc)
    record = {"success": False,
              "error": {"error_type": re.sub(r"(?<!^)(?=[A-Z])", "_", kind).lower(),
                        "error_message": str(exc)},
              "input_data": None if job is None else qcschema.input_echo(job),
              "extras": {"provenance": {"creator": "dfmp2", "version": __version__,
                                        "routine": "dfmp2"}}}
    from ._files import write_text_file

    try:
        write_text_file(json_path, json.dumps(record, indent=2) + "\n")
    except OSError:  # no room even for the record: the earlier result goes (a removal frees)
        with contextlib.suppress(OSError):
            os.remove(os.path.realpath(json_path))  # the file, not a link to it


def _fail(message, who: str = "") -> click.exceptions.Exit:
    click.echo(f"error{who}: {message}", err=True)
    return click.exceptions.Exit(1)


@main.command()
@click.option("--nki-emulator", is_flag=True, envvar="DFMP2_NKI_EMULATOR",
              help="Report the emulator mode as opted in.")
@click.option("--simulator", "nki_simulator", is_flag=True, envvar="DFMP2_USE_SIMULATOR",
              help="Report the simulator mode as requested.")
def info(nki_emulator, nki_simulator):
    """Versions, and each backend and execution mode with why it is or is not available."""
    _usable_tempdir(None, hint="")
    from .linalg.numpy_ops import PAIR_REDUCTION
    from .linalg.report import backend_report
    from .results import versions

    for name, version in versions().items():
        click.echo(f"{name:<8s} {version}")
    built = "built" if PAIR_REDUCTION.startswith("compiled") else "NOT built"
    click.echo(f"compiled pair reduction: {built}; pair energies use the {PAIR_REDUCTION}")
    click.echo("")
    click.echo("backends and modes:")
    for backend, mode, available, reason in backend_report(nki_emulator, nki_simulator):
        mark = "yes" if available else "no "
        click.echo(f"  {backend:<8s} {mode:<10s} {mark}  {reason}")


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(allow_dash=True))
@click.option("-v", "--verbose", is_flag=True,
              help="Also the backend, BLAS, per-op records and stage times.")
def show(paths, verbose):
    """Print the summary of a result saved by `dfmp2 run --json PATH` (or a QCSchema result
    of dfmp2's; '-' reads standard input), as the run printed it; several files print the
    table of a batch."""
    from .results import Result

    rows = []
    for path in paths:
        try:
            if path == "-":
                try:
                    result = Result.from_json(click.get_binary_stream("stdin").read())
                except InputError as exc:
                    raise InputError(f"stdin: {exc}") from None
            else:
                result = Result.read(path)
        except InputError as exc:
            if len(paths) == 1:
                raise _fail(str(exc)) from None
            click.echo(f"error: {exc}", err=True)
            result = None
        rows.append((path, result, result is None))
    if len(paths) == 1:
        click.echo(rows[0][1].summary(verbose=verbose))
        return
    if verbose:  # each record's whole summary, then the table
        for path, result, _failed in rows:
            if result is not None:
                click.echo(f"== {path}\n{result.summary(verbose=True)}\n")
    click.echo(_batch_table(rows))
    if any(failed for _path, _result, failed in rows):
        raise click.exceptions.Exit(1)


#: trnsci's measured DF-MP2 energy step on one trn1 NeuronCore (v0.5.0, fused energy) at its
#: benchmark shapes (nocc, nvir, naux): the numbers a modeled time is set beside.
TRNSCI_ENERGY_SECONDS = {(64, 448, 1536): ("medium", 5.43), (96, 672, 2304): ("large", 30.27)}


@main.command("nki-model")
@click.option("--nocc", type=click.IntRange(1, 4096), required=True,
              help="Active occupied orbitals.")
@click.option("--nvir", type=click.IntRange(1, 20000), required=True, help="Virtual orbitals.")
@click.option("--naux", type=click.IntRange(1, 100000), required=True,
              help="Auxiliary functions.")
@click.option("--target", type=click.Choice(["trn1", "trn2"], case_sensitive=False),
              default="trn1", show_default=True,
              help="NeuronCore whose documented rates price the instructions.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the report as JSON to PATH ('-' for stdout).")
def nki_model(nocc, nvir, naux, target, json_path):
    """Model dfmp2's NKI kernels at one shape: run them on the emulator against float64, count
    their instructions and price them with AWS's documented per-instruction costs (modeled,
    never measured). Exit status 0 only if every kernel matched float64."""
    import json

    from .nki_model import run_model

    _check_json_path(json_path)
    try:
        report = run_model(nocc, nvir, naux, target)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    except MemoryError as exc:  # an allocation its memory check did not foresee
        raise _fail(f"out of memory modeling nvir {nvir} ({exc or 'an allocation failed'}); "
                    "model a smaller nvir or raise the process's memory limit (ulimit -v)"
                    ) from None
    reference = TRNSCI_ENERGY_SECONDS.get((nocc, nvir, naux))
    if reference:
        report["trnsci_energy_step_seconds"] = {"shape": reference[0], "seconds": reference[1],
                                                "measured_on": "trn1, one NeuronCore"}
    if json_path == "-":
        click.echo(json.dumps(report, indent=1))
    else:
        _echo_model(report, reference)
        if json_path:
            from ._files import write_text_file

            try:
                write_text_file(json_path, json.dumps(report, indent=1) + "\n")
            except OSError as exc:
                raise _fail(f"cannot write JSON to {json_path!r}: {exc.strerror}") from None
    if not report["passed"]:
        failed = [name for name, k in report["kernels"].items() if not k["passed"]]
        raise _fail(f"kernel(s) {', '.join(failed)} differ from float64 beyond their tolerance")


def _echo_model(report, reference) -> None:
    shape = report["shape"]
    click.echo(f"NKI cost model, {report['target']} (documented rates; modeled, not measured), "
               f"nocc {shape['nocc']} nvir {shape['nvir']} naux {shape['naux']}, kernels run on "
               "dfmp2's emulator")
    click.echo(f"{'kernel':<31s} {'check':>5s} {'launches':>8s} {'instr':>7s} {'tensor':>9s} "
               f"{'vector':>9s} {'scalar':>8s} {'dma':>9s} {'modeled':>9s} {'TensorE':>7s}")
    for name, k in report["kernels"].items():
        e = k["engines"]
        us = {engine: f"{seconds * 1e6:.1f}us" for engine, seconds in e.items()}
        click.echo(f"{name:<31s} {'ok' if k['passed'] else 'FAIL':>5s} {k['launches']:>8d} "
                   f"{k['instructions']:>7d} {us['tensor']:>9s} {us['vector']:>9s} "
                   f"{us['scalar']:>8s} {us['dma']:>9s} {k['modeled_seconds'] * 1e6:>7.1f}us "
                   f"{k['tensore_utilization']:>7.0%}")
    step = report["energy_step"]
    line = (f"energy step (closed shell, {step['pairs']} pairs): "
            f"{report['energy_step_seconds']:.3f} s modeled on {step['cores']} cores "
            f"({step['kernel_seconds']:.3f} s of kernels on one, {step['launches']} launches, "
            f"B uploaded once: {step['b_upload_bytes'] / 1e6:.0f} MB)")
    if reference:
        line += f"; trnsci {reference[0]} measured {reference[1]:.2f} s"
    click.echo(line)
    split = report["energy_step_bf16x3"]
    if split:
        click.echo(f"energy step with --nki-matmul bf16x3: {split['seconds']:.3f} s modeled "
                   f"on {split['cores']} cores ({split['kernel_seconds']:.3f} s of kernels on "
                   f"one, {split['launches']} launches)")
    for name, reason in report["not_modeled"].items():
        click.echo(f"{name}: not modeled: {reason}")


if __name__ == "__main__":  # pragma: no cover
    main()
