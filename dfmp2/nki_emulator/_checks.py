"""Operand validation and value access shared by the emulated ``nisa`` instructions.

All reads go through :func:`read_f32` / :func:`read_raw`, which refuse never-written elements;
all writes go through :func:`write_f32` / :func:`write_raw`, which cast to the destination dtype,
mark the elements written and record in PSUM that a non-matmul instruction wrote them.

In a grid launch (``kernel[2]``), the programs run concurrently on hardware with no ordering
between them, so for a shared_hbm output (an allocation with a ``writer`` array) writing an
element another program wrote, or reading an element another program wrote, raises.

Access patterns (``t.ap(...)``, :class:`~._tensor.ApView`, ``nisa.dma_copy`` only) go through
:func:`read_ap_raw` / :func:`write_ap_raw`: the same never-written and race checks on the
elements the pattern selects, after :func:`ap_flat_indices` resolved the dynamic offset and
checked that every selected element lies inside the tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _state
from ._context import EmulatorError, current
from ._dtypes import float32, from_float32, to_float32
from ._enums import engine as Engine
from ._register import VirtualRegister, register_value
from ._tensor import ApView, MemoryRegion, NkiTensor

SBUF = MemoryRegion.sbuf
PSUM = MemoryRegion.psum
ON_CHIP = (SBUF, PSUM)


def tensor(x: Any, instr: str, name: str) -> NkiTensor:
    """Return ``x`` if it is an emulated tensor, else raise naming the parameter."""
    if isinstance(x, ApView):
        raise EmulatorError(
            f"nisa.{instr}: {name} is an access pattern {x.describe()}; the emulator accepts "
            ".ap() views only as nisa.dma_copy src or dst"
        )
    if not isinstance(x, NkiTensor):
        raise TypeError(
            f"nisa.{instr}: {name} must be an NKI tensor (nl.ndarray or a view), "
            f"got {type(x).__name__}"
        )
    return x


def on_chip(
    x: Any, instr: str, name: str, allowed: tuple[MemoryRegion, ...] = ON_CHIP
) -> NkiTensor:
    """Check ``x`` is a tensor in one of ``allowed`` with ≥2 dims and ≤128 partitions."""
    t = tensor(x, instr, name)
    if t.buffer not in allowed:
        names = " or ".join(b.value.upper() for b in allowed)
        raise EmulatorError(
            f"nisa.{instr}: {name} must be in {names}, got a {t.buffer.value} tensor {t.shape}"
        )
    if t.ndim < 2:
        raise EmulatorError(
            f"nisa.{instr}: {name} view {t.shape} of {t.name!r} has {t.ndim} dim; on-chip operands "
            "need at least 2 dims (partition, free); slice with j:j+1 instead of an integer"
        )
    if t.shape[0] > _state.NUM_PARTITIONS:
        raise EmulatorError(
            f"nisa.{instr}: {name} partition dim {t.shape[0]} exceeds the maximum 128"
        )
    if instr != "dma_copy":
        partition_start_rule(t, instr, name)
    return t


def partition_start_rule(t: NkiTensor, instr: str, name: str) -> None:
    """The start-partition rule of compute-engine operands (Trainium/Inferentia2 architecture
    guide, "Accessing SBUF/PSUM tensors using compute engines"): more than 64 partitions start
    at 0; 33-64 at 0 or 64; up to 32 at 0, 32, 64 or 96. (DMA endpoints are not covered by the
    documented rule and are not checked.)"""
    count, start = t.shape[0], t.partition_start()
    allowed = (0,) if count > 64 else (0, 64) if count > 32 else (0, 32, 64, 96)
    if start not in allowed:
        raise EmulatorError(
            f"nisa.{instr}: {name} spans {count} partitions from partition {start}; an access of "
            f"that many partitions must start at {' or '.join(map(str, allowed))} (the "
            "start-partition rule of the compute engines)"
        )


def free_size(t: NkiTensor) -> int:
    """Elements per partition (product of the free dims)."""
    return int(np.prod(t.shape[1:], dtype=np.int64))


def same_layout(instr: str, a_name: str, a: NkiTensor, b_name: str, b: NkiTensor) -> None:
    """Require equal partition counts and equal elements per partition (no broadcasting)."""
    if a.shape[0] != b.shape[0] or free_size(a) != free_size(b):
        raise EmulatorError(
            f"nisa.{instr}: {a_name} {a.shape} and {b_name} {b.shape} must have the same partition "
            f"count and elements per partition (got {a.shape[0]}x{free_size(a)} vs "
            f"{b.shape[0]}x{free_size(b)}); NKI does not broadcast tiles"
        )


def not_both_psum(instr: str, a_name: str, a: NkiTensor, b_name: str, b: NkiTensor) -> None:
    if a.buffer is PSUM and b.buffer is PSUM:
        raise EmulatorError(
            f"nisa.{instr}: {a_name} and {b_name} cannot both be in PSUM; copy one to SBUF first"
        )


def writable(t: NkiTensor, instr: str, name: str = "dst") -> NkiTensor:
    """Refuse writes to kernel arguments (the emulator treats them as read-only)."""
    if t._alloc.kernel_input:
        raise EmulatorError(
            f"nisa.{instr}: {name} is the kernel input {t.name!r}; the emulator treats inputs as "
            "read-only: allocate an output with nl.ndarray(..., buffer=nl.shared_hbm) and return it"
        )
    return t


def _check_written(t: NkiTensor, instr: str, name: str) -> None:
    _check_written_elements(
        t._written, t._writer, f"{t.name!r} (view {t.shape} of {t._alloc.shape})", instr, name
    )


def _check_written_elements(
    written: np.ndarray, writer: np.ndarray | None, what: str, instr: str, name: str
) -> None:
    """Refuse reading never-written elements, or (grid launches) elements another program
    wrote; ``written``/``writer`` hold the elements read, ``what`` names them."""
    if not written.all():
        missing = int((~written).sum())
        raise EmulatorError(
            f"nisa.{instr}: {name} reads {missing} of {written.size} never-written element(s) of "
            f"{what}; nl.ndarray memory is uninitialised"
        )
    if writer is not None:
        run = current(f"nisa.{instr}")
        foreign = writer != run.program_id
        if foreign.any():
            other = int(writer[foreign].flat[0])
            raise EmulatorError(
                f"nisa.{instr}: {name} of {run.label} reads {int(foreign.sum())} element(s) of "
                f"the shared_hbm tensor {what} that program {other} wrote; the programs of a "
                "grid launch run concurrently with no ordering between them"
            )


def _note_writer(t: NkiTensor) -> None:
    """Record the current program as the writer of ``t``'s elements (grid launches, shared_hbm
    outputs only), refusing elements another program already wrote."""
    if t._writer is None:
        return
    _check_foreign_writes(t._writer, f"{t.name!r}", f"view {t.shape} of {t._alloc.shape}")
    t._writer[...] = current("write").program_id


def _check_foreign_writes(writer: np.ndarray, name: str, what: str) -> None:
    """Refuse a write of elements (their ``writer`` values) another program already wrote."""
    run = current("write")
    foreign = (writer >= 0) & (writer != run.program_id)
    if foreign.any():
        other = int(writer[foreign].flat[0])
        raise EmulatorError(
            f"race on the shared_hbm tensor {name}: {run.label} writes "
            f"{int(foreign.sum())} element(s) ({what}) that program "
            f"{other} also writes; the programs of a grid launch run concurrently, so each must "
            "write its own part of a shared output"
        )


def read_f32(t: NkiTensor, instr: str, name: str) -> np.ndarray:
    """Values of ``t`` as float32 (a copy), after checking every element was written."""
    _check_written(t, instr, name)
    return to_float32(t._data)


def read_raw(t: NkiTensor, instr: str, name: str) -> np.ndarray:
    """Stored values of ``t`` (a copy), after checking every element was written."""
    _check_written(t, instr, name)
    return np.array(t._data, copy=True)


def write_f32(t: NkiTensor, values: np.ndarray, psum_state: int = 2) -> None:
    """Cast float32 ``values`` (any shape with ``t.size`` elements) to ``t.dtype`` and store."""
    _note_writer(t)
    t._data[...] = from_float32(np.asarray(values, dtype=np.float32).reshape(t.shape), t.dtype)
    t._written[...] = True
    if t.buffer is PSUM:
        t._psum_state[...] = psum_state


def write_raw(t: NkiTensor, values: np.ndarray) -> None:
    """Store already-typed ``values`` bit-exactly."""
    _note_writer(t)
    t._data[...] = np.asarray(values).reshape(t.shape)
    t._written[...] = True
    if t.buffer is PSUM:
        t._psum_state[...] = 2


def scalar(value: Any, instr: str, name: str) -> np.float32:
    """A compile-time constant operand as float32 (Python numbers; no float64 NumPy scalars)."""
    if isinstance(value, VirtualRegister):
        raise value._misuse(f"as the {name} operand of nisa.{instr}")
    if isinstance(value, ApView):
        tensor(value, instr, name)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"nisa.{instr}: {name} must be a number or a (P, 1) tile, got {value!r}")
    if isinstance(value, np.float64):
        raise TypeError(
            f"nisa.{instr}: {name} is a numpy float64 scalar; float64 does not exist on the device"
        )
    return np.float32(value)


def scalar_or_column(
    value: Any, data: NkiTensor, instr: str, name: str, require_fp32: bool
) -> np.ndarray | np.float32:
    """A scalar constant, or a ``(P, 1)`` tile read as a float32 column of shape ``(P, 1)``."""
    if not isinstance(value, NkiTensor):
        return scalar(value, instr, name)
    col = on_chip(value, instr, name)
    if col.ndim != 2 or col.shape != (data.shape[0], 1):
        raise EmulatorError(
            f"nisa.{instr}: {name} must be a scalar or a tile of shape ({data.shape[0]}, 1) "
            f"(one value per partition of data), got shape {col.shape}"
        )
    if require_fp32 and col.dtype is not float32:
        raise EmulatorError(f"nisa.{instr}: {name} tile must be float32, got {col.dtype.name}")
    return read_f32(col, instr, name).reshape(data.shape[0], 1)


def engine_name(value: Any, instr: str, default: str, allowed: tuple[str, ...]) -> str:
    """Resolve an ``engine=`` argument to an engine name among ``allowed``."""
    if not isinstance(value, Engine):
        raise TypeError(f"nisa.{instr}: engine must be an nisa.engine member, got {value!r}")
    if value is Engine.unknown:
        return default
    if value.value not in allowed:
        raise EmulatorError(
            f"nisa.{instr}: engine={value.value} is not allowed; use one of {allowed}"
        )
    return value.value


def no_psum_on_gpsimd(eng: str, instr: str, **tensors: NkiTensor | None) -> None:
    if eng != "gpsimd":
        return
    for name, t in tensors.items():
        if t is not None and t.buffer is PSUM:
            raise EmulatorError(f"nisa.{instr}: GpSimd cannot access PSUM, but {name} is in PSUM")


# -- access patterns (``t.ap(...)``, nisa.dma_copy only) --------------------------------------
def scalar_offset_value(view: ApView, instr: str, name: str) -> int:
    """The value of ``view``'s scalar offset when the instruction runs (0 without one): a
    VirtualRegister's value, or the element of an SBUF (1, 1) integer tensor (which must have
    been written)."""
    offset = view.scalar_offset
    if offset is None:
        return 0
    if isinstance(offset, VirtualRegister):
        return register_value(offset, f"nisa.{instr}: {name} scalar_offset")
    return int(read_raw(offset, instr, f"{name} scalar_offset").reshape(-1)[0])


def ap_flat_indices(view: ApView, instr: str, name: str) -> np.ndarray:
    """Flat element indices (int64, of ``view.shape``) into the base tensor that ``view``
    selects now: ``offset + scalar_offset * indirect_stride + sum(k_d * step_d)``. Raises when
    any lies outside ``[0, base.size)``."""
    dynamic = scalar_offset_value(view, instr, name)
    start = view.offset + dynamic * view.indirect_stride
    idx = start + view.relative_indices()
    size = view._alloc.data.size
    outside = (idx < 0) | (idx >= size)
    if outside.any():
        bad = int(idx.flat[int(np.argmax(outside))])  # the first, in pattern order
        dyn = ""
        if view.scalar_offset is not None:
            dyn = (
                f" (scalar_offset value {dynamic} x {view.indirect_stride} elements per index "
                f"of dim {view.indirect_dim})"
            )
        raise EmulatorError(
            f"nisa.{instr}: {name} {view.describe()} reaches flat element {bad}, outside the "
            f"tensor {view._alloc.shape} ([0, {size}), {int(outside.sum())} element(s) "
            f"outside); its start is element {start}{dyn}"
        )
    return idx


def read_ap_raw(view: ApView, instr: str, name: str) -> np.ndarray:
    """Stored values (a copy, of ``view.shape``) of the elements ``view`` selects, after the
    bounds, never-written and race checks."""
    idx = ap_flat_indices(view, instr, name)
    alloc = view._alloc
    writer = None if alloc.writer is None else alloc.writer.reshape(-1)[idx]
    what = f"{alloc.shape} through {view.describe()}"
    _check_written_elements(alloc.written.reshape(-1)[idx], writer, what, instr, name)
    return alloc.data.reshape(-1)[idx]


def write_ap_raw(view: ApView, values: np.ndarray, instr: str, name: str) -> None:
    """Store already-typed ``values`` into the elements ``view`` selects (bounds and race
    checks; a pattern selecting an element twice is refused: which write lands is undefined)."""
    idx = ap_flat_indices(view, instr, name).reshape(-1)
    if np.unique(idx).size != idx.size:
        raise EmulatorError(
            f"nisa.{instr}: {name} {view.describe()} selects some elements more than once; the "
            "emulator refuses such a destination (the order of the writes is undefined)"
        )
    alloc = view._alloc
    if alloc.writer is not None:
        flat_writer = alloc.writer.reshape(-1)
        _check_foreign_writes(flat_writer[idx], f"{alloc.name!r}", f"through {view.describe()}")
        flat_writer[idx] = current("write").program_id
    alloc.data.reshape(-1)[idx] = np.asarray(values).reshape(-1)
    alloc.written.reshape(-1)[idx] = True
