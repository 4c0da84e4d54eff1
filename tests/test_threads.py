"""Thread counts: every pool held to one count for a run, and put back (``dfmp2.threads``)."""

from __future__ import annotations

import json

import numpy as np  # noqa: F401  - numpy's OpenBLAS loaded, as in every run
import pytest
import scipy.linalg  # noqa: F401  - scipy's too
import torch
from click.testing import CliRunner
from pyscf import lib

import dfmp2
from dfmp2 import threads
from dfmp2.cli import main
from dfmp2.errors import InputError

from conftest import INPUTS
from tolerances import TOL_OUTCORE

WATER = str(INPUTS / "water.xyz")


def _flat(counts: dict) -> dict:
    """{pool: count} with each OpenBLAS as its own pool."""
    return {"torch": counts["torch"], "pyscf_openmp": counts["pyscf_openmp"],
            **{f"openblas {k}": v for k, v in counts["openblas"].items()}}


@pytest.fixture
def two_threads():
    """Every pool at 2 threads before the test (whatever the machine), put back after."""
    before = threads.counts()
    torch.set_num_threads(2)
    lib.num_threads(2)
    for path in threads.openblas_libraries():
        calls = threads._openblas_calls(path)
        if calls is not None:
            calls[1](2)
    yield threads.counts()
    torch.set_num_threads(before["torch"])
    lib.num_threads(before["pyscf_openmp"])
    for path in threads.openblas_libraries():
        calls = threads._openblas_calls(path)
        if calls is not None:
            calls[1](before["openblas"].get(threads._owner(path), 1))


def test_limit_holds_every_pool_and_restores_it(two_threads):
    assert "numpy" in two_threads["openblas"]  # numpy's wheel's OpenBLAS, found and named
    multi = {k for k, v in _flat(two_threads).items() if v == 2}
    assert {"torch", "pyscf_openmp", "openblas numpy"} <= multi
    with threads.limit(1):
        assert set(_flat(threads.counts()).values()) == {1}
        assert threads.available() == 1
    assert threads.counts() == two_threads
    with pytest.raises(RuntimeError, match="inside"), threads.limit(1):
        raise RuntimeError("inside")
    assert threads.counts() == two_threads  # put back on error too
    with threads.limit(None):
        assert threads.counts() == two_threads


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_limit_refuses_what_is_not_a_count(bad):
    with pytest.raises(InputError, match="threads must be a whole number from 1 to 4096"), \
            threads.limit(bad):
        pass


def test_owner_names_the_package():
    assert threads._owner("/x/lib/python3.11/site-packages/numpy.libs/libscipy_openblas.so") \
        == "numpy"
    assert threads._owner("/x/site-packages/pyscf/lib/libopenblas-r0.so") == "pyscf"
    assert threads._owner("/usr/lib/libopenblas.so.0") == "libopenblas.so.0"


def test_run_with_threads_records_them_and_gives_the_same_energy(two_threads):
    free = dfmp2.run(WATER, basis="sto-3g")
    one = dfmp2.run(WATER, basis="sto-3g", threads=1)
    assert set(_flat(one.backend.cpu_blas["threads"]).values()) == {1}
    assert free.backend.cpu_blas["threads"]["torch"] == 2
    assert threads.counts() == two_threads
    assert abs(one.e_tot - free.e_tot) <= TOL_OUTCORE  # another summation order at most
    assert "threads: torch 1, PySCF's OpenMP 1, OpenBLAS of numpy 1" in one.summary(verbose=True)


def test_dfmp2_class_holds_the_threads_of_its_runs(two_threads):
    """DFMP2(mf, threads=) as dfmp2.run(threads=): the record says the pools ran on that
    count, the process's counts are back afterwards, and run(threads=) changes it for later
    runs as PySCF's run(**kwargs) does (it was refused as an unknown setting)."""
    from pyscf import gto, scf

    mol = gto.M(atom=WATER, basis="sto-3g", verbose=0)
    mf = scf.RHF(mol).run()
    free = dfmp2.DFMP2(mf, auxbasis="def2-svp-ri").run()
    pt = dfmp2.DFMP2(mf, auxbasis="def2-svp-ri", threads=1).run()
    assert set(_flat(pt.result.backend.cpu_blas["threads"]).values()) == {1}
    assert free.result.backend.cpu_blas["threads"]["torch"] == 2
    assert threads.counts() == two_threads
    assert abs(pt.e_corr - free.e_corr) <= TOL_OUTCORE  # another summation order at most
    pt.run(threads=2)
    assert pt.threads == 2 and pt.result.backend.cpu_blas["threads"]["torch"] == 2
    for bad in (0, 1.5, True):
        with pytest.raises(InputError, match="threads must be a whole number from 1"):
            dfmp2.DFMP2(mf, threads=bad)
        with pytest.raises(InputError, match="threads must be a whole number from 1"):
            pt.run(threads=bad)
    assert pt.threads == 2  # a refused run changes nothing


def test_cli_threads(tmp_path, two_threads):
    out = tmp_path / "w.json"
    result = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--threads", "1",
                                       "--json", str(out), "-q"])
    assert result.exit_code == 0, result.output
    recorded = json.loads(out.read_text())["extras"]["backend"]["cpu_blas"]["threads"]
    assert set(_flat(recorded).values()) == {1}
    assert threads.counts() == two_threads
    refused = CliRunner().invoke(main, ["run", WATER, "--threads", "0"])
    assert refused.exit_code == 2 and "--threads" in refused.output


