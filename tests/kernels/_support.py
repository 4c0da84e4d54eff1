"""Shared pieces of the NKI kernel tests: the execution-mode fixture, tolerances, data.

The fixtures ``nki_mode`` and ``emulator_trace`` live in ``conftest.py`` beside this file.
The same test functions run in three modes. The ``emulator`` parameter carries the
``nki_emulated`` mark (dfmp2's NumPy emulator, no ``nki`` needed); ``simulator`` carries
``nki_simulator`` (the real ``nki.simulate``) and ``hardware`` carries ``neuron`` (a Trainium
device). A mode that cannot run here is skipped with the reason from
:func:`dfmp2.linalg.nki_ops.probe`. Select one tier with ``-m nki_emulated``,
``-m nki_simulator`` or ``-m neuron``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tolerances import TOL_NKI_ENERGY_REL, TOL_NKI_FP32_REL

#: The kernel tests' names for two tolerances of ``tests/tolerances.py`` (see there).
FP32_RTOL = TOL_NKI_FP32_REL
ENERGY_RTOL = TOL_NKI_ENERGY_REL

MODES = [
    pytest.param("emulator", marks=pytest.mark.nki_emulated, id="emulator"),
    pytest.param("simulator", marks=pytest.mark.nki_simulator, id="simulator"),
    pytest.param("hardware", marks=pytest.mark.neuron, id="hardware"),
]


def rand(shape, seed, scale=1.0) -> torch.Tensor:
    """Reproducible float64 normal tensor."""
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape) * scale)


def spd(n: int, seed: int) -> torch.Tensor:
    """A well-conditioned symmetric positive definite (n, n) float64 matrix (cond ~ 10)."""
    r = rand((n, n + 8), seed)
    return r @ r.T / (n + 8) + 0.5 * torch.eye(n, dtype=torch.float64)


def pair_block(ni, nj, nva, nvb, naux, diagonal_block, seed, same_space=False):
    """Synthetic operands ``(ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb)`` of ``mp2_pair_sums``:
    B ~ N(0, 0.05^2), occupied energies in [-1.5, -0.3], virtual energies in [0.1, 3.0] (all
    denominators negative, as for a real reference). A diagonal block (nva == nvb) passes the
    same tensors for i and j; otherwise every operand is drawn independently (also eps_vb, so a
    swapped a/b orientation of D shows), except that ``same_space`` blocks (two orbital blocks of
    one spin space, the only ones with an exchange sum) share the virtual energies."""
    rng = np.random.default_rng(seed)
    ovL_i = torch.from_numpy(rng.standard_normal((ni, nva, naux)) * 0.05)
    eps_i = torch.from_numpy(rng.uniform(-1.5, -0.3, ni))
    eps_va = torch.from_numpy(rng.uniform(0.1, 3.0, nva))
    if diagonal_block:
        assert (ni, nva) == (nj, nvb), "a diagonal block pairs one orbital space with itself"
        return ovL_i, ovL_i, eps_i, eps_i, eps_va, eps_va
    ovL_j = torch.from_numpy(rng.standard_normal((nj, nvb, naux)) * 0.05)
    eps_j = torch.from_numpy(rng.uniform(-1.5, -0.3, nj))
    eps_vb = torch.from_numpy(rng.uniform(0.1, 3.0, nvb))
    if same_space:
        eps_vb = eps_va
    return ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def one_core():
    """An emulator device of one program per launch (one physical core's instruction stream),
    for tests that count a launch's instructions against the single-program plan."""
    from dfmp2.linalg import nki_runtime

    return nki_runtime.NkiDevice("emulator", lnc=1)


def launch_instructions(ni, nj, nv_rest, nvb, naux, n_wt, exchange, split=False, lnc=2):
    """Instructions executed by one fused-energy launch over ni rows x nj columns on a device
    of ``lnc`` programs per launch (``kernel[lnc]`` when every program gets a row), all
    programs."""
    from dfmp2.linalg import nki_ops

    grid = lnc if ni >= lnc else 1
    return sum(nki_ops._energy_instructions(ni, nj, nv_rest, nvb, naux, n_wt, exchange, split,
                                            grid, p) for p in range(grid))
