"""Vector/Scalar/GpSimd compute instructions, from the documented 0.3.0 semantics."""

from __future__ import annotations

import numpy as np
import pytest

from dfmp2.nki_emulator import EmulatorError, jit, target, trace
from dfmp2.nki_emulator import isa as nisa
from dfmp2.nki_emulator import language as nl

from tolerances import (
    TOL_BF16_REL,
    TOL_EMU_ELEMENTWISE_REL,
    TOL_EMU_FP32_REL,
    TOL_EMU_RECIPROCAL_REL,
)

pytestmark = pytest.mark.nki_emulated
RNG = np.random.default_rng(11)


def load(x, dtype=None, buffer=nl.sbuf):
    t = nl.ndarray(x.shape, dtype=dtype or x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    if buffer is nl.psum:
        p = nl.ndarray(x.shape, dtype=t.dtype, buffer=nl.psum)
        nisa.tensor_copy(dst=p, src=t)
        return p
    return t


def store(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def new(shape, dtype=nl.float32, buffer=nl.sbuf):
    return nl.ndarray(shape, dtype=dtype, buffer=buffer)


def rand(*shape, low=-2.0, high=2.0):
    return RNG.uniform(low, high, size=shape).astype(np.float32)


@pytest.mark.parametrize(
    "op, ref",
    [
        (nl.add, np.add),
        (nl.subtract, np.subtract),
        (nl.multiply, np.multiply),
        (nl.maximum, np.maximum),
        (nl.minimum, np.minimum),
    ],
)
def test_tensor_tensor_ops(op, ref):
    @jit
    def k(a, b):
        out = new(a.shape)
        nisa.tensor_tensor(out, load(a), load(b, buffer=nl.psum), op)
        return store(out)

    a, b = rand(64, 40), rand(64, 40)
    np.testing.assert_array_equal(k(a, b), ref(a, b))


def test_tensor_tensor_same_elements_per_partition_different_shape():
    @jit
    def k(a, b):
        out = new((8, 12))
        nisa.tensor_tensor(out, load(a), load(b), nl.add)
        return store(out)

    a, b = rand(8, 3, 4), rand(8, 12)
    np.testing.assert_array_equal(k(a, b), a.reshape(8, 12) + b)


@pytest.mark.parametrize(
    "b_shape, both_psum, match",
    [
        ((8, 1), False, "does not broadcast"),
        ((1, 16), False, "does not broadcast"),
        ((8, 16), True, "cannot both be in PSUM"),
    ],
)
def test_tensor_tensor_constraints_raise(b_shape, both_psum, match):
    @jit
    def k(a, b):
        buffer = nl.psum if both_psum else nl.sbuf
        out = new(a.shape)
        nisa.tensor_tensor(out, load(a, buffer=buffer), load(b, buffer=buffer), nl.add)

    with pytest.raises(EmulatorError, match=match):
        k(rand(8, 16), rand(*b_shape))


def test_tensor_tensor_rejects_non_operator():
    @jit
    def k(a):
        out = new(a.shape)
        nisa.tensor_tensor(out, load(a), load(a), np.add)

    with pytest.raises(EmulatorError, match="not an emulated binary ALU"):
        k(rand(4, 4))


def test_tensor_scalar_column_operand_and_reverse():
    @jit
    def k(x, col):
        out = new(x.shape)
        nisa.tensor_scalar(
            out, load(x), nl.subtract, load(col), reverse0=True, op1=nl.multiply, operand1=3.0
        )
        return store(out)

    x, col = rand(16, 10), rand(16, 1)
    np.testing.assert_allclose(k(x, col), (col - x) * np.float32(3.0), rtol=TOL_EMU_ELEMENTWISE_REL)


def test_tensor_scalar_reverse1_and_unary():
    @jit
    def k(x):
        out = new(x.shape)
        nisa.tensor_scalar(out, load(x), nl.abs, None, op1=nl.subtract, operand1=1.0, reverse1=True)
        return store(out)

    x = rand(4, 6)
    np.testing.assert_allclose(k(x), 1.0 - np.abs(x), rtol=TOL_EMU_ELEMENTWISE_REL)


@pytest.mark.parametrize(
    "operand, match",
    [
        ("row", "shape \\(16, 1\\)"),
        ("bf16col", "must be float32"),
        ("op1only", "operand1 given without op1"),
    ],
)
def test_tensor_scalar_constraints_raise(operand, match):
    @jit
    def k(x, row):
        out = new(x.shape)
        if operand == "row":
            nisa.tensor_scalar(out, load(x), nl.add, load(row))
        elif operand == "bf16col":
            nisa.tensor_scalar(out, load(x), nl.add, load(x[:, 0:1], nl.bfloat16))
        else:
            nisa.tensor_scalar(out, load(x), nl.add, 1.0, operand1=2.0)

    with pytest.raises(EmulatorError, match=match):
        k(rand(16, 8), rand(1, 8))


def test_tensor_scalar_scalar_engine_combinations_on_trn2():
    @jit
    def k(x):
        out = new(x.shape)
        nisa.tensor_scalar(out, load(x), nl.subtract, 1.0, engine=nisa.engine.scalar)

    with pytest.raises(EmulatorError, match="Scalar Engine on trn2"):
        k(rand(4, 4))


def test_scalar_tensor_tensor():
    @jit
    def k(t, tt):
        out = new(t.shape)
        nisa.scalar_tensor_tensor(
            dst=out,
            data=load(t, buffer=nl.psum),
            op0=nl.multiply,
            operand0=2.0,
            op1=nl.subtract,
            operand1=load(tt),
        )
        return store(out)

    t, tt = rand(32, 20), rand(32, 20)
    np.testing.assert_allclose(k(t, tt), 2 * t - tt, rtol=TOL_EMU_ELEMENTWISE_REL)


def test_scalar_tensor_tensor_reverse_and_column():
    @jit
    def k(t, col, tt):
        out = new(t.shape)
        nisa.scalar_tensor_tensor(
            out, load(t), nl.add, load(col), nl.subtract, load(tt), reverse1=True
        )
        return store(out)

    t, col, tt = rand(8, 5), rand(8, 1), rand(8, 5)
    np.testing.assert_allclose(k(t, col, tt), tt - (t + col), rtol=TOL_EMU_ELEMENTWISE_REL)


def test_scalar_tensor_tensor_both_psum_raises():
    @jit
    def k(t):
        out = new(t.shape)
        nisa.scalar_tensor_tensor(
            out, load(t, buffer=nl.psum), nl.add, 1.0, nl.add, load(t, buffer=nl.psum)
        )

    with pytest.raises(EmulatorError, match="cannot both be in PSUM"):
        k(rand(4, 4))


def test_activation_bias_column_and_scale():
    @jit
    def k(x, bias, scale):
        out = new(x.shape)
        nisa.activation(dst=out, op=nl.exp, data=load(x), bias=load(bias), scale=load(scale))
        return store(out)

    x, bias, scale = rand(16, 12), rand(16, 1), rand(16, 1)
    np.testing.assert_allclose(k(x, bias, scale), np.exp(x * scale + bias), rtol=TOL_EMU_FP32_REL)


def test_activation_reciprocal_of_shifted_row():
    @jit
    def k(negv, col):
        out = new(negv.shape)
        nisa.activation(out, nl.reciprocal, load(negv), bias=load(col), scale=1.0)
        return store(out)

    negv = -rand(8, 30, low=1.0, high=3.0)
    col = rand(8, 1, low=-3.0, high=-1.0)
    np.testing.assert_allclose(k(negv, col), 1.0 / (negv + col), rtol=TOL_EMU_ELEMENTWISE_REL)


def test_activation_scalar_bias_gen3_only():
    @jit
    def k(x):
        out = new(x.shape)
        nisa.activation(out, nl.copy, load(x), bias=0.5)
        return store(out)

    x = rand(4, 4)
    np.testing.assert_allclose(k(x), x + np.float32(0.5))
    with target("trn1"), pytest.raises(EmulatorError, match="gen2"):
        k(x)


def test_activation_bias_must_be_column():
    @jit
    def k(x):
        out = new(x.shape)
        nisa.activation(out, nl.copy, load(x), bias=load(x))

    with pytest.raises(EmulatorError, match="shape \\(4, 1\\)"):
        k(rand(4, 4))


def test_activation_outside_documented_range_raises():
    @jit
    def k(x):
        out = new(x.shape)
        nisa.activation(out, nl.reciprocal, load(x))

    with pytest.raises(ValueError, match="valid range"):
        k(np.zeros((4, 4), np.float32))


def test_activation_reduce_registers():
    @jit
    def k(x, y):
        out = new(x.shape)
        res = new((x.shape[0], 1))
        res2 = new((x.shape[0], 1))
        nisa.activation(
            out, nl.square, load(x), reduce_op=nl.add, reduce_cmd=nisa.reduce_cmd.reset_reduce
        )
        nisa.activation(
            out,
            nl.square,
            load(y),
            reduce_op=nl.add,
            reduce_res=res,
            reduce_cmd=nisa.reduce_cmd.reduce,
        )
        nisa.activation(out, nl.copy, load(y), reduce_res=res2)  # idle: registers unchanged
        both = new((x.shape[0], 2))
        nisa.tensor_copy(dst=both[:, 0:1], src=res)
        nisa.tensor_copy(dst=both[:, 1:2], src=res2)
        return store(both)

    x, y = rand(8, 10), rand(8, 10)
    got = k(x, y)
    want = (x**2).sum(axis=1) + (y**2).sum(axis=1)
    np.testing.assert_allclose(got[:, 0], want, rtol=TOL_EMU_FP32_REL)
    np.testing.assert_allclose(got[:, 1], want, rtol=TOL_EMU_FP32_REL)


def test_activation_reset_then_read():
    @jit
    def k(x):
        out = new(x.shape)
        res = new((x.shape[0], 1))
        nisa.activation(out, nl.copy, load(x), reduce_res=res, reduce_cmd=nisa.reduce_cmd.reset)
        return store(res)

    np.testing.assert_array_equal(k(rand(4, 3)), np.zeros((4, 1), np.float32))


@pytest.mark.parametrize(
    "cmd, reduce_op, match",
    [
        ("reduce", "add", "never reset"),
        ("reset_reduce", None, "needs reduce_op"),
        ("reset_reduce", "multiply", "must be nl.add"),
    ],
)
def test_activation_reduce_misuse_raises(cmd, reduce_op, match):
    @jit
    def k(x):
        out = new(x.shape)
        op = None if reduce_op is None else getattr(nl, reduce_op)
        nisa.activation(
            out, nl.copy, load(x), reduce_op=op, reduce_cmd=getattr(nisa.reduce_cmd, cmd)
        )

    with pytest.raises(EmulatorError, match=match):
        k(rand(4, 3))


def test_tensor_reduce_trailing_axes():
    @jit
    def k(x):
        last = new((8, 3, 1))
        both = new((8, 1))
        mx = new((8, 3))
        nisa.tensor_reduce(last, nl.add, load(x), axis=(2,), keepdims=True)
        nisa.tensor_reduce(both, nl.add, load(x), axis=(1, 2), negate=True)
        nisa.tensor_reduce(mx, nl.maximum, load(x), axis=2)
        return store(last), store(both), store(mx)

    x = rand(8, 3, 5)
    last, both, mx = k(x)
    np.testing.assert_allclose(last, x.sum(axis=2, keepdims=True), rtol=TOL_EMU_FP32_REL)
    np.testing.assert_allclose(both[:, 0], -x.sum(axis=(1, 2)), rtol=TOL_EMU_FP32_REL)
    np.testing.assert_array_equal(mx, x.max(axis=2))


@pytest.mark.parametrize(
    "axis, dst_shape, match",
    [
        ((0,), (1, 3, 5), "partition axis 0"),
        ((1,), (8, 5), "last contiguous free axes"),
        ((2,), (8, 5), "must hold the reduced shape"),
    ],
)
def test_tensor_reduce_constraints_raise(axis, dst_shape, match):
    @jit
    def k(x):
        nisa.tensor_reduce(new(dst_shape), nl.add, load(x), axis=axis)

    with pytest.raises(EmulatorError, match=match):
        k(rand(8, 3, 5))


def test_tensor_partition_reduce():
    @jit
    def k(x):
        out = new((1, x.shape[1]))
        nisa.tensor_partition_reduce(out, nl.add, load(x))
        return store(out)

    x = rand(64, 7)
    np.testing.assert_allclose(k(x), x.sum(axis=0, keepdims=True), rtol=TOL_EMU_FP32_REL)


def test_reciprocal_and_dst_cast_rounding():
    @jit
    def k(x):
        r = new(x.shape)
        nisa.reciprocal(r, load(x))
        rb = new(x.shape, dtype=nl.bfloat16)
        nisa.reciprocal(rb, load(x))
        return store(r), store(rb)

    x = rand(4, 8, low=1.0, high=3.0)
    r, rb = k(x)
    np.testing.assert_allclose(r, np.float32(1.0) / x, rtol=TOL_EMU_RECIPROCAL_REL)
    # bf16 keeps 8 significant bits: low 16 bits of the float32 pattern are zero after rounding
    assert np.all(rb.view(np.uint32) & 0xFFFF == 0)
    np.testing.assert_allclose(rb, 1.0 / x, rtol=TOL_BF16_REL)


def test_int_dst_rounds_to_nearest():
    @jit
    def k(x):
        out = new(x.shape, dtype=nl.int32)
        nisa.tensor_scalar(out, load(x), nl.add, 0.0)
        return store(out)

    x = np.array([[0.4, 1.6, -2.5, 2.5]], dtype=np.float32)
    np.testing.assert_array_equal(k(x), np.array([[0, 2, -2, 2]], dtype=np.int32))


def test_trace_records_engines():
    @jit
    def k(x):
        out = new(x.shape)
        nisa.tensor_tensor(out, load(x), load(x), nl.add)
        nisa.activation(out, nl.copy, load(x))
        return store(out)

    with trace() as tr:
        k(rand(4, 4))
    assert [r.engine for r in tr.find("tensor_tensor")] == ["vector"]
    assert tr.find("activation")[0].engine == "scalar"
    assert tr.find("tensor_tensor")[0].attrs["op"] == "nl.add"


def test_numpy_float64_scalar_operand_raises():
    @jit
    def k(x):
        out = new(x.shape)
        nisa.tensor_scalar(out, load(x), nl.add, np.float64(1.0))

    with pytest.raises(TypeError, match="float64"):
        k(rand(4, 4))


def test_language_wrappers_are_not_emulated():
    with pytest.raises(EmulatorError, match="experimental"):
        nl.add(1, 2)
    with pytest.raises(EmulatorError, match="experimental"):
        nl.load(None)


def test_nc_version_program_id_and_ranges():
    seen = {}

    @jit
    def k(x):
        seen["v"] = nisa.get_nc_version()
        seen["ids"] = (nl.program_id(0), nl.num_programs())
        seen["ranges"] = (
            list(nl.affine_range(3)),
            list(nl.sequential_range(1, 7, 2)),
            list(nl.static_range(2)),
        )
        return store(load(x))

    k(rand(2, 2))
    assert seen["v"] is nisa.nc_version.gen3
    assert seen["ids"] == (0, 1)
    assert seen["ranges"] == ([0, 1, 2], [1, 3, 5], [0, 1])
    with target("trn1"):
        k(rand(2, 2))
    assert seen["v"] is nisa.nc_version.gen2
