"""DF-MP2 on a CUDA device against the CPU paths of the same machine, in one run.

    python3 benchmarks/gpu.py                                  # water20, water32, water64
    python3 benchmarks/gpu.py --molecules water20 --name gpu-smoke --device cpu   # no GPU

Per molecule (cc-pVDZ, cc-pVDZ-RI): one density-fitted RHF (PySCF, every core), then the MP2
step three ways on that SCF: dfmp2 with ``--device`` (default cuda), dfmp2 on the host, and
PySCF's DF-MP2 (``with_t2=False``; the process set up as the ``dfmp2`` command sets it up,
:func:`dfmp2.blas_env.prepare_process`: PySCF's bundled OpenBLAS on Haswell kernels where it
would pick an older core, numpy's OpenBLAS on the kernels it detects). Reported: each path's
time and stage times, the host path's BLAS and pair reduction, the device's pair step in
TFLOP/s against the device's own DGEMM and SGEMM rates measured in this run (n = 8192), the
energies' differences, where B lived, and the device and CPU names. Results:
``benchmarks/results/<name>.json`` and ``.md``. Exit status 1 if an fp64 energy differs from the
host path's by 1e-10 Eh or more.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# As the dfmp2 command does, before numpy, torch and PySCF load: PySCF's bundled OpenBLAS gets
# Haswell kernels where it would pick an older core, numpy's own OpenBLAS keeps the kernels it
# detects (a global OPENBLAS_CORETYPE=Haswell would hold the host path to AVX2 on an AVX-512 CPU).
from dfmp2.blas_env import prepare_process  # noqa: E402  (imports no numerical library)

ENVIRONMENT = prepare_process("auto")
_core = ENVIRONMENT.get("pyscf_openblas_core") or {}
if _core.get("library"):  # a file name, not this machine's path, goes into the results
    _core["library"] = os.path.basename(_core["library"])

from machine import cpu_model, machine_info  # noqa: E402
from run import find_xyz, molecule_dirs, provenance, provenance_line  # noqa: E402

#: fp64 agreement of the device path with the host path (the same SCF, the same formulas).
TOL_DEVICE = 1e-10


def water_grid(n_side: int, spacing: float = 3.0, seed: int = 64) -> str:
    """xyz text of n_side^3 waters on a cubic grid (O-O ``spacing`` Angstrom), each in a
    seeded random orientation (the way benchmarks/molecules/water32.xyz was built)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    oh, angle = 0.9572, np.deg2rad(104.52)
    local = np.array([[0, 0, 0], [oh, 0, 0], [oh * np.cos(angle), oh * np.sin(angle), 0]])
    lines = []
    centre = (n_side - 1) * spacing / 2
    for i in range(n_side):
        for j in range(n_side):
            for k in range(n_side):
                q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
                origin = np.array([i, j, k]) * spacing - centre
                for symbol, xyz in zip("OHH", local @ q.T + origin):
                    lines.append(f"{symbol} {xyz[0]:14.8f} {xyz[1]:14.8f} {xyz[2]:14.8f}")
    count = n_side ** 3
    return (f"{3 * count}\n(H2O)_{count} grid {spacing} A O-O spacing, seeded random "
            f"orientations\n" + "\n".join(lines) + "\n")


def device_gemm_rates(device: str, n: int = 8192, repeat: int = 5) -> dict:
    """torch.matmul TFLOP/s on ``device`` in float64 and float32 (TF32 off), best of repeats."""
    import torch

    out = {}
    for name, dtype in (("fp64", torch.float64), ("fp32", torch.float32)):
        size = n if device != "cpu" else 2048
        a = torch.rand((size, size), dtype=dtype, device=device)
        b = torch.rand((size, size), dtype=dtype, device=device)
        best = float("inf")
        for _ in range(repeat):
            if device != "cpu":
                torch.cuda.synchronize()
            start = time.perf_counter()
            a @ b
            if device != "cpu":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        out[name] = {"n": size, "tflops": 2.0 * size ** 3 / best / 1e12}
    return out


def pair_flops(nocc: int, nvir: int, naux: int) -> float:
    """The pair step's GEMM flops: o(o+1)/2 blocks of 2 v^2 X."""
    return nocc * (nocc + 1) / 2 * 2 * nvir * nvir * naux


def measure(name: str, xyz: str, basis: str, device: str, max_memory: int) -> dict:
    from pyscf import df, gto, scf
    from pyscf.mp import dfmp2 as pyscf_dfmp2

    import dfmp2

    mol = gto.M(atom=xyz, basis=basis, verbose=0, max_memory=max_memory)
    start = time.perf_counter()
    mf = scf.RHF(mol).density_fit(auxbasis=basis + "-jkfit").run(conv_tol=1e-10)
    scf_s = time.perf_counter() - start
    row = {"molecule": name, "nbasis": mol.nao_nr(), "scf_s": round(scf_s, 2)}
    for label, where in (("device", device), ("host", "cpu")):
        start = time.perf_counter()
        pt = dfmp2.DFMP2(mf, auxbasis=basis + "-ri", device=where, max_memory=max_memory).run()
        row[label] = {"seconds": round(time.perf_counter() - start, 3),
                      "stages": pt.result.timings, "e_corr": pt.e_corr,
                      "device": pt.result.backend.device,
                      "cpu_blas": pt.result.backend.cpu_blas}
    s = pt.result.sizes
    row["sizes"] = {"nocc": s.nocc, "nvir": s.nvir, "naux": s.naux}
    pair_s = row["device"]["stages"].get("pair_energy")
    row["device_pair_tflops"] = (pair_flops(s.nocc, s.nvir, s.naux) / pair_s / 1e12
                                 if pair_s else None)
    start = time.perf_counter()
    ref = pyscf_dfmp2.DFMP2(mf)
    ref.with_df = df.DF(mol, auxbasis=basis + "-ri")
    ref.kernel(with_t2=False)
    row["pyscf"] = {"seconds": round(time.perf_counter() - start, 3), "e_corr": ref.e_corr}
    row["device_minus_host"] = row["device"]["e_corr"] - row["host"]["e_corr"]
    row["device_minus_pyscf"] = row["device"]["e_corr"] - ref.e_corr
    row["speedup_vs_pyscf"] = row["pyscf"]["seconds"] / row["device"]["seconds"]
    return row


