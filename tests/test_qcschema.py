"""QCSchema in and out (v1 and v2), Psi4's keyword names, and dfmp2 as a QCEngine program."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from qcelemental.models import v1, v2

import dfmp2
from dfmp2 import qcschema
from dfmp2.cli import main
from dfmp2.errors import InputError

from conftest import INPUTS
from tolerances import TOL_OUTCORE

#: Water in Bohr (a QCSchema molecule), and the same with a ghost water beside it.
WATER = {"symbols": ["O", "H", "H"],
         "geometry": [0.0, 0.0, -0.1294769411, 0.0, -1.494187339, 1.0274465079,
                      0.0, 1.494187339, 1.0274465079]}
DIMER_GHOST = {"symbols": ["O", "H", "H", "O", "H", "H"],
               "geometry": WATER["geometry"] + [5.6, 0.0, 0.0, 6.2, 1.4, 0.0, 6.2, -1.4, 0.0],
               "real": [True, True, True, False, False, False]}


def v1_input(keywords=None, method="mp2", molecule=WATER, **extra) -> dict:
    return {"schema_name": "qcschema_input", "schema_version": 1, "molecule": molecule,
            "driver": "energy", "model": {"method": method, "basis": "cc-pvdz"},
            "keywords": keywords or {}, **extra}


def v2_input(**kwargs) -> dict:
    return json.loads(v1.AtomicInput(**v1_input(**kwargs)).convert_v(2).serialize("json"))


@pytest.fixture(scope="module")
def frozen_core():
    """The v1 result of water with Psi4's keywords, and the same run through dfmp2.run."""
    job = qcschema.read_input(v1_input({"freeze_core": True, "scf_type": "df",
                                        "df_basis_mp2": "cc-pvdz-ri", "mp2_type": "df"}))
    direct = dfmp2.run(job.mole, **job.options)
    return job, direct, qcschema.result_dict(direct, job)


def test_v1_in_v1_out_validates_and_carries_the_run(frozen_core):
    job, direct, out = frozen_core
    assert job.version == 1 and job.options == {"basis": "cc-pvdz", "frozen_core": True,
                                                "core_rule": "psi4", "scf_type": "df",
                                                "auxbasis": "cc-pvdz-ri"}
    model = v1.AtomicResult(**out)  # validates
    assert model.schema_name == "qcschema_output" and model.schema_version == 1
    assert out["return_result"] == out["properties"]["return_energy"] == direct.e_tot
    assert out["properties"]["mp2_correlation_energy"] == direct.e_corr
    assert direct.sizes.nfrozen_occ == 1
    assert out["molecule"]["symbols"] == ["O", "H", "H"]
    assert out["keywords"]["freeze_core"] is True


def test_v2_in_v2_out(frozen_core):
    job, direct, _ = frozen_core
    data = v2_input(keywords={"freeze_core": True, "df_basis_mp2": "cc-pvdz-ri"})
    assert qcschema.schema_version(data) == 2
    out = qcschema.run_qcschema(data)
    model = v2.AtomicResult(**out)
    assert (model.schema_name, model.schema_version) == ("qcschema_atomic_result", 2)
    assert abs(model.return_result - direct.e_tot) <= TOL_OUTCORE
    assert model.input_data.specification.keywords["freeze_core"] is True
    # v1 has no program: the input gave none (''), so the result names the program that ran
    assert data["specification"]["program"] == ""
    assert model.input_data.specification.program == "dfmp2"


def test_v2_program_is_echoed_as_given(frozen_core):
    _, direct, _ = frozen_core
    data = v2_input(keywords={"freeze_core": True, "df_basis_mp2": "cc-pvdz-ri"})
    data["specification"]["program"] = "dfmp2-cluster"
    job = qcschema.read_input(data)
    assert job.program == "dfmp2-cluster"
    assert qcschema.read_input(v1_input()).program is None
    out = qcschema.result_dict(direct, job)
    assert out["input_data"]["specification"]["program"] == "dfmp2-cluster"


