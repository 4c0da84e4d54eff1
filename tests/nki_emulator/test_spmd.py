"""SPMD grid launches (``kernel[2]``, LNC=2 on trn2) in the emulator.

Semantics from the NKI 0.3.0 docs and AWS's nki-library kernels: ``kernel[n]`` launches n
programs on the physical cores of one logical NeuronCore (trn2: n <= 2; trn1: n == 1);
``nl.program_id(0)``, ``nl.num_programs(0)`` and ``nl.program_ndim()`` are plain Python ints.
The programs run concurrently on hardware, so the emulator refuses races on shared outputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfmp2.nki_emulator import EmulatorError, _state, jit, simulate, target, trace
from dfmp2.nki_emulator import isa as nisa
from dfmp2.nki_emulator import language as nl

pytestmark = pytest.mark.nki_emulated

ROWS, COLS = 256, 64


def _grid():
    """``(n, pid)`` the way AWS's nki-library kernels read the launch grid."""
    if nl.program_ndim() == 0:
        n, pid = 1, 0
    else:
        n, pid = nl.num_programs(0), nl.program_id(0)
    return n, pid


def _copy_rows(dst, src, r0, r1):
    """DMA ``src[r0:r1]`` -> SBUF -> ``dst[r0:r1]`` in tiles of 128 partitions."""
    for start in range(r0, r1, 128):
        stop = min(start + 128, r1)
        tile = nl.ndarray((stop - start, src.shape[1]), dtype=src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=src[start:stop, :])
        nisa.dma_copy(dst=dst[start:stop, :], src=tile)


@jit
def half_copy_kernel(x):
    """Each program copies its share of the rows of ``x`` into one shared output."""
    n, pid = _grid()
    rows = x.shape[0] // n
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    _copy_rows(out, x, pid * rows, (pid + 1) * rows)
    return out


def _x():
    return np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)


# -- a correct grid launch -----------------------------------------------------------------------
def test_two_programs_each_copy_their_half():
    x = _x()
    with trace() as tr:
        got = half_copy_kernel[2](x)
    np.testing.assert_array_equal(got, x)
    assert tr.kernels == ["half_copy_kernel"]
    assert tr.count("dma_copy", program=0) == 2
    assert tr.count("dma_copy", program=1) == 2
    assert tr.count("dma_copy") == 4
    assert all(r.operands["dst"].shape == (128, COLS) for r in tr.find("dma_copy"))
    # program 0 stores rows 0..127 first, then program 1 rows 128..255
    assert [r.program for r in tr.records] == [0, 0, 1, 1]


def test_plain_call_and_grid_of_one_run_a_single_program():
    x = _x()
    for kernel in (half_copy_kernel, half_copy_kernel[1], half_copy_kernel[(1,)]):
        with trace() as tr:
            got = kernel(x)
        np.testing.assert_array_equal(got, x)
        assert tr.count("dma_copy", program=0) == 4 and tr.count("dma_copy", program=1) == 0


def test_grid_launch_through_simulate_and_torch():
    x = _x()
    np.testing.assert_array_equal(simulate(half_copy_kernel[2])(x), x)
    got = half_copy_kernel[2](torch.from_numpy(x))
    assert isinstance(got, torch.Tensor)
    assert torch.equal(got, torch.from_numpy(x))


def test_indexing_returns_a_new_kernel():
    bound = half_copy_kernel[2]
    assert bound is not half_copy_kernel and bound.grid == 2
    assert half_copy_kernel.grid is None
    assert bound.__name__ == "half_copy_kernel"


# -- program_ndim, num_programs, program_id ------------------------------------------------------
@jit
def grid_report_kernel():
    """Row ``pid`` of the output holds (program_ndim, num_programs, program_id, 7)."""
    n, pid = _grid()
    values = (nl.program_ndim(), nl.num_programs(0), nl.program_id(0), 7)
    tile = nl.ndarray((1, 4), dtype=nl.int32, buffer=nl.sbuf)
    for j in range(4):
        nisa.memset(tile[0:1, j : j + 1], values[j])
    out = nl.ndarray((n, 4), dtype=nl.int32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[pid : pid + 1, :], src=tile)
    return out


@pytest.mark.parametrize(
    "grid, expected",
    [
        (None, [[0, 1, 0, 7]]),
        (1, [[1, 1, 0, 7]]),
        ((1,), [[1, 1, 0, 7]]),
        (2, [[1, 2, 0, 7], [1, 2, 1, 7]]),
        ((2,), [[1, 2, 0, 7], [1, 2, 1, 7]]),
    ],
)
def test_program_ndim_num_programs_and_program_id(grid, expected):
    kernel = grid_report_kernel if grid is None else grid_report_kernel[grid]
    got = kernel()
    assert got.tolist() == expected


