"""dfmp2: density-fitted MP2 (RI-MP2) energies on PySCF references.

>>> import dfmp2
>>> result = dfmp2.run("inputs/water.xyz", basis="cc-pvdz")
>>> result.e_tot, result.e_corr_os, result.e_corr_ss
"""

from ._version import __version__
from .errors import (
    BackendUnavailableError,
    ConvergenceError,
    DFMP2Error,
    InputError,
    OrbitalError,
    PrecisionError,
    ResourceError,
    UnsupportedShapeError,
)
from .options import Options
from .qcengine_harness import arm as _arm_qcengine
from .results import Result

__all__ = [
    "__version__", "run", "run_counterpoise", "run_qcschema", "DFMP2", "Options", "Result",
    "DFMP2Error", "InputError", "OrbitalError", "PrecisionError", "ConvergenceError",
    "BackendUnavailableError", "UnsupportedShapeError", "ResourceError",
]


# QCEngine's program "dfmp2": registered when qcengine is (or gets) imported; never imports it.
_arm_qcengine()


def __dir__():  # the lazily loaded names too (tab completion, dir())
    return sorted(set(globals()) | set(__all__))


def __getattr__(name):
    # PySCF and torch load only when the API is used, so `dfmp2 --help` stays fast.
    if name in ("run", "DFMP2"):
        from . import api

        return getattr(api, name)
    if name == "run_counterpoise":
        from .counterpoise import run_counterpoise

        return run_counterpoise
    if name == "run_qcschema":
        from .qcschema import run_qcschema

        return run_qcschema
    if name == "plot":  # dfmp2.plot.plot_pair_energies(...) after a plain `import dfmp2`
        import importlib

        return importlib.import_module(".plot", __name__)
    raise AttributeError(f"module 'dfmp2' has no attribute {name!r}")
