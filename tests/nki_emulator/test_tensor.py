"""Tensors: allocation rules, views, uninitialised memory and the SBUF/PSUM budgets."""

from __future__ import annotations

import numpy as np
import pytest

from dfmp2.nki_emulator import EmulatorError, jit, target
from dfmp2.nki_emulator import isa as nisa
from dfmp2.nki_emulator import language as nl

pytestmark = pytest.mark.nki_emulated


def store(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def done():
    """A tiny written output, for kernels that only exercise allocation rules."""
    t = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(t, 0.0)
    return store(t)


def test_views_write_through_and_ds():
    @jit
    def k(x):
        t = nl.ndarray((40, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(t, 0.0)
        nisa.dma_copy(dst=t[0:4, nl.ds(4, 8)], src=x)
        view = t[:, 8:16]
        nisa.memset(view[32:36, 0:2], 9.0)
        return store(t)

    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    got = k(x)
    want = np.zeros((40, 16), np.float32)
    want[0:4, 4:12] = x
    want[32:36, 8:10] = 9.0
    np.testing.assert_array_equal(got, want)


def test_tensor_attributes_integer_index_and_reshape():
    seen = {}

    @jit
    def k(x):
        t = nl.ndarray((4, 2, 6), dtype=nl.bfloat16, buffer=nl.sbuf, name="tile")
        seen["attrs"] = (t.shape, t.dtype, t.buffer, t.ndim, t.size, t.name)
        seen["int"] = t[:, 1].shape
        seen["step"] = t[:, :, ::2].shape
        seen["x_row"] = x[1].shape
        flat = t.reshape((4, 12))
        nisa.dma_copy(dst=flat, src=x)
        return store(t[:, 1:2, :])

    x = np.arange(48, dtype=np.float32).reshape(4, 12)
    got = k(x)
    assert seen["attrs"] == ((4, 2, 6), nl.bfloat16, nl.sbuf, 3, 48, "tile")
    assert seen["int"] == (4, 6) and seen["step"] == (4, 2, 3) and seen["x_row"] == (12,)
    np.testing.assert_array_equal(got, x.reshape(4, 2, 6)[:, 1:2, :])


@pytest.mark.parametrize(
    "shape, buffer, match",
    [
        ((129, 4), nl.sbuf, "exceeds the maximum 128"),
        ((200, 4), nl.psum, "exceeds the maximum 128"),
        ((128,), nl.sbuf, "at least 2 dimensions"),
        ((4,), nl.psum, "at least 2 dimensions"),
    ],
)
def test_allocation_rules_raise(shape, buffer, match):
    @jit
    def k():
        nl.ndarray(shape, dtype=nl.float32, buffer=buffer)

    with pytest.raises(EmulatorError, match=match):
        k()


def test_hbm_tensors_may_be_1d_and_large():
    @jit
    def k(x):
        out = nl.ndarray((300,), dtype=nl.float32, buffer=nl.shared_hbm)
        scratch = nl.ndarray((300,), dtype=nl.float32, buffer=nl.hbm)
        nisa.dma_copy(dst=scratch, src=x)
        nisa.dma_copy(dst=out, src=scratch)
        return out

    x = np.arange(300, dtype=np.float32)
    np.testing.assert_array_equal(k(x), x)


@pytest.mark.parametrize(
    "dtype, buffer, match",
    [
        (np.float64, nl.sbuf, "float64"),
        ("float64", nl.sbuf, "float64"),
        (nl.float32, "sbuf", "buffer objects"),
    ],
)
def test_float64_and_string_buffers_rejected(dtype, buffer, match):
    @jit
    def k():
        nl.ndarray((4, 4), dtype=dtype, buffer=buffer)

    with pytest.raises(TypeError, match=match):
        k()


def test_reading_never_written_memory_raises():
    @jit
    def k():
        t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(t[:, 0:7], 1.0)
        return store(t)

    with pytest.raises(EmulatorError, match="reads 4 of 32 never-written"):
        k()


@pytest.mark.parametrize(
    "bad", ["partition_int", "assign", "array_index", "reshape_partition", "scalar"]
)
def test_view_misuse_raises(bad):
    @jit
    def k():
        t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        if bad == "partition_int":
            t[0, :]
        elif bad == "assign":
            t[0:1, :] = 1.0
        elif bad == "array_index":
            t[np.array([0, 1]), :]
        elif bad == "reshape_partition":
            t.reshape((8, 4))
        else:
            nl.ndarray((4,), dtype=nl.float32, buffer=nl.hbm)[2]

    with pytest.raises((IndexError, TypeError, ValueError)):
        k()


def test_one_dim_on_chip_view_is_not_an_operand():
    @jit
    def k():
        t = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(t[:, 3], 1.0)

    with pytest.raises(EmulatorError, match="j:j\\+1"):
        k()


def test_allocation_outside_kernel_raises():
    with pytest.raises(EmulatorError, match="outside an @nki.jit kernel"):
        nl.ndarray((4, 4), dtype=nl.float32, buffer=nl.sbuf)


def test_sbuf_budget_trn2_and_trn1():
    """The usable SBUF per partition (212984 B of trn2's 224 KiB, 180224 B of trn1's 192 KiB)."""
    @jit
    def k(cols):
        _big = nl.ndarray((128, 100 * 256), dtype=nl.float32, buffer=nl.sbuf)
        _other = nl.ndarray((128, cols), dtype=nl.float32, buffer=nl.sbuf)
        return done()

    k((212984 - 102400 - 4) // 4)  # 100 KiB + the rest, plus the 4 B of done(), fits trn2
    with pytest.raises(EmulatorError, match="SBUF budget exceeded"):
        k((212984 - 102400 - 4) // 4 + 1)
    with target("trn1"):
        k((180224 - 102400 - 4) // 4)
        with pytest.raises(EmulatorError, match="180224 B per partition usable of 196608 "
                                                "\\(trn1\\)"):
            k((180224 - 102400 - 4) // 4 + 1)


def test_psum_budget_counts_whole_banks():
    @jit
    def k(n_tiles, free):
        tiles = []
        for i in nl.static_range(n_tiles):
            tiles.append(nl.ndarray((128, free), dtype=nl.float32, buffer=nl.psum))
        return done()

    k(8, 512)
    with pytest.raises(EmulatorError, match="PSUM budget exceeded"):
        k(9, 512)
    with pytest.raises(EmulatorError, match="PSUM budget exceeded"):
        k(9, 1)  # a 4-byte tile still takes a whole 2 KiB bank
    with pytest.raises(EmulatorError, match="needs 2 bank"):
        k(5, 513)


def test_released_tiles_free_their_budget():
    @jit
    def k():
        for i in nl.static_range(20):
            _t = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.psum)  # 2 banks each
            _s = nl.ndarray((128, 50 * 256), dtype=nl.float32, buffer=nl.sbuf)  # 50 KiB each
        return done()

    k()
