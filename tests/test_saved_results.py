"""A saved result reads back: ``Result.from_dict``/``from_json``/``read`` of what ``to_dict`` and
``dfmp2 run --json`` wrote give the same energies, records and summary, and ``dfmp2 show``
prints that summary; anything else is refused in one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

import dfmp2
from dfmp2 import qcschema
from dfmp2.cli import main
from dfmp2.errors import InputError
from dfmp2.results import Result

from conftest import INPUTS
from tolerances import TOL_FP64, TOL_IDENTITY

WATER = str(INPUTS / "water.xyz")
OH = "O 0 0 0; H 0 0 0.97"


def _with(data: dict, where: tuple, value) -> dict:
    """A deep copy of the record ``data`` with the field at path ``where`` set to ``value``."""
    broken = json.loads(json.dumps(data))
    record = broken
    for key in where[:-1]:
        record = record[key]
    record[where[-1]] = value
    return broken


def _round_trip(result: Result) -> Result:
    again = Result.from_json(result.to_json())
    assert again.to_dict() == json.loads(result.to_json())  # every record, as JSON holds it
    for name in ("e_scf", "e_corr_os", "e_corr_ss", "e_singles", "e_corr", "e_tot", "e_scs",
                 "e_scs_tot", "e_return", "e_hf"):
        assert getattr(again, name) == getattr(result, name), name  # exact: repr round-trips
    assert again.summary(verbose=True) == result.summary(verbose=True)
    return again


@pytest.mark.parametrize("options", [
    {"frozen_core": True, "pair_energies": True},
    {"reference": "rohf", "sos": True},
    {"reference": "uhf", "os_scale": 1.1, "ss_scale": 0.4},
], ids=["rhf-frozen-pairs", "rohf-sos", "uhf-scales"])
def test_a_result_reads_back_as_it_was(options):
    geometry = OH if options.get("reference") else WATER
    spin = {"spin": 1} if options.get("reference") else {}
    result = dfmp2.run(geometry, basis="sto-3g" if spin else "cc-pvdz", **spin, **options)
    again = _round_trip(result)
    assert again.sizes == result.sizes and again.scf.kind == result.scf.kind


def test_a_double_hybrids_result_reads_back(tmp_path):
    result = dfmp2.run(WATER, basis="6-31g", xc="b2plyp", grid=1)
    again = _round_trip(result)
    assert again.double_hybrid == result.double_hybrid and again.e_hf is None
    # the command line's keywords carry the values as checked, as Python's do ('1': 1)
    out = tmp_path / "dh.json"
    ran = CliRunner().invoke(main, ["run", WATER, "--basis", "6-31g", "--xc", "b2plyp",
                                    "--grid", "1", "--json", str(out), "-q"])
    assert ran.exit_code == 0, ran.output
    assert json.loads(out.read_text())["keywords"] == result.keywords == {
        "grid": 1, "cartesian": False}


def test_a_qcschema_result_reads_back_in_either_version():
    data = {"schema_name": "qcschema_input", "schema_version": 1, "driver": "energy",
            "molecule": {"symbols": ["He"], "geometry": [0.0, 0.0, 0.0]},
            "model": {"method": "mp2", "basis": "cc-pvdz"}}
    v1 = qcschema.run_qcschema(data)
    direct = Result.from_dict(v1)
    assert direct.e_tot == v1["return_result"] and direct.molecule.formula == "He"
    from qcelemental.models import v1 as models_v1

    as_v2 = json.loads(models_v1.AtomicInput(**data).convert_v(2).serialize("json"))
    v2 = qcschema.run_qcschema(as_v2)
    assert Result.from_dict(v2).e_tot == pytest.approx(direct.e_tot, abs=TOL_IDENTITY)


def test_the_record_keeps_the_options_given_as_its_keywords(tmp_path):
    """A command line's record and a dfmp2.run's have the options given (not every default),
    under the keyword names and with the values a QCSchema input's record echoes; not the
    machine's resources, nor what the model and molecule state. They read back, and an
    AtomicInput of the record's molecule, model and keywords runs the same calculation."""
    out = tmp_path / "water.json"
    ran = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--frozen-core",
                                    "--scf-type", "CONV", "--charge", "0", "--max-memory",
                                    "2000", "--json", str(out), "-q"])
    assert ran.exit_code == 0, ran.output
    data = json.loads(out.read_text())
    echoed = {"freeze_core": True, "core_rule": "pyscf", "scf_type": "conv"}
    assert data["keywords"] == echoed and Result.read(out).keywords == echoed
    given = dfmp2.run(WATER, basis="sto-3g", frozen_core=True, scf_type="conv", max_memory=2000)
    assert given.to_dict()["keywords"] == echoed  # the same names from Python
    assert dfmp2.run(WATER, basis="sto-3g", frozen=(0,), reference="RHF",
                     scratch_dir=str(tmp_path)).to_dict()["keywords"] == {"frozen": [0],
                                                                          "reference": "rhf"}
    again = qcschema.run_qcschema({"schema_name": "qcschema_input", "schema_version": 1,
                                   "driver": "energy", "molecule": data["molecule"],
                                   "model": data["model"], "keywords": data["keywords"]})
    assert again["keywords"] == echoed
    # (qcelemental keeps the geometry to 1e-8 Bohr: the same molecule to 3e-10 Eh)
    assert again["return_result"] == pytest.approx(data["return_result"], abs=TOL_FP64)
    from qcelemental.models import v1 as models_v1

    as_v2 = models_v1.AtomicResult(**again).convert_v(2).serialize("json")
    assert Result.from_json(as_v2).keywords == echoed  # v2 keeps them in input_data


