"""DF-MP2 over torch.distributed (gloo on this machine): the split of the work, torchrun runs of
2 and 3 ranks against the single-process energy, the record, and ranks that fail."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys

import _dist_workers
import numpy as np
import pytest
from _dist_workers import die_in_pairs, fail_in_fit

import dfmp2
from dfmp2 import distributed
from dfmp2.energy import pair_weights
from dfmp2.errors import ResourceError
from dfmp2.geometry import read_xyz_frames

from conftest import INPUTS, open_files_under
from tolerances import TOL_DISTRIBUTED

WATER = str(INPUTS / "water.xyz")
#: H2O+ (doublet): an open shell whose alpha and beta spaces differ.
CATION = ["--charge", "1", "--spin", "1"]
#: Seconds within which ranks stopped by a failed input check must report (they stop before the
#: SCF, in well under a second; the group's collective timeout is 60 s).
TIMELY_STOP_S = 30.0


# -- the split ---------------------------------------------------------------------------------
def _cover(nocc, world, chunk, triangular=True):
    """Run the pair stage's schedule on paper: (times each pair is computed, pairs per rank,
    pairs per rank and gather step)."""
    seen = np.zeros((nocc, nocc), dtype=int)
    shares = np.zeros(world, dtype=int)
    steps = -(-(-(-nocc // world)) // chunk)
    per_step = np.zeros((world, steps), dtype=int)
    for rank in range(world):
        i0, i1 = distributed.occ_slice(nocc, world, rank)
        for src, share in distributed.pair_sources(world, rank, triangular):
            s0, s1 = distributed.occ_slice(nocc, world, src)
            if src == rank and triangular:  # the own triangle: one process's I <= J blocks
                w = pair_weights(0, i1 - i0, 0, i1 - i0, True)
                for a, b in zip(*np.nonzero(w)):
                    seen[i0 + a, i0 + b] += 1
                shares[rank] += int(np.count_nonzero(w))
                continue
            for t in range(steps):
                j_lo, j_hi = t * chunk, min(s1 - s0, (t + 1) * chunk)
                for r0, r1, c0, c1 in distributed.block_pieces(share, t, chunk, i1 - i0,
                                                               j_hi - j_lo):
                    for i in range(i0 + r0, i0 + r1):
                        for j in range(s0 + j_lo + c0, s0 + j_lo + c1):
                            seen[min(i, j), max(i, j)] += 1 if triangular else 0
                            if not triangular:
                                seen[i, j] += 1
                    n = (r1 - r0) * (c1 - c0)
                    shares[rank] += n
                    per_step[rank, t] += n
    return seen, shares, per_step


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("nocc", [1, 2, 5, 13, 40])
@pytest.mark.parametrize("chunk", [1, 3, 20])
def test_every_pair_is_computed_once_and_the_shares_balance(world, nocc, chunk):
    """The blocks of :func:`pair_sources`, cut by :func:`block_pieces` step by step, cover every
    pair i <= j of one space exactly once (and every i, j of two spaces); with slices of equal
    size the ranks' shares are equal, and a shared block gives both ranks work in every step."""
    seen, shares, per_step = _cover(nocc, world, chunk)
    assert (seen == np.triu(np.ones((nocc, nocc), dtype=int))).all()
    assert shares.sum() == nocc * (nocc + 1) // 2
    n = nocc // world
    if nocc % world == 0 and n % chunk == 0 and chunk % 2 == 0:
        assert len(set(shares.tolist())) == 1, shares
    if nocc % world == 0:  # an odd chunk's diagonal cells split unevenly by one row each
        assert shares.max() - shares.min() <= (n // chunk + 1) * chunk, shares
    if world == 2 and nocc == 40 and chunk == 3:  # the shared block, step by step
        assert (np.abs(per_step[0] - per_step[1]) <= chunk * chunk).all(), per_step
    both, _, _ = _cover(nocc, world, chunk, triangular=False)
    assert (both == 1).all()


def test_auxiliary_shells_are_shared_by_function_count():
    ao_loc = np.array([0, 1, 4, 9, 10, 15, 16, 21, 22, 27, 30])
    for world in (1, 2, 3, 4):
        shares = distributed.aux_shares(ao_loc, world)
        assert shares[0][0] == 0 and shares[-1][1] == len(ao_loc) - 1
        assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))  # contiguous
        sizes = [p1 - p0 for _, _, p0, p1 in shares]
        assert sum(sizes) == 30 and max(sizes) - min(sizes) <= 6  # whole shells of <= 5
    # more ranks than shells: the last ones get none, and nothing is lost
    assert [p1 - p0 for *_, p0, p1 in distributed.aux_shares(np.array([0, 5, 10]), 3)] == \
        [5, 0, 5]


