"""Vector, Scalar and GpSimd compute instructions (float32 math, cast to ``dst.dtype``)."""

from __future__ import annotations

import numpy as np

from . import _checks as ck
from . import _enums as E
from . import _ops, _trace
from . import language as nl
from ._context import EmulatorError, current

F32 = np.float32


def _binary(op: object, instr: str, name: str):
    if op not in _ops.ALU_BINARY:
        raise EmulatorError(
            f"nisa.{instr}: {name}={_ops.op_name(op)} is not an emulated binary ALU "
            "operator (add, subtract, multiply, maximum, minimum, power, comparisons)"
        )
    return _ops.ALU_BINARY[op]


def _apply(op: object, x: np.ndarray, operand, reverse: bool, instr: str, name: str) -> np.ndarray:
    """``x op operand`` (or ``operand op x`` when reversed), with unary ALU ops supported."""
    if op in _ops.ALU_UNARY:
        if not (operand is None or (not isinstance(operand, np.ndarray) and operand == 0)):
            raise EmulatorError(
                f"nisa.{instr}: {_ops.op_name(op)} is unary; its operand must be None or 0"
            )
        return _ops.ALU_UNARY[op](x)
    if operand is None:
        raise EmulatorError(f"nisa.{instr}: binary operator {_ops.op_name(op)} needs an operand")
    fn = _binary(op, instr, name)
    return fn(operand, x) if reverse else fn(x, operand)


def _operand(value, data, instr, name):
    if value is None:
        return None
    return ck.scalar_or_column(value, data, instr, name, require_fp32=True)


def tensor_tensor(dst, data1, data2, op, engine=E.engine.unknown, name=None):
    """Elementwise ``dst = data1 op data2``; same partitions and elements per partition."""
    instr = "tensor_tensor"
    current(f"nisa.{instr}")
    a = ck.on_chip(data1, instr, "data1")
    b = ck.on_chip(data2, instr, "data2")
    out = ck.writable(ck.on_chip(dst, instr, "dst"), instr)
    fn = _binary(op, instr, "op")
    ck.same_layout(instr, "data1", a, "data2", b)
    ck.same_layout(instr, "data1", a, "dst", out)
    ck.not_both_psum(instr, "data1", a, "data2", b)
    default = "gpsimd" if op is nl.power else "vector"
    eng = ck.engine_name(engine, instr, default, ("vector", "gpsimd"))
    ck.no_psum_on_gpsimd(eng, instr, dst=out, data1=a, data2=b)
    p = a.shape[0]
    x = ck.read_f32(a, instr, "data1").reshape(p, -1)
    y = ck.read_f32(b, instr, "data2").reshape(p, -1)
    ck.write_f32(out, fn(x, y))
    _trace.emit(instr, eng, {"dst": out, "data1": a, "data2": b}, op=_ops.op_name(op))


def tensor_scalar(
    dst,
    data,
    op0,
    operand0,
    reverse0=False,
    op1=None,
    operand1=None,
    reverse1=False,
    engine=E.engine.unknown,
    name=None,
):
    """``dst = (data op0 operand0) op1 operand1`` with scalar or ``(P, 1)`` float32 operands."""
    instr = "tensor_scalar"
    current(f"nisa.{instr}")
    src = ck.on_chip(data, instr, "data")
    out = ck.writable(ck.on_chip(dst, instr, "dst"), instr)
    ck.same_layout(instr, "data", src, "dst", out)
    if op1 is None and operand1 is not None:
        raise EmulatorError(
            f"nisa.{instr}: operand1 given without op1; both must be None when unused"
        )
    eng = ck.engine_name(engine, instr, "vector", ("vector", "scalar", "gpsimd"))
    ck.no_psum_on_gpsimd(eng, instr, dst=out, data=src)
    if eng == "gpsimd" and (op0, op1) not in ((nl.rsqrt, None),):
        raise EmulatorError(
            f"nisa.{instr}: on the GpSimd engine tensor_scalar computes only rsqrt (op0=nl.rsqrt, "
            f"no op1); got ({_ops.op_name(op0)}, {op1!r}): use the Vector Engine"
        )
    if eng == "scalar":
        combos = {(nl.multiply, nl.add), (nl.multiply, None), (nl.add, None)}
        if current(instr).gen == 2:
            raise EmulatorError(f"nisa.{instr}: engine=scalar is not modelled for gen2 (trn1)")
        if (op0, op1) not in combos:
            raise EmulatorError(
                f"nisa.{instr}: the Scalar Engine on trn2 supports only (multiply, add), "
                f"(multiply, None), (add, None); got ({_ops.op_name(op0)}, {op1!r})"
            )
    p = src.shape[0]
    x = ck.read_f32(src, instr, "data").reshape(p, -1)
    x = _apply(op0, x, _operand(operand0, src, instr, "operand0"), reverse0, instr, "op0")
    if op1 is not None:
        x = _apply(op1, x, _operand(operand1, src, instr, "operand1"), reverse1, instr, "op1")
    ck.write_f32(out, x)
    _trace.emit(
        instr,
        eng,
        {"dst": out, "data": src},
        op0=_ops.op_name(op0),
        op1=None if op1 is None else _ops.op_name(op1),
    )


