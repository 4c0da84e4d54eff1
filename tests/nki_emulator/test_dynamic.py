"""Dynamic loops, virtual registers and ``.ap`` dynamic DMA in the emulator.

Spec: the NKI 0.3.0 docs (aws-neuron-sdk at 65c21355d97095de19c5c7b7c6cd21ba6fecd020):

- ``nki/deep-dives/nki-dynamic-loops.rst``: ``nl.dynamic_range`` "emits a **hardware loop
  instruction** on the device. The loop body is not unrolled"; "The compiled artifact size does
  **not** grow with the trip count"; "The loop variable is a device register, not a Python
  ``int``. You cannot use it in host-side Python expressions (e.g., ``if i == 0:``)"; the step
  "**Must** be a compile-time positive integer. Passing a ``VirtualRegister`` raises an
  ``AssertionError``"; "Tensors allocated inside the loop body are allocated once and reused
  across iterations";
- ``nki/deep-dives/nki-aps.rst``: ``ap(pattern, offset=0, scalar_offset=None,
  vector_offset=None, indirect_dim=0, dtype=None)``; the access starts at element
  ``offset + scalar_offset * prod(A.shape[indirect_dim+1:])`` of the base tensor; its
  ``scalar_dynamic_dma`` example;
- ``nki/get-started/nki-language-guide.rst``: the induction variable of a ``dynamic_range`` loop
  "is frozen: you cannot write to it with ``register_move`` or ``register_load``";
- ``nki/api/nki/isa/__init__.py``: ``register_alloc(x=None)``, ``register_load(dst, src)``,
  ``register_move(dst, src)``, ``register_store(dst, src)``.
"""

from __future__ import annotations

import operator

import numpy as np
import pytest

from dfmp2 import nki_model
from dfmp2.nki_emulator import EmulatorError, _state, jit, trace
from dfmp2.nki_emulator import isa as nisa
from dfmp2.nki_emulator import language as nl

pytestmark = pytest.mark.nki_emulated

RNG = np.random.default_rng(11)


def _static(tr):
    return sum(r.static for r in tr.records)


# -- the docs' examples --------------------------------------------------------------------------
@jit
def scalar_dynamic_dma(A):
    """nki-aps.rst, "Scalar Dynamic Access", as written there (without its
    ``assert A.shape == [512, 512]``: shapes are tuples)."""
    # Assume input A is of shape (4*128, 512). We want to copy from A[3*128:, 0:256]
    # The 3*128 offset comes from a dynamic variable in SBUF
    batch_idx = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
    nisa.memset(batch_idx, value=3 * 128)

    result = nl.ndarray((128, 256), A.dtype, buffer=nl.shared_hbm)

    nisa.dma_copy(
        src=A.ap(pattern=[[512, 128], [1, 256]], offset=0, scalar_offset=batch_idx, indirect_dim=0),
        dst=result[...],
    )

    return result


def test_the_docs_scalar_dynamic_dma_example():
    """"the access starts from: ``0 + batch_idx * 512``" with batch_idx = 384 (its row 384 of
    the (512, 512) input): the result is A[384:512, 0:256]."""
    a = RNG.standard_normal((512, 512)).astype(np.float32)
    with trace() as tr:
        got = scalar_dynamic_dma(a)
    np.testing.assert_array_equal(got, a[384:512, 0:256])
    (dma,) = tr.find("dma_copy")
    assert dma.operands["src"].shape == (128, 256) and dma.operands["src"].buffer == "shared_hbm"
    assert dma.nbytes == 128 * 256 * 4 and dma.attrs["src_bytes"] == 128 * 256 * 4
    assert dma.attrs["run_bytes"] == 256 * 4  # the innermost pair [1, 256]: 256 contiguous


def test_memset_writes_an_int_into_an_int32_tile():
    @jit
    def k():
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(t, value=3 * 128)
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    got = k()
    assert got.dtype == np.int32 and got.tolist() == [[384]]


