"""The NKI cost model (``dfmp2 nki-model``): per-instruction prices from the documented rates,
the report's shape, and the exit status that says whether every kernel matched float64."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from dfmp2 import nki_model
from dfmp2.cli import main
from dfmp2.nki_emulator._trace import Operand, Record

from tolerances import TOL_MODEL_PEAK_REL

pytestmark = pytest.mark.nki_emulated

TRN1 = nki_model.TARGETS["trn1"]


def _op(shape, buffer="sbuf", dtype="float32"):
    return Operand(tuple(shape), buffer, dtype)


def _matmul(k, m, n, dtype="float32"):
    return Record("nc_matmul", "tensor", {"dst": _op((m, n), "psum"),
                                          "stationary": _op((k, m), dtype=dtype),
                                          "moving": _op((k, n), dtype=dtype)})


def test_tensore_prices_follow_the_documented_initiation_interval():
    engine, seconds, flops = nki_model.instruction_cost(_matmul(128, 128, 512), TRN1)
    assert engine == "tensor" and seconds == pytest.approx(512 * 4 / 2.8e9)
    assert flops == 2 * 128 * 128 * 512
    # at the fp32 rate a full matmul runs at the documented 23 TFLOPS peak (within 0.3%)
    assert flops / seconds == pytest.approx(23e12, rel=TOL_MODEL_PEAK_REL)
    # below 64 moving columns the cost stays at 64 cycles; bf16 is 4x cheaper than fp32
    assert nki_model.instruction_cost(_matmul(128, 128, 32), TRN1)[1] == pytest.approx(
        64 * 4 / 2.8e9)
    assert nki_model.instruction_cost(_matmul(128, 128, 512, "bfloat16"), TRN1)[1] == (
        pytest.approx(512 / 2.8e9))


def test_vector_and_dma_prices():
    recip = Record("reciprocal", "vector", {"dst": _op((128, 128)), "data": _op((128, 128))})
    assert nki_model.instruction_cost(recip, TRN1) == ("vector", pytest.approx(1024 / 1.12e9), 0.0)
    two_sbuf = Record("tensor_tensor", "vector", {"dst": _op((128, 100)), "data1": _op((128, 100)),
                                                  "data2": _op((128, 100))})
    one_psum = Record("tensor_tensor", "vector", {"dst": _op((128, 100)), "data1": _op((128, 100)),
                                                  "data2": _op((128, 100), "psum")})
    assert nki_model.instruction_cost(two_sbuf, TRN1)[1] == pytest.approx(200 / 1.12e9)
    assert nki_model.instruction_cost(one_psum, TRN1)[1] == pytest.approx(100 / 1.12e9)
    small = Record("tensor_scalar", "vector", {"dst": _op((128, 8)), "data": _op((128, 8))})
    assert nki_model.instruction_cost(small, TRN1)[1] == pytest.approx(64 / 1.12e9)

    def dma(shape, run_bytes):
        nbytes = int(np.prod(shape)) * 4
        return Record("dma_copy", "dma", {"dst": _op(shape), "src": _op(shape, "hbm")},
                      nbytes=nbytes, attrs={"src_bytes": nbytes, "run_bytes": run_bytes})

    full, quarter = dma((128, 512), 2048), dma((128, 128), 512)  # 2 KiB and 512 B runs
    assert nki_model.instruction_cost(full, TRN1)[1] == pytest.approx(128 * 512 * 4 / 272e9)
    assert nki_model.instruction_cost(quarter, TRN1)[1] == pytest.approx(
        4 * 128 * 128 * 4 / 272e9)
    # a panel of 18 K tiles of 128 columns: 9 KiB per partition, but in runs of 512 B
    panel = dma((128, 18, 128), 512)
    assert nki_model.instruction_cost(panel, TRN1)[1] == pytest.approx(
        4 * 128 * 18 * 128 * 4 / 272e9)


def test_the_trace_records_the_contiguous_runs_of_a_strided_panel():
    """A (128, n_kt, 128) panel read from a (128, n_kt, 1000) partition-major array: runs of
    128 floats; the whole rows of a (128, 300) array: one run of 300."""
    from dfmp2.nki_emulator import install, jit, trace
    from dfmp2.nki_emulator import isa as nisa
    from dfmp2.nki_emulator import language as nl

    install()

    @jit
    def k(b3, b2):
        t = nl.ndarray((128, 4, 128), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t[0:128, 0:4, 0:128], src=b3[0:128, 0:4, 100:228])
        u = nl.ndarray((128, 300), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=u, src=b2)
        out = nl.ndarray((128, 300), dtype=nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=u)
        return out

    with trace() as tr:
        k(np.ones((128, 4, 1000), np.float32), np.ones((128, 300), np.float32))
    runs = [r.attrs["run_bytes"] for r in tr.find("dma_copy")]
    assert runs == [128 * 4, 300 * 4, 300 * 4]


def test_a_launch_is_as_long_as_its_busiest_engine():
    records = [_matmul(128, 128, 512)] * 3 + [
        Record("reciprocal", "vector", {"dst": _op((128, 512)), "data": _op((128, 512))})]
    report = nki_model.model_records(records, TRN1)
    tensor, vector = 3 * 2048 / 2.8e9, 4096 / 1.12e9
    assert report["engines"]["tensor"] == pytest.approx(tensor)
    assert report["modeled_seconds"] == pytest.approx(max(tensor, vector))
    assert report["serial_seconds"] == pytest.approx(tensor + vector)
    assert report["tensore_utilization"] == pytest.approx(
        3 * 2 * 128 * 128 * 512 / (max(tensor, vector) * 23e12))


def test_cli_reports_every_kernel_and_the_energy_step(tmp_path):
    out = tmp_path / "model.json"
    result = CliRunner().invoke(main, ["nki-model", "--nocc", "5", "--nvir", "150", "--naux",
                                       "300", "--target", "trn2", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "modeled, not measured" in result.stdout
    report = json.loads(out.read_text())
    assert report["ran_on_emulator"] is True and report["target"] == "trn2"
    assert set(report["kernels"]) == {"gemm_kernel", "mp2_pair_energy_kernel",
                                      "mp2_pair_direct_kernel", "mp2_pair_energy_kernel[bf16x3]"}
    for kernel in report["kernels"].values():
        assert kernel["passed"] and kernel["max_abs_error"] >= 0.0
        assert 0.0 < kernel["tensore_utilization"] <= 1.0 and kernel["modeled_seconds"] > 0.0
    assert report["energy_step"]["pairs"] == report["energy_step_bf16x3"]["pairs"] == 15
    # the host launches whole chunks: here one 5 x 5 chunk, the 10 pairs below i <= j included
    assert report["energy_step"]["launched_pairs"] == 25
    step = report["energy_step"]
    # two cores share the kernel time (trn2: kernel[2]); B is uploaded once
    assert step["cores"] == 2
    assert report["energy_step_seconds"] == pytest.approx(
        step["kernel_seconds"] * step["busiest_core_pairs"] / step["launched_pairs"]
        + step["launch_seconds"])
    assert step["busiest_core_pairs"] == 3 * 5  # kernel[2]: 3 of the 5 rows x 5 columns
    assert step["seconds_one_core"] > report["energy_step_seconds"]
    from dfmp2.linalg import nki_ops

    assert step["b_upload_bytes"] == nki_ops.resident_b_bytes(5, 150, 300)
    assert "B uploaded once" in result.stdout


def test_the_busiest_core_sets_the_step():
    blocks = [(28, 28), (56, 28), (64, 8)]
    assert nki_model._busiest_core_pairs(blocks, "trn1") == 56 * 28  # blocks 0 and 2 vs 1
    assert nki_model._busiest_core_pairs(blocks, "trn2") == 14 * 28 + 28 * 28 + 32 * 8


def test_the_energy_step_runs_in_few_persistent_launches():
    """The rows are a device loop: one launch per block of the plan's columns and a-tile
    window, however many rows (trnsci's medium shape: a few launches where a launch per chunk
    of pairs needed about a hundred)."""
    from dfmp2.linalg import nki_ops

    cols, window = nki_ops._energy_launch_plan(448, 448, 1536, True)
    launched, launches = nki_model._launched_pairs(64, 448, 1536, False)
    blocks = -(-64 // cols)
    assert launches == blocks * -(-4 // window) and launches <= 8
    assert launched >= 64 * 65 // 2
def test_cli_exits_non_zero_when_a_kernel_misses_float64(monkeypatch):
    real = nki_model._check

    def strict(got, want, rtol, *scale):
        return (real(got, want, 0.0, *scale) if rtol == nki_model.FP32_RTOL
                else real(got, want, rtol, *scale))

    monkeypatch.setattr(nki_model, "_check", strict)  # fp32 never equals fp64 exactly
    result = CliRunner().invoke(main, ["nki-model", "--nocc", "2", "--nvir", "40", "--naux",
                                       "60"])
    assert result.exit_code == 1
    assert "mp2_pair_energy_kernel" in result.stderr and "FAIL" in result.stdout


def test_cli_rejects_an_impossible_shape_in_one_line():
    result = CliRunner().invoke(main, ["nki-model", "--nocc", "1", "--nvir", "2000",
                                       "--naux", "40000"])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "one pair and one a tile" in lines[0]


@pytest.mark.parametrize("shape", [(64, 448, 1536), (96, 672, 2304)], ids=["medium", "large"])
def test_the_pair_kernel_meets_the_modeled_target_at_trnsci_shapes(shape):
    """Issue 14's target: one chunk of the fused exchange kernel at >= 70% of one trn1
    NeuronCore's fp32 TensorE peak (modeled) at trnsci's medium and large shapes, checked
    against float64 on the way."""
    from dfmp2.nki_emulator import install

    install()
    chunk = nki_model._pair_chunk(*shape, True, np.random.default_rng(7))
    assert chunk["passed"]
    report = nki_model.model_records(chunk["records"], TRN1)
    assert report["tensore_utilization"] >= 0.70
    assert report["engines"]["tensor"] == report["modeled_seconds"]  # TensorE-bound


def test_bf16x3_past_its_launch_bound_is_named_and_the_fp32_kernels_still_modeled(monkeypatch):
    from dfmp2.linalg import nki_ops

    real = nki_ops._energy_launch_plan

    def fp32_only(nva, nvb, naux, exchange, split=False):
        return (1, 0) if split else real(nva, nvb, naux, exchange, split)

    monkeypatch.setattr(nki_ops, "_energy_launch_plan", fp32_only)
    result = CliRunner().invoke(main, ["nki-model", "--nocc", "2", "--nvir", "40", "--naux",
                                       "60", "--json", "-"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert "mp2_pair_energy_kernel[bf16x3]" not in report["kernels"]
    assert "bf16x3" in report["not_modeled"]["mp2_pair_energy_kernel[bf16x3]"]
    assert report["energy_step_bf16x3"] is None and report["passed"]


def test_a_shape_beyond_the_machines_memory_is_one_line_before_any_emulation(monkeypatch):
    """nvir 20000 took more than 10 GB (nvir^2 products per emulated pair); a machine with less
    available says so instead of running out of memory."""
    import dfmp2.nki_emulator

    monkeypatch.setattr(nki_model, "_available_bytes", lambda: 2 * 10**9)
    monkeypatch.setattr(dfmp2.nki_emulator, "install", lambda: pytest.fail("emulation began"))
    result = CliRunner().invoke(main, ["nki-model", "--nocc", "1", "--nvir", "20000",
                                       "--naux", "1"])
    assert result.exit_code == 1
    assert result.output.strip() == ("error: modeling nvir 20000 needs about 12.8 GB (1 pairs' "
                                     "(ia|jb) products emulated and checked in float64), and "
                                     "this process may use 2.0 GB more (the machine's "
                                     "available memory, or its ulimit -v); model a smaller nvir")
    nki_model._check_memory(64, 448, 1536, available=2 * 10**9)  # trnsci's shape fits


def test_a_process_memory_limit_counts_and_an_allocation_it_refuses_is_one_line():
    """Under ``ulimit -v`` the room is the limit less the process's size, not the machine's
    free memory (a 1.5 GB check array ended in a numpy traceback under a 6 GB limit), and a
    MemoryError the check did not foresee is one line, exit 1."""
    script = ("import resource, sys; from dfmp2 import nki_model; "
              "resource.setrlimit(resource.RLIMIT_AS, (6 * 10**9, resource.RLIM_INFINITY)); "
              "print(nki_model._available_bytes() < 6 * 10**9); "
              "from dfmp2.cli import main; sys.argv = ['dfmp2', 'nki-model', '--nocc', '1', "
              "'--nvir', '14000', '--naux', '1']; main()")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.stdout.splitlines()[0] == "True"
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines() + done.stdout.strip().splitlines()[1:]
    assert len(lines) == 1 and lines[0].startswith("error: modeling nvir 14000 needs about")
    assert "ulimit -v" in lines[0] and "Traceback" not in done.stderr


def test_a_memory_error_the_check_did_not_foresee_is_one_line(monkeypatch):
    monkeypatch.setattr(nki_model, "run_model", _raise_memory_error)
    result = CliRunner().invoke(main, ["nki-model", "--nocc", "1", "--nvir", "8", "--naux", "4"])
    assert result.exit_code == 1
    assert result.output.strip() == ("error: out of memory modeling nvir 8 (Unable to allocate "
                                     "1.46 GiB); model a smaller nvir or raise the process's "
                                     "memory limit (ulimit -v)")


def _raise_memory_error(*_args, **_kwargs):
    raise MemoryError("Unable to allocate 1.46 GiB")


@pytest.mark.parametrize("shape", [(1, 1, 2), (1, 1, 3), (2, 1, 2)])
def test_tiny_shapes_pass_their_float64_checks(shape):
    """At naux 2 a pair sum can cancel to near zero: the checks are relative to the products'
    magnitude (the pair sums of |B|), where rounding lives, and bf16x3 to its own bound."""
    nocc, nvir, naux = shape
    report = nki_model.run_model(nocc, nvir, naux, "trn1")
    assert all(kernel["passed"] for kernel in report["kernels"].values()), report["kernels"]
    assert nki_model.SPLIT_RTOL == 6 * 2.0**-18


@pytest.mark.parametrize("shape", [(8, 64, 128), (8, 200, 1000)])
def test_the_bf16x3_bound_still_catches_a_wrong_or_missing_exchange_term(shape):
    """Per term and first order: an exchange sum of the wrong sign, or none, lies far outside
    its bound, which a scale of the (much larger) direct term or of sum |B| would hide."""
    import torch

    from dfmp2.energy import reference_pair_sums

    ni, nvir, naux = shape
    rng = np.random.default_rng(7)
    ovl = torch.from_numpy(rng.standard_normal((ni, nvir, naux)) * 0.05)
    e_o = torch.from_numpy(rng.uniform(-1.5, -0.3, ni))
    e_v = torch.from_numpy(rng.uniform(0.1, 3.0, nvir))
    args = (ovl, ovl, e_o, e_o, e_v, e_v, torch.ones((ni, ni), dtype=torch.float64), True)
    direct, exchange = reference_pair_sums(*args)
    bound = nki_model._split_bound(*args)
    assert bound[1] < abs(exchange) and 2 * abs(exchange) > bound[1]
    assert bound[0] < 1e-3 * abs(direct)
