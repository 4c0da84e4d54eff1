"""The typed result of a run (Hartree throughout), its text summary and its JSON form."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field

__all__ = ["Result"]


@dataclass(frozen=True)
class Result:
    """Energies of a DF-MP2 run, in Hartree, and how they were obtained.

    e_hf : SCF total energy; e_corr_os / e_corr_ss : opposite- and same-spin correlation
    (unscaled); e_singles : singles (zero for RHF); e_corr : e_singles + e_corr_os + e_corr_ss;
    e_tot : e_hf + e_corr; e_scs : SCS-MP2 correlation energy; e_scs_tot : e_hf + e_scs.
    """

    e_hf: float
    e_corr_os: float
    e_corr_ss: float
    e_singles: float
    e_scs: float
    sizes: dict
    method: dict
    backend: dict
    timings: dict
    versions: dict
    molecule: dict = field(default_factory=dict)

    @property
    def e_doubles(self) -> float:
        return self.e_corr_os + self.e_corr_ss

    @property
    def e_corr(self) -> float:
        return self.e_singles + self.e_doubles

    @property
    def e_tot(self) -> float:
        return self.e_hf + self.e_corr

    @property
    def e_scs_tot(self) -> float:
        return self.e_hf + self.e_scs

    def properties(self) -> dict:
        """QCSchema ``AtomicResultProperties`` names and values (Hartree)."""
        return {
            "scf_total_energy": self.e_hf,
            "mp2_same_spin_correlation_energy": self.e_corr_ss,
            "mp2_opposite_spin_correlation_energy": self.e_corr_os,
            "mp2_singles_energy": self.e_singles,
            "mp2_doubles_energy": self.e_doubles,
            "mp2_correlation_energy": self.e_corr,
            "mp2_total_energy": self.e_tot,
            "return_energy": self.e_tot,
            "calcinfo_nbasis": self.sizes["nbasis"],
            "calcinfo_nmo": self.sizes["nmo"],
            "calcinfo_nalpha": self.sizes["nalpha"],
            "calcinfo_nbeta": self.sizes["nbeta"],
            "calcinfo_natom": self.sizes["natom"],
        }

    def to_dict(self) -> dict:
        """A QCSchema-shaped output object (schema v1 field names) with dfmp2 data in extras."""
        return {
            "schema_name": "qcschema_output",
            "schema_version": 1,
            "driver": "energy",
            "model": {"method": "mp2", "basis": self.method["basis"]},
            "molecule": self.molecule,
            "success": True,
            "return_result": self.e_tot,
            "properties": self.properties(),
            "extras": {
                "scs_mp2_correlation_energy": self.e_scs,
                "scs_mp2_total_energy": self.e_scs_tot,
                "sizes": self.sizes,
                "method": self.method,
                "backend": self.backend,
                "timings": self.timings,
                "versions": self.versions,
            },
            "provenance": {
                "creator": "dfmp2",
                "version": self.versions.get("dfmp2", ""),
                "routine": "dfmp2.run",
            },
        }

    def to_json(self, indent: int = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def summary(self) -> str:
        """Readable text summary for a terminal."""
        s, m, b = self.sizes, self.method, self.backend
        frozen = f"{s['nfrozen']} frozen" if s["nfrozen"] else "all electrons"
        lines = [
            f"DF-MP2  {m['reference'].upper()}/{m['basis']}  aux {m['auxbasis']}  "
            f"SCF {m['scf_type']}" + (f" ({m['scf_auxbasis']})" if m.get("scf_auxbasis") else ""),
            f"  nbasis {s['nbasis']}  naux {s['naux']}  nocc {s['nocc']}  nvir {s['nvir']}  "
            f"({frozen})",
            f"  backend {b['resolved']}"
            + (f" [{b['nki_mode']}]" if b.get("nki_mode") else "")
            + f"  fused energy {'on' if m['fused_energy'] else 'off'}  precision {m['precision']}"
            + (f" (NKI ops: {m['nki_precision']})" if m.get("nki_precision") else ""),
            f"  B storage {m['blocks']['storage']} ({m['blocks']['b_mb']} MB)  "
            f"max memory {m['max_memory_mb']} MB",
        ]
        blas = b.get("cpu_blas")
        if blas and b["resolved"] == "pytorch":
            lines.append(f"  CPU products through {blas['choice']} "
                         f"({blas['libraries'][blas['choice']]}; {blas.get('reason', '')})")
            if blas.get("pair_reduction"):
                lines.append(f"  pair-energy reduction: {blas['pair_reduction']}")
            if blas["choice"] == "numpy" and blas.get("openblas_thread_timeout"):
                lines.append("  numpy's OpenBLAS: OPENBLAS_THREAD_TIMEOUT="
                             f"{blas['openblas_thread_timeout']}")
        for op, rec in b["ops"].items():
            note = f"  FALLBACK: {rec['fallback']}" if rec["fallback"] else ""
            lines.append(f"    {op:<22s} {rec['backend']:<8s} {rec['mode']:<10s} "
                         f"{rec['calls']:>6d} calls{note}")
        lines += [
            "",
            f"  {'E(HF)':<22s}{self.e_hf:22.12f} Eh",
            f"  {'E(OS) opposite-spin':<22s}{self.e_corr_os:22.12f} Eh",
            f"  {'E(SS) same-spin':<22s}{self.e_corr_ss:22.12f} Eh",
            f"  {'E(corr) MP2':<22s}{self.e_corr:22.12f} Eh",
            f"  {'E(MP2) total':<22s}{self.e_tot:22.12f} Eh",
            f"  {'E(corr) SCS-MP2':<22s}{self.e_scs:22.12f} Eh",
            f"  {'E(SCS-MP2) total':<22s}{self.e_scs_tot:22.12f} Eh",
            "",
            "  time  " + "  ".join(f"{k} {v:.2f}s" for k, v in self.timings.items()),
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def versions() -> dict:
    """Versions of dfmp2 and the libraries that shaped the numbers."""
    import numpy
    import pyscf
    import torch

    from ._version import __version__

    return {"dfmp2": __version__, "pyscf": pyscf.__version__, "torch": torch.__version__,
            "numpy": numpy.__version__, "python": platform.python_version()}
