"""Where the three-index MO integrals live: in memory, or in a temporary HDF5 file.

Two tensors pass through storage: ``Pia`` (naux, nocc*nvir), the transformed integrals as the
transform produces them (one auxiliary block of rows at a time, written sequentially), and ``B``
(nocc, nvir, naux_fit), the fitted integrals the pair-energy step reads in occupied blocks.
The out-of-core store keeps both in one temporary HDF5 file that is deleted on ``close()``.
A DF-SCF's fitted AO tensor that does not fit in memory lives in a :class:`MatrixFile`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import weakref

import numpy as np
import torch

from .buffers import zeros
from .errors import ResourceError

__all__ = ["DeviceStore", "IncoreStore", "H5Store", "MatrixFile", "StreamedB"]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(zeros(shape, np.float32 if dtype == torch.float32 else np.float64))


class _InMemory:
    """What the in-memory stores share: B replaces ``Pia`` when the fit is done, read in
    occupied blocks."""

    _ovP: torch.Tensor | None
    _ovL: torch.Tensor | None

    def finish_fit(self) -> None:
        if self._ovL is not self._ovP:
            self._ovP = None

    def read_b(self, i0: int, i1: int) -> torch.Tensor:
        """B for occupied i0:i1, (i1 - i0, nvir, naux_fit), in the store's dtype."""
        return self._ovL[i0:i1]

    def close(self) -> None:
        self._ovP = self._ovL = None


class IncoreStore(_InMemory):
    """Both tensors in memory. ``Pia`` and ``B`` share one buffer when the fit is in place."""

    kind = "incore"

    def __init__(self, nocc: int, nvir: int, naux: int, naux_fit: int, dtype=torch.float64):
        self.nocc, self.nvir, self.naux, self.naux_fit = nocc, nvir, naux, naux_fit
        self._ovP = _zeros((nocc, nvir, naux), torch.float64)
        self._ovL = None
        self._dtype = dtype

    def write_pia(self, p0: int, p1: int, pia: torch.Tensor) -> None:
        """Rows p0:p1 of Pia, given as (p1 - p0, nocc, nvir), any strides. A numpy copy: see
        :mod:`dfmp2.linalg.cpu_blas` for why no torch op runs between the GEMMs."""
        np.copyto(self._ovP.numpy()[:, :, p0:p1], pia.numpy().transpose(1, 2, 0))

    def write_pia_part(self, i0: int, i1: int, p0: int, p1: int, ovp: np.ndarray) -> None:
        """(ia|P) of occupied i0:i1 and functions p0:p1, given as (i1-i0, nvir, p1-p0)."""
        self._ovP.numpy()[i0:i1, :, p0:p1] = ovp

    def read_ia_slab(self, i0: int, i1: int) -> torch.Tensor:
        """(i1 - i0) * nvir rows of (ia|P), shape ((i1-i0)*nvir, naux), float64: a view, which
        the fit may overwrite with B."""
        return self._ovP[i0:i1].reshape((i1 - i0) * self.nvir, self.naux)

    def write_b(self, i0: int, i1: int, b_rows: torch.Tensor) -> None:
        """Fitted rows for occupied i0:i1, shape ((i1-i0)*nvir, naux_fit)."""
        if self._ovL is None:
            in_place = self.naux_fit == self.naux and self._dtype == torch.float64
            self._ovL = self._ovP if in_place else _zeros(
                (self.nocc, self.nvir, self.naux_fit), self._dtype)
        target = self._ovL[i0:i1]
        if b_rows.data_ptr() != target.data_ptr():  # not already fitted in place
            np.copyto(target.numpy(), b_rows.numpy().reshape(i1 - i0, self.nvir, -1),
                      casting="same_kind")



class DeviceStore(_InMemory):
    """Both tensors on a torch device (``--device cuda``; any device, the CPU in tests): torch
    ops only, no numpy views. ``Pia`` and ``B`` share one tensor when the fit is in place."""

    kind = "device"
    in_memory = True

    def __init__(self, nocc: int, nvir: int, naux: int, naux_fit: int, dtype, device):
        self.nocc, self.nvir, self.naux, self.naux_fit = nocc, nvir, naux, naux_fit
        self._ovP = torch.zeros((nocc, nvir, naux), dtype=torch.float64, device=device)
        self._ovL = None
        self._dtype = dtype

    def write_pia(self, p0: int, p1: int, pia: torch.Tensor) -> None:
        """Rows p0:p1 of Pia, given as (p1 - p0, nocc, nvir) on the device."""
        self._ovP[:, :, p0:p1].copy_(pia.permute(1, 2, 0))

    def read_ia_slab(self, i0: int, i1: int) -> torch.Tensor:
        return self._ovP[i0:i1].reshape((i1 - i0) * self.nvir, self.naux)

    def write_b(self, i0: int, i1: int, b_rows: torch.Tensor) -> None:
        if self._ovL is None:
            in_place = self.naux_fit == self.naux and self._dtype == torch.float64
            self._ovL = self._ovP if in_place else torch.zeros(
                (self.nocc, self.nvir, self.naux_fit), dtype=self._dtype,
                device=self._ovP.device)
        target = self._ovL[i0:i1]
        if b_rows.data_ptr() != target.data_ptr():
            target.copy_(b_rows.reshape(i1 - i0, self.nvir, -1))


