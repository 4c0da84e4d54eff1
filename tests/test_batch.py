"""Several geometries in one `dfmp2 run`: arguments and multi-frame xyz files, one table, one
JSON per result, a failing entry reported while the others run."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

import dfmp2
from dfmp2.cli import main
from dfmp2.errors import InputError
from dfmp2.geometry import read_xyz, read_xyz_frames

from conftest import INPUTS
from tolerances import TOL_OUTCORE

FRAMES = ("3\nwater 1\nO 0 0 0\nH 0 0.757 0.587\nH 0 -0.757 0.587\n\n"
          "3\nwater 2\nO 0 0 0\nH 0 0.76 0.58\nH 0 -0.76 0.58\n")


def test_frames_are_read_in_order_with_their_lines(tmp_path):
    path = tmp_path / "w.xyz"
    path.write_text(FRAMES)
    frames = read_xyz_frames(path)
    assert [f.comment for f in frames] == ["water 1", "water 2"]
    assert frames[1].where[0] == f"{path} line 9"
    with pytest.raises(InputError, match="holds 2 frames"):
        read_xyz(path)
    with pytest.raises(InputError, match="holds 2 frames"):
        dfmp2.run(str(path))
    path.write_text(FRAMES + "H 0 0 0\n")
    with pytest.raises(InputError, match="line 12: line 7 says 3 atoms but more lines follow"):
        read_xyz_frames(path)
    path.write_text(FRAMES + "2\nshort\nH 0 0 0\n")
    with pytest.raises(InputError, match="line 15: expected 2 atom lines after the comment line, found 1"):
        read_xyz_frames(path)


def test_a_count_line_off_its_frame_refuses_the_file_before_any_job(tmp_path):
    """A count that does not match its frame's atom lines (here frame 2 says 3 atoms and has 2)
    leaves no way to tell where the next frames begin: one line naming it, exit 1, and no job
    runs, frame 1 (readable) included (README, "Several geometries")."""
    path = tmp_path / "mid.xyz"
    path.write_text("2\nf1\nH 0 0 0\nH 0 0 0.74\n3\nf2\nH 0 0 0\nH 0 0 0.74\n"
                    "2\nf3\nH 0 0 0\nH 0 0 0.75\n")
    result = CliRunner().invoke(main, ["run", str(path), "--basis", "sto-3g"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"error: {path} line 9: expected 'Element x y z', got '2'"]


def test_batch_prints_one_table_and_writes_one_json_each(tmp_path):
    frames = tmp_path / "w.xyz"
    frames.write_text(FRAMES)
    out = tmp_path / "out"
    out.mkdir()
    methane = str(INPUTS / "methane.xyz")
    result = CliRunner().invoke(main, ["run", str(frames), methane, "--json", str(out)])
    assert result.exit_code == 0, result.output
    table = [line for line in result.output.splitlines() if line.startswith(("w#", methane))]
    assert [line.split()[0] for line in table] == ["w#1", "w#2", methane]
    assert sorted(p.name for p in out.iterdir()) == ["methane.json", "w-1.json", "w-2.json"]
    single = dfmp2.run(methane)
    data = json.loads((out / "methane.json").read_text())
    assert abs(data["properties"]["mp2_total_energy"] - single.e_tot) <= TOL_OUTCORE
    assert float(table[2].split()[5]) == pytest.approx(single.e_tot, abs=TOL_OUTCORE)


def test_a_failing_entry_does_not_stop_the_others(tmp_path):
    result = CliRunner().invoke(main, ["run", str(tmp_path / "missing.xyz"),
                                       str(INPUTS / "water.xyz"), "--json",
                                       str(tmp_path / "{index}.json")])
    assert result.exit_code == 1
    assert "error (" in result.output and "missing.xyz" in result.output
    assert "failed (its error is above)" in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["2.json"]


def test_a_malformed_file_fails_its_own_entry_only(tmp_path):
    bad = tmp_path / "bad.xyz"
    bad.write_text(FRAMES + "2\nshort\nH 0 0 0\n")  # its third frame is truncated
    result = CliRunner().invoke(main, ["run", str(bad), str(INPUTS / "water.xyz"), "--json",
                                       str(tmp_path / "{index}.json"), "--basis", "sto-3g"])
    assert result.exit_code == 1
    assert "line 15: expected 2 atom lines" in result.output
    assert "failed (its error is above)" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2.json", "bad.xyz"]


def test_a_frame_with_a_wrong_atom_line_fails_its_own_job_only(tmp_path):
    """A trajectory with one broken frame (a NaN coordinate) ran none of its frames, and with
    --json DIR its one error line blamed the directory ("is a directory; give a file path")."""
    frames = tmp_path / "w.xyz"
    frames.write_text(FRAMES.replace("water 2\nO 0 0 0", "water 2\nO 0 0 nan")
                      + "\n" + FRAMES.split("\n\n")[0] + "\n")
    with pytest.raises(InputError, match="line 9: coordinate 'nan'") as raised:
        read_xyz_frames(frames)
    assert type(raised.value) is InputError
    read = read_xyz_frames(frames, keep_errors=True)
    assert [type(f).__name__ for f in read] == ["Geometry", "InputError", "Geometry"]
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(main, ["run", str(frames), "--json", str(out), "--basis",
                                       "sto-3g", "-q"])
    assert result.exit_code == 1
    assert f"error (w#2): {frames} line 9: coordinate 'nan'" in result.stderr
    assert "directory" not in result.stderr
    rows = [line.split()[:2] for line in result.stdout.splitlines() if line.startswith("w#")]
    assert rows[1] == ["w#2", "failed"] and rows[0][1] == rows[2][1] == "H2O"
    assert sorted(p.name for p in out.iterdir()) == ["w-1.json", "w-3.json"]


def test_several_results_need_several_json_files(tmp_path):
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"),
                                       str(INPUTS / "methane.xyz"), "--json",
                                       str(tmp_path / "one.json")])
    assert result.exit_code == 1
    assert "each result needs its own file; give a directory or a path with {name}" \
        in result.output


def test_two_entries_that_would_write_one_file_are_refused_before_any_run(tmp_path):
    for sub, text in (("a", FRAMES.split("\n\n")[0] + "\n"), ("b", FRAMES.split("\n\n")[1])):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "mol.xyz").write_text(text)
    out = tmp_path / "out"
    out.mkdir()
    entries = [str(tmp_path / "a" / "mol.xyz"), str(tmp_path / "b" / "mol.xyz")]
    result = CliRunner().invoke(main, ["run", *entries, "--json", str(out)])
    assert result.exit_code == 1 and list(out.iterdir()) == []
    assert (f"{entries[0]}'s --json and {entries[1]}'s --json would both write "
            f"{out / 'mol.json'}") in result.stderr
    named = [str(tmp_path / "a" / "2.xyz"), str(tmp_path / "b" / "1.xyz")]
    for entry, source in zip(named, entries):
        os.rename(source, entry)
    across = CliRunner().invoke(main, ["run", *named, "--json", str(out / "{index}.svg"),
                                       "--plot", str(out / "{name}.svg")])
    assert across.exit_code == 1 and list(out.iterdir()) == []  # a JSON under a plot's name
    assert (f"{named[1]}'s --json and {named[0]}'s --plot would both write "
            f"{out / '2.svg'}") in across.stderr
    for entry, source in zip(named, entries):
        os.rename(entry, source)
    by_index = CliRunner().invoke(main, ["run", *entries, "--json", str(out / "{index}.json"),
                                         "-q"])
    assert by_index.exit_code == 0, by_index.output
    assert sorted(p.name for p in out.iterdir()) == ["1.json", "2.json"]


def test_an_entry_computed_but_not_written_keeps_its_row_of_energies(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "water.json").symlink_to("/dev/full")  # the write fails: no space left on device
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"),
                                       str(INPUTS / "methane.xyz"), "--basis", "sto-3g",
                                       "--json", str(out)])
    assert result.exit_code == 1
    assert "error (" + str(INPUTS / "water.xyz") + "): cannot write JSON" in result.stderr
    row = next(line for line in result.stdout.splitlines() if "water.xyz" in line)
    assert "H2O" in row and row.endswith("(output not written: its error is above)")
    single = dfmp2.run(str(INPUTS / "water.xyz"), basis="sto-3g")
    assert float(row.split()[5]) == pytest.approx(single.e_tot, abs=TOL_OUTCORE)
    assert (out / "methane.json").is_file()


def test_no_entry_may_write_over_another_entrys_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "2.xyz").write_text((INPUTS / "water.xyz").read_text())
    (tmp_path / "1.xyz").write_text(FRAMES.split("\n\n")[0] + "\n")
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    result = CliRunner().invoke(main, ["run", "2.xyz", "1.xyz", "--json", "{index}.xyz"])
    assert result.exit_code == 1
    assert "2.xyz's 1.xyz would overwrite the input '1.xyz'" in result.stderr
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before


def test_one_geometry_fills_in_name_and_index(tmp_path):
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"), "--basis", "sto-3g",
                                       "--json", str(tmp_path / "{name}-{index}.json"), "-q"])
    assert result.exit_code == 0, result.output
    assert [p.name for p in tmp_path.iterdir()] == ["water-1.json"]


def test_an_interrupted_batch_prints_the_rows_of_the_jobs_it_finished(monkeypatch):
    import signal

    import dfmp2.api
    from dfmp2.errors import Interrupted

    calls, run = [], dfmp2.api.run

    def signalled_in_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise Interrupted(signal.SIGTERM, "SIGTERM")
        return run(*args, **kwargs)

    monkeypatch.setattr(dfmp2.api, "run", signalled_in_the_second)
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"),
                                       str(INPUTS / "methane.xyz"), str(INPUTS / "ammonia.xyz"),
                                       "--basis", "sto-3g"])
    assert result.exit_code == 128 + signal.SIGTERM
    assert "interrupted by SIGTERM" in result.stderr
    rows = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert rows == [str(INPUTS / "water.xyz"), str(INPUTS / "methane.xyz")]  # not ammonia's
    assert "H2O" in result.stdout and "failed (its error is above)" in result.stdout
    calls.clear()
    calls.append(1)  # the next call is the second: the first job is the one interrupted
    first = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"),
                                      str(INPUTS / "methane.xyz"), "--basis", "sto-3g"])
    assert first.exit_code == 128 + signal.SIGTERM and first.stdout == ""  # no finished job


def test_a_signal_between_two_entries_ends_the_batch_with_the_finished_rows(monkeypatch,
                                                                             tmp_path):
    """A signal while no entry's run holds the handlers (here: the second entry's output
    checks) ends the batch as one during a run does: the finished rows, one line naming the
    entry, exit 128 + n, and no file half made by the checks."""
    import signal

    import dfmp2.cli as cli

    calls, checks = [], cli._output_error

    def signalled_in_the_second_check(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return checks(*args, **kwargs)

    monkeypatch.setattr(cli, "_output_error", signalled_in_the_second_check)
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(main, ["run", str(INPUTS / "water.xyz"),
                                       str(INPUTS / "methane.xyz"), "--basis", "sto-3g",
                                       "--json", str(out)])
    assert result.exit_code == 128 + signal.SIGTERM, result.output
    assert f"({INPUTS / 'methane.xyz'}, before it ran): interrupted by SIGTERM" in result.stderr
    assert [line.split()[0] for line in result.stdout.splitlines()[1:]] == [
        str(INPUTS / "water.xyz")]
    assert sorted(p.name for p in out.iterdir()) == ["water.json"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the batch's handlers restored


def test_an_output_check_that_fails_replaces_an_earlier_result_and_names_its_entry(tmp_path):
    """hf.json of an earlier run must not pass for this run's when hf's plot path is refused."""
    out = tmp_path / "out"
    out.mkdir()
    water, methane = str(INPUTS / "water.xyz"), str(INPUTS / "methane.xyz")
    first = CliRunner().invoke(main, ["run", water, methane, "--basis", "sto-3g",
                                      "--json", str(out), "-q"])
    assert first.exit_code == 0, first.output
    (out / "methane.png").mkdir()
    second = CliRunner().invoke(main, ["run", water, methane, "--basis", "sto-3g",
                                       "--json", str(out), "--plot", str(out)])
    assert second.exit_code == 1
    assert f"error ({methane}): plot" in second.stderr and "is a directory" in second.stderr
    record = json.loads((out / "methane.json").read_text())
    assert record["success"] is False and "is a directory" in record["error"]["error_message"]


def test_a_non_utf8_or_too_deep_json_input_fails_its_own_entry(tmp_path):
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('{"id": "Ångström"}'.encode("latin-1"))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    result = CliRunner().invoke(main, ["run", str(latin1), str(deep), str(INPUTS / "water.xyz"),
                                       "--basis", "sto-3g"])
    assert result.exit_code == 1, result.output
    assert f"error ({latin1}): QCSchema input '{latin1}' is not UTF-8 text" in result.stderr
    assert f"QCSchema input '{deep}' nests its JSON too deeply to read" in result.stderr
    assert "Traceback" not in result.output
    assert "H2O" in result.stdout  # the last entry ran


def test_show_refuses_binary_and_too_deep_input_in_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("{\"a\": " * 50000 + "1" + "}" * 50000)
    shown = CliRunner().invoke(main, ["show", str(deep)])
    assert shown.exit_code == 1
    assert shown.stderr.strip() == f"error: {deep}: the record nests its JSON too deeply to read"
    binary = CliRunner().invoke(main, ["show", "-"], input=b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    assert binary.exit_code == 1
    assert binary.stderr.startswith("error: stdin: the record is not UTF-8 text")


def test_an_atom_line_with_an_atomic_number_is_not_read_as_another_frame(tmp_path):
    """A wrong count line (2 for 5 atoms) in a file of atomic numbers: '1 0 0 6' is an atom,
    not the count line of a second frame, so the file is refused, not split."""
    path = tmp_path / "numbers.xyz"
    path.write_text("2\ncluster\n2 0 0 0\n2 0 0 3\n1 0 0 6\n1 0 0 6.74\n2 0 0 9\n")
    with pytest.raises(InputError, match="line 5: line 1 says 2 atoms but more lines follow"):
        read_xyz_frames(path)
    path.write_text("2\nHe2\n2 0 0 0\n2 0 0 3\n1 atom\nHe\n2 0 0 0\n")  # a count line with text
    assert [len(f.atoms) for f in read_xyz_frames(path)] == [2, 1]


def test_a_multi_frame_file_of_another_suffix_runs_each_frame(tmp_path):
    path = tmp_path / "traj.txt"
    path.write_text(FRAMES)
    result = CliRunner().invoke(main, ["run", str(path), "--basis", "sto-3g"])
    assert result.exit_code == 0, result.output
    assert [line.split()[0] for line in result.stdout.splitlines()[1:]] == ["traj#1", "traj#2"]


def test_a_long_atom_string_gets_a_file_name_that_fits(tmp_path):
    atoms = "; ".join(f"H 0 0 {0.74 * k:.6f}" for k in range(2)) + "; " + "; ".join(
        f"He {5 + 3 * k:.6f} 0 0" for k in range(14))
    out = tmp_path / "out"
    out.mkdir()
    result = CliRunner().invoke(main, ["run", atoms, str(INPUTS / "water.xyz"), "--basis",
                                       "sto-3g", "--json", str(out), "-q"])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == 2 and all(len(name) <= 110 for name in names)  # cut to 100 + index


def test_verbose_batches_and_shows_print_each_whole_summary(tmp_path):
    water, methane = str(INPUTS / "water.xyz"), str(INPUTS / "methane.xyz")
    out = tmp_path / "out"
    out.mkdir()
    ran = CliRunner().invoke(main, ["run", water, methane, "--basis", "sto-3g", "-v",
                                    "--json", str(out)])
    assert ran.exit_code == 0, ran.output
    assert f"== {water}\n" in ran.stdout and f"== {methane}\n" in ran.stdout
    assert ran.stdout.count("SCF J/K:") == 2 and "E(SCS-MP2) total" in ran.stdout
    shown = CliRunner().invoke(main, ["show", "-v", str(out / "water.json"),
                                      str(out / "methane.json")])
    assert shown.exit_code == 0 and shown.stdout.count("SCF J/K:") == 2
    stdout = CliRunner().invoke(main, ["run", water, methane, "--json", "-"])
    assert stdout.exit_code == 1
    assert "--json - writes one result to stdout; with 2 geometries give a directory" in \
        stdout.stderr