def test_a_dfmp2_objects_record_keeps_its_options_as_keywords():
    """DFMP2(mf)'s record echoes the MP2 step's options given (to the constructor, as
    attributes or to run), as dfmp2.run's does; with PySCF's with_df idiom, its fitting set."""
    from pyscf import df, scf

    from dfmp2.molecule import build_mole

    mf = scf.RHF(build_mole(WATER, basis="sto-3g")).run(conv_tol=1e-10)
    pt = dfmp2.DFMP2(mf, frozen=1, auxbasis="cc-pvdz-ri")
    pt.max_memory = 2000  # a resource: not echoed
    assert pt.run(precision="fp64").result.keywords == {
        "frozen": 1, "df_basis_mp2": "cc-pvdz-ri", "precision": "fp64"}
    idiom = dfmp2.DFMP2(mf)
    idiom.with_df = df.DF(mf.mol, auxbasis="cc-pvdz-ri")
    assert idiom.run().result.keywords == {"df_basis_mp2": "cc-pvdz-ri"}
    assert dfmp2.DFMP2(mf).run().result.keywords == {}


def test_the_record_keywords_say_what_a_qcschema_input_would_read_psi4s_way(tmp_path):
    """A QCSchema input's ``freeze_core`` freezes Psi4's core and its 6-31G runs Cartesian;
    a command line's record of NaH in 6-31G with --frozen-core (PySCF's core: Na's 1s only,
    spherical functions) therefore echoes ``core_rule`` and ``cartesian`` too, so that its
    molecule, model and keywords run the same energy again (without them, 1.4e-3 Eh away)."""
    out = tmp_path / "nah.json"
    ran = CliRunner().invoke(main, ["run", "Na 0 0 0; H 0 0 1.89", "--basis", "6-31g",
                                    "--frozen-core", "--json", str(out), "-q"])
    assert ran.exit_code == 0, ran.output
    data = json.loads(out.read_text())
    assert data["keywords"] == {"freeze_core": True, "core_rule": "pyscf", "cartesian": False}
    again = qcschema.run_qcschema({"schema_name": "qcschema_input", "schema_version": 1,
                                   "driver": "energy", "molecule": data["molecule"],
                                   "model": data["model"], "keywords": data["keywords"]})
    assert again["keywords"] == data["keywords"]
    # (qcelemental keeps the geometry to 1e-8 Bohr)
    assert again["return_result"] == pytest.approx(data["return_result"], abs=TOL_FP64)
    assert again["extras"]["method"]["core_rule"] == "pyscf"


@pytest.mark.parametrize("options", [{"sos": True}, {"sos": True, "os_scale": 1.2},
                                     {"xc": "b2plyp", "sos": True, "os_scale": 0.4, "grid": 1}],
                         ids=["sos", "sos-own-scale", "double-hybrid-sos"])
