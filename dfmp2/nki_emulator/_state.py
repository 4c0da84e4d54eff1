"""The emulator's only module-level mutable state.

Everything that changes at run time lives here, in one place:

- ``INSTALLED``: whether :func:`dfmp2.nki_emulator.install` aliased ``nki`` in ``sys.modules``
  (together with the entries it displaced, restored by ``uninstall``);
- ``TRACE_STACK``: the active :class:`~dfmp2.nki_emulator._trace.Trace` objects (innermost last);
- ``KERNEL_STACK``: the kernel runs in progress (one per active ``@nki.jit`` call; nesting a
  kernel call inside a kernel is rejected, so it holds at most one entry);
- ``TARGET``: the emulated platform, ``"trn2"`` (gen3, the default) or ``"trn1"`` (gen2), set
  through :func:`dfmp2.nki_emulator.set_target` (never read from the environment at import).
"""

from __future__ import annotations

from typing import Any

INSTALLED: dict[str, Any] = {"on": False, "displaced": {}}
TRACE_STACK: list[Any] = []
KERNEL_STACK: list[Any] = []
TARGET: dict[str, str] = {"name": "trn2"}

#: Per-partition SBUF bytes a kernel may allocate on each target. The documented capacities are
#: 192 KiB (trn1: 24 MiB / 128) and 224 KiB (trn2: 28 MiB / 128); the compiler reserves part of
#: it, and its usable size (``nl.tile_size.total_available_sbuf_size``) has no documented
#: value. These are the values of the KLR kernel IR (leanprover/KLR, an implementation constant,
#: not documentation): 180224 B (trn1) and 212984 B (trn2).
SBUF_BYTES_PER_PARTITION = {"trn1": 180224, "trn2": 212984}
#: Documented SBUF capacity per partition (reported in errors beside the usable size).
SBUF_CAPACITY_PER_PARTITION = {"trn1": 192 * 1024, "trn2": 224 * 1024}
#: Instructions one kernel launch may issue. No limit is documented (the compiler reports only
#: "number of instructions generated exceeds the limit", and trnsci's fully unrolled kernels
#: failed to compile or to load: an 18 GB trace, NRT_RESOURCE); this bound is the emulator's
#: assumption, twice the largest launch dfmp2's host wrappers plan (8192 instructions).
MAX_INSTRUCTIONS_PER_LAUNCH = 16384
#: PSUM geometry, identical on trn1 and trn2: 8 banks of 2 KiB per partition.
PSUM_BANK_BYTES = 2048
PSUM_BANKS = 8
#: Number of partitions (lanes) of SBUF and PSUM.
NUM_PARTITIONS = 128
