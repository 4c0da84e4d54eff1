"""Memory planner: every block size of the MP2 step comes from here.

All sizes in bytes unless a name says MB. With ``w`` the item size (8 for float64):

* ``B`` (the fitted tensor, resident): ``o * v * X * w``
* one auxiliary block of ``p`` functions during the transform: the packed and the unpacked
  int3c2e block plus the half- and full-transformed copies,
  ``p * (1.5 * n^2 + 2 * n * o + 2 * o * v) * w``
* the fit of ``r`` rows of ``(ia|P)``: input and output rows, ``2 * r * X * w``
* a pair block of ``b`` occupied orbitals against ``b``: the ``(ia|jb)`` block and the
  reduction's temporaries, ``6 * b^2 * v^2 * w`` (float64: the reduction is always float64)
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ResourceError

__all__ = ["BlockPlan", "plan_blocks"]

MB = 1024 * 1024
_F64 = 8


@dataclass(frozen=True)
class BlockPlan:
    """aux_block : auxiliary functions per int3c2e block; fit_rows : (ia) rows per fit call;
    occ_block : occupied orbitals per pair-energy block; b_bytes : size of B."""

    aux_block: int
    fit_rows: int
    occ_block: int
    b_bytes: int

    def as_dict(self) -> dict:
        return {"aux_block": self.aux_block, "fit_rows": self.fit_rows,
                "occ_block": self.occ_block, "b_mb": round(self.b_bytes / MB, 1)}


def plan_blocks(nao: int, nocc: int, nvir: int, naux: int, max_memory_mb: float,
                itemsize: int = _F64) -> BlockPlan:
    """Block sizes that keep the MP2 working set under ``max_memory_mb``.

    Raises :class:`ResourceError` before any work when even the smallest blocks do not fit.
    """
    budget = max_memory_mb * MB
    b_bytes = nocc * nvir * naux * itemsize
    free = budget - b_bytes
    per_aux = (1.5 * nao * nao + 2 * nao * nocc + 2 * nocc * nvir) * itemsize
    per_pair = 6 * nvir * nvir * _F64
    smallest = max(per_aux, 2 * naux * itemsize, per_pair)
    if free < smallest:
        need_mb = (b_bytes + smallest) / MB
        raise ResourceError(
            f"max_memory {max_memory_mb:.0f} MB is too small: the fitted integrals B "
            f"(nocc {nocc} x nvir {nvir} x naux {naux}) need {b_bytes / MB:.0f} MB plus "
            f"{smallest / MB:.1f} MB of work space; give at least {need_mb:.0f} MB"
        )
    aux_block = int(max(1, min(naux, free // per_aux, 512)))
    fit_rows = int(max(1, min(nocc * nvir, free // (2 * naux * itemsize))))
    occ_block = int(max(1, min(nocc, (free / per_pair) ** 0.5, 64)))
    return BlockPlan(aux_block, fit_rows, occ_block, b_bytes)
