"""Tile-level building blocks shared by the NKI 0.3.0 kernels (device-side helpers).

Plain module-level functions that the kernels call while they are traced: the compiler inlines
them, so every helper issues exactly the ``nki.isa`` instructions a kernel would have written in
place, in the same order. They follow the kernels' rules (``nki.isa`` instructions,
``nl.ndarray`` allocations, slices, ``nl.static_range`` loops, ``min`` for edge tiles) and are
checked by the emulator's AST lint: each helper uses ``nisa``/``nl`` or is called by one that does.

Imported only by the kernel modules, after ``nki`` is importable (the tile constants that host
code needs stay in :mod:`._tiles`, which never imports ``nki``).

Conventions: a *strip* is an SBUF tensor holding all 128-row K tiles (partition tiles) of an
operand side by side on the free axis, K tile ``kt`` at free offset ``kt * stride`` (the gemm
and trsm kernels); a *panel* is an SBUF tensor (128, tiles, K tiles, 128) of the pair kernels'
tile-major B. Helpers that return an SBUF or PSUM tile allocate it themselves at the full tile
shape and write only the ``[0:rows, 0:cols]`` corner the caller names; edge tiles are sliced in
the gemm and trsm kernels, and zero-padded by the host in the pair kernels' B (never read past
the real rows and columns of a tile).
"""

import nki.isa as nisa
import nki.language as nl

from ._tiles import TILE_K, TILE_M, TILE_N

__all__ = [
    "tile_span",
    "load_block",
    "load_tile",
    "load_strip",
    "load_panels",
    "stream_buffers",
    "load_panels_into",
    "load_chunk_pair",
    "matmul_tile",
    "accumulate_strips",
    "accumulate_products",
    "matmul_strip_by_hbm",
    "subtract_psum",
    "store_psum",
    "row_dot",
    "load_neg_eps",
    "load_row_denominators",
    "store_row",
    "row_tiles",
    "load_row_panels_into",
    "load_row_panels",
    "program_rows",
    "reciprocal_denominators",
    "weighted_row_sums",
    "direct_row",
    "mirror_tile",
    "tile_pair_sums",
]


def tile_span(t, tile, total):
    """Start and size ``(t * tile, min(tile, total - t * tile))`` of tile ``t`` of an axis of
    ``total`` elements cut into tiles of ``tile`` (the last one ragged). Trace-time integer
    arithmetic only, no HBM/SBUF/PSUM operands; preconditions: ``0 <= t < ceil(total / tile)``.
    """
    start = t * tile
    return start, min(tile, total - start)


def load_block(src_hbm):
    """DMA a square diagonal block HBM ``src_hbm`` (nb, nb) into a new SBUF tile (128, 128).

    Preconditions: ``1 <= nb <= 128``. Returns the SBUF tile, rows and columns ``0:nb`` written
    (one ``dma_copy``).
    """
    nb = src_hbm.shape[0]
    blk_sb = nl.ndarray((TILE_K, TILE_M), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=blk_sb[0:nb, 0:nb], src=src_hbm[0:nb, 0:nb])
    return blk_sb


