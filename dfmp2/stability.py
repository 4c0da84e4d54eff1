"""Stability of a converged SCF: the lowest eigenvalues of its orbital-rotation Hessian.

A converged SCF is a stationary point of the energy among determinants; it is a minimum only
where the Hessian of the energy over orbital rotations has no negative eigenvalue. A saddle
point (a UHF of stretched H2 that kept the restricted solution, an open shell caught on the
wrong state) gives an MP2 energy of the wrong determinant with nothing in the SCF's own output
to say so. Two analyses, both on PySCF's Hessian-vector products (the SCF's own J/K, dfmp2's
:class:`dfmp2.jk.DFJK` included), by Davidson iterations:

* ``internal``: rotations within the reference's own kind (RHF, UHF, ROHF, RKS, UKS), from
  ``pyscf.soscf.newton_ah.gen_g_hop_*`` (the Hessian doubled as in PySCF's
  ``scf.stability``, whose eigenvalues it computes). A negative eigenvalue can be followed:
  the orbitals are rotated along its eigenvector and the SCF runs again from there
  (:func:`settle`).
* ``rhf_to_uhf``: for a closed-shell RHF or RKS, the triplet rotations that break the spin
  symmetry: a negative eigenvalue means a UHF (UKS) determinant of lower energy exists, which a
  restricted run cannot reach.

Eigenvalues are in Hartree, as PySCF's stability analysis logs them; one below the
reference's threshold (:func:`threshold`) is an instability.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
from pyscf import dft, lib
from pyscf import scf as pyscf_scf
from pyscf.soscf import newton_ah

from .reference import own_attribute

log = logging.getLogger(__name__)

__all__ = ["UNSTABLE_BELOW", "UNSTABLE_BELOW_KS", "Lowest", "analyse", "rotated_orbitals",
           "settle", "threshold"]

#: A Hessian eigenvalue (Eh) below this is an instability of an HF reference: PySCF's own
#: threshold.
UNSTABLE_BELOW = -1e-5
#: The same for a Kohn-Sham reference, whose DFT grid is not invariant under rotations: the
#: rotation that moves the hole among the degenerate Pi orbitals of OH (UKS, B2PLYP's KS part,
#: cc-pVDZ) has the eigenvalue 0 exactly but -1.6e-5 Eh on PySCF's grid level 3 and -4e-5 on
#: level 1, and following it lowers the energy by 2e-7 Eh; a real instability is far below.
UNSTABLE_BELOW_KS = -1e-4
#: Lowest eigenvalues the Davidson iterations converge together, from :data:`START_UNITS`
#: unit start vectors. A Hessian of a symmetric molecule is block diagonal, and the rotations
#: whose diagonal elements are smallest may all lie in a block without its lowest eigenvalue:
#: on 30 SCFs of small symmetric molecules (O2, C2, B2, O3, cyclobutadiene, an H6 ring; RHF,
#: UHF, ROHF; 6-31G) against their dense Hessians, one root from 3 unit vectors missed the
#: lowest eigenvalue 5 times (C2's UHF: -0.311 for -0.468 Eh), one root from 10 once, two
#: roots from 10 never; the analyses of (H2O)8 cc-pVDZ's RHF then took 139 Hessian products
#: against 48.
NROOTS = 2
START_UNITS = 10
#: Davidson's tolerance on the eigenvalues (Eh; residuals to its square root): tighter than
#: PySCF's 1e-4, so that an eigenvalue is known to well within :data:`UNSTABLE_BELOW`.
DAVIDSON_TOL = 1e-6
#: Davidson iterations before an analysis is reported as not converged.
DAVIDSON_CYCLES = 100
#: Internal instabilities :func:`settle` follows before it reports the SCF as still unstable.
MAX_FOLLOWS = 5
#: A followed SCF that does not end this many conv_tol below the energy it left has not
#: lowered it: the solution it left is kept.
LOWERED_BY_CONV_TOL = 10


@dataclass(frozen=True)
class Lowest:
    """The lowest eigenvalue (Eh) of one analysis (None where there is no rotation: an atom in
    a minimal basis has no virtual orbital), whether Davidson converged it, the threshold of
    an instability, and the eigenvector (the rotation to follow; None for ``rhf_to_uhf``)."""

    eigenvalue: float | None
    converged: bool
    below: float
    vector: np.ndarray | None = None

    @property
    def stable(self) -> bool:
        return self.eigenvalue is None or not self.eigenvalue < self.below

    def record(self) -> dict:
        return {"lowest_eigenvalue": self.eigenvalue, "stable": self.stable,
                "converged": self.converged, "threshold": self.below}


def _kind(mf) -> str:
    """'rohf', 'uhf' or 'rhf' (RKS and UKS are RHF and UHF to PySCF; ROHF is an RHF too)."""
    if isinstance(mf, pyscf_scf.rohf.ROHF):
        return "rohf"
    if isinstance(mf, pyscf_scf.uhf.UHF):
        return "uhf"
    return "rhf"


def threshold(mf) -> float:
    """The eigenvalue (Eh) below which ``mf`` is unstable: :data:`UNSTABLE_BELOW`, or
    :data:`UNSTABLE_BELOW_KS` for a Kohn-Sham reference."""
    return UNSTABLE_BELOW_KS if isinstance(mf, dft.rks.KohnShamDFT) else UNSTABLE_BELOW


def _lowest(hop, hdiag: np.ndarray, below: float, keep_vector: bool, report=None) -> Lowest:
    """The lowest eigenvalue of the symmetric operator ``hop`` (vectors of ``hdiag``'s length)
    by Davidson iterations (:data:`NROOTS` roots), preconditioned by its diagonal ``hdiag``,
    from the unit vectors of the :data:`START_UNITS` smallest diagonal elements and PySCF's
    ``1/hdiag`` vector; ``report(iteration, lowest so far)`` after each iteration when
    given."""
    size = hdiag.size
    if size == 0:
        return Lowest(None, True, below)
    starts = []
    for index in np.argsort(hdiag, kind="stable")[:START_UNITS]:
        unit = np.zeros(size)
        unit[index] = 1.0
        starts.append(unit)
    big = np.abs(hdiag) > 1e-8
    if big.any() and size > START_UNITS:
        inverse = np.zeros(size)
        inverse[big] = 1.0 / hdiag[big]
        starts.append(inverse / np.linalg.norm(inverse))

    def precond(dx, e, x0):
        shifted = hdiag - e
        shifted[np.abs(shifted) < 1e-8] = 1e-8
        return dx / shifted

    def callback(envs: dict) -> None:
        report(envs["icyc"] + 1, float(np.min(envs["e"])))

    conv, e, v = lib.davidson1(lambda xs: [hop(x) for x in xs], starts, precond,
                               tol=DAVIDSON_TOL, max_cycle=DAVIDSON_CYCLES,
                               nroots=min(NROOTS, size), verbose=0,
                               callback=None if report is None else callback)
    e, conv = np.atleast_1d(e), np.atleast_1d(conv)
    first = int(np.argmin(e))
    return Lowest(float(e[first]), bool(conv[first]), below,
                  np.asarray(v[first]) if keep_vector else None)


def internal(mf, report=None) -> Lowest:
    """The lowest eigenvalue of ``mf``'s Hessian over rotations within its own kind, with its
    eigenvector (``report`` as in :func:`_lowest`)."""
    gen = {"rhf": newton_ah.gen_g_hop_rhf, "uhf": newton_ah.gen_g_hop_uhf,
           "rohf": newton_ah.gen_g_hop_rohf}[_kind(mf)]
    _, hop, hdiag = gen(mf, mf.mo_coeff, mf.mo_occ, with_symmetry=False)
    return _lowest(lambda x: hop(x).real * 2, np.asarray(hdiag).real * 2, threshold(mf),
                   keep_vector=True, report=report)


def rhf_to_uhf(mf, report=None) -> Lowest:
    """The lowest eigenvalue of a closed-shell RHF's (RKS's) Hessian over the triplet
    rotations (RHF -> UHF): the orbital response with K only (and the triplet kernel of a
    functional), as PySCF's ``rhf_external`` builds it, without its real -> complex part."""
    mo, occ = np.asarray(mf.mo_coeff), np.asarray(mf.mo_occ)
    orbo, orbv = mo[:, occ == 2], mo[:, occ == 0]
    nocc, nvir = orbo.shape[1], orbv.shape[1]
    if nocc * nvir == 0:
        return Lowest(None, True, threshold(mf))
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

    return _lowest(hop, hdiag, threshold(mf), keep_vector=False, report=report)


