"""Emulated NKI tensors: buffers, allocations and views.

An :class:`Allocation` owns three NumPy arrays of the same shape: ``data`` (the stored values),
``written`` (which elements were ever written; reading an unwritten element is an error) and,
for PSUM, ``psum_state`` (``0`` never written, ``1`` last written by ``nc_matmul``, ``2`` last
written by any other instruction; ``nc_matmul`` uses it for its accumulate rules). A
``shared_hbm`` output of a grid launch (``kernel[2]``, see :mod:`._jit`) also has ``writer``: the
program that wrote each element (int8, ``-1`` never written), which the read and write helpers
of :mod:`._checks` use to refuse races between programs; it is ``None`` everywhere else.

An :class:`NkiTensor` is a view of an allocation: basic NumPy indexing (integers, slices with
positive steps, ``...``, :class:`DynSlice` from ``nl.ds``) applied to all three arrays, so
writes through a view land in the allocation. A VirtualRegister in an index raises (use
``.ap``). :meth:`NkiTensor.ap` on a whole HBM tensor gives an :class:`ApView`, an access
pattern over the allocation's flat elements that only ``nisa.dma_copy`` accepts.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ._dtypes import DType, as_dtype, uninitialised_fill
from ._errors import EmulatorError
from ._register import VirtualRegister, misuse_in_index


class MemoryRegion(enum.Enum):
    """NKI buffers. ``nl.hbm`` is an alias of ``private_hbm``."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    def __repr__(self) -> str:
        return f"nl.{self.value}"

    @property
    def on_chip(self) -> bool:
        return self in (MemoryRegion.sbuf, MemoryRegion.psum)

    @property
    def is_hbm(self) -> bool:
        return not self.on_chip


class DynSlice:
    """``nl.ds(start, size)``: the slice ``start:start+size``."""

    def __init__(self, start: int, size: int) -> None:
        for part in (start, size):
            error = misuse_in_index(part, "nl.ds")
            if error is not None:
                raise error
        if not isinstance(start, (int, np.integer)) or not isinstance(size, (int, np.integer)):
            raise TypeError(f"nl.ds(start, size) needs integers, got ({start!r}, {size!r})")
        if start < 0 or size <= 0:
            raise ValueError(
                f"nl.ds(start, size) needs start >= 0 and size > 0, got ({start}, {size})"
            )
        self.start = int(start)
        self.size = int(size)

    def as_slice(self) -> slice:
        return slice(self.start, self.start + self.size)

    def __repr__(self) -> str:
        return f"nl.ds({self.start}, {self.size})"


class Allocation:
    """Storage of one ``nl.ndarray`` (or one kernel argument).

    Parameters
    ----------
    shape : tuple of int
        Shape; for SBUF/PSUM, ``shape[0]`` is the partition dimension.
    dtype : DType
        Element type.
    buffer : MemoryRegion
        Where it lives.
    name : str
        Name for error messages.
    kernel_input : bool
        True for a kernel argument (fully initialised and read-only).
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: DType,
        buffer: MemoryRegion,
        name: str,
        kernel_input: bool = False,
    ) -> None:
        self.shape = shape
        self.dtype = dtype
        self.buffer = buffer
        self.name = name
        self.kernel_input = kernel_input
        self.data = np.full(shape, uninitialised_fill(dtype), dtype=dtype.storage)
        self.written = np.full(shape, kernel_input, dtype=bool)
        self.psum_state = np.zeros(shape, dtype=np.int8)
        self.writer: np.ndarray | None = None

    def track_writers(self) -> None:
        """Start recording which program writes each element (grid launches, shared_hbm)."""
        self.writer = np.full(self.shape, -1, dtype=np.int8)

    def on_release(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once no tensor refers to this allocation any more."""
        weakref.finalize(self, callback)

    def bytes_per_partition(self) -> int:
        """Device bytes per partition: elements of the free dims times the item size."""
        return int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize


