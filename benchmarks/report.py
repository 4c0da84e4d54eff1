"""Turn the raw measurements of ``run.py`` into summary rows, scaling fits and markdown."""

from __future__ import annotations

import json
import math
import os
import statistics

#: Energy agreement required between PySCF and dfmp2 (Hartree). It is a pass/fail test for
#: 'fp64'; reduced precisions ('mixed', 'fp32') are shown against it but not failed.
ENERGY_TOL = 1e-8


def save(out_dir: str, name: str, text: str, data: dict, echo: bool = False) -> None:
    """Write a benchmark's result: ``<name>.md`` (``text``) and ``<name>.json`` (``data``)
    under ``out_dir``; with ``echo``, print ``text`` too."""
    if echo:
        print(text)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name + ".md"), "w") as handle:
        handle.write(text)
    with open(os.path.join(out_dir, name + ".json"), "w") as handle:
        json.dump(data, handle, indent=1, default=str)


def energy_fails(row: dict) -> bool:
    """True when an fp64 row misses :data:`ENERGY_TOL`."""
    return row["precision"] == "fp64" and not row["dE"] < ENERGY_TOL


def _energy_cell(row: dict) -> str:
    if row["dE"] < ENERGY_TOL:
        return f"{row['dE']:.1e}"
    return f"{row['dE']:.1e}" + (" FAIL" if energy_fails(row) else " (>1e-8)")


def _rss_cell(peak, before) -> str:
    """Peak RSS of the call and, in brackets, how far it rose above the RSS before the call."""
    if not peak:
        return "—"
    return f"{peak:.0f} (+{max(0.0, peak - before):.0f})"


