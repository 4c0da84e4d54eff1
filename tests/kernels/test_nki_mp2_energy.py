"""Fused NKI pair sums (``nki_ops.mp2_pair_sums``) against the float64 oracle
``energy.reference_pair_sums``, and the kernels' structure: (ia|jb) stays on chip, each T block
is computed once (the mirrored block in its transposed layout, a TensorE transpose on the
diagonal only), the direct-only kernel of rectangular blocks issues no transposes, the rows run
in a device loop, and blocks of zero weight are not launched."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfmp2.energy import pair_weights, reference_pair_sums
from dfmp2.errors import InputError
from dfmp2.linalg import nki_ops

from ._support import ENERGY_RTOL, ceil_div, launch_instructions, one_core, pair_block
from tolerances import TOL_NKI_BF16X3_REL

#: kind -> (diagonal_block, exchange): a diagonal block I = J with triangular weights; an
#: off-diagonal square block I < J of one space (weights 2) with exchange; a rectangular
#: αβ-like block of two spaces (weights 1) without exchange.
KINDS = {"diagonal": (True, True), "square": (False, True), "rect": (False, False)}
#: (ni, nj, nva, nvb, naux, kind): nocc = 1; ragged nv and naux with several K tiles; a diagonal
#: block of 5 orbitals; nv > 512 (two moving chunks per row tile); nva != nvb with ragged tiles,
#: nvb > 512 (two moving chunks), nva > 512 (five a tiles) against nvb < 128.
CASES = [
    (1, 1, 130, 130, 200, "diagonal"),
    (5, 5, 150, 150, 250, "diagonal"),
    (3, 2, 200, 200, 300, "square"),
    (2, 1, 600, 600, 140, "square"),
    (3, 2, 200, 130, 300, "rect"),
    (2, 3, 130, 600, 140, "rect"),
    (2, 2, 600, 70, 260, "rect"),
]
KERNEL = {True: "mp2_pair_energy_kernel", False: "mp2_pair_direct_kernel"}


def _block(ni, nj, nva, nvb, naux, kind, seed=0):
    """Operands and weights of one case: ``(args, weights, exchange)``."""
    diagonal_block, exchange = KINDS[kind]
    args = pair_block(ni, nj, nva, nvb, naux, diagonal_block, seed, same_space=exchange)
    if diagonal_block:
        weights = pair_weights(0, ni, 0, nj, True)
    else:  # I < J of one space (all 2), or two spaces (all 1)
        weights = pair_weights(0, ni, ni, ni + nj, exchange)
    return args, torch.from_numpy(weights), exchange


def _assert_sums_close(got, args, weights, exchange, rtol=ENERGY_RTOL):
    """``got`` within ``rtol`` of the oracle, relative to the direct sum with |weights| (a
    scale that signed weights cannot cancel)."""
    want = reference_pair_sums(*args, weights, exchange)
    scale = abs(reference_pair_sums(*args, weights.abs(), False)[0])
    assert got.dtype == torch.float64 and got.shape == (2,)
    err = float(np.abs(got.numpy() - want).max())
    assert err <= rtol * scale, f"error {err:.3e} > {rtol:g} * {scale:.3e}"
    if not exchange:
        assert float(got[1]) == 0.0


@pytest.mark.parametrize("ni,nj,nva,nvb,naux,kind", CASES)
def test_pair_sums_match_float64(nki_mode, ni, nj, nva, nvb, naux, kind):
    args, weights, exchange = _block(ni, nj, nva, nvb, naux, kind)
    got = nki_ops.mp2_pair_sums(*args, weights, exchange, mode=nki_mode)
    _assert_sums_close(got, args, weights, exchange)


@pytest.mark.parametrize("nvb,exchange", [(140, True), (140, False), (90, False)],
                         ids=["square-exchange", "square-direct", "rect-direct"])
def test_pair_sums_with_arbitrary_weights(nki_mode, nvb, exchange):
    """Signed, fractional and zero weights (zero pairs inside a launched chunk add nothing)."""
    args = pair_block(4, 3, 140, nvb, 200, False, 3, same_space=exchange)
    weights = torch.from_numpy(np.random.default_rng(4).uniform(-1.0, 2.0, (4, 3)))
    weights[1, 2] = weights[3, 0] = 0.0
    got = nki_ops.mp2_pair_sums(*args, weights, exchange, mode=nki_mode)
    _assert_sums_close(got, args, weights, exchange)


@pytest.mark.parametrize("ni,nj,nvb,kind", [(5, 5, 140, "diagonal"), (5, 3, 90, "rect")])
def test_pair_sums_over_several_launches(nki_mode, monkeypatch, ni, nj, nvb, kind):
    """Pairs split over launches (blocks of <= 4 columns), rows past a block's last weight
    skipped."""
    monkeypatch.setattr(nki_ops, "MAX_PAIRS_PER_CALL", 4)
    args, weights, exchange = _block(ni, nj, 140, nvb, 130, kind, seed=7)
    got = nki_ops.mp2_pair_sums(*args, weights, exchange, mode=nki_mode)
    _assert_sums_close(got, args, weights, exchange)


@pytest.mark.parametrize("ni,nj,nva,nvb,naux,kind", CASES)
@pytest.mark.nki_emulated
def test_pair_sums_structure(emulator_trace, monkeypatch, ni, nj, nva, nvb, naux, kind):
    """One launch over the whole block (bounds lifted): the instruction count the host budgets
    launches with, exactly; one GEMM's worth of matmuls per pair; T never leaves the chip."""
    monkeypatch.setattr(nki_ops, "MAX_PAIRS_PER_CALL", 1000)
    monkeypatch.setattr(nki_ops, "MAX_ENERGY_INSTRUCTIONS_PER_CALL", 10 ** 6)
    args, weights, exchange = _block(ni, nj, nva, nvb, naux, kind)
    with emulator_trace() as tr:
        nki_ops.mp2_pair_sums(*args, weights, exchange, mode="emulator")
    pairs = ni * nj
    n_at, n_bc, n_kt = ceil_div(nva, 128), ceil_div(nvb, 512), ceil_div(naux, 128)
    assert tr.kernels == [KERNEL[exchange]]
    # trn2 (the emulator's default): kernel[2], each program its share of the pairs
    assert len(tr.records) == launch_instructions(ni, nj, nva, nvb, naux, n_at, exchange)
    transposes = tr.find("nc_transpose")
    tile_pairs = n_at * (n_at + 1) // 2
    if exchange:  # T[ta, tb] and T[tb, ta] once each per tile pair ta <= tb: n_at^2 tiles
        assert tr.count("nc_matmul") == pairs * n_at * n_at * n_kt
        # the exchange partners T_ba: off the diagonal the mirrored tile is formed transposed,
        # so one TensorE transpose per diagonal tile only
        assert len(transposes) == pairs * n_at
        assert all(r.engine == "tensor" and r.operands["dst"].buffer == "psum" for r in transposes)
        # no ragged stationary off the diagonal: the ragged last tile is stationary n_kt times
        ragged = [r for r in tr.find("nc_matmul") if r.operands["stationary"].shape[1] < 128]
        assert len(ragged) == (pairs * n_kt if nva % 128 else 0)
        assert tr.count("reciprocal") == pairs * tile_pairs
        width = 3 * pairs * n_at * n_at
    else:  # the direct kernel neither transposes nor reduces an exchange term
        n_bt = ceil_div(nvb, 128)
        assert tr.count("nc_matmul") == pairs * n_at * n_bt * n_kt
        assert transposes == []
        # a ragged last a tile is formed transposed (B_j's b tiles stationary): no stationary
        # is narrower than 128 but nvb's own last tile, once per pair and K tile there
        ragged = [r for r in tr.find("nc_matmul") if r.operands["stationary"].shape[1] < 128]
        assert len(ragged) == (pairs * n_kt if nva % 128 and nvb % 128 else 0)
        epilogues = pairs * (nva // 128 * n_bc + (n_bt if nva % 128 else 0))
        assert tr.count("tensor_reduce") == tr.count("reciprocal") == epilogues
        width = epilogues
    # the only store to HBM is the small block of partial sums: no (ia|jb) tile leaves the chip
    stores = tr.dma_stores()  # one per row, each program storing its own rows
    assert len(stores) == ni and all(r.operands["dst"].shape == (128, width // ni)
                                     for r in stores)
    assert sorted({r.program for r in stores}) == list(range(2 if ni >= 2 else 1))
    assert tr.bytes_moved() - sum(r.nbytes for r in tr.dma_loads()) == 128 * width * 4
    # VectorE reciprocal of the denominators (no ScalarE approximation); the ScalarE runs only
    # the identity: the denominators' add and, exchange kernel, the PSUM evacuation
    activations = tr.find("activation")
    assert activations and all(r.attrs["op"] == "nl.copy" and r.engine == "scalar"
                               for r in activations)
    assert len(activations) == tr.count("reciprocal") + len(transposes)


@pytest.mark.parametrize("ni,nj,nva,nvb,naux,kind", [CASES[1], CASES[3], CASES[4], CASES[6]])
@pytest.mark.nki_emulated
def test_split_precision_products_match_float64(emulator_trace, monkeypatch, ni, nj, nva, nvb,
                                                naux, kind):
    """bf16x3: B split on the host into bfloat16 high and low parts, three bfloat16 matmuls per
    K tile (hi*hi, hi*lo, lo*hi) into one float32 PSUM tile, two panel DMAs where fp32 has one;
    within TOL_NKI_BF16X3_REL of float64."""
    monkeypatch.setattr(nki_ops, "MAX_PAIRS_PER_CALL", 1000)
    monkeypatch.setattr(nki_ops, "MAX_ENERGY_INSTRUCTIONS_PER_CALL", 10 ** 6)
    args, weights, exchange = _block(ni, nj, nva, nvb, naux, kind)
    with emulator_trace() as tr:
        got = nki_ops.mp2_pair_sums(*args, weights, exchange, mode="emulator", products="bf16x3")
    _assert_sums_close(got, args, weights, exchange, TOL_NKI_BF16X3_REL)
    n_at, n_kt = ceil_div(nva, 128), ceil_div(naux, 128)
    gemm = n_at * n_at * n_kt if exchange else n_at * ceil_div(nvb, 128) * n_kt
    matmuls = tr.find("nc_matmul")
    assert len(matmuls) == 3 * ni * nj * gemm
    assert all(r.operands["stationary"].dtype == r.operands["moving"].dtype == "bfloat16"
               and r.operands["dst"].dtype == "float32" for r in matmuls)
    assert len(tr.records) == launch_instructions(ni, nj, nva, nvb, naux, n_at, exchange, True)
    with pytest.raises(InputError, match="bf16x9"):
        nki_ops.mp2_pair_sums(*args, weights, exchange, mode="emulator", products="bf16x9")


def _oracle_one_pair(args, exchange):
    """fp64 ``[direct, exchange]`` of a single pair from one dense GEMM (the float64 oracle
    ``reference_pair_sums`` is slower at these sizes)."""
    ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb = (x.numpy() for x in args)
    t_ab = ovL_i[0] @ ovL_j[0].T
    d_ab = eps_i[0] + eps_j[0] - eps_va[:, None] - eps_vb[None, :]
    w_ab = t_ab / d_ab
    return np.array([(w_ab * t_ab).sum(), (w_ab * t_ab.T).sum() if exchange else 0.0])


@pytest.mark.parametrize("nva,nvb,exchange", [(2000, 2000, True), (2000, 2000, False),
                                              (300, 2000, False)],
                         ids=["exchange", "direct", "rect-direct"])
def test_pair_sums_at_nvir_2000_and_naux_8000(nki_mode, nva, nvb, exchange):
    """The issue's bound, one pair: no SBUF-resident operand strip, no fallback; the exchange
    kernel runs a window of a tiles per launch, both stream the auxiliary index in chunks."""
    naux = 8000
    args = pair_block(1, 1, nva, nvb, naux, False, 11, same_space=exchange)
    weights = torch.ones((1, 1), dtype=torch.float64)
    assert nki_ops.SUPPORTS["mp2_pair_sums"](*args, weights, exchange) is None
    got = nki_ops.mp2_pair_sums(*args, weights, exchange, mode=nki_mode).numpy()
    want = _oracle_one_pair(args, exchange)
    assert np.abs(got - want).max() <= ENERGY_RTOL * abs(want[0])


@pytest.mark.parametrize("products", ["fp32", "bf16x3"])
@pytest.mark.parametrize("chunked", [False, True], ids=["panel", "streamed"])
@pytest.mark.parametrize("kind", ["diagonal", "square", "rect"])
@pytest.mark.nki_emulated
def test_windows_and_aux_chunks_add_up(emulator_trace, monkeypatch, kind, chunked, products):
    """Small bounds force what large molecules need: several a-tile windows per pair (the
    exchange kernel's later windows see only their own and later columns; tiles beyond a window
    load their strips once for all its rows) and, streamed, several K chunks per contraction
    (PSUM keeps accumulating across chunk loads)."""
    import sys

    monkeypatch.setattr(nki_ops, "MAX_ENERGY_INSTRUCTIONS_PER_CALL", 35 if kind == "rect" else 150)
    if chunked:
        monkeypatch.setattr(nki_ops, "ENERGY_K_TILES", 2)
        nki_ops.nki_runtime.prepare("emulator")
        kernels = sys.modules[nki_ops.nki_runtime.load_kernel(
            "mp2_energy", "mp2_pair_energy_kernel").__module__]
        monkeypatch.setattr(kernels, "ENERGY_K_TILES", 2)
    ni, nj, nva, nvb = (2, 2, 400, 400) if kind != "rect" else (2, 2, 400, 150)
    args, weights, exchange = _block(ni, nj, nva, nvb, 600, kind, seed=12)
    split = products == "bf16x3"
    if split:  # three products per K tile: twice the bound keeps windows of the same size
        monkeypatch.setattr(nki_ops, "MAX_ENERGY_INSTRUCTIONS_PER_CALL",
                            2 * nki_ops.MAX_ENERGY_INSTRUCTIONS_PER_CALL)
    window = nki_ops._energy_launch_plan(nva, nvb, 600, exchange, split)[1]
    assert 0 < window < ceil_div(nva, 128)
    with emulator_trace() as tr:
        got = nki_ops.mp2_pair_sums(*args, weights, exchange, mode="emulator", products=products,
                                    device=one_core())
    _assert_sums_close(got, args, weights, exchange, TOL_NKI_BF16X3_REL if split else ENERGY_RTOL)
    # one column per launch, its device loop over the rows up to its last weight
    rows = [int(np.flatnonzero(weights[:, j]).max()) + 1 for j in range(nj)]
    pairs_run = sum(rows)
    windows = ceil_div(ceil_div(nva, 128), window)
    assert len(tr.kernels) == nj * windows
    n_at, n_kt = ceil_div(nva, 128), ceil_div(600, 128)
    per_pair = n_at * n_at * n_kt if exchange else n_at * ceil_div(nvb, 128) * n_kt
    # windows and chunks add no work (bf16x3: three products per K tile)
    assert tr.count("nc_matmul") == pairs_run * per_pair * (3 if split else 1)
    # the instruction count the host plans with, launch by launch (all rows executed)
    assert len(tr.records) == sum(
        nki_ops._energy_instructions(nr, 1, nva - w0 * 128 if exchange else
                                     min(nva, (w0 + window) * 128) - w0 * 128, nvb, 600,
                                     ceil_div(min(nva, (w0 + window) * 128) - w0 * 128, 128),
                                     exchange, split)
        for w0 in range(0, n_at, window) for nr in rows)


@pytest.mark.nki_emulated
def test_pair_sums_launch_count(emulator_trace, monkeypatch):
    """One persistent launch per block of columns, its device loop over every row up to the
    block's last weighted one: the rows do not multiply the launches."""
    monkeypatch.setattr(nki_ops, "MAX_PAIRS_PER_CALL", 4)
    args, weights, exchange = _block(5, 5, 140, 140, 130, "diagonal", seed=7)
    with emulator_trace() as tr:
        nki_ops.mp2_pair_sums(*args, weights, exchange, mode="emulator", device=one_core())
    # columns {0..3} with rows 0..3, column {4} with rows 0..4
    assert tr.kernels == ["mp2_pair_energy_kernel"] * 2
    assert tr.count("nc_matmul") == (4 * 4 + 5 * 1) * 2 * 2 * 2  # pairs * n_at^2 * n_kt
    body = nki_ops._energy_instructions(1, 4, 140, 140, 130, 2, True)
    static = [r for r in tr.records if r.static]
    assert len(static) == body + nki_ops._energy_instructions(1, 1, 140, 140, 130, 2, True)


@pytest.mark.nki_emulated
def test_zero_weight_blocks_are_not_launched(emulator_trace, monkeypatch):
    """A block of columns with no weight is skipped, and a launch's rows run from its first
    to its last weighted row only."""
    monkeypatch.setattr(nki_ops, "MAX_PAIRS_PER_CALL", 2)
    args = pair_block(4, 4, 140, 90, 130, False, 8)
    weights = torch.zeros((4, 4), dtype=torch.float64)
    weights[1, 0] = weights[2, 1] = 1.0  # columns 0-1, rows 1-2; columns 2-3 carry no weight
    with emulator_trace() as tr:
        got = nki_ops.mp2_pair_sums(*args, weights, False, mode="emulator", device=one_core())
    assert tr.kernels == ["mp2_pair_direct_kernel"]
    assert tr.count("nc_matmul") == 2 * 2 * (2 * 1 * 2)  # 2 rows x 2 columns, 2x1 tiles, 2 K
    _assert_sums_close(got, args, weights, False)
    with emulator_trace() as tr:
        got = nki_ops.mp2_pair_sums(*args, torch.zeros((4, 4), dtype=torch.float64), False,
                                    mode="emulator")
    assert tr.kernels == [] and got.tolist() == [0.0, 0.0]


@pytest.mark.nki_emulated
def test_pair_sums_reject_inconsistent_shapes():
    ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb = pair_block(2, 3, 10, 8, 7, False, 0)
    weights = torch.ones((2, 3), dtype=torch.float64)
    with pytest.raises(InputError, match=r"eps_va must have shape \(10,\)"):
        nki_ops.mp2_pair_sums(ovL_i, ovL_j, eps_i, eps_j, eps_va[:9], eps_vb, weights, False,
                              mode="emulator")
    with pytest.raises(InputError, match=r"weights must have shape \(2, 3\)"):
        nki_ops.mp2_pair_sums(ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights.T, False,
                              mode="emulator")
    with pytest.raises(InputError, match="exchange sum needs nvir_i == nvir_j, got 10 and 8"):
        nki_ops.mp2_pair_sums(ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights, True,
                              mode="emulator")
    # the exchange kernel pairs orbitals of one space: a second set of virtual energies is
    # refused by the op and named by its shape check (the dispatcher then runs it on the host)
    two_spaces = (ovL_i, ovL_i, eps_i, eps_i, eps_va, eps_va + 0.1,
                  torch.ones((2, 2), dtype=torch.float64), True)
    with pytest.raises(InputError, match="one virtual space"):
        nki_ops.mp2_pair_sums(*two_spaces, mode="emulator")
    assert "one virtual space" in nki_ops.SUPPORTS["mp2_pair_sums"](*two_spaces)
    one_space = two_spaces[:5] + (eps_va.clone(),) + two_spaces[6:]
    assert nki_ops.SUPPORTS["mp2_pair_sums"](*one_space) is None


@pytest.mark.nki_emulated
def test_pair_sums_supports_any_size_up_to_the_issue_bound_and_names_a_limit_beyond():
    check = nki_ops.SUPPORTS["mp2_pair_sums"]
    for nv, naux in ((448, 1536), (672, 2304), (1200, 5000), (2000, 8000)):
        block = torch.zeros(1).expand(4, nv, naux)
        rect = torch.zeros(1).expand(4, nv // 3, naux)
        assert check(block, block, None, None, None, None, None, True) is None
        assert check(block, block, None, None, None, None, None, False) is None
        assert check(block, rect, None, None, None, None, None, False) is None
        assert check(rect, block, None, None, None, None, None, False) is None
    # one pair and one a tile of a 2000-virtual space need more than one launch's trace
    beyond = torch.zeros(1).expand(1, 2000, 40000)
    reason = check(beyond, beyond, None, None, None, None, None, True)
    assert "mp2_pair_energy_kernel" in reason and "one pair and one a tile" in reason


@pytest.mark.parametrize("nva,nvb,naux,exchange", [
    (150, 150, 300, True), (600, 70, 260, False), (130, 600, 140, False),
    (150, 150, 3300, True), (130, 600, 2200, False)])
@pytest.mark.nki_emulated
def test_sbuf_estimate_bounds_the_emulated_peak(emulator_trace, monkeypatch, nva, nvb, naux,
                                                exchange):
    """The host's SBUF estimate is at least what the emulator holds live (its conservative
    liveness model: a tile counts until its last Python reference goes), one K chunk or
    several."""
    from dfmp2.nki_emulator import _context

    peak = [0]
    register = _context.KernelRun.register

    def tracked(run, alloc):
        register(run, alloc)
        peak[0] = max(peak[0], run.usage.sbuf_bytes)

    monkeypatch.setattr(_context.KernelRun, "register", tracked)
    monkeypatch.setattr(nki_ops, "MAX_ENERGY_INSTRUCTIONS_PER_CALL", 10 ** 6)
    args = pair_block(2, 3, nva, nvb, naux, False, 9, same_space=exchange)
    with emulator_trace() as tr:
        nki_ops.mp2_pair_sums(*args, torch.ones((2, 3), dtype=torch.float64), exchange,
                              mode="emulator")
    assert len(tr.kernels) == 1
    n_at = ceil_div(nva, 128)
    assert 0 < peak[0] <= nki_ops._energy_sbuf_words(nva, nvb, naux, 6, n_at, exchange) * 4


@pytest.mark.parametrize("nva,nvb,naux,exchange", [
    (448, 448, 1536, True), (448, 448, 1536, False), (672, 672, 2304, True),
    (672, 672, 2304, False), (96, 700, 4000, False), (700, 96, 4000, False),
    (2000, 2000, 8000, True), (2000, 2000, 8000, False), (2000, 300, 8000, False)])
@pytest.mark.nki_emulated
def test_launch_plan_keeps_every_launch_within_its_bounds(nva, nvb, naux, exchange):
    """Every launch's compiled body (one row of the device loop, all its columns) within the
    instruction bound and its SBUF within the budget, whatever the number of rows."""
    cols, window = nki_ops._energy_launch_plan(nva, nvb, naux, exchange)
    assert 1 <= cols <= nki_ops.MAX_PAIRS_PER_CALL and window >= 1
    n_at = ceil_div(nva, 128)
    if (nva, naux) == (672, 2304):  # a window of a tiles, and still several columns per launch
        assert cols > 1 and window < n_at
    for w0 in range(0, n_at, window):  # the exchange kernel sees the columns from w0 on
        rows = min(nva, (w0 + window) * 128) - w0 * 128
        rest = nva - w0 * 128 if exchange else rows
        n_wt = ceil_div(rows, 128)
        assert nki_ops._energy_instructions(1, cols, rest, nvb, naux, n_wt, exchange) <= (
            nki_ops.MAX_ENERGY_INSTRUCTIONS_PER_CALL)
        assert nki_ops._energy_sbuf_words(rest, nvb, naux, cols, n_wt, exchange) * 4 <= (
            nki_ops.ENERGY_SBUF_BUDGET)


@pytest.mark.nki_emulated
def test_bf16x3_beyond_its_launch_bound_is_named_not_raised():
    """Three matmuls per K tile fill a launch sooner: where the fp32 kernel still fits, the
    bf16x3 one is refused by SUPPORTS with its reason (the registry then falls back visibly),
    and the op itself names the bound instead of a bare message."""
    check = nki_ops.SUPPORTS["mp2_pair_sums"]
    block = torch.zeros(1).expand(1, 2000, 10500)
    assert check(block, block, None, None, None, None, None, True) is None
    reason = check(block, block, None, None, None, None, None, True, products="bf16x3")
    assert "bf16x3" in reason and "one pair and one a tile" in reason


@pytest.mark.nki_emulated
def test_row_range_spans_the_weighted_rows():
    weights = np.zeros((6, 3))
    assert nki_ops._row_range(weights) is None
    weights[2, 0] = weights[4, 2] = 1.0
    assert nki_ops._row_range(weights) == (2, 5)
    assert nki_ops._row_range(np.triu(np.ones((5, 5)))[:, 3:5]) == (0, 5)


@pytest.mark.nki_emulated
def test_b_chunks_are_double_buffered(emulator_trace):
    """The direct kernel's b chunks stream through two SBUF slots: each chunk's DMA is issued
    one step ahead, before the matmuls of the chunk before it (the next pair's first chunk
    too), and every chunk is still loaded once per pair."""
    args, weights, _exchange = _block(1, 2, 130, 600, 140, "rect", seed=3)
    with emulator_trace() as tr:
        got = nki_ops.mp2_pair_sums(*args, weights, False, mode="emulator", device=one_core())
    _assert_sums_close(got, args, weights, False)
    order = [(r.instruction, r.operands["src"].shape[1] if r.instruction == "dma_copy"
              and len(r.operands["src"].shape) == 4 else None) for r in tr.records]
    chunks = [k for k, (name, tiles) in enumerate(order) if name == "dma_copy" and tiles in (4, 1)]
    matmuls = [k for k, (name, _t) in enumerate(order) if name == "nc_matmul"]
    # two pairs x (a 4-tile and a 1-tile chunk); the a panel is 2 tiles wide
    assert [order[k][1] for k in chunks] == [4, 1, 4, 1]
    first_chunk_matmuls = matmuls[: 2 * 4 * 2]  # 2 a tiles x 4 b tiles x 2 K tiles
    assert chunks[1] < first_chunk_matmuls[0]  # chunk 1 in flight while chunk 0 is used
    # the next pair's first chunk is loaded before the last chunk of this pair is multiplied
    assert chunks[2] < matmuls[2 * 4 * 2]
