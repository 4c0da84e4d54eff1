"""Memory planner: every block size of the MP2 step, and in-core versus out-of-core, from here.

All sizes in bytes unless a name says MB. o, v, X: active occupied, active virtual, auxiliary
functions; n: basis functions; ``w`` the item size of the stored B (8 for fp64, 4 for fp32 and
mixed). The transformed integrals ``(ia|P)`` are always float64.

* resident in memory throughout: the metric's factor ``L``, ``L^{-T}`` for the fit and, while
  either is formed, the metric or the identity, ``3 * 8 X^2``
* resident in memory (in-core only): ``(ia|P)``, overwritten in place by B in fp64,
  ``8 o v X``, plus a separate B of ``w o v X`` when B is stored in fp32
* one auxiliary block of ``p`` functions during the transform: the packed int3c2e block,
  ``8 p n(n+1)/2`` (a block holds whole shells: one shell larger than ``p`` makes a block of
  its own, left to the reserve), and ``u`` of its functions
  transformed at a time, one product per step for all of them (``u`` up to
  :data:`_UNPACK_BYTES`): their square matrices, ``8 u n^2`` once for every space, and per
  space their half- and full-transformed copies, ``8 u (n o + o v)``, plus out of core the
  copy the HDF5 write makes, ``8 u o v``. On the nki backend each product also makes float32
  copies of its operands and a float64 result, up to about twice the group's buffers, which
  :data:`_UNPACK_BYTES` keeps small next to the reserve
* the fit of ``f`` occupied orbitals: the slab of ``(ia|P)`` rows and the product's column
  block, ``2 * 8 f v X``; out of core ``3 * 8 f v X`` (h5py's read of the strided slab, its
  transpose, and the write)
* a pair block of ``b`` occupied orbitals against ``b``: the ``(ia|jb)`` block, ``8 b^2 v^2``,
  and the reduction's three row buffers, ``3 * 8 b v^2``; out-of-core also the two B blocks read
  from disk, ``2 w b v X``

B goes to a temporary HDF5 file when the in-core resident set does not leave room for the
smallest blocks (or when ``force_outcore``). :data:`RESERVE` of the budget is kept back for what
the formulas do not model (integral-library and HDF5 buffers, allocator slack).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import ResourceError

__all__ = ["BlockPlan", "JKPlan", "jk_lane_budget", "jk_square_fits", "jk_square_rows",
           "jk_work_bytes",
           "plan_blocks", "plan_jk", "pair_block_bytes", "transform_bytes_per_unpacked",
           "usable_bytes", "MB", "size_text", "size_texts", "RESERVE"]

MB = 1024 * 1024


def size_text(nbytes: float) -> str:
    """``nbytes`` for a message: to three significant figures in MB, or in kB below 1 MB, or
    in bytes below 1 kB (so that a need and a room that differ do not both read '0 MB')."""
    for unit, size in (("MB", MB), ("kB", 1024)):
        value = nbytes / size
        if value >= 1:
            decimals = 0 if value >= 100 else 1 if value >= 10 else 2
            return f"{value:.{decimals}f} {unit}"
    return f"{int(nbytes)} byte" + ("" if int(nbytes) == 1 else "s")


def size_texts(need: float, room: float) -> tuple[str, str]:
    """:func:`size_text` of a need and the room it does not fit in, in bytes where the two
    would read the same."""
    texts = size_text(need), size_text(room)
    return texts if texts[0] != texts[1] else (f"{int(need)} bytes", f"{int(room)} bytes")


_F64 = 8
#: Auxiliary functions per int3c2e block to aim for. Measured on C20H42 cc-pVDZ (nao 490, the
#: packed and unpacked blocks 94 + 188 MB at 128) inside repeated DF-MP2 runs: transform 4.6 s
#: at 64 and at 192, 4.1 s at 96 and 128. Larger blocks fall out of cache and page-fault more
#: fresh memory per run; smaller ones multiply int3c2e's per-call cost.
_AUX_BLOCK_FUNCTIONS = 128
#: Bytes of the transform's buffers for the functions it unpacks and transforms at a time (their
#: square ``(mu nu|P)`` matrices, half- and full-transformed copies; one product per step for
#: all of them, :func:`dfmp2.pipeline.transform`). Measured on the Intel Xeon (family 6, model
#: 167), the whole transform: C20H42 cc-pVDZ (nao 490) 2.79-2.84 s with 16 or 32 functions at
#: a time against 3.1-3.25 s with 4; (H2O)16 (nao 384) 1.54-1.56 s with 16 or 32, 1.60-1.65 s
#: with 64 and 1.81-1.84 s with 4.
_UNPACK_BYTES = 32 * MB
#: Fraction of ``max_memory`` the block formulas may not use. Measured on (H2O)16 cc-pVDZ with
#: B out of core under 150 MB: the working set exceeded the formulas' total by 17 MB (11%).
RESERVE = 0.15
#: Rows of AO pairs in the DF-SCF build's int3c2e block (dfmp2.scf_integrals.JK_AUX_BLOCK) and
#: columns of torch's trmm work array (dfmp2.linalg.torch_ops.TRMM_COLUMN_BLOCK), for
#: :func:`plan_jk`.
_JK_INT3C_ROWS = 128
_TRMM_COLUMNS = 256
#: Largest occupied block: bigger ones stop paying off in GEMM efficiency.
_MAX_OCC_BLOCK = 64


@dataclass(frozen=True)
class BlockPlan:
    """aux_block : auxiliary functions per int3c2e block; unpack_block : square (mu nu|P) matrices
    unpacked and transformed at a time within it (one product per step for the group);
    fit_occ : occupied orbitals per fit call; occ_block : occupied orbitals per pair-energy
    block; b_bytes : size of the stored B; outcore : B lives in an HDF5 file; resident_bytes :
    what stays in memory throughout; forced : out of core because the run asked for it
    (``force_outcore``), which a device run honours too (:func:`dfmp2.device.plan_device`)."""

    aux_block: int
    unpack_block: int
    fit_occ: int
    occ_block: int
    b_bytes: int
    outcore: bool
    resident_bytes: int
    forced: bool = False

    def as_dict(self) -> dict:
        return {"aux_block": self.aux_block, "unpack_block": self.unpack_block,
                "fit_occ": self.fit_occ,
                "occ_block": self.occ_block, "b_mb": round(self.b_bytes / MB, 1),
                "storage": "hdf5" if self.outcore else "incore",
                "resident_mb": round(self.resident_bytes / MB, 1)}


def plan_blocks(nao: int, spaces: Sequence[tuple[int, int]], naux: int, max_memory_mb: float,
                b_itemsize: int = _F64, force_outcore: bool = False,
                transform_spaces: Sequence[tuple[int, int]] | None = None) -> BlockPlan:
    """Block sizes that keep the MP2 working set under ``max_memory_mb``.

    spaces : (nocc, nvir) of each orbital space, one for a closed shell, alpha and beta for an
    open shell. Every formula of the module header holds per space and adds over the spaces
    (``o v X`` becomes ``sum_s o_s v_s X``), but for the transform's packed block and square
    matrices, which the spaces share; the transform holds one group of every space at once; a
    pair block is the largest over the spin blocks (``v`` becomes ``v_s v_t`` for the
    alpha-beta block). ``transform_spaces``: the (nocc, nvir) whose groups the transform
    holds, when they are not ``spaces`` (a distributed rank plans its occupied slices but
    transforms every occupied orbital of its auxiliary functions).
    Raises :class:`ResourceError` before any work when even the smallest
    blocks do not fit.
    """
    spaces = [(o, v) for o, v in spaces if o and v] or [(0, 0)]
    transformed = [(o, v) for o, v in (spaces if transform_spaces is None else transform_spaces)
                   if o and v] or [(0, 0)]
    budget = usable_bytes(max_memory_mb)
    ovx = sum(o * v for o, v in spaces) * naux
    b_bytes = ovx * b_itemsize
    per_aux = (nao * (nao + 1) // 2) * _F64  # the packed block (all spaces read it)
    per_unpacked = sum(transform_bytes_per_unpacked(nao, o, v) for o, v in transformed) \
        - (len(transformed) - 1) * nao * nao * _F64  # one square matrix for all spaces
    vmax = max(v for _, v in spaces)
    per_fit_occ = 2 * vmax * naux * _F64
    pair_ovov = 4 * vmax * vmax * _F64  # b = 1: the (ia|jb) block and three row buffers
    metric = 3 * naux * naux * _F64
    resident = metric + ovx * _F64 + (b_bytes if b_itemsize != _F64 else 0)
    smallest = max(per_aux + per_unpacked, per_fit_occ, pair_ovov)
    outcore = force_outcore or budget - resident < smallest
    if outcore:
        resident = metric
        per_unpacked += sum(o * v for o, v in transformed) * _F64  # H5Store's copy of a group
        per_fit_occ = 3 * vmax * naux * _F64
        smallest = max(per_aux + per_unpacked, per_fit_occ,
                       pair_ovov + 2 * vmax * naux * b_itemsize)
    free = budget - resident
    if free < smallest:
        need = (resident + smallest) / MB
        dims = " + ".join(f"nocc {o} x nvir {v}" for o, v in spaces)
        dims = f"({dims})" if len(spaces) > 1 else dims  # both spins' pairs, times naux
        raise ResourceError(
            f"max_memory {max_memory_mb:.0f} MB is too small: with B ({dims} x naux {naux}) "
            f"on disk the metric factors and the smallest blocks still need {need:.1f} MB; "
            f"give at least {least_max_memory(need)} MB", least_max_memory(need)
        )
    unpack_block = int(max(1, min(_UNPACK_BYTES, free // 4) // per_unpacked))
    aux_block = int(max(1, min(naux, (free - unpack_block * per_unpacked) // per_aux,
                               _AUX_BLOCK_FUNCTIONS)))
    unpack_block = min(unpack_block, aux_block)
    omax = max(o for o, _ in spaces)
    fit_occ = int(max(1, min(omax, free // per_fit_occ)))
    occ_block = _largest_occ_block(free, omax, vmax, naux, b_itemsize if outcore else 0)
    return BlockPlan(aux_block, unpack_block, fit_occ, occ_block, b_bytes, outcore, int(resident),
                     force_outcore)


def jk_square_fits(nao: int, naux: int, itemsize: int, max_memory_mb: float,
                   unpack_block: int = 16) -> bool:
    """Whether K may keep a DF-SCF's in-memory tensor unpacked too, (naux, n, n) in
    ``itemsize``-byte floats: the packed tensor, that copy and K's work arrays within the usable
    budget (the metric's factors are gone once the tensor is built). ``unpack_block``: K's
    (:data:`dfmp2.scf_integrals.UNPACK_BLOCK`, which its callers pass)."""
    packed = _F64 * naux * (nao * (nao + 1) // 2)
    return (packed + itemsize * naux * nao * nao + jk_work_bytes(nao, unpack_block)
            <= usable_bytes(max_memory_mb))


def jk_square_rows(nao: int, naux: int, ncol: int, max_memory_mb: float,
                   square_block: int, unpack_block: int, metric_naux: int | None = None) -> int:
    """How many of a DF-SCF's in-memory tensor's rows (auxiliary functions) may be held
    unpacked, (q, n, n) float64, with the others on the ``ncol`` columns of the AO pairs that
    are not zero, (naux - q, ncol), in the memory of the build
    (:func:`dfmp2.scf_integrals.split_cderi`): the metric's factors, those rows and the
    larger of the build's work arrays and K's within the usable budget, for the largest q.
    K's work arrays: one block's product ``Y = C^T B^Q`` of up to 2n columns, ``8 * 2n *
    square_block * n`` (a float32 cycle's Y and its float32 copy of the block take ``12 *
    square_block * n^2`` of that), and where some rows stay on their pairs their unpacking, as
    in :func:`jk_square_fits`. ``naux`` (the tensor unpacked only) when it fits so, 0 when
    not even the pair-screened tensor fits that way. ``square_block``, ``unpack_block``:
    :data:`dfmp2.jk.K_SQUARE_BLOCK` and :data:`dfmp2.scf_integrals.UNPACK_BLOCK`, which its
    callers pass. ``metric_naux``: the fitting set's functions, whose metric is factored, where
    eigenvalues dropped leave the tensor ``naux`` rows only (None: ``naux``)."""
    square, columns = _F64 * nao * nao, _F64 * ncol
    metric_naux = naux if metric_naux is None else metric_naux
    usable = usable_bytes(max_memory_mb)
    metric = 3 * metric_naux * metric_naux * _F64
    build, k_square = _jk_build_bytes(nao, naux), _k_square_bytes(nao, square_block)
    if metric + max(build, k_square) + square * naux <= usable:
        return naux
    # Some rows on their pairs: where square <= columns (one basis function) the whole tensor
    # unpacked needs no more than this, so free < 0 below and no division by zero is reached.
    free = usable - metric - max(build, k_square + jk_work_bytes(nao, unpack_block)) \
        - columns * naux
    if free < 0:
        return 0
    return min(naux, int(free // (square - columns)))


def _k_square_bytes(nao: int, square_block: int) -> int:
    """K's product of a block of ``square_block`` unpacked rows with up to 2n columns (two
    densities' occupied orbitals), ``8 * 2n * square_block * n``."""
    return _F64 * 2 * nao * square_block * nao


def _jk_build_bytes(nao: int, naux: int) -> int:
    """The DF-SCF tensor build's work arrays: the int3c2e block
    (dfmp2.scf_integrals.JK_AUX_BLOCK rows of AO pairs) and torch's trmm work array
    (torch_ops.TRMM_COLUMN_BLOCK columns of pairs)."""
    return _F64 * (nao * (nao + 1) // 2) * (_JK_INT3C_ROWS + min(naux, _TRMM_COLUMNS))


def jk_work_bytes(nao: int, unpack_block: int) -> int:
    """K's work arrays per build: ``unpack_block`` unpacked matrices, their float32 copy and the
    products, ``3 * 8 u n^2``."""
    return 3 * unpack_block * nao * nao * _F64


def jk_lane_budget(nao: int, naux: int, square_block: int, unpack_block: int, unpacked: bool,
                   packed: bool, copy: bool) -> int:
    """What the planner sets aside in memory for one J/K build's work arrays, as the lanes of
    :func:`dfmp2.jk.get_jk` may fill it: for rows held unpacked (``unpacked``: the tensor
    unpacked only, or its first rows) the product of a block of ``square_block`` of them with up
    to 2n columns, ``8 * 2n * square_block * n`` (:func:`jk_square_rows`); for rows on their AO
    pairs (``packed``) K's unpacking (:func:`jk_work_bytes`); and, unless a square ``copy`` sits
    next to packed rows (:func:`jk_square_fits` counts only the unpacking for it), the larger
    of that and the tensor build's own arrays, released before the first build
    (:func:`plan_jk`, :func:`jk_square_rows`)."""
    work = ((_k_square_bytes(nao, square_block) if unpacked else 0)
            + (jk_work_bytes(nao, unpack_block) if packed else 0))
    return work if copy else max(work, _jk_build_bytes(nao, naux))


def transform_bytes_per_unpacked(nao: int, nocc: int, nvir: int) -> int:
    """Transform buffers per auxiliary function of a group transformed at a time, for one
    orbital space: its square (mu nu|P), half-transformed (i, nu) and fully transformed (i, a)
    matrices (several spaces share the square one)."""
    return (nao * nao + nao * nocc + nocc * nvir) * _F64


def usable_bytes(max_memory_mb: float) -> float:
    """The part of ``max_memory_mb`` the planner's formulas may fill: all but :data:`RESERVE`."""
    return (1.0 - RESERVE) * max_memory_mb * MB


def least_max_memory(need_mb: float) -> int:
    """The smallest whole ``max_memory`` in MB whose usable part holds ``need_mb``."""
    least = math.ceil(need_mb / (1.0 - RESERVE))
    return least if usable_bytes(least) >= need_mb * MB else least + 1


def pair_block_bytes(b: int, nvir: int, naux: int, b_itemsize: int) -> int:
    """Working set of a b x b pair block: ``8 b^2 v^2 + 3 * 8 b v^2 + 2 w b v X`` (w = 0 when B
    is in memory)."""
    return _F64 * b * b * nvir * nvir + 3 * _F64 * b * nvir * nvir + 2 * b_itemsize * b * nvir * naux


def _largest_occ_block(free: float, nocc: int, nvir: int, naux: int, b_itemsize: int) -> int:
    """Largest b (at most :data:`_MAX_OCC_BLOCK`) whose pair block fits in ``free``."""
    block = 1
    for b in range(1, min(nocc, _MAX_OCC_BLOCK) + 1):
        if pair_block_bytes(b, nvir, naux, b_itemsize) <= free:
            block = b
    return block


@dataclass(frozen=True)
class JKPlan:
    """Where a DF-SCF's fitted tensor B (naux, n(n+1)/2) lives while dfmp2 builds J and K.

    outcore : in a temporary file (:class:`dfmp2.storage.MatrixFile`) rather than in memory;
    fit_pairs : AO pairs per block of the out-of-core fit (int3c2e for all auxiliary functions
    of those pairs, fitted, written); read_block : auxiliary functions read from the file at a
    time in each J/K build; tensor_bytes : the packed tensor's size (in memory or on disk);
    resident_bytes : what stays in memory throughout (the tensor in core; the metric's factors);
    incore_bytes : what holding the tensor in memory takes (the metric's factors, the packed
    tensor and the larger of K's and the build's work arrays), within the usable budget
    (:func:`usable_bytes`) when not ``outcore``; forced : out of core because ``force_outcore``
    asked (more memory would not bring it into memory).
    Whether K also keeps the tensor unpacked is :func:`jk_square_fits`."""

    outcore: bool
    fit_pairs: int
    read_block: int
    tensor_bytes: int
    resident_bytes: int
    incore_bytes: int = 0
    forced: bool = False


def plan_jk(nao: int, naux: int, max_memory_mb: float, max_shell_pairs: int,
            unpack_block: int = 16, force_outcore: bool = False) -> JKPlan:
    """In core or out of core for a DF-SCF's fitted tensor under ``max_memory_mb``, and the
    out-of-core block sizes.

    In core: the metric's factors (``3 * 8 X^2``), the packed tensor (``8 X n(n+1)/2``) and
    the larger of K's work arrays (``3 * 8 u n^2``: ``unpack_block`` unpacked matrices, their
    float32 copy and the products) and the build's (an int3c2e block and a trmm work array,
    ``8 n(n+1)/2 (128 + min(X, 256))``) fit in the usable budget. Out of core, the metric's
    factors stay and a fit block of ``f`` AO pairs takes ``2 * 8 f X`` (the integrals and their
    fitted copy), a read block of ``r`` auxiliary functions ``8 r n(n+1)/2`` plus K's work
    arrays; ``f`` must hold the pairs of the largest AO shell row (``max_shell_pairs``). Raises
    :class:`ResourceError` when even those do not fit."""
    budget = usable_bytes(max_memory_mb)
    npair = nao * (nao + 1) // 2
    tensor = _F64 * naux * npair
    metric = 3 * naux * naux * _F64
    work = jk_work_bytes(nao, unpack_block)
    incore = metric + tensor + max(work, _jk_build_bytes(nao, naux))
    if not force_outcore and incore <= budget:
        return JKPlan(False, npair, naux, tensor, metric + tensor, incore)
    free = budget - metric
    per_pair, per_row = 2 * _F64 * naux, _F64 * npair
    if free < max(per_pair * max_shell_pairs, per_row + work):
        need = (metric + max(per_pair * max_shell_pairs, per_row + work)) / MB
        raise ResourceError(
            f"max_memory {max_memory_mb:.0f} MB is too small for the DF-SCF: with its fitted "
            f"integrals (naux {naux} x {npair} AO pairs) on disk, the metric factors and the "
            f"smallest blocks still need {need:.1f} MB; give at least "
            f"{least_max_memory(need)} MB", least_max_memory(need))
    fit_pairs = int(min(npair, free // per_pair))
    read_block = int(max(1, min(naux, 128, (free - work) // per_row)))
    return JKPlan(True, fit_pairs, read_block, tensor, metric, incore, force_outcore)
