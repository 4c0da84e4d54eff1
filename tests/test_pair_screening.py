"""The DF-SCF's tensor on the AO pairs that are not zero (dfmp2.df.PairColumns,
dfmp2.scf_integrals.screened_cderi): the same fitted numbers as PySCF's packed tensor on the
kept pairs, exact zeros on the others, and the same J, K and SCF energies on every route that
reads it."""

from __future__ import annotations

import numpy as np
import pytest
from pyscf import gto, lib, scf

from dfmp2 import jk as jkmod
from dfmp2.df import PairColumns, PairUnpacker, iter_int3c2e
from dfmp2.integrals import make_auxmol
from dfmp2.jk import DFJK, get_jk
from dfmp2.linalg import Dispatcher, DispatchPolicy
from dfmp2.scf_integrals import (
    JK_AUX_BLOCK,
    fitted_cderi,
    screened_cderi,
    split_cderi,
    unpack_in_place,
)

from tolerances import TOL_FP32_REL, TOL_MATRIX_ABS, TOL_OUTCORE

#: Two water molecules 6 Angstrom apart: 238 of their 1176 AO pairs (cc-pVDZ) are zero for
#: every auxiliary function (libcint's primitive screening).
DIMER = ("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59; "
         "O 6 0 0; H 6 0.76 0.59; H 6 -0.76 0.59")
CO = "C 0 0 0; O 0 0 1.13"
WATER_METHYL = ("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59; "
                "C 6 0 0; H 6 1.08 0; H 6 -0.54 0.935; H 6 -0.54 -0.935")
JKFIT = "cc-pvdz-jkfit"


def _la():
    return Dispatcher(DispatchPolicy("pytorch"))


def _unpacked(mol, auxmol) -> tuple[np.ndarray, PairColumns]:
    """The fitted tensor unpacked only, (naux, nao, nao), and its pairs: :func:`split_cderi`
    with every row unpacked (what :class:`DFJK` holds where that fits)."""
    head, tail, pairs = split_cderi(mol, auxmol, _la(), lambda pairs, naux: naux)
    assert tail.shape == (0, pairs.ncol)
    return head, pairs


def _random_pairs(nao: int, keep: float, seed: int) -> PairColumns:
    npair = nao * (nao + 1) // 2
    rng = np.random.default_rng(seed)
    return PairColumns(nao, np.flatnonzero(rng.random(npair) < keep))


@pytest.mark.parametrize("nao, keep", [(1, 1.0), (2, 0.5), (7, 0.0), (7, 0.6), (24, 0.75),
                                       (24, 1.0)])
def test_pair_columns_compress_expand_and_unpack_like_pyscf(nao, keep):
    """Packed rows zero at the pairs not kept: compressed they hold the kept pairs and a zero
    last column; expanded they are the packed rows again; unpacked (threads over rows) they
    are PySCF's unpacking. A nonzero at a pair not kept is reported, never compressed away."""
    pairs = _random_pairs(nao, keep, nao)
    npair, naux = nao * (nao + 1) // 2, 19
    packed = np.random.default_rng(1).standard_normal((naux, npair))
    packed[:, pairs.column == pairs.kept.size] = 0.0
    assert pairs.ncol == pairs.kept.size + 1 and pairs.screened == npair - pairs.kept.size
    assert not pairs.misses(packed)
    columns = pairs.compress(packed, np.full((naux, pairs.ncol), np.nan))
    assert np.array_equal(columns[:, :-1], packed[:, pairs.kept])
    assert np.array_equal(columns[:, -1], np.zeros(naux))
    assert np.array_equal(pairs.expand(columns), packed)
    for threads in (1, 3):
        with PairUnpacker(threads) as unpack:
            square = unpack(columns, np.full((naux, nao, nao), np.nan), pairs)
        assert np.array_equal(square, lib.unpack_tril(packed))
    vectors = np.random.default_rng(2).standard_normal((2, npair))
    assert np.array_equal(pairs.of_pairs(vectors)[:, :-1], vectors[:, pairs.kept])
    assert np.array_equal(pairs.of_pairs(vectors)[:, -1], [0.0, 0.0])
    assert np.array_equal(PairColumns.nonzero_in(nao, packed).kept, pairs.kept)
    if pairs.screened:
        extra = np.flatnonzero(pairs.column == pairs.kept.size)[-1]
        packed[3, extra] = 1e-300
        assert pairs.misses(packed)
        assert np.array_equal(PairColumns.nonzero_in(nao, packed).kept,
                              np.union1d(pairs.kept, [extra]))