@jit
def dynamic_add_two(input_tensor):
    """nki-dynamic-loops.rst, "Runtime trip count from a ``VirtualRegister``", as written."""
    out_tensor = nl.ndarray(input_tensor.shape, input_tensor.dtype, buffer=nl.shared_hbm)
    start = nisa.register_alloc(0)
    stop = nisa.register_alloc(512)
    for i in nl.dynamic_range(start, stop, 128):
        tile = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        result = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(src=input_tensor.ap([[512, 128], [1, 512]], scalar_offset=i), dst=tile)
        nisa.tensor_scalar(dst=result, data=tile, op0=nl.add, operand0=2.0)
        nisa.dma_copy(src=result, dst=out_tensor.ap([[512, 128], [1, 512]], scalar_offset=i))
    return out_tensor


def test_the_docs_dynamic_loop_example():
    """The loop runs for i = 0, 128, 256, 384; with indirect_dim 0 the offset is i * 512
    elements, i.e. rows i..i+127. Four iterations of a three-instruction body are executed,
    but the compiled stream holds the two register_alloc and one copy of the body."""
    x = RNG.standard_normal((512, 512)).astype(np.float32)
    with trace() as tr:
        got = dynamic_add_two(x)
    np.testing.assert_array_equal(got, x + np.float32(2.0))
    body = ["dma_copy", "tensor_scalar", "dma_copy"]
    assert [r.instruction for r in tr.records] == ["register_alloc"] * 2 + body * 4
    assert [r.static for r in tr.records] == [True] * 5 + [False] * 9
    assert _static(tr) == 2 + 3 and len(tr.records) == 2 + 4 * 3
    assert [r.engine for r in tr.find("register_alloc")] == ["sync", "sync"]


@pytest.mark.parametrize("bound, ok", [(5, True), (4, False)])
def test_the_instruction_bound_counts_the_static_stream(monkeypatch, bound, ok):
    """The bound applies to the 5 static instructions, not the 14 executed ones."""
    monkeypatch.setattr(_state, "MAX_INSTRUCTIONS_PER_LAUNCH", bound)
    x = np.zeros((512, 512), np.float32)
    if ok:
        assert dynamic_add_two(x).min() == 2.0
    else:
        with pytest.raises(EmulatorError, match="more than 4 instructions in one launch"):
            dynamic_add_two(x)


def _counting_kernel(dynamic: bool):
    """A loop of ``n`` iterations with a 3-instruction body writing row i of the output:
    register_store (dynamic) or memset (static) of i, an add of 0.5, a one-element store
    through .ap (scalar_offset=i dynamic, offset=i static)."""

    @jit
    def k(n):
        out = nl.ndarray((n, 1), nl.float32, buffer=nl.shared_hbm)
        loop = nl.dynamic_range if dynamic else nl.static_range
        for i in loop(n):
            tile = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
            res = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
            if dynamic:
                nisa.register_store(tile, i)
                dst = out.ap([[1, 1], [1, 1]], scalar_offset=i)
            else:
                nisa.memset(tile, i)
                dst = out.ap([[1, 1], [1, 1]], offset=i)
            nisa.tensor_scalar(dst=res, data=tile, op0=nl.add, operand0=0.5)
            nisa.dma_copy(dst=dst, src=res)
        return out

    return k


def test_ten_thousand_dynamic_iterations_fit_a_bound_that_static_range_breaks(monkeypatch):
    monkeypatch.setattr(_state, "MAX_INSTRUCTIONS_PER_LAUNCH", 100)
    n = 10000
    with trace() as tr:
        got = _counting_kernel(True)(n)
    np.testing.assert_array_equal(got[:, 0], np.arange(n, dtype=np.float32) + 0.5)
    assert len(tr.records) == 3 * n and _static(tr) == 3
    assert _counting_kernel(False)(30)[29, 0] == 29.5  # 90 static instructions: fits
    with pytest.raises(EmulatorError, match="more than 100 instructions in one launch"):
        _counting_kernel(False)(n)


# -- static counting: nesting, break, exceptions, zero trips -------------------------------------
def _memset_kernel(body):
    @jit
    def k():
        t = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        body(t)
        out = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    return k


