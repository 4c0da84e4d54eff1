"""Benchmark dfmp2's DF-MP2 against PySCF's on a ladder of molecules.

    python3 benchmarks/run.py --ladder quick            # a few minutes
    python3 benchmarks/run.py --ladder full --budget-min 25
    python3 benchmarks/run.py --molecules water,water4@cc-pvtz --basis cc-pvdz --repeat 3
    python3 benchmarks/run.py --molecule-dir ~/my-xyz --molecules mymol --no-e2e
    python3 benchmarks/run.py --reference uhf --molecules water16+1 --no-e2e --name uhf-r1
    python3 benchmarks/run.py --no-ladder --e2e water16,C20H42 --coretypes pyscf-Haswell \
        --name e2e-zen4                                 # dfmp2 run vs PySCF, whole jobs

Molecules are xyz stems looked up in every ``--molecule-dir`` given, then in the repository's
``inputs/``, then in ``benchmarks/molecules/`` (the larger water clusters and alkanes).

Each molecule runs in fresh worker processes (``benchmarks/worker.py``), one per
OPENBLAS_CORETYPE setting (unset = OpenBLAS auto-detects; Haswell = forced), because the variable
only acts before OpenBLAS loads. A worker builds the DF-RHF (``--reference uhf``: DF-UHF) once,
then times PySCF's DF-MP2 (DFUMP2) and dfmp2's (every precision in ``dfmp2.options.PRECISIONS``)
alternately. An entry ``name+1`` or ``name-2`` has that charge. Results go to stdout and
to ``benchmarks/results/<name>.md`` and ``.json``; see ``benchmarks/README.md`` for the columns.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

import machine  # benchmarks/*.py, next to this script (its folder is on sys.path)
import report
import worker

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

#: Where xyz files are looked up after the ``--molecule-dir`` folders, in order: the repository's
#: small molecules, then the larger ones only the benchmarks use.
MOLECULE_DIRS = (os.path.join(ROOT, "inputs"), os.path.join(HERE, "molecules"))

LADDERS = {
    "quick": ["water", "water4", "water8", "C10H22"],
    "full": ["water", "water2", "water4", "water8", "water12", "water16", "water20", "C10H22",
             "C14H30", "C20H42", "caffeine", "water@cc-pvtz", "water4@cc-pvtz"],
}
#: Molecules timed end to end (``python3 -m dfmp2 run``) by default, per ladder.
E2E = {"quick": ["water4", "C10H22"], "full": ["water8", "caffeine"]}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ladder", choices=sorted(LADDERS), help="a predefined list of molecules")
    p.add_argument("--molecules", help="comma-separated names (xyz stems), name@basis allowed")
    p.add_argument("--molecule-dir", action="append", default=[], metavar="DIR",
                   help="folder of xyz files searched before inputs/ and benchmarks/molecules/ "
                        "(repeat the option for several folders)")
    p.add_argument("--basis", default="cc-pvdz", help="orbital basis of entries without @basis")
    p.add_argument("--reference", choices=("rhf", "uhf"), default="rhf",
                   help="SCF reference of every entry: density-fitted RHF (PySCF's DFMP2) or UHF "
                        "(PySCF's DFUMP2); an entry name may end in a charge, e.g. water16+1")
    p.add_argument("--spin", type=int, default=None, metavar="2S",
                   help="2S of every entry (needs --reference uhf when nonzero); default the "
                        "lowest for each entry's electron count (0 or 1)")
    p.add_argument("--auxbasis", help="MP2 fitting basis (default: <basis>-ri)")
    p.add_argument("--repeat", type=int, default=3, help="timed repetitions of each side")
    p.add_argument("--warmup", type=int, default=0,
                   help="untimed runs of each side on the molecule before timing (every worker "
                        "first runs each side once on water, untimed, whatever this is)")
    p.add_argument("--coretypes", default="unset,pyscf-Haswell",
                   help="OPENBLAS_CORETYPE values, one worker process each ('unset' removes it; "
                        "'pyscf-Haswell': Haswell kernels for PySCF's bundled OpenBLAS only, "
                        "as the dfmp2 CLI sets it up)")
    p.add_argument("--thread-timeout", default=None,
                   help="OPENBLAS_THREAD_TIMEOUT of the workers (both sides): default what the "
                        "dfmp2 CLI sets (dfmp2.blas_env.OPENBLAS_THREAD_TIMEOUT) unless the "
                        "harness's environment has it; 'unset' removes it (OpenBLAS: 28)")
    p.add_argument("--precisions", help="dfmp2 precisions (default: all of options.PRECISIONS)")
    p.add_argument("--cpu-blas",
                   help="dfmp2 cpu_blas choices to time, comma-separated (e.g. torch,numpy); "
                        "default: the package default only")
    p.add_argument("--max-memory", type=int, default=4000, help="MB, both PySCF and dfmp2")
    p.add_argument("--conv-tol", type=float, default=1e-10, help="SCF energy tolerance")
    p.add_argument("--e2e", help="molecules for the end-to-end run (default: per ladder)")
    p.add_argument("--no-e2e", action="store_true", help="skip the end-to-end runs")
    p.add_argument("--e2e-scf-precisions", default="fp64", metavar="LIST",
                   help="comma-separated --scf-precision values of the end-to-end dfmp2 runs "
                        "(each against the same PySCF runs; default fp64, dfmp2's default)")
    p.add_argument("--no-ladder", action="store_true",
                   help="skip the post-SCF ladder (GEMM rates and end-to-end runs only)")
    p.add_argument("--budget-min", type=float,
                   help="start no new measurement after this many minutes (the rest is skipped)")
    p.add_argument("--timeout", type=int, default=2400, help="seconds per worker process")
    p.add_argument("--name", help="results file name (default: the ladder name or 'custom')")
    p.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    p.add_argument("--append", action="store_true",
                   help="add this run's workers to the results file of the same --name in "
                        "--out-dir (same reference, repeat, warm-up, precisions, memory, SCF "
                        "tolerance and thread timeout), e.g. a coretype "
                        "that an earlier run's --budget-min left out")
    args = p.parse_args(argv)
    if not args.ladder and not args.molecules and not (args.no_ladder and args.e2e):
        p.error("give --ladder or --molecules (or --no-ladder with --e2e)")
    from dfmp2.options import SCF_PRECISIONS

    listed = args.e2e_scf_precisions.split(",")
    unknown = set(listed) - set(SCF_PRECISIONS)
    if unknown or len(set(listed)) != len(listed):
        p.error(f"--e2e-scf-precisions {args.e2e_scf_precisions}: give each of "
                f"{', '.join(SCF_PRECISIONS)} at most once")
    if args.spin is not None and (args.spin < 0 or (args.spin and args.reference == "rhf")):
        p.error(f"--spin {args.spin}: 2S must be >= 0, and 0 for --reference rhf")
    if args.append:
        previous = os.path.join(args.out_dir, (args.name or args.ladder or "custom") + ".json")
        if not os.path.exists(previous):
            p.error(f"--append: no {previous} to add to")
    for folder in args.molecule_dir:
        if not os.path.isdir(folder):
            p.error(f"--molecule-dir {folder}: not a folder")
    return args


def molecule_dirs(extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The folders searched for xyz files: ``extra`` (``--molecule-dir``), then
    :data:`MOLECULE_DIRS`."""
    return [os.path.abspath(os.path.expanduser(d)) for d in extra] + list(MOLECULE_DIRS)


