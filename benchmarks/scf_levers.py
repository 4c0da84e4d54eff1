"""What could make the DF-SCF cheaper without changing its numbers: fewer cycles, or a screened K.

    python3 benchmarks/scf_levers.py --molecules water16,C20H42 --name scf-levers-spr

Per molecule (cc-pVDZ, PySCF's JK-fit partner basis, dfmp2's default tolerances), on one
:class:`dfmp2.jk.DFJK` tensor built once:

1. **Cycles.** PySCF's RHF driver on dfmp2's J/K from the initial guesses ``minao`` (PySCF's
   and dfmp2's default), ``atom`` and ``huckel``, from the converged 6-31G density projected
   onto the basis, with a larger DIIS space (12, 20) and with ADIIS: cycles to convergence,
   seconds, and the energy against the default's.
2. **Screening.** How much of the fitted tensor ``B^Q_{mu nu}`` a screened K could skip: AO
   functions grouped into blocks of whole atoms (one atom, or up to 40 functions), a tile
   (block a, block b) dropped when ``max_Q |B^Q_{mu nu}|`` over the tile is below a threshold;
   the kept fraction of tiles and of the n^2 area. Then K from the converged orbitals both ways:
   dense (``Y = C^T B^Q``, ``K += Y^T Y``, the product shapes of :func:`dfmp2.jk.get_jk`) and
   block-sparse at 1e-12 (per column block, ``C[kept rows]^T`` times the kept tiles; a
   measuring prototype, not a product path), seconds and the change of K and of the exchange
   energy -1/4 tr(D dK).

Results go to stdout and to ``benchmarks/results/<name>.md`` and ``.json``.
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

#: Thresholds on max |B| of a tile, and the one the block-sparse K is timed at.
THRESHOLDS = (1e-10, 1e-12, 1e-14)
SPARSE_THRESHOLD = 1e-12
#: Auxiliary functions per block of the K products (dense and block-sparse alike).
K_AUX_BLOCK = 32


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--molecules", default="water16,C20H42", help="xyz stems, comma-separated")
    p.add_argument("--molecule-dir", action="append", default=[], metavar="DIR")
    p.add_argument("--basis", default="cc-pvdz")
    p.add_argument("--repeat", type=int, default=3, help="timings of each K (median reported)")
    p.add_argument("--max-memory", type=int, default=16000, help="MB for the DF-SCF tensor")
    p.add_argument("--name", default="scf-levers")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    return p.parse_args(argv)


def _scf(mol, auxbasis, dfjk, options, variant: str, dm0=None) -> dict:
    from pyscf import scf

    mf = scf.RHF(mol).density_fit(auxbasis=auxbasis)
    mf.with_df = dfjk
    mf.conv_tol, mf.conv_tol_grad = options.conv_tol, options.resolved_conv_tol_grad
    mf.max_cycle, mf.verbose = options.max_cycle, 0
    if variant in ("atom", "huckel"):
        mf.init_guess = variant
    elif variant.startswith("diis_space="):
        mf.diis_space = int(variant.split("=")[1])
    elif variant == "adiis":
        mf.DIIS = scf.ADIIS
    cycles = []
    mf.callback = lambda env: cycles.append(env["cycle"])
    start = time.perf_counter()
    mf.kernel(dm0=dm0)
    return {"variant": variant, "cycles": len(cycles), "converged": bool(mf.converged),
            "seconds": time.perf_counter() - start, "e_tot": float(mf.e_tot), "mf": mf}


def cycles(mol, auxbasis, dfjk, options) -> tuple[list[dict], object]:
    """The cycle counts of every start and accelerator measured (module docstring); returns
    them and the default's SCF object."""
    from pyscf import gto, scf
    from pyscf.scf import addons

    rows = [_scf(mol, auxbasis, dfjk, options, v)
            for v in ("minao", "atom", "huckel", "diis_space=12", "diis_space=20", "adiis")]
    small = gto.M(atom=mol.atom, basis="6-31g", charge=mol.charge, spin=mol.spin, verbose=0)
    start = time.perf_counter()
    pre = scf.RHF(small).density_fit().run(conv_tol=1e-6, verbose=0)
    pre_seconds = time.perf_counter() - start
    dm0 = addons.project_dm_nr2nr(small, pre.make_rdm1(), mol)
    row = _scf(mol, auxbasis, dfjk, options, "6-31G projected", dm0)
    row["seconds_before"] = pre_seconds
    rows.append(row)
    default = rows[0]["mf"]
    for r in rows:
        r["de"] = r["e_tot"] - default.e_tot
        del r["mf"]
    return rows, default


