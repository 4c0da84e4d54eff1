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
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import BackendUnavailableError, InputError

__all__ = [
    "MODES",
    "MIN_NKI_VERSION",
    "TARGETS",
    "DTYPES",
    "DeviceArray",
    "Ledger",
    "NkiDevice",
    "detect_target",
    "probe",
    "prepare",
    "load_kernel",
]

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


#: Per target: ``lnc``, the SPMD programs of one launch (trn2 runs LNC=2: a logical NeuronCore
#: spans two physical cores, told apart by ``nl.program_id``; trn1 has LNC=1), ``cores``, the
#: NeuronCores the host spreads launches over (trn1: the chip's two cores, one launch each;
#: trn2: the one logical core), and ``hbm_bytes``, the device memory of those cores (trn1: 32
#: GiB per chip, 16 per core; trn2: 96 GiB per chip of 8 physical cores, 24 per logical core).
TARGETS = {
    "trn1": {"lnc": 1, "cores": 2, "hbm_bytes": 32 * 1024**3},
    "trn2": {"lnc": 2, "cores": 1, "hbm_bytes": 24 * 1024**3},
}
#: Where the instance type of an EC2 instance is read (on Nitro instances the DMI product name
#: is the instance type, e.g. "trn1.32xlarge").
DMI_PRODUCT_NAME = "/sys/devices/virtual/dmi/id/product_name"


def detect_target(path: str = DMI_PRODUCT_NAME) -> tuple[str | None, str]:
    """``(target, how it was found)`` from the instance type in ``path``: trn1 for
    ``trn1.*``/``trn1n.*``, trn2 for ``trn2.*``/``trn2u.*``; ``(None, why)`` when the file is
    missing or names another instance (the run then takes the cautious defaults; ``--nki-target``
    sets it)."""
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            product = handle.read().strip()
    except OSError as exc:
        return None, f"unknown (cannot read {path}: {exc.strerror}; give --nki-target)"
    family = product.split(".", 1)[0].lower()
    for name in TARGETS:
        if family == name or (family.startswith(name) and family[len(name):].isalpha()):
            return name, f"instance type {product}"
    return None, f"unknown (instance type {product!r} is not trn1 or trn2; give --nki-target)"


#: Share of the cores' device memory that operands kept resident for a run may take (the rest
#: holds the compiled kernels, launch inputs and outputs).
RESIDENT_FRACTION = 0.5


@dataclass
class Ledger:
    """What one run moved between host and device, and what it launched.

    uploaded_bytes / downloaded_bytes : host -> device and device -> host bytes (the data as
    launched: float32, or bfloat16 for the bf16x3 split B; in emulator and simulator modes,
    what hardware would move), cumulative.
    resident_bytes : bytes of the operands kept on the device now (B of the pair stage, kept
    operands not yet released). launches : kernel launches; programs : SPMD programs over all
    launches; core_launches : launches per NeuronCore; program_pairs : pairs the fused energy
    kernels computed per (core, program) slot, in order ``core * lnc + program`` (the balance
    of the pair work; zero-weight pairs inside a launch included).
    """

    uploaded_bytes: int = 0
    downloaded_bytes: int = 0
    resident_bytes: int = 0
    launches: int = 0
    programs: int = 0
    core_launches: list[int] = field(default_factory=list)
    program_pairs: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


#: Element types of the arrays a launch takes and the device keeps, with their bytes: float32
#: (C-contiguous NumPy arrays on the host), and bfloat16 (contiguous CPU ``torch.bfloat16``
#: tensors on the host: NumPy has no bfloat16), which the bf16x3 pair kernels take their split
#: B in, so it crosses to the device at 2 bytes per element.
DTYPES = {"float32": 4, "bfloat16": 2}


