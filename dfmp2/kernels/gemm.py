"""NKI 0.3.0 kernel: tiled fp32 GEMM ``C = A @ B`` with ``A`` passed transposed.

Imported only after ``nki`` is importable (the real package, or dfmp2's emulator installed by the
host wrapper). Written with ``nki.isa`` instructions, ``nl.ndarray`` allocations, slices and
plain Python loops (fully unrolled by the compiler).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from ._blocks import load_strip, load_tile, store_psum, tile_span
from ._tiles import GEMM_M_GROUP, TILE_K, TILE_M, TILE_N

__all__ = ["gemm_kernel"]


@nki.jit
def gemm_kernel(a_km, b_kn):
    """``c_mn = a_km.T @ b_kn`` in fp32 (fp32 PSUM accumulation over the K tiles), blocked over
    M: every moving tile of B loaded from HBM serves a group of ``GEMM_M_GROUP`` M tiles.

    Parameters
    ----------
    a_km : HBM float32 (K, M)
        ``A`` transposed, so that the contraction index K lies on the partition axis.
    b_kn : HBM float32 (K, N)

    Returns
    -------
    c_mn : shared HBM float32 (M, N)

    Preconditions: both operands 2-D float32 with the same K; M, N, K >= 1; any sizes, ragged
    edges included (edge tiles are sliced with ``min``, nothing is padded). SBUF holds the A^T
    strip of one M group, ``ceil(K/128) * 512 * 4`` bytes per partition, so the host keeps
    K <= ``GEMM_MAX_K`` = 4096 per call (larger K is split on the host and the partial products
    are added in fp64). PSUM: one bank per M tile of the group (4).

    Steps
    -----
    1. For each group of up to 4 M tiles (512 rows of C): DMA the group's A^T strip
       ``a_km[:, group]`` into SBUF ``a_sb`` (``load_strip``: ceil(K/128) tiles of
       (<=128, <=512) side by side on the free axis, K tile kt at free offset kt * 512).
    2. For each N tile (512 columns of C): allocate the PSUM tile ``c_ps`` (128, 4, 512), one
       bank per M tile of the group.
    3. For each K tile: DMA ``b_kn[k-tile, n-tile]`` into SBUF ``mov_sb`` (<=128, <=512) once
       (``load_tile``) and issue, for every M tile g of the group,
       ``nc_matmul(dst=c_ps[:, g], stationary=a_sb[k-tile, g], moving=mov_sb)`` with
       ``accumulate=False`` for the first K tile and ``True`` after it.
    4. ``store_psum`` per M tile: ``tensor_copy`` PSUM -> SBUF; ``dma_copy`` SBUF -> HBM.

    Matmuls issued: ceil(M/128) * ceil(N/512) * ceil(K/128); moving-tile loads:
    ceil(M/512) * ceil(N/512) * ceil(K/128).
    """
    k_total = a_km.shape[0]
    m_total = a_km.shape[1]
    n_total = b_kn.shape[1]
    n_kt = (k_total + TILE_K - 1) // TILE_K
    group_rows = GEMM_M_GROUP * TILE_M
    n_mg = (m_total + group_rows - 1) // group_rows
    n_nt = (n_total + TILE_N - 1) // TILE_N
    c_mn = nl.ndarray((m_total, n_total), dtype=nl.float32, buffer=nl.shared_hbm)

    for mg in nl.static_range(n_mg):
        g0, gsz = tile_span(mg, group_rows, m_total)
        n_g = (gsz + TILE_M - 1) // TILE_M
        # Step 1: A^T strip of this M group, K tile kt at free offset kt * 512 (SBUF).
        a_sb = load_strip(a_km, g0, gsz, group_rows)
        for nt in nl.static_range(n_nt):
            n0, nsz = tile_span(nt, TILE_N, n_total)
            # Step 2: one PSUM bank per M tile of the group.
            c_ps = nl.ndarray((TILE_M, GEMM_M_GROUP, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for kt in nl.static_range(n_kt):
                k0, ksz = tile_span(kt, TILE_K, k_total)
                # Step 3: the moving tile once, for every M tile of the group.
                mov_sb = load_tile(b_kn, k0, n0, ksz, nsz)
                for g in nl.static_range(n_g):
                    m0, msz = tile_span(g, TILE_M, gsz)
                    f0 = kt * group_rows + m0
                    nisa.nc_matmul(dst=c_ps[0:msz, g, 0:nsz],
                                   stationary=a_sb[0:ksz, f0:f0 + msz],
                                   moving=mov_sb[0:ksz, 0:nsz], accumulate=kt > 0)
            # Step 4: PSUM -> SBUF -> HBM (dma_copy cannot read PSUM).
            for g in nl.static_range(n_g):
                m0, msz = tile_span(g, TILE_M, gsz)
                store_psum(c_mn, g0 + m0, n0, c_ps[0:TILE_M, g, 0:TILE_N], msz, nsz)
    return c_mn
