"""dfmp2's vendored linear-algebra suite: one registry, a pytorch backend and an nki backend.

Pipeline code creates one :class:`Dispatcher` per run and calls its ops (``gemm``, ``cholesky``,
``eigh``, ``trsm``, ``trmm``, ``mp2_pair_sums``, ``pair_sums_from_ovov``); the dispatcher
records which backend and execution mode ran each op.
"""

from .registry import (
    BACKENDS,
    HOST_OPS,
    OPS,
    REGISTRY,
    Dispatcher,
    DispatchPolicy,
    HostOps,
    OpRecord,
)

__all__ = ["BACKENDS", "HOST_OPS", "OPS", "REGISTRY", "DispatchPolicy", "Dispatcher", "HostOps",
           "OpRecord"]
