"""The SCF's J/K build by thread count: dfmp2's lanes against its one pass.

    python3 benchmarks/jk_threads.py --molecules water16,C20H42 --name jk-threads-xeon16

Why: on 16 cores (docs/performance.md, "End to end on 16 cores") the J/K build of stop 44 ran
at 32-45% of the DGEMM rate, against 65-78% on 2 cores: its products, ``Y = C^T B^Q`` (M =
nocc) and ``Y^T Y`` (an n x n result), each ran on all the BLAS threads, with numpy work on one
thread between them. Since stop 45 the blocks of the tensor in memory run on lane workers, one
per BLAS thread, each its GEMMs on one BLAS thread (:func:`dfmp2.jk._lanes`, section
"J/K by lanes"; since stop 46 each lane also unpacks the rows kept on their AO pairs). This
script measures what the lanes give at each thread count.

Per molecule (cc-pVDZ, PySCF's JK-fit partner basis): one :class:`dfmp2.jk.DFJK` tensor built
under ``--max-memory`` (default 16000 MB: unpacked whole where that fits; under a smaller one,
e.g. the run's default 4000, some rows are kept on their AO pairs), and an RHF density from one
diagonalisation of the core Hamiltonian, tagged with its orbitals as PySCF's SCF driver passes
it (the cost of a build does not depend on the density's values). Then at each thread count
(every core, then 8, 4, 2 and 1 where fewer, each under :func:`dfmp2.threads.limit`),
alternating, ``--repeat`` times each, ``DFJK.get_jk`` as an SCF cycle calls it:

- **lanes:** as it runs (the lanes wherever numpy's BLAS has more than one thread);
- **one pass:** the same call with the lanes turned off (the code of stop 44).

Reported: medians, GFLOP/s of the flops every build needs (the count of
``extras.scf.jk_stats``), their share of the same process's 2048³ numpy DGEMM at that count,
and the largest difference of J and K between the two. Results go to stdout and to
``benchmarks/results/<name>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import report  # benchmarks/report.py
import run  # benchmarks/run.py, next to this script: where the xyz files are looked up
from machine import machine_info, numpy_gemm_rate

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the checkout's dfmp2, without an install

def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--molecules", default="water16,C20H42", help="xyz stems, comma-separated")
    p.add_argument("--molecule-dir", action="append", default=[], metavar="DIR")
    p.add_argument("--basis", default="cc-pvdz")
    p.add_argument("--threads", help="thread counts, comma-separated (default: every core, "
                   "then 8, 4, 2, 1 where fewer)")
    p.add_argument("--repeat", type=int, default=3, help="builds of each kind per count")
    p.add_argument("--max-memory", type=int, default=16000, help="MB for the fitted tensor")
    p.add_argument("--name", default="jk-threads")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    try:
        thread_counts(args.threads)
    except ValueError as exc:
        p.error(f"--threads {args.threads}: {exc}")
    return args


def thread_counts(given: str | None) -> list[int]:
    cores = len(os.sched_getaffinity(0))
    if given:
        counts = [int(t) for t in given.split(",")]  # ValueError: not whole numbers
        if min(counts) < 1:
            raise ValueError("thread counts must be at least 1")
        return counts
    return sorted({cores, *(t for t in (8, 4, 2, 1) if t < cores)}, reverse=True)


def rhf_density(mol):
    """D tagged with mo_coeff and mo_occ: the core Hamiltonian's orbitals, doubly occupied by
    the molecule's electron pairs."""
    from pyscf import lib, scf

    mf = scf.RHF(mol)
    energies, coeff = mf.eig(mf.get_hcore(), mf.get_ovlp())
    occ = mf.get_occ(energies, coeff)
    c = np.ascontiguousarray(coeff[:, occ > 0] * np.sqrt(2.0))
    return lib.tag_array(c @ c.T, mo_coeff=coeff, mo_occ=occ)


