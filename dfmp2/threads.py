"""How many threads a run may use: every thread pool of the process held to one count for a block
of code, and put back afterwards (:func:`limit`).

A workflow engine that runs several jobs side by side on one node (QCEngine's ``ncores``,
:mod:`dfmp2.qcengine_harness`) gives each job's process a share of the cores. The environment
variables that size the pools (``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``) are read once, when
each library loads, so inside a running process each pool is set through its library's own call.
The counts belong to the process (PySCF's OpenMP count to the calling thread): one run at a
time holds a limit, and two runs on threads of one process cannot have different ones.

- torch's intra-op pool (its products and copies, and MKL's threads): ``torch.set_num_threads``;
- PySCF's OpenMP threads (libcint's integrals, its compiled gathers): ``pyscf.lib.num_threads``;
  dfmp2's own Python thread pools (zeroing new arrays, unpacking the SCF's tensor) take their
  size from it;
- every OpenBLAS loaded in the process (numpy's, scipy's, PySCF's bundled one): its
  ``openblas_set_num_threads`` under the names its build gives it (a single-threaded build,
  as PySCF's is, answers 1 and ignores the call). numpy's is found through numpy itself,
  whatever its file is called (a wheel's, conda's, a distribution's ``libblas.so.3``), and
  its count is shared with the pair step's blocks on one BLAS thread
  (:func:`single_threaded_numpy_blas`) under one lock, so that a limit and such a block,
  opened and closed in any order on two Python threads, each give back what they found.
"""

from __future__ import annotations

import ctypes
import functools
import numbers
import os
import threading
from contextlib import contextmanager

from ._names import MAX_THREADS
from .errors import InputError

__all__ = ["limit", "checked_count", "counts", "openblas_libraries", "available",
           "numpy_blas_threads", "single_threaded_numpy_blas"]

#: The C functions ``openblas_get_num_threads`` and ``openblas_set_num_threads`` under the names
#: OpenBLAS builds give them: plain; numpy 1.x's wheels' 64-bit-integer build (suffix ``64_``);
#: scipy-openblas's (numpy 2's wheel: 64-bit integers, suffix ``64_``; scipy's: 32-bit, no
#: suffix). A name ending in ``_`` alone, or in ``_64_``, is the Fortran interface, which takes a
#: pointer: not these.
_THREAD_SYMBOLS = (("openblas_get_num_threads", "openblas_set_num_threads"),
                   ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
                   ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
                   ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"))


def openblas_libraries() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process (``/proc/self/maps``), sorted;
    empty where that file does not exist (not Linux)."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps
                           if "openblas" in os.path.basename(line.split()[-1]).lower()})
    except OSError:
        return []


def _openblas_calls(path: str):
    """(get, set) thread-count functions of the OpenBLAS at ``path``; None if it has none."""
    return _thread_calls(ctypes.CDLL(path))


def _thread_calls(handle):
    """(get, set) thread-count functions of a loaded OpenBLAS ``handle``, under the first names
    of :data:`_THREAD_SYMBOLS` it has; None if it has none."""
    for get_name, set_name in _THREAD_SYMBOLS:
        get, put = getattr(handle, get_name, None), getattr(handle, set_name, None)
        if get is not None and put is not None:
            get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
            return get, put
    return None


def _owner(path: str) -> str:
    """Whose OpenBLAS ``path`` is: the installed package it sits in ('numpy' for
    ``site-packages/numpy.libs/...``, 'pyscf' for ``site-packages/pyscf/lib/...``), else its
    file name."""
    parts = os.path.realpath(path).split(os.sep)
    for i, part in enumerate(parts[:-2]):
        if part in ("site-packages", "dist-packages"):
            return parts[i + 1].removesuffix(".libs")
    return os.path.basename(path)


def _numpy_core_module():
    """numpy's compiled core (the extension that calls its BLAS): ``numpy._core``'s (numpy 2)
    or ``numpy.core``'s (numpy 1)."""
    try:
        from numpy._core import _multiarray_umath
    except ImportError:  # numpy 1.x
        from numpy.core import _multiarray_umath
    return _multiarray_umath


@functools.cache
def _numpy_openblas():
    """(get, set) thread-count functions of numpy's OpenBLAS; None where numpy's BLAS is not
    an OpenBLAS with them (found once: a loaded library stays). Looked up through numpy's own
    compiled core, whose handle resolves a name in the libraries it was linked against: the
    OpenBLAS of a wheel (``numpy.libs``), of conda (``libcblas.so.3``, a link to its OpenBLAS)
    or of a Linux distribution (``libblas.so.3`` where OpenBLAS provides it) alike, whatever
    its file is called."""
    try:
        calls = _thread_calls(ctypes.CDLL(_numpy_core_module().__file__))
    except (OSError, AttributeError, ImportError):
        calls = None
    if calls is None:  # a core that cannot be opened so: a wheel's library by its path
        for path in openblas_libraries():
            if _owner(path) == "numpy":
                return _openblas_calls(path)
    return calls


