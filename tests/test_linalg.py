"""Every pytorch linalg op against torch.linalg / explicit formulas in float64."""

from __future__ import annotations

import pytest
import torch

from dfmp2.errors import InputError, NotPositiveDefiniteError
from dfmp2.linalg import torch_ops

from tolerances import TOL_FP32_REL, TOL_MATRIX_ABS, TOL_MATRIX_REL


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _spd(n, seed=0):
    a = _rand(n, n, seed=seed)
    return a @ a.T + n * torch.eye(n, dtype=torch.float64)


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm(trans_a, trans_b):
    a, b = _rand(7, 5, seed=1), _rand(5, 9, seed=2)
    got = torch_ops.gemm(a.T.contiguous() if trans_a else a, b.T.contiguous() if trans_b else b,
                         trans_a, trans_b)
    assert torch.allclose(got, torch.einsum("mk,kn->mn", a, b), atol=TOL_MATRIX_REL)


def test_cholesky_and_failure():
    a = _spd(12, seed=3)
    l_nn = torch_ops.cholesky(a)
    assert torch.allclose(l_nn, torch.linalg.cholesky(a), atol=TOL_MATRIX_REL)
    assert torch.allclose(l_nn @ l_nn.T, a, atol=TOL_MATRIX_ABS)
    singular = torch.ones(4, 4, dtype=torch.float64)
    with pytest.raises(NotPositiveDefiniteError, match="pivot"):
        torch_ops.cholesky(singular)


def test_eigh():
    a = _spd(8, seed=4)
    w, v = torch_ops.eigh(a)
    assert torch.allclose(v @ torch.diag(w) @ v.T, a, atol=TOL_MATRIX_ABS)
    assert torch.allclose(w, torch.linalg.eigvalsh(a), atol=TOL_MATRIX_REL)


def test_trsm_is_right_solve_with_transposed_lower():
    l_nn = torch.linalg.cholesky(_spd(10, seed=5))
    b = _rand(6, 10, seed=6)
    x = torch_ops.trsm(l_nn, b)
    assert torch.allclose(x @ l_nn.T, b, atol=TOL_MATRIX_ABS)
    assert torch.allclose(x, b @ torch.linalg.inv(l_nn).T, atol=TOL_MATRIX_ABS)


@pytest.mark.parametrize("diagonal_block", [True, False])
def test_fused_equals_unfused(diagonal_block):
    ni, nj, nv, naux = 3, 3 if diagonal_block else 4, 5, 7
    ovL_i, ovL_j = _rand(ni, nv, naux, seed=7), _rand(nj, nv, naux, seed=8)
    if diagonal_block:
        ovL_j = ovL_i
    eps_i, eps_j = -1 - _rand(ni, seed=9).abs(), -1 - _rand(nj, seed=10).abs()
    eps_v = 1 + _rand(nv, seed=11).abs()
    fused = torch_ops.mp2_pair_energy(ovL_i, ovL_j, eps_i, eps_j, eps_v, diagonal_block)
    ovov = torch.einsum("iaP,jbP->iajb", ovL_i, ovL_j)
    unfused = torch_ops.pair_energy_from_ovov(ovov, eps_i, eps_j, eps_v, diagonal_block)
    assert fused.dtype == torch.float64 and fused.shape == (2,)
    assert torch.allclose(fused, unfused, atol=TOL_MATRIX_REL)
    # explicit pair loop with weights
    e = torch.zeros(2, dtype=torch.float64)
    for i in range(ni):
        for j in range(nj):
            if diagonal_block and j < i:
                continue
            w = 1.0 if diagonal_block and i == j else 2.0
            t = ovov[i, :, j, :]
            d = eps_i[i] + eps_j[j] - eps_v[:, None] - eps_v[None, :]
            e += w * torch.stack([(t * t / d).sum(), (t * (t - t.T) / d).sum()])
    assert torch.allclose(fused, e, atol=TOL_MATRIX_REL)


