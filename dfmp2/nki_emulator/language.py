"""Emulated ``nki.language`` (NKI 0.3.0 subset): buffers, dtypes, tile sizes, allocation,
indexing helpers, loop ranges and the operator objects that ``nki.isa`` instructions take.

The 0.3.0 compute wrappers (``nl.add(x, y)``, ``nl.load``, ``nl.matmul``, ...) are
experimental and are deliberately not emulated: the operator functions below exist so that
kernels can pass them as ``op=nl.add`` to ``nisa`` instructions; calling one raises.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _checks, _context, _state, _trace
from ._context import EmulatorError
from ._dtypes import (
    as_dtype,
    bfloat16,
    bool_,
    float16,
    float32,
    from_float32,
    int8,
    int16,
    int32,
    uint8,
    uint16,
    uint32,
)
from ._register import VirtualRegister, register_value
from ._tensor import Allocation, DynSlice, MemoryRegion, NkiTensor

__dfmp2_emulator__ = True

__all__ = [
    "MemoryRegion",
    "NkiTensor",
    "affine_range",
    "bfloat16",
    "bool_",
    "ds",
    "dynamic_range",
    "float16",
    "float32",
    "hbm",
    "int8",
    "int16",
    "int32",
    "ndarray",
    "num_programs",
    "private_hbm",
    "program_id",
    "program_ndim",
    "psum",
    "sbuf",
    "sequential_range",
    "shared_hbm",
    "shared_identity_matrix",
    "static_range",
    "tile_size",
    "uint8",
    "uint16",
    "uint32",
    "zeros",
]

sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm


class _TileSize:
    """``nl.tile_size``: hardware tile limits (gen2/gen3 values)."""

    pmax = 128
    psum_fmax = 512
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512

    @property
    def total_available_sbuf_size(self) -> int:
        """Usable SBUF bytes per partition of the current emulator target."""
        return _state.SBUF_BYTES_PER_PARTITION[_state.TARGET["name"]]

    def __repr__(self) -> str:
        return "nl.tile_size"


tile_size = _TileSize()


def _check_shape(shape: Any, buffer: MemoryRegion, where: str) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    if not isinstance(shape, (tuple, list)) or not all(
        isinstance(n, (int, np.integer)) and not isinstance(n, bool) for n in shape
    ):
        raise TypeError(f"{where}: shape must be a tuple of ints, got {shape!r}")
    shape = tuple(int(n) for n in shape)
    if not shape or any(n <= 0 for n in shape):
        raise ValueError(f"{where}: shape must be non-empty with positive sizes, got {shape}")
    if buffer.on_chip:
        if len(shape) < 2:
            raise EmulatorError(
                f"{where}: SBUF and PSUM tensors must have at least 2 dimensions "
                f"(partition, free...), got shape {shape}; use ({shape[0]}, 1) or (1, {shape[0]})"
            )
        if shape[0] > _state.NUM_PARTITIONS:
            raise EmulatorError(
                f"{where}: partition dimension {shape[0]} of a {buffer.value} tensor exceeds "
                f"the maximum {_state.NUM_PARTITIONS} (nl.tile_size.pmax)"
            )
    return shape


def _allocate(shape: Any, dtype: Any, buffer: Any, name: str, where: str) -> NkiTensor:
    run = _context.current(where)
    if not isinstance(buffer, MemoryRegion):
        raise TypeError(
            f"{where}: buffer must be nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or nl.shared_hbm "
            f"(buffer objects, not strings), got {buffer!r}"
        )
    shape = _check_shape(shape, buffer, where)
    dt = as_dtype(dtype, where)
    run.counter += 1
    alloc = Allocation(shape, dt, buffer, name or f"{buffer.value}_{run.counter}")
    run.register(alloc)
    if buffer is MemoryRegion.shared_hbm:
        alloc = run.shared_hbm_allocation(alloc)
    return NkiTensor.whole(alloc)


def ndarray(shape, dtype, buffer=sbuf, name="", address=None):
    """Allocate an uninitialised tensor of ``shape`` and ``dtype`` in ``buffer``.

    ``address`` is accepted and ignored (the emulator places every allocation itself).
    Reading an element before any instruction wrote it raises. In a grid launch
    (``kernel[2]``), the k-th ``shared_hbm`` allocation of every program is the same tensor as
    program 0's k-th (same shape and dtype required); other buffers are per program.
    """
    return _allocate(shape, dtype, buffer, name, "nl.ndarray")


def zeros(shape, dtype, buffer=sbuf, name=""):
    """Allocate a tensor filled with zeros (experimental in 0.3.0; counts as a memset).

    PSUM filled this way is non-matmul-initialised: ``nc_matmul`` refuses to accumulate onto it.
    """
    tensor = _allocate(shape, dtype, buffer, name, "nl.zeros")
    _checks.write_raw(tensor, np.zeros(tensor.shape, dtype=tensor._data.dtype))
    _trace.emit("memset", "vector", {"dst": tensor}, via="nl.zeros", value=0)
    return tensor


def shared_identity_matrix(n, dtype=uint8, dst=None):
    """Return an ``(n, n)`` identity matrix in SBUF (into ``dst`` when given)."""
    where = "nl.shared_identity_matrix"
    if not isinstance(n, (int, np.integer)) or not 0 < n <= _state.NUM_PARTITIONS:
        raise ValueError(f"{where}: n must be an int in [1, 128], got {n!r}")
    if dst is None:
        dst = _allocate((int(n), int(n)), dtype, sbuf, "", where)
    elif not isinstance(dst, NkiTensor) or dst.buffer is not sbuf or dst.shape != (n, n):
        raise ValueError(f"{where}: dst must be an SBUF tensor of shape ({n}, {n}), got {dst!r}")
    dst._data[...] = from_float32(np.eye(int(n), dtype=np.float32), dst.dtype)
    dst._written[...] = True
    _trace.emit("shared_identity_matrix", "dma", {"dst": dst})
    return dst


def ds(start, size):
    """Dynamic slice ``start:start+size`` for tensor indexing."""
    return DynSlice(start, size)


def static_range(start, stop=None, step=1):
    """Fully unrolled loop range (Python ``range`` semantics)."""
    return range(start, stop, step) if stop is not None else range(start)


def affine_range(start, stop=None, step=1):
    """Deprecated in 0.3.0 (fully unrolled, same as :func:`static_range`)."""
    return static_range(start, stop, step)


def sequential_range(start, stop=None, step=1):
    """Deprecated in 0.3.0 (fully unrolled, same as :func:`static_range`)."""
    return static_range(start, stop, step)


def dynamic_range(start, stop=None, step=1):
    """A **dynamic** (on-device, hardware) loop: ``for i in nl.dynamic_range(...)``.

    NKI 0.3.0, ``nki/deep-dives/nki-dynamic-loops.rst``: "When the compiler encounters a
    ``dynamic_range`` loop it emits a **hardware loop instruction** on the device. The loop
    body is not unrolled; instead, a single copy of the body is generated and the hardware
    iterates over it at runtime"; "The compiled artifact size does **not** grow with the trip
    count"; "The loop variable is a device register, not a Python ``int``. You cannot use it
    in host-side Python expressions (e.g., ``if i == 0:``)"; ``start``/``stop`` "Can be Python
    ``int`` literals **or** ``VirtualRegister`` objects"; ``step`` "**Must** be a compile-time
    positive integer. Passing a ``VirtualRegister`` raises an ``AssertionError``"; "Tensors
    allocated inside the loop body are allocated once and reused across iterations".

    Emulated semantics:

    - one argument is ``stop`` (``start`` 0), as for ``range``; register bounds are read when
      the loop starts (an uninitialised register raises);
    - ``step`` that is not a positive Python int (a VirtualRegister, 0, negative, a float)
      raises AssertionError;
    - the body runs once per iteration (so results are exact) and the loop variable is a
      fresh frozen :class:`~._register.VirtualRegister` holding the iteration's value: any
      Python use of it raises; use it as an ``.ap(..., scalar_offset=i)`` offset, a bound of a
      nested dynamic loop, or a ``nisa.register_move`` source;
    - static size: only the instructions of the first iteration (of every enclosing dynamic
      loop) count against the launch's instruction bound, and their trace records have
      ``static=True``; later iterations' records have ``static=False``;
    - memory: when an iteration starts, the previous iteration's on-chip allocations stop
      counting against the SBUF/PSUM budgets (:mod:`._context`);
    - a zero-trip loop runs nothing, and its body counts nothing.

    Not emulated: the hardware loop instruction itself (no trace record), ``while reg:`` loops
    (``bool(reg)`` raises), and the rule that a dynamic loop may not sit inside
    ``nl.no_reorder()`` (the lint checks it, :mod:`.lint`).
    """
    where = "nl.dynamic_range"
    run = _context.current(where)
    if (
        isinstance(step, VirtualRegister)
        or isinstance(step, bool)
        or not isinstance(step, (int, np.integer))
        or step <= 0
    ):
        raise AssertionError(
            f"{where}: step must be a compile-time positive int (the hardware loop instruction "
            f"encodes it as an immediate operand), got {step!r}"
        )
    if stop is None:
        start, stop = 0, start
    first = _loop_bound(start, where, "start")
    last = _loop_bound(stop, where, "stop")
    return _dynamic_iterations(run, range(first, last, int(step)))


def _loop_bound(value: Any, where: str, name: str) -> int:
    if isinstance(value, VirtualRegister):
        return register_value(value, f"{where}: {name}")
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{where}: {name} must be an int or a VirtualRegister, got {value!r}")
    return int(value)


def _dynamic_iterations(run: _context.KernelRun, values: range):
    """Yield a frozen register per iteration while ``run`` tracks the loop; the loop's entry
    is removed however the loop ends (exhausted, ``break``, or an exception in the body)."""
    loop = run.enter_dynamic_loop()
    try:
        for iteration, value in enumerate(values):
            run.next_iteration(loop, iteration)
            yield VirtualRegister(value, frozen=True)
    finally:
        run.exit_dynamic_loop(loop)


# -- SPMD launch grid ------------------------------------------------------------------------
# NKI 0.3.0 launches ``kernel[n](...)`` as n SPMD programs on the physical NeuronCores of one
# logical core (LNC=2 on trn2; trn1 has LNC=1). AWS's nki-library kernels read the grid with
# ``if nl.program_ndim() == 0: n, pid = 1, 0 else: n, pid = nl.num_programs(0),
# nl.program_id(0)`` and use the values as plain Python ints (range(), min(), f-strings).
# The emulator supports 1-D grids only.


def _is_zero(axis: Any) -> bool:
    return isinstance(axis, (int, np.integer)) and not isinstance(axis, bool) and axis == 0


def program_id(axis=0):
    """Index of this program in the launch grid, a Python int: ``p`` in ``0 .. n-1`` for
    program ``p`` of ``kernel[n](...)``, 0 for a plain call. Only ``axis=0`` (1-D grids)."""
    run = _context.current("nl.program_id")
    if not _is_zero(axis):
        raise EmulatorError(
            f"nl.program_id(axis={axis!r}): the emulator supports 1-D launch grids only (axis 0)"
        )
    return run.program_id


def num_programs(axes=0):
    """Number of programs in the launch grid, a Python int: ``n`` for ``kernel[n](...)``, 1 for
    a plain call. Only ``axes=0`` (1-D grids)."""
    run = _context.current("nl.num_programs")
    if not _is_zero(axes):
        raise EmulatorError(
            f"nl.num_programs(axes={axes!r}): the emulator supports 1-D launch grids only (axes=0)"
        )
    return run.num_programs


def program_ndim():
    """Number of dimensions of the launch grid: 0 for a plain call ``kernel(...)``, 1 for
    ``kernel[n](...)`` (also for ``kernel[1]``)."""
    return _context.current("nl.program_ndim").grid_ndim


# -- operator objects ----------------------------------------------------------------------
# Kernels pass these as ``op=`` to nisa instructions. Calling them is the experimental 0.3.0
# wrapper API, which the emulator does not implement.


def _wrapper_called(name: str) -> None:
    raise EmulatorError(
        f"nl.{name}(...) is an experimental NKI 0.3.0 wrapper that the emulator does not "
        f"implement; use the nisa instruction (e.g. op=nl.{name} in nisa.tensor_tensor)"
    )


def add(x, y, dtype=None):
    _wrapper_called("add")


def subtract(x, y, dtype=None):
    _wrapper_called("subtract")


def multiply(x, y, dtype=None):
    _wrapper_called("multiply")


def divide(x, y, dtype=None):
    _wrapper_called("divide")


def maximum(x, y, dtype=None):
    _wrapper_called("maximum")


def minimum(x, y, dtype=None):
    _wrapper_called("minimum")


def power(x, y, dtype=None):
    _wrapper_called("power")


def equal(x, y, dtype=None):
    _wrapper_called("equal")


def not_equal(x, y, dtype=None):
    _wrapper_called("not_equal")


def less(x, y, dtype=None):
    _wrapper_called("less")


def less_equal(x, y, dtype=None):
    _wrapper_called("less_equal")


def greater(x, y, dtype=None):
    _wrapper_called("greater")


def greater_equal(x, y, dtype=None):
    _wrapper_called("greater_equal")


def bitwise_and(x, y, dtype=None):
    _wrapper_called("bitwise_and")


def bitwise_or(x, y, dtype=None):
    _wrapper_called("bitwise_or")


def bitwise_xor(x, y, dtype=None):
    _wrapper_called("bitwise_xor")


def logical_and(x, y, dtype=None):
    _wrapper_called("logical_and")


def logical_or(x, y, dtype=None):
    _wrapper_called("logical_or")


def logical_xor(x, y, dtype=None):
    _wrapper_called("logical_xor")


def abs(x, dtype=None):
    _wrapper_called("abs")


def square(x, dtype=None):
    _wrapper_called("square")


def exp(x, dtype=None):
    _wrapper_called("exp")


def log(x, dtype=None):
    _wrapper_called("log")


def sqrt(x, dtype=None):
    _wrapper_called("sqrt")


def rsqrt(x, dtype=None):
    _wrapper_called("rsqrt")


def reciprocal(x, dtype=None):
    _wrapper_called("reciprocal")


def copy(x, dtype=None):
    _wrapper_called("copy")


def relu(x, dtype=None):
    _wrapper_called("relu")


def tanh(x, dtype=None):
    _wrapper_called("tanh")


def sigmoid(x, dtype=None):
    _wrapper_called("sigmoid")


def negative(x, dtype=None):
    _wrapper_called("negative")


def sign(x, dtype=None):
    _wrapper_called("sign")


def load(src, dtype=None):
    _wrapper_called("load")


def store(dst, value):
    _wrapper_called("store")


def matmul(x, y, transpose_x=False):
    _wrapper_called("matmul")


def transpose(x, dtype=None):
    _wrapper_called("transpose")


def load_transpose2d(src, dtype=None):
    _wrapper_called("load_transpose2d")
