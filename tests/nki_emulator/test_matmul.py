"""nc_matmul and nc_transpose, from the documented 0.3.0 semantics and limits."""

from __future__ import annotations

import numpy as np
import pytest

from dfmp2.nki_emulator import EmulatorError, jit, trace
from dfmp2.nki_emulator import isa as nisa
from dfmp2.nki_emulator import language as nl

from tolerances import (
    TOL_EMU_BF16_MATMUL_ABS,
    TOL_EMU_BF16_MATMUL_REL,
    TOL_EMU_ELEMENTWISE_REL,
    TOL_EMU_FP32_REL,
    TOL_EMU_MATMUL_ABS,
    TOL_EMU_MATMUL_LONG_ABS,
)

pytestmark = pytest.mark.nki_emulated
RNG = np.random.default_rng(7)


def load(x, dtype=None):
    t = nl.ndarray(x.shape, dtype=dtype or x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return t


def store(t):
    sb = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=sb, src=t)
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=sb)
    return out


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_matmul_128x128_by_128x512_is_a_T_b():
    @jit
    def k(a, b):
        res = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(res, load(a), load(b))
        return store(res)

    a, b = rand(128, 128), rand(128, 512)
    with trace() as tr:
        c = k(a, b)
    np.testing.assert_allclose(c, a.T @ b, rtol=TOL_EMU_FP32_REL, atol=TOL_EMU_MATMUL_LONG_ABS)
    assert tr.count("nc_matmul") == 1
    rec = tr.find("nc_matmul")[0]
    assert rec.engine == "tensor"
    assert rec.operands["dst"].buffer == "psum" and rec.operands["stationary"].shape == (128, 128)
    assert rec.attrs["accumulate"] is False


def test_accumulation_over_two_k_tiles():
    @jit
    def k(a, b):
        res = nl.ndarray((64, 300), dtype=nl.float32, buffer=nl.psum)
        for kt in nl.static_range(2):
            at = load(a[kt * 128 : (kt + 1) * 128, :])
            bt = load(b[kt * 128 : (kt + 1) * 128, :])
            nisa.nc_matmul(res, at, bt, accumulate=(kt > 0))
        return store(res)

    a, b = rand(256, 64), rand(256, 300)
    np.testing.assert_allclose(
        k(a, b), a.T @ b, rtol=TOL_EMU_FP32_REL, atol=TOL_EMU_MATMUL_LONG_ABS
    )


def test_accumulate_none_first_overwrites_then_accumulates():
    @jit
    def k(a, b):
        res = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.psum)
        at, bt = load(a), load(b)
        nisa.nc_matmul(res, at, bt)
        nisa.nc_matmul(res, at, bt)
        return store(res)

    a, b = rand(8, 32), rand(8, 16)
    with trace() as tr:
        c = k(a, b)
    np.testing.assert_allclose(c, 2 * (a.T @ b), rtol=TOL_EMU_FP32_REL, atol=TOL_EMU_MATMUL_ABS)
    assert [r.attrs["accumulate"] for r in tr.find("nc_matmul")] == [False, True]


def test_accumulate_false_overwrites_previous_group():
    @jit
    def k(a, b):
        res = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.psum)
        at, bt = load(a), load(b)
        nisa.nc_matmul(res, at, bt, accumulate=False)
        nisa.nc_matmul(res, at, bt, accumulate=False)
        return store(res)

    a, b = rand(8, 32), rand(8, 16)
    np.testing.assert_allclose(k(a, b), a.T @ b, rtol=TOL_EMU_FP32_REL, atol=TOL_EMU_MATMUL_ABS)


