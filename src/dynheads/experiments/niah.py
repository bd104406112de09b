"""Trace a NIAH grid (lengths x depths x runs) into a run directory."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dynheads.experiments.tracing import run_task
from dynheads.models import LoadedModel
from dynheads.runs import RunDir
from dynheads.scores import LOCAL_WINDOW, SINK_SIZE
from dynheads.tasks.registry import NIAH
from dynheads.tasks.sample import Sample


@dataclass(frozen=True)
class NiahConfig:
    model: str | None = field(default=None, metadata={"help": "hub id, folder or .gguf; None = embedded SmolLM2"})
    lengths: tuple[int, ...] = field(default=(500, 1000, 2000), metadata={"help": "haystack tokens"})
    depths: tuple[float, ...] = field(default=(0.0, 0.25, 0.5, 0.75, 1.0), metadata={"help": "needle depth, 0..1"})
    runs: int = field(default=1, metadata={"help": "samples (different needle and seed) per grid cell"})
    seed: int = field(default=0, metadata={"help": "master seed; each sample's seed derives from it"})
    max_new_tokens: int = field(default=48, metadata={"help": "generation budget (a UUID is ~35 tokens)"})
    haystack: str | None = field(default=None, metadata={"help": "folder of .txt files; None = Paul Graham essays"})
    sink_size: int = field(default=SINK_SIZE, metadata={"help": "Eq. 2: first tokens excluded as attention sink"})
    local_window: int = field(default=LOCAL_WINDOW, metadata={"help": "Eq. 2: last tokens excluded as local attention"})
    distractor_depth: float | None = field(
        default=None, metadata={"help": "depth of a 'The secret word is <similar UUID>' distractor; None = none"})
    distractor_prefix: int = field(default=8, metadata={"help": "characters the distractor shares with the needle"})
    split: str = field(default="analysis", metadata={"help": "seed stream; 'static' samples are disjoint"})
    chat_template_kwargs: str = field(default="", metadata={
        "help": "JSON object of chat-template variables over the pinned ones (enable_thinking=false, "
                "date_string='26 Jul 2024'), e.g. {\"enable_thinking\": true}"})
    dtype: str = field(default="auto", metadata={"help": "model dtype (auto keeps the checkpoint's)"})
    device: str | None = field(default=None, metadata={"help": "cpu / cuda; None picks cuda when available"})


def niah_samples(config: NiahConfig, tokenizer) -> list[Sample]:
    """The grid's samples, seeded per (split, length, depth, run) so any subset is reproducible."""
    return NIAH.grid(config, tokenizer).samples


def prompt_manifest() -> dict:
    return NIAH.prompt(None)


def run_niah(config: NiahConfig, out: str | Path, *, lm: LoadedModel | None = None, progress: bool = True,
             on_sample: Callable[[dict], None] | None = None, batch_size: int = 1,
             device_map: str | None = None) -> RunDir:
    """Trace every sample of the grid into ``out``; finished samples of an earlier attempt are skipped."""
    return run_task(NIAH, config, out, lm=lm, device_map=device_map, progress=progress, on_sample=on_sample,
                    batch_size=batch_size)