def load_tile(src_hbm, r0, c0, rsz, csz):
    """DMA the HBM tile ``src_hbm[r0:r0+rsz, c0:c0+csz]`` into a new SBUF tile (128, 512).

    Preconditions: ``1 <= rsz <= 128`` (partitions), ``1 <= csz <= 512``. Returns the SBUF tile
    with ``[0:rsz, 0:csz]`` written (one ``dma_copy``).
    """
    tile_sb = nl.ndarray((TILE_K, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile_sb[0:rsz, 0:csz], src=src_hbm[r0:r0 + rsz, c0:c0 + csz])
    return tile_sb


def load_strip(src_hbm, c0, csz, stride):
    """DMA columns ``c0:c0+csz`` of HBM ``src_hbm`` (K, ...) into a new SBUF strip, one
    ``dma_copy`` per 128-row K tile: K tile ``kt`` (rows ``kt*128 : kt*128 + ksz``) lands on
    partitions ``0:ksz`` at free offset ``kt * stride``.

    Preconditions: K = ``src_hbm.shape[0]`` >= 1 (ragged last tile allowed), ``1 <= csz <=
    stride``. Returns the SBUF strip (128, ceil(K/128) * stride), ``ceil(K/128) * stride * 4``
    bytes per partition.
    """
    k_total = src_hbm.shape[0]
    n_kt = (k_total + TILE_K - 1) // TILE_K
    strip_sb = nl.ndarray((TILE_K, n_kt * stride), dtype=nl.float32, buffer=nl.sbuf)
    for kt in nl.static_range(n_kt):
        k0, ksz = tile_span(kt, TILE_K, k_total)
        f0 = kt * stride
        nisa.dma_copy(dst=strip_sb[0:ksz, f0:f0 + csz], src=src_hbm[k0:k0 + ksz, c0:c0 + csz])
    return strip_sb


def load_panels(src_tm, split, i, tile0, ntiles, kt0, nkt):
    """DMA virtual tiles ``tile0 : tile0+ntiles`` of orbital ``i``, K tiles ``kt0 : kt0+nkt``,
    of a tile-major HBM operand into a new SBUF panel, one ``dma_copy`` (two when ``split``):
    per partition one contiguous run of ``ntiles * nkt * 512`` bytes when ``nkt`` is every K
    tile (``nkt * 512`` otherwise), near the DMA's full rate.

    Operands: ``src_tm`` HBM (128, n, n_tiles, n_kt, 128) float32 with ``src_tm[p, i, a_t, t,
    c] = B_i[a_t*128 + c, t*128 + p]`` (the host lays B out so, both indices zero-padded to
    whole tiles), or with ``split`` bfloat16 (2, ...): ``[0]`` the high part of B and ``[1]``
    the low part (B - high, rounded; the host splits in fp64). Returns ``(hi_sb, lo_sb)``: SBUF
    panels (128, ntiles, nkt, 128), ``[:, a, t, :]`` holding virtual tile ``tile0 + a`` of K
    tile ``kt0 + t``; split, two bfloat16 panels (no conversion in the DMA; the two take the
    bytes of one float32 panel, in HBM and in SBUF); otherwise one float32 panel, returned
    twice (lo unused). Preconditions:
    ``0 <= tile0 < tile0 + ntiles <= n_tiles``, ``0 <= kt0 < kt0 + nkt <= n_kt``.
    """
    hi_sb, lo_sb = stream_buffers(split, ntiles, nkt)
    load_panels_into(hi_sb, lo_sb, 0, src_tm, split, i, tile0, ntiles, kt0, nkt)
    return hi_sb, lo_sb


def stream_buffers(split, ntiles, nkt):
    """New SBUF panels ``(hi_sb, lo_sb)`` (128, ntiles, nkt, 128) for :func:`load_panels_into`:
    two bfloat16 panels when ``split``, else one float32 panel returned twice. Allocated once
    with two tiles' slots, they double-buffer a stream of tiles: the kernel loads tile t+1 into
    one slot while the engines still read tile t from the other (explicit, so the overlap does
    not depend on the compiler's allocator)."""
    if split:
        hi_sb = nl.ndarray((TILE_K, ntiles, nkt, TILE_M), dtype=nl.bfloat16, buffer=nl.sbuf)
        lo_sb = nl.ndarray((TILE_K, ntiles, nkt, TILE_M), dtype=nl.bfloat16, buffer=nl.sbuf)
        return hi_sb, lo_sb
    panel_sb = nl.ndarray((TILE_K, ntiles, nkt, TILE_M), dtype=nl.float32, buffer=nl.sbuf)
    return panel_sb, panel_sb


def load_panels_into(hi_sb, lo_sb, slot, src_tm, split, i, tile0, ntiles, kt0, nkt):
    """:func:`load_panels` into existing SBUF panels (from :func:`stream_buffers`), at tile
    slots ``slot : slot+ntiles``: one ``dma_copy`` (two when ``split``). Preconditions: those
    of :func:`load_panels`, and the slots within the panels."""
    if split:
        nisa.dma_copy(dst=hi_sb[0:TILE_K, slot:slot + ntiles, 0:nkt, 0:TILE_M],
                      src=src_tm[0, 0:TILE_K, i, tile0:tile0 + ntiles, kt0:kt0 + nkt, 0:TILE_M])
        nisa.dma_copy(dst=lo_sb[0:TILE_K, slot:slot + ntiles, 0:nkt, 0:TILE_M],
                      src=src_tm[1, 0:TILE_K, i, tile0:tile0 + ntiles, kt0:kt0 + nkt, 0:TILE_M])
        return
    nisa.dma_copy(dst=hi_sb[0:TILE_K, slot:slot + ntiles, 0:nkt, 0:TILE_M],
                  src=src_tm[0:TILE_K, i, tile0:tile0 + ntiles, kt0:kt0 + nkt, 0:TILE_M])


def matmul_tile(ksz, stat_sb, s0, ssz, mov_sb, n0, nsz):
    """One-K-tile product into a new PSUM tile (128, 512):
    ``dst[0:ssz, 0:nsz] = stat_sb[0:ksz, s0:s0+ssz].T @ mov_sb[0:ksz, n0:n0+nsz]``.

    Operands: ``stat_sb`` (stationary) and ``mov_sb`` (moving) in SBUF, contraction on their
    partitions ``0:ksz``. Preconditions: ``1 <= ksz <= 128``, ``1 <= ssz <= 128``,
    ``1 <= nsz <= 512``. One ``nc_matmul`` with ``accumulate=False``; returns the PSUM tile.
    """
    dst_ps = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=dst_ps[0:ssz, 0:nsz], stationary=stat_sb[0:ksz, s0:s0 + ssz],
                   moving=mov_sb[0:ksz, n0:n0 + nsz], accumulate=False)
    return dst_ps


