"""Execution-mode probe, mode set-up and the host-wrapper contract (signatures, SUPPORTS)."""

from __future__ import annotations

import inspect
import sys
import types

import numpy as np
import pytest

from dfmp2.errors import BackendUnavailableError, InputError
from dfmp2.linalg import nki_ops, nki_runtime, torch_ops
from dfmp2.linalg.registry import OPS

from tolerances import TOL_NKI_CHOLESKY_ABS, TOL_NKI_GEMM_ABS, TOL_NKI_TRSM_ABS


def _fake_real_nki(monkeypatch, version):
    """Make ``import nki`` return a stand-in for the real package (no emulator marker)."""
    fake = types.ModuleType("nki")
    fake.__version__ = version
    monkeypatch.setitem(sys.modules, "nki", fake)


@pytest.fixture
def no_real_nki():
    version, _why = nki_runtime.real_nki_version()
    if version is not None:
        pytest.skip(f"the real nki {version} is installed here")


@pytest.mark.nki_emulated
def test_probe_without_nki_names_the_install_route_and_the_emulator(no_real_nki):
    mode, reason = nki_ops.probe()
    assert mode is None
    assert "pip install 'dfmp2[nki]'" in reason
    assert "--extra-index-url https://pip.repos.neuron.amazonaws.com" in reason
    assert "--nki-emulator" in reason
    assert nki_ops.probe(simulator=True)[0] is None  # the simulator needs the real nki


@pytest.mark.nki_emulated
def test_probe_offers_the_emulator_only_on_request(no_real_nki):
    assert nki_ops.probe(emulator=True) == ("emulator", None)


@pytest.mark.nki_emulated
def test_probe_does_not_mistake_the_emulator_for_nki(no_real_nki):
    from dfmp2 import nki_emulator

    with nki_emulator.installed():
        assert nki_runtime.real_nki_version()[0] is None
        assert nki_ops.probe()[0] is None
        assert nki_ops.probe(emulator=True) == ("emulator", None)


@pytest.mark.nki_emulated
def test_probe_with_real_nki_prefers_simulator_when_asked(monkeypatch):
    _fake_real_nki(monkeypatch, "0.3.0")
    assert nki_ops.probe(simulator=True) == ("simulator", None)
    assert nki_ops.probe(simulator=True, emulator=True) == ("simulator", None)


@pytest.mark.nki_emulated
def test_probe_with_real_nki_and_no_device(monkeypatch):
    _fake_real_nki(monkeypatch, "0.3.1")
    monkeypatch.setattr(nki_runtime, "_hardware_missing", lambda: "no /dev/neuron* device")
    mode, reason = nki_ops.probe(emulator=True)
    assert mode is None
    assert "nki 0.3.1 is installed but no Neuron device / torch-xla was found" in reason
    assert "simulator option" in reason


@pytest.mark.nki_emulated
def test_probe_with_real_nki_and_device(monkeypatch):
    _fake_real_nki(monkeypatch, "0.4.0")
    monkeypatch.setattr(nki_runtime, "_hardware_missing", lambda: None)
    assert nki_ops.probe() == ("hardware", None)


@pytest.mark.nki_emulated
def test_probe_rejects_an_old_nki(monkeypatch):
    _fake_real_nki(monkeypatch, "0.2.0")
    mode, reason = nki_ops.probe(simulator=True)
    assert mode is None and "nki 0.2.0" in reason and ">= 0.3.0" in reason


@pytest.mark.nki_emulated
def test_emulator_mode_is_refused_over_a_real_nki(monkeypatch):
    _fake_real_nki(monkeypatch, "0.3.0")
    with pytest.raises(BackendUnavailableError, match="real nki 0.3.0 is installed"):
        nki_runtime.prepare("emulator")


@pytest.mark.nki_emulated
def test_unknown_mode_is_an_input_error():
    with pytest.raises(InputError, match="unknown NKI execution mode 'gpu'"):
        nki_runtime.prepare("gpu")


