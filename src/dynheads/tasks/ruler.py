"""RULER's variable tracking and multi-key NIAH (Hsieh et al. 2024), built to the definitions of its generators.

Both are question tasks (a stream of seeded questions spread over a lengths x depths grid, as HotpotQA's) whose
samples carry HotpotQA's ``QAExtras``, so every HotpotQA-side runner (tracing, ablation, RAG) runs them. Their
context is RULER's noise haystack, which needs no data: the line ``NOISE`` repeated, one unit per line, with the
task's statements inserted between lines.

**Variable tracking** (``variable_tracking[:hops=2,chains=3,query=value]``): each chain is a value statement
``VAR ABCDE = 12345`` followed by ``hops`` links ``VAR FGHIJ = VAR ABCDE`` (RULER's ``num_hops``), each link at a
later line than the one before; ``chains`` chains, one gold. Two questions:

- ``query=all`` (RULER's): "Find all variables that are assigned the value 12345": the answer is the gold
  chain's ``hops + 1`` variable names, scored by RULER's string match (share of the names in the output).
- ``query=value``: "What is the value of VAR <the chain's last variable>?": the answer is the gold chain's
  number, reached only by following all ``hops + 1`` statements back (hops = 0 is a one-fact key-value lookup).

**Multi-key NIAH** (``multikey_niah[:keys=4,haystack=noise]``): ``keys`` needles "One of the special magic numbers
for <key> is: <7 digits>." with distinct keys (RULER's adjective-noun words), the question names one key.
``haystack=needle`` fills the context with more needles of the same form instead of noise (RULER's
niah_multikey_2/3 haystack).

Fact order and positions: the gold value's rank among the candidate values cycles over the stream (``gold_rank``,
recorded per sample, balanced: ``candidates.gold_rank_of``). ``placement=uniform`` (the default, variable tracking
and multi-key NIAH alike): every chain's first statement (value statement, needle) takes a uniform line and the
gold one the ``gold_rank``-th of them (``candidates.balanced_positions``), so the gold statement's position is
uniform over the whole context and no rule on positions finds it; the grid's ``depth`` only names the cell.
``placement=depth`` (the former placement): the gold chain starts at ``depth`` of the context less its ``spread``
and the distractors take lines before or after it (with ``spread=0.5`` the gold value sat in the first half, and
"the last candidate in the first half" answered 0.64 of the key-value lookups). Links follow their chain's first
statement within ``spread`` of the context.
Each sample records its candidates in context order (``meta.candidates``, read by ``dynheads.tasks.candidates``),
the realised depth of each gold statement (``meta.fact_depths``, token
position over the context span) and their mean (``meta.depth_realised``). Eq. 2's needle (``needle_positions``)
is every token of the gold statements: the whole gold chain, or the gold needle.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from dynheads.config import Rule
from dynheads.errors import DynheadsError
from dynheads.tasks import candidates as cand
from dynheads.tasks import hotpotqa, qa_metrics
from dynheads.tasks.forms import PLACEMENT_RULE, check_form, parse_form
from dynheads.tasks.grid import QuestionGrid, TaskGrid, generated_questions, generated_task_grid
from dynheads.tasks.multihop import COMMON_NOUNS
from dynheads.tasks.prompting import (
    chat_template_kwargs,
    context_spans,
    render_chat,
)
from dynheads.tasks.registry import Task, register
from dynheads.tasks.sample import Sample

if TYPE_CHECKING:  # transformers is imported by the code that loads a tokenizer, not by the task's module
    from transformers import PreTrainedTokenizerBase

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."  # RULER's
SYSTEM_PROMPT = "You are a helpful AI bot that answers questions for a user. Keep your response short and direct."
VT_INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text."
VT_ALL = (
    "{intro}\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the text above. "
    "Answer with the {count} variable names only."
)
VT_VALUE = (
    "{intro}\n\n{context}\nQuestion: What is the value of VAR {query}? Follow the assignments back to a "
    "number and answer with the number only."
)
VALUE_STATEMENT = "VAR {var} = {value}"
LINK_STATEMENT = "VAR {var} = VAR {previous}"
NIAH_NEEDLE = "One of the special magic numbers for {key} is: {value}."
NIAH_USER = (
    "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you "
    "about the number afterwards.\n{context}\nWhat is the special magic number for {query} mentioned in the "
    "provided text?"
)
_ADJECTIVES = (
    "able",
    "bitter",
    "brave",
    "calm",
    "clever",
    "crisp",
    "damp",
    "eager",
    "fancy",
    "gentle",
    "glad",
    "grumpy",
    "happy",
    "hollow",
    "humble",
    "jolly",
    "kind",
    "lively",
    "lucky",
    "mellow",
    "misty",
    "noisy",
    "odd",
    "polite",
    "proud",
    "quick",
    "quiet",
    "rapid",
    "rough",
    "rusty",
    "shiny",
    "silent",
    "silly",
    "sleepy",
    "smooth",
    "sour",
    "spicy",
    "steady",
    "sticky",
    "sunny",
    "swift",
    "tame",
    "tender",
    "tidy",
    "tiny",
    "vast",
    "warm",
    "wild",
)
_NUMBER = re.compile(r"\d+")
_VARIABLE = re.compile(r"\b[A-Z]{5}\b")
VT_SOURCE, MK_SOURCE = "variable_tracking", "multikey_niah"
QUERIES = ("all", "value")
HAYSTACKS = ("noise", "needle")


PLACEMENT_HELP = "uniform (candidates at uniform positions, gold one by fact order) or depth (gold at the cell's depth)"


# ---- forms: what a ``data`` value spells ---------------------------------------------------------------------------
VT_RULES: dict[str, Rule] = {
    "hops": (lambda hops: 0 <= hops <= 10, "between 0 and 10"),
    "chains": (lambda chains: chains >= 1, ">= 1"),
    "query": (lambda query: query in QUERIES, f"one of {', '.join(QUERIES)}"),
    "spread": (lambda spread: 0.0 < spread <= 1.0, "in (0, 1]"),
    "placement": PLACEMENT_RULE,
}
MK_RULES: dict[str, Rule] = {
    "keys": (lambda keys: keys >= 1, ">= 1"),
    "haystack": (lambda haystack: haystack in HAYSTACKS, f"one of {', '.join(HAYSTACKS)}"),
    "placement": VT_RULES["placement"],
}


@dataclass(frozen=True)
class VTForm:
    """``variable_tracking:hops=2,chains=3,query=value,spread=0.5``."""

    hops: int = field(default=2, metadata={"help": "VAR-to-VAR links per chain (RULER's num_hops); facts = hops + 1"})
    chains: int = field(default=3, metadata={"help": "chains in the context, one gold (RULER's num_chains)"})
    query: str = field(default="value", metadata={"help": "value (the last variable's number) or all (RULER's)"})
    spread: float = field(default=0.5, metadata={"help": "share of the context a chain spans"})
    placement: str = field(default="uniform", metadata={"help": PLACEMENT_HELP})

    def __post_init__(self) -> None:
        check_form(VT_SOURCE, self, VT_RULES)
        if self.query == "all" and self.hops < 1:
            raise DynheadsError("variable_tracking query=all needs hops >= 1 (RULER's chains have links)")

    @property
    def candidates(self) -> int:
        return self.chains

    @property
    def type(self) -> str:
        if self.query == "value" and self.hops == 0:
            return "key-value lookup"
        return f"{self.hops + 1}-fact chain" if self.query == "value" else f"{self.hops}-hop chain, all variables"


@dataclass(frozen=True)
class MKForm:
    """``multikey_niah:keys=4,haystack=noise``."""

    keys: int = field(default=4, metadata={"help": "needles with distinct keys, one asked for (RULER's num_needle_k)"})
    haystack: str = field(default="noise", metadata={"help": "noise (RULER's repeat) or needle (more needles)"})
    placement: str = field(default="uniform", metadata={"help": PLACEMENT_HELP})

    def __post_init__(self) -> None:
        check_form(MK_SOURCE, self, MK_RULES)

    @property
    def candidates(self) -> int:
        return self.keys

    @property
    def type(self) -> str:
        return f"{self.keys}-key NIAH ({self.haystack} haystack)"


_FORMS = {VT_SOURCE: VTForm, MK_SOURCE: MKForm}


def source_of(data: str | None) -> str | None:
    """The task a ``data`` value names (``variable_tracking[:...]`` or ``multikey_niah[:...]``), else None."""
    if data is None:
        return None
    name = data.split(":", 1)[0]
    return name if name in _FORMS and (data == name or data.startswith(name + ":")) else None


def parse_source(data: str) -> VTForm | MKForm:
    """``variable_tracking:hops=2,chains=3`` -> its form (defaults for what is left out)."""
    name = source_of(data)
    if name is None:
        raise DynheadsError(f"{data!r} names no RULER task (use {VT_SOURCE}[:hops=2,...] or {MK_SOURCE}[:keys=4,...])")
    return parse_form(name, data[len(name) + 1 :], _FORMS[name])


def parse_vt(data: str) -> VTForm:
    """``parse_source`` of a ``variable_tracking[:...]`` value."""
    form = parse_source(data)
    if not isinstance(form, VTForm):
        raise DynheadsError(f"{data!r} is not a {VT_SOURCE} task")
    return form


def describe_form(data: str) -> dict:
    return asdict(parse_source(data))


# ---- placement -----------------------------------------------------------------------------------------------------
def _slots(
    rng: random.Random, lines: int, count: int, depth: float, spread: float, rank: int, links: int, placement: str
) -> list[list[int]]:
    """Line slots (0..lines: before line i) of each group's statements; group 0 is gold, and ``rank`` other groups
    start before it, the rest after it. ``uniform``: first slots from ``candidates.balanced_positions``;
    ``depth``: the gold group starts at ``depth`` of the lines its ``spread`` leaves, the others at uniform slots
    on its side. Within a group, slots ascend (a link comes after what it names, within ``spread``)."""
    width = max(1, round(spread * lines))

    def group(first: int) -> list[int]:
        return [first] + sorted(rng.randint(first, min(lines, first + width)) for _ in range(links))

    if placement == "uniform":
        return [group(min(int(p * (lines + 1)), lines)) for p in cand.balanced_positions(rng, count, rank)]
    start = round(depth * (lines - width)) if lines > width else 0
    groups = [group(start)]
    for k in range(count - 1):
        groups.append(group(rng.randint(0, start) if k < rank else rng.randint(start, lines)))
    return groups


def _assemble(
    lines: list[str], groups: list[list[int]], statements: list[list[str]], rank: int
) -> tuple[str, dict[tuple[int, int], int], list[int]]:
    """Insert each group's statements before their slot's line; ties keep: groups placed before the gold one, the
    gold one, groups after it (first statements), then links in chain order. Returns the context, each
    statement's character offset and the groups in the order their first statements appear."""
    keyed = []
    for g, (slots, texts) in enumerate(zip(groups, statements, strict=True)):
        side = 1 if g == 0 else 0 if g - 1 < rank else 2
        for j, (slot, text) in enumerate(zip(slots, texts, strict=True)):
            keyed.append(((slot, side if j == 0 else 3, j, g), g, j, text))
    keyed.sort(key=lambda item: item[0])
    pieces, offsets, length, at = [], {}, 0, 0
    for slot in range(len(lines) + 1):
        while at < len(keyed) and keyed[at][0][0] == slot:
            _, g, j, text = keyed[at]
            offsets[(g, j)] = length
            pieces.append(text)
            length += len(text) + 1
            at += 1
        if slot < len(lines):
            pieces.append(lines[slot])
            length += len(lines[slot]) + 1
    order = [g for _, g, j, _ in keyed if j == 0]
    return "\n".join(pieces), offsets, order