def _trace_of(body):
    with trace() as tr:
        _memset_kernel(body)()
    return tr


def test_nested_dynamic_loops_count_one_body():
    def body(t):
        for _i in nl.dynamic_range(3):
            for _j in nl.dynamic_range(4):
                nisa.memset(t, 1.0)

    tr = _trace_of(body)
    assert tr.count("memset") == 12
    assert [r.static for r in tr.find("memset")] == [True] + [False] * 11
    assert _static(tr) == 2  # one memset and the store


def test_static_loops_unroll_inside_and_around_a_dynamic_loop():
    def body(t):
        for _s in nl.static_range(2):  # two copies of the dynamic loop
            for _i in nl.dynamic_range(5):
                for _u in nl.static_range(3):  # three memsets in the body
                    nisa.memset(t, 1.0)

    tr = _trace_of(body)
    assert tr.count("memset") == 2 * 5 * 3
    assert sum(r.static for r in tr.find("memset")) == 2 * 3


def test_a_break_or_an_exception_leaves_no_loop_behind():
    def body(t):
        seen = 0
        for _i in nl.dynamic_range(5):
            seen += 1
            if seen == 3:
                break
            nisa.memset(t, 1.0)
        nisa.memset(t, 2.0)  # after the loop: static again
        try:
            for _i in nl.dynamic_range(5):
                seen += 1
                if seen == 5:
                    raise ValueError("stop")
        except ValueError:
            pass
        nisa.memset(t, 3.0)

    tr = _trace_of(body)
    assert [r.static for r in tr.find("memset")] == [True, False, True, True]


def test_a_zero_trip_loop_runs_and_counts_nothing():
    def body(t):
        nisa.memset(t, 1.0)
        for _i in nl.dynamic_range(4, 4):
            nisa.memset(t, 2.0)
        for _i in nl.dynamic_range(nisa.register_alloc(0)):
            nisa.memset(t, 2.0)

    tr = _trace_of(body)
    assert tr.count("memset") == 1 and _static(tr) == 3  # memset, register_alloc, store


def test_a_dynamic_body_allocates_once_against_the_sbuf_budget(monkeypatch):
    """A tile of more than half the usable SBUF allocated in a loop body: the dynamic loop
    reuses one allocation ("allocated once and reused across iterations") for 100 iterations;
    unrolled (static_range), the next iteration's tile is allocated while the previous one is
    still bound, and the budget refuses it."""
    monkeypatch.setitem(_state.SBUF_BYTES_PER_PARTITION, "trn2", 4096)

    def kernel(loop):
        @jit
        def k():
            acc = nl.ndarray((128, 1), nl.float32, buffer=nl.sbuf)
            nisa.memset(acc, 0.0)
            for _i in loop(100):
                big = nl.ndarray((128, 600), nl.float32, buffer=nl.sbuf)  # 2400 B of 4096
                nisa.memset(big, 1.0)
                nisa.tensor_tensor(dst=acc, data1=acc, data2=big[:, 0:1], op=nl.add)
            out = nl.ndarray((128, 1), nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=acc)
            return out

        return k

    assert kernel(nl.dynamic_range)().tolist() == [[100.0]] * 128
    with pytest.raises(EmulatorError, match="SBUF budget exceeded"):
        kernel(nl.static_range)()


