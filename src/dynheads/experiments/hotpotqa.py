"""Trace HotpotQA questions (real data from a file, or the seeded synthetic set) over a length x depth grid.

``hotpot_samples`` is the one place that turns a ``data`` value into QA questions: a HotpotQA file/folder,
None (synthetic HotpotQA), or ``multihop[:options]`` (the synthetic multi-hop key-value task,
``dynheads.tasks.multihop``). Every HotpotQA-side runner (tracing, ablation, RAG) reads its questions here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import product
from pathlib import Path

from dynheads.errors import DynheadsError
from dynheads.experiments.tracing import trace_samples
from dynheads.models import LoadedModel, load_model
from dynheads.runs import RunDir, derive_seed
from dynheads.tasks import hotpotqa, multihop


@dataclass(frozen=True)
class HotpotConfig:
    model: str | None = field(default=None, metadata={"help": "hub id, folder or .gguf; None = embedded SmolLM2"})
    data: str | None = field(default=None, metadata={
        "help": "HotpotQA file/folder; None = synthetic questions; multihop[:options] = the multihop task"})
    questions: int = field(default=45, metadata={"help": "questions used (the first N of the data)"})
    lengths: tuple[int, ...] = field(default=(250, 500, 1000), metadata={"help": "context tokens"})
    depths: tuple[float, ...] = field(default=(0.05, 0.5, 0.95), metadata={"help": "gold paragraphs' depth, 0..1"})
    seed: int = field(default=0, metadata={"help": "master seed (synthetic data, distractor order)"})
    max_new_tokens: int = field(default=24, metadata={"help": "generation budget per question"})
    sink_size: int = field(default=4, metadata={"help": "Eq. 2: first tokens excluded as attention sink"})
    local_window: int = field(default=32, metadata={"help": "Eq. 2: last tokens excluded as local attention"})
    dtype: str = field(default="auto", metadata={"help": "model dtype (auto keeps the checkpoint's)"})
    device: str | None = field(default=None, metadata={"help": "cpu / cuda; None picks cuda when available"})


def load_records(config: HotpotConfig) -> list[hotpotqa.HotpotRecord]:
    records = hotpotqa.load_hotpotqa(config.data) if config.data else hotpotqa.synthetic_hotpotqa(
        config.questions, config.seed)
    if len(records) < config.questions:
        raise DynheadsError(f"{config.data} holds {len(records)} questions, fewer than questions={config.questions}")
    return records


def hotpot_samples(config: HotpotConfig, tokenizer) -> list[hotpotqa.HotpotSample]:
    """Question i goes to grid cell i mod (lengths x depths), so every cell gets questions of every type."""
    if multihop.is_source(config.data):
        return multihop.grid_samples(tokenizer, questions=config.questions, lengths=config.lengths,
                                     depths=config.depths, seed=config.seed, form=multihop.parse_source(config.data))
    cells = list(product(config.lengths, config.depths))
    if not cells or config.questions < 1:
        raise DynheadsError("the HotpotQA grid is empty: give at least one length, one depth and questions >= 1")
    records = load_records(config)
    pool = hotpotqa.paragraph_pool(records)
    samples = []
    for index, record in enumerate(records[: config.questions]):
        length, depth = cells[index % len(cells)]
        samples.append(hotpotqa.make_sample(
            tokenizer, record, context_tokens=length, depth=depth,
            seed=derive_seed(config.seed, record.id, length, depth), distractors=pool,
            sample_id=f"q{index:04d}-len{length}-depth{depth:g}"))
    return samples


def qa_score(sample, generated: str) -> dict[str, float]:
    """The metrics of one answer: multihop's (EM/F1 + accuracy) for its samples, HotpotQA's official EM/F1 else."""
    if isinstance(sample, multihop.MultihopSample):
        return multihop.score(sample.answer, generated)
    return hotpotqa.score(sample.answer, generated)


def run_hotpotqa(
    config: HotpotConfig,
    out: str | Path,
    *,
    lm: LoadedModel | None = None,
    progress: bool = True,
    on_sample: Callable[[dict], None] | None = None,
) -> RunDir:
    """Trace every question into ``out`` (Eq. 2 scores per head and step); resumable."""
    lm = lm or load_model(config.model, dtype=config.dtype, device=config.device)
    samples = hotpot_samples(config, lm.tokenizer)
    prompt = {"system": hotpotqa.SYSTEM_PROMPT, "user": hotpotqa.USER_TEMPLATE,
              "paragraph": hotpotqa.PARAGRAPH_TEMPLATE,
              "data": config.data or "synthetic (dynheads.tasks.hotpotqa.synthetic_hotpotqa)"}
    if multihop.is_source(config.data):
        prompt = {"system": multihop.SYSTEM_PROMPT, "user": multihop.USER_TEMPLATE, "data": config.data,
                  "form": asdict(multihop.parse_source(config.data))}
    run = RunDir(out)
    run.start("hotpotqa", config, lm, {"prompt": prompt, "prompt_template": samples[0].prompt_template})
    return trace_samples(run, lm, samples, qa_score,
                         max_new_tokens=config.max_new_tokens, sink_size=config.sink_size,
                         local_window=config.local_window, desc="hotpotqa", progress=progress, on_sample=on_sample)
