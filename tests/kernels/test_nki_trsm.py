"""NKI blocked Cholesky and trsm (host diagonal blocks, NKI panel/trailing updates)."""

from __future__ import annotations

import pytest
import torch

from dfmp2.errors import InputError, NotPositiveDefiniteError
from dfmp2.linalg import nki_ops, torch_ops

from ._support import FP32_RTOL, ceil_div, rand, spd

#: One block; two blocks with a ragged second one; three blocks (ragged last).
ORDERS = [1, 130, 300]


def _rel_err(got, want) -> float:
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("n", ORDERS)
def test_cholesky_matches_float64(nki_mode, n):
    a = spd(n, seed=n)
    got = nki_ops.cholesky(a, mode=nki_mode)
    want = torch_ops.cholesky(a)
    assert got.dtype == torch.float64 and got.shape == (n, n)
    assert torch.equal(got, torch.tril(got))
    assert _rel_err(got, want) <= FP32_RTOL


def test_cholesky_raises_on_a_pivot_in_a_later_block(nki_mode):
    """The failing pivot lies in the second block, seen only after the NKI trailing update."""
    a = spd(200, seed=1)
    a[150, :] = 0.0
    a[:, 150] = 0.0
    with pytest.raises(NotPositiveDefiniteError, match=r"pivot 15[01] of 200"):
        nki_ops.cholesky(a, mode=nki_mode)


@pytest.mark.parametrize("n", ORDERS)
@pytest.mark.nki_emulated
def test_cholesky_runs_panel_and_trailing_updates_on_nki(emulator_trace, n):
    with emulator_trace() as tr:
        nki_ops.cholesky(spd(n, seed=n), mode="emulator")
    steps = [n - j1 for j1 in range(128, n, 128)]  # trailing order after each non-last block
    assert tr.kernels == ["cholesky_step_kernel"] * len(steps)
    assert tr.count("nc_matmul") == sum(ceil_div(r, 512) * (1 + ceil_div(r, 128)) for r in steps)


@pytest.mark.parametrize("n", ORDERS)
@pytest.mark.parametrize("m", [1, 700])
def test_trsm_matches_float64(nki_mode, n, m):
    l_nn = torch_ops.cholesky(spd(n, seed=n))
    b_mn = rand((m, n), seed=m)
    got = nki_ops.trsm(l_nn, b_mn, mode=nki_mode)
    want = torch_ops.trsm(l_nn, b_mn)
    assert got.dtype == torch.float64 and got.shape == (m, n)
    assert _rel_err(got, want) <= FP32_RTOL


def test_trsm_split_launches_match(nki_mode, monkeypatch):
    monkeypatch.setattr(nki_ops, "MAX_MATMULS_PER_CALL", 1)
    l_nn = torch_ops.cholesky(spd(300, seed=2))
    b_mn = rand((1100, 300), seed=4)
    got = nki_ops.trsm(l_nn, b_mn, mode=nki_mode)
    assert _rel_err(got, torch_ops.trsm(l_nn, b_mn)) <= FP32_RTOL


@pytest.mark.parametrize("n,m", [(300, 700), (130, 1)])
@pytest.mark.nki_emulated
def test_trsm_runs_off_diagonal_updates_on_nki(emulator_trace, n, m):
    l_nn = torch_ops.cholesky(spd(n, seed=n))
    with emulator_trace() as tr:
        nki_ops.trsm(l_nn, rand((m, n), seed=5), mode="emulator")
    starts = list(range(0, n, 128))
    assert tr.kernels == ["gemm_kernel"] + ["trsm_block_kernel"] * (len(starts) - 1)
    # block 0: inv(L00) @ B0^T; block J: ceil(J0/128) update matmuls + 1 inverse matmul per chunk
    expected = sum(ceil_div(m, 512) * (ceil_div(j0, 128) + 1) for j0 in starts)
    assert tr.count("nc_matmul") == expected


@pytest.mark.nki_emulated
def test_trsm_rejects_bad_shapes():
    with pytest.raises(InputError, match=r"trsm needs l \(n, n\) and b \(m, n\)"):
        nki_ops.trsm(torch.eye(3, dtype=torch.float64), torch.zeros(2, 4), mode="emulator")
    with pytest.raises(InputError, match="singular"):
        nki_ops.trsm(torch.zeros(3, 3, dtype=torch.float64), torch.zeros(2, 3), mode="emulator")


@pytest.mark.nki_emulated
def test_cholesky_rejects_a_non_square_matrix():
    with pytest.raises(InputError, match="square"):
        nki_ops.cholesky(torch.zeros(3, 4, dtype=torch.float64), mode="emulator")


@pytest.mark.nki_emulated
def test_supports_names_the_limits():
    assert nki_ops.SUPPORTS["cholesky"](torch.zeros(300, 300)) is None
    big = nki_ops.CHOLESKY_MAX_N + 1
    assert "exceeds" in nki_ops.SUPPORTS["cholesky"](torch.zeros(1).expand(big, big))
    assert nki_ops.SUPPORTS["trsm"](torch.zeros(300, 300), torch.zeros(9, 300)) is None
    big = nki_ops.TRSM_MAX_N + 1
    assert "SBUF" in nki_ops.SUPPORTS["trsm"](torch.zeros(big, 1), torch.zeros(1, 1))