def load_chunk_pair(buf_i, buf_j, slot, b_i, b_j, split, r, j, tile, kt0, nkt):
    """K tiles ``kt0 : kt0+nkt`` of virtual tile ``tile`` of ``B_i`` (the orbital in device
    register ``r``, :func:`row_tiles`) and of ``B_j`` (orbital ``j``, a trace-time integer)
    into tile slot ``slot`` of two SBUF stream buffers (:func:`stream_buffers`, ``nkt`` within
    their K extent): two ``dma_copy`` (four when ``split``)."""
    load_row_panels_into(buf_i[0], buf_i[1], slot, b_i, split, r, tile, 1, kt0, nkt)
    load_panels_into(buf_j[0], buf_j[1], slot, b_j, split, j, tile, 1, kt0, nkt)


def accumulate_strips(dst_ps, c0, psz, fsz, stat_sb, s_tile, mov_sb, m_tile, kt0, nkt, opens):
    """Add the products of a chunk of K tiles to a PSUM tile:
    ``dst_ps[0:psz, c0:c0+fsz] (+)= sum_t stat_sb[:, s_tile, t, 0:psz].T @ mov_sb[:, m_tile, t,
    0:fsz]`` over the tiles ``t < nkt`` of two SBUF panels (:func:`load_panels`) that hold the
    global K tiles ``kt0 : kt0+nkt`` of the contraction (whole 128-row tiles: the host pads).

    Preconditions: ``1 <= psz, fsz <= 128``, ``dst_ps`` a PSUM tile whose ``[0:psz,
    c0:c0+fsz]`` block lies in one bank. One ``nc_matmul`` per tile. ``opens``: this call's
    product for global K tile 0 is the first write of the block (``accumulate=False``); every
    other matmul accumulates, so successive chunks and further products (the split-precision
    terms) add up in PSUM.
    """
    for t in nl.static_range(nkt):
        nisa.nc_matmul(dst=dst_ps[0:psz, c0:c0 + fsz],
                       stationary=stat_sb[0:TILE_K, s_tile, t, 0:psz],
                       moving=mov_sb[0:TILE_K, m_tile, t, 0:fsz],
                       accumulate=kt0 + t > 0 or not opens)


def accumulate_products(dst_ps, c0, psz, fsz, stat, s_tile, mov, m_tile, kt0, nkt, split):
    """:func:`accumulate_strips` of one operand pair: float32 panels (``stat``, ``mov`` are
    ``(panel, panel)`` pairs from :func:`load_panels`), or with ``split`` the three bfloat16
    products ``hi*hi + hi*lo + lo*hi`` accumulated in one float32 PSUM block (the ``lo*lo``
    term and the residuals, at most ``3 * 2^-18`` of ``|a||b|``, are dropped). ``nkt`` or
    ``3 * nkt`` ``nc_matmul``.
    """
    accumulate_strips(dst_ps, c0, psz, fsz, stat[0], s_tile, mov[0], m_tile, kt0, nkt, True)
    if split:
        accumulate_strips(dst_ps, c0, psz, fsz, stat[0], s_tile, mov[1], m_tile, kt0, nkt,
                          False)
        accumulate_strips(dst_ps, c0, psz, fsz, stat[1], s_tile, mov[0], m_tile, kt0, nkt,
                          False)