def test_program_id_is_a_plain_int_usable_at_trace_time():
    seen = []

    @jit
    def k(x):
        pid = nl.program_id(0)
        seen.append((type(pid), type(nl.num_programs(0)), type(nl.program_ndim())))
        seen.append(f"p{pid}")
        return half_copy_kernel.func(x)

    k[2](_x())
    assert seen == [(int, int, int), "p0", (int, int, int), "p1"]


def test_grid_queries_outside_a_kernel_and_other_axes_raise():
    for query in (nl.program_id, nl.num_programs, nl.program_ndim):
        with pytest.raises(EmulatorError, match="outside an @nki.jit kernel"):
            query()

    @jit
    def k(case):
        if case == "id":
            nl.program_id(1)
        else:
            nl.num_programs((0, 1))

    for case in ("id", "num"):
        with pytest.raises(EmulatorError, match="1-D launch grids only"):
            k[2](case)


# -- grids the target cannot launch --------------------------------------------------------------
def test_grid_of_two_is_refused_on_trn1_at_call_time():
    bound = half_copy_kernel[2]  # indexing is fine; the target is checked at the call
    with target("trn1"), pytest.raises(EmulatorError, match="LNC=1 only"):
        bound(_x())
    np.testing.assert_array_equal(bound(_x()), _x())  # back on trn2
    with target("trn1"):
        np.testing.assert_array_equal(half_copy_kernel[1](_x()), _x())


def test_grid_of_three_is_refused_on_trn2():
    bound = half_copy_kernel[3]
    with pytest.raises(EmulatorError, match="LNC is at most 2"):
        bound(np.ones((384, 4), np.float32))


@pytest.mark.parametrize(
    "grid, match",
    [
        ((2, 2), "1-D launch grids only"),
        ((), "1-D launch grids only"),
        (0, "at least 1"),
        (-1, "at least 1"),
        ((0,), "at least 1"),
        (2.0, "must be a Python int"),
        (True, "must be a Python int"),
        ("2", "must be a Python int"),
    ],
)
def test_malformed_grids_are_refused(grid, match):
    with pytest.raises(EmulatorError, match=match):
        half_copy_kernel[grid]


def test_a_bound_kernel_cannot_be_indexed_again():
    with pytest.raises(EmulatorError, match="already given"):
        half_copy_kernel[2][2]


# -- races and mismatches between programs -------------------------------------------------------
def test_two_programs_writing_the_same_rows_race():
    @jit
    def k(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        _copy_rows(out, x, 0, 256)  # every program copies every row
        return out

    with pytest.raises(
        EmulatorError,
        match=r"race on the shared_hbm tensor .*program 1 of "
        r"kernel\[2\] writes 8192 element\(s\).*program 0 also writes",
    ):
        k[2](_x())
    np.testing.assert_array_equal(k(_x()), _x())  # one program: no race


def test_both_programs_zeroing_a_shared_output_race():
    @jit
    def k():
        out = nl.zeros((4, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        return out

    assert k[1]().tolist() == [[0.0] * 4] * 4
    with pytest.raises(EmulatorError, match="race on the shared_hbm tensor"):
        k[2]()


def test_reading_rows_another_program_wrote_is_refused():
    @jit
    def k(x):
        n, pid = _grid()
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        _copy_rows(out, x, pid * 128, pid * 128 + 128)
        tile = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=out[0:128, :])  # rows program 0 wrote
        return out

    with pytest.raises(
        EmulatorError,
        match=r"program 1 of kernel\[2\] reads 8192 element\(s\) "
        r"of the shared_hbm tensor .* that program 0 wrote",
    ):
        k[2](_x())


def test_a_program_may_read_back_what_it_wrote():
    @jit
    def k(x):
        n, pid = _grid()
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        _copy_rows(out, x, pid * 128, pid * 128 + 128)
        tile = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=out[pid * 128 : pid * 128 + 128, :])
        nisa.dma_copy(dst=out[pid * 128 : pid * 128 + 128, :], src=tile)
        return out

    np.testing.assert_array_equal(k[2](_x()), _x())


def test_private_hbm_scratch_stays_per_program():
    @jit
    def k(x):
        n, pid = _grid()
        scratch = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.private_hbm)
        tile = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x[pid * 128 : pid * 128 + 128, :])
        nisa.dma_copy(dst=scratch, src=tile)  # whole scratch, in both programs
        nisa.dma_copy(dst=tile, src=scratch)
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[pid * 128 : pid * 128 + 128, :], src=tile)
        return out

    np.testing.assert_array_equal(k[2](_x()), _x())


