"""NKI 0.3.0 kernels of dfmp2 (``@nki.jit`` functions) and their tile constants.

The kernel modules (``gemm``, ``trsm``, ``mp2_energy``) import ``nki`` at the top, so import them
only after ``nki`` is importable: the real package from the Neuron index, or dfmp2's emulator
installed by :func:`dfmp2.nki_emulator.install`. The host wrappers in
:mod:`dfmp2.linalg.nki_ops` do that lazily. This package itself and :mod:`._tiles` never import
``nki``; :mod:`._blocks` (the tile-level helpers the kernels call, traced inline) does and is
imported only by the kernel modules.

Kernels
-------
gemm.gemm_kernel(a_km, b_kn) -> c_mn
    Tiled fp32 GEMM ``c = a_km.T @ b_kn``.
trsm.trsm_block_kernel(linv_t_bb, panel_t_kb, x_prev_t_km, rhs_t_bm) -> x_t_bm
    One block row of the blocked forward substitution.
trsm.cholesky_step_kernel(linv_t_bb, a_col_t_br, a_trail_rr) -> (l_col_t_br, a_next_rr)
    Panel and trailing update of one right-looking blocked Cholesky step.
mp2_energy.mp2_pair_energy_kernel(b_i, b_j, d_col, neg_eps_row) -> partials
    Fused (ia|jb) formation and direct/exchange reduction for a block of occupied pairs of one
    orbital space (nva == nvb).
mp2_energy.mp2_pair_direct_kernel(b_i, b_j, d_col, neg_eps_row, d_col_b, neg_eps_a) -> partials
    The direct sums only, for rectangular blocks (nva != nvb: alpha-beta pairs), no transposes.
"""

KERNEL_MODULES = ("gemm", "trsm", "mp2_energy")

__all__ = ["KERNEL_MODULES"]