def matmul_strip_by_hbm(stat_sb, ssz, stride, mov_hbm, n0, nsz):
    """Product of an SBUF strip and HBM columns, accumulated over the K tiles into a new PSUM
    tile (128, 512): ``dst[0:ssz, 0:nsz] = sum_kt stat_sb[kt][:, 0:ssz].T @ mov_hbm[k-tile,
    n0:n0+nsz]``; each moving K tile is DMA'd HBM -> SBUF (:func:`load_tile`) just before its
    matmul.

    Operands: ``stat_sb`` an SBUF strip (see :func:`load_strip`) of the K = ``mov_hbm.shape[0]``
    rows, ``mov_hbm`` (K, N) in HBM. Preconditions: ``1 <= ssz <= min(128, stride)``,
    ``1 <= nsz <= 512``, ``n0 + nsz <= N``. Per K tile one ``dma_copy`` and one ``nc_matmul``
    (``accumulate=False`` for the first, ``True`` after); returns the PSUM tile.
    """
    k_total = mov_hbm.shape[0]
    n_kt = (k_total + TILE_K - 1) // TILE_K
    dst_ps = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.static_range(n_kt):
        k0, ksz = tile_span(kt, TILE_K, k_total)
        f0 = kt * stride
        mov_sb = load_tile(mov_hbm, k0, n0, ksz, nsz)
        nisa.nc_matmul(dst=dst_ps[0:ssz, 0:nsz], stationary=stat_sb[0:ksz, f0:f0 + ssz],
                       moving=mov_sb[0:ksz, 0:nsz], accumulate=kt > 0)
    return dst_ps


def subtract_psum(src_hbm, r0, c0, sub_ps, rsz, csz):
    """``src_hbm[r0:r0+rsz, c0:c0+csz] - sub_ps[0:rsz, 0:csz]`` into a new SBUF tile (128, 512).

    Operands: ``src_hbm`` in HBM (DMA'd to an SBUF tile first, :func:`load_tile`), ``sub_ps`` a
    PSUM tile. Preconditions: ``1 <= rsz <= 128``, ``1 <= csz <= 512``. One ``dma_copy`` and one
    VectorE ``tensor_tensor(subtract)`` (SBUF - PSUM); returns the SBUF tile, ``[0:rsz, 0:csz]``
    written.
    """
    src_sb = load_tile(src_hbm, r0, c0, rsz, csz)
    diff_sb = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=diff_sb[0:rsz, 0:csz], data1=src_sb[0:rsz, 0:csz],
                       data2=sub_ps[0:rsz, 0:csz], op=nl.subtract)
    return diff_sb


def store_psum(dst_hbm, r0, c0, src_ps, rsz, csz):
    """Write the PSUM tile corner ``src_ps[0:rsz, 0:csz]`` to HBM ``dst_hbm[r0:r0+rsz,
    c0:c0+csz]`` through a new SBUF tile (128, 512): ``tensor_copy`` PSUM -> SBUF, then
    ``dma_copy`` SBUF -> HBM (``dma_copy`` cannot read PSUM).

    Preconditions: ``1 <= rsz <= 128``, ``1 <= csz <= 512``; ``dst_hbm`` a (shared) HBM tensor.
    """
    out_sb = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=out_sb[0:rsz, 0:csz], src=src_ps[0:rsz, 0:csz])
    nisa.dma_copy(dst=dst_hbm[r0:r0 + rsz, c0:c0 + csz], src=out_sb[0:rsz, 0:csz])


def row_dot(dst_sb, x_sb, y_sb, rsz, fsz):
    """Row-wise dot products ``dst_sb[p, 0] = sum_f x_sb[p, f] * y_sb[p, f]`` for ``p < rsz``.

    Operands: ``x_sb``, ``y_sb`` (rsz, fsz) SBUF views, ``dst_sb`` a (rsz, 1) SBUF view (one
    column of an accumulator; overwritten, not added to). Preconditions: ``1 <= rsz <= 128``,
    ``fsz >= 1``. Allocates an SBUF product tile (128, fsz); one VectorE ``tensor_tensor``
    (multiply) and one ``tensor_reduce(add)`` over the free axis.
    """
    prod_sb = nl.ndarray((TILE_M, fsz), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=prod_sb[0:rsz, 0:fsz], data1=x_sb, data2=y_sb, op=nl.multiply)
    nisa.tensor_reduce(dst=dst_sb, op=nl.add, data=prod_sb[0:rsz, 0:fsz], axis=1, keepdims=True)