def test_a_scaled_runs_record_runs_the_same_scales_again(options):
    """--sos is stated by no keyword of its own (a command line's model.method is mp2, or the
    double hybrid's name): the record echoes its scales, so that its molecule, model and
    keywords run the same scaled energy again (before, SCS-MP2's scales, or a model.method
    that no input may name)."""
    result = dfmp2.run(WATER, basis="sto-3g", **options)
    data = result.to_dict()
    assert data["keywords"]["ss_scale"] == 0.0
    again = qcschema.run_qcschema({"schema_name": "qcschema_input", "schema_version": 1,
                                   "driver": "energy", "molecule": data["molecule"],
                                   "model": data["model"], "keywords": data["keywords"]})
    before, after = (record["extras"]["method"]["scaling"] for record in (data, again))
    assert {**after, "source": None} == {**before, "source": None}  # (source: the flags given)
    # (qcelemental keeps the geometry to 1e-8 Bohr: the same molecule to 3e-10 Eh)
    assert again["return_result"] == pytest.approx(data["return_result"], abs=TOL_FP64)
    totals = [name for name in data["extras"] if name.endswith("mp2_total_energy")]
    assert totals or "xc" in options  # (sos_mp2_... or custom_scs_mp2_...)
    for name in totals:
        assert again["extras"][name] == pytest.approx(data["extras"][name], abs=TOL_FP64)


@pytest.mark.parametrize("method, keywords", [
    ("sos-mp2", {}), ("scs-mp2", {}), ("mp2", {}),
    ("custom-scs-mp2", {"mp2_os_scale": 1.1, "mp2_ss_scale": 0.5}),
    ("custom-scs-mp2", {"mp2_os_scale": 1.2, "mp2_ss_scale": 1 / 3})])  # (SCS-MP2's scales)
def test_a_result_read_from_a_qcschema_record_writes_it_again(method, keywords):
    """A QCSchema input's record read back (Result.from_dict, as `dfmp2 show` does) keeps the
    method the input asked for: its model.method, its answer (the scaled total of a scaled
    method) and the energies it records, so that writing the Result out again gives the same
    record, and running that record again the same answer. Before, it became an mp2 record
    whose return_result was the MP2 total, and reran as SCS-MP2."""
    record = qcschema.run_qcschema({"schema_name": "qcschema_input", "schema_version": 1,
                                    "driver": "energy", "model": {"method": method,
                                                                  "basis": "sto-3g"},
                                    "molecule": {"symbols": ["O", "H", "H"],
                                                 "geometry": [0, 0, 0, 0, 0, 1.8,
                                                              1.75, 0, -0.47]},
                                    "keywords": keywords})
    result = Result.from_dict(record)
    again = result.to_dict()
    assert again["model"] == record["model"] and again["keywords"] == record["keywords"]
    assert again["return_result"] == record["return_result"] == result.e_return
    assert again["properties"]["return_energy"] == record["properties"]["return_energy"]
    energies = {k for k in record["extras"] if k.endswith("_energy")}
    assert energies and {k: again["extras"].get(k) for k in energies} == {
        k: record["extras"][k] for k in energies}
    assert Result.from_dict(again) == result
    rerun = qcschema.run_qcschema({"schema_name": "qcschema_input", "schema_version": 1,
                                   "driver": "energy", "molecule": again["molecule"],
                                   "model": again["model"], "keywords": again["keywords"]})
    # (qcelemental keeps the geometry to 1e-8 Bohr: the same molecule to 3e-10 Eh)
    assert rerun["return_result"] == pytest.approx(record["return_result"], abs=TOL_FP64)


def test_results_are_equal_when_they_mean_the_same():
    """Two runs of one calculation are equal whatever their wall times (timings, the SCF's
    J/K seconds) and a GPU's free memory, and equal to their record read back; another
    basis, another energy or another device plan is another result."""
    first, second = (dfmp2.run(WATER, basis="sto-3g") for _ in range(2))
    slower = replace(second, timings={k: v + 1.0 for k, v in second.timings.items()},
                     scf=replace(second.scf, jk_stats={**second.scf.jk_stats, "seconds": 9.0}))
    assert first == second and first == slower and not first != slower
    assert Result.from_json(first.to_json()) == first
    assert first != dfmp2.run(WATER, basis="6-31g")
    assert first != replace(first, e_corr_os=first.e_corr_os * (1 + 1e-12))
    assert first != replace(first, keywords={"freeze_core": True})
    assert first != first.to_dict()
    # on a GPU: the device's free memory at the start differs between two runs (the first
    # leaves torch's cache behind), the plan it chose is the run's
    on_gpu = {**first.backend.device, "resolved": "cuda:0", "memory_mb": 139000.0,
              "plan": {"b_placement": "device", "occ_block": 5, "aux_block": 84, "fit_occ": 5,
                       "device_mb": 0.2}}
    gpu = replace(first, backend=replace(first.backend, device=on_gpu))
    assert gpu == replace(gpu, backend=replace(gpu.backend, device={**on_gpu,
                                                                    "memory_mb": 137000.0}))
    assert gpu != first and gpu != replace(gpu, backend=replace(gpu.backend, device={
        **on_gpu, "plan": {**on_gpu["plan"], "occ_block": 2}}))