def find_xyz(name: str, dirs: list[str]) -> str:
    """The xyz file of a molecule name: the first ``<dir>/<name>.xyz`` of ``dirs`` that exists."""
    for folder in dirs:
        path = os.path.join(folder, name + ".xyz")
        if os.path.exists(path):
            return path
    raise SystemExit(f"no {name}.xyz in {', '.join(dirs)} (add a folder with --molecule-dir)")


def ri_basis(basis: str) -> str:
    """The RI (MP2-fit) partner of an orbital basis: cc-pVXZ -> cc-pVXZ-RI."""
    return basis.lower() + "-ri"


#: An entry name: the xyz stem, then optionally the charge (``water16+1``, ``C20H41-1``).
_ENTRY = re.compile(r"^(?P<stem>.+?)(?P<charge>[+-]\d+)?$")


def parse_entry(item: str) -> tuple[str, int, str | None]:
    """(xyz stem, charge, basis or None) of ``name[+q|-q][@basis]``."""
    name, _, own_basis = item.partition("@")
    match = _ENTRY.match(name)
    return match["stem"], int(match["charge"] or 0), own_basis or None


def entries(names: list[str], basis: str, auxbasis: str | None, dirs: list[str],
            reference: str = "rhf", spin: int | None = None) -> list[dict]:
    """Molecule entries (name, basis, auxbasis, path, nbasis, charge, spin, reference), smallest
    nbasis first; xyz files from ``dirs`` (:func:`molecule_dirs`). ``spin`` (2S) None: the lowest
    for each entry's electron count. An odd electron count under an RHF reference is an error."""
    from pyscf import gto

    out = []
    for item in names:
        stem, charge, own_basis = parse_entry(item)
        b = own_basis or basis
        path = find_xyz(stem, dirs)
        nelectron = gto.M(atom=path, basis=b, charge=charge, spin=None, verbose=0).nelectron
        two_s = nelectron % 2 if spin is None else spin
        if (nelectron - two_s) % 2 or two_s > nelectron:
            raise SystemExit(f"{item}: {nelectron} electrons cannot have 2S = {two_s}")
        if two_s and reference == "rhf":
            raise SystemExit(f"{item}: {nelectron} electrons, 2S = {two_s}: an open shell needs "
                             "--reference uhf")
        nbasis = gto.M(atom=path, basis=b, charge=charge, spin=two_s, verbose=0).nao_nr()
        entry = {"name": item.partition("@")[0], "basis": b,
                 "auxbasis": auxbasis or ri_basis(b), "path": path, "nbasis": nbasis}
        if reference != "rhf" or charge or two_s:  # RHF entries keep their former fields
            entry.update(charge=charge, spin=two_s, reference=reference)
        out.append(entry)
    return sorted(out, key=lambda e: e["nbasis"])


