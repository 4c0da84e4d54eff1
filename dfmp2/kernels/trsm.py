"""NKI 0.3.0 kernels for the blocked Cholesky factorisation and the blocked triangular solve.

The host factors (``potrf``) and inverts (``trtri``) the 128x128 diagonal blocks in fp64 and
passes each inverse, transposed and rounded to fp32, as ``linv_t_bb = inv(L_JJ).T``. These kernels
do the matrix-product parts of one block step on the TensorE. Both work in the transposed layout
(block rows of ``X^T`` and ``L^T``) so that every contraction index lies on the partition axis and
no transpose is needed on the device.
"""

import nki
import nki.isa as nisa
import nki.language as nl

from ._blocks import (
    load_block,
    load_strip,
    load_tile,
    matmul_strip_by_hbm,
    matmul_tile,
    store_psum,
    subtract_psum,
    tile_span,
)
from ._tiles import TILE_K, TILE_M, TILE_N

__all__ = ["trsm_block_kernel", "cholesky_step_kernel"]


@nki.jit
def trsm_block_kernel(linv_t_bb, panel_t_kb, x_prev_t_km, rhs_t_bm):
    """One block row of the forward substitution ``X^T = L^{-1} B^T``:
    ``x_t_bm = inv(L_JJ) @ (rhs_t_bm - L[J, :J0] @ x_prev_t_km)``.

    Parameters
    ----------
    linv_t_bb : HBM float32 (nb, nb)
        ``inv(L_JJ).T`` of the diagonal block J (nb <= 128), from the host.
    panel_t_kb : HBM float32 (J0, nb)
        ``L[J, :J0].T``: the off-diagonal block row of L, transposed (J0 = start of block J).
    x_prev_t_km : HBM float32 (J0, m)
        Rows ``:J0`` of ``X^T`` solved by the previous steps.
    rhs_t_bm : HBM float32 (nb, m)
        Rows J of ``B^T``.

    Returns
    -------
    x_t_bm : shared HBM float32 (nb, m), rows J of ``X^T``.

    Preconditions: 1 <= nb <= 128, J0 >= 1, m >= 1, ragged sizes allowed (edge tiles sliced).
    SBUF holds the panel strip, ``ceil(J0/128) * nb * 4`` bytes per partition.

    Steps
    -----
    1. DMA ``linv_t_bb`` -> SBUF ``linv_sb`` (``load_block``); DMA the panel ``panel_t_kb`` ->
       SBUF ``panel_sb`` (``load_strip``, K tile kt at free offset kt * 128).
    2. For each column tile of 512 (``matmul_strip_by_hbm``): accumulate
       ``u = L[J,:J0] @ X_prev^T`` over the K tiles in PSUM ``u_ps`` (nb, <=512):
       ``nc_matmul(stationary=panel_sb[k-tile], moving=mov_sb)`` where ``mov_sb`` is the SBUF
       copy of ``x_prev_t_km[k-tile, n-tile]``.
    3. ``subtract_psum``: DMA ``rhs_t_bm[:, n-tile]`` -> SBUF; ``tensor_tensor(subtract)``
       SBUF - PSUM -> SBUF ``r_sb`` (the updated right-hand side).
    4. ``matmul_tile``: ``nc_matmul(dst=x_ps, stationary=linv_sb, moving=r_sb)`` =
       ``inv(L_JJ) @ r`` in PSUM.
    5. ``store_psum``: ``tensor_copy`` PSUM -> SBUF, ``dma_copy`` SBUF -> HBM ``x_t_bm``.

    Matmuls issued: ceil(m/512) * (ceil(J0/128) + 1).
    """
    nb = linv_t_bb.shape[0]
    m_total = x_prev_t_km.shape[1]
    n_nt = (m_total + TILE_N - 1) // TILE_N
    x_t_bm = nl.ndarray((nb, m_total), dtype=nl.float32, buffer=nl.shared_hbm)

    # Step 1: operands that stay on chip for the whole call (SBUF).
    linv_sb = load_block(linv_t_bb)
    panel_sb = load_strip(panel_t_kb, 0, nb, TILE_M)

    for nt in nl.static_range(n_nt):
        n0, nsz = tile_span(nt, TILE_N, m_total)
        # Step 2: u = L[J, :J0] @ X_prev^T[:, n-tile], accumulated over K tiles (PSUM).
        u_ps = matmul_strip_by_hbm(panel_sb, nb, TILE_M, x_prev_t_km, n0, nsz)
        # Step 3: r = rhs - u (SBUF operand minus PSUM operand, result in SBUF).
        r_sb = subtract_psum(rhs_t_bm, 0, n0, u_ps, nb, nsz)
        # Step 4: x = inv(L_JJ) @ r; stationary^T @ moving with stationary = inv(L_JJ)^T.
        x_ps = matmul_tile(nb, linv_sb, 0, nb, r_sb, 0, nsz)
        # Step 5: PSUM -> SBUF -> HBM.
        store_psum(x_t_bm, 0, n0, x_ps, nb, nsz)
    return x_t_bm