def _noise_lines(tokenizer: PreTrainedTokenizerBase, budget: int) -> int:
    per_line = len(tokenizer("\n" + NOISE, add_special_tokens=False)["input_ids"])
    return max(budget // per_line, 1)


class _Names:
    """Seeded names unique within a sample: RULER's 5-letter variables, 5- or 7-digit values, adjective-noun keys."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set[str]()

    def _fresh(self, draw) -> str:
        for _ in range(10000):
            name = draw()
            if name not in self.used:
                self.used.add(name)
                return name
        raise DynheadsError("the RULER name space is exhausted: use fewer chains or keys")

    def variable(self) -> str:
        return self._fresh(lambda: "".join(self.rng.choices(string.ascii_uppercase, k=5)))

    def number(self, digits: int) -> str:
        return self._fresh(lambda: str(self.rng.randint(10 ** (digits - 1), 10**digits - 1)))

    def key(self) -> str:
        return self._fresh(lambda: f"{self.rng.choice(_ADJECTIVES)}-{self.rng.choice(COMMON_NOUNS)}")


def _candidates(
    context: str, order: list[int], values: list[str], offsets: dict[tuple[int, int], int], needles: bool
) -> tuple[list[str], list[int]]:
    """The same-form candidate values in context order and each one's character offset: the groups' values, or
    with the needle haystack every needle's value."""
    if needles:
        found = list(re.finditer(r"is: (\d{7})\.", context))
        return [m.group(1) for m in found], [m.start() for m in found]
    return [values[g] for g in order], [offsets[(g, 0)] for g in order]


# ---- samples -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Facts:
    """What one sample states: each group's statements (group 0 is gold), each group's candidate value, the
    answer and the queried name with the user template that asks it, and how a group's statements spread."""

    statements: list[list[str]]
    values: list[str]
    answer: str
    query: str
    user: str
    spread: float
    links: int


def _chain_facts(form: VTForm, names: _Names) -> _Facts:
    """Variable tracking: ``chains`` chains of a value statement and ``hops`` links; the first chain is gold."""
    chains = []
    for _ in range(form.chains):
        variables = [names.variable() for _ in range(form.hops + 1)]
        chains.append((variables, names.number(5)))
    statements = [
        [VALUE_STATEMENT.format(var=v[0], value=n)]
        + [LINK_STATEMENT.format(var=v[j + 1], previous=v[j]) for j in range(form.hops)]
        for v, n in chains
    ]
    gold_vars, gold_value = chains[0]
    if form.query == "value":
        return _Facts(statements, [n for _, n in chains], gold_value, gold_vars[-1], VT_VALUE, form.spread, form.hops)
    values = [" ".join(v) for v, _ in chains]
    return _Facts(statements, values, " ".join(gold_vars), gold_value, VT_ALL, form.spread, form.hops)


def _needle_facts(form: MKForm, names: _Names) -> _Facts:
    """Multi-key NIAH: ``keys`` needles with distinct keys; the first is gold."""
    keys = [names.key() for _ in range(form.keys)]
    values = [names.number(7) for _ in keys]
    statements = [[NIAH_NEEDLE.format(key=k, value=v)] for k, v in zip(keys, values, strict=True)]
    return _Facts(statements, values, values[0], keys[0], NIAH_USER, 0.0, 0)


def _haystack_lines(
    tokenizer: PreTrainedTokenizerBase, facts: _Facts, context_tokens: int, filler: _Names | None
) -> list[str]:
    """The lines the statements go between, filling what ``context_tokens`` leaves: RULER's noise line repeated,
    or with ``filler`` (the needle haystack) a needle of the same form with a fresh key per line."""
    flat = [s for group in facts.statements for s in group]
    fact_tokens = sum(len(tokenizer("\n" + s, add_special_tokens=False)["input_ids"]) for s in flat)
    budget = context_tokens - fact_tokens
    if budget < 16:
        raise DynheadsError(
            f"context_tokens={context_tokens} is too short for {len(flat)} statements "
            f"({fact_tokens} tokens): use a longer context or fewer chains/keys"
        )
    if filler is None:
        return [NOISE] * _noise_lines(tokenizer, budget)
    one = len(
        tokenizer("\n" + NIAH_NEEDLE.format(key="quiet-walrus", value="1234567"), add_special_tokens=False)["input_ids"]
    )
    return [NIAH_NEEDLE.format(key=filler.key(), value=filler.number(7)) for _ in range(max(budget // one, 1))]


def make_sample(
    tokenizer: PreTrainedTokenizerBase,
    *,
    data: str,
    context_tokens: int,
    depth: float,
    seed: int,
    gold_rank: int = 0,
    sample_id: str | None = None,
    chat_template_kwargs: Mapping[str, object] | None = None,
) -> Sample:
    """One seeded question of the task ``data`` names, ``context_tokens`` context tokens (statements included),
    the gold chain (needle) at ``depth`` and ``gold_rank`` candidate values before the gold one."""
    form = parse_source(data)
    if not 0.0 <= depth <= 1.0:
        raise DynheadsError(f"depth must be between 0 and 1, got {depth}")
    if not 0 <= gold_rank < form.candidates:
        raise DynheadsError(f"gold rank must be in 0..{form.candidates - 1}, got {gold_rank}")
    rng = random.Random(seed)
    names = _Names(rng)
    facts = _chain_facts(form, names) if isinstance(form, VTForm) else _needle_facts(form, names)
    filler = names if isinstance(form, MKForm) and form.haystack == "needle" else None
    lines = _haystack_lines(tokenizer, facts, context_tokens, filler)
    groups = _slots(rng, len(lines), len(facts.statements), depth, facts.spread, gold_rank, facts.links, form.placement)
    context, offsets, order = _assemble(lines, groups, facts.statements, gold_rank)
    if order.index(0) != gold_rank:  # placement guarantees it; a broken guarantee must not pass silently
        raise DynheadsError(f"internal: gold group at rank {order.index(0)}, wanted {gold_rank}")
    in_order, starts = _candidates(context, order, facts.values, offsets, needles=filler is not None)

    asked = {"intro": VT_INTRO, "query": facts.query, "count": len(facts.answer.split())}
    question = facts.user.format(context="", **asked).split("\n")[-1]
    prompt = render_chat(tokenizer, SYSTEM_PROMPT, facts.user.format(context=context, **asked), chat_template_kwargs)
    gold = facts.statements[0]
    pieces = [
        (offsets[(0, j)], offsets[(0, j)] + len(text), text.split()[-1], f"gold statement {text!r}")
        for j, text in enumerate(gold)
    ]
    spans, positions, (first, last) = context_spans(tokenizer, prompt, context, pieces)
    fact_depths = [round((start - first) / max(last - first, 1), 4) for start, _ in spans]
    record_id = f"{source_of(data)}-{seed}"
    return hotpotqa.qa_sample(
        tokenizer,
        prompt,
        context,
        sample_id=sample_id or f"{record_id}-len{context_tokens}-depth{depth:g}",
        needle_positions=positions,
        answer=facts.answer,
        context_tokens=context_tokens,
        depth=depth,
        seed=seed,
        extras=hotpotqa.QAExtras(
            question=question,
            type=form.type,
            record_id=record_id,
            supporting_facts=[(text, j) for j, text in enumerate(gold)],
            supporting_spans=spans,
            context_span=(first, last),
        ),
        meta={
            "form": asdict(form),
            cand.CANDIDATES: in_order,
            cand.GOLD_RANK: in_order.index(facts.answer),
            cand.DEPTHS: [round(start / max(len(context), 1), 4) for start in starts],
            "fact_depths": fact_depths,
            "depth_realised": round(sum(fact_depths) / len(fact_depths), 4),
            "distractor_statements": [s for group in facts.statements[1:] for s in group],
        },
    )


def grid_samples(
    tokenizer: PreTrainedTokenizerBase,
    grid: QuestionGrid,
    *,
    data: str,
    chat_template_kwargs: Mapping[str, object] | None = None,
) -> list[Sample]:
    """The questions of ``grid`` (``grid.generated_questions``: question i in cell i mod (lengths x depths),
    seeded by i alone, with gold rank ``gold_rank_of(i, ...)``)."""
    form = parse_source(data)  # refuses a value that names no RULER task
    return [
        make_sample(
            tokenizer,
            data=data,
            context_tokens=question.length,
            depth=question.depth,
            seed=question.seed,
            gold_rank=question.gold_rank,
            sample_id=question.sample_id,
            chat_template_kwargs=chat_template_kwargs,
        )
        for question in generated_questions(data.partition(":")[0], grid, form.candidates)
    ]


# ---- scoring: RULER's string match, EM on the extracted answer, the distractor failure mode -------------------------
def string_match(references: list[str], generated: str) -> float:
    """RULER's string match (``string_match_all``): the share of references contained in the output, case-blind."""
    if not references:
        raise DynheadsError("string match needs at least one reference")
    text = generated.lower()
    return sum(ref.lower() in text for ref in references) / len(references)


def extract_answer(sample: Sample, generated: str) -> str:
    """The answer the output gives: its first number (value answers), or the set of 5-capital-letter variable
    names it names, sorted (``query=all``). Numbers: a small model restates the question ("The value of VAR X
    is 12345"); the first number is the value it commits to."""
    if sample.meta.get("form", {}).get("query") == "all":
        return " ".join(sorted(set(_VARIABLE.findall(generated))))
    match = _NUMBER.search(generated)
    return match.group(0) if match else qa_metrics.extract_answer(generated)


def score(sample: Sample, generated: str) -> dict[str, float]:
    """String match (RULER's, the first metric), EM / F1 of the extracted answer, and whether a wrong answer is a
    distractor's value."""
    is_set = sample.meta.get("form", {}).get("query") == "all"
    gold = " ".join(sorted(sample.answer.split())) if is_set else sample.answer
    prediction = extract_answer(sample, generated)
    pool = (
        [" ".join(sorted(c.split())) for c in sample.meta[cand.CANDIDATES]] if is_set else sample.meta[cand.CANDIDATES]
    )
    return {
        "string_match": string_match(sample.answer.split(), generated),
        **qa_metrics.score(gold, prediction, extract=False),
        "distractor": cand.is_distractor(prediction, gold, pool),
    }


# ---- the task: its grid and its registry entry -------------------------------------------------------------------
def ruler_grid(name: str, default: str | None = None):
    """The grid builder of RULER task ``name`` (``variable_tracking`` or ``multikey_niah``): its questions over the
    same cells as HotpotQA's grid; ``config.data`` spells the form (None: ``default``, else the task's defaults).
    Question i of the stream is seeded by i and its fact order cycles (``candidates.gold_rank_of``)."""

    def grid(config: Any, tokenizer) -> TaskGrid:
        data = config.data or default or name
        if source_of(data) != name:
            raise DynheadsError(f"the {name} task reads {name}[:options] data, got {data!r}")
        template_kwargs = chat_template_kwargs(config.chat_template_kwargs)
        return generated_task_grid(
            config, lambda grid: grid_samples(tokenizer, grid, data=data, chat_template_kwargs=template_kwargs)
        )

    return grid


def _prompt(name: str, default: str | None = None) -> Callable[[Any], dict]:
    def prompt(config: Any) -> dict:
        data = config.data or default or name
        user = NIAH_USER if name == MK_SOURCE else (VT_ALL if parse_vt(data).query == "all" else VT_VALUE)
        return {
            "system": SYSTEM_PROMPT,
            "user": user,
            "data": data,
            "form": describe_form(data),
            "haystack": NOISE,
            "metric": "RULER string match (share of the reference values in the output)",
        }

    return prompt


RULER_METRICS = {"string_match": "string match", "em": "EM", "f1": "F1"}


def _register(
    name: str,
    label: str,
    source: str,
    help: str,
    data: str | None = None,
    paper_task: str = "",
    selects: Callable[[str], bool] | None = None,
) -> Task:
    """A RULER task: Eq. 2 scores and reasoning static heads, RULER's metrics, a question stream over the grid;
    ``source[:options]`` data of the form ``selects`` selects it (``data``, else ``source``, when none is given)."""
    return register(
        Task(
            name=name,
            label=label,
            score_kind="reasoning",
            static_kind="reasoning",
            metrics=RULER_METRICS,
            score=score,
            grid=ruler_grid(source, data),
            prompt=_prompt(source, data),
            paper_task=paper_task,
            questions=True,
            fade_sparse_cells=True,
            help=help,
            data_source=source,
            selects=selects,
            default_data=data or source,
            chance=ruler_chance,
        )
    )


def ruler_chance(data: str | None) -> float | None:
    """A guess among the same-form candidates (the chains' values, the keys' values) is right with 1 / candidates;
    RULER's ``query=all`` (a share of names) has no such chance (None), nor data of no RULER form."""
    if data is None or source_of(data) is None:
        return None
    form = parse_source(data)
    if isinstance(form, VTForm) and form.query != "value":
        return None
    return 1.0 / form.candidates


VARIABLE_TRACKING = _register(
    VT_SOURCE,
    "Variable tracking",
    VT_SOURCE,
    "RULER variable tracking: follow chains of VAR assignments",
    paper_task="hotpotqa",
    selects=lambda data: parse_vt(data).hops != 0,
)
VT_LOOKUP_NAME, VT_LOOKUP_DATA = "vt_lookup", "variable_tracking:hops=0"
VT_LOOKUP = _register(  # variable tracking with no links: one VAR statement to find, not multi-hop
    VT_LOOKUP_NAME,
    "Key-value lookup (VAR statements)",
    VT_SOURCE,
    "variable tracking with no links (variable_tracking:hops=0): one VAR statement to find",
    data=VT_LOOKUP_DATA,
    paper_task="hotpotqa",
    selects=lambda data: parse_vt(data).hops == 0,
)
MULTIKEY_NIAH = _register(
    MK_SOURCE, "Multi-key NIAH", MK_SOURCE, "RULER multi-key NIAH: the value of one key among similar needles"
)
