"""A prompt of one's own text: a context, a question and the spans of the context the heads should retrieve from.

``sample_from_text(lm, context, question, answer=...)`` renders the prompt exactly as the tasks do (the model's
chat template, pinned template variables) and returns a ``Sample`` whose ``needle_positions`` are the tokens of the
given spans, found from character offsets (never by matching tokens); its ``context_tokens`` is the context's length
and its ``depth`` where the first span starts in it (``needle_depth``), both as written. Spans are, in order of
precedence:

- ``spans=[(start, stop), "text", ...]``: character ``[start, stop)`` offsets into ``context``, or a string (every
  occurrence of it in the context);
- spans marked in the context itself: ``"The magic word is [[pineapple]]."`` (the marks are removed; they must pair
  up, ``check_marks``; given ``spans=``, a ``[[`` stays in the prompt as text);
- otherwise every occurrence of ``answer`` in the context.

Refused, each with a one-line ``DynheadsError``: an answer that is not inside a ``[[marked]]`` span (nor holds
one), an empty, blank or out-of-range span, a span whose tokens do not
decode back to its text (it tokenises away), a string or answer that does not occur, a context or question holding a
special token's spelling or a lone surrogate (``check_plain_text``), and a prompt longer than the model's context
window (when the model, not only its tokenizer, is given).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynheads.errors import DynheadsError
from dynheads.tasks.hotpotqa import SYSTEM_PROMPT, USER_TEMPLATE
from dynheads.tasks.prompting import locate, marked_spans, render_chat, token_span
from dynheads.tasks.sample import Sample, build_sample, needle_depth

MARK_OPEN, MARK_CLOSE = "[[", "]]"  # a span marked in the text: [[like this]]
_MARKED = re.compile(re.escape(MARK_OPEN) + "(.*?)" + re.escape(MARK_CLOSE), re.DOTALL)
_MARK = re.compile(re.escape(MARK_OPEN) + "|" + re.escape(MARK_CLOSE))  # either mark, left to right
_HUGE = 10**9  # tokenizers without a known window report a sentinel above this as model_max_length

SpanSpec = tuple[int, int] | str  # character [start, stop) of the context, or a text whose occurrences are spans


@dataclass(frozen=True)
class TextExtras:
    """What a sample of one's own text holds beyond the common fields (read as ``sample.question`` etc.)."""

    question: str
    record_id: str
    spans: list[tuple[int, int]]  # character [start, stop) of each span in the context, in context order
    span_tokens: list[tuple[int, int]]  # [start, stop) token range of each span in the prompt, same order
    context_span: tuple[int, int]  # [start, stop) token range of the context


def unmark(context: str) -> tuple[str, list[tuple[int, int]]]:
    """The context without its ``[[...]]`` marks, and the character spans the marks enclosed (in that text)."""
    spans, pieces, at, removed = [], [], 0, 0
    for match in _MARKED.finditer(context):
        pieces.append(context[at : match.start()])
        start = match.start() - removed
        spans.append((start, start + len(match[1])))
        pieces.append(match[1])
        removed += len(MARK_OPEN) + len(MARK_CLOSE)
        at = match.end()
    return "".join(pieces) + context[at:], spans


def check_marks(context: str) -> None:
    """Refuse ``[[...]]`` marks that do not pair up (an unclosed ``[[``, a stray ``]]``, a mark inside a mark) or
    enclose no text: ``unmark`` would leave the rest in the prompt as text, or mark the wrong span."""
    opened: int | None = None
    keep = f"(to keep {MARK_OPEN} or {MARK_CLOSE} as text, pass spans=[...])"
    for match in _MARK.finditer(context):
        at = match.start()
        if match[0] == MARK_OPEN and opened is not None:
            raise DynheadsError(f"the {MARK_OPEN} at character {at} opens a mark inside the mark at {opened} {keep}")
        if match[0] == MARK_CLOSE and opened is None:
            raise DynheadsError(f"the {MARK_CLOSE} at character {at} closes no {MARK_OPEN} {keep}")
        if match[0] == MARK_CLOSE and opened is not None and not context[opened + len(MARK_OPEN) : at].strip():
            raise DynheadsError(f"the mark at character {opened} holds no text {keep}")
        opened = at if match[0] == MARK_OPEN else None
    if opened is not None:
        raise DynheadsError(f"the {MARK_OPEN} at character {opened} is never closed with {MARK_CLOSE} {keep}")


