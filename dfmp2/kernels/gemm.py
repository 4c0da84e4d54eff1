"""NKI 0.3.0 kernel: tiled fp32 GEMM ``C = A @ B`` with ``A`` passed transposed.

Imported only after ``nki`` is importable (the real package, or dfmp2's emulator installed by the
host wrapper). Written with ``nki.isa`` instructions, ``nl.ndarray`` allocations, slices and
plain Python loops (fully unrolled by the compiler).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from ._tiles import TILE_K, TILE_M, TILE_N

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
       ``a_sb`` (ceil(K/128) tiles of (<=128, <=128) side by side on the free axis).
    2. For each N tile (512 columns of C): allocate the PSUM tile ``c_ps`` (<=128, <=512) fp32.
    3. For each K tile: DMA ``b_kn[k-tile, n-tile]`` into SBUF ``b_sb`` (<=128, <=512) and issue
       ``nc_matmul(dst=c_ps, stationary=a_sb[k-tile], moving=b_sb)`` with ``accumulate=False``
       for the first K tile and ``True`` after it.
    4. ``tensor_copy`` PSUM ``c_ps`` -> SBUF ``c_sb``; ``dma_copy`` SBUF ``c_sb`` -> HBM ``c_mn``.

    Matmuls issued: ceil(M/128) * ceil(N/512) * ceil(K/128).
    """
    k_total = a_km.shape[0]
    m_total = a_km.shape[1]
    n_total = b_kn.shape[1]
    n_kt = (k_total + TILE_K - 1) // TILE_K
    n_mt = (m_total + TILE_M - 1) // TILE_M
    n_nt = (n_total + TILE_N - 1) // TILE_N
    c_mn = nl.ndarray((m_total, n_total), dtype=nl.float32, buffer=nl.shared_hbm)

    for mt in nl.static_range(n_mt):
        m0 = mt * TILE_M
        msz = min(TILE_M, m_total - m0)
        # Step 1: A^T strip of this M tile, K tile kt at free offset kt * TILE_M (SBUF).
        a_sb = nl.ndarray((TILE_K, n_kt * TILE_M), dtype=nl.float32, buffer=nl.sbuf)
        for kt in nl.static_range(n_kt):
            k0 = kt * TILE_K
            ksz = min(TILE_K, k_total - k0)
            f0 = kt * TILE_M
            nisa.dma_copy(dst=a_sb[0:ksz, f0:f0 + msz], src=a_km[k0:k0 + ksz, m0:m0 + msz])

        for nt in nl.static_range(n_nt):
            n0 = nt * TILE_N
            nsz = min(TILE_N, n_total - n0)
            # Step 2: one PSUM bank for this output tile.
            c_ps = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for kt in nl.static_range(n_kt):
                k0 = kt * TILE_K
                ksz = min(TILE_K, k_total - k0)
                f0 = kt * TILE_M
                # Step 3: moving tile (SBUF), then accumulate in PSUM.
                b_sb = nl.ndarray((TILE_K, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=b_sb[0:ksz, 0:nsz], src=b_kn[k0:k0 + ksz, n0:n0 + nsz])
                nisa.nc_matmul(
                    dst=c_ps[0:msz, 0:nsz],
                    stationary=a_sb[0:ksz, f0:f0 + msz],
                    moving=b_sb[0:ksz, 0:nsz],
                    accumulate=kt > 0,
                )
            # Step 4: PSUM -> SBUF -> HBM (dma_copy cannot read PSUM).
            c_sb = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=c_sb[0:msz, 0:nsz], src=c_ps[0:msz, 0:nsz])
            nisa.dma_copy(dst=c_mn[m0:m0 + msz, n0:n0 + nsz], src=c_sb[0:msz, 0:nsz])
    return c_mn
