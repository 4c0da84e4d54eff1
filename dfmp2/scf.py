"""The reference SCF through PySCF: RHF, UHF or ROHF, or with ``--xc`` RKS or UKS, density-fitted
(JK-fit basis) or with exact integrals."""

from __future__ import annotations

import logging
import os

import numpy as np
import torch
from pyscf import df, dft, gto, lib, scf
from pyscf.lib.exceptions import BasisNotFoundError

from . import stability
from .blocking import jk_square_fits, usable_bytes
from .errors import ConvergenceError, InputError
from .functionals import grid_settings
from .integrals import default_auxbasis, make_auxmol
from .jk import DFJK, plan_tensor
from .molecule import element_of, first_line, is_ghost_label, quiet_pyscf, unghosted
from .options import Options
from .reference import own_attribute
from .scf_integrals import UNPACK_BLOCK
from .scf_newton import newton_raphson

log = logging.getLogger(__name__)

__all__ = ["CHK_XC_KEY", "check_guess", "check_reference_spin", "jk_auxbasis", "make_scf",
           "plan_scf", "release_integrals", "restart_guess", "run_scf", "scf_fit_record"]


def jk_auxbasis(mol, options: Options):
    """The JK-fit basis of a DF-SCF: the user's choice or PySCF's partner of the orbital basis."""
    if options.scf_auxbasis is not None:  # a falsy value too: the fit's build refuses it
        return options.scf_auxbasis
    return default_auxbasis(mol, mp2fit=False)


def plan_scf(mol, options: Options):
    """Before any integral, what a DF-SCF on dfmp2's J/K needs, refused now when it cannot be
    had: its JK-fit basis built (one line naming ``--scf-auxbasis`` otherwise), its tensor
    planned under ``--max-memory`` (:func:`dfmp2.jk.plan_tensor`: :class:`ResourceError` when
    even the smallest blocks do not fit), and float32 K under ``--scf-precision mixed`` only
    where the functional has exact exchange (a KS part without it builds no K, so the option
    would change nothing). The :class:`dfmp2.blocking.JKPlan`; None for an SCF on exact
    integrals."""
    if options.scf_type != "df":
        return None
    xc = options.scaling.xc
    if options.scf_precision == "mixed" and xc is not None and not dft.libxc.is_hybrid_xc(xc):
        raise InputError(f"--scf-precision mixed runs K in float32 in the early cycles, and the "
                         f"KS part {xc!r} has no exact exchange (no K): drop --scf-precision "
                         "mixed")
    auxmol = make_auxmol(mol, jk_auxbasis(mol, options), jk=True)
    return plan_tensor(mol, auxmol, options.max_memory, options.force_outcore)


def run_scf(mol, options: Options, progress=None, la=None):
    """Run and return a converged SCF object for ``mol``.

    ``options.resolved_reference``: 'rhf' (2S = 0 only), 'uhf' or 'rohf'; with ``options.xc``
    the Kohn-Sham RKS or UKS of :func:`make_scf`. A non-converged SCF
    raises :class:`ConvergenceError`: no MP2 energy is computed from it. Each iteration is
    logged at INFO (cycle, energy, change, orbital gradient) and reported to
    ``progress(stage, cycle, max_cycle)`` when given. With ``options.chkfile`` the converged SCF
    is written there (with its functional, :data:`CHK_XC_KEY`); a chkfile of the same molecule,
    basis, reference and functional already there is the
    initial guess (:func:`restart_guess`), or, when converged to this run's tolerances, the
    SCF itself with no cycle (:func:`_converged_checkpoint`). The object's ``restart``
    attribute says which.

    A density-fitted SCF builds J and K with dfmp2's own integrals, fit and ``la`` ops
    (:class:`dfmp2.jk.DFJK`) when ``la`` is given, its fitted tensor in memory or, beyond
    ``options.max_memory``, in a temporary file in ``options.scratch_dir`` (unlinked as soon
    as it is open; released on any error); without ``la``, with PySCF's DF object. The object's
    ``jk`` attribute says which ran and where the tensor was.
    """
    reference = options.resolved_reference
    check_reference_spin(mol, reference)
    mf = make_scf(mol, options)
    dm0, mf.restart = restart_guess(mf, options.chkfile)  # refused before any integral
    mf.guess_record = options.guess if dm0 is None else None  # else the chkfile's orbitals
    mf.jk = "exact integrals (PySCF)"
    if options.scf_type == "df":
        auxbasis = jk_auxbasis(mol, options)
        mf = mf.density_fit(auxbasis=auxbasis)
        mf.jk = _choose_jk(mf, mol, auxbasis, options, la, restart=dm0 is not None)
    if la is not None:  # every cycle's diagonalisation on the run's ops, whatever builds J/K
        mf._eigh = registry_eigh(la)
    try:  # from here on a built tensor (a temporary file when out of core) is released on error
        _converge(mf, options, progress, dm0)
    except BaseException:
        release_integrals(mf)
        raise
    return mf


def make_scf(mol, options: Options):
    """The unconverged SCF object of a run: RHF, UHF or ROHF; with ``options.xc``, RKS or UKS
    with the functional's KS part (a double hybrid's, :mod:`dfmp2.functionals`) on the grid of
    ``options.grid``."""
    reference = options.resolved_reference
    xc = options.scaling.xc
    if xc is None:
        mf = {"rhf": scf.RHF, "uhf": scf.UHF, "rohf": scf.ROHF}[reference](mol)
    else:
        mf = {"rhf": dft.RKS, "uhf": dft.UKS}[reference](mol, xc=xc)
        grid_settings(mf.grids, options.grid)
    # PySCF's constructor opens a named scratch chkfile in its TMPDIR, which a killed process
    # would leave behind; dfmp2 writes only --chkfile (when converged), so it goes at once
    scratch = own_attribute(mf, "_chkfile", None)
    if hasattr(scratch, "close"):
        scratch.close()
    mf._chkfile, mf.chkfile = None, None
    mf.init_guess, mf.level_shift = options.guess, options.level_shift
    return mf


def _label(mf, options: Options) -> str:
    """'DF-RHF', 'DF-RKS (0.53*HF + 0.47*B88, 0.73*LYP)', ... for messages."""
    kind = type(mf).__name__.replace("SymAdaptedR", "R").replace("SymAdaptedU", "U")
    kind = next((k for k in ("ROHF", "RHF", "UHF", "RKS", "UKS") if k in kind),
                options.resolved_reference.upper())
    xc = f" ({mf.xc})" if own_attribute(mf, "xc", None) and options.xc is not None else ""
    return f"{options.scf_type.upper()}-{kind}{xc}"


