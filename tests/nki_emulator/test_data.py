"""dma_copy, tensor_copy, memset, iota, affine_select and the DMA trace."""

from __future__ import annotations

import numpy as np
import pytest

from dfmp2.nki_emulator import EmulatorError, jit, target, trace
from dfmp2.nki_emulator import isa as nisa
from dfmp2.nki_emulator import language as nl

from tolerances import TOL_BF16_REL, TOL_BF16_ULP

pytestmark = pytest.mark.nki_emulated
RNG = np.random.default_rng(3)


def new(shape, dtype=nl.float32, buffer=nl.sbuf):
    return nl.ndarray(shape, dtype=dtype, buffer=buffer)


def store(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_dma_copy_casts_through_fp32_and_counts_bytes():
    @jit
    def k(x):
        half = new(x.shape, dtype=nl.bfloat16)
        nisa.dma_copy(dst=half, src=x)
        back = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=back, src=half)
        return back

    x = np.array([[1.0, 1.00390625, 1.005859375, 3.14159265]], dtype=np.float32)
    with trace() as tr:
        got = k(x)
    # bf16 has 8 significant bits: 1 + 2**-8 ties to even (1.0); 1 + 1.5 * 2**-8 rounds up
    np.testing.assert_array_equal(got[0, :3], np.array([1.0, 1.0, 1.0078125], np.float32))
    assert abs(got[0, 3] - np.pi) < TOL_BF16_ULP * np.pi
    loads, stores = tr.dma_loads(), tr.dma_stores()
    assert len(loads) == 1 and len(stores) == 1
    assert loads[0].nbytes == 4 * 2 and stores[0].nbytes == 4 * 4
    assert stores[0].operands["src"].dtype == "bfloat16"
    assert tr.kernels == ["k"]


