"""Double-hybrid functionals and the scaled second-order energy a run reports.

A double hybrid's energy is a Kohn-Sham energy with a hybrid exchange and a scaled GGA
correlation, plus a scaled second-order term on the KS orbitals (no singles):

    E = E_KS[c_x HF + (1 - c_x) X_GGA, c_c C_GGA] + c_os E_OS + c_ss E_SS

PySCF's libxc has no entry for these composites, so each is built here from its components as
PySCF's functional expression (:data:`DOUBLE_HYBRIDS`, with the parameters of the paper cited).
Dispersion-corrected variants (``-D2``, ``-D3BJ``, ``-NL``) are not offered: dfmp2 computes no
dispersion term, and their fitted mixes differ from the uncorrected ones.

:func:`resolve` turns the options ``xc``, ``os_scale``, ``ss_scale`` and ``sos`` into the run's
:class:`Scaling` (which scaled energy is reported, and its source) and the KS functional.
:func:`parse_grid` / :func:`grid_settings` handle ``--grid``.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

from .errors import InputError

__all__ = ["DOUBLE_HYBRIDS", "DoubleHybrid", "Scaling", "SCS_MP2", "SOS_MP2", "check_grid",
           "find_double_hybrid", "grid_record", "grid_settings", "parse_grid", "resolve"]


@dataclass(frozen=True)
class DoubleHybrid:
    """A double hybrid: ``xc`` the KS part as a PySCF expression ("X mix, C mix"), ``c_os`` and
    ``c_ss`` the scales of the opposite- and same-spin second-order energies, ``citation``
    where the parameters are published."""

    name: str
    xc: str
    c_os: float
    c_ss: float
    citation: str
    aliases: tuple[str, ...] = ()


#: The double hybrids ``--xc`` knows, by name (upper case). Exchange: the fraction of HF
#: exchange and the GGA exchange (B88 and PBE include Slater exchange); correlation: the
#: scaled GGA correlation (LYP; P86, which includes PZ81; PBE).
DOUBLE_HYBRIDS = {dh.name: dh for dh in (
    DoubleHybrid("B2PLYP", "0.53*HF + 0.47*B88, 0.73*LYP", 0.27, 0.27,
                 "S. Grimme, J. Chem. Phys. 124, 034108 (2006)"),
    DoubleHybrid("B2GPPLYP", "0.65*HF + 0.35*B88, 0.64*LYP", 0.36, 0.36,
                 "A. Karton, A. Tarnopolsky, J.-F. Lamere, G. C. Schatz, J. M. L. Martin, "
                 "J. Phys. Chem. A 112, 12868 (2008)", ("B2GP-PLYP",)),
    DoubleHybrid("DSD-BLYP", "0.75*HF + 0.25*B88, 0.53*LYP", 0.46, 0.60,
                 "S. Kozuch, J. M. L. Martin, J. Comput. Chem. 34, 2327 (2013), the "
                 "parameters without a dispersion term"),
    DoubleHybrid("DSD-PBEP86", "0.72*HF + 0.28*PBE, 0.44*P86", 0.51, 0.36,
                 "S. Kozuch, J. M. L. Martin, J. Comput. Chem. 34, 2327 (2013), the "
                 "parameters without a dispersion term"),
    DoubleHybrid("DSD-PBEPBE", "0.72*HF + 0.28*PBE, 0.48*PBE", 0.54, 0.31,
                 "S. Kozuch, J. M. L. Martin, J. Comput. Chem. 34, 2327 (2013), the "
                 "parameters without a dispersion term"),
    DoubleHybrid("PBE0-DH", "0.5*HF + 0.5*PBE, 0.875*PBE", 0.125, 0.125,
                 "E. Bremond, C. Adamo, J. Chem. Phys. 135, 024106 (2011)"),
    DoubleHybrid("PBE0-2", "0.793701*HF + 0.206299*PBE, 0.5*PBE", 0.5, 0.5,
                 "J.-D. Chai, S.-P. Mao, Chem. Phys. Lett. 538, 121 (2012)"),
)}

#: Dispersion-corrected names people type, refused with a pointer (dfmp2 has no dispersion).
_DISPERSION = re.compile(r"-(D2|D3|D3BJ|D3ZERO|D4|NL)$")


@dataclass(frozen=True)
class Scaling:
    """The scaled second-order energy of a run, ``os * E_OS + ss * E_SS`` (ROHF singles added
    unscaled): ``label`` what it is called ("SCS-MP2", "SOS-MP2", "scaled MP2", a double
    hybrid's name, "custom double hybrid"), ``source`` where the scales come from,
    ``double_hybrid`` the functional when the run is one (then the reported energy is the
    double hybrid's total and ``xc`` the KS part)."""

    label: str
    os: float
    ss: float
    source: str
    double_hybrid: DoubleHybrid | None = None
    xc: str | None = None

    @property
    def is_double_hybrid(self) -> bool:
        return self.xc is not None

    def as_dict(self) -> dict:
        return {"label": self.label, "os_scale": self.os, "ss_scale": self.ss,
                "source": self.source, "xc": self.xc,
                "double_hybrid": self.double_hybrid.name if self.double_hybrid else None}


#: Largest spin-component scale taken. Published ones are below 2 (SCS-MP2 6/5 and 1/3,
#: SOS-MP2 1.3, SCSN-MP2's same-spin 1.76, the double hybrids' below 1); a scale of 1e300 is a
#: slip, and its "energy" would print as a 300-digit number.
MAX_SCALE = 10.0

SCS_MP2 = (6.0 / 5.0, 1.0 / 3.0, "S. Grimme, J. Chem. Phys. 118, 9095 (2003)")
SOS_MP2 = (1.3, 0.0, "Y. Jung, R. C. Lochan, A. D. Dutoi, M. Head-Gordon, "
                     "J. Chem. Phys. 121, 9793 (2004)")


def _key(name: str) -> str:
    return name.strip().upper().replace("_", "-")


def find_double_hybrid(name: str) -> DoubleHybrid | None:
    """The double hybrid called ``name`` (case, '-' and '_' ignored), or None."""
    squeezed = _key(name).replace("-", "")
    for dh in DOUBLE_HYBRIDS.values():
        if any(squeezed == n.replace("-", "") for n in (dh.name, *dh.aliases)):
            return dh
    return None


def resolve(xc: str | None, os_scale: float | None, ss_scale: float | None,
            sos: bool, parse: bool = True) -> Scaling:
    """The run's :class:`Scaling` from its options.

    Without ``xc``: SCS-MP2 (Grimme's 6/5 and 1/3), SOS-MP2 with ``sos`` (1.3 and 0, Jung et
    al.), or the scales given. With a double hybrid's name: its KS part and its scales, the
    given ones replacing them (``sos`` sets c_ss = 0 and then needs ``os_scale``: each
    spin-opposite double hybrid has its own fitted c_os). With any other functional (a libxc
    name or a PySCF expression): a custom double hybrid, which needs both scales (or ``sos``
    and ``os_scale``). A contradiction or a missing scale is an :class:`InputError`.
    ``parse``: check with PySCF that a custom functional can be evaluated (imports PySCF).
    """
    if sos and ss_scale is not None:
        raise InputError(f"--sos sets the same-spin scale to 0 and contradicts --ss-scale "
                         f"{ss_scale}; drop one of them")
    for name, value in (("os_scale", os_scale), ("ss_scale", ss_scale)):
        if value is not None and not (value >= 0 and math.isfinite(value)):
            raise InputError(f"{name} must be a finite number >= 0, got {value}")
        if value is not None and value > MAX_SCALE:
            raise InputError(f"{name} {value:g} is more than {MAX_SCALE:g}: spin-component "
                             "scales are of order 1 (SCS-MP2: 1.2 and 1/3)")
    if xc is None:
        # SCS-MP2 and SOS-MP2 are their published scales; any other pair is "scaled MP2"
        # (Psi4's CUSTOM SCS-MP2), whatever flags gave it
        if sos:
            os_, ss_ = (SOS_MP2[0] if os_scale is None else os_scale), 0.0
            given = "given (--sos --os-scale: SS scale 0)"
        else:
            os_ = SCS_MP2[0] if os_scale is None else os_scale
            ss_ = SCS_MP2[1] if ss_scale is None else ss_scale
            given = "given (--os-scale/--ss-scale; the other SCS-MP2's)"
        for label, (c_os, c_ss, citation) in (("SCS-MP2", SCS_MP2), ("SOS-MP2", SOS_MP2)):
            if (os_, ss_) == (c_os, c_ss):
                return Scaling(label, c_os, c_ss, citation)
        return Scaling("scaled MP2", os_, ss_, given)
    if not isinstance(xc, str) or not xc.strip():
        raise InputError(f"xc must name a functional, got {xc!r}")
    if _DISPERSION.search(_key(xc)):
        raise InputError(
            f"--xc {xc}: dfmp2 computes no dispersion correction, and the dispersion-corrected "
            "fits have their own mixes; run the uncorrected functional (known: "
            f"{', '.join(DOUBLE_HYBRIDS)}) and add the dispersion term with a dispersion "
            "program")
    dh = find_double_hybrid(xc)
    if dh is not None:
        if sos and os_scale is None:
            raise InputError(f"--sos with --xc {dh.name} needs --os-scale: a spin-opposite "
                             "double hybrid has its own fitted opposite-spin scale")
        os_ = dh.c_os if os_scale is None else os_scale
        ss_ = 0.0 if sos else (dh.c_ss if ss_scale is None else ss_scale)
        custom = (os_, ss_) != (dh.c_os, dh.c_ss)
        return Scaling(f"{dh.name} (custom PT2 scales)" if custom else dh.name, os_, ss_,
                       dh.citation + ("; PT2 scales given" if custom else ""), dh, dh.xc)
    if parse:
        _check_functional(xc)
    if os_scale is None or (ss_scale is None and not sos):
        raise InputError(
            f"--xc {xc}: not a double hybrid dfmp2 knows ({', '.join(DOUBLE_HYBRIDS)}); to use "
            "it as the KS part of your own double hybrid, give --os-scale and --ss-scale (or "
            "--sos and --os-scale)")
    return Scaling("custom double hybrid", os_scale, 0.0 if sos else ss_scale,
                   "given (--xc with --os-scale/--ss-scale)", None, xc.strip())


def _check_functional(xc: str) -> None:
    """A functional PySCF can evaluate, without range separation (dfmp2's J/K and the MP2
    step assume none)."""
    from pyscf.dft import libxc

    try:
        libxc.parse_xc(xc)
        omega = libxc.rsh_coeff(xc)[0]
    except (KeyError, ValueError, TypeError, NotImplementedError) as exc:
        raise InputError(f"--xc {xc!r}: PySCF cannot parse this functional ({exc}); give a "
                         f"libxc name or an expression like '0.5*HF + 0.5*B88, LYP', or one "
                         f"of {', '.join(DOUBLE_HYBRIDS)}") from None
    if omega:
        raise InputError(f"--xc {xc!r} is range-separated (omega {omega}); dfmp2 supports "
                         "global hybrids only")


def parse_grid(value):
    """``--grid``: None (PySCF's default, level 3), a level 0-9 (PySCF's ``grids.level``), or
    "RADIAL,ANGULAR" radial shells and Lebedev points per atom, unpruned (a Psi4-style
    ``dft_radial_points``/``dft_spherical_points`` grid). Returns None, an int or a
    ``(radial, angular)`` tuple; anything else is an :class:`InputError`."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InputError(f"grid must be a level 0-9 or RADIAL,ANGULAR, got {value!r}")
    if isinstance(value, numbers.Integral):  # a numpy integer too
        level = int(value)
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        return _radial_angular(value, value)
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        level = int(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+\s*,\s*\d+\s*", value):
        return _radial_angular(value.split(","), value)
    else:
        raise InputError(f"grid {value!r}: give a level 0-9 (e.g. 5) or radial,angular points "
                         "per atom (e.g. 99,590)")
    if not 0 <= level <= 9:
        raise InputError(f"grid level {level}: PySCF's levels are 0-9")
    return level


def _radial_angular(pair, given):
    try:
        radial, angular = (int(str(x).strip()) for x in pair)
    except ValueError:
        raise InputError(f"grid {given!r}: radial and angular points must be whole numbers"
                         ) from None
    if radial < 10:
        raise InputError(f"grid {given!r}: at least 10 radial points per atom")
    return radial, angular


#: Most radial points per atom a ``--grid`` may ask for: PySCF's finest level (9) uses 200,
#: and 20000 took 2.9 GB and minutes before the SCF began.
MAX_RADIAL = 1000


def check_grid(grid) -> None:
    """A parsed ``--grid`` PySCF can build: at most :data:`MAX_RADIAL` radial points, the
    angular count a Lebedev grid size."""
    if not isinstance(grid, tuple):
        return
    from pyscf.dft import gen_grid

    radial, angular = grid
    if radial > MAX_RADIAL:
        raise InputError(f"grid {radial},{angular}: {radial} radial points per atom is more "
                         f"than {MAX_RADIAL} (PySCF's finest level uses 200); give fewer")
    if angular not in gen_grid.LEBEDEV_ORDER.values():
        orders = sorted(gen_grid.LEBEDEV_ORDER.values())
        raise InputError(f"grid {radial},{angular}: {angular} is not a Lebedev grid size; "
                         f"choose one of {', '.join(map(str, orders[4:]))}")


def grid_settings(grids, grid) -> None:
    """Apply a parsed ``--grid`` to a PySCF ``Grids`` object (before it is built)."""
    if grid is None:
        return
    if isinstance(grid, int):
        grids.level = grid
        return
    check_grid(grid)
    grids.atom_grid = grid
    grids.prune = None


def grid_record(mf) -> dict:
    """What the KS SCF integrated on: PySCF's settings and the number of points."""
    grids = mf.grids
    atom_grid = grids.atom_grid
    return {
        "level": None if atom_grid else int(grids.level),
        "atom_grid": list(atom_grid) if isinstance(atom_grid, tuple) else atom_grid or None,
        "prune": getattr(grids.prune, "__name__", None),
        "radial_scheme": getattr(grids.radi_method, "__name__", str(grids.radi_method)),
        "becke_scheme": getattr(grids.becke_scheme, "__name__", str(grids.becke_scheme)),
        "points": int(grids.weights.size) if grids.weights is not None else None,
    }
