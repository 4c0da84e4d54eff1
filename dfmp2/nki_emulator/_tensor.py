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
writes through a view land in the allocation.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ._dtypes import DType, uninitialised_fill


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
