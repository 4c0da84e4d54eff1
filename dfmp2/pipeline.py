"""The DF-MP2 pipeline: metric -> transform -> fit -> pair energy, each stage through linalg ops.

Indices: i, j active occupied; a, b active virtual; P, Q auxiliary. Every function is pure apart
from the optional ``progress(stage, done, total)`` callback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from .blocking import BlockPlan
from .buffers import Buffers
from .df import (
    METRIC_ON_HOST,
    MetricFactor,
    PairUnpacker,
    factor_metric,
    fit_in_place,
    fit_matrix,
    host_ops,
    iter_int3c2e,
    metric,
    solves,
    unpack_pairs,
)
from .energy import CLOSED, OPPOSITE, SAME, SpinBlock, pair_weights
from .errors import PrecisionError, ResourceError
from .linalg import Dispatcher
from .reference import OrbitalSpace
from .storage import H5Store, IncoreStore

log = logging.getLogger(__name__)

__all__ = [
    "FIT_HOST_CONDITION",
    "PRECISION_DTYPES",
    "STAGES",
    "TRANSFORM_HOST_CONDITION",
    "PairEnergies",
    "PairMatrix",
    "SpinTask",
    "StagePrecision",
    "TensorB",
    "dfmp2_pair_energies",
    "fit",
    "pair_energies",
    "plan_stages",
    "spin_tasks",
    "transform",
]


Progress = Callable[[str, int, int], None]


def _no_progress(stage: str, done: int, total: int) -> None:
    return None


# -- where each stage of an NKI run computes -------------------------------------------------
#: Above this metric condition number an NKI run computes the AO->MO transform on the host in
#: fp64. Error model: fp32 rounds (ia|P) with relative error u ~ 6e-8; the fit multiplies by
#: L^{-T}, whose norm is 1/sqrt(w_min), so the noise in B grows like u * sqrt(cond) relative to
#: B, and the pair energies pick up that first-order term (random signs, partly cancelling)
#: plus a systematic second-order u^2 * cond term. Measured on the emulator (fp64 metric
#: factor and L^{-T}; error of E_corr, Hartree, against fp64; cond is this 1-norm estimate):
#: C4H10 cc-pVDZ-RI 4.0e6: 1.3e-7; benzene cc-pVDZ-RI 7.8e6: 3.8e-7; (H2O)4 aug-cc-pVDZ-RI
#: 2.7e7: 1.6e-7; H2O aug-cc-pVTZ-RI 3.4e7: 8.3e-7; benzene aug-cc-pVDZ-RI 7.1e8: 4.8e-4;
#: H2O aug-cc-pVTZ aug_etb(2.0) 2.9e9: 4.9e-6, (1.5) 7.0e13: 1.4e-2. Between 1e7 and 1e9 the
#: error grew like cond^1.6 (benzene), so the limit sits where every measured error is 25x
#: below the 1e-5 Eh budget.
TRANSFORM_HOST_CONDITION = 1e7
#: Above this condition number the fit (``B = (ia|P) L^{-T}``) also runs on the host in fp64.
#: With an fp64 (ia|P), the fp32 product with L^{-T} measured (same runs as above): <= 4e-7 up
#: to 4.4e10 (H2O aug_etb(1.8)), 3.9e-7 at 7.1e8 (benzene), then 2.4e-6 (benzene aug_etb(2.0),
#: 2.6e11), 4.0e-6 (H2O, 2.6e11), 1.9e-5 (H2O, 3.4e12).
FIT_HOST_CONDITION = 1e10
#: With (ia|P) and B in fp64, only the pair energies run in fp32 on NKI. That error does not
#: depend on the metric: the fit is a projection in the Coulomb metric, so sum_Q (B_ia^Q)^2 <=
#: (ia|ia) whatever cond is, and rounding B to fp32 perturbs (ia|jb) by ~u (ia|ia). Measured
#: 1e-9 to 5e-9 Eh for every basis above, up to cond 8.5e15 and with 73 eigenvalues dropped. So
#: the NKI path never needs to refuse; it refuses only under ``--require-nki``, which forbids
#: running a stage off the device (:class:`PrecisionError`).
STAGES = ("metric", "transform", "fit", "pair_energy")


@dataclass(frozen=True)
class StagePrecision:
    """Where and in what precision one pipeline stage computes, and why.

    placement : 'nki fp32' (NKI kernels, fp32, host sums in fp64), 'host fp64' (an NKI run's
    stage kept on the host), or 'pytorch fp64' / 'pytorch fp32' (the pytorch backend).
    """

    stage: str
    placement: str
    reason: str

    def as_dict(self) -> dict:
        return {"placement": self.placement, "reason": self.reason}


#: What a bf16x3 pair stage's record says of its error (docs/nki.md, "Precision of the pair
#: kernels' products").
BF16X3_PAIR_REASON = (
    "three bfloat16 products of a high/low split of B into float32 PSUM (--nki-matmul "
    "bf16x3): each drops lo*lo, up to 2^-18 of |B_ia||B_jb| and one-signed where a pair's "
    "terms are sums of squares; 1e-7 Eh on the molecule ladder, 1.05e-5 Eh on H2 stretched "
    "to 12 A (E(corr) -0.74 Eh)")


def plan_stages(backend: str, condition: float | None, precision: str = "fp64",
                require_nki: bool = False, pair_table: bool = False,
                nki_matmul: str = "fp32") -> tuple[StagePrecision, ...]:
    """The placement of :data:`STAGES` for a run on ``backend`` with a metric of condition
    number ``condition`` (see :attr:`MetricFactor.condition`).

    On nki: the metric on the host in fp64 always; the transform above
    :data:`TRANSFORM_HOST_CONDITION` and the fit above :data:`FIT_HOST_CONDITION` on the host in
    fp64; the pair energies on NKI, or with ``pair_table`` (every pair's energy kept) on the
    host, in B's precision (``precision``); with ``nki_matmul`` bf16x3 their products are
    three bfloat16 matmuls (:data:`BF16X3_PAIR_REASON`). Raises :class:`PrecisionError` when
    ``require_nki`` forbids a host stage that the condition number needs.
    """
    if backend != "nki":
        pair = "pytorch fp64" if precision == "fp64" else "pytorch fp32"
        return tuple(StagePrecision(stage, pair if stage == "pair_energy" else "pytorch fp64",
                                    f"backend pytorch, precision {precision}")
                     for stage in STAGES)
    cond = float("inf") if condition is None else condition
    stages = [StagePrecision("metric", "host fp64", METRIC_ON_HOST)]
    for stage, limit in (("transform", TRANSFORM_HOST_CONDITION), ("fit", FIT_HOST_CONDITION)):
        if cond > limit:
            stages.append(StagePrecision(stage, "host fp64", (
                f"{stage} stage: fp64 on the host because the metric's condition number "
                f"{cond:.1e} exceeds {limit:.0e} (fp32 would amplify rounding past 1e-5 Eh)")))
        else:
            stages.append(StagePrecision(stage, "nki fp32", (
                f"metric condition number {cond:.1e} <= {limit:.0e}")))
    if pair_table:
        stages.append(StagePrecision(
            "pair_energy", "host fp64" if precision == "fp64" else "host fp32",
            "every pair's energy kept (pair energies asked for): a host op, mp2_pair_table"))
    elif nki_matmul == "bf16x3":
        stages.append(StagePrecision("pair_energy", "nki bf16x3", BF16X3_PAIR_REASON))
    else:
        stages.append(StagePrecision("pair_energy", "nki fp32",
                                     "bounded error: |B_ia|^2 <= (ia|ia) whatever the metric"))
    # the stages the condition number moves (the metric is always on the host; the pair
    # table is a host op by request, not for precision)
    host = [s.stage for s in stages if s.stage in ("transform", "fit")
            and s.placement == "host fp64"]
    if require_nki and host:
        raise PrecisionError(
            f"the auxiliary metric's condition number {cond:.1e} needs the {' and '.join(host)} "
            f"in fp64 on the host, which --require-nki forbids; drop --require-nki, use a better "
            "conditioned auxiliary basis, or run --backend pytorch"
        )
    return tuple(stages)


def _stage_ops(la: Dispatcher, stage: StagePrecision):
    """The dispatcher (or its host view) that runs ``stage``."""
    return host_ops(la, stage.reason) if stage.placement == "host fp64" else la


def transform(mol, auxmol, spaces: Sequence[OrbitalSpace], la: Dispatcher, aux_block: int,
              unpack_block: int, stores: Sequence, progress: Progress = _no_progress,
              shells: tuple[int, int] | None = None) -> None:
    """``(ia|P) = sum_{mu nu} C_mu,i C_nu,a (mu nu|P)`` for every orbital space (one for a
    closed shell, alpha and beta for an open shell), streamed over auxiliary-shell blocks into
    the matching ``stores`` (float64). Each int3c2e block is computed and unpacked once and
    transformed with every space.

    Per block of ``aux_block`` auxiliary functions, ``unpack_block`` functions at a time: the
    packed integrals are unpacked by one thread per CPU (:class:`PairUnpacker`) into square
    matrices, ``(q, mu, nu)`` viewed as ``(q*mu, nu)``; one product ``C_occ^T (q*mu,
    nu)^T`` gives the half-transformed ``(i, q*nu)`` of all q (each matrix is symmetric, so no
    transpose is needed), one more ``(i*q, nu) x (nu, a)`` the fully transformed ``(i, q, a)``,
    which the store writes as (q, i, a); all products through ``la.gemm``. Every intermediate
    lives in one buffer reused by all blocks (fresh arrays of this size cost page faults
    comparable to the GEMMs on the benchmark machine). The group size and what it was measured
    against (one half-transform product per matrix): :data:`dfmp2.blocking._UNPACK_BYTES`.

    shells : ``(shell0, shell1)``, only these auxiliary shells (a rank's share of a distributed
    run); the stores then hold their functions, from 0.
    """
    shells = shells or (0, auxmol.nbas)
    ao_loc = auxmol.ao_loc_nr()
    base, naux = int(ao_loc[shells[0]]), int(ao_loc[shells[1]] - ao_loc[shells[0]])
    coeffs = [(torch.from_numpy(sp.occ_coeff), torch.from_numpy(sp.vir_coeff)) for sp in spaces]
    for occ_coeff, vir_coeff in coeffs:  # read by every block: a device keeps them
        la.keep_on_device(occ_coeff)
        la.keep_on_device(vir_coeff)
    nao = mol.nao_nr()
    buffers = Buffers()
    with PairUnpacker() as unpack:
        for p0, p1, packed in iter_int3c2e(mol, auxmol, aux_block, shells):
            for s0 in range(0, p1 - p0, unpack_block):
                s1 = min(s0 + unpack_block, p1 - p0)
                q = s1 - s0
                square = buffers.get("square", (q, nao, nao))
                unpack(packed[s0:s1], square.numpy())
                for s, ((occ_coeff, vir_coeff), store) in enumerate(zip(coeffs, stores)):
                    nocc, nvir = spaces[s].nocc, spaces[s].nvir
                    half = la.gemm(occ_coeff, square.view(q * nao, nao), trans_a=True,
                                   trans_b=True, out=buffers.get(f"half{s}", (nocc, q * nao)))
                    full = la.gemm(half.view(nocc * q, nao), vir_coeff,
                                   out=buffers.get(f"full{s}", (nocc * q, nvir)))  # (i*q, a)
                    store.write_pia(p0 + s0 - base, p0 + s1 - base,
                                    full.view(nocc, q, nvir).permute(1, 0, 2))
            progress("transform", p1 - base, naux)
    for occ_coeff, vir_coeff in coeffs:
        la.release_from_device(occ_coeff)
        la.release_from_device(vir_coeff)


def fit(store, factor: MetricFactor, la: Dispatcher, fit_occ: int,
        progress: Progress = _no_progress, matrix: torch.Tensor | None = None) -> None:
    """``B_ia^Q = sum_P (ia|P) [L^{-T}]_PQ`` (or ``(ia|P) J^{-1/2}``) for blocks of ``fit_occ``
    occupied orbitals, read from and written to ``store``.

    ``L^{-T}`` is formed once (or given as ``matrix``, e.g. already on a CUDA device); each
    block is then one ``la.trmm``, in place in the rows read (a trsm per block ran at half the
    GEMM rate). A metric whose condition is above :data:`dfmp2.df.SOLVE_CONDITION` is solved
    with its Cholesky factor instead, in the rows read (:func:`dfmp2.df.fit_in_place`, on the
    host or the device), and ``matrix`` is not used."""
    nocc = store.nocc
    if not solves(factor):
        matrix = fit_matrix(factor, la) if matrix is None else matrix
        la.keep_on_device(matrix)  # read by every block: a device keeps it
    for i0 in range(0, nocc, fit_occ):
        i1 = min(i0 + fit_occ, nocc)
        rows = store.read_ia_slab(i0, i1)  # ((i1-i0)*nvir, naux)
        if factor.lower is not None:
            store.write_b(i0, i1, fit_in_place(factor, la, rows, matrix))
        else:
            store.write_b(i0, i1, la.gemm(rows, matrix))
        progress("fit", i1, nocc)
    if not solves(factor):
        la.release_from_device(matrix)
    store.finish_fit()


@dataclass(frozen=True)
class PairEnergies:
    """Opposite-spin and same-spin correlation energies (Hartree) and the pairs evaluated.

    stages : where each pipeline stage computed (:class:`StagePrecision` per :data:`STAGES`),
    filled by :func:`dfmp2_pair_energies`; :meth:`stages_dict` gives it as plain data.
    pairs : with ``pair_table``, the pair energies of each spin block (:class:`PairMatrix`);
    else None.
    """

    e_os: float
    e_ss: float
    npairs: int
    stages: tuple[StagePrecision, ...] = ()
    pairs: tuple["PairMatrix", ...] | None = None
    device_plan: dict | None = None

    def stages_dict(self) -> dict[str, dict]:
        """``{stage: {"placement": ..., "reason": ...}}`` for the result and JSON."""
        return {s.stage: s.as_dict() for s in self.stages}


@dataclass(frozen=True)
class PairMatrix:
    """The pair energies of one spin block, float64 numpy: ``os[i, j]`` and ``ss[i, j]`` over
    every ordered pair (i of the first space, j of the second), so that their sums over all
    entries are the block's E_OS and E_SS (a pair i != j of one space appears as [i, j] and
    [j, i], each with half its energy). ``block``: 'closed', 'alpha-alpha', 'beta-beta' or
    'alpha-beta'; ``spaces``: the indices of the two orbital spaces."""

    block: str
    spaces: tuple[int, int]
    os: np.ndarray
    ss: np.ndarray


@dataclass(frozen=True)
class SpinTask:
    """The pair sums of one spin block: ``kind`` (:data:`dfmp2.energy.CLOSED`, ``SAME`` or
    ``OPPOSITE``) over the orbitals of store ``i`` (and of store ``j``; the same store for a
    triangular block), with their occupied and virtual orbital energies."""

    kind: SpinBlock
    store_i: object
    store_j: object
    eps_occ_i: torch.Tensor
    eps_occ_j: torch.Tensor
    eps_vir_i: torch.Tensor
    eps_vir_j: torch.Tensor


def spin_tasks(stores: Sequence, eps: Sequence[tuple[torch.Tensor, torch.Tensor]]):
    """The spin blocks of one store (closed shell: :data:`CLOSED`) or of two (alpha, beta:
    alpha-alpha and beta-beta :data:`SAME`, alpha-beta :data:`OPPOSITE`). ``eps[s]`` is
    ``(eps_occ, eps_vir)`` of store s. A store without orbitals (None) takes part in none."""
    if len(stores) == 1:
        (e_o, e_v), store = eps[0], stores[0]
        return [SpinTask(CLOSED, store, store, e_o, e_o, e_v, e_v)] if store is not None else []
    tasks = [SpinTask(SAME, st, st, e_o, e_o, e_v, e_v)
             for st, (e_o, e_v) in zip(stores, eps) if st is not None]
    if stores[0] is not None and stores[1] is not None:
        (e_oa, e_va), (e_ob, e_vb) = eps
        tasks.append(SpinTask(OPPOSITE, stores[0], stores[1], e_oa, e_ob, e_va, e_vb))
    return tasks


def pair_energies(stores, eps, la: Dispatcher, occ_block: int, fused: bool = True,
                  progress: Progress = _no_progress, pair_table: bool = False) -> PairEnergies:
    """E_OS and E_SS from the fitted B of every store, over blocks of ``occ_block`` occupied
    orbitals: blocks I <= J within a space (pair weights from :func:`dfmp2.energy.pair_weights`),
    all blocks I x J between the alpha and beta spaces.

    stores : one closed-shell store or (alpha, beta); each has ``nocc`` and
    ``read_b(i0, i1) -> (i1-i0, nvir, naux)`` (a storage object, or :class:`TensorB`). eps :
    ``(eps_occ, eps_vir)`` per store, in the reduction dtype. The GEMMs run in B's dtype.
    fused : one ``mp2_pair_sums`` op per block; else ``gemm`` for ``(ia|jb)`` and a separate
    ``pair_sums_from_ovov`` reduction. Sums add in float64. pair_table : one
    ``mp2_pair_table`` op per block instead (every pair kept, on the host), the energies their
    weighted sums, and :attr:`PairEnergies.pairs` filled.
    """
    if fused and not pair_table:  # a device backend keeps B there (one block per store)
        in_memory = all(getattr(st, "in_memory", True) for st in stores if st is not None)
        stores, occ_block = la.place_pair_operands(stores, occ_block, in_memory)
    tasks = spin_tasks(stores, eps)
    blocks = [list(_task_blocks(t, occ_block)) for t in tasks]
    nblocks = sum(len(b) for b in blocks)
    e_os = e_ss = 0.0
    npairs = done = 0
    matrices = []
    for task, task_blocks in zip(tasks, blocks):
        sums = None  # [direct, exchange] of the task, float64 where the operands are
        if pair_table:
            shape = (task.store_i.nocc, task.store_j.nocc)
            matrix = PairMatrix(_block_name(task, stores), _space_pair(task, stores),
                                np.zeros(shape), np.zeros(shape))
            matrices.append(matrix)
        cached = (None, None)
        for (i0, i1), (j0, j1) in task_blocks:
            if cached[0] != (i0, i1):
                cached = ((i0, i1), task.store_i.read_b(i0, i1))
            ovL_i = cached[1]
            same = task.kind.triangular and (i0, i1) == (j0, j1)
            ovL_j = ovL_i if same else task.store_j.read_b(j0, j1)
            weights = pair_weights(i0, i1, j0, j1, task.kind.triangular)
            args = (ovL_i, ovL_j, task.eps_occ_i[i0:i1], task.eps_occ_j[j0:j1], task.eps_vir_i,
                    task.eps_vir_j, torch.from_numpy(weights), task.kind.exchange)
            if pair_table:
                part = torch.tensor(_table_block(la, args, matrix, task.kind, (i0, i1),
                                                 (j0, j1)), dtype=torch.float64)
            else:
                part = la.mp2_pair_sums(*args) if fused else _unfused(la, *args)
            sums = part if sums is None else sums + part.to(sums.device)
            npairs += int(np.count_nonzero(weights))
            done += 1
            progress("pair energy", done, nblocks)
        if sums is not None:  # the energies are linear in the sums: one read per task
            direct, exchange = (float(x) for x in sums.cpu())
            os_part, ss_part = task.kind.energies(direct, exchange)
            e_os += os_part
            e_ss += ss_part
    return PairEnergies(e_os, e_ss, npairs, pairs=tuple(matrices) if pair_table else None)


def _device_pair_energies(mol, auxmol, spaces, plan: BlockPlan, la: Dispatcher, device,
                          fused: bool, precision: str, progress: Progress, timer: StageTimer,
                          scratch_dir: str | None, pair_table: bool):
    """:func:`dfmp2_pair_energies` on ``device.device`` (a CUDA device; the CPU in tests).

    The metric is factored on the host in fp64 (LAPACK decides positive definiteness, as on
    every path) and its fit matrix copied to the device. When every space's (ia|P) and B fit in
    the device's budget (:func:`dfmp2.device.plan_device`), the transform runs there
    (:func:`transform_on_device`: int3c2e blocks from libcint on the host, copied in while the
    device transforms the previous block), then the fit and the pair energies, B never leaving
    the device. Otherwise, or when the run forces B out of core (``plan.forced``), the transform
    and fit run on the host (the host plan: in memory or out of core) and the pair blocks of B
    are copied to the device (:class:`StreamedB`).
    Operands on a CUDA device always run torch's ops (the dispatcher's records say pytorch)."""
    from .device import plan_device
    from .storage import DeviceStore

    dev = device.device
    if dev.type == "cuda":  # the stages' times include their queued kernels (same dict)
        timer = StageTimer(timer.seconds, lambda: torch.cuda.synchronize(dev))
    b_dtype, reduce_dtype = PRECISION_DTYPES[precision]
    used = [k for k, sp in enumerate(spaces) if sp.nocc and sp.nvir]
    naux = auxmol.nao_nr()
    dplan = plan_device(mol.nao_nr(), [(spaces[k].nocc, spaces[k].nvir) for k in used], naux,
                        device.memory_bytes if device.memory_bytes is not None
                        else plan.resident_bytes + plan.b_bytes, torch.finfo(b_dtype).bits // 8,
                        int(np.diff(auxmol.ao_loc_nr()).max()), device.host_bytes,
                        resident=not plan.forced)
    where = f"{dev.type} " + {"fp64": "fp64", "mixed": "fp32 products, fp64 sums",
                              "fp32": "fp32"}[precision]
    stages = (StagePrecision("metric", "host fp64", "LAPACK's positive-definiteness decision"),
              *(StagePrecision(stage, f"{dev.type} fp64" if dplan.resident else "host fp64",
                               "B on the device" if dplan.resident else
                               "--force-outcore: B in the host's HDF5 file, pair blocks "
                               "streamed" if plan.forced else
                               "B does not fit on the device: host, pair blocks streamed")
                for stage in ("transform", "fit")),
              StagePrecision("pair_energy", where, f"--device on {device.name}"))
    eps = [tuple(torch.from_numpy(np.ascontiguousarray(e)).to(reduce_dtype).to(dev)
                 for e in (sp.eps_occ, sp.eps_vir)) for sp in spaces]
    if not dplan.resident:
        host_plan = replace(plan, occ_block=min(plan.occ_block, dplan.occ_block))
        energies, factor = dfmp2_pair_energies(mol, auxmol, spaces, host_plan, la, fused,
                                               precision, progress, timer, scratch_dir,
                                               pair_table, device=None, _streamed=(dev, eps))
        return replace(energies, stages=stages, device_plan=dplan.as_dict()), factor
    j2c = timer.run("metric", lambda: torch.from_numpy(metric(auxmol)))
    factor = timer.run("metric", factor_metric, j2c, la)  # the streamed path factors its own
    del j2c
    stores = timer.run("transform", lambda: [
        DeviceStore(spaces[k].nocc, spaces[k].nvir, naux, factor.naux_fit, b_dtype, dev)
        for k in used])
    try:
        timer.run("transform", transform_on_device, mol, auxmol, [spaces[k] for k in used], la,
                  dplan.aux_block, stores, dev, progress)
        matrix = None if solves(factor) else fit_matrix(factor, la).to(dev)
        for k, store in zip(used, stores):
            spin = "" if len(spaces) == 1 else (" alpha", " beta")[k]
            timer.run("fit", fit, store, factor, la, dplan.fit_occ,
                      lambda stage, done, total: progress(stage + spin, done, total), matrix)
        by_space = dict(zip(used, stores))
        energies = timer.run("pair_energy", pair_energies,
                             [by_space.get(k) for k in range(len(spaces))], eps, la,
                             dplan.occ_block, fused, progress, pair_table)
    finally:
        for store in stores:
            store.close()
    return replace(energies, stages=stages, device_plan=dplan.as_dict()), factor


def transform_on_device(mol, auxmol, spaces: Sequence[OrbitalSpace], la: Dispatcher,
                        aux_block: int, stores, device, progress: Progress = _no_progress
                        ) -> None:
    """The AO->MO transform of :func:`transform` with the products on ``device``: per block of
    ``aux_block`` auxiliary functions, libcint's packed integrals are unpacked on the host into
    one of two host buffers (pinned for CUDA) and copied to the device; there
    ``X = (mu nu|P) C_occ`` is one GEMM over the block ((P nu, mu) x (mu, i); the square
    matrices are symmetric) and ``(ia|P) = X^T C_vir`` another, written into the
    :class:`~dfmp2.storage.DeviceStore`. On CUDA the copies run on their own stream, so block
    k+1's copy overlaps block k's products, and the host computes the next block's integrals
    meanwhile; a host buffer is reused only once its copy and the products reading that copy
    have finished (two events per buffer), so at most two blocks are on the device, as
    :func:`dfmp2.device.plan_device` counts."""
    nao = mol.nao_nr()
    cuda = device.type == "cuda"
    coeffs = [(torch.from_numpy(sp.occ_coeff).to(device), torch.from_numpy(sp.vir_coeff).to(device))
              for sp in spaces]
    naux = auxmol.nao_nr()
    # iter_int3c2e yields whole shells: a block may exceed aux_block by up to one shell
    rows = aux_block + int(np.diff(auxmol.ao_loc_nr()).max())
    host = [torch.empty((rows, nao, nao), dtype=torch.float64, pin_memory=cuda)
            for _ in range(2)]
    copied = [None, None]  # CUDA events: the copy out of each host buffer has finished
    consumed = [None, None]  # ... and the products that read the block copied from it
    copies = torch.cuda.Stream(device) if cuda else None  # copies overlap the products
    for k, (p0, p1, packed) in enumerate(iter_int3c2e(mol, auxmol, aux_block)):
        nblk, slot = p1 - p0, k % 2
        for event in (copied[slot], consumed[slot]):  # at most two blocks on the device
            if event is not None:
                event.synchronize()
        square_host = host[slot][:nblk]
        unpack_pairs(packed, out=square_host.numpy())
        if cuda:
            with torch.cuda.stream(copies):
                square = square_host.to(device, non_blocking=True)
                copied[slot] = torch.cuda.Event()
                copied[slot].record(copies)
            compute = torch.cuda.current_stream(device)
            compute.wait_event(copied[slot])
            square.record_stream(compute)  # allocated on the copy stream, used on this one
        else:
            square = square_host.to(device)
        for (occ_coeff, vir_coeff), sp, store in zip(coeffs, spaces, stores):
            x = la.gemm(square.reshape(nblk * nao, nao), occ_coeff)  # (P nu, i)
            x_t = x.view(nblk, nao, sp.nocc).transpose(1, 2).reshape(nblk * sp.nocc, nao)
            full = la.gemm(x_t, vir_coeff)  # (P i, a)
            store.write_pia(p0, p1, full.view(nblk, sp.nocc, sp.nvir))
        if cuda:
            consumed[slot] = torch.cuda.Event()
            consumed[slot].record(torch.cuda.current_stream(device))
        progress("transform", p1, naux)


def _block_name(task: SpinTask, stores) -> str:
    if task.kind is CLOSED:
        return "closed"
    if task.kind is OPPOSITE:
        return "alpha-beta"
    return "alpha-alpha" if task.store_i is stores[0] else "beta-beta"


def _space_pair(task: SpinTask, stores) -> tuple[int, int]:
    index = {id(st): k for k, st in enumerate(stores) if st is not None}
    return index[id(task.store_i)], index[id(task.store_j)]


def _table_block(la: Dispatcher, args, matrix: PairMatrix, kind: SpinBlock, rows, cols):
    """One block's ``[direct, exchange]`` from its per-pair table (``mp2_pair_table``), its pair
    energies written into ``matrix`` (a triangular block's mirror too)."""
    ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, exchange = args
    table = la.mp2_pair_table(ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, exchange)
    table = table.cpu().numpy()
    w = weights.numpy()
    direct, ex = float(np.sum(w * table[..., 0])), float(np.sum(w * table[..., 1]))
    os_ij, ss_ij = kind.energies(table[..., 0], table[..., 1])
    (i0, i1), (j0, j1) = rows, cols
    for target, values in ((matrix.os, os_ij), (matrix.ss, ss_ij)):
        values = values + 0.0  # a spin block's missing part reads 0, not -0.0
        target[i0:i1, j0:j1] = values
        if kind.triangular and (i0, i1) != (j0, j1):
            target[j0:j1, i0:i1] = np.transpose(values)
    return direct, ex


def _task_blocks(task: SpinTask, occ_block: int):
    """((i0, i1), (j0, j1)) of a task's occupied blocks: I <= J when triangular, else all."""
    starts_i = range(0, task.store_i.nocc, occ_block)
    starts_j = range(0, task.store_j.nocc, occ_block)
    for i0 in starts_i:
        for j0 in starts_j:
            if task.kind.triangular and j0 < i0:
                continue
            yield ((i0, min(i0 + occ_block, task.store_i.nocc)),
                   (j0, min(j0 + occ_block, task.store_j.nocc)))


@dataclass(frozen=True)
class TensorB:
    """A B tensor (nocc, nvir, naux) in memory, read in occupied blocks."""

    ovL: torch.Tensor

    @property
    def nocc(self) -> int:
        return self.ovL.shape[0]

    def read_b(self, i0: int, i1: int) -> torch.Tensor:
        return self.ovL[i0:i1]


def _unfused(la: Dispatcher, ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, exchange):
    ni, nva, naux = ovL_i.shape
    nj, nvb = ovL_j.shape[:2]
    ovov = la.gemm(ovL_i.reshape(ni * nva, naux), ovL_j.reshape(nj * nvb, naux), False, True)
    return la.pair_sums_from_ovov(ovov.view(ni, nva, nj, nvb), eps_i, eps_j, eps_va, eps_vb,
                                  weights, exchange)


@dataclass
class StageTimer:
    """Wall time per pipeline stage in seconds. ``sync``, when given, is called before a stage's
    end is read (``torch.cuda.synchronize`` on a CUDA run: its kernels run asynchronously, so
    the time of work queued in one stage would otherwise land in a later one)."""

    seconds: dict[str, float] = field(default_factory=dict)
    sync: Callable[[], None] | None = None

    def run(self, stage: str, fn, *args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        if self.sync is not None:
            self.sync()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start
        return result


#: dtypes of (stored B and pair GEMMs, pair-energy reduction) per precision.
PRECISION_DTYPES = {
    "fp64": (torch.float64, torch.float64),
    "mixed": (torch.float32, torch.float64),
    "fp32": (torch.float32, torch.float32),
}


def dfmp2_pair_energies(mol, auxmol, spaces: Sequence[OrbitalSpace], plan: BlockPlan,
                        la: Dispatcher, fused: bool = True, precision: str = "fp64",
                        progress: Progress = _no_progress, timer: StageTimer | None = None,
                        scratch_dir: str | None = None, pair_table: bool = False,
                        device=None, _streamed=None) -> tuple[PairEnergies, MetricFactor]:
    """The whole post-SCF DF-MP2 step for a list of orbital spaces: one (closed shell) or
    alpha and beta (open shell, spin blocks as in :mod:`dfmp2.energy`).

    precision : 'fp64'; 'mixed' (B and the pair GEMMs in fp32, reduction and sums in fp64); or
    'fp32' (reduction of each block in fp32 too, block sums in fp64). The metric, transform and
    fit always run in fp64 (on the pytorch backend). pair_table : keep every pair's energy
    (:attr:`PairEnergies.pairs`; see :func:`pair_energies`). device : a
    :class:`dfmp2.device.ComputeDevice` with a torch device: the step runs there
    (:func:`_device_pair_energies`); None or a host one: the host pipeline below.

    On the nki backend each stage runs where :func:`plan_stages` puts it for the metric's
    condition number (the op records say which calls ran on the host, and why); raises
    :class:`PrecisionError` under ``--require-nki`` when a stage would have to leave the device.
    Returns ``(energies, factor)``: ``energies.stages`` holds the placement of each stage,
    ``factor.condition`` / ``factor.method`` / ``factor.reason`` the metric's.
    """
    timer = timer or StageTimer()
    if device is not None and device.device is not None:
        try:
            return _device_pair_energies(mol, auxmol, spaces, plan, la, device, fused,
                                         precision, progress, timer, scratch_dir, pair_table)
        except torch.cuda.OutOfMemoryError as exc:  # memory the plan did not count
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "out of memory"
        # raised outside the handler: the error's frames (and their device tensors) are gone
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        raise ResourceError(
            f"{device.name} ran out of memory in the MP2 step ({reason}); give it less with "
            "--device-memory MB, or run on the host with --device cpu")
    b_dtype, reduce_dtype = PRECISION_DTYPES[precision]
    j2c = timer.run("metric", lambda: torch.from_numpy(metric(auxmol)))
    factor = timer.run("metric", factor_metric, j2c, la)
    del j2c  # the planner counts the metric only until it is factored
    stages = plan_stages(la.backend, factor.condition, precision, la.policy.require_nki,
                         pair_table, la.policy.nki_matmul)
    for stage in stages:
        log.info("stage %s: %s (%s)", stage.stage, stage.placement, stage.reason)
    placed = {stage.stage: _stage_ops(la, stage) for stage in stages}
    # spaces without occupied or virtual orbitals (an open shell's empty spin) take no part
    used = [k for k, sp in enumerate(spaces) if sp.nocc and sp.nvir]
    naux = auxmol.nao_nr()
    # An out-of-core store registers itself here before its file exists, so an interruption
    # (a signal turned into an exception) at any point leaves no file behind.
    opened: list = []

    def new_store(space):
        shape = (space.nocc, space.nvir, naux, factor.naux_fit)
        if plan.outcore:
            return H5Store(*shape, dtype=b_dtype, directory=scratch_dir, register=opened.append)
        return IncoreStore(*shape, dtype=b_dtype)

    try:
        # the stores' allocation (the first touch of their pages, in core) counts as transform
        stores = timer.run("transform", lambda: [new_store(spaces[k]) for k in used])
        timer.run("transform", transform, mol, auxmol, [spaces[k] for k in used],
                  placed["transform"], plan.aux_block, plan.unpack_block, stores, progress)
        for k, store in zip(used, stores):
            spin = "" if len(spaces) == 1 else (" alpha", " beta")[k]
            timer.run("fit", fit, store, factor, placed["fit"], plan.fit_occ,
                      lambda stage, done, total: progress(stage + spin, done, total))
        by_space = dict(zip(used, stores))
        eps = [tuple(torch.from_numpy(np.ascontiguousarray(e)).to(reduce_dtype)
                     for e in (sp.eps_occ, sp.eps_vir)) for sp in spaces]
        if _streamed is not None:  # a device's pair stage: B's blocks copied there
            from .storage import StreamedB

            target, eps = _streamed
            by_space = {k: StreamedB(store, target) for k, store in by_space.items()}
        energies = timer.run("pair_energy", pair_energies,
                             [by_space.get(k) for k in range(len(spaces))], eps,
                             placed["pair_energy"], plan.occ_block, fused, progress,
                             pair_table)
    finally:
        for store in opened:
            store.close()
    return replace(energies, stages=stages), factor
