"""``nki.isa`` enums (members as in the 0.3.0 stubs)."""

from __future__ import annotations

import enum


class engine(enum.Enum):
    """Neuron Device engines."""

    tensor = "tensor"
    vector = "vector"
    scalar = "scalar"
    gpsimd = "gpsimd"
    dma = "dma"
    sync = "sync"
    unknown = "unknown"


class reduce_cmd(enum.Enum):
    """Engine register reduce commands."""

    idle = "idle"
    reset = "reset"
    reduce = "reduce"
    reset_reduce = "reset_reduce"
    load_reduce = "load_reduce"


class dge_mode(enum.Enum):
    """Descriptor Generation Engine mode."""

    unknown = "unknown"
    swdge = "swdge"
    hwdge = "hwdge"
    none = "none"


class oob_mode(enum.Enum):
    """Out-of-bounds access mode."""

    error = "error"
    skip = "skip"


class matmul_perf_mode(enum.Enum):
    """Performance mode for matmul."""

    none = "none"
    double_row = "double_row"


class nc_version(enum.Enum):
    """NeuronCore version."""

    gen2 = "gen2"
    gen3 = "gen3"
    gen4 = "gen4"


class dma_engine(enum.Enum):
    """DMA transfer engine."""

    dma = "dma"
    gpsimd_dma = "gpsimd_dma"
