"""Geometry parsing, options validation and the memory planner."""

from __future__ import annotations

import pytest
from pyscf import gto

import dfmp2
from dfmp2.blocking import MB, pair_block_bytes, plan_blocks, usable_bytes
from dfmp2.errors import InputError, ResourceError
from dfmp2.molecule import build_mole, parse_geometry, read_xyz
from dfmp2.options import Options

from conftest import INPUTS
from tolerances import TOL_COORDS, TOL_FP64


@pytest.mark.parametrize("name", ["water", "ammonia", "methane", "benzene", "water4",
                                  "water8", "caffeine"])
def test_shipped_inputs_parse(name):
    geom = read_xyz(INPUTS / f"{name}.xyz")
    assert len(geom.atoms) >= 3 and all(len(xyz) == 3 for _, xyz in geom.atoms)


def test_xyz_atom_string_and_mole_give_the_same_molecule():
    geom = read_xyz(INPUTS / "water.xyz")
    text = "; ".join(f"{s} {x} {y} {z}" for s, (x, y, z) in geom.atoms)
    a = build_mole(INPUTS / "water.xyz")
    b = build_mole(text)
    c = build_mole(gto.M(atom=text, basis="cc-pvdz"))
    assert a.nao_nr() == b.nao_nr() == c.nao_nr() == 24
    assert abs(a.atom_coords() - b.atom_coords()).max() < TOL_COORDS
    assert abs(a.atom_coords() - c.atom_coords()).max() < TOL_COORDS


def test_element_symbols_are_case_insensitive_and_zmatrix_is_accepted():
    assert parse_geometry("o 0 0 0; h 0 0 1; H 0 1 0").atoms[0][0] == "O"
    mol = build_mole("O; H 1 1.0; H 1 1.0 2 90.0")
    assert mol.natm == 3 and mol.nelectron == 10


def test_blank_lines_after_the_atoms_are_fine(tmp_path):
    path = tmp_path / "h2.xyz"
    path.write_text("2\nhydrogen\nH 0 0 0\nH 0 0 0.74\n\n")
    assert len(read_xyz(path).atoms) == 2


def test_extra_atom_lines_are_an_error(tmp_path):
    path = tmp_path / "h2.xyz"
    path.write_text("1\nhydrogen\nH 0 0 0\nH 0 0 0.74\n")
    with pytest.raises(InputError, match="line 4: line 1 says 1 atoms"):
        read_xyz(path)


def test_charge_and_spin_checks():
    assert build_mole("O 0 0 0; H 0 0 1; H 0 1 0", charge=1, spin=1).nelectron == 9
    with pytest.raises(InputError, match="cannot have 2S = 2.*an odd count needs an odd 2S"):
        build_mole("O 0 0 0; H 0 0 1", spin=2)
    with pytest.raises(InputError, match="cannot have 2S = 1.*an even count needs an even 2S"):
        build_mole("O 0 0 0; H 0 0 1; H 0 1 0", spin=1)


