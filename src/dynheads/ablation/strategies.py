"""The ablation strategies (``dynheads.ablation.cascade``): which heads one decode step removes, given its D_t.

Each strategy is an ``AblationStrategy`` in the registry ``ABLATION_STRATEGIES``: a ``choose(inputs)`` returning the
heads to remove, what it needs (a static head list, ``--heads``), whether it is a matched control (it removes as
many heads as the step's D_t, or the dynamic run's mean |D_t|: ``matching``) or the un-ablated baseline, and the
title of its heat-map panel; ``MATCHINGS`` holds the rules for that count. The decoding loop, the grid's checks
and run order, ``--strategies``' help and the figure read the entries. Registration order is run order
(``none``, then ``dynamic``, which the mean-matched controls read their count from, then the rest).

- ``none``: plain greedy decoding (the baseline); ``dynamic``: D_t, or its first ``max_dynamic`` heads ordered by
  attention on the copied position (progressive ablation);
- ``static``: the top heads of a static list; ``static_outside``: the top static heads outside the step's D_t
  (separates "dynamic" from "important and always on"); ``random``: a seeded draw at each step (matched controls);
- ``contrast``: the step's top heads by a second score, its own active set first (``--contrast copy`` with D_t of
  the write score: "does W_t matter more than as many copy heads?"), as many as D_t;
- ``fixed``: one given head set (``--heads``) at every step.

This module imports no torch: the CLI reads the names and help texts at start-up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynheads.heads import Head
from dynheads.registry import Registry


@dataclass(frozen=True)
class MaskInputs:
    """What a strategy may read when it picks the heads one step removes."""

    dynamic: Sequence[Head]  # D_t of the step's clean pass, ranked (highest first)
    count: int  # matched controls: heads to remove at this step (|D_t|, or the dynamic run's mean), at most L x H
    max_dynamic: int | None  # progressive ablation: remove only the first k of D_t
    static_ranking: Sequence[Head]
    fixed_heads: Sequence[Head]
    num_layers: int
    num_heads: int
    rng: np.random.Generator  # seeded per sample
    ranking: Sequence[Head] = ()  # a dose: every head of the step ranked, D_t first (``ScoreSpec.step_ranking``)
    dosed: bool = False  # a dose (a fraction f of |D_t|): every strategy removes ``count`` = ceil(f |D_t|) heads
    contrast: Sequence[Head] = ()  # every head ranked by a second score, its own active set first (``contrast``)


@dataclass(frozen=True)
class AblationStrategy:
    choose: Callable[[MaskInputs], list[Head]]
    title: str  # its heat-map panel's title
    matched: bool = False  # a control removing as many heads as D_t (``matching``: per step, or the mean |D_t|)
    baseline: bool = False  # removes nothing: always run, drawn last
    needs_static: bool = False  # reads the static head list (--static FILE)
    needs_heads: bool = False  # reads the given head set (--heads)
    needs_contrast: bool = False  # reads a second score's ranking (--contrast)
    counts: bool = False  # its run's mean |D_t| is the count the matched controls mask under mean matching


ABLATION_STRATEGIES = Registry[AblationStrategy]("ablation strategy")
# the arms of Claim 2's dose-response: each masks ceil(f |D_t|) heads at step t, f a fraction of the step's |D_t|
DOSE_ARMS = ("dynamic", "static", "static_outside", "random")
# the paper's literal controls at f = 1: static / random masking the clean answer's mean |D_t| (rounded) at every step
MEAN_ARMS = {"static_mean": "static", "random_mean": "random"}


def dose_key(fraction: float) -> str:
    """How a fraction names its dose in records, numbers and dose.csv: 0.25, 1, 1.5 (six significant digits, so
    two fractions closer than that share a name: ``AblationConfig.check_doses`` refuses them)."""
    return f"{fraction:g}"


def counting_strategy() -> str:
    """The strategy whose run gives the matched controls their mean count (``counts``): the dynamic one."""
    return next(entry.name for entry in ABLATION_STRATEGIES if entry.value.counts)


def ablation_strategy(title: str, **traits: Any) -> Callable[[Callable[[MaskInputs], list[Head]]], AblationStrategy]:
    """Decorator: a ``choose`` function as an ``AblationStrategy`` titled ``title``, with ``traits``."""
    return lambda choose: AblationStrategy(choose, title, **traits)


@dataclass(frozen=True)
class Matching:
    """How many heads a matched control removes at one step."""

    count: Callable[[Sequence[Head], int | None], int]  # (the step's D_t, the given count) -> heads to remove
    given_count: bool  # reads a count fixed per sample (the dynamic run's mean |D_t|): that run goes first


def _given_count(dynamic: Sequence[Head], given: int | None) -> int:
    if given is None:
        raise ValueError("the 'mean' matching needs the dynamic run's count (that run goes first)")
    return int(given)


MATCHINGS = Registry[Matching]("matching")
MATCHINGS.register(
    "per_step",
    Matching(lambda dynamic, given: len(dynamic), given_count=False),
    help="|D_t| of each step's clean pass of the control run",
)
MATCHINGS.register("mean", Matching(_given_count, given_count=True), help="the dynamic run's mean |D_t|, rounded")


def panel_order() -> list[str]:
    """Strategies in heat-map panel order: registration order, the baselines last."""
    entries = list(ABLATION_STRATEGIES)
    return [e.name for e in entries if not e.value.baseline] + [e.name for e in entries if e.value.baseline]


@ABLATION_STRATEGIES.register("none", help="no masking: plain greedy decoding (always run, the baseline)")
@ablation_strategy("no masking (baseline)", baseline=True)
def _none(inputs: MaskInputs) -> list[Head]:
    return []


@ABLATION_STRATEGIES.register("dynamic", help="mask D_t, each step's dynamic heads (progressive: the first k)")
@ablation_strategy("dynamic heads masked", counts=True)
def _dynamic(inputs: MaskInputs) -> list[Head]:
    if inputs.dosed:  # the dose's k_t best-ranked heads: D_t's first (all of D_t, then the step's next best, past 1)
        chosen = inputs.dynamic if inputs.count <= len(inputs.dynamic) else inputs.ranking
        return list(chosen[: inputs.count])
    return list(inputs.dynamic if inputs.max_dynamic is None else inputs.dynamic[: inputs.max_dynamic])


@ABLATION_STRATEGIES.register("static", help="mask the top heads of a static list, as many as D_t")
@ablation_strategy("static heads masked", matched=True, needs_static=True)
def _static(inputs: MaskInputs) -> list[Head]:
    return list(inputs.static_ranking[: inputs.count])


@ABLATION_STRATEGIES.register("static_outside", help="mask the top static heads outside D_t, as many as D_t")
@ablation_strategy("static heads outside D_t masked", matched=True, needs_static=True)
def _static_outside(inputs: MaskInputs) -> list[Head]:
    dynamic = set(inputs.dynamic)
    return [head for head in inputs.static_ranking if head not in dynamic][: inputs.count]


@ABLATION_STRATEGIES.register("random", help="mask heads drawn at each step, as many as D_t")
@ablation_strategy("random heads masked", matched=True)
def _random(inputs: MaskInputs) -> list[Head]:
    if inputs.count == 0:  # no draw: the generator's stream stays as it was
        return []
    flat = inputs.rng.choice(inputs.num_layers * inputs.num_heads, size=inputs.count, replace=False)
    return [(int(i) // inputs.num_heads, int(i) % inputs.num_heads) for i in sorted(flat)]


@ABLATION_STRATEGIES.register(
    "contrast", help="mask the step's top heads by a second score (--contrast copy: D_t of Eq. 1 first), as many as D_t"
)
@ablation_strategy("contrast score's heads masked", matched=True, needs_contrast=True)
def _contrast(inputs: MaskInputs) -> list[Head]:
    return list(inputs.contrast[: inputs.count])


@ABLATION_STRATEGIES.register("fixed", help="mask one given head set at every step (--heads)")
@ablation_strategy("fixed heads masked", needs_heads=True)
def _fixed(inputs: MaskInputs) -> list[Head]:
    return list(inputs.fixed_heads)
