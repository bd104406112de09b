"""Heads as a re-ranker: candidate paragraphs in the prompt, the query after them, one score per paragraph per head.

In-context re-ranking (ICR, Chen et al., ICLR 2025) scores a candidate by the attention that the query rows put on
its tokens, summed over every head, minus the same attention under a content-free query ("N/A") in the same
place. Query-focused retrieval heads (QRHead, Zhang et al., EMNLP 2025) sum only chosen heads. The query rows are
the published ones: from the instruction after the candidates through the question and the chat template's end
(the assistant header), averaged per row, so the real pass and the calibration pass (whose query is shorter)
score the same row range on the same scale. Both read the ``[L, H, S]`` span score
(``dynheads.scores.SpanScore``) that the probe reduces in its pass:

1. the shared prefix (instruction and paragraphs, up to the query rows) is fed once and cached;
2. the real query rows are fed with the span score set (one prefill in all);
3. the cache rolls back and the content-free query rows are fed the same way (the calibration pass).

The paragraphs' own states are those of one prefill; only the query rows are computed twice. BM25 (``bm25s``,
optional extra ``rerank``) ranks the same candidates from their text. What we leave out of ICR: its token-level
outlier masking (tokens whose calibrated score is below mean - 2 std), since the probe reduces whole spans.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dynheads.analysis.ranking import ranking
from dynheads.engine.decoding import DecodingSession
from dynheads.engine.probe import Measure
from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel
from dynheads.scores import SpanScore
from dynheads.tasks.prompting import RenderedPrompt, locate, render_chat, token_span

SYSTEM_PROMPT = "You are a helpful AI bot that finds the paragraphs relevant to a query."
USER_TEMPLATE = (
    "Here are some paragraphs:\n\n{paragraphs}\n\n"
    "Please find information that is relevant to the following query in the paragraphs above.\n\n"
    "Query: {query}"
)
SEPARATOR = "\n\n"
CONTENT_FREE_QUERY = "N/A"  # ICR's calibration query
# What a span score's query rows are (recorded in a rerank run's manifest; scores stored under another rule are refused)
QUERY_ROWS = "from the instruction after the candidates through the end of the prompt, averaged per row (ICR, QRHead)"


@dataclass(frozen=True)
class RerankPrompt:
    """The real prompt and its content-free twin. Both share their tokens up to the query rows (the paragraphs
    included), and their query rows start at the same token and run through each prompt's last token."""

    input_ids: list[int]
    query: tuple[int, int]  # [start, stop) query rows of the real prompt: instruction, question, template end
    null_ids: list[int]
    null_query: tuple[int, int]  # [start, stop) query rows of the content-free twin
    spans: tuple[tuple[int, int], ...]  # [start, stop) tokens of each candidate, in prompt order

    def __post_init__(self) -> None:
        start = self.query[0]
        if (
            self.null_query[0] != start
            or self.input_ids[:start] != self.null_ids[:start]
            or (self.query[1], self.null_query[1]) != (len(self.input_ids), len(self.null_ids))
            or not self.spans
            or self.spans[-1][1] > start
        ):
            raise DynheadsError(
                "the query rows of a re-ranking prompt and its content-free twin must start at the same token, "
                "after every candidate, and run to the end of each prompt"
            )

    @property
    def shared(self) -> int:
        """Tokens both prompts share and the passes cache: everything before the query rows."""
        return self.query[0]


def build_prompt(
    tokenizer, paragraphs: Sequence[str], question: str, template_kwargs: Mapping[str, object] | None = None
) -> RerankPrompt:
    """Render the candidates (texts, in prompt order) and the question after them, and find every span."""
    if not paragraphs:
        raise DynheadsError("re-ranking needs at least one candidate paragraph")
    block = SEPARATOR.join(paragraphs)
    prompt = render_chat(
        tokenizer, SYSTEM_PROMPT, USER_TEMPLATE.format(paragraphs=block, query=question), template_kwargs
    )
    at, block_end = locate(prompt, block, what="paragraph block")
    chars = []
    for text in paragraphs:
        chars.append((at, at + len(text)))
        at += len(text) + len(SEPARATOR)
    query_at = prompt.text.rindex("Query: " + question) + len("Query: ")
    return twin_prompts(
        tokenizer,
        prompt.text,
        chars,
        (query_at, query_at + len(question)),
        rows_from=block_end + len(SEPARATOR),
        special=prompt.template == "plain",
    )


