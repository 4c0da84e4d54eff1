"""Checks on input and output files before any work (nothing is computed only to be lost),
and writes that leave a whole file or none."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from tempfile import NamedTemporaryFile

from .errors import InputError

__all__ = ["check_readable_file", "check_writable_file", "write_text_file"]


def _of_the_system(path) -> bool:
    """Whether ``path`` names one of the system's files (/dev, /proc: a process's own streams,
    ``/dev/stdout``, ``/dev/stdin``), which are read and written as they are."""
    return os.path.abspath(path).startswith(("/dev/", "/proc/"))


def write_text_file(path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all. A regular file (or a new one) is written
    beside it under a temporary name and renamed over it, so a write that fails (a full disk)
    leaves what was there and no piece of a file. Written in place, as ``open(path, "w")``
    would: a device or a pipe, anything under /dev or /proc (``/dev/stdout``, which may stand
    for the file a shell redirects to), and a file whose directory takes no new file (read-only,
    or sticky and another user's) while the file itself is writable. The new file takes the old
    one's permissions, or the umask's. The file this process's standard output or error
    writes to (``--json /dev/stdout`` with the output redirected to a file, or that file's own
    name) is written through that stream, after what it holds and before what follows: opened
    again, it would be written from its start, under the stream's own later writes. Raises
    ``OSError``."""
    stream = _standard_stream_of(path)
    if stream is not None:
        stream.write(text)
        stream.flush()
        return
    try:
        mode = os.stat(path).st_mode  # follows links: what a write would reach
    except FileNotFoundError:
        mode = None
    if (mode is not None and not stat.S_ISREG(mode)) or \
            _of_the_system(path):
        _write_in_place(path, text)
        return
    target = os.path.realpath(path)  # a link stays: the file it names is replaced
    folder = os.path.dirname(target) or "."
    part = os.path.join(folder, f".{os.path.basename(target)}.{os.getpid()}.{os.urandom(4).hex()}"
                        ".part")
    try:
        descriptor = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies
    except PermissionError:  # the directory takes no new file; the file may still be written
        _write_in_place(path, text)
        return
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        if mode is not None:
            os.chmod(part, stat.S_IMODE(mode))
        try:
            os.replace(part, target)
        except PermissionError:  # a sticky directory: another user's file is not renamed over
            os.remove(part)
            _write_in_place(path, text)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(part)
        raise


def _standard_stream_of(path):
    """``sys.stdout`` or ``sys.stderr`` when ``path`` is the file (or pipe, or terminal) its
    descriptor, 1 or 2, writes to; else None."""
    try:
        target = os.stat(path)
    except OSError:
        return None
    for descriptor, stream in ((1, sys.stdout), (2, sys.stderr)):
        try:
            written = os.fstat(descriptor)
        except OSError:  # closed
            continue
        if stream is not None and (target.st_dev, target.st_ino) == (written.st_dev,
                                                                     written.st_ino):
            return stream
    return None


def _write_in_place(path, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def check_readable_file(path, what: str) -> None:
    """``path`` is a regular file to read whole: a device (/dev/zero) or a pipe would be read
    without end or wait for a writer, so they are refused in one line naming ``what``."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # missing or unreadable: the read names it
    if stat.S_ISDIR(mode):
        raise InputError(f"{what} {str(path)!r} is a directory; give a file")
    if stat.S_ISFIFO(mode) and _of_the_system(path):
        return  # the process's own pipe (cat r.json | dfmp2 show /dev/stdin): its writer runs
    if not stat.S_ISREG(mode):
        raise InputError(f"{what} {str(path)!r} is not a regular file (a device or a pipe); "
                         "give a JSON file")


def check_writable_file(path: str, what: str, replaced: bool = False) -> None:
    """``path`` can be created or rewritten: tried by opening it for appending (a file this
    makes is removed again); a FIFO only when something reads it (opening it would wait for a
    reader); a device (``/dev/null``, ``/dev/stdout``) as it is. ``replaced``: the output is
    written beside the file and renamed over it (the chkfile), so an existing path must be a
    regular file and its directory must take a new file too (tried with a temporary one).
    Raises :class:`InputError` naming ``what`` and the reason."""
    if not str(path).strip():
        raise InputError(f"{what} path is empty; give a file path")
    if os.path.isdir(path):
        raise InputError(f"{what} {path!r} is a directory; give a file path")
    if str(path).endswith(("/", os.sep)):  # realpath would drop the slash and make a file
        raise InputError(f"{what} {path!r} ends in '/', a directory, and there is none; give "
                         "a file path")
    mode = os.stat(path).st_mode if os.path.exists(path) else None
    if replaced and mode is not None and not stat.S_ISREG(mode):
        raise InputError(f"{what} {path!r} is not a regular file; give a file path")
    if mode is not None and stat.S_ISFIFO(mode):  # a pipe: written to if something reads it
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            raise InputError(f"{what} {path!r} is a FIFO that nothing reads; start its reader "
                             "first or give a file path") from None
        return
    if replaced:
        folder = os.path.dirname(os.path.realpath(path))
        try:
            with NamedTemporaryFile(dir=folder, prefix=".dfmp2-check-"):
                pass
        except OSError as exc:
            raise InputError(f"cannot write {what} {path!r}: its directory {folder!r} takes no "
                             f"new file ({exc.strerror})") from None
    made = os.path.realpath(path)  # a link (dangling too) stays: the file it names is tried
    existed = os.path.exists(made)
    try:
        with open(made, "ab"):
            pass
    except OSError as exc:
        raise InputError(f"cannot write {what} to {path!r}: {exc.strerror}") from None
    finally:  # also when a signal's exception lands here: no empty file is left behind
        if not existed and os.path.exists(made):
            os.remove(made)
