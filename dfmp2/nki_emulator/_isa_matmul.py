"""Tensor Engine instructions: ``nc_matmul`` and ``nc_transpose``."""

from __future__ import annotations

import numpy as np

from . import _checks as ck
from . import _enums as E
from . import _state, _trace
from ._context import EmulatorError, current
from ._dtypes import bfloat16, float16, float32

_MATMUL_INPUT = (float32, bfloat16, float16)


def _check_bank(dst: ck.NkiTensor, instr: str) -> None:
    start, end = dst.free_byte_range()
    bank = _state.PSUM_BANK_BYTES
    if start // bank != (end - 1) // bank:
        raise EmulatorError(
            f"nisa.{instr}: dst spans bytes [{start}, {end}) of each partition of {dst.name!r}, "
            f"crossing a {bank}-byte PSUM bank boundary; a matmul output must stay in one bank"
        )


def _resolve_accumulate(dst: ck.NkiTensor, accumulate: object) -> bool:
    """Return True to add into dst, False to overwrite; raise on documented misuse."""
    state = dst._psum_state
    if accumulate not in (None, True, False):
        raise TypeError(
            f"nisa.nc_matmul: accumulate must be None, True or False, got {accumulate!r}"
        )
    if np.any(state == 2) and accumulate is not False:
        raise EmulatorError(
            f"nisa.nc_matmul: accumulate={accumulate} onto PSUM {dst.name!r} {dst.shape} that was "
            "last written by a non-matmul instruction (memset, nl.zeros, tensor_copy, ...); "
            "accumulating onto such PSUM is undefined on gen2/gen3: start with accumulate=False"
        )
    if accumulate is True:
        if not np.all(state == 1):
            raise EmulatorError(
                f"nisa.nc_matmul: accumulate=True onto PSUM {dst.name!r} {dst.shape} with "
                f"{int((state != 1).sum())} element(s) never written by nc_matmul; "
                "the first matmul "
                "into a PSUM tile must overwrite (accumulate=False)"
            )
        return True
    if accumulate is False:
        return False
    if np.all(state == 0):
        return False
    if np.all(state == 1):
        return True
    raise EmulatorError(
        f"nisa.nc_matmul: accumulate=None on PSUM {dst.name!r} {dst.shape} that is partly "
        "written by earlier matmuls; the auto rule would mix overwrite and accumulate: "
        "pass accumulate explicitly"
    )


def nc_matmul(
    dst,
    stationary,
    moving,
    is_stationary_onezero=False,
    is_moving_onezero=False,
    is_transpose=False,
    accumulate=None,
    tile_position=(),
    tile_size=(),
    perf_mode=E.matmul_perf_mode.none,
    name=None,
):
    """``dst[m, n...] (+)= sum_k stationary[k, m] * moving[k, n...]`` on the Tensor Engine.

    Shapes: stationary ``(K, M)``, moving ``(K, N...)``, dst ``(M, N...)`` in PSUM, float32;
    ``K <= 128``, ``M <= 128``, ``prod(N...) <= 512``. Accumulation is in float32.
    """
    instr = "nc_matmul"
    current(f"nisa.{instr}")
    stat = ck.on_chip(stationary, instr, "stationary", (ck.SBUF,))
    mov = ck.on_chip(moving, instr, "moving", (ck.SBUF,))
    out = ck.writable(ck.on_chip(dst, instr, "dst", (ck.PSUM,)), instr)
    if perf_mode is not E.matmul_perf_mode.none:
        raise EmulatorError(f"nisa.{instr}: perf_mode={perf_mode} (FP8 double row) is not emulated")
    if stat.ndim != 2:
        raise EmulatorError(f"nisa.{instr}: stationary must be 2-D (K, M), got {stat.shape}")
    if out.dtype is not float32:
        raise EmulatorError(
            f"nisa.{instr}: dst must be float32 on gen2/gen3 (trn1/trn2), got {out.dtype.name}"
        )
    for label, t in (("stationary", stat), ("moving", mov)):
        if t.dtype not in _MATMUL_INPUT:
            raise EmulatorError(
                f"nisa.{instr}: {label} dtype {t.dtype.name} is not a matmul input type "
                "(bfloat16, float16, float32 are emulated)"
            )
    if (stat.dtype is float32) != (mov.dtype is float32):
        raise EmulatorError(
            f"nisa.{instr}: if one input is float32 the other must be too, got "
            f"stationary {stat.dtype.name} and moving {mov.dtype.name}"
        )
    k, m = stat.shape
    n_free = ck.free_size(mov)
    if mov.shape[0] != k:
        raise EmulatorError(
            f"nisa.{instr}: stationary {stat.shape} and moving {mov.shape} must have the "
            f"same partition (contraction) size, got {k} and {mov.shape[0]}"
        )
    if m > 128:
        raise EmulatorError(
            f"nisa.{instr}: stationary free size {m} exceeds gemm_stationary_fmax 128"
        )
    if n_free > 512:
        raise EmulatorError(
            f"nisa.{instr}: moving free size {n_free} exceeds gemm_moving_fmax 512 "
            "(one PSUM bank of float32)"
        )
    expected = (m,) + mov.shape[1:]
    if out.shape != expected:
        raise EmulatorError(
            f"nisa.{instr}: dst shape must be (stationary free, moving free...) = "
            f"{expected}, got {out.shape}"
        )
    if tile_position or tile_size:
        _check_tiling(tile_position, tile_size, k, m, current(instr).gen)
    _check_bank(out, instr)
    add = _resolve_accumulate(out, accumulate)
    a = ck.read_f32(stat, instr, "stationary")
    b = ck.read_f32(mov, instr, "moving").reshape(k, n_free)
    product = (a.T @ b).astype(np.float32).reshape(out.shape)
    if add:
        product = (out._data.astype(np.float32) + product).astype(np.float32)
    ck.write_f32(out, product, psum_state=1)
    _trace.emit(
        instr,
        "tensor",
        {"dst": out, "stationary": stat, "moving": mov},
        accumulate=add,
        requested=accumulate,
    )