def test_moving_with_two_free_dims():
    @jit
    def k(a, b):
        res = nl.ndarray((16, 4, 8), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(res, load(a), load(b), accumulate=False)
        return store(res)

    a, b = rand(8, 16), rand(8, 4, 8)
    np.testing.assert_allclose(
        k(a, b), np.einsum("km,knp->mnp", a, b), rtol=TOL_EMU_FP32_REL, atol=TOL_EMU_MATMUL_ABS
    )


def _matmul_kernel(
    stat_shape,
    mov_shape,
    dst_shape,
    *,
    dst_dtype=nl.float32,
    dst_buffer=nl.psum,
    stat_dtype=nl.float32,
    mov_dtype=nl.float32,
    init=None,
    accumulate=None,
    dst_slice=None,
):
    @jit
    def k():
        stat = nl.ndarray(stat_shape, dtype=stat_dtype, buffer=nl.sbuf)
        mov = nl.ndarray(mov_shape, dtype=mov_dtype, buffer=nl.sbuf)
        nisa.memset(stat, 1.0)
        nisa.memset(mov, 1.0)
        dst = nl.ndarray(dst_shape, dtype=dst_dtype, buffer=dst_buffer)
        if init == "memset":
            nisa.memset(dst, 0.0)
        if init == "tensor_copy":
            zero = nl.ndarray(dst_shape, dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(zero, 0.0)
            nisa.tensor_copy(dst=dst, src=zero)
        if init == "zeros":
            dst = nl.zeros(dst_shape, dtype=dst_dtype, buffer=dst_buffer)
        target = dst if dst_slice is None else dst[dst_slice]
        nisa.nc_matmul(target, stat, mov, accumulate=accumulate)

    return k


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(stat_shape=(128, 129), mov_shape=(128, 8), dst_shape=(129, 8)),
            "partition dimension 129",
        ),
        (
            dict(stat_shape=(128, 129), mov_shape=(128, 8), dst_shape=(128, 8)),
            "stationary free size 129",
        ),
        (
            dict(stat_shape=(128, 64), mov_shape=(128, 513), dst_shape=(64, 513)),
            "moving free size 513",
        ),
        (dict(stat_shape=(64, 32), mov_shape=(32, 8), dst_shape=(32, 8)), "same partition"),
        (dict(stat_shape=(8, 32), mov_shape=(8, 16), dst_shape=(16, 32)), "dst shape must be"),
        (
            dict(stat_shape=(8, 32), mov_shape=(8, 16), dst_shape=(32, 16), dst_dtype=nl.bfloat16),
            "float32",
        ),
        (
            dict(stat_shape=(8, 32), mov_shape=(8, 16), dst_shape=(32, 16), dst_buffer=nl.sbuf),
            "PSUM",
        ),
        (
            dict(stat_shape=(8, 32), mov_shape=(8, 16), dst_shape=(32, 16), mov_dtype=nl.bfloat16),
            "other must be too",
        ),
        (
            dict(stat_shape=(8, 32), mov_shape=(8, 16), dst_shape=(32, 16), accumulate=True),
            "never written by nc_matmul",
        ),
        (
            dict(
                stat_shape=(8, 32),
                mov_shape=(8, 16),
                dst_shape=(32, 16),
                init="memset",
                accumulate=True,
            ),
            "non-matmul",
        ),
        (
            dict(stat_shape=(8, 32), mov_shape=(8, 16), dst_shape=(32, 16), init="memset"),
            "non-matmul",
        ),
        (
            dict(
                stat_shape=(8, 32),
                mov_shape=(8, 16),
                dst_shape=(32, 16),
                init="tensor_copy",
                accumulate=True,
            ),
            "non-matmul",
        ),
        (
            dict(
                stat_shape=(8, 32),
                mov_shape=(8, 16),
                dst_shape=(32, 16),
                init="zeros",
                accumulate=True,
            ),
            "non-matmul",
        ),
        (
            dict(
                stat_shape=(8, 32),
                mov_shape=(8, 400),
                dst_shape=(32, 1024),
                dst_slice=(slice(None), slice(300, 700)),
            ),
            "bank boundary",
        ),
    ],
)
def test_nc_matmul_constraints_raise(kwargs, match):
    with pytest.raises(EmulatorError, match=match):
        _matmul_kernel(**kwargs)()


def test_inputs_must_be_in_sbuf():
    @jit
    def k():
        stat = nl.ndarray((8, 32), dtype=nl.float32, buffer=nl.psum)
        mov = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        dst = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst, stat, mov)

    with pytest.raises(EmulatorError, match="stationary must be in SBUF"):
        k()


def test_accumulate_none_on_partly_written_psum_raises():
    @jit
    def k():
        stat = nl.ndarray((8, 32), dtype=nl.float32, buffer=nl.sbuf)
        mov = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(stat, 1.0)
        nisa.memset(mov, 1.0)
        dst = nl.ndarray((32, 32), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst[:, 0:16], stat, mov, accumulate=False)
        mov2 = nl.ndarray((8, 32), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(mov2, 1.0)
        nisa.nc_matmul(dst, stat, mov2)

    with pytest.raises(EmulatorError, match="pass accumulate explicitly"):
        k()


def test_matmul_reads_of_uninitialised_inputs_raise():
    @jit
    def k():
        stat = nl.ndarray((8, 32), dtype=nl.float32, buffer=nl.sbuf)
        mov = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(stat, 1.0)
        dst = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst, stat, mov)

    with pytest.raises(EmulatorError, match="never-written"):
        k()


