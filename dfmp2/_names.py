"""Names of the choices a run can make, in a module that imports nothing heavy.

``import dfmp2`` and the CLI must not load torch before the CLI has set the environment that
torch's OpenMP runtime reads at load time (see ``dfmp2.cli``).
"""

BACKENDS = ("auto", "pytorch", "nki")
CPU_BLAS_CHOICES = ("auto", "torch", "numpy")
