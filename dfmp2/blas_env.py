"""The one owner of the process environment: what the ``dfmp2`` command sets, once, before the
numerical libraries load (:func:`prepare_process`), and the record of it that goes into the
result. Only the CLI (and the benchmark harness, which mirrors it) calls this module; the library
itself never reads or writes the environment.

**PySCF's kernels.**
PySCF wheels bundle OpenBLAS 0.3.3 (``pyscf/lib/libopenblas-r0-*.so``, loaded by
``libnp_helper``), which predates the CPUs this project runs on. On CPUs it does not know it falls
back to an old SSE-only core: "Barcelona" on the AMD EPYC machines (Zen 4 and Zen 5) of this
project, "Prescott" on an Intel Xeon Sapphire Rapids (issue 13). Its DGEMM then runs at half the
rate of its own Haswell kernels (49 against 106 GFLOP/s on the Zen 5 machine,
``docs/performance.md``; PySCF's DF-MP2 took 30 s against 16 s on the Intel machine).
``OPENBLAS_CORETYPE=Haswell`` selects the AVX2/FMA kernels, the newest that 0.3.3's PyPI build
has (asked for "SkylakeX", it runs Haswell). So the library itself is asked, not the CPU vendor:

1. a child process loads PySCF's library as PySCF does and asks ``openblas_get_corename()`` which
   core it picks by default (:func:`probe_pyscf_openblas`; a fresh process because
   ``OPENBLAS_CORETYPE`` acts only when the library loads, and once loaded here it stays);
2. if that core's kernels predate AVX2/FMA (:func:`is_pre_avx2_core`) and the CPU has AVX2 and
   FMA, PySCF's library loads here with ``OPENBLAS_CORETYPE=Haswell``. numpy's own (newer)
   OpenBLAS detects the CPU correctly, so numpy, scipy and torch load first, the variable is set
   only while PySCF's library loads, and the previous environment is restored;
3. the loaded library is asked again which core it runs, and both answers are recorded.

A value of ``OPENBLAS_CORETYPE`` the user set is kept and recorded with the cores it gave: it
acts on every OpenBLAS that loads with it, numpy's too (which runs dfmp2's products where
``--cpu-blas`` chose numpy), so both libraries are asked, with a warning where either runs
kernels older than AVX2/FMA on a CPU that has them. An empty value counts as unset.

**OpenBLAS's idle workers.** After each call OpenBLAS's worker threads spin for
``2^OPENBLAS_THREAD_TIMEOUT`` cycles (default 2^28, about 0.1 s) before they sleep. The
transform alternates GEMMs with int3c2e blocks computed by libcint's OpenMP threads, which then
share the cores with the spinning workers: on (H2O)20 cc-pVDZ (13 int3c2e blocks) the integrals
took 1.8-2.1 s after GEMMs against 1.45-1.6 s alone, and 1.5-1.7 s with a timeout of 2^20
cycles (:data:`OPENBLAS_THREAD_TIMEOUT`). Sleeping workers cost a wake-up (microseconds) at the
next call, nothing next to the GEMMs of this program. The variable is read when OpenBLAS loads.

**Thread counts that are not numbers.** ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and
``MKL_NUM_THREADS`` set to something other than a positive whole number (a cluster script's
unset ``$SLURM_CPUS_PER_TASK`` leaves ``OMP_NUM_THREADS`` empty) are ignored by the libraries,
which then run one thread per CPU, libgomp after two lines of its own on stderr. The command
says so in one warning and unsets the variable before any library loads
(:func:`drop_unreadable_thread_counts`); OpenMP's list form (``4,2``) is a number.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys

from .cpuinfo import choose_cpu_blas
from .cpuinfo import cpu_identity as _cpu
from .threads import _numpy_core_module

__all__ = ["prepare_process", "tune_pyscf_openblas", "load_pyscf_openblas",
           "probe_pyscf_openblas", "ask_openblas", "ask_numpy_openblas", "is_pre_avx2_core",
           "shorten_openblas_spin", "drop_unreadable_thread_counts", "OPENBLAS_THREAD_TIMEOUT",
           "PRE_AVX2_CORES", "CORRECTED_CORETYPE", "THREAD_COUNT_VARIABLES"]

logger = logging.getLogger(__name__)

#: The ``OPENBLAS_THREAD_TIMEOUT`` the CLI sets (log2 of the cycles an idle worker spins).
OPENBLAS_THREAD_TIMEOUT = "20"

#: The core PySCF's OpenBLAS is loaded with where it chose one of :data:`PRE_AVX2_CORES`.
CORRECTED_CORETYPE = "Haswell"

#: OpenBLAS x86 cores (``openblas_get_corename()``, lower case) whose kernels predate AVX2/FMA:
#: the SSE-only cores OpenBLAS falls back to on CPUs newer than it knows, and the AVX(-FMA) cores
#: without AVX2 (Sandybridge, Bulldozer, Piledriver, Steamroller). A core not named here (Haswell,
#: Zen, SkylakeX, Cooperlake, SapphireRapids, Excavator, names of later versions) is left alone.
PRE_AVX2_CORES = frozenset({
    "unknown", "generic", "katmai", "coppermine", "northwood", "prescott", "banias", "atom",
    "core2", "penryn", "dunnington", "nehalem", "athlon", "opteron", "opteron_sse3", "barcelona",
    "nano", "bobcat", "sandybridge", "bulldozer", "piledriver", "steamroller",
})

#: The CPU flags the Haswell kernels need.
_AVX2_FMA = frozenset({"avx2", "fma"})

#: The probe's limit in seconds (it took 0.11-0.15 s on a busy 2-core machine: a Python start,
#: the import of this module and one dlopen).
_PROBE_TIMEOUT_S = 30


def is_pre_avx2_core(core: str) -> bool:
    """True when OpenBLAS's core ``core`` (as ``openblas_get_corename()`` names it, any case)
    runs kernels older than AVX2/FMA (:data:`PRE_AVX2_CORES`)."""
    return core.strip().lower() in PRE_AVX2_CORES


def _pyscf_helper_path() -> str | None:
    """Path of PySCF's ``libnp_helper`` (the library that loads its OpenBLAS), found without
    importing PySCF; None when PySCF or the library is not there."""
    spec = importlib.util.find_spec("pyscf")
    for location in (spec.submodule_search_locations or []) if spec else []:
        for ext in (".so", ".dylib"):
            path = os.path.join(location, "lib", "libnp_helper" + ext)
            if os.path.exists(path):
                return path
    return None


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _file_of(function) -> str:
    """The shared object that defines the ctypes ``function`` (``dladdr``); '' if unknown."""
    try:
        dladdr = ctypes.CDLL(None).dladdr
    except (AttributeError, OSError):
        return ""
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    info = _DlInfo()
    if not dladdr(ctypes.cast(function, ctypes.c_void_p), ctypes.byref(info)):
        return ""
    return os.path.realpath(os.fsdecode(info.dli_fname)) if info.dli_fname else ""


#: ``openblas_get_corename`` and ``openblas_get_config`` under the names OpenBLAS builds give
#: them: plain; numpy 1.x's wheels' 64-bit-integer build (suffix ``64_``); scipy-openblas's
#: (numpy 2's wheel: 64-bit integers, suffix ``64_``; scipy's: 32-bit, no suffix).
_OPENBLAS_SYMBOLS = (("openblas_get_corename", "openblas_get_config"),
                     ("openblas_get_corename64_", "openblas_get_config64_"),
                     ("scipy_openblas_get_corename64_", "scipy_openblas_get_config64_"),
                     ("scipy_openblas_get_corename", "scipy_openblas_get_config"))


def ask_openblas(handle: ctypes.CDLL) -> dict:
    """Ask the OpenBLAS behind the loaded library ``handle`` (itself or a dependency) which core
    it runs: {'core', 'config', 'library', 'version'}, or {'error'} when there is no OpenBLAS."""
    for corename_symbol, config_symbol in _OPENBLAS_SYMBOLS:
        corename = getattr(handle, corename_symbol, None)
        config = getattr(handle, config_symbol, None)
        if corename is not None and config is not None:
            break
    else:
        return {"error": f"no openblas_get_corename in {os.path.basename(handle._name)} or its "
                         "dependencies (not OpenBLAS)"}
    corename.restype = config.restype = ctypes.c_char_p
    library = _file_of(corename)
    config_text = (config() or b"").decode(errors="replace").strip()
    version = re.search(r"(\d+\.\d+\.\d+)", config_text) or re.search(
        r"(\d+\.\d+\.\d+)", os.path.basename(library))
    return {"core": (corename() or b"").decode(errors="replace").strip(), "config": config_text,
            "library": library, "version": version.group(1) if version else "unknown"}


def ask_numpy_openblas() -> dict:
    """Which core numpy's own OpenBLAS runs (:func:`ask_openblas` through numpy's compiled core,
    which resolves the name in the BLAS it was linked against, whatever that file is called:
    a wheel's ``numpy.libs``, conda's, a distribution's), or {'error'} when numpy's BLAS is
    not an OpenBLAS."""
    try:
        return ask_openblas(ctypes.CDLL(_numpy_core_module().__file__))
    except OSError as exc:
        return {"error": f"numpy's compiled core could not be opened: {exc}"}


def _probe_child(helper: str) -> None:
    """The child of :func:`probe_pyscf_openblas`: load ``helper`` and print the answer as JSON."""
    print(json.dumps(ask_openblas(ctypes.CDLL(helper))))


def probe_pyscf_openblas(helper: str) -> dict:
    """Which core PySCF's OpenBLAS picks by itself: load ``helper`` (PySCF's ``libnp_helper``,
    as PySCF loads it) in a child process with ``OPENBLAS_CORETYPE`` unset, and ask it
    (:func:`ask_openblas`); {'error'} if the child fails."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE",
                                                            "OPENBLAS_VERBOSE")}
    env["OPENBLAS_NUM_THREADS"] = "1"  # no worker threads: the core is chosen regardless
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    code = "import sys; from dfmp2.blas_env import _probe_child; _probe_child(sys.argv[1])"
    try:
        done = subprocess.run([sys.executable, "-c", code, helper], env=env, capture_output=True,
                              text=True, timeout=_PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"the probe of {helper} did not run: {exc}"}
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"the probe of {helper} failed (exit {done.returncode}: {last})"}