def test_pair_columns_refuse_what_is_not_a_set_of_pairs():
    for kept in ([2, 1], [0, 0], [-1], [3], [[0]]):
        with pytest.raises(ValueError, match="increasing packed pair indices"):
            PairColumns(2, np.array(kept))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("nao, naux", [(2, 1), (5, 17), (24, 40)])
def test_unpacking_screened_rows_in_place_equals_pyscfs_unpacking(nao, naux, threads):
    pairs = _random_pairs(nao, 0.7, naux)
    npair = nao * (nao + 1) // 2
    packed = np.random.default_rng(naux).standard_normal((naux, npair))
    packed[:, pairs.column == pairs.kept.size] = 0.0
    flat = np.full(naux * nao * nao, np.nan)
    pairs.compress(packed, flat[: naux * pairs.ncol].reshape(naux, pairs.ncol))
    square = unpack_in_place(flat, naux, nao, threads=threads, pairs=pairs)
    assert np.shares_memory(square, flat)
    assert np.array_equal(square, lib.unpack_tril(packed))
    with pytest.raises(ValueError, match="do not fit in place"):
        unpack_in_place(np.zeros(4), 2, 1, pairs=PairColumns.every(1))


def test_the_screened_tensor_is_the_packed_one_on_its_kept_pairs():
    """A distant water dimer: libcint leaves some pairs zero for every auxiliary function; the
    screened tensor keeps every other pair, its fitted columns are the packed tensor's and the
    packed tensor is exactly zero elsewhere; unpacked in place it is the packed one unpacked."""
    mol = gto.M(atom=DIMER, basis="cc-pvdz", verbose=0)
    auxmol = make_auxmol(mol, JKFIT)
    packed = fitted_cderi(mol, auxmol, _la())
    columns, pairs = screened_cderi(mol, auxmol, _la())
    assert 0 < pairs.screened < pairs.npair // 2  # the test needs pairs to screen
    assert np.array_equal(pairs.kept, np.flatnonzero(np.any(packed != 0, axis=0)))
    assert np.abs(columns[:, :-1] - packed[:, pairs.kept]).max() < TOL_MATRIX_ABS
    assert not np.any(columns[:, -1])
    square, square_pairs = _unpacked(mol, auxmol)
    assert np.array_equal(square_pairs.kept, pairs.kept)
    assert np.abs(square - lib.unpack_tril(packed)).max() < TOL_MATRIX_ABS
    naux = columns.shape[0]
    for rows in (0, 1, HEAD_ROWS, naux - 1, naux):  # split: the first rows unpacked, in place
        head, tail, split_pairs = split_cderi(mol, auxmol, _la(), lambda p, n: rows)
        assert np.array_equal(split_pairs.kept, pairs.kept)
        assert head.shape == (rows, mol.nao_nr(), mol.nao_nr())
        assert tail.shape == (naux - rows, pairs.ncol)
        assert np.abs(head - square[:rows]).max(initial=0.0) < TOL_MATRIX_ABS
        assert np.abs(tail - columns[rows:]).max(initial=0.0) < TOL_MATRIX_ABS
        assert not np.any(tail[:, -1])


