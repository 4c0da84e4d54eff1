"""Pair energies (``--pair-energies``) and their picture (``--plot``): every pair against
PySCF's amplitudes and against whole einsums, blocked and out of core, open shells, the record,
the CLI and the counterpoise panel."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from pyscf import scf

import dfmp2
from dfmp2.cli import main
from dfmp2.errors import InputError
from dfmp2.linalg import Dispatcher, DispatchPolicy
from dfmp2.molecule import build_mole
from dfmp2.pipeline import TensorB, pair_energies
from dfmp2.plot import pair_matrix, plot_pair_energies

from conftest import INPUTS, pyscf_dfmp2
from tolerances import TOL_COMPONENT_SUM, TOL_FP64, TOL_MATRIX_REL, TOL_OUTCORE

WATER = str(INPUTS / "water.xyz")
NH2 = "N\nH 1 1.008\nH 1 1.008 2 105.0"


def _einsum_pairs(b_i, b_j, e_i, e_j, e_a, e_b):
    """Per-pair [direct, exchange] by whole einsums (float64)."""
    t = np.einsum("iaP,jbP->ijab", b_i, b_j)
    d = e_i[:, None, None, None] + e_j[None, :, None, None] - e_a[:, None] - e_b[None, :]
    direct = np.einsum("ijab->ij", t * t / d)
    exchange = np.einsum("ijab->ij", t * t.transpose(0, 1, 3, 2) / d) \
        if b_i.shape[1] == b_j.shape[1] else np.zeros_like(direct)
    return direct, exchange


@pytest.mark.parametrize("occ_block", [1, 2, 3, 7])
def test_blocked_pair_matrices_equal_whole_einsums(occ_block):
    """Closed shell and alpha/beta stores over blocks of every size: each matrix entry is its
    pair's energy, mirrored blocks included, and the matrices sum to the energies."""
    rng = np.random.default_rng(7)
    nocc_a, nocc_b, nvir_a, nvir_b, naux = 7, 5, 6, 8, 11
    b_a = rng.standard_normal((nocc_a, nvir_a, naux)) * 0.1
    b_b = rng.standard_normal((nocc_b, nvir_b, naux)) * 0.1
    e_oa, e_ob = -1 - rng.random(nocc_a), -1 - rng.random(nocc_b)
    e_va, e_vb = 1 + rng.random(nvir_a), 1 + rng.random(nvir_b)
    la = Dispatcher(DispatchPolicy("pytorch"))
    t = torch.from_numpy
    closed = pair_energies([TensorB(t(b_a))], [(t(e_oa), t(e_va))], la, occ_block,
                           pair_table=True)
    (matrix,) = closed.pairs
    direct, exchange = _einsum_pairs(b_a, b_a, e_oa, e_oa, e_va, e_va)
    assert matrix.block == "closed"
    np.testing.assert_allclose(matrix.os, direct, atol=TOL_OUTCORE, rtol=0)
    np.testing.assert_allclose(matrix.ss, direct - exchange, atol=TOL_OUTCORE, rtol=0)
    fused = pair_energies([TensorB(t(b_a))], [(t(e_oa), t(e_va))], la, occ_block)
    assert abs(closed.e_os - fused.e_os) <= TOL_OUTCORE
    assert abs(matrix.os.sum() - closed.e_os) <= TOL_COMPONENT_SUM
    assert closed.npairs == fused.npairs
    opened = pair_energies([TensorB(t(b_a)), TensorB(t(b_b))],
                           [(t(e_oa), t(e_va)), (t(e_ob), t(e_vb))], la, occ_block,
                           pair_table=True)
    blocks = {m.block: m for m in opened.pairs}
    assert set(blocks) == {"alpha-alpha", "beta-beta", "alpha-beta"}
    d_ab, _ = _einsum_pairs(b_a, b_b, e_oa, e_ob, e_va, e_vb)
    np.testing.assert_allclose(blocks["alpha-beta"].os, d_ab, atol=TOL_OUTCORE, rtol=0)
    d_bb, x_bb = _einsum_pairs(b_b, b_b, e_ob, e_ob, e_vb, e_vb)
    np.testing.assert_allclose(blocks["beta-beta"].ss, 0.5 * (d_bb - x_bb), atol=TOL_OUTCORE,
                               rtol=0)
    assert blocks["alpha-beta"].spaces == (0, 1) and blocks["beta-beta"].spaces == (1, 1)
    total_ss = sum(m.ss.sum() for m in opened.pairs)
    assert abs(total_ss - opened.e_ss) <= TOL_COMPONENT_SUM
    # what a spin block cannot have (same-spin OS, opposite-spin SS, i = j of one spin) is 0
    assert not blocks["alpha-alpha"].os.any() and not blocks["alpha-beta"].ss.any()
    for m in opened.pairs:  # never -0.0, which a table or a plot would print as "-0"
        for values in (m.os, m.ss):
            assert not np.any(np.signbit(values) & (values == 0)), m.block


