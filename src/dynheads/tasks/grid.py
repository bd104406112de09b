"""Grid samples of each task: a config's lengths x depths (x runs or questions) turned into ``Sample`` lists.

A builder takes the command's config (read by attribute: ``NiahConfig``, ``HotpotConfig`` or any object with
the same fields) and a tokenizer, and returns a ``TaskGrid``. Question tasks read one named stream of their
source (``split``, ``first``, ``questions``; ``dynheads.tasks.questions``): the grid records the stream and its
question ids, so runs that fit something (static reasoning heads, probes) can be checked against runs that
evaluate it. (question, cell) pairs whose gold paragraphs exceed the cell's length are skipped and counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from dynheads.errors import DynheadsError
from dynheads.seeding import derive_seed
from dynheads.tasks import hotpotqa, multihop, niah, ruler
from dynheads.tasks.prompting import chat_template_kwargs
from dynheads.tasks.questions import QuestionStream
from dynheads.tasks.sample import Sample


@dataclass(frozen=True)
class TaskGrid:
    """The samples of a grid run; for question tasks the stream, its question ids and the skipped pairs."""

    samples: list[Sample]
    stream: QuestionStream | None = None  # None: the task has no question stream (NIAH)
    question_ids: list[str] = field(default_factory=list)  # record ids of the stream, in source order
    skipped: list[dict] = field(default_factory=list)  # {"record_id", "length", "depth", "reason"} per pair
    source: dict = field(default_factory=dict)  # where the questions come from (a packaged set: wheels, sha256)

    def skip_counts(self) -> dict:
        """Skipped pairs in total, by reason and by cell ("length/depth"): what outputs report."""
        return {"count": len(self.skipped),
                "by_reason": dict(Counter(item["reason"] for item in self.skipped)),
                "by_cell": dict(Counter(f"{item['length']}/{item['depth']:g}" for item in self.skipped))}

    def manifest(self) -> dict:
        """The manifest entries of a question task: its questions (split, range, ids) and skips ({} for NIAH)."""
        if self.stream is None:
            return {}
        return {"questions": self.stream.describe(self.question_ids),
                "skipped": {**self.skip_counts(), "pairs": self.skipped},
                **({"source": self.source} if self.source else {})}

    def skip_note(self) -> str:
        """One line for markdown and CLI output ('' when nothing was skipped)."""
        if not self.skipped:
            return ""
        reasons = "; ".join(f"{count} {reason}" for reason, count in self.skip_counts()["by_reason"].items())
        return f"{len(self.skipped)} (question, cell) pairs skipped ({reasons}); their cells count no sample"


def niah_grid(config: Any, tokenizer) -> TaskGrid:
    """The NIAH grid, seeded per (split, length, depth, run) so any subset is reproducible (runs vary fastest)."""
    if not config.lengths or not config.depths or config.runs < 1:
        raise DynheadsError("the NIAH grid is empty: give at least one length, one depth and runs >= 1")
    template_kwargs = chat_template_kwargs(config.chat_template_kwargs)
    samples = []
    for length, depth, run in product(config.lengths, config.depths, range(config.runs)):
        seed = derive_seed(config.seed, config.split, length, depth, run)
        samples.append(niah.make_sample(tokenizer, context_tokens=length, depth=depth, seed=seed,
                                        haystack=config.haystack,
                                        sample_id=f"{config.split}-len{length}-depth{depth:g}-run{run}",
                                        distractor_depth=config.distractor_depth,
                                        distractor_prefix=config.distractor_prefix,
                                        chat_template_kwargs=template_kwargs))
    return TaskGrid(samples)


def question_stream(config: Any) -> QuestionStream:
    """Questions ``first .. first + questions - 1`` of the config's data, named ``split``."""
    return QuestionStream(config.split, config.first, config.questions)


def load_records(config: Any) -> list[hotpotqa.HotpotRecord]:
    """The whole HotpotQA source (the synthetic set is generated up to the end of the config's stream)."""
    if config.data:
        return hotpotqa.load_hotpotqa(config.data)
    return hotpotqa.synthetic_hotpotqa(question_stream(config).stop, config.seed)


def _cells(config: Any) -> list[tuple[int, float]]:
    cells = list(product(config.lengths, config.depths))
    if not cells:
        raise DynheadsError("the HotpotQA grid is empty: give at least one length and one depth")
    return cells


def hotpotqa_grid(config: Any, tokenizer) -> TaskGrid:
    """Question i of the stream goes to grid cell i mod (lengths x depths), so every cell gets questions of every
    type. A question whose gold paragraphs exceed its cell's length is skipped and counted, never fatal."""
    cells = _cells(config)
    stream = question_stream(config)
    template_kwargs = chat_template_kwargs(config.chat_template_kwargs)
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
    return TaskGrid(samples, stream, [record.id for record in chosen], skipped, hotpotqa.describe_source(config.data))


def multihop_grid(config: Any, tokenizer) -> TaskGrid:
    """Generated questions over the same cells as HotpotQA's grid; question i of the stream is seeded by i."""
    _cells(config)
    stream = question_stream(config)
    form = multihop.parse_source(config.data or multihop.SOURCE)
    samples = multihop.grid_samples(tokenizer, questions=stream.count, first=stream.first, lengths=config.lengths,
                                    depths=config.depths, seed=config.seed, form=form,
                                    chat_template_kwargs=chat_template_kwargs(config.chat_template_kwargs))
    return TaskGrid(samples, stream, [sample.record_id for sample in samples])



def ruler_grid(name: str, default: str | None = None):
    """The grid builder of RULER task ``name`` (``variable_tracking`` or ``multikey_niah``): its questions over the
    same cells as HotpotQA's grid; ``config.data`` spells the form (None: ``default``, else the task's defaults).
    Question i of the stream is seeded by i and its fact order cycles (``ruler.gold_rank_of``)."""

    def grid(config: Any, tokenizer) -> TaskGrid:
        _cells(config)
        data = config.data or default or name
        if ruler.source_of(data) != name:
            raise DynheadsError(f"the {name} task reads {name}[:options] data, got {data!r}")
        stream = question_stream(config)
        samples = ruler.grid_samples(tokenizer, data=data, questions=stream.count, first=stream.first,
                                     lengths=config.lengths, depths=config.depths, seed=config.seed,
                                     chat_template_kwargs=chat_template_kwargs(config.chat_template_kwargs))
        return TaskGrid(samples, stream, [sample.record_id for sample in samples])

    return grid