def median(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else float("nan")


def coretype_label(value) -> str:
    """How a run's OPENBLAS_CORETYPE is shown: the value, or 'unset' (OpenBLAS auto-detects)."""
    return value if value else "unset"


def pair_flops(nocc: int, nvir: int, naux: int) -> float:
    """Flops of the (ia|jb) GEMMs of a symmetric (i <= j) algorithm:
    2 * nocc(nocc+1)/2 * nvir^2 * naux."""
    return 2.0 * nocc * (nocc + 1) / 2 * nvir**2 * naux


def uhf_pair_flops(nocc_a: int, nvir_a: int, nocc_b: int, nvir_b: int, naux: int) -> float:
    """Flops of the (ia|jb) GEMMs an unrestricted DF-MP2 needs: the same-spin pairs i < j of
    each spin (pairs i = i add nothing to E_SS) and every alpha-beta pair,
    2 * naux * [oa(oa-1)/2 * va^2 + ob(ob-1)/2 * vb^2 + oa*ob*va*vb]."""
    return 2.0 * naux * (nocc_a * (nocc_a - 1) / 2 * nvir_a**2
                         + nocc_b * (nocc_b - 1) / 2 * nvir_b**2
                         + nocc_a * nocc_b * nvir_a * nvir_b)


def sizes_pair_flops(sizes: dict) -> float:
    """:func:`pair_flops` of a closed shell or :func:`uhf_pair_flops` of an open one, from a
    run's ``sizes`` (``nocc_beta`` None or absent for a closed shell)."""
    if sizes.get("nocc_beta") is None:
        return pair_flops(sizes["nocc"], sizes["nvir"], sizes["naux"])
    return uhf_pair_flops(sizes["nocc"], sizes["nvir"], sizes["nocc_beta"], sizes["nvir_beta"],
                          sizes["naux"])


def gemm_dtype(precision: str) -> str:
    """The dtype of the pair GEMMs of a precision: fp32 for 'fp32'/'mixed', fp64 otherwise."""
    return "fp32" if precision in ("fp32", "mixed") else "fp64"


def selected_blas(runs: list[dict]) -> str:
    """Which library ran dfmp2's pair GEMMs, from its ``cpu_blas`` record (the package records
    the resolved choice, 'torch' or 'numpy') over the repetitions; several answers are joined
    by '+', and 'torch?' stands for a run that recorded nothing."""
    names = {(run.get("cpu_blas") or {}).get("choice") or "torch?" for run in runs}
    return "+".join(sorted(names))


def _rate(rates: dict | None, library: str, dtype: str, suffix: str = "") -> float:
    """Median GFLOP/s of ``library`` ('torch'/'numpy', or a '+' mix: the faster) at dtype
    (``suffix`` '_2048': the in-worker 2048^3 probe)."""
    if not rates:
        return float("nan")
    libs = [lib.rstrip("?") for lib in library.split("+")]
    keys = [f"{lib}_{dtype}{suffix}" for lib in libs]
    values = [rates[key]["median"] for key in keys if key in rates]
    return max(values) if values else float("nan")


def dfmp2_rows(mol: dict, gemm_by_core: dict) -> list[dict]:
    """One summary row per dfmp2 variant (precision, cpu_blas) of a molecule result (one
    process, one coretype)."""
    s = mol["sizes"]
    flops = sizes_pair_flops(s)
    pyscf_runs = mol["runs"]["pyscf"]
    t_pyscf = median(r["seconds"] for r in pyscf_runs)
    e_pyscf = pyscf_runs[0]["e_corr"]
    gemm = gemm_by_core.get(coretype_label(mol["coretype"]))
    rows = []
    for key, runs in mol["runs"].items():
        if not key.startswith("dfmp2:"):
            continue
        precision, _, choice = key.split(":", 1)[1].partition("/")
        blas, dtype = selected_blas(runs), gemm_dtype(precision)
        stages = {k: median(r["stages"].get(k) for r in runs)
                  for k in ("orbital_check", "metric", "transform", "fit", "pair_energy")}
        t = median(r["seconds"] for r in runs)
        pair_rate = flops / stages["pair_energy"] / 1e9
        shape_rate = _rate(mol["pair_gemm"], blas, dtype)
        rows.append({
            "molecule": mol["name"], "basis": mol["basis"], "nbasis": s["nbasis"],
            "naux": s["naux"], "nocc": s["nocc"], "nvir": s["nvir"],
            "reference": mol.get("reference", "rhf"), "charge": mol.get("charge", 0),
            "spin": mol.get("spin", 0), "nocc_beta": s.get("nocc_beta"),
            "nvir_beta": s.get("nvir_beta"), "pair_flops": flops,
            "s2": mol["scf"].get("s2"), "e_corr_pyscf": e_pyscf,
            "dE_os": _max_diff(runs, pyscf_runs[0], "e_corr_os"),
            "dE_ss": _max_diff(runs, pyscf_runs[0], "e_corr_ss"),
            "coretype": coretype_label(mol["coretype"]), "precision": precision,
            "cpu_blas_choice": choice or "default", "cpu_blas": blas,
            "variant": precision + (f"/{choice}" if choice else ""),
            "scf_s": mol["scf"]["seconds"],
            "pyscf_s": t_pyscf, "dfmp2_s": t, "ratio": t_pyscf / t,
            "pyscf_all_s": [r["seconds"] for r in pyscf_runs],
            "dfmp2_all_s": [r["seconds"] for r in runs],
            "dE": max(abs(r["e_corr"] - e_pyscf) for r in runs),
            "stages": stages, "int3c2e_s": mol.get("int3c2e_seconds"),
            "pair_gflops": pair_rate,
            "pair_pct_gemm": 100.0 * pair_rate / _rate(gemm and gemm["rates"], blas, dtype),
            "pair_pct_shape": 100.0 * pair_rate / shape_rate,
            "pair_pct_gemm_here": 100.0 * pair_rate / _rate(mol["pair_gemm"], blas, dtype, "_2048"),
            "pair_shape_gflops": shape_rate,
            "pair_split": mol.get("pair_split") if precision == "fp64" else None,
            "pyscf_stages": {k: median(r["stages"].get(k) for r in pyscf_runs)
                             for k in pyscf_runs[0]["stages"]},
            "pyscf_pair_gflops": flops / median(r["stages"]["pair"] for r in pyscf_runs) / 1e9,
            "cpu_util_pyscf": median(r["cpu_s"] / r["seconds"] for r in pyscf_runs),
            "cpu_util_dfmp2": median(r["cpu_s"] / r["seconds"] for r in runs),
            "peak_rss_dfmp2_mb": max(r["peak_rss_mb"] or 0 for r in runs) or None,
            "peak_rss_pyscf_mb": max(r["peak_rss_mb"] or 0 for r in pyscf_runs) or None,
            "rss_before_mb": min(r["rss_before_mb"] for r in pyscf_runs + runs),
            "process_peak_rss_mb": mol["process_peak_rss_mb"],
            "loadavg": mol["loadavg"],
        })
    return rows


def _max_diff(runs: list[dict], ref: dict, key: str) -> float | None:
    """max |run[key] - ref[key]| over runs (None where a side did not record ``key``)."""
    if ref.get(key) is None or any(r.get(key) is None for r in runs):
        return None
    return max(abs(r[key] - ref[key]) for r in runs)


def loglog_exponent(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log(time) against log(nbasis); None with fewer than 3 sizes."""
    points = [(x, y) for x, y in points if x > 0 and y > 0]
    if len({x for x, _ in points}) < 3:
        return None
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(y) for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
            / sum((x - mx) ** 2 for x in xs))


def scaling_fits(rows: list[dict], min_nbasis: int = 0) -> list[dict]:
    """Time-vs-nbasis exponents per basis, coretype and method over the measured ladder."""
    fits = []
    groups = sorted({(r["basis"], r["coretype"], r["variant"]) for r in rows})
    for basis, core, variant in groups:
        sel = [r for r in rows if (r["basis"], r["coretype"], r["variant"]) == (basis, core, variant)
               and r["nbasis"] >= min_nbasis]
        nb = [r["nbasis"] for r in sel]
        for method, key in ((f"dfmp2 {variant}", "dfmp2_s"), ("PySCF", "pyscf_s")):
            if method == "PySCF" and variant != rows[0]["variant"]:
                continue  # one PySCF fit per coretype, not one per dfmp2 variant
            exp = loglog_exponent([(r["nbasis"], r[key]) for r in sel])
            if exp is None:
                continue
            fits.append({"basis": basis, "coretype": core, "method": method, "points": len(sel),
                         "nbasis": [min(nb), max(nb)] if nb else None, "min_nbasis": min_nbasis,
                         "exponent": exp})
    return sorted(fits, key=lambda f: (f["min_nbasis"], f["basis"], f["coretype"],
                                       f["method"] != "PySCF", f["method"]))


def _f(value, digits=3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}"


def _table(header: list[str], lines: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in line) + " |" for line in lines]
    return out


def _split_cell(split: dict | None) -> str:
    """Share of the reduction in one probed row of the fp64 pair step (GEMM + reduction)."""
    if not split or "error" in split:
        return "—"
    return f"{100 * split['reduce_s'] / (split['reduce_s'] + split['gemm_s']):.0f}%"


def _variant_cell(row: dict) -> str:
    """Precision (and requested cpu_blas) with the library that ran the pair GEMMs."""
    return f"{row['variant']} [{row['cpu_blas']}]"


def _spins(row: dict, key: str) -> str:
    """A closed shell's count, or an open shell's 'alpha/beta'."""
    beta = row.get(key + "_beta")
    return str(row[key]) if beta is None else f"{row[key]}/{beta}"


def main_table(rows: list[dict]) -> list[str]:
    header = ["molecule", "basis", "nbf", "naux", "nocc", "nvir", "OPENBLAS_CORETYPE",
              "prec [BLAS]", "SCF s", "PySCF s", "dfmp2 s", "PySCF/dfmp2", "max abs dE (Eh)",
              "CPU/wall PySCF / dfmp2", "load 1m"]
    return _table(header, [[
        r["molecule"], r["basis"], r["nbasis"], r["naux"], _spins(r, "nocc"), _spins(r, "nvir"),
        r["coretype"],
        _variant_cell(r), _f(r["scf_s"], 1), _f(r["pyscf_s"]), _f(r["dfmp2_s"]), _f(r["ratio"], 2),
        _energy_cell(r), f"{_f(r['cpu_util_pyscf'], 1)} / {_f(r['cpu_util_dfmp2'], 1)}",
        _f(r["loadavg"]["start"][0], 1)] for r in rows])


def stage_table(rows: list[dict]) -> list[str]:
    header = ["molecule", "basis", "CORETYPE", "prec [BLAS]", "orbital check", "metric",
              "transform", "(int3c2e)",
              "fit", "pair_energy", "pair GFLOP/s", "% GEMM 2048", "% GEMM 2048 in worker",
              "% GEMM pair-shape",
              "reduction share", "peak RSS dfmp2 MiB", "peak RSS PySCF MiB"]
    lines = []
    for r in rows:
        st = r["stages"]
        lines.append([
            r["molecule"], r["basis"], r["coretype"], _variant_cell(r),
            _f(st.get("orbital_check")), _f(st["metric"]),
            _f(st["transform"]), _f(r["int3c2e_s"]), _f(st["fit"]), _f(st["pair_energy"]),
            _f(r["pair_gflops"], 1), _f(r["pair_pct_gemm"], 0), _f(r["pair_pct_gemm_here"], 0),
            _f(r["pair_pct_shape"], 0),
            _split_cell(r["pair_split"]), _rss_cell(r["peak_rss_dfmp2_mb"], r["rss_before_mb"]),
            _rss_cell(r["peak_rss_pyscf_mb"], r["rss_before_mb"])])
    return _table(header, lines)


def open_shell_table(rows: list[dict]) -> list[str]:
    """Charge, 2S, <S^2> of the UHF and the energy components against PySCF, open-shell rows."""
    header = ["molecule", "CORETYPE", "prec [BLAS]", "charge", "2S", "<S^2> UHF",
              "E_corr PySCF (Eh)", "max abs dE (Eh)", "dE OS", "dE SS"]
    return _table(header, [[
        r["molecule"], r["coretype"], _variant_cell(r), f"{r['charge']:+d}", r["spin"],
        _f(r["s2"], 4), f"{r['e_corr_pyscf']:.10f}", _energy_cell(r),
        "—" if r["dE_os"] is None else f"{r['dE_os']:.1e}",
        "—" if r["dE_ss"] is None else f"{r['dE_ss']:.1e}"]
        for r in rows if r.get("reference", "rhf") != "rhf"])


def pyscf_stage_table(rows: list[dict]) -> list[str]:
    header = ["molecule", "basis", "CORETYPE", "j2c", "j3c", "xform", "save", "fit", "pair",
              "pair GFLOP/s"]
    lines, seen = [], set()
    for r in rows:
        key = (r["molecule"], r["basis"], r["coretype"])
        if key in seen:
            continue
        seen.add(key)
        st = r["pyscf_stages"]
        lines.append([r["molecule"], r["basis"], r["coretype"]]
                     + [_f(st.get(k)) for k in ("j2c", "j3c", "xform", "save", "fit", "pair")]
                     + [_f(r["pyscf_pair_gflops"], 1)])
    return _table(header, lines)


def gemm_table(gemm_by_core: dict) -> list[str]:
    header = ["OPENBLAS_CORETYPE", "torch fp64", "torch fp32", "numpy DGEMM", "numpy SGEMM",
              "PySCF bundled DGEMM", "OpenBLAS kernels picked (library: arch)"]
    lines = []
    for core, g in gemm_by_core.items():
        rates = g["rates"]
        libs = g["blas"].get("libraries") or []
        arch = ", ".join(f"{lib['prefix']} {lib.get('version') or '?'}: {lib['architecture']}"
                         for lib in libs)
        lines.append([coretype_label(core)] + [
            f"{_f(rates[k]['median'], 1)} (best {_f(rates[k]['best'], 1)})"
            if k in rates else "—"
            for k in ("torch_fp64", "torch_fp32", "numpy_fp64", "numpy_fp32", "pyscf_fp64")]
            + [arch])
    return _table(header, lines)


def e2e_keys(row: dict) -> list[str]:
    """The keys of an end-to-end row's dfmp2 runs: 'dfmp2' (the default fp64 SCF) and 'dfmp2
    <precision>' per other ``--scf-precision`` the harness ran (``run.e2e_key``)."""
    return [key for key in row if key == "dfmp2" or key.startswith("dfmp2 ")]


def e2e_summary(row: dict, ours: str = "dfmp2") -> dict:
    """Medians of one end-to-end row (dfmp2 runs ``row[ours]`` and PySCF's runs of one molecule
    and coretype): wall, SCF and post-SCF seconds per side (keys 'dfmp2_*' whichever ``ours``),
    their ratios (PySCF / dfmp2), the SCF cycles, and the largest total-energy difference
    between any two of those runs."""
    sides = {side: [r for r in row[key] if "error" not in r]
             for side, key in (("dfmp2", ours), ("pyscf", "pyscf"))}
    out = {"errors": [r["error"] for key in (ours, "pyscf") for r in row[key]
                      if "error" in r], "runs": min(len(v) for v in sides.values())}
    if not out["runs"]:
        return out
    for side, runs in sides.items():
        for key in ("wall_s", "scf_s", "mp2_s"):
            out[f"{side}_{key}"] = median([r[key] for r in runs])
        out[f"{side}_cycles"] = median([r["scf_cycles"] for r in runs])
    for key in ("wall_s", "scf_s", "mp2_s"):
        out[f"ratio_{key}"] = out[f"pyscf_{key}"] / out[f"dfmp2_{key}"]
    energies = [r["e_tot"] for runs in sides.values() for r in runs]
    out["energy_spread"] = max(energies) - min(energies)
    jk = [r["scf_jk_stats"] for r in sides["dfmp2"] if r.get("scf_jk_stats")]
    out["jk_gflops"] = median([s["gflop"] / s["seconds"] for s in jk]) if jk else None
    out["jk_seconds_per_call"] = median([s["seconds"] / s["calls"] for s in jk]) if jk else None
    return out


def best_dgemm(gemm_by_core: dict, core) -> float | None:
    """The faster of numpy's and torch's median 2048^3 DGEMM rate in the run's GEMM worker of
    ``core`` (the rate dfmp2's J/K is compared with), or None."""
    rates = (gemm_by_core.get(coretype_label(core)) or {}).get("rates", {})
    values = [rates[k]["median"] for k in ("numpy_fp64", "torch_fp64") if k in rates]
    return max(values) if values else None


def e2e_table(e2e: list[dict], gemm_by_core: dict | None = None) -> list[str]:
    header = ["molecule", "basis", "PySCF's BLAS", "dfmp2 SCF precision", "runs",
              "dfmp2 wall s", "PySCF wall s",
              "ratio", "dfmp2 SCF s (cycles)", "PySCF SCF s (cycles)", "ratio",
              "dfmp2 post-SCF s", "PySCF post-SCF s", "ratio", "max |ΔE(MP2)| Eh",
              "dfmp2 J/K s per build, GFLOP/s (% DGEMM)"]
    lines = []
    for row, ours in ((row, key) for row in e2e if "pyscf" in row for key in e2e_keys(row)):
        m = e2e_summary(row, ours)
        label = [row["name"], row["basis"], coretype_label(row["coretype"]),
                 ours.partition(" ")[2] or "fp64", str(m["runs"])]
        if not m["runs"]:
            lines.append(label + ["error: " + "; ".join(m["errors"])[:80]] + [""] * 10)
            continue
        dgemm = best_dgemm(gemm_by_core or {}, row["coretype"])
        jk = "—" if m["jk_gflops"] is None else (
            f"{m['jk_seconds_per_call']:.2f}, {m['jk_gflops']:.0f}"
            + (f" ({100 * m['jk_gflops'] / dgemm:.0f}%)" if dgemm else ""))
        lines.append(label + [
            _f(m["dfmp2_wall_s"], 2), _f(m["pyscf_wall_s"], 2), _f(m["ratio_wall_s"], 2),
            f"{_f(m['dfmp2_scf_s'], 2)} ({m['dfmp2_cycles']:g})",
            f"{_f(m['pyscf_scf_s'], 2)} ({m['pyscf_cycles']:g})", _f(m["ratio_scf_s"], 2),
            _f(m["dfmp2_mp2_s"], 2), _f(m["pyscf_mp2_s"], 2), _f(m["ratio_mp2_s"], 2),
            f"{m['energy_spread']:.1e}", jk])
    return _table(header, lines)


def scaling_table(fits: list[dict]) -> list[str]:
    header = ["basis", "OPENBLAS_CORETYPE", "method", "points", "nbasis range", "min nbasis",
              "exponent"]
    return _table(header, [[
        f["basis"], f["coretype"], f["method"], f["points"],
        f"{f['nbasis'][0]}–{f['nbasis'][1]}" if f["nbasis"] else "—", f["min_nbasis"],
        _f(f["exponent"], 2)] for f in fits])


def blas_lines(gemm_by_core: dict, machine: dict) -> list[str]:
    """Machine and BLAS facts as a bullet list."""
    first = next(iter(gemm_by_core.values()), {}) if gemm_by_core else {}
    blas = first.get("blas", {})
    out = [
        (f"- CPU: {machine['cpu']}; {machine['cores']} cores "
         f"(affinity {machine.get('affinity_cores')}); {machine.get('memory_gib')} GiB; "
         f"flags {' '.join(machine.get('cpu_flags', []))}"),
        (f"- Python {machine['python']}; torch threads {machine['torch_threads']}; "
         f"PySCF threads (OpenMP) {blas.get('pyscf_num_threads')}; "
         f"versions {machine['versions']}"),
        f"- torch BLAS: {blas.get('torch_blas')} (mkl available: {blas.get('torch_mkl')})",
        f"- BLAS environment inherited by the harness: {machine['env']}",
        (f"- workers (both sides): OPENBLAS_THREAD_TIMEOUT="
         f"{blas.get('OPENBLAS_THREAD_TIMEOUT') or 'unset (OpenBLAS default 28)'}"),
        _source_line(machine),
    ]
    for core, g in gemm_by_core.items():
        for lib in g["blas"].get("libraries") or []:
            out.append(f"- [{coretype_label(core)}] {lib['prefix']} {lib.get('version') or '?'}"
                       f" arch {lib['architecture']}, threads {lib['num_threads']} "
                       f"({lib.get('threading_layer')}): {lib['filepath']}")
        touch = g.get("first_touch")
        if touch:
            out.append(f"- [{coretype_label(core)}] first touch of {touch['gib']:g} GiB (a new "
                       f"numpy array written once, one thread): {touch['new_s']:.2f} s, then "
                       f"{touch['again_s']:.2f} s for the next one allocated right after it "
                       "was freed")
    return out


def _source_line(machine: dict) -> str:
    """The dfmp2 code state, flagged when it changed between the start and the end of a run."""
    start, end = machine.get("source_start"), machine.get("source_end")
    if not start:
        return "- dfmp2 sources: not recorded"
    line = f"- dfmp2 sources: commit {start['commit']}, sha256 {start['dfmp2_sources_sha256']}"
    if end and end != start:
        line += (f"; CHANGED during the run (end: commit {end['commit']}, "
                 f"sha256 {end['dfmp2_sources_sha256']})")
    return line


def markdown(data: dict) -> str:
    """The whole report: machine, GEMM rates, timings, stages, end to end, scaling, skips."""
    rows, fits = data["rows"], data["scaling"]
    out = [f"# dfmp2 benchmark `{data['name']}`", "",
           f"Command: `{data['command']}`  ",
           (f"Started {data['started']}; wall {data['wall_s']:.0f} s; repeat {data['repeat']}, "
            f"extra warm-up runs {data['warmup']}; precisions {', '.join(data['precisions'])}; "
            f"max_memory {data['max_memory']} MB; reference {data.get('reference', 'rhf')}; "
            f"1-minute load average at start "
            f"{data['machine']['loadavg'][0]:.1f}"), "",
           "## Machine and BLAS", ""] + blas_lines(data["gemm"], data["machine"])
    out += ["", "## GEMM rates (GFLOP/s, 2048^3, median of 5)", ""] + gemm_table(data["gemm"])
    if rows:
        out += ["", "## DF-MP2: PySCF vs dfmp2 (medians, seconds)", ""] + main_table(rows)
    if any(r.get("reference", "rhf") != "rhf" for r in rows):
        out += ["", "## Open shells: reference and energy components vs PySCF DFUMP2", ""]
        out += open_shell_table(rows)
    if rows:
        out += ["", "## dfmp2 stages (medians, seconds) and pair-energy rate", ""]
        out += stage_table(rows)
        out += ["", "## PySCF stages (medians, seconds; pair = total − ao2mo stages)", ""]
        out += pyscf_stage_table(rows)
    if data.get("e2e"):
        out += ["", "## End to end: `python3 -m dfmp2 run` vs PySCF's DF-SCF + DF-MP2 "
                "(`benchmarks/pyscf_e2e.py`), fresh processes, medians; ratio = PySCF / "
                "dfmp2", ""]
        out += e2e_table(data["e2e"], data.get("gemm"))
    if fits:
        out += ["", "## Scaling: time ∝ nbasis^k (log-log least squares)", ""]
        out += scaling_table(fits)
    if data.get("skipped"):
        out += ["", "## Not measured", ""] + [f"- {s}" for s in data["skipped"]]
    return "\n".join(out) + "\n"
