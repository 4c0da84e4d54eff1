"""AST lint of NKI kernel source for the Python subset the NKI 0.3.0 compiler accepts.

Checked functions (in a module that imports ``nki``): every function decorated with
``nki.jit`` (``@nki.jit``, ``@nki.jit(...)``, ``@jit`` imported from ``nki``), every module-level
function that uses the ``nki.isa``/``nki.language`` aliases (device-side helpers), every
module-level function those call by name, and every one that calls a device helper (a helper
composed of helpers), transitively. Host code that only calls kernels is not checked.

Rules (each message is ``file:line: [rule] detail (in function)``):

- ``is-compare``: ``is`` / ``is not`` (rejected by the 0.3.0 compiler);
- ``kwonly-params``: keyword-only parameters (a ``*`` separator) in a checked function;
- ``list-argument``: a list literal passed as a call argument (use a tuple); the ``pattern`` of
  ``nisa.iota``, ``nisa.affine_select`` and ``.ap`` is exempt (documented as a list);
- ``nested-function``: ``def``, ``lambda`` or ``class`` inside a checked function;
- ``comprehension``: list/set/dict comprehensions and generator expressions;
- ``subscript-unpack``: subscript targets in tuple unpacking (``x[0], y = f()``);
- ``float64``: any mention of float64;
- ``not-in-subset``: ``nl.*`` calls other than allocation/index/range helpers (the 0.3.0 compute
  wrappers such as ``nl.load``, ``nl.store``, ``nl.matmul`` are experimental), and ``nisa.*``
  calls the emulator does not implement;
- ``forbidden-statement``: ``try``, ``with`` (except ``with nl.no_reorder():``), ``yield``,
  ``global``, ``nonlocal``, ``await``;
- ``dynamic-in-no-reorder``: a ``for ... in nl.dynamic_range(...)`` loop inside a
  ``with nl.no_reorder():`` block ("``dynamic_range`` loops inside a ``nl.no_reorder()`` block
  are not currently supported", ``nki/deep-dives/nki-dynamic-loops.rst``; put the
  ``no_reorder`` block inside the loop body instead).

Allowed device calls include ``nl.dynamic_range``, the ``nisa.register_*`` instructions and
``t.ap(pattern, ...)`` (a method call, with its list ``pattern``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from . import isa as _isa

ALLOWED_NL_CALLS = frozenset(
    {
        "ndarray",
        "zeros",
        "shared_identity_matrix",
        "ds",
        "static_range",
        "affine_range",
        "sequential_range",
        "dynamic_range",
        "program_id",
        "num_programs",
        "program_ndim",
        "device_print",
        "no_reorder",
    }
)
ALLOWED_NISA_CALLS = frozenset(name for name in _isa.__all__ if callable(getattr(_isa, name)))
_NON_CALL_NAMES = frozenset(
    {
        "sbuf",
        "psum",
        "hbm",
        "private_hbm",
        "shared_hbm",
        "tile_size",
        "float32",
        "bfloat16",
        "float16",
        "int32",
        "int16",
        "int8",
        "uint32",
        "uint16",
        "uint8",
        "bool_",
        "add",
        "subtract",
        "multiply",
        "maximum",
        "minimum",
        "equal",
        "not_equal",
        "less",
        "less_equal",
        "greater",
        "greater_equal",
        "copy",
        "square",
        "reciprocal",
        "rsqrt",
        "sqrt",
        "exp",
        "log",
        "abs",
        "relu",
        "tanh",
        "sigmoid",
        "negative",
        "sign",
        "power",
    }
)
_PATTERN_ARG = {"iota": 1, "affine_select": 1, "ap": 0}
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_FORBIDDEN = {
    ast.Try: "try",
    ast.AsyncWith: "async with",
    ast.Yield: "yield",
    ast.YieldFrom: "yield from",
    ast.Global: "global",
    ast.Nonlocal: "nonlocal",
    ast.Await: "await",
}
if hasattr(ast, "TryStar"):
    _FORBIDDEN[ast.TryStar] = "try"


class _Aliases:
    """Names bound to ``nki``, ``nki.language``, ``nki.isa`` and to ``nki.jit`` in a module."""

    def __init__(self, tree: ast.Module) -> None:
        self.nki: set[str] = set()
        self.nl: set[str] = set()
        self.nisa: set[str] = set()
        self.jit: set[str] = set()
        self.from_nl: list[tuple[str, int]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    self._bind(a.name, a.asname)
            elif (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.split(".")[0] == "nki"
            ):
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    bound = a.asname or a.name
                    if full == "nki.language":
                        self.nl.add(bound)
                    elif full == "nki.isa":
                        self.nisa.add(bound)
                    elif full == "nki.jit":
                        self.jit.add(bound)
                    elif node.module == "nki.language":
                        self.from_nl.append((a.name, node.lineno))

    def _bind(self, module: str, asname: str | None) -> None:
        if module == "nki" or (module.startswith("nki.") and asname is None):
            self.nki.add("nki")
        elif module == "nki.language":
            self.nl.add(asname)
        elif module == "nki.isa":
            self.nisa.add(asname)

    @property
    def imports_nki(self) -> bool:
        return bool(self.nki or self.nl or self.nisa or self.jit or self.from_nl)


def _module_of(node: ast.expr, al: _Aliases) -> str | None:
    """``"nl"`` / ``"nisa"`` if ``node`` names the language or isa module, else None."""
    if isinstance(node, ast.Name):
        return "nl" if node.id in al.nl else "nisa" if node.id in al.nisa else None
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in al.nki
    ):
        return {"language": "nl", "isa": "nisa"}.get(node.attr)
    return None


def _is_jit(decorator: ast.expr, al: _Aliases) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Name):
        return target.id in al.jit
    return (
        isinstance(target, ast.Attribute)
        and target.attr == "jit"
        and isinstance(target.value, ast.Name)
        and target.value.id in al.nki
    )


def _uses_device_api(func: ast.FunctionDef, al: _Aliases) -> bool:
    return any(isinstance(n, ast.Attribute) and _module_of(n.value, al) for n in ast.walk(func))


def checked_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """Module-level functions the lint checks: kernels, device helpers, their callees, and the
    functions that call a device helper (a helper composed only of other helpers)."""
    al = _Aliases(tree)
    if not al.imports_nki:
        return []
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}

    def called(func: ast.FunctionDef) -> set[str]:
        return {node.func.id for node in ast.walk(func) if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name) and node.func.id in defs}

    calls = {name: called(func) for name, func in defs.items()}
    jit = {name for name, f in defs.items() if any(_is_jit(d, al) for d in f.decorator_list)}
    seen = jit | {name for name, f in defs.items() if _uses_device_api(f, al)}
    while True:
        grown = set(seen)
        for name in seen:
            grown |= calls[name]  # callees of checked functions
        helpers = grown - jit
        grown |= {name for name in defs if calls[name] & helpers}  # callers of helpers
        if grown == seen:
            break
        seen = grown
    return sorted((defs[name] for name in seen), key=lambda f: f.lineno)


def _has_subscript(target: ast.expr) -> bool:
    if isinstance(target, ast.Subscript):
        return True
    if isinstance(target, ast.Starred):
        return _has_subscript(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_has_subscript(t) for t in target.elts)
    return False


def _call_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _check_node(node: ast.AST, func: ast.FunctionDef, al: _Aliases) -> list[tuple[int, str, str]]:
    out: list[tuple[int, str, str]] = []
    line = getattr(node, "lineno", func.lineno)
    if isinstance(node, ast.Compare) and any(
        isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops
    ):
        out.append(
            (line, "is-compare", "'is'/'is not' is rejected by the NKI compiler; use == / !=")
        )
    if node is not func and isinstance(node, _NESTED):
        kind = "lambda" if isinstance(node, ast.Lambda) else type(node).__name__
        out.append((line, "nested-function", f"nested {kind}; move it to module level"))
    if isinstance(node, _COMPREHENSIONS):
        out.append((line, "comprehension", f"{type(node).__name__} is not accepted; write a loop"))
    if isinstance(node, (ast.Assign, ast.For)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            if isinstance(t, (ast.Tuple, ast.List)) and _has_subscript(t):
                out.append(
                    (
                        line,
                        "subscript-unpack",
                        "subscript target in tuple unpacking; assign one by one",
                    )
                )
    if (
        (isinstance(node, ast.Attribute) and node.attr == "float64")
        or (isinstance(node, ast.Name) and node.id == "float64")
        or (isinstance(node, ast.Constant) and node.value == "float64")
    ):
        out.append((line, "float64", "float64 does not exist on NeuronCores"))
    for kind, label in _FORBIDDEN.items():
        if isinstance(node, kind):
            out.append((line, "forbidden-statement", f"'{label}' is not accepted in kernel code"))
    if isinstance(node, ast.With) and not all(
        isinstance(i.context_expr, ast.Call)
        and isinstance(i.context_expr.func, ast.Attribute)
        and i.context_expr.func.attr == "no_reorder"
        and _module_of(i.context_expr.func.value, al) == "nl"
        for i in node.items
    ):
        out.append(
            (line, "forbidden-statement", "'with' is not accepted (only 'with nl.no_reorder():')")
        )
    if isinstance(node, ast.With) and _is_no_reorder(node, al):
        for inner in ast.walk(node):
            if isinstance(inner, ast.For) and _is_dynamic_range(inner.iter, al):
                out.append(
                    (
                        inner.lineno,
                        "dynamic-in-no-reorder",
                        "nl.dynamic_range loop inside 'with nl.no_reorder():' is not supported; "
                        "put the no_reorder block inside the loop body",
                    )
                )
    if isinstance(node, ast.Call):
        out.extend(_check_call(node, line, al))
    return out


def _is_no_reorder(node: ast.With, al: _Aliases) -> bool:
    return any(
        isinstance(i.context_expr, ast.Call)
        and isinstance(i.context_expr.func, ast.Attribute)
        and i.context_expr.func.attr == "no_reorder"
        and _module_of(i.context_expr.func.value, al) == "nl"
        for i in node.items
    )


def _is_dynamic_range(node: ast.expr, al: _Aliases) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "dynamic_range"
        and _module_of(node.func.value, al) == "nl"
    )


def _check_call(node: ast.Call, line: int, al: _Aliases) -> list[tuple[int, str, str]]:
    out = []
    name = _call_name(node)
    exempt_pos = _PATTERN_ARG.get(name)
    for i, arg in enumerate(node.args):
        if isinstance(arg, ast.List) and i != exempt_pos:
            out.append(
                (line, "list-argument", f"list literal passed to {name or 'a call'}(); use a tuple")
            )
    for kw in node.keywords:
        if isinstance(kw.value, ast.List) and not (kw.arg == "pattern" and name in _PATTERN_ARG):
            out.append(
                (
                    line,
                    "list-argument",
                    f"list literal passed as {kw.arg}= to {name}(); use a tuple",
                )
            )
    if isinstance(node.func, ast.Attribute):
        module = _module_of(node.func.value, al)
        if module == "nl" and node.func.attr not in ALLOWED_NL_CALLS:
            out.append(
                (
                    line,
                    "not-in-subset",
                    f"nl.{node.func.attr}() is an experimental 0.3.0 wrapper or "
                    "outside the emulated subset; use nisa instructions",
                )
            )
        if module == "nisa" and node.func.attr not in ALLOWED_NISA_CALLS:
            out.append(
                (
                    line,
                    "not-in-subset",
                    f"nisa.{node.func.attr}() is not implemented by the emulator",
                )
            )
    return out


def lint_source(source: str, filename: str = "<string>") -> list[str]:
    """Lint kernel source; returns one message per violation (empty when clean)."""
    tree = ast.parse(source, filename=filename)
    al = _Aliases(tree)
    found: list[tuple[int, str, str, str]] = []
    for name, line in al.from_nl:
        if name not in ALLOWED_NL_CALLS and not name[:1].isupper() and name not in _NON_CALL_NAMES:
            found.append(
                (
                    line,
                    "not-in-subset",
                    f"'from nki.language import {name}' (experimental wrapper)",
                    "<module>",
                )
            )
    for func in checked_functions(tree):
        if func.args.kwonlyargs:
            found.append(
                (
                    func.lineno,
                    "kwonly-params",
                    "keyword-only parameters ('*' separator) are rejected by the NKI compiler",
                    func.name,
                )
            )
        for node in ast.walk(func):
            found.extend(
                (ln, rule, msg, func.name) for ln, rule, msg in _check_node(node, func, al)
            )
    found = sorted(set(found))
    return [f"{filename}:{ln}: [{rule}] {msg} (in {fn})" for ln, rule, msg, fn in found]


def lint_paths(paths: Iterable[str | Path]) -> list[str]:
    """Lint files and directories (``*.py`` files of a directory, recursively, sorted)."""
    messages: list[str] = []
    for path in paths:
        path = Path(path)
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            messages.extend(lint_source(file.read_text(), str(file)))
    return messages