def twin_prompts(
    tokenizer,
    text: str,
    paragraph_chars: Sequence[tuple[int, int]],
    query_chars: tuple[int, int],
    *,
    rows_from: int,
    special: bool,
) -> RerankPrompt:
    """Tokenise ``text`` and its twin with the content-free query in place of ``text[query_chars]``. The
    paragraphs' character spans (all before ``rows_from``) become token spans of both; the query rows run from
    the token at character ``rows_from`` (the instruction after the paragraphs) through the last token."""
    start, stop = query_chars
    if not paragraph_chars or max(b for _, b in paragraph_chars) > rows_from or rows_from > start:
        raise DynheadsError("the query rows must start after every candidate and at or before the query")
    null_text = text[:start] + CONTENT_FREE_QUERY + text[stop:]
    rendered = []
    for prompt_text in (text, null_text):
        encoded = tokenizer(prompt_text, add_special_tokens=special, return_offsets_mapping=True)
        prompt = RenderedPrompt(
            prompt_text,
            list(encoded["input_ids"]),
            [tuple(o) for o in encoded["offset_mapping"]],
            "plain" if special else "chat",
        )
        spans = []
        for a, b in (*paragraph_chars, (rows_from, len(prompt_text))):
            tokens = token_span(prompt, a, b)
            if not tokens:
                raise DynheadsError(f"no token covers characters {a}..{b} of the re-ranking prompt")
            spans.append((tokens[0], tokens[-1] + 1))
        rows = (spans[-1][0], len(prompt.input_ids))  # through the last token (a template's end has no characters)
        rendered.append((prompt.input_ids, rows, tuple(spans[:-1])))
    (ids, rows, paragraph_spans), (null_ids, null_rows, null_spans) = rendered
    if paragraph_spans != null_spans or rows[0] != null_rows[0] or ids[: rows[0]] != null_ids[: rows[0]]:
        raise DynheadsError(
            "the content-free prompt does not share the paragraphs' tokens with the real one "
            "(tokenisation merged the query into the text before it)"
        )
    return RerankPrompt(ids, rows, null_ids, null_rows, paragraph_spans)


def sample_prompt(tokenizer, sample) -> RerankPrompt:
    """The re-ranking prompt of a HotpotQA ``Sample`` as it stands (its context, then its question): its paragraphs
    are found from ``meta["paragraph_titles"]`` in the decoded prompt, which must tokenise back to the same ids."""
    text, offsets, special = _decoded(tokenizer, sample)
    context_start, context_stop = offsets[sample.context_span[0]][0], offsets[sample.context_span[1] - 1][1]
    titles = sample.meta.get("paragraph_titles") or []
    starts, at = [], context_start
    for title in titles:
        found = text.find(f"{title}: ", at, context_stop)
        if found < 0:
            raise DynheadsError(f"sample {sample.sample_id!r}: paragraph {title!r} is not in its context")
        starts.append(found)
        at = found + len(title)
    if not starts:
        raise DynheadsError(f"sample {sample.sample_id!r} records no paragraph titles: nothing to re-rank")
    ends = [next_start - len(SEPARATOR) for next_start in starts[1:]] + [context_stop]
    candidates = list(zip(starts, ends, strict=True))
    return _question_twins(tokenizer, sample.sample_id, sample.question, text, candidates, context_stop, special)


def needle_prompt(tokenizer, sample, question: str) -> RerankPrompt:
    """A needle task's ``Sample`` as a re-ranking prompt with one candidate, its needle (``needle_positions``), and
    its ``question`` (the task's, after the haystack) as the query: what QRHead's head score reads on a needle
    stream."""
    text, offsets, special = _decoded(tokenizer, sample)
    if not sample.needle_positions:
        raise DynheadsError(f"sample {sample.sample_id!r} has no needle positions: nothing to score a head on")
    needle = (offsets[sample.needle_positions[0]][0], offsets[sample.needle_positions[-1]][1])
    context_stop = offsets[sample.context_span[1] - 1][1]
    return _question_twins(tokenizer, sample.sample_id, question, text, [needle], context_stop, special)


def _decoded(tokenizer, sample) -> tuple[str, list[tuple[int, int]], bool]:
    """A sample's prompt as text with each token's character offsets; refused where the text does not tokenise
    back to the sample's own ids (its spans could not be located)."""
    special = sample.prompt_template == "plain"
    text = tokenizer.decode(list(sample.input_ids), skip_special_tokens=False)
    encoded = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    if list(encoded["input_ids"]) != list(sample.input_ids):
        raise DynheadsError(
            f"sample {sample.sample_id!r}: its prompt does not tokenise back to its own ids, so its "
            "spans cannot be located for re-ranking"
        )
    return text, [tuple(o) for o in encoded["offset_mapping"]], special


