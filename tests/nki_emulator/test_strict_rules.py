"""The emulator's stricter rules (issue 14, point 6): each documented rule the emulator used to
accept now raises, with a negative test beside a case the rule allows. Sources: the Trainium/
Inferentia2 and Trainium2 architecture guides and the 0.3.0 ``nki.isa`` stubs (aws-neuron-sdk at
65c21355d97095de19c5c7b7c6cd21ba6fecd020); the instruction bound is the emulator's assumption
(no limit is documented), the usable SBUF an implementation constant (KLR)."""

from __future__ import annotations

import numpy as np
import pytest

from dfmp2.nki_emulator import EmulatorError, _state, jit, target
from dfmp2.nki_emulator import isa as nisa
from dfmp2.nki_emulator import language as nl

from tolerances import TOL_EMU_ELEMENTWISE_REL, TOL_EMU_FP32_REL, TOL_EMU_MATMUL_ABS

pytestmark = pytest.mark.nki_emulated


def _out(t):
    out = nl.ndarray(t.shape, dtype=t.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def _sbuf(p, f, dtype=nl.float32):
    return nl.ndarray((p, f), dtype=dtype, buffer=nl.sbuf)


# -- the start-partition ("quadrant") rule of the compute engines --------------------------------
@pytest.mark.parametrize("rows,ok", [
    ((0, 128), True), ((64, 128), True), ((32, 64), True), ((96, 128), True), ((0, 4), True),
    ((4, 8), False), ((32, 96), False), ((64, 100), True), ((16, 48), False), ((1, 128), False)])
def test_compute_operands_start_where_their_partition_count_allows(rows, ok):
    r0, r1 = rows

    @jit
    def k():
        t = _sbuf(128, 8)
        nisa.memset(t, 0.0)
        nisa.memset(t[r0:r1, 0:8], 1.0)
        return _out(t)

    if ok:
        assert k()[r0:r1].min() == 1.0
    else:
        with pytest.raises(EmulatorError, match="start-partition rule"):
            k()


def test_dma_endpoints_are_not_held_to_the_compute_rule():
    @jit
    def k(x):
        t = _sbuf(128, 8)
        nisa.memset(t, 0.0)
        nisa.dma_copy(dst=t[4:8, 0:8], src=x)
        return _out(t)

    x = np.ones((4, 8), np.float32)
    assert k(x)[4:8].min() == 1.0


# -- an instruction-count bound per launch ------------------------------------------------------
def test_a_launch_past_the_instruction_bound_is_refused(monkeypatch):
    monkeypatch.setattr(_state, "MAX_INSTRUCTIONS_PER_LAUNCH", 10)

    @jit
    def k(n):
        t = _sbuf(128, 8)
        for _ in nl.static_range(n):
            nisa.memset(t, 0.0)
        return _out(t)

    k(9)  # nine memsets and the store: ten instructions
    with pytest.raises(EmulatorError, match="more than 10 instructions in one launch"):
        k(10)


# -- dma_copy's descriptor-generation modes -----------------------------------------------------
def _dma(dge_mode, engine):
    @jit
    def k(x):
        t = _sbuf(4, 8)
        nisa.dma_copy(dst=t, src=x, dge_mode=dge_mode, engine=engine)
        return _out(t)

    return k(np.ones((4, 8), np.float32))


def test_dma_engine_needs_hwdge_and_hwdge_needs_gen3():
    assert _dma(nisa.dge_mode.hwdge, nisa.engine.sync).sum() == 32  # trn2 (the default)
    with pytest.raises(EmulatorError, match="needs dge_mode=nisa.dge_mode.hwdge"):
        _dma(nisa.dge_mode.unknown, nisa.engine.sync)
    with target("trn1"), pytest.raises(EmulatorError, match="hwdge exists from gen3"):
        _dma(nisa.dge_mode.hwdge, nisa.engine.unknown)
    with target("trn1"):
        assert _dma(nisa.dge_mode.unknown, nisa.engine.unknown).sum() == 32


# -- ScalarE reciprocal and GpSimd tensor_scalar ------------------------------------------------
def _reciprocal(with_bias):
    @jit
    def k(x, col):
        t, b, out = _sbuf(8, 16), _sbuf(8, 1), _sbuf(8, 16)
        nisa.dma_copy(dst=t, src=x)
        nisa.dma_copy(dst=b, src=col)
        nisa.activation(out, nl.reciprocal, t, bias=b if with_bias else None)
        return _out(out)

    return k(np.full((8, 16), 2.0, np.float32), np.ones((8, 1), np.float32))


def test_activation_reciprocal_takes_no_bias_on_gen2():
    np.testing.assert_allclose(_reciprocal(True), 1.0 / 3.0, rtol=TOL_EMU_ELEMENTWISE_REL)
    with target("trn1"):
        np.testing.assert_allclose(_reciprocal(False), 0.5)
        with pytest.raises(EmulatorError, match="takes no bias on gen2"):
            _reciprocal(True)


@pytest.mark.parametrize("op,ok", [(nl.rsqrt, True), (nl.multiply, False), (nl.add, False)])
def test_gpsimd_tensor_scalar_computes_only_rsqrt(op, ok):
    @jit
    def k(x):
        t, out = _sbuf(8, 16), _sbuf(8, 16)
        nisa.dma_copy(dst=t, src=x)
        if op is nl.rsqrt:
            nisa.tensor_scalar(out, t, op0=nl.rsqrt, operand0=0.0, engine=nisa.engine.gpsimd)
        else:
            nisa.tensor_scalar(out, t, op0=op, operand0=2.0, engine=nisa.engine.gpsimd)
        return _out(out)

    x = np.full((8, 16), 4.0, np.float32)
    if ok:
        assert k(x).shape == (8, 16)
    else:
        with pytest.raises(EmulatorError, match="only rsqrt"):
            k(x)


# -- TensorE on gen2: float32 transposes, 64-row tiling -----------------------------------------
def _transpose(dtype):
    @jit
    def k(x):
        t = _sbuf(16, 32, dtype)
        nisa.dma_copy(dst=t, src=x)
        tt = nl.ndarray((32, 16), dtype=dtype, buffer=nl.psum)
        nisa.nc_transpose(dst=tt, data=t, engine=nisa.engine.tensor)
        out = _sbuf(32, 16, dtype)
        nisa.tensor_copy(dst=out, src=tt)
        return _out(out)

    return k(np.arange(16 * 32, dtype=np.float32).reshape(16, 32))


def test_gen2_tensor_engine_transposes_float32_only():
    np.testing.assert_array_equal(_transpose(nl.bfloat16).shape, (32, 16))  # trn2
    with target("trn1"):
        assert _transpose(nl.float32)[3, 5] == 5 * 32 + 3
        with pytest.raises(EmulatorError, match="float32 PSUM only"):
            _transpose(nl.bfloat16)


def _tiled(tile_size):
    @jit
    def k(a, b):
        sa, sb = _sbuf(32, 32), _sbuf(32, 16)
        nisa.dma_copy(dst=sa, src=a)
        nisa.dma_copy(dst=sb, src=b)
        res = nl.ndarray((32, 16), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(res, sa, sb, accumulate=False, tile_position=(0, 0), tile_size=tile_size)
        out = _sbuf(32, 16)
        nisa.tensor_copy(dst=out, src=res)
        return _out(out)

    rng = np.random.default_rng(0)
    a = rng.standard_normal((32, 32)).astype(np.float32)
    b = rng.standard_normal((32, 16)).astype(np.float32)
    return k(a, b), a.T @ b


def test_gen2_tiles_the_pe_array_by_64_only():
    got, want = _tiled((32, 32))  # trn2: 4x 32 rows and columns
    np.testing.assert_allclose(got, want, rtol=TOL_EMU_FP32_REL, atol=TOL_EMU_MATMUL_ABS)
    with target("trn1"):
        got, want = _tiled((64, 64))
        np.testing.assert_allclose(got, want, rtol=TOL_EMU_FP32_REL, atol=TOL_EMU_MATMUL_ABS)
        with pytest.raises(EmulatorError, match="2x 64 rows or columns only"):
            _tiled((32, 128))
