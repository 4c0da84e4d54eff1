"""NKI 0.3.0 kernels: fused DF-MP2 pair sums of a block of occupied pairs, at any size.

For every pair (i, j) of the block the kernels form ``T_ab = (ia|jb) = sum_P B_i[P, a] B_j[P, b]``
on the TensorE (fp32 PSUM accumulation over the auxiliary tiles), keep T on chip and reduce

    DIRECT_ij = sum_ab T_ab^2 / D_ab,   EX_ij = sum_ab T_ab T_ba / D_ab,
    D_ab = e_i + e_j - e_a - e_b   (e_a of the i side's virtuals, e_b of the j side's)

to per-partition partial sums. Only those partial sums go back to HBM; the host adds them in
fp64 and applies the pair weights (``nki_ops.mp2_pair_sums``). Two kernels, one per variant
(NKI specialises on shapes, and the host passes only float32 arrays, so the variant is a kernel,
not a flag):

- :func:`mp2_pair_energy_kernel`: direct and exchange sums of one virtual space (nva == nvb,
  the same orbital energies), by 128 x 128 tile pairs (ta <= tb) of T: each tile pair needs both
  ``T[ta, tb]`` and ``T[tb, ta]`` for its direct sums, and the exchange partners of one are the
  elements of the other transposed, so the TensorE forms the second directly in that layout
  (its operands' roles swapped): nothing is computed twice, nothing off the diagonal is
  transposed, and no T row is held whole.
- :func:`mp2_pair_direct_kernel`: the direct sum only, of rectangular blocks (nva != nvb
  allowed; the αβ blocks of an open shell), by (128-row, 512-column) tiles of T.

A launch covers the pairs of ``nr`` orbitals i (the *rows*) with ``nj`` orbitals j (the
*columns*). The rows run in a device loop, ``nl.dynamic_range``: its body, one row with all
columns, is compiled once and the hardware repeats it, so the program size does not grow with
the rows and one launch serves every row a block of columns meets (persistent launches; the
row's B_i, denominators and output are addressed through ``.ap(scalar_offset=row)``). The
columns are unrolled. In an SPMD launch (``kernel[2]``, trn2's LNC=2) each program loops over
its share of the rows (``program_rows``).

No operand need be held whole: the host launches a window of a-tile rows at a time, sized so
that the window's B strips (the *panel*) stay in SBUF and are reused by every tile they meet,
when naux is one chunk of ``ENERGY_K_TILES`` auxiliary tiles; a larger naux streams the strips
in chunks for every tile and keeps accumulating in PSUM. SBUF use is bounded for any nvir and
naux (``nki_ops._energy_sbuf_words``).
"""

import nki
import nki.isa as nisa
import nki.language as nl

from ._blocks import (
    accumulate_products,
    direct_row,
    load_chunk_pair,
    load_neg_eps,
    load_panels,
    load_panels_into,
    load_row_denominators,
    load_row_panels,
    load_row_panels_into,
    program_rows,
    store_row,
    stream_buffers,
    tile_pair_sums,
    tile_span,
)
from ._tiles import ENERGY_K_TILES, TILE_M, TILE_N

__all__ = ["mp2_pair_energy_kernel", "mp2_pair_direct_kernel"]


