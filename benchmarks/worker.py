"""One measurement in a fresh process: ``python3 benchmarks/worker.py SPEC.json``.

``benchmarks/run.py`` starts this script once per molecule and per OPENBLAS_CORETYPE setting
(the variable must be in the environment before OpenBLAS loads, hence a fresh process), and once
per setting for the GEMM rates. SPEC is a JSON object with ``kind`` ('molecule' or 'gemm') and
``out`` (where to write the JSON result); see :func:`run_molecule` for the molecule fields.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import resource
import sys
import time

import numpy as np

import machine  # benchmarks/machine.py, next to this script (its folder is on sys.path)

#: Worker environment flag: load PySCF's bundled OpenBLAS with Haswell kernels the way the dfmp2
#: CLI does (``dfmp2.blas_env``), leaving numpy's and torch's BLAS on their own detection.
PYSCF_ONLY_FLAG = "DFMP2_BENCH_PYSCF_HASWELL"
#: How that configuration is labelled in the results.
PYSCF_ONLY_LABEL = "pyscf-Haswell"


def coretype() -> str | None:
    """The OPENBLAS_CORETYPE configuration of this process, as the results label it."""
    if os.environ.get(PYSCF_ONLY_FLAG):
        return PYSCF_ONLY_LABEL
    return os.environ.get("OPENBLAS_CORETYPE")


#: PySCF's DF-MP2 debug log line with the wall time of one ao2mo stage.
_PYSCF_STAGE = re.compile(r"ao2mo CPU time for (\S+)\s+[-\d.]+ sec\s+wall time\s+([-\d.]+) sec")


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (``echo 5 > /proc/self/clear_refs``), so
    that ``ru_maxrss`` afterwards is the peak of what runs next. False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """``resource.getrusage(RUSAGE_SELF).ru_maxrss`` in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """The resident set size now, from /proc/self/statm, in MiB."""
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def build_scf(path: str, basis: str, conv_tol: float, charge: int = 0, spin: int = 0,
              reference: str = "rhf"):
    """Density-fitted RHF, or UHF for ``reference`` 'uhf' (PySCF's JK-fit partner of ``basis``),
    of the molecule with ``charge`` and 2S = ``spin``, converged to ``conv_tol``."""
    from pyscf import gto, scf

    mol = gto.M(atom=path, basis=basis, charge=charge, spin=spin, verbose=0)
    mf = (scf.UHF if reference == "uhf" else scf.RHF)(mol).density_fit()
    mf.conv_tol = conv_tol
    mf.verbose = 0
    mf.kernel()
    if not mf.converged:
        raise RuntimeError(f"SCF of {path} did not converge")
    return mf


def run_pyscf(mf, auxbasis: str, max_memory: int) -> dict:
    """PySCF's DF-MP2 with the RI basis ``auxbasis`` (not the SCF's JK-fit ``with_df``), no t2:
    ``pyscf.mp.dfmp2.DFMP2`` on an RHF, ``pyscf.mp.dfump2.DFUMP2`` on a UHF (its ``kernel`` is
    ``MP2.kernel``, which passes ``with_t2`` to the DF-UMP2 kernel: no amplitudes are allocated).

    Its debug log gives the wall time of each ao2mo stage (j2c, j3c, xform, save, fit); the rest
    of the call is the pair-energy contraction (``pair``).
    """
    from pyscf import df
    from pyscf import scf as pyscf_scf
    from pyscf.mp import dfmp2 as pyscf_dfmp2
    from pyscf.mp import dfump2 as pyscf_dfump2

    unrestricted = isinstance(mf, pyscf_scf.uhf.UHF)
    pt = (pyscf_dfump2.DFUMP2 if unrestricted else pyscf_dfmp2.DFMP2)(mf)
    pt.with_df = df.DF(mf.mol, auxbasis=auxbasis)
    pt.max_memory = max_memory
    pt.verbose = 5
    pt.stdout = io.StringIO()
    start = time.perf_counter()
    e_corr, t2 = pt.kernel(with_t2=False)
    seconds = time.perf_counter() - start
    assert t2 is None, "PySCF stored t2 amplitudes"
    stages = {name: float(wall) for name, wall in _PYSCF_STAGE.findall(pt.stdout.getvalue())}
    stages["pair"] = seconds - sum(stages.values())
    return {"seconds": seconds, "e_corr": float(e_corr), "e_corr_os": float(pt.e_corr_os),
            "e_corr_ss": float(pt.e_corr_ss), "stages": stages,
            "naux": pt.with_df.auxmol.nao_nr(), "class": type(pt).__name__}