def test_overlapping_single_threaded_blocks_restore_the_count_once_both_close(two_threads):
    """Two Python threads in single_threaded_numpy_blas at once (two runs in one process):
    the count stays 1 until the last block closes, then comes back (not 1 for good)."""
    import threading

    if threads.numpy_blas_threads() != 2:
        pytest.skip("numpy's BLAS thread count cannot be set here (not an OpenBLAS)")
    opened, release, seen = threading.Event(), threading.Event(), []

    def second():
        with threads.single_threaded_numpy_blas():
            opened.set()
            release.wait(10)
            seen.append((_live(), threads.numpy_blas_threads()))

    worker = threading.Thread(target=second)
    with threads.single_threaded_numpy_blas():
        worker.start()
        assert opened.wait(10)
    assert _live() == 1  # the second block is still open
    release.set()
    worker.join(10)
    # inside, the products ran on 1 thread; the count a run reads is the one given back
    assert seen == [(1, 2)] and _live() == 2


def _live() -> int:
    """numpy's OpenBLAS count as the library holds it now."""
    return int(threads._numpy_openblas()[0]())


@pytest.mark.parametrize("limit_first", [True, False])
def test_a_limit_and_a_single_threaded_block_overlapping_each_give_back_what_they_found(
        two_threads, limit_first):
    """A run's ``limit(3)`` and another run's pair step (one BLAS thread) on two Python
    threads, opened and closed in either order: the pair step's products stay on one thread
    while it is open, the limited run reads its 3, and the process ends at its 2 (it was left
    at 1 or 3 for good when each saved and restored the count on its own)."""
    import threading

    if threads.numpy_blas_threads() != 2:
        pytest.skip("numpy's BLAS thread count cannot be set here (not an OpenBLAS)")
    opened, release, closed, seen = (threading.Event(), threading.Event(), threading.Event(),
                                     [])

    def pair_step():
        with threads.single_threaded_numpy_blas():
            opened.set()
            release.wait(10)
            seen.append(("pair step", _live()))
        closed.set()

    worker = threading.Thread(target=pair_step)
    if limit_first:  # the limit opens first and closes first
        with threads.limit(3):
            worker.start()
            assert opened.wait(10)
            seen.append(("limited", _live(), threads.numpy_blas_threads()))
        seen.append(("after the limit", _live(), threads.numpy_blas_threads()))
        release.set()
    else:  # the pair step opens first and closes inside the limit
        worker.start()
        assert opened.wait(10)
        with threads.limit(3):
            seen.append(("limited", _live(), threads.numpy_blas_threads()))
            release.set()
            assert closed.wait(10)
            seen.append(("pair step closed", _live(), threads.numpy_blas_threads()))
    worker.join(10)
    assert ("pair step", 1) in seen
    assert ("limited", 1, 3) in seen
    assert ("after the limit", 1, 2) in seen or ("pair step closed", 3, 3) in seen
    assert _live() == 2 and threads.counts() == two_threads


def test_numpy_blas_is_found_whatever_its_file_is_called(two_threads, monkeypatch):
    """Through numpy's own compiled core, not a path: conda's ``libcblas.so.3`` or a
    distribution's ``libblas.so.3`` is numpy's OpenBLAS under a name without 'openblas' or
    'site-packages' in it (then no library by path is numpy's)."""
    if threads._numpy_openblas() is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS")
    monkeypatch.setattr(threads, "openblas_libraries", lambda: [])
    assert threads.counts()["openblas"] == {"numpy": 2}
    with threads.limit(1):
        assert _live() == 1
        with threads.single_threaded_numpy_blas():
            assert _live() == 1
    assert _live() == 2
    with threads.single_threaded_numpy_blas():
        assert _live() == 1 and threads.numpy_blas_threads() == 2
    assert _live() == 2


def test_the_thread_calls_are_found_under_each_builds_names():
    """numpy 1.x's wheel names them openblas_*_num_threads64_ (its Fortran ones end in _64_,
    which take a pointer); numpy 2's scipy_openblas_*64_; a plain build has no suffix."""
    from types import SimpleNamespace

    def library(*names):
        return SimpleNamespace(**{name: type("Call", (), {})() for name in names})

    numpy1 = library("openblas_get_num_threads64_", "openblas_set_num_threads64_",
                     "openblas_get_num_threads_64_", "openblas_set_num_threads_64_")
    get, put = threads._thread_calls(numpy1)
    assert (get, put) == (numpy1.openblas_get_num_threads64_,
                          numpy1.openblas_set_num_threads64_)
    numpy2 = library("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_")
    assert threads._thread_calls(numpy2)[0] is numpy2.scipy_openblas_get_num_threads64_
    assert threads._thread_calls(library("openblas_get_num_threads_64_",
                                         "openblas_set_num_threads_64_")) is None


def test_numpy_blas_falls_back_to_its_wheels_path_where_its_core_cannot_be_opened(monkeypatch):
    """A numpy whose compiled core ctypes cannot open: its wheel's library, by path, as before
    (not None, which would leave the pair step's GEMMs on every BLAS thread)."""
    found = threads._numpy_openblas()
    if found is None or not any(threads._owner(p) == "numpy"
                                for p in threads.openblas_libraries()):
        pytest.skip("numpy's BLAS here is not a wheel's OpenBLAS")

    def unopenable():
        raise ImportError("no compiled core")

    monkeypatch.setattr(threads, "_numpy_core_module", unopenable)
    threads._numpy_openblas.cache_clear()
    try:
        calls = threads._numpy_openblas()
        assert calls is not None and threads._address(calls[1]) == threads._address(found[1])
    finally:
        threads._numpy_openblas.cache_clear()
