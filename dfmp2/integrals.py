"""The PySCF integral boundary: auxiliary basis, metric, int3c2e blocks, orbital partition.

Nothing here holds the whole ``(nao, nao, naux)`` tensor: :func:`iter_int3c2e` yields blocks of
whole auxiliary shells.
"""

from __future__ import annotations

import inspect

import numpy as np
from pyscf import df, gto, lib
from pyscf.gto import moleintor
from pyscf.lib.exceptions import BasisNotFoundError

from .errors import InputError
from .molecule import (
    basis_record,
    check_every_atom_has_functions,
    describe_shells,
    element_of,
    first_line,
    ghost_basis,
    quiet_pyscf,
)

__all__ = [
    "INT3C_EXPCUTOFF",
    "aux_shell_blocks",
    "auxbasis_record",
    "iter_int3c2e",
    "make_auxmol",
    "metric",
    "resolve_auxbasis",
    "unpack_pairs",
]


#: libcint's primitive screening for int3c2e: primitive pairs whose Gaussian product prefactor
#: is below exp(-INT3C_EXPCUTOFF) are skipped (libcint's default is 60). Measured on (H2O)20
#: cc-pVDZ: int3c2e 11% faster at 40, largest change of an integral 4e-19 (2e-14 at 30).
INT3C_EXPCUTOFF = 40


#: Advice when PySCF has no MP2-fit partner for the orbital basis or cannot build the one named.
_AUX_ADVICE = ("choose one with --auxbasis (Python: auxbasis=), e.g. cc-pvtz-ri or def2-tzvpp-ri "
               "(MP2-fit sets), or def2-universal-jkfit")
_AUX_ERRORS = (BasisNotFoundError, KeyError, RuntimeError, ValueError, TypeError, IndexError,
               AttributeError, AssertionError)


def _quiet_copy(mol):
    """A shallow copy of ``mol`` that logs nothing (PySCF writes its logs to ``mol.stdout``)."""
    quiet = mol.copy(deep=False)
    quiet.verbose = 0
    return quiet


def resolve_auxbasis(mol, auxbasis=None):
    """The auxiliary basis input handed to PySCF: ``auxbasis`` itself, or, when None, PySCF's
    MP2-fit partner of the orbital basis per atom label (``df.make_auxbasis(mol, mp2fit=True)``:
    a name, or even-tempered shells for elements the named RI set lacks)."""
    if auxbasis is not None:
        return ghost_basis(auxbasis, [a[0] for a in mol._atom])
    try:
        with quiet_pyscf():
            return df.make_auxbasis(_quiet_copy(mol), mp2fit=True)
    except _AUX_ERRORS as exc:
        raise InputError(
            f"no default RI auxiliary basis for basis {_basis_text(mol)} "
            f"(PySCF: {type(exc).__name__}: {first_line(exc)}); {_AUX_ADVICE}"
        ) from None


def _basis_text(mol) -> str:
    names = sorted(set(basis_record(mol).values()))
    return repr(names[0]) if len(names) == 1 else "(" + "; ".join(names) + ")"


def _etb_description() -> str:
    """How PySCF's ``aug_etb`` fills elements a named RI set lacks, with the beta it uses."""
    beta = inspect.signature(df.addons.aug_etb).parameters["beta"].default
    return f"even-tempered (PySCF aug_etb, beta={beta})"


def auxbasis_record(mol, auxbasis=None) -> dict[str, str]:
    """The MP2 auxiliary basis per element as :func:`make_auxmol` resolves it (ghost atoms under
    their element): a name, ``'even-tempered (PySCF aug_etb, beta=2.0)'`` where PySCF's default
    generated the functions, or ``'user-given data [..]'`` for explicit shells."""
    spec = resolve_auxbasis(mol, auxbasis)
    names: dict[str, list[str]] = {}
    for label in sorted({a[0] for a in mol._atom}):
        value = spec.get(label, spec.get("default")) if isinstance(spec, dict) else spec
        if isinstance(value, str):
            name = value
        elif auxbasis is None:
            name = _etb_description()
        else:
            name = describe_shells(value)
        entry = names.setdefault(element_of(label), [])
        if name not in entry:
            entry.append(name)
    return {element: ", ".join(entry) for element, entry in sorted(names.items())}


