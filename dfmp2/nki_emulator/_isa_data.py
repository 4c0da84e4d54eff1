"""Data movement and generation: ``dma_copy``, ``tensor_copy``, ``memset``, ``iota``,
``affine_select``."""

from __future__ import annotations

import numpy as np

from . import _checks as ck
from . import _enums as E
from . import _ops, _trace
from . import language as nl
from ._context import EmulatorError, current
from ._dtypes import from_float32, to_float32
from ._tensor import ApView

F32 = np.float32
_CMP = (nl.equal, nl.not_equal, nl.less, nl.less_equal, nl.greater, nl.greater_equal)


def dma_copy(
    dst,
    src,
    oob_mode=E.oob_mode.error,
    dge_mode=E.dge_mode.unknown,
    engine=E.engine.unknown,
    name=None,
):
    """DMA ``dst = src`` between HBM and SBUF (or SBUF to SBUF), element counts equal.

    Elements are matched in row-major order. Different dtypes convert src -> float32 -> dst;
    equal dtypes copy bit-exactly. PSUM is neither a source nor a destination of DMA.

    Either side may be an access pattern on an HBM tensor (``t.ap(...)``, see
    :meth:`~._tensor.NkiTensor.ap`), the other an ordinary tensor (or another pattern): its
    scalar offset is read now, every element it selects must lie inside the tensor, reads
    refuse never-written elements and writes mark elements written (and record the writing
    program of a grid launch's shared output), as for an ordinary view. In the record, the
    pattern's ``run_bytes`` (its contiguous run per row) is computed from its pattern as for a
    view: the trailing ``[step, num]`` pairs after the first that are contiguous (innermost step
    1, each outer step the product of the inner nums), multiplied out.
    """
    instr = "dma_copy"
    current(f"nisa.{instr}")
    s = _dma_operand(src, instr, "src")
    d = ck.writable(_dma_operand(dst, instr, "dst"), instr)
    if s.buffer is ck.PSUM:
        raise EmulatorError(
            f"nisa.{instr}: src {s.name!r} is in PSUM; dma_copy cannot read PSUM in "
            "0.3.0: nisa.tensor_copy it to SBUF first"
        )
    if d.buffer is ck.PSUM:
        raise EmulatorError(
            f"nisa.{instr}: dst {d.name!r} is in PSUM; DMA moves data between HBM and SBUF"
        )
    for label, t in (("src", s), ("dst", d)):
        if t.buffer.on_chip:
            ck.on_chip(t, instr, label)
    if s.size != d.size:
        raise EmulatorError(
            f"nisa.{instr}: src {s.shape} has {s.size} elements but dst {d.shape} has {d.size}"
        )
    if dge_mode is E.dge_mode.hwdge and s.dtype is not d.dtype:
        raise EmulatorError(
            f"nisa.{instr}: dge_mode=hwdge requires equal dtypes, "
            f"got {s.dtype.name} -> {d.dtype.name}"
        )
    if engine not in (E.engine.unknown, E.engine.sync, E.engine.scalar):
        raise EmulatorError(
            f"nisa.{instr}: engine must be unknown, sync or scalar (HWDGE), got {engine}"
        )
    if engine is not E.engine.unknown and dge_mode is not E.dge_mode.hwdge:
        raise EmulatorError(
            f"nisa.{instr}: engine={engine} selects a hardware DGE queue and needs "
            f"dge_mode=nisa.dge_mode.hwdge, got {dge_mode}"
        )
    if dge_mode is E.dge_mode.hwdge and current(instr).gen == 2:
        raise EmulatorError(
            f"nisa.{instr}: dge_mode=hwdge exists from gen3 (trn2); on gen2 (trn1) leave "
            "dge_mode and engine unset"
        )
    if oob_mode is not E.oob_mode.error:
        raise EmulatorError(
            f"nisa.{instr}: oob_mode={oob_mode} only applies to indirect DMA, which is not emulated"
        )
    if isinstance(s, ApView):
        values = ck.read_ap_raw(s, instr, "src")
    else:
        values = ck.read_raw(s, instr, "src")
    if s.dtype is not d.dtype:
        values = from_float32(to_float32(values), d.dtype)
    if isinstance(d, ApView):
        ck.write_ap_raw(d, values, instr, "dst")
    else:
        ck.write_raw(d, values)
    hbm = s if not s.buffer.on_chip else d
    _trace.emit(instr, "dma", {"dst": d, "src": s}, nbytes=d.size * d.dtype.itemsize,
                src_bytes=s.size * s.dtype.itemsize, run_bytes=_contiguous_run_bytes(hbm))