def test_occupied_slices_differ_by_at_most_one_orbital():
    for nocc in (0, 1, 5, 13):
        for world in (1, 2, 3, 7):
            sizes = [b - a for a, b in (distributed.occ_slice(nocc, world, r)
                                        for r in range(world))]
            assert sum(sizes) == nocc and max(sizes) - min(sizes) <= 1


def test_a_rank_plans_for_its_slice():
    one = distributed.plan_rank(100, [(40, 300)], 900, 1, 4000, 8)
    four = distributed.plan_rank(100, [(40, 300)], 900, 4, 4000, 8)
    assert four.b_bytes == one.b_bytes // 4 and four.occ_block <= 10


@pytest.mark.parametrize("world_size, max_memory", [(4, 800), (8, 1500), (8, 2000)])
def test_a_ranks_transform_groups_fit_with_every_occupied_orbital(world_size, max_memory):
    """A rank plans B by its occupied slice but transforms all 200 occupied orbitals of its
    auxiliary functions: the transform's block and groups, counted with all of them (and,
    out of core, the HDF5 write's copy of a group), fit what the plan leaves (the first two
    budgets are ones where a plan made by the slices alone did not leave enough)."""
    from dfmp2.blocking import usable_bytes

    nao, nocc, nvir = 1000, 200, 800
    plan = distributed.plan_rank(nao, [(nocc, nvir)], 3000, world_size, max_memory, 8)
    group = nao * nao + nao * nocc + nocc * nvir + (nocc * nvir if plan.outcore else 0)
    transform = (plan.aux_block * nao * (nao + 1) // 2 + plan.unpack_block * group) * 8
    assert transform <= usable_bytes(max_memory) - plan.resident_bytes


def test_no_torchrun_no_group():
    assert distributed.init_from_environment({}) is None
    assert distributed.init_from_environment({"RANK": "0", "WORLD_SIZE": "1"}) is None
    assert distributed.current() is None


def test_a_group_that_cannot_be_joined_is_one_line():
    from dfmp2.errors import BackendUnavailableError, InputError

    env = {"RANK": "0", "WORLD_SIZE": "2"}
    with pytest.raises(InputError, match="are not integers"):
        distributed.init_from_environment({"RANK": "zero", "WORLD_SIZE": "2"})
    if not __import__("torch").cuda.is_available():
        with pytest.raises(BackendUnavailableError, match="nccl needs CUDA; use gloo"):
            distributed.init_from_environment(env, "nccl")
    with pytest.raises(BackendUnavailableError, match="xla needs torch-xla"):
        distributed.init_from_environment(env, "xla")


def test_nccl_only_where_each_rank_of_the_node_has_a_device(monkeypatch):
    """Two ranks on a one-GPU machine: auto takes gloo on every rank (NCCL refuses two ranks on
    one device), and nccl asked for stops every rank with the same line before any CUDA call;
    without LOCAL_WORLD_SIZE (another launcher) all ranks count as one node, so they still
    agree. torch's queries are patched: this runs without a GPU."""
    from dfmp2.errors import BackendUnavailableError, InputError

    torch = __import__("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda _i: pytest.fail("set_device called"))

    def choice(rank, local_rank, local_world=None, world=2):
        env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local_rank)}
        if local_world is not None:
            env["LOCAL_WORLD_SIZE"] = local_world
        return distributed._auto_backend(distributed._node_ranks(env)[1])

    assert choice(0, 0, "2") == choice(1, 1, "2") == "gloo"
    assert choice(0, 0, "1") == choice(1, 0, "1") == "nccl"  # one rank per node
    for local_world in (None, "", "abc", "0"):  # all ranks counted as one node: all agree
        assert choice(0, 0, local_world) == choice(1, 1, local_world) == "gloo"
    for rank in (0, 1):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": "2"}
        with pytest.raises(BackendUnavailableError,
                           match=r"^--dist-backend nccl needs a CUDA device per rank of a node: "
                                 r"2 ranks, 1 device\(s\) visible; use gloo"):
            distributed.init_from_environment(env, "nccl")
    with pytest.raises(InputError, match="LOCAL_RANK='one' is not an integer"):
        distributed.init_from_environment({"RANK": "1", "WORLD_SIZE": "2",
                                           "LOCAL_RANK": "one"}, "nccl")