def thread_timeout(arg: str | None) -> str | None:
    """The workers' OPENBLAS_THREAD_TIMEOUT: the argument ('unset' -> None), else this
    environment's, else the value the dfmp2 CLI sets (``dfmp2.blas_env``)."""
    from dfmp2.blas_env import OPENBLAS_THREAD_TIMEOUT

    if arg is not None:
        return None if arg == "unset" else arg
    return os.environ.get("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_THREAD_TIMEOUT)


def worker_env(coretype: str) -> dict:
    """The environment of a worker: this one, with OPENBLAS_CORETYPE set or removed; for
    'pyscf-Haswell' removed, and the worker gives Haswell kernels to PySCF's library only.
    OPENBLAS_THREAD_TIMEOUT is inherited (``main`` sets it from --thread-timeout)."""
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop(worker.PYSCF_ONLY_FLAG, None)
    if coretype == worker.PYSCF_ONLY_LABEL:
        env[worker.PYSCF_ONLY_FLAG] = "1"
    elif coretype != "unset":
        env["OPENBLAS_CORETYPE"] = coretype
    return env


def run_worker(spec: dict, coretype: str, timeout: int) -> dict:
    """Run ``worker.py`` on ``spec`` in a fresh process; its JSON result, or {'error': ...}."""
    return _run_script("worker.py", spec, coretype, timeout)[1]


def _run_script(script: str, spec: dict, coretype: str, timeout: int) -> tuple[float, dict]:
    """(wall seconds, result) of ``benchmarks/<script> SPEC.json`` in a fresh process with
    ``coretype``'s environment: the JSON the script wrote to ``spec['out']`` (added here), or
    {'error': the last line of its error output}."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = {**spec, "out": os.path.join(tmp, "out.json")}
        spec_path = os.path.join(tmp, "spec.json")
        with open(spec_path, "w") as handle:
            json.dump(spec, handle)
        wall, error = _timed([sys.executable, os.path.join(HERE, script), spec_path], coretype,
                             timeout)
        if error is None and not os.path.exists(spec["out"]):
            error = "no output"
        if error is not None:
            return wall, {"error": error}
        with open(spec["out"]) as handle:
            return wall, json.load(handle)


def run_e2e(entry: dict, coretype: str, timeout: int, scf_precision: str = "fp64") -> dict:
    """``python3 -m dfmp2 run`` on one molecule in a fresh process: wall time, and the SCF and
    DF-MP2 stage times it reports (SCF includes building the molecule), its SCF cycles.
    ``scf_precision`` other than the default is passed as ``--scf-precision``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "dfmp2", "run", entry["path"], "--basis", entry["basis"],
               "--auxbasis", entry["auxbasis"], "--backend", "pytorch", "--json", out, "-q"]
        if scf_precision != "fp64":
            cmd += ["--scf-precision", scf_precision]
        if "reference" in entry:
            cmd += ["--charge", str(entry["charge"]), "--spin", str(entry["spin"]),
                    "--reference", entry["reference"]]
        wall, error = _timed(cmd, coretype, timeout)
        if error:
            return {"error": error}
        with open(out) as handle:
            result = json.load(handle)
    timings = result["extras"]["timings"]
    scf = timings.get("scf", 0.0)
    mp2 = sum(v for k, v in timings.items() if k != "scf")
    props = result["properties"]
    return {"wall_s": wall, "scf_s": scf, "mp2_s": mp2, "other_s": wall - scf - mp2,
            "timings": timings, "scf_cycles": props.get("scf_iterations"),
            "scf_jk": result["extras"]["scf"]["jk"],
            "scf_jk_stats": result["extras"]["scf"].get("jk_stats"),
            "e_scf": props["scf_total_energy"],
            "e_tot": props["mp2_total_energy"], "command": _portable(cmd, out)}


