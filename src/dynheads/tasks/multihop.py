"""The key-value lookup (one hop, the default form: registered as ``kv_lookup``) and two-hop key-value retrieval
(``multihop:hops=2``, registered as ``multihop``), RULER-style, solvable by small models.

Short facts are scattered through the NIAH haystack (``niah.load_haystack``)::

    hop 1   "The code of the tiger is the lamp."
    hop 2   "The magic word for the lamp is 482913."
    question (two hops)  "What is the magic word for the code of the tiger?"
    question (one hop)   "What is the magic word for the lamp?"

Distractor facts have exactly the same two forms, with other invented names and values (chains of their own),
so a fact can only be told from a distractor by its key. Keys are seeded common nouns (distinct within a
sample: a small model matches whole familiar words far better than invented names); values are random (a
6-digit number, an invented word or 8 hex digits) that do not occur in the haystack, so nothing can be guessed
without the context.

Placement (``placement=uniform``, the default): the value facts (the gold one and each distractor chain's) sit at
uniform depths, the gold one the ``gold_rank``-th of them (``candidates.balanced_positions``; the grid cycles the
rank with ``candidates.gold_rank_of``), so fact order is balanced and the gold fact's position is uniform over the
context; other facts sit at uniform depths. ``placement=depth``: the supporting facts sit inside a window of
``spread`` (a share of the haystack) whose position is ``depth`` (0: the window starts the context, 1: it ends
it), in seeded order; distractors at seeded uniform depths. Every fact is moved back to the nearest sentence end,
as the NIAH needle is. Length convention as NIAH:
``context_tokens`` counts the haystack *with* every fact, in the model's tokens (the realised count is in
``meta``). Supporting-fact token spans come from character offsets of the rendered prompt, never from matching
tokens. Samples carry every field the HotpotQA-side runners read (``HotpotSample``'s).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeGuard

from dynheads.config import Rule
from dynheads.errors import DynheadsError
from dynheads.tasks import candidates, hotpotqa, qa_metrics
from dynheads.tasks.forms import PLACEMENT_RULE, check_form, parse_form
from dynheads.tasks.grid import QuestionGrid, TaskGrid, generated_questions, generated_task_grid
from dynheads.tasks.niah import haystack_of_length, load_haystack, sentence_end_before
from dynheads.tasks.prompting import (
    chat_template_kwargs,
    context_spans,
    render_chat,
)
from dynheads.tasks.registry import Task, register
from dynheads.tasks.sample import Sample

if TYPE_CHECKING:  # transformers is imported by the code that loads a tokenizer, not by the task's module
    from transformers import PreTrainedTokenizerBase

SOURCE = "multihop"  # the ``data`` value that selects this task wherever HotpotQA questions are read
SYSTEM_PROMPT = "You are a helpful AI bot that answers questions for a user. Keep your response short and direct."
USER_TEMPLATE = (
    "Context:\n{context}\n\nQuestion:\n{question}\n\n"
    "Instruction:\nAnswer with the magic word only, exactly as it is written in the document."
)
HOP1_TEMPLATE = "The code of the {key} is the {bridge}."
HOP2_TEMPLATE = "The magic word for the {bridge} is {value}."
QUESTION_TWO_HOPS = "What is the magic word for the code of the {key}?"
QUESTION_ONE_HOP = "What is the magic word for the {bridge}?"

_ECHO = re.compile(
    r"^(?:the\s+)?magic\s+word(?:\s+for\s+(?:the\s+)?(?:code\s+of\s+(?:the\s+)?)?[\w-]+)?"
    r"\s*(?:is\b|:|=)\s*",
    re.IGNORECASE,
)
VALUE_FORMATS = ("number", "word", "hex")
# Keys and bridges: common concrete nouns (one or two tokens each), drawn without replacement within a sample
# (RULER's multi-key words pair them with adjectives).
COMMON_NOUNS = (
    "tiger",
    "lamp",
    "river",
    "violin",
    "carrot",
    "hammer",
    "castle",
    "dolphin",
    "pencil",
    "mirror",
    "garden",
    "rocket",
    "blanket",
    "candle",
    "ladder",
    "pepper",
    "helmet",
    "wallet",
    "kettle",
    "saddle",
    "tunnel",
    "lemon",
    "parrot",
    "compass",
    "anchor",
    "basket",
    "bucket",
    "camel",
    "cherry",
    "donkey",
    "eagle",
    "feather",
    "forest",
    "giraffe",
    "guitar",
    "harbor",
    "island",
    "jacket",
    "kitten",
    "lantern",
    "magnet",
    "meadow",
    "needle",
    "onion",
    "orange",
    "panda",
    "pillow",
    "pirate",
    "rabbit",
    "saucer",
    "shovel",
    "spider",
    "statue",
    "teapot",
    "tomato",
    "trumpet",
    "turtle",
    "umbrella",
    "valley",
    "walrus",
    "whistle",
    "zebra",
    "acorn",
    "badger",
    "barrel",
    "beetle",
    "button",
    "cactus",
    "canoe",
    "cobra",
    "cookie",
    "crayon",
    "falcon",
    "ferret",
    "fountain",
    "glacier",
    "goose",
    "hippo",
    "iceberg",
    "jaguar",
    "koala",
    "lizard",
    "lobster",
    "mango",
    "monkey",
    "mustard",
    "octopus",
    "otter",
    "peacock",
    "pelican",
    "penguin",
    "pumpkin",
    "raccoon",
    "salmon",
    "scooter",
    "squirrel",
    "tractor",
    "walnut",
)


FORM_RULES: dict[str, Rule] = {
    "hops": (lambda hops: hops in (1, 2), "1 or 2"),
    "distractors": (lambda count: count >= 0, ">= 0"),
    "value": (lambda value: value in VALUE_FORMATS, f"one of {', '.join(VALUE_FORMATS)}"),
    "spread": (lambda spread: 0.0 <= spread <= 1.0, "between 0 and 1"),
    "placement": PLACEMENT_RULE,
}


@dataclass(frozen=True)
class MultihopForm:
    """What a question looks like; ``multihop:hops=2,distractors=6,value=word`` spells one in a ``data`` field."""

    # Defaults: the form the embedded SmolLM2-135M answers (full-context EM 0.70, hidden 0.00, docs/multihop.md);
    # two hops (EM 0.26 there) is for larger models: multihop:hops=2.
    hops: int = field(default=1, metadata={"help": "1: the value fact alone; 2: code fact then value fact"})
    distractors: int = field(default=2, metadata={"help": "distractor facts (same two forms, other names)"})
    value: str = field(default="number", metadata={"help": "answer format: number (6 digits), word, hex (8)"})
    spread: float = field(default=0.25, metadata={"help": "placement=depth: share of the haystack the facts span"})
    placement: str = field(
        default="uniform",
        metadata={"help": "uniform (value facts at uniform depths, the gold one by fact order) or depth"},
    )

    def __post_init__(self) -> None:
        check_form(SOURCE, self, FORM_RULES)

    @property
    def candidates(self) -> int:
        """Same-form candidates in the context: the gold value fact and each distractor chain's value fact."""
        return 1 + self.distractors // 2

    @property
    def type(self) -> str:
        return "two-hop" if self.hops == 2 else "one-hop"

    @property
    def label(self) -> str:
        """How cards, manifests and pages name the form: one hop is a key-value lookup, not multi-hop."""
        return "Multi-hop" if self.hops == 2 else "Key-value lookup"