@nki.jit
def cholesky_step_kernel(linv_t_bb, a_col_t_br, a_trail_rr):
    """One right-looking step of the blocked Cholesky factorisation after the host factored the
    diagonal block J: the panel ``L_RJ = A_RJ @ inv(L_JJ).T`` and the trailing (SYRK) update
    ``A_RR - L_RJ @ L_RJ.T`` (R = the rows and columns after block J).

    Parameters
    ----------
    linv_t_bb : HBM float32 (nb, nb)
        ``inv(L_JJ).T`` (nb <= 128).
    a_col_t_br : HBM float32 (nb, nr)
        ``A[R, J].T``: the block column under the diagonal block, transposed.
    a_trail_rr : HBM float32 (nr, nr)
        The trailing matrix ``A[R, R]`` (already updated by the previous steps).

    Returns
    -------
    l_col_t_br : shared HBM float32 (nb, nr), ``L[R, J].T``.
    a_next_rr : shared HBM float32 (nr, nr), ``A[R, R] - L[R, J] @ L[R, J].T`` (full square,
        both triangles).

    Preconditions: 1 <= nb <= 128, nr >= 1, ragged sizes allowed. SBUF holds the panel strip
    ``L[R, J].T``, ``nr * 4`` bytes per partition.

    Steps
    -----
    1. DMA ``linv_t_bb`` -> SBUF ``linv_sb`` (``load_block``).
    2. Panel, per 512-column tile: DMA ``a_col_t_br[:, n-tile]`` -> SBUF ``a_sb``
       (``load_tile``); ``nc_matmul(dst=l_ps, stationary=linv_sb, moving=a_sb)`` =
       ``inv(L_JJ) @ A[R,J].T`` in PSUM (``matmul_tile``); ``tensor_copy`` PSUM -> SBUF strip
       ``l_sb[:, n-tile]`` (kept on chip for step 3); ``dma_copy`` SBUF -> HBM ``l_col_t_br``.
    3. Trailing update, per (128-row, 512-column) tile of ``A[R, R]``:
       ``nc_matmul(dst=s_ps, stationary=l_sb[:, m-tile], moving=l_sb[:, n-tile])`` =
       ``L_RJ[m] @ L_RJ[n].T`` (contraction over the nb block columns, PSUM; ``matmul_tile``);
       ``subtract_psum``: DMA the ``A`` tile -> SBUF, ``tensor_tensor(subtract)`` SBUF - PSUM ->
       SBUF ``o_sb``; ``dma_copy`` SBUF -> HBM ``a_next_rr``.

    Matmuls issued: ceil(nr/512) * (1 + ceil(nr/128)).
    """
    nb = linv_t_bb.shape[0]
    nr = a_trail_rr.shape[0]
    n_mt = (nr + TILE_M - 1) // TILE_M
    n_nt = (nr + TILE_N - 1) // TILE_N
    l_col_t_br = nl.ndarray((nb, nr), dtype=nl.float32, buffer=nl.shared_hbm)
    a_next_rr = nl.ndarray((nr, nr), dtype=nl.float32, buffer=nl.shared_hbm)

    # Step 1 (SBUF).
    linv_sb = load_block(linv_t_bb)

    # Step 2: panel L[R, J].T = inv(L_JJ) @ A[R, J].T, kept in the SBUF strip l_sb.
    l_sb = nl.ndarray((TILE_K, n_nt * TILE_N), dtype=nl.float32, buffer=nl.sbuf)
    for nt in nl.static_range(n_nt):
        n0, nsz = tile_span(nt, TILE_N, nr)
        a_sb = load_tile(a_col_t_br, 0, n0, nb, nsz)
        l_ps = matmul_tile(nb, linv_sb, 0, nb, a_sb, 0, nsz)
        nisa.tensor_copy(dst=l_sb[0:nb, n0:n0 + nsz], src=l_ps[0:nb, 0:nsz])
        nisa.dma_copy(dst=l_col_t_br[0:nb, n0:n0 + nsz], src=l_sb[0:nb, n0:n0 + nsz])

    # Step 3: trailing update A[R, R] - L_RJ @ L_RJ.T, one (128, 512) output tile at a time.
    for mt in nl.static_range(n_mt):
        m0, msz = tile_span(mt, TILE_M, nr)
        for nt in nl.static_range(n_nt):
            n0, nsz = tile_span(nt, TILE_N, nr)
            s_ps = matmul_tile(nb, l_sb, m0, msz, l_sb, n0, nsz)
            o_sb = subtract_psum(a_trail_rr, m0, n0, s_ps, msz, nsz)
            nisa.dma_copy(dst=a_next_rr[m0:m0 + msz, n0:n0 + nsz], src=o_sb[0:msz, 0:nsz])
    return l_col_t_br, a_next_rr
