"""What a newcomer relies on outside the package: the install metadata, README's two commands,
what CI runs, and benchmark code that runs on any machine."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_torch_is_not_capped_in_the_package_metadata():
    """A cap would make pip pull torch's CUDA build (GBs) or fight the user's own torch; the CPU
    wheel is README's business and CI's pin lives in .ci/constraints.txt."""
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is Python >= 3.11 only)
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    torch = re.findall(r'^\s*"(torch\b[^"]*)"', deps, re.M)
    assert len(torch) == 1 and "<" not in torch[0] and "==" not in torch[0], torch
    assert re.search(r"^torch==\S+", (ROOT / ".ci/constraints.txt").read_text(), re.M)


def test_readme_gives_the_two_commands_and_the_cpu_wheel():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    assert "python3 -m pip install -e '.[test]' && dfmp2 run inputs/water.xyz" in blocks[0]
    assert blocks[1].strip() == "python3 -m pytest"
    assert "download.pytorch.org/whl/cpu" in readme  # the CPU-only install
    assert "docs/performance.md" in readme  # figures are stated there, once


def test_ci_lints_and_runs_readmes_test_command():
    ci = (ROOT / ".ci/run").read_text()
    assert "ruff check ." in ci
    assert re.search(r"^python3 -m pytest$", ci, re.M)
    assert "constraints.txt" in ci


def test_benchmarks_name_no_machine_paths():
    """Molecules come from inputs/, benchmarks/molecules/ or --molecule-dir, never from a path
    of one machine; recorded results name libraries and commands without this machine's
    install prefix or scratch paths."""
    pattern = re.compile(r"(?<![\w.])/(root|home|work|tmp|Users)/|C:\\\\")
    files = sorted((ROOT / "benchmarks").glob("*.py"))
    files += sorted((ROOT / "benchmarks" / "results").glob("*.*"))
    for path in files:
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            assert not pattern.search(line), f"{path.name}:{number}: {line.strip()}"


def test_every_test_tolerance_is_named_in_tolerances_py():
    """House rule: tolerances live in tests/tolerances.py, named, with their reason; a literal
    literal bound elsewhere is one nobody can find when it must change."""
    pattern = re.compile(r"\b(abs|rel|rtol|atol)\s*=\s*([0-9.]+e-?[0-9]+|2\s*\*\*\s*-)")
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name == "tolerances.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
