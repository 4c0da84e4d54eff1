"""Emulated ``nki.jit``: run a kernel body eagerly on NumPy-backed HBM tensors.

Arguments: NumPy arrays (float32, float16, int/uint 8/16/32, bool) or torch CPU tensors
(additionally bfloat16) become read-only HBM tensors; tuples of them are allowed (lists are
rejected, as by the 0.3.0 compiler); Python scalars, strings and None pass through as
compile-time constants. float64 is rejected.

Results: the kernel must return ``nl.shared_hbm`` tensors it allocated (or a tuple of them),
fully written. They come back as NumPy arrays (bfloat16 as float32 holding bf16 values), or as
torch tensors of the matching dtype when any argument was a torch tensor.

SPMD grid launches follow the NKI 0.3.0 docs and AWS's nki-library kernels: ``kernel[n](...)``
(or ``kernel[(n,)]``) launches ``n`` programs on the physical NeuronCores of one logical core.
Only trn2 (gen3, LNC=2) has more than one: ``n`` is 1 or 2 there and 1 on trn1 (gen2, LNC=1),
checked at call time against the current target. Inside the body ``nl.program_id(0)`` is the
program's index and ``nl.num_programs(0)`` the grid size, both plain Python ints;
``nl.program_ndim()`` is 0 for a plain call and 1 with a grid (also ``kernel[1]``). The emulator:

- runs the body once per program, sequentially, program 0 first; each program has its own
  :class:`~._context.KernelRun` (its own SBUF/PSUM budget and its own instruction count against
  ``_state.MAX_INSTRUCTIONS_PER_LAUNCH``: each core runs its own instruction stream);
- wraps the arguments once; all programs read the same (read-only) inputs;
- makes the k-th ``nl.shared_hbm`` allocation of program ``p > 0`` the same tensor as program
  0's k-th (shape and dtype must agree; a program may not make more than program 0);
  private_hbm and on-chip tensors stay per program;
- refuses races on those shared tensors: an element written by two programs, or read by a
  program other than its writer (the programs run concurrently, with no ordering);
- requires every program to return the same tensors in the same structure, and every element
  of them to be written by some program.
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


def _check_result(value: Any, run: KernelRun) -> None:
    """Refuse a returned value that is not (a tuple of) whole shared_hbm tensors of the kernel."""
    if isinstance(value, tuple):
        for v in value:
            _check_result(v, run)
        return
    who = f" of {run.label}" if run.label else ""
    where = f"@nki.jit kernel {run.name!r}: returned value{who}"
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


def _same_result(a: Any, b: Any) -> bool:
    """Whether two programs' (checked) results are the same tensors in the same structure."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (
            isinstance(a, tuple)
            and isinstance(b, tuple)
            and len(a) == len(b)
            and all(_same_result(x, y) for x, y in zip(a, b))
        )
    return a._alloc is b._alloc


def _describe_result(value: Any) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(_describe_result(v) for v in value) + ")"
    return f"{value.name!r} {value.shape}"


def _unwrap(value: Any, name: str, as_torch: bool) -> Any:
    """Copy a checked result out: NumPy arrays, or torch tensors when ``as_torch``."""
    if isinstance(value, tuple):
        return tuple(_unwrap(v, name, as_torch) for v in value)
    alloc = value._alloc
    if not alloc.written.all():
        missing = int((~alloc.written).sum())
        raise EmulatorError(
            f"@nki.jit kernel {name!r}: returned value {alloc.name!r} {alloc.shape} has "
            f"{missing} never-written element(s)"
        )
    data = np.array(alloc.data, copy=True)
    if not as_torch:
        return data
    import torch

    tensor = torch.from_numpy(data)
    return tensor.to(torch.bfloat16) if alloc.dtype is bfloat16 else tensor