@pytest.mark.nki_emulated
def test_a_launch_accepts_only_contiguous_float32():
    device = nki_runtime.NkiDevice("emulator")
    with pytest.raises(InputError, match="float32"):
        device.launch(None, (np.zeros((2, 2)),))
    with pytest.raises(InputError, match="contiguous"):
        device.launch(None, (np.zeros((4, 4), dtype=np.float32)[:, ::2],))


#: NKI-only keyword options an op may take before ``mode``.
NKI_OPTIONS = {"products"}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.nki_emulated
def test_host_wrappers_have_the_torch_ops_signature_plus_mode(op):
    """The torch op's parameters, then keyword-only ``mode`` (required) and ``device`` (the
    run's NkiDevice, default None)."""
    ours = inspect.signature(getattr(nki_ops, op))
    theirs = inspect.signature(getattr(torch_ops, op))
    params = list(ours.parameters.values())
    mode, device = params[-2:]
    assert mode.name == "mode" and mode.kind is inspect.Parameter.KEYWORD_ONLY
    assert mode.default is inspect.Parameter.empty
    assert device.name == "device" and device.kind is inspect.Parameter.KEYWORD_ONLY
    assert device.default is None
    # keyword-only options of the NKI kernels themselves (the pair kernels' bf16x3 products)
    mine = [(p.name, p.kind, p.default) for p in params[:-2]
            if not (p.kind is inspect.Parameter.KEYWORD_ONLY and p.name in NKI_OPTIONS)]
    # `matmul` is the pytorch backend's injected CPU BLAS choice, not part of the op contract
    contract = [p for p in theirs.parameters.values() if p.name != "matmul"]
    assert mine == [(p.name, p.kind, p.default) for p in contract]


@pytest.mark.nki_emulated
def test_supports_covers_every_op():
    assert set(nki_ops.SUPPORTS) == set(OPS)


@pytest.mark.nki_emulated
def test_kernel_modules_import_nki_only_when_loaded():
    """The host wrappers and tile constants import without nki (kernels load lazily)."""
    import dfmp2.kernels
    import dfmp2.kernels._tiles as tiles

    assert dfmp2.kernels.KERNEL_MODULES == ("gemm", "trsm", "mp2_energy")
    assert (tiles.TILE_K, tiles.TILE_M, tiles.TILE_N) == (128, 128, 512)


@pytest.mark.nki_emulated
def test_every_op_runs_under_the_trn1_rules(emulator_trace):
    """gen2 (trn1): 192 KiB SBUF per partition, no ScalarE tensor_copy, vector bias only."""
    import torch

    from dfmp2 import nki_emulator
    from dfmp2.energy import pair_weights

    from ._support import ENERGY_RTOL, pair_block, rand, spd
    with nki_emulator.target("trn1"):
        a, b = rand((130, 200), 1), rand((200, 600), 2)
        assert torch.allclose(nki_ops.gemm(a, b, mode="emulator"), a @ b, rtol=0,
                              atol=TOL_NKI_GEMM_ABS)
        l_nn = nki_ops.cholesky(spd(200, 3), mode="emulator")
        assert torch.allclose(l_nn, torch_ops.cholesky(spd(200, 3)), rtol=0,
                              atol=TOL_NKI_CHOLESKY_ABS)
        x = nki_ops.trsm(l_nn, rand((300, 200), 4), mode="emulator")
        assert torch.allclose(x, torch_ops.trsm(l_nn, rand((300, 200), 4)), rtol=0,
                              atol=TOL_NKI_TRSM_ABS)
        args = pair_block(2, 2, 150, 150, 140, True, 5)
        w = torch.from_numpy(pair_weights(0, 2, 0, 2, True))
        got = nki_ops.mp2_pair_sums(*args, w, True, mode="emulator")
        assert torch.allclose(got, torch_ops.mp2_pair_sums(*args, w, True), rtol=ENERGY_RTOL,
                              atol=0)
        args = pair_block(2, 2, 150, 90, 140, False, 6)  # the direct kernel, rectangular
        w = torch.ones((2, 2), dtype=torch.float64)
        got = nki_ops.mp2_pair_sums(*args, w, False, mode="emulator")
        assert torch.allclose(got, torch_ops.mp2_pair_sums(*args, w, False), rtol=ENERGY_RTOL,
                              atol=0)