def scalar_tensor_tensor(
    dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None
):
    """``dst = (data op0 operand0) op1 operand1``.

    ``operand0`` is a scalar or a ``(P, 1)`` tile, ``operand1`` a tile shaped like ``data``.
    """
    instr = "scalar_tensor_tensor"
    current(f"nisa.{instr}")
    src = ck.on_chip(data, instr, "data")
    other = ck.on_chip(operand1, instr, "operand1")
    out = ck.writable(ck.on_chip(dst, instr, "dst"), instr)
    ck.same_layout(instr, "data", src, "operand1", other)
    ck.same_layout(instr, "data", src, "dst", out)
    ck.not_both_psum(instr, "data", src, "operand1", other)
    p = src.shape[0]
    x = ck.read_f32(src, instr, "data").reshape(p, -1)
    x = _apply(
        op0, x, ck.scalar_or_column(operand0, src, instr, "operand0", False), reverse0, instr, "op0"
    )
    y = ck.read_f32(other, instr, "operand1").reshape(p, -1)
    fn = _binary(op1, instr, "op1")
    ck.write_f32(out, fn(y, x) if reverse1 else fn(x, y))
    _trace.emit(
        instr,
        "vector",
        {"dst": out, "data": src, "operand1": other},
        op0=_ops.op_name(op0),
        op1=_ops.op_name(op1),
    )


def activation(
    dst,
    op,
    data,
    bias=None,
    scale=1.0,
    reduce_op=None,
    reduce_res=None,
    reduce_cmd=E.reduce_cmd.idle,
    name=None,
):
    """ScalarE ``dst = op(data * scale + bias)`` with the optional per-partition add-reduction
    into the 128 reduce registers (``reduce_cmd``) and their read-out into ``reduce_res``."""
    instr = "activation"
    run = current(f"nisa.{instr}")
    src = ck.on_chip(data, instr, "data")
    out = ck.writable(ck.on_chip(dst, instr, "dst"), instr)
    ck.same_layout(instr, "data", src, "dst", out)
    if op not in _ops.ACTIVATION:
        raise EmulatorError(
            f"nisa.{instr}: op={_ops.op_name(op)} is not an emulated activation function"
        )
    p = src.shape[0]
    if op is nl.reciprocal and bias is not None and run.gen == 2:
        raise EmulatorError(
            f"nisa.{instr}: op=reciprocal takes no bias on gen2 (trn1); add the bias first "
            "(tensor_scalar) or use nisa.reciprocal on the VectorE"
        )
    if bias is not None and not isinstance(bias, ck.NkiTensor) and run.gen == 2:
        raise EmulatorError(
            f"nisa.{instr}: on gen2 (trn1) bias must be a ({p}, 1) tile, got scalar {bias!r}"
        )
    b = F32(0.0) if bias is None else ck.scalar_or_column(bias, src, instr, "bias", False)
    s = ck.scalar_or_column(scale, src, instr, "scale", True)
    x = ck.read_f32(src, instr, "data").reshape(p, -1) * s + b
    _ops.check_activation_range(op, x, f"nisa.{instr}")
    y = _ops.ACTIVATION[op](x).astype(F32)
    _reduce_registers(run, src, y, reduce_op, reduce_res, reduce_cmd)
    ck.write_f32(out, y)
    _trace.emit(
        instr,
        "scalar",
        {"dst": out, "data": src, "reduce_res": reduce_res},
        op=_ops.op_name(op),
        reduce_cmd=reduce_cmd.name,
    )


