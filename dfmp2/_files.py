"""Checks on output files before any work (nothing is computed only to be lost)."""

from __future__ import annotations

import os
import stat
from tempfile import NamedTemporaryFile

from .errors import InputError

__all__ = ["check_writable_file"]


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
