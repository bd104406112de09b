"""Sharding a run's samples over the processes of ``torchrun`` or ``accelerate launch``.

The launcher starts one process per GPU (or CPU worker) and sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``.
Rank r takes the samples whose index in the run's fixed sample order is r modulo the world size: shares are
disjoint, cover the run, and do not depend on timing. Every rank writes its own per-sample files into the
shared run directory (named by sample id and written atomically, so they never collide); rank 0 writes the
manifest before the others check it, and ``results.csv`` after every rank has finished. The only
communication is ``torch.distributed`` barriers (gloo backend, which works with and without GPUs).
Without a launcher (no ``WORLD_SIZE``) everything runs in one process and no process group is created.
``spawn`` is a launcher of its own for one machine (``dynheads reproduce --processes N``): it starts the processes
with the environment torchrun would give them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TypeVar

from dynheads.errors import DynheadsError
from dynheads.plugins import import_recorded_plugins

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


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: a container's or taskset's limit), else all."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pooled_threads(threads: int) -> int:
    """Threads for work that one process runs while the launch's other processes on this machine wait: all
    processes' threads together, capped at the usable cores as torch caps ``OMP_NUM_THREADS`` when it loads. So the
    work runs as it would in one process started with the launch's threads (torch's reductions, and so the last
    digits of a probe's training, depend on the thread count), and never with more threads than cores. One process
    keeps the threads it was given."""
    processes = local_world()
    return threads if processes == 1 else max(1, min(threads * processes, usable_cores()))


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
    import torch.distributed as dist  # here, not at the top: the CLI's --help imports this module and no torch

    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=BARRIER_TIMEOUT)
    dist.barrier()


def spawn(function: Callable[[], object], processes: int) -> None:
    """Run ``function()`` (picklable: a module-level function or a ``functools.partial`` of one) in ``processes``
    new processes on this machine, each with what a launcher sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``, a free ``MASTER_PORT`` on 127.0.0.1) and its share of this process's CPU threads; return
    once all have finished. A process that fails stops the others, and its error is raised here in one line."""
    import torch
    import torch.multiprocessing as mp

    if "WORLD_SIZE" in os.environ:
        raise DynheadsError("already under a launcher (WORLD_SIZE is set): let it start the processes")
    threads = max(1, torch.get_num_threads() // processes)
    try:
        mp.start_processes(
            _child, args=(processes, _free_port(), threads, function), nprocs=processes, start_method="spawn"
        )
    except mp.ProcessRaisedException as error:
        last = str(error).strip().splitlines()[-1]
        raise DynheadsError(f"a process failed: {last.split(': ', 1)[-1]}") from None
    except mp.ProcessExitedException as error:
        raise DynheadsError(f"a process exited: {error}") from None


def _child(rank: int, processes: int, port: int, threads: int, function: Callable[[], object]) -> None:
    import torch

    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(processes),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(processes),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS=str(threads),
    )
    torch.set_num_threads(threads)
    import_recorded_plugins()  # the variants the starting command's plugins registered
    function()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
