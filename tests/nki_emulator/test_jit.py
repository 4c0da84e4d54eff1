"""The emulated nki.jit kernel boundary."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfmp2.nki_emulator import EmulatorError, jit, simulate, trace
from dfmp2.nki_emulator import isa as nisa
from dfmp2.nki_emulator import language as nl

pytestmark = pytest.mark.nki_emulated


@jit
def copy_kernel(x):
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.uint8])
def test_numpy_roundtrip(dtype):
    x = (np.arange(12) % 7).astype(dtype).reshape(3, 4)
    got = copy_kernel(x)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, x)


def test_tuple_arguments_and_outputs_and_scalars():
    @jit
    def k(pair, scale, label=None):
        a, b = pair
        sa = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.sbuf)
        sb = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sa, src=a)
        nisa.dma_copy(dst=sb, src=b)
        nisa.tensor_scalar(sa, sa, nl.multiply, scale)
        oa = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ob = nl.ndarray(b.shape, dtype=b.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=oa, src=sa)
        nisa.dma_copy(dst=ob, src=sb)
        return oa, ob

    a, b = np.ones((2, 3), np.float32), np.zeros((4, 1), np.float32)
    oa, ob = k((a, b), 3.0, label="x")
    np.testing.assert_array_equal(oa, 3 * a)
    np.testing.assert_array_equal(ob, b)


def test_torch_bfloat16_in_and_out():
    x = torch.tensor([[1.0, 2.5, -3.25]], dtype=torch.bfloat16)
    got = copy_kernel(x)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    assert torch.equal(got, x)


@pytest.mark.parametrize(
    "arg, match",
    [
        (np.ones((2, 2)), "float64"),
        ([np.ones((2, 2), np.float32)], "list arguments"),
        (np.float64(1.0), "float64"),
        (object(), "unsupported kernel argument"),
    ],
)
def test_bad_arguments_raise(arg, match):
    with pytest.raises(TypeError, match=match):
        copy_kernel(arg)


@pytest.mark.parametrize(
    "case, match",
    [
        ("hbm", "kernel outputs must be allocated with buffer=nl.shared_hbm"),
        ("private", "kernel outputs must be allocated"),
        ("sbuf", "kernel outputs must be allocated"),
        ("input", "kernel input"),
        ("view", "return the whole tensor"),
        ("unwritten", "never-written"),
        ("number", "not a tensor"),
        ("none", "not a tensor"),
    ],
)
def test_bad_returns_raise(case, match):
    @jit
    def k(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        if case in ("hbm", "private"):
            out = nl.ndarray(
                x.shape, dtype=x.dtype, buffer=nl.hbm if case == "hbm" else nl.private_hbm
            )
            nisa.dma_copy(dst=out, src=t)
            return out
        if case == "sbuf":
            return t
        if case == "input":
            return x
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        if case == "view":
            nisa.dma_copy(dst=out, src=t)
            return out[0:1, :]
        if case == "unwritten":
            return out
        if case == "number":
            return 1.0
        return None

    with pytest.raises(EmulatorError, match=match):
        k(np.ones((2, 2), np.float32))


def test_kernel_inputs_are_read_only():
    @jit
    def k(x):
        t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=x, src=t)

    with pytest.raises(EmulatorError, match="read-only"):
        k(np.ones((2, 2), np.float32))


def test_nested_kernel_call_and_platform_target_raise():
    @jit
    def outer(x):
        return copy_kernel(x)

    with pytest.raises(EmulatorError, match="called inside kernel"):
        outer(np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match="platform_target"):
        jit(platform_target="trn2")


def test_jit_with_arguments_simulate_and_grid():
    @jit(mode="auto")
    def k(x):
        return copy_kernel.func(x)

    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    np.testing.assert_array_equal(k(x), x)
    np.testing.assert_array_equal(simulate(k)(x), x)
    np.testing.assert_array_equal(k[1](x), x)
    with pytest.raises(EmulatorError, match="1-D launch grids"):
        k[(1, 1)]


def test_inputs_are_not_modified_and_trace_names_kernel():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    before = x.copy()
    with trace() as outer, trace() as inner:
        copy_kernel(x)
    np.testing.assert_array_equal(x, before)
    assert outer.count("dma_copy") == inner.count("dma_copy") == 2
    assert {r.kernel for r in outer.records} == {"copy_kernel"}
    assert outer.bytes_moved() == 2 * 6 * 4
    assert outer.dma_stores(shape=(2, 3)) and not outer.dma_stores(shape=(3, 2))
