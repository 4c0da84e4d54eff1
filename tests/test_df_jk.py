"""DF-J/K on dfmp2's own integrals and ops inside PySCF's SCF drivers (dfmp2.jk): the same J, K
and SCF energies as PySCF's DF-SCF with the same JK-fit basis, on every reference type."""

from __future__ import annotations

import copy
import itertools
import os
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from pyscf import dft, gto, lib, scf

import dfmp2
import dfmp2.jk as jk_module
from dfmp2 import threads
from dfmp2.blocking import jk_lane_budget, jk_work_bytes, usable_bytes
from dfmp2.df import PairColumns
from dfmp2.jk import DFJK, K_SQUARE_BLOCK, LANE_BLOCK, get_jk
from dfmp2.linalg import Dispatcher, DispatchPolicy
from dfmp2.options import Options
from dfmp2.scf import release_integrals, run_scf
from dfmp2.scf_integrals import UNPACK_BLOCK

from conftest import INPUTS
from tolerances import TOL_FP32_FLOOR, TOL_FP32_REL, TOL_MATRIX_ABS, TOL_OUTCORE

WATER = "O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59"
NH2 = "N; H 1 1.008; H 1 1.008 2 105.0"
JKFIT = "cc-pvdz-jkfit"
#: Two water molecules 6 Angstrom apart: 238 of their 1176 AO pairs (cc-pVDZ) are zero for
#: every auxiliary function.
DISTANT_DIMER = ("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59; "
                 "O 6 0 0; H 6 0.76 0.59; H 6 -0.76 0.59")


def _la(**kwargs):
    return Dispatcher(DispatchPolicy("pytorch", **kwargs))


REFERENCES = {
    "rhf": (WATER, 0, scf.RHF),
    "uhf": (NH2, 1, scf.UHF),
    "rohf": (NH2, 1, scf.ROHF),
    "rks": (WATER, 0, lambda m: dft.RKS(m, xc="b3lyp")),
    "uks": (NH2, 1, lambda m: dft.UKS(m, xc="pbe0")),
}


@pytest.mark.parametrize("kind", sorted(REFERENCES))
def test_scf_energy_equals_pyscf_df_scf(kind):
    atom, spin, make = REFERENCES[kind]
    mol = gto.M(atom=atom, basis="cc-pvdz", spin=spin, verbose=0)
    energies, cycles = [], []
    for ours in (False, True):
        mf = make(mol).density_fit(auxbasis=JKFIT)
        mf.conv_tol, mf.conv_tol_grad = 1e-11, 1e-7
        if ours:
            mf.with_df = DFJK(mol, JKFIT, _la())
        mf.kernel()
        assert mf.converged
        energies.append(mf.e_tot)
        cycles.append(mf.cycles)
    assert energies[1] == pytest.approx(energies[0], abs=TOL_OUTCORE)
    assert cycles[1] == cycles[0]


@pytest.mark.parametrize("layout", ["square", "packed+square", "packed"])
@pytest.mark.parametrize("cpu_blas", ["torch", "numpy"])
def test_j_and_k_equal_pyscf_for_tagged_untagged_and_rohf_densities(layout, cpu_blas):
    """Every in-memory layout: the tensor unpacked only (the float64 default), packed with an
    unpacked copy for K, packed alone. The third density's tag names other orbitals than the
    density's own (PySCF builds K from the tag and J from the density): J must not take its
    fitted density from K's factors there."""
    mol = gto.M(atom=NH2, basis="cc-pvdz", spin=1, verbose=0)
    ref = scf.ROHF(mol).density_fit(auxbasis=JKFIT).run()
    ours = DFJK(mol, JKFIT, _la(cpu_blas=cpu_blas),
                layout="auto" if layout == "square" else "packed").build()
    assert ours.square is not None and ours.square.dtype == np.float64
    assert ours.square_only is (layout == "square")
    assert (ours._cderi is None) is (layout == "square")
    if layout == "packed":
        ours.square = None
    dm_rohf = ref.make_rdm1()  # (2, nao, nao) tagged with one set of orbitals (2/1/0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((mol.nao_nr(), mol.nao_nr()))
    untagged = np.stack([x + x.T, 0.1 * (x @ x.T)])  # indefinite and positive semidefinite
    for dm in (dm_rohf, untagged, lib.tag_array(dm_rohf[0] * 2, mo_coeff=ref.mo_coeff,
                                                mo_occ=(ref.mo_occ > 1) * 2.0)):
        vj_ref, vk_ref = ref.with_df.get_jk(dm, hermi=1)
        vj, vk = ours.get_jk(dm, hermi=1)
        assert np.abs(vj - vj_ref).max() < TOL_MATRIX_ABS
        assert np.abs(vk - vk_ref).max() < TOL_MATRIX_ABS
        vj, vk = ours.get_jk(dm, hermi=1, with_k=False)  # J alone: its own product
        assert vk is None and np.abs(vj - vj_ref).max() < TOL_MATRIX_ABS
        vj, vk = ours.get_jk(dm, hermi=1, with_j=False)
        assert vj is None and np.abs(vk - vk_ref).max() < TOL_MATRIX_ABS