def occurrences(context: str, text: str) -> list[tuple[int, int]]:
    """Character spans of every (non-overlapping) occurrence of ``text`` in ``context``."""
    return [(m.start(), m.end()) for m in re.finditer(re.escape(text), context)] if text else []


def resolve_spans(context: str, spans: Sequence[SpanSpec] | None, answer: str) -> list[tuple[int, int]]:
    """The character spans of ``context`` a sample marks (see the module docstring), sorted; refuses bad ones."""
    if spans is None:
        found = occurrences(context, answer.strip())
        if not found:
            given = answer.strip()
            missing = f"the answer {given[:60]!r} does not occur in the context" if given else "no answer"
            raise DynheadsError(
                f"no span to score ({missing}): give spans=[(start, stop)] or mark the span in the text as "
                f"{MARK_OPEN}...{MARK_CLOSE}"
            )
        return found
    if not spans:
        raise DynheadsError("spans is empty: give at least one span (start, stop) of the context")
    resolved: list[tuple[int, int]] = []
    for index, span in enumerate(spans):
        resolved += _one_span(context, index, span)
    return sorted(set(resolved))


def _one_span(context: str, index: int, span: Any) -> list[tuple[int, int]]:
    if isinstance(span, str):
        found = occurrences(context, span)
        if not span.strip() or not found:
            raise DynheadsError(f"span {index} {span[:60]!r} does not occur in the context (or is blank)")
        return found
    if (
        not isinstance(span, list | tuple)
        or len(span) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in span)
    ):
        raise DynheadsError(f"span {index} must be [start, stop] character offsets (integers) or a text, got {span!r}")
    start, stop = span
    if not 0 <= start < stop <= len(context):
        raise DynheadsError(
            f"span {index} [{start}, {stop}) is empty or outside the context of {len(context)} characters"
            " (need 0 <= start < stop <= length)"
        )
    if not context[start:stop].strip():
        raise DynheadsError(f"span {index} [{start}, {stop}) holds only whitespace")
    return [(start, stop)]


def check_answer_in_marks(answer: str, marked: Sequence[str]) -> None:
    """Refuse an ``answer`` that neither lies inside a ``[[marked]]`` span nor holds one (case aside): the marks,
    not the answer, say what is scored, so a question about another part of the text would score the wrong span."""
    given = answer.strip().lower()
    if not given or any(given in text.lower() or text.strip().lower() in given for text in marked):
        return
    shown = ", ".join(repr(text[:40]) for text in marked[:3])
    raise DynheadsError(
        f"the answer {answer.strip()[:60]!r} is not inside the marked span(s) {shown}, which are what would be "
        f"scored: mark its own span with {MARK_OPEN}...{MARK_CLOSE}, or pass spans=[...]"
    )


def fill_template(template: str, context: str, question: str) -> tuple[str, int]:
    """The user turn of ``template`` (one ``{context}``, at most one ``{question}``) and where the context starts."""
    if template.count("{context}") != 1:
        raise DynheadsError(f"the prompt template must hold {{context}} exactly once, got {template[:80]!r}")
    before, after = template.split("{context}")
    before, after = before.replace("{question}", question), after.replace("{question}", question)
    return before + context + after, len(before)


