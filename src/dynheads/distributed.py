"""Sharding a run's samples over the processes of ``torchrun`` or ``accelerate launch``.

The launcher starts one process per GPU (or CPU worker) and sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``.
Rank r takes the samples whose index in the run's fixed sample order is r modulo the world size: shares are
disjoint, cover the run, and do not depend on timing. Every rank writes its own per-sample files into the
shared run directory (named by sample id and written atomically, so they never collide); rank 0 writes the
manifest before the others check it, and ``results.csv`` after every rank has finished. The only
communication is ``torch.distributed`` barriers (gloo backend, which works with and without GPUs).
Without a launcher (no ``WORLD_SIZE``) everything runs in one process and no process group is created.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta
from typing import TypeVar

import torch.distributed as dist

from dynheads.errors import DynheadsError

T = TypeVar("T")

# How long a rank waits at a barrier for the others: as long as another rank's share of a stage, or an analysis
# that rank 0 runs alone in ``dynheads reproduce``, takes (gloo's default, 30 minutes, is shorter than a probe on a
# paper-sized run).
BARRIER_TIMEOUT = timedelta(hours=24)


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment; (0, 1) without a launcher."""
    try:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        raise DynheadsError("RANK and WORLD_SIZE must be integers (set by torchrun / accelerate launch)") from None
    if world < 1 or not 0 <= rank < world:
        raise DynheadsError(f"bad launcher environment: RANK={rank}, WORLD_SIZE={world}")
    return rank, world


def is_main() -> bool:
    return rank_and_world()[0] == 0


def local_world() -> int:
    """Processes of this launch on this machine (``LOCAL_WORLD_SIZE``, set by the launcher); 1 without one."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    except ValueError:
        raise DynheadsError("LOCAL_WORLD_SIZE must be an integer (set by torchrun / accelerate launch)") from None


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share: items at indices congruent to the rank modulo the world size."""
    rank, world = rank_and_world()
    return list(items[rank::world])


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    if rank_and_world()[1] == 1:
        return
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=BARRIER_TIMEOUT)
    dist.barrier()
