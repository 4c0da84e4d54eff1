"""The compiled single-pass pair reduction (dfmp2/linalg/_pair_reduce.c) against explicit sums."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfmp2.linalg import numpy_ops

from tolerances import TOL_MATRIX_REL


def _reduce():
    assert numpy_ops._pair_reduce is not None, (
        "the compiled pair reduction was not built; reinstall with a C compiler present "
        f"(pip install -e .): {numpy_ops.PAIR_REDUCTION}")
    return numpy_ops._pair_reduce


def test_extension_is_built():
    """An install without it runs, but on the slower numpy reduction: CI must build it."""
    _reduce()
    assert numpy_ops.PAIR_REDUCTION.startswith("compiled")


def _explicit_sums(block, pair_e, weight, e_v):
    """Weighted [e_os, e_ss] of every pair of a (nk, nv, ng, nv) block, pair by pair."""
    e_os = e_ss = 0.0
    for k in range(block.shape[0]):
        for g in range(block.shape[2]):
            m = block[k, :, g, :].astype(np.float64)
            d = pair_e[k, g] - e_v[:, None] - e_v[None, :]
            direct, exchange = (m * m / d).sum(), (m * m.T / d).sum()
            e_os += weight[k, g] * direct
            e_ss += weight[k, g] * (direct - exchange)
    return e_os, e_ss


@pytest.mark.parametrize("nv", [1, 5, 32, 33, 70])  # one element, one partial tile, tile edges
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pair_sums_equal_explicit_sums(nv, dtype):
    rng = np.random.default_rng(nv)
    nk, ng = 3, 2
    block = rng.standard_normal((nk, nv, ng, nv)).astype(dtype)
    e_v = 0.2 + rng.random(nv)
    pair_e = -1.0 - rng.random((nk, ng))
    weight = np.array([[2.0, 1.0], [0.0, 2.0], [1.0, 0.0]])
    got = _reduce().pair_sums(block, nk, nv, ng, pair_e, weight, e_v)
    ref = _explicit_sums(block, pair_e, weight, e_v)
    assert np.allclose(got, ref, rtol=TOL_MATRIX_REL, atol=0)


def test_pair_sums_skips_zero_weights_and_empty_blocks():
    rng = np.random.default_rng(1)
    block = rng.standard_normal((2, 4, 1, 4))
    pair_e, e_v = -np.ones((2, 1)), np.ones(4)
    assert _reduce().pair_sums(block, 2, 4, 1, pair_e, np.zeros((2, 1)), e_v) == (0.0, 0.0)
    empty = np.empty((0, 4, 1, 4))
    assert _reduce().pair_sums(empty, 0, 4, 1, np.empty((0, 1)), np.empty((0, 1)), e_v) == (
        0.0, 0.0)


def test_pair_sums_rejects_wrong_arguments():
    pair_sums = _reduce().pair_sums
    block, pair_e, weight, e_v = np.zeros((1, 3, 2, 3)), np.zeros((1, 2)), np.ones((1, 2)), np.ones(3)
    with pytest.raises(ValueError, match="float64 or float32"):
        pair_sums(block.astype(np.int64), 1, 3, 2, pair_e, weight, e_v)
    with pytest.raises(ValueError, match="block has 12 items, expected nk\\*nv\\*ng\\*nv = 18"):
        pair_sums(np.zeros((1, 3, 2, 2)), 1, 3, 2, pair_e, weight, e_v)
    with pytest.raises(ValueError, match="weight must be a C-contiguous array of 2 'd' items"):
        pair_sums(block, 1, 3, 2, pair_e, weight.astype(np.float32), e_v)
    with pytest.raises(ValueError, match="e_v must be"):
        pair_sums(block, 1, 3, 2, pair_e, weight, np.ones(4))
    with pytest.raises(ValueError, match="not C-contiguous"):
        pair_sums(np.zeros((1, 3, 3, 2)).transpose(0, 1, 3, 2), 1, 3, 2, pair_e, weight, e_v)
    with pytest.raises(ValueError, match=">= 0"):
        pair_sums(block, -1, 3, 2, pair_e, weight, e_v)


@pytest.mark.parametrize("diagonal_block", [True, False])
@pytest.mark.parametrize("group_rows", [1, 3, 4])
def test_compiled_and_numpy_reductions_agree(diagonal_block, group_rows, monkeypatch):
    """The pair step with nv across several tiles, through both reductions (float64)."""
    monkeypatch.setattr(numpy_ops, "GROUP_ROWS", group_rows)
    g = torch.Generator().manual_seed(3)
    ni, nv, naux = 7, 45, 20
    ovL_i = torch.randn(ni, nv, naux, generator=g, dtype=torch.float64)
    ovL_j = ovL_i if diagonal_block else torch.randn(5, nv, naux, generator=g,
                                                     dtype=torch.float64)
    eps_i = -1 - torch.rand(ni, generator=g, dtype=torch.float64)
    eps_j = eps_i if diagonal_block else -1 - torch.rand(5, generator=g, dtype=torch.float64)
    eps_v = 0.5 + torch.rand(nv, generator=g, dtype=torch.float64)
    args = (ovL_i, ovL_j, eps_i, eps_j, eps_v, diagonal_block)
    compiled = numpy_ops.mp2_pair_energy(*args, compiled=True)
    ufuncs = numpy_ops.mp2_pair_energy(*args, compiled=False)
    assert torch.allclose(compiled, ufuncs, rtol=TOL_MATRIX_REL, atol=0)


def test_requesting_a_missing_extension_is_an_error(monkeypatch):
    monkeypatch.setattr(numpy_ops, "_pair_reduce", None)
    x = torch.ones(1, 2, 3, dtype=torch.float64)
    e = torch.ones(1, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="not built"):
        numpy_ops.mp2_pair_energy(x, x, -e, -e, torch.ones(2, dtype=torch.float64), True,
                                  compiled=True)
    # and the default falls back to numpy
    got = numpy_ops.mp2_pair_energy(x, x, -e, -e, torch.ones(2, dtype=torch.float64), True)
    assert torch.isfinite(got).all()
