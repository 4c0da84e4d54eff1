"""NKI 0.3.0 kernels: fused DF-MP2 pair sums of a block of occupied pairs.

For every pair (i, j) of the block the kernels form ``T_ab = (ia|jb) = sum_P B_i[P, a] B_j[P, b]``
on the TensorE (fp32 PSUM accumulation over the auxiliary tiles), keep T on chip and reduce

    DIRECT_ij = sum_ab T_ab^2 / D_ab,   EX_ij = sum_ab T_ab T_ba / D_ab,
    D_ab = e_i + e_j - e_a - e_b   (e_a of the i side's virtuals, e_b of the j side's)

to per-partition partial sums. Only those partial sums go back to HBM; the host adds them in
fp64 and applies the pair weights (``nki_ops.mp2_pair_sums``). Two kernels, one per variant
(NKI specialises on shapes, and the host passes only float32 arrays, so the variant is a kernel,
not a flag):

- :func:`mp2_pair_energy_kernel`: direct and exchange sums of square blocks (nva == nvb); the
  exchange partner ``T_ba`` comes from TensorE transposes of T tiles (no second GEMM).
- :func:`mp2_pair_direct_kernel`: the direct sum only, of rectangular blocks (nva != nvb
  allowed; the αβ blocks of an open shell): no transposes, no exchange reduction, one T row tile
  on chip at a time.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from ._blocks import (
    direct_row,
    load_pair_denominators,
    load_strip,
    pair_t_rows,
    row_dot,
    tile_span,
)
from ._tiles import TILE_M

__all__ = ["mp2_pair_energy_kernel", "mp2_pair_direct_kernel"]


@nki.jit
def mp2_pair_energy_kernel(b_i, b_j, d_col, neg_eps_row):
    """Direct and exchange partial sums of the ni x nj pairs of one square block (nva = nvb).

    Parameters
    ----------
    b_i : HBM float32 (naux, ni * nv)
        ``B[P, i*nv + a]`` for the occupied orbitals i of the block (naux on partitions).
    b_j : HBM float32 (naux, nj * nv)
        The same for the orbitals j.
    d_col : HBM float32 (nv, ni * nj)
        ``d_col[a, i*nj + j] = e_i + e_j - e_a`` (host-computed in fp64, rounded once).
    neg_eps_row : HBM float32 (128, nv)
        ``-e_b`` replicated on all 128 partitions (the host-supplied broadcast row).

    Returns
    -------
    partials : shared HBM float32 (128, 2 * ni * nj * n_at), n_at = ceil(nv / 128).
        Column ``(i*nj + j) * n_at + ta`` holds, on partition ``p``, the direct sum of row
        ``a = ta*128 + p`` of pair (i, j); the same column plus ``ni*nj*n_at`` holds the
        exchange sum. Partitions beyond the last row of a ragged a tile hold 0.

    Preconditions: nv = ``neg_eps_row.shape[1]`` = ``d_col.shape[0]`` >= 1 with
    ``b_i.shape[1] = ni * nv`` and ``b_j.shape[1] = nj * nv``; naux >= 1; ragged nv and naux
    allowed (edge tiles sliced); all ``D_ab`` nonzero (negative for a valid reference). SBUF per
    partition, in fp32 words: ``2*ceil(naux/128)*nv`` (the B strips of i and j) +
    ``ceil(nv/128)*nv`` (the T rows) + ``6*nv`` (epilogue tiles) + small terms; the host checks
    a double-buffered version of this bound (``nki_ops.SUPPORTS``) and bounds ni*nj per call.

    Steps
    -----
    1. DMA ``neg_eps_row`` -> SBUF ``negv_sb`` and ``d_col`` -> SBUF ``dcol_sb`` (a tile ta at
       free offset ta*ni*nj; ``load_pair_denominators``); ``memset`` SBUF accumulator
       ``acc_sb`` (128, 2*ni*nj*n_at) to 0.
    2. For each i: DMA the strip ``b_i[:, i]`` -> SBUF ``bi_sb`` (``load_strip``, K tile kt at
       free offset kt*nv). For each j: DMA ``b_j[:, j]`` -> SBUF ``bj_sb`` the same way.
    3. T rows (``pair_t_rows``): for each a tile ta (<=128 rows) and b chunk (<=512 columns),
       accumulate ``nc_matmul(dst=t_ps, stationary=bi_sb[k-tile, a-tile],
       moving=bj_sb[k-tile, b-chunk])`` over the K tiles in PSUM ``t_ps`` (accumulate=False
       first, True after), then ``tensor_copy`` PSUM -> SBUF ``t_sb`` (row tile ta at free
       offset ta*nv). T never leaves the chip.
    4. Per a tile (``direct_row``): ``D = -e_b + d_col[a]`` by ``tensor_scalar(add)`` with a
       (P, 1) operand (SBUF ``d_sb``), ``R = 1/D`` by VectorE ``reciprocal`` (SBUF ``r_sb``),
       ``W = T*R`` (``tensor_tensor``, SBUF ``w_sb``), ``W*T`` then ``tensor_reduce(add)`` over
       the free axis into the direct column of ``acc_sb`` (``row_dot``).
    5. Exchange: for each b tile tb (<=128), ``nc_transpose`` (TensorE) of the SBUF block
       ``t_sb[b-tile rows, a-tile columns of row tile tb]`` -> PSUM ``tt_ps`` (a, b) =
       ``T_ba``; ``tensor_copy`` PSUM -> SBUF row ``tt_sb``. Then ``W*T^T`` and
       ``tensor_reduce(add)`` into the exchange column of ``acc_sb`` (``row_dot``).
    6. ``dma_copy`` SBUF ``acc_sb`` -> HBM ``partials`` (the only write to HBM).

    Per pair: ceil(nv/128) * ceil(nv/512) * ceil(naux/128) matmuls and ceil(nv/128)^2
    transposes; in all ``ceil(naux/128)`` (B_j strip) + ``n_at*ceil(nv/512)*(ceil(naux/128)+1)``
    (T) + ``n_at*(7 + 2*n_at)`` (epilogue) instructions, plus ``ceil(naux/128)`` per i and
    ``3 + n_at`` per launch.
    """
    naux = b_i.shape[0]
    nv = neg_eps_row.shape[1]
    ni = b_i.shape[1] // nv
    nj = b_j.shape[1] // nv
    npairs = ni * nj
    n_at = (nv + TILE_M - 1) // TILE_M
    ncol = npairs * n_at
    partials = nl.ndarray((TILE_M, 2 * ncol), dtype=nl.float32, buffer=nl.shared_hbm)

    # Step 1: denominators' parts and the accumulator (SBUF).
    negv_sb, dcol_sb = load_pair_denominators(d_col, neg_eps_row)
    acc_sb = nl.ndarray((TILE_M, 2 * ncol), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc_sb[0:TILE_M, 0:2 * ncol], value=0.0)

    for i in nl.static_range(ni):
        # Step 2: the B strip of orbital i stays in SBUF for all j.
        bi_sb = load_strip(b_i, i * nv, nv, nv)
        for j in nl.static_range(nj):
            pair = i * nj + j
            bj_sb = load_strip(b_j, j * nv, nv, nv)

            # Step 3: all row tiles of T = B_i^T B_j, PSUM-accumulated, kept in SBUF t_sb.
            t_sb = nl.ndarray((TILE_M, n_at * nv), dtype=nl.float32, buffer=nl.sbuf)
            for ta in nl.static_range(n_at):
                a0, asz = tile_span(ta, TILE_M, nv)
                pair_t_rows(t_sb, ta * nv, bi_sb, a0, asz, nv, bj_sb, nv, naux)

            for ta in nl.static_range(n_at):
                a0, asz = tile_span(ta, TILE_M, nv)
                t_row = t_sb[0:asz, ta * nv:(ta + 1) * nv]
                c_dir = pair * n_at + ta
                c_ex = ncol + c_dir
                c_d = ta * npairs + pair
                # Step 4: R = 1 / (-e_b + (e_i + e_j - e_a)); W = T R; direct row sums.
                w_sb = direct_row(acc_sb[0:asz, c_dir:c_dir + 1], t_row, negv_sb,
                                  dcol_sb[0:asz, c_d:c_d + 1], asz, nv)

                # Step 5: T^T row tile from TensorE transposes of T blocks (b-tile, a-tile).
                tt_sb = nl.ndarray((TILE_M, nv), dtype=nl.float32, buffer=nl.sbuf)
                for tb in nl.static_range(n_at):
                    b0, bsz = tile_span(tb, TILE_M, nv)
                    tt_ps = nl.ndarray((TILE_M, TILE_M), dtype=nl.float32, buffer=nl.psum)
                    nisa.nc_transpose(dst=tt_ps[0:asz, 0:bsz],
                                      data=t_sb[0:bsz, tb * nv + a0:tb * nv + a0 + asz],
                                      engine=nisa.engine.tensor)
                    nisa.tensor_copy(dst=tt_sb[0:asz, b0:b0 + bsz], src=tt_ps[0:asz, 0:bsz])
                row_dot(acc_sb[0:asz, c_ex:c_ex + 1], w_sb[0:asz, 0:nv], tt_sb[0:asz, 0:nv], asz,
                        nv)

    # Step 6: the partial sums are the only data written back to HBM.
    nisa.dma_copy(dst=partials[0:TILE_M, 0:2 * ncol], src=acc_sb[0:TILE_M, 0:2 * ncol])
    return partials


@nki.jit
def mp2_pair_direct_kernel(b_i, b_j, d_col, neg_eps_row):
    """Direct partial sums (no exchange) of the ni x nj pairs of one block, nva != nvb allowed.

    Parameters
    ----------
    b_i : HBM float32 (naux, ni * nva)
        ``B[P, i*nva + a]`` for the occupied orbitals i of the block (naux on partitions).
    b_j : HBM float32 (naux, nj * nvb)
        ``B[P, j*nvb + b]`` for the orbitals j (their own virtual space, of size nvb).
    d_col : HBM float32 (nva, ni * nj)
        ``d_col[a, i*nj + j] = e_i + e_j - e_a`` (host-computed in fp64, rounded once).
    neg_eps_row : HBM float32 (128, nvb)
        ``-e_b`` replicated on all 128 partitions (the host-supplied broadcast row).

    Returns
    -------
    partials : shared HBM float32 (128, ni * nj * n_at), n_at = ceil(nva / 128).
        Column ``(i*nj + j) * n_at + ta`` holds, on partition ``p``, the direct sum of row
        ``a = ta*128 + p`` of pair (i, j) (the layout of the first half of
        :func:`mp2_pair_energy_kernel`'s output; there is no exchange half). Partitions beyond
        the last row of a ragged a tile hold 0.

    Preconditions: nva = ``d_col.shape[0]`` >= 1, nvb = ``neg_eps_row.shape[1]`` >= 1 with
    ``b_i.shape[1] = ni * nva`` and ``b_j.shape[1] = nj * nvb``; naux >= 1; ragged nva, nvb and
    naux allowed (edge tiles sliced); all ``D_ab`` nonzero. SBUF per partition, in fp32 words:
    ``ceil(naux/128)*(nva + nvb)`` (the B strips of i and j) + ``6*nvb`` (one T row tile and
    the epilogue tiles) + small terms; the host checks a double-buffered version of this bound
    (``nki_ops.SUPPORTS``) and bounds ni*nj per call.

    Steps
    -----
    1. DMA ``neg_eps_row`` -> SBUF ``negv_sb`` and ``d_col`` -> SBUF ``dcol_sb`` (a tile ta at
       free offset ta*ni*nj; ``load_pair_denominators``); ``memset`` SBUF accumulator
       ``acc_sb`` (128, ni*nj*n_at) to 0.
    2. For each i: DMA the strip ``b_i[:, i]`` -> SBUF ``bi_sb`` (``load_strip``, K tile kt at
       free offset kt*nva). For each j: DMA ``b_j[:, j]`` -> SBUF ``bj_sb`` (offset kt*nvb).
    3. Per a tile ta (<=128 rows), one T row tile (``pair_t_rows``): for each b chunk
       (<=512 columns) accumulate ``nc_matmul(dst=t_ps, stationary=bi_sb[k-tile, a-tile],
       moving=bj_sb[k-tile, b-chunk])`` over the K tiles in PSUM ``t_ps``, then
       ``tensor_copy`` PSUM -> SBUF ``t_sb`` (128, nvb). T never leaves the chip, and only one
       row tile of it is held at a time (no transposes need the other rows).
    4. The same a tile (``direct_row``): ``D = -e_b + d_col[a]`` by ``tensor_scalar(add)``
       (SBUF ``d_sb``), ``R = 1/D`` by VectorE ``reciprocal`` (SBUF ``r_sb``), ``W = T*R``
       (``tensor_tensor``, SBUF ``w_sb``), ``W*T`` then ``tensor_reduce(add)`` over the free
       axis into the pair's column of ``acc_sb`` (``row_dot``).
    5. ``dma_copy`` SBUF ``acc_sb`` -> HBM ``partials`` (the only write to HBM).

    Per pair: ceil(nva/128) * ceil(nvb/512) * ceil(naux/128) matmuls and no transposes; in all
    ``ceil(naux/128)`` (B_j strip) + ``n_at*ceil(nvb/512)*(ceil(naux/128)+1)`` (T) +
    ``5*n_at`` (epilogue) instructions, plus ``ceil(naux/128)`` per i and ``3 + n_at`` per
    launch.
    """
    naux = b_i.shape[0]
    nva = d_col.shape[0]
    nvb = neg_eps_row.shape[1]
    ni = b_i.shape[1] // nva
    nj = b_j.shape[1] // nvb
    npairs = ni * nj
    n_at = (nva + TILE_M - 1) // TILE_M
    ncol = npairs * n_at
    partials = nl.ndarray((TILE_M, ncol), dtype=nl.float32, buffer=nl.shared_hbm)

    # Step 1: denominators' parts and the accumulator (SBUF).
    negv_sb, dcol_sb = load_pair_denominators(d_col, neg_eps_row)
    acc_sb = nl.ndarray((TILE_M, ncol), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc_sb[0:TILE_M, 0:ncol], value=0.0)

    for i in nl.static_range(ni):
        # Step 2: the B strip of orbital i stays in SBUF for all j.
        bi_sb = load_strip(b_i, i * nva, nva, nva)
        for j in nl.static_range(nj):
            pair = i * nj + j
            bj_sb = load_strip(b_j, j * nvb, nvb, nvb)
            for ta in nl.static_range(n_at):
                a0, asz = tile_span(ta, TILE_M, nva)
                # Step 3: one row tile of T = B_i^T B_j, PSUM-accumulated, in SBUF t_sb.
                t_sb = nl.ndarray((TILE_M, nvb), dtype=nl.float32, buffer=nl.sbuf)
                pair_t_rows(t_sb, 0, bi_sb, a0, asz, nva, bj_sb, nvb, naux)
                # Step 4: R = 1 / (-e_b + (e_i + e_j - e_a)); direct row sums of W T.
                c_dir = pair * n_at + ta
                c_d = ta * npairs + pair
                direct_row(acc_sb[0:asz, c_dir:c_dir + 1], t_sb[0:asz, 0:nvb], negv_sb,
                           dcol_sb[0:asz, c_d:c_d + 1], asz, nvb)

    # Step 5: the partial sums are the only data written back to HBM.
    nisa.dma_copy(dst=partials[0:TILE_M, 0:ncol], src=acc_sb[0:TILE_M, 0:ncol])
    return partials