def _converge(mf, options: Options, progress, dm0) -> None:
    """Build ``mf``'s DF tensor, run its SCF and write the chkfile (see :func:`run_scf`)."""
    restarted = dm0 is not None  # from the chkfile's orbitals
    if options.scf_type == "df":
        try:
            with quiet_pyscf():
                mf.with_df.build()
        except BasisNotFoundError as exc:
            raise InputError(f"SCF fitting basis {mf.with_df.auxbasis!r}: {first_line(exc)}"
                             ) from None
        if isinstance(mf.with_df, DFJK):
            mf.jk += _jk_layout(mf.with_df, mf.with_df.k_precision == "fp32")
    mf.conv_tol = options.conv_tol
    mf.conv_tol_grad = options.resolved_conv_tol_grad
    mf.max_cycle = options.max_cycle
    mf.verbose = 0
    mf.chkfile = None  # PySCF writes no scratch chkfile of its own, nor --chkfile mid-run
    mf.solver = "DIIS (PySCF)"
    jk = own_attribute(mf, "with_df", None)
    if isinstance(jk, DFJK) and jk.k_precision == "fp32":
        mf.check_convergence = _mixed_precision_check(jk)
    if dm0 is None:  # made here, as PySCF's kernel would, so that its failure is one line
        try:
            dm0 = mf.get_init_guess(mf.mol, mf.init_guess)
        except Exception as exc:  # e.g. 'sap' has no potential of a ghost atom
            raise InputError(f"the SCF's initial guess {mf.init_guess!r} could not be made "
                             f"({first_line(exc)}); choose another --guess") from None
    saved = None  # the chkfile's orbitals, when they are the converged SCF as they are
    if restarted and KEPT_FOREIGN not in mf.restart:
        check = _converged_checkpoint(mf, dm0, options.chkfile)
        if check is not None:
            saved = mf.mo_coeff
            mf.restart = f"converged SCF from chkfile {options.chkfile} ({check})"
    if restarted and options.guess != Options.default("guess"):
        mf.restart += (f"; --guess {options.guess} not used: the checkpoint's "
                       + ("SCF was converged" if saved is not None else
                          "orbitals are the initial guess"))
    if saved is None:
        _kernel(mf, options, progress, dm0)
    _require_converged(mf, options)
    log.info("SCF converged: E = %.12f Eh", mf.e_tot)
    builds = sum(jk.k_calls.values()) if isinstance(jk, DFJK) else 0  # the SCF's, not the
    if options.stability != "none":                      # analysis's (its record counts those)
        _stability(mf, options, progress)
        if saved is not None and mf.mo_coeff is not saved:
            mf.restart += ("; then --stability follow left it for a lower solution "
                           f"({_cycles(mf.cycles)}), which replaces it in the chkfile")
    if isinstance(jk, DFJK) and jk.k_calls["fp32"]:
        products = ("J and K" if jk.square_only else
                    "K (and J of the unpacked rows)" if jk.head is not None else "K")
        mf.jk += (f"; {products} in float32 for the first {jk.k_calls['fp32']} of the SCF's "
                  f"{builds} builds, then float64")
    elif isinstance(jk, DFJK) and options.scf_precision == "mixed":  # restarted (_choose_jk)
        mf.jk += ("; float64 throughout: --scf-precision mixed starts in float32, and this SCF "
                  "started from a chkfile's orbitals")
    if (options.chkfile is not None and KEPT_FOREIGN not in mf.restart  # once, converged
            and mf.mo_coeff is not saved):  # not the chkfile's own SCF, unchanged
        try:
            _check_unchanged(mf, options.chkfile)
            write_chkfile(mf, options.chkfile)
            mf.chkfile = options.chkfile
        except Exception as exc:  # checked before the SCF: a full disk, h5py's errors now
            why = getattr(exc, "strerror", None) or first_line(exc)
            log.warning("could not write the chkfile %r (%s); the run goes on without it",
                        options.chkfile, why)
            mf.restart = f"{mf.restart}; not written: {why}"  # the summary and the record


def _kernel(mf, options: Options, progress, dm0, note: str = "") -> None:
    """PySCF's DIIS from ``dm0`` with the run's cycle reports and stall watch, continued by
    :func:`_second_order` when DIIS stalls; ``note`` is added to each progress line (a
    followed instability's SCF)."""
    report = progress
    if progress is not None and note:
        def report(stage, cycle, total):
            progress(f"{stage} {note}", cycle, total)
    mf.callback = _cycle_reporter(report, options.max_cycle,
                                  _stall_watch(mf.conv_tol, mf.conv_tol_grad, options.max_cycle))
    try:
        mf.kernel(dm0=dm0)
    except _Stalled as stall:
        _second_order(mf, stall, options, report)


def _require_converged(mf, options: Options) -> None:
    """The :class:`ConvergenceError` of an SCF that did not converge."""
    if mf.converged:
        return
    float32 = _float32_cycles(mf)
    stalled = own_attribute(mf, "stalled_at", None)
    if stalled is not None:  # DIIS stalled, and what ran after it ended at --max-cycle
        raise ConvergenceError(
            f"the {_label(mf, options)} did not converge in {_cycles(options.max_cycle)} "
            f"(last energy {mf.e_tot:.10f} Eh): DIIS stalled at |g| = {stalled:.2e} "
            f"(threshold {mf.conv_tol_grad:.0e}) and the solvers after it did not finish; "
            "loosen --conv-tol-grad, or raise --max-cycle")
    raise ConvergenceError(
        f"the {_label(mf, options)} did not converge in "
        f"{_cycles(options.max_cycle)} (last energy {mf.e_tot:.10f} Eh); raise "
        "--max-cycle, or check the geometry, the charge and the spin (--charge, --spin)" + (
            "; a KS reference whose gradient stalls (DFT grid noise) needs a finer --grid "
            "or a looser --conv-tol-grad" if options.xc is not None else "") + (
            f"; a level shift slows the last cycles: lower --level-shift "
            f"{options.level_shift:g} or drop it" if options.level_shift else "") + (
            f"; {float32} of its J/K builds ran in float32 (--scf-precision mixed), whose "
            "cycles never count as converged: --scf-precision fp64 may need fewer"
            if float32 else "")
    )


def _float32_cycles(mf) -> int:
    """How many of ``mf``'s J/K builds so far ran in float32 (``--scf-precision mixed``)."""
    jk = own_attribute(mf, "with_df", None)
    return jk.k_calls["fp32"] if isinstance(jk, DFJK) else 0


