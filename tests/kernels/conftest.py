"""Fixtures of the NKI kernel tests: the execution mode (three tiers, each with its own mark,
see ``_support.MODES``) and the emulator's instruction trace."""

from __future__ import annotations

import contextlib

import pytest

from dfmp2.linalg.nki_ops import probe

from ._support import MODES


def _mode_or_skip(mode: str) -> str:
    got, reason = probe(simulator=mode == "simulator", emulator=mode == "emulator")
    if got != mode:
        pytest.skip(f"NKI {mode} mode is unavailable here: {reason or f'probe chose {got}'}")
    return mode


@contextlib.contextmanager
def _emulator_scope():
    """Install dfmp2's emulator for one test and restore sys.modules afterwards."""
    from dfmp2 import nki_emulator

    with nki_emulator.installed():
        yield


@pytest.fixture(params=MODES)
def nki_mode(request):
    """An NKI execution mode that can run here (others are skipped with the reason)."""
    mode = _mode_or_skip(request.param)
    if mode != "emulator":
        yield mode
        return
    with _emulator_scope():
        yield mode


@pytest.fixture
def emulator_trace():
    """For structure tests (emulator only): yields a factory of instruction traces."""
    _mode_or_skip("emulator")
    from dfmp2 import nki_emulator

    with _emulator_scope():
        yield nki_emulator.trace