def _check_tiling(tile_position: object, tile_size: object, k: int, m: int, gen: int) -> None:
    if not (
        isinstance(tile_position, tuple)
        and isinstance(tile_size, tuple)
        and len(tile_position) == 2
        and len(tile_size) == 2
    ):
        raise EmulatorError(
            "nisa.nc_matmul: tile_position and tile_size must both be 2-tuples when tiling"
        )
    rows, cols = tile_size
    r0, c0 = tile_position
    if rows not in (32, 64, 128) or cols not in (32, 64, 128):
        raise EmulatorError(f"nisa.nc_matmul: tile_size {tile_size} must use sizes 32, 64 or 128")
    if gen == 2 and 32 in (rows, cols):
        raise EmulatorError(
            f"nisa.nc_matmul: tile_size {tile_size}: gen2 (trn1) tiles the PE array in 2x 64 rows "
            "or columns only; 4x 32 exists from gen3 (trn2)"
        )
    if r0 % rows or c0 % cols or r0 + rows > 128 or c0 + cols > 128:
        raise EmulatorError(
            f"nisa.nc_matmul: tile_position {tile_position} must be a multiple of "
            f"tile_size {tile_size} inside the 128x128 array"
        )
    if k > rows or m > cols:
        raise EmulatorError(f"nisa.nc_matmul: stationary ({k}, {m}) exceeds tile_size {tile_size}")


def nc_transpose(dst, data, engine=E.engine.unknown, name=None):
    """Swap partition and (flattened) free axes: ``dst (F, P) = data (P, F...)^T``.

    Tensor Engine: SBUF -> PSUM, up to 128x128. Vector Engine: SBUF/PSUM, up to 32x32.
    ``dst.dtype`` must equal ``data.dtype``; the copy is bit exact.
    """
    instr = "nc_transpose"
    current(f"nisa.{instr}")
    src = ck.on_chip(data, instr, "data")
    out = ck.writable(ck.on_chip(dst, instr, "dst"), instr)
    p, f = src.shape[0], ck.free_size(src)
    default = "tensor" if (src.buffer is ck.SBUF and out.buffer is ck.PSUM) else "vector"
    eng = ck.engine_name(engine, instr, default, ("tensor", "vector"))
    limit = 128 if eng == "tensor" else 32
    if p > limit or f > limit:
        raise EmulatorError(
            f"nisa.{instr}: {eng} engine transposes at most {limit}x{limit}, got data {src.shape}"
        )
    if eng == "tensor" and (src.buffer is not ck.SBUF or out.buffer is not ck.PSUM):
        raise EmulatorError(
            f"nisa.{instr}: the Tensor Engine transposes SBUF -> PSUM, got "
            f"{src.buffer.value} -> {out.buffer.value}"
        )
    if out.dtype is not src.dtype:
        raise EmulatorError(
            f"nisa.{instr}: dst dtype {out.dtype.name} must equal data dtype {src.dtype.name}"
        )
    if eng == "tensor" and current(instr).gen == 2 and src.dtype is not float32:
        raise EmulatorError(
            f"nisa.{instr}: the gen2 (trn1) Tensor Engine writes float32 PSUM only, so it "
            f"transposes float32 data; got {src.dtype.name} (bfloat16 PSUM output from gen3)"
        )
    if out.shape[0] != f or ck.free_size(out) != p:
        raise EmulatorError(
            f"nisa.{instr}: dst must hold ({f}, {p}) for data {src.shape}, got {out.shape}"
        )
    values = ck.read_raw(src, instr, "data").reshape(p, f).T
    ck.write_raw(out, values)
    _trace.emit(instr, eng, {"dst": out, "data": src})
