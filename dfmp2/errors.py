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
    "KernelError",
    "OrbitalError",
    "PrecisionError",
    "Interrupted",
    "NotComputedError",
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
    """The memory limit is too small for the smallest possible block. ``least_mb``: the
    smallest ``max_memory`` in MB that would do, when the planner knows it (None otherwise)."""

    def __init__(self, message: str, least_mb: int | None = None):
        super().__init__(message)
        self.least_mb = least_mb


class NotPositiveDefiniteError(DFMP2Error, ArithmeticError):
    """A Cholesky factorisation met a non-positive pivot (the matrix is not positive definite)."""



class KernelError(DFMP2Error, RuntimeError):
    """A kernel crashed while running (not a refusal of its shape): the message names the op,
    the backend and execution mode, and the original error."""


class OrbitalError(InputError):
    """The reference orbitals are not what the MP2 formulas assume (orthonormal, canonical,
    converged); the message names the largest offending element."""


class PrecisionError(DFMP2Error, ArithmeticError):
    """A reduced-precision path cannot keep the energy within its stated tolerance on this input;
    the message says what to run instead."""


class Interrupted(KeyboardInterrupt):
    """A signal (SIGINT, SIGTERM, SIGHUP, ...: ``dfmp2._command.SIGNALS``) stopped the run;
    ``signum`` is its number and the CLI exits with status 128 + signum. Like
    ``KeyboardInterrupt`` it is no ``Exception``, so no ``except Exception`` swallows it;
    ``finally`` blocks (the temporary HDF5 file) still run."""

    def __init__(self, signum: int, name: str):
        super().__init__(f"interrupted by {name}")
        self.signum = signum
        self.name = name

    def __reduce__(self):  # pickled with its own arguments (a worker process's error)
        return (type(self), (self.signum, self.name))


class NotComputedError(DFMP2Error, AttributeError):
    """An energy was asked for before the calculation ran (``run()`` first)."""
