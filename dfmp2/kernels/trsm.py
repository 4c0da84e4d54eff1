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
    1. DMA ``linv_t_bb`` -> SBUF ``linv_sb``; DMA the panel ``panel_t_kb`` -> SBUF ``panel_sb``
       (K tile kt at free offset kt * nb).
    2. For each column tile of 512: accumulate ``u = L[J,:J0] @ X_prev^T`` over the K tiles in
       PSUM ``u_ps`` (nb, <=512): ``nc_matmul(stationary=panel_sb[k-tile], moving=x_sb)`` where
       ``x_sb`` is the SBUF copy of ``x_prev_t_km[k-tile, n-tile]``.
    3. DMA ``rhs_t_bm[:, n-tile]`` -> SBUF ``r_sb``; ``tensor_tensor(subtract)`` SBUF - PSUM ->
       SBUF ``r_sb`` (the updated right-hand side).
    4. ``nc_matmul(dst=x_ps, stationary=linv_sb, moving=r_sb)`` = ``inv(L_JJ) @ r`` in PSUM.
    5. ``tensor_copy`` PSUM -> SBUF, ``dma_copy`` SBUF -> HBM ``x_t_bm``.

    Matmuls issued: ceil(m/512) * (ceil(J0/128) + 1).
    """
    nb = linv_t_bb.shape[0]
    k_total = panel_t_kb.shape[0]
    m_total = x_prev_t_km.shape[1]
    n_kt = (k_total + TILE_K - 1) // TILE_K
    n_nt = (m_total + TILE_N - 1) // TILE_N
    x_t_bm = nl.ndarray((nb, m_total), dtype=nl.float32, buffer=nl.shared_hbm)

    # Step 1: operands that stay on chip for the whole call (SBUF).
    linv_sb = nl.ndarray((TILE_K, TILE_M), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=linv_sb[0:nb, 0:nb], src=linv_t_bb[0:nb, 0:nb])
    panel_sb = nl.ndarray((TILE_K, n_kt * TILE_M), dtype=nl.float32, buffer=nl.sbuf)
    for kt in nl.static_range(n_kt):
        k0 = kt * TILE_K
        ksz = min(TILE_K, k_total - k0)
        f0 = kt * TILE_M
        nisa.dma_copy(dst=panel_sb[0:ksz, f0:f0 + nb], src=panel_t_kb[k0:k0 + ksz, 0:nb])

    for nt in nl.static_range(n_nt):
        n0 = nt * TILE_N
        nsz = min(TILE_N, m_total - n0)
        # Step 2: u = L[J, :J0] @ X_prev^T[:, n-tile], accumulated over K tiles (PSUM).
        u_ps = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
        for kt in nl.static_range(n_kt):
            k0 = kt * TILE_K
            ksz = min(TILE_K, k_total - k0)
            f0 = kt * TILE_M
            x_sb = nl.ndarray((TILE_K, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=x_sb[0:ksz, 0:nsz], src=x_prev_t_km[k0:k0 + ksz, n0:n0 + nsz])
            nisa.nc_matmul(
                dst=u_ps[0:nb, 0:nsz],
                stationary=panel_sb[0:ksz, f0:f0 + nb],
                moving=x_sb[0:ksz, 0:nsz],
                accumulate=kt > 0,
            )
        # Step 3: r = rhs - u (SBUF operand minus PSUM operand, result in SBUF).
        rhs_sb = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=rhs_sb[0:nb, 0:nsz], src=rhs_t_bm[0:nb, n0:n0 + nsz])
        r_sb = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=r_sb[0:nb, 0:nsz], data1=rhs_sb[0:nb, 0:nsz],
                           data2=u_ps[0:nb, 0:nsz], op=nl.subtract)
        # Step 4: x = inv(L_JJ) @ r; stationary^T @ moving with stationary = inv(L_JJ)^T.
        x_ps = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=x_ps[0:nb, 0:nsz], stationary=linv_sb[0:nb, 0:nb],
                       moving=r_sb[0:nb, 0:nsz], accumulate=False)
        # Step 5: PSUM -> SBUF -> HBM.
        out_sb = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(dst=out_sb[0:nb, 0:nsz], src=x_ps[0:nb, 0:nsz])
        nisa.dma_copy(dst=x_t_bm[0:nb, n0:n0 + nsz], src=out_sb[0:nb, 0:nsz])
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
    1. DMA ``linv_t_bb`` -> SBUF ``linv_sb``.
    2. Panel, per 512-column tile: DMA ``a_col_t_br[:, n-tile]`` -> SBUF ``a_sb``;
       ``nc_matmul(dst=l_ps, stationary=linv_sb, moving=a_sb)`` = ``inv(L_JJ) @ A[R,J].T`` in PSUM;
       ``tensor_copy`` PSUM -> SBUF strip ``l_sb[:, n-tile]`` (kept on chip for step 3);
       ``dma_copy`` SBUF -> HBM ``l_col_t_br``.
    3. Trailing update, per (128-row, 512-column) tile of ``A[R, R]``:
       ``nc_matmul(dst=s_ps, stationary=l_sb[:, m-tile], moving=l_sb[:, n-tile])`` =
       ``L_RJ[m] @ L_RJ[n].T`` (contraction over the nb block columns, PSUM); DMA the ``A`` tile
       -> SBUF ``t_sb``; ``tensor_tensor(subtract)`` SBUF - PSUM -> SBUF ``o_sb``;
       ``dma_copy`` SBUF -> HBM ``a_next_rr``.

    Matmuls issued: ceil(nr/512) * (1 + ceil(nr/128)).
    """
    nb = linv_t_bb.shape[0]
    nr = a_trail_rr.shape[0]
    n_mt = (nr + TILE_M - 1) // TILE_M
    n_nt = (nr + TILE_N - 1) // TILE_N
    l_col_t_br = nl.ndarray((nb, nr), dtype=nl.float32, buffer=nl.shared_hbm)
    a_next_rr = nl.ndarray((nr, nr), dtype=nl.float32, buffer=nl.shared_hbm)

    # Step 1 (SBUF).
    linv_sb = nl.ndarray((TILE_K, TILE_M), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=linv_sb[0:nb, 0:nb], src=linv_t_bb[0:nb, 0:nb])

    # Step 2: panel L[R, J].T = inv(L_JJ) @ A[R, J].T, kept in the SBUF strip l_sb.
    l_sb = nl.ndarray((TILE_K, n_nt * TILE_N), dtype=nl.float32, buffer=nl.sbuf)
    for nt in nl.static_range(n_nt):
        n0 = nt * TILE_N
        nsz = min(TILE_N, nr - n0)
        a_sb = nl.ndarray((TILE_K, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=a_sb[0:nb, 0:nsz], src=a_col_t_br[0:nb, n0:n0 + nsz])
        l_ps = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=l_ps[0:nb, 0:nsz], stationary=linv_sb[0:nb, 0:nb],
                       moving=a_sb[0:nb, 0:nsz], accumulate=False)
        nisa.tensor_copy(dst=l_sb[0:nb, n0:n0 + nsz], src=l_ps[0:nb, 0:nsz])
        nisa.dma_copy(dst=l_col_t_br[0:nb, n0:n0 + nsz], src=l_sb[0:nb, n0:n0 + nsz])

    # Step 3: trailing update A[R, R] - L_RJ @ L_RJ.T, one (128, 512) output tile at a time.
    for mt in nl.static_range(n_mt):
        m0 = mt * TILE_M
        msz = min(TILE_M, nr - m0)
        for nt in nl.static_range(n_nt):
            n0 = nt * TILE_N
            nsz = min(TILE_N, nr - n0)
            s_ps = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=s_ps[0:msz, 0:nsz], stationary=l_sb[0:nb, m0:m0 + msz],
                           moving=l_sb[0:nb, n0:n0 + nsz], accumulate=False)
            t_sb = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=t_sb[0:msz, 0:nsz], src=a_trail_rr[m0:m0 + msz, n0:n0 + nsz])
            o_sb = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=o_sb[0:msz, 0:nsz], data1=t_sb[0:msz, 0:nsz],
                               data2=s_ps[0:msz, 0:nsz], op=nl.subtract)
            nisa.dma_copy(dst=a_next_rr[m0:m0 + msz, n0:n0 + nsz], src=o_sb[0:msz, 0:nsz])
    return l_col_t_br, a_next_rr
