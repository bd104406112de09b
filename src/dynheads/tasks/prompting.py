"""Render a task prompt through the model's chat template and locate marked text spans as token indices.

Spans are found from character offsets of the fully rendered prompt (the tokenizer's offset mapping), never
by matching token sets, and the prompt is tokenised exactly once: the token indices we report are the ones
the model sees.

Chat templates read variables besides the messages; the ones that change the prompt are pinned
(``PINNED_TEMPLATE_VARIABLES``) so a run never depends on the template's defaults or on the day it runs:
Qwen3 templates think by default (answers start with ``<think>``), Llama 3.x templates stamp today's date.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from dynheads.errors import DynheadsError
from dynheads.models import decode_text

if TYPE_CHECKING:  # transformers is imported by the code that loads a tokenizer, not by the task's module
    from transformers import PreTrainedTokenizerBase

# Template variables passed to every chat template (templates ignore the ones they do not use):
# - enable_thinking=False: Qwen3 templates otherwise open a <think> block (EM/F1 silently 0, budget spent thinking);
# - date_string: Llama 3.x templates otherwise stamp today's date, so a run resumed another day mixes prompts.
#   "26 Jul 2024" is the date Llama 3.1's own template falls back to, so its prompts stay the published ones.
PINNED_TEMPLATE_VARIABLES: dict[str, object] = {"enable_thinking": False, "date_string": "26 Jul 2024"}
# The prompt template of a model whose chat template refuses a system turn (Gemma 2): the system prompt is folded
# into the user turn, and the manifests say so.
SYSTEM_IN_USER_TURN = "chat (system prompt in the user turn)"


def chat_template_kwargs(overrides: str | Mapping[str, object] | None = None) -> dict[str, Any]:
    """The pinned template variables updated with ``overrides`` (a JSON object as text, or a mapping)."""
    if isinstance(overrides, str):
        try:
            overrides = json.loads(overrides) if overrides.strip() else {}
        except json.JSONDecodeError as error:
            raise DynheadsError(
                f"chat template kwargs must be a JSON object; cannot read {overrides!r}: {error}"
            ) from None
    if overrides is not None and not isinstance(overrides, Mapping):
        raise DynheadsError(
            f"chat template kwargs must be a JSON object such as '{{\"enable_thinking\": true}}', got {overrides!r}"
        )
    return {**PINNED_TEMPLATE_VARIABLES, **dict(overrides or {})}


@dataclass(frozen=True)
class RenderedPrompt:
    text: str  # the full prompt string, chat markup included
    input_ids: list[int]
    offsets: list[tuple[int, int]]  # character span of each token in ``text``
    template: str  # "chat" (the tokenizer's chat template), SYSTEM_IN_USER_TURN or "plain"
    template_kwargs: dict = field(default_factory=dict)  # variables given to the chat template ({} for plain)


def render_chat(
    tokenizer: PreTrainedTokenizerBase, system: str, user: str, template_kwargs: Mapping[str, object] | None = None
) -> RenderedPrompt:
    """Render system + user turns with the chat template (plain text when the model has none) and tokenise.

    ``template_kwargs``: template variables (None = ``PINNED_TEMPLATE_VARIABLES``).
    """
    variables = chat_template_kwargs(template_kwargs)
    if getattr(tokenizer, "chat_template", None):
        try:
            text, template = _render_turns(tokenizer, system, user, variables)
        except Exception as error:  # a template's own failure (its raise_exception, a bug in it): one line
            raise DynheadsError(
                f"the model's chat template cannot render the prompt: {type(error).__name__}: {error}"
            ) from None
        special = False  # the template already holds BOS and turn markers
    else:
        text, template, special, variables = f"{system}\n\n{user}\n\nAnswer:", "plain", True, {}
    if not getattr(tokenizer, "is_fast", False):
        raise DynheadsError("exact needle spans need a fast tokenizer (with offset mapping); this model has a slow one")
    encoded = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    return RenderedPrompt(
        text, list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]], template, variables
    )


def template_of(tokenizer: PreTrainedTokenizerBase, system: str) -> dict[str, Any]:
    """What a run manifest records of how prompts of ``system`` and a user turn are rendered (docs/formats.md):
    ``prompt_template`` and ``chat_template_kwargs`` (the pinned variables), from ``render_chat`` itself."""
    prompt = render_chat(tokenizer, system, "{user}")
    return {"prompt_template": prompt.template, "chat_template_kwargs": prompt.template_kwargs}


def _render_turns(
    tokenizer: PreTrainedTokenizerBase, system: str, user: str, variables: dict[str, Any]
) -> tuple[str, str]:
    """The system and user turns through the chat template, and the prompt template that says how."""
    from jinja2 import TemplateError  # what a chat template's raise_exception raises (transformers renders with it)

    try:
        return _templated(
            tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": user}], variables
        ), "chat"
    except TemplateError:  # some templates (Gemma 2) refuse a system turn: fold it into the user turn, say so
        folded = [{"role": "user", "content": f"{system}\n\n{user}"}]
        return _templated(tokenizer, folded, variables), SYSTEM_IN_USER_TURN


def _templated(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], variables: dict[str, Any]) -> str:
    # untokenised, the template's output is one string (transformers types every return form)
    return cast(str, tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **variables))


def token_span(prompt: RenderedPrompt, start: int, stop: int) -> list[int]:
    """Indices of the tokens whose characters overlap ``text[start:stop]``."""
    return [i for i, (a, b) in enumerate(prompt.offsets) if a < stop and b > start and b > a]


def locate(prompt: RenderedPrompt, needle: str, *, what: str = "needle") -> tuple[int, int]:
    """Character span of the single occurrence of ``needle`` in the rendered prompt."""
    start = prompt.text.find(needle)
    if start < 0 or prompt.text.find(needle, start + 1) >= 0:
        found = "not found" if start < 0 else "found more than once"
        raise DynheadsError(f"the {what} {needle[:60]!r} is {found} in the rendered prompt")
    return start, start + len(needle)


def check_span_keeps(
    tokenizer: PreTrainedTokenizerBase, ids: Sequence[int], positions: Sequence[int], must_contain: str, what: str
) -> None:
    """Refuse a span whose tokens do not decode back to text containing ``must_contain`` (lost in tokenisation)."""
    decoded = decode_text(tokenizer, [ids[i] for i in positions]) if positions else ""
    if must_contain not in decoded.replace(" ", "") and must_contain not in decoded:
        raise DynheadsError(
            f"the {what} does not survive tokenisation: its tokens decode to {decoded[:80]!r}, "
            f"which does not contain {must_contain!r} (unknown characters for this tokenizer?)"
        )


def marked_spans(
    tokenizer: PreTrainedTokenizerBase, prompt: RenderedPrompt, pieces: Iterable[tuple[int, int, str, str]]
) -> tuple[list[tuple[int, int]], list[int]]:
    """Token spans of marked text: ``pieces`` are (start, stop, must_contain, what) character spans of the prompt.
    Returns each piece's ``[start, stop)`` token range (same order) and the sorted union of their tokens."""
    spans, positions = [], set()
    for start, stop, must_contain, what in pieces:
        span = token_span(prompt, start, stop)
        check_span_keeps(tokenizer, prompt.input_ids, span, must_contain, what)
        spans.append((span[0], span[-1] + 1))
        positions.update(span)
    return spans, sorted(positions)


def context_spans(
    tokenizer: PreTrainedTokenizerBase,
    prompt: RenderedPrompt,
    context: str,
    pieces: Sequence[tuple[int, int, str, str]],
) -> tuple[list[tuple[int, int]], list[int], tuple[int, int]]:
    """The token spans of ``pieces`` of ``context`` in the rendered prompt (each: character ``[start, stop)`` in the
    context, the text its tokens must decode to, a label for errors), their positions (Eq. 2's needle) and the
    context's token span."""
    base, context_stop = locate(prompt, context, what="context")
    context_positions = token_span(prompt, base, context_stop)
    spans, positions = marked_spans(
        tokenizer, prompt, [(base + start, base + stop, text, label) for start, stop, text, label in pieces]
    )
    return spans, positions, (context_positions[0], context_positions[-1] + 1)