def atom_blocks(mol, max_functions: int) -> list[tuple[int, int]]:
    """AO ranges of consecutive whole atoms, each at most ``max_functions`` long (one atom
    alone may be longer)."""
    ranges, start = [], 0
    for _, _, p0, p1 in mol.aoslice_by_atom():
        if p1 - start > max_functions and p0 > start:
            ranges.append((start, int(p0)))
            start = int(p0)
    ranges.append((start, mol.nao_nr()))
    return ranges


def tile_maxima(pair_max: np.ndarray, blocks) -> np.ndarray:
    """(nblock, nblock): the max of ``pair_max`` (nao, nao), max_Q |B^Q_{mu nu}|, per tile."""
    return np.array([[pair_max[a0:a1, b0:b1].max() for b0, b1 in blocks] for a0, a1 in blocks])


def k_dense(square: np.ndarray, c: np.ndarray) -> np.ndarray:
    naux, n, _ = square.shape
    k = np.zeros((n, n))
    for q0 in range(0, naux, K_AUX_BLOCK):
        y = c.T @ square[q0:q0 + K_AUX_BLOCK].reshape(-1, n).T
        rows = y.reshape(-1, n)
        k += rows.T @ rows
    return k


def sparse_tiles(square: np.ndarray, blocks, keep: np.ndarray):
    """Per column block b: (rows, T_b) with T_b[nu, Q, mu] = B^Q_{nu, b0 + mu} for the AO rows
    nu of the kept tiles of that column."""
    tiles = []
    for j, (b0, b1) in enumerate(blocks):
        rows = np.concatenate([np.arange(a0, a1) for i, (a0, a1) in enumerate(blocks)
                               if keep[i, j]])
        tiles.append((rows, np.ascontiguousarray(square[:, rows, b0:b1].transpose(1, 0, 2))))
    return tiles


def k_sparse(tiles, blocks, c: np.ndarray, naux: int) -> np.ndarray:
    n, r = c.shape
    k = np.zeros((n, n))
    y = np.empty((r, K_AUX_BLOCK, n))
    c_rows = [np.ascontiguousarray(c[rows].T) for rows, _ in tiles]
    for q0 in range(0, naux, K_AUX_BLOCK):
        q1 = min(q0 + K_AUX_BLOCK, naux)
        yq = y[:, : q1 - q0]
        for (b0, b1), (rows, t), cr in zip(blocks, tiles, c_rows):
            block = t[:, q0:q1].reshape(len(rows), (q1 - q0) * (b1 - b0))
            yq[:, :, b0:b1] = (cr @ block).reshape(r, q1 - q0, b1 - b0)
        flat = yq.reshape(-1, n)
        k += flat.T @ flat
    return k


def _median_seconds(fn, repeat: int):
    seconds, out = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), out


def screening(dfjk, mf, repeat: int) -> dict:
    from dfmp2.jk import square_copy

    cderi = dfjk.tensor  # None when the tensor is held unpacked only (dfjk.square)
    if cderi is not None and dfjk.pairs is not None:  # on the AO pairs that are not zero
        cderi = np.concatenate([dfjk.pairs.expand(cderi[q0:q0 + 64])
                                for q0 in range(0, cderi.shape[0], 64)])
    naux = dfjk.get_naoaux()
    mol = mf.mol
    c = np.ascontiguousarray(mf.mo_coeff[:, mf.mo_occ > 0] * np.sqrt(2.0))
    density = c @ c.T
    from pyscf import lib

    # one pass over the tensor
    if cderi is None:  # by blocks: no temporary of the tensor's size
        pair_max = np.max([np.abs(dfjk.square[q0:q0 + 64]).max(axis=0)
                           for q0 in range(0, naux, 64)], axis=0)
    else:
        pair_max = lib.unpack_tril(np.abs(cderi).max(axis=0))
    result = {"naux": naux, "nao": mol.nao_nr(), "nocc": c.shape[1], "blocks": {}}
    tiled = {}
    for label, size in (("atom", 1), ("40 functions", 40)):
        blocks = atom_blocks(mol, size)
        maxima = tile_maxima(pair_max, blocks)
        tiled[label] = blocks, maxima
        widths = np.array([b1 - b0 for b0, b1 in blocks])
        area = np.outer(widths, widths)
        result["blocks"][label] = {
            "nblocks": len(blocks),
            "kept": {f"{t:.0e}": {"tiles": float((maxima >= t).mean()),
                                  "area": float(area[maxima >= t].sum() / area.sum())}
                     for t in THRESHOLDS}}
    square = dfjk.square if dfjk.square is not None else square_copy(cderi, np.float64)
    dense_s, k_ref = _median_seconds(lambda: k_dense(square, c), repeat)
    blocks, maxima = tiled["40 functions"]
    keep = maxima >= SPARSE_THRESHOLD
    tiles = sparse_tiles(square, blocks, keep)
    sparse_s, k_screened = _median_seconds(lambda: k_sparse(tiles, blocks, c, naux), repeat)
    flops = 3 * naux * mol.nao_nr() ** 2 * c.shape[1]
    result["k"] = {"threshold": SPARSE_THRESHOLD, "blocks": "40 functions",
                   "kept_area": float(sum(t.size for _, t in tiles) / square.size),
                   "dense_s": dense_s, "sparse_s": sparse_s,
                   "dense_gflops": flops / dense_s / 1e9,
                   "max_abs_dk": float(np.abs(k_screened - k_ref).max()),
                   "d_exchange_energy": float(-0.25 * np.sum(density * (k_screened - k_ref))) + 0.0}
    return result