def load_neg_eps(neg_eps_row):
    """DMA HBM ``neg_eps_row`` (128, nvb), ``-e_b`` on every partition, into a new SBUF tile
    (128, nvb); one ``dma_copy``. Preconditions: ``nvb >= 1``."""
    nvb = neg_eps_row.shape[1]
    negv_sb = nl.ndarray((TILE_M, nvb), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=negv_sb[0:TILE_M, 0:nvb], src=neg_eps_row[0:TILE_M, 0:nvb])
    return negv_sb


def load_row_denominators(d_col, r):
    """DMA the host-computed parts of the MP2 denominators of row ``r``'s pairs into SBUF.

    Operands: HBM ``d_col`` (nr, nva, nj), ``d_col[r, a, j] = e_i + e_j - e_a`` (row r, column
    j); ``r`` the device register of an ``nl.dynamic_range`` loop (the row is selected by
    ``.ap(scalar_offset=r, indirect_dim=0)``). Returns SBUF (128, ceil(nva/128) * nj) holding
    tile ``ta`` of the row (a = ``ta*128 : ta*128 + asz``) on partitions ``0:asz`` at free
    offset ``ta * nj``. Preconditions: ``nva, nj >= 1``. ``ceil(nva/128)`` ``dma_copy``.
    """
    nva = d_col.shape[1]
    nj = d_col.shape[2]
    n_at = (nva + TILE_M - 1) // TILE_M
    dcol_sb = nl.ndarray((TILE_M, n_at * nj), dtype=nl.float32, buffer=nl.sbuf)
    for ta in nl.static_range(n_at):
        a0, asz = tile_span(ta, TILE_M, nva)
        nisa.dma_copy(dst=dcol_sb[0:asz, ta * nj:(ta + 1) * nj],
                      src=d_col.ap([[nj, asz], [1, nj]], offset=a0 * nj, scalar_offset=r,
                                   indirect_dim=0))
    return dcol_sb


def store_row(partials, acc_sb, r, ncol):
    """DMA SBUF ``acc_sb[0:128, 0:ncol]`` into row ``r`` of the shared HBM output ``partials``
    (nr, 128, ncol) (``.ap(scalar_offset=r, indirect_dim=0)``; ``r`` a ``dynamic_range``
    register); one ``dma_copy``."""
    nisa.dma_copy(dst=partials.ap([[ncol, TILE_M], [1, ncol]], offset=0, scalar_offset=r,
                                  indirect_dim=0),
                  src=acc_sb[0:TILE_M, 0:ncol])


def row_tiles(src_tm, split, part, r, tile0, ntiles, kt0, nkt):
    """The HBM access pattern of virtual tiles ``tile0 : tile0+ntiles``, K tiles ``kt0 :
    kt0+nkt``, of the orbital in device register ``r`` of a tile-major operand (see
    :func:`load_panels`; ``part`` 0 or 1 selects the high or low part when ``split``), shaped
    (128, ntiles, nkt, 128) like an SBUF panel: ``src_tm.ap`` with ``scalar_offset=r`` on the
    orbital axis (1, or 2 when ``split``), so one compiled body serves every orbital of a
    ``dynamic_range`` loop. No instruction; per partition one contiguous run when ``nkt`` is
    every K tile."""
    n = src_tm.shape[-4]
    n_tiles = src_tm.shape[-3]
    n_kt = src_tm.shape[-2]
    per_partition = n * n_tiles * n_kt * TILE_M
    base = part * TILE_K * per_partition
    return src_tm.ap([[per_partition, TILE_K], [n_kt * TILE_M, ntiles], [TILE_M, nkt],
                      [1, TILE_M]],
                     offset=base + (tile0 * n_kt + kt0) * TILE_M, scalar_offset=r,
                     indirect_dim=2 if split else 1)


def load_row_panels_into(hi_sb, lo_sb, slot, src_tm, split, r, tile0, ntiles, kt0, nkt):
    """:func:`load_panels_into` for the orbital in device register ``r`` (:func:`row_tiles`):
    one ``dma_copy`` (two when ``split``) from the HBM operand into tile slots ``slot :
    slot+ntiles`` of the SBUF panels."""
    nisa.dma_copy(dst=hi_sb[0:TILE_K, slot:slot + ntiles, 0:nkt, 0:TILE_M],
                  src=row_tiles(src_tm, split, 0, r, tile0, ntiles, kt0, nkt))
    if split:
        nisa.dma_copy(dst=lo_sb[0:TILE_K, slot:slot + ntiles, 0:nkt, 0:TILE_M],
                      src=row_tiles(src_tm, split, 1, r, tile0, ntiles, kt0, nkt))


