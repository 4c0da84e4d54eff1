"""PySCF's side of the end-to-end comparison: what a PySCF user runs for a DF-MP2 energy.

    python3 benchmarks/pyscf_e2e.py SPEC.json

SPEC (written by ``benchmarks/run.py``): path, basis, auxbasis (the RI basis of the MP2 step),
charge, spin, reference ('rhf' or 'uhf'), conv_tol, conv_tol_grad, pyscf_haswell (load PySCF's
OpenBLAS with Haswell kernels first, the 'pyscf-Haswell' setting), out. The script builds the
molecule, runs PySCF's density-fitted SCF (``density_fit()``: PySCF's JK-fit partner of the
basis, as dfmp2's SCF uses) to the same tolerances as ``dfmp2 run``, then ``DFMP2``/``DFUMP2``
with ``with_df = df.DF(mol, auxbasis=RI)`` and ``kernel(with_t2=False)`` (energy only), and
writes the stage times, the SCF cycle count and the energies to ``out``. ``run.py`` times the
whole process from outside, as it does ``dfmp2 run``. Only PySCF (and, for the
'pyscf-Haswell' setting, dfmp2's loader of PySCF's OpenBLAS) is imported before the clock of
the first stage starts.
"""

from __future__ import annotations

import json
import sys
import time


def main(spec_path: str) -> int:
    start = time.perf_counter()
    with open(spec_path) as handle:
        spec = json.load(handle)
    if spec.get("pyscf_haswell"):
        from dfmp2.blas_env import tune_pyscf_openblas

        tune_pyscf_openblas()
    from pyscf import df, gto, scf
    from pyscf.mp import dfmp2, dfump2

    imported = time.perf_counter()
    mol = gto.M(atom=spec["path"], basis=spec["basis"], charge=spec["charge"],
                spin=spec["spin"], verbose=0)
    unrestricted = spec["reference"] == "uhf"
    mf = (scf.UHF if unrestricted else scf.RHF)(mol).density_fit()
    if spec["conv_tol_grad"] is None:  # PySCF would take sqrt(conv_tol), not dfmp2's threshold
        print("the spec has no conv_tol_grad: the two SCFs would converge differently",
              file=sys.stderr)
        return 2
    mf.conv_tol, mf.conv_tol_grad = spec["conv_tol"], spec["conv_tol_grad"]
    mf.kernel()
    if not mf.converged:
        print(f"the PySCF SCF of {spec['path']} did not converge", file=sys.stderr)
        return 1
    scf_done = time.perf_counter()
    pt = (dfump2.DFUMP2 if unrestricted else dfmp2.DFMP2)(mf)
    pt.with_df = df.DF(mol, auxbasis=spec["auxbasis"])
    e_corr, t2 = pt.kernel(with_t2=False)
    assert t2 is None, "PySCF stored t2 amplitudes"
    end = time.perf_counter()
    with open(spec["out"], "w") as handle:
        json.dump({"scf_s": scf_done - imported, "mp2_s": end - scf_done,
                   "import_s": imported - start, "scf_cycles": int(mf.cycles),
                   "e_scf": float(mf.e_tot), "e_corr": float(e_corr),
                   "e_tot": float(mf.e_tot + e_corr)}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