def measure(name: str, path: str, basis: str, max_memory: int, repeat: int) -> dict:
    from pyscf import df, gto

    from dfmp2.jk import DFJK
    from dfmp2.linalg import Dispatcher, DispatchPolicy
    from dfmp2.options import Options

    mol = gto.M(atom=path, basis=basis, verbose=0)
    auxbasis = df.make_auxbasis(mol, mp2fit=False)
    options = Options()
    la = Dispatcher(DispatchPolicy("pytorch"))
    dfjk = DFJK(mol, auxbasis, la)
    dfjk.max_memory = max_memory
    start = time.perf_counter()
    dfjk.build()
    build_s = time.perf_counter() - start
    rows, mf = cycles(mol, auxbasis, dfjk, options)
    return {"molecule": name, "basis": basis, "nao": mol.nao_nr(),
            "conv_tol": options.conv_tol, "conv_tol_grad": options.resolved_conv_tol_grad,
            "tensor_build_s": build_s, "cpu_blas": la.cpu_blas.choice, "cycles": rows,
            "screening": screening(dfjk, mf, repeat)}


def markdown(spec: dict, results: list[dict]) -> str:
    lines = [f"# dfmp2 SCF levers `{spec['name']}`", "", f"Command: `{spec['command']}`  ",
             f"CPU: {spec['machine']['cpu']}; {spec['machine']['affinity_cores']} cores; "
             f"numpy DGEMM 2048^3 {spec['dgemm_gflops']:.0f} GFLOP/s", ""]
    for res in results:
        lines += [f"## {res['molecule']} {res['basis']} ({res['nao']} basis functions; "
                  f"conv_tol {res['conv_tol']:g}, gradient {res['conv_tol_grad']:g}; "
                  f"J/K on dfmp2's DFJK, products through {res['cpu_blas']})", "",
                  "| start / accelerator | cycles | converged | SCF s | E - E(minao) Eh |",
                  "|---|---|---|---|---|"]
        for r in res["cycles"]:
            extra = (f" (+ {r['seconds_before']:.1f} s for the 6-31G SCF)"
                     if "seconds_before" in r else "")
            lines.append(f"| {r['variant']} | {r['cycles']} | {r['converged']} | "
                         f"{r['seconds']:.1f}{extra} | {r['de']:.1e} |")
        s = res["screening"]
        lines += ["", f"Tiles of the fitted tensor (naux {s['naux']}) kept, by max_Q |B| over "
                  "the tile (fraction of tiles / of the n^2 area):", "",
                  "| blocks | " + " | ".join(f"{t:.0e}" for t in THRESHOLDS) + " |",
                  "|---|" + "---|" * len(THRESHOLDS)]
        for label, b in s["blocks"].items():
            cells = [f"{v['tiles']:.2f} / {v['area']:.2f}" for v in b["kept"].values()]
            lines.append(f"| {label} ({b['nblocks']}) | " + " | ".join(cells) + " |")
        k = s["k"]
        lines += ["", f"K from the {s['nocc']} occupied orbitals: dense {k['dense_s']:.3f} s "
                  f"({k['dense_gflops']:.0f} GFLOP/s); block-sparse at {k['threshold']:.0e} "
                  f"({k['blocks']}, {k['kept_area']:.2f} of the area kept) {k['sparse_s']:.3f} s; "
                  f"max |dK| {k['max_abs_dk']:.1e}, exchange energy change "
                  f"{k['d_exchange_energy']:.1e} Eh.", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    dirs = run.molecule_dirs(args.molecule_dir)
    spec = {"name": args.name, "command": "python3 benchmarks/scf_levers.py " + " ".join(argv),
            "machine": machine_info(), "dgemm_gflops": numpy_gemm_rate(2048)["median"]}
    results = []
    for name in args.molecules.split(","):
        results.append(measure(name, run.find_xyz(name, dirs), args.basis, args.max_memory,
                               args.repeat))
        print(f"{name} done", file=sys.stderr, flush=True)
    report.save(args.out_dir, args.name, markdown(spec, results),
                {"spec": spec, "results": results}, echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
