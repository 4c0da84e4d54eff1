"""Distributed DF-MP2 on this machine, and a model of many nodes built on what it measures.

    python3 benchmarks/distributed.py                       # water16, cc-pVDZ, 1x2 vs 2x1
    python3 benchmarks/distributed.py --molecule water12 --bandwidth-gbs 12.5,25 --name dist-r1

Measured, in one run on one machine: the same job as 1 process x 2 threads (``dfmp2 run``) and
as 2 ranks x 1 thread (``torchrun --nproc-per-node 2``, gloo): wall time, each MP2 stage's time
per rank, bytes each rank sent, each rank's share of the pairs, the energies' agreement, and
the machine's DGEMM rate at 1 and 2 threads. Modeled (``docs/distributed.md``): the MP2 step of
(H2O)100 and of 175 waters cc-pVDZ on R ranks (strong scaling) and at a fixed size per rank
(weak scaling), from the pair, fit and transform rates measured here per thread and a network
bandwidth given as a parameter. Results: ``benchmarks/results/<name>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine import cpu_model, machine_info, torch_gemm_rate  # noqa: E402
from run import find_xyz, molecule_dirs, provenance, provenance_line  # noqa: E402

#: The two cases of the issue: (H2O)100 and 175 waters in cc-pVDZ with cc-pVDZ-RI.
CASES = {
    "(H2O)100": {"nao": 2400, "nocc": 500, "nvir": 1900, "naux": 8400},
    "175 waters": {"nao": 4375, "nocc": 875, "nvir": 3500, "naux": 14700},
}
RANKS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(command: list[str], threads: int, json_path: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "OPENBLAS_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    proc = subprocess.run(command + ["--json", str(json_path), "-q"], capture_output=True,
                          text=True, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{proc.stderr[-2000:]}")
    record = json.loads(json_path.read_text())
    return {"wall_s": round(wall, 3), "record": record}


def measure(molecule: str, basis: str, extra: list[str]) -> dict:
    """The job as 1 x 2 and as 2 x 1, in this order, in one run."""
    path = str(find_xyz(molecule, molecule_dirs()))
    args = [path, "--basis", basis, *extra]
    with tempfile.TemporaryDirectory() as tmp:
        one = _run([sys.executable, "-m", "dfmp2", "run", *args], 2, Path(tmp) / "one.json")
        two = _run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
                    "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    f"127.0.0.1:{_free_port()}", "-m", "dfmp2", "run", *args], 1,
                   Path(tmp) / "two.json")
    r1, r2 = one["record"], two["record"]
    sizes = r1["extras"]["sizes"]
    dist = r2["extras"]["distributed"]
    stages = ("transform", "redistribute", "fit", "pair_energy")
    t1 = {s: r1["extras"]["timings"].get(s, 0.0) for s in stages}
    per_rank = dist["stage_seconds"]
    t2 = {s: max(rank.get(s, 0.0) for rank in per_rank) for s in stages}
    e1 = r1["properties"]["mp2_correlation_energy"]
    e2 = r2["properties"]["mp2_correlation_energy"]
    return {
        "molecule": molecule, "basis": basis, "sizes": sizes,
        "one_process_2_threads": {"wall_s": one["wall_s"], "scf_s": r1["extras"]["timings"]
                                  .get("scf"), "stages_s": t1},
        "two_ranks_1_thread": {"wall_s": two["wall_s"], "scf_s": r2["extras"]["timings"]
                               .get("scf"), "stages_s_slowest_rank": t2,
                               "stage_seconds_per_rank": per_rank,
                               "pair_shares": dist["pair_shares"],
                               "aux_shares": dist["aux_shares"],
                               "occ_shares": dist["occ_shares"],
                               "bytes_sent": dist["bytes_sent"]},
        "e_corr_difference": e2 - e1,
    }


def rates(measured: dict, gemm_1t: float) -> dict:
    """Per-thread rates of the MP2 stages, from the 2 x 1 run (one thread per rank): flops of
    each stage over its slowest rank's time, times the ranks. Pair stage: ``o(o+1)/2`` pairs of
    ``2 v^2 X`` flops; fit: ``o v X^2`` (a triangular product); transform: per auxiliary
    function, ``2 nao^2 o + 2 nao o v`` flops plus the integrals (folded into the rate)."""
    s = measured["sizes"]
    o, v, x, nao = s["nocc"], s["nvir"], s["naux"], s["nbasis"]
    t = measured["two_ranks_1_thread"]["stages_s_slowest_rank"]
    ranks = len(measured["two_ranks_1_thread"]["pair_shares"])
    flops = {"pair_energy": o * (o + 1) / 2 * 2 * v * v * x, "fit": o * v * x * x,
             "transform": x * (2 * nao * nao * o + 2 * nao * o * v)}
    out = {k: flops[k] / (t[k] * ranks) for k in flops}
    out["dgemm_1_thread"] = gemm_1t
    return out


def model(case: dict, ranks: int, rate: dict, bandwidth: float, itemsize: int = 8) -> dict:
    """Modeled seconds of each stage of the MP2 step on ``ranks`` ranks of ``rate`` (flop/s per
    rank) with ``bandwidth`` bytes/s per rank (both directions), no overlap of communication
    and computation (an upper bound), and the per-rank memory of the largest stage.

    transform and fit: their flops / ranks; redistribution: each rank sends ``(R-1)/R`` of its
    ``o v X / R`` share of ``(ia|P)`` (fp64); pairs: ``o(o+1)/2 * 2 v^2 X / R`` flops, and every
    rank receives every other slice's B once through the gathers (``o v X * itemsize * (R-1)/R``
    bytes: this scheme's volume per rank does not shrink with R; a 2-D assignment would cut it
    to about ``2 o v X itemsize / sqrt(R)``)."""
    o, v, x, nao = case["nocc"], case["nvir"], case["naux"], case["nao"]
    r = ranks
    b = o * v * x
    t = {
        "transform": x * (2 * nao * nao * o + 2 * nao * o * v) / (r * rate["transform"]),
        "redistribute": (b * 8 / r) * (r - 1) / r / bandwidth,
        "fit": o * v * x * x / (r * rate["fit"]),
        "pair_compute": o * (o + 1) / 2 * 2 * v * v * x / (r * rate["pair_energy"]),
        "pair_gather": b * itemsize * (r - 1) / r / bandwidth,
    }
    t["total"] = sum(t.values())
    # per rank: the redistribution's peak (two slices of (ia|P)), or the pair stage's B slice
    # and gather buffers: occ_block // R orbitals from every rank, at least one (with more
    # ranks than orbitals in a slice, one orbital of B from each of the R ranks)
    # (the pair blocks at their largest, 64 orbitals; one process gathers nothing)
    slice_o = math.ceil(o / r)
    block = min(slice_o, 64)
    gather = (r + 1) * max(1, block // r) * v * x * itemsize if r > 1 else 0
    t["memory_gb_per_rank"] = max(2 * slice_o * v * x * 8,
                                  slice_o * v * x * itemsize + gather) / 1e9
    return t


def modeled(rate_per_thread: dict, threads_per_rank: int, bandwidths: list[float]) -> dict:
    rate = {k: val * threads_per_rank for k, val in rate_per_thread.items()}
    out = {}
    for name, case in CASES.items():
        out[name] = {}
        for bw in bandwidths:
            rows = [{"ranks": r, **{k: round(val, 3) for k, val in
                                    model(case, r, rate, bw * 1e9).items()}} for r in RANKS]
            base = rows[0]["total"]
            for row in rows:
                row["speedup"] = round(base / row["total"], 2)
                row["efficiency"] = round(base / row["total"] / row["ranks"], 3)
            out[name][f"{bw:g} GB/s"] = rows
    # weak scaling: (H2O)n, whose pair work grows as o^2 v^2 X ~ n^5, sized so that the pair
    # work per rank stays that of (H2O)25 on one rank: n = 25 * R^(1/5)
    weak = []
    n0 = 25
    rate_rank = {k: val * threads_per_rank for k, val in rate_per_thread.items()}
    for r in RANKS:
        n = n0 * r ** 0.2
        case = {"nao": 24 * n, "nocc": 5 * n, "nvir": 19 * n, "naux": 84 * n}
        weak.append({"ranks": r, "waters": round(n, 1),
                     **{k: round(val, 3) for k, val in
                        model(case, r, rate_rank, bandwidths[0] * 1e9).items()}})
    return {"strong": out, "weak": weak}


def report(result: dict) -> str:
    m = result["measured"]
    one, two = m["one_process_2_threads"], m["two_ranks_1_thread"]
    s = m["sizes"]
    made = ([provenance_line({**result, "machine": result["machine"]["cpu"]}), ""]
            if "command" in result else [])  # (files made before it was recorded lack it)
    lines = [f"# Distributed DF-MP2: `{result['name']}`", "", *made,
             f"CPU: {result['machine']['cpu']}, {result['machine']['cores']} cores; "
             f"DGEMM {result['gemm']['1']['best']:.0f} GFLOP/s on 1 thread, "
             f"{result['gemm']['2']['best']:.0f} on 2 (torch, n=2048).", "",
             f"{m['molecule']} {m['basis']}: nocc {s['nocc']}, nvir {s['nvir']}, naux "
             f"{s['naux']}; E(corr) 2x1 minus 1x2: {m['e_corr_difference']:.1e} Eh.", "",
             "| stage (s) | 1 process x 2 threads | 2 ranks x 1 thread (slowest rank) |",
             "|---|---|---|"]
    for stage in ("transform", "redistribute", "fit", "pair_energy"):
        lines.append(f"| {stage} | {one['stages_s'].get(stage, 0.0):.2f} | "
                     f"{two['stages_s_slowest_rank'].get(stage, 0.0):.2f} |")
    lines += [f"| SCF | {one['scf_s']:.2f} | {two['scf_s']:.2f} (rank 0) |",
              f"| whole job, wall | {one['wall_s']:.2f} | {two['wall_s']:.2f} |", "",
              f"Pair shares {two['pair_shares']}, auxiliary functions {two['aux_shares']}, "
              f"MB sent per rank {[round(b / 1e6, 1) for b in two['bytes_sent']]}.", ""]
    rate = result["rates_per_thread"]
    lines += ["Per-thread rates from the 2 x 1 run (GFLOP/s): "
              + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in rate.items()), ""]
    for name, by_bw in result["model"]["strong"].items():
        for bw, rows in by_bw.items():
            lines += [f"Modeled strong scaling, {name}, {bw} per rank, "
                      f"{result['threads_per_rank']} threads of this machine per rank:", "",
                      "| ranks | total s | pair compute | pair gather | transform | fit | "
                      "redistribute | speedup | efficiency | GB per rank |",
                      "|---|---|---|---|---|---|---|---|---|---|"]
            for row in rows:
                lines.append(
                    f"| {row['ranks']} | {row['total']:.0f} | {row['pair_compute']:.0f} | "
                    f"{row['pair_gather']:.1f} | {row['transform']:.0f} | {row['fit']:.0f} | "
                    f"{row['redistribute']:.1f} | {row['speedup']} | {row['efficiency']} | "
                    f"{row['memory_gb_per_rank']:.1f} |")
            lines.append("")
    lines += ["Modeled weak scaling, (H2O)n with n = 25 R^(1/5) (the pair work per rank of "
              f"(H2O)25 on one rank), {result['bandwidths_gbs'][0]:g} GB/s per rank:", "",
              "| ranks | waters | total s | pair compute | pair gather | GB per rank |",
              "|---|---|---|---|---|---|"]
    for row in result["model"]["weak"]:
        lines.append(f"| {row['ranks']} | {row['waters']} | {row['total']:.1f} | "
                     f"{row['pair_compute']:.1f} | {row['pair_gather']:.1f} | "
                     f"{row['memory_gb_per_rank']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--molecule", default="water16")
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--name", default="distributed-r1")
    parser.add_argument("--bandwidth-gbs", default="12.5",
                        help="network bandwidths per rank for the model, GB/s, comma-separated")
    parser.add_argument("--threads-per-rank", type=int, default=32,
                        help="threads per rank of the modeled machines (rates per thread "
                             "measured here, scaled)")
    parser.add_argument("--model-only", action="store_true",
                        help="re-run the model on the measurements already in results/NAME.json")
    args = parser.parse_args()
    bandwidths = [float(b) for b in args.bandwidth_gbs.split(",")]
    out = HERE / "results" / f"{args.name}.json"
    if args.model_only:
        result = json.loads(out.read_text())
    else:
        print(f"measuring {args.molecule} as 1x2 and 2x1 ...", file=sys.stderr)
        measured = measure(args.molecule, args.basis, [])
        import torch

        gemm = {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            gemm[str(threads)] = torch_gemm_rate(2048, 2048, 2048, "float64")
        result = {"name": args.name, **provenance("distributed.py", sys.argv[1:]),
                  "machine": {**machine_info(), "cpu": cpu_model()},
                  "gemm": gemm, "measured": measured,
                  "rates_per_thread": rates(measured, gemm["1"]["best"] * 1e9)}
    result["threads_per_rank"] = args.threads_per_rank
    result["bandwidths_gbs"] = bandwidths
    result["model"] = modeled(result["rates_per_thread"], args.threads_per_rank, bandwidths)
    out.write_text(json.dumps(result, indent=1) + "\n")
    text = report(result)
    (HERE / "results" / f"{args.name}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