def _stability(mf, options: Options, progress) -> None:
    """The stability analysis of the converged ``mf`` (:func:`dfmp2.stability.settle`, which
    follows instabilities under ``options.stability`` 'follow'), put on it as
    ``stability_record`` (the run's ``extras.scf.stability``). Each followed SCF runs as the
    first did (up to ``--max-cycle`` cycles of its own); one that does not converge is a
    :class:`ConvergenceError`."""
    label = _label(mf, options)

    def rerun(mf, dm0, k: int) -> None:
        before = mf.e_tot
        mf.solver = "DIIS (PySCF)"
        after = f"after following an instability of the converged SCF (E = {before:.10f} Eh"
        keep = "raise --max-cycle, or run --stability check to keep the converged SCF"
        try:
            _kernel(mf, options, progress, dm0, note=f"(instability {k} followed)")
        except ConvergenceError as exc:  # a stall the second-order solver could not finish
            raise ConvergenceError(f"{exc}; this SCF ran {after}); or {keep}") from None
        if not mf.converged:
            raise ConvergenceError(f"the {label} did not converge in "
                                   f"{_cycles(options.max_cycle)} {after}; last energy "
                                   f"{mf.e_tot:.10f} Eh); {keep}")

    mf.stability_record = {"mode": options.stability,
                           **stability.settle(mf, options.stability == "follow", rerun, label,
                                             progress)}


def _check_unchanged(mf, path: str) -> None:
    """Before the converged SCF is written to ``path``: what is there is still something this
    run may replace (checked before its SCF: this system's checkpoint, or none). Another run
    given the same path may have written its own meanwhile; that one is kept (an
    :class:`InputError` saying so)."""
    if not os.path.exists(path):
        return
    try:
        _dm, record = restart_guess(mf, path)
    except InputError as exc:  # "chkfile '...' holds another calculation (...); remove it ..."
        text = first_line(exc)
        what = text.split(" holds ", 1)[1].split(";")[0] if " holds " in text else text
        raise InputError(f"written meanwhile, it now holds {what} (another run given the same "
                         "--chkfile?), and is kept") from None
    if record is not None and record.endswith(KEPT_FOREIGN):
        raise InputError("written meanwhile by another program than dfmp2, it is kept")


def write_chkfile(mf, path: str) -> None:
    """Save the converged SCF (and its functional, :data:`CHK_XC_KEY`) to ``path`` without a
    moment when ``path`` holds half a checkpoint. The whole file (whatever else a file already
    there held is kept; its SCF and molecule records are replaced) is built in memory, written
    beside ``path`` by plain file I/O and renamed over it: a full disk is one ``OSError`` of that
    write (HDF5 writing into a full disk can crash the process), and the file does not grow
    with every restart (HDF5 keeps the space of a replaced record). A symbolic link keeps
    pointing at the file it names, which is the one rewritten."""
    import io

    import h5py

    path = os.path.realpath(path)
    memory = io.BytesIO()
    with h5py.File(memory, "w") as out:
        if os.path.exists(path):
            with h5py.File(path, "r") as old:
                for key, value in old.attrs.items():
                    out.attrs[key] = value
                for name in old:
                    if name not in ("mol", "scf"):
                        old.copy(old[name], out, name=name)
            if CHK_XC_KEY in out:
                del out[CHK_XC_KEY]
        out["mol"] = mf.mol.dumps()
        out["scf/e_tot"] = float(mf.e_tot)
        for key in ("mo_energy", "mo_occ", "mo_coeff"):
            out[f"scf/{key}"] = np.asarray(getattr(mf, key))
        out[CHK_XC_KEY] = _functional_of(mf)
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "wb") as handle:
            handle.write(memory.getbuffer())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


#: A mixed-precision SCF (``--scf-precision mixed``) builds K in float64 from the cycle after
#: PySCF's orbital gradient falls below this. Float32 K leaves a gradient noise of about 1e-5 on
#: (H2O)16 cc-pVDZ (the gradient stalls there). Measured on the Intel Xeon (family 6, model
#: 167), cc-pVDZ, float32 J and K from the unpacked tensor, cycles (float32 + float64 builds)
#: and J/K seconds at 1e-3 against 1e-4: (H2O)16 14 (8 + 8) and 11.7 s against 15 (9 + 8) and
#: 12.6 s; (H2O)16+ UHF 24 (10 + 16) and 35.8 s against 26 (15 + 13) and 36.6 s; C20H42 12
#: cycles either way, 27.7 s and 27.6 s. Switching later (3e-5) took 20 cycles on (H2O)16.
FP64_SWITCH_GRAD = 1e-3
#: ... or after this many float32 cycles without a new lowest gradient (a stall above the
#: threshold) ...
FP32_STALL_CYCLES = 3
#: ... or after this many cycles with float32 K, whichever comes first.
FP32_MAX_CYCLES = 30


def _mixed_precision_check(jk):
    """PySCF's convergence test (its ``check_convergence`` hook) for an SCF whose K starts in
    float32 (:class:`dfmp2.jk.DFJK`): a cycle with float32 K never converges, and the one where
    the gradient passes :data:`FP64_SWITCH_GRAD` (or stalls, or the cycle count passes its cap)
    switches K to float64 for the cycles after it. Cycles with float64 K get PySCF's own test
    (|dE| < conv_tol and |g| < conv_tol_grad; in its extra cycle after convergence, either with
    its loosened values), so the energy is that of a float64 SCF converged to the same
    tolerances."""
    best, stalled = np.inf, 0

    def check(envs) -> bool:
        nonlocal best, stalled
        change = abs(envs["e_tot"] - envs["last_hf_e"])
        gradient = envs["norm_gorb"]
        if envs["scf_conv"]:  # PySCF's extra cycle (conv_check), tolerances already loosened
            return bool(change < envs["conv_tol"] or gradient < envs["conv_tol_grad"])
        if jk.k_precision == "fp32":
            stalled = 0 if gradient < best else stalled + 1
            best = min(best, gradient)
            if (gradient < FP64_SWITCH_GRAD or stalled >= FP32_STALL_CYCLES
                    or jk.k_calls["fp32"] >= FP32_MAX_CYCLES):
                jk.use_fp64()
            return False
        return bool(change < envs["conv_tol"] and gradient < envs["conv_tol_grad"])

    return check


def check_reference_spin(mol, reference: str) -> None:
    """An RHF reference needs 2S = 0."""
    if reference == "rhf" and mol.spin != 0:
        raise InputError(f"an RHF reference needs 2S = 0, got 2S = {mol.spin} (multiplicity "
                         f"{mol.spin + 1}); use --reference uhf or rohf for an open shell")


def check_guess(mol, guess: str) -> None:
    """Refuse, before any SCF, an initial guess PySCF cannot make for ``mol``: 'sap' has no
    atomic potential of a ghost atom (a counterpoise fragment's partners), and PySCF's 'sap'
    fails on Cartesian d or higher shells (its potential's matrix has the spherical size)."""
    if guess != "sap":
        return
    if any(mol.atom_charge(i) == 0 for i in range(mol.natm)):
        raise InputError("--guess sap (guess='sap') has no atomic potential for ghost atoms "
                         "(a counterpoise run's fragments have them); choose another guess")
    if mol.cart and any(mol.bas_angular(i) >= 2 for i in range(mol.nbas)):
        raise InputError("--guess sap (guess='sap') is made for spherical functions only "
                         "(PySCF's fails on Cartesian d shells); choose another guess or drop "
                         "--cartesian")