def test_pairs_zero_by_symmetry_in_the_first_block_are_kept_with_their_shell_pair():
    """CO cc-pVTZ: four pairs vanish by symmetry for the first block of auxiliary functions
    but not for later ones; the kept set takes whole shell pairs, so it holds them and the
    screened tensor is the packed one (the same zero pairs)."""
    mol = gto.M(atom=CO, basis="cc-pvtz", verbose=0)
    auxmol = make_auxmol(mol, "cc-pvtz-jkfit")
    blocks = list(rows.copy() for *_, rows in iter_int3c2e(mol, auxmol, JK_AUX_BLOCK))
    by_pair = PairColumns.nonzero_in(mol.nao_nr(), blocks[0])
    by_shell = PairColumns.nonzero_in(mol.nao_nr(), blocks[0], mol.ao_loc_nr())
    assert any(by_pair.misses(rows) for rows in blocks[1:])  # the case under test
    assert not any(by_shell.misses(rows) for rows in blocks[1:])
    square, pairs = _unpacked(mol, auxmol)
    packed = fitted_cderi(mol, auxmol, _la())
    assert np.array_equal(pairs.kept, by_shell.kept)
    assert np.abs(square - lib.unpack_tril(packed)).max() < TOL_MATRIX_ABS


@pytest.mark.parametrize("square", [False, True], ids=["screened", "unpacked"])
def test_a_later_block_nonzero_where_the_first_was_zero_keeps_every_pair(monkeypatch, caplog,
                                                                         square):
    """When a later block is nonzero at a pair the first block's set left out (here the set is
    made to leave one out), the integrals are computed again with every pair kept: the
    tensor is the packed one."""
    mol = gto.M(atom=DIMER, basis="cc-pvdz", verbose=0)
    auxmol = make_auxmol(mol, JKFIT)
    real = PairColumns.nonzero_in

    def one_short(nao, rows, ao_loc=None):
        kept = real(nao, rows, ao_loc).kept
        return PairColumns(nao, kept[:-1])

    monkeypatch.setattr(PairColumns, "nonzero_in", staticmethod(one_short))
    with caplog.at_level("INFO", logger="dfmp2.scf_integrals"):
        tensor, pairs = _unpacked(mol, auxmol) if square else screened_cderi(mol, auxmol,
                                                                               _la())
    assert "every AO pair kept" in caplog.text and pairs.screened == 0
    packed = fitted_cderi(mol, auxmol, _la())
    expected = lib.unpack_tril(packed) if square else packed
    assert np.abs((tensor if square else tensor[:, :-1]) - expected).max() < TOL_MATRIX_ABS
    if not square:
        assert not np.any(tensor[:, -1])


def test_one_basis_function_and_mismatched_widths():
    """An H atom in STO-3G (one basis function: a square row is narrower than a screened one)
    is unpacked apart from its screened rows; rows of the wrong width are refused before
    PySCF's gather, which checks no index."""
    mol = gto.M(atom="H", basis="sto-3g", spin=1, verbose=0)
    auxmol = make_auxmol(mol, "def2-universal-jkfit")
    square, pairs = _unpacked(mol, auxmol)
    assert np.abs(square - lib.unpack_tril(fitted_cderi(mol, auxmol, _la()))).max() \
        < TOL_MATRIX_ABS
    wide = _random_pairs(5, 0.5, 0)
    rows = np.zeros((3, 15))  # packed width, not the screened one
    with PairUnpacker(1) as unpack, pytest.raises(ValueError, match="not \\(n, "):
        unpack(rows, np.zeros((3, 5, 5)), wide)
    with pytest.raises(ValueError, match="pair columns of 5 functions"):
        get_jk(rows, np.eye(5), _la(), pairs=wide)
    with pytest.raises(ValueError, match="take_columns: columns up to 15"):
        from dfmp2.df import take_columns
        take_columns(rows, np.array([0, 15], dtype=np.int32), np.zeros((3, 2)))


#: Auxiliary functions a split tensor holds unpacked in these tests: of the dimer's 232, more
#: than one of K's blocks of the unpacked rows (64) and not a whole number of them, nor of the
#: unpacking's blocks (16).
HEAD_ROWS = 100


def _screened_jk(monkeypatch, mol, copy: bool, head_rows: int = 0, **kwargs) -> DFJK:
    """A DFJK on the pair-screened tensor in memory, its build told to unpack its first
    ``head_rows`` rows (none: with or without K's square copy)."""
    monkeypatch.setattr(jkmod, "jk_square_fits", lambda *a, **k: copy)
    monkeypatch.setattr(jkmod, "jk_square_rows", lambda *a, **k: head_rows)
    ours = DFJK(mol, JKFIT, _la(), **kwargs).build()
    assert ours.columns is not None and ours._cderi is None and ours.tensor is ours.columns
    assert (ours.square is not None) is copy and not ours.square_only
    if head_rows:
        assert ours.head.shape == (head_rows, mol.nao_nr(), mol.nao_nr())
        assert ours.columns.shape[0] == ours.get_naoaux() - head_rows
    else:
        assert ours.head is None
    return ours


