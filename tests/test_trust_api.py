"""The Python API never prints a number it should not: orbitals the formulas do not describe,
settings that would be ignored, empty orbital spaces, scratch space, KS references, QCSchema."""

from __future__ import annotations

import json
import logging
import re

import numpy as np
import pytest
from pyscf import ao2mo, df, dft, gto, scf

import dfmp2
from dfmp2.errors import (
    ConvergenceError,
    InputError,
    NotComputedError,
    OrbitalError,
    ResourceError,
)

from conftest import INPUTS, pyscf_dfmp2
from tolerances import TOL_FP64, TOL_IDENTITY

WATER = "O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.587"


@pytest.fixture(scope="module")
def water_rhf():
    mf = scf.RHF(gto.M(atom=WATER, basis="cc-pvdz", verbose=0))
    mf.conv_tol = 1e-11
    return mf.run()


def _modified(mf, mo_coeff=None, mo_energy=None):
    """A shallow copy of ``mf`` with other orbitals (the fixture stays untouched)."""
    new = mf.copy()
    new.mo_coeff = mf.mo_coeff.copy() if mo_coeff is None else mo_coeff
    new.mo_energy = mf.mo_energy.copy() if mo_energy is None else mo_energy
    return new


# -- 3. orbitals that are not what the formulas assume ------------------------------------------
def test_canonical_orbitals_pass_and_the_check_is_recorded(water_rhf):
    result = dfmp2.DFMP2(water_rhf, backend="pytorch").run().result
    assert result.scf.orbital_check.startswith("orthonormal and canonical")


def test_localised_occupied_orbitals_are_refused(water_rhf):
    c = water_rhf.mo_coeff.copy()
    theta = 0.3  # rotate occupied orbitals 3 and 4: orthonormal, but F is no longer diagonal
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    c[:, [3, 4]] = c[:, [3, 4]] @ rot
    with pytest.raises(OrbitalError, match=r"occupied-occupied Fock block.*F\[(3, 4|4, 3)\]"):
        dfmp2.DFMP2(_modified(water_rhf, mo_coeff=c), backend="pytorch").run()


def test_scaled_orbitals_are_refused(water_rhf):
    c = water_rhf.mo_coeff.copy()
    c[:, 7] *= 1.01
    with pytest.raises(OrbitalError, match=r"not orthonormal: \(C\^T S C - 1\)\[7, 7\]"):
        dfmp2.DFMP2(_modified(water_rhf, mo_coeff=c), backend="pytorch").run()


def test_reordered_virtual_orbitals_are_refused(water_rhf):
    c = water_rhf.mo_coeff.copy()
    c[:, [5, 9]] = c[:, [9, 5]]  # mo_energy not swapped with them
    with pytest.raises(OrbitalError, match="virtual-virtual Fock block, diagonal minus mo_energy"):
        dfmp2.DFMP2(_modified(water_rhf, mo_coeff=c), backend="pytorch").run()


def test_occupied_and_virtual_swapped_is_refused(water_rhf):
    c = water_rhf.mo_coeff.copy()
    c[:, [4, 5]] = c[:, [5, 4]]
    with pytest.raises(OrbitalError):
        dfmp2.DFMP2(_modified(water_rhf, mo_coeff=c), backend="pytorch").run()


def test_loose_scf_gets_a_warning_with_the_expected_error(caplog):
    mf = scf.RHF(gto.M(atom=WATER, basis="cc-pvdz", verbose=0))
    mf.conv_tol = 1e-6
    mf.run()
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        dfmp2.DFMP2(mf, backend="pytorch").run()
    assert any("conv_tol = 1e-06" in r.message and "1e-05 Eh" in r.message
               for r in caplog.records), caplog.text


def test_tight_scf_gets_no_warning(water_rhf, caplog):
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        dfmp2.DFMP2(water_rhf, backend="pytorch").run()
    assert not [r for r in caplog.records if "conv_tol" in r.message]


def _rotated(c: np.ndarray, i: int, j: int, theta: float) -> np.ndarray:
    """``c`` with orbitals i and j rotated into each other by ``theta`` (orthonormal still)."""
    c = c.copy()
    rot = np.array([[np.cos(theta), -np.sin(theta)], [np.sin(theta), np.cos(theta)]])
    c[:, [i, j]] = c[:, [i, j]] @ rot
    return c


@pytest.fixture(scope="module")
def oh_rohf():
    mf = scf.ROHF(gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0))
    mf.conv_tol = 1e-11
    return mf.run()


def test_converged_rohf_orbitals_pass_the_gradient_check(oh_rohf):
    result = dfmp2.DFMP2(oh_rohf, backend="pytorch").run().result
    assert result.scf.orbital_check.startswith("orthonormal, ROHF gradient below")


def test_an_rohf_object_costs_one_fock_build_for_its_check_and_semicanonical_orbitals(oh_rohf):
    mf = oh_rohf.copy()
    builds, own = [], oh_rohf.get_jk
    mf.get_jk = lambda *args, **kwargs: (builds.append(1), own(*args, **kwargs))[1]
    pt = dfmp2.DFMP2(mf, backend="pytorch").run()
    assert len(builds) == 1
    reference = dfmp2.DFMP2(oh_rohf, backend="pytorch").run()
    assert abs(pt.e_corr - reference.e_corr) <= TOL_IDENTITY
    assert pt.result.scf.orbital_check.startswith("orthonormal, ROHF gradient below")


def test_an_rohf_objects_own_potential_shapes_its_semicanonical_orbitals(oh_rohf):
    """A potential the SCF converged with is in the Fock matrix that semicanonicalises its
    orbitals, whether the object adds it to its get_veff or to its core Hamiltonian (it was
    left out of the first: E(singles) -5.0e-3 Eh against -6.7e-4 for OH in 6-31G)."""
    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="6-31g", spin=1, verbose=0)
    v = 0.05 * np.eye(mol.nao)  # an external potential on every AO

    class InVeff(scf.rohf.ROHF):
        def get_veff(self, mol=None, dm=None, *args, **kwargs):
            return super().get_veff(mol, dm, *args, **kwargs) + v

        def energy_elec(self, dm=None, h1e=None, vhf=None):
            return super().energy_elec(dm, self.get_hcore() + v, vhf - v if vhf is not None
                                       else None)

    class InCore(scf.rohf.ROHF):
        def get_hcore(self, mol=None):
            return super().get_hcore(mol) + v

    energies = []
    for kind in (InVeff, InCore):
        mf = kind(mol)
        mf.conv_tol = 1e-11
        pt = dfmp2.DFMP2(mf.run(), backend="pytorch", auxbasis="cc-pvdz-ri").run()
        energies.append((pt.e_singles, pt.e_corr))
    assert np.allclose(energies[0], energies[1], rtol=0, atol=TOL_FP64)


@pytest.mark.parametrize("i, j, theta", [(3, 6, 0.3), (2, 4, 0.3), (1, 6, 0.01)])
def test_rotated_rohf_orbitals_are_refused(oh_rohf, i, j, theta):
    """docc-virtual, docc-socc and a small docc-virtual rotation: 0.128, 1.4e-4 and 1.3e-4 Eh
    off in E(corr) when they were accepted."""
    rotated = oh_rohf.copy()
    rotated.mo_coeff = _rotated(oh_rohf.mo_coeff, i, j, theta)
    with pytest.raises(OrbitalError, match="ROHF orbitals are not converged: largest orbital-"):
        dfmp2.DFMP2(rotated, backend="pytorch").run()


