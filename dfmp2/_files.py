"""Checks on output files before any work (nothing is computed only to be lost)."""

from __future__ import annotations

import os
import stat
import tempfile

from .errors import InputError

__all__ = ["check_writable_file"]


def check_writable_file(path: str, what: str, replaced: bool = False) -> None:
    """``path`` can be created or rewritten: tried by opening it for appending (a file this
    makes is removed again). An existing path must be a regular file (a FIFO would block the
    check, a device would take the output). ``replaced``: the output is written beside the
    file and renamed over it (the chkfile), so its directory must take a new file too (tried
    with a temporary one). Raises :class:`InputError` naming ``what`` and the reason."""
    if os.path.isdir(path):
        raise InputError(f"{what} {path!r} is a directory; give a file path")
    if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):
        raise InputError(f"{what} {path!r} is not a regular file; give a file path")
    if replaced:
        folder = os.path.dirname(os.path.realpath(path))
        try:
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".dfmp2-check-"):
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
    if not existed:
        os.remove(made)
