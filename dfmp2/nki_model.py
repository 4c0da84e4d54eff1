"""A cost model of dfmp2's NKI kernels that anyone can run: emulate one launch of each kernel at a
shape, check it against float64, count its instructions from the emulator's trace and price each
with the per-instruction costs AWS documents for trn1 (NeuronCore-v2) and trn2 (NeuronCore-v3).

Modeled, never measured: the numbers say where the time would go if the documented rules of
thumb hold, and they are the first thing to compare with a profile on hardware
(``docs/nki.md``, "Hardware-day checklist"). Sources (aws-neuron/aws-neuron-sdk at
65c21355d97095de19c5c7b7c6cd21ba6fecd020, the commit that ships NKI 0.3.0):

- A2 = ``nki/guides/architecture/trainium_inferentia2_arch.rst`` (NeuronCore-v2);
- A3 = ``nki/guides/architecture/trainium2_arch.rst`` (NeuronCore-v3);
- DMA = ``nki/deep-dives/nki-dma-bandwidth-guide.rst``;
- OLD = the SDK 2.26 ``nki.isa`` stub (its "Estimated instruction cost" sections; dropped from
  the 0.3.0 stub, so secondary).

Assumptions (each a rule of thumb of those documents, none verified on hardware):

- TensorE: a matmul costs ``max(N, 64)`` cycles, N the moving free size, 4x for fp32
  (A2 "initiation interval ... roughly max(N, MM_INIT_LATENCY)", "FP32 ... roughly 4x"); a
  TensorE transpose of a (P, F) tile ``max(P, min(64, F))`` cycles (OLD), 4x for fp32.
- VectorE: ``max(64, N)`` cycles for one input (N elements per partition), ``max(64, 2N)`` for
  two SBUF inputs and ``max(64, N)`` when one is in PSUM, ``max(64, 8N)`` for ``reciprocal``
  (OLD; A2 "roughly N cycles", "roughly 2N"); ScalarE ``activation`` ``max(64, N)`` (A2: the
  same cost with or without scale and bias); no static overhead beyond the 64-cycle minimum.
- DMA: 16 queues per NeuronCore at 17 B/ns (trn1) or 23 B/ns (trn2) each (DMA, table); a
  transfer whose contiguous runs in HBM (per partition row, recorded by the emulator's trace)
  are shorter than 2 KiB runs at that fraction of the bandwidth (DMA: "at least 2-4 KiB" of
  contiguous data per partition for full bandwidth); a casting DMA is priced at the larger of
  its source and destination bytes.
- Engines overlap perfectly (the model's time of a launch is its busiest engine's); the
  serialised sum is reported beside it. Matmul flops count whole 128-row K tiles (the host
  zero-pads the auxiliary index), so the utilization of a ragged naux includes padding. Launch overhead: 0.7 ms per launch through torch-xla
  (measured by trnsci on trn1, ``../shared/reference/trnsci.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["TARGETS", "Target", "instruction_cost", "model_records", "run_model"]


@dataclass(frozen=True)
class Target:
    """Documented rates of one NeuronCore."""

    name: str
    tensor_ghz: float  # A2 / A3 engine table
    vector_ghz: float
    scalar_ghz: float
    gpsimd_ghz: float
    fp32_peak_tflops: float  # A2 "23 TFLOPS for FP32"; A3 "20 FP32"
    dma_queues: int  # DMA table: 16 per NeuronCore
    dma_bytes_per_ns: float  # per queue: 17 (trn1), 23 (trn2)


TARGETS = {
    "trn1": Target("trn1", 2.8, 1.12, 1.4, 1.4, 23.0, 16, 17.0),
    "trn2": Target("trn2", 2.4, 0.96, 1.2, 1.2, 20.0, 16, 23.0),
}
#: Minimum cycles of one instruction (MM_INIT_LATENCY and VectorE MIN_II, A2 / OLD).
MIN_CYCLES = 64
#: Contiguous bytes per partition a DMA needs for full bandwidth (DMA guide: "at least 2-4 KiB").
DMA_FULL_BYTES_PER_PARTITION = 2048
#: Host dispatch per kernel launch through torch-xla (trnsci, trn1).
LAUNCH_SECONDS = 0.7e-3
#: Rows (orbitals i) of the pair kernels' device loop the model emulates per launch: the time
#: per pair includes each row's own loads, amortised over the launch's columns as on device.
MODEL_ROWS = 2
#: Bytes the model holds per emulated (ia|jb) product of one launch, per element (float64,
#: with the emulator's tiles and the check's reference): 3.1-3.7 measured at nvir 2000 and
#: 4000 (peak RSS over an idle model), rounded up.
CHECK_BYTES_PER_ELEMENT = 4 * 8
#: How the host spreads the pair work (``nki_runtime.TARGETS``): trn1 sends launches of one
#: program to its two NeuronCores in turn; trn2 launches ``kernel[2]`` on one LNC=2 logical
#: core (two physical cores), halving each launch's rows per core. The step lasts as long as
#: the busier core's share (:func:`_busiest_core_pairs`); dispatch stays serial on one host
#: thread. (``cores`` here counts physical cores; the run record's trn2 ``cores`` is 1 logical
#: core of LNC=2.) On hardware, trn1's second core is not yet reached (docs/nki.md).
CORES = {"trn1": {"lnc": 1, "cores": 2}, "trn2": {"lnc": 2, "cores": 2}}
#: Tolerances of the float64 checks: gemm and fp32 pair sums (float32 accumulation), relative
#: to the largest reference value; the bf16x3 pair sums, whose products miss at most
#: SPLIT_RTOL / 2 = 3 * 2^-18 of |a||b| (the bound of ``--nki-matmul bf16x3``: twice that of
#: |E(corr)|; tests/tolerances.py, TOL_NKI_BF16X3_ECORR_REL), each term within its own
#: first-order bound (:func:`_split_bound`).
GEMM_RTOL = 1e-5
FP32_RTOL = 1e-6
SPLIT_RTOL = 6 * 2.0**-18
_FP32_FACTOR = 4


def _free(shape) -> int:
    return int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1


def instruction_cost(record, target: Target) -> tuple[str, float, float]:
    """``(engine, seconds, useful_flops)`` of one trace record under ``target``'s rates."""
    ops = record.operands
    name = record.instruction
    if name.startswith("register_"):
        # nisa.register_alloc/move/load/store: engine-sequencer register work, not costed
        # (register_alloc and register_move have no tensor operand to cost by)
        return "scalar", 0.0, 0.0
    if name == "dma_copy":
        # bytes read or written in HBM, whichever is larger (a casting DMA moves both), at the
        # fraction of the rate its contiguous runs allow (the HBM side's, per partition row)
        moved = max(record.nbytes, record.attrs.get("src_bytes", 0))
        run = record.attrs.get("run_bytes", moved)
        efficiency = min(1.0, run / DMA_FULL_BYTES_PER_PARTITION)
        rate = target.dma_queues * target.dma_bytes_per_ns * 1e9 * efficiency
        return "dma", moved / rate, 0.0
    if name == "nc_matmul":
        k, m = ops["stationary"].shape[0], _free(ops["stationary"].shape)
        n = _free(ops["moving"].shape)
        factor = _FP32_FACTOR if ops["moving"].dtype == "float32" else 1
        cycles = max(n, MIN_CYCLES) * factor
        return "tensor", cycles / (target.tensor_ghz * 1e9), 2.0 * k * m * n
    if name == "nc_transpose" and record.engine == "tensor":
        p, f = ops["data"].shape[0], _free(ops["data"].shape)
        factor = _FP32_FACTOR if ops["data"].dtype == "float32" else 1
        cycles = max(p, min(MIN_CYCLES, f)) * factor
        return "tensor", cycles / (target.tensor_ghz * 1e9), 0.0
    data = ops.get("data", ops.get("src", ops.get("data1", ops.get("dst"))))
    n = _free(data.shape)
    if name == "reciprocal":
        cycles = max(MIN_CYCLES, 8 * n)
    elif name == "tensor_tensor":
        in_psum = "psum" in (ops["data1"].buffer, ops["data2"].buffer)
        cycles = max(MIN_CYCLES, n if in_psum else 2 * n)
    else:
        cycles = max(MIN_CYCLES, n)
    engine = record.engine if record.engine in ("vector", "scalar", "gpsimd") else "vector"
    ghz = {"vector": target.vector_ghz, "scalar": target.scalar_ghz,
           "gpsimd": target.gpsimd_ghz}[engine]
    return engine, cycles / (ghz * 1e9), 0.0


