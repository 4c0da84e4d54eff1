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
