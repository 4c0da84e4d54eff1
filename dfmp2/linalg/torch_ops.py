"""PyTorch implementations of the linalg ops (CPU, and CUDA when the operands live there).

These functions define the contract of every op: the NKI host wrappers in ``nki_ops`` take the
same arguments and return the same shapes. Every function is pure; none copies its inputs except
where a dtype change forces it.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import InputError, NotPositiveDefiniteError
from .cpu_blas import torch_matmul

__all__ = [
    "TRMM_COLUMN_BLOCK",
    "cholesky",
    "eigh",
    "gemm",
    "lapack_cholesky",
    "lapack_potrf",
    "check_pair_sums_args",
    "is_diagonal_block",
    "mp2_pair_sums",
    "mp2_pair_table",
    "pair_sums_from_ovov",
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


def is_diagonal_block(ovL_i: torch.Tensor, ovL_j: torch.Tensor, weights: torch.Tensor) -> bool:
    """True when ``ovL_j`` is the same block of orbitals as ``ovL_i`` (same storage, shape and
    strides) and ``weights`` vanish below the diagonal: pairs j < i need not be computed (a
    diagonal block I = J of the triangular sums in :mod:`dfmp2.energy`)."""
    return (ovL_i.shape == ovL_j.shape and ovL_i.stride() == ovL_j.stride()
            and ovL_i.data_ptr() == ovL_j.data_ptr()
            and not bool(torch.tril(weights, -1).any()))


def check_pair_sums_args(ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights,
                         exchange: bool) -> tuple[int, int, int, int, int]:
    """``(ni, nj, nva, nvb, naux)`` of valid :func:`mp2_pair_sums` operands; raises
    :class:`InputError` naming the first operand of the wrong shape."""
    if ovL_i.ndim != 3 or ovL_j.ndim != 3:
        raise InputError(f"mp2_pair_sums: ovL_i and ovL_j must be 3-D (n, nvir, naux), got "
                         f"{tuple(ovL_i.shape)} and {tuple(ovL_j.shape)}")
    ni, nva, naux = (int(s) for s in ovL_i.shape)
    nj, nvb = int(ovL_j.shape[0]), int(ovL_j.shape[1])
    if int(ovL_j.shape[2]) != naux:
        raise InputError(f"mp2_pair_sums: ovL_j must have naux = {naux}, got {tuple(ovL_j.shape)}")
    for eps, size, name in ((eps_i, ni, "eps_i"), (eps_j, nj, "eps_j"), (eps_va, nva, "eps_va"),
                            (eps_vb, nvb, "eps_vb")):
        if tuple(eps.shape) != (size,):
            raise InputError(f"mp2_pair_sums: {name} must have shape ({size},), got "
                             f"{tuple(eps.shape)}")
    if tuple(weights.shape) != (ni, nj):
        raise InputError(f"mp2_pair_sums: weights must have shape ({ni}, {nj}), got "
                         f"{tuple(weights.shape)}")
    if exchange and nva != nvb:
        raise InputError(f"mp2_pair_sums: the exchange sum needs nvir_i == nvir_j, got {nva} and "
                         f"{nvb}")
    return ni, nj, nva, nvb, naux


def pair_sums_from_ovov(
    ovov: torch.Tensor,
    eps_i: torch.Tensor,
    eps_j: torch.Tensor,
    eps_va: torch.Tensor,
    eps_vb: torch.Tensor,
    weights: torch.Tensor,
    exchange: bool,
) -> torch.Tensor:
    """Reduce a block of ``(ia|jb)`` integrals to the float64 ``[direct, exchange]`` sums of
    :func:`mp2_pair_sums` (the unfused path's second half).

    ovov : (ni, nva, nj, nvb) integrals ``(ia|jb)``; eps_i (ni,), eps_j (nj,), eps_va (nva,),
    eps_vb (nvb,); weights (ni, nj) float64 (pairs of weight 0 are skipped). The reduction runs
    in the dtype of ``eps_va``; pair sums are added in float64.
    """
    ni = ovov.shape[0]
    work = _RowWork(eps_j, eps_va, eps_vb)
    total = torch.zeros(2, dtype=torch.float64, device=ovov.device)
    on_device = weights.to(device=ovov.device, dtype=torch.float64)  # host weights, CUDA ovov
    for i in range(ni):
        j0, j1 = _weighted_span(weights[i])
        if j0 < j1:
            t_jab = ovov[i, :, j0:j1, :].permute(1, 0, 2)  # (j1 - j0, nva, nvb)
            total += work.sums(t_jab, eps_i[i], j0, on_device[i, j0:j1], exchange)
    return total


def mp2_pair_table(
    ovL_i: torch.Tensor,
    ovL_j: torch.Tensor,
    eps_i: torch.Tensor,
    eps_j: torch.Tensor,
    eps_va: torch.Tensor,
    eps_vb: torch.Tensor,
    exchange: bool,
) -> torch.Tensor:
    """Per-pair sums of a block, unweighted: the float64 (ni, nj, 2) tensor

        [i, j] = [ sum_ab T_ab^2 / D,   sum_ab T_ab T_ba / D ]

    with T and D as in :func:`mp2_pair_sums` (the second entry 0.0 when ``exchange`` is
    False). What :func:`mp2_pair_sums` returns is ``sum_ij w_ij [i, j]``; this op keeps every
    pair (the pair-energy diagnostics of ``--pair-energies``). One GEMM per i,
    ``B_j x B_i^T`` ((nj*nvb, naux) x (naux, nva)); the reduction in eps_va's dtype."""
    ni, nj, nva, nvb, naux = check_pair_sums_args(
        ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, torch.zeros(
            (ovL_i.shape[0], ovL_j.shape[0]), dtype=torch.float64), exchange)
    table = torch.zeros((ni, nj, 2), dtype=torch.float64, device=ovL_i.device)
    if ni == 0 or nj == 0 or nva == 0 or nvb == 0:
        return table
    dtype = eps_va.dtype
    base = (eps_j.view(nj, 1, 1) - eps_va.view(1, nva, 1)) - eps_vb.to(dtype).view(1, 1, nvb)
    jb_L = ovL_j.reshape(nj * nvb, naux)
    for i in range(ni):
        t = torch.matmul(ovL_i[i], jb_L.T).view(nva, nj, nvb).permute(1, 0, 2).to(dtype)
        w = t / (base + eps_i[i])  # T / D, (nj, nva, nvb)
        table[i, :, 0] = (w * t).sum(dim=(1, 2), dtype=torch.float64)  # float32 terms: float64
        if exchange:                                                    # sums (see _RowWork)
            table[i, :, 1] = (w * t.transpose(1, 2)).sum(dim=(1, 2), dtype=torch.float64)
    return table


def mp2_pair_sums(
    ovL_i: torch.Tensor,
    ovL_j: torch.Tensor,
    eps_i: torch.Tensor,
    eps_j: torch.Tensor,
    eps_va: torch.Tensor,
    eps_vb: torch.Tensor,
    weights: torch.Tensor,
    exchange: bool,
    matmul=torch.matmul,
) -> torch.Tensor:
    """Weighted pair sums of a block of occupied pairs, the spin-neutral op of every backend.

    With ``T^ij_ab = (ia|jb) = sum_Q ovL_i[i, a, Q] ovL_j[j, b, Q]`` and
    ``D = eps_i[i] + eps_j[j] - eps_va[a] - eps_vb[b]``, returns the float64 tensor

        [ sum_ij w_ij sum_ab T_ab^2 / D,   sum_ij w_ij sum_ab T_ab T_ba / D ]

    (the second entry 0.0 when ``exchange`` is False). ovL_i : (ni, nva, naux); ovL_j :
    (nj, nvb, naux); eps_i (ni,), eps_j (nj,), eps_va (nva,), eps_vb (nvb,); weights (ni, nj)
    float64; exchange needs nva == nvb. Blocks may be rectangular (nva != nvb: the αβ blocks of
    an open shell). Pairs of weight 0 are not computed: in a diagonal block
    (:func:`is_diagonal_block`) one GEMM per i, ``B_J[j >= i] x B_i^T``; otherwise one GEMM
    (ni*nva, naux) x (naux, nj*nvb). The spin algebra (which weights, what the sums mean) is
    :mod:`dfmp2.energy`'s. GEMMs run in the operands' dtype, the reduction in eps_va's dtype,
    the pair sums in float64.
    """
    ni, nj, nva, nvb, naux = check_pair_sums_args(ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb,
                                                  weights, exchange)
    jb_L = ovL_j.reshape(nj * nvb, naux)
    work = _RowWork(eps_j, eps_va, eps_vb)
    total = torch.zeros(2, dtype=torch.float64, device=ovL_i.device)
    if ni == 0 or nj == 0 or nva == 0 or nvb == 0:
        return total
    weights = weights.to(device=ovL_i.device, dtype=torch.float64)
    # the diagonal path sums each pair's transpose: right only when D is symmetric in a <-> b
    if not (is_diagonal_block(ovL_i, ovL_j, weights) and torch.equal(eps_va, eps_vb)):
        ovov = matmul(ovL_i.reshape(ni * nva, naux), jb_L.T).view(ni, nva, nj, nvb)
        for i in range(ni):
            total += work.sums(ovov[i].permute(1, 0, 2), eps_i[i], 0, weights[i], exchange)
        return total
    # a diagonal block: nva == nvb and eps_va == eps_vb, so each pair's T may be transposed
    t_buffer = torch.empty(nj * nvb * nva, dtype=ovL_i.dtype, device=ovL_i.device)
    for i in range(ni):
        t_jba = t_buffer[: (nj - i) * nvb * nva].view((nj - i) * nvb, nva)
        matmul(jb_L[i * nvb :], ovL_i[i].T, out=t_jba)
        total += work.sums(t_jba.view(nj - i, nvb, nva), eps_i[i], i, weights[i, i:], exchange)
    return total


def _weighted_span(weights_j: torch.Tensor) -> tuple[int, int]:
    """(j0, j1): the range of j between the first and last nonzero weight of one row."""
    nonzero = torch.nonzero(weights_j).flatten()
    if nonzero.numel() == 0:
        return 0, 0
    return int(nonzero[0]), int(nonzero[-1]) + 1


class _RowWork:
    """Reusable buffers and ``e_j - e_a - e_b`` for reducing rows of pairs (i, j >= j0).

    Allocating fresh multi-megabyte temporaries per row costs page faults comparable to the
    arithmetic, so the work arrays (nj, nva, nvb) are made once per op call.
    """

    def __init__(self, eps_j: torch.Tensor, eps_va: torch.Tensor, eps_vb: torch.Tensor):
        nj, nva, nvb = eps_j.shape[0], eps_va.shape[0], eps_vb.shape[0]
        self.dtype = eps_va.dtype
        self.base = ((eps_j.view(nj, 1, 1) - eps_va.view(1, nva, 1))
                     - eps_vb.to(self.dtype).view(1, 1, nvb))
        self.t = torch.empty_like(self.base)
        self.w = torch.empty_like(self.base)
        self.swap = torch.empty_like(self.base) if nva == nvb else None
        # below float64 each pair's terms are added up in float64 (as the compiled reduction
        # does): a float32 dot over nvir^2 terms of one sign drifted by 2e-5 of E(corr) on
        # (H2O)8 cc-pVDZ, past the bound the summary prints to
        self.terms = None if self.dtype == torch.float64 else torch.empty_like(self.base)

    def _pair_dots(self, w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """(nk,) float64 ``sum_ab w_kab t_kab`` of (nk, nva, nvb) blocks: one batched product
        in float64, or the float32 terms summed in float64."""
        nk = w.shape[0]
        nab = w.shape[1] * w.shape[2]
        if self.terms is None:
            return torch.bmm(w.view(nk, 1, nab), t.reshape(nk, nab, 1)).view(nk)
        terms = torch.mul(w, t, out=self.terms[:nk])
        return terms.view(nk, nab).sum(dim=1, dtype=torch.float64)

    def sums(self, t_jab: torch.Tensor, eps_i, j0: int, weights_k: torch.Tensor,
             exchange: bool) -> torch.Tensor:
        """Weighted ``[direct, exchange]`` of pairs (i, j0 + k) from T (nk, nva, nvb) (or, for
        a diagonal block, its per-pair transpose: there D is symmetric in a <-> b)."""
        nk = t_jab.shape[0]
        if t_jab.dtype == self.dtype and t_jab.is_contiguous():
            t = t_jab
        else:
            t = self.t[:nk].copy_(t_jab)
        w = torch.add(self.base[j0 : j0 + nk], eps_i, out=self.w[:nk])  # D
        torch.div(t, w, out=w)  # W = T / D
        direct_k = self._pair_dots(w, t)
        weights_k = weights_k.to(torch.float64)
        direct = torch.dot(weights_k, direct_k)
        if not exchange:
            return torch.stack([direct, torch.zeros_like(direct)])
        swap = self.swap[:nk].copy_(t.transpose(1, 2))
        ex_k = self._pair_dots(w, swap)
        return torch.stack([direct, torch.dot(weights_k, ex_k)])
