"""The task ``custom``: your own data, one JSON object per line, each context traced as written.

    {"id": "q1", "context": "...", "question": "...", "answer": "...", "spans": [[start, stop], ...]}

``spans`` (optional) are character ``[start, stop)`` offsets into ``context``; without them the needle is every
occurrence of ``answer`` in the context. Other keys are ignored. A record is rendered with the QA prompt
(``dynheads.tasks.hotpotqa``'s system prompt and user template) through ``own_text.sample_from_text``: no padding,
no distractors, no lengths or depths. Every head is scored at every step with Eq. 1 and Eq. 2 against the spans;
D_t is Eq. 1's (the spans are what a head copies from); metrics are recall (the share of the answer's words in
the reply's first sentence: 1 when the answer is said inside a sentence), then the QA ones (EM, F1).

``check_data`` reads and checks the whole file without a tokenizer, so a bad record is named with its line number
at once; then it tokenises every record with the model's tokenizer alone (``models.load_tokenizer``: seconds, no
weights), so what only the tokenizer can tell (a span that tokenises away, a prompt plus its generation budget past
the model's window) is named, with its line, before the model loads.
``--questions`` caps the records traced and ``--first`` skips some (``dynheads trace --task custom --data FILE``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynheads.errors import DynheadsError
from dynheads.io import read_user_text
from dynheads.seeding import derive_seed
from dynheads.tasks import qa_metrics
from dynheads.tasks.grid import TaskGrid
from dynheads.tasks.hotpotqa import SYSTEM_PROMPT, USER_TEMPLATE
from dynheads.tasks.own_text import resolve_spans, sample_from_text
from dynheads.tasks.prompting import chat_template_kwargs
from dynheads.tasks.questions import QuestionStream
from dynheads.tasks.registry import Task, register

NAME = "custom"
# recall first: a chat model answers in a sentence, so the answer's words inside its reply decide (the KV table's
# accuracy, the summary line's first number); EM and F1 follow
CUSTOM_METRICS = {"recall": "recall", **qa_metrics.QA_METRICS}
FIELDS = ("id", "context", "question", "answer")  # required, each a string (an integer id is read as text)


@dataclass(frozen=True)
class TextRecord:
    """One line of a user's file, checked: ``spans`` are the character spans its needle is made of."""

    id: str
    context: str
    question: str
    answer: str
    spans: tuple[tuple[int, int], ...]
    line: int  # 1-based line of the file, for errors


def parse_line(raw: Any, line: int, source: str) -> TextRecord:
    """A record of line ``line``; errors read ``FILE line N (id 'x'): ...``."""
    record_id = raw.get("id") if isinstance(raw, dict) else None
    where = f"{source} line {line}" + (f" (id {record_id!r})" if record_id is not None else "")
    if not isinstance(raw, dict):
        raise DynheadsError(f"{where}: a record is a JSON object {{{', '.join(FIELDS)}, spans?}}")
    if isinstance(record_id, int) and not isinstance(record_id, bool):
        raw = {**raw, "id": str(record_id)}
    for name in FIELDS:
        if not isinstance(raw.get(name), str):
            problem = "is missing" if name not in raw else f"must be a string, got {type(raw[name]).__name__}"
            raise DynheadsError(f"{where}: field {name!r} {problem}")
    if not raw["id"] or not raw["context"].strip():
        raise DynheadsError(f"{where}: field {'id' if not raw['id'] else 'context'!r} is empty")
    if not qa_metrics.normalize_answer(raw["answer"]):
        raise DynheadsError(
            f"{where}: the answer {raw['answer']!r} has no word left once normalised for EM and F1 (lower case, "
            "ASCII punctuation and the articles a, an, the removed): every reply would score 0"
        )
    spans = raw.get("spans")
    if spans is not None and not isinstance(spans, list):
        raise DynheadsError(f"{where}: field 'spans' must be a list of [start, stop] character offsets")
    if spans is not None and any(isinstance(span, str) for span in spans):
        raise DynheadsError(f"{where}: field 'spans' takes [start, stop] character offsets, not text")
    if spans is not None and any(not isinstance(span, list) for span in spans):
        raise DynheadsError(f"{where}: field 'spans' is a list of [start, stop] pairs, e.g. [[0, 3]], got {spans!r}")
    try:
        found = resolve_spans(raw["context"], spans, raw["answer"])
    except DynheadsError as error:
        raise DynheadsError(f"{where}: {error}") from None
    return TextRecord(raw["id"], raw["context"], raw["question"], raw["answer"], tuple(found), line)


