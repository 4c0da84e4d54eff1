"""Names of the choices a run can make, in a module that imports nothing heavy.

``import dfmp2`` and the CLI must not load torch before the CLI has set the environment that
torch's OpenMP runtime reads at load time (see ``dfmp2.cli``).
"""

import re

BACKENDS = ("auto", "pytorch", "nki")
CPU_BLAS_CHOICES = ("auto", "torch", "numpy")
#: Precisions of the NKI pair kernels' (ia|jb) products: float32, or three bfloat16 products of
#: a high/low split accumulated in float32 PSUM.
NKI_MATMULS = ("fp32", "bf16x3")
#: NeuronCore generations the NKI kernels target: "auto" reads the instance type in hardware mode
#: (the emulated target in emulator mode).
NKI_TARGETS = ("auto", "trn1", "trn2")
#: Where the MP2 step runs (``--device``).
DEVICES = ("auto", "cpu", "cuda")
#: torch.distributed backends of a torchrun job: CPU, CUDA, Trainium (torch-xla).
DIST_BACKENDS = ("gloo", "nccl", "xla")
#: Most threads a pool may be given: five times the largest machines' hardware threads (two
#: 192-core, 2-way SMT CPUs: 768). Far more does not start: libgomp fails to create 16384 threads
#: ("Resource temporarily unavailable") and 32768 ran a 24 GiB machine out of memory on import.
MAX_THREADS = 4096

#: The rules ``frozen_core`` may follow (``Options.core_rule``): PySCF's ``chemcore`` table, or
#: Psi4's FREEZE_CORE TRUE (:func:`dfmp2.reference.psi4_core_orbitals`).
CORE_RULES = ("pyscf", "psi4")
#: What a run does about the stability of its SCF (``--stability``, :mod:`dfmp2.stability`):
#: nothing, analyse it, or analyse it and follow an internal instability to a lower solution.
STABILITY_MODES = ("none", "check", "follow")
#: Initial guesses of an SCF (``--guess``; PySCF's ``init_guess`` names): a superposition of
#: atomic densities projected from a minimal basis (PySCF's default), of atomic SCF densities,
#: Hückel's (and PySCF's modified Hückel), the core Hamiltonian's orbitals, and the
#: superposition of atomic potentials.
GUESSES = ("minao", "atom", "huckel", "mod_huckel", "1e", "sap")
#: QCSchema methods whose answer (``return_result``) is a scaled total: SCS-MP2's and SOS-MP2's
#: published scales, and the keywords' (Psi4's CUSTOM SCS-MP2).
SCALED_METHODS = ("scs-mp2", "sos-mp2", "custom-scs-mp2")
#: Units of an xyz file's or atom string's coordinates (``--unit``; PySCF's ``Mole.unit``).
UNITS = ("angstrom", "bohr")


def cartesian_elsewhere(basis) -> bool:
    """Whether Gaussian and Psi4 run the basis named ``basis`` with Cartesian functions by
    default (its ``.gbs`` file in Psi4 says ``cartesian``): the 3-21G and 6-31G families, not
    6-311G (spherical, as everything else)."""
    return isinstance(basis, str) and re.match(r"(3-21|6-31)(?!1)", basis.strip().lower()) \
        is not None
