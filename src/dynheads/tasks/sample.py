"""The one sample type of every task: a rendered prompt, where its needle sits, and the expected answer.

Common fields are plain attributes; what only one task has (HotpotQA's question and supporting-fact spans,
NIAH's answer token count) is one frozen dataclass in ``extras``, whose fields read as attributes of the sample
too (``sample.context_span``). ``describe()`` is what a run's per-sample record stores: every field but the
token ids, extras flattened after ``answer`` (the record columns runs have always had).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from dynheads.tasks.prompting import RenderedPrompt


@dataclass(frozen=True)
class Sample:
    """One prompt of a task. ``needle_positions`` are token indices into ``input_ids`` (Eq. 1's / Eq. 2's needle)."""

    sample_id: str
    input_ids: list[int]
    needle_positions: list[int]
    answer: str
    # what only generated tasks have (None for a prompt of one's own text, ``dynheads.sample_from_text``):
    context_tokens: int | None = None  # the task's length convention (haystack or context block, in model tokens)
    depth: float | None = None  # where the needle sits, 0..1 (as asked, or realised: ``needle_depth``)
    seed: int | None = None
    prompt_template: str = "plain"  # "chat" (the tokenizer's chat template) or "plain"
    extras: Any = None  # a frozen dataclass of the task's own fields (None: the task has none)
    meta: dict = field(default_factory=dict)  # free-form facts about how the sample was built
    chat_template_kwargs: dict = field(default_factory=dict)  # template variables the prompt was rendered with

    def __post_init__(self) -> None:
        if self.extras is not None and not is_dataclass(self.extras):
            raise TypeError(f"sample extras must be a dataclass instance, got {type(self.extras).__name__}")

    def __getattr__(self, name: str) -> Any:
        """The task's own fields, read through ``extras`` (called only for names the sample lacks)."""
        extras = self.__dict__.get("extras")
        if extras is not None and name in {f.name for f in fields(extras)}:
            return getattr(extras, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def describe(self) -> dict:
        """The per-sample record: every field but ``input_ids`` (its length as ``prompt_tokens``)."""
        data = asdict(self)
        extras = data.pop("extras") or {}
        record: dict = {}
        for key, value in data.items():
            if key != "input_ids":
                record[key] = value
            if key == "answer":  # as a saved record reads back (JSON has lists): a span is [start, stop]
                record.update({name: list(v) if isinstance(v, tuple) else v for name, v in extras.items()})
        record["prompt_tokens"] = len(self.input_ids)
        return record


def build_sample(
    prompt: RenderedPrompt,
    *,
    sample_id: str,
    needle_positions: Sequence[int],
    answer: str,
    context_tokens: int | None = None,
    depth: float | None = None,
    seed: int | None = None,
    extras: Any = None,
    meta: dict | None = None,
) -> Sample:
    """A ``Sample`` of a rendered prompt (its tokens, template kind and template variables)."""
    return Sample(
        sample_id=sample_id,
        input_ids=prompt.input_ids,
        needle_positions=list(needle_positions),
        answer=answer,
        context_tokens=context_tokens,
        depth=depth,
        seed=seed,
        prompt_template=prompt.template,
        extras=extras,
        meta=meta or {},
        chat_template_kwargs=prompt.template_kwargs,
    )


def needle_depth(needle_positions: Sequence[int], context_span: tuple[int, int]) -> float:
    """Where a needle sits in its context, 0..1: its first token's place among the context's tokens (2 decimals).
    The depth of a sample whose context is given as written rather than built at a depth."""
    start, stop = context_span
    return round((min(needle_positions) - start) / max(stop - start - 1, 1), 2)


def template_fields(samples: Sequence[Sample]) -> dict[str, Any]:
    """What a run manifest records of how its prompts were rendered (docs/formats.md): the first sample's
    ``prompt_template`` and ``chat_template_kwargs`` (one tokenizer renders every prompt of a run alike); {} for
    no samples."""
    if not samples:
        return {}
    return {"prompt_template": samples[0].prompt_template, "chat_template_kwargs": samples[0].chat_template_kwargs}
