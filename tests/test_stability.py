"""The SCF's stability analysis (``stability='check'``/``'follow'``, ``--stability``): its
eigenvalues against PySCF's Hessians, a followed instability against PySCF's own, the record,
the warnings, the summary, the command line and the QCSchema keyword."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pyscf import df, gto, scf
from pyscf.mp import dfump2
from pyscf.scf import stability as pyscf_stability
from pyscf.soscf import newton_ah

import dfmp2
from dfmp2 import stability
from dfmp2.errors import InputError
from dfmp2.results import Result

from tolerances import TOL_FOLLOWED, TOL_STABILITY_EIGENVALUE

STRETCHED_H2 = "H 0 0 0; H 0 0 2.5"
WATER = "O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.587"
OH = "O 0 0 0; H 0 0 0.97"


def _pyscf_scf(atom: str, spin: int, kind, basis: str = "cc-pvdz", xc: str | None = None):
    """PySCF's own DF-SCF with dfmp2's JK-fit partner basis and default tolerances."""
    mol = gto.M(atom=atom, basis=basis, spin=spin, verbose=0)
    mf = kind(mol) if xc is None else kind(mol, xc=xc)
    jkfit = f"{basis}-jkfit" if basis.startswith("cc-") else "def2-universal-jkfit"
    mf = mf.density_fit(auxbasis=jkfit)
    mf.conv_tol, mf.conv_tol_grad = 1e-10, 1e-7
    mf.kernel()
    assert mf.converged
    return mf


def _dense_lowest(hop, size: int) -> float:
    """The lowest eigenvalue of the operator ``hop`` on vectors of ``size``, from its dense
    matrix (every unit vector)."""
    h = np.array([hop(unit) for unit in np.eye(size)])
    return float(np.linalg.eigvalsh((h + h.T) / 2)[0])


def _internal_reference(mf) -> float:
    gen = (newton_ah.gen_g_hop_rohf if isinstance(mf, scf.rohf.ROHF) else
           newton_ah.gen_g_hop_uhf if isinstance(mf, scf.uhf.UHF) else newton_ah.gen_g_hop_rhf)
    g, hop, _ = gen(mf, mf.mo_coeff, mf.mo_occ, with_symmetry=False)
    return _dense_lowest(lambda x: hop(x).real * 2, g.size)


@pytest.mark.parametrize("atom, spin, reference, kind, xc, basis", [
    (WATER, 0, "rhf", scf.RHF, None, "cc-pvdz"),
    (STRETCHED_H2, 0, "rhf", scf.RHF, None, "cc-pvdz"),
    (STRETCHED_H2, 0, "uhf", scf.UHF, None, "cc-pvdz"),
    (OH, 1, "uhf", scf.UHF, None, "cc-pvdz"),
    (OH, 1, "rohf", scf.ROHF, None, "cc-pvdz"),
    (WATER, 0, "rhf", scf.RKS, "b2plyp", "def2-svp"),
])
def test_the_lowest_eigenvalues_equal_those_of_pyscfs_hessians(atom, spin, reference, kind, xc,
                                                              basis):
    """dfmp2's analysis of its own SCF (dfmp2's J/K) against the dense Hessians of PySCF's
    DF-SCF (PySCF's J/K): within the SCF's own kind, and RHF -> UHF for a closed shell."""
    options = {"reference": reference, "basis": basis, "stability": "check"}
    if xc is not None:
        options["xc"] = xc
    record = dfmp2.run(atom, spin=spin, **options).scf.stability
    # a double hybrid's reference is its KS part: B2PLYP's, as dfmp2 runs it
    mf = _pyscf_scf(atom, spin, kind, basis, xc and "0.53*HF + 0.47*B88, 0.73*LYP")
    expected = {"internal": _internal_reference(mf)}
    if reference == "rhf":
        _, _, hop, hdiag = pyscf_stability._gen_hop_rhf_external(mf, with_symmetry=False)
        expected["rhf_to_uhf"] = _dense_lowest(hop, hdiag.size)
    assert set(record) == {"mode", "follows", "seconds", "jk_builds", *expected}
    assert record["jk_builds"] > 0 and record["seconds"] > 0
    assert record["mode"] == "check" and record["follows"] == []
    for name, value in expected.items():
        assert record[name]["lowest_eigenvalue"] == pytest.approx(
            value, abs=TOL_STABILITY_EIGENVALUE), name
        assert record[name]["stable"] == (value >= stability.UNSTABLE_BELOW)
        assert record[name]["converged"] is True


def test_following_an_instability_reaches_pyscfs_followed_solution():
    """A UHF of stretched H2 from the default guess converges to the restricted (saddle)
    solution; 'follow' goes on to the broken-symmetry minimum that PySCF's own stability
    analysis and a second SCF reach, with its MP2 energy."""
    mf = _pyscf_scf(STRETCHED_H2, 0, scf.UHF)
    saddle = mf.e_tot
    rotated = mf.stability()[0]
    mf.kernel(mf.make_rdm1(rotated, mf.mo_occ))
    pt = dfump2.DFUMP2(mf)
    pt.with_df = df.DF(mf.mol, auxbasis="cc-pvdz-ri")
    pt.kernel()
    assert mf.e_tot < saddle - 0.1  # the case is what it should be

    result = dfmp2.run(STRETCHED_H2, reference="uhf", stability="follow")
    assert result.e_scf == pytest.approx(mf.e_tot, abs=TOL_FOLLOWED)
    assert result.e_tot == pytest.approx(mf.e_tot + pt.e_corr, abs=TOL_FOLLOWED)
    record = result.scf.stability
    assert record["internal"]["stable"] is True
    [follow] = record["follows"]
    assert follow["from_energy"] == pytest.approx(saddle, abs=TOL_FOLLOWED)
    assert follow["energy"] == result.e_scf and follow["lowered"] is True
    assert follow["eigenvalue"] < stability.UNSTABLE_BELOW
    assert result.scf.cycles > follow["cycles"]  # both SCFs' cycles
    assert result.warnings == ()
    assert result.scf.s2 > 0.9  # spin-polarised: the broken-symmetry determinant


def test_check_reports_a_saddle_point_and_keeps_it():
    result = dfmp2.run(STRETCHED_H2, reference="uhf", stability="check")
    record = result.scf.stability
    assert record["internal"]["stable"] is False and record["follows"] == []
    assert result.e_scf == pytest.approx(_pyscf_scf(STRETCHED_H2, 0, scf.UHF).e_tot,
                                         abs=TOL_FOLLOWED)
    [warning] = result.warnings
    assert "saddle point" in warning and "--stability follow" in warning
    assert "internal UNSTABLE" in result.summary()


def test_a_kohn_sham_reference_is_named_as_such():
    result = dfmp2.run(STRETCHED_H2, basis="sto-3g", xc="b2plyp", stability="check")
    [warning] = [w for w in result.warnings if "unstable towards" in w]
    assert "lowest RKS -> UKS Hessian eigenvalue" in warning and "runs UKS" in warning
    assert "RKS -> UKS UNSTABLE" in result.summary()


def test_an_rhf_unstable_towards_uhf_says_how_to_reach_it():
    result = dfmp2.run(STRETCHED_H2, stability="check")
    record = result.scf.stability
    assert record["internal"]["stable"] is True
    assert record["rhf_to_uhf"]["stable"] is False
    [warning] = result.warnings
    assert "unstable towards DF-UHF" in warning and "--reference uhf" in warning
    # follow cannot leave RHF: the same RHF, the same warning
    followed = dfmp2.run(STRETCHED_H2, stability="follow")
    assert followed.e_scf == result.e_scf and followed.scf.stability["follows"] == []
    assert followed.warnings == result.warnings


def test_a_stable_scf_has_its_record_and_no_warning_and_none_runs_no_analysis():
    checked = dfmp2.run(WATER, basis="sto-3g", stability="check")
    assert checked.scf.stability["internal"]["stable"] is True
    assert checked.scf.stability["rhf_to_uhf"]["stable"] is True
    assert checked.warnings == ()
    assert "stability  internal stable (lowest Hessian eigenvalue" in checked.summary()
    plain = dfmp2.run(WATER, basis="sto-3g")
    assert plain.scf.stability is None and "stability" not in plain.summary()
    assert plain.e_tot == checked.e_tot


def test_the_mixed_scfs_note_counts_the_scfs_builds_not_the_analysiss():
    """A mixed-precision SCF checked for stability: its J/K note counts the SCF's own builds
    (float32, then float64), not the analysis's Hessian products, which its record counts."""
    import re

    result = dfmp2.run(WATER, basis="cc-pvdz", scf_precision="mixed", stability="check")
    found = re.search(r"in float32 for the first (\d+) of the SCF's (\d+) builds", result.scf.jk)
    assert found, result.scf.jk
    fp32, builds = map(int, found.groups())
    analysis = result.scf.stability["jk_builds"]
    assert 0 < fp32 < builds and analysis > 0
    assert result.scf.jk_stats["calls"] == builds + analysis


def test_a_follow_that_does_not_lower_the_energy_keeps_the_solution_it_left(monkeypatch,
                                                                             tmp_path):
    """An SCF that does not end below the solution it left (here: a rotation to a higher
    determinant, the occupied and the lowest virtual orbital of each spin swapped) is
    dropped: the run keeps the saddle point, with its analysis, and says so."""
    saddle = dfmp2.run(STRETCHED_H2, reference="uhf", stability="check")

    def swapped(mf, vector):
        mo = np.array(mf.mo_coeff)
        mo[:, :, [0, 1]] = mo[:, :, [1, 0]]
        return mo

    monkeypatch.setattr(stability, "rotated_orbitals", swapped)
    chk = str(tmp_path / "h2.chk")
    result = dfmp2.run(STRETCHED_H2, reference="uhf", stability="follow", chkfile=chk)
    from pyscf import lib
    saved = lib.chkfile.load(chk, "scf")
    assert saved["e_tot"] == saddle.e_scf  # the checkpoint holds the solution kept
    [follow] = result.scf.stability["follows"]
    assert follow["lowered"] is False and follow["energy"] > follow["from_energy"]
    assert result.e_scf == saddle.e_scf and result.e_tot == saddle.e_tot
    assert result.scf.stability["internal"] == saddle.scf.stability["internal"]
    assert result.scf.cycles == saddle.scf.cycles + follow["cycles"]
    [warning] = result.warnings
    assert "not below" in warning and "keeps the saddle point" in warning
    assert "not lower: the solution it left kept" in result.summary()


def test_a_followed_scf_that_does_not_converge_is_one_line():
    with pytest.raises(dfmp2.ConvergenceError, match="after following an instability of the "
                       r"converged SCF \(E = -0.86535.*--stability check to keep"):
        dfmp2.run(STRETCHED_H2, reference="uhf", stability="follow", max_cycle=6)


def test_no_rotations_is_stable_and_said_so():
    """An atom in a minimal basis has no virtual orbital: nothing to analyse."""
    for atom, spin, reference in (("He 0 0 0", 0, "rhf"), ("H 0 0 0", 1, "uhf"),
                                  ("H 0 0 0", 1, "rohf")):
        result = dfmp2.run(atom, basis="sto-3g", spin=spin, reference=reference,
                           stability="follow")
        record = result.scf.stability
        assert record["internal"]["lowest_eigenvalue"] is None
        assert record["internal"]["stable"] is True
        assert not any("stab" in w or "saddle" in w for w in result.warnings)
        assert "internal stable (no orbital rotations)" in result.summary()
        Result.from_dict(json.loads(json.dumps(result.to_dict())))


def test_the_lowest_eigenvalue_of_a_symmetric_molecule_is_the_lowest():
    """C2's UHF at its restricted solution: the rotations with the smallest diagonal elements
    are not those of the lowest eigenvalue (one Davidson root from three of them found -0.311
    for -0.468 Eh)."""
    mol = gto.M(atom="C 0 0 0; C 0 0 1.25", basis="6-31g", verbose=0)
    mf = scf.UHF(mol)
    mf.conv_tol = 1e-10
    mf.kernel()
    assert mf.converged
    assert stability.internal(mf).eigenvalue == pytest.approx(_internal_reference(mf),
                                                              abs=TOL_STABILITY_EIGENVALUE)


def test_a_kohn_sham_reference_has_the_grid_aware_threshold():
    result = dfmp2.run(WATER, basis="6-31g", xc="b2plyp", stability="check")
    assert result.scf.stability["internal"]["threshold"] == stability.UNSTABLE_BELOW_KS
    assert dfmp2.run(WATER, basis="6-31g", stability="check").scf.stability[
        "internal"]["threshold"] == stability.UNSTABLE_BELOW
    assert stability.UNSTABLE_BELOW_KS < stability.UNSTABLE_BELOW < 0


def test_an_analysis_that_does_not_converge_says_so(monkeypatch):
    monkeypatch.setattr(stability, "DAVIDSON_CYCLES", 1)
    monkeypatch.setattr(stability, "DAVIDSON_TOL", 1e-14)
    result = dfmp2.run(WATER, basis="6-31g", stability="check")
    assert result.scf.stability["internal"]["converged"] is False
    assert any("did not converge in 1 Davidson" in w for w in result.warnings)
    assert "not converged" in result.summary()


def test_the_record_round_trips_and_a_damaged_one_is_one_line():
    result = dfmp2.run(STRETCHED_H2, reference="uhf", stability="follow")
    again = Result.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.scf.stability == result.scf.stability
    assert "internal instability 1 (-0.611880 Eh) followed" in again.summary()
    assert "then internal stable" in again.summary()
    data = result.to_dict()
    data["extras"]["scf"]["stability"]["internal"]["lowest_eigenvalue"] = "low"
    with pytest.raises(InputError, match="stability.internal.lowest_eigenvalue is 'low'"):
        Result.from_dict(data)
    data = result.to_dict()
    data["extras"]["scf"]["stability"]["follows"] = [{"energy": 1.0}]
    with pytest.raises(InputError, match=r"follows\[0\]\.eigenvalue is None"):
        Result.from_dict(data)
    for where, value in (("mode", "maybe"), ("internal.lowest_eigenvalue", float("nan")),
                         ("internal.stable", False)):
        data = result.to_dict()
        *path, last = ["extras", "scf", "stability", *where.split(".")]
        node = data
        for key in path:
            node = node[key]
        node[last] = value
        with pytest.raises(InputError, match=f"stability.{where} is"):
            Result.from_dict(data)


def test_the_option_is_checked_and_dfmp2_of_an_scf_refuses_it():
    with pytest.raises(InputError, match="stability must be one of none, check, follow"):
        dfmp2.run(WATER, basis="sto-3g", stability="yes")
    assert dfmp2.run(WATER, basis="sto-3g", stability="CHECK").scf.stability["mode"] == "check"
    mf = scf.RHF(gto.M(atom=WATER, basis="sto-3g", verbose=0)).run()
    with pytest.raises(InputError, match="stability: DFMP2"):
        dfmp2.DFMP2(mf, stability="check")


def test_the_command_line_and_a_qcschema_keyword(tmp_path):
    from click.testing import CliRunner

    from dfmp2.cli import main

    out = CliRunner().invoke(main, ["run", STRETCHED_H2, "--reference", "uhf", "--stability",
                                    "follow", "--json", str(tmp_path / "r.json")])
    assert out.exit_code == 0, out.output
    assert "internal instability 1 (" in out.output
    # what converged each SCF adds up to the cycles the SCF line says
    line = next(text for text in out.output.splitlines() if "converged in" in text)
    total = int(line.split("converged in ")[1].split()[0])
    parts = [int(p.split(" cycles")[0]) for p in line.split("DIIS (PySCF) for ")[1:]]
    assert len(parts) == 2 and sum(parts) == total
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["extras"]["scf"]["stability"]["internal"]["stable"] is True
    schema = {"schema_name": "qcschema_input", "schema_version": 1,
              "molecule": {"symbols": ["H", "H"], "geometry": [0, 0, 0, 0, 0, 2.5 / 0.52917721],
                           "molecular_multiplicity": 1},
              "driver": "energy", "model": {"method": "mp2", "basis": "cc-pvdz"},
              "keywords": {"reference": "uhf", "stability_analysis": "FOLLOW"}}
    path = tmp_path / "in.json"
    path.write_text(json.dumps(schema))
    out = CliRunner().invoke(main, ["run", str(path), "--json", str(tmp_path / "s.json")])
    assert out.exit_code == 0, out.output
    saved = json.loads((tmp_path / "s.json").read_text())
    assert len(saved["extras"]["scf"]["stability"]["follows"]) == 1
    bad = CliRunner().invoke(main, ["run", WATER, "--stability", "maybe"])
    assert bad.exit_code != 0 and "maybe" in bad.output


def test_the_analysis_reports_its_progress():
    """A long analysis moves the terminal's status line: each Davidson iteration is a
    progress report, after the SCF's cycles."""
    seen = []  # (in STO-3G the ten start vectors span all rotations: done before a report)
    dfmp2.run(WATER, basis="6-31g", stability="check",
              progress=lambda stage, done, total: seen.append((stage, done, total)))
    analysis = [(stage, done, total) for stage, done, total in seen
                if stage.startswith("SCF stability")]
    assert {stage.split(")")[0] for stage, _, _ in analysis} == {
        "SCF stability (internal", "SCF stability (RHF -> UHF"}
    assert all(total == stability.DAVIDSON_CYCLES and done >= 1 for _, done, total in analysis)
    first = next(i for i, (stage, _, _) in enumerate(seen) if stage.startswith("SCF stability"))
    assert any(stage.startswith("SCF E=") for stage, _, _ in seen[:first])