def test_one_basis_function_where_the_unpacked_only_layout_is_refused(monkeypatch):
    """An H atom in STO-3G on the split build, no row unpacked (a screened row, its pair and
    the zero column, is wider than a 1x1 square one, so none may be): the rows stay as they
    are (the in-place unpacking of no rows refused their width: a ValueError), and J and K
    are PySCF's."""
    mol = gto.M(atom="H", basis="sto-3g", spin=1, verbose=0)
    auxmol = make_auxmol(mol, JKFIT)
    columns, pairs = screened_cderi(mol, auxmol, _la())
    head, tail, split_pairs = split_cderi(mol, auxmol, _la(), lambda p, n: 0)
    assert head.shape == (0, 1, 1) and np.array_equal(split_pairs.kept, pairs.kept)
    assert np.array_equal(tail, columns)
    ours = _screened_jk(monkeypatch, mol, copy=False)
    ref = scf.UHF(mol).density_fit(auxbasis=JKFIT).run()
    dm = ref.make_rdm1()
    for got, want in zip(ours.get_jk(dm), ref.with_df.get_jk(dm)):
        assert np.abs(got - want).max() < TOL_MATRIX_ABS


@pytest.mark.parametrize("copy, head_rows", [(False, 0), (True, 0), (False, HEAD_ROWS)],
                         ids=["unpacking", "square-copy", "split"])
def test_screened_j_and_k_equal_pyscfs_for_every_kind_of_density(monkeypatch, copy,
                                                                  head_rows):
    """Tagged UHF and ROHF densities, untagged indefinite ones, a non-symmetric one (PySCF's
    general code for K, J from the screened tensor: PySCF's would recompute the integrals),
    PySCF's tools (loop, get_naoaux), float32 K: all against PySCF's DF object; also with the
    first rows unpacked (their J and K from those, the others' from the screened rows)."""
    from pyscf.df import df_jk

    mol = gto.M(atom=DIMER, basis="cc-pvdz", charge=1, spin=1, verbose=0)
    ref = scf.UHF(mol).density_fit(auxbasis=JKFIT).run(conv_tol=1e-8)
    ours = _screened_jk(monkeypatch, mol, copy, head_rows)
    assert ours.pairs.screened and "AO pairs (the others are zero)" in ours.describe()
    assert ours.get_naoaux() == ref.with_df.get_naoaux()
    rows = np.concatenate(list(ours.loop(blksize=50)))
    assert np.abs(rows - np.concatenate(list(ref.with_df.loop()))).max() < TOL_MATRIX_ABS
    rng = np.random.default_rng(4)
    x = rng.standard_normal((mol.nao_nr(), mol.nao_nr()))
    for dm in (ref.make_rdm1(), np.stack([x + x.T, 0.1 * (x @ x.T)])):
        vj_ref, vk_ref = ref.with_df.get_jk(dm, hermi=1)
        for with_j, with_k in ((True, True), (True, False), (False, True)):
            vj, vk = ours.get_jk(dm, hermi=1, with_j=with_j, with_k=with_k)
            assert (vj is None) is not with_j and (vk is None) is not with_k
            if with_j:
                assert np.abs(vj - vj_ref).max() < TOL_MATRIX_ABS
            if with_k:
                assert np.abs(vk - vk_ref).max() < TOL_MATRIX_ABS
    monkeypatch.setattr(df_jk, "get_j", lambda *a, **k: pytest.fail("integrals recomputed"))
    vj_ref, vk_ref = ref.with_df.get_jk(x, hermi=0)
    for ours_jk, ref_jk in zip(ours.get_jk(x, hermi=0), (vj_ref, vk_ref)):
        assert np.abs(ours_jk - ref_jk).max() < TOL_MATRIX_ABS
    assert np.abs(ours.get_jk(x, hermi=0, with_k=False)[0] - vj_ref).max() < TOL_MATRIX_ABS
    dm = ref.make_rdm1()
    vj_ref, vk_ref = ref.with_df.get_jk(dm, hermi=1)
    vj32, vk32 = get_jk(ours.columns, dm, _la(), k_precision="fp32", pairs=ours.pairs,
                        head=ours.head)
    assert 0 < np.abs(vk32 - vk_ref).max() / np.abs(vk_ref).max() < TOL_FP32_REL
    # J of unpacked rows is float32 in a float32 build (J_FP32 of the fused product), of the
    # others float64
    assert np.abs(vj32 - vj_ref).max() / np.abs(vj_ref).max() < TOL_FP32_REL
    assert bool(np.abs(vj32 - vj_ref).max() < TOL_MATRIX_ABS) is (head_rows == 0)
    with pytest.raises(ValueError, match="pair columns of"):
        get_jk(ours.columns, dm[:, :-1, :-1], _la(), pairs=ours.pairs)