def test_unconverged_orbitals_diagonal_within_blocks_are_refused(water_rhf):
    """Three SCF cycles, then each block of the Fock matrix diagonalised alone: the occupied-
    occupied and virtual-virtual blocks are diagonal and equal mo_energy, the occupied-virtual
    block is not zero (2.3e-4 Eh off in E(corr) when accepted)."""
    mf = scf.RHF(water_rhf.mol)
    mf.max_cycle, mf.conv_check = 3, False
    mf.run()
    f_mo = mf.mo_coeff.T @ mf.get_fock() @ mf.mo_coeff
    occ = mf.mo_occ > 0
    c, eps = mf.mo_coeff.copy(), mf.mo_energy.copy()
    for mask in (occ, ~occ):
        w, u = np.linalg.eigh(f_mo[np.ix_(mask, mask)])
        c[:, mask], eps[mask] = mf.mo_coeff[:, mask] @ u, w
    mf.mo_coeff, mf.mo_energy, mf.converged = c, eps, True
    with pytest.raises(OrbitalError, match="occupied-virtual Fock block, off-diagonal"):
        dfmp2.DFMP2(mf, backend="pytorch").run()


def test_a_loose_gradient_threshold_does_not_open_the_check(water_rhf, caplog):
    rotated = _modified(water_rhf, mo_coeff=_rotated(water_rhf.mo_coeff, 6, 7, 0.6))
    rotated.conv_tol_grad = 0.1
    with caplog.at_level(logging.WARNING, logger="dfmp2"), \
            pytest.raises(OrbitalError, match=r"virtual-virtual.*tolerance 1e-03: ten times the "
                                              r"SCF's gradient threshold 1e-01, kept within"):
        dfmp2.DFMP2(rotated, backend="pytorch").run()
    assert "conv_tol_grad = 1e-01 only" in caplog.text


def test_a_molecule_changed_after_the_scf_is_refused(water_rhf):
    charged = water_rhf.copy()
    charged.mol = water_rhf.mol.copy()
    charged.mol.charge = 2
    charged.mol.build()
    with pytest.raises(OrbitalError, match="hold 10 electrons but mf.mol has 8 .charge 2."):
        dfmp2.DFMP2(charged, backend="pytorch").run()
    bigger = water_rhf.copy()
    bigger.mol = gto.M(atom=WATER, basis="aug-cc-pvdz", verbose=0)
    with pytest.raises(OrbitalError, match="mo_coeff has 24 rows but mf.mol has 41 basis"):
        dfmp2.DFMP2(bigger, backend="pytorch").run()


def test_orbitals_that_are_not_real_numpy_arrays_are_refused(water_rhf):
    complex_c = _modified(water_rhf, mo_coeff=water_rhf.mo_coeff.astype(complex))
    with pytest.raises(OrbitalError, match="mf.mo_coeff is complex128: dfmp2 needs real"):
        dfmp2.DFMP2(complex_c, backend="pytorch").run()
    listed = _modified(water_rhf, mo_coeff=water_rhf.mo_coeff.tolist())
    with pytest.raises(OrbitalError, match="mf.mo_coeff holds a list, not a numpy array"):
        dfmp2.DFMP2(listed, backend="pytorch").run()


def test_what_is_not_a_molecules_scf_is_refused(water_rhf):
    for given in (None, water_rhf.mol):
        with pytest.raises(InputError, match="DFMP2 needs a PySCF SCF object .* got"):
            dfmp2.DFMP2(given)
    model = gto.M(verbose=0)
    model.nelectron, model.incore_anyway = 2, True
    hubbard = scf.RHF(model)  # a two-site Hubbard dimer, PySCF's model-Hamiltonian recipe
    hubbard.get_hcore = lambda *a: -np.eye(2, k=1) - np.eye(2, k=-1)
    hubbard.get_ovlp = lambda *a: np.eye(2)
    onsite = np.zeros((2, 2, 2, 2))
    onsite[0, 0, 0, 0] = onsite[1, 1, 1, 1] = 2.0
    hubbard._eri = ao2mo.restore(8, onsite, 2)
    hubbard.run()
    with pytest.raises(InputError, match="no atoms .a model Hamiltonian."):
        dfmp2.DFMP2(hubbard).run()


def test_a_scaled_hamiltonian_is_refused(water_rhf):
    assert water_rhf._eri is not None  # the check below passes for the molecule's own
    scaled = scf.RHF(water_rhf.mol)
    scaled._eri = 0.9 * water_rhf._eri
    scaled.conv_tol = 1e-11
    scaled.run()
    with pytest.raises(InputError, match=r"two-electron integrals \(mf._eri\) are not"):
        dfmp2.DFMP2(scaled, backend="pytorch").run()


def test_an_scf_whose_molecule_moved_without_a_reset_is_refused():
    """mol.set_geom_ then mf.kernel(): PySCF keeps the integrals of the old geometry (fitted
    ones, or mf._eri), so that SCF is not the molecule's (2.4 Eh off for a DF-RHF of water with
    its O moved 0.1 Angstrom), and its orbital check, on the same integrals, passes. Refused,
    naming the atom and mf.reset(); after the reset the run is the molecule's."""
    for density_fit in (True, False):
        mol = gto.M(atom=WATER, basis="sto-3g", verbose=0)
        mf = scf.RHF(mol)
        mf = mf.density_fit() if density_fit else mf
        mf.conv_tol = 1e-11
        mf.run()
        moved = mol.atom_coords(unit="Ang")
        moved[0, 2] += 0.10
        mol.set_geom_(moved, unit="Ang")
        mf.kernel()
        match = (r"fitted integrals \(mf.with_df\) were built at another geometry \(atom 1 "
                 r"\(O\) 0.189 Bohr from where it is now\).*call mf.reset\(\)" if density_fit
                 else r"kept from another geometry: after mol.set_geom_, call mf.reset\(\)")
        with pytest.raises(InputError, match=match):
            dfmp2.DFMP2(mf, backend="pytorch").run()
        mf.reset()
        mf.kernel()
        atoms = [(mol.atom_symbol(k), mol.atom_coord(k, unit="Ang")) for k in range(mol.natm)]
        fresh = scf.RHF(gto.M(atom=atoms, basis="sto-3g", verbose=0))
        fresh = fresh.density_fit() if density_fit else fresh
        fresh.conv_tol = 1e-11
        fresh.run()
        assert abs(mf.e_tot - fresh.e_tot) <= TOL_FP64
        assert abs(dfmp2.DFMP2(mf, backend="pytorch").run().e_tot
                   - dfmp2.DFMP2(fresh, backend="pytorch").run().e_tot) <= TOL_FP64


def test_an_excited_determinant_gets_a_warning(caplog):
    mol = gto.M(atom=WATER, basis="cc-pvdz", symmetry=True, verbose=0)
    mf = scf.RHF(mol)
    mf.irrep_nelec = {"A1": 8, "B1": 2, "B2": 0, "A2": 0}
    mf.conv_tol = 1e-10
    mf.run()
    assert mf.converged
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        dfmp2.DFMP2(mf, backend="pytorch").run()
    assert "lies above the lowest virtual" in caplog.text