def make_auxmol(mol, auxbasis=None):
    """The auxiliary molecule of the MP2 fit: ``auxbasis`` (a name, or a dict per element) or,
    when None, PySCF's MP2-fit partner of mol's basis (:func:`auxbasis_record` says which).
    Every PySCF failure becomes one :class:`InputError` line naming ``--auxbasis``."""
    spec = resolve_auxbasis(mol, auxbasis)
    try:
        with quiet_pyscf():
            auxmol = df.addons.make_auxmol(_quiet_copy(mol), spec)
    except BasisNotFoundError as exc:
        raise InputError(
            f"auxiliary basis {_aux_text(auxbasis, spec)}: {first_line(exc)}; {_AUX_ADVICE}"
        ) from None
    except _AUX_ERRORS as exc:
        raise InputError(
            f"auxiliary basis {_aux_text(auxbasis, spec)} could not be built (PySCF: "
            f"{type(exc).__name__}: {first_line(exc)}); {_AUX_ADVICE}"
        ) from None
    check_every_atom_has_functions(
        auxmol, f"the auxiliary basis {_aux_text(auxbasis, spec)}",
        "give an auxiliary basis for every element (a name, or a dict with every element)")
    auxmol.verbose = mol.verbose
    return auxmol


def _aux_text(auxbasis, spec) -> str:
    if auxbasis is None:
        names = sorted({v for v in spec.values() if isinstance(v, str)})
        return f"{', '.join(names) or 'generated'} (PySCF's default for the orbital basis)"
    return repr(auxbasis)


def metric(auxmol) -> np.ndarray:
    """The Coulomb metric ``J_PQ = (P|Q)``, (naux, naux) float64."""
    return auxmol.intor("int2c2e", hermi=1)


def aux_shell_blocks(auxmol, max_functions: int) -> list[tuple[int, int, int, int]]:
    """Group auxiliary shells into blocks of at most ``max_functions`` functions (a block holds at
    least one whole shell). Returns (shell0, shell1, p0, p1) per block."""
    offsets = auxmol.ao_loc_nr()
    blocks, start = [], 0
    for shell in range(auxmol.nbas):
        if shell > start and offsets[shell + 1] - offsets[start] > max_functions:
            blocks.append((start, shell, offsets[start], offsets[shell]))
            start = shell
    blocks.append((start, auxmol.nbas, offsets[start], offsets[auxmol.nbas]))
    return blocks


def iter_int3c2e(mol, auxmol, max_functions: int):
    """Yield ``(p0, p1, packed)`` for blocks of whole auxiliary shells, where
    ``packed[P - p0, mu*(mu+1)/2 + nu] = (mu nu|P)`` for ``mu >= nu``: shape
    (p1 - p0, nao*(nao+1)/2), float64, C-contiguous (:func:`unpack_pairs` gives the square).

    One libcint optimiser serves every block, and every block is written into one reused buffer
    (fresh arrays of this size cost page faults comparable to the integrals on some hosts): a
    yielded block is valid until the next one is requested."""
    pmol = mol + auxmol
    if not pmol._env[gto.PTR_EXPCUTOFF]:  # unset (0): libcint's default; a user's value stays
        pmol._env[gto.PTR_EXPCUTOFF] = INT3C_EXPCUTOFF  # pmol is new: mol keeps its own _env
    intor = pmol._add_suffix("int3c2e")
    atm, bas, env = pmol._atm, pmol._bas, pmol._env
    ao_loc = moleintor.make_loc(bas, intor)
    cintopt = moleintor.make_cintopt(atm, bas, env, intor)
    nbas, nao = mol.nbas, mol.nao_nr()
    npair = nao * (nao + 1) // 2
    blocks = aux_shell_blocks(auxmol, max_functions)
    packed = np.empty(max(p1 - p0 for _, _, p0, p1 in blocks) * npair)
    for shell0, shell1, p0, p1 in blocks:
        shls_slice = (0, nbas, 0, nbas, nbas + shell0, nbas + shell1)
        j3c = moleintor.getints3c(intor, atm, bas, env, shls_slice, 1, "s2ij", ao_loc, cintopt,
                                  out=packed[: (p1 - p0) * npair])  # (npair, P), F-order
        yield p0, p1, j3c.T


def unpack_pairs(packed: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Square symmetric blocks ``out[P, mu, nu]`` (n, nao, nao) from rows of
    :func:`iter_int3c2e`'s packed block (n, nao*(nao+1)/2). Runs in the calling thread only:
    an OpenMP pool woken between two BLAS calls competes with the BLAS's spinning workers."""
    with lib.with_omp_threads(1):
        return lib.unpack_tril(packed, out=out)