def _pyscf_loaded() -> bool:
    """Whether PySCF's libraries (and with them its OpenBLAS) have loaded in this process."""
    return "pyscf.lib" in sys.modules


def _load_pyscf(coretype: str | None) -> dict:
    """Import ``pyscf.lib`` (loading its OpenBLAS) after numpy, scipy and torch, with
    ``OPENBLAS_CORETYPE=coretype`` set only meanwhile when given; ask the loaded library."""
    import numpy  # noqa: F401  - numpy, scipy and torch pick their own kernels first
    import scipy.linalg  # noqa: F401
    import torch  # noqa: F401

    if coretype is None:
        import pyscf.lib
    else:
        os.environ["OPENBLAS_CORETYPE"] = coretype
        try:
            import pyscf.lib  # loads the bundled libopenblas
        finally:
            del os.environ["OPENBLAS_CORETYPE"]
    return ask_openblas(pyscf.lib.load_library("libnp_helper"))


def load_pyscf_openblas() -> dict:
    """Load PySCF's OpenBLAS with the right kernels (see the module docstring) and return the
    record: 'summary' (one line), 'library', 'version', 'default' (the core it picks by
    itself; None when not probed), 'OPENBLAS_CORETYPE' (what it loaded with; None: nothing),
    'loaded' (the core it runs), 'avx2_fma' (whether the CPU has both)."""
    has_avx2_fma = _AVX2_FMA <= _cpu()[2]
    record = {"default": None, "OPENBLAS_CORETYPE": None, "avx2_fma": has_avx2_fma}
    helper = _pyscf_helper_path()
    user = os.environ.get("OPENBLAS_CORETYPE") or None  # set empty: OpenBLAS detects, as unset
    preloaded = user is None and _pyscf_loaded()  # in-process use (tests, notebooks)
    # what was done: {v} and {core} are the version and the loaded core
    if user is not None:
        loaded, record["OPENBLAS_CORETYPE"] = _load_pyscf(None), user
        numpy_core = ask_numpy_openblas()  # it read the variable too, when numpy loaded
        record["numpy_core"] = numpy_core.get("core")
        done = (f"OPENBLAS_CORETYPE={user} (set by the user): PySCF's OpenBLAS {{v}} runs "
                "{core}; " + (f"numpy's OpenBLAS, which reads it too, runs {numpy_core['core']}"
                              if "core" in numpy_core else numpy_core["error"]))
    elif preloaded:
        loaded = _load_pyscf(None)
        done = ("PySCF's OpenBLAS {v} had loaded before the CLI could choose its kernels: "
                "runs {core}")
    elif helper is None:
        loaded = _load_pyscf(None)
        done = "PySCF's OpenBLAS {v} not probed (no libnp_helper in pyscf/lib): runs {core}"
    else:
        default = probe_pyscf_openblas(helper)
        record["default"] = default.get("core")
        if "error" in default:
            loaded = _load_pyscf(None)
            done = f"PySCF's OpenBLAS {{v}} not probed ({default['error']}): runs {{core}}"
        elif not is_pre_avx2_core(default["core"]):
            loaded = _load_pyscf(None)
            done = f"PySCF's OpenBLAS {{v}} chose {default['core']}; kept: runs {{core}}"
        elif not has_avx2_fma:
            loaded = _load_pyscf(None)
            done = (f"PySCF's OpenBLAS {{v}} chose {default['core']}; kept, as this CPU has no "
                    "AVX2/FMA: runs {core}")
        else:
            loaded = _load_pyscf(CORRECTED_CORETYPE)
            record["OPENBLAS_CORETYPE"] = CORRECTED_CORETYPE
            done = (f"PySCF's OpenBLAS {{v}} chose {default['core']}; loaded with "
                    f"OPENBLAS_CORETYPE={CORRECTED_CORETYPE}: now {{core}}")
    if "error" in loaded:
        record.update(library="", version="unknown", loaded=None, summary=loaded["error"])
        return record
    record.update(library=loaded["library"], version=loaded["version"], loaded=loaded["core"])
    record["summary"] = done.format(v=loaded["version"], core=loaded["core"])
    if has_avx2_fma and is_pre_avx2_core(loaded["core"]) and user is None and not preloaded:
        # the correction failed; when PySCF had loaded first (in-process use) the record says so
        logger.warning("PySCF's OpenBLAS runs %s kernels on this AVX2/FMA CPU, at a fraction of "
                       "its DGEMM rate (%s)", loaded["core"], record["summary"])
    slow = [core for core in (loaded["core"], record.get("numpy_core")) if core
            and is_pre_avx2_core(core)]
    if has_avx2_fma and user is not None and slow:
        logger.warning("OPENBLAS_CORETYPE=%s leaves %s kernels running on this AVX2/FMA CPU, at "
                       "a fraction of their DGEMM rate (%s); unset it and the dfmp2 command "
                       "gives PySCF's OpenBLAS Haswell kernels and leaves numpy's its own "
                       "choice", user, " and ".join(sorted(set(slow))), record["summary"])
    return record


