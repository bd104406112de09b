"""Decoy needles: the null a continuous head score's threshold is fitted against (issue 63, the write score).

A decoy task is a needle task whose samples are its base task's, prompt for prompt, with the needle positions moved
to a haystack span of the same length that holds no needle token: the model reads the same prompt and writes the
same answer, and every head score is measured at a span that carries no answer. What the write score (or Eq. 2)
gives there is what it gives by chance, at the same lengths, depths and answers; ``null:Q`` thresholds
(``dynheads.thresholds``, ``views.threshold_fit``) are fitted on a traced decoy run so that the decoy spans mark Q
heads per step on average, the expected false members of each step's set.

The decoy span starts half a haystack away from the needle (wrapping around inside the haystack's tokens), so it
sits at another depth of the same essay and never overlaps the needle. Answers, metrics and sample ids are the base
task's; ``meta["decoy_of"]`` keeps the real needle positions. Fit on a stream the evaluated run does not hold (the
static split): ``views.threshold_fit`` refuses a fitting run that shares a sample seed with the evaluated run.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dynheads.errors import DynheadsError
from dynheads.tasks.grid import TaskGrid
from dynheads.tasks.niah import NIAH
from dynheads.tasks.registry import Task, register
from dynheads.tasks.sample import Sample
from dynheads.tasks.spelled import SPELLED_NIAH, SPELLED_NIAH_PARAPHRASED

SUFFIX = "_decoy"


def decoy_span(needle: list[int], context_span: tuple[int, int]) -> list[int]:
    """A span of ``len(needle)`` haystack positions half a haystack after the needle's start (wrapping inside
    ``context_span = (start, stop)``), disjoint from the needle."""
    start, stop = context_span
    width, room = len(needle), stop - start
    half_away = start + (needle[0] - start + room // 2) % (room - width + 1)
    for first in (half_away, needle[-1] + 1, needle[0] - width, start):  # then just past or before the needle
        if start <= first <= stop - width and (first + width <= needle[0] or first > needle[-1]):
            return list(range(first, first + width))
    raise DynheadsError(
        f"a haystack of {room} tokens has no room for a decoy span of {width} beside the needle at "
        f"{needle[0]}..{needle[-1]}: use a longer context"
    )


def decoy_sample(sample: Sample) -> Sample:
    """``sample`` with its needle positions moved to its decoy span (``meta["decoy_of"]``: the real ones)."""
    needle = sorted(sample.needle_positions)
    decoy = decoy_span(needle, sample.context_span)
    return replace(sample, needle_positions=decoy, meta={**sample.meta, "decoy_of": needle})


def is_decoy(task_name: str) -> bool:
    """Whether the task of this name measures its scores at decoy spans."""
    return task_name.endswith(SUFFIX)


def _decoy_grid(base: Task):
    def grid(config: Any, tokenizer) -> TaskGrid:
        built = base.grid(config, tokenizer)
        return replace(built, samples=[decoy_sample(sample) for sample in built.samples])

    return grid


def _decoy_prompt(base: Task):
    def manifest(config: Any) -> dict:
        return {**base.prompt(config), "decoy": "needle positions moved to a same-length haystack span (the null)"}

    return manifest


def decoy_of(base: Task) -> Task:
    """Register the decoy twin of needle task ``base`` (``<name>_decoy``)."""
    return register(
        replace(
            base,
            name=base.name + SUFFIX,
            label=f"{base.label}, decoy span",
            grid=_decoy_grid(base),
            prompt=_decoy_prompt(base),
            help=f"{base.name} scored at a same-length haystack span instead of the needle: the null for null:Q",
        )
    )


NIAH_DECOY = decoy_of(NIAH)
SPELLED_NIAH_DECOY = decoy_of(SPELLED_NIAH)
SPELLED_NIAH_PARAPHRASED_DECOY = decoy_of(SPELLED_NIAH_PARAPHRASED)