def model_records(records, target: Target) -> dict:
    """Modeled engine times of a launch's trace records: ``{"engines": {engine: seconds},
    "modeled_seconds": busiest engine, "serial_seconds": their sum, "tensore_utilization":
    the matmuls' flops at their dtype's peak (fp32: the documented fp32 peak; bfloat16 and the
    other 16-bit types: 4x it, A2 "92 TFLOPS ... 23 TFLOPS for FP32") over modeled_seconds,
    "matmul_gflop", "instructions"}``."""
    engines = {"tensor": 0.0, "vector": 0.0, "scalar": 0.0, "gpsimd": 0.0, "dma": 0.0}
    flops = ideal = 0.0
    peak = target.fp32_peak_tflops * 1e12
    for record in records:
        engine, seconds, useful = instruction_cost(record, target)
        engines[engine] += seconds
        if useful:
            fp32 = record.operands["moving"].dtype == "float32"
            flops += useful
            ideal += useful / (peak if fp32 else _FP32_FACTOR * peak)
    modeled = max(engines.values())
    return {
        "engines": engines,
        "modeled_seconds": modeled,
        "serial_seconds": sum(engines.values()),
        "tensore_utilization": ideal / modeled if modeled > 0 else 0.0,
        "matmul_gflop": flops / 1e9,
        "instructions": len(records),
    }