def run_pyscf_e2e(entry: dict, coretype: str, timeout: int) -> dict:
    """PySCF's DF-SCF + DF-MP2 on one molecule in a fresh process (``benchmarks/pyscf_e2e.py``,
    dfmp2's default SCF tolerances): wall time, stage times, SCF cycles and energies."""
    from dfmp2.options import Options

    defaults = Options()
    spec = {"path": entry["path"], "basis": entry["basis"], "auxbasis": entry["auxbasis"],
            "charge": entry.get("charge", 0), "spin": entry.get("spin", 0),
            "reference": entry.get("reference", "rhf"), "conv_tol": defaults.conv_tol,
            "conv_tol_grad": defaults.resolved_conv_tol_grad,  # what dfmp2 run converges to
            "pyscf_haswell": coretype == worker.PYSCF_ONLY_LABEL}
    wall, result = _run_script("pyscf_e2e.py", spec, coretype, timeout)
    if "error" in result:
        return result
    return {"wall_s": wall, **result, "other_s": wall - result["scf_s"] - result["mp2_s"]}


def _timed(cmd: list[str], coretype: str, timeout: int) -> tuple[float, str | None]:
    """(wall seconds, None) of ``cmd`` in a fresh process with ``coretype``'s environment, or
    (elapsed, the last line of its error output) when it fails or times out."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=worker_env(coretype), cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - start, f"timed out after {timeout} s"
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return wall, (proc.stderr.strip().splitlines() or ["failed"])[-1]
    return wall, None


def _portable(cmd: list[str], json_out) -> str:
    """The end-to-end command as a reader would type it: ``python3``, the xyz file by name, the
    temporary JSON as ``OUT.json`` (no paths of this machine in the results)."""
    words = ["python3" if k == 0 else os.path.basename(w) if w.endswith(".xyz") else
             "OUT.json" if w == str(json_out) else w for k, w in enumerate(cmd)]
    return shlex.join(words)


def precisions(arg: str | None) -> list[str]:
    """The dfmp2 precisions to time: the argument, or every one the package lists now."""
    from dfmp2.options import PRECISIONS

    return arg.split(",") if arg else list(PRECISIONS)


class Budget:
    """Wall-clock budget of ``minutes`` (None = unlimited).

    ``ok(predicted)`` is False once the budget is spent, or when a measurement predicted to take
    ``predicted`` seconds would end past it. Predictions scale the last worker's wall time by
    (nbasis / its nbasis)^SCALING — deliberately steeper than the measured exponents (about 3).
    """

    SCALING = 4.0

    def __init__(self, minutes: float | None):
        self.start = time.perf_counter()
        self.minutes = minutes
        self.last: tuple[int, float] | None = None  # (nbasis, seconds) of the last worker

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def predict(self, nbasis: int) -> float:
        if self.last is None:
            return 0.0
        return self.last[1] * (nbasis / self.last[0]) ** self.SCALING

    def ok(self, predicted: float = 0.0) -> bool:
        return self.minutes is None or self.elapsed() + predicted < 60 * self.minutes


def source_state() -> dict:
    """Which dfmp2 code ran: the git commit, and a sha256 over every dfmp2/**/*.py file as it is
    on disk (the checkout may hold uncommitted edits, and other people may edit it mid-run)."""
    import hashlib
    import pathlib

    digest = hashlib.sha256()
    for path in sorted(pathlib.Path(ROOT, "dfmp2").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                                capture_output=True, check=False).stdout.strip() or None
    except OSError:
        commit = None
    return {"commit": commit, "dfmp2_sources_sha256": digest.hexdigest()[:16]}


def provenance(script: str, argv: list[str]) -> dict:
    """What a result file must say of its run: the command that made it, the CPU model and the
    dfmp2 code (:func:`source_state`)."""
    return {"command": " ".join(["python3", f"benchmarks/{script}", *argv]),
            "machine": machine.cpu_model(), **source_state()}


def provenance_line(record: dict) -> str:
    """One markdown line from :func:`provenance`'s record."""
    return (f"Command: `{record['command']}`; machine: {record['machine']}; dfmp2 commit "
            f"{record['commit']} (sources sha256 {record['dfmp2_sources_sha256']}).")


