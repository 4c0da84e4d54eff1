"""dfmp2 on your own PySCF SCF object, next to PySCF's DF-MP2 with the same RI basis."""

from pyscf import df, gto, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2

import dfmp2

mol = gto.M(atom="O 0 0 0; H 0 -0.757 0.587; H 0 0.757 0.587", basis="cc-pvdz", verbose=0)
mf = scf.RHF(mol).density_fit().run(conv_tol=1e-11)

ours = dfmp2.DFMP2(mf, frozen=1).run()
theirs = pyscf_dfmp2.DFMP2(mf, frozen=1)
theirs.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")  # PySCF would reuse the JK-fit basis
theirs.kernel(with_t2=False)
print(f"dfmp2 {ours.e_corr:.12f}  pyscf {theirs.e_corr:.12f}  diff {ours.e_corr - theirs.e_corr:.1e}")
