"""Dynamic RAG with head-based in-context retrieval: the paper's Algorithm 1, with Algorithm 2 as ``_retrieve``.

The prompt is ``[chat prefix, context, question]``; the model's view of the context is controlled by the
attention probe's hidden-key mask, so positions never shift. The prefix and the context are encoded once
(nothing hidden: the context's own states are those of the plain prompt) and cached, once per question
for all the strategies answering it (``shared_context_sessions``). Every round then
rolls back to that cache and re-reads the question and the answer so far under the current visibility:

1. draft up to ``draft_tokens`` tokens with the context hidden (or with the last retrieved windows visible);
2. RIND on the draft; no trigger: keep the draft, hide the context again;
3. trigger: cut the draft back to the start of the triggering sentence, read the question and kept answer
   once with the context visible, average the chosen heads' attention rows over the context, turn the top
   positions into windows (``rag.windows``), make only those visible and regenerate one sentence.

What an answer sees outside retrievals is its strategy's ``visibility``: ``none`` never shows the context and
never retrieves (w/o RAG); ``full-context`` (``all``) always shows all of it; ``rerank`` (``given``) always shows the
context positions it is given (``shown``: the top re-ranked paragraphs) and never retrieves.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Generator, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import torch

from dynheads.engine.decoding import Action, DecodingSession, Emit, Row, StepPolicy, StepResult, Stop, decode, greedy
from dynheads.engine.probe import Measure, RowEdit
from dynheads.errors import DynheadsError
from dynheads.heads import Head
from dynheads.models import LoadedModel, decode_text
from dynheads.rag.strategies import HeadSelector
from dynheads.rag.trigger import TriggerConfig, rind
from dynheads.rag.windows import RetrievalConfig, retrieval_recall, select_windows

_SENTENCE_END = re.compile(r"[.!?]\s*$|\n")


@dataclass(frozen=True)
class RagSettings:
    max_new_tokens: int = field(default=48, metadata={"help": "answer budget in tokens"})
    draft_tokens: int = field(default=24, metadata={"help": "tokens drafted before RIND checks them"})
    max_retrievals: int = field(default=3, metadata={"help": "retrievals per answer at most"})
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)


@dataclass
class RagAnswer:
    text: str
    tokens: list[int]
    retrievals: int
    windows: list[tuple[int, int]]  # every window made visible, absolute positions
    visible_tokens: list[int]  # context tokens visible after each retrieval
    heads: list[list[Head]]  # heads used at each retrieval
    retrieval_recall: float | None  # share of supporting-fact tokens any retrieval made visible


def context_session(
    lm: LoadedModel, input_ids: Sequence[int], context: tuple[int, int], settings: RagSettings
) -> DecodingSession:
    """A session holding the prompt up to the end of the context (prefix + context, nothing hidden) in its cache,
    with room for the question and the longest answer ``settings`` allow."""
    question = len(input_ids) - context[1]
    session = DecodingSession(
        lm,
        list(input_ids[: context[1]]),
        max_new_tokens=question + settings.max_new_tokens + settings.draft_tokens + 1,
    )
    session.forward(context[1])
    return session


def shared_context_sessions(lm: LoadedModel, samples: Sequence, settings: RagSettings) -> list[DecodingSession]:
    """``context_session`` per sample, a prompt several samples share (the strategies of one question) prefilled
    once and forked (``DecodingSession.copies``: the same cached states)."""
    rows_of: dict[tuple, list[int]] = {}
    for i, sample in enumerate(samples):
        rows_of.setdefault((tuple(sample.input_ids), _context_of(sample)), []).append(i)
    sessions: list[DecodingSession | None] = [None] * len(samples)
    for rows in rows_of.values():
        sample = samples[rows[0]]
        session = context_session(lm, sample.input_ids, _context_of(sample), settings)
        for i, fork in zip(rows, session.copies(len(rows)) if len(rows) > 1 else [session], strict=True):
            sessions[i] = fork
    return cast(list[DecodingSession], sessions)


def _context_of(sample) -> tuple[int, int]:
    """The sample's context span ``[start, stop)``, checked to lie inside its prompt."""
    context = (int(sample.context_span[0]), int(sample.context_span[1]))
    if not 0 < context[0] < context[1] <= len(sample.input_ids):
        raise DynheadsError(f"sample {sample.sample_id!r} has no usable context span {context}")
    return context


