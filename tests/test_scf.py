"""dfmp2's own SCF: per-iteration reports and the --chkfile restart."""

from __future__ import annotations

import json
import os
import re

import pytest

import dfmp2
from dfmp2.errors import InputError

from conftest import INPUTS
from tolerances import (
    TOL_EIGH_ORTHO,
    TOL_MATRIX_ABS,
    TOL_RESTART,
    TOL_SCF_ACCEPTED,
    TOL_SCF_TIGHT,
    TOL_SKIPPED_RESTART,
)

WATER = str(INPUTS / "water.xyz")
OH = "O 0 0 0; H 0 0 0.97"
#: SCF tolerances a default run's SCF is not converged to: its restart iterates and rewrites.
LOOSE = {"conv_tol": 1e-6, "conv_tol_grad": 1e-3}


def test_progress_reports_every_scf_iteration():
    seen = []
    result = dfmp2.run(WATER, progress=lambda stage, done, total: seen.append((stage, done)))
    scf = [(stage, done) for stage, done in seen if stage.startswith("SCF")]
    assert [done for _, done in scf] == list(range(1, result.scf.cycles + 1))
    assert all(" dE=" in stage and "|g|=" in stage for stage, _ in scf)


def test_chkfile_restart_skips_a_converged_scf(tmp_path):
    """A checkpoint converged to the run's tolerances is the SCF, with no cycle: its orbitals
    and orbital energies as saved (the same MP2 energy, run after run), the file left as it
    is. One converged more loosely is the initial guess of an SCF that iterates and is
    written; a later run then skips that one."""
    chk = str(tmp_path / "water.chk")
    first = dfmp2.run(WATER, chkfile=chk)
    assert first.scf.restart == f"new chkfile {chk}" and first.scf.cycles > 3
    written = open(chk, "rb").read()
    for _ in range(2):
        again = dfmp2.run(WATER, chkfile=chk)
        assert again.scf.restart.startswith(f"converged SCF from chkfile {chk} (no SCF cycle: "
                                            "energy change ")
        assert again.scf.cycles == 0 and again.scf.solver.startswith("none")
        assert again.e_corr == first.e_corr and (again.scf.homo, again.scf.lumo) == (
            first.scf.homo, first.scf.lumo)
        assert again.e_scf == pytest.approx(first.e_scf, abs=TOL_SKIPPED_RESTART)
        assert open(chk, "rb").read() == written
    assert "converged SCF from chkfile" in again.summary()
    loose = str(tmp_path / "loose.chk")
    dfmp2.run(WATER, chkfile=loose, **LOOSE)
    tight = dfmp2.run(WATER, chkfile=loose)
    assert tight.scf.restart == f"initial guess from chkfile {loose}" and tight.scf.cycles >= 1
    assert tight.e_tot == pytest.approx(first.e_tot, abs=TOL_RESTART)
    assert dfmp2.run(WATER, chkfile=loose).scf.cycles == 0  # rewritten converged


def test_a_damaged_chkfile_is_refused_and_a_rewrite_keeps_other_data(tmp_path):
    import h5py
    import numpy as np
    from pyscf import lib

    chk = str(tmp_path / "water.chk")
    dfmp2.run(WATER, chkfile=chk, basis="sto-3g")
    lib.chkfile.save(chk, "user/note", "kept")
    dfmp2.run(WATER, chkfile=chk, basis="sto-3g")  # rewritten through a copy beside it
    assert lib.chkfile.load(chk, "user/note") in (b"kept", "kept")
    assert sorted(os.listdir(tmp_path)) == ["water.chk"]  # no partial copy left
    for damage, why in ((np.zeros((3, 3)), "do not fit 7 basis functions"),
                        (np.full((7, 7), np.nan), "NaN or infinite")):
        with h5py.File(chk, "a") as f:
            del f["scf/mo_coeff"]
            f["scf/mo_coeff"] = damage
        with pytest.raises(InputError, match=f"is damaged .*{why}"):
            dfmp2.run(WATER, chkfile=chk, basis="sto-3g")


def test_a_ghf_chkfile_is_refused_as_another_reference(tmp_path):
    from pyscf import gto, scf

    chk = str(tmp_path / "ghf.chk")
    ghf = scf.GHF(gto.M(atom=WATER, basis="sto-3g", verbose=0))
    ghf.chkfile = chk
    ghf.run()
    with pytest.raises(InputError, match=r"another calculation \(another reference "
                                         r"\(generalised, GHF"):
        dfmp2.run(WATER, chkfile=chk, basis="sto-3g")


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


