"""Render a task prompt through the model's chat template and locate marked text spans as token indices.

Spans are found from character offsets of the fully rendered prompt (the tokenizer's offset mapping), never
by matching token sets, and the prompt is tokenised exactly once: the token indices we report are the ones
the model sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from transformers import PreTrainedTokenizerBase

from dynheads.errors import DynheadsError


@dataclass(frozen=True)
class RenderedPrompt:
    text: str  # the full prompt string, chat markup included
    input_ids: list[int]
    offsets: list[tuple[int, int]]  # character span of each token in ``text``
    template: str  # "chat" when the tokenizer's chat template was used, else "plain"


def render_chat(tokenizer: PreTrainedTokenizerBase, system: str, user: str) -> RenderedPrompt:
    """Render system + user turns with the chat template (plain text when the model has none) and tokenise."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception:  # some templates (Gemma 2) refuse a system turn: fold it into the user turn
            messages = [{"role": "user", "content": f"{system}\n\n{user}"}]
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        template, special = "chat", False  # the template already holds BOS and turn markers
    else:
        text, template, special = f"{system}\n\n{user}\n\nAnswer:", "plain", True
    if not getattr(tokenizer, "is_fast", False):
        raise DynheadsError("exact needle spans need a fast tokenizer (with offset mapping); this model has a slow one")
    encoded = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    return RenderedPrompt(text, list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]], template)


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
    decoded = tokenizer.decode([ids[i] for i in positions]) if positions else ""
    if must_contain not in decoded.replace(" ", "") and must_contain not in decoded:
        raise DynheadsError(
            f"the {what} does not survive tokenisation: its tokens decode to {decoded[:80]!r}, "
            f"which does not contain {must_contain!r} (unknown characters for this tokenizer?)"
        )


class SampleRecord:
    """Mixin for task sample dataclasses: ``describe()`` is what a per-sample record stores (no token ids)."""

    def describe(self) -> dict:
        record = asdict(self)
        del record["input_ids"]
        record["prompt_tokens"] = len(self.input_ids)
        return record