# -- the kernels at one shape ------------------------------------------------------------------
def _traced(fn):
    from .nki_emulator import trace

    with trace() as tr:
        out = fn()
    return out, tr


def _check(got, want, rtol, scale=None) -> dict:
    """Whether ``got`` is ``want`` to ``rtol`` of ``scale`` (default: the largest |want|)."""
    err = float(np.abs(np.asarray(got, dtype=np.float64) - np.asarray(want)).max())
    if scale is None:
        scale = float(np.abs(np.asarray(want)).max())
    scale = scale or 1.0
    return {"max_abs_error": err, "rtol": rtol, "passed": bool(err <= rtol * scale)}


def _pair_chunk(nocc: int, nvir: int, naux: int, exchange: bool, rng,
                matmul: str = "fp32") -> dict:
    """The launches of one block of pairs (the launch plan's columns by ``MODEL_ROWS`` rows of
    its device loop, every a-tile window) of a fused pair kernel on synthetic operands, and
    their fp64 check."""
    from .energy import reference_pair_sums
    from .linalg import nki_ops, nki_runtime

    split = matmul == "bf16x3"
    cols, window = nki_ops._energy_launch_plan(nvir, nvir, naux, exchange, split)
    if window == 0:
        raise ValueError(nki_ops._energy_supports_shape(nvir, nvir, naux, exchange, split))
    ci, cj = min(nocc, MODEL_ROWS), min(nocc, cols)  # a launch's columns, a few of its rows
    ovl_i = torch.from_numpy(rng.standard_normal((ci, nvir, naux)) * 0.05)
    ovl_j = torch.from_numpy(rng.standard_normal((cj, nvir, naux)) * 0.05)
    e_i = torch.from_numpy(rng.uniform(-1.5, -0.3, ci))
    e_j = torch.from_numpy(rng.uniform(-1.5, -0.3, cj))
    e_vir = torch.from_numpy(rng.uniform(0.1, 3.0, nvir))
    args = (ovl_i, ovl_j, e_i, e_j, e_vir, e_vir, torch.ones((ci, cj), dtype=torch.float64),
            exchange)
    core = nki_runtime.NkiDevice("emulator", lnc=1)  # one physical core's instruction stream
    got, tr = _traced(lambda: nki_ops.mp2_pair_sums(*args, mode="emulator", products=matmul,
                                                    device=core))
    want = reference_pair_sums(*args)
    if split:  # each term within its own first-order bound (a pair sum can cancel to ~0)
        miss = np.abs(np.asarray(got.numpy(), dtype=np.float64) - want)
        bound = _split_bound(*args)
        check = {"max_abs_error": float(miss.max()), "rtol": SPLIT_RTOL,
                 "passed": bool(np.all(miss <= bound))}
    else:
        check = _check(got.numpy(), want, FP32_RTOL)
    return {"records": tr.records, "launches": len(tr.kernels), "pairs": ci * cj,
            "window_tiles": window, **check}