class Answerer:
    """State of one answer: the session, the cached context, the answer so far, what is visible."""

    def __init__(
        self,
        lm: LoadedModel,
        input_ids: list[int],
        context: tuple[int, int],
        settings: RagSettings,
        session: DecodingSession | None = None,
    ):
        """``session``: ``context_session`` of these ids and settings, when it was made (and forked) beforehand."""
        self.lm, self.settings = lm, settings
        self.prompt = tuple(input_ids)
        self.question = list(input_ids[context[1] :])  # question turn and generation prompt
        self.context = context
        self.answer: list[int] = []
        self.session = session or context_session(lm, input_ids, context, settings)
        self.cached = self.session.checkpoint()
        self.stop_ids = lm.stop_token_ids()
        self.finished = False

    def show(self, visible: np.ndarray | None, rows_for: Collection[Head] = frozenset()) -> None:
        """Roll back to the cached context, show ``visible`` context positions (None: all; the next passes run
        under ``edit``) and write the question and the answer so far after it (the next pass reads them)."""
        self.session.rollback(self.cached)
        self.edit = RowEdit(hidden_keys=frozenset(self.hidden_positions(visible)))
        self.measure = Measure(rows=frozenset(rows_for))  # what the next passes keep: these heads' rows
        self.session.write(self.question + self.answer)

    def hidden_positions(self, visible: np.ndarray | None) -> list[int]:
        """Absolute positions of the context that ``visible`` hides."""
        return [] if visible is None else [self.context[0] + int(i) for i in np.flatnonzero(~visible)]

    def read(self, visible: np.ndarray | None, rows_for: Collection[Head] = frozenset()):
        """``show``, then one pass over the question and the answer so far."""
        self.show(visible, rows_for)
        return self.session.forward(measure=self.measure, edits=[self.edit])

    def draft(self, visible: np.ndarray | None, limit: int, *, sentence: bool) -> _DraftPolicy:
        """Show ``visible`` and give the policy that drafts up to ``limit`` greedy tokens after the answer so far
        (``decode`` runs it, alone or batched with other answerers' drafts)."""
        last_layer = self.lm.num_layers - 1
        self.show(visible, {(last_layer, h) for h in range(self.lm.num_heads)})
        return _DraftPolicy(self, limit, sentence)

    def received_attention(self, rows: list[torch.Tensor], first: int, count: int) -> np.ndarray:
        """``[H, T]``: for each drafted token, the largest last-layer attention it receives from a drafted query.

        The queries are the drafted tokens themselves (``rows[1:]``: row ``j`` is the query at drafted token
        ``j - 1``), up to and including the last one, each seeing the drafted keys up to its own position.
        """
        received = np.zeros((self.lm.num_heads, count), dtype=np.float64)
        for j in range(1, len(rows)):
            seen = min(j, count)
            received[:, :seen] = np.maximum(received[:, :seen], rows[j][:, first : first + seen].cpu().numpy())
        return received


class _DraftPolicy(StepPolicy):
    """Greedy drafting of one answerer under its visibility: the tokens, their entropies and last-layer rows.

    ``rows[j]`` (``[H, positions]``) is the row of the query that predicted token ``j``, i.e. of the position
    before it; when the loop ran the last token through the model (budget or EOS reached, not a sentence end)
    one more row follows: the last token's own query, so it too receives attention. Step ``limit`` is the pass
    that reads the last token.
    """

    def __init__(self, answerer: Answerer, limit: int, sentence: bool):
        self.answerer, self.limit, self.sentence = answerer, limit, sentence
        self.tokens: list[int] = []
        self.entropies: list[float] = []
        self.rows: list[torch.Tensor] = []
        self.stopped_early = False  # a stop token within the budget: the answer is finished
        self.steps = limit + 1

    def edit(self, index: int) -> RowEdit:
        return self.answerer.edit

    def measure(self, index: int) -> Measure:
        return self.answerer.measure

    def identity(self) -> tuple:
        """What decides the draft: the prompt, the answer so far, what is visible, the budget. Two drafts with the
        same identity (strategies of one question before they retrieve differently) decode the same passes."""
        a = self.answerer
        return (a.prompt, a.context, tuple(a.answer), a.edit, a.measure, self.limit, self.sentence)

    def take(self, decoded: _DraftPolicy) -> None:
        """This draft's result from ``decoded``, a draft of the same identity (itself: nothing to do)."""
        if decoded is self:
            return
        self.tokens, self.entropies, self.rows = list(decoded.tokens), list(decoded.entropies), list(decoded.rows)
        self.stopped_early = decoded.stopped_early
        self.answerer.finished = self.answerer.finished or self.stopped_early

    def after(self, index: int, row: Row, result: StepResult, rerun: bool) -> Action:
        lm = self.answerer.lm
        last_layer = lm.num_layers - 1
        rows = torch.stack([result.stats.rows[(last_layer, h)] for h in range(lm.num_heads)])
        action = greedy(result, self.answerer.stop_ids)
        if index == self.limit or isinstance(action, Stop):
            self.stopped_early = index < self.limit
            self.answerer.finished = self.answerer.finished or self.stopped_early
            if self.tokens:  # this pass read the last token: its query row is the last one the draft gives
                self.rows.append(rows)
            return Stop("end")
        log_probs = torch.log_softmax(result.logits, dim=-1)
        self.entropies.append(float(-(log_probs.exp() * log_probs).sum()))
        self.rows.append(rows)
        self.tokens.append(action.token)
        if self.sentence and _SENTENCE_END.search(decode_text(lm.tokenizer, self.tokens)):
            return Emit(action.token, stop_reason="sentence")
        return action