def run_dfmp2(mf, auxbasis: str, max_memory: int, precision: str,
              cpu_blas: str | None = None) -> dict:
    """dfmp2's DF-MP2 (pytorch backend, fused pair energies) on the same SCF object.

    ``cpu_blas`` ('auto', 'torch', 'numpy') is passed only when given (the package default
    otherwise); the result records which library ran the products of each dtype."""
    import dfmp2

    extra = {} if cpu_blas is None else {"cpu_blas": cpu_blas}
    start = time.perf_counter()
    pt = dfmp2.DFMP2(mf, auxbasis=auxbasis, backend="pytorch", max_memory=max_memory,
                     fused_energy=True, precision=precision, **extra).run()
    seconds = time.perf_counter() - start
    res = pt.result
    blas = res.backend.cpu_blas or {}
    sizes = {**dataclasses.asdict(res.sizes), "nfrozen": res.sizes.nfrozen}
    return {"seconds": seconds, "e_corr": float(res.e_corr), "e_corr_os": float(res.e_corr_os),
            "e_corr_ss": float(res.e_corr_ss), "stages": dict(res.timings),
            "sizes": sizes, "blocks": res.method.blocks,
            "precision": res.method.precision, "backend": res.backend.resolved,
            "cpu_blas": {k: blas.get(k) for k in ("choice", "reason", "pair_reduction")}}


def measured(fn, *args) -> dict:
    """``fn(*args)`` with its CPU seconds (all threads), the peak RSS of the call and the RSS
    before it (MiB)."""
    reset_ok = reset_peak_rss()
    before = current_rss_mb()
    cpu = time.process_time()
    out = fn(*args)
    out["cpu_s"] = time.process_time() - cpu  # all threads of this process
    out["peak_rss_mb"] = peak_rss_mb() if reset_ok else None
    out["rss_before_mb"] = before
    return out


def int3c2e_seconds(mol, auxbasis: str, aux_block: int) -> float:
    """Wall time of dfmp2's int3c2e generation alone (``iter_int3c2e``, same block size), the
    integral part of its 'transform' stage."""
    from dfmp2.df import iter_int3c2e
    from dfmp2.integrals import make_auxmol

    auxmol = make_auxmol(mol, auxbasis)
    start = time.perf_counter()
    for _ in iter_int3c2e(mol, auxmol, aux_block):
        pass
    return time.perf_counter() - start


def pair_gemm_rates(nvir: int, naux: int, occ_block: int, cap: int = 2048) -> dict:
    """torch.matmul and numpy matmul rates at the pair-energy GEMM's shape,
    (b*nvir, naux) x (naux, b*nvir),
    with b*nvir capped at ``cap`` to keep the probe short (k = naux is kept), and at 2048^3
    (keys ``*_2048``). One timed call per dtype after a warm-up: :func:`alternating` runs it
    between repetitions."""
    m = max(1, min(occ_block * nvir, cap))
    return {"torch_fp64": machine.torch_gemm_rate(m, naux, m, "float64", 1),
            "torch_fp32": machine.torch_gemm_rate(m, naux, m, "float32", 1),
            "numpy_fp64": machine.numpy_gemm_rate(m, 1, k=naux),
            "numpy_fp32": machine.numpy_gemm_rate(m, 1, k=naux, dtype="float32"),
            # the 2048^3 reference again, here, under the same load as the timed runs
            "torch_fp64_2048": machine.torch_gemm_rate(2048, 2048, 2048, "float64", 1),
            "torch_fp32_2048": machine.torch_gemm_rate(2048, 2048, 2048, "float32", 1),
            "numpy_fp64_2048": machine.numpy_gemm_rate(2048, 1),
            "numpy_fp32_2048": machine.numpy_gemm_rate(2048, 1, dtype="float32")}


