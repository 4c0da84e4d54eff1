"""install()/uninstall(): aliases only while installed, never over a real nki."""

from __future__ import annotations

import sys
import types

import pytest

from dfmp2 import nki_emulator as emu

pytestmark = pytest.mark.nki_emulated

NAMES = ("nki", "nki.isa", "nki.language")


@pytest.fixture(autouse=True)
def _no_leak():
    """Each test starts uninstalled; afterwards no alias is left (a prior install is restored)."""
    was_installed = emu.is_installed()
    emu.uninstall()
    yield
    emu.uninstall()
    for name in NAMES:
        module = sys.modules.get(name)
        assert module is None or not getattr(module, "__dfmp2_emulator__", False)
    if was_installed:
        emu.install()


def test_aliases_exist_only_while_installed():
    assert "nki" not in sys.modules
    emu.install()
    try:
        assert emu.is_installed()
        for name in NAMES:
            assert sys.modules[name].__dfmp2_emulator__ is True
        import nki
        import nki.isa as nisa
        import nki.language as nl

        assert nisa.nc_matmul is emu.isa.nc_matmul
        assert nl.ndarray is emu.language.ndarray
        assert nki.jit is emu.jit
        assert nki.isa is nisa and nki.language is nl
    finally:
        emu.uninstall()
    for name in NAMES:
        assert name not in sys.modules
    assert not emu.is_installed()


def test_install_is_idempotent_and_context_manager_restores():
    with emu.installed():
        emu.install()
        assert sys.modules["nki"].__dfmp2_emulator__
        with emu.installed():
            assert emu.is_installed()
        assert emu.is_installed(), "inner context must not uninstall the outer installation"
    assert "nki" not in sys.modules


def test_module_importing_nki_at_import_time_works_after_install(tmp_path, monkeypatch):
    source = (
        "import nki\nimport nki.isa as nisa\nimport nki.language as nl\n"
        "@nki.jit\n"
        "def k(x):\n"
        "    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)\n"
        "    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)\n"
        "    nisa.dma_copy(dst=t, src=x)\n"
        "    nisa.dma_copy(dst=out, src=t)\n"
        "    return out\n"
    )
    (tmp_path / "emu_import_probe.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    import numpy as np

    with emu.installed():
        import emu_import_probe

        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(emu_import_probe.k(x), x)
    sys.modules.pop("emu_import_probe", None)


def test_refuses_to_install_over_a_real_nki(monkeypatch):
    fake = types.ModuleType("nki")
    fake.__version__ = "0.3.0"
    monkeypatch.setitem(sys.modules, "nki", fake)
    available, reason = emu.real_nki_available()
    assert available and "0.3.0" in reason
    with pytest.raises(RuntimeError, match="real NKI is present"):
        emu.install()
    assert sys.modules["nki"] is fake
    assert not emu.is_installed()


def test_newer_real_nki_is_also_refused(monkeypatch):
    fake = types.ModuleType("nki")
    fake.__version__ = "0.6.0"
    monkeypatch.setitem(sys.modules, "nki", fake)
    with pytest.raises(RuntimeError):
        emu.install()


def test_placeholder_nki_counts_as_absent(monkeypatch):
    # sys.modules[name] = None makes "import nki" raise ImportError, like the PyPI placeholder.
    monkeypatch.setitem(sys.modules, "nki", None)
    available, reason = emu.real_nki_available()
    assert not available and "import nki failed" in reason
    emu.install()
    assert sys.modules["nki"].__dfmp2_emulator__
    emu.uninstall()
    assert sys.modules["nki"] is None, "uninstall restores the displaced entry"


def test_old_nki_is_not_real_and_is_restored(monkeypatch):
    old = types.ModuleType("nki")
    old.__version__ = "0.2.0"
    monkeypatch.setitem(sys.modules, "nki", old)
    assert emu.real_nki_available()[0] is False
    emu.install()
    assert sys.modules["nki"] is not old
    emu.uninstall()
    assert sys.modules["nki"] is old


def test_real_nki_available_reports_emulator_alias():
    with emu.installed():
        available, reason = emu.real_nki_available()
    assert not available and "emulator" in reason


def test_no_real_nki_here():
    available, reason = emu.real_nki_available()
    assert not available, reason
    assert "nki" not in sys.modules


def test_target_setting_and_context():
    assert emu.get_target() == "trn2"
    with emu.target("trn1"):
        assert emu.get_target() == "trn1"
        # usable bytes per partition (KLR's values) of the documented 192 and 224 KiB
        assert emu.language.tile_size.total_available_sbuf_size == 180224 < 192 * 1024
    assert emu.get_target() == "trn2"
    assert emu.language.tile_size.total_available_sbuf_size == 212984 < 224 * 1024
    with pytest.raises(ValueError, match="trn1"):
        emu.set_target("trn3")
