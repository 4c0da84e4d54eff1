"""The emulator's error type (its own module so that :mod:`._tensor` and :mod:`._register`
can raise it without importing :mod:`._context`, which imports them)."""

from __future__ import annotations


class EmulatorError(RuntimeError):
    """A kernel broke a documented NKI 0.3.0 rule (the message names the rule and the values)."""