def is_source(data: str | None) -> TypeGuard[str]:
    """Whether a ``data`` value names this task (``multihop`` or ``multihop:key=value,...``)."""
    return data is not None and (data == SOURCE or data.startswith(SOURCE + ":"))


def parse_source(data: str) -> MultihopForm:
    """``multihop[:hops=1,distractors=2,value=number,spread=0.25]`` -> the form (defaults for what is left out)."""
    if not is_source(data):
        raise DynheadsError(f"{data!r} does not name the multihop task (use {SOURCE} or {SOURCE}:hops=2,...)")
    return parse_form(SOURCE, data[len(SOURCE) + 1 :], MultihopForm)


MultihopSample = Sample  # a multi-hop sample is a ``Sample`` with ``hotpotqa.QAExtras``


@dataclass(frozen=True)
class _Chain:
    key: str
    bridge: str
    value: str

    def facts(self) -> list[str]:
        return [
            HOP1_TEMPLATE.format(key=self.key, bridge=self.bridge),
            HOP2_TEMPLATE.format(bridge=self.bridge, value=self.value),
        ]


class _Names:
    """Seeded keys (nouns) and values, unique within a sample; values (and invented words) absent from the haystack."""

    def __init__(self, rng: random.Random, haystack: str):
        self.rng, self.haystack, self.used = rng, haystack.lower(), set[str]()

    def word(self, syllables: tuple[int, ...] = (2, 3)) -> str:
        for _ in range(1000):
            word = "".join(self.rng.choice(hotpotqa.SYLLABLES) for _ in range(self.rng.choice(syllables)))
            if word not in self.used and word not in self.haystack:
                self.used.add(word)
                return word
        raise DynheadsError("the multihop name space is exhausted: use fewer distractors")

    def value(self, kind: str) -> str:
        if kind == "word":
            return self.word((3, 4))
        for _ in range(1000):
            value = str(self.rng.randint(100000, 999999)) if kind == "number" else f"{self.rng.getrandbits(32):08x}"
            if value not in self.used and value not in self.haystack:
                self.used.add(value)
                return value
        raise DynheadsError("cannot draw a value absent from the haystack")

    def noun(self) -> str:
        free = [noun for noun in COMMON_NOUNS if noun not in self.used]
        if not free:
            raise DynheadsError(
                f"the multihop key space ({len(COMMON_NOUNS)} nouns) is exhausted: use fewer distractors"
            )
        noun = self.rng.choice(free)
        self.used.add(noun)
        return noun

    def chain(self, kind: str) -> _Chain:
        return _Chain(self.noun(), self.noun(), self.value(kind))