def tune_pyscf_openblas() -> str:
    """Load PySCF's OpenBLAS as :func:`load_pyscf_openblas` does; return its one-line summary
    (the benchmark harness prints it)."""
    return load_pyscf_openblas()["summary"]


def shorten_openblas_spin() -> str:
    """Set ``OPENBLAS_THREAD_TIMEOUT`` to :data:`OPENBLAS_THREAD_TIMEOUT` unless it is set or
    numpy (and with it its OpenBLAS) has already loaded; return what was done."""
    if os.environ.get("OPENBLAS_THREAD_TIMEOUT"):  # set empty: OpenBLAS's default, as unset
        return f"OPENBLAS_THREAD_TIMEOUT={os.environ['OPENBLAS_THREAD_TIMEOUT']} (set by the user)"
    if "numpy" in sys.modules:
        return "OPENBLAS_THREAD_TIMEOUT unset: numpy had loaded before the CLI could set it"
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = OPENBLAS_THREAD_TIMEOUT
    return f"OPENBLAS_THREAD_TIMEOUT={OPENBLAS_THREAD_TIMEOUT} (idle OpenBLAS workers sleep sooner)"


#: The variables that size the thread pools of libgomp, OpenBLAS and MKL.
THREAD_COUNT_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def drop_unreadable_thread_counts() -> dict:
    """Unset each of :data:`THREAD_COUNT_VARIABLES` that is set but not a positive whole number
    (for ``OMP_NUM_THREADS``, a comma-separated list of them), with one warning each; return
    ``{name: what was done}`` for the record. Before any numerical library loads."""
    done = {}
    for name in THREAD_COUNT_VARIABLES:
        value = os.environ.get(name)
        if value is None:
            continue
        parts = value.split(",") if name == "OMP_NUM_THREADS" else [value]
        if all(part.strip().isdigit() and int(part) > 0 for part in parts):
            continue
        del os.environ[name]
        logger.warning("%s=%r is not a positive whole number: unset for this run, so its "
                       "libraries run one thread per CPU; set it to a number, or use "
                       "--threads N", name, value)
        done[name] = f"{value!r} unset (not a positive whole number)"
    return done