def test_what_is_not_a_dfmp2_result_is_refused_in_one_line(tmp_path):
    failed = {"success": False, "error": {"error_type": "convergence_error",
                                          "error_message": "SCF did not converge"}}
    cases = [
        (failed, "failed run, with no energies: SCF did not converge"),
        ({"success": True, "provenance": {"creator": "Psi4"}}, "its provenance.creator is 'Psi4'"),
        ({"provenance": {"creator": "dfmp2"}, "extras": {}}, "lacks dfmp2's molecule, scf"),
        ([1, 2], "a JSON object, got list"),
        ({"success": False, "error": "boom"}, "failed run, with no energies: boom"),
        ({"success": True, "provenance": "x"}, "its provenance.creator is None"),
        ({"provenance": {"creator": "dfmp2"}, "extras": "x"}, "extras is a JSON object, got str"),
    ]
    for data, message in cases:
        with pytest.raises(InputError, match=message):
            Result.from_dict(data)
    with pytest.raises(InputError, match="not JSON: line 1, column 2"):
        Result.from_json("{oops")
    with pytest.raises(InputError, match="takes JSON text .*got dict; a dict goes to "
                                         "Result.from_dict"):
        Result.from_json({"success": True})
    with pytest.raises(InputError, match="cannot read .*missing.json.*No such file"):
        Result.read(tmp_path / "missing.json")


def test_a_record_of_another_dfmp2_version_names_the_fields_it_lacks():
    data = dfmp2.run(WATER, basis="sto-3g").to_dict()
    del data["extras"]["sizes"]["naux"]
    with pytest.raises(InputError, match="extras.sizes lacks naux: written by another version"):
        Result.from_dict(data)
    data = dfmp2.run(WATER, basis="sto-3g").to_dict()
    for where, value, message in ((("extras", "scf"), "x", "extras.scf is a JSON object, got str"),
                                  (("properties", "mp2_singles_energy"), "0",
                                   "energy mp2_singles_energy is '0', not a finite number"),
                                  (("properties", "scf_total_energy"), float("nan"),
                                   "energy scf_total_energy is nan, not a finite number"),
                                  (("extras", "scf", "homo"), None,
                                   r"extras.scf.homo is None, not float: the file was changed"),
                                  (("extras", "molecule", "charge"), "zero",
                                   "extras.molecule.charge is 'zero', not int"),
                                  (("extras", "sizes", "nocc"), True,
                                   "extras.sizes.nocc is True, not int"),
                                  (("extras", "method", "os_scale"), "1.2",
                                   "extras.method.os_scale is '1.2', not float")):
        with pytest.raises(InputError, match=message):
            Result.from_dict(_with(data, where, value))
    data["extras"]["method"]["metric_condition"] = float("inf")  # a singular metric's, read
    for field, value in (("metric_condition", float("nan")), ("os_scale", float("inf"))):
        broken = json.loads(json.dumps(data))
        broken["extras"]["method"][field] = value
        with pytest.raises(InputError, match=f"extras.method.{field} is {value}, not"):
            Result.from_dict(broken)
    data["extras"]["scf"]["a_later_field"] = 1  # a later version's: left out, the rest read
    assert Result.from_dict(data).e_tot == data["properties"]["mp2_total_energy"]


def test_dfmp2_show_prints_the_runs_summary(tmp_path):
    out = tmp_path / "water.json"
    runner = CliRunner()
    ran = runner.invoke(main, ["run", WATER, "--basis", "sto-3g", "--json", str(out)])
    assert ran.exit_code == 0, ran.output
    shown = runner.invoke(main, ["show", str(out)])
    assert shown.exit_code == 0 and shown.stdout.strip() == ran.stdout.strip()
    verbose = runner.invoke(main, ["show", "-v", str(out)])
    assert verbose.exit_code == 0 and "SCF J/K" in verbose.stdout and "time  " in verbose.stdout
    piped = runner.invoke(main, ["show", "-"], input=out.read_text())
    assert piped.exit_code == 0 and piped.stdout == shown.stdout
    out.write_text("{")
    bad = runner.invoke(main, ["show", str(out)])
    assert bad.exit_code == 1
    assert bad.output.strip() == f"error: {out}: the record is not JSON: line 1, column 2: " \
                                 "Expecting property name enclosed in double quotes"
    folder = runner.invoke(main, ["show", str(tmp_path)])
    assert folder.exit_code == 1 and folder.output.strip() == (
        f"error: result {str(tmp_path)!r} is a directory; give a file")
    gone = runner.invoke(main, ["show", str(tmp_path / "none.json")])
    assert gone.exit_code == 1 and gone.output.count("\n") == 1 and "No such file" in gone.output