def test_mixed_precision_operands_reduce_in_float64():
    ovL = _rand(2, 4, 6, seed=12)
    eps_o, eps_v = torch.tensor([-1.0, -0.5], dtype=torch.float64), 1 + _rand(4, seed=13).abs()
    e64 = torch_ops.mp2_pair_energy(ovL, ovL, eps_o, eps_o, eps_v, True)
    e32 = torch_ops.mp2_pair_energy(ovL.float(), ovL.float(), eps_o, eps_o, eps_v, True)
    assert e32.dtype == torch.float64
    assert torch.allclose(e32, e64, rtol=TOL_FP32_REL)


def test_cpu_blas_choices_give_the_same_products():
    from dfmp2.linalg.cpu_blas import CpuBlas

    a, b = _rand(40, 30, seed=20), _rand(50, 30, seed=21)
    ref = a @ b.T
    for choice in ("torch", "numpy"):
        blas = CpuBlas(choice)
        assert torch.allclose(blas.matmul(a, b.T), ref, atol=TOL_MATRIX_REL)
        assert torch.allclose(torch_ops.gemm(a, b, False, True, matmul=blas.matmul), ref,
                              atol=TOL_MATRIX_REL)
        out = torch.empty(40, 50, dtype=torch.float64)
        assert blas.matmul(a, b.T, out=out) is out and torch.allclose(out, ref, atol=TOL_MATRIX_REL)
        assert blas.as_dict()["choice"] == choice
    with pytest.raises(InputError, match="torch, numpy"):
        CpuBlas("auto")


def test_numpy_blas_pipeline_equals_torch_blas():
    from dfmp2.linalg import Dispatcher, DispatchPolicy

    ovL = _rand(4, 6, 9, seed=25)
    eps_o, eps_v = -1 - _rand(4, seed=26).abs(), 1 + _rand(6, seed=27).abs()
    energies = [Dispatcher(DispatchPolicy("pytorch", cpu_blas=c)).mp2_pair_energy(
        ovL, ovL, eps_o, eps_o, eps_v, True) for c in ("torch", "numpy")]
    assert torch.allclose(energies[0], energies[1], atol=TOL_MATRIX_REL)


def _pair_oracle(ovL_i, ovL_j, eps_i, eps_j, eps_v, diagonal_block):
    """[e_os, e_ss] of a pair block by explicit loops over pairs (float64)."""
    ovov = torch.einsum("iaP,jbP->iajb", ovL_i.double(), ovL_j.double())
    eps_i, eps_j, eps_v = eps_i.double(), eps_j.double(), eps_v.double()
    e = torch.zeros(2, dtype=torch.float64)
    for i in range(ovov.shape[0]):
        for j in range(i if diagonal_block else 0, ovov.shape[2]):
            w = 1.0 if diagonal_block and i == j else 2.0
            t = ovov[i, :, j, :]
            d = eps_i[i] + eps_j[j] - eps_v[:, None] - eps_v[None, :]
            e += w * torch.stack([(t * t / d).sum(), (t * (t - t.T) / d).sum()])
    return e


@pytest.mark.parametrize("diagonal_block", [True, False])
@pytest.mark.parametrize("chunk_pairs", [1, 2, 100])
@pytest.mark.parametrize("precision", ["fp64", "mixed", "fp32"])
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy-reduction"])
def test_numpy_pair_energy_matches_oracle(diagonal_block, chunk_pairs, precision, compiled,
                                          monkeypatch):
    """The numpy-BLAS pair step: every chunking of the rows of j, every precision, both
    reductions (the compiled one must be built: see tests/test_pair_reduce.py)."""
    from dfmp2.linalg import numpy_ops

    ni, nj, nv, naux = 5, 5 if diagonal_block else 3, 6, 11
    ovL_i = _rand(ni, nv, naux, seed=30)
    ovL_j = ovL_i if diagonal_block else _rand(nj, nv, naux, seed=31)
    eps_i, eps_j = -1 - _rand(ni, seed=32).abs(), -1 - _rand(nj, seed=33).abs()
    eps_v = 1 + _rand(nv, seed=34).abs()
    b_dtype = torch.float64 if precision == "fp64" else torch.float32
    r_dtype = torch.float32 if precision == "fp32" else torch.float64
    monkeypatch.setattr(numpy_ops, "CHUNK_BYTES", chunk_pairs * nv * nv * r_dtype.itemsize)
    got = numpy_ops.mp2_pair_energy(ovL_i.to(b_dtype), ovL_j.to(b_dtype), eps_i.to(r_dtype),
                                    eps_j.to(r_dtype), eps_v.to(r_dtype), diagonal_block,
                                    compiled=compiled)
    ref = _pair_oracle(ovL_i, ovL_j, eps_i, eps_j, eps_v, diagonal_block)
    assert got.dtype == torch.float64 and got.shape == (2,)
    tol = {"fp64": TOL_MATRIX_REL, "mixed": 1e-5, "fp32": 1e-4}[precision]
    assert torch.allclose(got, ref, rtol=tol, atol=tol)
    torch_got = torch_ops.mp2_pair_energy(ovL_i.to(b_dtype), ovL_j.to(b_dtype), eps_i.to(r_dtype),
                                          eps_j.to(r_dtype), eps_v.to(r_dtype), diagonal_block)
    assert torch.allclose(got, torch_got, rtol=tol, atol=tol)


