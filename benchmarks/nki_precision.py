"""Precision of the reduced-precision paths on a molecule ladder: E(corr) of the nki backend
through dfmp2's emulator (fp32 pair-kernel products, and the bf16x3 split) and of the pytorch
backend with ``precision`` mixed and fp32, against the fp64 PyTorch run on the same SCF
(cc-pVDZ, cc-pVDZ-RI). Precision only: the emulator says nothing about speed.

    python3 benchmarks/nki_precision.py                       # water, water4, benzene, water8
    python3 benchmarks/nki_precision.py --molecules water,caffeine --name nki-precision-r3

Writes ``benchmarks/results/<name>.json`` and ``.md``; the exit status is 1 if any energy is
1e-5 Eh or more away from fp64 (the package's fp32 promise), or farther than the error the
run's summary claims (``Result.precision_error``: the decimals it prints).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from run import provenance, provenance_line  # benchmarks/run.py, next to this script

ROOT = Path(__file__).resolve().parent.parent
MOLECULE_DIRS = (ROOT / "inputs", ROOT / "benchmarks" / "molecules")
BUDGET_EH = 1e-5


def _xyz(stem: str) -> Path:
    for folder in MOLECULE_DIRS:
        path = folder / f"{stem}.xyz"
        if path.exists():
            return path
    raise SystemExit(f"error: no {stem}.xyz in {', '.join(str(d) for d in MOLECULE_DIRS)}")


def measure(stem: str) -> dict:
    """E(corr) of fp64 PyTorch and of the emulated nki backend (fp32, bf16x3) on one SCF."""
    from pyscf import scf

    import dfmp2
    from dfmp2.molecule import build_mole

    mol = build_mole(_xyz(stem))
    mf = scf.RHF(mol).density_fit()
    mf.conv_tol = 1e-10
    mf.verbose = 0
    mf.kernel()
    ref = dfmp2.DFMP2(mf, backend="pytorch").run()
    row = {"molecule": stem, "nbasis": mol.nao_nr(), "nocc": ref.result.sizes.nocc,
           "nvir": ref.result.sizes.nvir, "naux": ref.result.sizes.naux,
           "e_corr_fp64": ref.e_corr}
    runs = {}
    for matmul in ("fp32", "bf16x3"):
        start = time.perf_counter()
        runs[matmul] = dfmp2.DFMP2(mf, backend="nki", nki_emulator=True, require_nki=True,
                                   nki_matmul=matmul).run()
        row[f"emulator_seconds_{matmul}"] = round(time.perf_counter() - start, 1)
    for precision in ("mixed", "fp32"):
        runs[f"pytorch_{precision}"] = dfmp2.DFMP2(mf, backend="pytorch",
                                                   precision=precision).run()
    for key, run in runs.items():
        row[f"e_corr_{key}"] = run.e_corr
        row[f"error_{key}"] = run.e_corr - ref.e_corr
        row[f"claimed_{key}"] = run.result.precision_error
        row[f"stages_{key}"] = {s: r["placement"]
                                for s, r in run.result.method.stage_precision.items()}
    return row


#: The runs of a row, as the table heads them.
RUNS = {"fp32": "nki fp32", "bf16x3": "nki bf16x3", "pytorch_mixed": "pytorch mixed",
        "pytorch_fp32": "pytorch fp32"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--molecules", default="water,water4,benzene,water8")
    parser.add_argument("--name", default="nki-precision-r2")
    args = parser.parse_args(argv)
    rows = []
    for stem in args.molecules.split(","):
        print(f"{stem} ...", file=sys.stderr, flush=True)
        rows.append(measure(stem))
    report = {"kind": "nki-precision",
              **provenance("nki_precision.py", sys.argv[1:] if argv is None else argv),
              "basis": "cc-pvdz", "auxbasis": "cc-pvdz-ri", "rows": rows}
    out = ROOT / "benchmarks" / "results"
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = ["| molecule | nbasis | nocc | nvir | naux | E(corr) fp64 | "
             + " | ".join(f"{head} - fp64 (claimed)" for head in RUNS.values()) + " |",
             "|---|---|---|---|---|---|" + "---|" * len(RUNS)]
    for r in rows:
        lines.append(f"| {r['molecule']} | {r['nbasis']} | {r['nocc']} | {r['nvir']} | "
                     f"{r['naux']} | {r['e_corr_fp64']:.10f} | "
                     + " | ".join(f"{r[f'error_{key}']:+.1e} ({r[f'claimed_{key}']:.0e})"
                                  for key in RUNS) + " |")
    table = "\n".join(lines)
    (out / f"{args.name}.md").write_text(
        "# Reduced-precision paths (E(corr), Eh; cc-pVDZ / cc-pVDZ-RI): NKI on the emulator, "
        f"PyTorch mixed and fp32\n\n{provenance_line(report)} Accuracy only: the emulator's "
        "times mean nothing.\n\nEach error against the fp64 PyTorch run on the same SCF; "
        "in parentheses the error the run's summary claims (`Result.precision_error`), which "
        "sets the decimals it prints.\n\n" + table + "\n")
    print(table)
    worst = max(abs(r[f"error_{key}"]) for r in rows for key in RUNS)
    beyond = [(r["molecule"], key) for r in rows for key in RUNS
              if abs(r[f"error_{key}"]) > r[f"claimed_{key}"]]
    for molecule, key in beyond:
        print(f"error: {molecule} {RUNS[key]}: beyond the error its summary claims",
              file=sys.stderr)
    return 0 if worst < BUDGET_EH and not beyond else 1


if __name__ == "__main__":
    sys.exit(main())
