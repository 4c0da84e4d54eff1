"""State of one emulated kernel call: memory budgets and ScalarE reduce registers.

Liveness model: an SBUF/PSUM allocation is live while any Python object refers to it (the
tensor returned by ``nl.ndarray`` or any view of it). CPython frees it when the last reference
goes, e.g. when a loop rebinds the name. The new tile is allocated before the old name is
rebound, so a tile allocated inside a loop briefly counts twice. This is conservative compared
with the compiler's allocator; the budgets are per partition:

- SBUF: the usable bytes per partition, 180224 (trn1) or 212984 (trn2), of the documented
  192 KiB or 224 KiB (``_state.SBUF_BYTES_PER_PARTITION``);
- PSUM: 8 banks of 2 KiB per partition; each allocation takes whole banks (rounded up) and
  starts on a bank boundary.

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
from ._tensor import Allocation, MemoryRegion


class EmulatorError(RuntimeError):
    """A kernel broke a documented NKI 0.3.0 rule (the message names the rule and the values)."""


@dataclass
class _Usage:
    """Live on-chip usage per partition (apart from allocations, for the finalizers)."""

    sbuf_bytes: int = 0
    psum_banks: int = 0
    live: dict[int, tuple[str, str, int]] = field(default_factory=dict)


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
        self.instructions = 0
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

    def count_instruction(self, instruction: str) -> None:
        """Count one issued instruction; raise past ``_state.MAX_INSTRUCTIONS_PER_LAUNCH``
        (per program in a grid launch: each physical core runs its own instruction stream)."""
        self.instructions += 1
        if self.instructions > _state.MAX_INSTRUCTIONS_PER_LAUNCH:
            who = f" ({self.label})" if self.label else ""
            raise EmulatorError(
                f"nisa.{instruction}: kernel {self.name!r}{who} issued more than "
                f"{_state.MAX_INSTRUCTIONS_PER_LAUNCH} instructions in one launch (the emulator's "
                "bound on an unrolled trace; split the work over launches on the host)"
            )

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
