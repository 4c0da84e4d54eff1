"""NKI data types as the emulator stores them.

Each :class:`DType` has its NKI name, its size in bytes on the device (used for the SBUF and
PSUM budgets and for DMA byte counts) and the NumPy dtype the emulator stores it in.
``bfloat16`` has no NumPy type (``ml_dtypes`` is not installed), so it is stored as float32
holding only bf16-representable values: every write rounds the float32 value to bf16 with
round-to-nearest-even. ``float64`` does not exist on the device and is rejected everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    """An NKI element type.

    Attributes
    ----------
    name : str
        NKI name, e.g. ``"bfloat16"``.
    itemsize : int
        Bytes per element on the device.
    storage : numpy.dtype
        NumPy dtype the emulator stores the elements in.
    kind : str
        ``"f"`` for floating point, ``"i"`` signed or ``"u"`` unsigned integer.
    """

    name: str
    itemsize: int
    storage: np.dtype
    kind: str

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    @property
    def is_float(self) -> bool:
        return self.kind == "f"


float32 = DType("float32", 4, np.dtype(np.float32), "f")
bfloat16 = DType("bfloat16", 2, np.dtype(np.float32), "f")
float16 = DType("float16", 2, np.dtype(np.float16), "f")
int32 = DType("int32", 4, np.dtype(np.int32), "i")
int16 = DType("int16", 2, np.dtype(np.int16), "i")
int8 = DType("int8", 1, np.dtype(np.int8), "i")
uint32 = DType("uint32", 4, np.dtype(np.uint32), "u")
uint16 = DType("uint16", 2, np.dtype(np.uint16), "u")
uint8 = DType("uint8", 1, np.dtype(np.uint8), "u")
bool_ = DType("bool_", 1, np.dtype(np.uint8), "u")

ALL = (float32, bfloat16, float16, int32, int16, int8, uint32, uint16, uint8, bool_)
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME["bool"] = bool_
_FROM_NUMPY = {
    np.dtype(np.float32): float32,
    np.dtype(np.float16): float16,
    np.dtype(np.int32): int32,
    np.dtype(np.int16): int16,
    np.dtype(np.int8): int8,
    np.dtype(np.uint32): uint32,
    np.dtype(np.uint16): uint16,
    np.dtype(np.uint8): uint8,
    np.dtype(np.bool_): bool_,
}


def as_dtype(value: object, where: str) -> DType:
    """Return the :class:`DType` for ``value`` (a DType, an NKI name, or a NumPy dtype).

    Raises
    ------
    TypeError
        For float64 (no such type on the device) or any type the emulator does not model.
    """
    if isinstance(value, DType):
        return value
    if isinstance(value, str) and value in _BY_NAME:
        return _BY_NAME[value]
    try:
        np_dtype = np.dtype(value)  # type: ignore[arg-type]
    except TypeError:
        np_dtype = None
    if np_dtype is not None and np_dtype == np.float64:
        raise TypeError(f"{where}: float64 does not exist on NeuronCores; use nl.float32")
    if np_dtype is not None and np_dtype in _FROM_NUMPY:
        return _FROM_NUMPY[np_dtype]
    supported = ", ".join(d.name for d in ALL)
    raise TypeError(f"{where}: unsupported dtype {value!r}; the emulator models {supported}")


def round_to_bfloat16(values_f32: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32."""
    values_f32 = np.ascontiguousarray(values_f32, dtype=np.float32)
    bits = values_f32.view(np.uint32)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + lsb) & np.uint32(0xFFFF0000)
    out = rounded.view(np.float32)
    return np.where(np.isnan(values_f32), values_f32, out).astype(np.float32)


def from_float32(values_f32: np.ndarray, dtype: DType) -> np.ndarray:
    """Cast float32 engine results to the storage of ``dtype``.

    Floats round to nearest even. Integers round to nearest even and saturate at the type's
    range; NaN becomes 0 (the hardware's float-to-int conversion is not documented for 0.3.0).
    """
    values_f32 = np.asarray(values_f32, dtype=np.float32)
    if dtype is float32:
        return values_f32.copy()
    if dtype is bfloat16:
        return round_to_bfloat16(values_f32)
    if dtype is float16:
        return values_f32.astype(np.float16)
    info = np.iinfo(dtype.storage)
    finite = np.nan_to_num(values_f32, nan=0.0)
    clipped = np.clip(np.rint(finite.astype(np.float64)), info.min, info.max)
    return clipped.astype(dtype.storage)


def to_float32(storage_values: np.ndarray) -> np.ndarray:
    """Convert stored values to the float32 the engines compute in (ints exact to 2**24)."""
    return np.asarray(storage_values).astype(np.float32)


def uninitialised_fill(dtype: DType) -> float | int:
    """Sentinel for never-written memory: NaN for floats, 4 for integers (as ``nki.simulate``)."""
    return float("nan") if dtype.is_float else 4
