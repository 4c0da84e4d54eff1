"""Emulated ``nki.jit``: run a kernel body eagerly on NumPy-backed HBM tensors.

Arguments: NumPy arrays (float32, float16, int/uint 8/16/32, bool) or torch CPU tensors
(additionally bfloat16) become read-only HBM tensors; tuples of them are allowed (lists are
rejected, as by the 0.3.0 compiler); Python scalars, strings and None pass through as
compile-time constants. float64 is rejected.

Results: the kernel must return ``nl.shared_hbm`` tensors it allocated (or a tuple of them),
fully written. They come back as NumPy arrays (bfloat16 as float32 holding bf16 values), or as
torch tensors of the matching dtype when any argument was a torch tensor.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import numpy as np

from . import _state, _trace
from ._context import EmulatorError, KernelRun
from ._dtypes import as_dtype, bfloat16
from ._tensor import Allocation, MemoryRegion, NkiTensor


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _wrap_array(value: Any, where: str) -> NkiTensor:
    if _is_torch(value):
        import torch  # only when the caller already uses torch

        t = value.detach().cpu()
        if t.dtype == torch.bfloat16:
            dtype, data = bfloat16, t.to(torch.float32).numpy()
        else:
            data = t.numpy()
            dtype = as_dtype(data.dtype, where)
    else:
        data = np.asarray(value)
        dtype = as_dtype(data.dtype, where)
    if data.ndim == 0:
        raise TypeError(
            f"{where}: 0-d arrays are not kernel tensors; pass a Python scalar or a (1,) array"
        )
    alloc = Allocation(tuple(data.shape), dtype, MemoryRegion.shared_hbm, where, kernel_input=True)
    alloc.data[...] = data.astype(dtype.storage)
    return NkiTensor.whole(alloc)


def _wrap(value: Any, where: str) -> Any:
    if isinstance(value, list):
        raise TypeError(
            f"{where}: list arguments are rejected by the NKI 0.3.0 compiler; pass a tuple"
        )
    if isinstance(value, tuple):
        return tuple(_wrap(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, np.ndarray) or _is_torch(value):
        return _wrap_array(value, where)
    if isinstance(value, np.float64):
        raise TypeError(f"{where}: numpy float64 scalar; float64 does not exist on the device")
    if value is None or isinstance(value, (bool, int, float, str, np.integer, np.floating)):
        return value
    if isinstance(value, NkiTensor):
        raise TypeError(f"{where}: an NKI tensor from another kernel call cannot be passed in")
    raise TypeError(f"{where}: unsupported kernel argument of type {type(value).__name__}")


def _unwrap(value: Any, run: KernelRun, as_torch: bool) -> Any:
    if isinstance(value, tuple):
        return tuple(_unwrap(v, run, as_torch) for v in value)
    where = f"@nki.jit kernel {run.name!r}: returned value"
    if not isinstance(value, NkiTensor):
        raise EmulatorError(f"{where} {value!r} is not a tensor; return nl.shared_hbm tensor(s)")
    alloc = value._alloc
    if alloc.kernel_input:
        raise EmulatorError(
            f"{where} is the kernel input {alloc.name!r}; return a new nl.shared_hbm tensor"
        )
    if alloc.buffer is not MemoryRegion.shared_hbm:
        raise EmulatorError(
            f"{where} {alloc.name!r} is in {alloc.buffer.value}; kernel outputs must be "
            "allocated with buffer=nl.shared_hbm (nl.hbm outputs fail to compile in 0.3.0)"
        )
    if not value._is_whole or value.shape != alloc.shape:
        raise EmulatorError(
            f"{where} is a view {value.shape} of {alloc.name!r} {alloc.shape}; "
            "return the whole tensor"
        )
    if not alloc.written.all():
        missing = int((~alloc.written).sum())
        raise EmulatorError(
            f"{where} {alloc.name!r} {alloc.shape} has {missing} never-written element(s)"
        )
    data = np.array(alloc.data, copy=True)
    if not as_torch:
        return data
    import torch

    tensor = torch.from_numpy(data)
    return tensor.to(torch.bfloat16) if alloc.dtype is bfloat16 else tensor


class EmulatedKernel:
    """A function decorated with the emulated ``nki.jit``; call it like the real kernel."""

    def __init__(self, func: Any) -> None:
        self.func = func
        functools.update_wrapper(self, func)

    def __getitem__(self, grid: Any) -> EmulatedKernel:
        if grid not in (1, (1,)):
            raise NotImplementedError(
                f"{self.func.__name__}[{grid!r}]: the emulator runs LNC=1 launches only"
            )
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self.func.__name__
        if _state.KERNEL_STACK:
            raise EmulatorError(
                f"@nki.jit kernel {name!r} called inside kernel "
                f"{_state.KERNEL_STACK[-1].name!r}; call helpers as plain functions"
            )
        as_torch = any(_is_torch(a) for a in list(args) + list(kwargs.values()))
        params = list(inspect.signature(self.func).parameters)
        labels = [params[i] if i < len(params) else str(i) for i in range(len(args))]
        wrapped = [_wrap(a, f"{name}: argument {label!r}") for label, a in zip(labels, args)]
        wrapped_kw = {k: _wrap(v, f"{name}: argument {k!r}") for k, v in kwargs.items()}
        run = KernelRun(name, _state.TARGET["name"])
        _state.KERNEL_STACK.append(run)
        _trace.note_kernel(name)
        try:
            result = self.func(*wrapped, **wrapped_kw)
            return _unwrap(result, run, as_torch)
        finally:
            _state.KERNEL_STACK.remove(run)


def jit(func=None, mode="auto", **kwargs):
    """Emulated ``nki.jit``: decorate a kernel (``@nki.jit`` or ``@nki.jit(...)``).

    ``mode`` is ignored (as in 0.3.0); ``platform_target=`` raises (as in 0.3.0): choose the
    emulated target with :func:`dfmp2.nki_emulator.set_target`.
    """
    if "platform_target" in kwargs:
        raise TypeError(
            "nki.jit(platform_target=...) raises in NKI 0.3.0; set the target with "
            "NEURON_PLATFORM_TARGET_OVERRIDE (real nki) or dfmp2.nki_emulator.set_target"
        )
    if func is None:
        return lambda f: EmulatedKernel(f)
    return EmulatedKernel(func)


def simulate(kernel):
    """Emulated ``nki.simulate(kernel)``: a callable running ``kernel`` on the emulator."""
    if isinstance(kernel, EmulatedKernel):
        return kernel
    return EmulatedKernel(kernel)
