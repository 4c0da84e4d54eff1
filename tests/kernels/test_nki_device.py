"""The run's NKI device (``nki_runtime.NkiDevice``): what crosses between host and device, B kept
on the device for the pair stage, operands kept for the transform and fit, and the pair work
split over SPMD programs (trn2's LNC=2) and NeuronCores (trn1's two)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfmp2.energy import pair_weights
from dfmp2.errors import InputError
from dfmp2.linalg import nki_ops, nki_runtime
from dfmp2.pipeline import TensorB

from ._support import pair_block
from tolerances import TOL_NKI_GEMM_ABS, TOL_SUM_ORDER_REL

pytestmark = pytest.mark.nki_emulated


@pytest.fixture
def emulator(emulator_trace):
    """The emulator installed for one test; yields its module (targets, trace)."""
    from dfmp2 import nki_emulator

    yield nki_emulator


def _store(nocc, nvir, naux, seed=0):
    rng = np.random.default_rng(seed)
    return TensorB(torch.from_numpy(rng.standard_normal((nocc, nvir, naux)) * 0.05))


def _eps(nocc, nvir, seed=1):
    rng = np.random.default_rng(seed)
    return (torch.from_numpy(np.sort(rng.uniform(-1.5, -0.3, nocc))),
            torch.from_numpy(np.sort(rng.uniform(0.1, 3.0, nvir))))


def _closed_shell_sums(stores, e_o, e_v, device, occ_block):
    """The closed-shell pair stage of ``pipeline.pair_energies``: blocks I <= J, summed."""
    store = stores[0]
    total = np.zeros(2)
    for i0 in range(0, store.nocc, occ_block):
        i1 = min(store.nocc, i0 + occ_block)
        for j0 in range(i0, store.nocc, occ_block):
            j1 = min(store.nocc, j0 + occ_block)
            ovl_i = store.read_b(i0, i1)
            ovl_j = ovl_i if i0 == j0 else store.read_b(j0, j1)
            weights = torch.from_numpy(pair_weights(i0, i1, j0, j1, True))
            total += nki_ops.mp2_pair_sums(ovl_i, ovl_j, e_o[i0:i1], e_o[j0:j1], e_v, e_v,
                                           weights, True, mode="emulator",
                                           device=device).numpy()
    return total


def test_targets_set_programs_cores_and_memory(emulator):
    trn1 = nki_runtime.NkiDevice("emulator", "trn1")
    trn2 = nki_runtime.NkiDevice("emulator", "trn2")
    assert (trn1.lnc, trn1.cores) == (1, 2) and (trn2.lnc, trn2.cores) == (2, 1)
    assert trn1.resident_budget == 16 * 2**30 and trn2.resident_budget == 12 * 2**30
    with emulator.target("trn1"):
        assert nki_runtime.NkiDevice("emulator").target == "trn1"
    assert nki_runtime.NkiDevice("simulator").lnc == 1  # unknown hardware: one program
    with pytest.raises(InputError, match="trn3"):
        nki_runtime.NkiDevice("emulator", "trn3")
    with pytest.raises(InputError, match="simulator"):
        nki_ops.gemm(torch.eye(2), torch.eye(2), mode="simulator", device=trn1)


@pytest.mark.parametrize("product, want", [
    ("trn1.32xlarge", "trn1"), ("trn1n.32xlarge", "trn1"), ("trn1.2xlarge", "trn1"),
    ("trn2.48xlarge", "trn2"), ("trn2u.48xlarge", "trn2"),
    ("inf2.xlarge", None), ("trn10.big", None), ("Standard PC (Q35 + ICH9, 2009)", None)])
def test_hardware_target_is_read_from_the_instance_type(tmp_path, product, want):
    path = tmp_path / "product_name"
    path.write_text(product + "\n")
    target, how = nki_runtime.detect_target(str(path))
    assert target == want
    assert (how == f"instance type {product}") if want else ("give --nki-target" in how)


def test_hardware_target_unknown_without_the_dmi_file(tmp_path, monkeypatch):
    target, how = nki_runtime.detect_target(str(tmp_path / "missing"))
    assert target is None and "cannot read" in how and "--nki-target" in how
    path = tmp_path / "product_name"
    path.write_text("trn2.48xlarge")
    monkeypatch.setattr(nki_runtime, "DMI_PRODUCT_NAME", str(path))
    monkeypatch.setattr(nki_runtime.detect_target, "__defaults__", (str(path),))
    device = nki_runtime.NkiDevice("hardware")  # nothing launched: no XLA device needed
    assert (device.target, device.lnc, device.target_source) == ("trn2", 2,
                                                                 "instance type trn2.48xlarge")
    given = nki_runtime.NkiDevice("hardware", "trn1")
    # one process, one XLA device: trn1's second core is another rank's, and so is its memory
    assert (given.target, given.cores, given.target_source) == ("trn1", 1, "option")
    assert given.resident_budget == nki_runtime.NkiDevice("emulator", "trn1").resident_budget // 2
    simulated = nki_runtime.NkiDevice("simulator")
    assert simulated.target is None and "--nki-target" in simulated.as_dict()["target_source"]


def test_emulator_launches_follow_the_device_target(emulator):
    """A device made for trn2 runs ``kernel[2]`` while the emulator's own setting is trn1 (the
    launch runs under the device's target), and leaves that setting as it was."""
    args = pair_block(2, 2, 130, 130, 140, False, 4, same_space=True)
    weights = torch.full((2, 2), 2.0, dtype=torch.float64)
    with emulator.target("trn1"):
        device = nki_runtime.NkiDevice("emulator", "trn2")
        nki_ops.mp2_pair_sums(*args, weights, True, mode="emulator", device=device)
        assert emulator.get_target() == "trn1"
    assert device.ledger.programs == 2 * device.ledger.launches