@dataclass(frozen=True)
class _Question:
    """The chains of one question: the gold chain with its supporting facts (the value fact alone for one hop),
    the distractor chains with their facts, and the question asked."""

    gold: _Chain
    supporting: list[str]
    chains: list[_Chain]
    distractors: list[str]
    question: str

    @property
    def values(self) -> dict[str, str]:
        """Each value fact (the gold chain's and each distractor chain's) -> its value."""
        return {HOP2_TEMPLATE.format(bridge=c.bridge, value=c.value): c.value for c in [self.gold, *self.chains]}


def _question(names: _Names, form: MultihopForm) -> _Question:
    """Draw the gold chain, then the distractor chains (``distractors`` facts of them)."""
    gold = names.chain(form.value)
    supporting = gold.facts()[2 - form.hops :]  # one hop: the value fact alone
    chains = [names.chain(form.value) for _ in range((form.distractors + 1) // 2)]
    distractors = [fact for chain in chains for fact in chain.facts()][: form.distractors]
    if form.hops == 2:
        question = QUESTION_TWO_HOPS.format(key=gold.key)
    else:
        question = QUESTION_ONE_HOP.format(bridge=gold.bridge)
    return _Question(gold, supporting, chains, distractors, question)


def _haystack_text(tokenizer: PreTrainedTokenizerBase, source: str, facts: list[str], context_tokens: int) -> str:
    """The haystack that ``context_tokens`` leaves beside ``facts``."""
    fact_tokens = sum(len(tokenizer(" " + f, add_special_tokens=False)["input_ids"]) for f in facts)
    budget = context_tokens - fact_tokens
    if budget < 16:
        raise DynheadsError(
            f"context_tokens={context_tokens} is too short for {len(facts)} facts "
            f"({fact_tokens} tokens): use a longer context or fewer distractors"
        )
    return haystack_of_length(tokenizer, source, budget)


def make_sample(
    tokenizer: PreTrainedTokenizerBase,
    *,
    context_tokens: int,
    depth: float,
    seed: int,
    form: MultihopForm = MultihopForm(),
    haystack: str | None = None,
    sample_id: str | None = None,
    chat_template_kwargs: Mapping[str, object] | None = None,
    gold_rank: int = 0,
) -> Sample:
    """One seeded question with ``context_tokens`` haystack tokens (facts included): the gold value fact the
    ``gold_rank``-th value fact in the context (``placement=uniform``), or the supporting facts at ``depth``."""
    if not 0.0 <= depth <= 1.0:
        raise DynheadsError(f"depth must be between 0 and 1, got {depth}")
    source = load_haystack(haystack)
    rng = random.Random(seed)
    drawn = _question(_Names(rng, source), form)
    supporting, distractors, values = drawn.supporting, drawn.distractors, drawn.values
    facts = supporting + distractors
    text = _haystack_text(tokenizer, source, facts, context_tokens)
    depths = _depths(rng, form, supporting, distractors, [f for f in distractors if f in values], depth, gold_rank)
    placed = sorted(facts, key=lambda f: (sentence_end_before(text, round(depths[f] * len(text))), depths[f]))
    context, offsets = _insert(text, [(sentence_end_before(text, round(depths[f] * len(text))), f) for f in placed])

    user = USER_TEMPLATE.format(context=context, question=drawn.question)
    prompt = render_chat(tokenizer, SYSTEM_PROMPT, user, chat_template_kwargs)
    pieces = [(offsets[fact], offsets[fact] + len(fact), fact, f"supporting fact {fact!r}") for fact in supporting]
    spans, positions, (first, last) = context_spans(tokenizer, prompt, context, pieces)
    record_id = f"multihop-{seed}"
    in_order = [values[fact] for fact in placed if fact in values]
    fact_depths = [round((start - first) / max(last - first, 1), 4) for start, _ in spans]
    return hotpotqa.qa_sample(
        tokenizer,
        prompt,
        context,
        sample_id=sample_id or f"{record_id}-len{context_tokens}-depth{depth:g}",
        needle_positions=positions,
        answer=drawn.gold.value,
        context_tokens=context_tokens,
        depth=depth,
        seed=seed,
        extras=hotpotqa.QAExtras(
            question=drawn.question,
            type=form.type,
            record_id=record_id,
            supporting_facts=[(fact, hop) for hop, fact in enumerate(supporting, 3 - form.hops)],
            supporting_spans=spans,
            context_span=(first, last),
        ),
        meta={
            "form": asdict(form),
            "distractor_facts": distractors,
            "fact_order": [placed.index(fact) for fact in supporting],  # rank of each supporting fact in the text
            # same-form candidates: the values of every value fact, in context order (chance, heuristics)
            candidates.CANDIDATES: in_order,
            candidates.GOLD_RANK: in_order.index(drawn.gold.value),
            candidates.DEPTHS: [round(offsets[f] / max(len(context), 1), 4) for f in placed if f in values],
            "fact_depths": fact_depths,
            "depth_realised": round(sum(fact_depths) / len(fact_depths), 4),
        },
    )


def _depths(
    rng: random.Random,
    form: MultihopForm,
    supporting: list[str],
    distractors: list[str],
    distractor_values: list[str],
    depth: float,
    gold_rank: int,
) -> dict[str, float]:
    """Each fact's depth (share of the haystack). ``uniform``: the value facts (the gold one, supporting[-1], and
    ``distractor_values``) from ``candidates.balanced_positions`` (the gold one the ``gold_rank``-th), every other
    fact at a uniform depth. ``depth``: the supporting facts in seeded order inside a window of ``spread`` at
    ``depth``, distractors at uniform depths."""
    if form.placement == "uniform":
        value_facts = [supporting[-1], *distractor_values]
        depths = dict(zip(value_facts, candidates.balanced_positions(rng, len(value_facts), gold_rank), strict=True))
        depths.update({fact: rng.random() for fact in supporting + distractors if fact not in depths})
        return depths
    order = list(range(len(supporting)))
    rng.shuffle(order)  # the hops appear in either order in the text
    start = depth * (1.0 - form.spread)
    step = form.spread / max(len(supporting) - 1, 1)
    depths = {supporting[i]: start + rank * step for rank, i in enumerate(order)}
    depths.update({fact: rng.random() for fact in distractors})
    return depths


def _insert(text: str, items: list[tuple[int, str]]) -> tuple[str, dict[str, int]]:
    """Insert each fact at its character cut (cuts ascending), space-separated; the facts' offsets in the result."""
    pieces: list[str] = []
    offsets, previous, length = {}, 0, 0
    for cut, fact in items + [(len(text), "")]:
        for piece, is_fact in ((text[previous:cut].strip(), False), (fact, True)):
            if not piece:
                continue
            length += 1 if pieces else 0  # the joining space
            if is_fact:
                offsets[piece] = length
            pieces.append(piece)
            length += len(piece)
        previous = cut
    return " ".join(pieces), offsets


def grid_samples(
    tokenizer: PreTrainedTokenizerBase,
    grid: QuestionGrid,
    *,
    form: MultihopForm = MultihopForm(),
    haystack: str | None = None,
    chat_template_kwargs: Mapping[str, object] | None = None,
) -> list[Sample]:
    """The questions of ``grid`` (``grid.generated_questions``: question i in cell i mod (lengths x depths),
    seeded by i alone, so disjoint index ranges are disjoint questions)."""
    return [
        make_sample(
            tokenizer,
            context_tokens=question.length,
            depth=question.depth,
            form=form,
            haystack=haystack,
            seed=question.seed,
            gold_rank=question.gold_rank,
            sample_id=question.sample_id,
            chat_template_kwargs=chat_template_kwargs,
        )
        for question in generated_questions(SOURCE, grid, form.candidates)
    ]


def extract_answer(generated: str) -> str:
    """HotpotQA's extraction (first sentence), less a restated question ("The magic word for X is ...") and quotes.

    Small chat models answer "The magic word for Tashkin is 482913." however they are told; the official EM
    would call that wrong, so the restatement (never the value) is dropped before EM/F1.
    """
    first = qa_metrics.extract_answer(generated)
    return _ECHO.sub("", first).strip().strip("\"'`*").strip()


def score(answer: str, generated: str, candidates_in_context: list[str] | None = None) -> dict[str, float]:
    """Official EM/F1 (``qa_metrics``' normalisation) of ``extract_answer``, and accuracy: the value appears verbatim;
    with the sample's candidates, ``distractor``: the answer is another value fact's value."""
    prediction = extract_answer(generated)
    scores = {**qa_metrics.score(answer, prediction, extract=False), "accuracy": float(answer in generated)}
    if candidates_in_context:
        scores["distractor"] = candidates.is_distractor(
            prediction, answer, candidates_in_context, qa_metrics.normalize_answer
        )
    return scores


# ---- the task: its grid and its registry entry -------------------------------------------------------------------
def multihop_grid(config: Any, tokenizer) -> TaskGrid:
    """Generated questions over the same cells as HotpotQA's grid; question i of the stream is seeded by i."""
    form = parse_source(config.data or SOURCE)
    template_kwargs = chat_template_kwargs(config.chat_template_kwargs)
    return generated_task_grid(
        config, lambda grid: grid_samples(tokenizer, grid, form=form, chat_template_kwargs=template_kwargs)
    )


def prompt_manifest(config: Any) -> dict:
    data = config.data or SOURCE
    form = parse_source(data)
    return {"system": SYSTEM_PROMPT, "user": USER_TEMPLATE, "data": data, "form": asdict(form), "label": form.label}


def _score(sample: Sample, text: str) -> dict[str, float]:
    return score(sample.answer, text, sample.meta.get("candidates"))


MULTIHOP_NAME, KV_LOOKUP_NAME = "multihop", "kv_lookup"
MULTIHOP = register(
    Task(
        name=MULTIHOP_NAME,
        label="Multi-hop",
        score_kind="reasoning",
        static_kind="reasoning",
        metrics=qa_metrics.QA_METRICS,
        score=_score,
        grid=multihop_grid,
        prompt=prompt_manifest,
        paper_task="hotpotqa",
        questions=True,
        fade_sparse_cells=True,
        help="synthetic two-hop key-value chains (multihop:hops=2), standing for HotpotQA on small models",
        data_source=SOURCE,
        selects=lambda data: parse_source(data).hops == 2,
        default_data=f"{SOURCE}:hops=2",
        implied_data=SOURCE,  # its grid's form when no data is given: an old ``multihop`` run is the one-hop lookup
    )
)
# the multihop task's one-hop form (multihop:hops=1, its default): everything else as MULTIHOP
KV_LOOKUP = register(
    replace(
        MULTIHOP,
        name=KV_LOOKUP_NAME,
        label="Key-value lookup",
        help="the multihop task's one-hop form: one key-value retrieval",
        selects=lambda data: parse_source(data).hops != 2,
        default_data=SOURCE,
    )
)
