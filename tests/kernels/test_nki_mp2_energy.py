"""Fused NKI pair sums (``nki_ops.mp2_pair_sums``) against the float64 oracle
``energy.reference_pair_sums``, and the kernels' structure: (ia|jb) stays on chip, the exchange
partner comes from TensorE transposes (not a second GEMM), the direct-only kernel of rectangular
blocks issues no transposes, and chunks of zero weight are not launched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfmp2.energy import pair_weights, reference_pair_sums
from dfmp2.errors import InputError
from dfmp2.linalg import nki_ops

from ._support import ENERGY_RTOL, ceil_div, pair_block

#: kind -> (diagonal_block, exchange): a diagonal block I = J with triangular weights; an
#: off-diagonal square block I < J of one space (weights 2) with exchange; a rectangular
#: αβ-like block of two spaces (weights 1) without exchange.
KINDS = {"diagonal": (True, True), "square": (False, True), "rect": (False, False)}
#: (ni, nj, nva, nvb, naux, kind): nocc = 1; ragged nv and naux with several K tiles; a diagonal
#: block of 5 orbitals; nv > 512 (two moving chunks per row tile); nva != nvb with ragged tiles,
#: nvb > 512 (two moving chunks), nva > 512 (five a tiles) against nvb < 128.
CASES = [
    (1, 1, 130, 130, 200, "diagonal"),
    (5, 5, 150, 150, 250, "diagonal"),
    (3, 2, 200, 200, 300, "square"),
    (2, 1, 600, 600, 140, "square"),
    (3, 2, 200, 130, 300, "rect"),
    (2, 3, 130, 600, 140, "rect"),
    (2, 2, 600, 70, 260, "rect"),
]
KERNEL = {True: "mp2_pair_energy_kernel", False: "mp2_pair_direct_kernel"}


def _block(ni, nj, nva, nvb, naux, kind, seed=0):
    """Operands and weights of one case: ``(args, weights, exchange)``."""
    diagonal_block, exchange = KINDS[kind]
    args = pair_block(ni, nj, nva, nvb, naux, diagonal_block, seed)
    if diagonal_block:
        weights = pair_weights(0, ni, 0, nj, True)
    else:  # I < J of one space (all 2), or two spaces (all 1)
        weights = pair_weights(0, ni, ni, ni + nj, exchange)
    return args, torch.from_numpy(weights), exchange


def _assert_sums_close(got, args, weights, exchange):
    """``got`` within ENERGY_RTOL of the oracle, relative to the direct sum with |weights| (a
    scale that signed weights cannot cancel)."""
    want = reference_pair_sums(*args, weights, exchange)
    scale = abs(reference_pair_sums(*args, weights.abs(), False)[0])
    assert got.dtype == torch.float64 and got.shape == (2,)
    err = float(np.abs(got.numpy() - want).max())
    assert err <= ENERGY_RTOL * scale, f"error {err:.3e} > {ENERGY_RTOL:g} * {scale:.3e}"
    if not exchange:
        assert float(got[1]) == 0.0


@pytest.mark.parametrize("ni,nj,nva,nvb,naux,kind", CASES)
def test_pair_sums_match_float64(nki_mode, ni, nj, nva, nvb, naux, kind):
    args, weights, exchange = _block(ni, nj, nva, nvb, naux, kind)
    got = nki_ops.mp2_pair_sums(*args, weights, exchange, mode=nki_mode)
    _assert_sums_close(got, args, weights, exchange)


@pytest.mark.parametrize("nvb,exchange", [(140, True), (140, False), (90, False)],
                         ids=["square-exchange", "square-direct", "rect-direct"])
def test_pair_sums_with_arbitrary_weights(nki_mode, nvb, exchange):
    """Signed, fractional and zero weights (zero pairs inside a launched chunk add nothing)."""
    args = pair_block(4, 3, 140, nvb, 200, False, 3)
    weights = torch.from_numpy(np.random.default_rng(4).uniform(-1.0, 2.0, (4, 3)))
    weights[1, 2] = weights[3, 0] = 0.0
    got = nki_ops.mp2_pair_sums(*args, weights, exchange, mode=nki_mode)
    _assert_sums_close(got, args, weights, exchange)


@pytest.mark.parametrize("ni,nj,nvb,kind", [(5, 5, 140, "diagonal"), (5, 3, 90, "rect")])
def test_pair_sums_over_several_launches(nki_mode, monkeypatch, ni, nj, nvb, kind):
    """Pairs split over launches (chunks of <= 4 pairs), chunks below the diagonal skipped."""
    monkeypatch.setattr(nki_ops, "MAX_PAIRS_PER_CALL", 4)
    args, weights, exchange = _block(ni, nj, 140, nvb, 130, kind, seed=7)
    got = nki_ops.mp2_pair_sums(*args, weights, exchange, mode=nki_mode)
    _assert_sums_close(got, args, weights, exchange)


@pytest.mark.parametrize("ni,nj,nva,nvb,naux,kind", CASES)
@pytest.mark.nki_emulated
def test_pair_sums_structure(emulator_trace, ni, nj, nva, nvb, naux, kind):
    args, weights, exchange = _block(ni, nj, nva, nvb, naux, kind)
    with emulator_trace() as tr:
        nki_ops.mp2_pair_sums(*args, weights, exchange, mode="emulator")
    pairs = ni * nj
    n_at, n_bc, n_kt = ceil_div(nva, 128), ceil_div(nvb, 512), ceil_div(naux, 128)
    assert tr.kernels == [KERNEL[exchange]]
    # the instruction count the host budgets launches with, exactly
    assert len(tr.records) == nki_ops._energy_instructions(ni, nj, nva, nvb, naux, exchange)
    # one GEMM per pair: (a tiles) x (512-column chunks) x (aux tiles), nothing more
    assert tr.count("nc_matmul") == pairs * n_at * n_bc * n_kt
    transposes = tr.find("nc_transpose")
    if exchange:  # the exchange term T_ba comes from TensorE transposes of T tiles
        assert len(transposes) == pairs * n_at * n_at
        assert all(r.engine == "tensor" and r.operands["dst"].buffer == "psum" for r in transposes)
    else:  # the direct kernel neither transposes nor reduces an exchange term
        assert transposes == []
        assert tr.count("tensor_reduce") == pairs * n_at
    # the only store to HBM is the small block of partial sums: no (ia|jb) tile leaves the chip
    halves = 2 if exchange else 1
    stores = tr.dma_stores()
    assert len(stores) == 1
    assert stores[0].operands["dst"].shape == (128, halves * pairs * n_at)
    assert tr.bytes_moved() - sum(r.nbytes for r in tr.dma_loads()) == (
        128 * halves * pairs * n_at * 4)
    # VectorE reciprocal of the denominators (no ScalarE approximation)
    assert tr.count("reciprocal") == pairs * n_at and tr.count("activation") == 0


@pytest.mark.nki_emulated
def test_pair_sums_launch_count(emulator_trace, monkeypatch):
    monkeypatch.setattr(nki_ops, "MAX_PAIRS_PER_CALL", 4)
    args, weights, exchange = _block(5, 5, 140, 140, 130, "diagonal", seed=7)
    with emulator_trace() as tr:
        nki_ops.mp2_pair_sums(*args, weights, exchange, mode="emulator")
    # chunks {0,1}, {2,3}, {4}: 3 diagonal chunk pairs + 3 above the diagonal, 3 skipped
    assert tr.kernels == ["mp2_pair_energy_kernel"] * 6
    assert tr.count("nc_matmul") == (4 + 4 + 1 + 4 + 2 + 2) * 2 * 1 * 2


@pytest.mark.nki_emulated
def test_zero_weight_chunks_are_not_launched(emulator_trace, monkeypatch):
    """Any chunk whose weights are all 0 is skipped, not only those below a diagonal."""
    monkeypatch.setattr(nki_ops, "MAX_PAIRS_PER_CALL", 4)
    args = pair_block(4, 4, 140, 90, 130, False, 8)
    weights = torch.ones((4, 4), dtype=torch.float64)
    weights[0:2, 2:4] = 0.0  # 2x2 chunks: (0:2, 2:4) and (2:4, 0:2) carry no weight
    weights[2:4, 0:2] = 0.0
    with emulator_trace() as tr:
        got = nki_ops.mp2_pair_sums(*args, weights, False, mode="emulator")
    assert tr.kernels == ["mp2_pair_direct_kernel"] * 2
    assert tr.count("nc_matmul") == 2 * 4 * 2 * 1 * 2
    _assert_sums_close(got, args, weights, False)
    with emulator_trace() as tr:
        got = nki_ops.mp2_pair_sums(*args, torch.zeros((4, 4), dtype=torch.float64), False,
                                    mode="emulator")
    assert tr.kernels == [] and got.tolist() == [0.0, 0.0]


@pytest.mark.nki_emulated
def test_pair_sums_reject_inconsistent_shapes():
    ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb = pair_block(2, 3, 10, 8, 7, False, 0)
    weights = torch.ones((2, 3), dtype=torch.float64)
    with pytest.raises(InputError, match=r"eps_va must have shape \(10,\)"):
        nki_ops.mp2_pair_sums(ovL_i, ovL_j, eps_i, eps_j, eps_va[:9], eps_vb, weights, False,
                              mode="emulator")
    with pytest.raises(InputError, match=r"weights must have shape \(2, 3\)"):
        nki_ops.mp2_pair_sums(ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights.T, False,
                              mode="emulator")
    with pytest.raises(InputError, match="exchange sum needs nvir_i == nvir_j, got 10 and 8"):
        nki_ops.mp2_pair_sums(ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, True,
                              mode="emulator")


@pytest.mark.nki_emulated
def test_pair_sums_supports_names_the_sbuf_limit():
    check = nki_ops.SUPPORTS["mp2_pair_sums"]
    typical = torch.zeros(1).expand(4, 448, 1536)
    assert check(typical, typical, None, None, None, None, None, True) is None
    huge = torch.zeros(1).expand(4, 2000, 8000)
    assert "SBUF" in check(huge, huge, None, None, None, None, None, True)
    assert "mp2_pair_direct_kernel" in check(huge, huge, None, None, None, None, None, False)
    # the large shape: the exchange kernel holds every T row tile, the direct kernel one
    large = torch.zeros(1).expand(4, 672, 2304)
    assert "mp2_pair_energy_kernel" in check(large, large, None, None, None, None, None, True)
    assert check(large, large, None, None, None, None, None, False) is None
    rect = torch.zeros(1).expand(4, 300, 2304)
    assert check(large, rect, None, None, None, None, None, False) is None


@pytest.mark.parametrize("nva,nvb,naux,exchange", [(150, 150, 300, True), (600, 70, 260, False),
                                                   (130, 600, 140, False)])
@pytest.mark.nki_emulated
def test_sbuf_estimate_bounds_the_emulated_peak(emulator_trace, monkeypatch, nva, nvb, naux,
                                                exchange):
    """The host's SBUF estimate is at least what the emulator holds live (its conservative
    liveness model: a tile counts until its last Python reference goes)."""
    from dfmp2.nki_emulator import _context

    peak = [0]
    register = _context.KernelRun.register

    def tracked(run, alloc):
        register(run, alloc)
        peak[0] = max(peak[0], run.usage.sbuf_bytes)

    monkeypatch.setattr(_context.KernelRun, "register", tracked)
    args = pair_block(2, 3, nva, nvb, naux, False, 9)
    with emulator_trace():
        nki_ops.mp2_pair_sums(*args, torch.ones((2, 3), dtype=torch.float64), exchange,
                              mode="emulator")
    assert 0 < peak[0] <= nki_ops._energy_sbuf_words(nva, nvb, naux, 6, exchange) * 4


@pytest.mark.parametrize("nva,nvb,naux,exchange", [
    (448, 448, 1536, True), (448, 448, 1536, False), (672, 672, 2304, True),
    (672, 672, 2304, False), (96, 700, 4000, False), (700, 96, 4000, False)])
@pytest.mark.nki_emulated
def test_pairs_per_call_keep_a_launch_within_the_instruction_budget(nva, nvb, naux, exchange):
    pairs = nki_ops._energy_pairs_per_call(nva, nvb, naux, exchange)
    assert 1 < pairs <= nki_ops.MAX_PAIRS_PER_CALL
    for square in (True, False):
        ci, cj = nki_ops._pair_chunks(64, 64, pairs, square)
        assert nki_ops._energy_instructions(ci, cj, nva, nvb, naux, exchange) <= (
            nki_ops.MAX_ENERGY_INSTRUCTIONS_PER_CALL)


@pytest.mark.nki_emulated
def test_pair_chunks_fill_the_launch_budget():
    assert nki_ops._pair_chunks(64, 1, 64, False) == (64, 1)
    assert nki_ops._pair_chunks(5, 7, 16, False) == (4, 4)
    assert nki_ops._pair_chunks(10, 10, 64, True) == (8, 8)
    assert nki_ops._pair_chunks(1, 1, 64, True) == (1, 1)