@nki.jit
def mp2_pair_energy_kernel(b_i, b_j, d_col, neg_eps_row):
    """Direct and exchange partial sums of the nr x nj pairs of one virtual space, for the rows
    of a window of a tiles.

    The host passes the virtual space from the window's first row on (``nv`` columns per
    orbital: the window and every later column); the window is the first ``nrows`` of them.

    Parameters
    ----------
    b_i : HBM float32 (128, nr, n_at, n_kt, 128), or bfloat16 (2, 128, ...) split
        Tile-major B of the row orbitals i: ``b_i[p, i, a_t, t, c] = B_i[a_t*128 + c, t*128 +
        p]`` (both indices zero-padded to whole tiles; see ``nki_ops._tile_major``); split, the
        bfloat16 high and low parts (``--nki-matmul bf16x3``).
    b_j : the same for the column orbitals j (nj of them).
    d_col : HBM float32 (nr, nrows, nj)
        ``d_col[i, a, j] = e_i + e_j - e_a`` for the window's rows (host fp64, rounded once).
    neg_eps_row : HBM float32 (128, nv)
        ``-e_b`` of all nv virtuals replicated on the 128 partitions (the host's broadcast row).

    Returns
    -------
    partials : shared HBM float32 (nr, 128, 3 * nj * n_wt * n_at)
        n_wt = ceil(nrows/128) window tiles, n_at = ceil(nv/128) tiles. Row i, columns
        ``3 * ((j * n_wt + w) * n_at + tb) + (0, 1, 2)`` hold, on partition p (row ``w*128 +
        p`` of the window), for tb >= w: the direct sum of row p of ``T[w, tb]``; the direct
        sum of column p of ``T[tb, w]`` (0 when tb == w); the exchange sum ``sum_b T_ab T_ba /
        D_ab`` over b in tile tb (the host doubles it for tb > w, which stands for the mirrored
        tile pair too). Columns with tb < w and partitions beyond a ragged tile hold 0. As
        ``kernel[n]`` each program computes and writes its share of the rows
        (``program_rows``); the programs together write every row.

    Preconditions: nv = ``neg_eps_row.shape[1]`` >= 1, ``ceil(nv/128)`` tiles in ``b_i`` and
    ``b_j``; ``nrows = d_col.shape[1]`` with ``1 <= nrows <= nv`` and nrows a multiple of 128
    unless nrows == nv; the i and j sides share one virtual space (the same orbital energies,
    so ``D_ab = D_ba``); naux >= 1; every ``D_ab`` nonzero (negative for a valid reference).
    SBUF per partition (fp32 words): nv (``-e_b``) + the accumulator and denominators of one
    row + the strips (naux one chunk: two panels of ``ceil(naux/128) * n_wt * 128`` and two
    streamed tiles on each side; otherwise two slots of ``24 * 128`` per operand of a tile pair)
    + epilogue tiles (``nki_ops._energy_sbuf_words``); PSUM: two one-bank tiles per tile pair.

    Steps
    -----
    1. DMA ``neg_eps_row`` -> SBUF ``negv_sb``; the stream buffers (two slots each).
    2. For each of this program's rows r, in a device loop (``nl.dynamic_range``; one compiled
       body): ``memset`` the SBUF accumulator ``acc_sb`` (the row's columns) to 0; DMA
       ``d_col[r]`` -> SBUF ``dcol_sb`` (``load_row_denominators``); when naux is one chunk
       (<= 24 K tiles) the window's tiles of ``B_i[r]`` -> SBUF panel ``pi_sb``
       (``load_row_panels``), resident for every j.
    3. Per column j (unrolled): the window's tiles of ``B_j`` -> SBUF panel ``pj_sb``. Per
       tile tb: its strips are a slice of the panels (tb in the window) or streamed once for
       every window tile w <= tb through two SBUF slots (``st_i``, ``st_j``; tile tb+1 is
       DMA'd while tile tb is used); accumulate in PSUM (``accumulate_strips``) ``t1_ps =
       T[w, tb] = B_i[:, w]^T B_j[:, tb]`` and, for tb > w, the mirrored tile in its
       transposed layout, ``t2_ps = T[tb, w]^T = B_j[:, w]^T B_i[:, tb]``: element (a, b) is
       T_ba, the exchange partner of T_ab, and both stationaries are window tiles w < tb, full
       128 columns wide (the ragged last tile is stationary only on its diagonal). With more
       K chunks, every chunk of both tiles is loaded for every tile pair through two SBUF
       slots (chunk kc+1 DMA'd while chunk kc is multiplied) and PSUM keeps accumulating over
       the chunks. T never leaves the chip.
    4. ``tile_pair_sums``: on the diagonal (tb == w) the partners come from ``mirror_tile``
       (ScalarE ``activation(copy)`` PSUM -> SBUF and TensorE ``nc_transpose`` -> PSUM).
    5. ``R = 1 / (-e_b + d_col[a])`` by ScalarE ``activation(copy, bias)`` and VectorE
       ``reciprocal`` (``reciprocal_denominators``); ``W = T[w, tb] * R`` and its direct row
       sums (``weighted_row_sums``); the exchange row sums of ``W * tt`` (``row_dot``); for
       tb > w the direct sums of the mirrored tile, ``tt * R * tt`` (D is symmetric in a and
       b).
    6. ``dma_copy`` SBUF ``acc_sb`` -> row r of HBM ``partials`` (``store_row``; the only
       write to HBM).

    Per pair, with n_kt = ceil(naux/128) and tile pairs ``n_wt * n_at - n_wt*(n_wt-1)/2``:
    ``n_kt`` matmuls per diagonal and ``2*n_kt`` per off-diagonal tile pair (``n_at^2 * n_kt``
    for a whole pair: one GEMM's worth) and one transpose per diagonal tile; the instruction
    counts (compiled and executed) are ``nki_ops._energy_instructions``.
    """
    split = b_i.shape[0] == 2  # (2, 128, ...): bfloat16 high and low parts
    n_kt = b_i.shape[-2]
    nr = b_i.shape[-4]
    nj = b_j.shape[-4]
    nv = neg_eps_row.shape[1]
    nrows = d_col.shape[1]
    n_at = (nv + TILE_M - 1) // TILE_M
    n_wt = (nrows + TILE_M - 1) // TILE_M
    kc_tiles = min(n_kt, ENERGY_K_TILES)
    n_kc = (n_kt + kc_tiles - 1) // kc_tiles
    per_pair = 3 * n_wt * n_at  # accumulator columns of one pair
    ncol = nj * per_pair
    partials = nl.ndarray((nr, TILE_M, ncol), dtype=nl.float32, buffer=nl.shared_hbm)
    r0, r1 = program_rows(nr)  # this program's rows (all of them without a grid)

    # Step 1: -e_b, the accumulator and the stream buffers, allocated once (SBUF).
    negv_sb = load_neg_eps(neg_eps_row)
    acc_sb = nl.ndarray((TILE_M, ncol), dtype=nl.float32, buffer=nl.sbuf)
    streamed = n_kc == 1 and n_at > n_wt  # tiles beyond the window pass through two slots
    if streamed:
        st_i = stream_buffers(split, 2, n_kt)
        st_j = stream_buffers(split, 2, n_kt)
    if n_kc > 1:  # K chunks of both tiles of a tile pair pass through two slots each
        ka_i = stream_buffers(split, 2, kc_tiles)
        ka_j = stream_buffers(split, 2, kc_tiles)
        kb_i = stream_buffers(split, 2, kc_tiles)
        kb_j = stream_buffers(split, 2, kc_tiles)

    for r in nl.dynamic_range(r0, r1):
        # Step 2: the row's accumulator, denominators and B_i panel.
        nisa.memset(dst=acc_sb[0:TILE_M, 0:ncol], value=0.0)
        dcol_sb = load_row_denominators(d_col, r)
        if n_kc == 1:
            pi_sb = load_row_panels(b_i, split, r, 0, n_wt, 0, n_kt)
        for j in nl.static_range(nj):
            if n_kc == 1:
                # Step 3: the window's tiles of B_j (a panel), resident for the pair.
                pj_sb = load_panels(b_j, split, j, 0, n_wt, 0, n_kt)
            if streamed:
                # Step 3: the first tile beyond the window, into its slot.
                load_row_panels_into(st_i[0], st_i[1], n_wt % 2, b_i, split, r, n_wt, 1, 0,
                                     n_kt)
                load_panels_into(st_j[0], st_j[1], n_wt % 2, b_j, split, j, n_wt, 1, 0, n_kt)
            for tb in nl.static_range(n_at):
                b0, bsz = tile_span(tb, TILE_M, nv)
                if streamed and tb >= n_wt and tb + 1 < n_at:
                    # Step 3: prefetch tile tb+1 into the other slot while tile tb is
                    # computed (each tile beyond the window loaded once for every window tile).
                    nxt = (tb + 1) % 2
                    load_row_panels_into(st_i[0], st_i[1], nxt, b_i, split, r, tb + 1, 1, 0,
                                         n_kt)
                    load_panels_into(st_j[0], st_j[1], nxt, b_j, split, j, tb + 1, 1, 0, n_kt)
                for w in nl.static_range(min(tb + 1, n_wt)):
                    _a0, asz = tile_span(w, TILE_M, nv)
                    off = tb > w
                    t1_ps = nl.ndarray((TILE_M, TILE_M), dtype=nl.float32, buffer=nl.psum)
                    t2_ps = t1_ps
                    if off:
                        t2_ps = nl.ndarray((TILE_M, TILE_M), dtype=nl.float32, buffer=nl.psum)
                    if n_kc > 1:
                        # Steps 2-3, streamed: the tile pair's first K chunk into slot 0.
                        _k0, nkt0 = tile_span(0, kc_tiles, n_kt)
                        load_chunk_pair(ka_i, ka_j, 0, b_i, b_j, split, r, j, w, 0, nkt0)
                        if off:
                            load_chunk_pair(kb_i, kb_j, 0, b_i, b_j, split, r, j, tb, 0, nkt0)
                    for kc in nl.static_range(n_kc):
                        kt0, nkt = tile_span(kc, kc_tiles, n_kt)
                        if n_kc == 1:
                            ai_sb, aj_sb, wa = pi_sb, pj_sb, w
                            if tb < n_wt:
                                si_sb, sj_sb, wb = pi_sb, pj_sb, tb
                            else:
                                si_sb, sj_sb, wb = st_i, st_j, tb % 2
                        else:
                            # Steps 2-3, streamed: prefetch chunk kc+1 into the other slot
                            # while chunk kc is multiplied (each loaded once per tile pair).
                            if kc + 1 < n_kc:
                                kt1, nkt1 = tile_span(kc + 1, kc_tiles, n_kt)
                                nxt = (kc + 1) % 2
                                load_chunk_pair(ka_i, ka_j, nxt, b_i, b_j, split, r, j, w, kt1,
                                                nkt1)
                                if off:
                                    load_chunk_pair(kb_i, kb_j, nxt, b_i, b_j, split, r, j, tb,
                                                    kt1, nkt1)
                            ai_sb, aj_sb, si_sb, sj_sb = ka_i, ka_j, ka_i, ka_j
                            if off:
                                si_sb, sj_sb = kb_i, kb_j
                            wa, wb = kc % 2, kc % 2
                        # T[w, tb] = B_i[:, w]^T B_j[:, tb], and off the diagonal the
                        # mirrored tile already transposed, T[tb, w]^T = B_j[:, w]^T B_i[:, tb]:
                        # both stationaries are window tiles w < tb, full 128 columns wide
                        accumulate_products(t1_ps, 0, asz, bsz, ai_sb, wa, sj_sb, wb, kt0, nkt,
                                            split)
                        if off:
                            accumulate_products(t2_ps, 0, asz, bsz, aj_sb, wa, si_sb, wb, kt0,
                                                nkt, split)
                    # Steps 4-5: the tile pair's direct, mirrored and exchange row sums.
                    tile_pair_sums(acc_sb, negv_sb, dcol_sb, t1_ps, t2_ps, off,
                                   3 * ((j * n_wt + w) * n_at + tb), w * nj + j, b0, asz, bsz)
        # Step 6: the row's partial sums are the only data written back to HBM.
        store_row(partials, acc_sb, r, ncol)
    return partials


