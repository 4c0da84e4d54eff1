"""Shared fixtures (the named tolerances live in ``tolerances.py``)."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest

INPUTS = Path(__file__).resolve().parent.parent / "inputs"


def open_files_under(directory, pids=None) -> list[str]:
    """Paths under ``directory`` that the processes ``pids`` (default: every process this user
    may inspect) hold open, deleted ones included (Linux ``/proc``): a run's scratch files are
    unlinked as soon as they are open, so this is where they can be seen."""
    prefix = os.path.realpath(directory) + os.sep
    fd_dirs = ([f"/proc/{pid}/fd" for pid in pids] if pids is not None
               else glob.glob("/proc/[0-9]*/fd"))
    found = []
    for fd_dir in fd_dirs:
        try:
            names = os.listdir(fd_dir)
        except OSError:  # gone, or not ours
            continue
        for name in names:
            try:
                target = os.readlink(os.path.join(fd_dir, name))
            except OSError:
                continue
            if target.startswith(prefix):
                found.append(target.removesuffix(" (deleted)"))
    return found


@pytest.fixture
def inputs_dir() -> Path:
    return INPUTS


def pyscf_dfmp2(mf, auxbasis: str, frozen=None):
    """PySCF's DF-MP2 as a reference: same SCF object, explicit RI basis, no stored t2."""
    from pyscf import df
    from pyscf.mp import dfmp2

    pt = dfmp2.DFMP2(mf, frozen=frozen)
    pt.with_df = df.DF(mf.mol, auxbasis=auxbasis)  # never the SCF's JK-fit basis
    pt.kernel(with_t2=False)
    return pt


@pytest.fixture(autouse=True)
def _restore_dfmp2_logger():
    """In-process CLI runs configure the 'dfmp2' logger; put it back for the next test."""
    import logging

    logger = logging.getLogger("dfmp2")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture(autouse=True)
def _auto_device_as_on_a_gpu(monkeypatch):
    """``DFMP2_TEST_AUTO_DEVICE=cpu python3 -m pytest``: every in-process run that leaves
    ``device`` at 'auto' takes the device path with the CPU as the device, as it takes a real
    GPU on a machine with one; 'cpu' stays on the host. A run of the suite this way shows the
    tests that assume the host without saying so (on an H200, four did). Unset: nothing."""
    import os

    if os.environ.get("DFMP2_TEST_AUTO_DEVICE") != "cpu":
        return
    import torch

    from dfmp2 import api
    from dfmp2.device import ComputeDevice, resolve_device

    def resolve(requested, backend, distributed=False, memory_mb=None, warn=False):
        if requested != "auto" or distributed or backend == "nki":
            return resolve_device(requested, backend, distributed, memory_mb, warn)
        budget = (memory_mb or 4000) * 2**20
        return ComputeDevice(requested, torch.device("cpu"),
                             "auto: the CPU as a device (DFMP2_TEST_AUTO_DEVICE)", "cpu", budget)

    monkeypatch.setattr(api, "resolve_device", resolve)
