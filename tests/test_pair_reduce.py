"""The compiled single-pass pair reduction (dfmp2/linalg/_pair_reduce.c) against explicit sums."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfmp2 import energy
from dfmp2.errors import BackendUnavailableError
from dfmp2.linalg import numpy_ops

from tolerances import TOL_MATRIX_REL

SIZES = [1, 5, 32, 33, 70]  # one element, one partial tile, one whole tile, tile edges
#: (nva, nvb, mode): every rectangle direct only; squares also with exchange, with e_vb equal to
#: e_va (the symmetric triangle loop) and different (the whole-tile loop).
CASES = ([(nva, nvb, "direct") for nva in SIZES for nvb in SIZES]
         + [(nv, nv, mode) for nv in SIZES for mode in ("exchange", "exchange-asym")])


def _reduce():
    assert numpy_ops._pair_reduce is not None, (
        "the compiled pair reduction was not built; reinstall with a C compiler present "
        f"(pip install -e .): {numpy_ops.PAIR_REDUCTION}")
    return numpy_ops._pair_reduce


def test_extension_is_built():
    """An install without it runs, but on the slower numpy reduction: CI must build it."""
    _reduce()
    assert numpy_ops.PAIR_REDUCTION.startswith("compiled")


def _explicit_sums(block, pair_e, weight, e_va, e_vb, exchange):
    """Weighted [direct, exchange] of every pair of a (nk, nvb, ng, nva) block, pair by pair,
    in float64: ``T_ab = block[k, b, g, a]``, ``D_ab = pair_e - e_va[a] - e_vb[b]``."""
    direct = ex = 0.0
    for k in range(block.shape[0]):
        for g in range(block.shape[2]):
            if weight[k, g] == 0.0:
                continue
            t_ab = block[k, :, g, :].astype(np.float64).T
            d_ab = pair_e[k, g] - e_va[:, None] - e_vb[None, :]
            direct += weight[k, g] * (t_ab * t_ab / d_ab).sum()
            if exchange:
                ex += weight[k, g] * (t_ab * t_ab.T / d_ab).sum()
    return np.array([direct, ex])


def _operands(nk, nvb, ng, nva, mode, dtype, seed):
    rng = np.random.default_rng(seed)
    block = rng.standard_normal((nk, nvb, ng, nva)).astype(dtype)
    e_va = 0.2 + rng.random(nva)
    e_vb = e_va.copy() if mode == "exchange" else 0.3 + rng.random(nvb)
    pair_e = -1.0 - rng.random((nk, ng))
    return block, pair_e, e_va, e_vb


@pytest.mark.parametrize("nva,nvb,mode", CASES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pair_sums_equal_explicit_sums(nva, nvb, mode, dtype):
    nk, ng = 3, 2
    block, pair_e, e_va, e_vb = _operands(nk, nvb, ng, nva, mode, dtype, seed=nva * 100 + nvb)
    weight = np.array([[2.0, 1.0], [0.0, 0.5], [1.0, 0.0]])
    exchange = mode != "direct"
    got = np.array(_reduce().pair_sums(block, nk, nvb, ng, nva, pair_e, weight, e_va, e_vb,
                                       exchange))
    ref = _explicit_sums(block, pair_e, weight, e_va, e_vb, exchange)
    assert np.allclose(got, ref, rtol=TOL_MATRIX_REL, atol=TOL_MATRIX_REL * abs(ref[0]))
    if not exchange:
        assert got[1] == 0.0


def test_exchange_is_not_the_direct_sum():
    """The two sums of a random block differ: a loop adding T_ab^2 for T_ab T_ba would fail."""
    block, pair_e, e_va, e_vb = _operands(1, 33, 1, 33, "exchange", np.float64, seed=5)
    direct, ex = _reduce().pair_sums(block, 1, 33, 1, 33, pair_e, np.ones((1, 1)), e_va, e_vb,
                                     True)
    assert abs(direct - ex) > 0.1 * abs(direct)


def test_pair_sums_skip_zero_weights_and_empty_blocks():
    """Pairs of weight 0 are never read: NaN in them does not reach the sums."""
    block, pair_e, e_va, e_vb = _operands(2, 6, 2, 6, "exchange", np.float64, seed=1)
    weight = np.array([[1.0, 0.0], [0.0, 2.0]])
    ref = _explicit_sums(block, pair_e, weight, e_va, e_vb, True)
    block[0, :, 1, :] = np.nan
    block[1, :, 0, :] = np.nan
    got = _reduce().pair_sums(block, 2, 6, 2, 6, pair_e, weight, e_va, e_vb, True)
    assert np.allclose(got, ref, rtol=TOL_MATRIX_REL, atol=0)
    zeros = np.zeros((2, 2))
    assert _reduce().pair_sums(block, 2, 6, 2, 6, pair_e, zeros, e_va, e_vb, True) == (0.0, 0.0)
    for nk, nvb, ng, nva in [(0, 4, 1, 4), (2, 4, 0, 4), (2, 0, 1, 3), (2, 3, 1, 0)]:
        empty = np.empty((nk, nvb, ng, nva))
        e_a, e_b, pe = np.ones(nva), np.ones(nvb), -np.ones((nk, ng))
        assert _reduce().pair_sums(empty, nk, nvb, ng, nva, pe, pe, e_a, e_b, False) == (0.0, 0.0)


def test_pair_sums_reject_wrong_arguments():
    pair_sums = _reduce().pair_sums
    block, pair_e, weight = np.zeros((1, 3, 2, 4)), np.zeros((1, 2)), np.ones((1, 2))
    e_va, e_vb = np.ones(4), np.ones(3)
    good = (block, 1, 3, 2, 4, pair_e, weight, e_va, e_vb, False)
    assert pair_sums(*good) == (0.0, 0.0)

    def call(**changes):
        names = ("block", "nk", "nvb", "ng", "nva", "pair_e", "weight", "e_va", "e_vb",
                 "exchange")
        return pair_sums(*(changes.get(n, v) for n, v in zip(names, good)))

    with pytest.raises(ValueError, match="float64 or float32"):
        call(block=block.astype(np.int64))
    with pytest.raises(ValueError, match=r"block has 18 items, expected nk\*nvb\*ng\*nva = 24"):
        call(block=np.zeros((1, 3, 2, 3)))
    with pytest.raises(ValueError, match="pair_e must be a C-contiguous array of 2 'd' items"):
        call(pair_e=np.zeros(3))
    with pytest.raises(ValueError, match="weight must be a C-contiguous array of 2 'd' items"):
        call(weight=weight.astype(np.float32))
    with pytest.raises(ValueError, match="e_va must be a C-contiguous array of 4 'd' items"):
        call(e_va=np.ones(3))
    with pytest.raises(ValueError, match="e_vb must be a C-contiguous array of 3 'd' items"):
        call(e_vb=np.ones(4))
    with pytest.raises(ValueError, match="not C-contiguous"):
        call(block=np.zeros((1, 3, 4, 2)).transpose(0, 1, 3, 2))
    with pytest.raises(ValueError, match=r"must be >= 0 \(got -1, 3, 2, 4\)"):
        call(nk=-1)
    with pytest.raises(ValueError, match=r"exchange sum needs nva == nvb \(got 4 and 3\)"):
        call(exchange=True)


@pytest.mark.parametrize("case", ["diagonal", "square", "rectangular"])
@pytest.mark.parametrize("group_rows", [1, 3, 4])
def test_compiled_and_numpy_reductions_agree(case, group_rows, monkeypatch):
    """The pair step with nv across several tiles, through both reductions (float64)."""
    monkeypatch.setattr(numpy_ops, "GROUP_ROWS", group_rows)
    g = torch.Generator().manual_seed(3)
    ni, nj, nva = 7, 5, 45
    nvb = 38 if case == "rectangular" else nva
    ovL_i = torch.randn(ni, nva, 20, generator=g, dtype=torch.float64)
    ovL_j = ovL_i if case == "diagonal" else torch.randn(nj, nvb, 20, generator=g,
                                                         dtype=torch.float64)
    eps_i = -1 - torch.rand(ni, generator=g, dtype=torch.float64)
    eps_j = eps_i if case == "diagonal" else -1 - torch.rand(nj, generator=g, dtype=torch.float64)
    eps_va = 0.5 + torch.rand(nva, generator=g, dtype=torch.float64)
    eps_vb = eps_va if case != "rectangular" else 0.5 + torch.rand(nvb, generator=g,
                                                                   dtype=torch.float64)
    weights = torch.from_numpy(energy.pair_weights(0, ni, 0, ovL_j.shape[0],
                                                   triangular=case == "diagonal"))
    args = (ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, case != "rectangular")
    compiled = numpy_ops.mp2_pair_sums(*args, compiled=True)
    ufuncs = numpy_ops.mp2_pair_sums(*args, compiled=False)
    assert torch.allclose(compiled, ufuncs, rtol=TOL_MATRIX_REL, atol=0)
    assert compiled[0] != 0 and (compiled[1] != 0) == (case != "rectangular")


def test_requesting_a_missing_extension_is_an_error(monkeypatch):
    monkeypatch.setattr(numpy_ops, "_pair_reduce", None)
    x = torch.ones(1, 2, 3, dtype=torch.float64)
    e, e_v = -torch.ones(1, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    w = torch.ones(1, 1, dtype=torch.float64)
    with pytest.raises(BackendUnavailableError, match="not built"):
        numpy_ops.mp2_pair_sums(x, x, e, e, e_v, e_v, w, True, compiled=True)
    # and the default falls back to numpy: T_ab = 3, D = -4, four (a, b)
    got = numpy_ops.mp2_pair_sums(x, x, e, e, e_v, e_v, w, True)
    assert torch.allclose(got, torch.tensor([-9.0, -9.0], dtype=torch.float64))