def _dtype_name(array) -> str | None:
    """'float32' or 'bfloat16' for a valid host operand (see :data:`DTYPES`), else None."""
    if isinstance(array, np.ndarray):
        return "float32" if array.dtype == np.float32 and array.flags.c_contiguous else None
    if type(array).__module__.startswith("torch") and hasattr(array, "dtype"):
        import torch

        if array.dtype == torch.bfloat16 and array.device.type == "cpu" \
                and array.is_contiguous():
            return "bfloat16"
    return None


def _nbytes(array) -> int:
    return int(np.prod(array.shape)) * DTYPES[_dtype_name(array) or "float32"]


class DeviceArray:
    """An array in device memory (a torch tensor on the XLA device in hardware mode; in
    emulator and simulator modes, whose "device" is host memory, the host array itself: a
    float32 NumPy array or a bfloat16 torch tensor), of element type ``dtype``
    (:data:`DTYPES`).

    Made by :meth:`NkiDevice.upload` or :meth:`NkiDevice.allocate`; :meth:`take` slices it on
    the device (no host transfer)."""

    def __init__(self, data, shape: tuple[int, ...], dtype: str = "float32") -> None:
        self.data = data
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * DTYPES[self.dtype]

    def take(self, index) -> DeviceArray:
        """The sub-array ``self[index]``, made contiguous on the device."""
        part = self.data[index]
        if isinstance(part, np.ndarray):
            part = np.ascontiguousarray(part)
        else:  # a torch tensor (on the XLA device, or a bfloat16 host tensor)
            part = part.contiguous()
        return DeviceArray(part, tuple(part.shape), self.dtype)


