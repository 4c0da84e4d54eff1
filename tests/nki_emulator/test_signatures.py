"""Every emulated function has the NKI 0.3.0 signature (names, order, defaults)."""

from __future__ import annotations

import pytest

from dfmp2 import nki_emulator
from dfmp2.nki_emulator import _root, isa, language, signatures

pytestmark = pytest.mark.nki_emulated

CASES = (
    [("nki.isa", name, isa, params) for name, params in signatures.ISA.items()]
    + [("nki.language", name, language, params) for name, params in signatures.LANGUAGE.items()]
    + [
        ("nki.language", name, language, params)
        for name, params in signatures.LANGUAGE_LATER_STUB.items()
    ]
    + [("nki", name, _root, params) for name, params in signatures.NKI.items()]
    + [
        ("nki.language.NkiTensor", name, language.NkiTensor, params)
        for name, params in signatures.TENSOR.items()
    ]
)


@pytest.mark.parametrize(
    "module_name, name, module, expected", CASES, ids=[f"{c[0]}.{c[1]}" for c in CASES]
)
def test_signature_matches_0_3_0_table(module_name, name, module, expected):
    assert signatures.parameters(getattr(module, name)) == expected


def test_every_public_isa_function_is_in_the_table():
    public = {
        name
        for name in isa.__all__
        if callable(getattr(isa, name)) and not isinstance(getattr(isa, name), type)
    }
    assert public == set(signatures.ISA)


def test_enum_members_match_the_stubs():
    assert [m.name for m in isa.engine] == [
        "tensor",
        "vector",
        "scalar",
        "gpsimd",
        "dma",
        "sync",
        "unknown",
    ]
    assert [m.name for m in isa.reduce_cmd] == [
        "idle",
        "reset",
        "reduce",
        "reset_reduce",
        "load_reduce",
    ]
    assert [m.name for m in isa.dge_mode] == ["unknown", "swdge", "hwdge", "none"]
    assert [m.name for m in isa.oob_mode] == ["error", "skip"]
    assert [m.name for m in isa.matmul_perf_mode] == ["none", "double_row"]
    assert [m.name for m in isa.nc_version] == ["gen2", "gen3", "gen4"]


def test_tile_size_and_buffers():
    ts = language.tile_size
    assert (ts.pmax, ts.psum_fmax, ts.gemm_stationary_fmax, ts.gemm_moving_fmax) == (
        128,
        512,
        128,
        512,
    )
    assert language.hbm is language.private_hbm
    assert len({language.sbuf, language.psum, language.private_hbm, language.shared_hbm}) == 4


def test_modules_are_marked_as_emulator():
    for module in (nki_emulator, _root, isa, language):
        assert module.__dfmp2_emulator__ is True