def _host_blas(result: dict) -> str:
    """The host path's BLAS choice and pair reduction, as its record says (first row)."""
    blas = (result["rows"][0]["host"].get("cpu_blas") or {}) if result["rows"] else {}
    return (f"{blas.get('choice', '?')} BLAS ({blas.get('reason', '')}), pair reduction "
            f"{blas.get('pair_reduction', '?')}")


def report(result: dict) -> str:
    rates = result["device_gemm"]
    lines = [f"# DF-MP2 on a device: `{result['name']}`", "",
             *([provenance_line(result["provenance"]), ""] if "provenance" in result else []),
             f"Device: {result['device_name']}; CPU: {result['cpu']} ({result['cores']} cores). "
             f"Device GEMM (torch, n={rates['fp64']['n']}): DGEMM {rates['fp64']['tflops']:.1f} "
             f"TFLOP/s, SGEMM {rates['fp32']['tflops']:.1f} (TF32 off). Host path: "
             f"{_host_blas(result)}; PySCF's OpenBLAS: "
             f"{result['environment'].get('pyscf_openblas')}.", "",
             "| molecule | nbasis | o, v, X | B | device MP2 s | pair TFLOP/s (% DGEMM) | "
             "host MP2 s | PySCF DF-MP2 s | vs PySCF | E(dev) - E(host) | E(dev) - E(PySCF) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        s = row["sizes"]
        plan = (row["device"]["device"] or {}).get("plan") or {}
        tf = row["device_pair_tflops"]
        share = f"{tf:.2f} ({100 * tf / rates['fp64']['tflops']:.0f}%)" if tf else "-"
        lines.append(
            f"| {row['molecule']} | {row['nbasis']} | {s['nocc']}, {s['nvir']}, {s['naux']} | "
            f"{plan.get('b_placement', 'host')} | {row['device']['seconds']:.2f} | {share} | "
            f"{row['host']['seconds']:.2f} | {row['pyscf']['seconds']:.2f} | "
            f"{row['speedup_vs_pyscf']:.1f}x | {row['device_minus_host']:.1e} | "
            f"{row['device_minus_pyscf']:.1e} |")
    lines += ["", "Stage seconds on the device: " + "; ".join(
        f"{row['molecule']}: " + ", ".join(f"{k} {v:.2f}" for k, v in
                                           row["device"]["stages"].items())
        for row in result["rows"])]
    return "\n".join(lines)


def write(result: dict) -> str:
    """Write ``results/<name>.json`` and ``.md``; return the report's text."""
    out = HERE / "results" / f"{result['name']}.json"
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    text = report(result)
    (HERE / "results" / f"{result['name']}.md").write_text(text + "\n")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--molecules", default="water20,water32,water64")
    parser.add_argument("--basis", default="cc-pvdz")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cpu runs the script's machinery on the host (a smoke test)")
    parser.add_argument("--name", default="gpu-r1")
    parser.add_argument("--max-memory", type=int, default=4000,
                        help="MB, the same for PySCF (mol.max_memory) and dfmp2 (--max-memory)")
    args = parser.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu.py: torch sees no CUDA device here; --device cpu runs the "
                         "script's machinery on the host (a smoke test)")
    device_name = (torch.cuda.get_device_name() if args.device == "cuda"
                   else f"none (--device cpu: the host path twice, {cpu_model()})")
    result = {"name": args.name, "provenance": provenance("gpu.py", sys.argv[1:]),
              "machine": machine_info(), "cpu": cpu_model(),
              "cores": os.cpu_count(), "device_name": device_name,
              "environment": ENVIRONMENT,
              "max_memory_mb": args.max_memory,
              "device_gemm": device_gemm_rates(args.device), "rows": []}
    dirs = molecule_dirs()
    rows = result["rows"]
    for name in args.molecules.split(","):
        if name == "water64" and not any(os.path.exists(os.path.join(d, "water64.xyz"))
                                          for d in dirs):
            xyz = water_grid(4)
        else:
            xyz = Path(find_xyz(name, dirs)).read_text()
        print(f"{name} ...", file=sys.stderr)
        rows.append(measure(name, "\n".join(xyz.splitlines()[2:]), args.basis, args.device,
                            args.max_memory))
        text = write(result)  # after each molecule: a run cut short keeps what it measured
    print(text)
    if any(abs(row["device_minus_host"]) >= TOL_DEVICE for row in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