def release_integrals(mf) -> None:
    """Drop the SCF's JK-fit tensors (dfmp2's or PySCF's) once nothing needs them: the MP2
    step's --max-memory budget is its own."""
    if own_attribute(mf, "with_df", None) is not None:
        mf.with_df.reset()


def _choose_jk(mf, mol, auxbasis, options: Options, la, restart: bool = False) -> str:
    """Give ``mf`` dfmp2's J/K (:class:`dfmp2.jk.DFJK`) when ``la`` is given; return what runs
    J and K (completed by :func:`_jk_layout` once the tensor is built). The fitted tensor is in
    memory or in a temporary file under ``--max-memory`` (:func:`dfmp2.blocking.plan_jk`). K
    starts in float32 under ``--scf-precision mixed`` unless the SCF ``restart``s from converged
    orbitals (a float32 cycle could not converge, and its noise would cost float64 cycles)."""
    if la is None:
        return "PySCF's DF J/K (no dispatcher given)"
    mixed = options.scf_precision == "mixed" and not restart
    mf.with_df = DFJK(mol, auxbasis, la, k_precision="fp32" if mixed else "fp64",
                      scratch_dir=options.scratch_dir, force_outcore=options.force_outcore)
    mf.with_df.max_memory = options.max_memory
    return "dfmp2 DF J/K"


def registry_eigh(la):
    """PySCF's ``_eigh`` hook for an SCF object, through ``la``'s ``eigh`` (a host op: torch's
    LAPACK): the diagonalisation of every cycle, which PySCF's kernel asks for with its
    orthogonaliser ``x`` (x^T S x = 1, linear dependencies dropped), is ``x^T h x``
    diagonalised, its eigenvectors back-transformed and given PySCF's phase (largest
    component positive). Without ``x`` (or complex), PySCF's generalised solver as before.
    It replaces SciPy's ``eigh`` on its bundled OpenBLAS, the slower of the two on the
    benchmark machine measured (docs/performance.md, section "Intel Xeon")."""

    def eigh(h, s, overwrite=False, x=None):
        if x is None or np.iscomplexobj(h) or np.iscomplexobj(x):
            return scf.hf.SCF._eigh(None, h, s, overwrite, x)
        xhx = x.T @ h @ x
        w, v = la.eigh(torch.from_numpy(np.ascontiguousarray(xhx)))  # its lower triangle
        return w.numpy(), scf.hf._adjust_phase_(x @ v.numpy())

    return eigh


def _jk_layout(jk: DFJK, mixed: bool) -> str:
    """Where a built :class:`DFJK` keeps its tensor, for the record."""
    plan, naux = jk.plan, jk.get_naoaux()
    if jk.square_only:
        return f" (fitted tensor in memory, unpacked, float64, naux {naux})"
    if jk.head is not None:
        return (f" (fitted tensor in memory, its first {jk.head.shape[0]} auxiliary functions "
                f"unpacked (float64), the other {jk.columns.shape[0]} packed on "
                f"{jk.pairs.describe()}, naux {naux})")
    if plan.outcore:
        reason = ("forced out of core" if plan.incore_bytes <= usable_bytes(jk.max_memory) else
                  f"in memory it would take {plan.incore_bytes / 2**20:.1f} MB (the packed "
                  f"tensor {plan.tensor_bytes / 2**20:.1f} MB, the metric's factors and work "
                  f"arrays), more than the {usable_bytes(jk.max_memory) / 2**20:.1f} MB "
                  f"usable of --max-memory {jk.max_memory:.0f} MB")
        return (f" (fitted tensor on disk: {jk.describe()}; {reason}; read "
                f"{plan.read_block} auxiliary functions at a time; naux {naux})")
    kept = [name for name, itemsize, wanted in (("float32", 4, mixed), ("float64", 8, True))
            if wanted and jk_square_fits(jk.mol.nao_nr(), naux, itemsize, jk.max_memory,
                                         UNPACK_BLOCK)]
    copies = f"; square copies for K: {' then '.join(kept)}" if kept else ""
    if jk.pairs is not None:
        layout = f"packed on {jk.pairs.describe()}"
    else:
        layout = "packed"
    return f" (fitted tensor in memory, {layout}, naux {naux}{copies})"


def _cycle_reporter(progress, max_cycle: int, watch=None, offset: int = 0, key: str = "cycle"):
    """PySCF's per-iteration callback: one INFO line per SCF cycle (shown by ``dfmp2 -v``) and,
    with ``progress``, the terminal's status line; then ``watch(cycle, energy change,
    gradient, envs)`` when given (:func:`_stall_watch`). ``key``: the cycle counter among the
    driver's locals ('imacro' for the second-order solver), counted after ``offset`` cycles."""

    reported = set()

    def report(envs: dict) -> None:
        cycle, energy = offset + envs[key] + 1, envs["e_tot"]
        if cycle in reported:  # PySCF's Newton driver calls back once more after its loop
            return
        reported.add(cycle)
        change = energy - envs.get("last_hf_e", energy)
        gradient = envs.get("norm_gorb", float("nan"))
        log.info("SCF cycle %2d  E = %.12f Eh  dE = %+.2e  |g| = %.2e", cycle, energy, change,
                 gradient)
        if progress is not None:
            progress(f"SCF E={energy:.8f} dE={change:+.1e} |g|={gradient:.1e}", cycle,
                     max_cycle)
        if watch is not None:
            watch(cycle, change, gradient, envs)

    return report


#: DIIS has stalled when, for this many consecutive cycles, the energy changed by less than
#: conv_tol while the orbital gradient stayed above conv_tol_grad without falling below
#: :data:`STALL_GAIN` times its value at the window's start (a slow but healthy tail gains
#: more than 10% in 8 cycles). Seen on OH (a 2-Pi radical) with a double hybrid's UKS: the
#: gradient sat at 1.08e-6 for 90 cycles over a threshold of 1e-6 on one machine (and
#: converged on another), the energy still falling by 1e-12 per cycle.
STALL_CYCLES = 8
STALL_GAIN = 0.9
#: Macro iterations of PySCF's second-order solver after a stall before DIIS takes over again.
NEWTON_CYCLES = 10
#: Newton-Raphson steps (:mod:`dfmp2.scf_newton`) after DIIS stalled again: near a stationary
#: point each gains orders of magnitude (the stretched water UHF of tests/test_scf.py: |g|
#: 1.8e-7, then 2.4e-11 after one), so a few are plenty, and more do not help a noise floor.
NEWTON_RAPHSON_CYCLES = 5
#: The largest orbital gradient at which a Kohn-Sham SCF stalled on its grid's noise is
#: accepted as converged under the default KS threshold (:func:`_ks_noise_bound`; smaller when
#: sqrt(conv_tol) is): sqrt(1e-11) = 3.16e-6 rounded, PySCF's own default threshold for that
#: energy tolerance (dfmp2's default before it became 1e-10).
KS_STALL_LIMIT = 3.2e-6


