"""Instruction trace: what the emulated kernel issued (structure only, never timings).

Every emulated instruction appends one :class:`Record` to each active :class:`Trace`. Use::

    with dfmp2.nki_emulator.trace() as tr:
        kernel(a, b)
    assert tr.count("nc_matmul") == 8
    assert not tr.dma_stores(shape=(128, 512))
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import _state


@dataclass(frozen=True)
class Operand:
    """Shape, buffer and dtype of one instruction operand (a tensor, never its values)."""

    shape: tuple[int, ...]
    buffer: str
    dtype: str


@dataclass(frozen=True)
class Record:
    """One emulated instruction.

    Attributes
    ----------
    instruction : str
        ``nisa`` function name, e.g. ``"nc_matmul"``.
    engine : str
        Engine the emulator attributes it to (``tensor``, ``vector``, ``scalar``, ``gpsimd``,
        ``dma``), following the documented engine of the instruction or the ``engine=`` given;
        ``sync`` for the ``nisa.register_*`` instructions (see :mod:`._isa_register`).
    operands : dict of str to Operand
        Tensor operands by parameter name (``dst``, ``src``, ``stationary``, ...).
    nbytes : int
        Bytes moved, for ``dma_copy`` (element count times the destination item size); else 0.
    kernel : str
        Name of the kernel that issued it.
    attrs : dict
        Instruction details (e.g. ``{"accumulate": True}`` for ``nc_matmul``, ``op`` names).
    program : int
        ``nl.program_id(0)`` of the program that issued it: 0 for a plain call, ``p`` for
        program ``p`` of a grid launch ``kernel[n](...)``.
    static : bool
        Whether it is part of the launch's compiled instruction stream, the count capped by
        ``_state.MAX_INSTRUCTIONS_PER_LAUNCH``: True except inside a ``nl.dynamic_range`` loop
        past its first iteration (a hardware loop runs one copy of its body; the emulator
        records every iteration). ``sum(r.static for r in tr.records)`` is the static size,
        ``len(tr.records)`` the executed count.
    """

    instruction: str
    engine: str
    operands: dict[str, Operand]
    nbytes: int = 0
    kernel: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    program: int = 0
    static: bool = True


class Trace:
    """Records of every instruction issued while this trace is active."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.kernels: list[str] = []

    def count(self, instruction: str, program: int | None = None) -> int:
        """Number of records of ``instruction`` (e.g. ``"nc_matmul"``), of all programs or only
        of program ``program`` of a grid launch."""
        return len(self.find(instruction, program=program))

    def find(
        self,
        instruction: str | None = None,
        engine: str | None = None,
        program: int | None = None,
    ) -> list[Record]:
        """Records matching ``instruction``, ``engine`` and/or ``program`` (None matches all)."""
        return [
            r
            for r in self.records
            if (instruction is None or r.instruction == instruction)
            and (engine is None or r.engine == engine)
            and (program is None or r.program == program)
        ]

    def dma_stores(self, shape: tuple[int, ...] | None = None) -> list[Record]:
        """``dma_copy`` records whose destination is in HBM.

        Parameters
        ----------
        shape : tuple of int, optional
            Keep only stores whose source or destination view has exactly this shape.
        """
        return self._dma(lambda r: r.operands["dst"].buffer.endswith("hbm"), shape)

    def dma_loads(self, shape: tuple[int, ...] | None = None) -> list[Record]:
        """``dma_copy`` records whose source is in HBM (optionally of this src/dst ``shape``)."""
        return self._dma(lambda r: r.operands["src"].buffer.endswith("hbm"), shape)

    def bytes_moved(self) -> int:
        """Total DMA bytes of all ``dma_copy`` records."""
        return sum(r.nbytes for r in self.records)

    def _dma(self, keep: Any, shape: tuple[int, ...] | None) -> list[Record]:
        out = []
        for r in self.find("dma_copy"):
            if not keep(r):
                continue
            if shape is not None and tuple(shape) not in (
                r.operands["src"].shape,
                r.operands["dst"].shape,
            ):
                continue
            out.append(r)
        return out


@contextlib.contextmanager
def trace() -> Iterator[Trace]:
    """Collect the instructions of every emulated kernel called inside the ``with`` block."""
    tr = Trace()
    _state.TRACE_STACK.append(tr)
    try:
        yield tr
    finally:
        _state.TRACE_STACK.remove(tr)


def operand(tensor: Any) -> Operand:
    """Describe a tensor operand for a record."""
    return Operand(tuple(tensor.shape), tensor.buffer.value, tensor.dtype.name)


def emit(
    instruction: str, engine: str, operands: dict[str, Any], nbytes: int = 0, **attrs: Any
) -> None:
    """Count the instruction against its launch's bound, then append a record to every active
    trace (none when no trace is active)."""
    static = True
    if _state.KERNEL_STACK:
        static = _state.KERNEL_STACK[-1].count_instruction(instruction)
    if not _state.TRACE_STACK:
        return
    run = _state.KERNEL_STACK[-1] if _state.KERNEL_STACK else None
    kernel = run.name if run is not None else ""
    program = run.program_id if run is not None else 0
    described = {
        k: operand(v) for k, v in operands.items() if v is not None and hasattr(v, "buffer")
    }
    record = Record(instruction, engine, described, nbytes, kernel, dict(attrs), program, static)
    for tr in _state.TRACE_STACK:
        tr.records.append(record)


def note_kernel(name: str) -> None:
    """Tell active traces that kernel ``name`` started (once per launch, also a grid launch)."""
    for tr in _state.TRACE_STACK:
        tr.kernels.append(name)