class StreamedB:
    """A host store's B read in occupied blocks onto ``device`` (the pair stage of a run whose
    B does not fit on the device)."""

    def __init__(self, store, device):
        self.store, self.device = store, device
        self.nocc = store.nocc
        self.in_memory = True  # nothing for a device backend to place: blocks are copied

    def read_b(self, i0: int, i1: int) -> torch.Tensor:
        return self.store.read_b(i0, i1).to(self.device, non_blocking=True)


class H5Store:
    """Both tensors in a temporary HDF5 file (h5py) under ``directory`` (default: the system's
    temporary directory). The file is unlinked as soon as it is open (HDF5 keeps working on its
    descriptor), so nothing is left in ``directory`` whatever ends the process, SIGKILL
    included; where the OS refuses that, :meth:`close` removes it, even after an error.

    ``register``, when given, is called with the store before its file exists: the caller's
    ``finally`` then closes every registered store, so an interruption (a signal turned into an
    exception) at any point of the construction leaves no file behind."""

    kind = "hdf5"
    in_memory = False

    def __init__(self, nocc: int, nvir: int, naux: int, naux_fit: int, dtype=torch.float64,
                 directory: str | None = None, register=None):
        import h5py

        self.nocc, self.nvir, self.naux, self.naux_fit = nocc, nvir, naux, naux_fit
        self._np_dtype = np.float32 if dtype == torch.float32 else np.float64
        name = f"dfmp2-{os.getpid()}-{secrets.token_hex(6)}.h5"
        self.path = os.path.join(directory or tempfile.gettempdir(), name)
        self._file = None
        if register is not None:
            register(self)
        try:
            # exclusive: never another run's file. No sieve buffer: a write the disk refuses
            # fails in the write itself (a cached one failed only at close, and an HDF5 file
            # left with data it cannot write crashes the process at its exit)
            access = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
            access.set_sieve_buf_size(0)
            with _scratch_io(self.path):
                self._file = h5py.File(h5py.h5f.create(os.fsencode(self.path),
                                                       h5py.h5f.ACC_EXCL, fapl=access))
            with contextlib.suppress(OSError):  # else close() removes it
                os.unlink(self.path)
            self._pia = self._file.create_dataset("Pia", (naux, nocc * nvir), dtype="f8")
            self._b = self._file.create_dataset("B", (nocc, nvir, naux_fit),
                                                dtype=self._np_dtype)
        except BaseException:
            self.close()
            raise

    def write_pia(self, p0: int, p1: int, pia: torch.Tensor) -> None:
        """Rows p0:p1 of Pia, given as (p1 - p0, nocc, nvir), any strides (the transform's view
        is permuted: one numpy copy, counted by the planner)."""
        rows = np.ascontiguousarray(pia.numpy()).reshape(p1 - p0, self.nocc * self.nvir)
        with _scratch_io(self.path):
            self._pia[p0:p1] = rows

    def write_pia_part(self, i0: int, i1: int, p0: int, p1: int, ovp: np.ndarray) -> None:
        rows = np.ascontiguousarray(ovp.reshape((i1 - i0) * self.nvir, p1 - p0).T)
        with _scratch_io(self.path):
            self._pia[p0:p1, i0 * self.nvir : i1 * self.nvir] = rows

    def read_ia_slab(self, i0: int, i1: int) -> torch.Tensor:
        with _scratch_io(self.path):
            slab = self._pia[:, i0 * self.nvir : i1 * self.nvir]  # (naux, rows)
        return torch.from_numpy(np.ascontiguousarray(slab.T))

    def write_b(self, i0: int, i1: int, b_rows: torch.Tensor) -> None:
        rows = b_rows.numpy().astype(self._np_dtype, copy=False)
        with _scratch_io(self.path):
            self._b[i0:i1] = rows.reshape(i1 - i0, self.nvir, self.naux_fit)

    def finish_fit(self) -> None:
        with _scratch_io(self.path):
            del self._file["Pia"]
        self._pia = None

    def read_b(self, i0: int, i1: int) -> torch.Tensor:
        with _scratch_io(self.path):
            return torch.from_numpy(self._b[i0:i1])

    def close(self) -> None:
        """Close and remove the file; a file whose writes failed (its HDF5 state broken) is
        closed as far as HDF5 can, without hiding the error that ended the run."""
        if self._file is not None:
            file, self._file = self._file, None
            self._pia = self._b = None  # the datasets' handles go before the file's
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                file.close()
        if os.path.exists(self.path):
            os.remove(self.path)


