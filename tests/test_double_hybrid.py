"""Double hybrids (``--xc``), SOS-MP2 and given scales: Psi4's and Grimme's B2PLYP values,
every double hybrid against PySCF computed by hand (RKS and UKS), the records, the CLI, QCSchema,
counterpoise, the chkfile and every way to ask for something dfmp2 does not do."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from pyscf import df, dft, gto
from pyscf.mp import dfmp2 as pyscf_dfmp2
from pyscf.mp import dfump2 as pyscf_dfump2
from qcelemental.models import v1

import dfmp2
from dfmp2 import qcschema
from dfmp2.cli import main
from dfmp2.errors import InputError
from dfmp2.molecule import build_mole
from dfmp2.results import Result

from conftest import INPUTS
from tolerances import (
    TOL_FP64,
    TOL_IDENTITY,
    TOL_OUTCORE,
    TOL_PSI4_DFT,
    TOL_PUBLISHED_4DP,
)

WATER = str(INPUTS / "water.xyz")
#: Psi4's tests/dft-b2plyp (Grimme's Table I geometries, cc-pVQZ, 99 radial x 302 Lebedev
#: points, all electrons): output.ref of Psi4 1.0 (2016), its DFT reference energy, DF-MP2
#: components on the KS orbitals and the double hybrid's total; and Grimme's published totals
#: (J. Chem. Phys. 124, 034108 (2006), Table I, 4 decimals).
H2 = "H 0 0 -0.371452; H 0 0 0.371452"
H2O_PSI4 = ("O 0 0 -0.065511056325; H 0 -0.761805723188 0.519854002043; "
            "H 0 0.761805723188 0.519854002043")
PSI4_B2PLYP = {
    "h2": {"ks": -1.1602968937931979, "os": -0.0391388530360417, "ss": 0.0,
           "total": -1.1708643841129469, "grimme": -1.1709},
    "h2o": {"ks": -76.3322868936584200, "os": -0.2798887226365517,
            "ss": -0.0851929054871406, "total": -76.4308589332592732, "grimme": -76.4309},
}
#: The published mixes, written out here (not read from dfmp2's table): KS part and
#: (c_os, c_ss).
PUBLISHED = {
    "B2PLYP": ("0.53*HF + 0.47*B88, 0.73*LYP", 0.27, 0.27),
    "B2GPPLYP": ("0.65*HF + 0.35*B88, 0.64*LYP", 0.36, 0.36),
    "DSD-BLYP": ("0.75*HF + 0.25*B88, 0.53*LYP", 0.46, 0.60),
    "DSD-PBEP86": ("0.72*HF + 0.28*PBE, 0.44*P86", 0.51, 0.36),
    "DSD-PBEPBE": ("0.72*HF + 0.28*PBE, 0.48*PBE", 0.54, 0.31),
    "PBE0-DH": ("0.5*HF + 0.5*PBE, 0.875*PBE", 0.125, 0.125),
    "PBE0-2": ("0.793701*HF + 0.206299*PBE, 0.5*PBE", 0.5, 0.5),
}
NH2 = "N\nH 1 1.008\nH 1 1.008 2 105.0"


@pytest.mark.parametrize("name,atom", [("h2", H2), ("h2o", H2O_PSI4)])
def test_b2plyp_matches_psi4_and_grimme(name, atom):
    ref = PSI4_B2PLYP[name]
    result = dfmp2.run(atom, basis="cc-pvqz", xc="B2PLYP", grid="99,302")
    assert abs(result.e_scf - ref["ks"]) <= TOL_PSI4_DFT
    assert abs(result.e_corr_os - ref["os"]) <= TOL_PSI4_DFT
    assert abs(result.e_corr_ss - ref["ss"]) <= TOL_PSI4_DFT
    assert abs(result.e_return - ref["total"]) <= TOL_PSI4_DFT
    assert abs(result.e_return - ref["grimme"]) <= TOL_PUBLISHED_4DP
    assert result.scf.grid["atom_grid"] == [99, 302] and result.scf.grid["prune"] is None


def _pyscf_by_hand(mol, xc: str, c_os: float, c_ss: float, auxbasis: str) -> float:
    """KS with the published mix on PySCF's default grid, PySCF's DF-MP2 on its orbitals
    (RKS or UKS), E = E_KS + c_os E_OS + c_ss E_SS."""
    ks = (dft.RKS if mol.spin == 0 else dft.UKS)(mol, xc=xc).density_fit()
    ks.conv_tol, ks.conv_tol_grad = 1e-11, 1e-7
    ks.kernel()
    assert ks.converged
    pt = (pyscf_dfmp2.DFMP2 if mol.spin == 0 else pyscf_dfump2.DFUMP2)(ks)
    pt.with_df = df.DF(mol, auxbasis=auxbasis)
    pt.kernel()
    return ks.e_tot + c_os * pt.e_corr_os + c_ss * pt.e_corr_ss


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_double_hybrid_equals_pyscf_by_hand(name):
    xc, c_os, c_ss = PUBLISHED[name]
    mol = build_mole(WATER, basis="cc-pvdz")
    result = dfmp2.run(mol, xc=name)
    assert abs(result.e_return - _pyscf_by_hand(mol, xc, c_os, c_ss, "cc-pvdz-ri")) <= TOL_FP64
    dh = result.double_hybrid
    assert (dh["functional"], dh["c_os"], dh["c_ss"], dh["xc"]) == (name, c_os, c_ss, xc)
    assert dh["e_total"] == result.e_return == result.e_scs_tot
    # e_tot is the method's total, not the unscaled MP2 sum on KS orbitals (the README's
    # first example prints result.e_tot); DFMP2's is PySCF's, e_hf + e_corr
    assert result.e_tot == result.e_return != result.e_scf + result.e_corr
    assert abs(dh["e_pt2"] - (c_os * result.e_corr_os + c_ss * result.e_corr_ss)) \
        <= TOL_IDENTITY
    assert result.e_singles == 0.0 and result.scf.kind == "rks"


@pytest.mark.parametrize("name", ["DSD-PBEP86", "B2PLYP"])
def test_uks_double_hybrid_equals_pyscf_by_hand(name):
    mol = build_mole(NH2, basis="cc-pvdz", spin=1)
    result = dfmp2.run(mol, xc=name)
    xc, c_os, c_ss = PUBLISHED[name]
    assert result.scf.kind == "uks" and result.e_singles == 0.0
    assert abs(result.e_return - _pyscf_by_hand(mol, xc, c_os, c_ss, "cc-pvdz-ri")) <= TOL_FP64


def test_a_degenerate_radical_converges_on_the_default_grid():
    """OH (a 2-Pi radical): the pruned grid's noise stalls the UKS orbital gradient at a few
    1e-7 on an AMD EPYC and at 1.08e-6 or 1.45e-6 on an Intel Xeon (two orderings of K's
    products), around the KS default threshold (1e-6): where DIIS stalls above it, the
    second-order solver finishes, or the stall is accepted under sqrt(conv_tol) (the test of
    that rule: tests/test_scf.py). The HF default (1e-7) is kept for HF."""
    result = dfmp2.run("O 0 0 0; H 0 0 0.97", spin=1, xc="b2plyp")
    assert result.scf.converged and result.scf.kind == "uks"
    assert dfmp2.Options(xc="b2plyp").resolved_conv_tol_grad > \
        dfmp2.Options().resolved_conv_tol_grad


@pytest.fixture(scope="module")
def water_mp2():
    return dfmp2.run(WATER)


def test_sos_and_given_scales(water_mp2):
    sos = dfmp2.run(WATER, sos=True)
    assert sos.scaled_label == "SOS-MP2" and sos.method.ss_scale == 0.0
    assert sos.e_scs == pytest.approx(1.3 * water_mp2.e_corr_os, abs=TOL_OUTCORE)
    assert "E(SOS-MP2) total" in sos.summary()
    extras = sos.to_dict()["extras"]
    assert extras["sos_mp2_total_energy"] == sos.e_scs_tot and "scs_mp2_total_energy" not in extras
    assert sos.e_return == sos.e_tot  # the run's answer stays MP2's
    given = dfmp2.run(WATER, os_scale=1.0, ss_scale=0.5)
    assert given.scaled_label == "scaled MP2"
    assert given.e_scs == pytest.approx(water_mp2.e_corr_os + 0.5 * water_mp2.e_corr_ss,
                                        abs=TOL_OUTCORE)
    assert "(os 1, ss 0.5)" in given.summary()
    # given scales are filed under Psi4's CUSTOM SCS-MP2 name, never as SCS-MP2's
    extras = given.to_dict()["extras"]
    assert extras["custom_scs_mp2_total_energy"] == given.e_scs_tot
    assert "scs_mp2_total_energy" not in extras and "sos_mp2_total_energy" not in extras
    assert dfmp2.Result.from_json(given.to_json()).e_scs == given.e_scs
    assert water_mp2.scaled_label == "SCS-MP2"
    assert water_mp2.method.scaling["source"].startswith("S. Grimme")


def test_scales_are_named_by_their_values_not_the_flags_that_gave_them():
    """SOS-MP2 and SCS-MP2 are their published scales; --sos with another --os-scale is a
    scaled MP2 (its scales printed), and the published scales given by hand are SCS-MP2."""
    from dfmp2.functionals import SCS_MP2, SOS_MP2, resolve

    assert resolve(None, None, None, True).label == "SOS-MP2"
    assert resolve(None, SOS_MP2[0], None, True).label == "SOS-MP2"
    other = resolve(None, 1.2, None, True)
    assert (other.label, other.os, other.ss) == ("scaled MP2", 1.2, 0.0)
    assert resolve(None, SCS_MP2[0], SCS_MP2[1], False).label == "SCS-MP2"
    assert resolve(None, 1.3, 0.0, False).label == "SOS-MP2"
    assert resolve(None, 1.0, None, False).label == "scaled MP2"


def test_custom_double_hybrid_and_custom_scales():
    named = dfmp2.run(WATER, xc="b2plyp")
    custom = dfmp2.run(WATER, xc=PUBLISHED["B2PLYP"][0], os_scale=0.27, ss_scale=0.27)
    assert abs(custom.e_return - named.e_return) <= TOL_OUTCORE
    assert custom.double_hybrid["functional"] is None
    assert custom.double_hybrid["label"] == "custom double hybrid"
    assert custom.to_dict()["model"]["method"] == "custom double hybrid"
    scaled = dfmp2.run(WATER, xc="b2plyp", os_scale=0.3)
    assert scaled.double_hybrid["label"] == "B2PLYP (custom PT2 scales)"
    # (the model names the functional; its scales are in the keywords, as an input gives them)
    assert scaled.to_dict()["model"]["method"] == "b2plyp"
    assert scaled.to_dict()["keywords"] == {"os_scale": 0.3}
    assert "E(B2PLYP (custom PT2 scales)) total" in scaled.summary()
    assert scaled.e_return == pytest.approx(
        named.e_scf + 0.3 * named.e_corr_os + 0.27 * named.e_corr_ss, abs=TOL_OUTCORE)
    sos = dfmp2.run(WATER, xc="b2plyp", sos=True, os_scale=0.4)
    assert sos.e_return == pytest.approx(named.e_scf + 0.4 * named.e_corr_os, abs=TOL_OUTCORE)


def test_records_and_json_of_a_double_hybrid():
    result = dfmp2.run(WATER, xc="B2GP-PLYP", grid=1)
    data = json.loads(result.to_json())
    v1.AtomicResult(**data)  # validates
    props, extras = data["properties"], data["extras"]
    assert data["model"]["method"] == "b2gpplyp"
    assert data["return_result"] == props["return_energy"] == result.e_return
    assert "mp2_total_energy" not in props and "mp2_correlation_energy" not in props
    assert props["mp2_opposite_spin_correlation_energy"] == result.e_corr_os
    assert extras["double_hybrid"]["source"].startswith("A. Karton")
    assert extras["scf"]["grid"]["level"] == 1 and extras["scf"]["grid"]["points"] > 0
    assert "scs_mp2_total_energy" not in extras
    text = result.summary()
    assert "E(B2GPPLYP) total" in text and "DFT grid   level 1" in text
    assert "E(MP2) total" not in text
    assert Result.from_dict(data) == result
    # an edited PT2 term or answer is refused, not shown (dfmp2 show, Result.read)
    edited = json.loads(result.to_json())
    edited["extras"]["double_hybrid"]["e_pt2"] = -0.5
    with pytest.raises(InputError, match=r"double_hybrid.e_pt2 -0.5 is not its scales"):
        Result.from_dict(edited)
    edited = json.loads(result.to_json())
    edited["return_result"] = None
    with pytest.raises(InputError, match=r"return_result None is not its run's answer"):
        Result.from_dict(edited)


def test_cli_double_hybrid_quiet_prints_its_total(tmp_path):
    out = tmp_path / "dh.json"
    cli = CliRunner().invoke(main, ["run", WATER, "--xc", "b2plyp", "--grid", "2", "-q",
                                    "--json", str(out)])
    assert cli.exit_code == 0, cli.output
    data = json.loads(out.read_text())
    assert float(cli.output.strip()) == pytest.approx(data["return_result"], abs=TOL_IDENTITY)
    assert data["extras"]["double_hybrid"]["functional"] == "B2PLYP"


@pytest.mark.parametrize("args,message", [
    (["--xc", "b3lyp"], "not a double hybrid dfmp2 knows"),
    (["--xc", "b3lyp", "--os-scale", "0.3"], "give --os-scale and --ss-scale"),
    (["--xc", "dsd-blyp-d3bj"], "computes no dispersion correction"),
    (["--xc", "wb97x", "--os-scale", "1", "--ss-scale", "1"], "range-separated"),
    (["--xc", "nonsense", "--os-scale", "1", "--ss-scale", "1"], "PySCF cannot parse"),
    (["--grid", "3"], "it needs --xc"),
    (["--xc", "b2plyp", "--grid", "99,300"], "not a Lebedev grid size"),
    (["--xc", "b2plyp", "--grid", "20000,302"], "more than 1000 (PySCF's finest level uses"),
    (["--xc", "b2plyp", "--grid", "12"], "PySCF's levels are 0-9"),
    (["--xc", "b2plyp", "--grid", "fine"], "give a level 0-9"),
    (["--xc", "b2plyp", "--reference", "rohf", "--spin", "2"], "ROKS orbitals are not"),
    (["--sos", "--ss-scale", "1"], "contradicts --ss-scale"),
    (["--xc", "b2plyp", "--sos"], "needs --os-scale"),
    (["--os-scale", "-1"], "os_scale must be a finite number >= 0"),
    (["--xc", "b2plyp", "--ss-scale", "inf"], "ss_scale must be a finite number >= 0"),
    (["--os-scale", "1e300"], "os_scale 1e+300 is more than 10: spin-component scales"),
    (["--sos", "--os-scale", "10.5"], "os_scale 10.5 is more than 10"),
])
def test_bad_double_hybrid_input_is_one_line(args, message):
    cli = CliRunner().invoke(main, ["run", WATER, *args])
    assert cli.exit_code == 1
    assert message in cli.output and "Traceback" not in cli.output
    assert len(cli.output.strip().splitlines()) == 1


def test_dfmp2_class_takes_the_functional_of_its_scf():
    mol = build_mole(WATER, basis="sto-3g")
    mf = dft.RKS(mol, xc="b3lyp")
    with pytest.raises(InputError, match="xc: DFMP2.mf. takes the SCF object as it is given"):
        dfmp2.DFMP2(mf, xc="b2plyp").run()


def test_qcschema_double_hybrid_with_psi4_grid_keywords():
    data = {"schema_name": "qcschema_input", "schema_version": 1, "driver": "energy",
            "molecule": {"symbols": ["H", "H"], "geometry": [0, 0, -0.7019, 0, 0, 0.7019]},
            "model": {"method": "b2plyp", "basis": "cc-pvdz"},
            "keywords": {"reference": "rks", "dft_radial_points": 99,
                         "dft_spherical_points": 302}}
    out = qcschema.run_qcschema(data)
    direct = dfmp2.run(gto.M(atom="H 0 0 -0.7019; H 0 0 0.7019", unit="Bohr",
                             basis="cc-pvdz"), xc="b2plyp", grid=(99, 302))
    assert abs(out["return_result"] - direct.e_return) <= TOL_OUTCORE
    assert out["extras"]["scf"]["grid"]["atom_grid"] == [99, 302]
    with pytest.raises(InputError, match="needs a double-hybrid method"):
        qcschema.read_input({**data, "model": {"method": "mp2", "basis": "cc-pvdz"}})
    with pytest.raises(InputError, match="b2plyp"):
        qcschema.read_input({**data, "model": {"method": "b3lyp", "basis": "cc-pvdz"}})
    sos = qcschema.read_input({**data, "model": {"method": "sos-mp2", "basis": "cc-pvdz"},
                               "keywords": {}})
    assert sos.options["sos"] is True
    with pytest.raises(InputError, match="give dfmp2's own keywords os_scale"):
        qcschema.read_input({**data, "keywords": {"mp2_os_scale": 0.5}})
    own = qcschema.read_input({**data, "keywords": {"os_scale": 0.5}})
    assert own.options["os_scale"] == 0.5 and own.options["xc"] == "B2PLYP"


def test_qcengine_runs_a_double_hybrid():
    import qcengine

    inp = v1.AtomicInput(molecule={"symbols": ["He"], "geometry": [0, 0, 0]},
                         driver="energy", model={"method": "dsd-pbep86", "basis": "cc-pvdz"})
    result = qcengine.compute(inp, "dfmp2", raise_error=True)
    direct = dfmp2.run("He 0 0 0", xc="dsd-pbep86")
    assert abs(result.return_result - direct.e_return) <= TOL_OUTCORE


def test_counterpoise_with_a_double_hybrid():
    result = dfmp2.run_counterpoise("He 0 0 0; He 0 0 3.0", "1,1", xc="b2plyp")
    inter = result.interaction
    assert set(inter["levels"]) == {"ks", "double_hybrid"}
    totals = inter["totals_eh"]
    for level in ("ks", "double_hybrid"):
        expected = totals["complex"][level] - sum(f[level] for f in totals["fragments"])
        assert inter[level]["eh"] == expected
    assert totals["complex"]["double_hybrid"] == result.e_return
    assert "E(int) B2PLYP" in result.summary()


def test_chkfile_keeps_its_functional(tmp_path):
    chk = str(tmp_path / "water.chk")
    first = dfmp2.run(WATER, xc="b2plyp", chkfile=chk)
    again = dfmp2.run(WATER, xc="b2plyp", chkfile=chk)
    assert again.scf.cycles == 0 and abs(again.e_return - first.e_return) <= TOL_FP64
    with pytest.raises(InputError, match="another functional"):
        dfmp2.run(WATER, chkfile=chk)
    # the same functional spelled otherwise (case, spaces) is the same calculation
    for first_xc, again_xc in (("PBE", "pbe"), ("0.5*HF+0.5*B88,LYP", "0.5*HF + 0.5*B88, LYP")):
        chk = str(tmp_path / f"{len(first_xc)}.chk")
        dfmp2.run(WATER, basis="sto-3g", xc=first_xc, os_scale=0.5, ss_scale=0.5, chkfile=chk)
        same = dfmp2.run(WATER, basis="sto-3g", xc=again_xc, os_scale=0.5, ss_scale=0.5,
                         chkfile=chk)
        assert same.scf.cycles == 0
    with pytest.raises(InputError, match=r"another functional \(PBE vs PBE0\)"):
        dfmp2.run(WATER, basis="sto-3g", xc="PBE0", os_scale=0.5, ss_scale=0.5,
                  chkfile=str(tmp_path / "3.chk"))


def test_batch_table_heads_the_double_hybrid(tmp_path):
    cli = CliRunner().invoke(main, ["run", WATER, str(INPUTS / "methane.xyz"), "--xc",
                                    "pbe0-dh", "--grid", "1"])
    assert cli.exit_code == 0, cli.output
    assert "E(PBE0-DH) total" in cli.output and "E(MP2) total" not in cli.output
    schema = tmp_path / "h2.json"  # a double hybrid beside an MP2 run: a table each
    schema.write_text(json.dumps({
        "schema_name": "qcschema_input", "schema_version": 1, "driver": "energy",
        "molecule": {"symbols": ["H", "H"], "geometry": [0, 0, -0.7, 0, 0, 0.7]},
        "model": {"method": "b2plyp", "basis": "cc-pvdz"}, "keywords": {}}))
    cli = CliRunner().invoke(main, ["run", str(schema), WATER])
    assert cli.exit_code == 0, cli.output
    tables = cli.output.split("\n\n")
    b2plyp = next(t for t in tables if "E(B2PLYP) total" in t)
    mp2 = next(t for t in tables if "E(MP2) total" in t)
    assert "H2" in b2plyp and "H2O" not in b2plyp and "H2O" in mp2