def test_ghost_atoms_come_and_go_as_real_false():
    out = qcschema.run_qcschema(v1_input(molecule=DIMER_GHOST))
    model = v1.AtomicResult(**out)
    assert list(model.molecule.real) == DIMER_GHOST["real"]
    assert out["extras"]["molecule"]["nghost"] == 3
    bare = qcschema.run_qcschema(v1_input())
    assert out["return_result"] < bare["return_result"]  # the ghost basis lowers the energy


def test_custom_scs_mp2_takes_psi4s_scales_and_scs_mp2_is_the_published_one():
    """As in Psi4: custom-scs-mp2 returns the total at mp2_os_scale/mp2_ss_scale (its extras
    as custom_scs_mp2_*); scs-mp2 and sos-mp2 are their published scales, and scale keywords
    with them are refused rather than returned under their name."""
    out = qcschema.run_qcschema(v1_input({"mp2_os_scale": 1.0, "mp2_ss_scale": 0.5},
                                         method="custom-scs-mp2"))
    props, extras = out["properties"], out["extras"]
    e_scs = props["scf_total_energy"] + props["mp2_opposite_spin_correlation_energy"] + 0.5 * \
        props["mp2_same_spin_correlation_energy"]
    assert abs(out["return_result"] - e_scs) <= TOL_OUTCORE
    assert extras["custom_scs_mp2_total_energy"] == out["return_result"]
    assert "scs_mp2_total_energy" not in extras
    assert extras["method"]["os_scale"] == 1.0 and extras["method"]["ss_scale"] == 0.5
    for method, keywords in (("scs-mp2", {"mp2_os_scale": 1.0}), ("sos-mp2", {"os_scale": 1.2}),
                             ("scs-mp2", {"MP2_SS_SCALE": 0.5})):
        with pytest.raises(InputError, match=rf"method '{method}' is {method.upper()} at its "
                                             r"published scales.*'custom-scs-mp2'"):
            qcschema.read_input(v1_input(keywords, method=method))
    scs = qcschema.run_qcschema(v1_input(method="scs-mp2"))
    props = scs["properties"]
    e_scs = props["scf_total_energy"] + 1.2 * props["mp2_opposite_spin_correlation_energy"] + \
        props["mp2_same_spin_correlation_energy"] / 3
    assert abs(scs["return_result"] - e_scs) <= TOL_OUTCORE
    assert scs["extras"]["scs_mp2_total_energy"] == scs["return_result"]


def test_freeze_core_follows_psi4s_rule():
    """Psi4's FREEZE_CORE TRUE freezes the previous noble gas's shells (NaH: [Ne], 5
    orbitals, where PySCF's table, --frozen-core, freezes 1); the run equals frozen=5."""
    nah = {"symbols": ["Na", "H"], "geometry": [0.0, 0.0, 0.0, 0.0, 0.0, 3.566]}
    job = qcschema.read_input(v1_input({"freeze_core": True}, molecule=nah))
    assert job.options["frozen_core"] is True and job.options["core_rule"] == "psi4"
    out = qcschema.run_qcschema(v1_input({"freeze_core": True}, molecule=nah))
    result = dfmp2.Result.from_dict(out)
    assert result.sizes.nfrozen_occ == 5 and result.method.core_rule == "psi4"
    assert "frozen core, Psi4's rule" in result.summary()
    by_hand = dfmp2.run(job.mole, basis="cc-pvdz", frozen=5)
    assert out["return_result"] == pytest.approx(by_hand.e_tot, abs=TOL_OUTCORE)
    # freeze_core false sets no rule; the command line's --frozen-core stands for the keyword
    # it is echoed as, so it keeps Psi4's rule
    assert "core_rule" not in qcschema.keyword_options({"freeze_core": False})
    cli = qcschema.with_overrides(job, {"frozen_core": True})
    assert cli.options["core_rule"] == "psi4"


