"""Large arrays: the stored integrals (small pages, zeroed by one thread per CPU) and the
reused work arrays of the block loops.

The first touch of a page is most of what a large fresh array costs on the benchmark machine, a
VM that hands freed memory back to its host: 500 MB took 1.3-1.5 s in transparent huge pages
(numpy's default for large arrays) from one thread, 0.5-0.7 s from two, and 0.2-0.3 s in small
pages from two. The work arrays stay in numpy's huge pages: they are written in scattered
places by libcint and the BLAS, and the transform of (H2O)20 ran 0.3-0.5 s slower with them in
small pages.
"""

from __future__ import annotations

import ctypes
import mmap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .errors import ResourceError
from .threads import available

__all__ = ["zeros", "Buffers", "MAX_TOUCH_THREADS", "return_freed_memory"]

#: Largest number of threads that zero a new array.
MAX_TOUCH_THREADS = 8
#: Arrays below this size are zeroed by the calling thread.
_THREAD_BYTES = 64 * 1024 * 1024


def zeros(shape: tuple[int, ...], dtype=np.float64) -> np.ndarray:
    """A zeroed C-contiguous array in small pages (where the OS lets us ask), zeroed by one
    thread per available CPU (:func:`dfmp2.threads.available`; up to :data:`MAX_TOUCH_THREADS`,
    one per 64 MB)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes and hasattr(mmap, "MADV_NOHUGEPAGE"):
        try:
            buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except OSError as exc:  # a process memory limit (ulimit -v), an exhausted machine
            raise ResourceError(
                f"cannot map {nbytes / 2**20:.0f} MiB of memory ({exc.strerror}); lower "
                "--max-memory (Python: max_memory=) or raise the process's memory limit "
                "(ulimit -v)") from None
        buffer.madvise(mmap.MADV_NOHUGEPAGE)
        array = np.frombuffer(buffer, dtype=dtype).reshape(shape)  # unmapped when freed
    else:
        array = np.empty(shape, dtype=dtype)
    flat = array.reshape(-1)
    nthreads = max(1, min(available(), MAX_TOUCH_THREADS, nbytes // _THREAD_BYTES))
    if nthreads == 1:
        flat.fill(0)
    else:
        with ThreadPoolExecutor(nthreads) as pool:  # ndarray.fill releases the GIL
            list(pool.map(lambda part: part.fill(0), np.array_split(flat, nthreads)))
    return array


class Buffers:
    """Named float64 CPU work arrays, grown on demand and reused: a block loop that allocated
    fresh arrays would pay the first touch for every block."""

    def __init__(self):
        self._flat: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A (shape) float64 tensor over the named buffer; its contents are undefined."""
        size = int(np.prod(shape))
        flat = self._flat.get(name)
        if flat is None or flat.size < size:
            flat = self._flat[name] = np.empty(size)
        return torch.from_numpy(flat[:size].reshape(shape))


def return_freed_memory() -> bool:
    """Hand the memory freed to the C heap back to the operating system (glibc's
    ``malloc_trim``; False where the C library has none). Arrays that glibc placed on its heap
    (below its mmap threshold, which rises to 32 MB as large arrays are freed) stay in the
    process once freed: between the SCF and the MP2 step that was 40-50 MB of a small
    ``--max-memory`` budget."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
