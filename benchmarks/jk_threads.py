"""The SCF's J/K build by thread count: dfmp2's against one worker per thread.

    python3 benchmarks/jk_threads.py --molecules water16,C20H42 --name jk-threads-xeon16

Why: on 16 cores (docs/performance.md, "End to end on 16 cores") dfmp2's J/K build ran at
32-45% of the DGEMM rate, against 65-78% on 2 cores. Its products, ``Y = C^T B^Q`` (M = nocc)
and ``Y^T Y`` (an n x n result), each run on all the BLAS threads, with numpy work on one
thread between them: the shapes that kept the pair step from scaling until each of its
workers ran its own GEMMs on one BLAS thread. This script measures whether the same remedy
helps J/K, before anything changes in ``dfmp2/jk.py``.

Per molecule (cc-pVDZ, PySCF's JK-fit partner basis): one :class:`dfmp2.jk.DFJK` tensor held
unpacked (``--max-memory`` large enough for n x n per auxiliary function; a molecule whose
tensor is not held so is reported and skipped), and an RHF density from one diagonalisation
of the core Hamiltonian, tagged with its orbitals as PySCF's SCF driver passes it (the cost of
a build does not depend on the density's values). Then at each thread count (every core,
then 8, 4, 2 and 1 where fewer, each under :func:`dfmp2.threads.limit`), alternating,
``--repeat`` times each:

- **dfmp2:** ``DFJK.get_jk`` as an SCF cycle calls it (one pass over the tensor in blocks of
  :data:`dfmp2.jk.K_SQUARE_BLOCK`: ``Y``, J's density from ``Y``, ``vj += rho^T B``,
  ``vk += Y^T Y``);
- **workers:** a measuring prototype, not a product path (:func:`jk_workers`): the same
  products, the auxiliary functions split into :data:`LANES` fixed contiguous lanes, each
  lane's blocks of ``--sub`` functions run by one worker thread with numpy's BLAS on one
  thread (:func:`dfmp2.threads.single_threaded_numpy_blas`), each lane summing into its own J
  and K, the lanes added in their order (the same bits for any worker count).

Reported: medians, GFLOP/s of the flops every build needs (the count of
``extras.scf.jk_stats``), their share of the same process's 2048³ DGEMM rate at that count,
and the largest difference of J and K between the two. Results go to stdout and to
``benchmarks/results/<name>.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import report  # benchmarks/report.py
import run  # benchmarks/run.py, next to this script: where the xyz files are looked up
from machine import machine_info, numpy_gemm_rate

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the checkout's dfmp2, without an install

#: Fixed lanes of auxiliary functions: the most workers the prototype can use at once, and the
#: grouping of its sums, which does not depend on the worker count.
LANES = 32


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--molecules", default="water16,C20H42", help="xyz stems, comma-separated")
    p.add_argument("--molecule-dir", action="append", default=[], metavar="DIR")
    p.add_argument("--basis", default="cc-pvdz")
    p.add_argument("--threads", help="thread counts, comma-separated (default: every core, "
                   "then 8, 4, 2, 1 where fewer)")
    p.add_argument("--sub", type=int, default=8,
                   help="auxiliary functions per product of a worker (default 8)")
    p.add_argument("--repeat", type=int, default=3, help="builds of each kind per count")
    p.add_argument("--max-memory", type=int, default=16000, help="MB for the fitted tensor")
    p.add_argument("--name", default="jk-threads")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    args = p.parse_args(argv)
    if args.sub < 1 or args.repeat < 1:
        p.error("--sub and --repeat must be at least 1")
    return args


def thread_counts(given: str | None) -> list[int]:
    cores = len(os.sched_getaffinity(0))
    if given:
        return [int(t) for t in given.split(",")]
    return sorted({cores, *(t for t in (8, 4, 2, 1) if t < cores)}, reverse=True)


def rhf_density(mol):
    """(D tagged with mo_coeff and mo_occ, C_occ * sqrt(2)): the core Hamiltonian's
    orbitals, doubly occupied by the molecule's electron pairs."""
    from pyscf import lib, scf

    mf = scf.RHF(mol)
    energies, coeff = mf.eig(mf.get_hcore(), mf.get_ovlp())
    occ = mf.get_occ(energies, coeff)
    c = np.ascontiguousarray(coeff[:, occ > 0] * np.sqrt(2.0))
    return lib.tag_array(c @ c.T, mo_coeff=coeff, mo_occ=occ), c


def jk_workers(square: np.ndarray, c: np.ndarray, workers: int, sub: int):
    """(vj (n, n), vk (n, n)) of D = c c^T from the unpacked tensor ``square`` (naux, n, n):
    the module docstring's prototype, on ``workers`` threads."""
    from dfmp2.threads import single_threaded_numpy_blas

    naux, n, _ = square.shape
    r = c.shape[1]
    bounds = np.linspace(0, naux, LANES + 1).astype(int)
    vj = np.zeros((LANES, n * n))
    vk = np.zeros((LANES, n, n))
    c_t = np.ascontiguousarray(c.T)
    c_cols = c_t[:, :, None]  # (r, n, 1)

    def lane(k: int) -> None:
        for q0 in range(bounds[k], bounds[k + 1], sub):
            q = min(q0 + sub, bounds[k + 1]) - q0
            block = square[q0:q0 + q]
            y = c_t @ block.reshape(q * n, n).T  # (r, q*n): Y[i, (Q, mu)]
            rho = np.matmul(y.reshape(r, q, n), c_cols)[:, :, 0].sum(axis=0)  # (q,)
            vj[k] += rho @ block.reshape(q, n * n)
            rows = y.reshape(r * q, n)
            vk[k] += rows.T @ rows

    with single_threaded_numpy_blas():
        if workers <= 1:
            for k in range(LANES):
                lane(k)
        else:
            with ThreadPoolExecutor(min(workers, LANES)) as pool:
                list(pool.map(lane, range(LANES)))
    total_j, total_k = np.zeros(n * n), np.zeros((n, n))
    for k in range(LANES):  # in the lanes' order: the same sums whatever the workers
        total_j += vj[k]
        total_k += vk[k]
    return total_j.reshape(n, n), total_k


