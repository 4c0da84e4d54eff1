"""``numpy_ops.mp2_pair_sums`` (the pair step on numpy's BLAS) against the einsum oracle
``energy.reference_pair_sums``: every block kind, weights, precision, reduction and grouping."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from dfmp2 import energy
from dfmp2.errors import InputError
from dfmp2.linalg import numpy_ops, torch_ops

from tolerances import TOL_FP32_REL, TOL_MATRIX_REL

NAUX, NJ, NVA, NVB = 11, 5, 6, 4
#: kind -> (the same tensor as both operands, exchange, nvb, weights: 'triangular', 'ones' or
#: 'random' (with zeros), eps_vb: the same tensor as eps_va or another)
KINDS = {
    "diagonal": (True, True, NVA, "triangular", "same"),
    "diagonal-direct": (True, False, NVA, "triangular", "same"),
    "square": (False, True, NVA, "ones", "same"),
    "square-weighted": (False, True, NVA, "random", "other"),
    "rectangular": (False, False, NVB, "ones", "other"),
    "rectangular-weighted": (False, False, NVB, "random", "other"),
}
#: precision -> (ovL dtype, eps dtype, relative tolerance against the float64 oracle)
PRECISIONS = {
    "fp64": (torch.float64, torch.float64, TOL_MATRIX_REL),
    "mixed": (torch.float32, torch.float64, TOL_FP32_REL),
    "fp32": (torch.float32, torch.float32, TOL_FP32_REL),
}


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _operands(kind: str, ni: int, seed: int = 0):
    """float64 (ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, exchange) of one kind."""
    same, exchange, nvb, weight_kind, eps_b = KINDS[kind]
    ovL_i = _rand(ni, NVA, NAUX, seed=seed)
    eps_i = -1 - _rand(ni, seed=seed + 1).abs()
    ovL_j, eps_j = (ovL_i, eps_i) if same else (_rand(NJ, nvb, NAUX, seed=seed + 2),
                                                -1 - _rand(NJ, seed=seed + 3).abs())
    nj = ovL_j.shape[0]
    eps_va = 1 + _rand(NVA, seed=seed + 4).abs()
    eps_vb = eps_va if eps_b == "same" else 1 + _rand(nvb, seed=seed + 5).abs()
    if weight_kind == "random":
        weights = torch.rand(ni, nj, generator=torch.Generator().manual_seed(seed + 6),
                             dtype=torch.float64) * 3 - 1
        weights[::2, 1::2] = 0.0
    else:
        weights = torch.from_numpy(energy.pair_weights(0, ni, 0, nj, weight_kind == "triangular"))
    return ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, exchange


def _cast(args, b_dtype, r_dtype):
    """The operands in one precision; the two operands stay one tensor when they were."""
    ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, exchange = args
    b_i = ovL_i.to(b_dtype)
    b_j = b_i if ovL_j is ovL_i else ovL_j.to(b_dtype)
    e_i = eps_i.to(r_dtype)
    e_j = e_i if eps_j is eps_i else eps_j.to(r_dtype)
    e_a = eps_va.to(r_dtype)
    e_b = e_a if eps_vb is eps_va else eps_vb.to(r_dtype)
    return b_i, b_j, e_i, e_j, e_a, e_b, weights, exchange


def _assert_matches(got: torch.Tensor, ref: np.ndarray, rel: float):
    """Each entry within ``rel`` of the largest one (the exchange sum may be far smaller)."""
    assert got.dtype == torch.float64 and got.shape == (2,)
    scale = float(np.abs(ref).max())
    assert np.allclose(got.numpy(), ref, rtol=rel, atol=rel * scale), (got, ref)


@pytest.mark.parametrize("ni", range(1, 10))  # GROUP_ROWS = 4: partial, whole and mixed groups
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "ufuncs"])
def test_pair_sums_match_the_oracle(ni, kind, precision, compiled):
    b_dtype, r_dtype, rel = PRECISIONS[precision]
    args = _operands(kind, ni, seed=ni)
    got = numpy_ops.mp2_pair_sums(*_cast(args, b_dtype, r_dtype), compiled=compiled)
    ref = energy.reference_pair_sums(*args)
    _assert_matches(got, ref, rel)
    if not args[-1]:
        assert got[1] == 0.0


@pytest.mark.parametrize("chunk_pairs", [1, 2, 100])
@pytest.mark.parametrize("kind", ["diagonal", "square-weighted", "rectangular"])
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "ufuncs"])
def test_every_chunking_of_j_matches_the_oracle(chunk_pairs, kind, compiled, monkeypatch):
    """CHUNK_BYTES sets how many j one GEMM covers: one, two, or all of them."""
    ni = 7
    args = _operands(kind, ni, seed=20)
    nvb = args[1].shape[1]
    monkeypatch.setattr(numpy_ops, "CHUNK_BYTES", chunk_pairs * 4 * NVA * nvb * 8)
    got = numpy_ops.mp2_pair_sums(*args, compiled=compiled)
    _assert_matches(got, energy.reference_pair_sums(*args), TOL_MATRIX_REL)


def _recorded_gemms(monkeypatch) -> list[tuple[int, int]]:
    """(rows of j, rows of i) of every GEMM the op runs, in pairs (nk, ng)."""
    calls = []
    real = numpy_ops._Rows.gemm

    def gemm(self, jb_rows, ai_t):
        calls.append((jb_rows.shape[0] // self.nvb, ai_t.shape[1] // self.nva))
        return real(self, jb_rows, ai_t)

    monkeypatch.setattr(numpy_ops._Rows, "gemm", gemm)
    return calls


@pytest.mark.parametrize("ni", [1, 4, 9])
def test_a_diagonal_block_computes_no_pair_below_its_groups(ni, monkeypatch):
    """Same tensor, triangular weights: only the pairs j >= the group's first i are formed."""
    calls = _recorded_gemms(monkeypatch)
    args = _operands("diagonal", ni, seed=30)
    got = numpy_ops.mp2_pair_sums(*args)
    _assert_matches(got, energy.reference_pair_sums(*args), TOL_MATRIX_REL)
    group = numpy_ops.GROUP_ROWS
    expected = sum((ni - g0) * min(group, ni - g0) for g0 in range(0, ni, group))
    assert sum(nk * ng for nk, ng in calls) == expected