def test_only_program_0_writing_its_half_leaves_never_written_elements():
    @jit
    def k(x):
        n, pid = _grid()
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        if pid == 0:
            _copy_rows(out, x, 0, 128)
        return out

    with pytest.raises(EmulatorError, match=r"has 8192 never-written element\(s\)"):
        k[2](_x())


@pytest.mark.parametrize(
    "case, match",
    [
        ("other_tensor", "every program must return the same shared_hbm tensors"),
        ("other_structure", "every program must return the same shared_hbm tensors"),
        ("other_shape", "does not match program 0's"),
        ("other_dtype", "does not match program 0's"),
        ("extra_allocation", "but program 0 made only 2"),
    ],
)
def test_programs_disagreeing_on_their_outputs_are_refused(case, match):
    @jit
    def k(x):
        n, pid = _grid()
        shape, dtype = x.shape, x.dtype
        if pid == 1 and case == "other_shape":
            shape = (128, x.shape[1])
        if pid == 1 and case == "other_dtype":
            dtype = nl.float16
        a = nl.ndarray(shape, dtype=dtype, buffer=nl.shared_hbm, name="a")
        b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="b")
        _copy_rows(a, x, pid * 128, pid * 128 + 128)
        _copy_rows(b, x, pid * 128, pid * 128 + 128)
        if pid == 1 and case == "extra_allocation":
            nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm, name="c")
        if pid == 1 and case == "other_tensor":
            return b, a
        if pid == 1 and case == "other_structure":
            return (a, b), ()
        return a, b

    with pytest.raises(EmulatorError, match=match):
        k[2](_x())


def test_programs_returning_the_same_tuple_agree():
    @jit
    def k(x):
        n, pid = _grid()
        a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        b = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        _copy_rows(a, x, pid * 128, pid * 128 + 128)
        _copy_rows(b, x, pid * 128, pid * 128 + 128)
        return a, (b,)

    a, (b,) = k[2](_x())
    np.testing.assert_array_equal(a, _x())
    np.testing.assert_array_equal(b, _x())


def test_single_program_outputs_do_not_track_writers():
    seen = []

    @jit
    def k(x):
        out = half_copy_kernel.func(x)
        seen.append(out._alloc.writer)
        return out

    k(_x())
    k[1](_x())
    k[2](_x())
    assert seen[0] is None and seen[1] is None
    assert seen[2] is seen[3] and seen[2].tolist() == [[0] * COLS] * 128 + [[1] * COLS] * 128


# -- per-program resources -----------------------------------------------------------------------
@pytest.mark.parametrize("memsets, ok", [((8, 8), True), ((8, 10), False), ((10, 8), False)])
def test_instruction_bound_applies_per_program(monkeypatch, memsets, ok):
    monkeypatch.setattr(_state, "MAX_INSTRUCTIONS_PER_LAUNCH", 10)

    @jit
    def k():
        n, pid = _grid()
        tile = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.sbuf)
        for _ in range(memsets[pid]):
            nisa.memset(tile, 1.0)
        out = nl.ndarray((256, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[pid * 128 : pid * 128 + 128, :], src=tile)
        return out

    if ok:  # 9 instructions per program, 18 in the launch: above 10 / 2 + 1, below 10 each
        with trace() as tr:
            assert k[2]().min() == 1.0
        assert len(tr.find(program=0)) == len(tr.find(program=1)) == 9
    else:
        bad = memsets.index(10)
        with pytest.raises(
            EmulatorError,
            match=rf"\(program {bad} of kernel\[2\]\) issued more "
            "than 10 instructions",
        ):
            k[2]()


def test_on_chip_budgets_apply_per_program(monkeypatch):
    monkeypatch.setitem(_state.SBUF_BYTES_PER_PARTITION, "trn2", 4096)
    keep = []  # keeps every program's tiles alive to the end of the launch

    @jit
    def k(tiles):
        n, pid = _grid()
        for _ in range(tiles):
            tile = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.sbuf)  # 4096 B each
            acc = nl.ndarray((128, 4096), dtype=nl.float32, buffer=nl.psum)  # all 8 banks
            keep.append((tile, acc))
            nisa.memset(tile, 2.0)
        out = nl.ndarray((256, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out[pid * 128 : pid * 128 + 128, :], src=tile)
        return out

    try:
        assert k[2](1).max() == 2.0  # each program fills its own SBUF and PSUM
        assert len(keep) == 2
        keep.clear()
        with pytest.raises(EmulatorError, match="SBUF budget exceeded"):
            k[2](2)
    finally:
        keep.clear()