def test_a_chkfile_that_is_no_scf_checkpoint_is_refused_and_its_text_never_runs(tmp_path):
    """A molecule record alone (PySCF saves one before its first cycle), an SCF record without
    occupations, a record that is not JSON, and Python source in the molecule's fields: one
    line each, and nothing in the file is run (PySCF's own reader passes those fields to
    eval)."""
    import h5py
    from pyscf import gto, lib

    mol = gto.M(atom=WATER, basis="sto-3g", verbose=0)
    marker = tmp_path / "ran"
    code = f"(__import__('pathlib').Path({str(marker)!r}).touch(), [])[1]"
    good = str(tmp_path / "good.chk")
    dfmp2.run(WATER, chkfile=good, basis="sto-3g")
    cases = {}
    cases["no SCF record 'scf'"] = str(tmp_path / "mol-only.chk")
    lib.chkfile.save_mol(mol, cases["no SCF record 'scf'"])
    cases["no scf/mo_occ"] = str(tmp_path / "no-occ.chk")
    with h5py.File(good) as src, h5py.File(cases["no scf/mo_occ"], "w") as dst:
        dst["mol"] = src["mol"][()]
        dst["scf/mo_coeff"] = src["scf/mo_coeff"][()]
    cases["Expecting"] = str(tmp_path / "code.chk")  # json's message for text that is not JSON
    with h5py.File(good) as src, h5py.File(cases["Expecting"], "w") as dst:
        dst["mol"] = code
        dst["scf/mo_coeff"], dst["scf/mo_occ"] = src["scf/mo_coeff"][()], src["scf/mo_occ"][()]
    for why, path in cases.items():
        with pytest.raises(InputError, match=f"cannot be read as a PySCF SCF checkpoint .*{why}"):
            dfmp2.run(WATER, chkfile=path, basis="sto-3g")
    with h5py.File(good, "a") as f:  # code where PySCF keeps the atoms and basis as given
        record = json.loads(f["mol"][()])
        record.update(atom=code, basis=code, ecp=code)
        del f["mol"]
        f["mol"] = json.dumps(record)
    again = dfmp2.run(WATER, chkfile=good, basis="sto-3g")  # the parsed tables are the record
    assert again.scf.cycles == 0 and not marker.exists()
    for field, value, why in (("charge", "0", "Unknown format code"),
                              ("_env", [0.0], "index")):  # damaged, not code
        with h5py.File(good, "a") as f:
            record = json.loads(f["mol"][()])
            record[field] = value
            del f["mol"]
            f["mol"] = json.dumps(record)
        with pytest.raises(InputError, match="cannot be read as a PySCF SCF checkpoint"):
            dfmp2.run(WATER, chkfile=good, basis="sto-3g")


def test_a_chkfile_path_that_cannot_take_the_checkpoint_is_refused_before_the_scf(
        tmp_path, monkeypatch):
    """A FIFO (the check would block), and a directory that takes no new file (the checkpoint
    is written beside the file and renamed over it): refused before the SCF."""
    from dfmp2 import _files, api

    monkeypatch.setattr(api, "run_scf", lambda *a, **k: pytest.fail("the SCF ran"))
    fifo = tmp_path / "fifo.chk"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="is not a regular file"):
        dfmp2.run(WATER, chkfile=str(fifo))
    existing = tmp_path / "old.chk"
    existing.write_bytes(b"")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    with pytest.raises(InputError, match="chkfile must be a file path"):
        dfmp2.run(WATER, chkfile=3)
    monkeypatch.setattr(_files, "NamedTemporaryFile", read_only)
    with pytest.raises(InputError, match="its directory .* takes no new file"):
        dfmp2.run(WATER, chkfile=str(existing))