def analyse(mf, progress=None) -> dict[str, Lowest]:
    """``{'internal': ...}`` for every converged SCF, with ``'rhf_to_uhf'`` for a closed-shell
    RHF or RKS; each Davidson iteration reported to ``progress(stage, iteration,
    DAVIDSON_CYCLES)`` when given."""
    def report(name: str):
        if progress is None:
            return None
        return lambda iteration, lowest: progress(
            f"SCF stability ({name}) lowest eigenvalue {lowest:.6f}", iteration,
            DAVIDSON_CYCLES)

    found = {"internal": internal(mf, report("internal"))}
    if _kind(mf) == "rhf":
        found["rhf_to_uhf"] = rhf_to_uhf(mf, report("RHF -> UHF"))
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


#: The attributes of a converged SCF object that a followed SCF replaces (and that are put
#: back when it did not lower the energy).
_SOLUTION = ("mo_coeff", "mo_occ", "mo_energy", "e_tot", "converged", "cycles", "solver")


def settle(mf, follow: bool, rerun, label: str, progress=None) -> dict:
    """The stability analysis of the converged SCF ``mf`` (its record: ``extras.scf.stability``
    less ``mode``), with every instability it leaves, and an analysis that did not converge,
    a warning. With ``follow``, each internal instability is followed: ``rerun(mf, dm0, k)``
    converges the SCF again from the density of the orbitals rotated along its eigenvector (k:
    the follow's number; it raises when that SCF does not converge), until the SCF is stable,
    :data:`MAX_FOLLOWS` times, or a followed SCF that does not lower the energy (by
    :data:`LOWERED_BY_CONV_TOL` conv_tol), whose solution is then dropped for the one it left.
    ``mf.cycles`` counts every SCF's cycles; ``label`` names the SCF in messages; ``progress``
    as in :func:`analyse`."""
    start = time.perf_counter()
    jk = own_attribute(mf, "with_df", None)
    calls = getattr(jk, "stats", {}).get("calls")
    follows: list[dict] = []
    found = _analysed(mf, progress)
    while follow and not found["internal"].stable and len(follows) < MAX_FOLLOWS:
        left = {name: own_attribute(mf, name, None) for name in _SOLUTION}
        eigenvalue = found["internal"].eigenvalue
        log.info("SCF: following the internal instability (eigenvalue %.6f Eh) from E = "
                 "%.12f Eh", eigenvalue, mf.e_tot)
        rotated = rotated_orbitals(mf, found["internal"].vector)
        rerun(mf, mf.make_rdm1(rotated, mf.mo_occ), len(follows) + 1)
        lowered = bool(mf.e_tot < left["e_tot"] - LOWERED_BY_CONV_TOL * mf.conv_tol)
        follows.append({"eigenvalue": eigenvalue, "from_energy": float(left["e_tot"]),
                        "energy": float(mf.e_tot), "cycles": int(mf.cycles),
                        "lowered": lowered})
        cycles = left["cycles"] + mf.cycles
        if not lowered:  # the solution it left stays, with its analysis
            for name, value in left.items():
                setattr(mf, name, value)
            mf.cycles = cycles
            break
        # what converged each SCF, and for how many cycles: they add up to mf.cycles
        mf.solver = (left["solver"]
                     + (f" for {left['cycles']} cycles" if left["solver"] == "DIIS (PySCF)"
                        else "")
                     + f"; after following instability {len(follows)}: {mf.solver}"
                     + (f" for {mf.cycles} cycles" if mf.solver == "DIIS (PySCF)" else ""))
        mf.cycles = cycles
        found = _analysed(mf, progress)
    _warn(label, found, follows)
    record = {**{name: lowest.record() for name, lowest in found.items()}, "follows": follows,
              "seconds": time.perf_counter() - start}
    if calls is not None:
        record["jk_builds"] = jk.stats["calls"] - calls
    return record


