"""NKI host wrappers: the ops of :mod:`dfmp2.linalg.torch_ops` run by dfmp2's NKI kernels.

Each op takes the arguments of its ``torch_ops`` twin plus a keyword-only ``mode`` (one of
``"hardware"``, ``"simulator"``, ``"emulator"``; see :mod:`.nki_runtime`) and ``device`` (the
run's :class:`~dfmp2.linalg.nki_runtime.NkiDevice`: what it keeps on the device, its launches
and transfers; None, a fresh one per call). Operands are torch
tensors (float64 usually); they are converted to C-contiguous float32 NumPy arrays at this
boundary (Trainium has no float64), the kernels run, and results come back as float64 torch
tensors on the input's device. Host-side sums (pair energies, split-K partial products) are
float64. The kernel modules are imported lazily, after the mode is set up.

Every call keeps the compiled size of one kernel launch bounded (``MAX_MATMULS_PER_CALL``;
the pair kernels ``MAX_ENERGY_INSTRUCTIONS_PER_CALL`` per row body and ``MAX_PAIRS_PER_CALL``
columns, their rows being a device loop) and loops over launches on the host.
"""

from __future__ import annotations

import numpy as np
import torch

from .._names import NKI_MATMULS
from ..errors import InputError, NotPositiveDefiniteError
from ..kernels._tiles import (
    BLOCK,
    ENERGY_K_TILES,
    FP32_BYTES,
    GEMM_M_GROUP,
    SBUF_RESIDENT_BUDGET,
    TILE_K,
    TILE_M,
    TILE_N,
    ceil_div,
)
from . import nki_runtime, torch_ops
from .nki_runtime import probe

__all__ = [
    "MAX_MATMULS_PER_CALL",
    "MAX_PAIRS_PER_CALL",
    "SUPPORTS",
    "cholesky",
    "gemm",
    "mp2_pair_sums",
    "probe",
    "trmm",
    "trsm",
]