def test_a_linked_chkfile_is_rewritten_through_its_link_and_a_failed_write_loses_no_result(
        tmp_path, monkeypatch, caplog):
    from dfmp2 import scf

    target, link = tmp_path / "target.chk", tmp_path / "link.chk"
    link.symlink_to(target)
    dfmp2.run(WATER, chkfile=str(link), basis="sto-3g", **LOOSE)
    assert link.is_symlink() and target.is_file()
    first = dfmp2.run(WATER, chkfile=str(link), basis="sto-3g")  # iterates, rewritten
    assert first.scf.cycles >= 1 and "initial guess from chkfile" in first.scf.restart
    assert dfmp2.run(WATER, chkfile=str(link), basis="sto-3g").scf.cycles == 0
    assert link.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == [
        "link.chk", "target.chk"]

    def full_disk(mf, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(scf, "write_chkfile", full_disk)
    new = tmp_path / "new.chk"
    result = dfmp2.run(WATER, chkfile=str(new), basis="sto-3g")
    assert result.e_tot == pytest.approx(first.e_tot, abs=TOL_RESTART) and not new.exists()
    assert "could not write the chkfile" in caplog.text and "No space left" in caplog.text
    assert result.scf.restart == f"new chkfile {new}; not written: No space left on device"


def test_a_full_disk_while_the_checkpoint_is_written_is_one_warning_and_no_partial_file(
        tmp_path, monkeypatch, caplog):
    """The checkpoint is built in memory and written by plain file I/O: a full disk there is a
    warning, the run's energy is kept and no partial file is left (an HDF5 file written into
    a full disk crashed the process)."""
    chk = tmp_path / "water.chk"
    first = dfmp2.run(WATER, chkfile=str(chk), basis="sto-3g", **LOOSE)
    before = chk.read_bytes()

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    again = dfmp2.run(WATER, chkfile=str(chk), basis="sto-3g")  # iterates: to be written
    assert again.scf.cycles >= 1 and first.scf.cycles >= 1
    assert again.scf.restart.endswith("not written: No space left on device")
    assert chk.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["water.chk"]
    assert "could not write the chkfile" in caplog.text


def test_a_checkpoint_does_not_grow_with_restarts(tmp_path):
    """Each write is the whole file anew: HDF5 keeps the space of a replaced record, so a
    checkpoint rewritten in place grew by 8 KB with every restart. (A restart that skips the
    SCF writes nothing; here the SCF is written over its own file twice.)"""
    from pyscf import gto
    from pyscf import scf as pyscf_scf

    from dfmp2.scf import write_chkfile

    chk = tmp_path / "water.chk"
    dfmp2.run(WATER, chkfile=str(chk), basis="sto-3g")
    sizes = [chk.stat().st_size]
    mf = pyscf_scf.RHF(gto.M(atom=WATER, basis="sto-3g", verbose=0)).run()
    for _ in range(2):
        write_chkfile(mf, str(chk))
        sizes.append(chk.stat().st_size)
    assert sizes[1] == sizes[2] and sizes[2] <= sizes[0] + 64, sizes


def test_a_checkpoint_with_another_ecp_of_the_same_core_is_refused(tmp_path):
    """def2-SVP's ECP and cc-pVDZ-PP's both take 28 electrons of iodine: the same electron
    count, another calculation."""
    chk = str(tmp_path / "hi.chk")
    hi = "H 0 0 0; I 0 0 1.609"
    dfmp2.run(hi, basis="def2-svp", chkfile=chk)
    with pytest.raises(InputError, match=re.escape("another calculation (another ECP)")):
        dfmp2.run(hi, basis="def2-svp", ecp="cc-pvdz-pp", chkfile=chk)
    assert dfmp2.run(hi, basis="def2-svp", chkfile=chk).scf.cycles == 0


def test_a_pyscf_checkpoint_is_a_guess_and_is_left_as_it_is(tmp_path):
    """A checkpoint PySCF wrote has no record of its functional (a B3LYP one looks like an
    HF one): dfmp2 starts from its orbitals, converges its own SCF, and leaves the file
    untouched rather than replacing another calculation's orbitals."""
    from pyscf import dft, gto

    chk = tmp_path / "b3lyp.chk"
    mf = dft.RKS(gto.M(atom=WATER, basis="sto-3g", verbose=0), xc="b3lyp")
    mf.chkfile = str(chk)
    mf.run()
    before = chk.read_bytes()
    result = dfmp2.run(WATER, chkfile=str(chk), basis="sto-3g")
    fresh = dfmp2.run(WATER, basis="sto-3g")
    assert result.e_tot == pytest.approx(fresh.e_tot, abs=TOL_RESTART)
    assert result.scf.restart.endswith("so kept as it is and not rewritten")
    assert chk.read_bytes() == before
    guessed = dfmp2.run(WATER, chkfile=str(chk), basis="sto-3g", guess="atom")
    assert "--guess atom not used" in guessed.scf.restart  # and no 'written meanwhile'
    assert "not written:" not in guessed.scf.restart and not guessed.warnings
    assert chk.read_bytes() == before


def test_a_pyscf_checkpoint_with_its_orbitals_stored_as_a_list_is_read(tmp_path):
    """PySCF stores a UHF's (alpha, beta) tuple as a list group (``mo_coeff__from_list__``),
    which its own reader and dfmp2's read."""
    import h5py
    import numpy as np
    from pyscf import lib

    chk = str(tmp_path / "cation.chk")
    dfmp2.run(WATER, chkfile=chk, basis="sto-3g", charge=1, spin=1)
    with h5py.File(chk, "a") as f:
        coeff, occ = f["scf/mo_coeff"][()], f["scf/mo_occ"][()]
        del f["scf/mo_coeff"], f["scf/mo_occ"]
    lib.chkfile.save(chk, "scf/mo_coeff", [coeff[0], coeff[1]])
    lib.chkfile.save(chk, "scf/mo_occ", [occ[0], occ[1]])
    with h5py.File(chk) as f:
        assert "mo_coeff__from_list__" in f["scf"]
    again = dfmp2.run(WATER, chkfile=chk, basis="sto-3g", charge=1, spin=1)
    assert again.scf.cycles == 0 and np.isfinite(again.e_tot)


def test_a_failed_scf_writes_no_chkfile_and_a_refusal_comes_before_any_integral(tmp_path,
                                                                              monkeypatch):
    from dfmp2 import jk as dfmp2_df
    from dfmp2.errors import ConvergenceError

    chk = tmp_path / "water.chk"
    with pytest.raises(ConvergenceError):
        dfmp2.run(WATER, chkfile=str(chk), max_cycle=2)
    assert not chk.exists()
    dfmp2.run(WATER, chkfile=str(chk))
    for name in ("fitted_cderi", "split_cderi", "fitted_cderi_file"):
        monkeypatch.setattr(dfmp2_df, name, lambda *a, **k: pytest.fail("integrals built"))
    with pytest.raises(InputError, match="another basis"):
        dfmp2.run(WATER, chkfile=str(chk), basis="cc-pvtz")


def test_a_singlet_rohf_restarts_from_its_own_chkfile(tmp_path):
    chk = str(tmp_path / "water.chk")
    first = dfmp2.run(WATER, chkfile=chk, reference="rohf")
    again = dfmp2.run(WATER, chkfile=chk, reference="rohf")
    assert again.scf.cycles == 0 and again.e_corr == first.e_corr
    assert again.e_tot == pytest.approx(first.e_tot, abs=TOL_SKIPPED_RESTART)


def test_stall_watch_counts_only_flat_energy_cycles_above_the_gradient_threshold():
    """The stall test: STALL_CYCLES cycles with |dE| < conv_tol, |g| > conv_tol_grad and under
    10% gain in |g| raise; a slowly falling gradient, a moving energy, a converged gradient or
    the last allowed cycle do not."""
    from dfmp2 import scf

    envs = {"mo_coeff": "C", "mo_occ": "n", "e_tot": -1.0}
    watch = scf._stall_watch(1e-11, 1e-6, 100)
    for cycle in range(1, scf.STALL_CYCLES):
        watch(cycle, -1e-12, 1.08e-6, envs)
    with pytest.raises(scf._Stalled) as stalled:
        watch(scf.STALL_CYCLES, -1e-12, 1.08e-6, envs)
    assert (stalled.value.cycle, stalled.value.mo_coeff) == (scf.STALL_CYCLES, "C")
    for changes, gradients in [
            ([-1e-12] * 20, [3e-6 * 0.98**k for k in range(20)]),  # slow: 15% per 8 cycles
            ([-1e-9 if k % 4 == 0 else -1e-12 for k in range(20)], [2e-6] * 20),  # E moves
            ([-1e-12] * 20, [5e-7] * 20)]:  # converged gradient
        watch = scf._stall_watch(1e-11, 1e-6, 100)
        for cycle, (change, gradient) in enumerate(zip(changes, gradients), 1):
            watch(cycle, change, gradient, envs)
    last = scf._stall_watch(1e-11, 1e-6, scf.STALL_CYCLES)  # max_cycle: DIIS's own failure
    for cycle in range(1, scf.STALL_CYCLES + 1):
        last(cycle, -1e-12, 1.08e-6, envs)


def _stall_at_cycle_3(conv_tol, conv_tol_grad, max_cycle):
    """A stand-in for dfmp2.scf._stall_watch that declares a stall at cycle 3."""
    from dfmp2 import scf

    def watch(cycle, change, gradient, envs):
        if cycle == 3:
            raise scf._Stalled(cycle, gradient, envs)
    return watch


def test_a_stalled_diis_continues_with_the_second_order_solver(monkeypatch):
    """A DIIS made to stall at cycle 3 (the watch patched) ends with PySCF's Newton solver from
    its orbitals: the same converged energies as plain DIIS, the solver recorded and shown."""
    from dfmp2 import scf

    plain = dfmp2.run(WATER)
    monkeypatch.setattr(scf, "_stall_watch", _stall_at_cycle_3)
    seen = []
    newton = dfmp2.run(WATER, progress=lambda stage, done, total: seen.append((stage, done)))
    assert newton.scf.converged and plain.scf.solver == "DIIS (PySCF)"
    assert newton.scf.solver.startswith("DIIS (PySCF) for 3 cycles, stalled at |g| = ")
    assert "; then second-order (Newton, PySCF) for " in newton.scf.solver
    scf_cycles = [done for stage, done in seen if stage.startswith("SCF")]
    assert newton.scf.cycles > 3 and max(scf_cycles) == newton.scf.cycles
    assert newton.scf.energy == pytest.approx(plain.scf.energy, abs=TOL_SCF_TIGHT)
    assert newton.e_tot == pytest.approx(plain.e_tot, abs=TOL_RESTART)
    assert "second-order (Newton, PySCF)" in newton.summary()
    assert newton.to_dict()["extras"]["scf"]["solver"] == newton.scf.solver


@pytest.mark.parametrize("kwargs", [{"charge": 1, "spin": 1}, {"charge": 1, "spin": 1,
                                                               "reference": "rohf"},
                                    {"scf_type": "conv"}], ids=["uhf", "rohf", "exact"])
def test_the_second_order_solver_after_a_stall_for_other_references(monkeypatch, kwargs):
    """The forced stall of the test above on UHF, ROHF and an exact-integral SCF: the same
    SCF and MP2 energies as plain DIIS."""
    from dfmp2 import scf

    plain = dfmp2.run(WATER, **kwargs)
    monkeypatch.setattr(scf, "_stall_watch", _stall_at_cycle_3)
    newton = dfmp2.run(WATER, **kwargs)
    assert "second-order (Newton, PySCF)" in newton.scf.solver
    assert newton.scf.energy == pytest.approx(plain.scf.energy, abs=TOL_SCF_TIGHT)
    assert newton.e_tot == pytest.approx(plain.e_tot, abs=TOL_RESTART)


def test_an_scf_that_stalled_and_then_ran_out_of_cycles_says_it_stalled(monkeypatch):
    """DIIS stalled, PySCF's second-order solver took no step and DIIS again ran into
    --max-cycle: the error names the stall and the threshold to loosen, not only --max-cycle
    (a --conv-tol-grad of 1e-30 ended so on water after 100 cycles, advising --max-cycle)."""
    from pyscf.soscf import newton_ah

    from dfmp2 import scf
    from dfmp2.errors import ConvergenceError

    def no_step(mf, mo_coeff, mo_occ, *_args, **_kwargs):
        return False, 0.0, None, mo_coeff, mo_occ

    monkeypatch.setattr(scf, "_stall_watch", _stall_at_cycle_3)
    monkeypatch.setattr(newton_ah, "kernel", no_step)
    with pytest.raises(ConvergenceError, match=r"^the DF-RHF did not converge in 5 cycles "
                       r"\(last energy .* Eh\): DIIS stalled at \|g\| = .* \(threshold 1e-07\) "
                       r"and the solvers after it did not finish; loosen --conv-tol-grad, or "
                       r"raise --max-cycle$"):
        dfmp2.run(WATER, max_cycle=5)


def test_a_failing_second_order_solver_is_a_convergence_error(monkeypatch):
    """When PySCF's second-order solver cannot continue a stalled DIIS, the run ends with one
    ConvergenceError naming the stall, not a traceback."""
    from pyscf.soscf import newton_ah

    from dfmp2 import scf
    from dfmp2.errors import ConvergenceError

    def no_second_derivatives(*_args, **_kwargs):
        raise NotImplementedError("functional has no second derivatives\nin libxc")

    monkeypatch.setattr(scf, "_stall_watch", _stall_at_cycle_3)
    monkeypatch.setattr(newton_ah, "kernel", no_second_derivatives)
    with pytest.raises(ConvergenceError, match=r"^the DF-RHF stalled at \|g\| = .* after 3 DIIS "
                       r"cycles and PySCF's second-order solver could not continue \(functional "
                       r"has no second derivatives\); loosen --conv-tol-grad$"):
        dfmp2.run(WATER)


def _stall_in_the_window(conv_tol, conv_tol_grad, max_cycle):
    """A stand-in for dfmp2.scf._stall_watch that declares a stall at the first cycle whose
    gradient is over the threshold but under sqrt(conv_tol) (a DFT grid's noise floor; the
    test lifts dfmp2.scf.KS_STALL_LIMIT so that this window is the accepted one)."""
    from dfmp2 import scf

    def watch(cycle, change, gradient, envs):
        if conv_tol_grad < gradient <= conv_tol ** 0.5:
            raise scf._Stalled(cycle, gradient, envs)
    return watch


@pytest.mark.parametrize("newton", ["raises", "stops"])
def test_a_ks_scf_stalled_on_the_grids_noise_is_accepted_under_the_default_threshold(
        monkeypatch, newton):
    """A KS SCF whose DIIS stalls over its default gradient threshold (1e-6) but under
    sqrt(conv_tol), PySCF's own default, is accepted as converged when the second-order solver
    cannot finish (it fails, or stops, DIIS stalls again and the Newton-Raphson steps gain
    nothing): the stalled cycle's orbitals and energy, said in the solver record and the
    summary. A threshold the user gave, or an HF reference, ends in a ConvergenceError
    instead."""
    from pyscf.soscf import newton_ah

    from dfmp2 import scf, scf_newton
    from dfmp2.errors import ConvergenceError

    kwargs = {"xc": "b2plyp", "conv_tol": 1e-7}
    plain = dfmp2.run(WATER, **kwargs)

    def second_order(mf, mo_coeff, mo_occ, *_args, **_kwargs):
        if newton == "raises":
            raise NotImplementedError("functional has no second derivatives")
        return False, 0.0, None, mo_coeff, mo_occ  # no step taken: DIIS again

    def no_gain(mf, mo_coeff, mo_occ, max_steps, report=None):
        return scf_newton.Steps(False, 0.0, mo_coeff, mo_occ, None, 1.0, 1)  # a noise floor

    monkeypatch.setattr(scf, "_stall_watch", _stall_in_the_window)
    monkeypatch.setattr(scf, "newton_raphson", no_gain)
    monkeypatch.setattr(scf, "KS_STALL_LIMIT", 1.0)  # the window up to sqrt(conv_tol) = 3.2e-4
    monkeypatch.setattr(newton_ah, "kernel", second_order)
    accepted = dfmp2.run(WATER, **kwargs)
    assert accepted.scf.converged and "accepted (default KS threshold 1e-06" in \
        accepted.scf.solver
    assert ("could not continue" in accepted.scf.solver) == (newton == "raises")
    # in the order they ran: the stall, the steps that did not finish it, the acceptance
    assert (re.search(r"again for \d+ cycles?, stalled at \|g\| = \S+; then Newton-Raphson for "
                      r"1 cycle, not converged \(last \|g\| = 1.0e\+00\); accepted \(default",
                      accepted.scf.solver) is not None) == (newton == "stops")
    assert "accepted (default KS threshold" in accepted.summary()
    assert accepted.scf.energy == pytest.approx(plain.scf.energy, abs=TOL_SCF_ACCEPTED)
    for refused in ({**kwargs, "conv_tol_grad": 1e-6}, {"conv_tol": 1e-7}):
        with pytest.raises(ConvergenceError, match=r"stalled at \|g\| = "):
            dfmp2.run(WATER, **refused)


def test_a_stalled_ks_scf_is_accepted_up_to_the_smaller_of_the_limit_and_sqrt_conv_tol():
    """The default conv_tol (1e-10) would give sqrt(conv_tol) = 1e-5: the bound stays at
    KS_STALL_LIMIT; a tighter conv_tol tightens it; a given conv_tol_grad, an HF reference or a
    stall without a Fock matrix (a second-order step) is never accepted."""
    from dfmp2 import scf
    from dfmp2.options import Options

    envs = {"e_tot": -1.0, "mo_coeff": None, "mo_occ": None, "fock": object()}

    def bound(gradient, **options):
        return scf._ks_noise_bound(Options(**options), scf._Stalled(5, gradient, envs))

    assert Options().conv_tol == 1e-10
    assert bound(3e-6, xc="b2plyp") == scf.KS_STALL_LIMIT == 3.2e-6
    assert bound(4e-6, xc="b2plyp") is None
    assert bound(1.5e-6, xc="b2plyp", conv_tol=1e-12) is None
    assert bound(0.9e-6, xc="b2plyp", conv_tol=1e-12) == pytest.approx(1e-6)
    assert bound(2e-6, xc="b2plyp", conv_tol_grad=1e-6) is None
    assert bound(2e-6) is None
    assert scf._ks_noise_bound(Options(xc="b2plyp"), scf._Stalled(5, 2e-6, {**envs, "fock": None})
                               ) is None


METHANE = str(INPUTS / "methane.xyz")


def test_an_unknown_scf_fitting_basis_names_its_own_option_before_the_scf(monkeypatch):
    from dfmp2 import api

    monkeypatch.setattr(api, "run_scf", lambda *a, **k: pytest.fail("the SCF ran"))
    with pytest.raises(InputError, match=r"SCF fitting basis 'no-such-jkfit'.*--scf-auxbasis"):
        dfmp2.run(WATER, scf_auxbasis="no-such-jkfit")
    with pytest.raises(InputError, match=r"SCF fitting basis 'cc-pvtz-jkfit'.*He.*--scf-auxbasis"):
        dfmp2.run("He 0 0 0", scf_auxbasis="cc-pvtz-jkfit")


def test_mixed_precision_needs_exact_exchange_in_the_ks_part():
    with pytest.raises(InputError, match="KS part 'pbe' has no exact exchange"):
        dfmp2.run(WATER, xc="pbe", os_scale=0.5, ss_scale=0.5, scf_precision="mixed")


def test_too_little_memory_is_refused_with_the_larger_of_the_scf_and_mp2_needs():
    """Both planners run before the SCF; where both refuse, the refusal is the one that needs
    more, so its advice is enough for both (benzene: the DF-SCF's tensor needs more than the
    MP2 step)."""
    from dfmp2 import api
    from dfmp2.errors import ResourceError
    from dfmp2.options import Options
    from dfmp2.scf import plan_scf

    benzene = str(INPUTS / "benzene.xyz")
    _, mol, auxmol, _, _ = api._setup(benzene, {}, None)
    needs = {}
    for name, check in (
            ("scf", lambda opts: plan_scf(mol, opts)),
            ("mp2", lambda opts: api.plan_run(mol, auxmol, api.guess_occupations(mol, "rhf"),
                                              opts))):
        with pytest.raises(ResourceError) as err:
            check(Options(max_memory=2))
        needs[name] = err.value.least_mb
    assert needs["scf"] > needs["mp2"]
    with pytest.raises(ResourceError, match="for the DF-SCF") as err:
        dfmp2.run(benzene, max_memory=needs["mp2"] - 1)  # both refuse: the SCF's need is named
    assert err.value.least_mb == needs["scf"]
    api._setup(benzene, {"max_memory": needs["scf"]}, None)  # its advice plans both


def test_the_record_of_a_tensor_on_disk_says_what_memory_would_have_taken():
    result = dfmp2.run(METHANE, max_memory=3)
    match = re.search(r"on disk.*in memory it would take ([\d.]+) MB .*more than the ([\d.]+) "
                      r"MB usable of --max-memory 3 MB", result.scf.jk)
    assert match and float(match.group(1)) > float(match.group(2)), result.scf.jk


def test_a_batch_gives_each_geometry_its_own_chkfile(tmp_path):
    from click.testing import CliRunner

    from dfmp2.cli import main

    frames = tmp_path / "two.xyz"
    frames.write_text("".join(f"3\nframe {k}\nO 0 0 0\nH 0 0.757 0.587\nH 0 -0.757 {y}\n"
                              for k, y in ((1, 0.587), (2, 0.600))))
    shared = CliRunner().invoke(main, ["run", str(frames), "--chkfile", str(tmp_path / "b.chk")])
    assert shared.exit_code == 1 and "each SCF needs its own checkpoint" in shared.stderr
    assert not (tmp_path / "b.chk").exists()  # refused before the first SCF
    per_frame = ["run", str(frames), "--chkfile", str(tmp_path / "b{index}.chk"), "-q"]
    first = CliRunner().invoke(main, per_frame)
    assert first.exit_code == 0, first.output
    assert sorted(p.name for p in tmp_path.glob("b*.chk")) == ["b1.chk", "b2.chk"]
    again = CliRunner().invoke(main, per_frame + ["--json", str(tmp_path / "r{index}.json")])
    assert again.exit_code == 0, again.output
    for k in (1, 2):
        record = json.loads((tmp_path / f"r{k}.json").read_text())
        scf = record["extras"]["scf"]
        assert scf["restart"].startswith(f"converged SCF from chkfile {tmp_path / f'b{k}.chk'} "
                                         "(no SCF cycle")
        assert scf["cycles"] == 0 and record["properties"]["scf_iterations"] == 0


def test_a_mixed_precision_restart_says_it_ran_in_float64(tmp_path):
    chk = str(tmp_path / "w.chk")
    first = dfmp2.run(WATER, chkfile=chk, scf_precision="mixed")
    assert "in float32 for the first" in first.scf.jk
    again = dfmp2.run(WATER, chkfile=chk, scf_precision="mixed")
    assert again.scf.cycles == 0 and "float64 throughout" in again.scf.jk
    assert again.e_corr == first.e_corr  # the mixed SCF's orbitals, as saved
    assert again.e_tot == pytest.approx(first.e_tot, abs=TOL_SKIPPED_RESTART)


def test_the_scf_diagonalises_through_the_registry_as_pyscf_would():
    """dfmp2's DF-SCF diagonalises each cycle's Fock matrix with the registry's eigh (recorded
    per call: one per cycle and PySCF's extra one after convergence), with PySCF's
    orthogonaliser and phase convention: the same eigenvalues and vectors as PySCF's solver,
    also with an orthogonaliser that drops dependent combinations."""
    import numpy as np
    from pyscf import gto
    from pyscf.scf import hf

    from dfmp2 import api, scf
    from dfmp2.options import Options

    result = dfmp2.run(WATER)
    ops = json.loads(result.to_json())["extras"]["backend"]["ops"]
    assert ops["eigh"]["calls"] == result.scf.cycles + 1 and ops["eigh"]["mode"] == "host"
    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    s = mol.intor("int1e_ovlp")
    h = mol.intor("int1e_kin") + mol.intor("int1e_nuc")
    x = hf.check_linear_dependency(s)
    eigh = scf.registry_eigh(api._dispatcher(Options()))
    dependent = scf.scf.addons.canonical_orth_(s, thr=0.1)  # fewer columns than rows
    assert dependent.shape[1] < dependent.shape[0]
    for given in (x, dependent):
        w, c = eigh(h, s, x=given)
        w_ref, c_ref = hf.SCF._eigh(None, h, s, x=given)
        # each vector PySCF's up to its sign (the largest component can tie between
        # symmetry-equivalent atoms, where rounding picks the phase)
        overlap = np.abs(np.diag(c.T @ s @ c_ref))
        assert np.abs(w - w_ref).max() < TOL_MATRIX_ABS
        assert np.abs(overlap - 1).max() < TOL_EIGH_ORTHO


def test_a_chkfile_another_run_wrote_meanwhile_is_kept(tmp_path):
    """Two runs given one --chkfile: the path was free (or this system's) when the run checked
    it, and holds another molecule's SCF when this one converges: that is kept, and the run
    says so (it was overwritten without a word)."""
    path = tmp_path / "shared.chk"
    methane = dfmp2.run("C 0 0 0; H 0.63 0.63 0.63; H -0.63 -0.63 0.63; H -0.63 0.63 -0.63; "
                        "H 0.63 -0.63 -0.63", basis="sto-3g", chkfile=str(tmp_path / "m.chk"))
    assert methane.scf.converged

    def other_run_writes(stage, done, total) -> None:
        if stage.startswith("SCF") and not path.exists():
            path.write_bytes((tmp_path / "m.chk").read_bytes())

    result = dfmp2.run(WATER, basis="sto-3g", chkfile=str(path), progress=other_run_writes)
    assert "not written: written meanwhile, it now holds another calculation (other atoms)" \
        in result.scf.restart
    assert any("could not write the chkfile" in text for text in result.warnings)
    assert path.read_bytes() == (tmp_path / "m.chk").read_bytes()


#: Water with both O-H bonds stretched (1.6 and 1.58 Angstrom): its singlet UHF has a DIIS
#: stall that only Newton-Raphson steps finish.
STRETCHED_WATER = "O 0 0 0; H 0 0 1.6; H 1.55 0 -0.3"


def test_a_singlet_uhf_stalled_at_a_saddle_is_finished_by_newton_raphson_steps(tmp_path):
    """Stretched water's singlet UHF (cc-pVDZ, default tolerances): DIIS, cycle for cycle
    PySCF's own, approaches the spin-restricted solution, a saddle of the UHF energy (Hessian
    eigenvalues -0.16 and -0.13, spin-flip rotations), and stalls at |g| ~ 2e-7 over 1e-7;
    PySCF's augmented-Hessian solver takes no step there (its subspace turns linearly
    dependent), DIIS stalls again, and Newton-Raphson steps converge it (|g| 1.8e-7 -> 2e-11
    in one step). The energy is PySCF's DF-UHF's: its DIIS settles at the same stationary
    point, the energy to 1e-13 Eh, while whether its gradient ever drops under the threshold is
    rounding's chance (at cycle 70 on one machine; not within 100 on another), so its
    convergence flag is not asked for. PySCF's own gradient of the written orbitals is under
    the threshold."""
    import numpy as np
    from pyscf import gto, lib
    from pyscf import scf as pyscf_scf

    chkfile = str(tmp_path / "stretched.chk")
    result = dfmp2.run(STRETCHED_WATER, reference="uhf", spin=0, chkfile=chkfile)
    assert result.scf.converged
    assert result.scf.solver.endswith("; then Newton-Raphson (MINRES on PySCF's orbital "
                                      "Hessian) for 1 cycle")
    assert [w for w in result.warnings if "finished by Newton-Raphson steps, which converge "
            "to saddle points" in w and "--stability check" in w] == list(result.warnings)
    assert len(result.warnings) == 1
    mol = gto.M(atom=STRETCHED_WATER, basis="cc-pvdz", verbose=0)
    ref = pyscf_scf.UHF(mol).density_fit(auxbasis="cc-pvdz-jkfit")
    ref.conv_tol, ref.conv_tol_grad = result.scf.conv_tol, result.scf.conv_tol_grad
    ref.max_cycle = 100
    ref.kernel()
    assert result.scf.energy == pytest.approx(ref.e_tot, abs=TOL_SCF_TIGHT)
    mo_coeff, mo_occ = (np.asarray(lib.chkfile.load(chkfile, f"scf/{key}"))
                        for key in ("mo_coeff", "mo_occ"))
    assert np.linalg.norm(ref.get_grad(mo_coeff, mo_occ)) < result.scf.conv_tol_grad


def test_a_mixed_precision_scf_that_runs_out_of_cycles_says_float32_cycles_do_not_count():
    from dfmp2.errors import ConvergenceError

    with pytest.raises(ConvergenceError, match=r"did not converge in 3 cycles .*; \d+ of its "
                                               r"J/K builds ran in float32 \(--scf-precision "
                                               r"mixed\), whose cycles never count"):
        dfmp2.run(WATER, scf_precision="mixed", max_cycle=3)
    with pytest.raises(ConvergenceError) as fp64:
        dfmp2.run(WATER, max_cycle=3)
    assert "float32" not in str(fp64.value)


@pytest.mark.parametrize("damage", ["mixed occupied orbitals", "other orbital energies",
                                    "virtual energies 9e-6 off", "orbitals out of order",
                                    "spins swapped", "another electron count"])
def test_a_converged_chkfile_that_is_not_the_scfs_own_last_step_is_a_guess(tmp_path, damage):
    """What the MP2 step takes from a skipped SCF must be what the SCF's last step gives:
    canonical orbitals with their own energies (orbitals mixed within the occupied space keep
    the density, energy and gradient), in ascending order (frozen core takes the first ones),
    occupied as their energies say (UHF's alpha and beta sets swapped; a file's occupations of
    another electron count). Each such file is the SCF's initial guess instead, and the run
    gives the fresh run's energies."""
    import h5py
    import numpy as np

    chk = str(tmp_path / "oh.chk")
    kwargs = {"spin": 1, "frozen_core": True, "basis": "cc-pvdz"}
    fresh = dfmp2.run(OH, **kwargs)
    dfmp2.run(OH, chkfile=chk, **kwargs)
    with h5py.File(chk, "a") as f:
        coeff, energy, occ = (f[f"scf/{key}"][()] for key in ("mo_coeff", "mo_energy", "mo_occ"))
        if damage == "mixed occupied orbitals":
            c, s_ = np.cos(0.5), np.sin(0.5)
            coeff[:, :, [2, 3]] = coeff[:, :, [2, 3]] @ np.array([[c, -s_], [s_, c]])
        elif damage == "other orbital energies":
            energy = energy + 1e-3
        elif damage == "virtual energies 9e-6 off":
            energy = np.where(occ > 0, energy, energy + 9e-6)
        elif damage == "orbitals out of order":  # O 1s moved among the virtual orbitals
            order = list(range(energy.shape[1]))
            order.insert(10, order.pop(0))
            coeff, energy, occ = coeff[:, :, order], energy[:, order], occ[:, order]
        elif damage == "spins swapped":
            coeff, energy, occ = coeff[::-1], energy[::-1], occ[::-1]
        else:
            occ = occ.copy()
            occ[:, 5] = 1.0  # an anion's occupations: seven and six electrons
        for key, value in (("mo_coeff", coeff), ("mo_energy", energy), ("mo_occ", occ)):
            del f[f"scf/{key}"]
            f[f"scf/{key}"] = value
    again = dfmp2.run(OH, chkfile=chk, **kwargs)
    assert again.scf.cycles >= 1 and again.scf.restart == f"initial guess from chkfile {chk}"
    assert again.e_tot == pytest.approx(fresh.e_tot, abs=TOL_RESTART)
    assert (again.sizes.nalpha, again.sizes.nbeta) == (5, 4)


def test_a_skipped_scf_that_follows_an_instability_says_so_and_is_written(tmp_path):
    """A chkfile holding a saddle point of the SCF (stretched H2's restricted solution in UHF)
    is converged, so a run with --stability follow takes it without a cycle, then leaves it for
    the broken-symmetry minimum: the record says both, and the minimum is written, which the
    next run takes as it is."""
    chk = str(tmp_path / "h2.chk")
    h2 = "H 0 0 0; H 0 0 2.5"
    saddle = dfmp2.run(h2, reference="uhf", chkfile=chk)
    followed = dfmp2.run(h2, reference="uhf", chkfile=chk, stability="follow")
    assert followed.scf.restart.startswith(f"converged SCF from chkfile {chk} (no SCF cycle")
    assert "; then --stability follow left it for a lower solution (" in followed.scf.restart
    assert followed.scf.cycles >= 1 and followed.e_scf < saddle.e_scf - 0.1
    again = dfmp2.run(h2, reference="uhf", chkfile=chk, stability="follow")
    assert again.scf.cycles == 0 and again.e_scf == pytest.approx(followed.e_scf,
                                                                   abs=TOL_SKIPPED_RESTART)
    assert "then --stability follow" not in again.scf.restart