def load_records(path: str | Path) -> list[TextRecord]:
    """Every record of the JSONL file ``path``, checked (blank lines skipped; ids must not repeat)."""
    path = Path(path)
    lines = read_user_text(path, "data file").splitlines()  # UTF-8, a leading byte-order mark dropped
    records: list[TextRecord] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as error:
            raise DynheadsError(f"{path} line {number} is not valid JSON: {error.msg} (one record per line)") from None
        record = parse_line(raw, number, str(path))
        if record.id in seen:
            raise DynheadsError(f"{path} line {number}: id {record.id!r} repeats line {seen[record.id]}")
        seen[record.id] = number
        records.append(record)
    if not records:
        raise DynheadsError(f"{path} holds no records (one JSON object per line)")
    return records


def chosen_records(config: Any) -> list[TextRecord]:
    """The records a config traces: ``questions`` of them from index ``first`` (fewer when the file ends)."""
    if not config.data:
        raise DynheadsError(f"task {NAME!r} traces your own file: pass --data FILE.jsonl (docs/own-data.md)")
    records = load_records(config.data)
    chosen = records[config.first : config.first + config.questions]
    if not chosen:
        raise DynheadsError(f"{config.data} holds {len(records)} records: --first {config.first} leaves none")
    return chosen


def check_data(config: Any) -> None:
    """Read and check the config's file, then tokenise its records with the model's tokenizer (no weights): what
    the CLI runs before loading the model."""
    from dynheads.models import load_tokenizer

    chosen_records(config)  # a malformed record costs no tokenizer load
    check_tokenised(config, load_tokenizer(config.model))


def check_tokenised(config: Any, tokenizer: Any) -> None:
    """Refuse a record whose spans tokenise away, or whose prompt plus ``max_new_tokens`` exceeds the window of
    ``tokenizer`` (a ``models.LoadedTokenizer``), naming its line."""
    grid = custom_grid(config, tokenizer)
    window = getattr(tokenizer, "max_context", None)
    records = chosen_records(config)
    for sample, record in zip(grid.samples, records, strict=True):
        needed = len(sample.input_ids) + config.max_new_tokens
        if window is not None and needed > window:
            raise DynheadsError(
                f"{config.data} line {record.line} (id {record.id!r}): the prompt has {len(sample.input_ids)} "
                f"tokens + {config.max_new_tokens} new tokens, more than the model's context window of {window}"
            )


def custom_grid(config: Any, tokenizer) -> TaskGrid:
    """One sample per record, its context as written; its ``sample_id`` and ``record_id`` are the file's id (a
    run's files name it through ``runs.file_stem``)."""
    chosen = chosen_records(config)
    template_kwargs = chat_template_kwargs(config.chat_template_kwargs)
    samples = []
    for record in chosen:
        try:
            sample = sample_from_text(
                tokenizer,
                record.context,
                record.question,
                answer=record.answer,
                spans=list(record.spans),
                sample_id=record.id,
                record_id=record.id,
                chat_template_kwargs=template_kwargs,
                seed=derive_seed(config.seed, record.id),
            )
        except DynheadsError as error:
            raise DynheadsError(f"{config.data} line {record.line} (id {record.id!r}): {error}") from None
        samples.append(sample)
    stream = QuestionStream(config.split, config.first, len(chosen))
    return TaskGrid(samples, stream, [record.id for record in chosen], source={"data": str(config.data)})


def prompt_manifest(config: Any) -> dict:
    return {"system": SYSTEM_PROMPT, "user": USER_TEMPLATE, "data": config.data}


CUSTOM = register(
    Task(
        name=NAME,
        label="Your data",
        score_kind="copy",
        static_kind="copy",
        metrics=CUSTOM_METRICS,
        score=lambda sample, text: qa_metrics.score(sample.answer, text),
        grid=custom_grid,
        prompt=prompt_manifest,
        questions=True,
        check_data=check_data,
        help="your own JSONL file {id, context, question, answer, spans?}, each context traced as written",
        ignores=("lengths", "depths", "pad"),
    )
)
