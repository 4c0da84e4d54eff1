"""Python API: ``run(geometry, ...) -> Result`` and the PySCF-shaped ``DFMP2(mf).run()``."""

from __future__ import annotations

import logging
import time

import numpy as np
from pyscf import scf as pyscf_scf

from .blocking import plan_blocks
from .energy import scs_energy
from .errors import ConvergenceError, InputError
from .integrals import frozen_mask, make_auxmol, orbital_space
from .linalg import DispatchPolicy, Dispatcher, numpy_ops
from .molecule import build_mole
from .options import Options
from .pipeline import PRECISION_DTYPES, StageTimer, dfmp2_pair_energies
from .results import Result, versions
from .scf import run_scf

log = logging.getLogger(__name__)

__all__ = ["run", "compute", "DFMP2"]


def run(geometry, progress=None, **options) -> Result:
    """DF-MP2 from a geometry: build the molecule, run the SCF, then the MP2 pipeline.

    geometry : xyz path, atom string or pyscf ``Mole``; options : fields of :class:`Options`
    (``basis``, ``auxbasis``, ``frozen_core``, ``backend``, ...); progress : optional callback
    ``progress(stage, done, total)``.
    """
    opts = Options.from_kwargs(**options)
    start = time.perf_counter()
    mol = build_mole(geometry, opts.basis, opts.charge, opts.spin)
    auxmol = make_auxmol(mol, opts.auxbasis)
    if opts.resolved_reference == "rhf" and mol.spin == 0:
        # catch a bad frozen list or a too small memory limit before the SCF runs
        nocc = mol.nelectron // 2
        _plan(mol, auxmol, np.array([2.0] * nocc + [0.0] * (mol.nao_nr() - nocc)), opts)
    mf = run_scf(mol, opts)
    return compute(mf, opts, progress=progress, scf_seconds=time.perf_counter() - start,
                   auxmol=auxmol)


def _plan(mol, auxmol, mo_occ, opts: Options):
    """The active-orbital mask and block plan for occupations ``mo_occ``."""
    active = frozen_mask(mol, mo_occ, opts.frozen, opts.frozen_core)
    occupied = mo_occ > 0
    nocc = int(np.count_nonzero(occupied & active))
    nvir = int(np.count_nonzero(~occupied & active))
    plan = plan_blocks(mol.nao_nr(), nocc, nvir, auxmol.nao_nr(), opts.max_memory,
                       b_itemsize=8 if opts.precision == "fp64" else 4,
                       force_outcore=opts.force_outcore)
    return active, plan


def _check_reference(mf) -> None:
    if not isinstance(mf, pyscf_scf.hf.RHF) or isinstance(mf, pyscf_scf.rohf.ROHF):
        raise InputError(
            f"DFMP2 needs a closed-shell RHF reference; got {type(mf).__name__} "
            "(UHF and ROHF references are not implemented yet)"
        )
    if mf.mo_coeff is None:
        raise InputError("the SCF object has no orbitals: run mf.kernel() first")
    if not mf.converged:
        raise ConvergenceError("the SCF object is not converged; DF-MP2 needs a converged SCF")


def _scf_auxbasis(mf):
    with_df = getattr(mf, "with_df", None)
    return None if with_df is None else with_df.auxbasis


