"""Worker functions of tests/test_distributed.py, run in spawned processes (they must be
importable by name): each joins a gloo group on localhost, runs dfmp2, and puts what happened on
a queue."""

from __future__ import annotations

import os


def _join(rank: int, world: int, port: int, timeout_s: float = 60.0) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def fail_in_fit(rank: int, world: int, port: int, queue, geometry: str, scratch: str) -> None:
    """Rank 1's fit raises a ResourceError; every rank reports its exception."""
    import torch.distributed as dist

    import dfmp2
    from dfmp2 import pipeline
    from dfmp2.errors import ResourceError

    _join(rank, world, port)
    if rank == 1:
        def broken_fit(*_args, **_kwargs):
            raise ResourceError("rank 1 ran out of memory in the fit (injected)")

        pipeline.fit = broken_fit
    try:
        dfmp2.run(geometry, force_outcore=True, scratch_dir=scratch)
        queue.put((rank, "ok", ""))
    except Exception as exc:  # reported to the test, which checks the type and text
        queue.put((rank, type(exc).__name__, str(exc)))
    finally:
        dist.destroy_process_group()


def die_in_pairs(rank: int, world: int, port: int, queue, geometry: str, scratch: str) -> None:
    """Rank 1 exits abruptly (no exception, no collective) in the pair stage; rank 0 must not
    hang: its collective fails (the peer is gone) or times out, and its files are removed."""
    import dfmp2
    from dfmp2 import distributed

    _join(rank, world, port, timeout_s=20.0)
    if rank == 1:
        def vanish(*_args, **_kwargs):
            os._exit(3)

        distributed._pair_stage = vanish
    try:
        dfmp2.run(geometry, force_outcore=True, scratch_dir=scratch)
        queue.put((rank, "ok", ""))
    except Exception as exc:  # reported to the test
        queue.put((rank, type(exc).__name__, str(exc)[:300]))


def scratch_missing_on_rank_1(rank: int, world: int, port: int, queue, geometry: str,
                              scratch: str) -> None:
    """Rank 1's scratch directory does not exist (node-local scratch): every rank stops in the
    input checks, before the SCF, and the processes live on (a notebook's)."""
    import time

    import torch.distributed as dist

    import dfmp2

    _join(rank, world, port, timeout_s=60.0)
    start = time.perf_counter()
    where = scratch if rank == 0 else os.path.join(scratch, "missing-on-this-node")
    try:
        dfmp2.run(geometry, force_outcore=True, scratch_dir=where)
        queue.put((rank, "ok", ""))
    except Exception as exc:  # reported to the test, which checks the type, text and time
        queue.put((rank, type(exc).__name__, f"{time.perf_counter() - start:.1f} {exc}"))
    finally:
        dist.destroy_process_group()


def qcschema_on_every_rank(rank: int, world: int, port: int, queue, data: dict) -> None:
    """Every rank calls dfmp2.run_qcschema: rank 0 reports its return_result, the others what
    they got (None, as dfmp2.run gives them)."""
    import torch.distributed as dist

    import dfmp2

    _join(rank, world, port)
    try:
        got = dfmp2.run_qcschema(data, threads=1)
        queue.put((rank, "ok", repr(got if got is None else got["return_result"])))
    except Exception as exc:  # reported to the test, which checks the type and text
        queue.put((rank, type(exc).__name__, str(exc)))
    finally:
        dist.destroy_process_group()
