"""One registry for backend dispatch: ``(op, backend) -> Impl``, and the per-run dispatcher.

The registry is a fixed table built at import, over three implementation backends: ``pytorch``
(torch, CPU or CUDA), ``numpy`` (numpy's/SciPy's BLAS and the compiled pair reduction, for the
ops with matrix products inside: :data:`MATMUL_OPS`) and ``nki``. A :class:`Dispatcher` is
created once per run from a :class:`DispatchPolicy`: it resolves ``auto`` once (nki or pytorch),
resolves the CPU BLAS choice once to the backend that runs each host op (numpy's for the
:data:`MATMUL_OPS` when chosen, else pytorch), then routes every op call, applies the fallback
policy, and records which backend and execution mode ran each op: a record's backend is the
implementation that ran, never a second dispatch below it. Call sites never test for NKI; they
call ``dispatcher.gemm(...)``.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from .._names import BACKENDS, NKI_MATMULS, NKI_TARGETS
from ..errors import (
    BackendUnavailableError,
    InputError,
    KernelError,
    NotPositiveDefiniteError,
    UnsupportedShapeError,
)
from . import torch_ops
from .cpu_blas import CpuBlas, numpy_matmul

log = logging.getLogger(__name__)

__all__ = [
    "BACKENDS",
    "HOST_MODE",
    "HOST_OPS",
    "OPS",
    "DispatchPolicy",
    "Dispatcher",
    "HostOps",
    "Impl",
    "OpRecord",
]

#: Ops that have an implementation per backend.
OPS = ("gemm", "cholesky", "trsm", "trmm", "mp2_pair_sums")
#: Ops that always run on the host in float64 by design (no NKI kernel is planned for them).
HOST_OPS = ("eigh", "pair_sums_from_ovov", "mp2_pair_table")
#: Ops with matrix products inside, implemented on numpy's BLAS too (the ``numpy`` backend,
#: chosen for the host by ``cpu_blas``; see :mod:`dfmp2.linalg.cpu_blas` for why).
MATMUL_OPS = ("gemm", "trmm", "mp2_pair_sums")
#: The execution mode recorded for calls that ran on the host in float64: the :data:`HOST_OPS`,
#: and the calls an NKI run places there on purpose (:meth:`Dispatcher.on_host`).
HOST_MODE = "host"


@dataclass(frozen=True)
class Impl:
    """An implementation of one op on one backend.

    fn : the function (for nki it takes an extra keyword ``mode``).
    supports : returns None, or the limit the given operands exceed.
    """

    fn: Callable
    supports: Callable[..., str | None]


def _always(*_args, **_kwargs) -> None:
    return None


def _lazy_attr(module: str, name: str) -> Callable:
    """``dfmp2.linalg.<module>.<name>`` imported at call time (the nki and numpy backends load
    only when used)."""

    def call(*args, **kwargs):
        return getattr(importlib.import_module(f".{module}", __package__), name)(*args, **kwargs)

    call.__name__ = f"{module}.{name}"
    return call


def _numpy_gemm(a, b, trans_a: bool = False, trans_b: bool = False, out=None):
    """:func:`torch_ops.gemm` with its product on numpy's BLAS (CPU tensors, strided views)."""
    return torch_ops.gemm(a, b, trans_a, trans_b, out, matmul=numpy_matmul)


def _nki_supports(op: str) -> Callable[..., str | None]:
    def check(*args, **options):
        module = importlib.import_module(".nki_ops", __package__)
        return module.SUPPORTS[op](*args, **options)

    return check


_TABLE: dict[tuple[str, str], Impl] = {}
for _op in OPS:
    _TABLE[(_op, "pytorch")] = Impl(getattr(torch_ops, _op), _always)
    _TABLE[(_op, "nki")] = Impl(_lazy_attr("nki_ops", _op), _nki_supports(_op))
for _op in HOST_OPS:
    _TABLE[(_op, "pytorch")] = Impl(getattr(torch_ops, _op), _always)