def test_frozen_core_counts_are_the_documented_ones():
    """--frozen-core freezes PySCF's chemical core, as README and --help state it: none for
    H-Be, 1 orbital for B-Mg, 5 for Al-Zn, 9 for Ga-Sr."""
    import numpy as np

    from dfmp2.reference import frozen_mask

    for atom, spin, nfrozen in (("Li", 1, 0), ("Be", 0, 0), ("B", 1, 1), ("Na", 1, 1),
                                ("Mg", 0, 1), ("Al", 1, 5), ("K", 1, 5), ("Zn", 0, 5),
                                ("Ga", 1, 9), ("Sr", 0, 9)):
        mol = build_mole(f"{atom} 0 0 0", basis="def2-svp", spin=spin, ecp="none")
        mo_occ = np.zeros(mol.nao_nr())
        mo_occ[: mol.nelectron // 2] = 2
        assert np.count_nonzero(~frozen_mask(mol, mo_occ, frozen_core=True)) == nfrozen, atom


def test_options_validate_once_and_name_the_problem():
    with pytest.raises(InputError, match="scf_type must be one of df, conv"):
        Options(scf_type="ri")
    with pytest.raises(InputError, match="unknown option.*basiss"):
        Options.from_kwargs(basiss="sto-3g")
    assert Options(frozen=[0, 1]).frozen == (0, 1)
    assert Options(spin=2).resolved_reference == "uhf"
    with pytest.raises(InputError, match="max_memory"):
        Options(max_memory=0)
    for setting in ({"scf_auxbasis": "def2-universal-jkfit"}, {"scf_precision": "mixed"}):
        with pytest.raises(InputError, match="--scf-type conv runs it on exact integrals"):
            Options(scf_type="conv", **setting)


def test_python_api_rejects_unknown_options():
    with pytest.raises(InputError, match="unknown option"):
        dfmp2.run(INPUTS / "water.xyz", bakend="nki")


def test_planner_respects_the_budget_and_refuses_too_little():
    metric = 3 * 8 * 1680**2  # L, L^-T and the metric or identity while they are formed
    plan = plan_blocks(nao=480, spaces=[(100, 380)], naux=1680, max_memory_mb=4000)
    assert plan.b_bytes == 100 * 380 * 1680 * 8 and not plan.outcore
    assert plan.resident_bytes == plan.b_bytes + metric
    usable = usable_bytes(4000)
    assert usable < 4000 * MB
    assert pair_block_bytes(plan.occ_block, 380, 1680, 0) <= usable - plan.resident_bytes
    transform = (plan.aux_block * 480 * 481 / 2
                 + plan.unpack_block * (480**2 + 480 * 100 + 100 * 380)) * 8
    assert transform <= usable - plan.resident_bytes
    assert 1 <= plan.unpack_block <= plan.aux_block
    small = plan_blocks(nao=480, spaces=[(100, 380)], naux=1680, max_memory_mb=400)
    free = usable_bytes(400) - metric
    assert small.outcore and small.resident_bytes == metric
    assert pair_block_bytes(small.occ_block, 380, 1680, 8) <= free
    assert pair_block_bytes(small.occ_block + 1, 380, 1680, 8) > free
    assert 3 * 8 * small.fit_occ * 380 * 1680 <= free  # out of core: three copies of the slab
    mixed = plan_blocks(nao=480, spaces=[(100, 380)], naux=1680, max_memory_mb=4000, b_itemsize=4)
    assert mixed.b_bytes == plan.b_bytes // 2
    with pytest.raises(ResourceError, match=r"with B \(nocc 100 x nvir 380 x naux 1680\) .*"
                                            "give at least"):
        plan_blocks(nao=480, spaces=[(100, 380)], naux=1680, max_memory_mb=5)
    # an open shell's B holds both spins' pairs, each times naux: bracketed so
    with pytest.raises(ResourceError, match=r"with B \(\(nocc 20 x nvir 76 \+ nocc 19 x nvir "
                                            r"77\) x naux 336\) on disk"):
        plan_blocks(nao=96, spaces=[(20, 76), (19, 77)], naux=336, max_memory_mb=1)


def test_memory_error_comes_before_the_scf(monkeypatch):
    import dfmp2.api

    def no_scf(*args, **kwargs):
        raise AssertionError("the SCF ran before the memory check")

    monkeypatch.setattr(dfmp2.api, "run_scf", no_scf)
    with pytest.raises(ResourceError):
        dfmp2.run(INPUTS / "caffeine.xyz", max_memory=1)


@pytest.mark.parametrize("kwargs, needle", [
    ({"frozen": "a"}, "frozen must be an int"),
    ({"os_scale": "x"}, "os_scale must be a number"),
    ({"max_memory": 1.5}, "max_memory must be an integer"),
    ({"fused_energy": 1}, "fused_energy must be True or False"),
    ({"charge": True}, "charge must be an integer"),
    # (PySCF's own refusal of a number read "AssertionError: AssertionError")
    ({"auxbasis": 3}, r"auxbasis \(--auxbasis\) must be a basis-set name or file .*got 3"),
    ({"scf_auxbasis": ["x"]}, r"scf_auxbasis \(--scf-auxbasis\) must be a basis-set name"),
    ({"auxbasis": " "}, r"auxbasis \(--auxbasis\) must be a basis-set name .*got ' '"),
])
def test_options_of_the_wrong_type_are_input_errors(kwargs, needle):
    with pytest.raises(InputError, match=needle):
        Options(**kwargs)


def test_sizes_in_messages_tell_a_need_from_the_room():
    from dfmp2.blocking import size_text, size_texts

    assert [size_text(b) for b in (1, 1000, 1024, 130000, 1.05 * MB, 16.3 * MB, 1234.4 * MB)] \
        == ["1 byte", "1000 bytes", "1.00 kB", "127 kB", "1.05 MB", "16.3 MB", "1234 MB"]
    assert size_texts(0.6 * MB, 0.4 * MB) == ("614 kB", "410 kB")
    # three figures alike: the exact counts
    assert size_texts(1000.4 * MB, 1000.2 * MB) == (f"{int(1000.4 * MB)} bytes",
                                                    f"{int(1000.2 * MB)} bytes")


def test_an_mp2_fitting_basis_given_as_pyscfs_list_of_shells_runs():
    """PySCF reads a fitting basis given as one list of shells for every element; so does
    dfmp2's auxbasis (the type check refused it for a moment)."""
    shells = gto.basis.load("cc-pvdz-ri", "H")
    assert isinstance(shells, list)
    listed = dfmp2.run("H 0 0 0; H 0 0 0.74", basis="cc-pvdz", auxbasis=shells)
    named = dfmp2.run("H 0 0 0; H 0 0 0.74", basis="cc-pvdz", auxbasis="cc-pvdz-ri")
    assert listed.e_corr == pytest.approx(named.e_corr, abs=TOL_FP64)


def test_numpy_integers_are_taken_and_normalised():
    import numpy as np

    assert Options(frozen=np.int64(1)).frozen == 1
    assert Options(frozen=np.arange(2)).frozen == (0, 1)
    assert Options(frozen=[np.arange(1), [0, np.int32(1)]]).frozen == ((0,), (0, 1))
    assert Options(max_memory=np.int64(100)).max_memory == 100


def test_a_per_spin_frozen_pair_needs_an_open_shell():
    with pytest.raises(InputError, match="per-spin pair"):
        dfmp2.run("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59", basis="sto-3g", frozen=[[0], [0]])


_STO3G_H_C = """BASIS "ao basis" PRINT
#BASIS SET: (3s) -> [1s]
H    S
      3.42525091             0.15432897
      0.62391373             0.53532814
      0.16885540             0.44463454
#BASIS SET: (6s,3p) -> [2s,1p]
C    S
     71.6168370              0.15432897
     13.0450960              0.53532814
      3.5305122              0.44463454
C    SP
      2.9412494             -0.09996723             0.15591627
      0.6834831              0.39951283             0.60768372
      0.2222899              0.70011547             0.39195739
END
"""


def test_a_basis_file_must_hold_every_element(tmp_path):
    """PySCF reads a file without the element in CP2K's format, which hands oxygen the file's
    functions: water ran with carbon's and hydrogen's, 2 Eh off, before this was refused."""
    path = tmp_path / "hc.nw"
    path.write_text(_STO3G_H_C)
    methane = build_mole("C 0 0 0; H 0 0 1.09; H 1.03 0 -0.36; H -0.51 0.89 -0.36; "
                         "H -0.51 -0.89 -0.36", basis=str(path))
    reference = gto.M(atom=methane.atom, basis="sto-3g", verbose=0)
    assert methane.nao_nr() == reference.nao_nr() == 9
    with pytest.raises(InputError, match=r"basis file '.*hc.nw' has no block for element O"):
        build_mole("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59", basis=str(path))
    with pytest.raises(InputError, match=r"auxiliary basis file '.*hc.nw' has no block for "
                                         r"element O"):
        dfmp2.run("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59", basis="sto-3g",
                  auxbasis=str(path))
    undelimited = tmp_path / "undelimited.nw"  # every element would get every function
    undelimited.write_text(_STO3G_H_C.replace("#BASIS SET: (6s,3p) -> [2s,1p]\n", ""))
    with pytest.raises(InputError, match="no block for element C .*'#BASIS SET' line"):
        build_mole("C 0 0 0; H 0 0 1.1; H 0 0 -1.1; H 0 1.1 0; H 0 -1.1 0",
                   basis=str(undelimited))
    broken = tmp_path / "broken.nw"
    broken.write_text(_STO3G_H_C.replace("3.42525091", "3.4x525091"))
    with pytest.raises(InputError, match=r"broken.nw': PySCF could not read the H functions"):
        build_mole("H 0 0 0; H 0 0 0.74", basis=str(broken))


_CP2K_H_C = """H  TEST-BASIS
 1
 1 0 0 3 1
  3.42525091  0.15432897
  0.62391373  0.53532814
  0.16885540  0.44463454
C  TEST-BASIS
 2
 1 0 0 3 1
 71.6168370  0.15432897
 13.0450960  0.53532814
  3.5305122  0.44463454
 2 0 1 3 1 1
  2.9412494 -0.09996723 0.15591627
  0.6834831  0.39951283 0.60768372
  0.2222899  0.70011547 0.39195739
"""


def test_basis_files_are_checked_where_pyscf_looks(tmp_path):
    """PySCF finds an element's block after a '#BASIS SET' line, in NWChem's or CP2K's format;
    otherwise it takes the whole file, which is right only for a file without element labels
    (carbon got hydrogen's one s shell from this CP2K file)."""
    import os

    import pyscf

    cp2k = tmp_path / "hc.cp2k"
    cp2k.write_text(_CP2K_H_C)
    with pytest.raises(InputError, match="no block for element C that PySCF finds"):
        build_mole("C 0 0 0; O 0 0 1.128", basis={"C": str(cp2k), "O": "sto-3g"})
    delimited = tmp_path / "hc-delimited.cp2k"
    delimited.write_text("#BASIS SET\n" + _CP2K_H_C.replace("C  TEST", "#BASIS SET\nC  TEST"))
    mol = build_mole("C 0 0 0; H 0 0 1.1; H 0 0 -1.1; H 0 1.1 0; H 0 -1.1 0",
                     basis=str(delimited))
    assert mol.nao_nr() == 9  # C 1s 2s 2p, four H 1s
    gth = os.path.join(os.path.dirname(pyscf.__file__), "pbc", "gto", "basis", "gth-dzvp.dat")
    assert build_mole("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59", basis=gth).nao_nr() == 23
    unlabelled = tmp_path / "o.nw"
    unlabelled.write_text("S\n  3.42525091  0.15432897\n  0.62391373  0.53532814\n")
    mol = build_mole("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59",
                     basis={"O": str(unlabelled), "H": "sto-3g"}, charge=8)
    assert mol.nao_nr() == 3


def test_basis_files_pyscf_would_misread_are_refused_and_the_rest_read(tmp_path):
    """The block PySCF takes for an element runs to the next '#BASIS SET' line, or is the whole
    file: it must name no other element. PySCF's 'unc' prefix and '@' suffix name the file."""
    undelimited = tmp_path / "undelimited.nw"
    undelimited.write_text(_STO3G_H_C.replace("#BASIS SET: (6s,3p) -> [2s,1p]\n", ""))
    with pytest.raises(InputError, match="the block PySCF finds for H runs on into the "
                                         "functions of C"):
        build_mole("H 0 0 0; H 0 0 0.74", basis=str(undelimited))  # H got 6 functions each
    hc = tmp_path / "hc.nw"
    hc.write_text(_STO3G_H_C)
    water = "O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59"
    for name in (f"unc{hc}", f"{hc}@1s"):
        with pytest.raises(InputError, match="has no block for element O"):
            build_mole(water, basis=name)
    assert build_mole("H 0 0 0; H 0 0 0.74", basis=f"unc{hc}").nao_nr() == 6  # 3 primitives
    typo = tmp_path / "typo.nw"
    typo.write_text("S\n  3.42525091  0.15432897\n  0.6239x1373  0.53532814\n")
    with pytest.raises(InputError, match="typo.nw': PySCF could not read the H functions"):
        build_mole("H 0 0 0; H 0 0 0.74", basis=str(typo))
    one = tmp_path / "h.cp2k"  # one element, CP2K's format, no '#BASIS SET' line: read whole
    one.write_text(_CP2K_H_C.split("C  TEST")[0])
    assert build_mole("H 0 0 0; H 0 0 0.74", basis=str(one)).nao_nr() == 2
    lower = tmp_path / "h-lower.nw"
    lower.write_text(_STO3G_H_C.split("#BASIS SET: (6s")[0].replace("H    S", "h    S"))
    assert build_mole("H 0 0 0; H 0 0 0.74", basis=str(lower)).nao_nr() == 2
