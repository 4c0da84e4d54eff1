"""DF-MP2 over ``torch.distributed``: the ranks' communicator and the split of the work.

One code path for CPUs (gloo), GPUs (NCCL) and Trainium (xla): only ``all_reduce``,
``broadcast``, ``all_gather_into_tensor`` and equal-split ``all_to_all_single`` are used, on
buffers padded to equal sizes. The split (``docs/distributed.md``):

1. rank 0 runs the SCF and broadcasts the MP2 orbital spaces (:func:`share_spaces`);
2. transform: rank r computes ``(ia|P)`` for its contiguous share of the auxiliary shells
   (:func:`aux_shares`, balanced by function count): no integral is computed twice;
3. redistribution: an equal-split ``all_to_all_single`` per round moves every element once, so
   that rank r holds ``(ia|P)`` for its occupied slice (:func:`occ_slice`) and every P;
4. the fit, locally, of the rank's slice;
5. pairs: the slices' B pass through ``all_gather_into_tensor`` in chunks within the rank's
   memory plan; rank r pairs its slice with its own and with the slices of
   :func:`pair_sources` (the (I <= J) slice blocks dealt round-robin; all slices for the
   alpha-beta block), and the ``[E_OS, E_SS, pairs]`` sums meet in an fp64 ``all_reduce``.

Failure: every rank reaches :meth:`Comm.agree` after each stage of its own work, with the error
it met or None; when any rank failed, every rank raises (the failing one its own error, the
others :class:`RankFailed` naming it), so none waits in a collective for a rank that stopped.
Collectives that still wait (a rank killed outright) end at the process group's timeout.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import DFMP2Error

__all__ = [
    "BACKENDS",
    "Comm",
    "ProcessGroup",
    "RankFailed",
    "aux_shares",
    "occ_slice",
    "block_pieces",
    "pair_sources",
    "current",
    "init_from_environment",
]

#: Process-group backends: gloo (CPU tensors), nccl (CUDA), xla (Trainium through torch-xla).
BACKENDS = ("gloo", "nccl", "xla")
#: Bytes of a rank's error message in :meth:`Comm.agree` (longer ones are cut).
_MESSAGE_BYTES = 1024


class RankFailed(DFMP2Error, RuntimeError):
    """Another rank of a distributed run failed; this rank stopped with it."""


@dataclass
class Comm:
    """The ranks of one distributed run and what this rank sent.

    rank, world_size : this process and the number of ranks; backend : the process group's
    (:data:`BACKENDS`); device : where collectives take their tensors (CPU for gloo; the rank's
    GPU for nccl; the XLA device for xla); the collectives run on the default process group.
    bytes_sent : payload this rank contributed to other ranks (an
    ``all_to_all`` block per other rank, its ``all_gather`` chunk once per other rank, a
    ``broadcast`` from it once per other rank, an ``all_reduce`` operand once), cumulative.
    stage_seconds : wall time of each stage on this rank.
    """

    rank: int
    world_size: int
    backend: str
    device: torch.device
    bytes_sent: int = 0
    stage_seconds: dict = field(default_factory=dict)

    # -- collectives -------------------------------------------------------------------------
    def _dist(self):
        import torch.distributed as dist

        return dist

    def _on(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device) if tensor.device != self.device else tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``tensor`` of rank ``src`` on every rank (the same shape and dtype everywhere)."""
        data = self._on(tensor.contiguous())
        self._dist().broadcast(data, src=src)
        if self.rank == src:
            self.bytes_sent += _nbytes(data) * (self.world_size - 1)
        return data.cpu()

    def all_reduce(self, tensor: torch.Tensor, op: str = "SUM") -> torch.Tensor:
        """The elementwise ``op`` (a ``ReduceOp`` name: SUM, MIN) over the ranks (float64 sums
        stay float64)."""
        data = self._on(tensor.clone())
        self._dist().all_reduce(data, op=getattr(self._dist().ReduceOp, op))
        self.bytes_sent += _nbytes(data)
        return data.cpu()

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``(world_size, *tensor.shape)``: every rank's ``tensor`` (equal shapes)."""
        data = self._on(tensor.contiguous())
        # the ranks' tensors concatenated along the first axis (what every backend takes)
        out = torch.empty((self.world_size * data.shape[0], *data.shape[1:]), dtype=data.dtype,
                          device=self.device)
        dist = self._dist()  # all_gather_single: the name torch >= 2.10 gives this collective
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        gather(out, data)
        self.bytes_sent += _nbytes(data) * (self.world_size - 1)
        return out.cpu().view(self.world_size, *data.shape)

    def all_to_all(self, send: torch.Tensor) -> torch.Tensor:
        """Equal-split exchange: ``send[d]`` goes to rank d; returns ``recv`` with ``recv[s]``
        from rank s (``send`` of shape ``(world_size, ...)``)."""
        if send.shape[0] != self.world_size:
            raise ValueError(f"all_to_all: {send.shape[0]} blocks for {self.world_size} ranks")
        data = self._on(send.contiguous())
        out = torch.empty_like(data)
        self._dist().all_to_all_single(out, data)
        self.bytes_sent += _nbytes(data) // self.world_size * (self.world_size - 1)
        return out.cpu()

    # -- agreement ---------------------------------------------------------------------------
    def agree(self, error: BaseException | None, stage: str) -> None:
        """Every rank calls this after ``stage`` with the error it met (None if none). When some
        rank failed, the lowest such rank's message is sent to all and every rank raises: the
        failing rank its own error, the others :class:`RankFailed`."""
        mine = torch.tensor([self.rank if error is not None else self.world_size],
                            dtype=torch.int64)
        failed = int(self.all_reduce(mine, "MIN")[0])
        if failed == self.world_size:
            return
        text = np.zeros(_MESSAGE_BYTES, dtype=np.uint8)
        if self.rank == failed:
            raw = _describe(error).encode("utf-8", "replace")[:_MESSAGE_BYTES]
            text[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        message = bytes(self.broadcast(torch.from_numpy(text), src=failed).numpy())
        if error is not None:
            raise error
        message = message.rstrip(b"\0").decode("utf-8", "replace")
        raise RankFailed(f"rank {failed} of {self.world_size} failed during {stage}: {message}")

    def run_stage(self, stage: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` on this rank, timed, then :meth:`agree` with the others."""
        start = time.perf_counter()
        result, error = None, None
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # an Interrupted (a signal) ends this rank at once
            error = exc
        self.stage_seconds[stage] = self.stage_seconds.get(stage, 0.0) + (
            time.perf_counter() - start)
        self.agree(error, stage)
        return result


def _describe(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if isinstance(error, DFMP2Error) else f"{type(error).__name__}: {text}"


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass
class ProcessGroup:
    """The default process group of a torchrun job as the CLI joined it: ``rank``,
    ``world_size``, ``backend``, ``timeout_s`` (of every collective); ``owned`` when the CLI
    initialised it (:meth:`close` then destroys it)."""

    rank: int
    world_size: int
    backend: str
    timeout_s: float
    owned: bool

    def close(self) -> None:
        import torch.distributed as dist

        if self.owned and dist.is_initialized():
            dist.destroy_process_group()

    @staticmethod
    def is_collective_error(exc: BaseException) -> bool:
        """A collective that timed out or lost a peer (torch.distributed's own errors)."""
        import torch.distributed as dist

        kinds = tuple(k for k in (getattr(dist, "DistError", None),) if k is not None)
        text = str(exc).lower()
        return (bool(kinds) and isinstance(exc, kinds)) or any(
            word in text for word in ("timed out", "timeout", "connection closed",
                                      "connection reset", "broken pipe"))

    def collective_error(self, exc: BaseException) -> str:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return (f"a collective of the {self.world_size}-rank {self.backend} group failed "
                f"({first}): another rank stopped, or it waited past --dist-timeout "
                f"{self.timeout_s:g} s; the failing rank's own message says why")


def init_from_environment(environ, backend: str = "auto", timeout_s: float = 3600.0
                          ) -> ProcessGroup | None:
    """Join the default process group of a torchrun job: None unless ``environ`` has
    torchrun's ``RANK`` and ``WORLD_SIZE`` with more than one rank. An already initialised
    group (a caller's) is used as it is. ``backend``: one of :data:`BACKENDS` or 'auto' (nccl
    when each of the node's ranks has a CUDA device, xla when torch-xla and a Neuron device
    are, else gloo)."""
    import datetime

    import torch.distributed as dist

    from .errors import BackendUnavailableError, InputError

    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    try:
        int(environ["RANK"])
        world = int(environ["WORLD_SIZE"])
    except ValueError:
        raise InputError(f"torchrun's RANK={environ['RANK']!r} WORLD_SIZE="
                         f"{environ['WORLD_SIZE']!r} are not integers") from None
    if dist.is_available() and dist.is_initialized():
        return ProcessGroup(dist.get_rank(), dist.get_world_size(),
                            str(dist.get_backend()).lower(), timeout_s, owned=False)
    if world < 2:
        return None
    if not dist.is_available():
        raise BackendUnavailableError("this torch build has no torch.distributed")
    local_rank, ranks_here = _node_ranks(environ)
    if backend == "auto":
        backend = _auto_backend(ranks_here)
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise BackendUnavailableError("--dist-backend nccl needs CUDA; use gloo")
        gpus = torch.cuda.device_count()
        if gpus < ranks_here:  # every rank of the node stops here, with the same line
            raise BackendUnavailableError(
                f"--dist-backend nccl needs a CUDA device per rank of a node: {ranks_here} "
                f"ranks, {gpus} device(s) visible; use gloo, or as many ranks per node as "
                f"devices")
        torch.cuda.set_device(local_rank)
    init = "env://"
    if backend == "xla":  # not verified here: no Neuron device (torch-xla's backend)
        try:
            import torch_xla.distributed.xla_backend  # noqa: F401  (registers "xla")
        except ImportError as exc:
            raise BackendUnavailableError(f"--dist-backend xla needs torch-xla: {exc}") from None
        init = "xla://"
    rank = int(environ["RANK"])
    if not 0 <= rank < world:
        raise InputError(f"torchrun's RANK={rank} is not a rank of WORLD_SIZE={world}")
    try:
        dist.init_process_group(backend, init_method=init,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except (ValueError, RuntimeError, OSError) as exc:  # DistError is a RuntimeError
        from .molecule import first_line

        rendezvous = ", ".join(f"{key}={environ.get(key)!r}" for key in
                               ("MASTER_ADDR", "MASTER_PORT"))
        raise BackendUnavailableError(
            f"the torchrun job's process group did not form ({rendezvous}): "
            f"{first_line(exc)}; "
            "start it with torchrun, which sets these, or unset RANK and WORLD_SIZE "
            "for a single process") from None
    return ProcessGroup(dist.get_rank(), dist.get_world_size(), backend, timeout_s, owned=True)


def _node_ranks(environ) -> tuple[int, int]:
    """(this rank's LOCAL_RANK, the ranks on its node) from torchrun's variables. Without a
    valid ``LOCAL_WORLD_SIZE`` (another launcher) every rank is counted as on one node
    (``WORLD_SIZE``), so that all ranks make the same choice of backend."""
    from .errors import InputError

    try:
        local_rank = int(environ.get("LOCAL_RANK", 0))
    except ValueError:
        raise InputError(f"LOCAL_RANK={environ['LOCAL_RANK']!r} is not an integer") from None
    try:
        ranks_here = int(environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        ranks_here = 0
    if ranks_here < 1:
        ranks_here = int(environ["WORLD_SIZE"])
    return local_rank, max(ranks_here, local_rank + 1)


def _auto_backend(ranks_here: int) -> str:
    """nccl when each of the ``ranks_here`` ranks of this node has a CUDA device of its own
    (NCCL refuses two ranks on one device), xla with torch-xla and a Neuron device, else
    gloo."""
    import glob
    import importlib.util

    if torch.cuda.is_available() and torch.cuda.device_count() >= ranks_here:
        return "nccl"
    if glob.glob("/dev/neuron*") and importlib.util.find_spec("torch_xla") is not None:
        return "xla"
    return "gloo"


def current() -> Comm | None:
    """The communicator of an initialised default process group with more than one rank, else
    None (a single-process run)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.get_world_size()
    if world < 2:
        return None
    backend = str(dist.get_backend()).lower()
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    elif backend == "xla":
        import torch_xla

        device = torch_xla.device()
    else:
        device = torch.device("cpu")
    return Comm(rank=dist.get_rank(), world_size=world, backend=backend, device=device)


# -- the split of the work --------------------------------------------------------------------
def aux_shares(ao_loc: np.ndarray, world_size: int) -> list[tuple[int, int, int, int]]:
    """``(shell0, shell1, p0, p1)`` per rank: contiguous auxiliary shells, rank r's share ending
    at the shell boundary nearest to ``(r+1) * naux / world_size`` functions (as equal as whole
    shells allow). A rank gets no shell when there are fewer shells than ranks. ``ao_loc``: the
    shells' function offsets (``auxmol.ao_loc_nr()``)."""
    ao_loc = np.asarray(ao_loc)
    nshell, naux = len(ao_loc) - 1, int(ao_loc[-1])
    shares, start = [], 0
    for r in range(world_size):
        if r == world_size - 1:
            stop = nshell
        else:
            stop = max(start, int(np.argmin(np.abs(ao_loc - (r + 1) * naux / world_size))))
        shares.append((start, stop, int(ao_loc[start]), int(ao_loc[stop])))
        start = stop
    return shares


def occ_slice(nocc: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(i0, i1)``: rank's contiguous slice of ``nocc`` occupied orbitals; slices differ by at
    most one orbital (the first ranks' shorter), and are empty for ranks past ``nocc``."""
    return rank * nocc // world_size, (rank + 1) * nocc // world_size


def pair_sources(world_size: int, rank: int, triangular: bool) -> list[tuple[int, str | None]]:
    """The slice blocks rank ``rank`` computes: ``(source, share)``, its own slice's rows
    against slice ``source``'s orbitals, all of the block (``share`` None) or its part of a
    block shared with the rank that owns ``source`` ("lower" or "upper": :func:`block_pieces`).

    triangular (closed-shell and same-spin blocks, pairs I <= J): its own slice (the diagonal
    block), then the round-robin deal of the blocks between two slices: slices ``rank + k``
    for ``k = 1 .. (world_size-1)//2``; for an even ``world_size`` the block with slice ``rank
    + world_size/2`` is shared, the lower rank "lower", the upper one "upper". Every unordered
    pair of orbitals is then computed exactly once, and with equal slices every rank gets the
    same number of pairs, in every step of the gathers. Otherwise (alpha-beta: every pair
    (i, j)) all slices, whole."""
    if not triangular:
        return [(s, None) for s in range(world_size)]
    blocks = [(rank, None)] + [((rank + k) % world_size, None)
                               for k in range(1, (world_size - 1) // 2 + 1)]
    if world_size % 2 == 0:
        half = world_size // 2
        blocks.append((rank + half, "lower") if rank < half else (rank - half, "upper"))
    return blocks


def block_pieces(share: str | None, step: int, chunk: int, n_rows: int, n_cols: int
                 ) -> list[tuple[int, int, int, int]]:
    """``(r0, r1, c0, c1)``: the rows of the rank's own slice (``n_rows`` orbitals) and the
    columns of the gathered chunk ``step`` (``n_cols`` orbitals, ``chunk`` per full chunk) that
    a block's ``share`` (:func:`pair_sources`) computes in that step.

    A shared block L x U (L the lower rank's slice, U the upper's, both cut into chunks of
    ``chunk``): cell (a, b) of L-chunk a and U-chunk b goes to the lower rank when a > b, to the
    upper one when b > a, and a diagonal cell a == b is split by L's rows, the first
    ``ceil(n/2)`` to the lower rank. The lower rank, at step b (U-chunk b gathered), takes its
    rows past chunk b and the first half of chunk b; the upper one, at step a (L-chunk a
    gathered), its rows past chunk a, and its rows of chunk a against the second half of L-chunk
    a. Both compute in every step, and equal amounts overall."""
    if n_cols <= 0 or n_rows <= 0:
        return []
    if share is None:
        return [(0, n_rows, 0, n_cols)]
    lo, hi = min(n_rows, step * chunk), min(n_rows, (step + 1) * chunk)
    if share == "lower":  # own rows are L; the chunk is U's
        own = hi - lo
        pieces = [(hi, n_rows, 0, n_cols), (lo, lo + (own + 1) // 2, 0, n_cols)]
    else:  # "upper": own rows are U; the chunk is L's, of n_cols orbitals
        pieces = [(hi, n_rows, 0, n_cols), (lo, hi, (n_cols + 1) // 2, n_cols)]
    return [p for p in pieces if p[1] > p[0] and p[3] > p[2]]


# -- the distributed MP2 step -----------------------------------------------------------------
def plan_rank(nao: int, dims, naux: int, world_size: int, max_memory_mb: float,
              b_itemsize: int, force_outcore: bool = False):
    """The block plan of one rank: :func:`dfmp2.blocking.plan_blocks` for twice the rank's
    largest occupied slice of every space (while the redistribution runs, the rank holds its
    share of ``(ia|P)`` by auxiliary functions and its slice of it by occupied orbitals, each
    about ``o v X / world_size``), with the occupied blocks capped at the slice and shrunk
    until the pair stage's gathers fit beside them; the transform's groups hold every occupied
    orbital of each space. ``b_bytes``: the rank's B. Raises :class:`ResourceError` (on every
    rank alike) naming the least ``max_memory`` with which this plan succeeds."""
    from .errors import ResourceError

    args = (nao, dims, naux, world_size)
    try:
        return _plan_rank(*args, max_memory_mb, b_itemsize, force_outcore)
    except ResourceError as exc:
        if exc.least_mb is None:
            raise
        least = exc.least_mb
        while True:  # the planner's least ignores the gathers; theirs, the planner's blocks
            try:
                _plan_rank(*args, least, b_itemsize, force_outcore)
                break
            except ResourceError as again:
                least = max(least + 1, again.least_mb or 0)
        if least == exc.least_mb:
            raise
        raise ResourceError(
            f"max_memory {max_memory_mb:.0f} MB per rank is too small on {world_size} ranks: "
            f"{str(exc).split('; give')[0].split(': ', 1)[-1]}, and the pair stage's gathers "
            f"need room beside that; give --max-memory {least} or use fewer ranks",
            least) from None


def _plan_rank(nao: int, dims, naux: int, world_size: int, max_memory_mb: float,
               b_itemsize: int, force_outcore: bool):
    """:func:`plan_rank` at one ``max_memory_mb`` (its ResourceError names the least of its
    own first check)."""
    from dataclasses import replace

    from .blocking import plan_blocks, usable_bytes

    slices = [(math.ceil(o / world_size), v) for o, v in dims]
    plan = plan_blocks(nao, [(2 * o, v) for o, v in slices], naux, max_memory_mb,
                       b_itemsize=b_itemsize, force_outcore=force_outcore,
                       transform_spaces=dims)
    omax = max([o for o, _ in slices] + [1])
    plan = replace(plan, occ_block=max(1, min(plan.occ_block, omax)),
                   fit_occ=max(1, min(plan.fit_occ, omax)),
                   b_bytes=sum(o * v for o, v in slices) * naux * b_itemsize)
    # the planner fills the budget with pair blocks; the gathers need room beside them, so
    # the block shrinks until both fit (a block of one is refused only when it does not)
    usable = usable_bytes(max_memory_mb)
    while plan.occ_block > 1 and _pair_stage_bytes(plan, slices, naux, world_size,
                                                   b_itemsize)[0] > usable:
        plan = replace(plan, occ_block=plan.occ_block - 1)
    _check_gather(plan, slices, naux, world_size, max_memory_mb, b_itemsize)
    return plan


def gather_bytes(occ_block: int, nvir: int, naux: int, world_size: int,
                 b_itemsize: int) -> int:
    """A rank's buffers of one pair-stage gather: ``occ_block // world_size`` orbitals (at
    least one) of B from each rank, and its own chunk to send."""
    chunk = max(1, occ_block // world_size)
    return (world_size + 1) * chunk * nvir * naux * b_itemsize


def _pair_stage_bytes(plan, slices, naux: int, world_size: int,
                      b_itemsize: int) -> tuple[int, int]:
    """(bytes, of which gather buffers) a rank's pair stage holds under ``plan``: the metric's
    factors, the rank's B slice (in core), a pair block and the gather buffers."""
    from .blocking import pair_block_bytes

    vmax = max([v for _, v in slices] + [1])
    gather = gather_bytes(plan.occ_block, vmax, naux, world_size, b_itemsize)
    need = (3 * naux * naux * 8 + (0 if plan.outcore else plan.b_bytes) + gather
            + pair_block_bytes(plan.occ_block, vmax, naux, b_itemsize if plan.outcore else 0))
    return need, gather


def _check_gather(plan, slices, naux: int, world_size: int, max_memory_mb: float,
                  b_itemsize: int) -> None:
    """The pair stage within ``max_memory_mb``: the metric's factors, the rank's B slice (in
    core), a pair block and the gather buffers (:func:`gather_bytes`: with more ranks than
    orbitals in a block, one orbital from every rank). A :class:`ResourceError` naming what to
    change otherwise (on every rank alike)."""
    from .blocking import MB, least_max_memory, size_text, usable_bytes
    from .errors import ResourceError

    need, gather = _pair_stage_bytes(plan, slices, naux, world_size, b_itemsize)
    if need > usable_bytes(max_memory_mb):
        raise ResourceError(
            f"max_memory {max_memory_mb:.0f} MB per rank is too small for the pair stage on "
            f"{world_size} ranks: each gather brings {max(1, plan.occ_block // world_size)} "
            f"occupied orbital(s) of B from every rank ({size_text(gather)}), and with the "
            f"rank's B and a pair block it needs {size_text(need)}; give --max-memory "
            f"{least_max_memory(need / MB)} or use fewer ranks", least_max_memory(need / MB))


class _Deferred:
    """The first error of a rank's local work inside a stage whose collectives must still run
    on every rank: later local work is skipped, the collectives go on, and :meth:`raise_` ends
    the stage with the error (then :meth:`Comm.agree` tells the others)."""

    def __init__(self) -> None:
        self.error: Exception | None = None

    def __call__(self, fn, *args, **kwargs):
        if self.error is not None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # an Interrupted (a signal) ends the rank at once
            self.error = exc
            return None

    def raise_(self) -> None:
        if self.error is not None:
            raise self.error


def share_spaces(comm: Comm, spaces) -> list | None:
    """Rank 0's MP2 orbital spaces on every rank (``spaces``: rank 0's list of
    :class:`~dfmp2.reference.OrbitalSpace`, ignored elsewhere); None on every rank when rank 0
    has none (no pairs)."""
    from .reference import OrbitalSpace

    head = torch.zeros(1 + 2 * 5, dtype=torch.int64)
    if comm.rank == 0 and spaces:
        head[0] = len(spaces)
        for k, sp in enumerate(spaces):
            head[1 + 5 * k: 6 + 5 * k] = torch.tensor(
                [sp.occ_coeff.shape[0], sp.nocc, sp.nvir, sp.nfrozen_occ, sp.nfrozen_vir])
    head = comm.broadcast(head)
    count = int(head[0])
    if count == 0:
        return None
    shared = []
    for k in range(count):
        nao, nocc, nvir, nfo, nfv = (int(x) for x in head[1 + 5 * k: 6 + 5 * k])
        parts = []
        for name, shape in (("occ_coeff", (nao, nocc)), ("vir_coeff", (nao, nvir)),
                            ("eps_occ", (nocc,)), ("eps_vir", (nvir,))):
            data = torch.zeros(shape, dtype=torch.float64)
            if comm.rank == 0:
                data = torch.from_numpy(np.ascontiguousarray(getattr(spaces[k], name),
                                                             dtype=np.float64))
            parts.append(comm.broadcast(data).numpy())
        shared.append(OrbitalSpace(*parts, nfo, nfv))
    return shared


def distributed_pair_energies(mol, auxmol, spaces, la, comm: Comm, *, max_memory: float,
                              precision: str = "fp64", fused: bool = True,
                              force_outcore: bool = False, scratch_dir: str | None = None,
                              progress=None):
    """The post-SCF DF-MP2 step split over the ranks of ``comm`` (every rank calls it with the
    same ``spaces``); the contract of :func:`dfmp2.pipeline.dfmp2_pair_energies`. Returns
    ``(energies, factor, record)`` on every rank: the energies summed over the ranks, the
    metric's factor (every rank factors the metric: naux^3/3 flops, replicated rather than
    sent) and the run's ``extras.distributed`` record (gathered to every rank)."""
    from .df import factor_metric, metric
    from .pipeline import (
        PRECISION_DTYPES,
        PairEnergies,
        _no_progress,
        _stage_ops,
        fit,
        plan_stages,
        transform,
    )

    progress = progress or _no_progress
    world, rank = comm.world_size, comm.rank
    b_dtype, reduce_dtype = PRECISION_DTYPES[precision]
    used = [k for k, sp in enumerate(spaces) if sp.nocc and sp.nvir]
    naux = auxmol.nao_nr()
    plan = plan_rank(mol.nao_nr(), [(spaces[k].nocc, spaces[k].nvir) for k in used], naux,
                     world, max_memory, 8 if precision == "fp64" else 4, force_outcore)
    factor = comm.run_stage("metric", lambda: factor_metric(
        torch.from_numpy(metric(auxmol)), la))
    kept = comm.all_reduce(torch.tensor([factor.naux_fit, -factor.naux_fit]), "MIN")
    if int(kept[0]) != -int(kept[1]):  # every rank sees the same numbers: all raise alike
        raise RankFailed(f"the ranks factored the metric differently (kept {int(kept[0])} to "
                         f"{-int(kept[1])} auxiliary functions): run every rank with the same "
                         "libraries on the same kind of machine")
    stages = comm.run_stage("metric", plan_stages, la.backend, factor.condition, precision,
                            la.policy.require_nki)
    placed = {stage.stage: _stage_ops(la, stage) for stage in stages}
    shares = aux_shares(auxmol.ao_loc_nr(), world)
    shell0, shell1, p0, p1 = shares[rank]
    opened: list = []

    def new_store(nocc, nvir, nfun, nfit):
        from .storage import H5Store, IncoreStore

        if plan.outcore:
            return H5Store(nocc, nvir, nfun, nfit, dtype=b_dtype, directory=scratch_dir,
                           register=opened.append)
        return IncoreStore(nocc, nvir, nfun, nfit, dtype=b_dtype)

    try:
        by_aux = comm.run_stage("transform", lambda: [
            new_store(spaces[k].nocc, spaces[k].nvir, p1 - p0, 0) for k in used])
        comm.run_stage("transform", transform, mol, auxmol, [spaces[k] for k in used],
                       placed["transform"], plan.aux_block, plan.unpack_block, by_aux,
                       progress, (shell0, shell1))
        stores = []
        for k, part in zip(used, by_aux):
            store = comm.run_stage("redistribute", new_store,
                                   _slice_size(spaces[k].nocc, world, rank), spaces[k].nvir,
                                   naux, factor.naux_fit)
            comm.run_stage("redistribute", _redistribute, comm, part, store, spaces[k], shares,
                           plan.fit_occ, progress)
            comm.run_stage("redistribute", part.close)
            stores.append(store)
        for store in stores:
            comm.run_stage("fit", fit, store, factor, placed["fit"], plan.fit_occ, progress)
        local = comm.run_stage("pair_energy", _pair_stage, comm, dict(zip(used, stores)),
                               spaces, placed["pair_energy"], plan.occ_block, fused,
                               b_dtype, reduce_dtype, progress)
    finally:
        for store in opened:
            store.close()
    e_os, e_ss, pairs = (float(x) for x in comm.all_reduce(
        torch.tensor(local, dtype=torch.float64)))
    record = _record(comm, shares, spaces, used, int(local[2]))
    return PairEnergies(e_os, e_ss, int(round(pairs)), stages), factor, record


def _slice_size(nocc: int, world: int, rank: int) -> int:
    i0, i1 = occ_slice(nocc, world, rank)
    return i1 - i0


def _redistribute(comm: Comm, by_aux, store, space, shares, fit_occ: int, progress) -> None:
    """``(ia|P)`` from every rank's share of the functions (``by_aux``: all i, this rank's P)
    into ``store`` (this rank's occupied slice, all P), in rounds of equal-split
    ``all_to_all``: each element moves once. Every rank runs every round (a local error is
    raised after the last)."""
    world, rank = comm.world_size, comm.rank
    nocc, nvir = space.nocc, space.nvir
    width = max(q1 - q0 for _, _, q0, q1 in shares)  # the functions of the widest share
    o_pad = math.ceil(nocc / world)
    chunk = max(1, min(o_pad, fit_occ // 2))  # orbitals per destination per round
    rounds = math.ceil(o_pad / chunk)
    _s0, _s1, p0, p1 = shares[rank]
    mine = _slice_size(nocc, world, rank)
    deferred = _Deferred()
    for t in range(rounds):
        send = torch.zeros((world, chunk, nvir, width), dtype=torch.float64)

        def pack():
            for d in range(world):
                d0, d1 = occ_slice(nocc, world, d)
                a0, a1 = d0 + t * chunk, min(d1, d0 + (t + 1) * chunk)
                if a1 > a0 and p1 > p0:
                    send[d, :a1 - a0, :, :p1 - p0] = by_aux.read_ia_slab(a0, a1).view(
                        a1 - a0, nvir, p1 - p0)

        deferred(pack)
        recv = comm.all_to_all(send)

        def unpack():
            m0, m1 = t * chunk, min(mine, (t + 1) * chunk)
            for src, (_a, _b, q0, q1) in enumerate(shares):
                if m1 > m0 and q1 > q0:
                    store.write_pia_part(m0, m1, q0, q1, recv[src, :m1 - m0, :, :q1 - q0].numpy())

        deferred(unpack)
        progress("redistribute", t + 1, rounds)
    deferred.raise_()


def _pair_stage(comm: Comm, stores: dict, spaces, la, occ_block: int, fused: bool,
                b_dtype, reduce_dtype, progress) -> list[float]:
    """This rank's ``[E_OS, E_SS, pairs]``: first the pairs within its own slices (every spin
    block, as one process computes them: :func:`dfmp2.pipeline.pair_energies`, blocks I <= J
    of ``occ_block``), then its slices against the other slices of :func:`pair_sources`, whose B
    arrives by ``all_gather`` in chunks (each rank's next ``occ_block // world_size`` orbitals,
    at least one), so a rank holds about one pair block of remote B at a time. Every rank runs
    every gather."""
    from .energy import CLOSED, OPPOSITE, SAME
    from .pipeline import _unfused, pair_energies

    world, rank = comm.world_size, comm.rank
    eps = [tuple(torch.from_numpy(np.ascontiguousarray(e)).to(reduce_dtype)
                 for e in (sp.eps_occ, sp.eps_vir)) for sp in spaces]
    if len(spaces) == 1:
        tasks = [(CLOSED, 0, 0)] if 0 in stores else []
    else:
        tasks = [(SAME, k, k) for k in (0, 1) if k in stores]
        if 0 in stores and 1 in stores:
            tasks.append((OPPOSITE, 0, 1))
    deferred = _Deferred()
    own = [stores.get(k) if _slice_size(sp.nocc, world, rank) else None
           for k, sp in enumerate(spaces)]
    own_eps = [(e_o[slice(*occ_slice(sp.nocc, world, rank))], e_v)
               for sp, (e_o, e_v) in zip(spaces, eps)]
    local = deferred(pair_energies, own, own_eps, la, occ_block, fused)
    e_os, e_ss = (local.e_os, local.e_ss) if local is not None else (0.0, 0.0)
    pairs = local.npairs if local is not None else 0
    chunk = max(1, occ_block // world)  # orbitals each rank adds to a gather
    steps = [math.ceil(math.ceil(spaces[sj].nocc / world) / chunk) for _k, _si, sj in tasks]
    done, total = 0, sum(steps)
    for (kind, si, sj), nsteps in zip(tasks, steps):
        store_i, store_j = stores[si], stores[sj]
        i_base = occ_slice(spaces[si].nocc, world, rank)[0]
        n_i = _slice_size(spaces[si].nocc, world, rank)
        nvir_j, naux_fit = spaces[sj].nvir, store_j.naux_fit
        blocks = [b for b in pair_sources(world, rank, kind.triangular) if b[0] != rank]
        # with every block whole (share None) a chunk is all its source's; shared blocks are
        # cut by block_pieces
        e_oi, e_vi = eps[si]
        e_oj, e_vj = eps[sj]
        for t in range(nsteps):
            lo, hi = t * chunk, min(_slice_size(spaces[sj].nocc, world, rank), (t + 1) * chunk)
            send = torch.zeros((chunk, nvir_j, naux_fit), dtype=b_dtype)
            if hi > lo:
                deferred(lambda: send[:hi - lo].copy_(store_j.read_b(lo, hi)))
            gathered = comm.all_gather(send)

            def compute():
                nonlocal e_os, e_ss, pairs
                for src, share in blocks:
                    s0, s1 = occ_slice(spaces[sj].nocc, world, src)
                    j_lo, j_hi = t * chunk, min(s1 - s0, (t + 1) * chunk)  # this chunk
                    for r_lo, r_hi, c0, c1 in block_pieces(share, t, chunk, n_i, j_hi - j_lo):
                        ovl_j = gathered[src, c0:c1]
                        j0, j1 = j_lo + c0, j_lo + c1
                        for i0 in range(r_lo, r_hi, occ_block):
                            i1 = min(r_hi, i0 + occ_block)
                            # distinct orbitals: 2 (I < J stands for both), or 1 (alpha-beta)
                            weights = np.full((i1 - i0, j1 - j0),
                                              2.0 if kind.triangular else 1.0)
                            args = (store_i.read_b(i0, i1), ovl_j,
                                    e_oi[i_base + i0: i_base + i1], e_oj[s0 + j0: s0 + j1],
                                    e_vi, e_vj, torch.from_numpy(weights), kind.exchange)
                            direct, exchange = (float(x) for x in (
                                la.mp2_pair_sums(*args) if fused else _unfused(la, *args)))
                            os_part, ss_part = kind.energies(direct, exchange)
                            e_os += os_part
                            e_ss += ss_part
                            pairs += int(np.count_nonzero(weights))

            deferred(compute)
            done += 1
            progress("pair energy", done, total)
    deferred.raise_()
    return [e_os, e_ss, float(pairs)]


#: Per-rank figures gathered into the record, in this order.
_RANK_FIELDS = ("pairs", "bytes_sent", "metric", "transform", "redistribute", "fit",
                "pair_energy")


def _record(comm: Comm, shares, spaces, used, pairs: int) -> dict:
    """``extras.distributed``: world size, backend, each rank's share of the pair work, of the
    auxiliary functions and of each space's occupied orbitals, bytes sent and stage times (lists
    in rank order)."""
    mine = torch.tensor([pairs, comm.bytes_sent] + [comm.stage_seconds.get(s, 0.0)
                                                     for s in _RANK_FIELDS[2:]],
                        dtype=torch.float64)
    table = comm.all_gather(mine).numpy()
    world = comm.world_size
    return {
        "world_size": world,
        "backend": comm.backend,
        "pair_shares": [int(x) for x in table[:, 0]],
        "bytes_sent": [int(x) for x in table[:, 1]],
        "aux_shares": [q1 - q0 for _a, _b, q0, q1 in shares],
        "occ_shares": [[_slice_size(spaces[k].nocc, world, r) for r in range(world)]
                       for k in used],
        "stage_seconds": [{s: round(float(table[r, 2 + n]), 4)
                           for n, s in enumerate(_RANK_FIELDS[2:])} for r in range(world)],
    }
