"""Open shells: UHF DF-MP2 and ROHF-MBPT(2) against pinned references, live PySCF DFUMP2 on the
same SCF object, the RHF path, and every pipeline path (fused, unfused, out-of-core, precision,
NKI on the emulator). ROHF is never compared with PySCF's ROHF MP2 (it is not ROHF-MBPT(2));
its independent oracle is in test_open_shell_oracle.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pyscf import df, gto, mp, scf

import dfmp2

from tolerances import (
    TOL_8DP,
    TOL_FP32,
    TOL_FP64,
    TOL_OUTCORE,
    TOL_PRECISION,
    TOL_PRINTED,
    TOL_SCF_TIGHT,
)

NH2 = "N\nH 1 1.008\nH 1 1.008 2 105.0"

#: references.md: NH2 aug-cc-pVDZ, DF-SCF (aug-cc-pVDZ-JKFIT) + DF-MP2 (aug-cc-pVDZ-RI), from
#: QCEngine's standard suite (8 decimals). (scf, ae (singles, SS, OS, corr), fc (...)).
NH2_DF = {
    "uhf": (-55.57512538464817, (0.0, -0.03523134, -0.11960775, -0.15483909),
            (0.0, -0.03448325, -0.11792353, -0.15240678)),
    "rohf": (-55.57071142443952, (-0.00282982, -0.03544639, -0.12119864, -0.15947485),
             (-0.00280619, -0.03469227, -0.11950562, -0.15700408)),
}


#: The same with the SCF on exact integrals (QCEngine's "pk" SCF; the MP2 is density-fitted
#: with aug-cc-pVDZ-RI as above; OS not published: None).
NH2_CONV = {
    "uhf": (-55.57513805247548, (0.0, -0.03523329, None, -0.15484736),
            (0.0, -0.03448519, None, -0.15241501)),
    "rohf": (-55.570724348574, (-0.00282963, -0.03544835, None, -0.15948289),
             (-0.002806, -0.03469422, None, -0.15701209)),
}


@pytest.mark.parametrize("scf_type", ["df", "conv"])
@pytest.mark.parametrize("reference", ["uhf", "rohf"])
@pytest.mark.parametrize("frozen_core", [False, True], ids=["ae", "fc"])
def test_nh2_references(scf_type, reference, frozen_core):
    result = dfmp2.run(NH2, basis="aug-cc-pvdz", spin=1, reference=reference,
                       frozen_core=frozen_core, scf_type=scf_type, conv_tol=1e-12,
                       conv_tol_grad=1e-8)
    e_scf, ae, fc = (NH2_DF if scf_type == "df" else NH2_CONV)[reference]
    singles, ss, os_, corr = fc if frozen_core else ae
    assert result.scf.kind == reference
    assert result.e_scf == pytest.approx(e_scf, abs=TOL_SCF_TIGHT)
    assert result.e_singles == pytest.approx(singles, abs=TOL_8DP)
    assert result.e_corr_ss == pytest.approx(ss, abs=TOL_8DP)
    if os_ is not None:
        assert result.e_corr_os == pytest.approx(os_, abs=TOL_8DP)
    assert result.e_corr == pytest.approx(corr, abs=TOL_8DP)
    assert (result.sizes.nalpha, result.sizes.nbeta) == (5, 4)
    assert result.e_scs == pytest.approx(1.2 * result.e_corr_os + result.e_corr_ss / 3
                                         + result.e_singles,
                                         abs=TOL_PRINTED)


def _uhf(atom, basis, charge=0, spin=1, df_aux=None, unit="Angstrom"):
    mol = gto.M(atom=atom, basis=basis, charge=charge, spin=spin, unit=unit, verbose=0)
    mf = scf.UHF(mol)
    if df_aux:
        mf = mf.density_fit(auxbasis=df_aux)
    mf.conv_tol = 1e-12
    mf.conv_tol_grad = 1e-8
    mf.kernel()
    assert mf.converged
    return mf


WATER_CATION = "O 0 0 0; H 0 -0.757 0.587; H 0 0.757 0.587"


@pytest.mark.parametrize("frozen, corr", [(None, -0.15321910903780497),
                                          ([0], -0.15103334394544674)])
def test_pyscf_water_cation(frozen, corr):
    """PySCF's test_dfump2.py: H2O+ cc-pVDZ, conventional UHF, default RI basis."""
    pt = dfmp2.DFMP2(_uhf(WATER_CATION, "cc-pvdz", charge=1), frozen=frozen).run()
    assert pt.e_corr == pytest.approx(corr, abs=TOL_OUTCORE)
    assert pt.e_singles == 0.0


