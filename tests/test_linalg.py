"""Every pytorch linalg op against torch.linalg / explicit formulas in float64."""

from __future__ import annotations

import pytest
import torch

from dfmp2.energy import pair_weights, reference_pair_sums
from dfmp2.errors import InputError, NotPositiveDefiniteError
from dfmp2.linalg import torch_ops

from tolerances import TOL_FP32_REDUCTION_REL, TOL_FP32_REL, TOL_MATRIX_ABS, TOL_MATRIX_REL


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


def _pair_problem(kind, seed=7):
    """Operands of mp2_pair_sums: 'diagonal' (one block against itself, triangular weights),
    'square' (two blocks of one space, exchange), 'rectangular' (alpha x beta, no exchange),
    'weighted' (arbitrary weights, exchange)."""
    ni, nj, nva, naux = 4, 3, 5, 7
    nvb = 6 if kind == "rectangular" else nva
    if kind == "diagonal":
        nj = ni
    ovL_i = _rand(ni, nva, naux, seed=seed)
    ovL_j = ovL_i if kind == "diagonal" else _rand(nj, nvb, naux, seed=seed + 1)
    eps_i = -1 - _rand(ni, seed=seed + 2).abs()
    eps_j = eps_i if kind == "diagonal" else -1 - _rand(nj, seed=seed + 3).abs()
    eps_va = 1 + _rand(nva, seed=seed + 4).abs()
    eps_vb = eps_va if kind != "rectangular" else 1 + _rand(nvb, seed=seed + 5).abs()
    if kind == "weighted":
        weights = _rand(ni, nj, seed=seed + 6).abs()
    else:
        weights = torch.from_numpy(pair_weights(0, ni, 0, nj, kind == "diagonal"))
    return (ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, kind != "rectangular")


PAIR_KINDS = ("diagonal", "square", "rectangular", "weighted")


@pytest.mark.parametrize("kind", PAIR_KINDS)
def test_pair_sums_fused_and_unfused_equal_the_oracle(kind):
    args = _pair_problem(kind)
    ovL_i, ovL_j = args[:2]
    fused = torch_ops.mp2_pair_sums(*args)
    ovov = torch.einsum("iaP,jbP->iajb", ovL_i, ovL_j)
    unfused = torch_ops.pair_sums_from_ovov(ovov, *args[2:])
    ref = torch.from_numpy(reference_pair_sums(*args))
    assert fused.dtype == torch.float64 and fused.shape == (2,)
    assert torch.allclose(fused, ref, atol=TOL_MATRIX_REL)
    assert torch.allclose(unfused, ref, atol=TOL_MATRIX_REL)
    if kind == "rectangular":
        assert fused[1] == 0.0


def test_same_tensor_with_two_virtual_energies_is_not_taken_for_a_diagonal_block():
    """The diagonal path sums each pair's transpose, which is right only when eps_va ==
    eps_vb: the op must give the oracle's sums for the same tensor with two virtual spectra."""
    ovL, _, eps_o, _, eps_va, _, weights, _ = _pair_problem("diagonal", seed=60)
    eps_vb = eps_va + _rand(eps_va.shape[0], seed=61).abs()
    args = (ovL, ovL, eps_o, eps_o, eps_va, eps_vb, weights, True)
    ref = torch.from_numpy(reference_pair_sums(*args))
    assert torch.allclose(torch_ops.mp2_pair_sums(*args), ref, atol=TOL_MATRIX_REL)


def test_pair_sums_refuses_exchange_on_rectangular_blocks():
    args = list(_pair_problem("rectangular"))
    args[-1] = True
    with pytest.raises(InputError, match="exchange"):
        torch_ops.mp2_pair_sums(*args)
    with pytest.raises(InputError, match="weights"):
        torch_ops.mp2_pair_sums(*args[:6], torch.ones(2, 2, dtype=torch.float64), False)


