"""State of one emulated kernel call: memory budgets and ScalarE reduce registers.

Liveness model: an SBUF/PSUM allocation is live while any Python object refers to it (the
tensor returned by ``nl.ndarray`` or any view of it). CPython frees it when the last reference
goes, e.g. when a loop rebinds the name. The new tile is allocated before the old name is
rebound, so a tile allocated inside an unrolled loop briefly counts twice (in a dynamic loop
it does not, see below). This is conservative compared
with the compiler's allocator; the budgets are per partition:

- SBUF: the usable bytes per partition, 180224 (trn1) or 212984 (trn2), of the documented
  192 KiB or 224 KiB (``_state.SBUF_BYTES_PER_PARTITION``);
- PSUM: 8 banks of 2 KiB per partition; each allocation takes whole banks (rounded up) and
  starts on a bank boundary.

Inside ``nl.dynamic_range`` loops (:class:`DynamicLoop`), the compiler allocates the body's
tensors once and reuses them in every iteration (``nki/deep-dives/nki-dynamic-loops.rst``:
"Tensors allocated inside the loop body are allocated once and reused across iterations"). The
emulator allocates anew in each iteration, so when an iteration starts, the on-chip allocations
of the loop's previous iteration stop counting against the budgets (still-referenced tiles of
that iteration stand for the same memory as this iteration's); the last iteration's
allocations count until they are freed. (So, unlike an unrolled loop, a dynamic loop body never
holds two generations of its tiles against the budget.)

Static instruction count: a dynamic loop is one hardware loop instruction over one copy of its
body ("The compiled artifact size does **not** grow with the trip count"). The emulator runs
the body once per iteration, and counts an instruction against
``_state.MAX_INSTRUCTIONS_PER_LAUNCH`` (``KernelRun.instructions``) only while every enclosing
dynamic loop is in its first iteration; ``KernelRun.executed`` counts every issued instruction.
A loop of zero iterations runs nothing, so its body counts nothing (the compiled loop has a
body; the emulator cannot see it).

A grid launch ``kernel[n]`` creates one run per program (see :mod:`._jit`): each has its own
budgets and instruction count (each physical NeuronCore has its own SBUF, PSUM and instruction
stream). The ``shared_hbm`` allocations of program ``p > 0`` alias those of program 0, in
allocation order (:meth:`KernelRun.shared_hbm_allocation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from . import _state
from ._errors import EmulatorError
from ._tensor import Allocation, MemoryRegion

__all__ = ["EmulatorError", "KernelRun", "current"]


@dataclass
class _Usage:
    """Live on-chip usage per partition (apart from allocations, for the finalizers)."""

    sbuf_bytes: int = 0
    psum_banks: int = 0
    live: dict[int, tuple[str, str, int]] = field(default_factory=dict)


class DynamicLoop:
    """One ``nl.dynamic_range`` loop in progress (an entry of ``KernelRun.dynamic_loops``).

    Attributes
    ----------
    iteration : int
        Index of the iteration running (0 for the first).
    allocations : list of int
        Budget keys of the on-chip allocations made during the current iteration (also inside
        nested loops), released from the budgets when the next iteration starts.
    """

    def __init__(self) -> None:
        self.iteration = 0
        self.allocations: list[int] = []


class KernelRun:
    """One call of an ``@nki.jit`` kernel in the emulator.

    Parameters
    ----------
    name : str
        Kernel function name.
    target : str
        ``"trn1"`` (gen2) or ``"trn2"`` (gen3).
    program_id : int
        Index of this program in the launch grid (``nl.program_id(0)``), 0 without a grid.
    num_programs : int
        Number of programs in the launch (``nl.num_programs(0)``), 1 without a grid.
    grid_ndim : int
        ``nl.program_ndim()``: 0 for a plain call ``kernel(...)``, 1 for ``kernel[n](...)``.
    first : KernelRun, optional
        Program 0's run, for programs ``p > 0`` of a grid launch: their ``shared_hbm``
        allocations alias program 0's.
    """

    def __init__(
        self,
        name: str,
        target: str,
        program_id: int = 0,
        num_programs: int = 1,
        grid_ndim: int = 0,
        first: KernelRun | None = None,
    ) -> None:
        self.name = name
        self.target = target
        self.program_id = program_id
        self.num_programs = num_programs
        self.grid_ndim = grid_ndim
        self.first = first
        #: This program's shared_hbm allocations, in allocation order.
        self.shared_hbm: list[Allocation] = []
        self.sbuf_budget = _state.SBUF_BYTES_PER_PARTITION[target]
        self.usage = _Usage()
        self.counter = 0
        #: Static instructions: the compiled stream's size, capped per launch.
        self.instructions = 0
        #: Every issued instruction (dynamic loop bodies once per iteration).
        self.executed = 0
        #: The nl.dynamic_range loops in progress, outermost first.
        self.dynamic_loops: list[DynamicLoop] = []
        self.reduce_regs = np.zeros(_state.NUM_PARTITIONS, dtype=np.float32)
        self.reduce_regs_valid = np.zeros(_state.NUM_PARTITIONS, dtype=bool)

    @property
    def gen(self) -> int:
        """NeuronCore generation: 2 for trn1, 3 for trn2."""
        return 2 if self.target == "trn1" else 3

    def register(self, alloc: Allocation) -> None:
        """Account an on-chip allocation against the budget, or raise :class:`EmulatorError`."""
        usage = self.usage
        self.counter += 1
        key = self.counter
        per_part = alloc.bytes_per_partition()
        desc = f"{alloc.name!r} {alloc.shape} {alloc.dtype.name}"
        if alloc.buffer is MemoryRegion.sbuf:
            if usage.sbuf_bytes + per_part > self.sbuf_budget:
                raise EmulatorError(
                    f"nl.ndarray: SBUF budget exceeded allocating {desc}: needs {per_part} B per "
                    f"partition, {usage.sbuf_bytes} B already live, limit {self.sbuf_budget} B per "
                    f"partition usable of {_state.SBUF_CAPACITY_PER_PARTITION[self.target]} "
                    f"({self.target}). Live SBUF: {self._live('sbuf')}"
                )
            usage.sbuf_bytes += per_part
            usage.live[key] = ("sbuf", desc, per_part)
        elif alloc.buffer is MemoryRegion.psum:
            banks = max(1, math.ceil(per_part / _state.PSUM_BANK_BYTES))
            if usage.psum_banks + banks > _state.PSUM_BANKS:
                raise EmulatorError(
                    f"nl.ndarray: PSUM budget exceeded allocating {desc}: needs {banks} bank(s) of "
                    f"{_state.PSUM_BANK_BYTES} B, {usage.psum_banks} of {_state.PSUM_BANKS} banks "
                    f"already live (16 KiB per partition). Live PSUM: {self._live('psum')}"
                )
            usage.psum_banks += banks
            usage.live[key] = ("psum", desc, banks)
        else:
            return
        alloc.on_release(_release_callback(usage, key))
        for loop in self.dynamic_loops:
            loop.allocations.append(key)

    @property
    def static_pass(self) -> bool:
        """True unless a dynamic loop in progress is past its first iteration (instructions
        issued now are part of the compiled instruction stream)."""
        return all(loop.iteration == 0 for loop in self.dynamic_loops)

    def enter_dynamic_loop(self) -> DynamicLoop:
        """Push a new ``nl.dynamic_range`` loop (in its first iteration)."""
        loop = DynamicLoop()
        self.dynamic_loops.append(loop)
        return loop

    def next_iteration(self, loop: DynamicLoop, iteration: int) -> None:
        """Start iteration ``iteration`` of ``loop``: the on-chip allocations of its previous
        iteration stop counting against the budgets (the compiler reuses their memory)."""
        release = [_release_callback(self.usage, key) for key in loop.allocations]
        for callback in release:
            callback()
        loop.allocations.clear()
        loop.iteration = iteration

    def exit_dynamic_loop(self, loop: DynamicLoop) -> None:
        """Pop ``loop`` (by identity, so an out-of-order close cannot drop another loop)."""
        self.dynamic_loops = [entry for entry in self.dynamic_loops if entry is not loop]

    @property
    def label(self) -> str:
        """``"program p of kernel[n]"`` in a grid launch of more than one program, else ``""``."""
        if self.num_programs == 1:
            return ""
        return f"program {self.program_id} of kernel[{self.num_programs}]"

    def shared_hbm_allocation(self, alloc: Allocation) -> Allocation:
        """The allocation a new ``shared_hbm`` tensor ``alloc`` of this program stands for.

        Without a grid of several programs, ``alloc`` itself. In a grid launch, program 0's
        allocations record which program writes each element; program ``p > 0`` gets program
        0's allocation of the same rank (its k-th shared_hbm allocation aliases program 0's
        k-th), after checking that shape and dtype agree.
        """
        if self.num_programs > 1:
            if self.first is None:
                alloc.track_writers()
            else:
                rank = len(self.shared_hbm)
                mine = f"{alloc.name!r} {alloc.shape} {alloc.dtype.name}"
                if rank >= len(self.first.shared_hbm):
                    raise EmulatorError(
                        f"nl.ndarray: {self.label} makes shared_hbm allocation #{rank} {mine}, "
                        f"but program 0 made only {len(self.first.shared_hbm)}; every program "
                        "must allocate the same shared_hbm outputs in the same order"
                    )
                first = self.first.shared_hbm[rank]
                if first.shape != alloc.shape or first.dtype is not alloc.dtype:
                    raise EmulatorError(
                        f"nl.ndarray: shared_hbm allocation #{rank} of {self.label} {mine} does "
                        f"not match program 0's {first.name!r} {first.shape} "
                        f"{first.dtype.name}; every program must allocate the same shared_hbm "
                        "outputs in the same order"
                    )
                alloc = first
        self.shared_hbm.append(alloc)
        return alloc

    def count_instruction(self, instruction: str) -> bool:
        """Count one issued instruction and return whether it is static (see the module
        docstring: inside a dynamic loop, only the first iteration's instructions are). Raise
        when the static count passes ``_state.MAX_INSTRUCTIONS_PER_LAUNCH`` (per program in a
        grid launch: each physical core runs its own instruction stream)."""
        self.executed += 1
        if not self.static_pass:
            return False
        self.instructions += 1
        if self.instructions > _state.MAX_INSTRUCTIONS_PER_LAUNCH:
            who = f" ({self.label})" if self.label else ""
            raise EmulatorError(
                f"nisa.{instruction}: kernel {self.name!r}{who} issued more than "
                f"{_state.MAX_INSTRUCTIONS_PER_LAUNCH} instructions in one launch (the emulator's "
                "bound on the compiled, unrolled instruction stream, in which a nl.dynamic_range "
                "body counts once; split the work over launches on the host, or loop with "
                "nl.dynamic_range)"
            )
        return True

    def _live(self, kind: str) -> str:
        items = [f"{d} ({n})" for k, d, n in self.usage.live.values() if k == kind]
        return "; ".join(items) if items else "none"


def _release_callback(usage: _Usage, key: int):
    def release() -> None:
        kind, _desc, amount = usage.live.pop(key, ("", "", 0))
        if kind == "sbuf":
            usage.sbuf_bytes -= amount
        elif kind == "psum":
            usage.psum_banks -= amount

    return release


def current(where: str) -> KernelRun:
    """The kernel run in progress, or an error naming ``where`` if none is."""
    if not _state.KERNEL_STACK:
        raise EmulatorError(
            f"{where}: called outside an @nki.jit kernel; NKI calls only run inside kernels"
        )
    return _state.KERNEL_STACK[-1]
