"""Parameter lists of the NKI 0.3.0 functions the emulator implements, for a conformance test.

Sources (transcribed by hand, parameter names, order and defaults):

- ``nki.isa``: aws-neuron/aws-neuron-sdk ``nki/api/nki/isa/__init__.py``. The 0.3.0 version
  (commit 65c21355d97095de19c5c7b7c6cd21ba6fecd020, the last docs commit before SDK 2.30) was not
  readable in our source index; the signatures were taken from the project reference
  ``shared/reference/nki-0.3.0.md`` §2.1, which quotes that commit, and cross-checked against the
  stored stub at commit 3afa0fdf40b9a7eb12d8d4b1ebfd924372465851 (a later release). Every
  emulated ``nisa`` signature agrees between the two except ``dma_copy``, whose later stub adds a
  ``priority=None`` parameter after ``src`` (NeuronCore-v4 DMA QoS); we follow 0.3.0 (no priority).
- ``nki.language``: the same repository's ``nki/api/nki/language/__init__.py``; 0.3.0 signatures
  from the reference §2.2 (quoting 65c21355), cross-checked against a later stored stub (index id
  56577332288, which declares ``ndarray(shape, dtype, buffer=sbuf, name='', address=None)``).
  Operator functions not listed in the reference (``maximum``, ``exp``, ...) come from that later
  stub and are kept in :data:`LANGUAGE_LATER_STUB`.
- ``nki.jit``: ``nki/api/nki/__init__.py`` as quoted in the reference §1.3.
- Dynamic loops and registers, read directly in the 0.3.0 stubs (commit 65c21355, a local
  mirror of aws-neuron-sdk): ``nki/api/nki/isa/__init__.py`` ``register_alloc(x=None)``,
  ``register_load(dst, src)``, ``register_move(dst, src)``, ``register_store(dst, src)``;
  ``nki/api/nki/language/__init__.py`` ``dynamic_range(start, stop=None, step=1)``; and the
  ``NkiTensor.ap`` method as ``nki/get-started/nki-language-guide.rst`` gives it,
  ``ap(pattern, offset=0, scalar_offset=None, vector_offset=None, indirect_dim=0, dtype=None)``
  (:data:`TENSOR`, with ``self``).

Defaults are written as strings: Python literals by ``repr`` (``None``, ``False``, ``()``,
``'auto'``), NKI objects by their qualified name (``engine.unknown``, ``nl.sbuf``, ``nl.equal``,
``nl.uint8``). :data:`REQUIRED` marks a parameter without default; ``**kwargs`` is listed by name.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from typing import Any

REQUIRED = "<required>"
R = REQUIRED

ISA: dict[str, list[tuple[str, str]]] = {
    "nc_matmul": [
        ("dst", R),
        ("stationary", R),
        ("moving", R),
        ("is_stationary_onezero", "False"),
        ("is_moving_onezero", "False"),
        ("is_transpose", "False"),
        ("accumulate", "None"),
        ("tile_position", "()"),
        ("tile_size", "()"),
        ("perf_mode", "matmul_perf_mode.none"),
        ("name", "None"),
    ],
    "nc_transpose": [("dst", R), ("data", R), ("engine", "engine.unknown"), ("name", "None")],
    "dma_copy": [
        ("dst", R),
        ("src", R),
        ("oob_mode", "oob_mode.error"),
        ("dge_mode", "dge_mode.unknown"),
        ("engine", "engine.unknown"),
        ("name", "None"),
    ],
    "tensor_copy": [("dst", R), ("src", R), ("engine", "engine.unknown"), ("name", "None")],
    "tensor_tensor": [
        ("dst", R),
        ("data1", R),
        ("data2", R),
        ("op", R),
        ("engine", "engine.unknown"),
        ("name", "None"),
    ],
    "tensor_scalar": [
        ("dst", R),
        ("data", R),
        ("op0", R),
        ("operand0", R),
        ("reverse0", "False"),
        ("op1", "None"),
        ("operand1", "None"),
        ("reverse1", "False"),
        ("engine", "engine.unknown"),
        ("name", "None"),
    ],
    "scalar_tensor_tensor": [
        ("dst", R),
        ("data", R),
        ("op0", R),
        ("operand0", R),
        ("op1", R),
        ("operand1", R),
        ("reverse0", "False"),
        ("reverse1", "False"),
        ("name", "None"),
    ],
    "activation": [
        ("dst", R),
        ("op", R),
        ("data", R),
        ("bias", "None"),
        ("scale", "1.0"),
        ("reduce_op", "None"),
        ("reduce_res", "None"),
        ("reduce_cmd", "reduce_cmd.idle"),
        ("name", "None"),
    ],
    "tensor_reduce": [
        ("dst", R),
        ("op", R),
        ("data", R),
        ("axis", R),
        ("negate", "False"),
        ("keepdims", "False"),
        ("name", "None"),
    ],
    "tensor_partition_reduce": [("dst", R), ("op", R), ("data", R), ("name", "None")],
    "reciprocal": [("dst", R), ("data", R), ("name", "None")],
    "memset": [("dst", R), ("value", R), ("engine", "engine.unknown"), ("name", "None")],
    "iota": [
        ("dst", R),
        ("pattern", R),
        ("offset", "0"),
        ("channel_multiplier", "0"),
        ("name", "None"),
    ],
    "affine_select": [
        ("dst", R),
        ("pattern", R),
        ("channel_multiplier", R),
        ("on_true_tile", R),
        ("on_false_value", R),
        ("cmp_op", "nl.equal"),
        ("offset", "0"),
        ("name", "None"),
    ],
    "get_nc_version": [],
    "register_alloc": [("x", "None")],
    "register_load": [("dst", R), ("src", R)],
    "register_move": [("dst", R), ("src", R)],
    "register_store": [("dst", R), ("src", R)],
}

_RANGE = [("start", R), ("stop", "None"), ("step", "1")]
_BINARY = [("x", R), ("y", R), ("dtype", "None")]
_UNARY = [("x", R), ("dtype", "None")]

LANGUAGE: dict[str, list[tuple[str, str]]] = {
    "ndarray": [
        ("shape", R),
        ("dtype", R),
        ("buffer", "nl.sbuf"),
        ("name", "''"),
        ("address", "None"),
    ],
    "zeros": [("shape", R), ("dtype", R), ("buffer", "nl.sbuf"), ("name", "''")],
    "shared_identity_matrix": [("n", R), ("dtype", "nl.uint8"), ("dst", "None")],
    "ds": [("start", R), ("size", R)],
    "static_range": _RANGE,
    "affine_range": _RANGE,
    "sequential_range": _RANGE,
    "dynamic_range": _RANGE,
    "program_id": [("axis", "0")],
    "num_programs": [("axes", "0")],
    # ``def program_ndim():`` ("0 if no grid"), read in the later stub 56577332288.
    "program_ndim": [],
    "add": _BINARY,
    "subtract": _BINARY,
    "multiply": _BINARY,
    "reciprocal": _UNARY,
    "copy": _UNARY,
    "load": [("src", R), ("dtype", "None")],
    "store": [("dst", R), ("value", R)],
    "matmul": [("x", R), ("y", R), ("transpose_x", "False")],
    "transpose": [("x", R), ("dtype", "None")],
    "load_transpose2d": [("src", R), ("dtype", "None")],
}

#: Operator functions whose signature we could only read in a post-0.3.0 stub.
LANGUAGE_LATER_STUB: dict[str, list[tuple[str, str]]] = {
    name: _BINARY
    for name in (
        "divide",
        "maximum",
        "minimum",
        "power",
        "equal",
        "not_equal",
        "less",
        "less_equal",
        "greater",
        "greater_equal",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "logical_and",
        "logical_or",
        "logical_xor",
    )
} | {
    name: _UNARY
    for name in (
        "abs",
        "square",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "relu",
        "tanh",
        "sigmoid",
        "negative",
        "sign",
    )
}

#: Methods of ``nl.NkiTensor``.
TENSOR: dict[str, list[tuple[str, str]]] = {
    "ap": [
        ("self", R),
        ("pattern", R),
        ("offset", "0"),
        ("scalar_offset", "None"),
        ("vector_offset", "None"),
        ("indirect_dim", "0"),
        ("dtype", "None"),
    ],
}

NKI: dict[str, list[tuple[str, str]]] = {
    "jit": [("func", "None"), ("mode", "'auto'"), ("**kwargs", R)],
}


def describe_default(value: Any) -> str:
    """The table's string form of a default value."""
    if value is inspect.Parameter.empty:
        return REQUIRED
    if isinstance(value, enum.Enum):
        if type(value).__name__ == "MemoryRegion":
            return f"nl.{value.value}"
        return f"{type(value).__name__}.{value.name}"
    if type(value).__name__ == "DType":
        return f"nl.{value.name}"
    if inspect.isfunction(value) and value.__module__.endswith("nki_emulator.language"):
        return f"nl.{value.__name__}"
    return repr(value)


def parameters(func: Callable[..., Any]) -> list[tuple[str, str]]:
    """``(name, default)`` pairs of ``func`` in the table's format."""
    out = []
    for param in inspect.signature(func).parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            out.append((f"**{param.name}", REQUIRED))
        elif param.kind is inspect.Parameter.VAR_POSITIONAL:
            out.append((f"*{param.name}", REQUIRED))
        else:
            out.append((param.name, describe_default(param.default)))
    return out
