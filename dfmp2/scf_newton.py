"""Newton-Raphson steps of an SCF near a stationary point: the last resort of a stalled DIIS
(:func:`dfmp2.scf._second_order`), where PySCF's augmented-Hessian solver takes no step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse.linalg import LinearOperator, minres

__all__ = ["MINRES_CYCLES", "MIN_GAIN", "Steps", "newton_raphson"]

#: Hessian products (one J/K build each) of the MINRES solve of one step. The stretched water
#: UHF of tests/test_scf.py needs 12 for its one step (SciPy's default tolerance, 1e-5 of the
#: preconditioned residual); from its first stall's orbitals, 9 and 13 for two.
MINRES_CYCLES = 50
#: A step that leaves the orbital gradient above this fraction of its value before it ends the
#: steps unconverged (a noise floor, or a start outside the quadratic region): a Newton-Raphson
#: step near a stationary point gains orders of magnitude (1.8e-7 -> 2.4e-11 there).
MIN_GAIN = 0.5


@dataclass
class Steps:
    """Where the steps ended: converged by PySCF's test (|dE| < conv_tol and |g| <
    conv_tol_grad), the energy, orbitals, Fock matrix (of their density) and orbital gradient
    norm there (PySCF's ``get_grad``, which its DIIS test reads), and how many steps ran."""

    converged: bool
    e_tot: float
    mo_coeff: np.ndarray
    mo_occ: np.ndarray
    fock: np.ndarray
    gradient: float
    steps: int


def newton_raphson(mf, mo_coeff, mo_occ, max_steps: int, report=None) -> Steps:
    """Up to ``max_steps`` Newton-Raphson steps of the SCF ``mf`` from ``mo_coeff``.

    Each step is the occupied-virtual rotation x (PySCF's parametrisation, ``mf.newton()``'s
    ``gen_g_hop`` and ``rotate_mo``) that solves the Newton equation

        H x = -g

    with g the orbital gradient and H the exact orbital Hessian (its products; one J/K build
    each), solved by MINRES (symmetric, indefinite allowed: a stationary point that is a
    saddle of the energy, such as the spin-restricted solution of a singlet UHF beyond the
    Coulson-Fischer point, has negative Hessian eigenvalues), preconditioned by |diag H|
    (Nocedal and Wright, *Numerical Optimization*, 2nd ed., sections 6.1 and 7.1). Near a
    stationary point the gradient falls quadratically; PySCF's augmented-Hessian solver instead
    stops taking steps there (its Davidson subspace turns linearly dependent, under
    ``ah_lindep``, when |g| ~ 1e-7). The steps end converged, after ``max_steps``, or when a
    step gains less than :data:`MIN_GAIN`. ``report(step, energy, last energy, gradient)``
    after each step when given."""
    newton = mf.newton()
    mol = mf.mol
    h1e, s1e = mf.get_hcore(mol), mf.get_ovlp(mol)
    dm = mf.make_rdm1(mo_coeff, mo_occ)
    vhf = mf.get_veff(mol, dm)
    e_tot = mf.energy_tot(dm, h1e, vhf)
    fock = mf.get_fock(h1e, s1e, vhf, dm)
    g, h_op, h_diag = newton.gen_g_hop(mo_coeff, mo_occ, fock)
    gradient = float(np.linalg.norm(mf.get_grad(mo_coeff, mo_occ, fock)))
    converged = False
    step = 0
    while step < max_steps and not converged:
        step += 1
        size = g.size
        hessian = LinearOperator((size, size), matvec=h_op, dtype=g.dtype)
        scale = np.maximum(np.abs(h_diag), 1e-8)
        precond = LinearOperator((size, size), matvec=lambda v: v / scale, dtype=g.dtype)
        x, _info = minres(hessian, -g, M=precond, maxiter=MINRES_CYCLES)
        mo_coeff = newton.rotate_mo(mo_coeff, newton.update_rotate_matrix(x, mo_occ,
                                                                          mo_coeff=mo_coeff))
        dm = mf.make_rdm1(mo_coeff, mo_occ)
        vhf = mf.get_veff(mol, dm)
        last, e_tot = e_tot, mf.energy_tot(dm, h1e, vhf)
        fock = mf.get_fock(h1e, s1e, vhf, dm)
        g, h_op, h_diag = newton.gen_g_hop(mo_coeff, mo_occ, fock)
        before, gradient = gradient, float(np.linalg.norm(mf.get_grad(mo_coeff, mo_occ, fock)))
        if report is not None:
            report(step, e_tot, last, gradient)
        converged = abs(e_tot - last) < mf.conv_tol and gradient < mf.conv_tol_grad
        if not converged and gradient > MIN_GAIN * before:
            break
    return Steps(converged, float(e_tot), mo_coeff, mo_occ, fock, gradient, step)