class _Stalled(Exception):
    """Raised from the cycle callback to leave PySCF's DIIS loop: its last energy and
    orbitals."""

    def __init__(self, cycle: int, gradient: float, envs: dict):
        super().__init__(f"DIIS stalled at cycle {cycle}")
        self.cycle, self.gradient, self.energy = cycle, gradient, envs["e_tot"]
        self.mo_coeff, self.mo_occ = envs["mo_coeff"], envs["mo_occ"]
        self.fock = envs.get("fock")  # PySCF's DIIS loop: the Fock of this cycle's density


def _stall_watch(conv_tol: float, conv_tol_grad: float, max_cycle: int):
    """The stall test of the DIIS cycles (:data:`STALL_CYCLES`); cycles whose K is float32
    (a mixed-precision SCF's early ones, which never converge) do not count, and the last
    allowed cycle ends as a non-converged SCF instead."""
    recent: list[float] = []
    window = STALL_CYCLES

    def watch(cycle: int, change: float, gradient: float, envs: dict) -> None:
        jk = getattr(envs.get("mf"), "with_df", None)
        if (isinstance(jk, DFJK) and jk.k_precision != "fp64") or not (
                abs(change) < conv_tol and gradient > conv_tol_grad):
            recent.clear()
            return
        recent.append(gradient)
        if (len(recent) >= window and min(recent[-window:]) > STALL_GAIN * recent[-window]
                and cycle < max_cycle):
            raise _Stalled(cycle, gradient, envs)

    return watch


def _cycles(n: int) -> str:
    return f"{n} cycle" if n == 1 else f"{n} cycles"


def _stall_error(mf, options: Options, gradient: float, what: str) -> ConvergenceError:
    """The one-line error of an SCF that stalled at ``gradient`` and could not go on."""
    return ConvergenceError(
        f"the {_label(mf, options)} stalled at |g| = {gradient:.2e} (threshold "
        f"{mf.conv_tol_grad:.0e}) {what}; loosen --conv-tol-grad"
        + (" or use a finer --grid" if options.xc is not None else ""))


def _ks_noise_bound(options: Options, stalled: _Stalled) -> float | None:
    """The orbital gradient up to which a stalled Kohn-Sham SCF is accepted as converged, or
    None when it is not: only under the default KS threshold (``--conv-tol-grad`` not given),
    only from a DIIS cycle (which has the Fock matrix of its density), and only up to
    :data:`KS_STALL_LIMIT` or PySCF's own default threshold ``sqrt(conv_tol)``, whichever is
    smaller. A DFT grid is not invariant under
    rotations, so a degenerate state (OH's 2-Pi) leaves its orbital gradient on a floor that
    depends on which way rounding broke the symmetry: 1.08e-6 and 1.45e-6 over the default
    1e-6 on one Intel Xeon with two orderings of K's products, a few 1e-7 on an AMD EPYC, the
    energy falling by 1e-11 per cycle or less."""
    bound = min(KS_STALL_LIMIT, float(np.sqrt(options.conv_tol)))
    if (options.xc is None or options.conv_tol_grad is not None or stalled.fock is None
            or not stalled.gradient <= bound):
        return None
    return bound


def _settle_stall(mf, options: Options, stalled: _Stalled, what: str) -> str:
    """A stall the second-order solver could not finish: the :class:`ConvergenceError` of
    :func:`_stall_error` (``what`` says after what), or, within :func:`_ks_noise_bound`, the
    stalled cycle's density put on ``mf`` as converged, as canonical orbitals of its own Fock
    matrix (PySCF's ``canonicalize``: occupied and virtual blocks diagonalised apart,
    occupations kept) with its energy; returns what the solver record adds ('accepted (...)',
    after the stall's own words)."""
    bound = _ks_noise_bound(options, stalled)
    if bound is None:
        raise _stall_error(mf, options, stalled.gradient, what) from None
    mf.mo_energy, mf.mo_coeff = mf.canonicalize(stalled.mo_coeff, stalled.mo_occ, stalled.fock)
    mf.converged, mf.e_tot, mf.mo_occ = True, stalled.energy, stalled.mo_occ
    log.warning("the %s stalled at |g| = %.2e over the default KS threshold %.0e (the DFT "
                "grid's noise); accepted as converged under %.1e (give --conv-tol-grad to "
                "insist)", _label(mf, options), stalled.gradient, mf.conv_tol_grad, bound)
    return (f"accepted (default KS threshold {mf.conv_tol_grad:.0e}, the grid's noise; under "
            f"{bound:.1e})")


def _second_order(mf, stall: _Stalled, options: Options, progress) -> None:
    """Continue a stalled DIIS from its last orbitals with PySCF's second-order (Newton) solver
    for up to :data:`NEWTON_CYCLES` macro iterations, to the same tolerances; when that has not
    converged (its steps can shrink to nothing just above a tight gradient threshold), DIIS
    again with a fresh subspace from the second-order orbitals, and when that stalls too,
    Newton-Raphson steps (:func:`_newton_raphson`). The result (converged, canonical orbitals
    and energy) is put on ``mf``; ``mf.solver`` says what ran."""
    log.info("SCF: DIIS stalled at cycle %d (|g| = %.2e over %.0e while the energy no longer "
             "changes); continuing with PySCF's second-order (Newton) solver", stall.cycle,
             stall.gradient, mf.conv_tol_grad)
    mf.stalled_at = stall.gradient  # for the error of an SCF that ends unconverged
    newton = mf.newton()
    newton.verbose = 0
    newton.max_cycle = max(1, min(NEWTON_CYCLES, options.max_cycle - stall.cycle))
    seen = [stall.cycle]
    gradients = [stall.gradient]

    def flat(cycle: int, change: float, gradient: float, envs: dict) -> None:
        """The second-order steps have stopped gaining: back to DIIS from here."""
        seen.append(cycle)
        if abs(change) < mf.conv_tol and gradient > STALL_GAIN * gradients[-1]:
            raise _Stalled(cycle, gradient, envs)
        gradients.append(gradient)

    newton.callback = _cycle_reporter(progress, options.max_cycle, flat, offset=stall.cycle,
                                      key="imacro")
    try:
        newton.kernel(stall.mo_coeff, stall.mo_occ)
        mf.converged, mf.e_tot = newton.converged, newton.e_tot
        mf.mo_energy, mf.mo_coeff, mf.mo_occ = newton.mo_energy, newton.mo_coeff, newton.mo_occ
    except _Stalled as stopped:  # DIIS below sets the orbital energies
        mf.converged, mf.e_tot = False, stopped.energy
        mf.mo_coeff, mf.mo_occ = stopped.mo_coeff, stopped.mo_occ
    except Exception as exc:  # e.g. a functional without the second derivatives it needs
        failed = f"PySCF's second-order solver could not continue ({first_line(exc)})"
        record = _settle_stall(mf, options, stall,
                               f"after {stall.cycle} DIIS cycles and {failed}")
        mf.cycles = max(seen)  # with any second-order steps taken before it failed
        mf.solver = (f"DIIS (PySCF) for {stall.cycle} cycles, stalled at |g| = "
                     f"{stall.gradient:.1e}; {failed}; {record}")
        return
    done = max(seen)  # PySCF's Newton driver keeps no count of its own
    mf.cycles = done
    mf.solver = (f"DIIS (PySCF) for {stall.cycle} cycles, stalled at |g| = "
                 f"{stall.gradient:.1e}; then second-order (Newton, PySCF) for "
                 f"{_cycles(done - stall.cycle)}")
    if mf.converged or done >= options.max_cycle:
        return
    mf.callback = _cycle_reporter(progress, options.max_cycle,
                                  _stall_watch(mf.conv_tol, mf.conv_tol_grad, options.max_cycle),
                                  offset=done)
    mf.max_cycle = options.max_cycle - done
    try:
        mf.kernel(dm0=mf.make_rdm1(mf.mo_coeff, mf.mo_occ))
    except _Stalled as again:
        mf.max_cycle = options.max_cycle
        _newton_raphson(mf, again, options, progress, done)
        return
    finally:
        mf.max_cycle = options.max_cycle
    mf.solver += f"; then DIIS (PySCF) again for {_cycles(mf.cycles)}"
    mf.cycles = done + mf.cycles