def test_bf16_inputs_accumulate_in_fp32():
    @jit
    def k(a, b):
        res = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(res, load(a, nl.bfloat16), load(b, nl.bfloat16), accumulate=False)
        return store(res)

    a, b = rand(32, 16), rand(32, 8)
    c = k(a, b)
    np.testing.assert_allclose(
        c, a.T @ b, rtol=TOL_EMU_BF16_MATMUL_REL, atol=TOL_EMU_BF16_MATMUL_ABS
    )


def test_nc_transpose_tensor_engine():
    @jit
    def k(x):
        out = nl.ndarray((96, 128), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_transpose(out, load(x))
        return store(out)

    x = rand(128, 96)
    with trace() as tr:
        np.testing.assert_array_equal(k(x), x.T)
    assert tr.find("nc_transpose")[0].engine == "tensor"


def test_nc_transpose_flattens_free_axes_and_vector_engine():
    @jit
    def k(x):
        out = nl.ndarray((32, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.nc_transpose(out, load(x), engine=nisa.engine.vector)
        hbm = nl.ndarray((32, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=hbm, src=out)
        return hbm

    x = rand(8, 4, 8)
    np.testing.assert_array_equal(k(x), x.reshape(8, 32).T)


@pytest.mark.parametrize(
    "shape, dst_buffer, eng, dst_dtype, match",
    [
        ((33, 16), nl.sbuf, "vector", nl.float32, "at most 32x32"),
        ((16, 16), nl.sbuf, "tensor", nl.float32, "SBUF -> PSUM"),
        ((16, 16), nl.psum, None, nl.bfloat16, "must equal data dtype"),
    ],
)
def test_nc_transpose_constraints_raise(shape, dst_buffer, eng, dst_dtype, match):
    @jit
    def k():
        data = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(data, 1.0)
        dst = nl.ndarray((shape[1], shape[0]), dtype=dst_dtype, buffer=dst_buffer)
        engine = nisa.engine.unknown if eng is None else getattr(nisa.engine, eng)
        nisa.nc_transpose(dst, data, engine=engine)

    with pytest.raises(EmulatorError, match=match):
        k()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tile_position=(0, 0), tile_size=(64, 128)), "exceeds tile_size"),
        (dict(tile_position=(32, 0), tile_size=(64, 128)), "multiple of"),
        (dict(tile_position=(0, 0)), "both be 2-tuples"),
        (dict(perf_mode=nisa.matmul_perf_mode.double_row), "not emulated"),
    ],
)
def test_tiling_and_perf_mode_constraints(kwargs, match):
    @jit
    def k():
        stat = nl.ndarray((128, 32), dtype=nl.float32, buffer=nl.sbuf)
        mov = nl.ndarray((128, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(stat, 1.0)
        nisa.memset(mov, 1.0)
        dst = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst, stat, mov, accumulate=False, **kwargs)

    with pytest.raises(EmulatorError, match=match):
        k()


def test_row_tiling_runs():
    @jit
    def k(a, b):
        res = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(
            res, load(a), load(b), accumulate=False, tile_position=(64, 0), tile_size=(64, 128)
        )
        return store(res)

    a, b = rand(64, 32), rand(64, 16)
    np.testing.assert_allclose(k(a, b), a.T @ b, rtol=TOL_EMU_FP32_REL, atol=TOL_EMU_MATMUL_ABS)


def test_psum_reuse_with_auto_accumulate_adds_onto_old_group():
    """Documented auto rule: later writes to a location accumulate, even after eviction."""

    @jit
    def k(a, b):
        res = nl.ndarray((8, 4), dtype=nl.float32, buffer=nl.psum)
        at, bt = load(a), load(b)
        nisa.nc_matmul(res, at, bt)
        first = store(res)
        nisa.nc_matmul(res, at, bt)
        return first, store(res)

    a, b = rand(4, 8), rand(4, 4)
    first, second = k(a, b)
    np.testing.assert_allclose(second, 2 * first, rtol=TOL_EMU_ELEMENTWISE_REL)
