"""Dispatch policy of the linalg registry, against a fake NKI host module (monkeypatched)."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch

from dfmp2.df import factor_metric
from dfmp2.errors import (
    BackendUnavailableError,
    InputError,
    KernelError,
    UnsupportedShapeError,
)
from dfmp2.linalg import OPS, REGISTRY, Dispatcher, DispatchPolicy, torch_ops
from dfmp2.linalg.registry import IMPL_BACKENDS

from tolerances import TOL_EIGH_ORTHO, TOL_MATRIX_REL


def _fake_nki(monkeypatch, mode="emulator", reason=None, gemm_limit=None, gemm_raises=False):
    """Install a stand-in for dfmp2.linalg.nki_ops; returns the call log."""
    calls = []
    fake = types.ModuleType("dfmp2.linalg.nki_ops")

    def probe(simulator=False, emulator=False):
        return (mode, None) if reason is None else (None, reason)

    def gemm(a, b, trans_a=False, trans_b=False, out=None, *, mode, device=None):
        calls.append(("gemm", mode))
        if gemm_raises:
            raise RuntimeError("kernel exploded")
        return torch_ops.gemm(a, b, trans_a, trans_b, out)

    fake.probe = probe
    fake.gemm = gemm
    fake.SUPPORTS = {op: (lambda *a: None) for op in OPS}
    fake.SUPPORTS["gemm"] = lambda *a: gemm_limit
    monkeypatch.setitem(sys.modules, "dfmp2.linalg.nki_ops", fake)
    return calls


def test_every_op_has_a_pytorch_and_an_nki_entry():
    for op in OPS:
        assert (op, "pytorch") in REGISTRY and (op, "nki") in REGISTRY
    assert {backend for _, backend in REGISTRY} == set(IMPL_BACKENDS)
    assert ("eigh", "pytorch") in REGISTRY and ("eigh", "nki") not in REGISTRY


def test_unknown_backend_lists_valid_names():
    with pytest.raises(InputError, match="auto, pytorch, nki"):
        DispatchPolicy("cuda")


def test_explicit_pytorch_records_pytorch():
    la = Dispatcher(DispatchPolicy("pytorch", cpu_blas="torch"))
    la.gemm(torch.eye(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64))
    assert la.backend == "pytorch" and la.records["gemm"].as_dict() == {
        "backend": "pytorch", "mode": "pytorch", "calls": 1, "fallback": None, "host_calls": 0,
        "host_reason": None}


def test_explicit_nki_unavailable_is_an_error_with_the_reason(monkeypatch):
    _fake_nki(monkeypatch, reason="nki is not installed: pip install 'dfmp2[nki]'")
    with pytest.raises(BackendUnavailableError, match=r"dfmp2\[nki\]"):
        Dispatcher(DispatchPolicy("nki"))


def test_auto_without_nki_resolves_to_pytorch_and_says_why(monkeypatch):
    _fake_nki(monkeypatch, reason="no nki here")
    la = Dispatcher(DispatchPolicy("auto"))
    assert la.backend == "pytorch" and "no nki here" in la.resolution


def test_auto_with_require_nki_and_no_nki_is_an_error(monkeypatch):
    _fake_nki(monkeypatch, reason="no nki here")
    with pytest.raises(BackendUnavailableError):
        Dispatcher(DispatchPolicy("auto", require_nki=True))


def test_nki_op_runs_in_the_probed_mode(monkeypatch):
    calls = _fake_nki(monkeypatch, mode="simulator")
    la = Dispatcher(DispatchPolicy("nki", nki_simulator=True))
    la.gemm(torch.ones(2, 3, dtype=torch.float64), torch.ones(3, 2, dtype=torch.float64))
    assert calls == [("gemm", "simulator")]
    assert la.records["gemm"].backend == "nki" and la.records["gemm"].mode == "simulator"


def test_unsupported_shape_falls_back_once_with_warning_and_record(monkeypatch, caplog):
    _fake_nki(monkeypatch, gemm_limit="M exceeds 4096")
    la = Dispatcher(DispatchPolicy("auto"))
    a = torch.ones(2, 2, dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        la.gemm(a, a)
        la.gemm(a, a)
    warnings = [r for r in caplog.records if "falls back" in r.getMessage()]
    assert len(warnings) == 1 and "M exceeds 4096" in warnings[0].getMessage()
    rec = la.records["gemm"]
    assert (rec.backend, rec.calls) == (la.host_backend["gemm"], 2)
    assert "M exceeds 4096" in rec.fallback


def test_require_nki_refuses_a_fallback(monkeypatch):
    _fake_nki(monkeypatch, gemm_limit="M exceeds 4096")
    la = Dispatcher(DispatchPolicy("auto", require_nki=True))
    a = torch.ones(2, 2, dtype=torch.float64)
    with pytest.raises(UnsupportedShapeError, match="require-nki"):
        la.gemm(a, a)


def test_kernel_failure_under_auto_falls_back_visibly(monkeypatch, caplog):
    _fake_nki(monkeypatch, gemm_raises=True)
    la = Dispatcher(DispatchPolicy("auto"))
    a = torch.ones(2, 2, dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        out = la.gemm(a, a)
    assert torch.equal(out, a @ a)
    assert "kernel exploded" in la.records["gemm"].fallback
    assert any("kernel exploded" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("policy", [DispatchPolicy("nki"), DispatchPolicy("auto", require_nki=True)],
                         ids=["explicit-nki", "require-nki"])
def test_kernel_crash_without_fallback_is_a_kernel_error(monkeypatch, policy):
    _fake_nki(monkeypatch, gemm_raises=True)
    la = Dispatcher(policy)
    a = torch.ones(2, 2, dtype=torch.float64)
    with pytest.raises(KernelError) as info:
        la.gemm(a, a)
    message = str(info.value)
    for part in ("gemm", "nki", "emulator mode", "RuntimeError", "kernel exploded",
                 "--backend pytorch"):
        assert part in message, (part, message)
    assert "\n" not in message and isinstance(info.value.__cause__, RuntimeError)
    assert not isinstance(info.value, BackendUnavailableError)


def test_host_view_runs_on_the_host_and_records_why(monkeypatch):
    calls = _fake_nki(monkeypatch)
    la = Dispatcher(DispatchPolicy("nki"))
    a = torch.ones(2, 2, dtype=torch.float64)
    la.gemm(a, a)
    out = la.on_host("precision: cond 1e9 > 1e7").gemm(a, a)
    assert torch.equal(out, a @ a) and calls == [("gemm", "emulator")]  # one NKI call only
    assert la.records["gemm"].as_dict() == {
        "backend": "mixed", "mode": "emulator+host", "calls": 2, "fallback": None,
        "host_calls": 1, "host_reason": "precision: cond 1e9 > 1e7"}
    # the host view is float64 work: another dtype is refused, not run and recorded as float64
    with pytest.raises(ValueError, match="takes float64 operands, got torch.float32"):
        la.on_host("precision").gemm(a.float(), a.float())
    assert la.records["gemm"].calls == 2


def test_pytorch_with_require_nki_is_contradictory():
    with pytest.raises(BackendUnavailableError, match="contradicts"):
        Dispatcher(DispatchPolicy("pytorch", require_nki=True))


def test_metric_falls_back_to_eigh_and_logs_dropped_count(caplog):
    """An indefinite metric (LAPACK's potrf fails): eigh drops what is below the threshold and
    says so, in the log and in the factor's record."""
    g = torch.Generator().manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    w = torch.tensor([-1e-6, 1e-14, 1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    j2c = (u * w) @ u.T
    la = Dispatcher(DispatchPolicy("pytorch"))
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        factor = factor_metric(j2c, la)
    assert factor.lower is None and factor.ndropped == 2 and factor.naux_fit == 4
    assert factor.method == "eigh" and "pivot" in factor.reason and "2 of 6" in factor.reason
    assert factor.condition == pytest.approx(4.0)
    assert any("dropping 2 of 6" in r.getMessage() for r in caplog.records)
    # the kept J^-1/2 reproduces the fitted Coulomb operator on the kept space
    v = factor.inv_sqrt
    assert torch.allclose(v.T @ j2c @ v, torch.eye(4, dtype=torch.float64), atol=TOL_EIGH_ORTHO)
    assert la.records["eigh"].mode == "host"


def test_cholesky_or_eigh_is_lapacks_decision():
    """Borderline metrics (a rank-deficient Gram matrix plus a ridge swept through the rounding
    level): the metric takes Cholesky exactly where SciPy's LAPACK potrf succeeds, whatever
    torch's own factorisation says (another LAPACK build that disagrees on such matrices)."""
    import scipy.linalg

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    outcomes = set()
    for ridge in (0.0, 1e-17, 1e-16, 1e-15, 1e-14, 1e-12, 1e-10):
        j2c = x @ x.T + ridge * torch.eye(6, dtype=torch.float64)
        try:
            scipy.linalg.cholesky(j2c.numpy(), lower=True)
            lapack = "cholesky"
        except scipy.linalg.LinAlgError:
            lapack = "eigh"
        factor = factor_metric(j2c, Dispatcher(DispatchPolicy("pytorch")))
        assert factor.method == lapack, ridge
        outcomes.add(lapack)
        if lapack == "cholesky":
            assert factor.condition > 1e9  # and the estimate says how ill-conditioned it is
    assert outcomes == {"cholesky", "eigh"}  # the sweep crosses LAPACK's boundary


def test_cholesky_and_eigh_fits_agree():
    """(ia|jb) from the triangular fit equals (ia|jb) from the J^-1/2 fit."""
    from dfmp2.df import MetricFactor
    from dfmp2.pipeline import fit
    from dfmp2.storage import IncoreStore

    def fitted(factor):
        store = IncoreStore(3, 4, 8, factor.naux_fit)
        store.write_pia(0, 8, ovP.permute(2, 0, 1))
        fit(store, factor, la, fit_occ=2)
        return store.read_b(0, 3).clone()

    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 8, generator=g, dtype=torch.float64)
    j2c = x @ x.T + 8 * torch.eye(8, dtype=torch.float64)
    ovP = torch.randn(3, 4, 8, generator=g, dtype=torch.float64)
    la = Dispatcher(DispatchPolicy("pytorch"))
    w, u = torch.linalg.eigh(j2c)
    by_chol = fitted(MetricFactor(torch.linalg.cholesky(j2c), None))
    by_eigh = fitted(MetricFactor(None, u / w.sqrt()))

    def ovov(b):
        return torch.einsum("iaQ,jbQ->iajb", b, b)

    assert torch.allclose(ovov(by_chol), ovov(by_eigh), atol=TOL_MATRIX_REL)


def test_an_unavailable_simulator_asked_for_by_name_is_a_warning(caplog):
    from dfmp2.linalg.registry import probe_nki

    policy = DispatchPolicy("auto", nki_simulator=True)
    mode, _reason = probe_nki(policy)
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        la = Dispatcher(policy)
    warned = "--simulator: the NKI simulator cannot run" in caplog.text
    assert (la.backend, warned) == (("pytorch", True) if mode is None else ("nki", False))


def test_nki_settings_that_run_nothing_are_said(monkeypatch, caplog):
    """Every setting is applied or said not to apply: the NKI modes under --backend pytorch,
    the simulator beside the emulator without the real nki, and the kernels' products and
    target where no NKI kernel can run."""
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        Dispatcher(DispatchPolicy("pytorch", nki_emulator=True, nki_simulator=True))
    assert ("--nki-emulator and --simulator: --backend pytorch runs no NKI kernel, so they have "
            "no effect") in caplog.text
    caplog.clear()
    _fake_nki(monkeypatch, reason="no nki here")
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        la = Dispatcher(DispatchPolicy("auto", nki_matmul="bf16x3", nki_target="trn1"))
    assert la.backend == "pytorch"
    assert ("--nki-matmul bf16x3; --nki-target trn1: no NKI kernel runs (no nki here)"
            in caplog.text)
    caplog.clear()
    _fake_nki(monkeypatch, mode="emulator")
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        la = Dispatcher(DispatchPolicy("nki", nki_emulator=True, nki_simulator=True))
    assert la.nki_mode == "emulator"
    assert "--simulator: the NKI simulator needs the real nki package" in caplog.text