def measure(name: str, path: str, basis: str, max_memory: int, counts: list[int], sub: int,
            repeat: int) -> dict:
    from pyscf import df, gto

    from dfmp2 import threads
    from dfmp2.jk import DFJK
    from dfmp2.linalg import Dispatcher, DispatchPolicy

    mol = gto.M(atom=path, basis=basis, verbose=0)
    auxbasis = df.make_auxbasis(mol, mp2fit=False)
    la = Dispatcher(DispatchPolicy("pytorch"))
    dfjk = DFJK(mol, auxbasis, la)
    dfjk.max_memory = max_memory
    start = time.perf_counter()
    dfjk.build()
    out = {"molecule": name, "basis": basis, "nao": mol.nao_nr(), "naux": dfjk.get_naoaux(),
           "cpu_blas": la.cpu_blas.choice, "tensor_build_s": time.perf_counter() - start,
           "sub": sub, "lanes": LANES, "rows": []}
    if not dfjk.square_only:
        out["skipped"] = (f"the tensor is not held unpacked whole under --max-memory "
                          f"{max_memory} ({dfjk.describe()})")
        return out
    dm, c = rhf_density(mol)
    out["nocc"] = c.shape[1]
    for count in counts:
        with threads.limit(count):
            rate = numpy_gemm_rate(2048)["median"] * 1e9
            mine, theirs, flops = [], [], None
            for _ in range(repeat):
                before = dict(dfjk.stats)
                start = time.perf_counter()
                vj, vk = dfjk.get_jk(dm)
                mine.append(time.perf_counter() - start)
                flops = dfjk.stats["flops"] - before["flops"]
                start = time.perf_counter()
                wj, wk = jk_workers(dfjk.square, c, count, sub)
                theirs.append(time.perf_counter() - start)
        row = {"threads": count, "dgemm_gflops": rate / 1e9, "gflop": flops / 1e9,
               "dfmp2_s": statistics.median(mine), "workers_s": statistics.median(theirs),
               "max_abs_dj": float(np.abs(np.asarray(vj).reshape(wj.shape) - wj).max()),
               "max_abs_dk": float(np.abs(np.asarray(vk).reshape(wk.shape) - wk).max())}
        for key in ("dfmp2", "workers"):
            row[f"{key}_share"] = flops / row[f"{key}_s"] / rate
        out["rows"].append(row)
        print(f"{name} threads {count}: dfmp2 {row['dfmp2_s']:.3f} s, workers "
              f"{row['workers_s']:.3f} s", file=sys.stderr, flush=True)
    return out


def markdown(spec: dict, results: list[dict]) -> str:
    lines = [f"# dfmp2 J/K by thread count `{spec['name']}`", "",
             f"Command: `{spec['command']}`  ",
             f"CPU: {spec['machine']['cpu']}; {spec['machine']['affinity_cores']} cores. "
             "dfmp2: `DFJK.get_jk`; workers: the measuring prototype of "
             "`benchmarks/jk_threads.py` (one worker per thread, each product on one BLAS "
             "thread). Medians; % of the 2048³ numpy DGEMM at the same thread count.", ""]
    for res in results:
        head = (f"## {res['molecule']} {res['basis']} (nao {res['nao']}, naux {res['naux']}; "
                f"products through {res['cpu_blas']}; worker blocks of {res['sub']}, "
                f"{res['lanes']} lanes)")
        if "skipped" in res:
            lines += [head, "", f"Skipped: {res['skipped']}.", ""]
            continue
        lines += [head, "", f"{res['rows'][0]['gflop']:.1f} GFLOP per build "
                  f"(nocc {res['nocc']}).", "",
                  "| threads | DGEMM GFLOP/s | dfmp2 s (% DGEMM) | workers s (% DGEMM) | "
                  "dfmp2 / workers | max abs dJ | max abs dK |", "|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            lines.append(f"| {r['threads']} | {r['dgemm_gflops']:.0f} | {r['dfmp2_s']:.3f} "
                         f"({100 * r['dfmp2_share']:.0f}%) | {r['workers_s']:.3f} "
                         f"({100 * r['workers_share']:.0f}%) | "
                         f"{r['dfmp2_s'] / r['workers_s']:.2f} | {r['max_abs_dj']:.1e} | "
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
                       args.sub, args.repeat) for name in args.molecules.split(",")]
    report.save(args.out_dir, args.name, markdown(spec, results),
                {"spec": spec, "results": results}, echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
