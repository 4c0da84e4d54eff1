"""Peak memory of dfmp2's DF-MP2 step under ``--max-memory`` limits.

    python3 benchmarks/memory.py --molecule water16 --limits 4000,300,150

Builds the DF-RHF once, then for each limit (largest first) resets the process's peak-RSS mark
(``/proc/self/clear_refs``), runs ``dfmp2.DFMP2(mf, max_memory=limit)`` and reports how far the
peak rose above the resident set before the call, next to the limit, the planner's blocks and
the energy difference from the first (largest-limit) run. Results go to stdout and to
``benchmarks/results/<name>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import report  # benchmarks/report.py
import run  # benchmarks/run.py, next to this script: where the xyz files are looked up
import worker  # benchmarks/worker.py: SCF builder and RSS helpers

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--molecule", default="water16",
                   help="xyz stem, looked up as by run.py (--molecule-dir, inputs/, "
                        "benchmarks/molecules/)")
    p.add_argument("--molecule-dir", action="append", default=[], metavar="DIR",
                   help="folder of xyz files searched first (repeatable)")
    p.add_argument("--basis", default="cc-pvdz")
    p.add_argument("--limits", default="4000,300,150", help="MB, comma-separated")
    p.add_argument("--precision", default="fp64")
    p.add_argument("--name", default="memory")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    return p.parse_args(argv)


def warm_up() -> None:
    """dfmp2's first run in a process imports torch and the pipeline and starts the BLAS
    threads (about 150 MiB of peak RSS): done on water in STO-3G before any measured call, in
    core and out of core (h5py), so that each row's peak rise is its DF-MP2 call's alone."""
    from pyscf import gto, scf

    import dfmp2

    mol = gto.M(atom="O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59", basis="sto-3g", verbose=0)
    mf = scf.RHF(mol).run(conv_tol=1e-10)
    for outcore in (False, True):
        dfmp2.DFMP2(mf, auxbasis="cc-pvdz-ri", force_outcore=outcore).run()


def measure(mf, limit: int, precision: str) -> dict:
    import dfmp2
    from dfmp2.buffers import return_freed_memory

    return_freed_memory()  # the last call's freed heap would otherwise serve this one unseen
    if not worker.reset_peak_rss():
        raise SystemExit("cannot reset the peak-RSS mark (/proc/self/clear_refs is not writable)")
    before = worker.current_rss_mb()
    start = time.perf_counter()
    pt = dfmp2.DFMP2(mf, auxbasis=f"{mf.mol.basis}-ri", max_memory=limit,
                     precision=precision).run()
    seconds = time.perf_counter() - start
    rise = worker.peak_rss_mb() - before
    blocks = pt.result.method.blocks
    return {"limit_mb": limit, "rss_before_mb": before, "peak_rise_mb": rise,
            "over_limit_mb": rise - limit, "seconds": seconds, "blocks": blocks,
            "e_corr": pt.e_corr, "cpu_blas": pt.result.backend.cpu_blas["choice"]}


def markdown(spec: dict, rows: list[dict]) -> str:
    ref = rows[0]["e_corr"]
    lines = [f"# dfmp2 memory benchmark `{spec['name']}`", "",
             run.provenance_line(spec) + "  ",
             f"{spec['molecule']} {spec['basis']} ({spec['nbasis']} basis functions), "
             f"precision {spec['precision']}, SCF peak RSS {spec['scf_peak_mb']:.0f} MiB; "
             "peak rise = peak RSS of the DF-MP2 call minus the RSS before it.", "",
             "| max_memory MB | B storage | aux block | fit occ | occ block | resident MB | "
             "peak rise MiB | over the limit MiB | s | E(corr) - first row (Eh) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        b = r["blocks"]
        lines.append(f"| {r['limit_mb']} | {b['storage']} | {b['aux_block']} | {b['fit_occ']} | "
                     f"{b['occ_block']} | {b['resident_mb']} | {r['peak_rise_mb']:.0f} | "
                     f"{max(0.0, r['over_limit_mb']):.0f} | {r['seconds']:.1f} | "
                     f"{r['e_corr'] - ref:.1e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    limits = sorted((int(x) for x in args.limits.split(",")), reverse=True)
    path = run.find_xyz(args.molecule, run.molecule_dirs(args.molecule_dir))
    mf = worker.build_scf(path, args.basis, 1e-10)
    spec = {"name": args.name, "molecule": args.molecule, "basis": args.basis,
            "nbasis": mf.mol.nao_nr(), "precision": args.precision,
            "scf_peak_mb": worker.peak_rss_mb(), **run.provenance("memory.py", argv)}
    warm_up()
    rows = [measure(mf, limit, args.precision) for limit in limits]
    report.save(args.out_dir, args.name, markdown(spec, rows), {"spec": spec, "rows": rows},
                echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