def log(message: str) -> None:
    """Progress on stderr (stdout carries the report)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure_gemm(cores: list[str]) -> dict:
    """GEMM rates and BLAS facts of a fresh process per coretype (failures left out)."""
    gemm = {}
    for core in cores:
        log(f"GEMM rates, OPENBLAS_CORETYPE={core}")
        result = run_worker({"kind": "gemm"}, core, 600)
        if "error" not in result:
            gemm[core] = result
    return gemm


def e2e_key(scf_precision: str) -> str:
    """The key of an end-to-end row's dfmp2 runs with ``--scf-precision scf_precision``."""
    return "dfmp2" if scf_precision == "fp64" else f"dfmp2 {scf_precision}"


def measure_e2e(names: list[str], args, cores: list[str], budget: Budget,
                skipped: list) -> list[dict]:
    """End-to-end runs of ``names`` for every coretype while the budget lasts: ``dfmp2 run``
    (once per ``--e2e-scf-precisions`` value: key 'dfmp2' for fp64, 'dfmp2 <precision>' for
    the others) and PySCF's DF-SCF + DF-MP2 (:func:`run_pyscf_e2e`) alternately,
    ``args.repeat`` times each, every run a fresh process."""
    precisions = args.e2e_scf_precisions.split(",")
    out = []
    dirs = molecule_dirs(args.molecule_dir)
    for entry in (entries(names, args.basis, args.auxbasis, dirs, args.reference, args.spin)
                  if names else []):
        for core in cores:
            label = f"end to end {entry['name']}/{entry['basis']} [{core}]"
            row = {"name": entry["name"], "basis": entry["basis"], "nbasis": entry["nbasis"],
                   "coretype": None if core == "unset" else core,
                   "reference": entry.get("reference", "rhf"), "pyscf": [],
                   **{e2e_key(prec): [] for prec in precisions}}
            for k in range(args.repeat):
                if not budget.ok():
                    skipped.append(f"{label} repetition {k + 1}: budget")
                    break
                log(f"{label} {k + 1}/{args.repeat}")
                for prec in precisions:
                    row[e2e_key(prec)].append(run_e2e(entry, core, args.timeout, prec))
                row["pyscf"].append(run_pyscf_e2e(entry, core, args.timeout))
            if row["pyscf"]:
                out.append(row)
    return out


def molecule_spec(entry: dict, args, precs: list[str]) -> dict:
    """What a molecule worker needs (see ``worker.run_molecule``)."""
    return {"kind": "molecule", **entry, "repeat": args.repeat, "warmup": args.warmup,
            "warmup_path": find_xyz("water", molecule_dirs(args.molecule_dir)),
            "precisions": precs,
            "cpu_blas": args.cpu_blas.split(",") if args.cpu_blas else None,
            "max_memory": args.max_memory, "conv_tol": args.conv_tol}


def measure_ladder(mols: list[dict], args, cores: list[str], precs: list[str],
                   budget: Budget, skipped: list) -> list[dict]:
    """One worker per molecule and coretype, smallest first, while the budget lasts."""
    raw = []
    for entry in mols:
        for core in cores:
            label = f"{entry['name']}/{entry['basis']} (nbasis {entry['nbasis']}) [{core}]"
            predicted = budget.predict(entry["nbasis"])
            if not budget.ok(predicted):
                skipped.append(f"{label}: not started at {budget.elapsed() / 60:.1f} min, "
                               f"predicted {predicted / 60:.1f} min, "
                               f"budget {args.budget_min:g} min")
                continue
            log(f"{label} ...")
            t0 = time.perf_counter()
            result = run_worker(molecule_spec(entry, args, precs), core, args.timeout)
            if "error" in result:
                skipped.append(f"{label}: {result['error']}")
                log(f"{label} failed: {result['error']}")
                continue
            raw.append(result)
            budget.last = (entry["nbasis"], time.perf_counter() - t0)
            log(f"{label} done at {budget.elapsed():.0f} s")
    return raw