# -- torchrun ----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _torchrun(world: int, args, tmp_path, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
         "--nproc-per-node", str(world), "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "-m", "dfmp2", "run", *args],
        capture_output=True, text=True, timeout=timeout, cwd=tmp_path, env=env)


@pytest.fixture(scope="module")
def single():
    """Single-process references: closed shell and cation, in core (the out-of-core route
    agrees to TOL_OUTCORE, tested elsewhere)."""
    return {"closed": dfmp2.run(WATER), "open": dfmp2.run(WATER, charge=1, spin=1),
            "rohf": dfmp2.run(WATER, charge=1, spin=1, reference="rohf")}


@pytest.mark.parametrize("outcore", [False, True], ids=["incore", "outcore"])
@pytest.mark.parametrize("shell", ["closed", "open"])
@pytest.mark.parametrize("world", [2, 3])
def test_torchrun_equals_one_process(tmp_path, single, world, shell, outcore):
    """2 and 3 ranks give the single-process energy; rank 0 alone prints and writes the JSON;
    the record shows the work split; no rank leaves a file behind."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    out = tmp_path / "r.json"
    args = [WATER, "--json", str(out), "--scratch-dir", str(scratch), "-v"]
    args += (CATION if shell == "open" else []) + (["--force-outcore"] if outcore else [])
    proc = _torchrun(world, args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("E(MP2) total") == 1  # rank 0 only
    record = json.loads(out.read_text())
    ref = single[shell]
    props = record["properties"]
    assert abs(props["mp2_correlation_energy"] - ref.e_corr) <= TOL_DISTRIBUTED
    assert abs(props["mp2_total_energy"] - ref.e_tot) <= TOL_DISTRIBUTED
    assert props["mp2_opposite_spin_correlation_energy"] == pytest.approx(
        ref.e_corr_os, abs=TOL_DISTRIBUTED)
    dist = record["extras"]["distributed"]
    assert (dist["world_size"], dist["backend"]) == (world, "gloo")
    device = record["extras"]["backend"]["device"]  # where the ranks' MP2 step ran (was null)
    assert device["resolved"] == "host" and "torchrun rank computes on its host" in device["reason"]
    # the work split: every pair once, every rank a share; functions and orbitals all dealt
    assert sum(dist["pair_shares"]) == record["extras"]["sizes"]["npairs"] == ref.sizes.npairs
    assert len(dist["pair_shares"]) == world and min(dist["pair_shares"]) > 0
    assert sum(dist["aux_shares"]) == ref.sizes.naux and min(dist["aux_shares"]) > 0
    nocc = [ref.sizes.nocc] + ([ref.sizes.nocc_beta] if shell == "open" else [])
    assert [sum(s) for s in dist["occ_shares"]] == nocc
    # the redistribution alone: rank r sends (ia|P) of its functions for every other rank's
    # orbitals, in fp64 (padding and the pair stage's chunks come on top)
    spaces = [(ref.sizes.nocc, ref.sizes.nvir)]
    if shell == "open":
        spaces.append((ref.sizes.nocc_beta, ref.sizes.nvir_beta))
    for rank, sent in enumerate(dist["bytes_sent"]):
        least = sum((o - (lambda a, b: b - a)(*distributed.occ_slice(o, world, rank))) * v
                    for o, v in spaces) * dist["aux_shares"][rank] * 8
        assert sent >= least > 0
    assert all(set(t) >= {"transform", "redistribute", "fit", "pair_energy"}
               for t in dist["stage_seconds"])
    assert record["extras"]["method"]["blocks"]["storage"] == ("hdf5" if outcore else "incore")
    assert f"distributed over {world} ranks (gloo)" in proc.stdout
    assert list(scratch.iterdir()) == []


def test_torchrun_rohf_adds_rank_0s_singles(tmp_path, single):
    """ROHF-MBPT(2) over 2 ranks: the semicanonical spaces are rank 0's, the singles too."""
    out = tmp_path / "r.json"
    proc = _torchrun(2, [WATER, *CATION, "--reference", "rohf", "--json", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    props = json.loads(out.read_text())["properties"]
    ref = single["rohf"]
    assert ref.e_singles < 0.0
    assert abs(props["mp2_singles_energy"] - ref.e_singles) <= TOL_DISTRIBUTED
    assert abs(props["mp2_correlation_energy"] - ref.e_corr) <= TOL_DISTRIBUTED


def test_torchrun_bad_input_ends_every_rank_with_one_line(tmp_path):
    proc = _torchrun(2, [str(tmp_path / "missing.xyz")], tmp_path, timeout=120)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 2 and all("missing.xyz" in line for line in errors)
    assert {"(rank 0 of 2)", "(rank 1 of 2)"} == {e.split(":")[0][5:].strip() for e in errors}
    # no traceback from a rank (torchrun's launcher adds its own report of the failed job)
    assert f"{os.sep}dfmp2{os.sep}" not in proc.stderr


def test_torchrun_signal_removes_every_ranks_files(tmp_path):
    """SIGTERM to torchrun (what a scheduler sends) reaches every rank: each ends with one line
    and exit 143, and every rank's scratch file is gone."""
    import signal
    import time

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
         "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "-m",
         "dfmp2", "run", str(INPUTS / "naphthalene.xyz"), "--force-outcore", "--scratch-dir",
         str(scratch)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120
        def h5_files():
            return {p for p in open_files_under(scratch) if p.endswith(".h5")}

        while len(h5_files()) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert len(h5_files()) == 2, "both ranks' files should be open"
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    lines = [line for line in err.splitlines() if line.startswith("error")]
    assert sorted(lines) == [f"error (rank {r} of 2): interrupted by SIGTERM; temporary files "
                             "removed; exit status 143" for r in (0, 1)]
    assert list(scratch.iterdir()) == [] and open_files_under(scratch) == []


# -- failing ranks (spawned processes calling dfmp2.run on their own gloo group) --------------
def _spawn(target, world, *args, timeout=240):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=target, args=(rank, world, port, queue, *args))
             for rank in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout)
    alive = [p for p in procs if p.is_alive()]
    for proc in alive:
        proc.kill()
    assert not alive, "a rank hung"
    reports = {}
    while not queue.empty():
        rank, kind, text = queue.get()
        reports[rank] = (kind, text)
    return procs, reports