def answer_question(
    lm: LoadedModel,
    sample,
    selector: HeadSelector,
    settings: RagSettings = RagSettings(),
    shown: Sequence[tuple[int, int]] = (),
) -> RagAnswer:
    """Answer one HotpotQA sample with in-context Dynamic RAG under ``selector``'s strategy; ``rerank`` shows the
    absolute ``[start, stop)`` windows ``shown`` (inside the context) for the whole answer."""
    return answer_questions(lm, [sample], [selector], settings, [shown])[0]


def answer_questions(
    lm: LoadedModel,
    samples: Sequence,
    selectors: Sequence[HeadSelector],
    settings: RagSettings = RagSettings(),
    shown: Sequence[Sequence[tuple[int, int]]] | None = None,
    rows_together: int | None = None,
) -> list[RagAnswer]:
    """``answer_question`` for several samples (``selectors[i]`` and ``shown[i]`` for ``samples[i]``). A prompt
    several of them share (one question under several strategies) is prefilled once (``shared_context_sessions``);
    their drafts and rewrites decode ``rows_together`` at a time (None: all as one batch; ``decoding.decode``),
    each retrieval's read pass runs alone. Drafts (and read passes) that several answers would make alike (the
    strategies of one question until they retrieve different windows) are made once and shared. ``result[i]``
    equals ``answer_question`` of sample i: exactly when ``rows_together`` is 1, up to fp32 rounding in a batch."""
    shown = shown if shown is not None else [() for _ in samples]
    if not len(samples) == len(selectors) == len(shown):
        raise DynheadsError(f"{len(samples)} samples, {len(selectors)} head selectors, {len(shown)} shown windows")
    if rows_together is not None and rows_together < 1:
        raise DynheadsError("answers decode at least one at a time")
    answers: list[RagAnswer | None] = [None] * len(samples)
    reads: dict[tuple, StepResult] = {}  # retrieval read passes by identity, shared by the answers that agree
    runs = [
        _answer(lm, sample, selector, settings, windows, session, reads)
        for sample, selector, windows, session in zip(
            samples, selectors, shown, shared_context_sessions(lm, samples, settings), strict=True
        )
    ]
    drafts: dict[int, _DraftPolicy] = {}

    def advance(i: int, sent) -> None:
        try:
            drafts[i] = runs[i].send(sent)
        except StopIteration as done:
            answers[i] = done.value
            drafts.pop(i, None)

    for i in range(len(runs)):
        advance(i, None)
    while drafts:
        batch = list(drafts.items())
        first_of: dict[tuple, _DraftPolicy] = {}  # one decode per distinct draft; its twins copy it
        for _, draft in batch:
            first_of.setdefault(draft.identity(), draft)
        distinct = list(first_of.values())
        width = rows_together or len(distinct)
        for start in range(0, len(distinct), width):
            part = distinct[start : start + width]
            decode([draft.answerer.session for draft in part], part, max(draft.steps for draft in part))
        for i, draft in batch:
            draft.take(first_of[draft.identity()])
            advance(i, draft)
    return cast(list[RagAnswer], answers)  # every run has finished: each slot holds its answer


