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
#: ... and at least this far from them: below it the products did not run in float32 (float64
#: results differ from PySCF's by ~1e-15 relative; float32 ones by ~1e-7).
TOL_FP32_FLOOR = 1e-9
#: --precision fp32's E(corr) relative to float64's where each pair's float32 terms are added up
#: in float64 (every CPU reduction): measured 2e-8 to 5e-8 on (H2O)4 and 3e-9 to 9e-9 on (H2O)8
#: cc-pVDZ; the torch reduction's float32 sums drifted by 3.6e-6 and 2.1e-5 there, past this.
TOL_FP32_SUMS_REL = 1e-6
#: Two estimates of the same condition number (LAPACK's 1-norm estimate, rerun).
TOL_CONDITION_REL = 1e-6
#: dfmp2 against the NumPy open-shell oracle (tests/open_shell_oracle.py): the same SCF, integrals
#: and RI basis, a different fit (eigh J^-1/2 vs Cholesky) and contraction order. The oracle
#: matches PySCF's DFUMP2 to ~1e-14 on NH2/cc-pVDZ, so 1e-10 leaves room only for summation order.
TOL_ORACLE = 1e-10
#: A pinned NH2 total SCF energy reproduced by a tight SCF (conv_tol 1e-12, conv_tol_grad 1e-8):
#: the energy is converged far below 1e-9, which leaves room only for BLAS summation order.
TOL_SCF_TIGHT = 1e-9
#: An energy against the float64 sum of its own components (singles + OS + SS): a few ulps of
#: terms of ~0.2 Eh (ulp ~3e-17), so any dropped or double-counted term shows.
TOL_COMPONENT_SUM = 1e-14
#: Semicanonical orbitals checked in float64 (C^T F C diagonal in occ-occ and vir-vir blocks, its
#: occ-vir block equal to the oracle's f_ov, C^T S C = 1): rounding of eigh and of an AO Fock
#: rebuild on 24 basis functions (~1e-13), converged SCF orbitals (conv_tol 1e-12).
TOL_SEMICANONICAL = 1e-10
#: The same geometry reached by three input forms (xyz file, atom string, Mole), in Bohr: float64
#: parsing and Angstrom-to-Bohr conversion of coordinates below ~10 Bohr (ulp ~2e-15).
TOL_COORDS = 1e-12
#: Largest change of any 3c2e integral when INT3C_EXPCUTOFF screens primitives at 40 instead of
#: libcint's 60: the screening contract, below the float64 resolution of integrals of order 1.
TOL_INT3C_SCREEN = 1e-14
#: Pair sums with fp32 operands *and* an fp32 reduction (precision "fp32") against float64, as
#: rtol and atol on sums of a few hundred: one more fp32 rounding per term than "mixed"
#: (TOL_FP32_REL); observed ~1e-7 relative.
TOL_FP32_REDUCTION_REL = 1e-4

# NKI kernels on an execution mode (tests/kernels; _support.py re-exports the first two as
# FP32_RTOL and ENERGY_RTOL).

#: fp32 kernels against float64 references, relative to the operand scale: the inputs are
#: rounded to fp32 (2^-24 ~ 6e-8 relative) and the products are accumulated in fp32 over
#: K <= a few hundred terms (typical error ~ sqrt(K) * 6e-8 ~ 1e-6 of sum |a||b|; worst case
#: K * 6e-8 ~ 2e-5 is never approached by random data). 1e-5 of the scale flags any indexing
#: or accumulation bug (those give O(1) errors) with a wide margin over rounding.
TOL_NKI_FP32_REL = 1e-5
#: Pair energies against float64, relative to |e_os|: T is fp32-accurate (~1e-7 relative),
#: the OS/exchange sums add same-sign terms per pair, the final sum is fp64 on the host, so the
#: energy keeps ~1e-7; 1e-6 leaves a tenfold margin and is far below the 1e-5 Eh budget of the
#: NKI path at molecular scale.
TOL_NKI_ENERGY_REL = 1e-6
#: A bf16x3 run's E(corr) against float64, relative to |E(corr)|: TOL_NKI_BF16X3_REL's miss
#: (3 * 2^-18 of |a||b|) in each of a pair energy's two factors, one-signed where the pair's
#: terms are sums of squares. Measured 1.4e-5 relative on H2 stretched to 12 A (docs/nki.md).
TOL_NKI_BF16X3_ECORR_REL = 6 * 2.0**-18
#: Emulated gemm (K = 200, N(0,1) operands, entries up to ~65) against float64, absolute:
#: TOL_NKI_FP32_REL of sum |a||b| (~130) is ~1e-3; observed 2e-5.
TOL_NKI_GEMM_ABS = 1e-3
#: Emulated Cholesky of an SPD matrix of order 200 (cond ~10, entries of L ~1) against float64,
#: absolute: fp32 rounding of O(1) entries; observed 1e-7.
TOL_NKI_CHOLESKY_ABS = 1e-5
#: Emulated trsm X = B L^-T (300 x 200, |X| up to ~5, L from the emulated Cholesky) against
#: float64, absolute: fp32 rounding times the solve's growth; observed 8e-7.
TOL_NKI_TRSM_ABS = 1e-4