def test_gpu4pyscf_triplet_water():
    """GPU4PySCF's test_dfump2.py: triplet water def2-TZVPP, DF-UHF, def2-TZVPP-RI."""
    mf = _uhf("O 0 0 0; H 0.94 0 0; H -0.24 0 0.91", "def2-tzvpp", spin=2,
              df_aux="def2-universal-jkfit")
    pt = dfmp2.DFMP2(mf, auxbasis="def2-tzvpp-ri").run()
    assert pt.e_corr_os == pytest.approx(-0.17417641954815585, abs=TOL_FP64)
    assert pt.e_corr_ss == pytest.approx(-0.05344288088930613, abs=TOL_FP64)
    assert pt.e_corr == pytest.approx(-0.2276193004374617, abs=TOL_FP64)


LIVE = {
    "triplet-O2": ("O 0 0 0; O 0 0 1.208", 0, 2),
    "triplet-CH2": ("C 0 0 0.1; H 0 0.99 -0.45; H 0 -0.99 -0.45", 0, 2),
    "NH3-cation": ("N 0 0 0; H 0 0.94 0.3; H 0.81 -0.47 0.3; H -0.81 -0.47 0.3", 1, 1),
    "PH2-doublet": ("P 0 0 0; H 0 1.2 0.9; H 0 -1.2 0.9", 0, 1),
    "Cl-atom": ("Cl 0 0 0", 0, 1),
}


@pytest.mark.parametrize("name", sorted(LIVE))
@pytest.mark.parametrize("frozen", [None, 1])
def test_matches_live_pyscf_dfump2(name, frozen):
    """PySCF's DFUMP2 on the same SCF object with the same RI basis (energy only)."""
    atom, charge, spin = LIVE[name]
    mf = _uhf(atom, "cc-pvdz", charge=charge, spin=spin)
    ref = mp.dfump2.DFUMP2(mf, frozen=frozen)
    ref.with_df = df.DF(mf.mol, auxbasis="cc-pvdz-ri")
    ref.kernel(with_t2=False)
    pt = dfmp2.DFMP2(mf, frozen=frozen, auxbasis="cc-pvdz-ri").run()
    assert pt.e_corr == pytest.approx(ref.e_corr, abs=TOL_OUTCORE)
    assert pt.e_corr_os == pytest.approx(ref.e_corr_os, abs=TOL_OUTCORE)
    assert pt.e_corr_ss == pytest.approx(ref.e_corr_ss, abs=TOL_OUTCORE)


def test_uks_orbitals_without_singles_match_pyscf():
    """A UKS reference: MP2 on its orbitals, no singles (the double-hybrid convention), recorded
    as uks with its functional; PySCF's DFUMP2 on the same object agrees."""
    from pyscf import dft

    mol = gto.M(atom=NH2.replace("\n", "; "), basis="cc-pvdz", spin=1, verbose=0)
    uks = dft.UKS(mol)
    uks.xc = "b3lyp"
    uks.conv_tol = 1e-11
    uks.kernel()
    ref = mp.dfump2.DFUMP2(uks)
    ref.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    ref.kernel(with_t2=False)
    pt = dfmp2.DFMP2(uks, auxbasis="cc-pvdz-ri").run()
    assert pt.e_corr == pytest.approx(ref.e_corr, abs=TOL_OUTCORE)
    assert (pt.result.scf.kind, pt.result.scf.xc, pt.e_singles) == ("uks", "b3lyp", 0.0)
    assert pt.result.e_hf is None


def test_roks_is_refused():
    from pyscf import dft

    from dfmp2.errors import InputError

    mol = gto.M(atom=NH2.replace("\n", "; "), basis="sto-3g", spin=1, verbose=0)
    with pytest.raises(InputError, match="ROKS"):
        dfmp2.DFMP2(dft.ROKS(mol).run()).run()


def test_closed_shell_through_the_uhf_path_equals_rhf():
    mol = gto.M(atom=WATER_CATION, basis="cc-pvdz", verbose=0)
    rhf = scf.RHF(mol).run(conv_tol=1e-12)
    uhf = scf.addons.convert_to_uhf(rhf)
    a = dfmp2.DFMP2(rhf).run()
    b = dfmp2.DFMP2(uhf).run()
    assert b.result.scf.kind == "uhf" and b.result.sizes.nocc_beta == 5
    for attr in ("e_corr", "e_corr_os", "e_corr_ss"):
        assert getattr(b, attr) == pytest.approx(getattr(a, attr), abs=TOL_OUTCORE)


@pytest.fixture(scope="module")
def nh2_uhf():
    return _uhf(NH2.replace("\n", "; "), "cc-pvdz")


