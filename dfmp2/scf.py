"""The reference SCF through PySCF: RHF, UHF or ROHF, density-fitted (JK-fit basis) or with
exact integrals."""

from __future__ import annotations

import logging

from pyscf import df, scf
from pyscf.lib.exceptions import BasisNotFoundError

from .errors import ConvergenceError, InputError
from .molecule import element_of, first_line, quiet_pyscf
from .options import Options

log = logging.getLogger(__name__)

__all__ = ["run_scf", "jk_auxbasis", "scf_fit_record"]


def jk_auxbasis(mol, options: Options):
    """The JK-fit basis of a DF-SCF: the user's choice or PySCF's partner of the orbital basis."""
    if options.scf_auxbasis:
        return options.scf_auxbasis
    with quiet_pyscf():
        return df.make_auxbasis(mol, mp2fit=False)


def run_scf(mol, options: Options):
    """Run and return a converged SCF object for ``mol``.

    ``options.resolved_reference``: 'rhf' (2S = 0 only), 'uhf' or 'rohf'. A non-converged SCF
    raises :class:`ConvergenceError`: no MP2 energy is computed from it.
    """
    reference = options.resolved_reference
    if reference == "rhf" and mol.spin != 0:
        raise InputError(f"an RHF reference needs 2S = 0, got 2S = {mol.spin}; use --reference "
                         "uhf or rohf for an open shell")
    mf = {"rhf": scf.RHF, "uhf": scf.UHF, "rohf": scf.ROHF}[reference](mol)
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
    mf.callback = _log_cycle
    mf.kernel()
    if not mf.converged:
        raise ConvergenceError(
            f"the {options.scf_type.upper()}-{reference.upper()} did not converge in {options.max_cycle} cycles "
            f"(last energy {mf.e_tot:.10f} Eh); raise --max-cycle or check the geometry"
        )
    log.info("SCF converged: E = %.12f Eh", mf.e_tot)
    return mf


def _log_cycle(envs: dict) -> None:
    """PySCF's per-iteration callback: one DEBUG line per SCF cycle (shown by ``dfmp2 -vv``)."""
    log.debug("SCF cycle %2d  E = %.12f Eh  |g| = %.2e", envs["cycle"] + 1, envs["e_tot"],
              envs.get("norm_gorb", float("nan")))


def scf_fit_record(mf):
    """The JK-fit basis of a density-fitted SCF per element (ghost atoms under their element;
    a ghost's entry names itself when it differs from the real atom's), or None for exact
    integrals. An even-tempered set that PySCF generated says so."""
    with_df = getattr(mf, "with_df", None)
    if with_df is None:
        return None
    spec = with_df.auxbasis
    if spec is None:
        with quiet_pyscf():
            spec = df.make_auxbasis(mf.mol, mp2fit=False)
    if isinstance(spec, str):
        return spec
    record = {}
    for label, value in spec.items():
        name = value if isinstance(value, str) else "even-tempered (PySCF aug_etb)"
        symbol = element_of(str(label))
        key = symbol if record.get(symbol, name) == name else f"{symbol} (ghost)"
        record[key] = name
    return record