def test_diagonal_block_is_detected_only_for_the_same_orbitals():
    ovL, _, _, _, _, _, weights, _ = _pair_problem("diagonal")
    assert torch_ops.is_diagonal_block(ovL, ovL, weights)
    assert not torch_ops.is_diagonal_block(ovL, ovL.clone(), weights)
    assert not torch_ops.is_diagonal_block(ovL, ovL, torch.ones_like(weights))


def test_mixed_precision_operands_reduce_in_float64():
    args = _pair_problem("diagonal", seed=12)
    e64 = torch_ops.mp2_pair_sums(*args)
    e32 = torch_ops.mp2_pair_sums(args[0].float(), args[1].float(), *args[2:])
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


@pytest.mark.parametrize("kind", PAIR_KINDS)
def test_numpy_blas_pair_sums_equal_torch_blas(kind):
    from dfmp2.linalg import Dispatcher, DispatchPolicy

    args = _pair_problem(kind, seed=25)
    sums = [Dispatcher(DispatchPolicy("pytorch", cpu_blas=c)).mp2_pair_sums(*args)
            for c in ("torch", "numpy")]
    assert torch.allclose(sums[0], sums[1], atol=TOL_MATRIX_REL)


@pytest.mark.parametrize("kind", PAIR_KINDS)
@pytest.mark.parametrize("chunk_pairs", [1, 2, 100])
@pytest.mark.parametrize("precision", ["fp64", "mixed", "fp32"])
@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy-reduction"])
def test_numpy_pair_sums_match_oracle(kind, chunk_pairs, precision, compiled, monkeypatch):
    """The numpy-BLAS pair step: every chunking of the rows of j, every precision, both
    reductions (the compiled one must be built: see tests/test_pair_reduce.py)."""
    from dfmp2.linalg import numpy_ops

    ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, exchange = _pair_problem(kind, seed=30)
    b_dtype = torch.float64 if precision == "fp64" else torch.float32
    r_dtype = torch.float32 if precision == "fp32" else torch.float64
    nv = eps_va.shape[0]
    monkeypatch.setattr(numpy_ops, "CHUNK_BYTES", chunk_pairs * nv * nv * r_dtype.itemsize)
    b_i = ovL_i.to(b_dtype)
    b_j = b_i if kind == "diagonal" else ovL_j.to(b_dtype)
    operands = (b_i, b_j, eps_i.to(r_dtype), eps_j.to(r_dtype), eps_va.to(r_dtype),
                eps_vb.to(r_dtype), weights, exchange)
    got = numpy_ops.mp2_pair_sums(*operands, compiled=compiled and precision != "fp32")
    ref = torch.from_numpy(reference_pair_sums(ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb,
                                               weights, exchange))
    assert got.dtype == torch.float64 and got.shape == (2,)
    tol = {"fp64": TOL_MATRIX_REL, "mixed": TOL_FP32_REL, "fp32": TOL_FP32_REDUCTION_REL}[precision]
    assert torch.allclose(got, ref, rtol=tol, atol=tol)
    assert torch.allclose(got, torch_ops.mp2_pair_sums(*operands), rtol=tol, atol=tol)


def test_dispatcher_records_the_backend_that_ran_each_host_op(monkeypatch):
    """numpy is a registered backend: with cpu_blas numpy the ops with products run there and
    their records say so; the host-only ops and everything under cpu_blas torch say pytorch."""
    from dfmp2.linalg import REGISTRY, Dispatcher, DispatchPolicy, numpy_ops

    calls = []
    real = numpy_ops.mp2_pair_sums
    monkeypatch.setattr(numpy_ops, "mp2_pair_sums", lambda *a: calls.append(1) or real(*a))
    args = _pair_problem("diagonal", seed=40)
    for choice in ("torch", "numpy"):
        la = Dispatcher(DispatchPolicy("pytorch", cpu_blas=choice))
        la.mp2_pair_sums(*args)
        la.gemm(args[0][0], args[0][0], False, True)
        la.eigh(_spd(3))
        expected = "numpy" if choice == "numpy" else "pytorch"
        for op in ("mp2_pair_sums", "gemm"):
            assert (la.records[op].backend, la.records[op].mode) == (expected, expected)
        assert (la.records["eigh"].backend, la.records["eigh"].mode) == ("pytorch", "host")
    assert calls == [1]
    assert {op for op, backend in REGISTRY if backend == "numpy"} == {
        "gemm", "trmm", "mp2_pair_sums"}