def test_psi4_keywords_map_onto_options():
    options = qcschema.keyword_options({
        "scf_type": "pk", "reference": "UHF", "freeze_core": "false", "df_basis_scf":
        "cc-pvdz-jkfit", "e_convergence": 1e-10, "d_convergence": "1e-8", "maxiter": 60,
        "backend": "pytorch", "precision": "mixed", "max_memory": 2000})
    # df_basis_scf does nothing under PK, as in Psi4 (Options would refuse it with conv)
    assert options == {"scf_type": "conv", "reference": "uhf", "frozen_core": False,
                       "conv_tol": 1e-10, "conv_tol_grad": 1e-8, "max_cycle": 60,
                       "backend": "pytorch", "precision": "mixed", "max_memory": 2000}
    dfmp2.Options(**options)  # runs unchanged
    assert qcschema.keyword_options({"scf_type": "df", "df_basis_scf": "cc-pvdz-jkfit"}) == {
        "scf_type": "df", "scf_auxbasis": "cc-pvdz-jkfit"}


def test_overrides_replace_every_keyword_of_their_setting():
    """The command line's grid replaces Psi4's point counts, its frozen (or frozen_core) the
    other one, its scf_type conv an input's df_basis_scf, and a resource is echoed only where
    the input named it; run_qcschema passes dfmp2.run's own arguments through."""
    job = qcschema.read_input(v1_input({"dft_radial_points": 50, "DFT_SPHERICAL_POINTS": 194},
                                       method="b2plyp"))
    grid = qcschema.with_overrides(job, {"grid": "99,590"})
    assert grid.input["keywords"] == {"grid": "99,590"} and grid.options["grid"] == "99,590"
    qcschema.read_input({**job.input, "keywords": grid.input["keywords"]})  # reads back
    job = qcschema.read_input(v1_input({"freeze_core": True, "max_memory": 500,
                                        "df_basis_scf": "cc-pvdz-jkfit"}))
    changed = qcschema.with_overrides(job, {"frozen": 2, "max_memory": 1000, "scf_type": "CONV"})
    # (CONV is conv: choices are any case)
    assert "frozen_core" not in changed.options and changed.options["frozen"] == 2
    assert "scf_auxbasis" not in changed.options
    assert changed.input["keywords"] == {"df_basis_scf": "cc-pvdz-jkfit", "frozen": 2,
                                         "max_memory": 1000, "scf_type": "conv"}
    dfmp2.Options(**{k: v for k, v in changed.options.items()})
    # both: refused
    with pytest.raises(InputError, match=r"either frozen_core \(--frozen-core\) or frozen"):
        dfmp2.Options(**qcschema.with_overrides(job, {"frozen": 2, "frozen_core": True}).options)
    unnamed = qcschema.with_overrides(qcschema.read_input(v1_input()), {"max_memory": 1000})
    assert unnamed.input["keywords"] == {} and unnamed.options["max_memory"] == 1000
    seen = []
    result = qcschema.run_qcschema(v1_input(), progress=lambda *args: seen.append(args))
    assert seen and result["keywords"] == {}


def test_device_keywords_pass_through():
    """dfmp2's own device options are keywords too (device_memory was missing)."""
    assert qcschema.keyword_options({"device": "cpu", "device_memory": 1000}) == {
        "device": "cpu", "device_memory": 1000}


@pytest.mark.parametrize("change, message", [
    ({"keywords": {"basis_guess": True}}, "unknown keyword 'basis_guess'; valid keywords: "),
    ({"keywords": {"mp2_type": "conv"}}, "mp2_type='conv': expected one of df"),
    ({"keywords": {"scf_type": "cd"}}, "scf_type='cd': expected one of df"),
    ({"keywords": {"freeze_core": "policy"}}, "freeze_core='policy': expected true or false"),
    ({"keywords": {"maxiter": "many"}}, "maxiter='many': expected a number"),
    ({"method": "ccsd(t)"}, "method 'ccsd(t)': dfmp2 runs mp2, scs-mp2"),
    ({"driver": "gradient"}, "driver 'gradient': dfmp2 computes energies"),
    ({"keywords": {"freeze_core": True, "FREEZE_CORE": False}},
     "keywords 'freeze_core' and 'FREEZE_CORE' both set frozen_core; give one of them"),
    ({"keywords": {"mp2_os_scale": 1.0, "os_scale": 2.0}},
     "keywords 'mp2_os_scale' and 'os_scale' both set os_scale"),
    ({"keywords": {"dft_radial_points": 75, "DFT_RADIAL_POINTS": 99}},
     "both set radial"),
])
def test_what_dfmp2_cannot_run_is_one_line(change, message):
    data = v1_input(**{k: v for k, v in change.items() if k in ("keywords", "method")})
    if "driver" in change:
        data["driver"] = change["driver"]
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        qcschema.read_input(data)