def test_a_mom_excited_determinant_runs_as_pyscf_does(caplog):
    """A MOM SCF keeps its canonical orbitals in energy order, its occupied ones not first:
    dfmp2 takes the spaces by mo_occ (as the same state from a symmetry-adapted SCF, whose
    occupied columns come first), with the inverted-orbital WARNING, and agrees with PySCF."""
    from pyscf.mp.dfump2 import DFUMP2
    from pyscf.scf import addons

    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    ground = scf.UHF(mol).run(conv_tol=1e-11)
    occ = [ground.mo_occ[0].copy(), ground.mo_occ[1].copy()]
    for o in occ:
        o[[4, 5]] = [0, 1]  # HOMO -> LUMO in both spins
    mom = addons.mom_occ_(scf.UHF(mol), ground.mo_coeff, occ)
    mom.conv_tol = 1e-10
    mom.kernel(mom.make_rdm1(ground.mo_coeff, occ))
    assert mom.converged and mom.mo_occ[0][4] == 0 and mom.mo_occ[0][5] == 1
    ref = DFUMP2(mom)
    ref.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    ref.kernel(with_t2=False)
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        pt = dfmp2.DFMP2(mom, auxbasis="cc-pvdz-ri", backend="pytorch").run()
    assert "lies above the lowest virtual" in caplog.text
    assert pt.e_corr == pytest.approx(ref.e_corr, abs=TOL_FP64)
    assert pt.nocc == (5, 5)


def test_a_per_spin_frozen_array_counts_each_spin():
    """``frozen`` as a 2-D numpy array (alpha row, beta row), as PySCF takes it."""
    mol = gto.M(atom="C 0 0 0; H 0 0.9 0.5; H 0 -0.9 0.5", basis="cc-pvdz", spin=2, verbose=0)
    mf = scf.UHF(mol).run(conv_tol=1e-11)
    as_array = dfmp2.DFMP2(mf, auxbasis="cc-pvdz-ri", frozen=np.array([[0], [0]]),
                           backend="pytorch").run()
    as_lists = dfmp2.DFMP2(mf, auxbasis="cc-pvdz-ri", frozen=[[0], [0]],
                           backend="pytorch").run()
    assert as_array.nocc == as_lists.nocc == (4, 2)
    assert as_array.nmo == as_lists.nmo
    assert as_array.e_corr == pytest.approx(as_lists.e_corr, abs=TOL_IDENTITY)


def test_a_two_component_x2c_object_is_refused_as_what_it_is():
    from pyscf import x2c

    mf = x2c.UHF(gto.M(atom="H 0 0 0; F 0 0 0.9", basis="sto-3g", verbose=0)).run()
    with pytest.raises(InputError, match=r"got UHF of pyscf\.x2c\.x2c \(two-component X2C"):
        dfmp2.DFMP2(mf).run()


def test_the_record_names_what_the_scf_object_added_to_the_hamiltonian(water_rhf):
    """X2C, a get_hcore of the object's own (an external field) and a solvent model are
    recorded (summary and JSON); the molecule's own Hamiltonian records nothing."""
    from pyscf import solvent

    mol = water_rhf.mol
    field = scf.RHF(mol)
    hcore = field.get_hcore() + 0.01 * mol.intor("int1e_r")[2]
    field.get_hcore = lambda *args: hcore
    cases = {"X2C-1e": scf.RHF(mol).x2c(), "own one-electron": field,
             "ddCOSMO solvent model": solvent.ddCOSMO(scf.RHF(mol))}
    for words, mf in cases.items():
        mf.conv_tol = 1e-10
        result = dfmp2.DFMP2(mf.run(), auxbasis="cc-pvdz-ri", backend="pytorch").run().result
        assert words in result.scf.hamiltonian
        assert f"Hamiltonian  {result.scf.hamiltonian}" in result.summary()
        assert json.loads(result.to_json())["extras"]["scf"]["hamiltonian"] == (
            result.scf.hamiltonian)
    plain = dfmp2.DFMP2(water_rhf, backend="pytorch").run().result
    assert plain.scf.hamiltonian is None and "Hamiltonian" not in plain.summary()
    newton = scf.RHF(mol).newton().run(conv_tol=1e-10)
    second_order = dfmp2.DFMP2(newton, backend="pytorch").run().result
    assert second_order.scf.hamiltonian is None
    # PySCF's second-order driver keeps no cycle count (its 0 was recorded): none is, and the
    # solver is named
    assert second_order.scf.cycles is None and "mf.newton()" in second_order.scf.solver
    line = next(t for t in second_order.summary().splitlines() if "converged" in t)
    assert ": converged (conv_tol 1e-10" in line and "mf.newton()" in line
    assert json.loads(second_order.to_json())["properties"].get("scf_iterations") is None


def test_near_whole_occupations_are_refused_with_the_hint(water_rhf):
    smeared = water_rhf.copy()
    smeared.mo_occ = water_rhf.mo_occ.copy()
    smeared.mo_occ[4] -= 3.7e-15
    smeared.mo_occ[5] += 3.7e-15
    with pytest.raises(OrbitalError, match=r"it holds 3.7e-15, 1.99999999999999.*whole "
                                           r"numbers to 3.\de-15 .*numpy.rint"):
        dfmp2.DFMP2(smeared, backend="pytorch").run()


def test_a_chkfile_scf_is_told_how_to_say_it_converged(water_rhf):
    loaded = water_rhf.copy()
    loaded.converged = False
    with pytest.raises(ConvergenceError, match="chkfile.*set mf.converged = True"):
        dfmp2.DFMP2(loaded, backend="pytorch").run()


# -- 4. the API applies or refuses every setting ----------------------------------------------
def test_settings_given_with_a_mole_are_applied_to_a_copy():
    mol = gto.M(atom=WATER, basis="sto-3g", verbose=0)
    kept = dfmp2.run(mol, backend="pytorch")
    assert kept.sizes.nbasis == 7 and kept.method.basis == {"O": "sto-3g", "H": "sto-3g"}
    applied = dfmp2.run(mol, basis="cc-pvdz", charge=2, backend="pytorch")
    assert applied.sizes.nbasis == 24 and applied.molecule.charge == 2
    assert applied.molecule.nelectron == 8
    assert (mol.basis, mol.charge, mol.nao_nr()) == ("sto-3g", 0, 7)  # the caller's Mole


def test_pyscf_with_df_idiom_sets_the_fitting_basis(water_rhf):
    ref = pyscf_dfmp2(water_rhf, "cc-pvdz-jkfit")
    pt = dfmp2.DFMP2(water_rhf, backend="pytorch")
    pt.with_df = df.DF(water_rhf.mol, auxbasis="cc-pvdz-jkfit")
    pt.run()
    assert pt.result.method.auxbasis == {"O": "cc-pvdz-jkfit", "H": "cc-pvdz-jkfit"}
    assert pt.e_corr == pytest.approx(ref.e_corr, abs=TOL_FP64)
    default = dfmp2.DFMP2(water_rhf, backend="pytorch").run()
    assert abs(default.e_corr - pt.e_corr) > 1e-6  # the setting changed the energy


def test_contradicting_auxbasis_and_with_df_are_refused(water_rhf):
    pt = dfmp2.DFMP2(water_rhf, auxbasis="cc-pvdz-ri", backend="pytorch")
    pt.with_df = df.DF(water_rhf.mol, auxbasis="cc-pvdz-jkfit")
    with pytest.raises(InputError, match="contradicts with_df.auxbasis"):
        pt.run()