def load_row_panels(src_tm, split, r, tile0, ntiles, kt0, nkt):
    """:func:`load_panels` for the orbital in device register ``r``: new SBUF panels
    ``(hi_sb, lo_sb)``, one ``dma_copy`` (two when ``split``)."""
    hi_sb, lo_sb = stream_buffers(split, ntiles, nkt)
    load_row_panels_into(hi_sb, lo_sb, 0, src_tm, split, r, tile0, ntiles, kt0, nkt)
    return hi_sb, lo_sb


def program_rows(nrows):
    """``(r0, r1)``: the rows (orbitals i) of this SPMD program, a contiguous share of
    ``nrows``.

    A launch without a grid (``nl.program_ndim() == 0``) is one program with every row; a
    ``kernel[n]`` launch (LNC=2 on trn2: the two physical cores of a logical NeuronCore) gives
    program ``k`` the rows ``k*q : min((k+1)*q, nrows)``, ``q = ceil(nrows / n)``: the host
    launches ``n`` programs only when every one gets a row (``nrows >= n``). No operand: the
    caller loops over its rows and writes their HBM output rows.
    """
    if nl.program_ndim() == 0:
        nprog, pid = 1, 0
    else:
        nprog, pid = nl.num_programs(0), nl.program_id(0)
    share = (nrows + nprog - 1) // nprog
    r0 = pid * share
    return r0, min(nrows, r0 + share)


def reciprocal_denominators(negv_sb, b0, dcol_sb, asz, bsz):
    """``R[p, f] = 1 / (dcol_sb[p, 0] - e_{b0+f})`` of one (a tile, b columns) block of a pair.

    Operands: ``negv_sb`` SBUF (128, >= b0+bsz) holding ``-e_b`` (see
    :func:`load_neg_eps`); ``dcol_sb`` (asz, 1) SBUF view of ``e_i + e_j - e_a``.
    Preconditions: ``1 <= asz <= 128``, ``bsz >= 1``, every denominator nonzero. ``D`` on the
    ScalarE (``activation(copy)`` with the (P, 1) ``bias``: the identity, no approximated
    function, one fp32 add; it takes the add off the VectorE), ``R`` by VectorE ``reciprocal``
    (no ScalarE approximation); returns SBUF ``r_sb`` (128, bsz), rows ``0:asz`` written; 2
    instructions.
    """
    d_sb = nl.ndarray((TILE_M, bsz), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=d_sb[0:asz, 0:bsz], op=nl.copy, data=negv_sb[0:asz, b0:b0 + bsz],
                    bias=dcol_sb)
    r_sb = nl.ndarray((TILE_M, bsz), dtype=nl.float32, buffer=nl.sbuf)
    nisa.reciprocal(dst=r_sb[0:asz, 0:bsz], data=d_sb[0:asz, 0:bsz])
    return r_sb


def weighted_row_sums(dst_sb, t_blk, r_sb, asz, bsz):
    """``W = T * R`` and the row sums ``dst_sb[p, 0] = sum_f W[p, f] * T[p, f]``.

    Operands: ``t_blk`` (asz, bsz) view of T in SBUF or PSUM; ``r_sb`` SBUF (128, >= bsz) from
    :func:`reciprocal_denominators`; ``dst_sb`` (asz, 1) SBUF view (overwritten). Preconditions:
    ``1 <= asz <= 128``, ``bsz >= 1``. Returns SBUF ``w_sb`` (128, bsz), rows ``0:asz``
    written; 3 instructions (``tensor_tensor`` and :func:`row_dot`).
    """
    w_sb = nl.ndarray((TILE_M, bsz), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=w_sb[0:asz, 0:bsz], data1=t_blk, data2=r_sb[0:asz, 0:bsz],
                       op=nl.multiply)
    row_dot(dst_sb, w_sb[0:asz, 0:bsz], t_blk, asz, bsz)
    return w_sb


