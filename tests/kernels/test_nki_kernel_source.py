"""Static checks of the kernel source against the NKI 0.3.0 compiler's Python subset and the
API subset we allow ourselves (nki.isa instructions, nl.ndarray allocations, plain loops).

The official simulator runs any Python, so these rules are checked here, from the AST."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

KERNEL_DIR = Path(importlib.util.find_spec("dfmp2.kernels").origin).parent
KERNEL_FILES = ["gemm.py", "trsm.py", "mp2_energy.py"]
#: Device-side helpers the kernels call (traced inline); held to the same rules as the kernels.
BLOCKS_FILE = "_blocks.py"

#: nki.isa instructions the kernels may issue.
ALLOWED_ISA = {"nc_matmul", "nc_transpose", "dma_copy", "tensor_copy", "tensor_tensor",
               "tensor_scalar", "reciprocal", "tensor_reduce", "memset", "activation"}
#: nki.language names the kernels may call (allocation, loops and the SPMD program queries;
#: no experimental wrappers).
ALLOWED_NL_CALLS = {"ndarray", "static_range", "dynamic_range", "program_ndim", "num_programs",
                    "program_id"}
#: Tensor methods the kernels may call: the 0.3.0 access pattern (dynamic DMA by a register).
TENSOR_METHODS = {"ap"}
#: Plain Python calls the compiler resolves at trace time.
ALLOWED_BUILTINS = {"min"}
FORBIDDEN_NODES = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda,
                   ast.Try, ast.With, ast.Global, ast.Nonlocal, ast.Yield, ast.YieldFrom,
                   ast.AsyncFunctionDef, ast.ClassDef)
IDENTITY = (ast.Is, ast.IsNot)


def _kernels(path: Path) -> list[ast.FunctionDef]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d) in ("nki.jit", "nki.jit()") for d in node.decorator_list):
            found.append(node)
    return found


def _helpers() -> dict[str, ast.FunctionDef]:
    """Module-level functions of the helper module ``_blocks.py``."""
    tree = ast.parse((KERNEL_DIR / BLOCKS_FILE).read_text(), filename=BLOCKS_FILE)
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _imported_helpers(path: Path) -> set[str]:
    """Names a kernel module imports from ``._blocks`` that ``_blocks.py`` defines as functions."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module == "_blocks":
            names.update(a.name for a in node.names if a.asname is None)
    return names & set(_helpers())


def _violations(kernel: ast.FunctionDef, helpers: set[str] = frozenset(),
                steps: bool = True) -> list[str]:
    """Rule violations of a kernel (``steps``: its docstring has numbered Steps) or a helper;
    plain calls other than ``min`` must name one of ``helpers``."""
    bad = []
    args = kernel.args
    if args.kwonlyargs or args.vararg or args.kwarg:
        bad.append("keyword-only, *args or **kwargs parameters")
    if not ast.get_docstring(kernel) or (steps and "Steps" not in ast.get_docstring(kernel)):
        bad.append("docstring without numbered Steps" if steps else "no docstring")
    for node in ast.walk(kernel):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, FORBIDDEN_NODES):
            bad.append(f"{type(node).__name__} at {where}")
        if isinstance(node, ast.FunctionDef) and node is not kernel:
            bad.append(f"nested def at {where}")
        if isinstance(node, ast.Compare) and any(isinstance(o, IDENTITY) for o in node.ops):
            bad.append(f"'is' comparison at {where}")
        if isinstance(node, ast.Assign):
            for target in node.targets:
                elts = target.elts if isinstance(target, ast.Tuple) else []
                if any(isinstance(e, ast.Subscript) for e in elts):
                    bad.append(f"subscript target in tuple unpacking at {where}")
        if isinstance(node, ast.Name) and node.id == "float64" or (
                isinstance(node, ast.Attribute) and node.attr == "float64"):
            bad.append(f"float64 at {where}")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                module, name = func.value.id, func.attr
                if module == "nisa" and name not in ALLOWED_ISA:
                    bad.append(f"nisa.{name} at {where}")
                elif module == "nl" and name not in ALLOWED_NL_CALLS:
                    bad.append(f"nl.{name}(...) at {where} (experimental or outside the subset)")
                elif module not in ("nisa", "nl") and name not in TENSOR_METHODS:
                    bad.append(f"call {module}.{name} at {where}")
            elif (isinstance(func, ast.Name) and func.id not in ALLOWED_BUILTINS
                  and func.id not in helpers):
                bad.append(f"call {func.id}(...) at {where}")
    return bad


@pytest.mark.parametrize("filename", KERNEL_FILES)
@pytest.mark.nki_emulated
def test_kernels_stay_in_the_compiler_subset(filename):
    kernels = _kernels(KERNEL_DIR / filename)
    assert kernels, f"no @nki.jit kernel found in {filename}"
    helpers = _imported_helpers(KERNEL_DIR / filename)
    for kernel in kernels:
        assert _violations(kernel, helpers) == [], f"{filename}:{kernel.name}"


@pytest.mark.nki_emulated
def test_block_helpers_stay_in_the_compiler_subset():
    """The helpers the kernels call obey the kernels' rules; each docstring names the memory
    space (HBM/SBUF/PSUM) of its operands."""
    helpers = _helpers()
    assert helpers, f"no helper found in {BLOCKS_FILE}"
    for name, func in helpers.items():
        assert _violations(func, set(helpers), steps=False) == [], f"{BLOCKS_FILE}:{name}"
        doc = ast.get_docstring(func)
        assert any(space in doc for space in ("HBM", "SBUF", "PSUM")), name


@pytest.mark.nki_emulated
def test_every_block_helper_is_checked_by_the_emulator_lint():
    """The emulator lint checks a module-level function only if it uses nisa/nl or is called by
    one that does; no helper may escape it."""
    from dfmp2.nki_emulator.lint import checked_functions

    tree = ast.parse((KERNEL_DIR / BLOCKS_FILE).read_text(), filename=BLOCKS_FILE)
    assert {f.name for f in checked_functions(tree)} == set(_helpers())


@pytest.mark.nki_emulated
def test_tile_constants_match_nl_tile_size(emulator_trace):
    """The host's tiling constants are the gen2/gen3 limits that nl.tile_size reports."""
    import nki.language as nl

    from dfmp2.kernels import _tiles

    assert nl.tile_size.pmax == _tiles.TILE_K
    assert nl.tile_size.gemm_stationary_fmax == _tiles.TILE_M
    assert nl.tile_size.gemm_moving_fmax == _tiles.TILE_N


@pytest.mark.nki_emulated
def test_kernels_pass_the_emulator_lint():
    """The emulator's own AST lint of the compiler subset (dfmp2.nki_emulator.lint)."""
    from dfmp2.nki_emulator.lint import lint_paths

    assert lint_paths([KERNEL_DIR / name for name in KERNEL_FILES + [BLOCKS_FILE]]) == []
