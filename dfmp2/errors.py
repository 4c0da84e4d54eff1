"""Typed errors of dfmp2.

Every error a user can cause derives from :class:`DFMP2Error` and from the matching builtin, so
``except ValueError`` keeps working for callers who do not know our classes. The CLI prints
``str(error)`` as one line and exits with status 1.
"""

from __future__ import annotations

__all__ = [
    "DFMP2Error",
    "InputError",
    "ConvergenceError",
    "BackendUnavailableError",
    "UnsupportedShapeError",
    "ResourceError",
    "NotPositiveDefiniteError",
]


class DFMP2Error(Exception):
    """Base class of every error dfmp2 raises on purpose."""


class InputError(DFMP2Error, ValueError):
    """The molecule, basis or an option is invalid; the message names the offending value."""


class ConvergenceError(DFMP2Error, RuntimeError):
    """An iterative step (the SCF) did not converge; no energy is reported."""


class BackendUnavailableError(DFMP2Error, RuntimeError):
    """A requested backend or execution mode cannot run on this host, or a fallback was refused."""


class UnsupportedShapeError(DFMP2Error, NotImplementedError):
    """An implementation does not support the operand shapes it was given."""


class ResourceError(DFMP2Error, MemoryError):
    """The memory limit is too small for the smallest possible block."""


class NotPositiveDefiniteError(DFMP2Error, ArithmeticError):
    """A Cholesky factorisation met a non-positive pivot (the matrix is not positive definite)."""