def test_a_failing_rank_ends_every_rank_and_leaves_no_file(tmp_path):
    """Rank 1's fit fails: rank 1 raises its own error, rank 0 a RankFailed naming rank 1 and
    its message; the scratch files of both (out of core) are gone."""
    _procs, reports = _spawn(fail_in_fit, 2, WATER, str(tmp_path))
    assert reports[1] == ("ResourceError", "rank 1 ran out of memory in the fit (injected)")
    kind, text = reports[0]
    assert kind == "RankFailed"
    assert text == ("rank 1 of 2 failed during fit: rank 1 ran out of memory in the fit "
                    "(injected)")
    assert list(tmp_path.iterdir()) == []


def test_a_vanished_rank_does_not_hang_the_others(tmp_path):
    """Rank 1 exits abruptly inside the pair stage: rank 0's collective fails (the peer is
    gone, or its 20 s timeout) instead of waiting forever, and rank 0's files are removed."""
    procs, reports = _spawn(die_in_pairs, 2, WATER, str(tmp_path))
    assert procs[1].exitcode == 3 and 1 not in reports
    kind, _text = reports[0]
    assert kind in ("RuntimeError", "DistBackendError", "DistNetworkError", "RankFailed")
    assert distributed.ProcessGroup.is_collective_error(RuntimeError(_text)) or \
        kind == "RankFailed"
    # rank 0 removed its files; rank 1 ended like a SIGKILL, which no process can clean after
    assert [p.name for p in tmp_path.iterdir()
            if not p.name.startswith(f"dfmp2-{procs[1].pid}-")] == []