def compute(mf, opts: Options, progress=None, scf_seconds: float | None = None,
            auxmol=None) -> Result:
    """The DF-MP2 step on a converged RHF object ``mf`` (the functional core behind the API)."""
    _check_reference(mf)
    mol = mf.mol
    timer = StageTimer()
    if scf_seconds is not None:
        timer.seconds["scf"] = scf_seconds
    auxmol = auxmol if auxmol is not None else make_auxmol(mol, opts.auxbasis)
    active, plan = _plan(mol, auxmol, mf.mo_occ, opts)
    space = orbital_space(mf.mo_coeff, mf.mo_energy, mf.mo_occ, active)
    la = Dispatcher(DispatchPolicy(opts.backend, opts.nki_simulator, opts.nki_emulator,
                                   opts.require_nki, opts.cpu_blas))
    kwargs = {"fused": opts.fused_energy, "timer": timer, "precision": opts.precision,
              "scratch_dir": opts.scratch_dir}
    if progress is not None:
        kwargs["progress"] = progress
    energies, factor = dfmp2_pair_energies(mol, auxmol, space, plan, la, **kwargs)
    nocc_total = int(np.count_nonzero(mf.mo_occ > 0))
    sizes = {
        "natom": mol.natm, "nbasis": mol.nao_nr(), "nmo": len(mf.mo_energy),
        "naux": auxmol.nao_nr(), "naux_fit": factor.naux_fit, "naux_dropped": factor.ndropped,
        "nocc": space.nocc, "nvir": space.nvir, "nalpha": nocc_total, "nbeta": nocc_total,
        "nfrozen": space.nfrozen_occ + space.nfrozen_vir,
        "nfrozen_occ": space.nfrozen_occ, "nfrozen_vir": space.nfrozen_vir,
        "npairs": energies.npairs,
    }
    method = {
        "reference": "rhf", "basis": _basis_name(mol.basis), "auxbasis": _basis_name(
            opts.auxbasis or auxmol.basis),
        "scf_type": "df" if _scf_auxbasis(mf) is not None else "conv",
        "scf_auxbasis": _basis_name(_scf_auxbasis(mf)), "fused_energy": opts.fused_energy,
        "precision": opts.precision,
        "nki_precision": "fp32 on the device, fp64 host sums" if la.backend == "nki" else None,
        "os_scale": opts.os_scale, "ss_scale": opts.ss_scale,
        "metric": "cholesky" if factor.lower is not None else "eigh",
        "blocks": plan.as_dict(), "max_memory_mb": opts.max_memory,
    }
    backend = {"requested": opts.backend, "resolved": la.backend, "nki_mode": la.nki_mode,
               "resolution": la.resolution, "ops": la.summary(),
               "cpu_blas": la.cpu_blas.as_dict()}
    if la.backend == "pytorch" and la.cpu_blas.choice == "numpy" and opts.fused_energy:
        backend["cpu_blas"]["pair_reduction"] = numpy_ops.pair_reduction(
            PRECISION_DTYPES[opts.precision][1])
    molecule = {
        "symbols": [mol.atom_pure_symbol(k) for k in range(mol.natm)],
        "geometry": mol.atom_coords(unit="Bohr").ravel().tolist(),
        "molecular_charge": mol.charge, "molecular_multiplicity": mol.spin + 1,
    }
    return Result(
        e_hf=float(mf.e_tot), e_corr_os=energies.e_os, e_corr_ss=energies.e_ss, e_singles=0.0,
        e_scs=scs_energy(energies.e_os, energies.e_ss, opts.os_scale, opts.ss_scale),
        sizes=sizes, method=method, backend=backend,
        timings={k: round(v, 4) for k, v in timer.seconds.items()},
        versions=versions(), molecule=molecule,
    )


def _basis_name(basis):
    """A readable name for a PySCF basis spec (a name, or a per-element dict of names)."""
    if basis is None or isinstance(basis, str):
        return basis
    if isinstance(basis, dict):
        names = sorted({v for v in basis.values() if isinstance(v, str)})
        return names[0] if len(names) == 1 else ", ".join(names) if names else "custom"
    return "custom"


class DFMP2:
    """PySCF-shaped DF-MP2 for a converged RHF object.

    >>> pt = dfmp2.DFMP2(mf, frozen=1, auxbasis="cc-pvdz-ri").run()
    >>> pt.e_corr, pt.e_corr_os, pt.e_corr_ss, pt.e_tot

    ``frozen`` follows PySCF (an int, or a list of MO indices); other keyword arguments are
    :class:`Options` fields (``backend``, ``fused_energy``, ``max_memory``, ...), also accepted by
    :meth:`run` and :meth:`kernel` to override per call.
    """

    def __init__(self, mf, frozen=None, auxbasis=None, **options):
        self._scf = mf
        self.mol = mf.mol
        self.frozen = frozen
        self.auxbasis = auxbasis
        self.options = options
        self.result: Result | None = None
        self.e_corr = self.e_corr_os = self.e_corr_ss = None

    @property
    def e_hf(self) -> float:
        return float(self._scf.e_tot)

    @property
    def e_tot(self) -> float:
        return self.e_hf + self.e_corr

    @property
    def e_scs(self) -> float:
        return self.result.e_scs

    emp2 = property(lambda self: self.e_corr)

    def kernel(self, **options):
        """Compute and return ``(e_corr, None)`` (PySCF returns ``(e_corr, t2)``; t2 is never
        stored here)."""
        merged = {**self.options, **options}
        frozen = merged.pop("frozen", self.frozen)
        opts = Options.from_kwargs(frozen=frozen, auxbasis=merged.pop("auxbasis", self.auxbasis),
                                   **merged)
        self.result = compute(self._scf, opts)
        self.e_corr = self.result.e_corr
        self.e_corr_os = self.result.e_corr_os
        self.e_corr_ss = self.result.e_corr_ss
        log.info("E(DF-MP2) = %.12f  E_corr = %.12f", self.e_tot, self.e_corr)
        return self.e_corr, None

    def run(self, **options) -> "DFMP2":
        self.kernel(**options)
        return self