@pytest.mark.parametrize("kind", ["rhf", "uhf"])
def test_an_scf_on_the_screened_tensor_equals_pyscfs_df_scf(monkeypatch, kind):
    """The energy of PySCF's DF-SCF to 1e-10 Eh, in PySCF's cycles or one more or fewer
    (summation order at the convergence threshold). The open shell is water beside a methyl
    radical: the dimer's cation, whose hole can sit on either water, took 17 cycles in PySCF
    with two threads and 28 with one, the path decided by rounding."""
    atom = DIMER if kind == "rhf" else WATER_METHYL
    mol = gto.M(atom=atom, basis="cc-pvdz", spin=kind == "uhf", verbose=0)
    runs = {}
    for layout in ("pyscf", "packed", "screened", "split"):
        mf = (scf.RHF if kind == "rhf" else scf.UHF)(mol).density_fit(auxbasis=JKFIT)
        mf.conv_tol, mf.conv_tol_grad = 1e-11, 1e-7
        if layout == "packed":
            mf.with_df = DFJK(mol, JKFIT, _la(), layout="packed")
        elif layout != "pyscf":
            mf.with_df = _screened_jk(monkeypatch, mol, copy=False,
                                      head_rows=HEAD_ROWS if layout == "split" else 0)
        mf.kernel()
        assert mf.converged
        runs[layout] = mf
    for layout in ("packed", "screened", "split"):
        assert runs[layout].e_tot == pytest.approx(runs["pyscf"].e_tot, abs=TOL_OUTCORE)
        # the cycle count is reported, not fixed: rounding at the threshold may move it by one
        assert abs(runs[layout].cycles - runs["pyscf"].cycles) <= 1


@pytest.mark.parametrize("copy, head_rows", [(False, 0), (True, 0), (False, HEAD_ROWS)],
                         ids=["screened", "square-copy", "split"])
def test_the_orbital_check_and_copies_of_a_screened_tensor(monkeypatch, copy, head_rows):
    """DFMP2(mf)'s orbital check on a DFJK holding the screened tensor (or its first rows
    unpacked and the others screened): the Fock of PySCF's own DF object, from the float64
    square copy with dfmp2's ops, or through the object's own J/K; a copy of the DFJK shares
    no tensor, and reset releases them all."""
    from dfmp2.api import fock_matrix

    mol = gto.M(atom=DIMER, basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=JKFIT)
    mf.with_df = _screened_jk(monkeypatch, mol, copy, head_rows)
    mf.run(conv_tol=1e-9)
    la = _la()
    theirs = scf.RHF(mol).density_fit(auxbasis=JKFIT).get_fock(dm=mf.make_rdm1())
    assert np.abs(fock_matrix(mf, la) - theirs).max() < TOL_MATRIX_ABS
    assert ("gemm" in la.records) is copy  # else the object's own get_fock, on its own ops
    other = mf.with_df.copy()
    assert other.columns is None and other.pairs is None and other.square is None
    assert other.head is None
    mf.with_df.reset()
    assert mf.with_df.columns is None and mf.with_df.pairs is None and mf.with_df.head is None
    assert mf.with_df.square is None and mf.with_df.tensor is None