def prepare_process(cpu_blas: str) -> dict:
    """Set what must be set before numpy, torch and PySCF load, in the one order that works, and
    return the record of it (stored in the result's ``environment``).

    1. ``OPENBLAS_THREAD_TIMEOUT`` (read when numpy's OpenBLAS loads);
    2. ``OMP_WAIT_POLICY=PASSIVE`` when numpy's BLAS runs the products (torch's OpenMP threads
       must not spin while OpenBLAS works; libgomp reads it when torch loads);
    3. PySCF's bundled OpenBLAS asked which core it picks, and loaded with Haswell kernels where
       that core predates AVX2/FMA on an AVX2/FMA CPU: ``pyscf_openblas`` says what was done in
       one line, ``pyscf_openblas_core`` holds the library, the default and the loaded core.
    A value the user set is kept and recorded as such, unless it is a thread count that is not
    a number (:func:`drop_unreadable_thread_counts`, first)."""
    record = drop_unreadable_thread_counts()
    record["OPENBLAS_THREAD_TIMEOUT"] = shorten_openblas_spin()
    if choose_cpu_blas(cpu_blas)[0] == "numpy":
        if os.environ.get("OMP_WAIT_POLICY"):
            record["OMP_WAIT_POLICY"] = f"{os.environ['OMP_WAIT_POLICY']} (set by the user)"
        elif "torch" in sys.modules:  # its OpenMP runtime read the environment when it loaded
            record["OMP_WAIT_POLICY"] = ("unset: torch had loaded before the CLI could set "
                                         "PASSIVE; its OpenMP threads keep their default")
        else:
            os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
            record["OMP_WAIT_POLICY"] = "PASSIVE (numpy's BLAS runs the products)"
    pyscf_blas = load_pyscf_openblas()
    record["pyscf_openblas"] = pyscf_blas.pop("summary")
    record["pyscf_openblas_core"] = pyscf_blas
    return record