def test_dispatcher_routes_the_pair_step_to_numpy_only_when_chosen(monkeypatch):
    from dfmp2.linalg import Dispatcher, DispatchPolicy, cpu_blas, numpy_ops

    calls = []
    real = numpy_ops.mp2_pair_energy
    monkeypatch.setitem(cpu_blas._NUMPY_OPS, "mp2_pair_energy",
                        lambda *a: calls.append(1) or real(*a))
    ovL = _rand(3, 4, 5, seed=40)
    eps_o, eps_v = -1 - _rand(3, seed=41).abs(), 1 + _rand(4, seed=42).abs()
    for choice in ("torch", "numpy"):
        Dispatcher(DispatchPolicy("pytorch", cpu_blas=choice)).mp2_pair_energy(
            ovL, ovL, eps_o, eps_o, eps_v, True)
    assert calls == [1]


@pytest.mark.parametrize("column_block", [1, 3, 256])
@pytest.mark.parametrize("cpu_blas", ["torch", "numpy"])
def test_fit_by_trmm_equals_trsm(column_block, cpu_blas, monkeypatch):
    """The fit multiplies by L^{-T} in place (numpy: one BLAS trmm; torch: column blocks of
    GEMMs); it must equal the solve."""
    from dfmp2 import pipeline
    from dfmp2.linalg import Dispatcher, DispatchPolicy

    monkeypatch.setattr(torch_ops, "TRMM_COLUMN_BLOCK", column_block)
    la = Dispatcher(DispatchPolicy("pytorch", cpu_blas=cpu_blas))
    l_nn = torch.linalg.cholesky(_spd(10, seed=50))
    rows = _rand(7, 10, seed=51)
    upper = pipeline.fit_matrix(pipeline.MetricFactor(l_nn, None), la)
    assert torch.allclose(torch.tril(upper, -1), torch.zeros(10, 10, dtype=torch.float64))
    expected = torch_ops.trsm(l_nn, rows)
    work = rows.clone()
    got = la.trmm(upper, work)
    assert got.data_ptr() == work.data_ptr()  # in place
    assert torch.allclose(work, expected, atol=TOL_MATRIX_REL)
    assert torch.allclose(work @ l_nn.T, rows, atol=TOL_MATRIX_ABS)
    assert la.records["trmm"].backend == "pytorch"


def test_numpy_trmm_handles_strided_rows():
    from dfmp2.linalg import numpy_ops

    upper = torch.triu(_rand(6, 6, seed=52))
    wide = _rand(5, 9, seed=53)
    view = wide[:, :6]  # not C-contiguous
    expected = view @ upper
    numpy_ops.trmm(upper, view)
    assert torch.allclose(wide[:, :6], expected, atol=TOL_MATRIX_REL)


@pytest.mark.parametrize("cpu_blas", ["torch", "numpy"])
def test_gemm_writes_into_out(cpu_blas):
    from dfmp2.linalg import Dispatcher, DispatchPolicy

    la = Dispatcher(DispatchPolicy("pytorch", cpu_blas=cpu_blas))
    a, b = _rand(6, 4, seed=60), _rand(5, 4, seed=61)
    out = torch.full((6, 5), float("nan"), dtype=torch.float64)
    got = la.gemm(a, b, False, True, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.allclose(out, a @ b.T, atol=TOL_MATRIX_REL)