def _dma_operand(x, instr: str, name: str):
    """A dma_copy operand: an ordinary tensor view or an access pattern (:class:`ApView`)."""
    return x if isinstance(x, ApView) else ck.tensor(x, instr, name)


def _contiguous_run_bytes(view) -> int:
    """Device bytes of the longest contiguous run of ``view`` within one row of its first axis
    (the partition axis of an on-chip view; for an HBM view the rows that land on partitions):
    the trailing free axes that are contiguous in memory, multiplied out. For an access pattern
    the same from its ``[step, num]`` pairs (steps in elements)."""
    if isinstance(view, ApView):
        sizes_strides = [(num, step) for step, num in view.pattern[1:]]
        expected = 1
    else:
        data = view._data
        sizes_strides = list(zip(data.shape[1:], data.strides[1:]))
        expected = data.itemsize
    run = 1
    for size, stride in reversed(sizes_strides):
        if size == 1:
            continue
        if stride != expected:
            break
        run *= size
        expected *= size
    return run * view.dtype.itemsize


def tensor_copy(dst, src, engine=E.engine.unknown, name=None):
    """Copy an SBUF/PSUM tile: same partitions and elements per partition; bit exact when the
    dtypes match on Vector/GpSimd, else through float32."""
    instr = "tensor_copy"
    run = current(f"nisa.{instr}")
    s = ck.on_chip(src, instr, "src")
    d = ck.writable(ck.on_chip(dst, instr, "dst"), instr)
    ck.same_layout(instr, "src", s, "dst", d)
    eng = ck.engine_name(engine, instr, "vector", ("vector", "scalar", "gpsimd"))
    ck.no_psum_on_gpsimd(eng, instr, dst=d, src=s)
    if eng == "scalar" and run.gen == 2:
        raise EmulatorError(
            f"nisa.{instr}: no Scalar Engine tensor_copy on gen2 (trn1); use "
            "nisa.activation(op=nl.copy)"
        )
    if s.dtype is d.dtype and eng != "scalar":
        ck.write_raw(d, ck.read_raw(s, instr, "src"))
    else:
        ck.write_f32(d, ck.read_f32(s, instr, "src"))
    _trace.emit(instr, eng, {"dst": d, "src": s})


def memset(dst, value, engine=E.engine.unknown, name=None):
    """Fill ``dst`` with the constant ``value`` (an int for integer tiles)."""
    instr = "memset"
    current(f"nisa.{instr}")
    d = ck.writable(ck.on_chip(dst, instr, "dst"), instr)
    eng = ck.engine_name(engine, instr, "vector", ("vector", "gpsimd"))
    ck.no_psum_on_gpsimd(eng, instr, dst=d)
    if not d.dtype.is_float and not (
        isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    ):
        raise EmulatorError(
            f"nisa.{instr}: value {value!r} must be an int for the {d.dtype.name} tile (0.3.0)"
        )
    v = ck.scalar(value, instr, "value")
    if d.dtype.is_float:
        ck.write_f32(d, np.full(d.shape, v, dtype=F32))
    else:
        ck.write_raw(d, np.full(d.shape, int(value), dtype=d.dtype.storage))
    _trace.emit(instr, eng, {"dst": d}, value=value)