def test_a_with_df_without_auxbasis_is_refused_unless_auxbasis_is_given(water_rhf):
    """PySCF's DF-MP2 fits with the JK-fit default when its with_df names no basis; dfmp2's
    default is the RI basis, so it asks rather than pick one of the two silently."""
    pt = dfmp2.DFMP2(water_rhf, backend="pytorch")
    pt.with_df = df.DF(water_rhf.mol)
    with pytest.raises(InputError, match="with_df has no auxbasis"):
        pt.run()
    pt.auxbasis = "cc-pvdz-ri"
    assert pt.run().result.method.auxbasis == {"O": "cc-pvdz-ri", "H": "cc-pvdz-ri"}


def test_settings_assigned_as_attributes_apply_or_are_refused(water_rhf):
    """PySCF users set ``pt.max_memory = ...``: an Options field assigned so is applied by the
    next run, like the keyword; PySCF's logger settings and unknown names are refused."""
    pt = dfmp2.DFMP2(water_rhf, backend="pytorch")
    assert pt.max_memory == dfmp2.Options.default("max_memory")
    pt.max_memory = 300
    assert pt.run().result.method.max_memory_mb == 300
    pt.precision = "mixed"
    assert pt.run().result.method.precision == "mixed"
    for name, message in (("verbose", "logs through Python's logging"),
                          ("max_cycles", "no setting 'max_cycles'")):
        with pytest.raises(AttributeError, match=message):
            setattr(pt, name, 4)


def test_molecule_settings_on_dfmp2_are_refused(water_rhf):
    with pytest.raises(InputError, match="basis belongs to the SCF's molecule"):
        dfmp2.DFMP2(water_rhf, basis="cc-pvtz").run()


@pytest.mark.parametrize("name, value", [("conv_tol", 1e-6), ("max_cycle", 1),
                                         ("scf_type", "conv"), ("chkfile", "x.chk"),
                                         ("reference", "uhf"), ("scf_precision", "mixed")])
def test_scf_settings_on_dfmp2_are_refused_not_ignored(water_rhf, name, value):
    """DFMP2 is given a converged SCF: the SCF's settings are refused, as keywords and as
    attributes (they used to be accepted and change nothing)."""
    with pytest.raises(InputError, match=f"{name}: DFMP2.mf. takes the SCF object as it is"):
        dfmp2.DFMP2(water_rhf, **{name: value}).run()
    pt = dfmp2.DFMP2(water_rhf)
    with pytest.raises(AttributeError, match="takes the SCF object as it is given"):
        setattr(pt, name, value)
    with pytest.raises(AttributeError):
        getattr(pt, name)  # not an option of this object: no default to read


def test_attribute_settings_of_a_copy_and_of_a_subclass():
    import copy

    from pyscf import gto, scf

    mf = scf.RHF(gto.M(atom=WATER, basis="sto-3g", verbose=0)).run()
    pt = dfmp2.DFMP2(mf)
    twin = copy.copy(pt)
    twin.precision = "mixed"
    assert "precision" not in pt.options and twin.precision == "mixed"

    class Tagged(dfmp2.DFMP2):
        pass

    tagged = Tagged(mf)
    tagged.tag = "mine"  # a subclass keeps its own attributes
    assert tagged.tag == "mine"


def test_pyscf_energy_only_kernel_call_and_unknown_settings(water_rhf):
    pt = dfmp2.DFMP2(water_rhf, backend="pytorch")
    e_corr, t2 = pt.kernel(with_t2=False)  # what PySCF users write for energies only
    assert t2 is None and e_corr == pt.e_corr
    with pytest.raises(InputError, match="energies only, never the t2 amplitudes"):
        pt.kernel(with_t2=True)
    with pytest.raises(InputError, match="takes no orbitals"):
        pt.kernel(water_rhf.mo_energy, water_rhf.mo_coeff)  # PySCF's positional form
    assert pt.kernel(None, None)[0] == e_corr  # PySCF's None: the SCF's own orbitals
    with pytest.raises(InputError, match="no setting 'nonsense'") as info:
        pt.kernel(nonsense=1)
    listed = str(info.value).split("(")[-1].rstrip(")").split(", ")
    assert "max_memory" in listed and "basis" not in listed and "conv_tol" not in listed


def test_settings_given_to_run_stay_on_the_object_as_pyscf_keeps_them(water_rhf):
    """PySCF's ``run(frozen=1)`` sets ``frozen`` on the object: its nocc/nmo then count the
    active orbitals of the energy just computed, and a later run() repeats that energy."""
    pt = dfmp2.DFMP2(water_rhf, backend="pytorch")
    e_frozen = pt.run(frozen=1).e_corr
    assert (pt.frozen, pt.nocc, pt.nmo) == (1, 4, 23)
    assert pt.run().e_corr == e_frozen
    pt.run(frozen_core=False, frozen=None)
    assert (pt.nocc, pt.nmo) == (5, 24) and pt.e_corr < e_frozen
    with pytest.raises(InputError):  # refused settings are not kept
        pt.run(frozen=-3)
    assert pt.frozen is None


def test_frozen_as_a_list_or_range_behaves_as_the_int(water_rhf):
    by_int = dfmp2.DFMP2(water_rhf, frozen=2, backend="pytorch").run().e_corr
    assert dfmp2.DFMP2(water_rhf, frozen=range(2), backend="pytorch").run().e_corr == by_int
    for every in (5, list(range(5))):
        with pytest.raises(InputError, match="freezes all 5 occupied orbitals"):
            dfmp2.DFMP2(water_rhf, frozen=every, backend="pytorch").run()


def test_energies_before_run_say_so(water_rhf):
    pt = dfmp2.DFMP2(water_rhf)
    assert pt.e_corr is None  # PySCF's convention
    with pytest.raises(NotComputedError, match=r"call run\(\)"):
        pt.e_tot
    assert not hasattr(pt, "e_scs")  # NotComputedError is an AttributeError


def test_kohn_sham_reference_is_recorded_as_rks():
    ks = dft.RKS(gto.M(atom=WATER, basis="cc-pvdz", verbose=0))
    ks.xc = "b3lyp"
    ks.conv_tol = 1e-11
    ks.run()
    result = dfmp2.DFMP2(ks, backend="pytorch").run().result
    assert (result.scf.kind, result.scf.xc) == ("rks", "b3lyp")
    assert result.e_hf is None and result.e_scf == ks.e_tot
    assert result.e_tot == pytest.approx(ks.e_tot + result.e_corr, abs=TOL_IDENTITY)
    text = result.summary()
    assert "E(RKS)" in text and "E(HF)" not in text and "RKS (b3lyp)" in text
    assert result.to_dict()["model"]["method"] == "mp2 on rks-b3lyp"


# -- 8. empty orbital spaces: E(corr) = 0 with a note, as PySCF ----------------------------------
def test_no_virtual_orbitals_gives_zero_with_a_note():
    result = dfmp2.run("He 0 0 0", basis="sto-3g", backend="pytorch")
    assert (result.e_corr, result.sizes.nvir, result.sizes.npairs) == (0.0, 0, 0)
    assert "no virtual orbitals" in result.method.note
    assert result.scf.lumo is None and "note: no virtual" in result.summary()


