"""Fused NKI pair-energy kernel against the float64 reference, and its structure: (ia|jb)
stays on chip, the exchange partner comes from TensorE transposes, not a second GEMM."""

from __future__ import annotations

import pytest
import torch

from dfmp2.errors import InputError
from dfmp2.linalg import nki_ops, torch_ops

from ._support import ENERGY_RTOL, ceil_div, pair_block

#: (ni, nj, nv, naux, diagonal_block): nocc = 1; ragged nv and naux with several K tiles;
#: a diagonal block of 5 orbitals; nv > 512 (two moving chunks per row tile).
CASES = [
    (1, 1, 130, 200, True),
    (3, 2, 200, 300, False),
    (5, 5, 150, 250, True),
    (2, 1, 600, 140, False),
]


def _energy(mode, ni, nj, nv, naux, diagonal_block, seed=0):
    args = pair_block(ni, nj, nv, naux, diagonal_block, seed)
    got = nki_ops.mp2_pair_energy(*args, diagonal_block, mode=mode)
    want = torch_ops.mp2_pair_energy(*args, diagonal_block)
    return got, want


def _assert_energy_close(got, want):
    assert got.dtype == torch.float64 and got.shape == (2,)
    scale = abs(float(want[0]))
    err = float((got - want).abs().max())
    assert err <= ENERGY_RTOL * scale, f"error {err:.3e} > {ENERGY_RTOL:g} * |e_os| {scale:.3e}"


@pytest.mark.parametrize("ni,nj,nv,naux,diagonal_block", CASES)
def test_pair_energy_matches_float64(nki_mode, ni, nj, nv, naux, diagonal_block):
    got, want = _energy(nki_mode, ni, nj, nv, naux, diagonal_block)
    _assert_energy_close(got, want)


def test_pair_energy_over_several_launches(nki_mode, monkeypatch):
    """Pairs split over launches (2x2 orbital chunks), chunks below the diagonal skipped."""
    monkeypatch.setattr(nki_ops, "MAX_PAIRS_PER_CALL", 4)
    got, want = _energy(nki_mode, 5, 5, 140, 130, True, seed=7)
    _assert_energy_close(got, want)


@pytest.mark.parametrize("ni,nj,nv,naux,diagonal_block", CASES)
@pytest.mark.nki_emulated
def test_pair_energy_structure(emulator_trace, ni, nj, nv, naux, diagonal_block):
    args = pair_block(ni, nj, nv, naux, diagonal_block, 0)
    with emulator_trace() as tr:
        nki_ops.mp2_pair_energy(*args, diagonal_block, mode="emulator")
    pairs = ni * nj
    n_at, n_bc, n_kt = ceil_div(nv, 128), ceil_div(nv, 512), ceil_div(naux, 128)
    assert tr.kernels == ["mp2_pair_energy_kernel"]
    # one GEMM per pair: (a tiles) x (512-column chunks) x (aux tiles), nothing more
    assert tr.count("nc_matmul") == pairs * n_at * n_bc * n_kt
    # the exchange term T_ba comes from TensorE transposes of T tiles
    transposes = tr.find("nc_transpose")
    assert len(transposes) == pairs * n_at * n_at
    assert all(r.engine == "tensor" and r.operands["dst"].buffer == "psum" for r in transposes)
    # the only store to HBM is the small block of partial sums: no (ia|jb) tile leaves the chip
    stores = tr.dma_stores()
    assert len(stores) == 1
    assert stores[0].operands["dst"].shape == (128, 2 * pairs * n_at)
    assert tr.bytes_moved() - sum(r.nbytes for r in tr.dma_loads()) == 128 * 2 * pairs * n_at * 4
    # VectorE reciprocal of the denominators (no ScalarE approximation)
    assert tr.count("reciprocal") == pairs * n_at and tr.count("activation") == 0


@pytest.mark.nki_emulated
def test_pair_energy_launch_count(emulator_trace, monkeypatch):
    monkeypatch.setattr(nki_ops, "MAX_PAIRS_PER_CALL", 4)
    args = pair_block(5, 5, 140, 130, True, 7)
    with emulator_trace() as tr:
        nki_ops.mp2_pair_energy(*args, True, mode="emulator")
    # chunks {0,1}, {2,3}, {4}: 3 diagonal chunk pairs + 3 above the diagonal, 3 skipped
    assert tr.kernels == ["mp2_pair_energy_kernel"] * 6
    assert tr.count("nc_matmul") == (4 + 4 + 1 + 4 + 2 + 2) * 2 * 1 * 2


@pytest.mark.nki_emulated
def test_pair_energy_rejects_inconsistent_shapes():
    ovL_i, ovL_j, eps_i, eps_j, eps_v = pair_block(2, 3, 10, 7, False, 0)
    with pytest.raises(InputError, match=r"eps_v must have shape \(10,\)"):
        nki_ops.mp2_pair_energy(ovL_i, ovL_j, eps_i, eps_j, eps_v[:9], False, mode="emulator")
    with pytest.raises(InputError, match="ni == nj"):
        nki_ops.mp2_pair_energy(ovL_i, ovL_j, eps_i, eps_j, eps_v, True, mode="emulator")


@pytest.mark.nki_emulated
def test_pair_energy_supports_names_the_sbuf_limit():
    check = nki_ops.SUPPORTS["mp2_pair_energy"]
    typical = torch.zeros(1).expand(4, 448, 1536)
    assert check(typical, typical, None, None, None, True) is None
    huge = torch.zeros(1).expand(4, 2000, 8000)
    assert "SBUF" in check(huge, huge, None, None, None, True)


@pytest.mark.nki_emulated
def test_pair_chunks_fill_the_launch_budget():
    assert nki_ops._pair_chunks(64, 1, 64, False) == (64, 1)
    assert nki_ops._pair_chunks(5, 7, 16, False) == (4, 4)
    assert nki_ops._pair_chunks(10, 10, 64, True) == (8, 8)
    assert nki_ops._pair_chunks(1, 1, 64, True) == (1, 1)