def test_a_launch_counts_what_it_moves(emulator):
    device = nki_runtime.NkiDevice("emulator")
    nki_runtime.prepare("emulator")
    kernel = nki_runtime.load_kernel("gemm", "gemm_kernel")
    a_km = np.ones((128, 128), dtype=np.float32)
    b_kn = np.ones((128, 256), dtype=np.float32)
    on_device = device.upload(a_km)
    (c_mn,) = device.launch(kernel, (on_device, b_kn))
    assert np.array_equal(c_mn, np.full((128, 256), 128.0, dtype=np.float32))
    ledger = device.ledger
    assert ledger.uploaded_bytes == a_km.nbytes + b_kn.nbytes  # a once at upload, b per launch
    assert ledger.resident_bytes == a_km.nbytes
    (_again,) = device.launch(kernel, (on_device, b_kn))
    assert ledger.uploaded_bytes == a_km.nbytes + 2 * b_kn.nbytes
    assert ledger.downloaded_bytes == 2 * c_mn.nbytes
    assert (ledger.launches, ledger.programs, ledger.core_launches) == (2, 2, [2])
    with pytest.raises(InputError, match="3 programs"):
        device.launch(kernel, (on_device, b_kn), grid=3)
    with pytest.raises(InputError, match="float32"):
        device.launch(kernel, (on_device, b_kn.astype(np.float64)))


@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_b_is_uploaded_once_for_the_pair_stage(emulator, monkeypatch, target):
    """Blocks of 2 orbitals read from a store placed on the device: every launch takes its B
    slices from the device copy (no B bytes per launch), which is uploaded once, and the sums
    equal those of host blocks uploaded launch by launch."""
    nocc, nvir, naux = 5, 150, 200
    store = _store(nocc, nvir, naux)
    e_o, e_v = _eps(nocc, nvir)
    with emulator.target(target):
        host_device = nki_runtime.NkiDevice("emulator")
        want = _closed_shell_sums([store], e_o, e_v, host_device, 2)
        device = nki_runtime.NkiDevice("emulator")
        placed, why_not = nki_ops.place_b([store], device)
        assert why_not is None and isinstance(placed[0], nki_ops.ResidentB)
        b_bytes = nki_ops.resident_b_bytes(nocc, nvir, naux)
        assert device.ledger.uploaded_bytes == device.ledger.resident_bytes == b_bytes
        launched = []
        real_launch = device.launch

        def spy(kernel, args, grid=1, core=0):
            launched.append(args)
            return real_launch(kernel, args, grid, core)

        monkeypatch.setattr(device, "launch", spy)
        got = _closed_shell_sums(placed, e_o, e_v, device, 2)
    assert np.abs(got - want).max() <= TOL_SUM_ORDER_REL * abs(want[0])  # the same launches' partials
    assert launched and all(isinstance(a, nki_runtime.DeviceArray) for args in launched
                            for a in args[:2])
    per_launch = sum(a.nbytes for args in launched for a in args[2:])
    assert device.ledger.uploaded_bytes == b_bytes + per_launch
    assert host_device.ledger.uploaded_bytes > device.ledger.uploaded_bytes