def test_the_same_tensor_with_full_weights_is_not_a_diagonal_block(monkeypatch):
    """Weights below the diagonal make every pair count: all ni * nj are formed."""
    calls = _recorded_gemms(monkeypatch)
    args = list(_operands("diagonal", 6, seed=40))
    args[6] = torch.ones(6, 6, dtype=torch.float64)
    got = numpy_ops.mp2_pair_sums(*args)
    _assert_matches(got, energy.reference_pair_sums(*args), TOL_MATRIX_REL)
    assert sum(nk * ng for nk, ng in calls) == 36


def test_chunks_of_zero_weight_are_skipped(monkeypatch):
    calls = _recorded_gemms(monkeypatch)
    args = list(_operands("square", 8, seed=50))
    weights = torch.zeros(8, NJ, dtype=torch.float64)
    weights[5, 2] = 1.0  # only the second group of 4 i has a pair
    args[6] = weights
    got = numpy_ops.mp2_pair_sums(*args)
    _assert_matches(got, energy.reference_pair_sums(*args), TOL_MATRIX_REL)
    assert len(calls) == 1
    args[6] = torch.zeros(8, NJ, dtype=torch.float64)
    assert numpy_ops.mp2_pair_sums(*args).tolist() == [0.0, 0.0]
    assert len(calls) == 1


def test_agrees_with_the_torch_implementation():
    for kind in KINDS:
        args = _operands(kind, 6, seed=60)
        assert torch.allclose(numpy_ops.mp2_pair_sums(*args), torch_ops.mp2_pair_sums(*args),
                              rtol=TOL_MATRIX_REL, atol=0)


@pytest.mark.parametrize("kind", ["diagonal", "square-weighted", "rectangular"])
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "ufuncs"])
def test_any_number_of_threads_gives_the_same_sum_bit_for_bit(kind, precision, compiled,
                                                                monkeypatch):
    """The tasks (one GEMM and its reduction each) run on 1 to 5 threads; their sums are added
    in the tasks' order, so every count gives the same bits, within the oracle's tolerance."""
    b_dtype, r_dtype, rel = PRECISIONS[precision]
    args = _operands(kind, 9, seed=90)
    nvb = args[1].shape[1]
    monkeypatch.setattr(numpy_ops, "CHUNK_BYTES", 4 * NVA * nvb * 8)  # one j per GEMM
    cast = _cast(args, b_dtype, r_dtype)
    sums = [numpy_ops.mp2_pair_sums(*cast, compiled=compiled, workers=n) for n in range(1, 6)]
    assert all(torch.equal(got, sums[0]) for got in sums[1:]), sums
    _assert_matches(sums[0], energy.reference_pair_sums(*args), rel)


