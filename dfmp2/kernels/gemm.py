"""NKI 0.3.0 kernel: tiled fp32 GEMM ``C = A @ B`` with ``A`` passed transposed.

Imported only after ``nki`` is importable (the real package, or dfmp2's emulator installed by the
host wrapper). Written with ``nki.isa`` instructions, ``nl.ndarray`` allocations, slices and
plain Python loops (fully unrolled by the compiler).
"""

import nki
import nki.language as nl

from ._blocks import load_strip, matmul_strip_by_hbm, store_psum, tile_span
from ._tiles import TILE_M, TILE_N

__all__ = ["gemm_kernel"]


@nki.jit
def gemm_kernel(a_km, b_kn):
    """``c_mn = a_km.T @ b_kn`` in fp32 (fp32 PSUM accumulation over the K tiles).

    Parameters
    ----------
    a_km : HBM float32 (K, M)
        ``A`` transposed, so that the contraction index K lies on the partition axis.
    b_kn : HBM float32 (K, N)

    Returns
    -------
    c_mn : shared HBM float32 (M, N)

    Preconditions: both operands 2-D float32 with the same K; M, N, K >= 1; any sizes, ragged
    edges included (edge tiles are sliced with ``min``, nothing is padded). SBUF holds one A strip
    of ``ceil(K/128) * 128 * 4`` bytes per partition, so the host keeps K <= 16384 per call
    (larger K is split on the host and the partial products are added in fp64).

    Steps
    -----
    1. For each M tile (128 rows of C): DMA the A^T strip ``a_km[:, m-tile]`` into SBUF
       ``a_sb`` (``load_strip``: ceil(K/128) tiles of (<=128, <=128) side by side on the free
       axis, K tile kt at free offset kt * 128).
    2. For each N tile (512 columns of C), in ``matmul_strip_by_hbm``: allocate the PSUM tile
       ``c_ps`` (<=128, <=512) fp32.
    3. For each K tile: DMA ``b_kn[k-tile, n-tile]`` into SBUF ``mov_sb`` (<=128, <=512) and
       issue ``nc_matmul(dst=c_ps, stationary=a_sb[k-tile], moving=mov_sb)`` with
       ``accumulate=False`` for the first K tile and ``True`` after it.
    4. ``store_psum``: ``tensor_copy`` PSUM ``c_ps`` -> SBUF; ``dma_copy`` SBUF -> HBM ``c_mn``.

    Matmuls issued: ceil(M/128) * ceil(N/512) * ceil(K/128).
    """
    m_total = a_km.shape[1]
    n_total = b_kn.shape[1]
    n_mt = (m_total + TILE_M - 1) // TILE_M
    n_nt = (n_total + TILE_N - 1) // TILE_N
    c_mn = nl.ndarray((m_total, n_total), dtype=nl.float32, buffer=nl.shared_hbm)

    for mt in nl.static_range(n_mt):
        m0, msz = tile_span(mt, TILE_M, m_total)
        # Step 1: A^T strip of this M tile, K tile kt at free offset kt * TILE_M (SBUF).
        a_sb = load_strip(a_km, m0, msz, TILE_M)
        for nt in nl.static_range(n_nt):
            n0, nsz = tile_span(nt, TILE_N, n_total)
            # Steps 2-3: one PSUM bank for this output tile, accumulated over the K tiles.
            c_ps = matmul_strip_by_hbm(a_sb, msz, TILE_M, b_kn, n0, nsz)
            # Step 4: PSUM -> SBUF -> HBM (dma_copy cannot read PSUM).
            store_psum(c_mn, m0, n0, c_ps, msz, nsz)
    return c_mn
