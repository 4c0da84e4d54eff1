"""Emulated ``nki.isa.VirtualRegister``: a device register holding one 32-bit integer.

NKI 0.3.0 (aws-neuron-sdk 65c21355, ``nki/api/nki/isa/__init__.py`` ``class VirtualRegister``
and ``nki/get-started/nki-language-guide.rst``, "Dynamic Control Flow"): "A ``VirtualRegister``
represents a scalar value stored in a hardware register on the Trainium device. Unlike
compile-time integer values, a ``VirtualRegister`` holds a value that exists at runtime. You can
use a ``VirtualRegister`` as a loop bound for ``dynamic_range``, as a condition for a dynamic
``while`` loop, or as a ``scalar_offset`` in a tensor access pattern for dynamic indexing."
``nki/deep-dives/nki-dynamic-loops.rst``: the loop variable of ``nl.dynamic_range`` "is a device
register, not a Python ``int``. You cannot use it in host-side Python expressions (e.g.,
``if i == 0:``)", and it "is frozen: you cannot write to it with ``register_move`` or
``register_load``".

The emulator keeps the value (it runs the kernel, so it knows it), but every use of a register
as a Python value raises :class:`EmulatorError`: arithmetic (also reflected), comparisons,
``bool()``, ``int()``, ``float()``, ``operator.index()`` (so ``range(reg)`` and ``t[reg]``),
and indexing a tensor with it (``t[0:128, reg]``, checked in ``NkiTensor.__getitem__``).
Its value is read only by the emulated instructions that take a register: ``nl.dynamic_range``
bounds, ``.ap(..., scalar_offset=reg)`` and the ``nisa.register_*`` instructions.
``hash()`` is the default (identity).

Not emulated: dynamic ``while reg:`` loops. The docs allow them (the compiler keeps a ``while``
whose condition is a register as a device loop), but the emulator runs kernels as Python, so
``bool(reg)`` raises like any other Python use; write such loops with ``nl.dynamic_range``.
Registers of the ``fp32`` and 64-bit (register pair) kinds are not emulated either: a register
holds an integer in ``[-2**31, 2**32)`` (the i32 and u32 ranges).
"""

from __future__ import annotations

from typing import Any

from ._errors import EmulatorError

#: Values a 32-bit register holds (as i32 or u32).
REGISTER_MIN, REGISTER_MAX = -(2**31), 2**32 - 1

_USE = (
    "use it as a dynamic_range bound, as an .ap(..., scalar_offset=reg) offset or in the "
    "nisa.register_* instructions"
)


class VirtualRegister:
    """A device register (``nisa.register_alloc``, or the loop variable of
    ``nl.dynamic_range``). Opaque: see the module docstring for what raises.

    Parameters
    ----------
    value : int or None
        Initial value; None for an uninitialised register (reading it raises).
    frozen : bool
        True for the induction variable of ``nl.dynamic_range`` (``register_move`` and
        ``register_load`` into it raise).
    """

    __hash__ = object.__hash__

    def __init__(self, value: int | None = None, frozen: bool = False) -> None:
        self._value = value
        self._frozen = frozen

    def __repr__(self) -> str:
        kind = "nl.dynamic_range loop variable" if self._frozen else "nisa.register_alloc"
        return f"<VirtualRegister ({kind}) at {id(self):#x}>"

    def _misuse(self, what: str) -> EmulatorError:
        who = (
            "nl.dynamic_range's loop variable (a VirtualRegister)"
            if self._frozen
            else "a VirtualRegister"
        )
        return EmulatorError(
            f"{who} is a device register: it cannot be used in a Python expression ({what}) "
            f"because its value exists only at run time on the device; {_USE}. To index a "
            "tensor with it, use t.ap(pattern, scalar_offset=reg, indirect_dim=...)"
        )

    # -- every Python use of the value raises ------------------------------------------------
    def __bool__(self) -> bool:
        raise self._misuse("bool(), if/while/and/or; dynamic while loops are not emulated")

    def __int__(self) -> int:
        raise self._misuse("int()")

    def __float__(self) -> float:
        raise self._misuse("float()")

    def __complex__(self) -> complex:
        raise self._misuse("complex()")

    def __index__(self) -> int:
        raise self._misuse("as an integer: range(), an index or a slice bound")

    def __round__(self, ndigits: Any = None) -> Any:
        raise self._misuse("round()")

    def __trunc__(self) -> Any:
        raise self._misuse("math.trunc()")

    def __floor__(self) -> Any:
        raise self._misuse("math.floor()")

    def __ceil__(self) -> Any:
        raise self._misuse("math.ceil()")

    def __iter__(self) -> Any:
        raise self._misuse("iteration")

    def __len__(self) -> int:
        raise self._misuse("len()")

    def __format__(self, spec: str) -> str:
        if spec:
            raise self._misuse(f"format spec {spec!r}")
        return repr(self)

    def __neg__(self) -> Any:
        raise self._misuse("unary -")

    def __pos__(self) -> Any:
        raise self._misuse("unary +")

    def __abs__(self) -> Any:
        raise self._misuse("abs()")

    def __invert__(self) -> Any:
        raise self._misuse("unary ~")


def _binary(symbol: str):
    def method(self: VirtualRegister, other: Any) -> Any:
        raise self._misuse(f"the operator {symbol}")

    return method


for _name, _symbol in {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "matmul": "@",
    "truediv": "/",
    "floordiv": "//",
    "mod": "%",
    "divmod": "divmod()",
    "pow": "**",
    "lshift": "<<",
    "rshift": ">>",
    "and": "&",
    "or": "|",
    "xor": "^",
}.items():
    setattr(VirtualRegister, f"__{_name}__", _binary(_symbol))
    setattr(VirtualRegister, f"__r{_name}__", _binary(_symbol))
for _name, _symbol in {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}.items():
    setattr(VirtualRegister, f"__{_name}__", _binary(_symbol))
del _name, _symbol


def register_value(reg: VirtualRegister, where: str) -> int:
    """The value ``reg`` holds, for the emulated instructions that read a register.

    Raises :class:`EmulatorError` for an uninitialised register (``register_alloc()`` without
    a value and never written by ``register_move``/``register_load``).
    """
    if reg._value is None:
        raise EmulatorError(
            f"{where}: reads an uninitialised VirtualRegister (nisa.register_alloc() without a "
            "value, never written by nisa.register_move or nisa.register_load)"
        )
    return reg._value


def misuse_in_index(item: Any, tensor_name: str) -> EmulatorError | None:
    """The error for a VirtualRegister used in ordinary tensor indexing (``t[0:128, reg]``,
    ``t[reg:...]``), or None when ``item`` holds none."""
    parts = (item.start, item.stop, item.step) if isinstance(item, slice) else (item,)
    for part in parts:
        if isinstance(part, VirtualRegister):
            return EmulatorError(
                f"{tensor_name}[...]: a VirtualRegister (e.g. nl.dynamic_range's loop variable) "
                "cannot index a tensor with [...] (slicing is resolved at compile time); use an "
                "access pattern with a dynamic offset instead: "
                f"{tensor_name}.ap(pattern, offset=..., scalar_offset=reg, indirect_dim=...)"
            )
    return None
