"""The reference SCF through PySCF: RHF, density-fitted (JK-fit basis) or with exact integrals."""

from __future__ import annotations

import logging

from pyscf import df, scf
from pyscf.lib.exceptions import BasisNotFoundError

from .errors import ConvergenceError, InputError
from .molecule import first_line, quiet_pyscf
from .options import Options

log = logging.getLogger(__name__)

__all__ = ["run_scf", "jk_auxbasis"]


def jk_auxbasis(mol, options: Options):
    """The JK-fit basis of a DF-SCF: the user's choice or PySCF's partner of the orbital basis."""
    return options.scf_auxbasis or df.make_auxbasis(mol, mp2fit=False)


def run_scf(mol, options: Options):
    """Run and return a converged SCF object for ``mol``.

    Only closed-shell RHF is implemented; other references raise :class:`InputError`. A
    non-converged SCF raises :class:`ConvergenceError`: no MP2 energy is computed from it.
    """
    reference = options.resolved_reference
    if reference != "rhf" or mol.spin != 0:
        raise InputError(
            f"only closed-shell RHF references are implemented (got reference {reference!r}, "
            f"2S = {mol.spin}); open shells (UHF, ROHF-MBPT(2)) are not available yet"
        )
    mf = scf.RHF(mol)
    if options.scf_type == "df":
        auxbasis = jk_auxbasis(mol, options)
        mf = mf.density_fit(auxbasis=auxbasis)
        try:
            with quiet_pyscf():
                mf.with_df.build()
        except BasisNotFoundError as exc:
            raise InputError(f"SCF fitting basis {auxbasis!r}: {first_line(exc)}") from None
    mf.conv_tol = options.conv_tol
    mf.conv_tol_grad = options.conv_tol_grad
    mf.max_cycle = options.max_cycle
    mf.verbose = 0
    mf.kernel()
    if not mf.converged:
        raise ConvergenceError(
            f"the {options.scf_type.upper()}-RHF did not converge in {options.max_cycle} cycles "
            f"(last energy {mf.e_tot:.10f} Eh); raise --max-cycle or check the geometry"
        )
    log.info("SCF converged: E = %.12f Eh", mf.e_tot)
    return mf