def _pattern(pattern, instr: str) -> list[tuple[int, int]]:
    if not isinstance(pattern, (list, tuple)) or not 1 <= len(pattern) <= 4:
        raise EmulatorError(
            f"nisa.{instr}: pattern must be a list of 1 to 4 [step, num] pairs, got {pattern!r}"
        )
    out = []
    for pair in pattern:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise EmulatorError(f"nisa.{instr}: pattern entry {pair!r} is not a [step, num] pair")
        out.append((int(pair[0]), int(pair[1])))
    return out


def _affine(
    d: ck.NkiTensor, pattern, offset: int, channel_multiplier: int, instr: str
) -> np.ndarray:
    """int64 values ``offset + p * channel_multiplier + sum(idx_i * step_i)`` of shape (P, F)."""
    pairs = _pattern(pattern, instr)
    count = int(np.prod([num for _step, num in pairs], dtype=np.int64))
    if count != ck.free_size(d):
        raise EmulatorError(
            f"nisa.{instr}: pattern {pattern} generates {count} elements per partition, "
            f"dst {d.shape} holds {ck.free_size(d)}"
        )
    free = np.zeros(1, dtype=np.int64)
    for step, num in pairs:
        free = (free[:, None] + step * np.arange(num, dtype=np.int64)[None, :]).reshape(-1)
    part = np.arange(d.shape[0], dtype=np.int64)[:, None] * int(channel_multiplier)
    values = int(offset) + part + free[None, :]
    return values.astype(np.int32).astype(np.int64)


def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """GpSimd: ``dst[p, i...] = offset + p * channel_multiplier + sum(i_k * step_k)`` in int32."""
    instr = "iota"
    current(f"nisa.{instr}")
    d = ck.writable(ck.on_chip(dst, instr, "dst", (ck.SBUF,)), instr)
    values = _affine(d, pattern, offset, channel_multiplier, instr)
    if d.dtype.is_float:
        ck.write_f32(d, values.astype(F32))
    else:
        info = np.iinfo(d.dtype.storage)
        ck.write_raw(d, np.clip(values, info.min, info.max).astype(d.dtype.storage))
    _trace.emit(instr, "gpsimd", {"dst": d})


def affine_select(
    dst,
    pattern,
    channel_multiplier,
    on_true_tile,
    on_false_value,
    cmp_op=nl.equal,
    offset=0,
    name=None,
):
    """GpSimd: ``dst = on_true_tile where cmp_op(affine, 0) else on_false_value``, with
    ``affine = offset + p * channel_multiplier + sum(i_k * step_k)``."""
    instr = "affine_select"
    current(f"nisa.{instr}")
    d = ck.writable(ck.on_chip(dst, instr, "dst", (ck.SBUF,)), instr)
    t = ck.on_chip(on_true_tile, instr, "on_true_tile", (ck.SBUF,))
    ck.same_layout(instr, "on_true_tile", t, "dst", d)
    if cmp_op not in _CMP:
        raise EmulatorError(
            f"nisa.{instr}: cmp_op must be a comparison operator, got {_ops.op_name(cmp_op)}"
        )
    false_value = ck.scalar(on_false_value, instr, "on_false_value")
    affine = _affine(d, pattern, offset, channel_multiplier, instr).astype(F32)
    keep = _ops.ALU_BINARY[cmp_op](affine, F32(0.0)) != 0
    p = d.shape[0]
    if t.dtype is d.dtype:
        true_vals = ck.read_raw(t, instr, "on_true_tile").reshape(p, -1)
        fill = from_float32(np.full(true_vals.shape, false_value, dtype=F32), d.dtype)
        ck.write_raw(d, np.where(keep, true_vals, fill))
    else:
        true_vals = ck.read_f32(t, instr, "on_true_tile").reshape(p, -1)
        ck.write_f32(d, np.where(keep, true_vals, false_value))
    _trace.emit(instr, "gpsimd", {"dst": d, "on_true_tile": t}, cmp_op=_ops.op_name(cmp_op))