def test_pair_energies_match_pyscf_amplitudes():
    """e_ij = sum_ab t_ij^ab [2 (ia|jb) - (ib|ja)] from PySCF's DF-MP2 amplitudes on the same
    SCF: the pair matrix of a run on that SCF object."""
    mol = build_mole(WATER, basis="cc-pvdz")
    mf = scf.RHF(mol).density_fit().run(conv_tol=1e-11)
    pt = pyscf_dfmp2(mf, "cc-pvdz-ri", frozen=1)
    pt.kernel(with_t2=True)
    nocc = pt.nocc
    t2 = pt.t2  # (i, j, a, b)
    from pyscf import df, lib

    eri = df.DF(mol, auxbasis="cc-pvdz-ri")
    mo = mf.mo_coeff[:, 1:]
    occ, vir = mo[:, :nocc], mo[:, nocc:]
    b = lib.einsum("Lpq,pi,qa->iaL", lib.unpack_tril(eri.build()._cderi), occ, vir)
    g = np.einsum("iaL,jbL->ijab", b, b)
    expected = np.einsum("ijab,ijab->ij", t2, 2 * g - g.transpose(0, 1, 3, 2))
    result = dfmp2.DFMP2(mf, frozen=1, auxbasis="cc-pvdz-ri", pair_energies=True,
                         cpu_blas="numpy").run().result
    assert not result.method.fused_energy  # the table's own op ran, not the fused one
    assert "pair_reduction" not in result.backend.cpu_blas  # nor numpy's reduction
    assert "fused energy off" in result.summary(verbose=True)
    got = pair_matrix(result.pair_energies["blocks"]["closed"])
    sym = expected + expected.T - np.diag(np.diag(expected))  # pair i != j: both orders
    np.testing.assert_allclose(np.triu(got), np.triu(sym), atol=TOL_FP64, rtol=0)
    assert abs(np.triu(got).sum() - pt.e_corr) <= TOL_FP64


def test_record_out_of_core_and_open_shell(tmp_path):
    incore = dfmp2.run(NH2, spin=1, reference="rohf", pair_energies=True, device="cpu")
    outcore = dfmp2.run(NH2, spin=1, reference="rohf", pair_energies=True,
                        force_outcore=True, max_memory=50, device="cpu")  # the host's record
    rec = outcore.pair_energies
    assert [len(s["orbital_energies"]) for s in rec["spaces"]] == [outcore.sizes.nocc,
                                                                   outcore.sizes.nocc_beta]
    for name in ("alpha-alpha", "beta-beta", "alpha-beta"):
        for part in ("os", "ss"):
            np.testing.assert_allclose(rec["blocks"][name][part],
                                       incore.pair_energies["blocks"][name][part],
                                       atol=TOL_OUTCORE, rtol=0)
    assert abs(sum(np.sum(b["os"]) for b in rec["blocks"].values()) - outcore.e_corr_os) \
        <= TOL_COMPONENT_SUM
    assert abs(sum(np.sum(b["ss"]) for b in rec["blocks"].values()) - outcore.e_corr_ss) \
        <= TOL_COMPONENT_SUM
    assert outcore.backend.ops["mp2_pair_table"]["mode"] == "host"
    plain = dfmp2.run(NH2, spin=1, reference="rohf")
    assert plain.pair_energies is None and "pair_energies" not in plain.to_dict()["extras"]
    assert abs(plain.e_corr - outcore.e_corr) <= TOL_OUTCORE