@pytest.fixture
def blas_at_two():
    """numpy's BLAS at 2 threads for the test (what a run of this 2-core machine has; the
    suite may run with OMP_NUM_THREADS=1), put back after; skipped where it cannot be set."""
    from dfmp2.threads import limit, numpy_blas_threads

    with limit(2):
        if numpy_blas_threads() != 2:
            pytest.skip("numpy's BLAS thread count cannot be set here (not an OpenBLAS)")
        yield


def test_the_threads_run_the_blas_on_one_thread_each_and_put_it_back(blas_at_two,
                                                                        monkeypatch):
    """Inside the call numpy's BLAS runs on one thread (each worker its own GEMMs, and one
    worker too); its count is restored afterwards, after an error too, which cancels the
    tasks not begun."""
    from dfmp2.threads import _numpy_openblas

    def numpy_blas_threads():  # as the library holds it now (inside the block too)
        return int(_numpy_openblas()[0]())

    seen = []
    real = numpy_ops._Rows.gemm

    def gemm(self, jb_rows, ai_t):
        seen.append(numpy_blas_threads())
        if fail and len(seen) == 3:
            raise RuntimeError("a GEMM failed")
        if fail and len(seen) > 3:
            time.sleep(0.2)  # the tasks after the failure are slow: they must not all run
        return real(self, jb_rows, ai_t)

    monkeypatch.setattr(numpy_ops._Rows, "gemm", gemm)
    monkeypatch.setattr(numpy_ops, "CHUNK_BYTES", 4 * NVA * NVA * 8)  # 15 GEMMs
    args = _operands("square", 9, seed=95)
    fail = False
    for workers in (3, 1):
        seen.clear()
        numpy_ops.mp2_pair_sums(*args, workers=workers)
        assert len(seen) == 15 and set(seen) == {1} and numpy_blas_threads() == 2
    seen.clear()
    fail = True
    with pytest.raises(RuntimeError, match="a GEMM failed"):
        numpy_ops.mp2_pair_sums(*args, workers=3)
    assert numpy_blas_threads() == 2
    assert len(seen) < 10  # of 15: the tasks not yet begun were cancelled


def test_the_bits_do_not_depend_on_the_runs_threads():
    """GEMMs large enough for OpenBLAS to split (whose bits then depend on its threads): the
    call gives the same bits under --threads 1 and 2, with one task (one worker) or several.
    Before every GEMM ran on one BLAS thread, the one-task call differed by 3e-8."""
    from dfmp2.threads import limit

    rng = np.random.default_rng(7)
    for ni in (4, 8):  # one task (a group of 4, every j in one chunk), two tasks
        b_i = torch.from_numpy(rng.standard_normal((ni, 100, 2000)))
        b_j = torch.from_numpy(rng.standard_normal((12, 100, 2000)))
        e_i, e_j = (torch.from_numpy(-1 - rng.random(n)) for n in (ni, 12))
        e_v = torch.from_numpy(1 + rng.random(100))
        weights = torch.ones(ni, 12, dtype=torch.float64)
        sums = []
        for count in (1, 2):
            with limit(count):
                sums.append(numpy_ops.mp2_pair_sums(b_i, b_j, e_i, e_j, e_v, e_v, weights,
                                                    True))
        assert torch.equal(sums[0], sums[1]), (ni, sums)