def collect(args: argparse.Namespace) -> dict:
    """Run every measurement the arguments ask for; return the raw and summarised data."""
    import dfmp2.results

    started = datetime.datetime.now().isoformat(timespec="seconds")
    budget = Budget(args.budget_min)
    cores = args.coretypes.split(",")
    precs = precisions(args.precisions)
    names = args.molecules.split(",") if args.molecules else LADDERS.get(args.ladder, [])
    mols = [] if args.no_ladder else entries(
        names, args.basis, args.auxbasis, molecule_dirs(args.molecule_dir), args.reference,
        args.spin)
    info = {**machine.machine_info(), "versions": dfmp2.results.versions(),
            "source_start": source_state()}
    skipped: list[str] = []
    gemm = measure_gemm(cores)
    e2e_names = [] if args.no_e2e else (
        args.e2e.split(",") if args.e2e else E2E.get(args.ladder, []))
    e2e = measure_e2e(e2e_names, args, cores, budget, skipped)
    raw = measure_ladder(mols, args, cores, precs, budget, skipped)
    info["source_end"] = source_state()
    if info["source_end"] != info["source_start"]:
        log("warning: the dfmp2 sources changed during the run")
    rows = [row for mol in raw for row in report.dfmp2_rows(mol, gemm)]
    scaling = report.scaling_fits(rows) + report.scaling_fits(rows, min_nbasis=100)
    return {"name": args.name or args.ladder or "custom", "command": _command(),
            "started": started, "wall_s": budget.elapsed(), "repeat": args.repeat,
            "reference": args.reference,
            "warmup": args.warmup, "precisions": precs, "max_memory": args.max_memory,
            "conv_tol": args.conv_tol,
            "worker_thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
            "machine": info, "gemm": gemm, "rows": rows,
            "scaling": scaling, "e2e": e2e, "skipped": skipped, "raw": raw}


def _command() -> str:
    return "python3 " + shlex.join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])


#: Settings two runs must share for their workers to sit in one results file (``--append``).
_SHARED = ("reference", "repeat", "warmup", "precisions", "max_memory", "conv_tol",
           "worker_thread_timeout")


def append_to(previous: dict, data: dict) -> dict:
    """``data`` (this run) added to ``previous`` (the results file of the same name): workers,
    GEMM rates and end-to-end runs join the earlier ones (this run's GEMM rates replace those
    of a coretype measured twice), rows and fits are recomputed, and a worker measured now
    leaves the earlier 'Not measured' list. Both commands and both source states are kept."""
    for key in _SHARED:
        if previous.get(key) != data.get(key):
            raise SystemExit(f"--append: {key} differs from {data['name']}.json's "
                             f"({data.get(key)!r} here, {previous.get(key)!r} there)")
    done = [(m["name"], m["basis"], report.coretype_label(m["coretype"])) for m in data["raw"]]
    skipped = [s for s in previous.get("skipped", [])
               if not any(s.startswith(f"{n}/{b} (") and f"[{c}]:" in s for n, b, c in done)]
    gemm = {**previous["gemm"], **data["gemm"]}
    raw = previous["raw"] + data["raw"]
    rows = [row for mol in raw for row in report.dfmp2_rows(mol, gemm)]
    machine_info = {**previous["machine"], "source_end": data["machine"]["source_end"],
                    "appended": previous["machine"].get("appended", []) + [{
                        "started": data["started"], "loadavg": data["machine"]["loadavg"],
                        "source_start": data["machine"]["source_start"],
                        "source_end": data["machine"]["source_end"]}]}
    return {**previous, "command": f"{previous['command']}; then {data['command']}",
            "wall_s": previous["wall_s"] + data["wall_s"], "machine": machine_info,
            "gemm": gemm, "rows": rows,
            "scaling": report.scaling_fits(rows) + report.scaling_fits(rows, min_nbasis=100),
            "e2e": previous.get("e2e", []) + data["e2e"],
            "skipped": skipped + data["skipped"], "raw": raw}


def write(data: dict, out_dir: str) -> str:
    """Write <name>.md and <name>.json under ``out_dir``; return the markdown."""
    text = report.markdown(data)
    report.save(out_dir, data["name"], text, data)
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    timeout = thread_timeout(args.thread_timeout)
    os.environ.pop("OPENBLAS_THREAD_TIMEOUT", None)  # the workers inherit this environment
    if timeout is not None:
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = timeout
    data = collect(args)
    if args.append:
        with open(os.path.join(args.out_dir, data["name"] + ".json")) as handle:
            data = append_to(json.load(handle), data)
    print(write(data, args.out_dir))
    return 1 if any(report.energy_fails(r) for r in data["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
