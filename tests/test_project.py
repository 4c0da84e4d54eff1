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


def test_end_to_end_report_takes_medians_and_ratios():
    """The end-to-end table of the benchmark report (both programs' whole jobs): medians of the
    repetitions, ratios PySCF / dfmp2, the energy spread over all runs; a failed run is left out
    and named."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks/report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)

    def run(wall, scf, mp2, energy, cycles=10):
        return {"wall_s": wall, "scf_s": scf, "mp2_s": mp2, "e_tot": energy,
                "scf_cycles": cycles}

    row = {"name": "water16", "basis": "cc-pvdz", "coretype": "pyscf-Haswell",
           "dfmp2": [run(30, 20, 8, -1.0), run(32, 21, 9, -1.0), run(90, 80, 9, -1.0)],
           "pyscf": [run(45, 30, 12, -1.0 + 3e-10, 11), {"error": "timed out after 9 s"},
                     run(47, 31, 14, -1.0, 11)]}
    summary = report.e2e_summary(row)
    assert summary["runs"] == 2 and summary["errors"] == ["timed out after 9 s"]
    assert summary["dfmp2_wall_s"] == 32 and summary["pyscf_wall_s"] == 46
    assert summary["ratio_scf_s"] == 30.5 / 21 and summary["ratio_mp2_s"] == 13 / 9
    assert abs(summary["energy_spread"] - 3e-10) < 1e-15
    table = "\n".join(report.e2e_table([row]))
    assert "| water16 | cc-pvdz | pyscf-Haswell | fp64 | 2 | 32.00 | 46.00 | 1.44 |" in table
    # a second dfmp2 SCF precision: its own line against the same PySCF runs
    row["dfmp2 mixed"] = [run(28, 18, 8, -1.0 - 6e-10), run(29, 18, 9, -1.0 - 6e-10)]
    mixed = report.e2e_summary(row, "dfmp2 mixed")
    assert mixed["runs"] == 2 and mixed["dfmp2_scf_s"] == 18 and mixed["pyscf_scf_s"] == 30.5
    assert abs(mixed["energy_spread"] - 9e-10) < 1e-15
    assert report.e2e_summary(row)["dfmp2_wall_s"] == 32  # the fp64 line is unchanged
    lines = "\n".join(report.e2e_table([row])).splitlines()
    assert [line.split(" | ")[3] for line in lines[2:]] == ["fp64", "mixed"]
    assert "| mixed | 2 | 28.50 | 46.00 | 1.61 |" in lines[3]


def test_the_harness_records_and_reports_the_first_touch_of_new_memory():
    """The GEMM worker's record holds the seconds to write new memory once and again right
    after freeing it (a VM that hands freed memory to its host makes the first slow), and the
    report's machine section states them per setting."""
    import importlib.util

    def load(name):
        spec = importlib.util.spec_from_file_location(f"bench_{name}",
                                                      ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    touch = load("machine").first_touch(gib=1 / 64)
    assert touch["gib"] == 1 / 64 and touch["new_s"] > 0 and touch["again_s"] > 0
    gemm = {"pyscf-Haswell": {"blas": {}, "first_touch": {"gib": 1, "new_s": 2.345,
                                                            "again_s": 0.151}}}
    info = {"cpu": "x", "cores": 2, "python": "3", "torch_threads": 2, "versions": {},
            "env": {}}
    lines = load("report").blas_lines(gemm, info)
    assert ("- [pyscf-Haswell] first touch of 1 GiB (a new numpy array written once, one "
            "thread): 2.35 s, then 0.15 s for the next one allocated right after it was "
            "freed") in lines
    assert not any("first touch" in line for line in load("report").blas_lines(
        {"unset": {"blas": {}}}, info))  # older records have none