def _newton_raphson(mf, again: _Stalled, options: Options, progress, done: int) -> None:
    """The last resort after DIIS stalled ``again`` (from cycle ``done``): up to
    :data:`NEWTON_RAPHSON_CYCLES` Newton-Raphson steps from its orbitals
    (:func:`dfmp2.scf_newton.newton_raphson`), within ``--max-cycle``. Converged, their
    canonical orbitals and energy are put on ``mf``; otherwise :func:`_settle_stall` of the
    stalled DIIS cycle (a :class:`ConvergenceError`, or a KS stall accepted)."""
    diis = f"; then DIIS (PySCF) again for {_cycles(again.cycle - done)}"
    allowed = min(NEWTON_RAPHSON_CYCLES, options.max_cycle - again.cycle)
    steps = None
    if allowed > 0:
        log.info("SCF: DIIS stalled again at cycle %d (|g| = %.2e); continuing with "
                 "Newton-Raphson steps", again.cycle, again.gradient)
        reporter = _cycle_reporter(progress, options.max_cycle, offset=again.cycle)

        def report(step: int, energy: float, last: float, gradient: float) -> None:
            reporter({"cycle": step - 1, "e_tot": energy, "last_hf_e": last,
                      "norm_gorb": gradient})

        steps = newton_raphson(mf, again.mo_coeff, again.mo_occ, allowed, report)
    if steps is not None and steps.converged:
        mf.mo_energy, mf.mo_coeff = mf.canonicalize(steps.mo_coeff, steps.mo_occ, steps.fock)
        mf.converged, mf.e_tot, mf.mo_occ = True, steps.e_tot, steps.mo_occ
        mf.cycles = again.cycle + steps.steps
        mf.solver += (f"{diis}, stalled at |g| = {again.gradient:.1e}; then Newton-Raphson "
                      f"(MINRES on PySCF's orbital Hessian) for {_cycles(steps.steps)}")
        if options.stability == "none":  # a saddle is where DIIS stalls most (the test's UHF)
            log.warning("the %s was finished by Newton-Raphson steps, which converge to saddle "
                        "points of the energy as well as to minima: --stability check says "
                        "which this is", _label(mf, options))
        return
    tried = "" if steps is None else f" and Newton-Raphson for {_cycles(steps.steps)}"
    record = _settle_stall(mf, options, again, "again after DIIS and PySCF's second-order "
                           f"solver{tried}" + ("" if steps is None else
                                               f" (last |g| = {steps.gradient:.1e})"))
    mf.solver += (f"{diis}, stalled at |g| = {again.gradient:.1e}" + (
        "" if steps is None else f"; then Newton-Raphson for {_cycles(steps.steps)}, not "
        f"converged (last |g| = {steps.gradient:.1e})") + f"; {record}")
    mf.cycles = again.cycle + (0 if steps is None else steps.steps)


def _same_system(mol, saved) -> str | None:
    """None when the chkfile's molecule ``saved`` is ``mol`` (atoms, coordinates, basis, ECP,
    charge, 2S), else what differs."""
    if [mol.atom_symbol(k) for k in range(mol.natm)] != [
            saved.atom_symbol(k) for k in range(saved.natm)]:
        return "other atoms"
    if not np.allclose(mol.atom_coords(), saved.atom_coords(), atol=1e-8, rtol=0):
        return "other coordinates"
    if mol.nao_nr() != saved.nao_nr() or gto.same_basis_set(mol, saved) is False:
        return "another basis"
    if (mol.charge, mol.spin) != (saved.charge, saved.spin):
        return f"its charge {saved.charge:+d} and 2S = {saved.spin}"
    if mol.nelectron != saved.nelectron or not _same_ecp(mol, saved):
        return "another ECP"
    return None


def _ecp_shells(mol) -> list:
    """``mol``'s ECP as numbers, free of where libcint keeps them: per ECP shell its atom,
    angular momentum, radial power, spin-orbit type, exponents and coefficients."""
    table = []
    for row in np.asarray(mol._ecpbas).reshape(-1, gto.BAS_SLOTS):
        atom, angular, nexp, power, so_type, p_exp, p_coeff = (int(x) for x in row[:7])
        table.append(((atom, angular, power, so_type), mol._env[p_exp:p_exp + nexp],
                      mol._env[p_coeff:p_coeff + nexp]))
    return sorted(table, key=lambda shell: shell[0])


def _same_ecp(mol, saved) -> bool:
    """Whether two molecules carry the same ECP (each ECP shell's numbers, :func:`_ecp_shells`):
    two ECPs can remove the same number of core electrons."""
    ours, theirs = _ecp_shells(mol), _ecp_shells(saved)
    return len(ours) == len(theirs) and all(
        a[0] == b[0] and a[1].shape == b[1].shape and np.allclose(a[1], b[1], rtol=1e-12, atol=0)
        and np.allclose(a[2], b[2], rtol=1e-12, atol=0) for a, b in zip(ours, theirs))