# -- .ap on a tile-major 5-D HBM tensor ----------------------------------------------------------
def test_five_d_tile_major_input_read_per_orbital_through_ap():
    """b (128, n, t, k, 128): partition p of B's tile (i, tile, kk) at b[p, i, tile, kk, :].
    The pattern's first pair [n*t*k*128, 128] walks the 128 rows of b's first axis (its stride
    is prod(shape[1:])); scalar_offset=i on indirect_dim=1 adds i * t*k*128; offset t0*k*128
    selects the first tile. The read equals the static slice b[:, i, t0:t0+t_sel] for every
    i, with the same DMA record (bytes and contiguous run) as that slice."""
    n, t, k, t0, t_sel = 3, 4, 2, 1, 2
    b = RNG.standard_normal((128, n, t, k, 128)).astype(np.float32)
    free = t_sel * k * 128

    @jit
    def gather(b, dynamic):
        out = nl.ndarray((n, 128, free), nl.float32, buffer=nl.shared_hbm)
        if dynamic:
            for i in nl.dynamic_range(n):
                tile = nl.ndarray((128, t_sel, k, 128), nl.float32, buffer=nl.sbuf)
                src = b.ap(
                    [[n * t * k * 128, 128], [k * 128, t_sel], [128, k], [1, 128]],
                    offset=t0 * k * 128,
                    scalar_offset=i,
                    indirect_dim=1,
                )
                nisa.dma_copy(dst=tile, src=src)
                dst = out.ap([[free, 128], [1, free]], scalar_offset=i, indirect_dim=0)
                nisa.dma_copy(dst=dst, src=tile)
        else:
            for i in nl.static_range(n):
                tile = nl.ndarray((128, t_sel, k, 128), nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=tile, src=b[:, i, t0 : t0 + t_sel, :, :])
                nisa.dma_copy(dst=out[i], src=tile)
        return out

    with trace() as tr:
        got = gather(b, True)
    for i in range(n):
        np.testing.assert_array_equal(got[i], b[:, i, t0 : t0 + t_sel].reshape(128, free))
    assert len(tr.records) == 2 * n and _static(tr) == 2
    with trace() as ref:
        np.testing.assert_array_equal(gather(b, False), got)

    def describe(records):
        return [(r.nbytes, r.attrs["src_bytes"], r.attrs["run_bytes"]) for r in records]

    assert describe(tr.dma_loads()) == describe(ref.dma_loads())
    assert describe(tr.dma_loads())[0] == (128 * free * 4, 128 * free * 4, free * 4)
    assert tr.dma_loads()[0].operands["src"].shape == (128, t_sel, k, 128)


def test_strided_pattern_runs_are_one_element():
    """A pattern whose innermost step is not 1 moves one element per contiguous run."""

    @jit
    def k(a):
        tile = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=a.ap([[16, 4], [2, 8]], offset=1))
        out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=tile)
        return out

    a = np.arange(64, dtype=np.float32).reshape(4, 16)
    with trace() as tr:
        np.testing.assert_array_equal(k(a), a[:, 1::2])
    assert tr.dma_loads()[0].attrs["run_bytes"] == 4


# -- writing per-iteration results through .ap ---------------------------------------------------
N_ROWS, C = 4, 16


def _row_kernel(first, stop, *, read_back=False):
    """Program p of a grid writes 2 * x[i] into out[i] for i in dynamic_range(first(p), stop(p))
    through .ap([[C, 128], [1, C]], scalar_offset=i, indirect_dim=0) on (n, 128, C) tensors."""

    @jit
    def k(x):
        pid = nl.program_id(0)
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        if read_back:
            tile = nl.ndarray((128, C), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile, src=out.ap([[C, 128], [1, C]]))
        for i in nl.dynamic_range(first(pid), stop(pid)):
            tile = nl.ndarray((128, C), nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile, src=x.ap([[C, 128], [1, C]], scalar_offset=i, indirect_dim=0))
            nisa.tensor_scalar(dst=tile, data=tile, op0=nl.multiply, operand0=2.0)
            nisa.dma_copy(dst=out.ap([[C, 128], [1, C]], scalar_offset=i, indirect_dim=0), src=tile)
        return out

    return k


def _rows():
    return RNG.standard_normal((N_ROWS, 128, C)).astype(np.float32)


def test_every_row_written_through_ap():
    x = _rows()
    np.testing.assert_array_equal(_row_kernel(lambda p: 0, lambda p: N_ROWS)(x), 2 * x)


