"""dfmp2 as a QCEngine program: ``qcengine.compute(atomic_input, "dfmp2")``.

QCEngine discovers no plugins, so dfmp2 registers itself through QCEngine's public
``register_program`` (:func:`register`). ``import dfmp2`` does it when qcengine is already
imported, and otherwise arms a one-shot import hook that does it right after a later
``import qcengine``: ``import dfmp2`` itself never imports qcengine (which loads numpy, before
the ``dfmp2`` command has set the environment numpy's BLAS reads at load time).

The harness runs :func:`dfmp2.qcschema.run_qcschema` in the calling process: the input's
keywords (Psi4's names, or dfmp2's own), QCEngine's task memory as ``max_memory`` and its scratch
directory as ``scratch_dir`` unless the keywords set them, and its ``ncores`` as the threads of
every pool during the run (:func:`dfmp2.threads.limit`; ``provenance.nthreads``). dfmp2's errors
become QCEngine's (:data:`ERRORS`).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

__all__ = ["ERRORS", "arm", "harness", "qcengine_error", "register"]

#: dfmp2 error class name -> QCEngine exception class name (the nearest class in an error's
#: MRO decides: :func:`qcengine_error`). A backend or device this machine lacks is a
#: resource QCEngine's task did not have; a precision or a shape a path cannot take is the
#: input's to change; a kernel that crashed stays unknown.
ERRORS = {
    "InputError": "InputError",
    "OrbitalError": "InputError",
    "PrecisionError": "InputError",
    "UnsupportedShapeError": "InputError",
    "ResourceError": "ResourceError",
    "BackendUnavailableError": "ResourceError",
    "ConvergenceError": "ConvergenceError",
}


def qcengine_error(exc: BaseException) -> str:
    """The QCEngine exception class name of a dfmp2 error (:data:`ERRORS`), else
    ``UnknownError``."""
    return next((ERRORS[k.__name__] for k in type(exc).__mro__ if k.__name__ in ERRORS),
                "UnknownError")


def harness():
    """A QCEngine ``ProgramHarness`` instance running dfmp2 (imports qcengine)."""
    from typing import Any, ClassVar

    from qcengine.programs.model import ProgramHarness

    class DFMP2Harness(ProgramHarness):
        """dfmp2 in the calling process: methods ``mp2``, ``scs-mp2``, ``sos-mp2``,
        ``custom-scs-mp2`` and the double hybrids (:mod:`dfmp2.functionals`)."""

        _defaults: ClassVar[dict[str, Any]] = {
            "name": "dfmp2",
            "scratch": True,
            "thread_safe": False,
            "thread_parallel": True,
            "node_parallel": False,
            "managed_memory": True,
        }

        @staticmethod
        def found(raise_error: bool = False) -> bool:
            return True  # this module is dfmp2: it is importable

        def get_version(self) -> str:
            from ._version import __version__

            return __version__

        def compute(self, input_data, config):
            return _compute(input_data, config)

    return DFMP2Harness()


def _compute(input_data, config):
    """Run one v2 ``AtomicInput`` (what QCEngine hands a harness) and return a v2
    ``AtomicResult``; dfmp2's errors raised as QCEngine's."""
    import json

    from qcelemental.models.v2 import AtomicResult
    from qcengine import exceptions

    from .errors import DFMP2Error
    from .qcschema import run_qcschema

    data = json.loads(input_data.serialize("json"))
    keywords = {name.lower() for name in data["specification"].get("keywords") or {}}
    # (keyword names are case-insensitive, as dfmp2.qcschema reads them)
    overrides = {}
    if config is not None and getattr(config, "memory", None) and "max_memory" not in keywords:
        overrides["max_memory"] = max(1, int(config.memory * 1024))  # GiB -> MB
    if config is not None and getattr(config, "scratch_directory", None) \
            and "scratch_dir" not in keywords:
        overrides["scratch_dir"] = config.scratch_directory
    ncores = getattr(config, "ncores", None) if config is not None else None
    if ncores:  # this task's share of the node: every thread pool held to it (dfmp2.threads)
        overrides["threads"] = int(ncores)
    try:
        result = run_qcschema(data, **overrides)
        if result is None:  # under torch.distributed: this rank took part, rank 0 has it
            raise exceptions.UnknownError(
                "dfmp2 ran distributed (torch.distributed): this rank took part in the run "
                "and rank 0's compute returned its AtomicResult; read the result there")
        if ncores:
            result["provenance"]["nthreads"] = int(ncores)
        return AtomicResult(**result)
    except DFMP2Error as exc:
        raise getattr(exceptions, qcengine_error(exc))(str(exc)) from exc


def register() -> bool:
    """Register the harness with QCEngine (once); False when qcengine is not installed."""
    if importlib.util.find_spec("qcengine") is None:
        return False
    import qcengine

    if "dfmp2" not in qcengine.list_all_programs():
        qcengine.register_program(harness())
    return True


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A one-shot import hook: when ``qcengine`` is first imported, run it as usual, then
    register dfmp2 with it, and remove the hook."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "qcengine":
            return None
        sys.meta_path.remove(self)  # find the real spec without this hook, and only once
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.register_program(harness())


def arm() -> None:
    """At ``import dfmp2``: register now if qcengine is already imported; else, if it is
    installed, register right after it is imported (:class:`_AfterImport`)."""
    if "qcengine" in sys.modules:
        register()
    elif importlib.util.find_spec("qcengine") is not None \
            and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