# The NKI emulator's instructions (tests/nki_emulator) against NumPy evaluating the same
# expression in float32 (bf16 where a name says so).

#: Relative part where the order or the argument of a fp32 evaluation differs (matmul and
#: reduction sums over <= 256 terms, exp of a rounded argument): up to ~100 fp32 ulps (6e-8).
TOL_EMU_FP32_REL = 1e-5
#: Absolute part for emulated matmuls with K <= 64 of N(0,1) data (|c| < ~25): fp32
#: summation-order differences observed up to 5e-6.
TOL_EMU_MATMUL_ABS = 1e-5
#: Absolute part for emulated matmuls with K = 128..256 of N(0,1) data (|c| < ~70): fp32
#: summation-order differences observed up to 4e-5.
TOL_EMU_MATMUL_LONG_ABS = 1e-4
#: Elementwise ALU results (one or two fp32 roundings per element, or a PSUM sum doubled):
#: a few fp32 ulps (6e-8) relative.
TOL_EMU_ELEMENTWISE_REL = 1e-6
#: An fp32 reciprocal against NumPy's IEEE fp32 division: both are correctly rounded, so equal;
#: 1e-7 allows less than one fp32 ulp (6e-8 to 1.2e-7 relative) of difference.
TOL_EMU_RECIPROCAL_REL = 1e-7
#: Rounding to bf16 (8 significant bits) moves a value by at most half an ulp: 2^-8 relative.
TOL_BF16_REL = 2**-8
#: One bf16 ulp relative to the value (2^-7 at most, for 8 significant bits): a float32 sent
#: through a bf16 DMA cast and back lands within it.
TOL_BF16_ULP = 2**-7
#: Emulated matmul of bf16-rounded N(0,1) inputs (K = 32) with fp32 accumulation against NumPy
#: on the unrounded fp32 inputs: each product carries ~2 * 2^-8 relative error, the sum ~0.03
#: absolute (worst seen over 200 draws: 0.07). Relative part, then absolute part.
TOL_EMU_BF16_MATMUL_REL = 0.05
TOL_EMU_BF16_MATMUL_ABS = 0.1

#: A restart whose SCF iterates from a chkfile (another program's, or one converged more
#: loosely) against the fresh run: each SCF stops at an orbital gradient of 1e-7, so the two
#: sets of orbitals differ by ~1e-8 and E(MP2) by ~1e-10 (measured 1.3e-10 on water cc-pVDZ).
TOL_RESTART = 1e-9
#: A restart that takes a converged chkfile's SCF as it is (no cycle): the SCF energy is that
#: of the same density, built again by the same code (measured: the same bits).
TOL_SKIPPED_RESTART = 1e-12

#: The cost model's fp32 matmul rate against the documented trn1 peak: a (128, 128) x (128, 512)
#: matmul, 2*128*128*512 flops in 512*4 cycles at 2.8 GHz, is 22.94 TFLOPS against the
#: documented "23 TFLOPS for FP32" (0.27% apart: the documented figure is rounded).
TOL_MODEL_PEAK_REL = 3e-3

