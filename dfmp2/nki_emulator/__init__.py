"""A NumPy emulator of the NKI 0.3.0 subset that dfmp2's kernels use (test and development only).

It is never installed under the name ``nki``. :func:`install` aliases ``nki``, ``nki.isa`` and
``nki.language`` in ``sys.modules`` to the emulator, and only when no real ``nki`` (>= 0.3.0)
imports; :func:`uninstall` removes the aliases and restores what was there before::

    from dfmp2 import nki_emulator
    with nki_emulator.installed():
        import nki, nki.isa as nisa, nki.language as nl
        ...                                  # @nki.jit kernels run on NumPy
        with nki_emulator.trace() as tr:
            out = kernel(a_np, b_np)         # returns numpy arrays
        tr.count("nc_matmul")

The emulator is stricter than the official simulator: partition and matmul free-size limits,
fp32 PSUM matmul output within one 2 KiB bank, the PSUM budget (8 banks per partition) and the
SBUF budget per partition (:func:`set_target`), reads of never-written memory, ``accumulate``
misuse, no float64, no tile broadcasting, no PSUM source for ``dma_copy``, and in SPMD grid
launches (``kernel[2]`` on trn2, :mod:`._jit`) races between programs on shared outputs. Each
instruction module documents its checks. It never measures performance: traces
(:func:`trace`) record structure only (``Record.program`` tells the programs of a grid launch
apart). The module objects carry ``__dfmp2_emulator__ = True`` so that callers can tell them
from the real ``nki``.

Dynamic loops (``nl.dynamic_range``, ``nisa.VirtualRegister`` and the ``nisa.register_*``
instructions) and ``.ap`` access patterns on HBM tensors with a ``scalar_offset`` (as
``nisa.dma_copy`` operands) are emulated: the body of a dynamic loop runs once per iteration
but counts once toward the launch's instruction bound (``Record.static``); see
:func:`.language.dynamic_range`, :mod:`._register` and :meth:`._tensor.NkiTensor.ap`.

Not emulated: ``.ap`` on SBUF/PSUM tensors, ``.ap`` with ``vector_offset`` (indirect DMA) or a
``dtype`` reinterpretation, dynamic ``while`` loops, ``view(dtype)``, fp8/tf32 types,
multi-dimensional launch grids, bitvec/logical operators, the ``nl`` compute wrappers, and
every ``nisa`` instruction not listed in :mod:`.isa`.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator

from . import _root, _state, isa, language
from ._context import EmulatorError
from ._jit import EmulatedKernel, jit, simulate
from ._trace import Record, Trace, trace

__dfmp2_emulator__ = True

__all__ = [
    "ALIASES",
    "EmulatedKernel",
    "EmulatorError",
    "Record",
    "Trace",
    "get_target",
    "install",
    "installed",
    "is_installed",
    "isa",
    "jit",
    "language",
    "real_nki_available",
    "set_target",
    "simulate",
    "target",
    "trace",
    "uninstall",
]

#: sys.modules names that install() sets, and the emulator modules they point to.
ALIASES = {"nki": _root, "nki.isa": isa, "nki.language": language}
_MIN_VERSION = (0, 3, 0)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in str(text).split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def real_nki_available() -> tuple[bool, str]:
    """Whether a real ``nki`` >= 0.3.0 imports here, with the reason.

    The PyPI placeholder named ``nki`` raises ImportError on import, so it counts as absent.
    While the emulator is installed, the answer is ``(False, ...)`` (install refuses to run
    over a real nki).
    """
    module = sys.modules.get("nki")
    if module is not None and getattr(module, "__dfmp2_emulator__", False):
        return False, "nki is the dfmp2 emulator alias (no real nki was present at install)"
    try:
        module = importlib.import_module("nki")
    except ImportError as exc:
        return False, f"import nki failed: {exc}"
    except Exception as exc:  # noqa: BLE001 (a broken install must not crash the caller)
        return False, f"import nki raised {type(exc).__name__}: {exc}"
    if getattr(module, "__dfmp2_emulator__", False):
        return False, "nki is the dfmp2 emulator"
    version = getattr(module, "__version__", None)
    if version is None:
        return False, f"nki at {getattr(module, '__file__', '?')} has no __version__"
    if _version_tuple(version) < _MIN_VERSION:
        return False, f"nki {version} is older than 0.3.0"
    return True, f"nki {version} at {getattr(module, '__file__', '?')}"


def is_installed() -> bool:
    """True while the ``nki`` aliases point to the emulator."""
    return bool(_state.INSTALLED["on"])


def install() -> None:
    """Alias ``nki``, ``nki.isa``, ``nki.language`` to the emulator (idempotent).

    Raises
    ------
    RuntimeError
        If a real ``nki`` >= 0.3.0 imports: the emulator never shadows the real thing.
    """
    if is_installed():
        return
    available, reason = real_nki_available()
    if available:
        raise RuntimeError(
            f"refusing to install the dfmp2 NKI emulator: a real NKI is present ({reason}); "
            "use it (nki.simulate) instead"
        )
    _state.INSTALLED["displaced"] = {
        name: sys.modules[name] for name in ALIASES if name in sys.modules
    }
    for name, module in ALIASES.items():
        sys.modules[name] = module
    _state.INSTALLED["on"] = True


def uninstall() -> None:
    """Remove the aliases and restore whatever ``sys.modules`` held before :func:`install`."""
    if not is_installed():
        return
    displaced = _state.INSTALLED["displaced"]
    for name, module in ALIASES.items():
        if sys.modules.get(name) is module:
            del sys.modules[name]
        if name in displaced:
            sys.modules[name] = displaced[name]
    _state.INSTALLED["displaced"] = {}
    _state.INSTALLED["on"] = False


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Context manager: :func:`install` on entry, :func:`uninstall` on exit (if it installed)."""
    was_installed = is_installed()
    install()
    try:
        yield
    finally:
        if not was_installed:
            uninstall()


def set_target(name: str) -> None:
    """Choose the emulated platform: ``"trn2"`` (gen3, default) or ``"trn1"`` (gen2)."""
    if name not in _state.SBUF_BYTES_PER_PARTITION:
        raise ValueError(f"set_target: expected 'trn1' or 'trn2', got {name!r}")
    _state.TARGET["name"] = name


def get_target() -> str:
    """The emulated platform, ``"trn1"`` or ``"trn2"``."""
    return _state.TARGET["name"]


@contextlib.contextmanager
def target(name: str) -> Iterator[None]:
    """Context manager: emulate ``name`` inside the block, then restore the previous target."""
    previous = get_target()
    set_target(name)
    try:
        yield
    finally:
        set_target(previous)