@pytest.mark.parametrize("column_block", [1, 3, 256])
@pytest.mark.parametrize("cpu_blas", ["torch", "numpy"])
def test_fit_by_trmm_equals_trsm(column_block, cpu_blas, monkeypatch):
    """The fit multiplies by L^{-T} in place (numpy: one BLAS trmm; torch: column blocks of
    GEMMs); it must equal the solve."""
    from dfmp2 import df
    from dfmp2.linalg import Dispatcher, DispatchPolicy

    monkeypatch.setattr(torch_ops, "TRMM_COLUMN_BLOCK", column_block)
    la = Dispatcher(DispatchPolicy("pytorch", cpu_blas=cpu_blas))
    l_nn = torch.linalg.cholesky(_spd(10, seed=50))
    rows = _rand(7, 10, seed=51)
    upper = df.fit_matrix(df.MetricFactor(l_nn, None), la)
    assert torch.allclose(torch.tril(upper, -1), torch.zeros(10, 10, dtype=torch.float64))
    expected = torch_ops.trsm(l_nn, rows)
    work = rows.clone()
    got = la.trmm(upper, work)
    assert got.data_ptr() == work.data_ptr()  # in place
    assert torch.allclose(work, expected, atol=TOL_MATRIX_REL)
    assert torch.allclose(work @ l_nn.T, rows, atol=TOL_MATRIX_ABS)
    assert la.records["trmm"].backend == ("numpy" if cpu_blas == "numpy" else "pytorch")


def test_numpy_trmm_handles_strided_rows():
    from dfmp2.linalg import numpy_ops

    upper = torch.triu(_rand(6, 6, seed=52))
    wide = _rand(5, 9, seed=53)
    view = wide[:, :6]  # not C-contiguous
    expected = view @ upper
    numpy_ops.trmm(upper, view)
    assert torch.allclose(wide[:, :6], expected, atol=TOL_MATRIX_REL)


@pytest.mark.parametrize("cpu_blas", ["torch", "numpy"])
def test_trmm_on_a_transposed_view_works_in_place(cpu_blas):
    """The DF-SCF's fit multiplies the (pairs, naux) view of its C-ordered (naux, pairs) tensor:
    in place, the same as on a C-ordered copy."""
    from dfmp2.linalg import Dispatcher, DispatchPolicy

    upper = torch.triu(_rand(6, 6, seed=54))
    tensor = _rand(6, 11, seed=55)  # (naux, pairs)
    expected = tensor.T @ upper
    view = tensor.T  # Fortran-ordered (pairs, naux)
    got = Dispatcher(DispatchPolicy("pytorch", cpu_blas=cpu_blas)).trmm(upper, view)
    assert got.data_ptr() == tensor.data_ptr()
    assert torch.allclose(tensor.T, expected, atol=TOL_MATRIX_REL)


@pytest.mark.parametrize("cpu_blas", ["torch", "numpy"])
def test_gemm_writes_into_out(cpu_blas):
    from dfmp2.linalg import Dispatcher, DispatchPolicy

    la = Dispatcher(DispatchPolicy("pytorch", cpu_blas=cpu_blas))
    a, b = _rand(6, 4, seed=60), _rand(5, 4, seed=61)
    out = torch.full((6, 5), float("nan"), dtype=torch.float64)
    got = la.gemm(a, b, False, True, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.allclose(out, a @ b.T, atol=TOL_MATRIX_REL)
