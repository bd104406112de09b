"""Trace a NIAH grid (lengths x depths x runs) into a run directory; refuse a head source (probe, static list)
fitted on a sample that is evaluated."""

from __future__ import annotations

from pathlib import Path
from typing import Unpack

from dynheads.experiments.experiment import run_task
from dynheads.runs import RunDir, RunOptions
from dynheads.settings import NiahConfig
from dynheads.tasks.niah import NIAH
from dynheads.tasks.sample import Sample


def niah_samples(config: NiahConfig, tokenizer) -> list[Sample]:
    """The grid's samples, seeded per (split, length, depth, run) so any subset is reproducible."""
    return NIAH.grid(config, tokenizer).samples


def run_niah(
    config: NiahConfig, out: str | Path, *, device_map: str | None = None, **options: Unpack[RunOptions]
) -> RunDir:
    """Trace every sample of the grid into ``out``; finished samples of an earlier attempt are skipped."""
    return run_task(NIAH, config, out, device_map=device_map, **options)