def test_cli_pair_energies_and_plot(tmp_path):
    out, png = tmp_path / "w.json", tmp_path / "w.png"
    cli = CliRunner().invoke(main, ["run", WATER, "--pair-energies", "--json", str(out)])
    assert cli.exit_code == 0, cli.output
    extras = json.loads(out.read_text())["extras"]
    assert set(extras["pair_energies"]["blocks"]) == {"closed"}
    cli = CliRunner().invoke(main, ["run", WATER, "--frozen-core", "--plot", str(png), "-q"])
    assert cli.exit_code == 0, cli.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,message", [
    (["--plot", "{tmp}/x.foo"], "matplotlib cannot write a foo file"),
    (["--plot", "{tmp}/missing/x.png"], "cannot write plot"),
    (["--plot", "{tmp}/x.png", str(INPUTS / "methane.xyz")], "each result needs its own file"),
    (["--plot", "{tmp}/{index}.xyz", str(INPUTS / "methane.xyz")],
     "plot '{tmp}/1.xyz' (--plot): matplotlib cannot write a xyz file"),
    # --plot keeps the pair energies: its contradictions name it (they named --pair-energies,
    # which was not given)
    (["--plot", "{tmp}/x.png", "--backend", "nki", "--nki-emulator", "--require-nki"],
     "error: --plot draws every pair's energy, kept by a host op, which --require-nki forbids"),
    (["--plot", "{tmp}/x.png", "--backend", "nki", "--nki-emulator", "--nki-matmul", "bf16x3"],
     "error: --plot draws every pair's energy, kept by a host op, which --nki-matmul bf16x3 "
     "does not run"),
    (["--plot", "{tmp}/x.png", "--pair-energies", "--backend", "nki", "--nki-emulator",
      "--require-nki"], "error: --pair-energies keeps every pair's energy by a host op"),
])
def test_bad_plot_paths_fail_before_any_work(tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    cli = CliRunner().invoke(main, ["run", WATER, *args])
    assert cli.exit_code == 1 and message.replace("{tmp}", str(tmp_path)) in cli.output
    assert "Traceback" not in cli.output and len(cli.output.strip().splitlines()) == 1


def test_a_plot_that_cannot_be_drawn_is_refused_or_one_line_after_the_summary(tmp_path,
                                                                              monkeypatch):
    import matplotlib.figure

    import dfmp2.plot

    monkeypatch.setattr(dfmp2.plot.shutil, "which", lambda _name: None)  # no LaTeX here
    pgf = CliRunner().invoke(main, ["run", WATER, "--plot", str(tmp_path / "x.pgf")])
    assert pgf.exit_code == 1 and pgf.output.strip() == (
        f"error: plot '{tmp_path / 'x.pgf'}' (--plot): a .pgf picture needs LaTeX (xelatex), "
        "which is not on PATH; use .pdf, .svg or .png")
    folder = CliRunner().invoke(main, ["run", WATER, "--plot", str(tmp_path)])
    assert folder.exit_code == 1 and "is a directory: give a file name" in folder.output

    def fails(*_args, **_kwargs):
        raise RuntimeError("a backend's tool failed\nsecond line")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", fails)
    drawn = CliRunner().invoke(main, ["run", WATER, "--basis", "sto-3g", "--plot",
                                      str(tmp_path / "x.png")])
    assert drawn.exit_code == 1 and "E(MP2) total" in drawn.stdout  # the energies are kept
    assert drawn.stderr.strip() == (f"error: cannot draw the plot to '{tmp_path / 'x.png'}': "
                                    "a backend's tool failed")


def test_batch_plots_one_picture_each(tmp_path):
    cli = CliRunner().invoke(main, ["run", WATER, str(INPUTS / "methane.xyz"), "--plot",
                                    str(tmp_path / "{name}.svg")])
    assert cli.exit_code == 0, cli.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["methane.svg", "water.svg"]


def test_counterpoise_plot_and_components(tmp_path):
    result = dfmp2.run_counterpoise("He 0 0 0; He 0 0 3.0", "1,1", pair_energies=True)
    parts = result.interaction["components"]
    total = parts["reference"]["eh"] + parts["os"]["eh"] + parts["ss"]["eh"]
    assert abs(total - result.interaction["mp2"]["eh"]) <= TOL_COMPONENT_SUM
    path = tmp_path / "cp.pdf"
    plot_pair_energies(result, str(path))
    assert path.read_bytes()[:4] == b"%PDF"
    with pytest.raises(InputError, match="no pair energies"):
        plot_pair_energies(dfmp2.run("He 0 0 0"), str(tmp_path / "no.png"))


def _two_spaces(mol):
    """Random orthonormal orbitals of ``mol`` split twice (5 and 4 occupied): two orbital
    spaces of different sizes, as an open shell's alpha and beta."""
    from dfmp2.reference import OrbitalSpace

    nao = mol.nao_nr()
    orbitals = np.linalg.qr(np.random.default_rng(7).standard_normal((nao, nao)))[0]
    return [OrbitalSpace(np.ascontiguousarray(orbitals[:, :o]),
                         np.ascontiguousarray(orbitals[:, o:]), np.zeros(o),
                         np.zeros(nao - o), 0, 0) for o in (5, 4)]


def _direct_pia(mol, auxmol, space) -> np.ndarray:
    """(ia|P) of ``space`` (nocc, nvir, naux) by one einsum over PySCF's whole int3c2e."""
    from pyscf import df

    nao, naux = mol.nao_nr(), auxmol.nao_nr()
    eri3 = df.incore.aux_e2(mol, auxmol, "int3c2e", aosym="s1").reshape(nao, nao, naux)
    return np.einsum("mnP,mi,na->iaP", eri3, space.occ_coeff, space.vir_coeff)


@pytest.mark.parametrize("cpu_blas", ["torch", "numpy"])
@pytest.mark.parametrize("aux_block, unpack_block", [(1, 1), (7, 3), (40, 16), (10_000, 10_000)])
def test_the_transform_equals_one_contraction_over_any_blocks(aux_block, unpack_block, cpu_blas):
    """``transform``'s (ia|P) for two orbital spaces (an open shell's alpha and beta, of
    different sizes) equals one einsum over the whole int3c2e tensor, whatever the blocks: one
    function at a time, groups that split a block unevenly (7 and 40 functions in groups of 3
    and 16 leave remainders), one block for everything; with either CPU BLAS."""
    from dfmp2.integrals import make_auxmol
    from dfmp2.pipeline import transform
    from dfmp2.storage import IncoreStore

    mol = build_mole(NH2, basis="cc-pvdz", spin=1)
    auxmol = make_auxmol(mol, "cc-pvdz-ri")
    naux = auxmol.nao_nr()
    spaces = _two_spaces(mol)
    stores = [IncoreStore(sp.nocc, sp.nvir, naux, naux, dtype=torch.float64) for sp in spaces]
    la = Dispatcher(DispatchPolicy("pytorch", cpu_blas=cpu_blas))
    transform(mol, auxmol, spaces, la, aux_block, unpack_block, stores)
    for sp, store in zip(spaces, stores):
        ref = _direct_pia(mol, auxmol, sp)
        ours = store.read_ia_slab(0, sp.nocc).numpy().reshape(ref.shape)
        assert np.abs(ours - ref).max() <= TOL_MATRIX_REL * np.abs(ref).max()


def test_the_transform_of_a_ranks_shells_into_hdf5_stores(tmp_path):
    """A distributed rank's share (``shells``: the auxiliary shells from the fourth on, stored
    from 0) transformed into out-of-core stores (H5Store copies the transform's permuted
    view) equals those functions of the direct (ia|P)."""
    from dfmp2.integrals import make_auxmol
    from dfmp2.pipeline import transform
    from dfmp2.storage import H5Store

    mol = build_mole(NH2, basis="cc-pvdz", spin=1)
    auxmol = make_auxmol(mol, "cc-pvdz-ri")
    base = int(auxmol.ao_loc_nr()[3])
    naux = auxmol.nao_nr() - base
    spaces = _two_spaces(mol)
    stores = [H5Store(sp.nocc, sp.nvir, naux, naux, directory=str(tmp_path)) for sp in spaces]
    try:
        transform(mol, auxmol, spaces, Dispatcher(DispatchPolicy("pytorch")), 9, 4, stores,
                  shells=(3, auxmol.nbas))
        for sp, store in zip(spaces, stores):
            ref = _direct_pia(mol, auxmol, sp)[:, :, base:]
            ours = store.read_ia_slab(0, sp.nocc).numpy().reshape(ref.shape)
            assert np.abs(ours - ref).max() <= TOL_MATRIX_REL * np.abs(ref).max()
    finally:
        for store in stores:
            store.close()


def test_the_python_plot_checks_its_path_and_draws_an_empty_case(tmp_path):
    from dfmp2.plot import plot_pair_energies

    helium = dfmp2.run("He 0 0 0", basis="sto-3g", pair_energies=True)
    for bad, message in (("he.xyz", "matplotlib cannot write"),
                         (str(tmp_path), "is a directory: give a file name")):
        with pytest.raises(InputError, match=message):
            plot_pair_energies(helium, bad)
    png = tmp_path / "he.png"
    plot_pair_energies(helium, str(png))  # no pairs: the picture says why
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