class NkiDevice:
    """The NKI device of one run: execution mode, target, launches and the transfer ledger.

    Parameters
    ----------
    mode : one of :data:`MODES`.
    target : 'trn1' or 'trn2' (:data:`TARGETS`); None: the emulated target in emulator mode,
        the instance type's in hardware mode (:func:`detect_target`), else unknown (one program
        per launch, one core, half of trn1's memory: the cautious choice). In emulator mode
        every launch runs under this target's rules (``nki_emulator.target``), whatever the
        emulator's own setting.
    lnc : SPMD programs per launch, instead of the target's (1 models one physical core).

    Cores: the target's in emulator and simulator modes (trn1: 2, the launches alternate); one
    in hardware mode, the process's XLA device (a trn1 chip's second core is reached by a second
    process: one torchrun rank per NeuronCore), with that core's share of the device memory.

    Every operand a launch takes as a NumPy array is uploaded for that launch and counted; a
    :class:`DeviceArray` is already on the device. Nothing here is global: the dispatcher
    makes one per run.
    """

    def __init__(self, mode: str, target: str | None = None, lnc: int | None = None) -> None:
        if mode not in MODES:
            raise InputError(f"unknown NKI execution mode {mode!r}; expected one of "
                             f"{', '.join(MODES)}")
        if target is not None and target not in TARGETS:
            raise InputError(f"unknown NKI target {target!r}; expected one of "
                             f"{', '.join(TARGETS)}")
        self.target_source = "option"
        if target is None and mode == "emulator":
            target = importlib.import_module("dfmp2.nki_emulator").get_target()
            self.target_source = "emulator"
        elif target is None and mode == "hardware":
            target, self.target_source = detect_target()
        elif target is None:
            self.target_source = "unknown (simulator; give --nki-target)"
        self.mode = mode
        self.target = target
        spec = TARGETS[target] if target else {"lnc": 1, "cores": 1,
                                               "hbm_bytes": TARGETS["trn1"]["hbm_bytes"] // 2}
        self.lnc = spec["lnc"] if lnc is None else int(lnc)
        if not 1 <= self.lnc <= spec["lnc"]:
            raise InputError(f"LNC={lnc} on {target or 'an unknown target'} (at most "
                             f"{spec['lnc']})")
        # A process launches on its one XLA device, one NeuronCore: in hardware mode trn1's
        # second core is another process's (a second torchrun rank), so this device has one.
        # The emulator and simulator model the target's cores as one host spreads launches.
        self.cores = 1 if mode == "hardware" else spec["cores"]
        self.resident_budget = int(spec["hbm_bytes"] * self.cores // spec["cores"]
                                   * RESIDENT_FRACTION)
        self.ledger = Ledger(core_launches=[0] * self.cores,
                             program_pairs=[0] * (self.cores * self.lnc))
        self._xla = None
        self._kept: dict[int, list] = {}  # storage address -> [tensor, version, {layout: array}]
        self._turn = 0  # the next core a block of launches goes to

    def next_core(self) -> int:
        """The NeuronCore the next block of launches goes to: the cores in turn."""
        core = self._turn % self.cores
        self._turn += 1
        return core

    # -- operands kept for the run ------------------------------------------------------------
    def keep(self, tensor) -> None:
        """Mark a host torch tensor that many launches of the run read (the fit's ``L^{-T}``,
        the transform's coefficients): the kernel layouts of it and of its views are uploaded
        once, on first use (:meth:`kept`), and reused while the tensor is unchanged. The
        tensor is referenced until :meth:`release`."""
        self.release(tensor)
        self._kept[tensor.untyped_storage().data_ptr()] = [tensor, tensor._version, {}]

    def release(self, tensor) -> None:
        """Drop a kept tensor and its device copies (their bytes leave ``resident_bytes``)."""
        entry = self._kept.pop(tensor.untyped_storage().data_ptr(), None)
        if entry is not None:
            self._drop(entry[2])

    def _drop(self, layouts: dict) -> None:
        self.ledger.resident_bytes -= sum(array.nbytes for array in layouts.values())
        layouts.clear()

    def kept(self, tensor, transpose: bool, make) -> DeviceArray | None:
        """The device copy of ``make()`` (the float32 kernel layout of ``tensor``, transposed
        or not) when ``tensor`` is a kept tensor or a view of one; None otherwise, or when the
        copy would pass :attr:`resident_budget` (the launch then uploads it). A change to the
        kept tensor (its version counter) drops the copies made before it."""
        entry = self._kept.get(tensor.untyped_storage().data_ptr())
        if entry is None:
            return None
        base, version, layouts = entry
        if base._version != version:  # written in place since: the old layouts are stale
            self._drop(layouts)
            entry[1] = base._version
        key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), transpose)
        if key not in layouts:
            nbytes = tensor.numel() * 4
            if self.ledger.resident_bytes + nbytes > self.resident_budget:
                return None
            layouts[key] = self.upload(make())
        return layouts[key]

    # -- placement --------------------------------------------------------------------------
    def upload(self, array: np.ndarray) -> DeviceArray:
        """Place a host operand (:data:`DTYPES`) on the device for the run (counted once)."""
        dtype = _check_operand("upload", array)
        self.ledger.uploaded_bytes += _nbytes(array)
        self.ledger.resident_bytes += _nbytes(array)
        return DeviceArray(self._to_device(array), array.shape, dtype)

    def allocate(self, shape: tuple[int, ...], dtype: str = "float32") -> DeviceArray:
        """A zero array of ``dtype`` (:data:`DTYPES`) on the device (no host transfer), filled
        by :meth:`write`."""
        if dtype not in DTYPES:
            raise InputError(f"allocate: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        if self.mode == "hardware" or dtype == "bfloat16":
            import torch

            data = torch.zeros(shape, dtype=getattr(torch, dtype),
                               device=self._xla_device() if self.mode == "hardware" else "cpu")
        else:
            data = np.zeros(shape, dtype=np.float32)
        self.ledger.resident_bytes += int(np.prod(shape)) * DTYPES[dtype]
        return DeviceArray(data, shape, dtype)

    def write(self, target: DeviceArray, index, array: np.ndarray) -> None:
        """Upload ``array`` (of ``target``'s dtype) into ``target[index]`` (counted)."""
        dtype = _check_operand("write", array)
        if dtype != target.dtype:
            raise InputError(f"write: a {dtype} array into a {target.dtype} device array")
        self.ledger.uploaded_bytes += _nbytes(array)
        target.data[index] = self._to_device(array)

    # -- launch -----------------------------------------------------------------------------
    def launch(self, kernel, args: tuple, grid: int = 1, core: int = 0) -> tuple[np.ndarray, ...]:
        """Run ``kernel`` on ``args`` (host operands, :data:`DTYPES`, uploaded for this
        launch, or :class:`DeviceArray`) as ``grid`` SPMD programs (``kernel[grid]``, at most
        :attr:`lnc`) on NeuronCore ``core``; return its outputs as float32 NumPy arrays."""
        if not 1 <= grid <= self.lnc:
            raise InputError(f"a launch of {grid} programs on {self.target or 'this device'} "
                             f"(LNC={self.lnc})")
        if not 0 <= core < self.cores:
            raise InputError(f"NeuronCore {core} of {self.cores}")
        data = []
        for index, arg in enumerate(args):
            if isinstance(arg, DeviceArray):
                data.append(arg.data)
                continue
            _check_operand(f"kernel argument {index}", arg)
            self.ledger.uploaded_bytes += _nbytes(arg)
            data.append(self._to_device(arg))
        if self.mode == "simulator":
            data = [_simulator_array(arg) for arg in data]
        call = kernel[grid] if grid > 1 else kernel
        if self.mode == "simulator":
            call = importlib.import_module("nki").simulate(call)
        if self.mode == "emulator" and self.target is not None:
            with importlib.import_module("dfmp2.nki_emulator").target(self.target):
                result = call(*data)
        else:
            result = call(*data)
        outputs = result if isinstance(result, tuple) else (result,)
        host = tuple(np.asarray(out if isinstance(out, np.ndarray) else out.cpu().numpy(),
                                dtype=np.float32) for out in outputs)
        self.ledger.downloaded_bytes += sum(out.nbytes for out in host)
        self.ledger.launches += 1
        self.ledger.programs += grid
        self.ledger.core_launches[core] += 1
        return host

    def as_dict(self) -> dict:
        """The record of the run's device use (for the result and JSON)."""
        return {"mode": self.mode, "target": self.target, "target_source": self.target_source,
                "lnc": self.lnc, "cores": self.cores,
                "resident_budget_bytes": self.resident_budget, **self.ledger.as_dict()}

    def _to_device(self, array):
        if self.mode != "hardware":
            return array
        import torch

        tensor = torch.from_numpy(array) if isinstance(array, np.ndarray) else array
        return tensor.to(self._xla_device())

    def _xla_device(self):
        """The XLA device of hardware mode (untested here: no Neuron device)."""
        if self._xla is None:
            import torch_xla

            if hasattr(torch_xla, "device"):
                self._xla = torch_xla.device()
            else:  # older torch-xla
                import torch_xla.core.xla_model as xm

                self._xla = xm.xla_device()
        return self._xla


def _check_operand(where: str, array) -> str:
    """The dtype name of a valid host operand (:data:`DTYPES`); raise otherwise."""
    dtype = _dtype_name(array)
    if dtype is None:
        got = getattr(array, "dtype", type(array).__name__)
        raise InputError(f"{where} must be a C-contiguous float32 NumPy array or a contiguous "
                         f"CPU torch.bfloat16 tensor, got {got} of {type(array).__name__}")
    return dtype


def _simulator_array(data):
    """``nki.simulate`` takes NumPy arrays: a bfloat16 torch tensor becomes an ``ml_dtypes``
    bfloat16 array of the same bits (the real ``nki`` uses ml_dtypes for bfloat16; not
    verified here: no real nki)."""
    if isinstance(data, np.ndarray):
        return data
    import torch

    try:
        import ml_dtypes
    except ImportError as exc:
        raise BackendUnavailableError(
            "bfloat16 operands in simulator mode need ml_dtypes (pip install ml_dtypes)"
        ) from exc
    return data.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