def test_dfmp2_show_of_several_files_prints_a_batch_table(tmp_path):
    runner = CliRunner()
    ran = runner.invoke(main, ["run", WATER, str(INPUTS / "methane.xyz"), "--basis", "sto-3g",
                               "--json", str(tmp_path)])
    assert ran.exit_code == 0, ran.output
    (tmp_path / "broken.json").write_text("[]")
    files = [str(tmp_path / name) for name in ("water.json", "methane.json", "broken.json")]
    shown = runner.invoke(main, ["show", *files])
    assert shown.exit_code == 1
    assert shown.stderr.strip() == f"error: {files[2]}: a dfmp2 result is a JSON object, got list"
    rows = {line.split()[0]: line.split()[1:] for line in shown.stdout.splitlines()[1:]}
    batch = {line.split()[0]: line.split()[1:] for line in ran.stdout.splitlines()
             if line.startswith(str(INPUTS))}
    assert rows[files[0]] == batch[WATER] and rows[files[1]] == batch[str(INPUTS / "methane.xyz")]
    assert rows[files[2]] == ["failed", "(its", "error", "is", "above)"]


def test_the_summary_says_when_the_scf_dropped_near_linear_dependencies():
    """He2 at 0.11 A in aug-cc-pVTZ: one overlap eigenvalue below PySCF's threshold, 45
    orbitals of 46 functions; the record had it (sizes.nmo), the summary did not."""
    result = dfmp2.run("He 0 0 0; He 0 0 0.11", basis="aug-cc-pvtz")
    assert (result.sizes.nbasis, result.sizes.nmo) == (46, 45)
    assert "(45 orbitals: 1 near-linearly dependent combination dropped)" in result.summary()
    assert "dropped)" not in dfmp2.run(WATER, basis="sto-3g").summary()


def test_a_record_changed_after_it_was_written_is_refused_in_one_line():
    """Another schema, driver or success flag than dfmp2 writes, or a total that is not the
    sum of the record's parts, is refused: ``show`` never prints other numbers than the file
    states."""
    data = dfmp2.run(WATER, basis="sto-3g").to_dict()
    for where, value, message in (
            (("schema_version",), 99, "schema_version 99 is not an AtomicResult dfmp2 writes"),
            (("schema_name",), "qcschema_input", "schema_name 'qcschema_input'"),
            (("driver",), "gradient", "driver is 'gradient'; dfmp2 computes energies only"),
            (("success",), None, "success is None, not true"),
            (("properties", "mp2_total_energy"), -5.0,
             r"mp2_total_energy -5.0 is not the sum of its parts .*changed after"),
            # (these were shown: a stated energy that is not a number, a scaled energy or an
            # answer that is not what the record's own parts and scales give)
            (("properties", "mp2_total_energy"), "abc",
             r"mp2_total_energy 'abc' is not the sum of its parts"),
            (("properties", "mp2_total_energy"), None,
             r"mp2_total_energy None is not the sum of its parts"),
            (("extras", "scs_mp2_correlation_energy"), -9.0,
             r"scaled correlation energy \(extras\) -9.0 is not its scales 1.2 x E\(OS\) \+ "
             r"0.333\d* x E\(SS\) .*changed after"),
            (("extras", "method", "scaling", "os_scale"), 1.3,
             r"scaled correlation energy .* is not its scales 1.3 x E\(OS\)"),
            (("return_result",), -5.0, r"return_result -5.0 is not its run's answer"),
            (("properties", "return_energy"), -5.0,
             r"properties.return_energy -5.0 is not its run's answer")):
        with pytest.raises(InputError, match=message):
            Result.from_dict(_with(data, where, value))
    assert Result.from_dict(data).e_tot == data["properties"]["mp2_total_energy"]


def test_a_nan_total_is_refused_as_not_the_sum_of_its_parts():
    data = dfmp2.run(WATER, basis="sto-3g").to_dict()
    with pytest.raises(InputError, match="mp2_total_energy nan is not the sum of its parts"):
        Result.from_dict(_with(data, ("properties", "mp2_total_energy"), float("nan")))