#: Upper bound on the nc_matmul instructions of one GEMM-like kernel launch (bounds the trace).
MAX_MATMULS_PER_CALL = 2048
#: Upper bound on the orbitals j (columns) of one fused-energy launch (its rows are unbounded).
MAX_PAIRS_PER_CALL = 64
#: Upper bound on the nki.isa instructions one fused-energy launch compiles: one row of its
#: device loop (what it executes grows with its rows).
MAX_ENERGY_INSTRUCTIONS_PER_CALL = 8192
#: Largest K of one GEMM launch: the A^T strip of one M group, ceil(K/128)*512*4 bytes per
#: partition, stays in half of the resident SBUF budget (K <= 4096). Larger K is split and the
#: partial products added in fp64.
GEMM_MAX_K = (SBUF_RESIDENT_BUDGET // 2 // (GEMM_M_GROUP * TILE_M * FP32_BYTES)) * TILE_K
#: SBUF bytes per partition the fused-energy kernels may use: all of trn1's usable 176 KiB
#: (the emulator's 180224 B; the documented capacity is 192 KiB).
ENERGY_SBUF_BUDGET = 176 * 1024
#: Largest order of the blocked Cholesky: the trailing update of one step issues
#: ceil(n/512) * (1 + ceil(n/128)) matmuls in one launch.
CHOLESKY_MAX_N = 8192
#: Largest order of the blocked trsm: the panel strip, ceil(n/128)*128*4 bytes per partition.
TRSM_MAX_N = (SBUF_RESIDENT_BUDGET // (TILE_M * FP32_BYTES)) * TILE_K


# -- boundary helpers -------------------------------------------------------------------------
def _f32(array) -> np.ndarray:
    """C-contiguous float32 copy (or view) of a NumPy array or torch tensor."""
    if isinstance(array, torch.Tensor):
        array = array.detach().to("cpu", torch.float64).numpy()
    return np.ascontiguousarray(array, dtype=np.float32)


def _f64(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float64).numpy()


def _out(array: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.asarray(array, dtype=np.float64)).to(like.device)


def _device(mode: str, device: nki_runtime.NkiDevice | None) -> nki_runtime.NkiDevice:
    """The run's device, or a fresh one for one op call."""
    if device is None:
        return nki_runtime.NkiDevice(mode)
    if device.mode != mode:
        raise InputError(f"an NKI device in {device.mode} mode was passed with mode={mode!r}")
    return device


def _require_2d(name: str, tensor) -> None:
    if tensor.ndim != 2:
        raise InputError(f"{name} must be 2-D, got shape {tuple(tensor.shape)}")


def _gemm_shapes(a, b, trans_a, trans_b) -> tuple[int, int, int]:
    _require_2d("a", a)
    _require_2d("b", b)
    m, k = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
    k_b, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
    if k != k_b:
        raise InputError(
            f"gemm: inner dimensions differ: op(a) is ({m}, {k}), op(b) is ({k_b}, {n})"
        )
    return int(m), int(n), int(k)


# -- gemm -------------------------------------------------------------------------------------
def _gemm_f32(a_km, b_kn, device: nki_runtime.NkiDevice) -> np.ndarray:
    """``a_km.T @ b_kn`` by the gemm kernel in launches of bounded trace; float64 result.

    ``a_km`` (k, m) and ``b_kn`` (k, n): float32 NumPy arrays (each launch uploads its slices)
    or :class:`~dfmp2.linalg.nki_runtime.DeviceArray` (on the device already, sliced there).
    Chunks are whole tiles (K by 128, M by 128, N by 512), so the total matmul count equals
    ceil(M/128) * ceil(N/512) * ceil(K/128) however the work is split.
    """
    k, m = a_km.shape
    n = b_kn.shape[1]
    c_mn = np.zeros((m, n), dtype=np.float64)
    if m == 0 or n == 0 or k == 0:
        return c_mn
    nki_runtime.prepare(device.mode)
    kernel = nki_runtime.load_kernel("gemm", "gemm_kernel")
    for k0 in range(0, k, GEMM_MAX_K):
        k1 = min(k, k0 + GEMM_MAX_K)
        n_kt = ceil_div(k1 - k0, TILE_K)
        # M first, in whole groups of GEMM_M_GROUP tiles (each moving tile of B serves a group)
        mt_call = max(1, min(ceil_div(m, TILE_M), MAX_MATMULS_PER_CALL // n_kt))
        if mt_call > GEMM_M_GROUP:
            mt_call -= mt_call % GEMM_M_GROUP
        nt_call = max(1, min(ceil_div(n, TILE_N), MAX_MATMULS_PER_CALL // (n_kt * mt_call)))
        for m0 in range(0, m, mt_call * TILE_M):
            m1 = min(m, m0 + mt_call * TILE_M)
            a_part = _part(a_km, (slice(k0, k1), slice(m0, m1)))
            for n0 in range(0, n, nt_call * TILE_N):
                n1 = min(n, n0 + nt_call * TILE_N)
                b_part = _part(b_kn, (slice(k0, k1), slice(n0, n1)))
                (c_part,) = device.launch(kernel, (a_part, b_part))
                c_mn[m0:m1, n0:n1] += c_part
    return c_mn


def _part(array, index):
    """A launch operand: a device-side slice, or a contiguous host copy (uploaded)."""
    if isinstance(array, nki_runtime.DeviceArray):
        return array.take(index)
    return np.ascontiguousarray(array[index])


def _operand(tensor: torch.Tensor, transpose: bool, device: nki_runtime.NkiDevice):
    """The float32 kernel layout of ``tensor`` (``tensor.T`` with ``transpose``): kept on the
    device when the run placed it there (:meth:`NkiDevice.kept`), else a host array."""
    kept = device.kept(tensor, transpose, lambda: _f32(tensor.T if transpose else tensor))
    return kept if kept is not None else _f32(tensor.T if transpose else tensor)


def gemm(a: torch.Tensor, b: torch.Tensor, trans_a: bool = False, trans_b: bool = False,
         out: torch.Tensor | None = None, *, mode: str,
         device: nki_runtime.NkiDevice | None = None) -> torch.Tensor:
    """``op(a) @ op(b)`` on the NKI gemm kernel (fp32 operands, fp32 PSUM accumulation).

    a : (m, k), or (k, m) with ``trans_a``; b : (k, n), or (n, k) with ``trans_b``.
    Returns (m, n) float64 on ``a``'s device, copied into ``out`` when given. ``device``: the
    run's :class:`~dfmp2.linalg.nki_runtime.NkiDevice` (operands the run keeps on it, such as
    the fit's ``L^{-T}`` and the transform's coefficients, are uploaded once); None, a fresh
    one for this call.
    """
    _gemm_shapes(a, b, trans_a, trans_b)
    device = _device(mode, device)
    a_km = _operand(a, not trans_a, device)  # the kernel takes A transposed: K on partitions
    b_kn = _operand(b, trans_b, device)
    result = _out(_gemm_f32(a_km, b_kn, device), a)
    return result if out is None else out.copy_(result)


def _gemm_supports(a, b, trans_a=False, trans_b=False, out=None) -> str | None:
    if a.ndim != 2 or b.ndim != 2:
        return f"gemm needs 2-D operands, got {tuple(a.shape)} and {tuple(b.shape)}"
    return None  # any M, N, K: ragged edges are sliced, large K is split on the host


# -- blocked Cholesky and trsm ----------------------------------------------------------------
def _potrf(a_bb: np.ndarray, offset: int, n: int) -> np.ndarray:
    """Host fp64 LAPACK Cholesky of one diagonal block; the pivot in the error is global."""
    l_bb, info = torch_ops.lapack_potrf(np.ascontiguousarray(a_bb, dtype=np.float64))
    if info != 0:
        raise NotPositiveDefiniteError(
            f"Cholesky factorisation failed at pivot {offset + info} of {n} "
            f"(diagonal block {offset}:{offset + a_bb.shape[0]} factored on the host in fp64 "
            "after fp32 trailing updates on NKI)"
        )
    return l_bb


def _trtri(l_bb: np.ndarray) -> np.ndarray:
    """Host fp64 inverse of a lower-triangular block."""
    eye = torch.eye(l_bb.shape[0], dtype=torch.float64)
    return torch.linalg.solve_triangular(torch.from_numpy(l_bb), eye, upper=False).numpy()


def cholesky(a_nn: torch.Tensor, *, mode: str,
             device: nki_runtime.NkiDevice | None = None) -> torch.Tensor:
    """Lower Cholesky factor ``l`` (``a = l @ l.T``) by right-looking blocks of 128.

    Per block J: the host factors ``A_JJ`` (potrf) and inverts ``L_JJ`` (trtri) in fp64; one
    ``cholesky_step_kernel`` launch computes the panel ``L_RJ = A_RJ @ inv(L_JJ).T`` and the
    trailing update ``A_RR -= L_RJ @ L_RJ.T`` in fp32. Returns (n, n) float64, zero above the
    diagonal. Raises :class:`NotPositiveDefiniteError` when a diagonal block is not positive
    definite.
    """
    _require_2d("a_nn", a_nn)
    n = int(a_nn.shape[0])
    if a_nn.shape[1] != n:
        raise InputError(f"cholesky needs a square matrix, got shape {tuple(a_nn.shape)}")
    device = _device(mode, device)
    work = _f64(a_nn).copy()
    l_nn = np.zeros((n, n), dtype=np.float64)
    kernel = None
    for j0 in range(0, n, BLOCK):
        j1 = min(n, j0 + BLOCK)
        l_jj = _potrf(work[j0:j1, j0:j1], j0, n)
        l_nn[j0:j1, j0:j1] = l_jj
        if j1 == n:
            break
        if kernel is None:
            nki_runtime.prepare(mode)
            kernel = nki_runtime.load_kernel("trsm", "cholesky_step_kernel")
        linv_t = _f32(_trtri(l_jj).T)
        l_col_t, a_next = device.launch(
            kernel, (linv_t, _f32(work[j1:, j0:j1].T), _f32(work[j1:, j1:])))
        l_nn[j1:, j0:j1] = l_col_t.T
        work[j1:, j1:] = a_next
    return _out(l_nn, a_nn)


def _cholesky_supports(a_nn) -> str | None:
    if a_nn.ndim != 2 or a_nn.shape[0] != a_nn.shape[1]:
        return f"cholesky needs a square 2-D matrix, got shape {tuple(a_nn.shape)}"
    if a_nn.shape[0] > CHOLESKY_MAX_N:
        return (f"cholesky order {a_nn.shape[0]} exceeds {CHOLESKY_MAX_N} (one trailing-update "
                "launch would exceed the bounded trace)")
    return None


def trsm(l_nn: torch.Tensor, b_mn: torch.Tensor, *, mode: str,
         device: nki_runtime.NkiDevice | None = None) -> torch.Tensor:
    """``x = b @ l^{-T}`` (``x @ l.T = b``) by blocked forward substitution on ``X^T = L^{-1} B^T``.

    Per block row J of 128: the host inverts ``L_JJ`` in fp64; the first block is one gemm
    launch ``inv(L_00) @ B_0^T``, every later block one ``trsm_block_kernel`` launch
    ``inv(L_JJ) @ (B_J^T - L[J, :J0] @ X^T[:J0])`` per column chunk. l_nn : (n, n) lower
    triangular; b_mn : (m, n). Returns x : (m, n) float64.
    """
    _require_2d("l_nn", l_nn)
    _require_2d("b_mn", b_mn)
    n = int(l_nn.shape[0])
    m = int(b_mn.shape[0])
    if l_nn.shape[1] != n or b_mn.shape[1] != n:
        raise InputError(
            f"trsm needs l (n, n) and b (m, n), got l {tuple(l_nn.shape)} and b {tuple(b_mn.shape)}"
        )
    device = _device(mode, device)
    l64 = _f64(l_nn)
    diagonal = np.diagonal(l64)
    if n and np.any(diagonal == 0.0):
        index = int(np.argmin(np.abs(diagonal)))
        raise InputError(f"trsm: l is singular (zero diagonal at index {index})")
    b_t = _f32(_f64(b_mn).T)  # (n, m)
    x_t = np.zeros((n, m), dtype=np.float32)
    if n == 0 or m == 0:
        return _out(x_t.T, b_mn)
    nki_runtime.prepare(mode)
    first = nki_runtime.load_kernel("gemm", "gemm_kernel")
    step = nki_runtime.load_kernel("trsm", "trsm_block_kernel")
    for j0 in range(0, n, BLOCK):
        j1 = min(n, j0 + BLOCK)
        linv_t = _f32(_trtri(l64[j0:j1, j0:j1]).T)
        panel_t = _f32(l64[j0:j1, :j0].T)
        n_kt = ceil_div(j0, TILE_K)
        cols = TILE_N * max(1, MAX_MATMULS_PER_CALL // (n_kt + 1))
        for c0 in range(0, m, cols):
            c1 = min(m, c0 + cols)
            rhs_t = np.ascontiguousarray(b_t[j0:j1, c0:c1])
            if j0 == 0:
                (x_part,) = device.launch(first, (linv_t, rhs_t))
            else:
                x_prev = np.ascontiguousarray(x_t[:j0, c0:c1])
                (x_part,) = device.launch(step, (linv_t, panel_t, x_prev, rhs_t))
            x_t[j0:j1, c0:c1] = x_part
    return _out(x_t.T, b_mn)


def _trsm_supports(l_nn, b_mn) -> str | None:
    if l_nn.ndim != 2 or b_mn.ndim != 2:
        return f"trsm needs 2-D operands, got {tuple(l_nn.shape)} and {tuple(b_mn.shape)}"
    if l_nn.shape[0] > TRSM_MAX_N:
        return (f"trsm order {l_nn.shape[0]} exceeds {TRSM_MAX_N} (the panel strip of one launch "
                f"would exceed {SBUF_RESIDENT_BUDGET // 1024} KiB of SBUF per partition)")
    return None


def trmm(u_nn: torch.Tensor, b_mn: torch.Tensor, *, mode: str,
         device: nki_runtime.NkiDevice | None = None) -> torch.Tensor:
    """``b_mn <- b_mn @ u_nn`` in place (u_nn upper triangular): the column blocks of
    :func:`dfmp2.linalg.torch_ops.upper_product_in_place`, each one gemm-kernel product (the
    blocks of ``u_nn`` stay on the device when the run keeps ``u_nn`` there)."""
    _require_2d("u_nn", u_nn)
    _require_2d("b_mn", b_mn)
    device = _device(mode, device)
    return torch_ops.upper_product_in_place(
        b_mn, u_nn, lambda a, b, out: gemm(a, b, out=out, mode=mode, device=device))


def _trmm_supports(u_nn, b_mn) -> str | None:
    if u_nn.ndim != 2 or b_mn.ndim != 2:
        return f"trmm needs 2-D operands, got {tuple(u_nn.shape)} and {tuple(b_mn.shape)}"
    return None  # column blocks of the gemm kernel, which takes any shape


# -- fused pair sums --------------------------------------------------------------------------
#: Kernel of each variant: exchange (one virtual space) or direct only (rectangular blocks).
_ENERGY_KERNELS = {True: "mp2_pair_energy_kernel", False: "mp2_pair_direct_kernel"}


def _energy_tiles(naux: int) -> tuple[int, int, int]:
    """``(n_kt, kc_tiles, n_kc)``: K tiles, K tiles per strip chunk and chunks of a launch."""
    n_kt = ceil_div(naux, TILE_K)
    kc = min(n_kt, ENERGY_K_TILES)
    return n_kt, kc, ceil_div(n_kt, kc)


def _direct_tiles(nv_rows: int) -> tuple[int, bool]:
    """``(n_af, ragged)`` of the direct kernel's window of ``nv_rows`` a rows: its whole a
    tiles, and whether a last ragged tile follows them (formed transposed by the kernel)."""
    return nv_rows // TILE_M, nv_rows % TILE_M != 0


def _energy_columns(npairs: int, n_wt: int, nv_rest: int, nvb: int, exchange: bool) -> int:
    """Accumulator columns of one launch (the kernels' ``partials`` width)."""
    if exchange:
        return 3 * npairs * n_wt * ceil_div(nv_rest, TILE_M)
    n_af, ragged = _direct_tiles(nv_rest)
    return npairs * (n_af * ceil_div(nvb, TILE_N) + (ceil_div(nvb, TILE_M) if ragged else 0))


def _energy_sbuf_words(nv_rest: int, nvb: int, naux: int, npairs: int, n_wt: int,
                       exchange: bool) -> int:
    """fp32 words per partition one fused-energy launch may hold in SBUF at its peak, with
    ``npairs`` the pairs of one row (its columns): the accumulator and denominators hold one
    row at a time.

    ``nv_rest``: the exchange kernel's virtual columns (the window and all later ones) or the
    direct kernel's window rows; ``n_wt`` window tiles. Both kernels: the ``-e_b`` row, the
    denominator columns (``n_wt * npairs``; direct with a ragged last a tile, also its ``-e_a``
    row and the per-b columns ``ceil(nvb/128) * npairs``) and the accumulator; the epilogue
    tiles, twice:
    seven (128, 128) (exchange: the T copy, D, R, W, the product of ``row_dot``, the mirrored
    W, slack) or four (128, 512) (direct: D, R, W, product). Strips, each counted twice (the
    next one is allocated while the last is still live): naux one chunk, the panels (two of
    ``n_kt * n_wt * 128``, exchange; one, direct) and one tile's strips (two 128-column,
    exchange; one 512-column, direct); more chunks, four 128-column chunks of ``kc`` K tiles
    (exchange) or a 128- and a 512-column one (direct).
    """
    n_kt, kc, n_kc = _energy_tiles(naux)
    cols = _energy_columns(npairs, n_wt, nv_rest, nvb, exchange)
    if exchange:
        fixed = nv_rest + n_wt * npairs + cols + 2 * 7 * TILE_M
        if n_kc == 1:
            return fixed + 2 * 2 * n_kt * (n_wt * TILE_M + TILE_M)
        return fixed + 2 * 4 * kc * TILE_M
    fixed = nvb + n_wt * npairs + cols + 2 * 4 * TILE_N
    if _direct_tiles(nv_rest)[1]:  # the ragged tile's -e_a row and per-b denominators
        fixed += TILE_M + ceil_div(nvb, TILE_M) * npairs
    if n_kc == 1:
        return fixed + 2 * n_kt * (n_wt * TILE_M + TILE_N)
    return fixed + 2 * kc * (TILE_M + TILE_N)


def _energy_body(nj: int, nv_rest: int, nvb: int, naux: int, n_wt: int, exchange: bool,
                 split: bool = False) -> int:
    """``nki.isa`` instructions of one row's body of a fused-energy launch: one orbital i with
    ``nj`` orbitals j over ``n_wt`` window tiles (the kernels' loops, counted; ``nv_rest`` as
    in :func:`_energy_sbuf_words`).

    Per row: memset, ``n_wt`` denominator loads, the store and (naux one chunk) B_i's panel.
    Every panel is one DMA (two when ``split``: its bfloat16 high and low parts), every K-tile
    product one matmul (three when ``split``). Exchange kernel, per pair, naux one chunk: B_j's
    panel, 2 loads per tile beyond the window, per diagonal tile pair ``n_kt`` matmuls and 9
    epilogue instructions, per off-diagonal one ``2*n_kt`` and 10; more chunks: every tile pair
    loads its panels per chunk, 2 (diagonal) or 4. Direct kernel, per pair, one chunk: 1 load
    per b chunk and 5 epilogue instructions per (whole a tile, b chunk) and per 128-column b
    tile of a ragged last a tile (formed transposed), ``n_kt`` matmuls per (a tile,
    128-column b tile); more chunks: per (a tile, b chunk) 2 loads per chunk, the same
    epilogues and matmuls. A ragged last a tile adds one denominator load per b tile to the
    row (its ``d_col_b``) and one load to the launch (its ``-e_a``,
    :func:`_energy_instructions`).
    """
    n_kt, _kc, n_kc = _energy_tiles(naux)
    ld, mm = (2, 3) if split else (1, 1)
    per_row = 2 + n_wt + (ld if n_kc == 1 else 0)
    if exchange:
        n_at = ceil_div(nv_rest, TILE_M)
        diag = mm * n_kt + 9 + (0 if n_kc == 1 else ld * 2 * n_kc)
        off = mm * 2 * n_kt + 10 + (0 if n_kc == 1 else ld * 4 * n_kc)
        tile_pairs = sum(n_at - w for w in range(n_wt))
        per_pair = n_wt * diag + (tile_pairs - n_wt) * off
        if n_kc == 1:  # B_j's panel and the tiles beyond the window per pair
            per_pair += ld * (1 + 2 * (n_at - n_wt))
    else:
        n_bc, n_bt = ceil_div(nvb, TILE_N), ceil_div(nvb, TILE_M)
        n_af, ragged = _direct_tiles(nv_rest)
        matmuls = n_wt * mm * n_kt * n_bt  # one per 128-column tile of every b chunk
        epilogues = 5 * (n_af * n_bc + (n_bt if ragged else 0))
        per_row += n_bt if ragged else 0  # the ragged tile's d_col_b, one load per b tile
        if n_kc == 1:  # every b chunk once per pair
            per_pair = n_bc * ld + epilogues + matmuls
        else:
            per_pair = n_wt * n_bc * ld * 2 * n_kc + epilogues + matmuls
    return per_row + nj * per_pair


def _energy_instructions(nr: int, nj: int, nv_rest: int, nvb: int, naux: int, n_wt: int,
                         exchange: bool, split: bool = False, programs: int = 1,
                         program: int = 0) -> int:
    """``nki.isa`` instructions SPMD program ``program`` of ``programs`` executes in one
    fused-energy launch over nr rows x nj columns: the ``-e_b`` load (and the direct kernel's
    ``-e_a`` of a ragged last a tile) and one
    :func:`_energy_body` per row of its share (:func:`_program_share`). What it compiles (the
    static size, bounded per launch) is one row's: ``_energy_instructions(1, nj, ...)``."""
    r0, r1 = _program_share(nr, programs, program)
    launch = 1 if exchange or not _direct_tiles(nv_rest)[1] else 2  # -e_b (and -e_a)
    return launch + (r1 - r0) * _energy_body(nj, nv_rest, nvb, naux, n_wt, exchange, split)


def _program_share(nrows: int, programs: int, program: int) -> tuple[int, int]:
    """``(r0, r1)``: the rows of SPMD program ``program`` of ``programs`` in one launch, as the
    kernels split them (``dfmp2.kernels._blocks.program_rows``)."""
    share = ceil_div(nrows, programs)
    r0 = min(nrows, program * share)
    return r0, min(nrows, r0 + share)


def _energy_launch_plan(nva: int, nvb: int, naux: int, exchange: bool,
                        split: bool = False) -> tuple[int, int]:
    """``(cols, window)``: orbitals j per launch and a tiles per window, so that every launch's
    compiled body (one row: :func:`_energy_instructions` with one row) stays within
    ``MAX_ENERGY_INSTRUCTIONS_PER_CALL`` and its SBUF within ``ENERGY_SBUF_BUDGET``. The rows
    run in a device loop: a launch takes every row a block of columns meets, however many.

    The widest window that fits one column (all a tiles when they fit: the fewest strip loads;
    checked at the first window, the largest, which meets the most later tiles), then as many
    columns per launch as fit with it, at most ``MAX_PAIRS_PER_CALL``. ``window == 0`` when
    even one pair and one a tile exceed a bound (``_energy_supports`` names it).
    """
    n_at = ceil_div(nva, TILE_M)

    def fits_window(cols, n_wt, nv_rest):
        return (_energy_instructions(1, cols, nv_rest, nvb, naux, n_wt, exchange, split)
                <= MAX_ENERGY_INSTRUCTIONS_PER_CALL
                and _energy_sbuf_words(nv_rest, nvb, naux, cols, n_wt, exchange) * FP32_BYTES
                <= ENERGY_SBUF_BUDGET)

    def fits(cols, window):
        if exchange:  # the first window sees every column: the largest launch
            return fits_window(cols, window, nva)
        # direct: the first window, and the last (it may end in a ragged tile, whose
        # transposed epilogue runs per 128-column b tile)
        last = nva - (ceil_div(n_at, window) - 1) * window * TILE_M
        return (fits_window(cols, window, min(nva, window * TILE_M))
                and fits_window(cols, ceil_div(last, TILE_M), last))

    window = n_at
    while window > 0 and not fits(1, window):
        window -= 1
    if window == 0:
        return 1, 0
    cols = 1
    while cols < MAX_PAIRS_PER_CALL and fits(cols + 1, window):
        cols += 1
    return cols, window


def _row_range(weight: np.ndarray) -> tuple[int, int] | None:
    """``(i0, i1)``: the rows from the first to the last with a nonzero weight in a block of
    columns (None when none has one): the rows one launch loops over."""
    rows = np.flatnonzero(weight.any(axis=1))
    if rows.size == 0:
        return None
    return int(rows[0]), int(rows[-1]) + 1


def _window_sums(partials: np.ndarray, ci: int, cj: int, n_wt: int, nv_rest: int, nvb: int,
                 exchange: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per-pair ``(direct, exchange)`` fp64 sums (ci, cj) of one launch's partial sums
    (ci, 128, columns)."""
    sums = partials.astype(np.float64).sum(axis=1).reshape(-1)  # fp64 over partitions
    if not exchange:
        return sums.reshape(ci, cj, -1).sum(axis=2), np.zeros((ci, cj))
    n_at = ceil_div(nv_rest, TILE_M)
    cols = sums.reshape(ci, cj, n_wt, n_at, 3)
    w_idx, tb_idx = np.arange(n_wt)[:, None], np.arange(n_at)[None, :]
    mirror = np.where(tb_idx > w_idx, 2.0, 1.0)  # an off-diagonal tile pair stands for two
    direct = (cols[..., 0] + cols[..., 1]).sum(axis=(2, 3))
    return direct, (cols[..., 2] * mirror).sum(axis=(2, 3))


def _tile_major(ovl: torch.Tensor, split: bool):
    """``(n, nv, naux)`` -> float32 ``(128, n, n_tiles, n_kt, 128)`` with ``[p, i, a_t, t, c] =
    B_i[a_t*128 + c, t*128 + p]``, both indices zero-padded to whole tiles (padded rows and
    columns add 0): a panel of a few virtual tiles and all K tiles is one contiguous run per
    partition, so the pair kernels load it in one DMA near full rate. With ``split``, a
    ``torch.bfloat16`` tensor ``(2, 128, ...)``: the bfloat16-rounded high part of B and the
    bfloat16-rounded rest, both computed in fp64 (exact in bfloat16: the two parts take the
    bytes of one float32 layout on the way to the device and in its memory)."""
    n, nv, naux = (int(x) for x in ovl.shape)
    n_tiles, n_kt = ceil_div(nv, TILE_M), ceil_div(naux, TILE_K)
    b64 = _f64(ovl)
    parts = [b64]
    if split:
        hi = torch.from_numpy(b64).to(torch.bfloat16).to(torch.float64).numpy()
        lo = torch.from_numpy(b64 - hi).to(torch.bfloat16).to(torch.float64).numpy()
        parts = [hi, lo]
    out = np.zeros((len(parts), TILE_K, n, n_tiles, n_kt, TILE_M), dtype=np.float32)
    padded = np.zeros((n, n_tiles * TILE_M, n_kt * TILE_K), dtype=np.float32)
    for index, part in enumerate(parts):
        padded[:, :nv, :naux] = part  # rounded to float32 once (exact for the split parts)
        # (n, a_t, c, t, p) -> (p, n, a_t, t, c)
        out[index] = padded.reshape(n, n_tiles, TILE_M, n_kt, TILE_K).transpose(4, 0, 1, 3, 2)
    if split:
        return torch.from_numpy(out).to(torch.bfloat16)  # exact: the parts are bfloat16 values
    return out[0]


class DeviceBlock:
    """Occupied orbitals ``i0 : i1`` of a :class:`ResidentB`: the operand ``mp2_pair_sums``
    takes in place of a host block ``(n, nvir, naux)`` when B is on the device.

    ``shape``/``ndim`` as the host block's; :meth:`host` reads the host block (for a fallback
    to another backend)."""

    def __init__(self, resident: ResidentB, i0: int, i1: int) -> None:
        self.resident, self.i0, self.i1 = resident, i0, i1
        self.shape = (i1 - i0, resident.nvir, resident.naux)
        self.ndim = 3

    def host(self, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Orbitals ``lo : hi`` of this block (all by default) read from the host store."""
        hi = self.i1 - self.i0 if hi is None else hi
        return self.resident.store.read_b(self.i0 + lo, self.i0 + hi)

    def tiles(self, rows: slice, tiles: slice, split: bool):
        """Device-side slice ``[..., i0 + rows, tiles, :, :]`` of the tile-major B."""
        if split != self.resident.split:
            raise InputError("mp2_pair_sums: B was placed on the device for "
                             f"{'bf16x3' if self.resident.split else 'fp32'} products")
        start = self.i0 + rows.start
        index = (Ellipsis, slice(start, start + rows.stop - rows.start), tiles,
                 slice(None), slice(None))
        return self.resident.array.take(index)


class ResidentB:
    """The fitted B of one store in device memory for the pair stage: tile-major
    (``_tile_major``; ``(2, ...)`` for bf16x3), uploaded once, in occupied chunks of about
    ``upload_mb`` of float32 layout (at least one orbital).

    store : has ``nocc`` and ``read_b(i0, i1) -> (n, nvir, naux)``; ``nvir``, ``naux`` its
    blocks' other dimensions. ``read_b`` here returns a :class:`DeviceBlock`."""

    def __init__(self, store, nvir: int, naux: int, device: nki_runtime.NkiDevice,
                 split: bool, upload_mb: float = 256.0) -> None:
        self.store, self.split = store, split
        self.nocc, self.nvir, self.naux = int(store.nocc), int(nvir), int(naux)
        shape = _tile_major_shape(self.nocc, self.nvir, self.naux, split)
        self.array = device.allocate(shape, "bfloat16" if split else "float32")
        per_orbital = self.array.nbytes // max(1, self.nocc)
        step = max(1, int(upload_mb * 1e6) // max(1, per_orbital))
        for i0 in range(0, self.nocc, step):
            i1 = min(self.nocc, i0 + step)
            index = (slice(None),) * (2 if split else 1) + (slice(i0, i1),)
            device.write(self.array, index, _tile_major(store.read_b(i0, i1), split))

    def read_b(self, i0: int, i1: int) -> DeviceBlock:
        return DeviceBlock(self, i0, i1)


def _tile_major_shape(n: int, nv: int, naux: int, split: bool) -> tuple[int, ...]:
    shape = (TILE_K, n, ceil_div(nv, TILE_M), ceil_div(naux, TILE_K), TILE_M)
    return (2,) + shape if split else shape


def resident_b_bytes(nocc: int, nvir: int, naux: int, products: str = "fp32") -> int:
    """Device bytes of one store's B as :class:`ResidentB` holds it."""
    split = products == "bf16x3"  # two bfloat16 parts: the bytes of one float32 layout
    return int(np.prod(_tile_major_shape(nocc, nvir, naux, split))) * (2 if split else FP32_BYTES)


def place_b(stores, device: nki_runtime.NkiDevice, products: str = "fp32",
            in_memory: bool = True):
    """``(stores, None)`` with each store's B placed on the device (:class:`ResidentB`; None
    stays None); else ``(stores, why not)`` unchanged (each block is then uploaded by the
    launches that use it): when B with the operands already kept would pass
    ``device.resident_budget``, when the kernels refuse the pair shapes (the blocks then fall
    back as the registry decides, read block by block), or, in emulator and simulator modes
    (whose "device" is host memory, outside the ``max_memory`` plan), when B is out of core
    (``in_memory`` False)."""
    present = [st for st in stores if st is not None and int(st.nocc) > 0]
    if not present:
        return stores, "no orbitals to pair"
    if device.mode != "hardware" and not in_memory:
        return stores, ("B is out of core, and in emulator and simulator modes the device's "
                        "memory is the host's")
    shapes = [tuple(int(x) for x in st.read_b(0, 1).shape[1:]) for st in present]
    split = products == "bf16x3"
    checks = [(nv, nv, naux, True) for nv, naux in shapes]
    if len(shapes) == 2:
        checks.append((shapes[0][0], shapes[1][0], shapes[0][1], False))
    for nva, nvb, naux, exchange in checks:
        refused = _energy_supports_shape(nva, nvb, naux, exchange, split)
        if refused is not None:
            return stores, f"the pair kernels refuse these shapes ({refused})"
    size = sum(resident_b_bytes(int(st.nocc), nv, naux, products)
               for st, (nv, naux) in zip(present, shapes))
    kept = device.ledger.resident_bytes
    if size + kept > device.resident_budget:
        return stores, (f"B takes {size / 2**30:.2f} GiB on the device (with "
                        f"{kept / 2**30:.2f} GiB of operands kept), over the "
                        f"{device.resident_budget / 2**30:.2f} GiB kept for resident operands")
    dims = iter(shapes)
    return [st if st is None or int(st.nocc) == 0 else ResidentB(st, *next(dims), device, split)
            for st in stores], None


class _HostB:
    """A host block laid out tile-major once per op call; its launch slices are uploaded by
    each launch (the ledger counts them)."""

    def __init__(self, ovl: torch.Tensor, split: bool) -> None:
        self.array = _tile_major(ovl, split)

    def tiles(self, rows: slice, tiles: slice, split: bool):
        part = self.array[..., rows, tiles, :, :]
        return part.contiguous() if split else np.ascontiguousarray(part)


def mp2_pair_sums(ovL_i, ovL_j, eps_i: torch.Tensor,
                  eps_j: torch.Tensor, eps_va: torch.Tensor, eps_vb: torch.Tensor,
                  weights: torch.Tensor, exchange: bool, *, products: str = "fp32",
                  mode: str, device: nki_runtime.NkiDevice | None = None) -> torch.Tensor:
    """Weighted pair sums ``[direct, exchange]`` of a block of occupied pairs on the fused
    kernels (the contract of :func:`dfmp2.linalg.torch_ops.mp2_pair_sums`).

    ``products``: ``"fp32"`` (float32 products) or ``"bf16x3"`` (B split on the host into
    bfloat16 high and low parts, ``T = hi*hi + hi*lo + lo*hi`` in float32 PSUM: three bfloat16
    matmuls, each a quarter of a float32 one on the TensorE). ``device``: the run's
    :class:`~dfmp2.linalg.nki_runtime.NkiDevice` (its mode must be ``mode``); None, a fresh one
    for this call.

    ovL_i : (ni, nva, naux) host tensor, or a :class:`DeviceBlock` of B already on the device
    (:func:`place_b`); ovL_j : (nj, nvb, naux) likewise; eps_i (ni,), eps_j (nj,), eps_va
    (nva,), eps_vb (nvb,); weights (ni, nj) float64; ``exchange`` needs one virtual space.
    Returns float64 ``[sum_ij w_ij sum_ab T_ab^2/D, sum_ij w_ij sum_ab T_ab T_ba/D]`` (the
    second 0.0 without exchange). With ``exchange`` the ``mp2_pair_energy_kernel`` runs, else
    the ``mp2_pair_direct_kernel``. The (ia|jb) GEMM and the reduction to per-partition partial
    sums run in fp32 on the device; the host adds the partial sums and applies the weights in
    fp64. Launches (``_energy_launch_plan``): one per block of columns j (and, when one pair
    is too large for a launch, per window of a tiles), looping on the device over every row i
    from the first to the last with a weight in those columns (a persistent launch: the rows
    are a device loop, so their number does not grow the compiled kernel); the rows split over
    the device's SPMD programs (``kernel[2]`` on trn2) and the launches spread over its
    NeuronCores (trn1: two). Columns with no weight are not launched, and pairs of weight 0
    inside a launch add nothing. Any nvir and naux run; raises :class:`InputError` on
    inconsistent shapes.
    """
    ni, nj, nva, nvb, naux = torch_ops.check_pair_sums_args(
        ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, exchange)
    exchange = bool(exchange)
    if products not in NKI_MATMULS:
        raise InputError(f"mp2_pair_sums: products {products!r} is not one of "
                         f"{', '.join(NKI_MATMULS)}")
    split = products == "bf16x3"
    if exchange and not _one_virtual_space(eps_va, eps_vb):
        raise InputError(f"mp2_pair_sums: {_TWO_SPACES}")
    device = _device(mode, device)
    w_ij = _f64(weights)
    direct = ex = 0.0
    if ni == 0 or nj == 0 or nva == 0 or nvb == 0 or naux == 0 or not w_ij.any():
        return torch.tensor([direct, ex], dtype=torch.float64, device=_torch_device(eps_i))
    cols, window = _energy_launch_plan(nva, nvb, naux, exchange, split)
    if window == 0:
        raise InputError(
            f"mp2_pair_sums: {_energy_supports_shape(nva, nvb, naux, exchange, split)}")
    src_i = ovL_i if isinstance(ovL_i, DeviceBlock) else _HostB(ovL_i, split)
    if ovL_j is ovL_i:
        src_j = src_i  # a diagonal block: one layout
    else:
        src_j = ovL_j if isinstance(ovL_j, DeviceBlock) else _HostB(ovL_j, split)
    e_i, e_j, e_a = _f64(eps_i), _f64(eps_j), _f64(eps_va)
    neg_eps_row = _f32(np.broadcast_to(-_f64(eps_vb), (TILE_M, nvb)))
    n_at = ceil_div(nva, TILE_M)
    nki_runtime.prepare(mode)
    kernel = nki_runtime.load_kernel("mp2_energy", _ENERGY_KERNELS[exchange])
    for j0 in range(0, nj, cols):
        j1 = min(nj, j0 + cols)
        rows = _row_range(w_ij[:, j0:j1])
        if rows is None:
            continue  # no weight in these columns: not launched
        i0, i1 = rows
        weight = w_ij[i0:i1, j0:j1]
        nr = i1 - i0
        grid = device.lnc if nr >= device.lnc else 1
        core = device.next_core()  # blocks of columns (all their windows) take the cores in turn
        direct_ij = np.zeros(weight.shape)
        ex_ij = np.zeros(weight.shape)
        for w0 in range(0, n_at, window):
            a0, a1 = w0 * TILE_M, min(nva, (w0 + window) * TILE_M)
            n_wt = ceil_div(a1 - a0, TILE_M)
            if exchange:  # the window's rows and every later column of the one space
                tiles_i, tiles_j, nv_rest = slice(w0, None), slice(w0, None), nva - a0
                neg_row = np.ascontiguousarray(neg_eps_row[:, a0:])
            else:  # the window's rows against all of the j side's columns
                tiles_i, tiles_j, nv_rest = slice(w0, w0 + n_wt), slice(None), a1 - a0
                neg_row = neg_eps_row
            d_col = (e_i[i0:i1, None, None] + e_j[None, None, j0:j1]
                     - e_a[None, a0:a1, None])  # (nr, window rows, nj), fp64
            args = (src_i.tiles(slice(i0, i1), tiles_i, split),
                    src_j.tiles(slice(j0, j1), tiles_j, split), _f32(d_col), neg_row)
            if not exchange:  # the last a tile's denominators with b on the partitions
                last = a0 + (n_wt - 1) * TILE_M
                d_col_b = (e_i[i0:i1, None, None] + e_j[None, None, j0:j1]
                           - _f64(eps_vb)[None, :, None])  # (nr, nvb, nj), fp64
                args += (_f32(d_col_b), _f32(np.broadcast_to(-e_a[last:a1], (TILE_M,
                                                                              a1 - last))))
            (partials,) = device.launch(kernel, args, grid=grid, core=core)
            d_part, x_part = _window_sums(partials, nr, j1 - j0, n_wt, nv_rest, nvb, exchange)
            direct_ij += d_part
            ex_ij += x_part
        for program in range(grid):
            r0, r1 = _program_share(nr, grid, program)
            device.ledger.program_pairs[core * device.lnc + program] += (r1 - r0) * (j1 - j0)
        used = weight != 0.0  # a skipped pair adds nothing, even a non-finite one
        direct += float((weight[used] * direct_ij[used]).sum())
        ex += float((weight[used] * ex_ij[used]).sum())
    return torch.tensor([direct, ex], dtype=torch.float64, device=_torch_device(eps_i))


def _torch_device(tensor: torch.Tensor):
    return tensor.device if isinstance(tensor, torch.Tensor) else "cpu"


def _energy_supports_shape(nva: int, nvb: int, naux: int, exchange: bool,
                           split: bool = False) -> str | None:
    """None, or why one pair and one a tile exceed a launch's bounds."""
    if _energy_launch_plan(nva, nvb, naux, exchange, split)[1] > 0:
        return None
    products = " with bf16x3 products" if split else ""
    return (f"nvir={nva}x{nvb} with naux={naux}: one pair and one a tile exceed a launch of "
            f"{_ENERGY_KERNELS[exchange]}{products} ({MAX_ENERGY_INSTRUCTIONS_PER_CALL} "
            f"instructions, {ENERGY_SBUF_BUDGET // 1024} KiB of SBUF per partition)")


#: Why the exchange kernel refuses two sets of virtual energies.
_TWO_SPACES = ("the exchange kernel pairs orbitals of one virtual space (eps_va equal to eps_vb: "
               "it uses D_ab = D_ba); exchange between two spaces runs on the host")


def _one_virtual_space(eps_va, eps_vb) -> bool:
    return eps_va is eps_vb or torch.equal(torch.as_tensor(eps_va), torch.as_tensor(eps_vb))


def _energy_supports(ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights,
                     exchange, products: str = "fp32") -> str | None:
    if ovL_i.ndim != 3 or ovL_j.ndim != 3:
        return (f"mp2_pair_sums needs 3-D ovL blocks, got {tuple(ovL_i.shape)} and "
                f"{tuple(ovL_j.shape)}")
    nva, naux = int(ovL_i.shape[1]), int(ovL_i.shape[2])
    nvb = int(ovL_j.shape[1])
    if exchange and nva != nvb:
        return None  # not a shape limit: mp2_pair_sums raises InputError on these operands
    if exchange and eps_va is not None and eps_vb is not None and (
            tuple(eps_va.shape) == tuple(eps_vb.shape) == (nva,)) and not _one_virtual_space(
            eps_va, eps_vb):
        return _TWO_SPACES  # the pipeline never asks this: its exchange blocks share one space
    return _energy_supports_shape(nva, nvb, naux, bool(exchange), products == "bf16x3")


#: op name -> shape check taking the op's arguments (without ``mode``): None or the limit hit.
SUPPORTS = {
    "gemm": _gemm_supports,
    "cholesky": _cholesky_supports,
    "trsm": _trsm_supports,
    "trmm": _trmm_supports,
    "mp2_pair_sums": _energy_supports,
}
