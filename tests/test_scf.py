"""dfmp2's own SCF: per-iteration reports and the --chkfile restart."""

from __future__ import annotations

import re

import pytest

import dfmp2
from dfmp2.errors import InputError

from conftest import INPUTS
from tolerances import TOL_RESTART

WATER = str(INPUTS / "water.xyz")


def test_progress_reports_every_scf_iteration():
    seen = []
    result = dfmp2.run(WATER, progress=lambda stage, done, total: seen.append((stage, done)))
    scf = [(stage, done) for stage, done in seen if stage.startswith("SCF")]
    assert [done for _, done in scf] == list(range(1, result.scf.cycles + 1))
    assert all(" dE=" in stage and "|g|=" in stage for stage, _ in scf)


def test_chkfile_restart_skips_a_converged_scf(tmp_path):
    chk = str(tmp_path / "water.chk")
    first = dfmp2.run(WATER, chkfile=chk)
    assert first.scf.restart == f"new chkfile {chk}" and first.scf.cycles > 3
    again = dfmp2.run(WATER, chkfile=chk)
    assert again.scf.restart == f"initial guess from chkfile {chk}" and again.scf.cycles == 1
    assert again.e_tot == pytest.approx(first.e_tot, abs=TOL_RESTART)
    assert "initial guess from chkfile" in again.summary()


@pytest.mark.parametrize("kwargs, differs", [
    ({"basis": "sto-3g"}, "another basis"),
    ({"charge": 1, "spin": 1}, "charge +0 and 2S = 0"),
    ({"reference": "uhf"}, "restricted vs unrestricted"),
])
def test_chkfile_of_another_calculation_is_refused(tmp_path, kwargs, differs):
    chk = str(tmp_path / "water.chk")
    dfmp2.run(WATER, chkfile=chk)
    with pytest.raises(InputError, match=re.escape(differs)):
        dfmp2.run(WATER, chkfile=chk, **kwargs)


def test_unwritable_chkfile_is_refused_before_the_scf(tmp_path):
    with pytest.raises(InputError, match="cannot write chkfile"):
        dfmp2.run(WATER, chkfile=str(tmp_path / "missing-dir" / "x.chk"))
    assert not (tmp_path / "missing-dir").exists()
    with pytest.raises(InputError, match="is a directory"):
        dfmp2.run(WATER, chkfile=str(tmp_path))


def test_a_failed_scf_writes_no_chkfile_and_a_refusal_comes_before_any_integral(tmp_path,
                                                                              monkeypatch):
    from dfmp2 import jk as dfmp2_df
    from dfmp2.errors import ConvergenceError

    chk = tmp_path / "water.chk"
    with pytest.raises(ConvergenceError):
        dfmp2.run(WATER, chkfile=str(chk), max_cycle=2)
    assert not chk.exists()
    dfmp2.run(WATER, chkfile=str(chk))
    monkeypatch.setattr(dfmp2_df, "fitted_cderi", lambda *a: pytest.fail("integrals built"))
    with pytest.raises(InputError, match="another basis"):
        dfmp2.run(WATER, chkfile=str(chk), basis="cc-pvtz")


def test_a_singlet_rohf_restarts_from_its_own_chkfile(tmp_path):
    chk = str(tmp_path / "water.chk")
    first = dfmp2.run(WATER, chkfile=chk, reference="rohf")
    again = dfmp2.run(WATER, chkfile=chk, reference="rohf")
    assert again.scf.cycles == 1
    assert again.e_tot == pytest.approx(first.e_tot, abs=TOL_RESTART)
