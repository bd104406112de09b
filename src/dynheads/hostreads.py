"""Counting host reads: the calls that bring a tensor's value to the host (on a GPU, each waits for the device).

``HostReads`` is a ``TorchFunctionMode`` that counts them by name while it is active: ``item``, ``tolist``, ``cpu``,
``numpy``, ``bool`` / ``int`` / ``float`` / ``index`` of a tensor, ``nonzero`` / ``argwhere`` (their size depends
on the values) and boolean-mask indexing. Moves with ``Tensor.to`` are not counted: on a CPU they cannot tell
host-to-device from device-to-host. ``benchmarks/bench_step_overhead.py`` counts a decode step's with it; a test
checks that the attention probe adds none to a pass.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

READS = {"item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero", "argwhere"}


def _is_mask_index(name: str, args) -> bool:
    """``x[mask]`` with a bool tensor: its size depends on the values."""
    if name != "__getitem__" or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


class HostReads(TorchFunctionMode):
    """``with HostReads() as reads: ...`` then ``reads.counts``: the host reads made in the block, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS:
            self.counts[name] += 1
        elif _is_mask_index(name, args):
            self.counts["mask index"] += 1
        return func(*args, **(kwargs or {}))
