"""Trace a NIAH grid (lengths x depths x runs) into a run directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dynheads.experiments.settings import NiahConfig
from dynheads.experiments.tracing import run_task
from dynheads.models import LoadedModel
from dynheads.runs import RunDir
from dynheads.tasks.niah import NIAH
from dynheads.tasks.sample import Sample


def niah_samples(config: NiahConfig, tokenizer) -> list[Sample]:
    """The grid's samples, seeded per (split, length, depth, run) so any subset is reproducible."""
    return NIAH.grid(config, tokenizer).samples


def prompt_manifest() -> dict:
    return NIAH.prompt(None)


def run_niah(
    config: NiahConfig,
    out: str | Path,
    *,
    lm: LoadedModel | None = None,
    progress: bool = True,
    on_sample: Callable[[dict], None] | None = None,
    batch_size: int = 1,
    device_map: str | None = None,
) -> RunDir:
    """Trace every sample of the grid into ``out``; finished samples of an earlier attempt are skipped."""
    return run_task(
        NIAH, config, out, lm=lm, device_map=device_map, progress=progress, on_sample=on_sample, batch_size=batch_size
    )