def restart_guess(mf, chkfile: str | None):
    """(dm0, record) for an SCF object from ``chkfile``: its saved orbitals' density when the
    file holds an SCF of the same molecule, basis and reference (dfmp2 writes one only when
    converged; :func:`_converged_checkpoint` then may skip the SCF), else (None, why not). A
    file of another system or reference is an :class:`InputError` (it would be overwritten).
    A checkpoint without dfmp2's record of its functional (PySCF's own) is a guess only: the
    record says so (:data:`KEPT_FOREIGN`) and the run leaves the file as it is."""
    if chkfile is None:
        return None, None
    if not os.path.exists(chkfile):
        return None, f"new chkfile {chkfile}"
    from pyscf import lib as pyscf_lib

    try:
        saved_mol, mo_coeff, mo_occ = read_checkpoint(chkfile)
        differs = _same_system(mf.mol, saved_mol)  # a damaged record fails here too
    except Exception as exc:  # h5py's and json's errors, a record of the wrong shape
        raise InputError(f"chkfile {chkfile!r} cannot be read as a PySCF SCF checkpoint "
                         f"({first_line(exc)}); remove it or choose another --chkfile") from None
    unrestricted = isinstance(mf, scf.uhf.UHF)
    if differs is None and mo_coeff.ndim == 2 and mo_coeff.shape[0] == 2 * mf.mol.nao_nr():
        differs = "another reference (generalised, GHF: spin orbitals over twice the basis)"
    if differs is None and (mo_coeff.ndim == 3) != unrestricted:
        differs = "another reference (restricted vs unrestricted)"
    if differs is None and not unrestricted and mf.mol.spin > 0 and not np.any(mo_occ == 1):
        differs = "another reference (RHF vs ROHF)"  # a singlet's ROHF is its RHF
    saved_xc = pyscf_lib.chkfile.load(chkfile, CHK_XC_KEY)  # None: not written by dfmp2
    if isinstance(saved_xc, bytes):
        saved_xc = saved_xc.decode()
    if differs is None and saved_xc is not None and not _same_functional(saved_xc,
                                                                         _functional_of(mf)):
        differs = f"another functional ({saved_xc} vs {_functional_of(mf)})"
    if differs is not None:
        raise InputError(f"chkfile {chkfile!r} holds another calculation ({differs}); remove it "
                         "or choose another --chkfile")
    damaged = _damaged_orbitals(mo_coeff, mo_occ, mf.mol.nao_nr(), 2 if unrestricted else 1)
    if damaged is not None:
        raise InputError(f"chkfile {chkfile!r} is damaged ({damaged}); remove it or choose "
                         "another --chkfile")
    if saved_xc is None:  # PySCF's own checkpoint: what it is of may not be this run
        return mf.make_rdm1(mo_coeff, mo_occ), (
            f"initial guess from chkfile {chkfile}; {KEPT_FOREIGN}")
    return mf.make_rdm1(mo_coeff, mo_occ), f"initial guess from chkfile {chkfile}"


#: How far a converged chkfile's orbitals may be from diagonalising the Fock matrix of their
#: density, ``|C^T F C - diag(saved orbital energies)|`` in Eh, in units of the run's orbital
#: gradient threshold, for the run to take them as they are (:func:`_converged_checkpoint`).
#: The saved orbitals diagonalise the previous cycle's Fock matrix: measured off by 0.2-0.9
#: times the gradient they converged to (4.4e-9 Eh for RHF water at 1.9e-8, 7.6e-7 Eh for a
#: UKS double hybrid of OH at 8.8e-7); orbitals mixed within the occupied space are off by
#: tenths of an Eh.
CANONICAL_FACTOR = 10


def _converged_checkpoint(mf, dm0, chkfile: str) -> str | None:
    """When dfmp2's ``chkfile`` of this system, whose orbitals' density :func:`restart_guess`
    made (``dm0``, tagged with them), holds an SCF converged to ``mf``'s tolerances, make it
    ``mf``'s converged SCF without a cycle: its orbitals, occupations and orbital energies as
    saved, and the energy of their density from one Fock build; returns what the check found.
    Converged is PySCF's test of a cycle: that energy within ``conv_tol`` of the saved one,
    the orbital gradient below ``conv_tol_grad``; and the saved orbitals must be what the
    SCF's own last step gives, which the MP2 step assumes:
    in ascending order of the saved orbital energies (frozen core takes the first), occupied
    as the SCF occupies them by those energies, and canonical with them (``C^T F C`` their
    diagonal matrix to :data:`CANONICAL_FACTOR` times ``conv_tol_grad``). Else (a looser SCF
    saved, orbitals reordered or mixed within the occupied or virtual space, other occupations,
    no orbital energies in the file) None, and ``mf`` is untouched: the saved orbitals are
    then the initial guess."""
    from pyscf.scf import hf

    mo_coeff, mo_occ = (own_attribute(dm0, key, None) for key in ("mo_coeff", "mo_occ"))
    try:  # the rest of the SCF record restart_guess read
        saved = {key: lib.chkfile.load(chkfile, f"scf/{key}") for key in ("e_tot", "mo_energy")}
    except Exception:  # read before the SCF; replaced since: the guess stands
        return None
    if any(value is None for value in (mo_coeff, mo_occ, *saved.values())):
        return None
    mo_energy, mo_coeff, mo_occ = (np.asarray(value, dtype=float) for value in
                                   (saved["mo_energy"], mo_coeff, mo_occ))
    e_saved = np.asarray(saved["e_tot"], dtype=float)
    if (mo_energy.shape != mo_occ.shape or e_saved.shape != ()
            or not (np.isfinite(mo_energy).all() and np.isfinite(e_saved))
            or np.any(np.diff(mo_energy, axis=-1) < 0)):
        return None
    try:
        occupied = np.asarray(mf.get_occ(mo_energy, mo_coeff), dtype=float)
    except Exception:  # PySCF's own refusal of these energies: the SCF iterates instead
        return None
    if occupied.shape != mo_occ.shape or not np.array_equal(occupied, mo_occ):
        return None
    h1e, s1e = mf.get_hcore(), mf.get_ovlp()
    vhf = mf.get_veff(mf.mol, dm0)
    e_tot = mf.energy_tot(dm0, h1e, vhf)
    fock = mf.get_fock(h1e, s1e, vhf, dm0)
    gradient = mf.get_grad(mo_coeff, mo_occ, fock)
    norm = float(np.linalg.norm(gradient))
    if not hf.TIGHT_GRAD_CONV_TOL:  # as PySCF's kernel measures it
        norm /= np.sqrt(gradient.size)
    change = float(e_tot - e_saved)
    if not (abs(change) < mf.conv_tol and norm < mf.conv_tol_grad):
        return None
    per_spin = zip(mo_coeff.reshape(-1, *mo_coeff.shape[-2:]),  # ROHF: its one effective Fock
                   np.reshape(fock, (-1, *np.shape(fock)[-2:])),
                   mo_energy.reshape(-1, mo_energy.shape[-1]))
    bound = CANONICAL_FACTOR * mf.conv_tol_grad
    if not all(np.abs(c.T @ f @ c - np.diag(e)).max() <= bound for c, f, e in per_spin):
        return None
    mf.mo_energy, mf.mo_coeff, mf.mo_occ = mo_energy, mo_coeff, mo_occ
    mf.e_tot, mf.converged, mf.cycles = float(e_tot), True, 0
    mf.solver = "none (the chkfile's SCF was converged)"
    return f"no SCF cycle: energy change {change:.1e} Eh, orbital gradient {norm:.1e}"