def test_the_call_runs_as_many_workers_as_worker_count_allows(monkeypatch):
    """mp2_pair_sums applies worker_count: the workers asked for, no more than the budget
    holds buffers for, and a budget too small for two runs the tasks in the calling thread."""
    pools = []

    class Recorded(numpy_ops.ThreadPoolExecutor):
        def __init__(self, max_workers):
            pools.append(max_workers)
            super().__init__(max_workers)

    monkeypatch.setattr(numpy_ops, "ThreadPoolExecutor", Recorded)
    monkeypatch.setattr(numpy_ops, "CHUNK_BYTES", 4 * NVA * NVA * 8)  # 15 tasks
    args = _operands("square", 9, seed=96)
    want = energy.reference_pair_sums(*args)
    # (the planner's budget for a 9 x 9 block of 6 virtuals, 31104 bytes, holds 6 workers'
    # buffers of 4608)
    for workers, pool in ((3, [3]), (40, [6]), (1, [])):
        pools.clear()
        _assert_matches(numpy_ops.mp2_pair_sums(*args, workers=workers), want, TOL_MATRIX_REL)
        assert pools == pool, workers
    monkeypatch.setattr(numpy_ops, "pair_block_bytes", lambda *shape: 1)  # none fits
    pools.clear()
    _assert_matches(numpy_ops.mp2_pair_sums(*args, workers=3), want, TOL_MATRIX_REL)
    assert pools == []


def test_the_threads_are_no_more_than_the_tasks_and_the_planners_budget_hold():
    budget = 22400  # the planner's for 4 x 4 pairs of 10 virtuals: 8*4*4*100 + 3*8*4*100
    assert numpy_ops.worker_count(8, 100, 1000, budget) == 8
    assert numpy_ops.worker_count(8, 3, 1000, budget) == 3  # no more than the tasks
    assert numpy_ops.worker_count(8, 100, 5000, budget) == 4  # 22400 // 5000 buffers fit
    assert numpy_ops.worker_count(8, 100, 10**9, budget) == 1  # one always runs
    assert numpy_ops.worker_count(np.int64(2), 100, 1, budget) == 2
    for bad in (0, -1, 2.0, True, None):
        with pytest.raises(InputError, match="workers must be a whole number >= 1"):
            numpy_ops.worker_count(bad, 10, 1, 100)


def test_the_fp32_reduction_runs_on_numpy_by_default(monkeypatch):
    """A float32 eps_va means a float32 reduction: the compiled pass (float64) is not used."""

    class Refuse:
        @staticmethod
        def pair_sums(*args):
            raise AssertionError("the compiled pass ran for a float32 reduction")

    monkeypatch.setattr(numpy_ops, "_pair_reduce", Refuse)
    args = _operands("diagonal", 5, seed=70)
    got = numpy_ops.mp2_pair_sums(*_cast(args, torch.float32, torch.float32))
    _assert_matches(got, energy.reference_pair_sums(*args), TOL_FP32_REL)
    with pytest.raises(AssertionError, match="compiled pass ran"):
        numpy_ops.mp2_pair_sums(*_cast(args, torch.float32, torch.float64))


@pytest.mark.parametrize("nvb", [0, NVB])
def test_empty_blocks_sum_to_zero(nvb):
    ovL_i = torch.ones(0, NVA, NAUX, dtype=torch.float64)
    eps_i = torch.ones(0, dtype=torch.float64)
    ovL_j = torch.ones(3, nvb, NAUX, dtype=torch.float64)
    eps_j = -torch.ones(3, dtype=torch.float64)
    e_a, e_b = torch.ones(NVA, dtype=torch.float64), torch.ones(nvb, dtype=torch.float64)
    got = numpy_ops.mp2_pair_sums(ovL_i, ovL_j, eps_i, eps_j, e_a, e_b,
                                  torch.ones(0, 3, dtype=torch.float64), False)
    assert got.tolist() == [0.0, 0.0]


def test_wrong_operands_are_input_errors():
    args = list(_operands("rectangular", 3, seed=80))
    with pytest.raises(InputError, match="exchange sum needs nvir_i == nvir_j, got 6 and 4"):
        numpy_ops.mp2_pair_sums(*args[:7], True)
    with pytest.raises(InputError, match=r"eps_vb must have shape \(4,\)"):
        numpy_ops.mp2_pair_sums(*args[:5], args[4], *args[6:])
    with pytest.raises(InputError, match=r"weights must have shape \(3, 5\)"):
        numpy_ops.mp2_pair_sums(*args[:6], args[6].T, False)
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    with pytest.raises(InputError, match="needs CPU tensors"):
        numpy_ops.mp2_pair_sums(*meta)


def test_the_old_closed_shell_name_is_gone():
    assert not hasattr(numpy_ops, "mp2_pair_energy")
    assert "mp2_pair_sums" in numpy_ops.__all__