def test_an_out_of_bounds_scalar_offset_raises():
    x = _rows()
    with pytest.raises(EmulatorError, match=r"reaches flat element 8192, outside") as err:
        _row_kernel(lambda p: 0, lambda p: N_ROWS + 1)(x)
    message = str(err.value)
    assert ".ap(pattern=[[16, 128], [1, 16]], offset=0, scalar_offset=..." in message
    assert "argument 'x'" in message and "(4, 128, 16) ([0, 8192), 2048 element(s)" in message
    assert "scalar_offset value 4 x 2048 elements" in message


def test_never_written_rows_are_still_caught():
    x = _rows()
    with pytest.raises(EmulatorError, match=r"2048 never-written element\(s\)"):
        _row_kernel(lambda p: 0, lambda p: N_ROWS - 1)(x)
    with pytest.raises(EmulatorError, match="reads 2048 of 2048 never-written"):
        _row_kernel(lambda p: 0, lambda p: N_ROWS, read_back=True)(x)


def test_spmd_programs_writing_their_own_rows_through_ap_and_a_race():
    x = _rows()
    half = N_ROWS // 2
    own = _row_kernel(lambda p: p * half, lambda p: (p + 1) * half)
    np.testing.assert_array_equal(own[2](x), 2 * x)
    both = _row_kernel(lambda p: 0, lambda p: N_ROWS)
    with pytest.raises(EmulatorError, match="race on the shared_hbm tensor"):
        both[2](x)


# -- VirtualRegister misuse ----------------------------------------------------------------------
MISUSES = {
    "if i == 0": lambda i, b: 1 if i == 0 else 0,
    "i + 1": lambda i, b: i + 1,
    "1 + i": lambda i, b: 1 + i,
    "i * 2": lambda i, b: i * 2,
    "i < 3": lambda i, b: i < 3,
    "int(i)": lambda i, b: int(i),
    "float(i)": lambda i, b: float(i),
    "bool(i)": lambda i, b: bool(i),
    "index(i)": lambda i, b: operator.index(i),
    "range(i)": lambda i, b: range(i),
    "b[0:128, i]": lambda i, b: b[0:128, i],
    "b[i:4]": lambda i, b: b[i:4, :],
    "b[i:i+1]": lambda i, b: b[i : i + 1, :],
    "nl.ds(i, 1)": lambda i, b: b[nl.ds(i, 1), :],
    "operand0=i": lambda i, b: nisa.tensor_scalar(
        dst=b, data=b, op0=nl.add, operand0=i
    ),
}


