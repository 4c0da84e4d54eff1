"""Register instructions: ``register_alloc``, ``register_move``, ``register_load``,
``register_store`` (NKI 0.3.0, ``nki/api/nki/isa/__init__.py``, and
``nki/get-started/nki-language-guide.rst``, "Dynamic Control Flow").

"Each engine sequencer (Tensor/Scalar/Vector/GpSimd/Sync Engine) within a NeuronCore maintains
its own set of physical registers [...] The NKI compiler handles physical register allocation
(and deallocation) across the appropriate engine sequencers". The emulator attributes the four
instructions to one sequencer, the Sync Engine's (``nisa.engine.sync``; trace records carry
``engine="sync"``), and counts each as one instruction, ``register_alloc`` too (an upper bound:
allocating an uninitialised register may issue nothing). dfmp2's cost model
(:func:`dfmp2.nki_model.instruction_cost`) costs them at zero.

Emulated: a register holds an integer in ``[-2**31, 2**32)`` (the i32 and u32 ranges);
``register_load`` reads one element of an integer SBUF or HBM tensor, ``register_store``
writes one into an integer SBUF or HBM tensor (the value must fit its dtype). The loop variable
of ``nl.dynamic_range`` is frozen: ``register_move``/``register_load`` into it raise. Not
emulated: fp32 and 64-bit (register pair) values, float tensors as source or destination.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _checks as ck
from . import _trace
from ._context import EmulatorError, current
from ._register import REGISTER_MAX, REGISTER_MIN, VirtualRegister, register_value
from ._tensor import ApView, NkiTensor

_ENGINE = "sync"


def _immediate(value: Any, instr: str, name: str) -> int:
    """A compile-time int that fits a 32-bit register."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"nisa.{instr}: {name} must be an int, got {value!r}")
    value = int(value)
    if not REGISTER_MIN <= value <= REGISTER_MAX:
        raise EmulatorError(
            f"nisa.{instr}: {name}={value} does not fit a 32-bit register "
            f"([{REGISTER_MIN}, {REGISTER_MAX}], as i32 or u32)"
        )
    return value


def _destination(dst: Any, instr: str) -> VirtualRegister:
    """A register ``dst`` may write: not the frozen loop variable of ``nl.dynamic_range``."""
    if not isinstance(dst, VirtualRegister):
        raise TypeError(
            f"nisa.{instr}: dst must be a VirtualRegister (nisa.register_alloc), got "
            f"{type(dst).__name__}"
        )
    if dst._frozen:
        raise EmulatorError(
            f"nisa.{instr}: dst is the induction variable of a nl.dynamic_range loop, which is "
            "frozen: you cannot write to it with register_move or register_load "
            "(nki-language-guide, 'Dynamic Control Flow')"
        )
    return dst


def _scalar_tensor(t: Any, instr: str, name: str) -> NkiTensor:
    """A one-element integer tensor in SBUF or HBM."""
    if isinstance(t, ApView):
        ck.tensor(t, instr, name)  # raises: access patterns are dma_copy operands only
    t = ck.tensor(t, instr, name)
    if t.buffer is ck.PSUM:
        raise EmulatorError(f"nisa.{instr}: {name} {t.name!r} is in PSUM; use SBUF or HBM")
    if t.buffer.on_chip:
        ck.on_chip(t, instr, name)
    if t.size != 1:
        raise EmulatorError(
            f"nisa.{instr}: {name} must be a tensor with exactly one element (shape [1] or "
            f"[1, 1]), got {t.shape}"
        )
    if t.dtype.is_float:
        raise EmulatorError(
            f"nisa.{instr}: {name} is {t.dtype.name}; the emulator's registers hold integers "
            "(fp32 register values are not emulated): use an integer tensor"
        )
    return t


def register_alloc(x=None):
    """Allocate a virtual register, uninitialised (``x=None``) or holding the int ``x``."""
    instr = "register_alloc"
    current(f"nisa.{instr}")
    value = None if x is None else _immediate(x, instr, "x")
    reg = VirtualRegister(value)
    _trace.emit(instr, _ENGINE, {}, value=value)
    return reg


def register_move(dst, src):
    """``dst = src``: a compile-time int or another register's value."""
    instr = "register_move"
    current(f"nisa.{instr}")
    reg = _destination(dst, instr)
    if isinstance(src, VirtualRegister):
        value = register_value(src, f"nisa.{instr}: src")
    else:
        value = _immediate(src, instr, "src")
    reg._value = value
    _trace.emit(instr, _ENGINE, {}, value=value)


def register_load(dst, src):
    """``dst = src``'s single element (an integer SBUF or HBM tensor of one element, written)."""
    instr = "register_load"
    current(f"nisa.{instr}")
    reg = _destination(dst, instr)
    t = _scalar_tensor(src, instr, "src")
    value = int(ck.read_raw(t, instr, "src").reshape(-1)[0])
    reg._value = _immediate(value, instr, "the loaded value")
    _trace.emit(instr, _ENGINE, {"src": t})


def register_store(dst, src):
    """Write register ``src``'s value into the one-element integer tensor ``dst`` (SBUF or
    HBM); the value must fit ``dst``'s dtype."""
    instr = "register_store"
    current(f"nisa.{instr}")
    t = ck.writable(_scalar_tensor(dst, instr, "dst"), instr)
    if not isinstance(src, VirtualRegister):
        raise TypeError(
            f"nisa.{instr}: src must be a VirtualRegister, got {type(src).__name__}"
        )
    value = register_value(src, f"nisa.{instr}: src")
    info = np.iinfo(t.dtype.storage)
    if not info.min <= value <= info.max:
        raise EmulatorError(
            f"nisa.{instr}: the register holds {value}, which does not fit dst {t.name!r} "
            f"({t.dtype.name})"
        )
    ck.write_raw(t, np.full(t.shape, value, dtype=t.dtype.storage))
    _trace.emit(instr, _ENGINE, {"dst": t})
