"""The one compiled piece of dfmp2: the single-pass MP2 pair reduction (see its source).

Everything else is in pyproject.toml. The extension is optional: without a C compiler the
install still succeeds and the numpy reduction runs instead (`dfmp2 run` reports which).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dfmp2.linalg._pair_reduce",
            sources=["dfmp2/linalg/_pair_reduce.c"],
            extra_compile_args=["-O3", "-fopenmp-simd"],
            optional=True,
        )
    ]
)
