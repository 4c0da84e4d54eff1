"""Precision of the NKI path on a molecule ladder, through dfmp2's emulator: E(corr) of the nki
backend with fp32 pair-kernel products and with the bf16x3 split, against the fp64 PyTorch run
on the same SCF (cc-pVDZ, cc-pVDZ-RI). Precision only: the emulator says nothing about speed.

    python3 benchmarks/nki_precision.py                       # water, water4, benzene, water8
    python3 benchmarks/nki_precision.py --molecules water,caffeine --name nki-precision-r2

Writes ``benchmarks/results/<name>.json`` and ``.md``; the exit status is 1 if any nki energy
is 1e-5 Eh or more away from fp64 (the package's fp32 promise).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

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
    for matmul in ("fp32", "bf16x3"):
        start = time.perf_counter()
        run = dfmp2.DFMP2(mf, backend="nki", nki_emulator=True, require_nki=True,
                          nki_matmul=matmul).run()
        row[f"e_corr_{matmul}"] = run.e_corr
        row[f"error_{matmul}"] = run.e_corr - ref.e_corr
        row[f"emulator_seconds_{matmul}"] = round(time.perf_counter() - start, 1)
        placements = {s: r["placement"] for s, r in run.result.method.stage_precision.items()}
        row[f"stages_{matmul}"] = placements
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--molecules", default="water,water4,benzene,water8")
    parser.add_argument("--name", default="nki-precision-r1")
    args = parser.parse_args(argv)
    rows = []
    for stem in args.molecules.split(","):
        print(f"{stem} ...", file=sys.stderr, flush=True)
        rows.append(measure(stem))
    report = {"kind": "nki-precision", "basis": "cc-pvdz", "auxbasis": "cc-pvdz-ri",
              "machine": platform.processor() or platform.machine(), "rows": rows}
    out = ROOT / "benchmarks" / "results"
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = ["| molecule | nbasis | nocc | nvir | naux | E(corr) fp64 | fp32 - fp64 | "
             "bf16x3 - fp64 |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['molecule']} | {r['nbasis']} | {r['nocc']} | {r['nvir']} | "
                     f"{r['naux']} | {r['e_corr_fp64']:.10f} | {r['error_fp32']:+.1e} | "
                     f"{r['error_bf16x3']:+.1e} |")
    table = "\n".join(lines)
    (out / f"{args.name}.md").write_text(
        "# NKI precision on the emulator (E(corr), Eh; cc-pVDZ / cc-pVDZ-RI)\n\n" + table + "\n")
    print(table)
    worst = max(abs(r[f"error_{m}"]) for r in rows for m in ("fp32", "bf16x3"))
    return 0 if worst < BUDGET_EH else 1


if __name__ == "__main__":
    sys.exit(main())