def test_torchrun_runs_workflows(tmp_path):
    """A QCSchema input and a counterpoise job over 2 ranks: the same energies as one process,
    rank 0 writing the JSON."""
    from qcelemental.models import v1

    from dfmp2.counterpoise import run_counterpoise

    schema = tmp_path / "in.json"
    schema.write_text(json.dumps({
        "schema_name": "qcschema_input", "schema_version": 1, "driver": "energy",
        "molecule": {"symbols": ["O", "H", "H"],
                     "geometry": [0.0, 0.0, -0.1294769411, 0.0, -1.494187339, 1.0274465079,
                                  0.0, 1.494187339, 1.0274465079]},
        "model": {"method": "mp2", "basis": "cc-pvdz"}, "keywords": {"freeze_core": True}}))
    out = tmp_path / "out.json"
    proc = _torchrun(2, [str(schema), "--json", str(out), "-q"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    v1.AtomicResult(**data)
    assert data["extras"]["distributed"]["world_size"] == 2
    single = dfmp2.run_qcschema(json.loads(schema.read_text()))
    assert abs(data["return_result"] - single["return_result"]) <= TOL_DISTRIBUTED
    cp = tmp_path / "cp.json"
    dimer = "O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.587; O 0 0 2.9; H 0 0.757 3.5; H 0 -0.757 3.5"
    proc = _torchrun(2, [dimer, "--counterpoise", "--fragments", "3,3", "--basis", "sto-3g",
                         "--auxbasis", "def2-svp-ri", "--json", str(cp)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("E(int) MP2") == 1
    got = json.loads(cp.read_text())["extras"]["interaction"]["mp2"]["eh"]
    want = run_counterpoise(dimer, "3,3", basis="sto-3g", auxbasis="def2-svp-ri")
    assert abs(got - want.interaction["mp2"]["eh"]) <= TOL_DISTRIBUTED


def test_run_qcschema_on_every_rank_returns_the_result_on_rank_0_and_none_elsewhere():
    """The Python QCSchema entry point under torch.distributed, as dfmp2.run: every rank takes
    part, rank 0 returns the AtomicResult and the others None (they raised an AttributeError
    from the result's record before)."""
    data = {"schema_name": "qcschema_input", "schema_version": 1, "driver": "energy",
            "molecule": {"symbols": ["O", "H", "H"],
                         "geometry": [0.0, 0.0, -0.1294769411, 0.0, -1.494187339, 1.0274465079,
                                      0.0, 1.494187339, 1.0274465079]},
            "model": {"method": "mp2", "basis": "sto-3g"}}
    _procs, reports = _spawn(_dist_workers.qcschema_on_every_rank, 2, data)
    assert reports[1] == ("ok", "None")
    kind, text = reports[0]
    assert kind == "ok"
    single = dfmp2.run_qcschema(data, threads=1)["return_result"]
    assert abs(float(text) - single) <= TOL_DISTRIBUTED


def test_a_check_that_fails_on_one_rank_stops_every_rank_before_the_scf(tmp_path):
    """A scratch directory missing on rank 1 only: both ranks stop in the input checks (rank 1
    its own InputError, rank 0 a RankFailed), at once rather than after rank 0's SCF and a
    collective timeout."""
    _procs, reports = _spawn(_dist_workers.scratch_missing_on_rank_1, 2, WATER, str(tmp_path))
    assert reports[1][0] == "InputError" and "does not exist" in reports[1][1]
    kind, text = reports[0]
    assert kind == "RankFailed" and "failed during the input checks" in text
    assert float(text.split()[0]) < TIMELY_STOP_S


def test_torchrun_batch_stays_in_step_when_rank_0_cannot_write(tmp_path):
    """Entry 1's JSON path is a directory (checked by rank 0, which alone writes): every rank
    skips entry 1 together, and entry 2's energy is that of one process."""
    frames = tmp_path / "two.xyz"
    water = (INPUTS / "water.xyz").read_text()
    frames.write_text(water + water.replace("0.0000", "0.0100", 1))
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "1.json").mkdir()
    proc = _torchrun(2, [str(frames), "--json", str(tmp_path / "out" / "{index}.json")],
                     tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "failed during the output checks" in proc.stderr
    # (once, on an H200 machine under pytest-xdist, entry 2 wrote no file: the ranks' own
    # lines say why, should it happen again)
    assert (tmp_path / "out" / "2.json").is_file(), proc.stdout[-2000:] + proc.stderr[-4000:]
    got = json.loads((tmp_path / "out" / "2.json").read_text())
    want = dfmp2.run(read_xyz_frames(frames)[1])
    assert abs(got["properties"]["mp2_correlation_energy"] - want.e_corr) <= TOL_DISTRIBUTED


@pytest.mark.parametrize("world_size, force_outcore", [(2, True), (3, True), (2, False)])
def test_a_rank_plan_shrinks_its_blocks_for_the_gathers_and_names_its_true_least(
        world_size, force_outcore):
    """(H2O)8 cc-pVDZ's sizes: the planner filled the budget with pair blocks and the gathers
    then did not fit, so every budget up to 171 MB was refused, each naming one that was
    refused again. Now the blocks shrink to make room; a refusal names the least budget that
    passes, and every budget from it up passes."""
    shape = (192, [(40, 152)], 672, world_size)
    least = None
    for max_memory in range(5, 200):
        try:
            distributed.plan_rank(*shape, max_memory, 8, force_outcore=force_outcore)
        except ResourceError as exc:
            assert least is None, f"{max_memory} MB refused above a budget that passed"
            distributed.plan_rank(*shape, exc.least_mb, 8, force_outcore=force_outcore)
            with pytest.raises(ResourceError):
                distributed.plan_rank(*shape, exc.least_mb - 1, 8, force_outcore=force_outcore)
            assert f"give --max-memory {exc.least_mb} " in str(exc)
        else:
            least = least or max_memory
    assert least is not None and least < 25


def test_the_pair_gather_counts_against_max_memory():
    """With more ranks than orbitals in a block, each gather brings one orbital from every
    rank: a budget that holds the slices but not that is refused before any work."""
    dims = [(500, 1900)]
    plan = distributed.plan_rank(2280, dims, 8400, 16, 40000, 8)
    assert plan.occ_block >= 16
    with pytest.raises(ResourceError, match="each gather brings 1 occupied orbital") as err:
        distributed.plan_rank(2280, dims, 8400, 256, 20000, 8)
    # the figure it names travels with it (api._plan_both compares it with the SCF's)
    assert f"give --max-memory {err.value.least_mb} " in str(err.value)
    assert err.value.least_mb > 20000
    assert distributed.gather_bytes(2, 1900, 8400, 256, 8) == 257 * 1900 * 8400 * 8


def test_a_torchrun_environment_that_cannot_meet_is_one_line(monkeypatch):
    """RANK outside WORLD_SIZE, or a rendezvous without MASTER_ADDR (or with a port that is not
    a number): one line naming what torchrun sets, not torch.distributed's traceback."""
    from dfmp2.errors import BackendUnavailableError, InputError

    with pytest.raises(InputError, match="RANK=5 is not a rank of WORLD_SIZE=2"):
        distributed.init_from_environment({"RANK": "5", "WORLD_SIZE": "2"}, "gloo")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with pytest.raises(BackendUnavailableError, match=r"process group did not form "
                                                      r"\(MASTER_ADDR=None, MASTER_PORT=None\)"):
        distributed.init_from_environment({"RANK": "0", "WORLD_SIZE": "2"}, "gloo")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "abc")
    with pytest.raises(BackendUnavailableError, match="MASTER_PORT='abc'.*start it with torchrun"):
        distributed.init_from_environment({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR":
                                           "127.0.0.1", "MASTER_PORT": "abc"}, "gloo")
