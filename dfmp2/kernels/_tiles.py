"""Tile constants shared by the NKI kernels and their host wrappers (no ``nki`` import here).

The values are the NeuronCore-v2/v3 (trn1/trn2) limits of ``nisa.nc_matmul``: the contraction
(partition) axis and the stationary free axis hold at most 128 elements, the moving free axis at
most 512 fp32 elements (one 2 KiB PSUM bank per partition). ``nl.tile_size`` reports the same
numbers on those targets; the kernels use these fixed values so that the host can predict the
tiling (and the instruction counts the tests assert) without importing ``nki``.
"""

from __future__ import annotations

__all__ = [
    "TILE_K",
    "TILE_M",
    "TILE_N",
    "BLOCK",
    "FP32_BYTES",
    "SBUF_RESIDENT_BUDGET",
    "ENERGY_K_TILES",
    "GEMM_M_GROUP",
    "ceil_div",
]

#: Contraction tile: partitions of both matmul operands (``nl.tile_size.pmax``).
TILE_K = 128
#: Stationary free size: rows of one output tile (``nl.tile_size.gemm_stationary_fmax``).
TILE_M = 128
#: Moving free size: columns of one output tile (``nl.tile_size.gemm_moving_fmax``).
TILE_N = 512
#: Block size of the blocked Cholesky / trsm (diagonal blocks factored on the host).
BLOCK = 128
#: Bytes of one float32 element (every kernel operand is float32).
FP32_BYTES = 4
#: Bytes per partition that the kernels let their long-lived SBUF tensors (operand strips held
#: across a loop) occupy. The smallest SBUF partition is 192 KiB (trn1); the rest is left to the
#: short-lived tiles of the loop bodies and to the compiler.
SBUF_RESIDENT_BUDGET = 128 * 1024

#: K tiles (128 auxiliary rows each) of one chunk of the operand strips the fused pair kernels
#: hold in SBUF. naux <= 24 * 128 = 3072 is one chunk: the kernels then keep a panel of the
#: window's strips in SBUF and reuse it for every tile they meet. A larger naux streams the
#: chunks for every tile and keeps accumulating in PSUM: at most four 128-column chunks
#: (exchange) or a 128- and a 512-column one (direct), each possibly allocated again before the
#: last is released, 8*24*128 or 2*24*640 fp32 words per partition (96 or 120 KiB).
ENERGY_K_TILES = 24

#: M tiles of one gemm group: every moving tile of B loaded from HBM serves this many stationary
#: A tiles (one PSUM bank each), so the gemm reads B from HBM once per 512 rows of C, not per 128.
GEMM_M_GROUP = 4


def ceil_div(a: int, b: int) -> int:
    """Number of tiles of size ``b`` that cover ``a`` elements."""
    return (a + b - 1) // b