def _split_bound(ovl_i, ovl_j, e_i, e_j, e_a, e_b, weights, exchange) -> np.ndarray:
    """The most bf16x3 pair sums may miss, per term ([direct, exchange]): each product of
    the split misses at most SPLIT_RTOL / 2 (3 * 2^-18) of |a||b|, and its float32 PSUM sum
    over naux adds about 4 sqrt(naux) 2^-24 of the same, so T = (ia|jb) misses at most eps M,
    M = sum_Q |B_ia^Q||B_jb^Q|; the direct term T^2/d then at most (2|T| eps M + (eps M)^2)/|d|
    and the exchange term T_ab T_ba/d at most (|T_ab| eps M_ba + eps M_ab |T_ba| + eps^2
    M_ab M_ba)/|d|. Per term, so a wrong or missing exchange term is not hidden by the larger
    direct one, and relative to the products' magnitude, so a pair sum that cancels (naux 2)
    is not held to a tolerance of its own near-zero value."""
    b_i, b_j = (np.asarray(x, dtype=np.float64) for x in (ovl_i, ovl_j))
    eps = SPLIT_RTOL / 2 + 4 * np.sqrt(b_i.shape[-1]) * 2.0**-24
    t = np.abs(np.einsum("iaP,jbP->ijab", b_i, b_j))
    m = eps * np.einsum("iaP,jbP->ijab", np.abs(b_i), np.abs(b_j))
    d = np.abs(np.asarray(e_i)[:, None, None, None] + np.asarray(e_j)[None, :, None, None]
               - np.asarray(e_a)[None, None, :, None] - np.asarray(e_b)[None, None, None, :])
    w = np.abs(np.asarray(weights, dtype=np.float64))[:, :, None, None]
    direct = float(np.sum(w * (2 * t * m + m * m) / d))
    if not exchange:
        return np.array([direct, 0.0])
    t_ba, m_ba = t.transpose(0, 1, 3, 2), m.transpose(0, 1, 3, 2)
    return np.array([direct, float(np.sum(w * (t * m_ba + m * t_ba + m * m_ba) / d))])


def _check_memory(nocc: int, nvir: int, naux: int, available: int | None = None) -> None:
    """Refuse (ValueError, one line) a shape whose emulated launch and float64 check would need
    more memory than the machine has available (``available`` bytes; /proc/meminfo's
    MemAvailable where not given): the (ia|jb) products of one launch's pairs, nvir^2 each."""
    from .linalg import nki_ops

    cols = max(nki_ops._energy_launch_plan(nvir, nvir, naux, exchange, False)[0]
               for exchange in (True, False))
    pairs = min(nocc, MODEL_ROWS) * min(nocc, max(cols, 1))
    need = pairs * nvir * nvir * CHECK_BYTES_PER_ELEMENT
    if available is None:
        available = _available_bytes()
    if available is not None and need > available:
        raise ValueError(f"modeling nvir {nvir} needs about {need / 1e9:.1f} GB ({pairs} pairs' "
                         f"(ia|jb) products emulated and checked in float64), and this process "
                         f"may use {available / 1e9:.1f} GB more (the machine's available "
                         "memory, or its ulimit -v); model a smaller nvir")


def _available_bytes() -> int | None:
    """What this process may still allocate, in bytes: MemAvailable of /proc/meminfo, or less
    under a limit of the process's address space (``ulimit -v``: the limit less the process's
    VmSize); None where neither is known."""
    machine = _proc_field("/proc/meminfo", "MemAvailable:")
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        limit = None if limit == resource.RLIM_INFINITY else limit
    except (ImportError, OSError, ValueError):
        limit = None
    used = _proc_field("/proc/self/status", "VmSize:")
    room = None if limit is None or used is None else max(0, limit - used)
    known = [b for b in (machine, room) if b is not None]
    return min(known) if known else None


def _proc_field(path: str, key: str) -> int | None:
    """A ``key: <n> kB`` line of a /proc file, in bytes (None where there is none)."""
    try:
        with open(path, encoding="ascii") as handle:
            for line in handle:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _launched_blocks(nocc: int, nvir: int, naux: int, split: bool) -> tuple[list, int]:
    """``(blocks, windows)`` the host launches for the closed-shell pairs i <= j of one
    occupied block (B on the device: one block spans the occupied space): per block of the
    plan's columns ``(rows, cols)``, its device loop over the rows 0 .. j1 (the block's last
    column), so a block's pairs below the diagonal run too, each block launched once per a-tile
    window (``nki_ops.mp2_pair_sums``)."""
    from .linalg import nki_ops

    cols, window = nki_ops._energy_launch_plan(nvir, nvir, naux, True, split)
    windows = nki_ops.ceil_div(nki_ops.ceil_div(nvir, nki_ops.TILE_M), window)
    blocks = [(min(nocc, j0 + cols), min(nocc, j0 + cols) - j0) for j0 in range(0, nocc, cols)]
    return blocks, windows


def _launched_pairs(nocc: int, nvir: int, naux: int, split: bool) -> tuple[int, int]:
    """``(pairs, launches)`` of :func:`_launched_blocks`."""
    blocks, windows = _launched_blocks(nocc, nvir, naux, split)
    return sum(rows * cols for rows, cols in blocks), len(blocks) * windows