def _question_twins(
    tokenizer,
    sample_id: str,
    question: str,
    text: str,
    candidates: list[tuple[int, int]],
    context_stop: int,
    special: bool,
) -> RerankPrompt:
    """``twin_prompts`` with ``question`` (after the context) as the query, the rows from the first character
    after the context."""
    query_at = text.find(question, context_stop)
    if query_at < 0:
        raise DynheadsError(f"sample {sample_id!r}: its question is not after its context")
    after = text[context_stop:]
    return twin_prompts(
        tokenizer,
        text,
        candidates,
        (query_at, query_at + len(question)),
        rows_from=context_stop + len(after) - len(after.lstrip()),  # the text after the context, as build_prompt's
        special=special,
    )


@dataclass(frozen=True, eq=False)
class SpanScores:
    """One question's head scores: ``[L, H, S]`` span masses under the real and the content-free query."""

    real: np.ndarray
    content_free: np.ndarray
    hidden: np.ndarray  # [D] final hidden state at the real prompt's last token (the head predictor reads it)
    prefill_seconds: float  # prefix + real query: what one ICR ranking costs
    calibration_seconds: float  # the content-free query pass on the cached prefix

    @property
    def calibrated(self) -> np.ndarray:
        return self.real.astype(np.float64) - self.content_free.astype(np.float64)


def span_scores(lm: LoadedModel, prompt: RerankPrompt) -> SpanScores:
    """The three passes of the module docstring: span masses averaged over each pass's query rows."""
    real_tail, null_tail = len(prompt.input_ids) - prompt.shared, len(prompt.null_ids) - prompt.shared
    session = DecodingSession(lm, prompt.input_ids, max_new_tokens=max(null_tail - real_tail, 0) + 1)
    began = time.perf_counter()
    session.forward(prompt.shared)
    cached = session.checkpoint()
    result = session.forward(real_tail, Measure(span=SpanScore(prompt.query, prompt.spans)))
    assert result.stats.span_mass is not None  # measured under the span score of the pass
    real, hidden = result.stats.span_mass.cpu().numpy().copy(), result.hidden.cpu().numpy().copy()
    prefill = time.perf_counter() - began
    began = time.perf_counter()
    session.rollback(cached)
    session.write(prompt.null_ids[prompt.shared :])
    null_mass = session.forward(null_tail, Measure(span=SpanScore(prompt.null_query, prompt.spans))).stats.span_mass
    assert null_mass is not None
    null = null_mass.cpu().numpy().copy()
    calibration = time.perf_counter() - began
    return SpanScores(real, null, hidden, prefill, calibration)


def require_bm25():
    """The ``bm25s`` module, or a one-line error naming the extra that installs it."""
    try:
        import bm25s
    except ImportError:
        raise DynheadsError("the bm25 strategy needs the bm25s package: pip install 'dynheads[rerank]'") from None
    return bm25s


def bm25_scores(paragraphs: Sequence[str], question: str) -> tuple[np.ndarray, float]:
    """BM25 scores of the candidates for the question (index over the candidates, English stop words removed) and
    the seconds it took (indexing included)."""
    bm25s = require_bm25()
    began = time.perf_counter()
    corpus = bm25s.tokenize(list(paragraphs), stopwords="en", show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(corpus, show_progress=False)
    query = bm25s.tokenize(question, stopwords="en", show_progress=False, return_ids=False)[0]
    scores = retriever.get_scores(query) if query else np.zeros(len(paragraphs))
    return np.asarray(scores, dtype=np.float64), time.perf_counter() - began


def icr_ranking(lm: LoadedModel, prompt: RerankPrompt) -> tuple[list[int], float]:
    """ICR's ranking of the prompt's candidates (every head, calibrated) and the seconds its passes took."""
    scores = span_scores(lm, prompt)
    return ranking(scores.calibrated.sum(axis=(0, 1))), scores.prefill_seconds + scores.calibration_seconds


def shown_spans(
    spans: Sequence[tuple[int, int]], order: Sequence[int], top: int, tokens: int | None = None
) -> list[tuple[int, int]]:
    """What re-rank-then-answer shows, as token windows: the ``top`` first candidates of ``order`` whole or, with a
    ``tokens`` budget, candidates in rank order until exactly that many tokens are shown (the last one cut after
    its first tokens), so the answer can see as many context tokens as a windowed strategy does."""
    if top < 1 or (tokens is not None and tokens < 1):
        raise DynheadsError(f"re-rank-then-answer shows at least one candidate and one token, got {top}, {tokens}")
    if tokens is None:
        return [(spans[i][0], spans[i][1]) for i in order[:top]]
    shown, left = [], tokens
    for i in order:
        start, stop = spans[i]
        if left <= 0:
            break
        shown.append((start, min(stop, start + left)))
        left -= shown[-1][1] - start
    return shown