def pair_split(nvir: int, naux: int, occ_block: int, nocc: int, cpu_blas: str | None,
               repeat: int = 9) -> dict | None:
    """Where dfmp2's fp64 pair step spends its time, on random data of the molecule's shapes,
    GEMM and reduction timed apart (median seconds), for the path the run took, with the
    exchange sum (closed-shell and same-spin blocks; an open shell's alpha sizes):

    - numpy's BLAS (``cpu_blas`` 'numpy'): one GEMM block of ``numpy_ops.mp2_pair_sums``,
      ``B_J[chunk] x B_group^T``, timed alone, and the public op on the same group and chunk
      (one GEMM and its reduction, compiled or numpy as this install runs it by default): the
      reduction is the op less the GEMM;
    - torch: one row of a block, the GEMM (nvir, naux) x (naux, b*nvir) and
      ``pair_sums_from_ovov`` of its (1, nvir, b, nvir) result.

    {'error': ...} if the op API changed."""
    import torch

    try:
        gen = torch.Generator().manual_seed(0)
        eps_v = 0.5 + torch.rand(nvir, dtype=torch.float64, generator=gen)
        if cpu_blas == "numpy":
            from dfmp2.linalg import numpy_ops

            ng = min(numpy_ops.GROUP_ROWS, nocc)
            nk = max(1, min(nocc, numpy_ops.CHUNK_BYTES // (ng * nvir * nvir * 8)))
            b_i = torch.rand((ng, nvir, naux), dtype=torch.float64, generator=gen)
            b_j = torch.rand((nk, nvir, naux), dtype=torch.float64, generator=gen)
            eps_i = -1.0 - torch.rand(ng, dtype=torch.float64, generator=gen)
            eps_j = -1.0 - torch.rand(nk, dtype=torch.float64, generator=gen)
            rows_j, group_t = b_j.numpy().reshape(nk * nvir, naux), b_i.numpy().reshape(-1, naux).T
            out = np.empty((nk * nvir, ng * nvir))
            gemm_s = float(np.median(machine.timed(
                lambda: np.matmul(rows_j, group_t, out=out), repeat)))
            # the op on the same block (one group, one chunk: a single GEMM), less its GEMM
            weights = torch.ones((ng, nk), dtype=torch.float64)
            both = machine.timed(lambda: numpy_ops.mp2_pair_sums(
                b_i, b_j, eps_i, eps_j, eps_v, eps_v, weights, True), repeat)
            reduce_s = max(0.0, float(np.median(both)) - gemm_s)
            flops, how = 2.0 * nk * nvir * naux * ng * nvir, numpy_ops.pair_reduction(
                torch.float64)
            shape = {"group": ng, "chunk": nk}
        else:
            from dfmp2.linalg.torch_ops import pair_sums_from_ovov
            b = max(1, min(occ_block, nocc))
            ovl = torch.rand((b, nvir, naux), dtype=torch.float64, generator=gen)
            eps_o = -1.0 - torch.rand(b, dtype=torch.float64, generator=gen)
            rest = ovl.reshape(b * nvir, naux).T
            ovov = ovl[0] @ rest
            gemm_s = float(np.median(machine.timed(lambda: ovl[0] @ rest, repeat)))
            view = ovov.view(1, nvir, b, nvir)
            weights = torch.ones((1, b), dtype=torch.float64)
            reduce_s = float(np.median(machine.timed(
                lambda: pair_sums_from_ovov(view, eps_o[:1], eps_o, eps_v, eps_v, weights, True),
                repeat)))
            flops, how, shape = 2.0 * nvir * naux * b * nvir, "torch", {"b": b}
    except (ImportError, AttributeError, TypeError, ValueError,
            RuntimeError) as exc:  # diagnostic only
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {**shape, "gemm_s": gemm_s, "reduce_s": reduce_s, "gemm_gflops": flops / gemm_s / 1e9,
            "reduction": how}


def alternating(methods: dict, repeat: int, between=None) -> tuple[dict, list]:
    """Run each method ``repeat`` times, interleaved; the order flips every repetition
    (A B, B A, A B, ...) so that neither side always runs first. ``between()`` (a GEMM probe)
    runs after each repetition. Returns (name -> list of runs, list of probe results)."""
    runs = {name: [] for name in methods}
    probes = []
    names = list(methods)
    for rep in range(repeat):
        for name in (names if rep % 2 == 0 else names[::-1]):
            runs[name].append(measured(methods[name]))
        if between is not None:
            probes.append(between(runs))
    return runs, probes


def make_methods(mf, spec: dict) -> dict:
    """name -> zero-argument callable: 'pyscf', and 'dfmp2:<precision>' for each precision
    (or 'dfmp2:<precision>/<cpu_blas>' for each cpu_blas choice when the spec names some)."""
    aux, mem = spec["auxbasis"], spec["max_memory"]
    methods = {"pyscf": lambda: run_pyscf(mf, aux, mem)}
    for prec in spec["precisions"]:
        for blas in spec.get("cpu_blas") or [None]:
            key = f"dfmp2:{prec}" + (f"/{blas}" if blas else "")
            methods[key] = (lambda p=prec, b=blas: run_dfmp2(mf, aux, mem, p, b))
    return methods


def warm_up(spec: dict) -> None:
    """Load every library and start every thread pool before timing: each method once, untimed,
    on the small warm-up molecule (water, same basis)."""
    if spec.get("warmup_path"):
        small = build_scf(spec["warmup_path"], spec["basis"], spec["conv_tol"],
                          reference=spec.get("reference", "rhf"))
        for fn in make_methods(small, spec).values():
            fn()


def _pair_probe(run: dict) -> dict:
    """:func:`pair_gemm_rates` at the shapes of a finished dfmp2 run."""
    sizes = run["sizes"]
    return pair_gemm_rates(sizes["nvir"], sizes["naux"],
                           run["blocks"].get("occ_block", sizes["nocc"]))


def run_molecule(spec: dict) -> dict:
    """Spec: path, name, basis, auxbasis, repeat, warmup, warmup_path, precisions, max_memory,
    conv_tol; for an open shell also charge, spin (2S) and reference ('uhf'; the warm-up water
    then runs as a UHF too). Times the methods of :func:`make_methods` with
    :func:`alternating`."""
    import torch

    load_start = list(os.getloadavg())
    warm_up(spec)
    start = time.perf_counter()
    reference = spec.get("reference", "rhf")
    mf = build_scf(spec["path"], spec["basis"], spec["conv_tol"], spec.get("charge", 0),
                   spec.get("spin", 0), reference)
    scf_seconds = time.perf_counter() - start
    aux = spec["auxbasis"]
    methods = make_methods(mf, spec)
    for _ in range(spec["warmup"]):
        for fn in methods.values():
            fn()
    key = next(k for k in methods if k.startswith("dfmp2:"))
    runs, probes = alternating(methods, spec["repeat"], lambda done: _pair_probe(done[key][-1]))
    sizes, blocks = runs[key][0]["sizes"], runs[key][0]["blocks"]
    open_shell = ({"reference": reference, "charge": spec.get("charge", 0),
                   "spin": spec.get("spin", 0)} if "reference" in spec else {})
    scf_info = {"seconds": scf_seconds, "e_tot": float(mf.e_tot),
                "cycles": getattr(mf, "cycles", None)}
    if reference == "uhf":
        scf_info["s2"] = float(mf.spin_square()[0])
    return {
        "name": spec["name"], "basis": spec["basis"], "auxbasis": aux, **open_shell,
        "coretype": coretype(),
        "sizes": sizes, "blocks": blocks,
        "scf": scf_info,
        "runs": runs,
        "int3c2e_seconds": int3c2e_seconds(mf.mol, aux, blocks.get("aux_block", 512)),
        "pair_gemm": {dt: {"shape": probes[0][dt]["shape"],
                           "median": float(np.median([p[dt]["median"] for p in probes]))}
                      for dt in probes[0]},
        "pair_gemm_probes": probes,
        "pair_split": pair_split(sizes["nvir"], sizes["naux"],
                                 blocks.get("occ_block", sizes["nocc"]), sizes["nocc"],
                                 (runs[key][0].get("cpu_blas") or {}).get("choice")),
        "process_peak_rss_mb": peak_rss_mb(),
        "blas": machine.blas_info(),
        "torch_threads": torch.get_num_threads(),
        "loadavg": {"start": load_start, "end": list(os.getloadavg())},
    }


def run_gemm(spec: dict) -> dict:
    """GEMM rates, BLAS facts and the first touch of new memory (``machine.first_touch``) of
    a fresh process with this environment."""
    out = {"coretype": coretype(),
           "rates": machine.gemm_rates(spec.get("n", 2048), spec.get("repeat", 5)),
           "blas": machine.blas_info(), "first_touch": machine.first_touch(),
           "loadavg": list(os.getloadavg())}
    return out


def main(argv: list[str]) -> int:
    if os.environ.get(PYSCF_ONLY_FLAG):
        from dfmp2.blas_env import tune_pyscf_openblas

        print(f"PySCF BLAS: {tune_pyscf_openblas()}", file=sys.stderr)
    with open(argv[1]) as handle:
        spec = json.load(handle)
    result = run_molecule(spec) if spec["kind"] == "molecule" else run_gemm(spec)
    with open(spec["out"], "w") as handle:
        json.dump(result, handle, indent=1, default=_jsonable)
    return 0


def _jsonable(value):
    """numpy scalars and arrays in JSON."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