def measure(name: str, path: str, basis: str, max_memory: int, counts: list[int],
            repeat: int) -> dict:
    from pyscf import df, gto

    import dfmp2.jk
    from dfmp2 import threads
    from dfmp2.jk import DFJK, LANE_BLOCK
    from dfmp2.linalg import Dispatcher, DispatchPolicy

    mol = gto.M(atom=path, basis=basis, verbose=0)
    auxbasis = df.make_auxbasis(mol, mp2fit=False)
    la = Dispatcher(DispatchPolicy("pytorch"))
    dfjk = DFJK(mol, auxbasis, la)
    dfjk.max_memory = max_memory
    start = time.perf_counter()
    dfjk.build()
    dm = rhf_density(mol)
    out = {"molecule": name, "basis": basis, "nao": mol.nao_nr(), "naux": dfjk.get_naoaux(),
           "nocc": int((dm.mo_occ > 0).sum()), "layout": dfjk.describe(),
           "cpu_blas": la.cpu_blas.choice, "tensor_build_s": time.perf_counter() - start,
           "lane_block": LANE_BLOCK, "rows": []}
    lane_workers = dfmp2.jk._lane_workers
    try:
        for count in counts:
            times = {"lanes": [], "one pass": []}
            with threads.limit(count):
                rate = numpy_gemm_rate(2048)["median"] * 1e9
                for _ in range(repeat):
                    for kind in times:
                        dfmp2.jk._lane_workers = (lane_workers if kind == "lanes" else
                                                  lambda *args: 1)
                        before = dfjk.stats["flops"]
                        start = time.perf_counter()
                        result = dfjk.get_jk(dm)
                        times[kind].append(time.perf_counter() - start)
                        flops = dfjk.stats["flops"] - before
                        if kind == "lanes":
                            lanes = result
                        else:
                            diffs = [float(np.abs(x - y).max()) for x, y in zip(lanes, result)]
            row = {"threads": count, "dgemm_gflops": rate / 1e9, "gflop": flops / 1e9,
                   "max_abs_dj": diffs[0], "max_abs_dk": diffs[1]}
            for kind, seconds in times.items():
                key = kind.replace(" ", "_")
                row[f"{key}_s"] = statistics.median(seconds)
                row[f"{key}_share"] = flops / row[f"{key}_s"] / rate
            out["rows"].append(row)
            print(f"{name} threads {count}: lanes {row['lanes_s']:.3f} s, one pass "
                  f"{row['one_pass_s']:.3f} s", file=sys.stderr, flush=True)
    finally:
        dfmp2.jk._lane_workers = lane_workers
    return out


def markdown(spec: dict, results: list[dict]) -> str:
    lines = [f"# dfmp2 J/K by thread count `{spec['name']}`", "",
             f"Command: `{spec['command']}`  ",
             f"CPU: {spec['machine']['cpu']}; {spec['machine']['affinity_cores']} cores. "
             "`DFJK.get_jk` with its lanes (a worker per thread, each its GEMMs on one BLAS "
             "thread) and with the lanes off (one pass, every product on all the threads), "
             "alternating. Medians; % of the 2048³ numpy DGEMM at the same thread count.", ""]
    for res in results:
        lines += [f"## {res['molecule']} {res['basis']} (nao {res['nao']}, naux {res['naux']}, "
                  f"nocc {res['nocc']}; products through {res['cpu_blas']}; lane blocks of "
                  f"{res['lane_block']})", "", f"Tensor: {res['layout']}. "
                  f"{res['rows'][0]['gflop']:.1f} GFLOP per build.", "",
                  "| threads | DGEMM GFLOP/s | lanes s (% DGEMM) | one pass s (% DGEMM) | "
                  "one pass / lanes | max abs dJ | max abs dK |", "|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            lines.append(f"| {r['threads']} | {r['dgemm_gflops']:.0f} | {r['lanes_s']:.3f} "
                         f"({100 * r['lanes_share']:.0f}%) | {r['one_pass_s']:.3f} "
                         f"({100 * r['one_pass_share']:.0f}%) | "
                         f"{r['one_pass_s'] / r['lanes_s']:.2f} | {r['max_abs_dj']:.1e} | "
                         f"{r['max_abs_dk']:.1e} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    dirs = run.molecule_dirs(args.molecule_dir)
    counts = thread_counts(args.threads)
    spec = {"name": args.name, "command": "python3 benchmarks/jk_threads.py " + " ".join(argv),
            "machine": machine_info(), "threads": counts}
    results = [measure(name, run.find_xyz(name, dirs), args.basis, args.max_memory, counts,
                       args.repeat) for name in args.molecules.split(",")]
    report.save(args.out_dir, args.name, markdown(spec, results),
                {"spec": spec, "results": results}, echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
