"""Trace HotpotQA questions (real data from a file, or the seeded synthetic set) over a length x depth grid.

The questions are one named stream of the source (``split``, ``first``, ``questions``; see
``dynheads.tasks.questions``): the manifest records the stream and its question ids, so runs that fit
something (static reasoning heads, probes) can be checked against runs that evaluate it. (question, cell)
pairs whose gold paragraphs exceed the cell's length are skipped and counted in the manifest.
``hotpot_samples`` is the one place that turns a ``data`` value into QA questions: a HotpotQA file/folder,
None (synthetic HotpotQA), or ``multihop[:options]`` (the synthetic multi-hop key-value task,
``dynheads.tasks.multihop``). Every HotpotQA-side runner (tracing, ablation, RAG) reads its questions here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from itertools import product
from pathlib import Path

from dynheads.errors import DynheadsError
from dynheads.experiments.settings import HotpotConfig
from dynheads.experiments.tracing import run_traced
from dynheads.io import read_json
from dynheads.models import LoadedModel
from dynheads.runs import RunDir
from dynheads.seeding import derive_seed
from dynheads.tasks import hotpotqa, multihop
from dynheads.tasks.prompting import chat_template_kwargs
from dynheads.tasks.questions import QuestionStream, refuse_overlap


def load_records(config: HotpotConfig) -> list[hotpotqa.HotpotRecord]:
    """The whole question source (the synthetic set is generated up to the end of this config's stream)."""
    stream = config.stream()
    if config.data:
        return hotpotqa.load_hotpotqa(config.data)
    return hotpotqa.synthetic_hotpotqa(stream.stop, config.seed)


@dataclass(frozen=True)
class HotpotGrid:
    """The samples of a grid run, the questions of its stream, and the (question, cell) pairs it skipped."""

    samples: list[hotpotqa.HotpotSample]
    stream: QuestionStream
    question_ids: list[str]  # record ids of the stream, in source order (also those skipped in every cell)
    skipped: list[dict]  # {"record_id", "length", "depth", "reason"} per skipped (question, cell) pair

    def skip_counts(self) -> dict:
        """Skipped pairs in total, by reason and by cell ("length/depth"): what outputs report."""
        return {"count": len(self.skipped),
                "by_reason": dict(Counter(item["reason"] for item in self.skipped)),
                "by_cell": dict(Counter(f"{item['length']}/{item['depth']:g}" for item in self.skipped))}

    def manifest(self) -> dict:
        """The manifest entries every HotpotQA consumer writes: its questions (split, range, ids) and skips."""
        return {"questions": self.stream.describe(self.question_ids),
                "skipped": {**self.skip_counts(), "pairs": self.skipped}}

    def skip_note(self) -> str:
        """One line for markdown and CLI output ('' when nothing was skipped)."""
        if not self.skipped:
            return ""
        reasons = "; ".join(f"{count} {reason}" for reason, count in self.skip_counts()["by_reason"].items())
        return f"{len(self.skipped)} (question, cell) pairs skipped ({reasons}); their cells count no sample"


def hotpot_grid(config: HotpotConfig, tokenizer) -> HotpotGrid:
    """Question i of the stream goes to grid cell i mod (lengths x depths), so every cell gets questions of every
    type. A question whose gold paragraphs exceed its cell's length is skipped and counted, never fatal."""
    cells = list(product(config.lengths, config.depths))
    if not cells:
        raise DynheadsError("the HotpotQA grid is empty: give at least one length and one depth")
    stream = config.stream()
    template_kwargs = chat_template_kwargs(config.chat_template_kwargs)
    if multihop.is_source(config.data):  # generated questions: question i of the stream is seeded by i
        samples = multihop.grid_samples(tokenizer, questions=stream.count, first=stream.first,
                                        lengths=config.lengths, depths=config.depths, seed=config.seed,
                                        form=multihop.parse_source(config.data),
                                        chat_template_kwargs=template_kwargs)
        return HotpotGrid(samples, stream, [sample.record_id for sample in samples], [])
    records = load_records(config)
    chosen = stream.take(records, config.data or "the synthetic set")
    pool = hotpotqa.paragraph_pool(records)
    samples, skipped = [], []
    for index, record in enumerate(chosen, start=stream.first):
        length, depth = cells[index % len(cells)]
        try:
            samples.append(hotpotqa.make_sample(
                tokenizer, record, context_tokens=length, depth=depth,
                seed=derive_seed(config.seed, record.id, length, depth), distractors=pool,
                sample_id=f"q{index:04d}-len{length}-depth{depth:g}", chat_template_kwargs=template_kwargs))
        except hotpotqa.GoldTooLong as error:
            skipped.append({"record_id": record.id, "length": length, "depth": depth, "reason": error.reason})
    if not samples:
        raise DynheadsError(f"all {len(chosen)} (question, cell) pairs were skipped ({skipped[0]['reason']}): "
                            "use longer --lengths or other questions")
    return HotpotGrid(samples, stream, [record.id for record in chosen], skipped)


def refuse_static_overlap(static: str | Path, evaluated: list[str], evaluator: str) -> None:
    """Refuse a static head list scored on a run (its folder's manifest records the questions) that shares
    questions with ``evaluated``; a list from elsewhere (a file with no run manifest beside it) passes."""
    manifest = Path(static).parent / "manifest.json"
    questions = read_json(manifest).get("questions") if manifest.is_file() else None
    if questions:
        refuse_overlap(questions["ids"], f"the static head list {static}", evaluated, evaluator)


def hotpot_samples(config: HotpotConfig, tokenizer) -> list[hotpotqa.HotpotSample]:
    """The samples of ``hotpot_grid`` (skipped pairs left out)."""
    return hotpot_grid(config, tokenizer).samples


def qa_score(sample, generated: str) -> dict[str, float]:
    """The metrics of one answer: multihop's (EM/F1 + accuracy) for its samples, HotpotQA's official EM/F1 else."""
    if isinstance(sample, multihop.MultihopSample):
        return multihop.score(sample.answer, generated)
    return hotpotqa.score(sample.answer, generated)


def run_hotpotqa(config: HotpotConfig, out: str | Path, *, lm: LoadedModel | None = None, progress: bool = True,
                 on_sample: Callable[[dict], None] | None = None, batch_size: int = 1,
                 device_map: str | None = None) -> RunDir:
    """Trace every question into ``out`` (Eq. 2 scores per head and step); resumable."""

    def prepare(tokenizer) -> tuple[list, dict]:
        grid = hotpot_grid(config, tokenizer)
        samples = grid.samples
        prompt = {"system": hotpotqa.SYSTEM_PROMPT, "user": hotpotqa.USER_TEMPLATE,
                  "paragraph": hotpotqa.PARAGRAPH_TEMPLATE,
                  "data": config.data or "synthetic (dynheads.tasks.hotpotqa.synthetic_hotpotqa)"}
        if multihop.is_source(config.data):
            prompt = {"system": multihop.SYSTEM_PROMPT, "user": multihop.USER_TEMPLATE, "data": config.data,
                      "form": asdict(multihop.parse_source(config.data))}
        return samples, {"prompt": prompt, "prompt_template": samples[0].prompt_template, **grid.manifest(),
                         "chat_template_kwargs": samples[0].chat_template_kwargs}

    return run_traced("hotpotqa", config, out, prepare, qa_score, lm=lm, device_map=device_map, progress=progress,
                      on_sample=on_sample, batch_size=batch_size)