def _normalise_index(index: Any, ndim: int, tensor_name: str) -> tuple[Any, ...]:
    """Turn an NKI index into a tuple of ints, slices and Ellipsis (basic indexing only)."""
    items = index if isinstance(index, tuple) else (index,)
    out: list[Any] = []
    for item in items:
        error = misuse_in_index(item, tensor_name)
        if error is not None:
            raise error
        if isinstance(item, DynSlice):
            out.append(item.as_slice())
        elif isinstance(item, slice):
            for part in (item.start, item.stop, item.step):
                if part is not None and not isinstance(part, (int, np.integer)):
                    raise TypeError(
                        f"{tensor_name}[...]: slice bounds must be integers, got {item!r}"
                    )
            if item.step is not None and item.step <= 0:
                raise IndexError(
                    f"{tensor_name}[...]: only positive slice steps are supported, got {item!r}"
                )
            out.append(item)
        elif isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            out.append(int(item))
        elif item is Ellipsis:
            out.append(item)
        else:
            raise TypeError(
                f"{tensor_name}[...]: unsupported index {item!r}; use integers, slices, ... or "
                "nl.ds(start, size) (advanced indexing is not part of NKI)"
            )
    return tuple(out)


class NkiTensor:
    """A view of an :class:`Allocation` (the emulator's ``NkiTensor``).

    Attributes
    ----------
    shape : tuple of int
        Shape of the view.
    dtype : DType
        Element type.
    buffer : MemoryRegion
        Buffer of the underlying allocation.
    """

    def __init__(
        self,
        alloc: Allocation,
        data: np.ndarray,
        written: np.ndarray,
        psum_state: np.ndarray,
        is_whole: bool,
        writer: np.ndarray | None = None,
    ) -> None:
        self._alloc = alloc
        self._data = data
        self._written = written
        self._psum_state = psum_state
        self._is_whole = is_whole
        self._writer = writer

    @classmethod
    def whole(cls, alloc: Allocation) -> NkiTensor:
        return cls(alloc, alloc.data, alloc.written, alloc.psum_state, True, alloc.writer)

    # -- NkiTensor attributes ---------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self._data.shape)

    @property
    def dtype(self) -> DType:
        return self._alloc.dtype

    @property
    def buffer(self) -> MemoryRegion:
        return self._alloc.buffer

    @property
    def name(self) -> str:
        return self._alloc.name

    @property
    def ndim(self) -> int:
        return self._data.ndim

    @property
    def size(self) -> int:
        return int(self._data.size)

    def __repr__(self) -> str:
        return (
            f"NkiTensor({self.name!r}, shape={self.shape}, dtype={self.dtype!r}, "
            f"buffer={self.buffer!r})"
        )

    def __len__(self) -> int:
        return self.shape[0]

    def __bool__(self) -> bool:
        raise TypeError(f"{self.name}: an NKI tensor has no truth value at trace time")

    def __iter__(self):
        raise TypeError(f"{self.name}: iterating over an NKI tensor is not supported; index it")

    # -- views ------------------------------------------------------------------------------
    def __getitem__(self, index: Any) -> NkiTensor:
        items = _normalise_index(index, self.ndim, self.name)
        if self.buffer.on_chip and items and isinstance(items[0], int):
            raise IndexError(
                f"{self.name}[...]: integer index on the partition axis of a {self.buffer.value} "
                f"tensor; keep the partition axis with a slice, "
                f"e.g. [{items[0]}:{items[0] + 1}, ...]"
            )
        try:
            data = self._data[items]
        except IndexError as exc:
            raise IndexError(f"{self.name}{list(self.shape)}[{index!r}]: {exc}") from None
        if data.ndim == 0:
            raise IndexError(
                f"{self.name}[{index!r}]: indexing down to a scalar is not supported; keep 2 dims"
            )
        if 0 in data.shape:
            raise IndexError(f"{self.name}[{index!r}]: empty view of shape {data.shape}")
        writer = None if self._writer is None else self._writer[items]
        return NkiTensor(
            self._alloc, data, self._written[items], self._psum_state[items], False, writer
        )

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError(
            f"{self.name}[...] = ...: item assignment is not an NKI instruction; write through "
            "nisa.* instructions (e.g. nisa.tensor_copy(dst=t[...], src=...))"
        )

    def reshape(self, new_shape: Any = None, shape: Any = None) -> NkiTensor:
        """Return a view with another shape and the same element count (no copy)."""
        target = new_shape if new_shape is not None else shape
        if isinstance(target, (int, np.integer)):
            target = (int(target),)
        target = tuple(int(n) for n in target)
        if int(np.prod(target, dtype=np.int64)) != self.size:
            raise ValueError(
                f"{self.name}.reshape: {self.shape} has {self.size} elements, {target} does not"
            )
        if self.buffer.on_chip and (len(target) < 2 or target[0] != self.shape[0]):
            raise ValueError(
                f"{self.name}.reshape{target}: a {self.buffer.value} tensor must keep "
                "its partition "
                f"dim {self.shape[0]} and at least 2 dims"
            )
        views = []
        arrays = [self._data, self._written, self._psum_state]
        if self._writer is not None:
            arrays.append(self._writer)
        for arr in arrays:
            view = arr.view()
            try:
                view.shape = target
            except AttributeError:
                raise ValueError(
                    f"{self.name}.reshape{target}: "
                    "this strided view cannot be reshaped without a copy"
                ) from None
            views.append(view)
        writer = views[3] if self._writer is not None else None
        return NkiTensor(self._alloc, views[0], views[1], views[2], self._is_whole, writer)

    def ap(self, pattern, offset=0, scalar_offset=None, vector_offset=None, indirect_dim=0,
           dtype=None):
        """An access pattern on this HBM tensor: a view usable as ``nisa.dma_copy`` src or dst.

        NKI 0.3.0, ``nki/deep-dives/nki-aps.rst``: "``pattern``: A list of two-element tuples,
        each tuple describes the access on one dimension. The first element represents the
        element stepping and the second element represents the number of elements in each
        dimension" ("The shape of a pattern is the collection of num"); "``offset``: The offset
        to start the access in terms of number of elements from the beginning of the tensor";
        with ``scalar_offset`` "the memory from A starting at the element offset
        ``offset + scalar_offset * prod(A.shape[indirect_dim+1:])``" where "the dimension is
        relative to the base tensor, not relative to the pattern". ``scalar_offset`` is "An
        SBUF tensor of shape ``(1, 1)``" or (``nki/api/nki/isa/__init__.py``, ``dma_copy``,
        "Scalar indirection") "a ``VirtualRegister`` from ``nisa.register_alloc()``", e.g. the
        loop variable of ``nl.dynamic_range`` (``nki/deep-dives/nki-dynamic-loops.rst``).

        Emulated semantics: element ``(k0, ..., kn)`` of the view is the flat (row-major)
        element ``offset + s * prod(self.shape[indirect_dim+1:]) + sum(k_d * step_d)`` of this
        tensor, ``s`` the scalar offset's value read when the DMA runs (0 without one). Every
        such index must lie in ``[0, self.size)`` when the DMA runs, else EmulatorError (a
        dynamic offset never reads or writes outside the tensor). The view's shape is
        ``tuple(num for step, num in pattern)``; 1 to 5 ``[step, num]`` pairs (the partition
        pair and up to four free dimensions), ``num >= 1``, any integer step.

        Emulator restrictions:

        - HBM tensors only (kernel inputs, ``nl.shared_hbm``/``nl.private_hbm`` allocations):
          ``.ap`` on SBUF/PSUM tensors is not emulated;
        - only on a whole tensor (``nl.ndarray``, a kernel argument, or a reshape of one): "The
          ``.ap`` method is only allowed on ``nl.ndarray`` and cannot be called on a tile
          produced by it" (nki-aps.rst, "Restriction on Nested Indexing"), so offsets are
          always relative to the first element of the whole tensor;
        - the view is accepted by ``nisa.dma_copy`` (as src or dst) only;
        - ``vector_offset`` (indirect gather/scatter) and ``dtype`` reinterpretation (a dtype
          other than the tensor's own) are not emulated.
        """
        where = f"{self.name}.ap"
        if self.buffer.on_chip:
            raise EmulatorError(
                f"{where}: access patterns are not emulated for on-chip tensors ({self.name!r} "
                f"is in {self.buffer.value}); the emulator supports .ap on HBM tensors (as a "
                "nisa.dma_copy src or dst) only; slice on-chip tensors instead"
            )
        if not self._is_whole or self.size != self._alloc.data.size:
            raise EmulatorError(
                f"{where}: cannot specify an access pattern on an already indexed tensor (a "
                f"view {self.shape} of {self._alloc.shape}); call .ap on the whole tensor, "
                "offsets count from its first element (nki-aps.rst, 'Restriction on Nested "
                "Indexing')"
            )
        if vector_offset is not None:
            raise EmulatorError(
                f"{where}: vector_offset (indirect gather/scatter) is not emulated; use "
                "scalar_offset"
            )
        if dtype is not None and as_dtype(dtype, where) is not self.dtype:
            raise EmulatorError(
                f"{where}: dtype={dtype!r} (reinterpreting {self.dtype.name} elements) is not "
                "emulated; leave dtype=None"
            )
        pairs = _ap_pattern(pattern, where)
        offset = _ap_int(offset, where, "offset")
        if not isinstance(indirect_dim, (int, np.integer)) or isinstance(indirect_dim, bool):
            raise TypeError(f"{where}: indirect_dim must be an int, got {indirect_dim!r}")
        if not 0 <= indirect_dim < self.ndim:
            raise EmulatorError(
                f"{where}: indirect_dim={indirect_dim} is not a dimension of the base tensor "
                f"{self.shape} (0..{self.ndim - 1})"
            )
        if scalar_offset is not None and not isinstance(scalar_offset, VirtualRegister):
            ok = (
                isinstance(scalar_offset, NkiTensor)
                and scalar_offset.buffer is MemoryRegion.sbuf
                and scalar_offset.shape == (1, 1)
                and not scalar_offset.dtype.is_float
            )
            if not ok:
                raise EmulatorError(
                    f"{where}: scalar_offset must be a VirtualRegister (nisa.register_alloc, a "
                    "nl.dynamic_range loop variable) or an SBUF (1, 1) integer tensor, got "
                    f"{scalar_offset!r}"
                )
        stride = int(np.prod(self.shape[int(indirect_dim) + 1 :], dtype=np.int64))
        return ApView(self, pairs, offset, scalar_offset, int(indirect_dim), stride)

    # -- helpers for instructions -----------------------------------------------------------
    def partition_start(self) -> int:
        """Index of the first partition of this view inside its allocation (on-chip only)."""
        base = self._alloc.data
        offset = self._data.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        return int(offset // base.strides[0]) if base.ndim else 0

    def free_byte_range(self) -> tuple[int, int]:
        """Device byte range ``[start, end)`` of this view within one partition."""
        base = self._alloc.data
        item = base.itemsize
        offset = self._data.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        start_elem = (offset % base.strides[0]) // item
        last_elem = start_elem + sum(
            (n - 1) * s // item for n, s in zip(self._data.shape[1:], self._data.strides[1:])
        )
        device_item = self.dtype.itemsize
        return int(start_elem * device_item), int((last_elem + 1) * device_item)


def _ap_int(value: Any, where: str, name: str) -> int:
    if isinstance(value, VirtualRegister):
        raise EmulatorError(
            f"{where}: {name} must be a compile-time int; a VirtualRegister offset goes in "
            "scalar_offset=reg (with indirect_dim)"
        )
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be an int, got {value!r}")
    return int(value)


def _ap_pattern(pattern: Any, where: str) -> tuple[tuple[int, int], ...]:
    """Validate an ``.ap`` pattern: 1 to 5 ``[step, num]`` pairs of ints, ``num >= 1``."""
    if not isinstance(pattern, (list, tuple)) or not 1 <= len(pattern) <= 5:
        raise EmulatorError(
            f"{where}: pattern must be a list of 1 to 5 [step, num] pairs (the partition pair "
            f"and up to four free dimensions), got {pattern!r}"
        )
    pairs = []
    for pair in pattern:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise EmulatorError(f"{where}: pattern entry {pair!r} is not a [step, num] pair")
        step = _ap_int(pair[0], where, "a pattern step")
        num = _ap_int(pair[1], where, "a pattern num")
        if num < 1:
            raise EmulatorError(f"{where}: pattern entry {list(pair)} has num < 1")
        pairs.append((step, num))
    return tuple(pairs)


class ApView:
    """The access pattern ``base.ap(...)`` of a whole HBM tensor (see :meth:`NkiTensor.ap`).

    A description only ("calling ``.ap`` on a tensor does not do any computation directly",
    nki-aps.rst): ``nisa.dma_copy`` resolves the scalar offset, checks the bounds and reads or
    writes the elements (:func:`._checks.ap_flat_indices`). It has the metadata of a tensor
    (``shape``, ``dtype``, ``buffer``, ``name``, ``size``, ``ndim``) but cannot be indexed,
    reshaped or given another access pattern.

    Attributes
    ----------
    pattern : tuple of (int, int)
        The ``(step, num)`` pairs.
    offset : int
        Static element offset from the base tensor's first element.
    scalar_offset : VirtualRegister, NkiTensor or None
        The dynamic offset, in units of ``indirect_stride`` elements.
    indirect_dim : int
        Dimension of the base tensor the scalar offset indexes.
    indirect_stride : int
        ``prod(base.shape[indirect_dim+1:])``: elements per unit of ``scalar_offset``.
    """

    def __init__(
        self,
        base: NkiTensor,
        pattern: tuple[tuple[int, int], ...],
        offset: int,
        scalar_offset: Any,
        indirect_dim: int,
        indirect_stride: int,
    ) -> None:
        self._base = base
        self._alloc = base._alloc
        self.pattern = pattern
        self.offset = offset
        self.scalar_offset = scalar_offset
        self.indirect_dim = indirect_dim
        self.indirect_stride = indirect_stride

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(num for _step, num in self.pattern)

    @property
    def dtype(self) -> DType:
        return self._alloc.dtype

    @property
    def buffer(self) -> MemoryRegion:
        return self._alloc.buffer

    @property
    def name(self) -> str:
        return self._alloc.name

    @property
    def ndim(self) -> int:
        return len(self.pattern)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def describe(self) -> str:
        """``.ap(pattern=..., offset=..., ...) of 'name'`` for error messages."""
        pattern = [list(p) for p in self.pattern]
        dynamic = ""
        if self.scalar_offset is not None:
            dynamic = f", scalar_offset=..., indirect_dim={self.indirect_dim}"
        return f".ap(pattern={pattern}, offset={self.offset}{dynamic}) of {self.name!r}"

    def relative_indices(self) -> np.ndarray:
        """int64 array of ``self.shape``: ``sum(k_d * step_d)`` (without any offset)."""
        idx = np.zeros((), dtype=np.int64)
        for step, num in self.pattern:
            idx = idx[..., None] + step * np.arange(num, dtype=np.int64)
        return idx

    def __repr__(self) -> str:
        return f"ApView({self.describe()}, shape={self.shape}, buffer={self.buffer!r})"

    def __bool__(self) -> bool:
        raise TypeError(f"{self.describe()}: an access pattern has no truth value at trace time")

    def __getitem__(self, index: Any) -> Any:
        raise EmulatorError(
            f"{self.describe()}[...]: an access pattern cannot be indexed; describe the whole "
            "access in one .ap pattern"
        )

    def ap(self, *args: Any, **kwargs: Any) -> Any:
        raise EmulatorError(
            f"{self.describe()}.ap(...): cannot specify an access pattern on an already "
            "indexed tensor (nki-aps.rst, 'Restriction on Nested Indexing')"
        )

    def reshape(self, *args: Any, **kwargs: Any) -> Any:
        raise EmulatorError(f"{self.describe()}.reshape: an access pattern cannot be reshaped")