def test_dma_copy_row_major_reshape_and_int():
    @jit
    def k(x):
        t = new((4, 6), dtype=nl.int32)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray((24,), dtype=nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.arange(24, dtype=np.int32).reshape(2, 12)
    np.testing.assert_array_equal(k(x), x.reshape(-1))


@pytest.mark.parametrize(
    "case, match",
    [
        ("psum_src", "cannot read PSUM"),
        ("count", "elements"),
        ("hwdge", "hwdge requires equal dtypes"),
        ("psum_dst", "between HBM and SBUF"),
    ],
)
def test_dma_copy_constraints_raise(case, match):
    @jit
    def k(x):
        sb = new(x.shape)
        nisa.dma_copy(dst=sb, src=x)
        if case == "psum_src":
            ps = new(x.shape, buffer=nl.psum)
            nisa.tensor_copy(dst=ps, src=sb)
            nisa.dma_copy(dst=new(x.shape), src=ps)
        elif case == "count":
            nisa.dma_copy(dst=new((4, 5)), src=x)
        elif case == "hwdge":
            nisa.dma_copy(dst=new(x.shape, nl.bfloat16), src=x, dge_mode=nisa.dge_mode.hwdge)
        else:
            nisa.dma_copy(dst=new(x.shape, buffer=nl.psum), src=x)

    with pytest.raises(EmulatorError, match=match):
        k(np.ones((4, 4), np.float32))


def test_tensor_copy_psum_to_sbuf_with_cast():
    @jit
    def k(x):
        sb = new(x.shape)
        nisa.dma_copy(dst=sb, src=x)
        ps = new(x.shape, buffer=nl.psum)
        nisa.tensor_copy(dst=ps, src=sb)
        out = new((x.shape[0], 2, x.shape[1] // 2), dtype=nl.bfloat16)
        nisa.tensor_copy(dst=out, src=ps)
        return store(out)

    x = RNG.standard_normal((16, 8)).astype(np.float32)
    got = k(x)
    assert got.shape == (16, 2, 4)
    np.testing.assert_allclose(got.reshape(16, 8), x, rtol=TOL_BF16_REL)


@pytest.mark.parametrize(
    "case, match",
    [
        ("gpsimd_psum", "GpSimd cannot access PSUM"),
        ("layout", "same partition count"),
        ("hbm", "must be in SBUF or PSUM"),
    ],
)
def test_tensor_copy_constraints_raise(case, match):
    @jit
    def k(x):
        sb = new(x.shape)
        nisa.dma_copy(dst=sb, src=x)
        if case == "gpsimd_psum":
            nisa.tensor_copy(dst=new(x.shape, buffer=nl.psum), src=sb, engine=nisa.engine.gpsimd)
        elif case == "layout":
            nisa.tensor_copy(dst=new((2, 8)), src=sb)
        else:
            nisa.tensor_copy(dst=new(x.shape), src=x)

    with pytest.raises(EmulatorError, match=match):
        k(np.ones((4, 4), np.float32))


def test_tensor_copy_on_scalar_engine_not_on_trn1():
    @jit
    def k(x):
        sb = new(x.shape)
        nisa.dma_copy(dst=sb, src=x)
        nisa.tensor_copy(dst=new(x.shape), src=sb, engine=nisa.engine.scalar)
        return store(sb)

    x = np.ones((2, 2), np.float32)
    np.testing.assert_array_equal(k(x), x)
    with target("trn1"), pytest.raises(EmulatorError, match="gen2"):
        k(x)


def test_memset_values_and_int_rule():
    @jit
    def k():
        f = new((4, 3))
        i = new((4, 3), dtype=nl.int32)
        nisa.memset(f, 2.5)
        nisa.memset(i, 7)
        return store(f), store(i)

    f, i = k()
    np.testing.assert_array_equal(f, np.full((4, 3), 2.5, np.float32))
    np.testing.assert_array_equal(i, np.full((4, 3), 7, np.int32))

    @jit
    def bad():
        nisa.memset(new((4, 3), dtype=nl.int32), 1.0)

    with pytest.raises(EmulatorError, match="must be an int"):
        bad()


def test_iota_pattern():
    @jit
    def k():
        out = new((4, 2, 3), dtype=nl.int32)
        nisa.iota(out, [[10, 2], [1, 3]], offset=5, channel_multiplier=100)
        return store(out)

    p = np.arange(4)[:, None, None]
    w = np.arange(2)[None, :, None]
    x = np.arange(3)[None, None, :]
    np.testing.assert_array_equal(k(), (5 + 100 * p + 10 * w + x).astype(np.int32))


def test_iota_pattern_size_mismatch_raises():
    @jit
    def k():
        nisa.iota(new((4, 5), dtype=nl.int32), [[1, 4]])

    with pytest.raises(EmulatorError, match="generates 4 elements"):
        k()


def test_affine_select_lower_triangle():
    @jit
    def k(x):
        sb = new(x.shape)
        nisa.dma_copy(dst=sb, src=x)
        out = new(x.shape)
        # keep x[p, j] where p - j >= 0 (lower triangle), else 0
        nisa.affine_select(out, [[-1, x.shape[1]]], 1, sb, 0.0, cmp_op=nl.greater_equal)
        return store(out)

    x = RNG.standard_normal((6, 6)).astype(np.float32)
    np.testing.assert_array_equal(k(x), np.tril(x))


def test_affine_select_requires_sbuf():
    @jit
    def k(x):
        sb = new(x.shape)
        nisa.dma_copy(dst=sb, src=x)
        ps = new(x.shape, buffer=nl.psum)
        nisa.tensor_copy(dst=ps, src=sb)
        nisa.affine_select(new(x.shape), [[-1, 4]], 1, ps, 0.0)

    with pytest.raises(EmulatorError, match="must be in SBUF"):
        k(np.ones((4, 4), np.float32))


def test_shared_identity_matrix_and_zeros():
    @jit
    def k():
        eye = nl.shared_identity_matrix(8, dtype=nl.float32)
        z = nl.zeros((8, 8), dtype=nl.float32)
        out = new((8, 8))
        nisa.tensor_tensor(out, eye, z, nl.add)
        return store(out)

    np.testing.assert_array_equal(k(), np.eye(8, dtype=np.float32))
