"""NumPy float32 semantics of the operator objects in :mod:`.language`.

``ALU_BINARY``: arithmetic ALU operators usable in ``tensor_tensor``, ``tensor_scalar``,
``scalar_tensor_tensor`` and (``add``, ``multiply``, ``maximum``, ``minimum``) reductions.
``ALU_UNARY``: ALU operators that take no operand (``tensor_scalar`` with operand None or 0).
``ACTIVATION``: ScalarE activation functions for ``nisa.activation``, with the documented
valid input ranges of the approximated ones (inputs outside raise).
Bitvec and logical operators exist in :mod:`.language` but are not emulated.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from . import language as nl

F32 = np.float32
Binary = Callable[[np.ndarray, np.ndarray], np.ndarray]
Unary = Callable[[np.ndarray], np.ndarray]


def _cmp(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Binary:
    return lambda a, b: fn(a, b).astype(F32)


ALU_BINARY: dict[object, Binary] = {
    nl.add: np.add,
    nl.subtract: np.subtract,
    nl.multiply: np.multiply,
    nl.maximum: np.maximum,
    nl.minimum: np.minimum,
    nl.power: np.power,
    nl.equal: _cmp(np.equal),
    nl.not_equal: _cmp(np.not_equal),
    nl.less: _cmp(np.less),
    nl.less_equal: _cmp(np.less_equal),
    nl.greater: _cmp(np.greater),
    nl.greater_equal: _cmp(np.greater_equal),
}

ALU_UNARY: dict[object, Unary] = {
    nl.abs: np.abs,
    nl.rsqrt: lambda a: F32(1.0) / np.sqrt(a),
    nl.reciprocal: lambda a: F32(1.0) / a,
}

#: Reduction operators of tensor_reduce / tensor_partition_reduce with their identity.
REDUCE: dict[object, tuple[Callable[..., np.ndarray], float]] = {
    nl.add: (np.sum, 0.0),
    nl.multiply: (np.prod, 1.0),
    nl.maximum: (np.max, -np.inf),
    nl.minimum: (np.min, np.inf),
}

ACTIVATION: dict[object, Unary] = {
    nl.copy: lambda a: a,
    nl.square: np.square,
    nl.exp: np.exp,
    nl.log: np.log,
    nl.sqrt: np.sqrt,
    nl.rsqrt: lambda a: F32(1.0) / np.sqrt(a),
    nl.reciprocal: lambda a: F32(1.0) / a,
    nl.abs: np.abs,
    nl.relu: lambda a: np.maximum(a, F32(0.0)),
    nl.tanh: np.tanh,
    nl.sigmoid: lambda a: F32(1.0) / (F32(1.0) + np.exp(-a)),
    nl.negative: np.negative,
    nl.sign: np.sign,
}

#: Documented valid |input| ranges of ScalarE's piecewise approximations (0.3.0 nki.api.shared).
ACTIVATION_RANGE: dict[object, tuple[float, float, bool]] = {
    nl.sqrt: (2.0**-116, 2.0**118, False),
    nl.rsqrt: (2.0**-87, 2.0**97, False),
    nl.reciprocal: (2.0**-42, 2.0**42, True),
}


def op_name(op: object) -> str:
    """``nl.<name>`` of an operator object, for messages and trace records."""
    return f"nl.{getattr(op, '__name__', repr(op))}"


def check_activation_range(op: object, values: np.ndarray, where: str) -> None:
    """Raise if ``values`` leave the documented valid input range of activation ``op``."""
    if op not in ACTIVATION_RANGE:
        return
    lo, hi, signed = ACTIVATION_RANGE[op]
    mag = np.abs(values) if signed else values
    bad = ~((mag >= lo) & (mag <= hi))
    if np.any(bad):
        example = float(values[bad].flat[0])
        sign = "±" if signed else ""
        raise ValueError(
            f"{where}: {op_name(op)} input {example!r} is outside the documented valid range "
            f"{sign}[{lo!r}, {hi!r}] of the ScalarE approximation ({int(bad.sum())} element(s))"
        )