@pytest.mark.parametrize("case", list(MISUSES))
def test_the_loop_variable_in_a_python_expression_raises(case):
    use = MISUSES[case]

    @jit
    def k(x):
        b = nl.ndarray((128, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=b, src=x)
        for i in nl.dynamic_range(2):
            use(i, b)
        out = nl.ndarray((128, 4), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=b)
        return out

    with pytest.raises(EmulatorError, match=r"device register.*\.ap\(|\.ap\(.*scalar_offset=reg"):
        k(np.zeros((128, 4), np.float32))


def test_a_register_hashes_by_identity_and_repr_hides_its_value():
    @jit
    def k():
        r = nisa.register_alloc(123456789)
        seen = {r: 1}
        assert seen[r] == 1 and "123456789" not in repr(r)
        assert f"{r}" == repr(r)
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        nisa.register_store(out, r)
        return out

    assert k().tolist() == [[123456789]]


@pytest.mark.parametrize("instruction", ["register_move", "register_load"])
def test_the_induction_variable_is_frozen(instruction):
    @jit
    def k():
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(t, 1)
        for i in nl.dynamic_range(2):
            if instruction == "register_move":
                nisa.register_move(i, 5)
            else:
                nisa.register_load(i, t)
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    with pytest.raises(EmulatorError, match="induction variable .* frozen"):
        k()


@pytest.mark.parametrize("step", ["register", 0, -1, 1.0, True])
def test_dynamic_range_step_must_be_a_positive_int(step):
    @jit
    def k():
        s = nisa.register_alloc(1) if step == "register" else step
        for _i in nl.dynamic_range(0, 4, s):
            pass
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        nisa.register_store(out, nisa.register_alloc(0))
        return out

    with pytest.raises(AssertionError, match="step must be a compile-time positive int"):
        k()


def test_dynamic_range_outside_a_kernel_and_with_bad_bounds_raise():
    with pytest.raises(EmulatorError, match="outside an @nki.jit kernel"):
        nl.dynamic_range(4)

    @jit
    def k(bound):
        for _i in nl.dynamic_range(bound):
            pass

    with pytest.raises(TypeError, match="stop must be an int or a VirtualRegister"):
        k(4.0)


# -- registers -----------------------------------------------------------------------------------
def test_register_alloc_move_load_store_round_trip():
    @jit
    def k(five):
        seven = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(seven, 7)
        a = nisa.register_alloc()
        nisa.register_load(a, seven)  # from SBUF
        b = nisa.register_alloc(0)
        nisa.register_move(b, a)  # register to register
        c = nisa.register_alloc(None)
        nisa.register_load(c, five)  # from HBM, shape (1,)
        d = nisa.register_alloc()
        nisa.register_move(d, -3)  # immediate
        tile = nl.ndarray((1, 3), nl.int32, buffer=nl.sbuf)
        nisa.register_store(tile[0:1, 0:1], b)
        nisa.register_store(tile[0:1, 1:2], c)
        nisa.register_store(tile[0:1, 2:3], d)
        out = nl.ndarray((1, 3), nl.int32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=tile)
        return out

    with trace() as tr:
        got = k(np.array([5], np.int32))
    assert got.tolist() == [[7, 5, -3]]
    registers = [r for r in tr.records if r.instruction.startswith("register_")]
    assert len(registers) == 11 and all(r.engine == "sync" and r.static for r in registers)
    model = nki_model.model_records(tr.records, nki_model.TARGETS["trn2"])
    assert model["instructions"] == len(tr.records)


def test_register_errors():
    def run(body):
        @jit
        def k():
            t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
            body(t)
            nisa.memset(t, 0)
            out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out, src=t)
            return out

        return k()

    with pytest.raises(EmulatorError, match="never-written"):
        run(lambda t: nisa.register_load(nisa.register_alloc(), t))
    with pytest.raises(EmulatorError, match="uninitialised VirtualRegister"):
        run(lambda t: nisa.register_store(t, nisa.register_alloc()))
    with pytest.raises(EmulatorError, match="uninitialised VirtualRegister"):
        run(lambda t: nisa.register_move(nisa.register_alloc(), nisa.register_alloc()))

    def float_source(t):
        f = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(f, 1.0)
        nisa.register_load(nisa.register_alloc(), f)

    with pytest.raises(EmulatorError, match="registers hold integers"):
        run(float_source)

    def two_elements(t):
        f = nl.ndarray((1, 2), nl.int32, buffer=nl.sbuf)
        nisa.memset(f, 1)
        nisa.register_load(nisa.register_alloc(), f)

    with pytest.raises(EmulatorError, match="exactly one element"):
        run(two_elements)
    with pytest.raises(EmulatorError, match="does not fit a 32-bit register"):
        run(lambda t: nisa.register_alloc(2**32))

    def too_big_for_int8(t):
        small = nl.ndarray((1, 1), nl.int8, buffer=nl.sbuf)
        nisa.register_store(small, nisa.register_alloc(300))

    with pytest.raises(EmulatorError, match="does not fit dst"):
        run(too_big_for_int8)


def test_dynamic_range_with_register_bounds_runs_the_register_count():
    """``count`` loaded from an input tensor (a trip count unknown at compile time) bounds the
    loop; an SBUF accumulator allocated before the loop carries the sum across iterations."""

    @jit
    def k(count):
        n = nisa.register_alloc()
        nisa.register_load(n, count)
        acc = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(acc, 0.0)
        for _i in nl.dynamic_range(n):
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=1.0)
        begin = nisa.register_alloc(0)
        end = nisa.register_alloc(4)
        for _i in nl.dynamic_range(begin, end, 2):  # the docs' start/stop/step example
            nisa.tensor_scalar(dst=acc, data=acc, op0=nl.add, operand0=100.0)
        out = nl.ndarray((1, 1), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=acc)
        return out

    for count in (0, 1, 5):
        with trace() as tr:
            got = k(np.array([[count]], np.int32))
        assert got.tolist() == [[count + 200.0]]
        adds = tr.find("tensor_scalar")
        assert len(adds) == count + 2
        assert sum(r.static for r in adds) == min(count, 1) + 1