def test_bf16x3_b_crosses_and_stays_as_bfloat16(emulator, monkeypatch):
    """The bf16x3 split of B travels and stays on the device as two bfloat16 parts (the bytes
    of one float32 layout, half of what float32 parts took), placed or uploaded per launch, and
    the sums on placed B equal those of host blocks."""
    nocc, nvir, naux = 4, 140, 150
    store = _store(nocc, nvir, naux, seed=5)
    e_o, e_v = _eps(nocc, nvir, seed=6)
    b_bytes = nki_ops.resident_b_bytes(nocc, nvir, naux, "bf16x3")
    assert b_bytes == nki_ops.resident_b_bytes(nocc, nvir, naux)
    weights = torch.from_numpy(pair_weights(0, nocc, 0, nocc, True))
    args = (store.read_b(0, nocc), store.read_b(0, nocc), e_o, e_o, e_v, e_v, weights, True)
    launched = []
    host_device = nki_runtime.NkiDevice("emulator")
    real_host = host_device.launch

    def spy(kernel, launch_args, grid=1, core=0):
        launched.append(launch_args)
        return real_host(kernel, launch_args, grid, core)

    monkeypatch.setattr(host_device, "launch", spy)
    want = nki_ops.mp2_pair_sums(*args, products="bf16x3", mode="emulator", device=host_device)
    b_args = [a for la in launched for a in la[:2]]
    assert all(a.dtype == torch.bfloat16 and a.shape[0] == 2 for a in b_args)
    device = nki_runtime.NkiDevice("emulator")
    placed, why_not = nki_ops.place_b([store], device, "bf16x3")
    assert why_not is None and placed[0].array.dtype == "bfloat16"
    assert device.ledger.uploaded_bytes == device.ledger.resident_bytes == b_bytes
    block = placed[0].read_b(0, nocc)
    got = nki_ops.mp2_pair_sums(block, block, *args[2:], products="bf16x3", mode="emulator",
                                device=device)
    assert np.abs(got.numpy() - want.numpy()).max() <= TOL_SUM_ORDER_REL * abs(float(want[0]))
    with pytest.raises(InputError, match="placed on the device for bf16x3"):
        nki_ops.mp2_pair_sums(block, block, *args[2:], mode="emulator", device=device)
    with pytest.raises(InputError, match="bfloat16 device array"):
        device.write(placed[0].array, (0,), np.zeros((1,), dtype=np.float32))
    with pytest.raises(InputError, match="float64"):
        device.upload(torch.zeros(3, dtype=torch.float64))


