"""PyTorch implementations of the linalg ops (CPU, and CUDA when the operands live there).

These functions define the contract of every op: the NKI host wrappers in ``nki_ops`` take the
same arguments and return the same shapes. Every function is pure; none copies its inputs except
where a dtype change forces it.
"""

from __future__ import annotations

import torch

from ..errors import NotPositiveDefiniteError

__all__ = ["gemm", "cholesky", "eigh", "trsm", "mp2_pair_energy", "pair_energy_from_ovov"]


def gemm(a: torch.Tensor, b: torch.Tensor, trans_a: bool = False, trans_b: bool = False,
         matmul=torch.matmul):
    """General matrix product ``op(a) @ op(b)`` where ``op(x)`` is ``x.T`` when asked.

    a : (m, k), or (k, m) with ``trans_a``; b : (k, n), or (n, k) with ``trans_b``.
    Returns (m, n) in the operands' dtype. ``matmul`` : the 2-D product to use (the dispatcher
    passes its CPU BLAS choice).
    """
    a_mk = a.T if trans_a else a
    b_kn = b.T if trans_b else b
    return matmul(a_mk, b_kn)


def cholesky(a_nn: torch.Tensor) -> torch.Tensor:
    """Lower Cholesky factor ``l`` of a symmetric positive definite matrix, ``a = l @ l.T``.

    Raises :class:`NotPositiveDefiniteError` with the failing pivot when ``a`` is not positive
    definite (numerically linearly dependent auxiliary functions).
    """
    l_nn, info = torch.linalg.cholesky_ex(a_nn)
    if int(info) != 0:
        raise NotPositiveDefiniteError(
            f"Cholesky factorisation failed at pivot {int(info)} of {a_nn.shape[0]}"
        )
    return l_nn


def eigh(a_nn: torch.Tensor):
    """Eigenvalues (ascending) and eigenvectors (columns) of a symmetric matrix."""
    return torch.linalg.eigh(a_nn)


def trsm(l_nn: torch.Tensor, b_mn: torch.Tensor) -> torch.Tensor:
    """Right-side triangular solve of the DF fit: ``x = b @ l^{-T}``, i.e. ``x @ l.T = b``.

    l_nn : (n, n) lower triangular; b_mn : (m, n). Returns x : (m, n).
    """
    return torch.linalg.solve_triangular(l_nn.T, b_mn, upper=True, left=False)


def pair_energy_from_ovov(
    ovov: torch.Tensor,
    eps_i: torch.Tensor,
    eps_j: torch.Tensor,
    eps_v: torch.Tensor,
    diagonal_block: bool,
) -> torch.Tensor:
    """Reduce a block of ``(ia|jb)`` integrals to weighted ``[e_os, e_ss]`` sums (float64).

    ovov : (ni, nv, nj, nv) integrals ``(ia|jb)``; eps_i (ni,), eps_j (nj,), eps_v (nv,) orbital
    energies. With ``diagonal_block`` local index j starts at the same orbital as i: pairs with
    j >= i count (j > i twice) and pairs below are ignored; otherwise every pair counts twice (the
    block lies above the diagonal). Closed shell: ``e_os = sum T^2/D``,
    ``e_ss = sum T (T - T_swap)/D`` with ``D = e_i + e_j - e_a - e_b``.

    The reduction runs in the dtype of the orbital energies (float64: the mixed-precision path;
    float32: the fp32 path, per pair); pair sums are added in float64.
    """
    dtype = eps_v.dtype
    t_iajb = ovov.to(dtype)
    ni, nv, nj, _ = t_iajb.shape
    d_iajb = (eps_i.view(ni, 1, 1, 1) + eps_j.view(1, 1, nj, 1)) - eps_v.view(1, nv, 1, 1)
    d_iajb = d_iajb - eps_v.view(1, 1, 1, nv)
    t_over_d = torch.div(t_iajb, d_iajb, out=d_iajb)
    os_ij = torch.einsum("iajb,iajb->ij", t_over_d, t_iajb)
    ex_ij = torch.einsum("iajb,ibja->ij", t_over_d, t_iajb)  # sum T_ab T_ba / D
    os_ij, ex_ij = os_ij.to(torch.float64), ex_ij.to(torch.float64)  # pair sums in fp64
    weight = _pair_weights(ni, nj, diagonal_block, t_iajb.device)
    e_os = (weight * os_ij).sum()
    e_ss = (weight * (os_ij - ex_ij)).sum()
    return torch.stack([e_os, e_ss])


def mp2_pair_energy(
    ovL_i: torch.Tensor,
    ovL_j: torch.Tensor,
    eps_i: torch.Tensor,
    eps_j: torch.Tensor,
    eps_v: torch.Tensor,
    diagonal_block: bool,
    matmul=torch.matmul,
) -> torch.Tensor:
    """Fused pair energy of a block of occupied pairs: ``(ia|jb) = sum_Q B_ia^Q B_jb^Q``, then
    the reduction of :func:`pair_energy_from_ovov`.

    ovL_i : (ni, nv, naux); ovL_j : (nj, nv, naux). Returns float64 tensor ``[e_os, e_ss]``.
    An off-diagonal block is one GEMM (ni*nv, naux) x (naux, nj*nv). A diagonal block (the same
    orbitals, ``ovL_j is ovL_i``) runs one GEMM per row i against j >= i, so no flop is spent
    below the diagonal. GEMMs run in the operands' dtype, the reduction in eps_v's dtype.
    """
    ni, nv, naux = ovL_i.shape
    nj = ovL_j.shape[0]
    if not diagonal_block:
        ovov = matmul(ovL_i.reshape(ni * nv, naux), ovL_j.reshape(nj * nv, naux).T)
        return pair_energy_from_ovov(ovov.view(ni, nv, nj, nv), eps_i, eps_j, eps_v, False)
    total = torch.zeros(2, dtype=torch.float64, device=ovL_i.device)
    for i in range(ni):
        ovov = matmul(ovL_i[i], ovL_j[i:].reshape((nj - i) * nv, naux).T)  # (nv, (nj-i)*nv)
        total += pair_energy_from_ovov(ovov.view(1, nv, nj - i, nv), eps_i[i : i + 1],
                                       eps_j[i:], eps_v, True)
    return total


def _pair_weights(ni: int, nj: int, diagonal_block: bool, device) -> torch.Tensor:
    """(ni, nj) float64 weights: 2 for every pair, on a diagonal block 1 on and 0 below it."""
    weight = torch.full((ni, nj), 2.0, dtype=torch.float64, device=device)
    if diagonal_block:
        weight = torch.triu(weight, diagonal=1) + torch.eye(ni, nj, dtype=torch.float64, device=device)
    return weight