def _analysed(mf, progress) -> dict[str, Lowest]:
    """:func:`analyse`, each eigenvalue logged."""
    found = analyse(mf, progress)
    for name, lowest in found.items():
        if lowest.eigenvalue is not None:
            log.info("SCF stability (%s): lowest Hessian eigenvalue %.6f Eh (%s)", name,
                     lowest.eigenvalue, "stable" if lowest.stable else "unstable")
    return found


def _warn(label: str, found: dict, follows: list[dict]) -> None:
    """One warning for each instability :func:`settle` leaves, and for an analysis whose
    Davidson iterations did not converge."""
    internal_lowest = found["internal"]
    if not internal_lowest.stable:
        what = (f"the {label} is a saddle point, not a minimum: its lowest internal Hessian "
                f"eigenvalue is {internal_lowest.eigenvalue:.6f} Eh")
        if not follows:
            log.warning("%s, so a lower %s solution exists and this run's energies are the "
                        "saddle point's; --stability follow (stability='follow') goes on to it",
                        what, label)
        elif not follows[-1]["lowered"]:
            log.warning("%s, and the SCF that followed it ended at E = %.10f Eh, not below "
                        "the %.10f Eh it left: this run keeps the saddle point; try another "
                        "--guess", what, follows[-1]["energy"], follows[-1]["from_energy"])
        else:
            log.warning("%s after following %d instabilities", what, len(follows))
    triplet = found.get("rhf_to_uhf")
    if triplet is not None and not triplet.stable:
        unrestricted = label.replace("RHF", "UHF").replace("RKS", "UKS")
        kinds = "RKS -> UKS" if "RKS" in label else "RHF -> UHF"
        log.warning("the %s is unstable towards %s: its lowest %s Hessian eigenvalue is %.6f "
                    "Eh, so a spin-polarised determinant of lower energy exists (a stretched "
                    "bond, a diradical); for its energies run --reference uhf --stability "
                    "follow (reference='uhf', stability='follow'; a KS reference then runs "
                    "UKS)", label, unrestricted, kinds, triplet.eigenvalue)
    for name, lowest in found.items():
        if not lowest.converged:
            log.warning("the %s stability analysis (%s) did not converge in %d Davidson "
                        "iterations; its lowest eigenvalue %.6f Eh is not settled", label, name,
                        DAVIDSON_CYCLES, lowest.eigenvalue)