def direct_row(dst_sb, t_blk, negv_sb, b0, dcol_sb, asz, bsz):
    """Direct MP2 row sums ``dst_sb[p, 0] = sum_f T[p, f]^2 / D[p, f]`` of one (a tile, b
    columns ``b0:b0+bsz``) block of a pair, ``D[p, f] = dcol_sb[p, 0] - e_{b0+f}``; returns
    the weighted amplitudes ``W = T / D``.

    Operands: ``t_blk`` (asz, bsz) view of T in SBUF or PSUM; ``negv_sb``, ``dcol_sb`` as in
    :func:`reciprocal_denominators`; ``dst_sb`` (asz, 1) SBUF view (overwritten).
    Preconditions: ``1 <= asz <= 128``, ``bsz >= 1``, D nonzero. Returns SBUF ``w_sb``
    (128, bsz); 5 instructions.
    """
    r_sb = reciprocal_denominators(negv_sb, b0, dcol_sb, asz, bsz)
    return weighted_row_sums(dst_sb, t_blk, r_sb, asz, bsz)


def mirror_tile(t_ps, psz, fsz):
    """The transpose of the PSUM tile corner ``t_ps[0:psz, 0:fsz]`` into a new PSUM tile
    (128, 128), corner ``[0:fsz, 0:psz]``: the ScalarE evacuates PSUM -> SBUF
    (``activation(copy)``, the identity: exact; the TensorE transposes SBUF data only, and the
    VectorE is the epilogue's busiest engine), then ``nc_transpose`` on the TensorE.

    Preconditions: ``1 <= psz, fsz <= 128``. Returns ``(t_sb, tt_ps)``: the SBUF copy (128,
    128) and the transposed PSUM tile; 2 instructions.
    """
    t_sb = nl.ndarray((TILE_M, TILE_M), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=t_sb[0:psz, 0:fsz], op=nl.copy, data=t_ps[0:psz, 0:fsz])
    tt_ps = nl.ndarray((TILE_M, TILE_M), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_transpose(dst=tt_ps[0:fsz, 0:psz], data=t_sb[0:psz, 0:fsz],
                      engine=nisa.engine.tensor)
    return t_sb, tt_ps


def tile_pair_sums(acc_sb, negv_sb, dcol_sb, t1_ps, tt_ps, off, col, c_dcol, b0, asz, bsz):
    """Steps 4-5 of ``mp2_energy.mp2_pair_energy_kernel`` for one tile pair (w, tb): the direct,
    mirrored-direct and exchange row sums into SBUF ``acc_sb[0:asz, col:col+3]``.

    Operands: PSUM ``t1_ps[0:asz, 0:bsz] = T[w, tb]``; off the diagonal (``off``) PSUM
    ``tt_ps[0:asz, 0:bsz] = T[tb, w]^T`` (the mirrored tile, computed in this layout by the
    TensorE: element (a, b) is T_ba, the exchange partner of T_ab); on the diagonal ``tt_ps``
    is ``t1_ps`` and asz == bsz, and the partners come from a TensorE transpose of it
    (:func:`mirror_tile`). SBUF ``negv_sb`` (-e_b) and ``dcol_sb`` (column ``c_dcol``: e_i + e_j
    - e_a of the window tile). Preconditions: ``1 <= asz, bsz <= 128``. The mirrored tile's
    exchange sum equals the tile's own (one virtual space, D symmetric), so column ``col + 2``
    stands for both and the host doubles it off the diagonal; on the diagonal column ``col +
    1`` is left as set (0). 9 instructions on the diagonal, 10 off it.
    """
    if off:
        t1_blk = t1_ps[0:asz, 0:bsz]
    else:
        # Step 4: the exchange partners within the diagonal tile, by a TensorE transpose.
        t1_sb, tt_ps = mirror_tile(t1_ps, asz, asz)
        t1_blk = t1_sb[0:asz, 0:bsz]
    # Step 5: R, then the direct and exchange row sums of the tile pair.
    r_sb = reciprocal_denominators(negv_sb, b0, dcol_sb[0:asz, c_dcol:c_dcol + 1], asz, bsz)
    w_sb = weighted_row_sums(acc_sb[0:asz, col:col + 1], t1_blk, r_sb, asz, bsz)
    row_dot(acc_sb[0:asz, col + 2:col + 3], w_sb[0:asz, 0:bsz], tt_ps[0:asz, 0:bsz], asz, bsz)
    if off:
        weighted_row_sums(acc_sb[0:asz, col + 1:col + 2], tt_ps[0:asz, 0:bsz], r_sb, asz, bsz)
