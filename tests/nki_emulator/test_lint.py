"""The AST lint of kernel source: one negative test per rule, and the real kernels."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfmp2.nki_emulator.lint import lint_paths, lint_source

pytestmark = pytest.mark.nki_emulated

HEADER = "import nki\nimport nki.isa as nisa\nimport nki.language as nl\n\n"
KERNELS_DIR = Path(__file__).resolve().parents[2] / "dfmp2" / "kernels"


def kernel(body: str, params: str = "a") -> str:
    lines = "\n".join("    " + line for line in body.strip("\n").splitlines())
    return HEADER + f"@nki.jit\ndef k({params}):\n{lines}\n    return a\n"


def rules(source: str) -> set[str]:
    return {msg.split("[", 1)[1].split("]", 1)[0] for msg in lint_source(source, "snippet.py")}


CLEAN = """
out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
for i in nl.static_range(4):
    nisa.dma_copy(dst=t[:, nl.ds(i * 128, 128)], src=a[:, i * 128:(i + 1) * 128])
x, y = a.shape
nisa.iota(t, [[1, 512]], offset=0)
nisa.affine_select(t, pattern=[[-1, 512]], channel_multiplier=1, on_true_tile=t, on_false_value=0.0)
if x == y:
    nisa.tensor_tensor(t, t, t, op=nl.add)
with nl.no_reorder():
    nisa.dma_copy(dst=out, src=t)
n = nisa.register_alloc(4)
nisa.register_move(n, 2)
for i in nl.dynamic_range(n):
    nisa.dma_copy(dst=t, src=a.ap([[512, 128], [1, 512]], scalar_offset=i, indirect_dim=0))
    nisa.dma_copy(dst=out.ap(pattern=[[512, 128], [1, 512]], scalar_offset=i), src=t)
    with nl.no_reorder():
        nisa.register_store(t[0:1, 0:1], i)
"""


def test_clean_kernel_passes():
    assert lint_source(kernel(CLEAN), "clean.py") == []


@pytest.mark.parametrize(
    "body, rule",
    [
        ("if a is None:\n    pass", "is-compare"),
        ("if a is not None:\n    pass", "is-compare"),
        ("nisa.memset(a, [0.0])", "list-argument"),
        ("nisa.tensor_copy(dst=a, src=[a])", "list-argument"),
        ("def inner(x):\n    return x", "nested-function"),
        ("f = lambda x: x", "nested-function"),
        ("xs = [i for i in range(3)]", "comprehension"),
        ("s = sum(i for i in range(3))", "comprehension"),
        ("d = {i: i for i in range(3)}", "comprehension"),
        ("t = (1, 2)\nt[0], b = 1, 2", "subscript-unpack"),
        ("for t[0], b in ((1, 2),):\n    pass", "subscript-unpack"),
        ("t = nl.ndarray((4, 4), dtype=nl.float64, buffer=nl.sbuf)", "float64"),
        ("t = nl.ndarray((4, 4), dtype='float64', buffer=nl.sbuf)", "float64"),
        ("x = nl.load(a)", "not-in-subset"),
        ("nl.store(a, a)", "not-in-subset"),
        ("c = nl.matmul(a, a, transpose_x=True)", "not-in-subset"),
        ("c = nl.multiply(a, a)", "not-in-subset"),
        ("nisa.dma_transpose(a, a)", "not-in-subset"),
        ("try:\n    pass\nexcept Exception:\n    pass", "forbidden-statement"),
        ("with open('f') as f:\n    pass", "forbidden-statement"),
        ("yield a", "forbidden-statement"),
        ("global G", "forbidden-statement"),
        ("with nl.no_reorder():\n    for i in nl.dynamic_range(4):\n        pass",
         "dynamic-in-no-reorder"),
    ],
)
def test_each_rule_fires(body, rule):
    assert rule in rules(kernel(body))


def test_keyword_only_parameters():
    assert "kwonly-params" in rules(kernel("pass", params="a, *, b=1"))


def test_experimental_import_is_flagged():
    assert "not-in-subset" in rules(HEADER + "from nki.language import load\n")


def test_helpers_called_from_kernels_are_checked_and_host_code_is_not():
    source = HEADER + (
        "def helper(x):\n    return [v for v in x]\n\n"
        "@nki.jit\ndef k(a):\n    helper(a)\n    return a\n\n"
        "def host(arrays):\n    return [k(x) for x in arrays if x is not None]\n"
    )
    messages = lint_source(source, "m.py")
    assert len(messages) == 1 and "(in helper)" in messages[0]


def test_a_helper_composed_only_of_helpers_is_checked():
    """A helper that calls device helpers but no nisa/nl itself (and is called from a kernel in
    another module) is device code too."""
    source = HEADER + (
        "def tile_helper(t):\n    nisa.memset(t, 0.0)\n\n"
        "def composed(t):\n    if t is None:\n        return t\n    tile_helper(t)\n\n"
        "def host(x):\n    return [v for v in x]\n")
    messages = lint_source(source, "snippet.py")
    assert len(messages) == 1 and "(in composed)" in messages[0] and "is-compare" in messages[0]


def test_device_helpers_without_kernel_are_checked():
    source = HEADER + "def tile_helper(t):\n    if t is None:\n        nisa.memset(t, 0.0)\n"
    assert rules(source) == {"is-compare"}


def test_modules_without_nki_are_not_checked():
    assert lint_source("def f(x):\n    return [y for y in x if y is not None]\n") == []


def test_messages_name_file_line_rule_and_function():
    (message,) = lint_source(kernel("if a is None:\n    pass"), "kern.py")
    assert message.startswith("kern.py:7: [is-compare]") and message.endswith("(in k)")


def test_lint_paths_reads_files_and_directories(tmp_path):
    (tmp_path / "good.py").write_text(kernel(CLEAN))
    (tmp_path / "bad.py").write_text(kernel("x = nl.load(a)"))
    messages = lint_paths([tmp_path])
    assert len(messages) == 1 and "bad.py" in messages[0]
    assert lint_paths([tmp_path / "good.py"]) == []


def test_dfmp2_kernels_pass_the_lint():
    assert KERNELS_DIR.is_dir(), f"{KERNELS_DIR} is missing"
    files = sorted(KERNELS_DIR.glob("*.py"))
    messages = lint_paths(files)
    assert messages == [], "\n".join(messages)
