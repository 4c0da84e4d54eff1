"""NKI gemm kernel and host wrapper against float64, plus its instruction structure."""

from __future__ import annotations

import pytest
import torch

from dfmp2.errors import InputError
from dfmp2.linalg import nki_ops, torch_ops

from ._support import FP32_RTOL, ceil_div, rand

#: (m, n, k): one element; ragged M, N > 512 and K > 128; ragged everything; exact tiles.
SHAPES = [(1, 1, 1), (130, 600, 300), (257, 513, 129), (128, 512, 256), (700, 130, 200)]


def _operands(m, n, k, trans_a, trans_b, seed=0):
    a = rand((k, m) if trans_a else (m, k), seed)
    b = rand((n, k) if trans_b else (k, n), seed + 1)
    return a, b


def _assert_close_fp32(got, a_mk, b_kn, want):
    scale = float((a_mk.abs() @ b_kn.abs()).max())
    err = float((got - want).abs().max())
    assert err <= FP32_RTOL * scale, f"max error {err:.3e} > {FP32_RTOL:g} * scale {scale:.3e}"


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True), (True, False)])
def test_gemm_matches_float64(nki_mode, m, n, k, trans_a, trans_b):
    a, b = _operands(m, n, k, trans_a, trans_b)
    got = nki_ops.gemm(a, b, trans_a, trans_b, mode=nki_mode)
    want = torch_ops.gemm(a, b, trans_a, trans_b)
    assert got.dtype == torch.float64 and got.shape == (m, n)
    a_mk, b_kn = (a.T if trans_a else a), (b.T if trans_b else b)
    _assert_close_fp32(got, a_mk, b_kn, want)


def test_gemm_split_launches_match(nki_mode, monkeypatch):
    """Host chunking of M, N and K into several launches gives the same product."""
    monkeypatch.setattr(nki_ops, "MAX_MATMULS_PER_CALL", 2)
    monkeypatch.setattr(nki_ops, "GEMM_MAX_K", 256)
    a, b = _operands(300, 1100, 400, False, False, seed=3)
    _assert_close_fp32(nki_ops.gemm(a, b, mode=nki_mode), a, b, a @ b)


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.nki_emulated
def test_gemm_issues_one_matmul_per_tile_triple(emulator_trace, m, n, k):
    a, b = _operands(m, n, k, False, False)
    with emulator_trace() as tr:
        nki_ops.gemm(a, b, mode="emulator")
    tiles_out = ceil_div(m, 128) * ceil_div(n, 512)
    assert tr.count("nc_matmul") == tiles_out * ceil_div(k, 128)
    matmuls = tr.find("nc_matmul")
    # the first K tile of every output tile overwrites PSUM, the others accumulate
    assert sum(1 for r in matmuls if not r.attrs["accumulate"]) == tiles_out
    assert all(r.operands["dst"].dtype == "float32" for r in matmuls)
    # PSUM -> SBUF copy, then one DMA store per output tile
    assert tr.count("tensor_copy") == tiles_out
    assert len(tr.dma_stores()) == tiles_out
    # blocked over M: per group of 4 M tiles, the A^T strip once and each moving tile of B once
    groups, n_kt = ceil_div(m, 512), ceil_div(k, 128)
    assert len(tr.dma_loads()) == groups * n_kt * (1 + ceil_div(n, 512))


@pytest.mark.nki_emulated
def test_gemm_split_launches_keep_the_matmul_count(emulator_trace, monkeypatch):
    monkeypatch.setattr(nki_ops, "MAX_MATMULS_PER_CALL", 2)
    monkeypatch.setattr(nki_ops, "GEMM_MAX_K", 256)
    a, b = _operands(300, 1100, 400, False, False, seed=3)
    with emulator_trace() as tr:
        nki_ops.gemm(a, b, mode="emulator")
    assert tr.count("nc_matmul") == 3 * 3 * 4
    assert len(tr.kernels) > 1 and set(tr.kernels) == {"gemm_kernel"}


@pytest.mark.nki_emulated
def test_gemm_empty_dimension_gives_zeros():
    a, b = torch.zeros(3, 0, dtype=torch.float64), torch.zeros(0, 4, dtype=torch.float64)
    got = nki_ops.gemm(a, b, mode="emulator")
    assert got.shape == (3, 4) and not got.any()


@pytest.mark.nki_emulated
def test_gemm_rejects_mismatched_inner_dimensions():
    with pytest.raises(InputError, match=r"inner dimensions differ"):
        nki_ops.gemm(torch.zeros(3, 4), torch.zeros(5, 6), mode="emulator")


@pytest.mark.nki_emulated
def test_gemm_supports_any_2d_shape():
    check = nki_ops.SUPPORTS["gemm"]
    assert check(torch.zeros(70000, 3), torch.zeros(3, 9)) is None
    assert "2-D" in check(torch.zeros(2, 3, 4), torch.zeros(4, 5))
