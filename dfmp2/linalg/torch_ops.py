"""PyTorch implementations of the linalg ops (CPU, and CUDA when the operands live there).

These functions define the contract of every op: the NKI host wrappers in ``nki_ops`` take the
same arguments and return the same shapes. Every function is pure; none copies its inputs except
where a dtype change forces it.
"""

from __future__ import annotations

import torch

from ..errors import NotPositiveDefiniteError

__all__ = ["gemm", "cholesky", "eigh", "trsm", "mp2_pair_energy", "pair_energy_from_ovov"]


def gemm(a: torch.Tensor, b: torch.Tensor, trans_a: bool = False, trans_b: bool = False):
    """General matrix product ``op(a) @ op(b)`` where ``op(x)`` is ``x.T`` when asked.

    a : (m, k), or (k, m) with ``trans_a``; b : (k, n), or (n, k) with ``trans_b``.
    Returns (m, n) in the operands' dtype.
    """
    a_mk = a.T if trans_a else a
    b_kn = b.T if trans_b else b
    return a_mk @ b_kn


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
    energies. With ``diagonal_block`` the i and j ranges are the same orbitals and only pairs
    i <= j count (i < j twice); otherwise every pair counts twice (the block lies above the
    diagonal). Closed shell: ``e_os = sum T^2/D``, ``e_ss = sum T (T - T_swap)/D`` with
    ``D = e_i + e_j - e_a - e_b``.
    """
    t_iajb = ovov.to(torch.float64)
    ni, nv, nj, _ = t_iajb.shape
    e_i = eps_i.to(torch.float64).view(ni, 1, 1, 1)
    e_j = eps_j.to(torch.float64).view(1, 1, nj, 1)
    e_a = eps_v.to(torch.float64).view(1, nv, 1, 1)
    e_b = eps_v.to(torch.float64).view(1, 1, 1, nv)
    inv_d = 1.0 / (e_i + e_j - e_a - e_b)
    t_over_d = t_iajb * inv_d
    os_ij = (t_over_d * t_iajb).sum(dim=(1, 3))  # (ni, nj)
    ex_ij = (t_over_d * t_iajb.transpose(1, 3)).sum(dim=(1, 3))  # (ni, nj): sum T_ab T_ba / D
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
) -> torch.Tensor:
    """Fused pair energy of a block of occupied pairs: ``(ia|jb) = sum_Q B_ia^Q B_jb^Q`` by one
    GEMM, then the reduction of :func:`pair_energy_from_ovov`.

    ovL_i : (ni, nv, naux); ovL_j : (nj, nv, naux). Returns float64 tensor ``[e_os, e_ss]``.
    The GEMM runs in the operands' dtype (float32 operands give the mixed-precision path); the
    reduction is float64. The caller bounds ni and nj so that the (ni, nv, nj, nv) block fits.
    """
    ni, nv, naux = ovL_i.shape
    nj = ovL_j.shape[0]
    ovov = (ovL_i.reshape(ni * nv, naux) @ ovL_j.reshape(nj * nv, naux).T).view(ni, nv, nj, nv)
    return pair_energy_from_ovov(ovov, eps_i, eps_j, eps_v, diagonal_block)


def _pair_weights(ni: int, nj: int, diagonal_block: bool, device) -> torch.Tensor:
    """(ni, nj) float64 weights: 2 for every pair, on a diagonal block 1 on and 0 below it."""
    weight = torch.full((ni, nj), 2.0, dtype=torch.float64, device=device)
    if diagonal_block:
        weight = torch.triu(weight, diagonal=1) + torch.eye(ni, nj, dtype=torch.float64, device=device)
    return weight