def test_b_over_the_device_budget_stays_on_the_host(emulator):
    store = _store(3, 130, 140)
    device = nki_runtime.NkiDevice("emulator")
    device.resident_budget = nki_ops.resident_b_bytes(3, 130, 140) - 1
    placed, why_not = nki_ops.place_b([store, None], device)
    assert placed == [store, None] and "over the" in why_not
    assert device.ledger.uploaded_bytes == 0
    device.resident_budget = 2**40
    assert nki_ops.place_b([store], device, in_memory=False)[1].startswith("B is out of core")
    assert nki_ops.place_b([None], device)[1] == "no orbitals to pair"
    huge = TensorB(torch.zeros((1, 2000, 40000)))  # beyond one launch of the exchange kernel
    assert "refuse" in nki_ops.place_b([huge], device)[1]


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "direct"])
def test_spmd_programs_share_the_pairs(emulator_trace, exchange):
    """trn2 (LNC=2): every launch of >= 2 rows is ``kernel[2]``; the programs take contiguous
    halves of the rows, each issues exactly its counted instructions, and the sums equal a
    trn1 run (one program per launch, launches taking the two NeuronCores in turn)."""
    from dfmp2 import nki_emulator

    ni, nj, nva, nvb, naux = 3, 3, 140, 140 if exchange else 90, 150
    args = pair_block(ni, nj, nva, nvb, naux, False, 5, same_space=exchange)
    weights = torch.from_numpy(pair_weights(0, ni, ni, ni + nj, exchange))
    with nki_emulator.target("trn1"):
        trn1 = nki_runtime.NkiDevice("emulator")
        want = nki_ops.mp2_pair_sums(*args, weights, exchange, mode="emulator", device=trn1)
    trn2 = nki_runtime.NkiDevice("emulator", "trn2")
    with emulator_trace() as tr:
        got = nki_ops.mp2_pair_sums(*args, weights, exchange, mode="emulator", device=trn2)
    assert np.abs(got.numpy() - want.numpy()).max() <= TOL_SUM_ORDER_REL * abs(float(want[0]))
    assert trn2.ledger.launches == 1 and trn2.ledger.programs == 2
    assert trn2.ledger.program_pairs == [6, 3]  # 3 rows: 2 and 1, each with 3 columns
    n_at = -(-nva // 128)
    for program in (0, 1):
        issued = [r for r in tr.records if r.program == program]
        assert len(issued) == nki_ops._energy_instructions(
            ni, nj, nva, nvb, naux, n_at, exchange, programs=2, program=program)
        assert any(r.instruction == "nc_matmul" for r in issued)
    assert sum(trn1.ledger.program_pairs) == ni * nj
    assert trn1.ledger.core_launches == [1, 0]


def test_trn1_spreads_launches_over_both_cores(emulator, monkeypatch):
    monkeypatch.setattr(nki_ops, "MAX_PAIRS_PER_CALL", 2)
    args = pair_block(4, 4, 130, 130, 140, False, 9, same_space=True)
    weights = torch.full((4, 4), 2.0, dtype=torch.float64)
    with emulator.target("trn1"):
        device = nki_runtime.NkiDevice("emulator")
        nki_ops.mp2_pair_sums(*args, weights, True, mode="emulator", device=device)
    assert device.ledger.core_launches == [1, 1]  # two blocks of two columns, all rows each
    assert device.ledger.program_pairs == [8, 8]


def test_kept_operands_are_uploaded_once_and_follow_changes(emulator):
    """The fit's L^{-T} pattern: a kept matrix (and its views) uploaded on first use, reused by
    later products, uploaded again after an in-place change."""
    rng = np.random.default_rng(3)
    u = torch.from_numpy(np.triu(rng.standard_normal((200, 200))))
    rows = torch.from_numpy(rng.standard_normal((150, 200)))
    device = nki_runtime.NkiDevice("emulator")
    device.keep(u)
    got = nki_ops.trmm(u, rows.clone(), mode="emulator", device=device)
    assert torch.allclose(got, rows @ u, atol=TOL_NKI_GEMM_ABS * 20)
    kept = device.ledger.resident_bytes
    assert kept > 0
    nki_ops.trmm(u, rows.clone(), mode="emulator", device=device)
    assert device.ledger.resident_bytes == kept  # the second product reuses the device copies
    u.mul_(2.0)
    got = nki_ops.trmm(u, rows.clone(), mode="emulator", device=device)
    assert torch.allclose(got, rows @ u, atol=TOL_NKI_GEMM_ABS * 40)
    assert device.ledger.resident_bytes == kept  # the stale copies dropped
    assert device.ledger.uploaded_bytes > 2 * kept  # uploaded again
    device.release(u)
    assert device.ledger.resident_bytes == 0
    other = torch.from_numpy(rng.standard_normal((200, 64)))
    before = device.ledger.resident_bytes
    nki_ops.gemm(rows, other, mode="emulator", device=device)  # nothing kept: per launch
    assert device.ledger.resident_bytes == before


def test_trn1_sends_each_block_with_all_its_windows_to_one_core(emulator, monkeypatch):
    """Several a-tile windows per block: the blocks, not the launches, alternate cores, so
    both cores work however many windows a block has."""
    monkeypatch.setattr(nki_ops, "MAX_PAIRS_PER_CALL", 1)
    monkeypatch.setattr(nki_ops, "MAX_ENERGY_INSTRUCTIONS_PER_CALL", 150)
    args = pair_block(2, 2, 400, 400, 600, False, 4, same_space=True)
    weights = torch.full((2, 2), 2.0, dtype=torch.float64)
    window = nki_ops._energy_launch_plan(400, 400, 600, True)[1]
    assert window < 4
    with emulator.target("trn1"):
        device = nki_runtime.NkiDevice("emulator")
        nki_ops.mp2_pair_sums(*args, weights, True, mode="emulator", device=device)
    windows = -(-4 // window)
    assert device.ledger.core_launches == [windows, windows]
    assert device.ledger.program_pairs == [2, 2]


def test_a_fallback_reads_placed_b_block_by_block(emulator, monkeypatch):
    """A pair call on B placed on the device that the host must run (a refusal, a crash under
    auto) reads the stage's planned blocks from the store, not whole stores."""
    from dfmp2.linalg import Dispatcher, DispatchPolicy

    store = _store(6, 20, 30)
    reads = []
    real = store.read_b

    class Spy:
        nocc = 6

        def read_b(self, i0, i1):
            reads.append((i0, i1))
            return real(i0, i1)

    la = Dispatcher(DispatchPolicy("nki", nki_emulator=True))
    placed, occ_block = la.place_pair_operands([Spy()], 2)
    assert la.residency == "device" and occ_block == 6
    reads.clear()
    monkeypatch.setitem(nki_ops.SUPPORTS, "mp2_pair_sums", lambda *a, **k: "forced refusal")
    e_o, e_v = _eps(6, 20)
    block = placed[0].read_b(0, 6)
    weights = torch.from_numpy(pair_weights(0, 6, 0, 6, True))
    got = la.mp2_pair_sums(block, block, e_o, e_o, e_v, e_v, weights, True)
    assert reads and max(i1 - i0 for i0, i1 in reads) == 2
    from dfmp2.linalg import torch_ops

    want = torch_ops.mp2_pair_sums(store.read_b(0, 6), store.read_b(0, 6), e_o, e_o, e_v, e_v,
                                   weights, True)
    assert torch.allclose(got, want, rtol=TOL_SUM_ORDER_REL, atol=0.0)
    assert la.records["mp2_pair_sums"].fallback.endswith("forced refusal")
