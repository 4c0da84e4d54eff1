"""Where the MP2 step's tensors live: the host (the CPU pipeline of :mod:`dfmp2.pipeline`, with
its BLAS choice and out-of-core store) or a CUDA device through torch (``--device``).

:func:`resolve_device` decides once per run and says why; :func:`plan_device` decides, from the
device's memory, whether the transformed and fitted integrals stay on the device for the whole
step or B stays in host memory and the pair blocks stream to the device
(:func:`dfmp2.pipeline.dfmp2_pair_energies`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ._names import DEVICES
from .errors import BackendUnavailableError, InputError

log = logging.getLogger(__name__)

__all__ = ["DEVICES", "ComputeDevice", "DevicePlan", "plan_device", "resolve_device"]

#: Share of the device's free memory (or of ``--device-memory``) the plan may fill: the CUDA
#: caching allocator and cuBLAS workspaces take the rest.
DEVICE_RESERVE = 0.10


@dataclass(frozen=True)
class ComputeDevice:
    """The run's compute device: ``device`` the torch device of the MP2 step (None: the host
    pipeline), ``reason`` why, ``name`` the device's name, ``memory_bytes`` its memory budget
    (None on the host path), ``host_bytes`` the host memory its staging buffers may take (set
    from ``--max-memory`` by the run; None: not limited)."""

    requested: str
    device: torch.device | None
    reason: str
    name: str
    memory_bytes: int | None = None
    host_bytes: int | None = None

    def as_dict(self) -> dict:
        return {"requested": self.requested,
                "resolved": str(self.device) if self.device is not None else "host",
                "reason": self.reason, "name": self.name,
                "memory_mb": None if self.memory_bytes is None
                else round(self.memory_bytes / 2**20, 1)}


#: ``--device auto`` takes a CUDA device only when the run may use at least this much of its
#: memory (a GPU that another process fills would stream tiny pair blocks).
AUTO_MIN_BYTES = 256 * 2**20


def resolve_device(requested: str, backend: str, distributed: bool = False,
                   memory_mb: int | None = None, warn: bool = False) -> ComputeDevice:
    """The device of a run. ``auto``: the current CUDA device when torch sees one (pytorch
    backend, one process), else the host; ``cpu``: the host; ``cuda``: the current CUDA device,
    or a :class:`BackendUnavailableError` saying why not. ``memory_mb``: the budget on the
    device (default: its free memory now); ``auto`` stays on the host when that budget is under
    :data:`AUTO_MIN_BYTES`. With ``warn``, a ``memory_mb`` that ``auto`` could not apply (no
    CUDA device runs the MP2 step) is a warning: given by name, it is not ignored silently."""
    device = _resolved(requested, backend, distributed, memory_mb)
    if warn and memory_mb is not None and device.device is None and requested == "auto" \
            and "--device-memory" not in device.reason:
        log.warning("--device-memory %d: no CUDA device runs the MP2 step (%s), so it has no "
                    "effect (--device cuda makes this an error)", memory_mb, device.reason)
    return device


def _resolved(requested: str, backend: str, distributed: bool,
              memory_mb: int | None) -> ComputeDevice:
    """:func:`resolve_device` without its warning."""
    if requested not in DEVICES:
        raise InputError(f"device {requested!r}: choose one of {', '.join(DEVICES)}")
    if requested == "cpu":
        return ComputeDevice(requested, None, "requested --device cpu", _cpu_name())
    if backend == "nki":
        if requested == "cuda":
            raise InputError("--device cuda contradicts --backend nki (its kernels run on "
                             "NeuronCores); drop one of them")
        return ComputeDevice(requested, None, "auto: the nki backend runs on NeuronCores",
                             _cpu_name())
    if distributed:
        if requested == "cuda":
            raise InputError("--device cuda is not supported under torchrun yet: the ranks' "
                             "MP2 step runs on their hosts; run one process per GPU job")
        return ComputeDevice(requested, None, "auto: a torchrun rank computes on its host",
                             _cpu_name())
    if not torch.cuda.is_available():
        why = ("torch has no CUDA support (a CPU wheel)" if torch.version.cuda is None
               else "torch sees no CUDA device")
        if requested == "cuda":
            raise BackendUnavailableError(f"--device cuda: {why}")
        return ComputeDevice(requested, None, f"auto: {why}; the host runs the MP2 step",
                             _cpu_name())
    index = torch.cuda.current_device()
    free, _total = torch.cuda.mem_get_info(index)
    budget = int(free) if memory_mb is None else min(int(free), int(memory_mb) * 2**20)
    if requested == "auto" and budget < AUTO_MIN_BYTES:
        return ComputeDevice(requested, None, (
            f"auto: CUDA device {index} has {budget / 2**20:.0f} MB for this run (free or "
            f"--device-memory), under {AUTO_MIN_BYTES // 2**20} MB; the host runs the MP2 step"),
            _cpu_name())
    return ComputeDevice(requested, torch.device("cuda", index),
                         f"{requested}: CUDA device {index}", torch.cuda.get_device_name(index),
                         budget)


def _cpu_name() -> str:
    from .cpuinfo import cpu_model

    return cpu_model()


@dataclass(frozen=True)
class DevicePlan:
    """The MP2 step on a device: ``resident`` True when (ia|P) and B of every space stay on
    the device (the transform and fit run there too), False when B stays in host memory (the
    transform and fit run on the host) and the pair blocks are copied to the device;
    ``occ_block`` the pair blocks' occupied orbitals; ``aux_block`` auxiliary functions per
    transform block; ``device_bytes`` what the plan puts on the device at most."""

    resident: bool
    occ_block: int
    aux_block: int
    device_bytes: int
    fit_occ: int = 1

    def as_dict(self) -> dict:
        """The record; a streamed plan has no transform or fit blocks of its own (the host
        plan's ran those stages: ``method.blocks``)."""
        if not self.resident:
            return {"b_placement": "host, streamed per pair block", "occ_block": self.occ_block,
                    "device_mb": round(self.device_bytes / 2**20, 1)}
        return {"b_placement": "device", "occ_block": self.occ_block,
                "aux_block": self.aux_block, "fit_occ": self.fit_occ,
                "device_mb": round(self.device_bytes / 2**20, 1)}


def plan_device(nao: int, dims, naux: int, budget_bytes: int, b_itemsize: int,
                max_shell: int = 1, host_bytes: int | None = None,
                resident: bool = True) -> DevicePlan:
    """The device plan for orbital spaces ``dims`` ((nocc, nvir) each) and ``naux`` auxiliary
    functions within ``budget_bytes`` (less :data:`DEVICE_RESERVE`).

    Resident: every space's (ia|P) in fp64 (B overwrites it in place in fp64; a separate B in
    fp32) and the fit matrix stay for the whole step; on top of them, one stage's work at a
    time: a transform block (two blocks of unpacked integrals, the copy and the products'
    double buffer, and the half-transformed and the transformed block), a fit block
    (``fit_occ`` orbitals: the trmm's work columns, or the product of the eigh fallback) or a
    pair block; a transform block holds whole auxiliary shells, so up to ``max_shell - 1``
    functions more than ``aux_block``. The transform's two host buffers (pinned on CUDA) take
    at most half of ``host_bytes`` when given (the run's ``--max-memory``). Streamed (B in host
    memory): a pair block and the two blocks of B it reads; always when ``resident`` is False
    (``--force-outcore``: B stays in the host's HDF5 file). Raises
    :class:`dfmp2.errors.ResourceError` when not even one-orbital pair blocks fit."""
    from .blocking import MB, pair_block_bytes
    from .errors import ResourceError

    usable = int((1.0 - DEVICE_RESERVE) * budget_bytes)
    used = [(o, v) for o, v in dims if o and v]
    vmax = max(v for _, v in used)
    omax = max(o for o, _ in used)
    ovx = sum(o * v for o, v in used) * naux
    kept = ovx * 8 + (ovx * b_itemsize if b_itemsize != 8 else 0) + naux * naux * 8
    room = usable - kept  # for one stage's work at a time
    # two unpacked blocks (one being copied in while the other is transformed), then per space
    # the half-transformed block, its transposed copy and the transformed block
    per_aux = (2 * nao * nao + sum(2 * o * nao + o * v for o, v in used)) * 8
    per_fit_occ = vmax * (min(naux, 256) + naux) * 8  # trmm work columns, or a gemm product
    extra = max_shell - 1  # a block of whole shells may run over aux_block by this many
    if resident and room >= max((1 + extra) * per_aux, per_fit_occ) \
            + pair_block_bytes(1, vmax, naux, 0):
        aux_block = int(max(1, min(naux, 256, room // per_aux - extra)))
        if host_bytes is not None:  # two host buffers of aux_block + extra square matrices
            aux_block = int(max(1, min(aux_block,
                                       host_bytes // 2 // (2 * nao * nao * 8) - extra)))
        fit_occ = int(max(1, min(omax, room // per_fit_occ)))
        best = max(b for b in range(1, min(omax, 64) + 1)
                   if pair_block_bytes(b, vmax, naux, 0) <= room or b == 1)
        peak = kept + max((aux_block + extra) * per_aux, fit_occ * per_fit_occ,
                          pair_block_bytes(best, vmax, naux, 0))
        return DevicePlan(True, best, aux_block, int(peak), fit_occ)
    fitting = [b for b in range(1, min(omax, 64) + 1)
               if pair_block_bytes(b, vmax, naux, b_itemsize) <= usable]
    if not fitting:
        raise ResourceError(
            f"the device's memory budget ({budget_bytes / MB:.0f} MB) holds not even a pair "
            f"block of one occupied orbital (nvir {vmax}, naux {naux}); use --device cpu")
    best = max(fitting)
    return DevicePlan(False, best, 1, int(pair_block_bytes(best, vmax, naux, b_itemsize)), 1)