class MatrixFile:
    """A float64 matrix (nrow, ncol) in a temporary binary file under ``directory`` (default:
    the system's temporary directory): the DF-SCF's fitted tensor when it does not fit in
    memory. Written in column slabs (the fit makes all rows of a range of AO pairs), read in row
    blocks (J and K take all pairs of a range of auxiliary functions), by ``pwrite``/``preadv``:
    the file's pages stay in the OS cache, not in the process.

    The file is unlinked as soon as it is open, so nothing is left in ``directory`` whatever
    ends the process (an exception, a signal, SIGKILL); its space is freed when the descriptor
    is closed (:meth:`close`, or when the object is collected). Where the OS refuses to unlink an
    open file, :meth:`close` removes it.

    A matrix whose final width is known only once it is written (the DF-SCF's tensor on the AO
    pairs that are not zero) is made with its widest ``ncol`` and :meth:`narrow`-ed: ``shape``
    is then the narrower matrix, read row by row from rows ``stride`` columns apart (the
    columns never written are holes in the file, on disk and in the OS cache alike)."""

    def __init__(self, nrow: int, ncol: int, directory: str | None = None):
        self.shape = (nrow, ncol)
        self.stride = ncol
        name = f"dfmp2-scf-{os.getpid()}-{secrets.token_hex(6)}.bin"
        self.path = os.path.join(directory or tempfile.gettempdir(), name)
        with _scratch_io(self.path):  # (a name too long for the file system, a vanished folder)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._finalizer = weakref.finalize(self, _close_fd, self._fd)
        try:
            os.unlink(self.path)
            self.linked = False
        except OSError:
            self.linked = True
        try:
            with _scratch_io(self.path):
                os.ftruncate(self._fd, nrow * ncol * 8)
        except BaseException:
            self.close()
            raise

    def write_columns(self, c0: int, block: np.ndarray) -> None:
        """Columns c0:c0 + nc of every row from ``block`` (nrow, nc), float64."""
        nrow, ncol = self.shape
        if (block.ndim != 2 or block.shape[0] != nrow
                or not 0 <= c0 <= c0 + block.shape[1] <= ncol):
            raise ValueError(f"write_columns: a block of shape {block.shape} at column {c0} "
                             f"does not fit a ({nrow}, {ncol}) matrix")
        rows = np.ascontiguousarray(block, dtype=np.float64)
        with _scratch_io(self.path):
            for r in range(nrow):
                _write_all(self._fd, memoryview(rows[r]).cast("B"), (r * self.stride + c0) * 8)

    def narrow(self, ncol: int) -> None:
        """The matrix is its first ``ncol`` columns from now on (at most the current width)."""
        if not 0 <= ncol <= self.shape[1]:
            raise ValueError(f"narrow: {ncol} columns of a ({self.shape[0]}, {self.shape[1]}) "
                             "matrix")
        self.shape = (self.shape[0], ncol)

    def read_rows(self, r0: int, r1: int, out: np.ndarray) -> np.ndarray:
        """Rows r0:r1 into ``out[: r1 - r0]`` (C-contiguous float64, ncol columns); returns it."""
        nrow, ncol = self.shape
        if not (0 <= r0 <= r1 <= nrow and out.dtype == np.float64 and out.flags.c_contiguous
                and out.ndim == 2 and out.shape[1] == ncol and out.shape[0] >= r1 - r0):
            raise ValueError(f"read_rows: rows {r0}:{r1} of a ({nrow}, {ncol}) matrix do not fit "
                             f"an array of shape {out.shape}, {out.dtype}, "
                             f"{'C' if out.flags.c_contiguous else 'not C'}-contiguous")
        target = out[: r1 - r0]
        with _scratch_io(self.path):
            if ncol == self.stride:  # the rows are contiguous in the file: one read
                self._read_all(target.reshape(-1), r0 * ncol * 8)
            else:
                for r in range(r0, r1):
                    self._read_all(target[r - r0], r * self.stride * 8)
        return target

    def _read_all(self, out: np.ndarray, offset: int) -> None:
        view = memoryview(out).cast("B")
        done = 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise OSError(f"short read of {self.path}")
            done += got

    def close(self) -> None:
        self._finalizer()
        if self.linked and os.path.exists(self.path):
            os.remove(self.path)
            self.linked = False


@contextlib.contextmanager
def _scratch_io(path: str):
    """An operating system's refusal to write or read a temporary file (a full disk, a file
    size limit, an I/O error) as one :class:`ResourceError` line naming the file's directory."""
    try:
        yield
    except (OSError, RuntimeError) as exc:  # h5py raises either for a failed write or flush
        text = str(exc)
        if "error message = '" in text:  # HDF5's: "... errno = 28, error message = '...', ..."
            why = text.split("error message = '", 1)[1].split("'", 1)[0]
        else:
            why = getattr(exc, "strerror", None) or text or type(exc).__name__
        raise ResourceError(f"the temporary file in {os.path.dirname(path)!r} could not be "
                            f"written or read ({why}); free space there or give another "
                            "scratch directory (scratch_dir, --scratch-dir)") from None


def _close_fd(fd: int) -> None:
    os.close(fd)


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)