def test_malformed_inputs_name_the_problem(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_name": "qcschema_input",\n "molecule": ')
    with pytest.raises(InputError, match="not JSON: line 2"):
        qcschema.read_input(bad)
    with pytest.raises(InputError, match="not a QCSchema AtomicInput"):
        qcschema.read_input({"schema_name": "qcschema_output", "schema_version": 1})
    nan = {**WATER, "geometry": [float("nan"), *WATER["geometry"][1:]]}
    with pytest.raises(InputError, match=r"molecule.geometry: atom 1 \(O\) has a coordinate"):
        qcschema.read_input(v1_input(molecule=nan))
    with pytest.raises(InputError, match="molecule.real marks every atom a ghost"):
        qcschema.read_input(v1_input(molecule={**WATER, "real": [False] * 3}))
    without_model = {k: v for k, v in v1_input().items() if k != "model"}
    with pytest.raises(InputError, match="v1 AtomicInput without 'model': give model.method"):
        qcschema.read_input(without_model)
    with pytest.raises(InputError, match="invalid QCSchema v1 AtomicInput"):
        qcschema.read_input({**v1_input(), "molecule": {"symbols": ["O"]}})
    with pytest.raises(InputError, match="cannot read QCSchema input"):
        qcschema.read_input(tmp_path / "missing.json")


def test_cli_reads_a_schema_file_and_writes_its_version(tmp_path, frozen_core):
    _job, direct, _ = frozen_core
    for version, make in ((1, v1_input), (2, v2_input)):
        path = tmp_path / f"in{version}.json"
        path.write_text(json.dumps(make(keywords={"freeze_core": True,
                                                  "df_basis_mp2": "cc-pvdz-ri"})))
        out = tmp_path / f"out{version}.json"
        result = CliRunner().invoke(main, ["run", str(path), "--json", str(out), "-q"])
        assert result.exit_code == 0, result.output
        data = json.loads(out.read_text())
        model = (v1 if version == 1 else v2).AtomicResult(**data)
        assert model.schema_version == version
        assert abs(model.return_result - direct.e_tot) <= TOL_OUTCORE
        assert abs(float(result.output.split()[-1]) - direct.e_tot) <= TOL_OUTCORE


def test_a_chkfile_keyword_that_is_the_json_output_is_refused_before_the_run(tmp_path,
                                                                            monkeypatch):
    """The input's chkfile keyword meets the same checks as --chkfile: one of them would
    overwrite the other."""
    from dfmp2 import api

    out = tmp_path / "out.json"
    path = tmp_path / "in.json"
    path.write_text(json.dumps(v1_input({"chkfile": str(out)})))
    monkeypatch.setattr(api, "run_scf", lambda *a, **k: pytest.fail("the SCF ran"))
    result = CliRunner().invoke(main, ["run", str(path), "--json", str(out)])
    assert result.exit_code != 0 and not out.exists()
    assert "--chkfile" in result.output and "same file" in result.output
    assert "Traceback" not in result.output


def test_cli_options_given_win_over_keywords(tmp_path):
    path = tmp_path / "in.json"
    path.write_text(json.dumps(v1_input({"precision": "fp64", "freeze_core": True})))
    out = tmp_path / "out.json"
    result = CliRunner().invoke(main, ["run", str(path), "--precision", "mixed", "--json",
                                       str(out), "-q"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["extras"]["method"]["precision"] == "mixed"  # the command line's
    assert data["keywords"] == {"precision": "mixed", "freeze_core": True}  # and it says so
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(v1_input({"nonsense": 1})))
    failed = CliRunner().invoke(main, ["run", str(bad)])
    assert failed.exit_code == 1 and "unknown keyword 'nonsense'" in failed.output


def test_what_the_command_line_changes_is_what_the_result_says(tmp_path):
    """The command line's basis, fitting basis and frozen core win over the input's model and
    keywords, and the AtomicResult echoes them (not the input's); the molecule's and the
    method's settings cannot be changed there; the machine's memory is not a keyword."""
    path = tmp_path / "in.json"
    path.write_text(json.dumps(v1_input({"freeze_core": True, "df_basis_mp2": "cc-pvdz-ri",
                                         "mp2_type": "df"})))
    out = tmp_path / "out.json"
    result = CliRunner().invoke(main, ["run", str(path), "--basis", "sto-3g", "--auxbasis",
                                       "def2-universal-jkfit", "--no-frozen-core",
                                       "--max-memory", "3000", "--json", str(out), "-q"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    v1.AtomicResult(**data)
    assert data["model"] == {"method": "mp2", "basis": "sto-3g"}
    assert data["keywords"] == {"mp2_type": "df", "df_basis_mp2": "def2-universal-jkfit",
                                "freeze_core": False}
    ran = data["extras"]
    assert ran["method"]["basis"] == {"H": "sto-3g", "O": "sto-3g"}
    assert ran["sizes"]["nfrozen_occ"] == 0 and ran["method"]["max_memory_mb"] == 3000
    direct = dfmp2.run(qcschema.read_input(v1_input()).mole, basis="sto-3g",
                       auxbasis="def2-universal-jkfit")
    assert abs(data["return_result"] - direct.e_tot) <= TOL_OUTCORE
    for flag, where in (("--charge", "molecule.molecular_charge"), ("--xc", "model.method")):
        refused = CliRunner().invoke(main, ["run", str(path), flag,
                                            "1" if flag == "--charge" else "b2plyp"])
        assert refused.exit_code == 1 and f"set {where} in the input" in refused.stderr


def test_a_fractional_charge_is_refused():
    for field, value in (("molecular_charge", 0.5), ("molecular_multiplicity", 1.5)):
        with pytest.raises(InputError, match=f"molecule.{field} {value:g}: .*whole number"):
            qcschema.read_input(v1_input(molecule={**WATER, field: value}))


# -- QCEngine ---------------------------------------------------------------------------------
def test_qcengine_runs_dfmp2(frozen_core):
    import qcengine

    _job, direct, _ = frozen_core
    assert "dfmp2" in qcengine.list_all_programs()
    import torch

    inp = v1.AtomicInput(**v1_input({"freeze_core": True, "df_basis_mp2": "cc-pvdz-ri"}))
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # so that ncores=1 shows, whatever the machine
    try:
        result = qcengine.compute(inp, "dfmp2", raise_error=True,
                                  task_config={"memory": 2, "ncores": 1})
        assert torch.get_num_threads() == 2  # put back after the task
    finally:
        torch.set_num_threads(before)
    assert result.success and result.schema_version == 1
    assert abs(result.return_result - direct.e_tot) <= TOL_OUTCORE
    assert result.properties.mp2_correlation_energy == pytest.approx(direct.e_corr,
                                                                      abs=TOL_OUTCORE)
    assert result.extras["method"]["max_memory_mb"] == 2048  # QCEngine's task memory
    assert result.provenance.nthreads == 1  # QCEngine's ncores held every pool during the run
    assert result.extras["backend"]["cpu_blas"]["threads"]["torch"] == 1
    assert "max_memory" not in result.keywords  # a resource of the machine, not the method
    for name in ("max_memory", "MAX_MEMORY"):  # keyword names in any case win over the task's
        own = qcengine.compute(v1.AtomicInput(**v1_input({name: 1234})), "dfmp2",
                               raise_error=True, task_config={"memory": 2, "ncores": 1})
        assert own.extras["method"]["max_memory_mb"] == 1234
    scs = qcengine.compute(v2_input(method="scs-mp2", keywords={"freeze_core": True}), "dfmp2",
                           raise_error=True)
    assert abs(scs.return_result - direct.e_scs_tot) <= TOL_OUTCORE


def test_every_dfmp2_error_has_the_nearest_qcengine_kind():
    from dfmp2 import errors
    from dfmp2.qcengine_harness import qcengine_error

    kinds = {errors.InputError: "InputError", errors.OrbitalError: "InputError",
             errors.PrecisionError: "InputError", errors.UnsupportedShapeError: "InputError",
             errors.ResourceError: "ResourceError",
             errors.BackendUnavailableError: "ResourceError",
             errors.ConvergenceError: "ConvergenceError", errors.KernelError: "UnknownError",
             RuntimeError: "UnknownError"}
    for kind, expected in kinds.items():
        assert qcengine_error(kind("x")) == expected, kind


def test_qcengine_maps_errors():
    import qcengine
    from qcengine.exceptions import InputError as QCEngineInputError

    failed = qcengine.compute(v1.AtomicInput(**v1_input({"bogus": 1})), "dfmp2")
    assert not failed.success and failed.error.error_type == "input_error"
    assert "unknown keyword 'bogus'" in failed.error.error_message
    with pytest.raises(QCEngineInputError):
        qcengine.compute(v1.AtomicInput(**v1_input({"bogus": 1})), "dfmp2", raise_error=True)


@pytest.mark.parametrize("order", ["dfmp2 first", "qcengine first"])
def test_import_dfmp2_registers_in_either_order_and_loads_nothing_heavy(order):
    """``import dfmp2`` registers with an imported qcengine, or arms itself for a later import;
    it never imports qcengine (or numpy, or torch) itself."""
    first, second = ("dfmp2", "qcengine") if order == "dfmp2 first" else ("qcengine", "dfmp2")
    code = (f"import sys; import {first}; light = 'qcengine' not in sys.modules and "
            f"'numpy' not in sys.modules and 'torch' not in sys.modules; import {second}; "
            "import qcengine; print(light, 'dfmp2' in qcengine.list_all_programs())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=INPUTS)
    assert proc.returncode == 0, proc.stderr
    light, registered = proc.stdout.split()
    assert registered == "True"
    assert light == ("True" if order == "dfmp2 first" else "False")


def test_a_failed_schema_run_writes_a_failed_operation_with_its_input(tmp_path):
    out = tmp_path / "out.json"
    out.write_text('{"success": true, "return_result": -1.0}')  # an earlier run's
    path = tmp_path / "in.json"
    path.write_text(json.dumps(v1_input({"maxiter": 2})))
    result = CliRunner().invoke(main, ["run", str(path), "--json", str(out)])
    assert result.exit_code == 1
    record = json.loads(out.read_text())
    assert record["success"] is False and record["error"]["error_type"] == "convergence_error"
    assert record["input_data"]["keywords"] == {"maxiter": 2}
    v1.FailedOperation(**record)  # the schema's own shape
    assert v1.AtomicInput(**record["input_data"]).molecule.symbols.tolist() == ["O", "H", "H"]


def test_a_failed_v2_run_echoes_its_input_as_a_valid_v2_input(tmp_path):
    """The echo is JSON data of the input's own version (its molecule's arrays were written
    as numpy's text, and a v2 input was echoed as v1)."""
    out = tmp_path / "out.json"
    out.write_text("{}")
    path = tmp_path / "in.json"
    path.write_text(json.dumps(v2_input(keywords={"maxiter": 2})))
    result = CliRunner().invoke(main, ["run", str(path), "--json", str(out)])
    assert result.exit_code == 1
    echo = json.loads(out.read_text())["input_data"]
    given = v2.AtomicInput(**echo)
    assert echo["schema_name"] == "qcschema_atomic_input"
    assert given.molecule.symbols.tolist() == ["O", "H", "H"]
    validated = v2.AtomicInput(**v2_input(keywords={"maxiter": 2})).molecule  # 8 decimals
    assert given.molecule.geometry.tolist() == validated.geometry.tolist()
    assert given.specification.keywords == {"maxiter": 2}


def test_keywords_take_whole_and_finite_numbers_and_psi4s_convergence_exponents():
    assert qcschema.keyword_options({"e_convergence": 8, "d_convergence": "6"}) == {
        "conv_tol": 1e-8, "conv_tol_grad": 1e-6}
    assert qcschema.keyword_options({"e_convergence": 1e-9}) == {"conv_tol": 1e-9}
    for keywords, why in (({"maxiter": float("inf")}, "a finite number"),
                          ({"maxiter": 50.5}, "a whole number"),
                          ({"dft_radial_points": 60.9}, "a whole number"),
                          ({"e_convergence": 1e308}, "below what a float64 energy resolves"),
                          ({"d_convergence": 17}, "below what a float64 energy resolves")):
        with pytest.raises(InputError, match=why):
            qcschema.keyword_options(keywords)


def test_a_qcelemental_model_is_an_input_and_other_objects_are_refused():
    result = dfmp2.run_qcschema(v1.AtomicInput(**v1_input()))
    assert result["success"] is True
    with pytest.raises(InputError, match="must be an AtomicInput .* got list"):
        dfmp2.run_qcschema([1, 2])


def test_input_extras_pass_through_and_a_wavefunction_protocol_is_refused():
    result = dfmp2.run_qcschema(v1_input(extras={"tag": "abc"}))
    assert result["extras"]["tag"] == "abc" and "method" in result["extras"]
    with pytest.raises(InputError, match="extras 'interaction', 'sos_mp2_correlation_energy': "
                                         "names dfmp2's result uses"):
        # read back, the input's value would be taken for dfmp2's own energy
        qcschema.read_input(v1_input(extras={"sos_mp2_correlation_energy": 1.0,
                                             "interaction": {}, "tag": 1}))
    with pytest.raises(InputError, match=r"protocols.wavefunction 'all': dfmp2 returns no "
                                         r"wavefunction"):
        dfmp2.run_qcschema(v1_input(protocols={"wavefunction": "all"}))
    assert dfmp2.run_qcschema(v1_input(protocols={"wavefunction": "none"}))["success"]


def test_result_extras_names_every_record_a_result_writes():
    """RESULT_EXTRAS (the names an input's extras may not take) holds every key of the
    records a result writes: plain, SOS-MP2, a double hybrid's."""
    from dfmp2.results import RESULT_EXTRAS

    for kwargs in ({}, {"sos": True}, {"xc": "b2plyp"}):
        extras = dfmp2.run(molecule_text(), basis="sto-3g", **kwargs).to_dict()["extras"]
        assert set(extras) <= set(RESULT_EXTRAS), set(extras) - set(RESULT_EXTRAS)


def molecule_text() -> str:
    return str(INPUTS / "water.xyz")


def test_a_schema_input_in_an_ecp_basis_gets_the_ecp():
    """model.basis def2-svp on iodine: the ECP is attached as for a geometry file (the input's
    molecule ran all-electron in a basis made for an ECP, with a warning)."""
    from dfmp2.molecule import build_mole, ecp_record

    hi = {"symbols": ["H", "I"], "geometry": [0.0, 0.0, 0.0, 0.0, 0.0, 3.04]}
    job = qcschema.read_input(v1_input(molecule=hi) | {"model": {"method": "mp2",
                                                                 "basis": "def2-svp"}})
    mol = build_mole(job.mole, basis=job.options["basis"])
    assert ecp_record(mol) == {"I": {"name": "def2-svp", "core_electrons": 28}}
    assert mol.nelectron == 26


def test_puream_and_psi4s_cartesian_pople_sets():
    """As in Psi4: a 6-31G-family basis runs Cartesian unless puream says otherwise, others
    spherical; the command line's --spherical is echoed as dfmp2's own keyword."""
    pople = {"model": {"method": "mp2", "basis": "6-31g*"}}
    assert qcschema.read_input({**v1_input(), **pople}).options["cartesian"] is True
    spherical = qcschema.read_input({**v1_input({"puream": True}), **pople})
    assert spherical.options["cartesian"] is False
    assert "cartesian" not in qcschema.read_input(v1_input()).options  # cc-pVDZ: spherical
    assert "cartesian" not in qcschema.read_input(
        {**v1_input(), "model": {"method": "mp2", "basis": "6-311g**"}}).options
    told = qcschema.with_overrides(qcschema.read_input({**v1_input(), **pople}),
                                   {"cartesian": False})
    assert told.options["cartesian"] is False and told.input["keywords"] == {"cartesian": False}
    with pytest.raises(InputError, match="'puream' and 'cartesian' both set cartesian"):
        qcschema.read_input(v1_input({"puream": True, "cartesian": False}))


def test_overrides_keep_the_inputs_conventions():
    """The command line's --basis re-derives Psi4's Cartesian default (unless the input says
    puream), its --frozen-core freezes the core the echoed freeze_core means (Psi4's), and
    custom-scs-mp2 files its energies under Psi4's CUSTOM name whatever the scales."""
    pople = qcschema.read_input({**v1_input(), "model": {"method": "mp2", "basis": "6-31g*"}})
    to_dunning = qcschema.with_overrides(pople, {"basis": "cc-pvdz"})
    assert "cartesian" not in to_dunning.options
    to_pople = qcschema.with_overrides(qcschema.read_input(v1_input()), {"basis": "6-31g*"})
    assert to_pople.options["cartesian"] is True
    said = qcschema.read_input({**v1_input({"puream": True}),
                                "model": {"method": "mp2", "basis": "6-31g*"}})
    assert qcschema.with_overrides(said, {"basis": "6-31g**"}).options["cartesian"] is False
    frozen = qcschema.with_overrides(qcschema.read_input(v1_input()), {"frozen_core": True})
    assert frozen.options["core_rule"] == "psi4" and frozen.input["keywords"] == {
        "freeze_core": True}
    out = qcschema.run_qcschema(v1_input(method="custom-scs-mp2"))
    assert out["extras"]["custom_scs_mp2_total_energy"] == out["return_result"] == \
        out["extras"]["scs_mp2_total_energy"]


def test_a_grid_count_of_zero_is_refused_not_replaced():
    """dft_radial_points 0 is a count the grid check refuses, not "not given" (Psi4's 75 ran
    while the record echoed 0)."""
    options = qcschema.keyword_options({"dft_radial_points": 0})
    assert options["grid"] == (0, 302)
    with pytest.raises(InputError, match="grid"):
        dfmp2.Options(xc="b2plyp", **options)


def test_multiplicity_on_the_command_line_is_the_inputs_own(tmp_path):
    path = tmp_path / "in.json"
    path.write_text(json.dumps(v1_input()))
    ran = CliRunner().invoke(main, ["run", str(path), "--multiplicity", "3"])
    assert ran.exit_code == 1 and ran.output.strip() == (
        "error: --multiplicity with a QCSchema input: set molecule.molecular_multiplicity in "
        "the input instead")


def test_an_inputs_error_gives_its_advice_in_the_inputs_terms(tmp_path):
    """The SCF's advice names --max-cycle and '--charge, --spin'; a QCSchema input sets the
    first by a keyword and refuses the others beside it (its molecule sets them): through
    run_qcschema and on the command line, each flag then says its keyword, and the molecule's
    its field."""
    from dfmp2.errors import ConvergenceError

    data = v1_input({"maxiter": 3})
    said = (r"raise --max-cycle \(keyword maxiter\), or check the geometry, the charge and the "
            r"spin \(molecule.molecular_charge, molecule.molecular_multiplicity\)$")
    with pytest.raises(ConvergenceError, match=said):
        qcschema.run_qcschema(data)
    path = tmp_path / "water.json"
    path.write_text(json.dumps(data))
    ran = CliRunner().invoke(main, ["run", str(path)])
    assert ran.exit_code == 1 and "--charge" not in ran.output
    assert "(keyword maxiter)" in ran.output and "molecule.molecular_charge" in ran.output
    assert qcschema.in_input_terms("--max-memory, --xc or --no-such-flag") == (
        "--max-memory, model.method or --no-such-flag")  # a machine's resource keeps its flag
    assert qcschema.in_input_terms("--no-fused-energy, --spherical, --basis x, --unit bohr") == (
        "--no-fused-energy (keyword fused_energy false), --spherical (keyword cartesian false), "
        "model.basis x, --unit bohr")  # negated and aliased flags; Bohr is the input's own
    once = qcschema.in_input_terms("raise --max-cycle")
    assert qcschema.in_input_terms(once) == once  # a flag with its keyword stays so
    assert qcschema.in_input_terms("/tmp/a--frozen/b --max-cycle=9") == (
        "/tmp/a--frozen/b --max-cycle=9")  # not flags where they stand
