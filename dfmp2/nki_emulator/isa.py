"""Emulated ``nki.isa`` (NKI 0.3.0 subset).

Every instruction takes ``dst`` first, validates its operands against the documented 0.3.0
constraints (raising :class:`EmulatorError` or ``TypeError`` naming the instruction and the
limit), computes with NumPy in float32, writes ``dst`` cast to its dtype, and appends a record
to the active traces.

``VirtualRegister`` and the ``register_*`` instructions (:mod:`._register`,
:mod:`._isa_register`) serve ``nl.dynamic_range`` bounds and ``.ap(..., scalar_offset=reg)``
dynamic DMA.
"""

from __future__ import annotations

from . import _context
from ._context import EmulatorError
from ._enums import dge_mode, dma_engine, engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd
from ._isa_data import affine_select, dma_copy, iota, memset, tensor_copy
from ._isa_matmul import nc_matmul, nc_transpose
from ._isa_register import register_alloc, register_load, register_move, register_store
from ._isa_vector import (
    activation,
    reciprocal,
    scalar_tensor_tensor,
    tensor_partition_reduce,
    tensor_reduce,
    tensor_scalar,
    tensor_tensor,
)
from ._register import VirtualRegister

__dfmp2_emulator__ = True

#: The error type the emulator raises for broken NKI rules (the real 0.3.0 uses
#: ``NkiValidationError`` for hardware constraint violations).
NkiValidationError = EmulatorError

__all__ = [
    "NkiValidationError",
    "VirtualRegister",
    "activation",
    "affine_select",
    "dge_mode",
    "dma_copy",
    "dma_engine",
    "engine",
    "get_nc_version",
    "iota",
    "matmul_perf_mode",
    "memset",
    "nc_matmul",
    "nc_transpose",
    "nc_version",
    "oob_mode",
    "reciprocal",
    "reduce_cmd",
    "register_alloc",
    "register_load",
    "register_move",
    "register_store",
    "scalar_tensor_tensor",
    "tensor_copy",
    "tensor_partition_reduce",
    "tensor_reduce",
    "tensor_scalar",
    "tensor_tensor",
]


def get_nc_version():
    """NeuronCore version of the emulated target: ``gen2`` (trn1) or ``gen3`` (trn2)."""
    run = _context.current("nisa.get_nc_version")
    return nc_version.gen2 if run.gen == 2 else nc_version.gen3