def _address(call) -> int:
    """Where a C function of :func:`_thread_calls` is (two handles of one library give the
    same)."""
    return ctypes.cast(call, ctypes.c_void_p).value


def _is_numpys(calls) -> bool:
    """Whether ``calls`` (of :func:`_thread_calls`) are those of numpy's OpenBLAS."""
    numpys = _numpy_openblas()
    return numpys is not None and _address(numpys[1]) == _address(calls[1])


#: numpy's OpenBLAS count belongs to the process; every change dfmp2 makes to it holds this
#: lock. ``depth``: :func:`single_threaded_numpy_blas`'s blocks open now, on any Python thread;
#: ``saved``: the count the last of them to close gives back, which :func:`limit` sets and
#: restores while any is open (so that neither undoes the other).
_single = {"lock": threading.Lock(), "depth": 0, "saved": 1}


def numpy_blas_threads() -> int:
    """Threads of numpy's OpenBLAS (1 where it has no such call), outside the
    :func:`single_threaded_numpy_blas` blocks open now: the count another run's pair step,
    open on another Python thread, holds at 1 and gives back."""
    return max(1, _numpy_count())


def _numpy_count(count: int | None = None) -> int:
    """numpy's OpenBLAS count outside :func:`single_threaded_numpy_blas`'s blocks (1 where it
    has no such call), first set to ``count`` when given (while a block is open, the count it
    gives back): the count before."""
    calls = _numpy_openblas()
    if calls is None:
        return 1
    with _single["lock"]:
        before = _single["saved"] if _single["depth"] else int(calls[0]())
        if count is not None:
            if _single["depth"]:
                _single["saved"] = count
            else:
                calls[1](count)
    return before


@contextmanager
def single_threaded_numpy_blas():
    """numpy's OpenBLAS on one thread inside the ``with`` block, its count restored afterwards
    (on error too): for Python threads that each run their own products. The count is the
    process's: while a block is open every numpy product runs on one thread, another run's on
    another Python thread too (its bits may then differ in the last places from a run alone;
    it reads :func:`numpy_blas_threads` as it was)."""
    calls = _numpy_openblas()
    if calls is None:
        yield
        return
    with _single["lock"]:
        if _single["depth"] == 0:
            _single["saved"] = int(calls[0]())
            calls[1](1)
        _single["depth"] += 1
    try:
        yield
    finally:
        with _single["lock"]:
            _single["depth"] -= 1
            if _single["depth"] == 0:
                calls[1](_single["saved"])


def counts() -> dict:
    """The thread count of each pool now: {'torch', 'pyscf_openmp', 'openblas': {owner: count}}
    with numpy's OpenBLAS under 'numpy' (:func:`numpy_blas_threads`) and every other one mapped
    under its package or file name (:func:`_owner`)."""
    import torch
    from pyscf import lib

    openblas = {}
    for path, calls in _other_openblas():
        openblas[_owner(path)] = int(calls[0]())
    if _numpy_openblas() is not None:
        openblas["numpy"] = numpy_blas_threads()
    return {"torch": torch.get_num_threads(), "pyscf_openmp": int(lib.num_threads()),
            "openblas": dict(sorted(openblas.items()))}


def _other_openblas() -> list:
    """``[(path, (get, set)), ...]`` of the OpenBLAS libraries mapped into the process other
    than numpy's (PySCF's bundled one, scipy's)."""
    found = []
    for path in openblas_libraries():
        calls = _openblas_calls(path)
        if calls is not None and not _is_numpys(calls):
            found.append((path, calls))
    return found


def available() -> int:
    """Threads dfmp2's own Python pools may use: PySCF's OpenMP count (which :func:`limit` sets),
    at most the CPUs this process may run on."""
    from pyscf import lib

    return max(1, min(int(lib.num_threads()), len(os.sched_getaffinity(0))))


def checked_count(threads) -> int:
    """``threads`` as an int (a numpy integer too), or an :class:`InputError` naming it when
    it is not a whole number from 1 to :data:`MAX_THREADS`."""
    if (isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1
            or threads > MAX_THREADS):
        raise InputError(f"threads must be a whole number from 1 to {MAX_THREADS}, got "
                         f"{threads!r}")
    return int(threads)


@contextmanager
def limit(threads: int | None):
    """Hold every pool (module docstring) to ``threads`` inside the ``with`` block and restore
    each one's count afterwards, on error too; None leaves them as they are. An OpenBLAS that
    loads inside the block is sized by the environment, as usual."""
    if threads is None:
        yield
        return
    threads = checked_count(threads)
    import torch
    from pyscf import lib

    restore = [(torch.set_num_threads, torch.get_num_threads()),
               (lib.num_threads, int(lib.num_threads()))]
    restore += [(calls[1], int(calls[0]())) for _, calls in _other_openblas()]
    if _numpy_openblas() is not None:  # through the lock its pair-step blocks share
        restore.append((_numpy_count, _numpy_count()))
    try:
        for put, _ in restore:
            put(threads)
        yield
    finally:
        for put, before in reversed(restore):
            put(before)