def sample_from_text(
    model: Any,
    context: str,
    question: str,
    *,
    answer: str = "",
    spans: Sequence[SpanSpec] | None = None,
    system_prompt: str = SYSTEM_PROMPT,
    template: str = USER_TEMPLATE,
    sample_id: str = "text",
    record_id: str | None = None,
    chat_template_kwargs: Mapping[str, object] | None = None,
    seed: int | None = None,
) -> Sample:
    """A ``Sample`` of one's own ``context`` and ``question`` whose needle is the given spans (module docstring).

    ``model``: a loaded model (``dynheads.load_model()``: its tokenizer, and its context window is checked) or a
    tokenizer. ``template``: the user turn, with ``{context}`` and ``{question}``; ``answer`` is what the sample's
    metrics compare the generation with; ``record_id`` names its source record (default: ``sample_id``)."""
    tokenizer = getattr(model, "tokenizer", model)
    if not isinstance(context, str) or not context.strip():
        raise DynheadsError("the context is empty: give the text the heads should read")
    for what, text in (("context", context), ("question", question), ("answer", answer)):
        check_plain_text(tokenizer if what != "answer" else None, text, what)  # the answer is not in the prompt
    marked_context, marked = unmark(context)
    if spans is None:
        check_marks(context)
    if spans is None and marked:
        context, spans = marked_context, marked
        check_answer_in_marks(answer, [context[start:stop] for start, stop in marked])
    char_spans = resolve_spans(context, spans, answer)
    user, offset = fill_template(template, context, question)
    prompt = render_chat(tokenizer, system_prompt, user, chat_template_kwargs)
    _check_window(model, tokenizer, len(prompt.input_ids))
    base = locate(prompt, user, what="user turn")[0] + offset
    pieces = [  # whitespace at a span's ends is no text to retrieve: it would add the next token (" .") to the needle
        (base + start + lead, base + stop - trail, text.strip(), f"span {i} [{start}, {stop}) {text!r}")
        for i, (start, stop) in enumerate(char_spans)
        for text in [context[start:stop]]
        for lead, trail in [(len(text) - len(text.lstrip()), len(text) - len(text.rstrip()))]
    ]
    span_tokens, positions = marked_spans(tokenizer, prompt, pieces)
    context_tokens = token_span(prompt, base, base + len(context))
    context_span = (context_tokens[0], context_tokens[-1] + 1)
    return build_sample(
        prompt,
        sample_id=sample_id,
        needle_positions=positions,
        answer=answer,
        context_tokens=len(context_tokens),
        depth=needle_depth(positions, context_span),
        seed=seed,
        extras=TextExtras(
            question=question,
            record_id=sample_id if record_id is None else record_id,
            spans=char_spans,
            span_tokens=span_tokens,
            context_span=context_span,
        ),
    )


def check_plain_text(tokenizer: Any, text: str, what: str) -> None:
    """Refuse a text no tokenizer can read as written: a lone surrogate (``\\ud800`` in JSON is no character), or,
    given a tokenizer, a special token's spelling (``<|im_end|>``), which it turns into that control token."""
    if not isinstance(text, str):
        raise DynheadsError(f"the {what} must be a string, got {type(text).__name__}")
    bad = next((i for i, char in enumerate(text) if "\ud800" <= char <= "\udfff"), None)
    if bad is not None:
        raise DynheadsError(
            f"the {what} holds a lone surrogate {text[bad]!r} at character {bad}: not a Unicode character (a JSON "
            "\\uXXXX escape of half a pair?)"
        )
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    special = {token.content for token in decoder.values() if token.special} if isinstance(decoder, Mapping) else set()
    found = sorted(token for token in special if token.strip() and token in text)  # a blank one is no spelling
    if found:
        raise DynheadsError(
            f"the {what} holds {found[0]!r}, a special token of this model's tokenizer: it would be read as that "
            "control token, not as text; remove it or spell it otherwise"
        )


def _check_window(model: Any, tokenizer: Any, length: int) -> None:
    """Refuse a prompt longer than the model's window (a loaded model's, else the tokenizer's when it knows one)."""
    window = getattr(model, "max_context", None) if model is not tokenizer else None
    if window is None:
        known = getattr(tokenizer, "model_max_length", None)
        window = known if isinstance(known, int) and known < _HUGE else None
    if window is not None and length > window:
        raise DynheadsError(f"the prompt has {length} tokens, more than the model's context window of {window}")
