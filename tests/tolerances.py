"""Every named tolerance of the test suite (Hartree unless a name says otherwise), in one place.

Tests import what they need: ``from tolerances import TOL_FP64``. Each value says what it bounds
and why it is that size.
"""

#: fp64 agreement with references and with PySCF (architecture.md: 1e-8 Eh).
TOL_FP64 = 1e-8
#: Literals published to 8 decimals carry up to 5e-9 of rounding on top of TOL_FP64's budget.
TOL_8DP = 1e-8
#: fp32 and NKI paths against the fp64 result.
TOL_FP32 = 1e-5
#: The same fp64 arithmetic reached by two routes (in core and out of core, blocked orders).
TOL_OUTCORE = 1e-10
#: `--precision mixed` against fp64 (fp32 pair GEMMs, fp64 reduction).
TOL_PRECISION = 1e-6
#: Relative error of float64 matrix kernels against an independent float64 route.
TOL_MATRIX_REL = 1e-12
#: Identities of printed quantities (E_tot = E_HF + E_corr, ...) in float64.
TOL_IDENTITY = 1e-12
#: What "equals PySCF to the last printed digit" means: 12 decimals are printed.
TOL_PRINTED = 1e-14
#: A pinned SCF total energy recomputed by a fresh PySCF RHF (conv_tol 1e-9 on the energy, and
#: the BLAS summation order of the host): far below any ECP or basis mix-up (>= 1 Eh).
TOL_SCF_PIN = 1e-6
#: Reconstruction identities of float64 factorisations (L L^T = A, V W V^T = A, X L^T = B)
#: on well-conditioned random matrices of order ~100.
TOL_MATRIX_ABS = 1e-10
#: Orthonormality of eigenvectors of a small, nearly singular metric (eigenvalues ~1e-4).
TOL_EIGH_ORTHO = 1e-8
#: fp32 results relative to float64 ones (fp32 epsilon 6e-8, times accumulation length).
TOL_FP32_REL = 1e-5
#: Two estimates of the same condition number (LAPACK's 1-norm estimate, rerun).
TOL_CONDITION_REL = 1e-6
#: dfmp2 against the NumPy open-shell oracle (tests/open_shell_oracle.py): the same SCF, integrals
#: and RI basis, a different fit (eigh J^-1/2 vs Cholesky) and contraction order. The oracle
#: matches PySCF's DFUMP2 to ~1e-14 on NH2/cc-pVDZ, so 1e-10 leaves room only for summation order.
TOL_ORACLE = 1e-10