def test_the_unpacked_only_tensor_serves_pyscfs_code_and_float32_k():
    """A DFJK holding its tensor unpacked only: ``loop`` gives PySCF's packed rows (those of
    the packed layout), ``get_naoaux`` the fitted count, PySCF's general code (a
    non-symmetric density) reads it through ``loop``; K asked in float32 casts its blocks
    (float64 J and K to float32 rounding; J alone stays float64)."""
    mol = gto.M(atom=NH2, basis="cc-pvdz", spin=1, verbose=0)
    square = DFJK(mol, JKFIT, _la()).build()
    packed = DFJK(mol, JKFIT, _la(), layout="packed").build()
    assert square.square_only and square.tensor is None and packed.tensor is not None
    assert square.get_naoaux() == packed.get_naoaux() == packed._cderi.shape[0]
    rows = np.concatenate(list(square.loop(blksize=7)))
    assert rows.shape == packed._cderi.shape
    assert np.abs(rows - packed._cderi).max() < TOL_MATRIX_ABS
    ref = scf.UHF(mol).density_fit(auxbasis=JKFIT).run()
    x = np.random.default_rng(2).standard_normal((mol.nao_nr(), mol.nao_nr()))
    for a, b in zip(square.get_jk(x, hermi=0), ref.with_df.get_jk(x, hermi=0)):
        assert np.abs(a - b).max() < TOL_MATRIX_ABS
    # an untagged indefinite density: J's fitted density from K's product of its eigenvectors
    # (positive and negative parts): per block one Y, one Y^T Y per part, one J product
    la, sym = _la(), x + x.T
    with threads.limit(1):  # one pass in blocks of K_SQUARE_BLOCK
        vj, vk = get_jk(None, sym, la, square=square.square)
    vj_ref, vk_ref = ref.with_df.get_jk(sym, hermi=1)
    assert np.abs(vj - vj_ref).max() < TOL_MATRIX_ABS
    assert np.abs(vk - vk_ref).max() < TOL_MATRIX_ABS
    nblocks = -(-square.get_naoaux() // K_SQUARE_BLOCK)
    assert la.records["gemm"].calls == nblocks * (1 + 2 + 1)
    dm = ref.make_rdm1()
    vj_ref, vk_ref = ref.with_df.get_jk(dm, hermi=1)
    square.k_precision = "fp32"
    vj, vk = square.get_jk(dm, hermi=1)
    for ours, theirs in ((vj, vj_ref), (vk, vk_ref)):  # both from the float32 blocks
        error = np.abs(ours - theirs).max() / np.abs(theirs).max()
        assert TOL_FP32_FLOOR < error < TOL_FP32_REL and ours.dtype == np.float64
    la32 = _la()  # J's density fused from K's float32 product: per block 1 + 2 + 1 products
    with threads.limit(1):
        get_jk(None, dm, la32, k_precision="fp32", square=square.square)
    assert la32.records["gemm"].calls == nblocks * (1 + 2 + 1)
    vj_only = square.get_jk(dm, hermi=1, with_k=False)[0]  # no K: J stays float64
    assert np.abs(vj_only - vj_ref).max() < TOL_MATRIX_ABS
    with pytest.raises(ValueError, match="float64 square"):
        get_jk(None, dm, _la(), square=square.square.astype(np.float32))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("nao", [1, 2, 5, 24])
@pytest.mark.parametrize("naux", [1, 15, 16, 17, 40])
def test_unpacking_in_place_equals_pyscfs_unpacking(naux, nao, threads):
    """The square tensor written over its own packed rows (last block first, the first blocks
    copied aside where their square rows overlap their packed ones, a block's rows split over
    the unpacking threads) equals PySCF's unpacking of a separate copy, for fewer rows than a
    block, whole blocks and a part block."""
    from dfmp2.scf_integrals import unpack_in_place

    npair = nao * (nao + 1) // 2
    packed = np.random.default_rng(naux * 100 + nao).standard_normal((naux, npair))
    flat = np.full(naux * nao * nao, np.nan)
    flat[: naux * npair] = packed.ravel()
    square = unpack_in_place(flat, naux, nao, threads=threads)
    assert np.shares_memory(square, flat) and square.shape == (naux, nao, nao)
    assert np.array_equal(square, lib.unpack_tril(packed))


def test_the_unpacked_only_tensor_answers_before_its_build_and_for_general_densities(
        monkeypatch):
    """``get_naoaux`` on an unbuilt DFJK builds it (PySCF's DF-SCF asks before any J/K); a
    non-symmetric density's J alone comes from the unpacked tensor (PySCF's general code would
    recompute the integrals without ``_cderi``), equal to PySCF's; J and K together too."""
    from pyscf.df import df_jk

    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    ref = scf.RHF(mol).density_fit(auxbasis=JKFIT)
    ref.with_df.build()
    ours = DFJK(mol, JKFIT, _la())
    assert ours.get_naoaux() == ref.with_df.get_naoaux() and ours.square_only
    monkeypatch.setattr(df_jk, "get_j", lambda *a, **k: pytest.fail("integrals recomputed"))
    dm = np.random.default_rng(3).standard_normal((2, mol.nao_nr(), mol.nao_nr()))
    vj_ref, vk_ref = ref.with_df.get_jk(dm, hermi=0)
    vj, vk = ours.get_jk(dm, hermi=0, with_k=False)
    assert vk is None and np.abs(vj - vj_ref).max() < TOL_MATRIX_ABS
    vj, vk = ours.get_jk(dm, hermi=0)
    assert np.abs(vj - vj_ref).max() < TOL_MATRIX_ABS
    assert np.abs(vk - vk_ref).max() < TOL_MATRIX_ABS
    vj, vk = ours.get_jk(dm, hermi=0, with_j=False)
    assert vj is None and np.abs(vk - vk_ref).max() < TOL_MATRIX_ABS


def test_one_product_serves_every_density_of_a_k_build():
    """K reads each block of the tensor once for all densities: one ``Y = C^T B^Q`` product
    per block whatever the number of densities (a UHF's two spins, ROHF's shared doubly
    occupied orbitals in whatever order they come and however PySCF tags them, a spin with no
    electrons), and K equals
    PySCF's for each; the flops recorded count ROHF's shared columns once."""
    nh2 = gto.M(atom=NH2, basis="cc-pvdz", spin=1, verbose=0)
    hydrogen = gto.M(atom="H", basis="cc-pvdz", spin=1, verbose=0)
    uhf = scf.UHF(nh2).density_fit(auxbasis=JKFIT).run()
    rohf = scf.ROHF(nh2).density_fit(auxbasis=JKFIT).run()
    empty_beta = scf.UHF(hydrogen).density_fit(auxbasis=JKFIT).run()
    order = np.argsort(rohf.mo_occ != 1, kind="stable")  # singly occupied orbitals first
    shuffled = lib.tag_array(rohf.make_rdm1(), mo_coeff=rohf.mo_coeff[:, order],
                             mo_occ=rohf.mo_occ[order])
    assert shuffled.mo_occ[0] == 1 and shuffled.mo_occ[1] == 2
    # how PySCF's ROHF get_veff tags its densities: the one set of orbitals twice
    as_pair = lib.tag_array(rohf.make_rdm1(), mo_coeff=(rohf.mo_coeff, rohf.mo_coeff),
                            mo_occ=np.stack([rohf.mo_occ > 0, rohf.mo_occ == 2]).astype(float))
    for (mf, dm), layout in itertools.product(
            ((uhf, uhf.make_rdm1()), (rohf, rohf.make_rdm1()), (rohf, shuffled),
             (rohf, as_pair), (empty_beta, empty_beta.make_rdm1())), ("auto", "packed")):
        ours = DFJK(mf.mol, JKFIT, _la(), layout=layout).build()
        la, counts = _la(), {}
        with threads.limit(1):  # one pass in blocks of K_SQUARE_BLOCK (lanes: the next test)
            vj, vk = get_jk(ours._cderi, dm, la, square=ours.square, counts=counts)
        vj_ref, vk_ref = mf.with_df.get_jk(dm, hermi=1)
        assert np.abs(vj - vj_ref).max() < TOL_MATRIX_ABS
        assert np.abs(vk - vk_ref).max() < TOL_MATRIX_ABS
        nao, naux = mf.mol.nao_nr(), ours.get_naoaux()
        if dm.mo_occ.ndim == 1:  # ROHF: alpha's columns, beta's among them
            ranks = [int((dm.mo_occ > 0).sum()), int((dm.mo_occ == 2).sum())]
            columns = ranks[0]
        elif mf is rohf:  # the same, tagged as a pair
            ranks = [int((occ > 0).sum()) for occ in dm.mo_occ]
            columns = ranks[0]
        else:
            ranks = [int((occ > 0).sum()) for occ in dm.mo_occ]
            columns = sum(ranks)
        nblocks = -(-naux // K_SQUARE_BLOCK)
        k_calls = nblocks * (1 + sum(r > 0 for r in ranks))  # per block one Y, Y^T Y per density
        if layout == "packed":  # J: two products over the whole tensor
            assert la.records["gemm"].calls == 2 + k_calls
        else:  # J: rho from K's Y, then one product per block
            assert ours.square_only and la.records["gemm"].calls == nblocks + k_calls
        k_flops = (2 * columns + sum(ranks)) * nao * nao * naux
        assert counts["flops"] == k_flops + 2 * 4 * naux * (nao * (nao + 1) // 2)


def _spy_lanes(monkeypatch, what=lambda segments, workers: workers) -> list:
    """Record ``what(segments, workers)`` of every call that runs in lanes (jk._lanes), which
    still runs; returns the list the records go to."""
    seen, real = [], jk_module._lanes

    def spy(segments, pairs, blocks, dms, workers):
        seen.append(what(segments, workers))
        return real(segments, pairs, blocks, dms, workers)

    monkeypatch.setattr(jk_module, "_lanes", spy)
    return seen


def test_lanes_give_the_one_pass_j_and_k_and_the_same_bits_run_after_run(monkeypatch):
    """The unpacked tensor's blocks on lane workers (numpy's BLAS, more than one thread):
    J and K of every kind of density (UHF's two, ROHF's shared orbitals, an untagged one, in
    float64 and float32) equal the one pass's on one thread, to float32 rounding in float32;
    the same bits on a second call; every block's products counted once in the record (the
    worker threads' calls included); torch's BLAS keeps the one pass."""
    nh2 = gto.M(atom=NH2, basis="cc-pvdz", spin=1, verbose=0)
    uhf = scf.UHF(nh2).density_fit(auxbasis=JKFIT).run()
    rohf = scf.ROHF(nh2).density_fit(auxbasis=JKFIT).run()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((nh2.nao_nr(), nh2.nao_nr()))
    lanes = _spy_lanes(monkeypatch)
    monkeypatch.setattr(jk_module, "LANE_MIN_FLOPS", 0)  # lanes for a build this small
    ours = DFJK(nh2, JKFIT, _la()).build()
    naux = ours.get_naoaux()
    assert ours.square_only and naux > 3 * LANE_BLOCK
    for dm in (uhf.make_rdm1(), rohf.make_rdm1(), x @ x.T):
        for precision in ("fp64", "fp32"):
            with threads.limit(1):
                one = get_jk(None, dm, _la(), k_precision=precision, square=ours.square)
            la = _la()
            with threads.limit(3):
                first = get_jk(None, dm, la, k_precision=precision, square=ours.square)
                again = get_jk(None, dm, _la(), k_precision=precision, square=ours.square)
            assert lanes == [3, 3]  # both calls on three lane workers
            lanes.clear()
            for a, b, c in zip(one, first, again):
                assert np.array_equal(b, c)
                scale = np.abs(a).max()
                bound = TOL_MATRIX_ABS if precision == "fp64" else TOL_FP32_REL * scale
                assert np.abs(a - b).max() < bound
            if precision == "fp64" and getattr(dm, "mo_occ", None) is not None:
                # per block: Y, J's product (its density from Y) and Y^T Y per spin
                assert la.records["gemm"].calls == -(-naux // LANE_BLOCK) * 4
    with threads.limit(3):
        get_jk(None, uhf.make_rdm1(), _la(cpu_blas="torch"), square=ours.square)
    assert not lanes
    # a whole SCF on the lanes: PySCF's DF-SCF energy and cycles
    mf = scf.UHF(nh2).density_fit(auxbasis=JKFIT)
    mf.with_df = DFJK(nh2, JKFIT, _la())
    with threads.limit(3):
        mf.run(conv_tol=uhf.conv_tol)
    assert lanes and set(lanes) == {3}
    assert mf.e_tot == pytest.approx(uhf.e_tot, abs=TOL_OUTCORE) and mf.cycles == uhf.cycles
    lanes.clear()
    monkeypatch.setattr(jk_module, "LANE_MIN_FLOPS", 1e30)  # too little work: one pass
    with threads.limit(3):
        get_jk(None, uhf.make_rdm1(), _la(), square=ours.square)
    assert not lanes


def test_a_lane_that_fails_stops_the_others_and_its_error_is_raised(monkeypatch):
    """One lane's error (here on its second block) reaches the caller, and the other lanes
    start no block after it: each ends at most the block it was in."""
    nh2 = gto.M(atom=NH2, basis="cc-pvdz", spin=1, verbose=0)
    dm = scf.UHF(nh2).density_fit(auxbasis=JKFIT).run().make_rdm1()
    ours = DFJK(nh2, JKFIT, _la()).build()
    monkeypatch.setattr(jk_module, "LANE_MIN_FLOPS", 0)
    monkeypatch.setattr(jk_module, "LANE_BLOCK", 2)  # many blocks per lane
    blocks = -(-ours.get_naoaux() // 2)
    lanes = _spy_lanes(monkeypatch)
    real, calls, lock = jk_module._SquareProducts.add, [], threading.Lock()
    failing = {}

    def add(self, block, vj, vk, with_j=True):
        with lock:
            calls.append(threading.get_ident())
            mine = failing.setdefault("thread", threading.get_ident()) == calls[-1]
            fail = mine and calls.count(calls[-1]) == 2
        if fail:
            raise MemoryError("a lane ran out of memory")
        return real(self, block, vj, vk, with_j)

    monkeypatch.setattr(jk_module._SquareProducts, "add", add)
    with threads.limit(3), pytest.raises(MemoryError, match="a lane ran out of memory"):
        get_jk(None, dm, _la(), square=ours.square)
    assert lanes == [3] and blocks > 30
    after = len(calls) - 1 - calls.index(failing["thread"], calls.index(failing["thread"]) + 1)
    assert after <= 2  # the other two lanes: at most the block each was in
    assert len(calls) < blocks


def test_dispatcher_counts_calls_from_many_threads_once_each():
    la = _la(cpu_blas="numpy")
    a = torch.ones((4, 4), dtype=torch.float64)

    def calls(_):
        for _ in range(300):
            la.gemm(a, a)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(calls, range(8)))
    assert la.records["gemm"].calls == 2400
    for copied in (copy.deepcopy(la), pickle.loads(pickle.dumps(la))):  # each its own lock
        assert copied._lock is not la._lock and copied.records["gemm"].calls == 2400
        copied.gemm(a, a)
        assert copied.records["gemm"].calls == 2401 and la.records["gemm"].calls == 2400


def test_lane_workers_stay_within_the_planners_k_work_arrays(monkeypatch):
    """No more lane workers than the work arrays the planner sets aside for a build hold (a
    worker's J and K sums and products, and the block it unpacks rows into), than numpy's BLAS
    threads, or than the call has blocks."""
    monkeypatch.setattr(jk_module, "LANE_MIN_FLOPS", 0)
    nao, rank = 24, 100
    dms = np.zeros((1, nao, nao))
    coeff = np.ones((nao, rank))
    parts = [[(slice(0, rank), 1.0)]]
    blocks = jk_module._SquareProducts(dms, coeff, parts, _la(cpu_blas="numpy"),
                                       None, False, np.float64)
    blocks.k_la = blocks.la
    budget = 3 * blocks.lane_bytes(unpacking=True)
    assert blocks.lane_bytes(unpacking=True) > blocks.lane_bytes() + 8 * LANE_BLOCK * nao**2
    with threads.limit(4):
        assert jk_module._lane_workers(blocks, 10**6, budget) == min(
            4, budget // blocks.lane_bytes())
        assert jk_module._lane_workers(blocks, 10**6, budget, unpacking=True) == 3
        assert jk_module._lane_workers(blocks, 2 * LANE_BLOCK, budget) == 2
        blocks.rank = 10**6  # Y alone past the budget: the one pass
        assert jk_module._lane_workers(blocks, 10**6, budget) == 1
    with threads.limit(1):
        blocks.rank = rank
        assert jk_module._lane_workers(blocks, 10**6, budget) == 1
    # the budget the planner sets aside, per layout: the unpacked rows' product of a block of
    # K_SQUARE_BLOCK, the packed rows' unpacking, and the tensor build's arrays when larger
    # (not next to a square copy, whose check counts the unpacking alone)
    nao, naux = 300, 100  # a build's arrays below the unpacked rows' product
    square_k = 8 * 2 * nao * K_SQUARE_BLOCK * nao
    build = 8 * nao * (nao + 1) // 2 * (128 + naux)
    unpack = jk_work_bytes(nao, UNPACK_BLOCK)
    assert square_k > build > unpack

    def budget(**layout):
        return jk_lane_budget(nao, naux, K_SQUARE_BLOCK, UNPACK_BLOCK, **layout)

    assert budget(unpacked=True, packed=False, copy=False) == square_k
    assert budget(unpacked=True, packed=True, copy=False) == square_k + unpack
    assert budget(unpacked=False, packed=True, copy=False) == build
    assert budget(unpacked=False, packed=True, copy=True) == unpack
    assert jk_lane_budget(nao, 1500, K_SQUARE_BLOCK, UNPACK_BLOCK, unpacked=True, packed=True,
                          copy=False) == 8 * nao * (nao + 1) // 2 * (128 + 256)  # the build's
    # get_jk without a budget from its caller's plan: K's unpacking arrays, the least any
    # plan sets aside; no occupied orbitals: no lanes
    budgets, real = [], jk_module._lane_workers

    def spy(blocks, naux, budget, unpacking=False):
        budgets.append(budget)
        return real(blocks, naux, budget, unpacking)

    monkeypatch.setattr(jk_module, "_lane_workers", spy)
    water = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    square = DFJK(water, JKFIT, _la()).build().square
    c = np.zeros((water.nao_nr(), 5))
    c[:5, :5] = np.eye(5)
    dm = lib.tag_array(c @ c.T, mo_coeff=c, mo_occ=np.ones(5))
    get_jk(None, dm, _la(cpu_blas="numpy"), square=square)
    assert budgets == [jk_work_bytes(water.nao_nr(), UNPACK_BLOCK)]
    empty = lib.tag_array(np.zeros_like(dm), mo_coeff=c, mo_occ=np.zeros(5))
    with threads.limit(3):
        blocks = jk_module._SquareProducts(empty[None], c[:, :0], [[(slice(0, 0), 1.0)]],
                                           _la(cpu_blas="numpy"), None, True, np.float64)
        blocks.k_la = blocks.la
        assert real(blocks, 10**6, 10**12) == 1


def _lane_layouts(mol):
    """The in-memory layouts of a DF-SCF tensor as :func:`get_jk` reads them, each as its
    keyword arguments: unpacked only; PySCF's packed rows alone, with a float64 and with a
    float32 unpacked copy; on the AO pairs that are not zero; and the first rows unpacked with
    the others on their pairs, or packed."""
    unpacked = DFJK(mol, JKFIT, _la()).build().square
    packed = DFJK(mol, JKFIT, _la(), layout="packed").build()._cderi
    kept = np.flatnonzero(np.abs(packed).max(axis=0) > 0)
    pairs = PairColumns(mol.nao_nr(), kept)
    columns = np.ascontiguousarray(np.hstack([packed[:, kept], np.zeros((len(packed), 1))]))
    head = len(unpacked) // 2 + 3  # not a whole number of lane blocks
    return {
        "unpacked": dict(cderi=None, square=unpacked),
        "packed": dict(cderi=packed),
        "packed, copy64": dict(cderi=packed, square=unpacked),
        "packed, copy32": dict(cderi=packed, square=unpacked.astype(np.float32)),
        "pairs": dict(cderi=columns, pairs=pairs),
        "head, pairs": dict(cderi=columns[head:].copy(), pairs=pairs,
                            head=np.ascontiguousarray(unpacked[:head])),
        "head, packed": dict(cderi=packed[head:].copy(),
                             head=np.ascontiguousarray(unpacked[:head])),
    }


def test_lanes_read_every_in_memory_layout_as_the_one_pass(monkeypatch):
    """The lanes on every in-memory layout (rows on their AO pairs or packed unpacked by the
    lane's own thread, rows held unpacked read, float32 blocks cast): J and K of a UHF density,
    an ROHF one (beta's columns among alpha's) and an untagged one equal the one pass's, in
    float64 to TOL_MATRIX_ABS, in float32 K to float32 rounding; J of rows not held unpacked
    stays float64 in float32 cycles, as in the one pass; the same bits on a second call, and
    K alone the same K. Two water molecules 6 Angstrom apart, so that 238 of their AO pairs
    are zero."""
    monkeypatch.setattr(jk_module, "LANE_MIN_FLOPS", 0)
    lanes = _spy_lanes(monkeypatch)
    mol = gto.M(atom=DISTANT_DIMER, basis="cc-pvdz", spin=2, verbose=0)
    uhf = scf.UHF(mol).density_fit(auxbasis=JKFIT).run()
    rohf = scf.ROHF(mol).density_fit(auxbasis=JKFIT).run()  # alpha's columns serve beta
    x = np.random.default_rng(2).standard_normal((mol.nao_nr(), mol.nao_nr()))
    densities = (uhf.make_rdm1(), rohf.make_rdm1(), x @ x.T)
    for name, layout in _lane_layouts(mol).items():
        for dm, precision in itertools.product(densities, ("fp64", "fp32")):
            kwargs = dict(dm=dm, k_precision=precision, lane_budget=10**9, **layout)
            with threads.limit(1):
                one = get_jk(la=_la(cpu_blas="numpy"), **kwargs)
            with threads.limit(3):
                first = get_jk(la=_la(cpu_blas="numpy"), **kwargs)
                again = get_jk(la=_la(cpu_blas="numpy"), **kwargs)
                k_alone = get_jk(la=_la(cpu_blas="numpy"), with_j=False, **kwargs)
            assert lanes == [3, 3, 3], (name, lanes)
            lanes.clear()
            assert k_alone[0] is None and np.array_equal(k_alone[1], first[1])
            # J of rows not held unpacked: float64 (the head's rows cast like K's)
            float64_j = precision == "fp64" or name in ("packed", "packed, copy64",
                                                        "packed, copy32", "pairs")
            for result, a, b, c in zip("JK", one, first, again):
                assert np.array_equal(b, c), (name, result)
                exact = precision == "fp64" or (result == "J" and float64_j)
                bound = TOL_MATRIX_ABS * max(1.0, np.abs(a).max()) if exact else \
                    TOL_FP32_REL * np.abs(a).max()
                assert np.abs(a - b).max() < bound, (name, precision, result)


@pytest.mark.parametrize("square", [True, False], ids=["square32", "packed"])
def test_fp32_k_is_fp64_k_to_fp32_precision(square):
    """K with float32 products (the early iterations of a mixed-precision SCF) next to the
    packed tensor, from the float32 square copy or cast block by block from the packed rows:
    float64 K to float32 rounding, never exactly (the products really ran in float32); J
    stays float64 (its products read the packed rows)."""
    mol = gto.M(atom=NH2, basis="cc-pvdz", spin=1, verbose=0)
    ref = scf.UHF(mol).density_fit(auxbasis=JKFIT).run()
    ours = DFJK(mol, JKFIT, _la(), k_precision="fp32", layout="packed").build()
    assert ours.square.dtype == np.float32
    if not square:
        ours.square = None
    dm = ref.make_rdm1()
    vj_ref, vk_ref = ref.with_df.get_jk(dm, hermi=1)
    vj, vk = ours.get_jk(dm, hermi=1)
    assert np.abs(vj - vj_ref).max() < TOL_MATRIX_ABS
    error = np.abs(vk - vk_ref).max() / np.abs(vk_ref).max()
    assert 0 < error < TOL_FP32_REL and vk.dtype == np.float64
    ours.use_fp64()
    assert ours.square is not None and ours.square.dtype == np.float64
    assert np.abs(ours.get_jk(dm, hermi=1)[1] - vk_ref).max() < TOL_MATRIX_ABS
    assert ours.k_calls == {"fp32": 1, "fp64": 1}


@pytest.mark.parametrize("kind", ["rhf", "uhf", "rohf"])
def test_mixed_precision_scf_equals_fp64_scf(kind):
    """--scf-precision mixed (float32 K until the gradient is below FP64_SWITCH_GRAD): the
    energy of the float64 SCF to 1e-10 Eh, the first K builds in float32, the last ones in
    float64, recorded."""
    atom, spin, _ = REFERENCES[kind]
    mol = gto.M(atom=str(INPUTS / "water4.xyz") if kind == "rhf" else atom, basis="cc-pvdz",
                spin=spin, verbose=0)
    runs = {p: run_scf(mol, Options(scf_precision=p, reference=kind), la=_la())
            for p in ("fp64", "mixed")}
    assert runs["mixed"].e_tot == pytest.approx(runs["fp64"].e_tot, abs=TOL_OUTCORE)
    calls = runs["mixed"].with_df.k_calls
    assert calls["fp32"] >= 3 and calls["fp64"] >= 2
    assert runs["fp64"].with_df.k_calls["fp32"] == 0
    assert f"K in float32 for the first {calls['fp32']} of" in runs["mixed"].jk
    assert "float32" not in runs["fp64"].jk


def test_a_float32_cycle_never_converges():
    """The convergence hook of a mixed-precision SCF: a float32 cycle is never converged, however
    small its gradient and energy change; it switches K to float64 below the gradient threshold
    or after a stall; float64 cycles and PySCF's extra cycle get PySCF's own tests."""
    from dfmp2.scf import FP32_STALL_CYCLES, FP64_SWITCH_GRAD, _mixed_precision_check

    mol = gto.M(atom=WATER, basis="sto-3g", verbose=0)

    def envs(gradient, change=0.0, scf_conv=False):
        return {"e_tot": -1.0 + change, "last_hf_e": -1.0, "norm_gorb": gradient,
                "conv_tol": 1e-11, "conv_tol_grad": 1e-7, "scf_conv": scf_conv}

    jk = DFJK(mol, JKFIT, _la(), k_precision="fp32")
    check = _mixed_precision_check(jk)
    assert not check(envs(1e-2)) and jk.k_precision == "fp32"
    assert not check(envs(1e-12)) and jk.k_precision == "fp64"  # below everything: not yet
    assert not check(envs(1e-6))  # float64 now: PySCF's test, the gradient is too large
    assert check(envs(1e-8))
    assert check(envs(1e-5, 1e-12, scf_conv=True))  # the extra cycle: either test
    assert not check(envs(1e-5, 1e-9, scf_conv=True))

    stalled = DFJK(mol, JKFIT, _la(), k_precision="fp32")
    check = _mixed_precision_check(stalled)
    for gradient in [1e-2, 5e-3] + [6e-3] * FP32_STALL_CYCLES:
        assert gradient > FP64_SWITCH_GRAD and not check(envs(gradient))
    assert stalled.k_precision == "fp64"


def test_a_one_cycle_molecule_still_ends_in_float64():
    """H2 converges in a couple of cycles: a mixed-precision SCF still converges on float64 K
    (the energy of the float64 SCF to 1e-10 Eh)."""
    mol = gto.M(atom="H 0 0 0; H 0 0 0.74", basis="cc-pvdz", verbose=0)
    runs = {p: run_scf(mol, Options(scf_precision=p), la=_la()) for p in ("fp64", "mixed")}
    assert runs["mixed"].e_tot == pytest.approx(runs["fp64"].e_tot, abs=TOL_OUTCORE)
    assert runs["mixed"].with_df.k_calls["fp64"] >= 2
    assert runs["fp64"].with_df.k_calls["fp32"] == 0  # the default is float64 throughout


def test_dfmp2_run_uses_its_own_jk_and_records_it():
    result = dfmp2.run(str(INPUTS / "water.xyz"))
    assert result.scf.jk.startswith("dfmp2 DF J/K")
    assert "SCF J/K: dfmp2 DF J/K" in result.summary(verbose=True)
    stats = result.scf.jk_stats  # J/K calls, seconds and the flops of their products
    nao, naux, nocc = 24, 116, 5  # water cc-pVDZ, cc-pVDZ-JKFIT
    assert stats["calls"] >= result.scf.cycles + 1 and stats["seconds"] > 0
    # Y = C^T B^Q (2 r n^2 per Q) and the symmetric Y^T Y (r n^2), tagged orbitals; J's
    # 4 naux n(n+1)/2 per build
    k_per_cycle = 3 * nocc * nao**2 * naux
    j_per_build = 4 * naux * nao * (nao + 1) // 2
    assert stats["gflop"] * 1e9 >= (stats["calls"] - 1) * k_per_cycle + stats["calls"] * j_per_build
    # ... and no more: the guess density's K from at most nao eigenvectors
    guess_k = 3 * nao * nao**2 * naux
    assert stats["gflop"] * 1e9 <= ((stats["calls"] - 1) * k_per_cycle + guess_k
                                    + stats["calls"] * j_per_build)
    assert "SCF J/K time:" in result.summary(verbose=True)
    assert result.to_dict()["extras"]["scf"]["jk_stats"] == stats
    assert result.scf.cycles > 3 and result.to_dict()["properties"]["scf_iterations"] > 3


def _scratch_files(directory) -> list[str]:
    return sorted(p.name for p in Path(directory).glob("dfmp2-scf-*"))


def _open_scratch_files() -> list[str]:
    """The DF-SCF tensor files this process holds open (unlinked: '... (deleted)')."""
    fds = Path("/proc/self/fd")
    names = []
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if "dfmp2-scf-" in target:
            names.append(target)
    return names


def test_a_tensor_beyond_max_memory_goes_to_a_file_and_is_removed(tmp_path):
    """(H2O)4: the packed tensor is 17 MB; under a 10 MB budget the planner puts it in a
    temporary file in the scratch directory, read block by block each iteration; the SCF energy
    is the in-memory one to 1e-10 Eh, the record says where the tensor was, and the file is
    gone once the tensor is released."""
    mol = gto.M(atom=str(INPUTS / "water4.xyz"), basis="cc-pvdz", verbose=0)
    small = run_scf(mol, Options(max_memory=10, scratch_dir=str(tmp_path)), la=_la())
    assert isinstance(small.with_df, DFJK) and small.with_df.plan.outcore
    assert "fitted tensor on disk" in small.jk and "--max-memory 10 MB" in small.jk
    assert small.with_df.plan.read_block < small.with_df.file.shape[0]  # several blocks
    held = _open_scratch_files()  # open, already unlinked: nothing to leave behind
    assert len(held) == 1 and held[0].endswith("(deleted)") and _scratch_files(tmp_path) == []
    big = run_scf(mol, Options(), la=_la())
    assert not big.with_df.plan.outcore and "fitted tensor in memory" in big.jk
    assert small.e_tot == pytest.approx(big.e_tot, abs=TOL_OUTCORE)
    assert small.cycles == big.cycles
    release_integrals(small)
    assert _open_scratch_files() == [] and small.with_df.file is None


@pytest.mark.parametrize("atom, screened", [(NH2, False), (DISTANT_DIMER, True)],
                         ids=["NH2", "distant-dimer"])
def test_out_of_core_j_and_k_equal_in_core_over_fit_and_read_blocks(monkeypatch, atom,
                                                                     screened):
    """The out-of-core build (int3c2e and the fit by ranges of AO shell rows, each range's
    nonzero pairs written as columns after the previous range's, read back row by row when
    pairs are zero) and the blockwise J/K (rows read a few auxiliary functions at a time) give
    the in-core J and K, for ROHF's tagged densities and an untagged indefinite one."""
    from dfmp2 import jk as dfmod
    from dfmp2.blocking import JKPlan

    mol = gto.M(atom=atom, basis="cc-pvdz", spin=1, charge=int(screened), verbose=0)
    ref = scf.ROHF(mol).density_fit(auxbasis=JKFIT).run()
    incore = DFJK(mol, JKFIT, _la(), layout="packed").build()
    npair = mol.nao_nr() * (mol.nao_nr() + 1) // 2
    monkeypatch.setattr(dfmod, "plan_jk", lambda *a, **k: JKPlan(True, 40, 7, 0, 0))
    ours = DFJK(mol, JKFIT, _la()).build()
    assert ours.file is not None and ours._cderi is None and ours.square is None
    assert bool(ours.pairs.screened) is screened
    assert (ours.file.stride > ours.file.shape[1]) is screened
    rows = np.empty(ours.file.shape)
    assert np.array_equal(ours.pairs.kept, np.flatnonzero(np.any(incore._cderi != 0, axis=0)))
    assert np.abs(ours.pairs.expand(ours.file.read_rows(0, rows.shape[0], rows))
                  - incore._cderi).max() < TOL_MATRIX_ABS
    assert npair > 40  # the fit really ran in several column ranges
    x = np.random.default_rng(1).standard_normal((mol.nao_nr(), mol.nao_nr()))
    for dm in (ref.make_rdm1(), np.stack([x + x.T, x @ x.T])):
        for a, b in zip(ours.get_jk(dm, hermi=1), incore.get_jk(dm, hermi=1)):
            assert np.abs(a - b).max() < TOL_MATRIX_ABS
        vj_ref, vk_ref = ref.with_df.get_jk(dm, hermi=0)  # PySCF's general code reads loop()
        vj, vk = ours.get_jk(dm, hermi=0)
        assert np.abs(vj - vj_ref).max() < TOL_MATRIX_ABS
        assert np.abs(vk - vk_ref).max() < TOL_MATRIX_ABS
    ours.reset()
    assert _open_scratch_files() == []


def test_an_scf_that_fails_leaves_no_file(tmp_path):
    """Out of core, an SCF that does not converge, or is interrupted in a cycle, removes its
    temporary file before the error reaches the caller."""
    from dfmp2.errors import ConvergenceError

    mol = gto.M(atom=str(INPUTS / "water4.xyz"), basis="cc-pvdz", verbose=0)
    options = Options(max_memory=10, scratch_dir=str(tmp_path), max_cycle=2)
    with pytest.raises(ConvergenceError):
        run_scf(mol, options, la=_la())
    assert _open_scratch_files() == [] and _scratch_files(tmp_path) == []

    def interrupt(stage, done, total):
        assert len(_open_scratch_files()) == 1  # the file is held while the SCF runs
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_scf(mol, Options(max_memory=10, scratch_dir=str(tmp_path)), progress=interrupt,
                la=_la())
    assert _open_scratch_files() == [] and _scratch_files(tmp_path) == []


def test_a_whole_run_with_the_scf_tensor_on_disk_leaves_no_file(tmp_path):
    """dfmp2.run with the SCF's tensor out of core: the energy of the in-memory run to 1e-10
    Eh, and nothing left in the scratch directory."""
    water4 = str(INPUTS / "water4.xyz")
    small = dfmp2.run(water4, max_memory=12, scratch_dir=str(tmp_path))
    assert "fitted tensor on disk" in small.scf.jk
    assert small.e_tot == pytest.approx(dfmp2.run(water4).e_tot, abs=TOL_OUTCORE)
    assert list(Path(tmp_path).iterdir()) == [] and _open_scratch_files() == []


def test_too_little_disk_for_the_scf_tensor_is_refused(tmp_path, monkeypatch):
    from collections import namedtuple

    from dfmp2 import scf_integrals as dfmod
    from dfmp2.errors import ResourceError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(dfmod.shutil, "disk_usage", lambda path: usage(10**6, 10**6, 1000))
    mol = gto.M(atom=str(INPUTS / "water4.xyz"), basis="cc-pvdz", verbose=0)
    with pytest.raises(ResourceError, match=r"need 16.\d MB on disk and .* has 1000 bytes "
                       r"free; free space or choose another --scratch-dir or raise --max-memory$"):
        run_scf(mol, Options(max_memory=10, scratch_dir=str(tmp_path)), la=_la())
    # out of core because asked (with room in memory, or too little anyway): more memory would
    # not bring it into memory
    for max_memory in (4000, 10):
        with pytest.raises(ResourceError, match=r"has 1000 bytes free; free space or choose "
                           r"another --scratch-dir$"):
            run_scf(mol, Options(force_outcore=True, max_memory=max_memory,
                                 scratch_dir=str(tmp_path)), la=_la())
    assert _scratch_files(tmp_path) == []


def test_nki_runs_float64_jk_on_the_host():
    la = Dispatcher(DispatchPolicy("nki", nki_emulator=True))
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    ref = scf.RHF(mol).density_fit(auxbasis=JKFIT).run(conv_tol=1e-11)
    mf = scf.RHF(mol).density_fit(auxbasis=JKFIT)
    mf.with_df = DFJK(mol, JKFIT, la)
    mf.run(conv_tol=1e-11)
    assert mf.e_tot == pytest.approx(ref.e_tot, abs=TOL_OUTCORE)
    gemm = la.records["gemm"]
    assert gemm.host_calls == gemm.calls and "DF-SCF fit, J and float64 K" in gemm.host_reason


def test_nki_runs_float32_k_on_its_gemm_and_ends_in_float64():
    """--backend nki with the mixed-precision SCF: the early K builds on NKI's gemm (the
    emulator here), the fit, J and the float64 cycles on the host; the energy of PySCF's
    DF-SCF to 1e-10 Eh."""
    la = Dispatcher(DispatchPolicy("nki", nki_emulator=True))
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    ref = scf.RHF(mol).density_fit(auxbasis=JKFIT).run(conv_tol=1e-11, conv_tol_grad=1e-7)
    mf = run_scf(mol, Options(scf_auxbasis=JKFIT, scf_precision="mixed"), la=la)
    assert mf.e_tot == pytest.approx(ref.e_tot, abs=TOL_OUTCORE)
    calls = mf.with_df.k_calls
    assert calls["fp32"] >= 2 and calls["fp64"] >= 2
    gemm = la.records["gemm"]
    assert gemm.backend == "mixed" and set(gemm.mode.split("+")) == {"host", "emulator"}
    assert 2 * calls["fp32"] <= gemm.calls - gemm.host_calls  # two products per K build


@pytest.mark.parametrize("with_df", ["pyscf", "dfjk"])
@pytest.mark.parametrize("kind", ["rhf", "uhf"])
def test_orbital_check_fock_from_dfmp2_jk_equals_pyscf(kind, with_df):
    """DFMP2(mf) checks canonical orbitals with a Fock build; for a DF-HF object whose tensor is
    in memory (PySCF's packed one, or a DFJK's held unpacked only) dfmp2 builds it from that
    tensor with its own ops: the object's own Fock to 1e-10."""
    from dfmp2.api import fock_matrix

    atom, spin, make = REFERENCES[kind]
    mol = gto.M(atom=atom, basis="cc-pvdz", spin=spin, verbose=0)
    mf = make(mol).density_fit(auxbasis=JKFIT)
    if with_df == "dfjk":
        mf.with_df = DFJK(mol, JKFIT, _la())
    mf.run()
    assert (with_df == "dfjk") is (getattr(mf.with_df, "square_only", False))
    la = _la()
    assert np.abs(fock_matrix(mf, la) - mf.get_fock()).max() < TOL_MATRIX_ABS
    assert la.records["gemm"].calls > 0


def test_a_solvent_model_keeps_its_own_fock_in_the_orbital_check():
    """ddCOSMO adds a potential to the Fock matrix: the check must use the object's own."""
    mf = scf.RHF(gto.M(atom=WATER, basis="cc-pvdz", verbose=0)).density_fit().ddCOSMO()
    mf.run(conv_tol=1e-10)
    assert dfmp2.DFMP2(mf).run().e_corr < 0


def test_non_symmetric_densities_go_to_pyscfs_general_code():
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    ref = scf.RHF(mol).density_fit(auxbasis=JKFIT)
    ref.with_df.build()
    ours = DFJK(mol, JKFIT, _la()).build()
    dm = np.random.default_rng(1).standard_normal((mol.nao_nr(), mol.nao_nr()))
    vj_ref, vk_ref = ref.with_df.get_jk(dm, hermi=0)
    vj, vk = ours.get_jk(dm, hermi=0)
    assert np.abs(vk - vk_ref).max() < TOL_MATRIX_ABS and np.abs(vj - vj_ref).max() < TOL_MATRIX_ABS


def test_rohf_builds_the_fitted_tensor_once_and_releases_it(monkeypatch):
    from dfmp2 import jk as dfmp2_df

    calls = []
    for name in ("fitted_cderi", "split_cderi"):
        monkeypatch.setattr(dfmp2_df, name, lambda *a, real=getattr(dfmp2_df, name), **k:
                            calls.append(1) or real(*a, **k))
    seen = {}
    real_compute = dfmp2.api.compute

    def compute(mf, *args, **kwargs):
        seen["mf"] = mf
        return real_compute(mf, *args, **kwargs)

    monkeypatch.setattr(dfmp2.api, "compute", compute)
    dfmp2.run(NH2, spin=1, reference="rohf")
    assert calls == [1]
    assert seen["mf"].with_df._cderi is None and seen["mf"].with_df.square is None


def test_the_planner_puts_the_scf_tensor_in_memory_or_on_disk():
    """plan_jk: in memory when the metric's factors, the packed tensor and K's work arrays fit
    in the usable budget; else on disk with fit and read blocks inside it; a budget too small
    even for those is one clear error."""
    from dfmp2.blocking import plan_jk, usable_bytes
    from dfmp2.errors import ResourceError

    nao, naux = 384, 1856  # (H2O)16 cc-pVDZ with cc-pVDZ-JKFIT
    tensor = 8 * naux * nao * (nao + 1) // 2
    incore = plan_jk(nao, naux, 4000, max_shell_pairs=2000)
    assert not incore.outcore and incore.tensor_bytes == tensor
    assert incore.resident_bytes == tensor + 3 * 8 * naux**2
    disk = plan_jk(nao, naux, 500, max_shell_pairs=2000)
    assert disk.outcore and disk.resident_bytes == 3 * 8 * naux**2
    free = usable_bytes(500) - disk.resident_bytes
    assert 2 * 8 * naux * disk.fit_pairs <= free and disk.fit_pairs >= 2000
    assert 8 * disk.read_block * nao * (nao + 1) // 2 <= free and disk.read_block >= 1
    assert plan_jk(nao, naux, 4000, 2000, force_outcore=True).outcore
    with pytest.raises(ResourceError, match=r"too small for the DF-SCF.*give at least \d+ MB"):
        plan_jk(nao, naux, 90, max_shell_pairs=2000)  # the metric's factors alone: 83 MB


def test_the_advised_max_memory_is_enough():
    """The "give at least N MB" of both planners is the least max_memory that plans (the usable
    part of it, not the whole, must hold what is needed)."""
    import re

    from dfmp2.blocking import plan_blocks, plan_jk
    from dfmp2.errors import ResourceError

    for plan in (lambda mb: plan_jk(252, 558, mb, max_shell_pairs=60),
                 lambda mb: plan_blocks(nao=252, spaces=[(21, 93)], naux=420, max_memory_mb=mb)):
        with pytest.raises(ResourceError) as err:
            plan(2)
        least = int(re.search(r"give at least (\d+) MB", str(err.value)).group(1))
        assert err.value.least_mb == least
        plan(least)
        with pytest.raises(ResourceError):
            plan(least - 1)


def test_the_planners_build_constants_follow_the_code():
    from dfmp2 import blocking, scf_integrals
    from dfmp2.linalg import torch_ops

    assert blocking._JK_INT3C_ROWS == scf_integrals.JK_AUX_BLOCK
    assert blocking._TRMM_COLUMNS == torch_ops.TRMM_COLUMN_BLOCK


@pytest.mark.parametrize("atom", [WATER, DISTANT_DIMER], ids=["water", "distant-dimer"])
@pytest.mark.parametrize("outcore", [False, True], ids=["in-memory", "on-disk"])
def test_the_eigh_fit_gives_the_cholesky_j_and_k(outcore, atom, monkeypatch):
    """When LAPACK refuses the metric, B = V^T (P|..) with J^{-1/2} from eigh (fitted by AO pair
    blocks, in memory or on disk, where each block's zero pairs are dropped before the fit's
    product): B differs from the Cholesky fit by a rotation of the auxiliary index, so J and K
    must be the same."""
    from dfmp2 import jk as dfmod
    from dfmp2 import scf_integrals
    from dfmp2.blocking import JKPlan
    from dfmp2.df import MetricFactor

    mol = gto.M(atom=atom, basis="cc-pvdz", verbose=0)
    cholesky = DFJK(mol, JKFIT, _la()).build()

    def by_eigh(j2c, la, lindep=None, what=None):
        w, u = torch.linalg.eigh(j2c)
        return MetricFactor(None, u / torch.sqrt(w), 0, float(w[-1] / w[0]), "eigh", "test")

    monkeypatch.setattr(scf_integrals, "factor_metric", by_eigh)
    if outcore:
        monkeypatch.setattr(dfmod, "plan_jk", lambda *a, **k: JKPlan(True, 50, 9, 0, 0))
    ours = DFJK(mol, JKFIT, _la()).build()
    assert (ours.file is not None) is outcore
    # out of core each fit range drops its zero pairs; in memory the eigh fit keeps them all
    assert bool(ours.pairs.screened) is (outcore and atom is DISTANT_DIMER)
    dm = scf.RHF(mol).density_fit(auxbasis=JKFIT).run().make_rdm1()
    for a, b in zip(ours.get_jk(dm), cholesky.get_jk(dm)):
        assert np.abs(a - b).max() < TOL_MATRIX_ABS
    ours.reset()


def test_a_range_separated_functional_on_disk_keeps_its_tensor():
    """wB97X asks PySCF's DF for long-range integrals through a copy of the DF object, which it
    resets: the copy shares no tensor, so the SCF's own file stays usable, and the energy on
    disk is the in-memory one to 1e-10 Eh."""
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    energies = []
    for outcore in (False, True):
        mf = dft.RKS(mol, xc="wb97x").density_fit(auxbasis=JKFIT)
        mf.with_df = DFJK(mol, JKFIT, _la(), force_outcore=outcore)
        mf.run(conv_tol=1e-11)
        assert mf.converged and (mf.with_df.file is not None) is outcore
        energies.append(mf.e_tot)
        copy = mf.with_df.copy()
        assert copy.file is None and copy._cderi is None and copy.stats is not mf.with_df.stats
        mf.with_df.reset()
    assert energies[1] == pytest.approx(energies[0], abs=TOL_OUTCORE)
    assert _open_scratch_files() == []


def test_bad_uses_of_the_scf_tensor_classes_are_refused(tmp_path):
    """MatrixFile refuses blocks and output arrays that do not fit it (never a silent wrong
    read or write); DFJK refuses an unknown K precision; the MP2 step refuses an SCF object
    whose K was still float32 when it converged."""
    from dfmp2.errors import InputError
    from dfmp2.storage import MatrixFile

    store = MatrixFile(3, 5, str(tmp_path))
    with pytest.raises(ValueError, match="does not fit"):
        store.write_columns(3, np.ones((3, 3)))
    with pytest.raises(ValueError, match="does not fit"):
        store.write_columns(0, np.ones((2, 2)))
    with pytest.raises(ValueError, match="does not fit"):
        store.write_columns(0, np.ones(3))
    with pytest.raises(ValueError, match="narrow: 6 columns"):
        store.narrow(6)
    with pytest.raises(ValueError, match="not C-contiguous"):
        store.read_rows(0, 3, np.empty((3, 5), order="F"))
    with pytest.raises(ValueError, match="do not fit"):
        store.read_rows(0, 3, np.empty((3, 4)))
    store.write_columns(1, np.arange(6.0).reshape(3, 2))
    assert store.read_rows(0, 3, np.empty((3, 5)))[:, 1:3].tolist() == [[0, 1], [2, 3], [4, 5]]
    store.close()
    assert list(Path(tmp_path).iterdir()) == []

    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    with pytest.raises(InputError, match="k_precision 'fp16'; choose one of fp64, fp32"):
        DFJK(mol, JKFIT, _la(), k_precision="fp16")
    with pytest.raises(InputError, match="layout 'square'; choose one of auto, packed"):
        DFJK(mol, JKFIT, _la(), layout="square")
    mf = scf.RHF(mol).density_fit(auxbasis=JKFIT)
    mf.with_df = DFJK(mol, JKFIT, _la(), k_precision="fp32")  # no run_scf: float32 to the end
    # a tolerance above float32 K's noise (a few 1e-6 Eh from cycle to cycle here: 1e-8 was
    # met or not by chance)
    mf.run(conv_tol=1e-5)
    assert mf.converged
    with pytest.raises(InputError, match="was still fp32 when it converged"):
        dfmp2.DFMP2(mf).run()


@pytest.mark.parametrize("max_memory, layout", [
    (58, "split"), (70, "unpacked"), (58, "split, mixed"), (90, "unpacked, mixed"),
    (58, "split, lanes"), (58, "split, lanes, mixed")])
def test_the_record_names_the_layout_k_really_reads(max_memory, layout, monkeypatch):
    """(H2O)4 (1e6 bytes): unpacked 34.2, on its AO pairs (none is zero) 17.3, the metric's
    factors 5.2, the build's work 14.3. Under --max-memory 58 (usable 85%: 51.7e6) the
    unpacked tensor alone does not fit with the factors and the build's work (53.7): its first
    409 of 464 auxiliary functions are held unpacked, the others on their AO pairs
    (blocking.jk_square_rows), and the record says so; at 70 (62.4e6) and 90 the tensor is
    held unpacked only. A mixed-precision SCF follows the same rule, its float32 cycles
    casting blocks of the unpacked rows (J and K in float32 there, recorded) and unpacking the
    others into float32. Each SCF energy is PySCF's DF-SCF's, also with the split tensor's
    builds in lanes on three threads (the packed rows unpacked by each lane), and then in
    PySCF's cycle count."""
    mol = gto.M(atom=str(INPUTS / "water4.xyz"), basis="cc-pvdz", verbose=0)
    mixed = layout.endswith("mixed")
    lanes = _spy_lanes(monkeypatch, lambda segments, workers: (
        workers, [unpacked for _, unpacked, _ in segments]))
    if "lanes" in layout:
        monkeypatch.setattr(jk_module, "LANE_MIN_FLOPS", 0)
    with threads.limit(3 if "lanes" in layout else 1):
        mf = run_scf(mol, Options(max_memory=max_memory,
                                  scf_precision="mixed" if mixed else "fp64"),
                     la=_la(cpu_blas="numpy"))
    assert lanes == ([] if "lanes" not in layout else
                     [(3, [True, False])] * mf.with_df.stats["calls"])
    # what the lanes may fill is free beside the tensor the plan holds (the metric's factors
    # and the build's arrays are released by then)
    held = sum(a.nbytes for a in (mf.with_df.square, mf.with_df.head, mf.with_df.columns)
               if a is not None)
    assert held + mf.with_df.lane_budget() <= usable_bytes(max_memory)
    jk = mf.with_df
    assert not jk.plan.outcore
    assert jk.square_only is layout.startswith("unpacked")
    if jk.square_only:
        assert "fitted tensor in memory, unpacked, float64" in mf.jk
        assert ("; J and K in float32 for the first" in mf.jk) is mixed
    else:
        assert jk.head.shape == (409, 96, 96) and jk.columns.shape == (55, 4657)
        assert ("fitted tensor in memory, its first 409 auxiliary functions unpacked (float64), "
                "the other 55 packed on all 4656 AO pairs (none is zero), naux 464)") in mf.jk
        assert jk.square is None  # no copy beside them
        assert ("; K (and J of the unpacked rows) in float32 for the first" in mf.jk) is mixed
    release_integrals(mf)
    ref = scf.RHF(mol).density_fit(auxbasis=JKFIT)
    ref.conv_tol, ref.conv_tol_grad = mf.conv_tol, mf.conv_tol_grad
    assert mf.e_tot == pytest.approx(ref.kernel(), abs=TOL_OUTCORE)
    if not mixed:
        assert mf.cycles == ref.cycles


def test_the_unpacked_only_layout_fits_where_packed_and_a_copy_do_not():
    """jk_square_rows gives every row (the tensor unpacked only) where the metric's factors,
    the unpacked tensor and the larger of the build's and K's work arrays fit the usable
    budget: no unpacking work then. (H2O)16 cc-pVDZ (JK-fit naux 1856) fits under the default
    4000 MB, C20H42 (nao 490, naux 2366: 4.5 GB unpacked) does not; at the least budget that
    holds (H2O)16 unpacked, neither packed with an unpacked copy does."""
    from dfmp2.blocking import jk_square_fits, jk_square_rows, usable_bytes
    from dfmp2.scf_integrals import UNPACK_BLOCK

    def rows(nao, naux, max_memory):  # every pair kept and the zero column: the most columns
        return jk_square_rows(nao, naux, nao * (nao + 1) // 2 + 1, max_memory, K_SQUARE_BLOCK,
                              UNPACK_BLOCK)

    assert rows(384, 1856, 4000) == 1856
    assert rows(490, 2366, 4000) < 2366
    nao, naux = 384, 1856
    need = (8 * naux * nao * nao + 3 * 8 * naux**2
            + max(8 * nao * (nao + 1) // 2 * (128 + 256), 8 * 2 * nao * K_SQUARE_BLOCK * nao))
    least = next(mb for mb in range(1, 10**5) if usable_bytes(mb) >= need)
    assert rows(nao, naux, least) == naux
    assert rows(nao, naux, least - 1) < naux
    assert not jk_square_fits(nao, naux, 8, least, 16)  # packed + unpacked need more


def test_the_split_layout_holds_as_many_rows_unpacked_as_fit():
    """jk_square_rows: the metric's factors, q rows unpacked and the others on the kept AO
    pairs, and the larger of the build's and K's work arrays within the usable budget, for
    the largest q. C20H42 cc-pVDZ (nao 490, JK-fit naux 2366, 65444 pairs kept and the zero
    column) under the default 4000 MB holds more than half of its rows unpacked; all of them
    where the budget is large, none where even its screened rows do not fit that way."""
    from dfmp2.blocking import jk_square_rows, usable_bytes
    from dfmp2.scf_integrals import UNPACK_BLOCK

    nao, naux, ncol = 490, 2366, 65445

    def need(q):
        work = max(8 * nao * (nao + 1) // 2 * (128 + 256),
                   8 * 2 * nao * K_SQUARE_BLOCK * nao + 3 * 8 * UNPACK_BLOCK * nao * nao)
        return 3 * 8 * naux**2 + work + 8 * (q * nao * nao + (naux - q) * ncol)

    q = jk_square_rows(nao, naux, ncol, 4000, K_SQUARE_BLOCK, UNPACK_BLOCK)
    assert naux // 2 < q < naux
    assert need(q) <= usable_bytes(4000) < need(q + 1)
    assert jk_square_rows(nao, naux, ncol, 10**5, K_SQUARE_BLOCK, UNPACK_BLOCK) == naux
    assert jk_square_rows(nao, naux, ncol, 1000, K_SQUARE_BLOCK, UNPACK_BLOCK) == 0
    # the metric factored is the whole fitting set's where eigenvalues were dropped (the
    # tensor's rows): fewer rows fit beside it
    assert jk_square_rows(nao, naux - 200, ncol, 4000, K_SQUARE_BLOCK, UNPACK_BLOCK,
                          metric_naux=naux) < jk_square_rows(nao, naux - 200, ncol, 4000,
                                                             K_SQUARE_BLOCK, UNPACK_BLOCK)


def test_the_split_layout_counts_the_whole_fitting_sets_metric(monkeypatch):
    """HI in Cartesian def2-SVP: its JK-fit metric drops iodine's dependent functions, so the
    tensor has fewer rows than the metric factored beside it (3 of its squares while the
    tensor is built); the rows that fit unpacked were counted against the smaller metric."""
    import dfmp2.jk as jkmod
    from dfmp2.blocking import jk_square_rows

    asked = []

    def spy(*args, **kwargs):
        asked.append((args[1], kwargs.get("metric_naux")))
        return jk_square_rows(*args, **kwargs)

    monkeypatch.setattr(jkmod, "jk_square_rows", spy)
    mol = gto.M(atom="H 0 0 0; I 0 0 1.609", basis="def2-svp", cart=True, verbose=0)
    jk = DFJK(mol, "def2-universal-jkfit", _la()).build()
    (rows, metric_naux), = asked
    assert rows == jk.get_naoaux() < metric_naux == jk.auxmol.nao_nr()


def test_the_switch_gradient_is_the_one_readme_and_help_state():
    """README, ``dfmp2 run --help`` and Options' docstring give the mixed SCF's switch to
    float64 as a number: the constant's, so that changing one without the others fails."""
    from click.testing import CliRunner

    from dfmp2.cli import main
    from dfmp2.scf import FP64_SWITCH_GRAD

    stated = "below " + f"{FP64_SWITCH_GRAD:.0e}".replace("e-0", "e-")  # 1e-03 as 1e-3
    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    assert stated + " (on `--backend nki`" in readme
    help_text = " ".join(CliRunner().invoke(main, ["run", "--help"]).output.split())
    assert stated + ", then float64" in help_text
    assert stated + ", then float64" in " ".join(Options.__doc__.split())


def test_a_range_separated_hybrid_drops_the_singular_metric_as_pyscf_does():
    """wB97X's long-range JK-fit metric is singular (Cholesky fails): its eigenvalues are
    dropped below PySCF's threshold (1e-7, SCF_LINDEP_THRESHOLD), so the SCF is PySCF's; the
    MP2 step's 1e-10 left it 3.3e-8 Eh away (two waters 30 Angstrom apart)."""
    mol = gto.M(atom=WATER + "; O 30 0 0; H 30 0.76 0.59; H 30 -0.76 0.59", basis="cc-pvdz",
                verbose=0)
    energies = []
    for ours in (False, True):
        mf = dft.RKS(mol, xc="wb97x").density_fit(auxbasis=JKFIT)
        mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-8
        if ours:
            mf.with_df = DFJK(mol, JKFIT, _la())
        energies.append(mf.kernel())
    assert energies[1] == pytest.approx(energies[0], abs=TOL_OUTCORE)


def test_an_ill_conditioned_fitting_basis_is_solved_not_inverted():
    """Water with an even-tempered fitting set (beta 1.3: Cholesky succeeds, condition about
    4e17) for both the SCF and the MP2 step: the fits solve with the Cholesky factor, as
    PySCF's do, and both energies are PySCF's (the explicit L^-T left the SCF 2.5e-6 Eh and
    E(corr) 5.8e-9 Eh away)."""
    from pyscf import df
    from pyscf.mp import dfmp2 as pyscf_dfmp2

    from dfmp2 import api
    from dfmp2.df import SOLVE_CONDITION

    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    etb = df.aug_etb(mol, beta=1.3)
    result = dfmp2.run(mol, scf_auxbasis=etb, auxbasis=etb, conv_tol=1e-12, conv_tol_grad=1e-8)
    assert result.method.metric_condition > SOLVE_CONDITION
    mf = scf.RHF(mol).density_fit(auxbasis=etb).run(conv_tol=1e-12, conv_tol_grad=1e-8)
    assert result.e_scf == pytest.approx(mf.e_tot, abs=TOL_OUTCORE)
    on_disk = dfmp2.run(mol, scf_auxbasis=etb, auxbasis=etb, conv_tol=1e-12, conv_tol_grad=1e-8,
                        force_outcore=True)  # both tensors in files, fitted block by block
    assert "on disk" in on_disk.scf.jk and on_disk.method.blocks["storage"] == "hdf5"
    assert on_disk.e_scf == pytest.approx(mf.e_tot, abs=TOL_OUTCORE)
    assert on_disk.e_corr == pytest.approx(result.e_corr, abs=TOL_OUTCORE)
    ours = api.DFMP2(mf, auxbasis=etb).run()
    pt = pyscf_dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=etb)
    pt.kernel(with_t2=False)
    assert ours.e_corr == pytest.approx(pt.e_corr, abs=TOL_OUTCORE)


def test_force_outcore_puts_the_scf_tensor_on_disk_too():
    forced = dfmp2.run(WATER, force_outcore=True)
    plain = dfmp2.run(WATER)
    assert "on disk" in forced.scf.jk and "on disk" not in plain.scf.jk
    assert forced.e_tot == pytest.approx(plain.e_tot, abs=TOL_OUTCORE)