_TABLE[("gemm", "numpy")] = Impl(_numpy_gemm, _always)
_TABLE[("trmm", "numpy")] = Impl(_lazy_attr("numpy_ops", "trmm"), _always)
_TABLE[("mp2_pair_sums", "numpy")] = Impl(_lazy_attr("numpy_ops", "mp2_pair_sums"), _always)
REGISTRY = MappingProxyType(_TABLE)
#: The implementation backends of the registry.
IMPL_BACKENDS = ("pytorch", "numpy", "nki")


@dataclass(frozen=True)
class DispatchPolicy:
    """How ops are routed. ``backend`` is one of :data:`BACKENDS`.

    nki_simulator : run NKI kernels through the real ``nki.simulate``.
    nki_emulator : allow dfmp2's NumPy emulator when the real ``nki`` is absent (explicit opt-in).
    require_nki : turn every fallback from nki to pytorch into an error.
    cpu_blas : 'auto', 'torch' or 'numpy': the library of the pytorch backend's CPU products.
    nki_matmul : 'fp32' or 'bf16x3': the products of the NKI pair kernels (``mp2_pair_sums``).
    nki_target : 'auto', 'trn1' or 'trn2': the target of the run's ``NkiDevice``.
    """

    backend: str = "auto"
    nki_simulator: bool = False
    nki_emulator: bool = False
    require_nki: bool = False
    cpu_blas: str = "auto"
    nki_matmul: str = "fp32"
    nki_target: str = "auto"

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise InputError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.nki_matmul not in NKI_MATMULS:
            raise InputError(f"unknown NKI matmul precision {self.nki_matmul!r}; choose one of "
                             f"{', '.join(NKI_MATMULS)}")
        if self.nki_target not in NKI_TARGETS:
            raise InputError(f"unknown NKI target {self.nki_target!r}; choose one of "
                             f"{', '.join(NKI_TARGETS)}")


@dataclass
class OpRecord:
    """What ran one op during a run: backend, execution mode, call count, fallback reason.

    host_calls : how many of ``calls`` an NKI run placed on the host in float64 on purpose
    (:meth:`Dispatcher.on_host`), and host_reason why (each distinct reason, joined by '; ').
    An op that ran both on NKI and on the host has backend 'mixed' and mode e.g.
    'emulator+host'.
    """

    backend: str
    mode: str
    calls: int = 0
    fallback: str | None = None
    host_calls: int = 0
    host_reason: str | None = None

    def as_dict(self) -> dict:
        return {"backend": self.backend, "mode": self.mode, "calls": self.calls,
                "fallback": self.fallback, "host_calls": self.host_calls,
                "host_reason": self.host_reason}


def probe_nki(policy: DispatchPolicy) -> tuple[str | None, str | None]:
    """(mode, None) when NKI kernels can run under ``policy``, else (None, reason)."""
    try:
        module = importlib.import_module(".nki_ops", __package__)
    except ImportError as exc:  # the host wrappers themselves failed to import
        return None, f"dfmp2's NKI host wrappers could not be imported: {exc}"
    return module.probe(simulator=policy.nki_simulator, emulator=policy.nki_emulator)


class _NamedOps:
    """The ops by name, with the signatures of :mod:`.torch_ops`; subclasses define ``call``."""

    def call(self, op: str, *args):
        raise NotImplementedError

    def gemm(self, a, b, trans_a: bool = False, trans_b: bool = False, out=None):
        return self.call("gemm", a, b, trans_a, trans_b, out)

    def cholesky(self, a_nn):
        return self.call("cholesky", a_nn)

    def eigh(self, a_nn):
        return self.call("eigh", a_nn)

    def trsm(self, l_nn, b_mn):
        return self.call("trsm", l_nn, b_mn)

    def trmm(self, u_nn, b_mn):
        return self.call("trmm", u_nn, b_mn)

    def mp2_pair_sums(self, ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights,
                      exchange: bool):
        return self.call("mp2_pair_sums", ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, weights,
                         exchange)

    def mp2_pair_table(self, ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, exchange: bool):
        return self.call("mp2_pair_table", ovL_i, ovL_j, eps_i, eps_j, eps_va, eps_vb, exchange)

    def pair_sums_from_ovov(self, ovov, eps_i, eps_j, eps_va, eps_vb, weights, exchange: bool):
        return self.call("pair_sums_from_ovov", ovov, eps_i, eps_j, eps_va, eps_vb, weights,
                         exchange)

    def keep_on_device(self, tensor) -> None:
        """Mark a tensor many op calls of the run read, so a device backend uploads it once
        (host backends: nothing to do)."""

    def release_from_device(self, tensor) -> None:
        """The end of :meth:`keep_on_device` for ``tensor`` (host backends: nothing to do)."""

    def place_pair_operands(self, stores, occ_block: int, in_memory: bool = True):
        """``(stores, occ_block)`` the pair stage reads ``mp2_pair_sums`` operands from, in
        blocks of ``occ_block`` occupied orbitals: a device backend places B on the device once
        (then one block spans each store: the op plans its own launches); host backends return
        both as they are. ``in_memory``: B is held in memory (not out of core)."""
        return stores, occ_block


