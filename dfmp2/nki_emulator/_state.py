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

#: Per-partition SBUF bytes of each target (trn1: 24 MiB / 128, trn2: 28 MiB / 128).
SBUF_BYTES_PER_PARTITION = {"trn1": 192 * 1024, "trn2": 224 * 1024}
#: PSUM geometry, identical on trn1 and trn2: 8 banks of 2 KiB per partition.
PSUM_BANK_BYTES = 2048
PSUM_BANKS = 8
#: Number of partitions (lanes) of SBUF and PSUM.
NUM_PARTITIONS = 128
