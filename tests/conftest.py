"""Shared fixtures (the named tolerances live in ``tolerances.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

INPUTS = Path(__file__).resolve().parent.parent / "inputs"


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