#: What the restart record says of a checkpoint dfmp2 did not write: its functional is not
#: recorded (a PySCF DFT checkpoint looks like an HF one), so it is a guess and not rewritten.
KEPT_FOREIGN = ("not written by dfmp2 (no record of its functional), so kept as it is and "
                "not rewritten")


#: The fields of a PySCF checkpoint's molecule record that ``pyscf.gto.loads`` passes to
#: ``eval`` (Python source in the file); :func:`read_checkpoint` leaves them out.
_EVALUATED_MOL_FIELDS = ("atom", "basis", "ecp", "pseudo")


def read_checkpoint(chkfile: str):
    """(molecule, mo_coeff, mo_occ) of a PySCF SCF checkpoint without running any of its text:
    PySCF's own reader passes parts of the molecule record to ``eval`` (and all of it when it
    is not JSON), so a file could run code. The molecule is rebuilt from the record's JSON
    fields (its libcint tables, the atoms and basis as PySCF parsed them, charge and 2S), which
    is what :func:`_same_system` compares. Raises ValueError for a missing record or one that
    is not JSON, OSError for a file that is not HDF5."""
    import json

    import h5py

    with h5py.File(chkfile, "r") as handle:
        if not isinstance(handle.get("mol"), h5py.Dataset):
            raise ValueError("no molecule record 'mol'")
        text = handle["mol"][()]
        if not isinstance(handle.get("scf"), h5py.Group):
            raise ValueError("no SCF record 'scf'")
    # PySCF's reader of datasets (no eval): a UHF's pair of arrays may be stored as a list
    orbitals = {key: lib.chkfile.load(chkfile, f"scf/{key}") for key in ("mo_coeff", "mo_occ")}
    missing = [f"scf/{key}" for key, value in orbitals.items() if value is None]
    if missing:
        raise ValueError(f"no {' or '.join(missing)}")
    mo_coeff, mo_occ = (np.asarray(orbitals[key]) for key in ("mo_coeff", "mo_occ"))
    record = json.loads(text.decode() if isinstance(text, bytes) else str(text))
    if not isinstance(record, dict):
        raise ValueError("the molecule record is not a JSON object")
    mol = gto.Mole()
    mol.__dict__.update({k: v for k, v in record.items() if k not in _EVALUATED_MOL_FIELDS})
    mol._atm = np.asarray(mol._atm, dtype=np.int32).reshape(-1, gto.ATM_SLOTS)
    mol._bas = np.asarray(mol._bas, dtype=np.int32).reshape(-1, gto.BAS_SLOTS)
    mol._env = np.asarray(mol._env, dtype=np.double)
    mol._ecpbas = np.asarray(mol._ecpbas, dtype=np.int32).reshape(-1, gto.BAS_SLOTS)
    if len(mol._atom) != mol.natm:
        raise ValueError(f"the molecule record lists {len(mol._atom)} atoms for {mol.natm}")
    return mol, mo_coeff, mo_occ


def _damaged_orbitals(mo_coeff: np.ndarray, mo_occ: np.ndarray, nao: int,
                      nspin: int) -> str | None:
    """What is wrong with a chkfile's saved orbitals for a molecule of ``nao`` functions, or
    None: (nspin, nao, nmo) / (nao, nmo) coefficients, occupations of the same length, every
    number finite."""
    shape = (nao,) if nspin == 1 else (nspin, nao)
    if mo_coeff.shape[:-1] != shape or mo_occ.shape != mo_coeff.shape[:-2] + mo_coeff.shape[-1:]:
        return (f"scf/mo_coeff {mo_coeff.shape} and scf/mo_occ {mo_occ.shape} do not fit "
                f"{nao} basis functions")
    if not (np.isfinite(mo_coeff).all() and np.isfinite(mo_occ).all()):
        return "its orbitals hold NaN or infinite numbers"
    return None


#: Where dfmp2 records the SCF's functional in its chkfile ("HF" for an HF reference).
CHK_XC_KEY = "dfmp2/xc"


def _functional_of(mf) -> str:
    return str(mf.xc) if isinstance(mf, dft.rks.KohnShamDFT) else "HF"


def _same_functional(saved: str, ours: str) -> bool:
    """Whether a chkfile's functional ``saved`` is ``ours`` however each is spelled: the same
    text but for case and spaces, or the same parts and weights as PySCF parses them ('PBE'
    and 'pbe', '0.5*HF+0.5*B88,LYP' and '0.5*HF + 0.5*B88, LYP')."""
    if "".join(saved.split()).upper() == "".join(ours.split()).upper():
        return True
    if "HF" in (saved, ours):  # an HF reference against a functional
        return False
    try:
        return dft.libxc.parse_xc(saved) == dft.libxc.parse_xc(ours)
    except Exception:  # a name PySCF no longer knows: another functional
        return False


def scf_fit_record(mf):
    """The JK-fit basis of a density-fitted SCF per element, or None for exact integrals;
    where the sets of an element's atoms differ, per label ('O1', 'O'), a ghost of the bare
    element as 'O (ghost)' and a labelled atom's ghost under its label ('GHOST-O1'). An
    even-tempered set that PySCF generated says so."""
    with_df = own_attribute(mf, "with_df", None)
    if with_df is None:
        return None
    spec = with_df.auxbasis
    if spec is None:
        with quiet_pyscf():
            spec = df.make_auxbasis(mf.mol, mp2fit=False)
    if isinstance(spec, str):
        return spec
    names = {str(label): value if isinstance(value, str) else "even-tempered (PySCF aug_etb)"
             for label, value in spec.items()}
    record = {}
    for label, name in names.items():
        symbol = element_of(label)
        if len({n for k, n in names.items() if element_of(k) == symbol}) == 1:
            key = symbol
        else:  # sets differ within the element: a ghost's, or labelled atoms' (O1 and O), each
            # under its own key (keyed by the element, the last label's set overwrote the first)
            # (a labelled atom's ghost, GHOST-O1, under its own label: 'O (ghost)' is GHOST-O's)
            bare_ghost = is_ghost_label(label) and unghosted(label) == symbol
            key = f"{symbol} (ghost)" if bare_ghost else label
            key = label if key in record else key
        record[key] = name
    return record
