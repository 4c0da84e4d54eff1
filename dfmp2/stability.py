"""Stability of a converged SCF: the lowest eigenvalues of its orbital-rotation Hessian.

A converged SCF is a stationary point of the energy among determinants; it is a minimum only
where the Hessian of the energy over orbital rotations has no negative eigenvalue. A saddle
point (a UHF of stretched H2 that kept the restricted solution, an open shell caught on the
wrong state) gives an MP2 energy of the wrong determinant with nothing in the SCF's own output
to say so. Two analyses, both on PySCF's Hessian-vector products (the SCF's own J/K, dfmp2's
:class:`dfmp2.jk.DFJK` included), by Davidson iterations:

* ``internal``: rotations within the reference's own kind (RHF, UHF, ROHF, RKS, UKS), from
  ``pyscf.soscf.newton_ah.gen_g_hop_*`` (the Hessian doubled as in PySCF's
  ``scf.stability``, whose eigenvalues it reproduces). A negative eigenvalue can be followed:
  the orbitals are rotated along its eigenvector and the SCF runs again from there
  (:func:`dfmp2.scf.run_scf` with ``stability='follow'``).
* ``rhf_to_uhf``: for a closed-shell RHF or RKS, the triplet rotations that break the spin
  symmetry: a negative eigenvalue means a UHF (UKS) determinant of lower energy exists, which a
  restricted run cannot reach.

Eigenvalues are in Hartree, as PySCF's stability analysis logs them; one below
:data:`UNSTABLE_BELOW` (PySCF's threshold) is an instability.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyscf import lib
from pyscf import scf as pyscf_scf
from pyscf.soscf import newton_ah

from ._names import STABILITY_MODES as MODES

__all__ = ["MODES", "UNSTABLE_BELOW", "Lowest", "analyse", "rotated_orbitals"]

#: A Hessian eigenvalue (Eh) below this is an instability: PySCF's own threshold.
UNSTABLE_BELOW = -1e-5
#: Lowest eigenvalues the Davidson iterations converge together. One: on (H2O)8 cc-pVDZ (RHF,
#: both analyses, AMD EPYC Zen 4) 51 Hessian products against 120 for two roots and 200 for
#: three (PySCF's default), the lowest eigenvalues the same to 1e-6 Eh.
NROOTS = 1
#: Davidson's tolerance on the eigenvalues (Eh; residuals to its square root): tighter than
#: PySCF's 1e-4, so that an eigenvalue is known to well within :data:`UNSTABLE_BELOW`.
DAVIDSON_TOL = 1e-6
#: Davidson iterations before an analysis is reported as not converged.
DAVIDSON_CYCLES = 100


@dataclass(frozen=True)
class Lowest:
    """The lowest eigenvalue (Eh) of one analysis, whether Davidson converged it, and its
    eigenvector (the rotation to follow; None for ``rhf_to_uhf``)."""

    eigenvalue: float
    converged: bool
    vector: np.ndarray | None = None

    @property
    def stable(self) -> bool:
        return not self.eigenvalue < UNSTABLE_BELOW

    def record(self) -> dict:
        return {"lowest_eigenvalue": self.eigenvalue, "stable": self.stable,
                "converged": self.converged}


def _kind(mf) -> str:
    """'rohf', 'uhf' or 'rhf' (RKS and UKS are RHF and UHF to PySCF; ROHF is an RHF too)."""
    if isinstance(mf, pyscf_scf.rohf.ROHF):
        return "rohf"
    if isinstance(mf, pyscf_scf.uhf.UHF):
        return "uhf"
    return "rhf"


def _lowest(hop, hdiag: np.ndarray, keep_vector: bool) -> Lowest:
    """The lowest eigenvalue of the symmetric operator ``hop`` (vectors of ``hdiag``'s length)
    by Davidson iterations, preconditioned by its diagonal ``hdiag``; the start vectors are the
    unit vectors of the three smallest diagonal elements and PySCF's ``1/hdiag`` vector (so a
    rotation that lowers the symmetry is in the space from the start)."""
    size = hdiag.size
    starts = []
    for index in np.argsort(hdiag, kind="stable")[:3]:
        unit = np.zeros(size)
        unit[index] = 1.0
        starts.append(unit)
    big = np.abs(hdiag) > 1e-8
    if big.any():
        inverse = np.zeros(size)
        inverse[big] = 1.0 / hdiag[big]
        starts.append(inverse / np.linalg.norm(inverse))
    nroots = min(NROOTS, size)

    def precond(dx, e, x0):
        shifted = hdiag - e
        shifted[np.abs(shifted) < 1e-8] = 1e-8
        return dx / shifted

    conv, e, v = lib.davidson1(lambda xs: [hop(x) for x in xs], starts, precond,
                               tol=DAVIDSON_TOL, max_cycle=DAVIDSON_CYCLES, nroots=nroots,
                               verbose=0)
    e, v, conv = np.atleast_1d(e), list(v), np.atleast_1d(conv)
    first = int(np.argmin(e))
    return Lowest(float(e[first]), bool(conv[first]),
                  np.asarray(v[first]) if keep_vector else None)


def internal(mf) -> Lowest:
    """The lowest eigenvalue of ``mf``'s Hessian over rotations within its own kind, with its
    eigenvector."""
    gen = {"rhf": newton_ah.gen_g_hop_rhf, "uhf": newton_ah.gen_g_hop_uhf,
           "rohf": newton_ah.gen_g_hop_rohf}[_kind(mf)]
    _, hop, hdiag = gen(mf, mf.mo_coeff, mf.mo_occ, with_symmetry=False)
    return _lowest(lambda x: hop(x).real * 2, np.asarray(hdiag).real * 2, keep_vector=True)


def rhf_to_uhf(mf) -> Lowest:
    """The lowest eigenvalue of a closed-shell RHF's (RKS's) Hessian over the triplet
    rotations (RHF -> UHF): the spin-flip-free orbital response with K only (and the triplet
    kernel of a functional), as PySCF's ``rhf_external`` builds it, without its real ->
    complex part."""
    mo, occ = np.asarray(mf.mo_coeff), np.asarray(mf.mo_occ)
    orbo, orbv = mo[:, occ == 2], mo[:, occ == 0]
    nocc, nvir = orbo.shape[1], orbv.shape[1]
    fock = mo.T @ mf.get_fock(dm=mf.make_rdm1(mo, occ)) @ mo
    foo, fvv = fock[occ == 2][:, occ == 2], fock[occ == 0][:, occ == 0]
    hdiag = (fvv.diagonal()[:, None] - foo.diagonal()[None, :]).ravel()
    response = mf.gen_response(singlet=False, hermi=1)

    def hop(x):
        x_vo = x.reshape(nvir, nocc)
        d_ao = orbv @ (2 * x_vo) @ orbo.T
        out = fvv @ x_vo - x_vo @ foo.T
        out += orbv.T @ response(d_ao + d_ao.T) @ orbo
        return out.ravel()

    return _lowest(hop, hdiag, keep_vector=False)


def analyse(mf) -> dict[str, Lowest]:
    """``{'internal': ...}`` for every converged SCF, with ``'rhf_to_uhf'`` for a closed-shell
    RHF or RKS."""
    found = {"internal": internal(mf)}
    if _kind(mf) == "rhf":
        found["rhf_to_uhf"] = rhf_to_uhf(mf)
    return found


def rotated_orbitals(mf, vector: np.ndarray):
    """``mf``'s orbitals rotated by ``exp(kappa)``, with kappa the antisymmetric
    occupied-virtual rotation of ``vector`` (an :func:`internal` eigenvector; for UHF the alpha
    rotations first, then the beta ones)."""
    def rotate(mo_coeff, mo_occ, dx):
        return np.asarray(mo_coeff) @ newton_ah.expmat(pyscf_scf.hf.unpack_uniq_var(dx, mo_occ))

    if _kind(mf) == "uhf":
        (occ_a, occ_b), (mo_a, mo_b) = mf.mo_occ, mf.mo_coeff
        nalpha = int(np.count_nonzero(occ_a > 0)) * int(np.count_nonzero(occ_a == 0))
        return np.stack([rotate(mo_a, occ_a, vector[:nalpha]),
                         rotate(mo_b, occ_b, vector[nalpha:])])
    return rotate(mf.mo_coeff, mf.mo_occ, vector)