def _grid_size(grid: Any, name: str) -> int:
    """The number of programs of ``kernel[grid]``: an int ``n >= 1`` or a 1-tuple ``(n,)``."""
    if isinstance(grid, tuple) and len(grid) != 1:
        raise EmulatorError(
            f"{name}[{grid!r}]: the emulator supports 1-D launch grids only, kernel[n] or "
            "kernel[(n,)] (a logical NeuronCore spans at most 2 physical cores)"
        )
    size = grid[0] if isinstance(grid, tuple) else grid
    if not isinstance(size, int) or isinstance(size, bool):
        raise EmulatorError(
            f"{name}[{grid!r}]: the grid size must be a Python int, got {type(size).__name__}"
        )
    if size < 1:
        raise EmulatorError(f"{name}[{grid!r}]: the grid size must be at least 1, got {size}")
    return size


def _check_grid_on_target(size: int, name: str, target: str) -> None:
    """Refuse a grid the emulated target cannot launch (checked at call time)."""
    if target == "trn1" and size != 1:
        raise EmulatorError(
            f"{name}[{size}] on trn1: trn1 (gen2) has LNC=1 only; launch the kernel once per "
            "NeuronCore instead"
        )
    if size > 2:
        raise EmulatorError(
            f"{name}[{size}] on {target}: LNC is at most 2: a logical NeuronCore spans 2 "
            "physical cores"
        )


class EmulatedKernel:
    """A function decorated with the emulated ``nki.jit``; call it like the real kernel.

    ``kernel[n]`` (or ``kernel[(n,)]``) is a new :class:`EmulatedKernel` bound to a 1-D launch
    grid of ``n`` SPMD programs; see the module docstring.

    Attributes
    ----------
    func : callable
        The kernel body.
    grid : int or None
        Number of programs of the launch grid, or None for a plain (grid-less) kernel.
    """

    def __init__(self, func: Any, grid: int | None = None) -> None:
        self.func = func
        functools.update_wrapper(self, func)
        self.grid = grid

    def __getitem__(self, grid: Any) -> EmulatedKernel:
        name = self.func.__name__
        if self.grid is not None:
            raise EmulatorError(f"{name}[{self.grid}][{grid!r}]: the grid is already given")
        return EmulatedKernel(self.func, _grid_size(grid, name))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self.func.__name__
        if _state.KERNEL_STACK:
            raise EmulatorError(
                f"@nki.jit kernel {name!r} called inside kernel "
                f"{_state.KERNEL_STACK[-1].name!r}; call helpers as plain functions"
            )
        target = _state.TARGET["name"]
        if self.grid is not None:
            _check_grid_on_target(self.grid, name, target)
        as_torch = any(_is_torch(a) for a in list(args) + list(kwargs.values()))
        params = list(inspect.signature(self.func).parameters)
        labels = [params[i] if i < len(params) else str(i) for i in range(len(args))]
        wrapped = [_wrap(a, f"{name}: argument {label!r}") for label, a in zip(labels, args)]
        wrapped_kw = {k: _wrap(v, f"{name}: argument {k!r}") for k, v in kwargs.items()}
        _trace.note_kernel(name)
        size = 1 if self.grid is None else self.grid
        ndim = 0 if self.grid is None else 1
        first_run, first_result = None, None
        for pid in range(size):
            run = KernelRun(name, target, pid, size, ndim, first_run)
            result = self._run_program(run, wrapped, wrapped_kw)
            if first_run is None:
                first_run, first_result = run, result
            elif not _same_result(first_result, result):
                raise EmulatorError(
                    f"@nki.jit kernel {name!r}: {run.label} returned "
                    f"{_describe_result(result)} but program 0 returned "
                    f"{_describe_result(first_result)}; every program must return the same "
                    "shared_hbm tensors in the same structure"
                )
        return _unwrap(first_result, name, as_torch)

    def _run_program(self, run: KernelRun, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run the kernel body once as ``run`` and return its checked (still wrapped) result."""
        _state.KERNEL_STACK.append(run)
        try:
            result = self.func(*args, **kwargs)
            _check_result(result, run)
            return result
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
    """Emulated ``nki.simulate(kernel)``: a callable running ``kernel`` on the emulator.

    An :class:`EmulatedKernel`, also one bound to a grid (``nki.simulate(kernel[2])``), is
    returned as it is.
    """
    if isinstance(kernel, EmulatedKernel):
        return kernel
    return EmulatedKernel(kernel)