#: The bf16x3 pair kernels' sums, relative to the direct sum with |weights|: each product of
#: a = hi + lo + r (|r| <= 2^-18 |a|) misses lo*lo + hi*r + r*hi, at most 3 * 2^-18 = 1.1e-5 of
#: |a||b|; on a diagonal block (i = j: T_aa = sum_P B^2, no cancellation) the miss is one-signed.
#: Measured: 1.5e-6 (5 x 5 diagonal block), 5e-8 elsewhere.
TOL_NKI_BF16X3_REL = 1e-5
#: The same fp32 partial sums (or the same fp64 block sums) added on the host in a different
#: order or grouping (other launches, SPMD shares, blocks of a fallback): fp64 reassociation.
TOL_SUM_ORDER_REL = 1e-12
#: A run split over torch.distributed ranks against the single-process run: the same fp64
#: arithmetic, summed in another order (the issue's bound).
TOL_DISTRIBUTED = 1e-10
#: The hartree -> kcal/mol factor across CODATA releases (2014: 627.509474, 2018:
#: 627.5094740631): they differ by 1e-10 relative.
TOL_KCAL_FACTOR_REL = 1e-9
#: A double hybrid against Psi4's on the same nominal grid (99 radial x 302 Lebedev points, the
#: same basis and fitting sets): two programs' quadratures (Psi4's Treutler partitioning, PySCF's
#: Becke with Treutler radii) and Psi4's SCF converged to 1e-6 in the density; measured 8e-8 Eh
#: on water cc-pVQZ, 6e-10 on H2.
TOL_PSI4_DFT = 1e-6
#: A published total printed to 4 decimals (rounding 5e-5) plus the grid and fit differences
#: between the paper's program and this one (TOL_PSI4_DFT).
TOL_PUBLISHED_4DP = 5e-5 + 1e-6
#: SCF energy of a Kohn-Sham SCF accepted at a stalled orbital gradient up to sqrt(conv_tol)
#: (3.2e-4 at conv_tol 1e-7, the test lifting dfmp2.scf.KS_STALL_LIMIT) against the same SCF
#: run to its threshold: second order in the gradient.
TOL_SCF_ACCEPTED = 1e-6
#: The same run of the same code in another process (a subprocess against an in-process call):
#: only the BLAS summation order may differ; printed with 12 decimals.
TOL_OTHER_PROCESS = 1e-10
#: The lowest eigenvalue of an SCF's orbital Hessian by dfmp2's Davidson iterations (tolerance
#: 1e-6 Eh on the eigenvalue, dfmp2.stability.DAVIDSON_TOL) against the dense Hessian of
#: PySCF's own DF-SCF built from PySCF's Hessian-vector products: both SCFs stop at an orbital
#: gradient of 1e-7, which moves the Hessian by about that; well inside the -1e-5 Eh that
#: makes an instability.
TOL_STABILITY_EIGENVALUE = 1e-5
#: An SCF that followed an instability against PySCF's SCF that followed its own stability
#: analysis from the same saddle point: the same minimum reached along other rotations (each
#: converged to an orbital gradient of 1e-7), so SCF energies agree to second order in the
#: gradient and MP2 energies to first order (measured 1e-15 Eh on stretched H2).
TOL_FOLLOWED = 1e-9
#: A counterpoise run's fragment in its own basis against the same fragment computed apart
#: (PySCF's density-fitted RHF at conv_tol 1e-12 and DF-MP2 on the same fitting sets, or
#: dfmp2.run of the fragment's atoms): the same integrals, each SCF converged far below it;
#: measured 6e-14 Eh per fragment of the water dimer in 6-31G.
TOL_SEPARATE_FRAGMENT = 1e-10
#: The same SCF from another initial guess or with a level shift: each converged to the default
#: tolerances (energy change 1e-10 Eh, orbital gradient 1e-7), so SCF totals agree to about
#: 1e-10 and MP2 totals to first order in the gradient (measured 3e-12 on water cc-pVDZ).
TOL_OTHER_GUESS = 1e-9
#: An orbital energy of two SCFs of one molecule converged to an orbital gradient of 1e-7
#: along other paths (a level shift): first order in the gradient; the summary prints 1e-6.
TOL_ORBITAL_ENERGY = 1e-6
#: One molecule given in Bohr and in Angstrom (converted with PySCF's Bohr radius, written with
#: 17 digits): the built coordinates differ by float64 rounding (~1e-16 Bohr), so the energies
#: only by the SCF's arithmetic on them; measured 0 Eh on water STO-3G.
TOL_UNITS = 1e-10