@pytest.mark.parametrize("reference", ["uhf", "rohf"])
def test_one_active_electron_gives_zero_doubles_with_a_note(reference):
    """H2O+ with 4 orbitals frozen keeps one active electron (alpha): no pair, so E(OS) and
    E(SS) are 0 (ROHF's singles remain), and the summary says why, as for no virtuals; the
    H atom too (an exact zero: a note, not a warning). It printed E(corr) = 0 without a
    word."""
    result = dfmp2.run(INPUTS / "water.xyz", basis="sto-3g", charge=1, spin=1, frozen=4,
                       reference=reference)
    assert result.e_corr_os == result.e_corr_ss == 0.0
    assert (result.e_singles != 0.0) is (reference == "rohf")
    said = "one active electron (1 alpha, 0 beta occupied): no pair to correlate"
    assert said in result.method.note and f"note: {said}" in result.summary()
    atom = dfmp2.run("H 0 0 0", spin=1, basis="cc-pvdz")
    assert said in atom.method.note and not atom.warnings  # exact: a note, no warning


def test_negative_frozen_indices_count_from_the_last_orbital_like_pyscf(water_rhf):
    """PySCF's MP2 reads frozen=[-1, -2] as numpy does: the two highest virtuals (a way to
    drop them); dfmp2 refused it. Now the same energy as PySCF's and as the same orbitals
    by their positive indices; beyond -nmo, one line."""
    nmo = len(water_rhf.mo_occ)
    ref = pyscf_dfmp2(water_rhf, "cc-pvdz-ri", frozen=[-1, -2])
    pt = dfmp2.DFMP2(water_rhf, frozen=[-1, -2], backend="pytorch").run()
    assert pt.e_corr == pytest.approx(ref.e_corr, abs=TOL_FP64)
    assert pt.result.sizes.nfrozen_vir == 2 and pt.nmo == nmo - 2
    assert pt.e_corr == dfmp2.DFMP2(water_rhf, frozen=[nmo - 1, nmo - 2],
                                    backend="pytorch").run().e_corr
    with pytest.raises(InputError, match=f"frozen orbital index {-nmo - 1} out of range "
                                         f"\\(nmo = {nmo}: indices 0 to {nmo - 1}, or -1 to "
                                         f"-{nmo} from the last\\)"):
        dfmp2.DFMP2(water_rhf, frozen=[0, -nmo - 1], backend="pytorch").run()


def test_all_virtuals_frozen_gives_zero_like_pyscf(water_rhf):
    nocc = int((water_rhf.mo_occ > 0).sum())
    frozen = list(range(nocc, len(water_rhf.mo_occ)))
    ref = pyscf_dfmp2(water_rhf, "cc-pvdz-ri", frozen=frozen)
    pt = dfmp2.DFMP2(water_rhf, frozen=frozen, backend="pytorch").run()
    assert pt.e_corr == ref.e_corr == 0.0
    assert pt.result.sizes.nfrozen_vir == len(frozen)


# -- 9. nothing computed only to be lost ------------------------------------------------------
def _no_scf(monkeypatch):
    def refuse(*_args, **_kwargs):
        raise AssertionError("the SCF ran before the problem was found")

    monkeypatch.setattr(dfmp2.api, "run_scf", refuse)


def test_unwritable_scratch_dir_is_one_line_before_the_scf(monkeypatch):
    _no_scf(monkeypatch)
    with pytest.raises(InputError, match="scratch directory '/proc' is not writable"):
        dfmp2.run(INPUTS / "water.xyz", scratch_dir="/proc")


