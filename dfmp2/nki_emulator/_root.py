"""The module object aliased as ``nki`` by :func:`dfmp2.nki_emulator.install`."""

from __future__ import annotations

from . import isa, language
from ._jit import jit, simulate

__dfmp2_emulator__ = True
#: Not a real nki version: the emulator follows the NKI 0.3.0 API.
__version__ = "0.3.0+dfmp2.emulator"

__all__ = ["isa", "jit", "language", "simulate"]