@nki.jit
def mp2_pair_direct_kernel(b_i, b_j, d_col, neg_eps_row, d_col_b, neg_eps_a):
    """Direct partial sums (no exchange) of the nr x nj pairs of one block, nva != nvb
    allowed, for the rows of a window of a tiles (the host passes only the window's columns of
    B_i).

    Parameters
    ----------
    b_i : HBM float32 (128, nr, ceil(nva/128), n_kt, 128), or bfloat16 (2, 128, ...) split
        Tile-major B of the row orbitals i, the window's tiles only (``nki_ops._tile_major``).
    b_j : HBM float32 (128, nj, ceil(nvb/128), n_kt, 128), or split
        The same for the column orbitals j (their own virtual space, all of its tiles).
    d_col : HBM float32 (nr, nva, nj)
        ``d_col[i, a, j] = e_i + e_j - e_a`` (host-computed in fp64, rounded once).
    neg_eps_row : HBM float32 (128, nvb)
        ``-e_b`` replicated on all 128 partitions (the host-supplied broadcast row).
    d_col_b : HBM float32 (nr, nvb, nj)
        ``d_col_b[i, b, j] = e_i + e_j - e_b``: the denominators of the ragged last a tile,
        whose T is formed transposed (b on the partitions); read only when that tile is
        ragged.
    neg_eps_a : HBM float32 (128, asz)
        ``-e_a`` of the window's last a tile (asz = nva - 128*(n_at-1) rows) replicated on all
        partitions; read only when asz < 128.

    Returns
    -------
    partials : shared HBM float32 (nr, 128, nj * (n_af * n_bc + n_rt))
        n_at = ceil(nva/128) a tiles, n_af of them whole, n_bc = ceil(nvb/512), n_bt =
        ceil(nvb/128), n_rt = n_bt when the last a tile is ragged (else 0). Per pair j the
        columns ``j * (n_af * n_bc + n_rt) + ...``: ``ta * n_bc + bc`` holds, on partition p,
        the direct sum of row ``a = ta*128 + p`` over the columns b of chunk bc (whole tiles
        ta); ``n_af * n_bc + u`` holds, on partition p, the direct sum of column ``b = u*128 +
        p`` over the ragged tile's rows a. Partitions beyond a ragged tile hold 0. As
        ``kernel[n]``, each program computes and writes its share of the rows
        (``program_rows``).

    Preconditions: nva = ``d_col.shape[1]`` >= 1, nvb = ``neg_eps_row.shape[1]`` >= 1, the
    tiles of ``b_i`` and ``b_j`` covering them; every ``D_ab`` nonzero. SBUF per partition
    (fp32 words): nvb (``-e_b``) + the accumulator and denominators of one row + the strips
    (naux one chunk: the panel ``ceil(naux/128) * n_at * 128`` and two 512-column slots;
    otherwise two slots of ``24 * (128 + 512)``) + epilogue tiles
    (``nki_ops._energy_sbuf_words``); PSUM: one bank per T tile.

    Steps
    -----
    1. DMA ``neg_eps_row`` -> SBUF ``negv_sb`` (and, with a ragged last a tile,
       ``neg_eps_a`` -> ``nega_sb``); the stream buffers (two slots each).
    2. For each of this program's rows r, in a device loop (``nl.dynamic_range``): ``memset``
       ``acc_sb``; DMA ``d_col[r]`` -> SBUF ``dcol_sb`` (and ``d_col_b[r]`` -> ``dcolb_sb``
       when the last a tile is ragged); when naux is one chunk (<= 24 K tiles) the window's
       tiles of ``B_i[r]`` -> SBUF panel ``pi_sb``, resident for every j.
    3. Per column j and b chunk bc (<= 512 columns): ``B_j[:, bc]`` streams through two SBUF
       slots (the row's first chunk loaded at its start, every later one DMA'd while the one
       before is used), then for each whole a tile accumulate ``t_ps = T[ta, bc] = B_i[:,
       ta]^T B_j[:, bc]`` in PSUM from the panel (``accumulate_strips``: B_i's tile
       stationary, 128 columns wide). The ragged last a tile (asz < 128 rows) is formed
       transposed instead, ``T[ta, u]^T = B_j[:, u]^T B_i[:, ta]`` for each 128-column b tile
       u of the chunk (B_j's tile stationary: 128 wide but for nvb's own last tile; B_i's
       narrow tile moving, asz columns), so no stationary is asz wide. With more K chunks,
       both operands' chunks are loaded for every tile through two slots each (chunk kc+1
       DMA'd while chunk kc is multiplied) and PSUM keeps accumulating over the chunks. T
       never leaves the chip.
    4. ``direct_row`` on the PSUM tile: ``R = 1 / (-e_b + d_col[a])`` (ScalarE
       ``activation(copy, bias)`` and VectorE ``reciprocal``), ``W = T * R``, the row sums of
       ``W * T`` into the column of ``acc_sb``; for the transposed ragged tile, per b tile u,
       ``R = 1 / (-e_a + d_col_b[b])`` (b on the partitions) and the row sums over a.
    5. ``dma_copy`` SBUF ``acc_sb`` -> row r of HBM ``partials`` (the only write to HBM).

    Per pair: ``n_at * n_bt * ceil(naux/128)`` matmuls and no transposes; the instruction
    counts are ``nki_ops._energy_instructions``.
    """
    split = b_i.shape[0] == 2  # (2, 128, ...): bfloat16 high and low parts
    n_kt = b_i.shape[-2]
    nr = b_i.shape[-4]
    nj = b_j.shape[-4]
    nva = d_col.shape[1]
    nvb = neg_eps_row.shape[1]
    n_at = (nva + TILE_M - 1) // TILE_M
    n_bt = (nvb + TILE_M - 1) // TILE_M
    chunk_tiles = TILE_N // TILE_M
    n_bc = (n_bt + chunk_tiles - 1) // chunk_tiles
    kc_tiles = min(n_kt, ENERGY_K_TILES)
    n_kc = (n_kt + kc_tiles - 1) // kc_tiles
    _al, asz_last = tile_span(n_at - 1, TILE_M, nva)
    ragged = asz_last < TILE_M  # the last a tile is formed transposed
    n_af = n_at - 1 if ragged else n_at  # whole a tiles
    per_pair = n_af * n_bc + (n_bt if ragged else 0)  # accumulator columns of one pair
    ncol = nj * per_pair
    partials = nl.ndarray((nr, TILE_M, ncol), dtype=nl.float32, buffer=nl.shared_hbm)
    r0, r1 = program_rows(nr)  # this program's rows (all of them without a grid)

    # Step 1: -e_b (and -e_a of a ragged tile), the accumulator and the stream buffers.
    negv_sb = load_neg_eps(neg_eps_row)
    if ragged:
        nega_sb = load_neg_eps(neg_eps_a)
    acc_sb = nl.ndarray((TILE_M, ncol), dtype=nl.float32, buffer=nl.sbuf)
    if n_kc == 1:  # the b chunks: two slots of chunk_tiles tiles
        sj_sb = stream_buffers(split, 2 * chunk_tiles, n_kt)
    if n_kc > 1:  # K chunks of the a tile and of the b chunk: two slots each
        ka_sb = stream_buffers(split, 2, kc_tiles)
        kb_sb = stream_buffers(split, 2 * chunk_tiles, kc_tiles)

    for r in nl.dynamic_range(r0, r1):
        # Step 2: the row's accumulator, denominators and B_i panel.
        nisa.memset(dst=acc_sb[0:TILE_M, 0:ncol], value=0.0)
        dcol_sb = load_row_denominators(d_col, r)
        if ragged:
            dcolb_sb = load_row_denominators(d_col_b, r)
        if n_kc == 1:
            pi_sb = load_row_panels(b_i, split, r, 0, n_at, 0, n_kt)
            # Step 3: the row's first b chunk into slot 0.
            _b, nbt0 = tile_span(0, chunk_tiles, n_bt)
            load_panels_into(sj_sb[0], sj_sb[1], 0, b_j, split, 0, 0, nbt0, 0, n_kt)
        for j in nl.static_range(nj):
            for bc in nl.static_range(n_bc):
                bt0, nbt = tile_span(bc, chunk_tiles, n_bt)
                b0, bsz = tile_span(bc, TILE_N, nvb)
                step = j * n_bc + bc  # this chunk's place in the row's stream
                if n_kc == 1 and step + 1 < nj * n_bc:
                    # Step 3: prefetch the next chunk (this column's next, or the next
                    # column's first) into the other slot while this one is computed.
                    j_next = j if bc + 1 < n_bc else j + 1
                    bc_next = bc + 1 if bc + 1 < n_bc else 0
                    bt_next, nbt_next = tile_span(bc_next, chunk_tiles, n_bt)
                    load_panels_into(sj_sb[0], sj_sb[1], ((step + 1) % 2) * chunk_tiles, b_j,
                                     split, j_next, bt_next, nbt_next, 0, n_kt)
                slot = (step % 2) * chunk_tiles
                for ta in nl.static_range(n_at):
                    _a0, asz = tile_span(ta, TILE_M, nva)
                    flip = ragged and ta == n_at - 1  # T^T: B_j's b tiles stationary
                    t_ps = nl.ndarray((TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
                    if n_kc > 1:
                        # Steps 2-3, streamed: the first K chunk of both operands into slot 0.
                        _k0, nkt0 = tile_span(0, kc_tiles, n_kt)
                        load_row_panels_into(ka_sb[0], ka_sb[1], 0, b_i, split, r, ta, 1, 0,
                                             nkt0)
                        load_panels_into(kb_sb[0], kb_sb[1], 0, b_j, split, j, bt0, nbt, 0,
                                         nkt0)
                    for kc in nl.static_range(n_kc):
                        kt0, nkt = tile_span(kc, kc_tiles, n_kt)
                        if n_kc == 1:
                            ai_sb, wa, bj_sb, wb = pi_sb, ta, sj_sb, slot
                        else:
                            # Steps 2-3, streamed: prefetch chunk kc+1 into the other slots
                            # while chunk kc is multiplied (each chunk loaded once per tile).
                            if kc + 1 < n_kc:
                                kt1, nkt1 = tile_span(kc + 1, kc_tiles, n_kt)
                                nxt = (kc + 1) % 2
                                load_row_panels_into(ka_sb[0], ka_sb[1], nxt, b_i, split, r, ta,
                                                     1, kt1, nkt1)
                                load_panels_into(kb_sb[0], kb_sb[1], nxt * chunk_tiles, b_j,
                                                 split, j, bt0, nbt, kt1, nkt1)
                            ai_sb, wa, bj_sb, wb = ka_sb, kc % 2, kb_sb, (kc % 2) * chunk_tiles
                        for u in nl.static_range(nbt):
                            c0, csz = tile_span(u, TILE_M, bsz)
                            if flip:
                                # T[ta, u]^T at columns u*asz of the PSUM tile: b on the
                                # partitions, the ragged a tile moving
                                accumulate_products(t_ps, u * asz, csz, asz, bj_sb, wb + u,
                                                    ai_sb, wa, kt0, nkt, split)
                            else:
                                accumulate_products(t_ps, c0, asz, csz, ai_sb, wa, bj_sb,
                                                    wb + u, kt0, nkt, split)
                    if flip:
                        # Step 4, transposed: R = 1 / (-e_a + (e_i + e_j - e_b)) per b tile;
                        # direct sums over a of each b row.
                        for u in nl.static_range(nbt):
                            _c0, csz = tile_span(u, TILE_M, bsz)
                            c_db = (bt0 + u) * nj + j
                            col = j * per_pair + n_af * n_bc + bt0 + u
                            direct_row(acc_sb[0:csz, col:col + 1],
                                       t_ps[0:csz, u * asz:(u + 1) * asz], nega_sb, 0,
                                       dcolb_sb[0:csz, c_db:c_db + 1], csz, asz)
                    else:
                        # Step 4: R = 1 / (-e_b + (e_i + e_j - e_a)); direct row sums of W T.
                        c_dcol = ta * nj + j
                        col = j * per_pair + ta * n_bc + bc
                        direct_row(acc_sb[0:asz, col:col + 1], t_ps[0:asz, 0:bsz], negv_sb,
                                   b0, dcol_sb[0:asz, c_dcol:c_dcol + 1], asz, bsz)
        # Step 5: the row's partial sums are the only data written back to HBM.
        store_row(partials, acc_sb, r, ncol)
    return partials