def test_too_little_scratch_space_is_refused_before_the_scf(monkeypatch, tmp_path):
    import shutil

    _no_scf(monkeypatch)
    monkeypatch.setattr(shutil, "disk_usage", lambda _d: shutil._ntuple_diskusage(10, 9, 1))
    # (sizes below 1 MB in kB or bytes, not both '0 MB'; --force-outcore: memory would not help)
    with pytest.raises(ResourceError, match=r"has 1 byte free; the out-of-core integrals need "
                       r"\d+ kB; free space or choose another --scratch-dir$"):
        dfmp2.run(INPUTS / "water.xyz", force_outcore=True, scratch_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


# -- 5 / 11. what the result records --------------------------------------------------------
def test_result_validates_as_a_qcschema_atomic_result_with_ghosts():
    import warnings

    import qcelemental as qcel

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PySCF's basis-set-exchange advice must not leak
        result = dfmp2.run("O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.587; @He 3 0 0",
                           basis="cc-pvdz", backend="pytorch")
    assert result.method.scf_auxbasis["He"] == "even-tempered (PySCF aug_etb)"
    model = qcel.models.AtomicResult(**result.to_dict())
    assert list(model.molecule.real) == [True, True, True, False]
    assert list(model.molecule.symbols) == ["O", "H", "H", "He"]
    assert model.return_result == pytest.approx(result.e_tot, abs=TOL_IDENTITY)
    assert model.properties.scf_iterations == result.scf.cycles > 0
    assert result.molecule.formula == "H2O" and result.molecule.nghost == 1


def test_summary_starts_with_the_molecule_and_keeps_machinery_for_verbose():
    result = dfmp2.run(INPUTS / "water.xyz", backend="pytorch")
    text = result.summary()
    first = text.splitlines()[0]
    assert first.startswith("H2O  charge +0  multiplicity 1  3 atoms  24 basis functions")
    order = [text.index(s) for s in ("basis      cc-pvdz", "auxiliary  cc-pvdz-ri",
                                     "nuclear repulsion", "converged in", "HOMO", "LUMO",
                                     "E(HF)", "E(MP2) total")]
    assert order == sorted(order)
    assert "backend" not in text and "calls" not in text
    from dfmp2.df import INT3C_EXPCUTOFF

    assert result.method.int3c2e_expcutoff == INT3C_EXPCUTOFF  # libcint screening, recorded
    assert result.timings["orbital_check"] >= 0 and result.environment is None  # Python API
    verbose = result.summary(verbose=True)
    assert "backend pytorch" in verbose and "calls" in verbose and "time" in verbose


@pytest.mark.parametrize("atom, formula", [
    ("C 0 0 0; O 0 0 1.13", "CO"),
    ("C 0 0 0; H 0 0 1.09; H 1.03 0 -0.36; H -0.51 0.89 -0.36; H -0.51 -0.89 -0.36", "CH4"),
    ("O 0 0 0; H 0 0.76 0.59; H 0 -0.76 0.59", "H2O"),
    ("Cl 0 0 0; H 0 0 1.27", "ClH"),
])
def test_the_formula_is_in_hill_order_with_or_without_hydrogen(atom, formula):
    """Carbon first, then hydrogen when there is any, then the rest alphabetically; without
    carbon, all alphabetically. A molecule with carbon and no hydrogen once lost its computed
    result to a KeyError here."""
    from dfmp2.api import _molecule_info

    assert _molecule_info(gto.M(atom=atom, basis="sto-3g", verbose=0)).formula == formula


def test_a_memory_budget_beyond_the_machine_gets_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        dfmp2.run("H 0 0 0; H 0 0 0.74", basis="sto-3g", max_memory=10**9)
    assert "more than this machine's" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        dfmp2.run("H 0 0 0; H 0 0 0.74", basis="sto-3g", max_memory=100)
    assert "more than this machine's" not in caplog.text


@pytest.mark.parametrize("kwargs, message", [
    ({"progress": 5}, "progress must be a function of"),
    ({"progress": lambda: None}, "progress must be a function of"),
    ({"environment": "x"}, "environment must be a dict"),
    ({"environment": {"k": object()}}, "environment must be JSON data"),
    ({"environment": {"k": float("nan")}}, "environment must be JSON data"),
])
def test_callbacks_and_records_are_checked_before_any_work(kwargs, message, monkeypatch):
    """A progress callback that cannot be called and an environment record the result could
    not print or write used to fail after the SCF, or after the whole run."""
    import dfmp2.api

    monkeypatch.setattr(dfmp2.api, "build_mole", lambda *a, **k: pytest.fail("work began"))
    with pytest.raises(InputError, match=message):
        dfmp2.run("H 0 0 0; H 0 0 0.74", basis="sto-3g", **kwargs)


def test_the_memory_limit_of_a_cgroup_is_found(tmp_path, monkeypatch, caplog):
    from dfmp2.api import _cgroup_limit_mb

    listing = tmp_path / "cgroup"
    root = tmp_path / "sys"
    (root / "job" / "7").mkdir(parents=True)
    (root / "job" / "7" / "memory.max").write_text(f"{512 * 2**20}\n")
    listing.write_text("0::/job/7\n")  # v2, a Slurm-like job path
    assert _cgroup_limit_mb(str(listing), str(root)) == 512
    (root / "job" / "7" / "memory.max").write_text("max\n")
    assert _cgroup_limit_mb(str(listing), str(root)) is None
    (root / "memory" / "slurm").mkdir(parents=True)
    (root / "memory" / "slurm" / "memory.limit_in_bytes").write_text(f"{300 * 2**20}\n")
    listing.write_text("9:name=systemd:/\n4:cpu,memory:/slurm\n")  # v1
    assert _cgroup_limit_mb(str(listing), str(root)) == 300
    assert _cgroup_limit_mb(str(tmp_path / "none"), str(root)) is None
    import dfmp2.api

    monkeypatch.setattr(dfmp2.api, "_cgroup_limit_mb", lambda: 50.0)
    with caplog.at_level(logging.WARNING, logger="dfmp2"):
        dfmp2.run("H 0 0 0; H 0 0 0.74", basis="sto-3g", max_memory=100)
    assert "more than the 50 MB limit of this process's cgroup" in caplog.text


def test_a_potential_set_on_the_scf_object_itself_is_part_of_its_fock_matrix():
    """``mf.get_veff`` replaced on a DF-RHF object (a user's added potential, here a uniform
    shift 0.02 S, which moves every orbital energy alike): the orbital check asks the object
    for its Fock matrix instead of building dfmp2's own, and the energy is that of the plain
    SCF (the shift cancels in MP2)."""

    mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
    plain = scf.RHF(mol).density_fit().run(conv_tol=1e-11)
    shifted = scf.RHF(mol).density_fit()
    base, shift = shifted.get_veff, 0.02 * mol.intor("int1e_ovlp")

    def get_veff(mol_=None, dm=None, *args, **kwargs):
        v = base(mol_, dm, *args, **kwargs)
        return v + shift  # RHF tags nothing its energy needs

    shifted.get_veff = get_veff
    shifted.run(conv_tol=1e-11)
    ours = dfmp2.DFMP2(shifted).run()
    assert ours.e_corr == pytest.approx(dfmp2.DFMP2(plain).run().e_corr, abs=TOL_FP64)


def test_singly_occupied_orbitals_in_rhf_are_refused_as_an_open_shell(water_rhf):
    opened = water_rhf.copy()
    opened.mo_occ = water_rhf.mo_occ.copy()
    opened.mo_occ[4], opened.mo_occ[5] = 1.0, 1.0
    with pytest.raises(OrbitalError, match=r"it holds 1.0 \(whole numbers this reference type "
                                           r"cannot hold: .*UHF or ROHF"):
        dfmp2.DFMP2(opened, backend="pytorch").run()


def test_a_spin_state_set_through_mf_nelec_is_the_one_recorded():
    """PySCF lets ``mf.nelec`` override the molecule's 2S: O2's triplet from a molecule built
    as a singlet is recorded as a triplet, its <S^2> against S(S+1) = 2."""
    mol = gto.M(atom="O 0 0 0; O 0 0 1.21", basis="cc-pvdz", verbose=0)
    mf = scf.UHF(mol)
    mf.nelec = np.array([9, 7])  # PySCF takes an array too
    mf.conv_tol = 1e-10
    result = dfmp2.DFMP2(mf.run()).run().result
    assert result.molecule.multiplicity == 3 and result.molecule.nelectron == 16
    assert abs(result.scf.s2_deviation) < 0.1 and "multiplicity 3" in result.summary()
    assert json.loads(result.to_json())["molecule"]["molecular_multiplicity"] == 3


def test_orbitals_of_a_nearly_dependent_basis_are_refused_with_what_to_do(monkeypatch):
    """PySCF's removal of near-zero overlap eigenvalues turned off: the SCF's own orbitals are
    not orthonormal to 1e-8 (H4 at 0.35 Angstrom in aug-cc-pVTZ, smallest eigenvalue 1.3e-9),
    and the refusal names the basis's linear dependency, not the orbitals."""
    from pyscf.scf import hf

    if not hasattr(hf, "remove_overlap_zero_eigenvalue"):
        pytest.skip("this PySCF has no remove_overlap_zero_eigenvalue switch")
    monkeypatch.setattr(hf, "remove_overlap_zero_eigenvalue", False)
    mol = gto.M(atom="H 0 0 0; H 0 0 0.35; H 0 0 0.7; H 0 0 1.05", basis="aug-cc-pvtz",
                verbose=0)
    mf = scf.RHF(mol).density_fit().run(conv_tol=1e-11)
    with pytest.raises(OrbitalError, match=r"not orthonormal.*nearly linearly dependent "
                                           r"\(smallest overlap eigenvalue 1\.\de-09\)"):
        dfmp2.DFMP2(mf, auxbasis="aug-cc-pvtz-ri").run()


def test_with_df_of_the_same_atoms_written_another_way_is_taken():
    """PySCF's idiom ``pt.with_df = df.DF(mol, ...)`` with a Mole of the same atoms given as
    arrays or as a string: the same molecule (its atom input is not compared); moved atoms
    are another."""
    mol = gto.M(atom=[("O", np.zeros(3)), ("H", np.array([0, 0.757, 0.587])),
                      ("H", np.array([0, -0.757, 0.587]))], basis="sto-3g", verbose=0)
    mf = scf.RHF(mol).run(conv_tol=1e-11)
    same = gto.M(atom=WATER, basis="sto-3g", verbose=0)
    pt = dfmp2.DFMP2(mf)
    pt.with_df = df.DF(same, auxbasis="def2-svp-ri")
    assert pt.run().e_corr == pytest.approx(
        dfmp2.DFMP2(mf, auxbasis="def2-svp-ri").run().e_corr, abs=TOL_FP64)
    moved = gto.M(atom="O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.6", basis="sto-3g", verbose=0)
    pt.with_df = df.DF(moved, auxbasis="def2-svp-ri")
    with pytest.raises(InputError, match="with_df was built for another molecule"):
        pt.run()


@pytest.mark.parametrize("kwargs, message", [
    ({"device": "cpu", "device_memory": 100}, "--device-memory sets the budget of a CUDA"),
    ({"backend": "pytorch", "nki_target": "trn2"}, "--nki-target trn2 .* contradicts"),
    ({"scratch_dir": " "}, "scratch_dir .* is empty"),
    ({"threads": np.int64(0)}, "threads must be a whole number from 1 to 4096"),
    # values that crashed deep inside, or were taken for "not given"
    ({"threads": 10**30}, "threads must be a whole number from 1 to 4096, got 1000"),
    ({"charge": 10**30}, r"charge 1000\d+ is beyond any molecule"),
    ({"charge": -10**30}, r"charge -1000\d+ is beyond any molecule"),
    ({"spin": 10**30}, r"spin 1000\d+ is beyond any molecule"),
    ({"scratch_dir": 1.0}, "scratch_dir must be a directory path .* got 1.0"),
    ({"scratch_dir": b"/tmp"}, "scratch_dir must be a directory path .* got b'/tmp'"),
    ({"scratch_dir": 0}, "scratch_dir must be a directory path .* got 0"),
    ({"scratch_dir": False}, "scratch_dir must be a directory path .* got False"),
    ({"scf_auxbasis": 0}, r"scf_auxbasis \(--scf-auxbasis\) must be a basis-set name .* got 0"),
    ({"scf_auxbasis": {}}, "the SCF fitting basis {} has no functions"),
    ({"chkfile": " "}, "chkfile must be a file path"),
])
def test_settings_that_would_change_nothing_are_refused(kwargs, message):
    with pytest.raises(InputError, match=message):
        dfmp2.run(WATER, basis="sto-3g", **kwargs)


def test_numpy_integers_are_numbers_everywhere():
    from dfmp2.options import Options

    options = Options(device_memory=np.int64(100), xc="b2plyp", grid=np.int64(2))
    assert options.device_memory == 100 and type(options.device_memory) is int
    assert dfmp2.run(WATER, basis="sto-3g", threads=np.int64(1)).e_corr < 0


def test_a_qcschema_file_given_to_run_points_to_run_qcschema(tmp_path):
    path = tmp_path / "inp.json"
    path.write_text('{"schema_name": "qcschema_input"}\n')
    with pytest.raises(InputError, match=r"this is JSON; .* dfmp2.run_qcschema\(path\)"):
        dfmp2.run(str(path))
    with pytest.raises(InputError, match="got dict; a QCSchema AtomicInput runs with"):
        dfmp2.run({"schema_name": "qcschema_input"})


def test_dfmp2_refuses_its_settings_when_built_and_reads_pyscfs_attributes(water_rhf):
    for kwargs, message in (({"bogus": 1}, "DFMP2 has no setting 'bogus'"),
                            ({"basis": "sto-3g"}, "basis belongs to the SCF's molecule"),
                            ({"max_memory": "x"}, "max_memory must be an integer")):
        with pytest.raises(InputError, match=message):
            dfmp2.DFMP2(water_rhf, **kwargs)  # at construction, not at run()
    pt = dfmp2.DFMP2(water_rhf)
    assert pt.converged is False and pt.mo_coeff is water_rhf.mo_coeff
    assert pt.mo_energy is water_rhf.mo_energy and pt.mo_occ is water_rhf.mo_occ
    assert pt.run().converged is True


def test_nocc_and_nmo_count_the_active_orbitals_as_pyscf_does(water_rhf, oh_rohf):
    from pyscf import mp

    for frozen in (None, 1, [0, 23]):
        ours, theirs = dfmp2.DFMP2(water_rhf, frozen=frozen), mp.MP2(water_rhf, frozen=frozen)
        assert (ours.nocc, ours.nmo) == (theirs.nocc, theirs.nmo)
    assert (dfmp2.DFMP2(water_rhf, frozen_core=True).nocc, dfmp2.DFMP2(water_rhf).nmo) == (4, 24)
    uhf = scf.UHF(oh_rohf.mol).run(conv_tol=1e-10)
    for frozen in (None, 1, [[0], [0, 1]]):
        ours, theirs = dfmp2.DFMP2(uhf, frozen=frozen), mp.UMP2(uhf, frozen=frozen)
        assert (ours.nocc, ours.nmo) == (tuple(theirs.nocc), tuple(theirs.nmo))
    ours, theirs = dfmp2.DFMP2(oh_rohf, frozen=1), mp.MP2(oh_rohf, frozen=1)  # PySCF: as UHF
    assert (ours.nocc, ours.nmo) == (tuple(theirs.nocc), tuple(theirs.nmo)) == ((4, 3), (18, 18))
    with pytest.raises(InputError, match="the SCF object has no orbitals yet"):
        dfmp2.DFMP2(scf.RHF(water_rhf.mol)).nocc


@pytest.mark.parametrize("change, message", [
    (lambda m: setattr(m, "basis", "cc-pvdz"), "were changed after mol.build()"),
    (lambda m: setattr(m, "nelectron", 8), "nelectron 8 contradicts its charge 0"),
    (lambda m: setattr(m, "basis", "cc-pvdzz"), "do not build any more"),
])
def test_a_mole_changed_after_its_build_is_refused(change, message):
    """Its integral tables are of one molecule and its settings of another: the energy was the
    tables' (STO-3G, 8 electrons) and the record the settings' (cc-pVDZ, neutral)."""
    from pyscf import gto

    mol = gto.M(atom=WATER, basis="sto-3g", verbose=0)
    change(mol)
    with pytest.raises(InputError, match=re.escape(message)):
        dfmp2.run(mol)


def test_a_mole_with_a_fractional_charge_is_refused():
    from pyscf import gto

    with pytest.raises(InputError, match="the given Mole's charge must be an integer, got 0.5"):
        dfmp2.run(gto.Mole(atom=WATER, basis="sto-3g", charge=0.5))


def test_a_built_mole_whose_geometry_file_is_gone_still_runs(tmp_path):
    """Its tables are what runs; the file it was read from cannot be read again to compare
    (it was refused as changed after its build)."""
    from pyscf import gto

    path = tmp_path / "w.xyz"
    path.write_text("3\n\nO 0 0 0\nH 0 0.757 0.587\nH 0 -0.757 0.587\n")
    mol = gto.M(atom=str(path), basis="sto-3g", verbose=0)
    path.unlink()
    assert dfmp2.run(mol).e_corr < 0


def test_the_readme_s_python_names_are_reachable_from_the_package():
    """README: dfmp2.plot.plot_pair_energies(...) after `import dfmp2`; every error class a
    run raises under dfmp2.*."""
    from dfmp2 import errors

    assert callable(dfmp2.plot.plot_pair_energies)
    for name in ("InputError", "OrbitalError", "PrecisionError", "ConvergenceError",
                 "ResourceError", "BackendUnavailableError", "UnsupportedShapeError"):
        assert getattr(dfmp2, name) is getattr(errors, name) and name in dfmp2.__all__


@pytest.mark.parametrize("atoms,basis,charge,psi4,pyscf", [
    ("Li 0 0 0; H 0 0 1.6", "cc-pvdz", 0, 1, 0),
    ("Na 0 0 0; H 0 0 1.9", "cc-pvdz", 0, 5, 1),
    ("K 0 0 0; H 0 0 2.24", "def2-svp", 0, 9, 5),
    ("Ga 0 0 0; H 0 0 1.6", "def2-svp", 0, 9, 9),      # 3d correlated in both
    ("Rb 0 0 0; H 0 0 2.4", "def2-svp", 0, 4, 0),      # [Kr] less the ECP's 28 electrons
    ("Au 0 0 0; H 0 0 1.5", "def2-svp", 0, 4, 0),      # [Xe]4f14 less the ECP's 60
    ("Ne 0 0 0", "cc-pvdz", 0, 1, 1),                  # a noble gas is in its own period
    ("Ne 0 0 0; Ne 0 0 3", "cc-pvdz", 0, 2, 2),
    ("He 0 0 0; He 0 0 3", "cc-pvdz", 0, 0, 0),
    ("Ar 0 0 0; " + WATER.replace("0.757", "3.757").replace("0 0 0", "3 0 0", 1),
     "cc-pvdz", 0, 6, 6),
    ("Al 0 0 0", "cc-pvdz", 3, 1, 5),                  # Al3+: no valence left, a shell given back
    (WATER + "; @O 3 0 0", "cc-pvdz", 0, 1, 1),        # a ghost freezes nothing
])
def test_psi4s_frozen_core_rule(atoms, basis, charge, psi4, pyscf):
    """Psi4's FREEZE_CORE TRUE (the previous noble gas, ECP electrons excluded, one shell
    unfrozen where no valence would be left) against PySCF's chemcore table."""
    from pyscf.data.elements import chemcore

    from dfmp2.molecule import build_mole
    from dfmp2.reference import psi4_core_orbitals

    mol = build_mole(atoms, basis=basis, charge=charge, spin=0)
    assert (psi4_core_orbitals(mol), chemcore(mol)) == (psi4, pyscf)


def test_a_core_rule_needs_a_frozen_core():
    with pytest.raises(InputError, match="core_rule='psi4' .* needs frozen_core=True"):
        dfmp2.Options(core_rule="psi4")
    with pytest.raises(InputError, match="core_rule"):
        dfmp2.Options(frozen_core=True, core_rule="orca")


def test_cartesian_functions_on_request_as_gaussian_and_psi4_run_pople_sets():
    """--cartesian gives 6-31G* its 6 d functions (Gaussian's and Psi4's default for the
    6-31G family: 3.7e-3 Eh apart from spherical on water); a Mole keeps its own cart unless
    told, a copy takes the one given; the summary says which ran where others differ."""
    cart = dfmp2.run(WATER, basis="6-31g*", cartesian=True)
    mole = gto.M(atom=WATER, basis="6-31g*", cart=True, verbose=0)
    assert cart.sizes.nbasis == 19 and cart.method.cartesian
    assert cart.e_tot == pytest.approx(dfmp2.run(mole).e_tot, abs=TOL_FP64)
    spherical = dfmp2.run(mole, cartesian=False)
    assert spherical.sizes.nbasis == 18 and mole.cart  # a copy: the caller's Mole is as it was
    assert abs(spherical.e_tot - cart.e_tot) > 1e-3
    assert "(spherical functions; Gaussian and Psi4 run this set Cartesian: --cartesian)" in \
        spherical.summary()
    assert "(Cartesian functions)" in cart.summary()
    assert "functions)" not in dfmp2.run(WATER, basis="sto-3g").summary().split("\n")[1]
    with pytest.raises(InputError, match="cartesian must be True, False or None"):
        dfmp2.Options(cartesian="yes")
    mf = scf.RHF(gto.M(atom=WATER, basis="sto-3g", verbose=0)).run()
    with pytest.raises(InputError, match="cartesian"):
        dfmp2.DFMP2(mf, cartesian=True).run()


def test_quiet_keeps_every_other_threads_output_and_the_streams(capsys):
    """PySCF's printing is kept off the terminal for the thread that runs dfmp2 only: another
    thread's print in the meantime is shown, and the process's streams and warning filters
    are as they were afterwards."""
    import sys
    import threading
    import warnings

    from dfmp2._quiet import quiet

    before = (sys.stdout, sys.stderr, list(warnings.filters))
    entered, release = threading.Event(), threading.Event()
    said = []

    def worker():
        with quiet() as buffer:
            print("hidden")
            entered.set()
            release.wait(10)
        said.append(buffer.getvalue())

    thread = threading.Thread(target=worker)
    thread.start()
    assert entered.wait(10)
    print("shown")
    release.set()
    thread.join()
    out = capsys.readouterr().out
    assert "shown" in out and "hidden" not in out and said == ["hidden\n"]
    assert (sys.stdout, sys.stderr, list(warnings.filters)) == before


def test_quiet_takes_warnings_leaves_streams_it_did_not_make_and_lets_none_be():
    """A warning raised inside goes through sys.stderr into the buffer (no warning filter is
    touched); a stream someone else put in place meanwhile stays; with no console (None
    streams) another thread prints nothing, as without dfmp2, instead of failing."""
    import io
    import subprocess
    import sys

    code = ("import warnings, dfmp2._quiet as q\n"
            "with q.quiet() as b:\n    warnings.warn('PySCF advice')\n"
            "print(repr(b.getvalue()))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert "PySCF advice" in proc.stdout and proc.stderr == ""
    from dfmp2._quiet import quiet

    before = sys.stdout
    theirs = io.StringIO()
    try:
        with quiet():
            sys.stdout = theirs
        assert sys.stdout is theirs
    finally:
        sys.stdout = before
    code = ("import sys, threading, dfmp2._quiet as q\n"
            "sys.stdout = sys.stderr = None\n"
            "inside, done = threading.Event(), threading.Event()\n"
            "def worker():\n    with q.quiet():\n        inside.set(); done.wait(10)\n"
            "t = threading.Thread(target=worker); t.start(); inside.wait(10)\n"
            "print('nowhere'); done.set(); t.join()\n"
            "assert sys.stdout is None and sys.stderr is None\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_runs_in_two_threads_at_once_leave_the_process_as_it_was():
    import sys
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    serial = [dfmp2.run(g, basis="sto-3g").e_tot for g in (WATER, "H 0 0 0; H 0 0 0.74")]
    before = (sys.stdout, sys.stderr, list(warnings.filters))  # the libraries' imports done
    with ThreadPoolExecutor(2) as pool:  # several rounds: the old race needed a few
        both = list(pool.map(lambda g: dfmp2.run(g, basis="sto-3g").e_tot,
                             [WATER, "H 0 0 0; H 0 0 0.74"] * 6))
    assert both == serial * 6
    assert (sys.stdout, sys.stderr, list(warnings.filters)) == before


def test_what_a_workflow_engine_gets_back():
    """Progress counts are Python ints (JSON-ready), the repr is one line, an interruption
    pickles with its signal."""
    import pickle

    from dfmp2.errors import Interrupted

    seen = []
    result = dfmp2.run(WATER, basis="sto-3g", progress=lambda *args: seen.append(args))
    assert seen and all(type(done) is int and type(total) is int for _, done, total in seen)
    json.dumps(seen)
    text = repr(result)
    assert text.startswith("<dfmp2.Result H2O RHF/sto-3g MP2 ") and "\n" not in text
    assert len(text) < 100
    again = pickle.loads(pickle.dumps(Interrupted(15, "SIGTERM")))
    assert (again.signum, again.name, str(again)) == (15, "SIGTERM", "interrupted by SIGTERM")


def test_warnings_as_errors_still_run_what_pyscf_only_advises_on():
    """python -W error: PySCF's basis-set-exchange advice before its fallback (def2-SVP-RI has
    no iodine: an even-tempered set) must not end the run, and before an error it announces
    the run still ends in dfmp2's one line."""
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-W", "error", "-m", "dfmp2", "run",
                               "H 0 0 0; I 0 0 1.609", "-q", *args], capture_output=True,
                              text=True, timeout=300)

    ran = run("--basis", "def2-svp")
    assert ran.returncode == 0, ran.stderr
    expected = dfmp2.run("H 0 0 0; I 0 0 1.609", basis="def2-svp").e_tot  # warnings as usual
    assert float(ran.stdout) == pytest.approx(expected, abs=TOL_FP64)
    refused = run("--basis", "cc-pvdz")
    assert refused.returncode == 1
    assert refused.stderr.strip() == "error: basis 'cc-pvdz': has no functions for element I in " \
                                     "cc-pvdz"