@pytest.mark.parametrize("kwargs, tol", [
    ({"fused_energy": False}, TOL_OUTCORE),
    ({"force_outcore": True}, TOL_OUTCORE),
    ({"cpu_blas": "torch"}, TOL_OUTCORE),
    ({"precision": "mixed"}, TOL_PRECISION),
    ({"precision": "fp32"}, TOL_FP32),
], ids=lambda v: str(v))
def test_every_path_equals_in_core_fp64(nh2_uhf, kwargs, tol):
    ref = dfmp2.DFMP2(nh2_uhf).run()
    got = dfmp2.DFMP2(nh2_uhf, **kwargs).run()
    assert got.e_corr == pytest.approx(ref.e_corr, abs=tol)
    if kwargs.get("force_outcore"):
        assert got.result.method.blocks["storage"] == "hdf5"


def test_planner_counts_both_spins():
    """B of both spins is stored: the in-core plan holds o_a v_a X + o_b v_b X, and a budget
    that holds one spin's B but not both puts B on disk."""
    from dfmp2.blocking import MB, plan_blocks

    alpha, beta, naux = (40, 200), (38, 202), 900
    both = plan_blocks(300, [alpha, beta], naux, 4000)
    one = plan_blocks(300, [alpha], naux, 4000)
    assert both.b_bytes == (40 * 200 + 38 * 202) * naux * 8
    assert both.resident_bytes - one.resident_bytes == 38 * 202 * naux * 8
    limit = (one.resident_bytes + 38 * 202 * naux * 4) / MB / 0.85
    assert not plan_blocks(300, [alpha], naux, limit).outcore
    assert plan_blocks(300, [alpha, beta], naux, limit).outcore


def test_nki_emulator_open_shell(nh2_uhf):
    ref = dfmp2.DFMP2(nh2_uhf).run()
    for fused in (True, False):
        got = dfmp2.DFMP2(nh2_uhf, backend="nki", nki_emulator=True, fused_energy=fused).run()
        assert got.e_corr == pytest.approx(ref.e_corr, abs=TOL_FP32)
        ops = got.result.backend.ops
        assert ops["gemm"]["mode"].startswith("emulator")
        if fused:
            assert ops["mp2_pair_sums"]["mode"] == "emulator"


def test_frozen_per_spin_lists():
    """PySCF's UHF frozen=[alpha list, beta list]: freezing alpha orbital 0 only differs from
    freezing both and from freezing none."""
    mf = _uhf(NH2.replace("\n", "; "), "cc-pvdz")
    both = dfmp2.DFMP2(mf, frozen=1).run().e_corr
    none = dfmp2.DFMP2(mf).run().e_corr
    alpha_only = dfmp2.DFMP2(mf, frozen=[[0], []]).run()
    sizes = alpha_only.result.sizes
    assert sizes.nocc == 4 and sizes.nocc_beta == 4
    assert (sizes.nfrozen_occ, sizes.nfrozen_occ_beta) == (1, 0)
    assert "frozen: alpha 1 occupied and 0 virtual, beta 0 occupied" in alpha_only.result.summary()
    assert none < alpha_only.e_corr < both


def test_hydrogen_atom_has_no_correlation():
    mf = _uhf("H 0 0 0", "cc-pvdz")
    pt = dfmp2.DFMP2(mf).run()
    assert pt.e_corr == 0.0


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "dfmp2", *args], capture_output=True, text=True)


def test_cli_open_shell_summary_and_json(tmp_path):
    out = tmp_path / "nh2.json"
    proc = _cli("run", "N 0 0 0; H 0 0.8 0.6; H 0 -0.8 0.6", "--spin", "1", "--reference", "rohf",
                "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "E(singles)" in proc.stdout and "beta 4 occupied" in proc.stdout
    data = json.loads(out.read_text())
    props = data["properties"]
    assert props["mp2_singles_energy"] < 0
    assert props["mp2_correlation_energy"] == pytest.approx(
        props["mp2_singles_energy"] + props["mp2_doubles_energy"], abs=TOL_PRINTED)
    assert (props["calcinfo_nalpha"], props["calcinfo_nbeta"]) == (5, 4)
    assert data["extras"]["sizes"]["nbeta"] == 4
    proc = _cli("run", "N 0 0 0; H 0 0.8 0.6; H 0 -0.8 0.6", "--spin", "1")
    assert proc.returncode == 0, proc.stderr
    assert "<S^2> 0.7" in proc.stdout and "UHF" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--spin", "2", "--reference", "rhf"], "RHF reference needs 2S = 0"),
    (["--spin", "1"], "cannot have 2S = 1"),
])
def test_cli_bad_spin_is_one_line(args, message):
    proc = _cli("run", "O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59", *args)
    assert proc.returncode == 1
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