# -- .ap restrictions ----------------------------------------------------------------------------
def _ap_case(case):
    @jit
    def k(a):
        sb = nl.ndarray((4, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=a)
        pattern = [[8, 4], [1, 8]]
        if case == "sbuf":
            sb.ap(pattern)
        elif case == "vector_offset":
            idx = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
            nisa.memset(idx, 0)
            a.ap(pattern, vector_offset=idx, indirect_dim=0)
        elif case == "dtype":
            a.ap(pattern, dtype=nl.bfloat16)
        elif case == "own dtype":
            nisa.dma_copy(dst=sb, src=a.ap(pattern, dtype=nl.float32))
        elif case == "sliced":
            a[0:2, :].ap([[8, 2], [1, 8]])
        elif case == "nested":
            a.ap(pattern).ap(pattern)
        elif case == "tensor_copy":
            nisa.tensor_copy(dst=sb, src=a.ap(pattern))
        elif case == "operand":
            nisa.tensor_scalar(dst=sb, data=sb, op0=nl.add, operand0=a.ap(pattern))
        elif case == "indirect_dim":
            a.ap(pattern, scalar_offset=nisa.register_alloc(0), indirect_dim=2)
        elif case == "float offset tile":
            f = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
            a.ap(pattern, scalar_offset=f)
        elif case == "unwritten offset tile":
            idx = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
            nisa.dma_copy(dst=sb, src=a.ap(pattern, scalar_offset=idx))
        elif case == "negative":
            nisa.dma_copy(dst=sb, src=a.ap(pattern, offset=-1))
        elif case == "duplicate writes":
            out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
            nisa.dma_copy(dst=out.ap([[0, 4], [1, 8]]), src=sb)
        elif case == "register offset":
            a.ap(pattern, offset=nisa.register_alloc(1))
        elif case == "input":
            nisa.dma_copy(dst=a.ap(pattern), src=sb)
        out = nl.ndarray((4, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    return k(np.arange(32, dtype=np.float32).reshape(4, 8))


@pytest.mark.parametrize(
    "case, match",
    [
        ("sbuf", "not emulated for on-chip tensors"),
        ("vector_offset", "vector_offset .* is not emulated"),
        ("dtype", "dtype=nl.bfloat16 .* is not emulated"),
        ("sliced", "already indexed tensor"),
        ("nested", "already indexed tensor"),
        ("tensor_copy", "only as nisa.dma_copy src or dst"),
        ("operand", "only as nisa.dma_copy src or dst"),
        ("indirect_dim", "indirect_dim=2 is not a dimension"),
        ("float offset tile", "SBUF \\(1, 1\\) integer tensor"),
        ("unwritten offset tile", "scalar_offset reads 1 of 1 never-written"),
        ("negative", "reaches flat element -1"),
        ("duplicate writes", "selects some elements more than once"),
        ("register offset", "compile-time int; a VirtualRegister offset goes in scalar_offset"),
        ("input", "kernel input"),
    ],
)
def test_ap_restrictions(case, match):
    with pytest.raises(EmulatorError, match=match):
        _ap_case(case)


def test_ap_with_the_tensors_own_dtype_and_on_a_reshaped_whole_tensor():
    np.testing.assert_array_equal(
        _ap_case("own dtype"), np.arange(32, dtype=np.float32).reshape(4, 8)
    )

    @jit
    def k(a):
        flat = a.reshape((32,))
        tile = nl.ndarray((2, 8), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=flat.ap([[8, 2], [1, 8]], offset=16))
        out = nl.ndarray((2, 8), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=tile)
        return out

    a = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(k(a), a[2:4])
