"""Checks on output files before any work (nothing is computed only to be lost)."""

from __future__ import annotations

import os

from .errors import InputError

__all__ = ["check_writable_file"]


def check_writable_file(path: str, what: str) -> None:
    """``path`` can be created or rewritten: tried by opening it for appending (a file this
    makes is removed again). Raises :class:`InputError` naming ``what`` and the reason."""
    if os.path.isdir(path):
        raise InputError(f"{what} {path!r} is a directory; give a file path")
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise InputError(f"cannot write {what} to {path!r}: {exc.strerror}") from None
    if not existed:
        os.remove(path)