def _answer(
    lm: LoadedModel,
    sample,
    selector: HeadSelector,
    settings: RagSettings,
    shown: Sequence[tuple[int, int]],
    session: DecodingSession,
    reads: dict[tuple, StepResult],
) -> Generator[_DraftPolicy, _DraftPolicy, RagAnswer]:
    """One answer as a coroutine, from ``session`` (its ``context_session``): it yields each draft to decode and
    receives it decoded; ``reads``: the retrieval read passes made so far (``_retrieve``)."""
    context = _context_of(sample)
    visibility = selector.entry.visibility
    if (visibility == "given") != bool(shown):
        raise DynheadsError("a strategy that shows given windows (rerank), and only it, answers with them shown")
    state = Answerer(lm, list(sample.input_ids), context, settings, session)
    width = context[1] - context[0]
    none_visible = np.zeros(width, dtype=bool)
    fixed: np.ndarray | None = None  # what full-context (None: all) and rerank show throughout
    if shown:
        fixed = none_visible.copy()
        for start, stop in shown:
            if not context[0] <= start < stop <= context[1]:
                raise DynheadsError(f"shown window {start}..{stop} lies outside the context {context}")
            fixed[start - context[0] : stop - context[0]] = True
    always = visibility in ("all", "given")
    visible: np.ndarray | None = fixed if always else none_visible
    windows: list[tuple[int, int]] = list(shown)
    visible_counts: list[int] = [] if fixed is None else [int(fixed.sum())]  # rerank: what it shows throughout
    used_heads: list[list[Head]] = []
    while not state.finished and len(state.answer) < settings.max_new_tokens:
        budget = min(settings.draft_tokens, settings.max_new_tokens - len(state.answer))
        first = context[1] + len(state.question) + len(state.answer)  # position of the first drafted token
        draft = yield state.draft(visible, budget, sentence=False)
        if not draft.tokens:
            break
        can_retrieve = selector.needs_heads and len(used_heads) < settings.max_retrievals
        texts = [decode_text(lm.tokenizer, [t]) for t in draft.tokens]
        result = (
            rind(
                texts,
                np.array(draft.entropies),
                state.received_attention(draft.rows, first, len(draft.tokens)),
                settings.trigger,
            )
            if can_retrieve
            else None
        )
        if result is None or not result.triggered:
            state.answer += draft.tokens
            visible = fixed if always else none_visible
            continue
        state.answer += draft.tokens[: result.sentence_token_start]
        state.finished = False
        heads, scores = _retrieve(state, selector, reads)
        retrieved = select_windows(scores, settings.retrieval, offset=context[0])
        windows += list(retrieved.windows)
        visible = retrieved.mask
        visible_counts.append(int(visible.sum()))
        used_heads.append(heads)
        rewrite = yield state.draft(visible, settings.max_new_tokens - len(state.answer), sentence=True)
        state.answer += rewrite.tokens
    supporting = getattr(sample, "needle_positions", None)
    return RagAnswer(
        text=decode_text(lm.tokenizer, state.answer, skip_special_tokens=True),
        tokens=state.answer,
        retrievals=len(used_heads),
        windows=windows,
        visible_tokens=visible_counts,
        heads=used_heads,
        retrieval_recall=retrieval_recall(windows, supporting) if supporting and (used_heads or shown) else None,
    )


def _retrieve(state: Answerer, selector: HeadSelector, reads: dict[tuple, StepResult]) -> tuple[list[Head], np.ndarray]:
    """Algorithm 2 up to AverageAttention: unmask, pick heads, average their rows over the context. The read pass
    depends on the prompt and the answer so far only: answers that agree on them (strategies of one question at
    their first retrieval) share it through ``reads``."""
    lm = state.lm
    identity = (state.prompt, state.context, tuple(state.answer))
    if identity not in reads:
        every_head = {(layer, head) for layer in range(lm.num_layers) for head in range(lm.num_heads)}
        reads[identity] = state.read(None, rows_for=every_head)  # one pass: the hidden state picks heads, rows kept
    step = reads[identity]
    heads = selector.select(step.hidden.cpu().numpy())
    start, stop = state.context
    rows = torch.stack([step.stats.rows[head][start:stop] for head in heads])
    scores = rows.mean(0).cpu().numpy()
    if not math.isfinite(float(scores.sum())):
        raise DynheadsError("retrieval attention is not finite")
    return heads, scores