def _busiest_core_pairs(blocks, target: str) -> int:
    """Pairs on the busiest of the two cores the host uses: trn2 splits every block's rows
    over ``kernel[2]``'s two programs (the larger half bounds a launch); trn1 sends the blocks
    to its two NeuronCores in turn."""
    if CORES[target]["lnc"] == 2:
        return sum(-(-rows // 2) * cols for rows, cols in blocks)
    loads = [0, 0]
    for k, (rows, cols) in enumerate(blocks):
        loads[k % 2] += rows * cols
    return max(loads)


def run_model(nocc: int, nvir: int, naux: int, target: str = "trn1", seed: int = 7) -> dict:
    """Emulate each kernel at ``(nocc, nvir, naux)``, check it against float64 and model it on
    ``target``: one ``gemm_kernel`` launch (a (<=512, naux) by (naux, <=512) product of the
    fit), and one chunk of pairs of each fused pair kernel (every a-tile window of it, as the
    host launches them), the exchange kernel also with bf16x3 products. The DF-MP2 energy step
    (closed shell, pairs i <= j) is modeled from the exchange kernel's chunk, fp32 and bf16x3:
    its kernel time per pair (one physical core's instruction stream) times the pairs the host
    launches (``_launched_blocks``: whole rows, so more than nocc*(nocc+1)/2), on the busiest of
    the two cores the host uses (:data:`CORES`; ``seconds_one_core`` without them), plus the
    overhead of every launch; B is uploaded once (``b_upload_bytes``). Returns the JSON-ready
    report."""
    from .linalg import nki_ops
    from .nki_emulator import install

    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    _check_memory(nocc, nvir, naux)
    install()
    spec = TARGETS[target]
    rng = np.random.default_rng(seed)
    kernels = {}

    m, n = min(nocc * nvir, 512), min(naux, 512)
    a = torch.from_numpy(rng.standard_normal((m, naux)))
    b = torch.from_numpy(rng.standard_normal((naux, n)))
    got, tr = _traced(lambda: nki_ops.gemm(a, b, mode="emulator"))
    kernels["gemm_kernel"] = {**model_records(tr.records, spec), "launches": len(tr.kernels),
                              **_check(got.numpy(), (a @ b).numpy(), GEMM_RTOL)}
    not_modeled = {}
    for exchange, name, matmul in ((True, "mp2_pair_energy_kernel", "fp32"),
                                   (False, "mp2_pair_direct_kernel", "fp32"),
                                   (True, "mp2_pair_energy_kernel[bf16x3]", "bf16x3")):
        try:
            chunk = _pair_chunk(nocc, nvir, naux, exchange, rng, matmul)
        except ValueError as exc:
            if matmul == "fp32":
                raise  # the shape itself is beyond the kernels
            not_modeled[name] = str(exc)  # bf16x3 fills a launch sooner: named, not fatal
            continue
        kernels[name] = {**model_records(chunk["records"], spec),
                         **{k: chunk[k] for k in ("launches", "pairs", "window_tiles",
                                                  "max_abs_error", "rtol", "passed")}}
    npairs = nocc * (nocc + 1) // 2
    steps = {"bf16x3": None}
    for matmul, name in (("fp32", "mp2_pair_energy_kernel"),
                         ("bf16x3", "mp2_pair_energy_kernel[bf16x3]")):
        if name not in kernels:
            continue
        chunk = kernels[name]
        chunk["seconds_per_pair"] = chunk["modeled_seconds"] / chunk["pairs"]
        blocks, windows = _launched_blocks(nocc, nvir, naux, matmul == "bf16x3")
        launched = sum(rows * cols for rows, cols in blocks)
        launches = len(blocks) * windows
        kernel_seconds = chunk["seconds_per_pair"] * launched
        busiest = _busiest_core_pairs(blocks, target)
        steps[matmul] = {"pairs": npairs, "launched_pairs": launched,
                         "kernel_seconds": kernel_seconds, "launches": launches,
                         "launch_seconds": launches * LAUNCH_SECONDS,
                         "seconds_one_core": kernel_seconds + launches * LAUNCH_SECONDS,
                         "cores": CORES[target]["cores"], "busiest_core_pairs": busiest,
                         "seconds": (chunk["seconds_per_pair"] * busiest
                                     + launches * LAUNCH_SECONDS),
                         "b_upload_bytes": nki_ops.resident_b_bytes(nocc, nvir, naux, matmul)}
    return {
        "ran_on_emulator": True,
        "target": target,
        "shape": {"nocc": nocc, "nvir": nvir, "naux": naux},
        "kernels": kernels,
        "energy_step_seconds": steps["fp32"]["seconds"],
        "energy_step": steps["fp32"],
        "energy_step_bf16x3": steps["bf16x3"],
        "not_modeled": not_modeled,
        "passed": all(k["passed"] for k in kernels.values()),
    }
