"""Precision of the NKI path (fp32 on the device) on ill-conditioned auxiliary metrics, on dfmp2's
emulator: stages move to the host in fp64 by the metric's condition number, the op records say
so, the energy stays within TOL_FP32 of fp64, and --require-nki refuses instead."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from pyscf import df, gto, scf

from dfmp2 import pipeline
from dfmp2.blocking import plan_blocks
from dfmp2.df import SOLVE_CONDITION, factor_metric, metric
from dfmp2.errors import NotPositiveDefiniteError, PrecisionError
from dfmp2.linalg import Dispatcher, DispatchPolicy
from dfmp2.pipeline import (
    FIT_HOST_CONDITION,
    TRANSFORM_HOST_CONDITION,
    dfmp2_pair_energies,
    plan_stages,
)
from dfmp2.reference import frozen_mask, orbital_space

from tolerances import (
    TOL_CONDITION_REL,
    TOL_FP32,
    TOL_MATRIX_REL,
    TOL_NKI_BF16X3_ECORR_REL,
)

WATER = "O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692"


@pytest.fixture(scope="module")
def water_adz():
    mol = gto.M(atom=WATER, basis="aug-cc-pvdz", verbose=0)
    mf = scf.RHF(mol)
    mf.conv_tol = 1e-11
    mf.kernel()
    space = orbital_space(mf.mo_coeff, mf.mo_energy, mf.mo_occ,
                          frozen_mask(mol, mf.mo_occ, frozen_core=True))
    return mol, space


def _run(mol, space, auxbasis, policy):
    auxmol = df.addons.make_auxmol(mol, auxbasis)
    plan = plan_blocks(mol.nao_nr(), [(space.nocc, space.nvir)], auxmol.nao_nr(), 4000)
    la = Dispatcher(policy)
    energies, factor = dfmp2_pair_energies(mol, auxmol, [space], plan, la)
    return energies, factor, la


def _e_corr(energies):
    return energies.e_os + energies.e_ss


def _etb(mol, beta):
    return df.addons.aug_etb(mol, beta)


def test_plan_thresholds_place_stages_by_condition():
    def placements(cond):
        return tuple(s.placement for s in plan_stages("nki", cond))

    nki, host = "nki fp32", "host fp64"
    assert placements(TRANSFORM_HOST_CONDITION) == (host, nki, nki, nki)
    assert placements(TRANSFORM_HOST_CONDITION * 1.01) == (host, host, nki, nki)
    assert placements(FIT_HOST_CONDITION * 1.01) == (host, host, host, nki)
    assert placements(None) == (host, host, host, nki)  # unknown: the safe side
    assert {s.placement for s in plan_stages("pytorch", 1e20)} == {"pytorch fp64"}
    with pytest.raises(PrecisionError, match="--backend pytorch"):
        plan_stages("nki", FIT_HOST_CONDITION * 10, require_nki=True)


@pytest.mark.parametrize("beta, host_stages", [(2.0, {"transform"}), (1.5, {"transform", "fit"})])
def test_ill_conditioned_metric_moves_stages_to_host_and_stays_accurate(water_adz, beta,
                                                                        host_stages):
    mol, space = water_adz
    ref, ref_factor, _ = _run(mol, space, _etb(mol, beta), DispatchPolicy("pytorch"))
    got, factor, la = _run(mol, space, _etb(mol, beta),
                           DispatchPolicy("nki", nki_emulator=True))
    assert factor.condition == pytest.approx(ref_factor.condition, rel=TOL_CONDITION_REL)
    assert factor.condition > TRANSFORM_HOST_CONDITION
    stages = got.stages_dict()
    assert {k for k, v in stages.items() if v["placement"] == "host fp64"} == {"metric",
                                                                               *host_stages}
    assert stages["pair_energy"]["placement"] == "nki fp32"
    ops = la.summary()
    # the transform's GEMMs ran on the host, named by the condition number
    assert ops["gemm"]["host_calls"] == ops["gemm"]["calls"] > 0
    assert f"{factor.condition:.1e}" in ops["gemm"]["host_reason"]
    # the fit: trmm by L^-T, or above SOLVE_CONDITION triangular solves (on the host)
    fit_op = "trsm" if factor.condition > SOLVE_CONDITION else "trmm"
    assert (ops[fit_op]["mode"] == "host") is ("fit" in host_stages)
    assert ops["mp2_pair_sums"]["mode"] == "emulator"
    assert _e_corr(got) == pytest.approx(_e_corr(ref), abs=TOL_FP32)


def test_require_nki_refuses_an_ill_conditioned_metric(water_adz):
    mol, space = water_adz
    with pytest.raises(PrecisionError) as info:
        _run(mol, space, _etb(mol, 2.0),
             DispatchPolicy("nki", nki_emulator=True, require_nki=True))
    message = str(info.value)
    assert "\n" not in message and "--backend pytorch" in message and "condition" in message


def test_well_conditioned_ri_metric_stays_on_the_device(water_adz):
    mol, space = water_adz
    got, factor, la = _run(mol, space, df.make_auxbasis(mol, mp2fit=True),
                           DispatchPolicy("nki", nki_emulator=True, require_nki=True))
    assert factor.condition < TRANSFORM_HOST_CONDITION
    assert {s.stage for s in got.stages if s.placement == "nki fp32"} == {
        "transform", "fit", "pair_energy"}
    assert la.records["gemm"].host_calls == 0 and la.records["gemm"].mode == "emulator"


def test_without_the_guard_the_nki_path_is_wrong(water_adz, monkeypatch):
    """Why the guard exists: the same ill-conditioned run with every stage on the device."""
    mol, space = water_adz
    ref, _, _ = _run(mol, space, _etb(mol, 1.3), DispatchPolicy("pytorch"))
    monkeypatch.setattr(pipeline, "TRANSFORM_HOST_CONDITION", float("inf"))
    monkeypatch.setattr(pipeline, "FIT_HOST_CONDITION", float("inf"))
    got, _, la = _run(mol, space, _etb(mol, 1.3), DispatchPolicy("nki", nki_emulator=True))
    assert la.records["gemm"].host_calls == 0
    assert abs(_e_corr(got) - _e_corr(ref)) > 100 * TOL_FP32


def _ghost_metric():
    """The RI metric (naux 141) of water aug-cc-pVDZ with a ghost H 1e-4 Angstrom from an H atom
    (cond ~1e16): more than one 128-block, so the NKI factorisation runs fp32 trailing updates."""
    mol = gto.M(atom="O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59; ghost-H 0 0.76 0.5901",
                basis="aug-cc-pvdz", verbose=0)
    auxmol = df.addons.make_auxmol(mol, df.make_auxbasis(mol, mp2fit=True))
    return torch.from_numpy(metric(auxmol))


def test_nki_blocked_cholesky_fails_where_lapack_succeeds_and_lapack_decides(caplog):
    import scipy.linalg

    from dfmp2.linalg import nki_ops

    j2c = _ghost_metric()
    scipy.linalg.cholesky(j2c.numpy(), lower=True)  # LAPACK fp64 factors it
    with pytest.raises(NotPositiveDefiniteError, match="fp32 trailing updates"):
        nki_ops.cholesky(j2c, mode="emulator")  # the fp32 blocked one does not
    la = Dispatcher(DispatchPolicy("nki", nki_emulator=True))
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        factor = factor_metric(j2c, la)
    assert factor.method == "cholesky" and factor.ndropped == 0
    assert factor.naux_fit == j2c.shape[0] and factor.condition > 1e12
    rec = la.records["cholesky"]
    assert (rec.mode, rec.host_calls) == ("host", 1) and "LAPACK" in rec.host_reason
    assert "eigh" not in la.records and not caplog.records
    lower = factor.lower.numpy()
    assert np.allclose(lower @ lower.T, j2c.numpy(), rtol=0, atol=TOL_MATRIX_REL)


def test_a_bf16x3_pair_stage_says_so_and_keeps_its_relative_bound():
    """The record names the products that ran (it said 'nki fp32'), and their error, one-signed
    where a pair's terms are sums of squares, stays within the relative bound even where it
    passes 1e-5 Eh: H2 stretched to 12 A (E(corr) -0.74 Eh), 1.05e-5 Eh measured."""
    import dfmp2

    stretched = "H 0 0 0; H 0 0 12"
    fp64 = dfmp2.run(stretched, basis="cc-pvdz", backend="pytorch")
    bf16x3 = dfmp2.run(stretched, basis="cc-pvdz", backend="nki", nki_emulator=True,
                       nki_matmul="bf16x3")
    assert bf16x3.method.stage_precision["pair_energy"]["placement"] == "nki bf16x3"
    assert "2^-18" in bf16x3.method.stage_precision["pair_energy"]["reason"]
    assert abs(bf16x3.e_corr - fp64.e_corr) <= TOL_NKI_BF16X3_ECORR_REL * abs(fp64.e_corr)
    assert {s.placement for s in plan_stages("nki", 1.0, nki_matmul="bf16x3")} == {
        "host fp64", "nki fp32", "nki bf16x3"}