def _reduce_registers(run, src, y, reduce_op, reduce_res, cmd) -> None:
    instr = "activation"
    if not isinstance(cmd, E.reduce_cmd):
        raise TypeError(f"nisa.{instr}: reduce_cmd must be an nisa.reduce_cmd member, got {cmd!r}")
    if cmd is E.reduce_cmd.load_reduce:
        raise EmulatorError(
            f"nisa.{instr}: nisa.reduce_cmd.load_reduce is not documented for activation"
        )
    lanes = slice(src.partition_start(), src.partition_start() + src.shape[0])
    if reduce_op is not None and reduce_op is not nl.add:
        raise EmulatorError(
            f"nisa.{instr}: reduce_op must be nl.add, got {_ops.op_name(reduce_op)}"
        )
    if cmd in (E.reduce_cmd.reduce, E.reduce_cmd.reset_reduce) and reduce_op is None:
        raise EmulatorError(f"nisa.{instr}: reduce_cmd={cmd.name} needs reduce_op=nl.add, got None")
    if cmd in (E.reduce_cmd.reset, E.reduce_cmd.reset_reduce):
        run.reduce_regs[lanes] = 0.0
        run.reduce_regs_valid[lanes] = True
    if cmd in (E.reduce_cmd.reduce, E.reduce_cmd.reset_reduce):
        if not run.reduce_regs_valid[lanes].all():
            raise EmulatorError(
                f"nisa.{instr}: reduce_cmd=reduce on reduce registers never reset in this "
                "kernel; use reset or reset_reduce first"
            )
        run.reduce_regs[lanes] += y.sum(axis=1, dtype=F32)
    if reduce_res is not None:
        res = ck.writable(ck.on_chip(reduce_res, instr, "reduce_res"), instr, "reduce_res")
        if res.shape != (src.shape[0], 1):
            raise EmulatorError(
                f"nisa.{instr}: reduce_res must have shape ({src.shape[0]}, 1), got {res.shape}"
            )
        if not run.reduce_regs_valid[lanes].all():
            raise EmulatorError(
                f"nisa.{instr}: reading reduce registers into reduce_res before any reset"
            )
        ck.write_f32(res, run.reduce_regs[lanes].reshape(-1, 1))


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce the trailing free axes ``axis`` of ``data`` (never the partition axis 0)."""
    instr = "tensor_reduce"
    current(f"nisa.{instr}")
    src = ck.on_chip(data, instr, "data")
    out = ck.writable(ck.on_chip(dst, instr, "dst"), instr)
    if op not in _ops.REDUCE:
        raise EmulatorError(
            f"nisa.{instr}: op={_ops.op_name(op)} is not an emulated reduction "
            "(add, multiply, maximum, minimum)"
        )
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    nd = src.ndim
    axes = tuple(int(a) + nd if int(a) < 0 else int(a) for a in axes)
    if 0 in axes:
        raise EmulatorError(
            f"nisa.{instr}: axis {axis} includes the partition axis 0, which cannot be reduced; "
            "use nc_matmul with a ones vector or tensor_partition_reduce"
        )
    if sorted(axes) != list(range(nd - len(axes), nd)) or len(set(axes)) != len(axes):
        raise EmulatorError(
            f"nisa.{instr}: axis {axis} must be the last contiguous free axes of data "
            f"{src.shape} (e.g. ({nd - 1},) or {tuple(range(max(1, nd - 2), nd))})"
        )
    kept = src.shape[: nd - len(axes)]
    expected = kept + (1,) * len(axes) if keepdims else kept
    if out.shape[0] != src.shape[0] or ck.free_size(out) != int(
        np.prod(expected[1:], dtype=np.int64)
    ):
        raise EmulatorError(f"nisa.{instr}: dst {out.shape} must hold the reduced shape {expected}")
    fn, _identity = _ops.REDUCE[op]
    x = ck.read_f32(src, instr, "data")
    y = fn(x, axis=axes).astype(F32)
    if negate:
        y = -y
    ck.write_f32(out, y)
    _trace.emit(instr, "vector", {"dst": out, "data": src}, op=_ops.op_name(op), axis=axes)


def tensor_partition_reduce(dst, op, data, name=None):
    """GpSimd reduction across partitions: ``dst (1, F...) = op over p of data (P, F...)``."""
    instr = "tensor_partition_reduce"
    current(f"nisa.{instr}")
    src = ck.on_chip(data, instr, "data", (ck.SBUF,))
    out = ck.writable(ck.on_chip(dst, instr, "dst", (ck.SBUF,)), instr)
    if op not in (nl.add, nl.maximum):
        raise EmulatorError(
            f"nisa.{instr}: op={_ops.op_name(op)} not emulated (nl.add, nl.maximum)"
        )
    if out.shape[0] != 1 or ck.free_size(out) != ck.free_size(src):
        raise EmulatorError(
            f"nisa.{instr}: dst must have 1 partition and {ck.free_size(src)} elements, "
            f"got {out.shape}"
        )
    fn, _identity = _ops.REDUCE[op]
    x = ck.read_f32(src, instr, "data").reshape(src.shape[0], -1)
    ck.write_f32(out, fn(x, axis=0).astype(F32))
    _trace.emit(instr, "gpsimd", {"dst": out, "data": src}, op=_ops.op_name(op))


def reciprocal(dst, data, name=None):
    """VectorE ``dst = 1 / data`` in float32."""
    instr = "reciprocal"
    current(f"nisa.{instr}")
    src = ck.on_chip(data, instr, "data")
    out = ck.writable(ck.on_chip(dst, instr, "dst"), instr)
    ck.same_layout(instr, "data", src, "dst", out)
    x = ck.read_f32(src, instr, "data")
    with np.errstate(divide="ignore"):
        ck.write_f32(out, F32(1.0) / x)
    _trace.emit(instr, "vector", {"dst": out, "data": src})