@dataclass
class Dispatcher(_NamedOps):
    """Routes op calls for one run and records what ran.

    Attributes after construction: ``backend`` (the resolved backend, 'pytorch' or 'nki'),
    ``nki_mode`` ('hardware', 'simulator', 'emulator' or None), ``resolution`` (why),
    ``cpu_blas`` (the resolved CPU BLAS choice), ``host_backend`` (op -> 'numpy' or 'pytorch':
    the backend of each op that runs on the host, resolved once from ``cpu_blas``),
    ``records`` (op name -> :class:`OpRecord`).
    """

    policy: DispatchPolicy = field(default_factory=DispatchPolicy)
    backend: str = field(init=False)
    nki_mode: str | None = field(init=False, default=None)
    resolution: str = field(init=False, default="")
    records: dict[str, OpRecord] = field(init=False, default_factory=dict)
    cpu_blas: CpuBlas = field(init=False)
    host_backend: dict[str, str] = field(init=False)
    nki_device: object = field(init=False, default=None)
    residency: str | None = field(init=False, default=None)
    _host_block: int = field(init=False, default=1)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock, repr=False,
                                  compare=False)

    def __getstate__(self) -> dict:  # a copy or a pickle gets a lock of its own
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __post_init__(self):
        self.cpu_blas = CpuBlas.resolve(self.policy.cpu_blas)
        numpy_blas = self.cpu_blas.choice == "numpy"
        self.host_backend = {op: "numpy" if numpy_blas and op in MATMUL_OPS else "pytorch"
                             for op in OPS + HOST_OPS}
        requested = self.policy.backend
        policy = self.policy
        if requested == "pytorch":
            self.backend, self.resolution = "pytorch", "requested --backend pytorch"
            if policy.require_nki:
                raise BackendUnavailableError(
                    "--require-nki contradicts --backend pytorch; drop one of them"
                )
            modes = [flag for flag, on in (("--nki-emulator", policy.nki_emulator),
                                           ("--simulator", policy.nki_simulator)) if on]
            if modes:  # asked for (or set in the environment): say that they did nothing
                log.warning("%s: --backend pytorch runs no NKI kernel, so %s no effect",
                            " and ".join(modes), "they have" if len(modes) > 1 else "it has")
            return
        mode, reason = probe_nki(policy)
        if mode is not None:
            self.backend, self.nki_mode = "nki", mode
            self.resolution = f"{requested}: NKI kernels run in {mode} mode"
            self.nki_device = importlib.import_module(".nki_runtime", __package__).NkiDevice(
                mode, target=None if policy.nki_target == "auto" else policy.nki_target)
            if policy.nki_simulator and mode != "simulator":
                log.warning("--simulator: the NKI simulator needs the real nki package; the "
                            "kernels run in %s mode instead", mode)
        elif requested == "nki" or policy.require_nki:
            raise BackendUnavailableError(f"the nki backend cannot run: {reason}")
        else:
            self.backend = "pytorch"
            self.resolution = f"auto: NKI unavailable ({reason}); using pytorch"
            # asked for by name: say that they did not apply (--backend nki or --require-nki
            # make this an error)
            unused = [text for text, on in (
                ("--simulator: the NKI simulator cannot run", policy.nki_simulator),
                (f"--nki-matmul {policy.nki_matmul}", policy.nki_matmul != "fp32"),
                (f"--nki-target {policy.nki_target}", policy.nki_target != "auto")) if on]
            if unused:
                log.warning("%s: no NKI kernel runs (%s); the run uses pytorch (--backend nki "
                            "or --require-nki make this an error)", "; ".join(unused), reason)
        log.info("backend %s", self.resolution)

    # -- dispatch ---------------------------------------------------------------------------
    def call(self, op: str, *args):
        """Run ``op`` on the resolved backend, falling back to pytorch where the policy allows.

        Raises :class:`KernelError` when an NKI kernel crashes (not a shape refusal) and the
        policy allows no fallback (``--backend nki`` or ``--require-nki``).
        """
        if op in HOST_OPS or self.backend == "pytorch":
            return self._run_host(op, args, mode=HOST_MODE if op in HOST_OPS else "pytorch")
        impl = REGISTRY[(op, "nki")]
        extra = {"products": self.policy.nki_matmul} if op == "mp2_pair_sums" else {}
        limit = impl.supports(*args, **extra)
        if limit is not None:
            return self._fall_back(op, args, f"shape not supported by the NKI kernel: {limit}")
        try:
            result = impl.fn(*args, mode=self.nki_mode, device=self.nki_device, **extra)
        except (NotPositiveDefiniteError, InputError):
            raise  # a property of the operands, not of the backend: the caller handles it
        except Exception as exc:  # made visible by _fall_back (WARNING + record) or KernelError
            crash = f"{type(exc).__name__}: {_first_line(exc)}"
            if self.policy.require_nki or self.policy.backend == "nki":
                raise KernelError(
                    f"the NKI {op} kernel crashed (backend nki, {self.nki_mode} mode): {crash}; "
                    "rerun with --backend pytorch"
                ) from exc
            return self._fall_back(op, args, f"NKI kernel failed: {crash}")
        self._record(op, "nki", self.nki_mode)
        return result

    def on_host(self, reason: str) -> HostOps:
        """The same ops, run on the host in float64 by the pytorch implementations whatever the
        resolved backend, each call recorded with ``reason`` (:attr:`OpRecord.host_reason`).
        For stages an NKI run keeps off the device on purpose (precision, see
        :mod:`dfmp2.pipeline`); operands must be float64."""
        return HostOps(self, reason)

    def run_on_host(self, op: str, args: tuple, reason: str):
        """Run ``op`` by its pytorch implementation in host mode and record ``reason``."""
        result = self._run_host(op, args, mode=HOST_MODE)
        record = self.records[op]
        record.host_calls += 1
        if reason not in (record.host_reason or "").split("; "):  # each distinct reason once
            record.host_reason = f"{record.host_reason}; {reason}" if record.host_reason \
                else reason
        return result

    def keep_on_device(self, tensor) -> None:
        """On NKI: the run's device uploads ``tensor`` (and the views of it the kernels take)
        once, instead of once per launch."""
        if self.nki_device is not None:
            self.nki_device.keep(tensor)

    def release_from_device(self, tensor) -> None:
        """On NKI: the device drops ``tensor``'s copies (the stage that read it is over)."""
        if self.nki_device is not None:
            self.nki_device.release(tensor)

    def place_pair_operands(self, stores, occ_block: int, in_memory: bool = True):
        """On NKI: every store's B placed on the device once for the pair stage
        (:func:`nki_ops.place_b` says when not), read in one block per store; else
        ``(stores, occ_block)`` as given. :attr:`residency` records which ("device", or why
        the blocks are uploaded per launch). A call that falls back to the host then reads B
        in blocks of ``occ_block`` (:meth:`_host_pair_sums`)."""
        if self.nki_device is None:
            return stores, occ_block
        nki_ops = importlib.import_module(".nki_ops", __package__)
        placed, why_not = nki_ops.place_b(stores, self.nki_device, self.policy.nki_matmul,
                                          in_memory)
        self.residency = "device" if why_not is None else f"uploaded per launch: {why_not}"
        if why_not is not None:
            return stores, occ_block
        self._host_block = occ_block
        return placed, max(int(st.nocc) for st in placed if st is not None and st.nocc)

    def device_record(self) -> dict | None:
        """The NKI device's record of the run (transfers, launches, programs, where B was
        during the pair stage), or None when no NKI device was used."""
        if self.nki_device is None:
            return None
        return {**self.nki_device.as_dict(), "b_placement": self.residency}

    def _run_host(self, op: str, args: tuple, mode: str):
        """Run ``op`` on the host backend chosen for it (numpy's BLAS or torch; CUDA operands
        always torch) and record that backend; ``mode`` 'host' for host-only or on-host calls,
        else the backend's name. Operands on the device (``host()``) are read back first."""
        if any(hasattr(arg, "host") for arg in args):  # B on the device: read it in blocks
            return self._host_pair_sums(op, args, mode)
        backend = self.host_backend[op]
        on = args[0].device.type if isinstance(args[0], torch.Tensor) else "cpu"
        if backend == "numpy" and on != "cpu":
            backend = "pytorch"
        result = REGISTRY[(op, backend)].fn(*args)
        # operands on a CUDA device ran there: the record says so, not "host"
        self._record(op, backend, on if on != "cpu" else
                     (backend if mode != HOST_MODE else HOST_MODE))
        return result

    def _host_pair_sums(self, op: str, args: tuple, mode: str):
        """``mp2_pair_sums`` on the host for operands placed on the device (whole stores): the
        blocks of the pair stage's plan (``occ_block``), each read from the store, their sums
        added in fp64, so a fallback stays within the memory plan."""
        ovl_i, ovl_j, eps_i, eps_j, eps_va, eps_vb, weights, exchange = args
        step = max(1, self._host_block)
        total = None
        for i0 in range(0, ovl_i.shape[0], step):
            i1 = min(ovl_i.shape[0], i0 + step)
            for j0 in range(0, ovl_j.shape[0], step):
                j1 = min(ovl_j.shape[0], j0 + step)
                w = weights[i0:i1, j0:j1]
                if not bool(w.any()):
                    continue
                block_i = ovl_i.host(i0, i1)
                same = ovl_j is ovl_i and (i0, i1) == (j0, j1)
                block_j = block_i if same else ovl_j.host(j0, j1)
                part = self._run_host(op, (block_i, block_j, eps_i[i0:i1], eps_j[j0:j1],
                                           eps_va, eps_vb, w, exchange), mode)
                total = part if total is None else total + part
        return total if total is not None else torch.zeros(2, dtype=weights.dtype)

    def _fall_back(self, op: str, args: tuple, reason: str):
        if self.policy.require_nki:
            raise UnsupportedShapeError(f"{op}: {reason}; refusing to fall back (--require-nki)")
        record = self.records.get(op)
        if record is None or record.fallback is None:
            log.warning("%s falls back from nki to the host (%s): %s", op,
                        self.host_backend.get(op, "pytorch"), reason)
        result = self._run_host(op, args, mode="pytorch")
        self.records[op].fallback = self.records[op].fallback or reason
        return result

    def _record(self, op: str, backend: str, mode: str, fallback: str | None = None):
        with self._lock:  # ops called from worker threads (the DF-SCF's J/K lanes) count once each
            record = self.records.get(op)
            if record is None:
                record = self.records[op] = OpRecord(backend, mode)
            elif ((record.backend, record.mode) != (backend, mode)
                  and mode not in record.mode.split("+")):
                record.backend, record.mode = "mixed", f"{record.mode}+{mode}"
            record.calls += 1
            record.fallback = record.fallback or fallback

    def summary(self) -> dict[str, dict]:
        """Per-op records as plain dicts (for the result and JSON)."""
        return {op: rec.as_dict() for op, rec in sorted(self.records.items())}


@dataclass(frozen=True)
class HostOps(_NamedOps):
    """A view of a :class:`Dispatcher` whose ops all run on the host in float64, recorded in the
    parent's records with ``reason`` (from :meth:`Dispatcher.on_host`)."""

    parent: Dispatcher
    reason: str

    @property
    def backend(self) -> str:
        return "pytorch"

    def call(self, op: str, *args):
        for arg in args:
            if isinstance(arg, torch.Tensor) and arg.dtype != torch.float64:
                raise ValueError(f"{op} on the host ({self.reason}) takes float64 operands, "
                                 f"got {arg.dtype}")
        return self.parent.run_on_host(op, args, self.reason)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "(no message)"
