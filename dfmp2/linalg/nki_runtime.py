"""Where dfmp2's NKI kernels run: availability probe, mode set-up and kernel launch.

Three execution modes run the same kernel source (:mod:`dfmp2.kernels`):

- ``"hardware"``: the real ``nki`` (>= 0.3.0) and a Neuron device; operands go to the XLA device
  through torch-xla and the ``@nki.jit`` kernel is called on them.
- ``"simulator"``: the real ``nki``; the kernel runs through ``nki.simulate(kernel)(*arrays)``
  on NumPy arrays (the official CPU simulator).
- ``"emulator"``: dfmp2's own NumPy emulator (:mod:`dfmp2.nki_emulator`), aliased as ``nki``
  only when the real package is absent. Tests and development only.

Nothing here reads environment variables; the CLI maps its options onto the ``mode`` argument.
"""

from __future__ import annotations

import glob
import importlib
import importlib.util
import re
import sys

import numpy as np

from ..errors import BackendUnavailableError, InputError

__all__ = ["MODES", "MIN_NKI_VERSION", "probe", "prepare", "load_kernel", "run_kernel"]

MODES = ("hardware", "simulator", "emulator")
MIN_NKI_VERSION = (0, 3, 0)
_INSTALL_HINT = (
    "install it with pip install 'dfmp2[nki]' --extra-index-url "
    "https://pip.repos.neuron.amazonaws.com (the PyPI package named nki is a placeholder), "
    "or opt in to dfmp2's NumPy emulator with --nki-emulator (tests and development only)"
)


def _is_emulator(module) -> bool:
    return bool(getattr(module, "__dfmp2_emulator__", False))


def _parse_version(text: str) -> tuple[int, ...]:
    """Leading numeric release of a version string: '0.3.0.dev1+x' -> (0, 3, 0)."""
    parts = []
    for piece in text.split(".")[:3]:
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match.group()))
    return tuple(parts)


def real_nki_version() -> tuple[str | None, str | None]:
    """(version, None) when the real ``nki`` imports, else (None, why not).

    A real import, never "the distribution is installed": the PyPI placeholder installs fine
    and raises ImportError on import. dfmp2's emulator, when it is aliased as ``nki``, is not
    the real package.
    """
    current = sys.modules.get("nki")
    if current is not None and _is_emulator(current):
        return None, "only dfmp2's emulator is loaded under the name nki"
    try:
        module = importlib.import_module("nki")
    except ImportError as exc:
        return None, f"import nki failed: {exc}"
    if _is_emulator(module):
        return None, "only dfmp2's emulator is loaded under the name nki"
    version = getattr(module, "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version("nki")
        except metadata.PackageNotFoundError:
            version = "unknown"
    return str(version), None


def _hardware_missing() -> str | None:
    """None when a Neuron device node and torch-xla are both present, else what is missing."""
    if not glob.glob("/dev/neuron*"):
        return "no /dev/neuron* device"
    if importlib.util.find_spec("torch_xla") is None:
        return "torch_xla is not installed"
    return None


def probe(simulator: bool = False, emulator: bool = False) -> tuple[str | None, str | None]:
    """Which NKI execution mode can run here: ``(mode, None)``, or ``(None, reason)``.

    Parameters
    ----------
    simulator : bool
        Ask for the official simulator (``nki.simulate``) when the real ``nki`` is installed.
    emulator : bool
        Allow dfmp2's NumPy emulator when the real ``nki`` is absent (explicit opt-in).
    """
    version, why = real_nki_version()
    if version is not None:
        if version != "unknown" and _parse_version(version) < MIN_NKI_VERSION:
            return None, f"nki {version} is installed but dfmp2 needs nki >= 0.3.0; {_INSTALL_HINT}"
        if simulator:
            return "simulator", None
        missing = _hardware_missing()
        if missing is None:
            return "hardware", None
        return None, (
            f"nki {version} is installed but no Neuron device / torch-xla was found ({missing}); "
            "use the simulator option"
        )
    if emulator:
        if importlib.util.find_spec("dfmp2.nki_emulator") is None:
            return None, "dfmp2's NKI emulator package (dfmp2.nki_emulator) is missing"
        return "emulator", None
    return None, f"the real nki >= 0.3.0 is not available ({why}); {_INSTALL_HINT}"


def prepare(mode: str) -> None:
    """Make ``import nki`` resolve to what ``mode`` needs; raise if it cannot.

    Idempotent. For ``"emulator"`` this installs dfmp2's emulator (it aliases ``nki`` only when
    the real package is absent).
    """
    if mode not in MODES:
        raise InputError(f"unknown NKI execution mode {mode!r}; expected one of {', '.join(MODES)}")
    if mode == "emulator":
        version, _why = real_nki_version()
        if version is not None:
            raise BackendUnavailableError(
                f"emulator mode was requested but the real nki {version} is installed; use the "
                "simulator or hardware mode"
            )
        emulator = importlib.import_module("dfmp2.nki_emulator")
        emulator.install()
        if not _is_emulator(sys.modules.get("nki")):
            raise BackendUnavailableError(
                "emulator mode was requested but the real nki is installed; use the simulator "
                "or hardware mode"
            )
        return
    version, why = real_nki_version()
    if version is None:
        raise BackendUnavailableError(f"{mode} mode needs the real nki >= 0.3.0: {why}")


def load_kernel(module_name: str, kernel_name: str):
    """Import ``dfmp2.kernels.<module_name>`` (after :func:`prepare`) and return the kernel."""
    module = importlib.import_module(f"dfmp2.kernels.{module_name}")
    return getattr(module, kernel_name)


def run_kernel(kernel, arrays: tuple[np.ndarray, ...], mode: str) -> tuple[np.ndarray, ...]:
    """Launch ``kernel`` on C-contiguous float32 arrays in ``mode``; return its outputs as a
    tuple of float32 NumPy arrays (a single output becomes a 1-tuple)."""
    for index, array in enumerate(arrays):
        if array.dtype != np.float32 or not array.flags.c_contiguous:
            raise InputError(
                f"kernel argument {index} must be C-contiguous float32, got {array.dtype} "
                f"(contiguous={array.flags.c_contiguous})"
            )
    if mode == "emulator":
        result = kernel(*arrays)
    elif mode == "simulator":
        nki = importlib.import_module("nki")
        result = nki.simulate(kernel)(*arrays)
    elif mode == "hardware":
        result = _run_on_xla(kernel, arrays)
    else:
        raise InputError(f"unknown NKI execution mode {mode!r}; expected one of {', '.join(MODES)}")
    outputs = result if isinstance(result, tuple) else (result,)
    return tuple(np.asarray(out, dtype=np.float32) for out in outputs)


def _run_on_xla(kernel, arrays: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """Hardware launch: torch tensors on the XLA device in, NumPy arrays out (untested here)."""
    import torch
    import torch_xla

    if hasattr(torch_xla, "device"):
        device = torch_xla.device()
    else:  # older torch-xla
        import torch_xla.core.xla_model as xm

        device = xm.xla_device()
    args = tuple(torch.from_numpy(array).to(device) for array in arrays)
    result = kernel(*args)
    outputs = result if isinstance(result, tuple) else (result,)
    return tuple(out.cpu().numpy() for out in outputs)
