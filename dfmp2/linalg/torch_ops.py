"""PyTorch implementations of the linalg ops (CPU, and CUDA when the operands live there).

These functions define the contract of every op: the NKI host wrappers in ``nki_ops`` take the
same arguments and return the same shapes. Every function is pure; none copies its inputs except
where a dtype change forces it.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import NotPositiveDefiniteError
from .cpu_blas import torch_matmul

__all__ = [
    "TRMM_COLUMN_BLOCK",
    "cholesky",
    "eigh",
    "gemm",
    "lapack_cholesky",
    "lapack_potrf",
    "mp2_pair_energy",
    "pair_energy_from_ovov",
    "trmm",
    "trsm",
    "upper_product_in_place",
]

#: Columns per GEMM of the blocked :func:`trmm` (here and in the NKI wrapper). Smaller blocks skip
#: more of the zero triangle (26% extra flops at 256 for n = 1708) but run narrower GEMMs.
TRMM_COLUMN_BLOCK = 256


def gemm(a: torch.Tensor, b: torch.Tensor, trans_a: bool = False, trans_b: bool = False,
         out: torch.Tensor | None = None, matmul=torch_matmul):
    """General matrix product ``op(a) @ op(b)`` where ``op(x)`` is ``x.T`` when asked.

    a : (m, k), or (k, m) with ``trans_a``; b : (k, n), or (n, k) with ``trans_b``.
    Returns (m, n) in the operands' dtype, written into ``out`` (contiguous, (m, n)) when given:
    large fresh results cost page faults comparable to the product on some hosts.
    ``matmul(a, b, out=None)`` : the 2-D product to use (the dispatcher passes its CPU BLAS).
    """
    a_mk = a.T if trans_a else a
    b_kn = b.T if trans_b else b
    return matmul(a_mk, b_kn, out=out)


def cholesky(a_nn: torch.Tensor) -> torch.Tensor:
    """Lower Cholesky factor ``l`` of a symmetric positive definite matrix, ``a = l @ l.T``.

    On the CPU this is LAPACK's ``potrf`` through SciPy (:func:`lapack_cholesky`), so whether a
    matrix counts as positive definite is LAPACK's decision (torch's own factorisation, another
    LAPACK build, disagrees on borderline matrices in either direction); on CUDA it is torch's.
    Raises :class:`NotPositiveDefiniteError` with the failing pivot when ``a`` is not positive
    definite (numerically linearly dependent auxiliary functions).
    """
    if a_nn.device.type == "cpu":
        return torch.from_numpy(lapack_cholesky(a_nn.numpy()))
    l_nn, info = torch.linalg.cholesky_ex(a_nn)
    if int(info) != 0:
        raise NotPositiveDefiniteError(
            f"Cholesky factorisation failed at pivot {int(info)} of {a_nn.shape[0]}"
        )
    return l_nn


def lapack_cholesky(a_nn: np.ndarray) -> np.ndarray:
    """Lower Cholesky factor (n, n) of ``a_nn`` by SciPy's LAPACK ``?potrf``: a new array, zero
    above the diagonal, in ``a_nn``'s dtype. Raises :class:`NotPositiveDefiniteError` with the
    failing pivot (1-based, LAPACK's ``info``)."""
    l_nn, info = lapack_potrf(a_nn)
    if info != 0:
        raise NotPositiveDefiniteError(
            f"Cholesky factorisation failed at pivot {info} of {a_nn.shape[0]} (LAPACK potrf)"
        )
    return l_nn


def lapack_potrf(a_nn: np.ndarray) -> tuple[np.ndarray, int]:
    """``(l_nn, info)`` from SciPy's LAPACK ``?potrf`` (lower, zero above the diagonal); ``info``
    is 0 on success, else the 1-based order of the first leading minor that is not positive."""
    from scipy.linalg import lapack

    routine = lapack.spotrf if a_nn.dtype == np.float32 else lapack.dpotrf
    l_nn, info = routine(a_nn, lower=1, clean=1, overwrite_a=0)
    if info < 0:  # an argument error is a bug here, never a property of the matrix
        raise AssertionError(f"?potrf rejected argument {-info}")
    return l_nn, int(info)


def eigh(a_nn: torch.Tensor):
    """Eigenvalues (ascending) and eigenvectors (columns) of a symmetric matrix."""
    return torch.linalg.eigh(a_nn)


def trsm(l_nn: torch.Tensor, b_mn: torch.Tensor) -> torch.Tensor:
    """Right-side triangular solve of the DF fit: ``x = b @ l^{-T}``, i.e. ``x @ l.T = b``.

    l_nn : (n, n) lower triangular; b_mn : (m, n). Returns x : (m, n).
    """
    return torch.linalg.solve_triangular(l_nn.T, b_mn, upper=True, left=False)


def trmm(u_nn: torch.Tensor, b_mn: torch.Tensor, matmul=torch_matmul) -> torch.Tensor:
    """In-place product with an upper-triangular matrix: ``b_mn <- b_mn @ u_nn``; returns b_mn.

    The DF fit ``B = (ia|P) L^{-T}`` with ``u_nn = L^{-T}``. u_nn : (n, n), zero below the
    diagonal; b_mn : (m, n), overwritten. Blocked GEMMs (:func:`upper_product_in_place`);
    ``matmul`` as in :func:`gemm`.
    """
    return upper_product_in_place(
        b_mn, u_nn, lambda a, b, out: gemm(a, b, out=out, matmul=matmul))


def upper_product_in_place(b_mn: torch.Tensor, u_nn: torch.Tensor, gemm_into) -> torch.Tensor:
    """``b_mn <- b_mn @ u_nn`` for upper-triangular ``u_nn`` by column blocks of
    :data:`TRMM_COLUMN_BLOCK`: block K of the product needs ``b[:, :end(K)]`` only, so going
    from the last block to the first overwrites nothing still needed. ``gemm_into(a, b, out)``
    computes ``a @ b`` into the contiguous ``out``."""
    m, n = b_mn.shape
    width = min(n, TRMM_COLUMN_BLOCK)
    work = torch.empty(m * width, dtype=b_mn.dtype, device=b_mn.device)
    for k0 in reversed(range(0, n, width)):
        k1 = min(k0 + width, n)
        block = gemm_into(b_mn[:, :k1], u_nn[:k1, k0:k1], work[: m * (k1 - k0)].view(m, k1 - k0))
        b_mn[:, k0:k1].copy_(block)
    return b_mn


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
    ni = ovov.shape[0]
    work = _RowWork(eps_j, eps_v)
    total = torch.zeros(2, dtype=torch.float64, device=ovov.device)
    for i in range(ni):
        j0 = i if diagonal_block else 0
        t_jab = ovov[i, :, j0:, :].permute(1, 0, 2)  # (nj - j0, nv, nv)
        total += work.energy(t_jab, eps_i[i], j0, diagonal_block)
    return total


def mp2_pair_energy(
    ovL_i: torch.Tensor,
    ovL_j: torch.Tensor,
    eps_i: torch.Tensor,
    eps_j: torch.Tensor,
    eps_v: torch.Tensor,
    diagonal_block: bool,
    matmul=torch.matmul,
) -> torch.Tensor:
    """Fused pair energy of a block of occupied pairs: ``(ia|jb) = sum_Q B_ia^Q B_jb^Q`` and the
    reduction of :func:`pair_energy_from_ovov`, row i by row i while the rows are in cache.

    ovL_i : (ni, nv, naux); ovL_j : (nj, nv, naux). Returns float64 tensor ``[e_os, e_ss]``.
    An off-diagonal block is one GEMM (ni*nv, naux) x (naux, nj*nv). A diagonal block (the same
    orbitals) runs one GEMM per i, ``B_J[j >= i] x B_i^T``, so no flop is spent below the
    diagonal. GEMMs run in the operands' dtype, the reduction in eps_v's dtype.
    """
    ni, nv, naux = ovL_i.shape
    nj = ovL_j.shape[0]
    jb_L = ovL_j.reshape(nj * nv, naux)
    work = _RowWork(eps_j, eps_v)
    total = torch.zeros(2, dtype=torch.float64, device=ovL_i.device)
    if not diagonal_block:
        ovov = matmul(ovL_i.reshape(ni * nv, naux), jb_L.T).view(ni, nv, nj, nv)
        for i in range(ni):
            total += work.energy(ovov[i].permute(1, 0, 2), eps_i[i], 0, False)
        return total
    t_buffer = torch.empty(nj * nv * nv, dtype=ovL_i.dtype, device=ovL_i.device)
    for i in range(ni):
        t_jba = t_buffer[: (nj - i) * nv * nv].view((nj - i) * nv, nv)
        matmul(jb_L[i * nv :], ovL_i[i].T, out=t_jba)
        total += work.energy(t_jba.view(nj - i, nv, nv), eps_i[i], i, True)
    return total


class _RowWork:
    """Reusable buffers and ``e_j - e_a - e_b`` for reducing rows of pairs (i, j >= j0).

    Allocating fresh multi-megabyte temporaries per row costs page faults comparable to the
    arithmetic, so the three (nj, nv, nv) work arrays are made once per op call.
    """

    def __init__(self, eps_j: torch.Tensor, eps_v: torch.Tensor):
        nj, nv = eps_j.shape[0], eps_v.shape[0]
        self.dtype = eps_v.dtype
        self.base = (eps_j.view(nj, 1, 1) - eps_v.view(1, nv, 1)) - eps_v.view(1, 1, nv)
        self.t = torch.empty_like(self.base)
        self.w = torch.empty_like(self.base)
        self.swap = torch.empty_like(self.base)

    def energy(self, t_jab: torch.Tensor, eps_i, j0: int, first_is_diagonal: bool):
        """Weighted [e_os, e_ss] of pairs (i, j0 + k) from T (nk, nv, nv) in any layout; the sums
        are symmetric in a <-> b, so T or its transpose per pair both work. Every pair counts
        twice, except the first when ``first_is_diagonal`` (the pair (i, i))."""
        nk, nv, _ = t_jab.shape
        if t_jab.dtype == self.dtype and t_jab.is_contiguous():
            t = t_jab
        else:
            t = self.t[:nk].copy_(t_jab)
        w = torch.add(self.base[j0 : j0 + nk], eps_i, out=self.w[:nk])  # D
        torch.div(t, w, out=w)  # W = T / D
        w_row = w.view(nk, 1, nv * nv)
        os_k = torch.bmm(w_row, t.reshape(nk, nv * nv, 1)).view(nk).to(torch.float64)
        swap = self.swap[:nk].copy_(t.transpose(1, 2))
        ex_k = torch.bmm(w_row, swap.view(nk, nv * nv, 1)).view(nk).to(torch.float64)
        weight = torch.full((nk,), 2.0, dtype=torch.float64, device=t.device)
        if first_is_diagonal and nk:
            weight[0] = 1.0
        e_os = torch.dot(weight, os_k)
        return torch.stack([e_os, e_os - torch.dot(weight, ex_k)])
