"""The blocked pair-energy sum against naive 4-index oracles."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfmp2.energy import (
    reference_dfmp2,
    reference_pair_energies,
    reference_spin_energies,
    scs_energy,
)
from dfmp2.integrals import make_auxmol
from dfmp2.linalg import Dispatcher, DispatchPolicy
from dfmp2.pipeline import TensorB, pair_energies
from dfmp2.reference import frozen_mask, orbital_space

from tolerances import TOL_INT3C_SCREEN, TOL_MATRIX_REL, TOL_OUTCORE, TOL_PRINTED


def _random_problem(nocc, nvir, naux, seed):
    rng = np.random.default_rng(seed)
    ovL = rng.standard_normal((nocc, nvir, naux)) * 0.1
    eps_occ = np.sort(rng.uniform(-2.0, -0.3, nocc))
    eps_vir = np.sort(rng.uniform(0.1, 3.0, nvir))
    return ovL, eps_occ, eps_vir


@pytest.mark.parametrize("nocc, nvir, naux, occ_block", [
    (1, 3, 5, 1), (5, 7, 11, 2), (6, 4, 9, 6), (7, 5, 13, 3), (9, 6, 10, 4),
])
@pytest.mark.parametrize("fused", [True, False])
def test_blocked_energy_matches_naive_oracle(nocc, nvir, naux, occ_block, fused):
    ovL, eps_occ, eps_vir = _random_problem(nocc, nvir, naux, seed=nocc * 100 + naux)
    ref_os, ref_ss = reference_pair_energies(ovL, eps_occ, eps_vir)
    la = Dispatcher(DispatchPolicy("pytorch"))
    got = pair_energies([TensorB(torch.from_numpy(ovL))],
                        [(torch.from_numpy(eps_occ), torch.from_numpy(eps_vir))], la, occ_block,
                        fused=fused)
    assert got.e_os == pytest.approx(ref_os, rel=TOL_MATRIX_REL, abs=TOL_PRINTED)
    assert got.e_ss == pytest.approx(ref_ss, rel=TOL_MATRIX_REL, abs=TOL_PRINTED)
    assert got.npairs == nocc * (nocc + 1) // 2
    op = "mp2_pair_sums" if fused else "pair_sums_from_ovov"
    nblk = -(-nocc // occ_block)
    assert la.records[op].calls == nblk * (nblk + 1) // 2


@pytest.mark.parametrize("nocc_a, nocc_b, nvir_a, occ_block", [
    (3, 2, 5, 1), (5, 3, 6, 2), (4, 4, 4, 4), (6, 1, 5, 3), (2, 0, 4, 2),
])
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("cpu_blas", ["torch", "numpy"])
def test_open_shell_blocked_energy_matches_naive_oracle(nocc_a, nocc_b, nvir_a, occ_block,
                                                        fused, cpu_blas):
    """alpha-alpha and beta-beta over I <= J, alpha-beta over all blocks (rectangular, the beta
    space has nocc_a - nocc_b more virtuals), against whole 4-index sums; an empty beta space
    adds nothing."""
    naux = 9
    nvir_b = nvir_a + nocc_a - nocc_b
    ovL_a, eps_oa, eps_va = _random_problem(nocc_a, nvir_a, naux, seed=nocc_a * 10 + nocc_b)
    ovL_b, eps_ob, eps_vb = _random_problem(nocc_b, nvir_b, naux, seed=nocc_b * 10 + nocc_a + 1)
    ref_os, ref_ss = reference_spin_energies(ovL_a, ovL_b, eps_oa, eps_va, eps_ob, eps_vb)
    la = Dispatcher(DispatchPolicy("pytorch", cpu_blas=cpu_blas))
    stores = [TensorB(torch.from_numpy(ovL_a)), TensorB(torch.from_numpy(ovL_b)) if nocc_b else None]
    eps = [tuple(torch.from_numpy(e) for e in pair) for pair in ((eps_oa, eps_va), (eps_ob, eps_vb))]
    got = pair_energies(stores, eps, la, occ_block, fused=fused)
    assert got.e_os == pytest.approx(ref_os, rel=TOL_MATRIX_REL, abs=TOL_PRINTED)
    assert got.e_ss == pytest.approx(ref_ss, rel=TOL_MATRIX_REL, abs=TOL_PRINTED)
    if nocc_b == 0:
        assert got.e_os == 0.0


def test_same_spin_vanishes_for_one_orbital_pair():
    """With one occupied and one virtual orbital (ia|ia) - (ia|ia) = 0: no same-spin energy."""
    ovL, eps_occ, eps_vir = _random_problem(1, 1, 4, seed=3)
    e_os, e_ss = reference_pair_energies(ovL, eps_occ, eps_vir)
    assert e_ss == 0.0 and e_os < 0.0


def test_scs_scales():
    assert scs_energy(-1.0, -3.0) == pytest.approx(-1.2 - 1.0)
    assert scs_energy(-1.0, -3.0, 1.3, 0.0) == pytest.approx(-1.3)
    assert scs_energy(-1.0, -3.0, e_singles=-0.5) == pytest.approx(-1.2 - 1.0 - 0.5)


def test_pipeline_matches_textbook_oracle():
    """The whole pipeline vs whole-tensor int3c2e with J^-1/2 (no blocking, no Cholesky)."""
    from pyscf import scf

    import dfmp2
    from dfmp2.molecule import build_mole

    mol = build_mole("N 0 0 0; H 0 0.94 0.3; H 0.81 -0.47 0.3; H -0.81 -0.47 0.3", "cc-pvdz")
    mf = scf.RHF(mol).run(conv_tol=1e-10, verbose=0)
    pt = dfmp2.DFMP2(mf, frozen=1).run()
    aux = make_auxmol(mol)
    space = orbital_space(mf.mo_coeff, mf.mo_energy, mf.mo_occ, frozen_mask(mol, mf.mo_occ, 1))
    e_os, e_ss = reference_dfmp2(mol, aux, space.occ_coeff, space.vir_coeff, space.eps_occ,
                                 space.eps_vir)
    assert pt.e_corr_os == pytest.approx(e_os, abs=TOL_OUTCORE)
    assert pt.e_corr_ss == pytest.approx(e_ss, abs=TOL_OUTCORE)


@pytest.mark.parametrize("max_functions", [1, 7, 1000])
def test_packed_int3c2e_blocks_unpack_to_the_full_tensor(max_functions):
    """Every auxiliary block, unpacked, equals the slice of PySCF's whole (mu nu|P) tensor."""
    from pyscf import df

    from dfmp2.df import iter_int3c2e, unpack_pairs
    from dfmp2.molecule import build_mole

    mol = build_mole("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59", "cc-pvdz")
    aux = make_auxmol(mol)
    full = df.incore.aux_e2(mol, aux, "int3c2e", aosym="s1")  # (nao, nao, naux)
    nao, naux = mol.nao_nr(), aux.nao_nr()
    seen = 0
    for p0, p1, packed in iter_int3c2e(mol, aux, max_functions):
        assert p0 == seen and packed.shape == (p1 - p0, nao * (nao + 1) // 2)
        square = unpack_pairs(packed, out=np.empty((p1 - p0, nao, nao)))
        np.testing.assert_allclose(square, full[:, :, p0:p1].transpose(2, 0, 1), atol=TOL_MATRIX_REL)
        seen = p1
    assert seen == naux


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_pair_unpacker_splits_rows_over_threads_and_unpacks_exactly(threads):
    """Every row count, more threads than rows included, gives PySCF's unpacking bit for bit
    and leaves the rest of ``out`` alone; a worker thread's error reaches the caller; the pool
    ends with the ``with`` block and a closed unpacker refuses work."""
    from pyscf import lib

    from dfmp2.df import PairUnpacker

    nao = 13
    rng = np.random.default_rng(threads)
    packed = rng.standard_normal((16, nao * (nao + 1) // 2))
    with PairUnpacker(threads) as unpack:
        assert unpack.threads == threads
        for rows in (1, 2, 7, 16):
            out = np.full((16, nao, nao), np.nan)
            square = unpack(packed[:rows], out)
            assert square.shape == (rows, nao, nao) and np.shares_memory(square, out)
            np.testing.assert_array_equal(square, lib.unpack_tril(packed[:rows]))
            assert np.isnan(out[rows:]).all()
        if threads > 1:  # the last rows are a worker's: its output slice is too short
            with pytest.raises(TypeError, match="buffer is too small"):
                unpack(packed[:7], np.empty((5, nao, nao)))
    assert unpack._pool is None
    with pytest.raises(RuntimeError, match="after close"):
        unpack(packed[:2], np.empty((2, nao, nao)))


def test_pair_unpacker_uses_no_more_threads_than_the_run_allows():
    """By default as many threads as PySCF's OpenMP may use (a rank of a distributed run given
    one thread gets one), never more than the CPUs it may run on."""
    import os

    from pyscf import lib

    from dfmp2.df import MAX_UNPACK_THREADS, PairUnpacker

    with lib.with_omp_threads(1), PairUnpacker() as unpack:
        assert unpack.threads == 1
    with PairUnpacker() as unpack:
        assert unpack.threads == min(lib.num_threads(), len(os.sched_getaffinity(0)),
                                     MAX_UNPACK_THREADS)


def _int3c2e_blocks(mol, aux) -> np.ndarray:
    from dfmp2.df import iter_int3c2e

    return np.vstack([packed.copy() for _, _, packed in iter_int3c2e(mol, aux, 1000)])


def test_int3c2e_primitive_screening(monkeypatch):
    """INT3C_EXPCUTOFF screens primitives without changing any integral beyond 1e-14 (a looser
    cutoff visibly does: the setting reaches libcint), leaves the caller's molecule alone, and
    yields to a cutoff the user set on the molecule."""
    from pyscf import gto

    from dfmp2 import df
    from dfmp2.molecule import build_mole

    mol = build_mole("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59; "
                     "O 0 0 4.5; H 0 0.76 5.09; H 0 -0.76 5.09", "cc-pvdz")
    aux = make_auxmol(mol)
    monkeypatch.setattr(df, "INT3C_EXPCUTOFF", 60)  # libcint's default
    reference = _int3c2e_blocks(mol, aux)
    monkeypatch.setattr(df, "INT3C_EXPCUTOFF", 40)
    assert np.abs(_int3c2e_blocks(mol, aux) - reference).max() < TOL_INT3C_SCREEN
    assert mol._env[gto.PTR_EXPCUTOFF] == 0
    monkeypatch.setattr(df, "INT3C_EXPCUTOFF", 8)
    assert np.abs(_int3c2e_blocks(mol, aux) - reference).max() > 1e-12
    mol._env[gto.PTR_EXPCUTOFF] = 60
    np.testing.assert_array_equal(_int3c2e_blocks(mol, aux), reference)


def test_zeros_are_zero_in_one_or_several_threads(monkeypatch):
    from dfmp2 import buffers

    for threshold in (1 << 40, 64):  # one thread; one per CPU
        monkeypatch.setattr(buffers, "_THREAD_BYTES", threshold)
        array = buffers.zeros((37, 5, 3), np.float32)
        assert array.dtype == np.float32 and array.shape == (37, 5, 3)
        assert array.flags.c_contiguous and array.flags.writeable and not array.any()
        array[3, 2, 1] = 7.0
        assert array.sum() == 7.0
    assert buffers.zeros((0, 4)).shape == (0, 4)
