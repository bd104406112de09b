"""The KV-retention policies (``dynheads.kv.retention``): which KV heads keep their whole cache at one decode step.

Each policy is a ``RetentionPolicy`` in the registry ``KV_POLICIES``: a ``choose(inputs)`` that returns the KV
heads kept whole, what it needs (a static head list, a trained probe, a clean full-KV pass at every step), how it
is costed (dynamic head sets keep the full KV in a second tier) and how figures draw it. The decoding loop
(``kv.kv_generate``), the experiment's jobs and checks, the CLI's help and the figures read these entries, so a
policy registered anywhere (a test file too) runs, is checked and is drawn like the built-in ones.

The built-in policies:

- ``full``: every head keeps its KV (the unmodified model, the ceiling); ``none``: every head streams,
- ``static``: the top-k KV heads of a static list (DuoAttention / RazorAttention / HeadKV), the same at every step;
  a KV head is ranked by its best query head's score and only KV heads with a positive score are ever kept (a
  budget beyond them keeps them all and records the shortfall: no zero-score filler),
- ``probe``: the top-k KV heads by a trained head predictor (``analysis.head_predictor``) applied to the final
  hidden state of the previous step (the last one the decoder has when step t starts), a KV head scoring as its
  best query head; or, with ``probe_select="threshold"``, the KV heads with a query head above the probe's
  decision threshold (a variable count),
- ``oracle``: the KV heads of the previous step's D_t (Eq. 1 copy heads) from a clean full-KV pass, at most k, in
  the order of their best head's attention weight; ``true``: the same for the current step's D_t from a clean
  pass at the same step (an offline upper bound, as in the ablation's two-pass scheme; the clean pass leaves the
  cache untouched). Both fill the rest of the budget with the static list's KV heads in its order
  (``fill_from_static``), so they hold the bytes every other policy holds at the budget (D_t alone is a few heads),
- ``random``: k KV heads drawn per step from a seeded generator.

Adding one (``tests/test_kv_policies.py`` does it from the test file alone)::

    @KV_POLICIES.register("first-layers", help="the first k KV heads in layer order")
    @retention_policy(dynamic=False)
    def first_layers(inputs: PolicyInputs) -> list[KVHead]:
        return list(inputs.every[: inputs.k])

This module imports no torch: the CLI reads the names and help texts at start-up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dynheads.heads import Head
from dynheads.registry import Registry

if TYPE_CHECKING:
    from dynheads.analysis.kvheads import KVHead


@dataclass(frozen=True)
class PolicyInputs:
    """What a policy may read when it picks the KV heads kept whole at one step."""

    k: int  # KV heads the budget allows
    every: Sequence[KVHead]  # every KV head, (layer, KV head) in layer order
    groups: int  # G: query heads per KV head (query head h reads KV head h // G)
    static_ranking: Sequence[KVHead]  # scored KV heads, best first (policies with needs_static)
    previous_dynamic: Sequence[Head]  # D_{t-1} of the previous step's clean pass (policies with clean_pass)
    clean_dynamic: Sequence[Head] | None  # D_t of this step's clean pass (policies with clean_pass)
    probe_scores: np.ndarray | None  # [KV head, G] probe(h_{t-1}) (needs_probe; None before any hidden state)
    probe_threshold: float | None  # the probe's decision threshold
    probe_select: str  # "top" (k KV heads) or "threshold" (every KV head with a query head above it)
    rng: np.random.Generator  # seeded per sample: random draws are reproducible


@dataclass(frozen=True)
class PlotStyle:
    colour: str  # a matplotlib colour
    marker: str
    dashes: str | tuple = "-"  # a matplotlib line style ("none": points only)


@dataclass(frozen=True)
class RetentionPolicy:
    choose: Callable[[PolicyInputs], list[KVHead]]
    budget_free: bool = False  # its head set does not depend on the budget (run once per sample)
    dynamic: bool = False  # its head set changes per step: costed with a second tier (full KV offloaded)
    clean_pass: bool = False  # needs a clean full-KV pass at every step (its D_t; the cache is left untouched)
    needs_static: bool = False  # reads the static head ranking (--static FILE)
    needs_probe: bool = False  # reads the trained head predictor's scores (--predictor DIR)
    reference: bool = False  # the unmodified cache: a given predictor's precision and recall is read along it
    style: PlotStyle | None = None  # None: a default style (``plot_style``)


KV_POLICIES = Registry[RetentionPolicy]("KV policy")


def retention_policy(**traits: Any) -> Callable[[Callable[[PolicyInputs], list[KVHead]]], RetentionPolicy]:
    """Decorator: a ``choose`` function as a ``RetentionPolicy`` with ``traits`` (the fields after ``choose``)."""
    return lambda choose: RetentionPolicy(choose, **traits)


def is_budget_free(name: str) -> bool:
    """True for a registered policy whose head set ignores the budget (a kvpress press is not one)."""
    return name in KV_POLICIES and KV_POLICIES.get(name).budget_free


def plot_style(name: str, index: int) -> PlotStyle:
    """The entry's style; a policy registered without one, or any other name (a kvpress press), gets a colour and
    marker of its own from ``index`` (its place in the figure; ten colours that no built-in policy and no grey
    uses, a new marker every ten places, so two unstyled policies never look alike), so no policy is left out of a
    figure."""
    policy = KV_POLICIES.get(name) if name in KV_POLICIES else None
    if policy is not None and policy.style is not None:
        return policy.style
    colours = len(UNSTYLED_COLOURS)
    return PlotStyle(UNSTYLED_COLOURS[index % colours], UNSTYLED_MARKERS[index // colours % len(UNSTYLED_MARKERS)])


# matplotlib's C5, C6, C8, C9 (not C7: grey, the Pareto front's) and six darker tab20b hues
UNSTYLED_COLOURS = (
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
    "#7b4173",
    "#6b6ecf",
)
UNSTYLED_MARKERS = ("P", "h", "d", "p", "8")


# ---- the built-in policies ------------------------------------------------------------------------------------------
@KV_POLICIES.register("full", help="every KV head keeps its whole cache (the unmodified model, the ceiling)")
@retention_policy(budget_free=True, reference=True, style=PlotStyle("k", "*", "none"))
def _full(inputs: PolicyInputs) -> list[KVHead]:
    return list(inputs.every)


@KV_POLICIES.register("none", help="every KV head streams (sink + recent window only)")
@retention_policy(budget_free=True, style=PlotStyle("k", "X", "none"))
def _none(inputs: PolicyInputs) -> list[KVHead]:
    return []


@KV_POLICIES.register("static", help="the top-k KV heads of a static head list, the same at every step")
@retention_policy(needs_static=True, style=PlotStyle("C1", "s", "--"))
def _static(inputs: PolicyInputs) -> list[KVHead]:
    # only positive-score KV heads are ranked: a budget beyond them keeps them all (the shortfall is recorded)
    return list(inputs.static_ranking[: inputs.k])


@KV_POLICIES.register("probe", help="the top-k KV heads (or those above threshold) by the head predictor on h_{t-1}")
@retention_policy(dynamic=True, needs_probe=True, style=PlotStyle("C0", "o", "-"))
def _probe(inputs: PolicyInputs) -> list[KVHead]:
    scores = inputs.probe_scores
    if scores is None:  # a one-token prompt: no hidden state yet
        return []
    if inputs.probe_select == "top":  # a KV head scores as its best query head; ties by (layer, KV head)
        return [inputs.every[int(i)] for i in np.argsort(-scores.max(1), kind="stable")[: inputs.k]]
    return [inputs.every[int(i)] for i in np.flatnonzero((scores > inputs.probe_threshold).any(1))]


@KV_POLICIES.register(
    "oracle",
    help="the KV heads of the previous step's D_t (clean full-KV pass), the rest of the k from the static list",
)
@retention_policy(dynamic=True, clean_pass=True, needs_static=True, style=PlotStyle("C3", "v", "-."))
def _oracle(inputs: PolicyInputs) -> list[KVHead]:
    return fill_from_static(kv_heads_of(inputs.previous_dynamic, inputs.groups), inputs)


@KV_POLICIES.register(
    "true",
    help="the KV heads of this step's own D_t from a clean pass, the rest of the k from the static list (offline "
    "upper bound)",
)
@retention_policy(dynamic=True, clean_pass=True, needs_static=True, style=PlotStyle("C4", "D", (0, (1, 3))))
def _true(inputs: PolicyInputs) -> list[KVHead]:
    return fill_from_static(kv_heads_of(inputs.clean_dynamic or (), inputs.groups), inputs)


@KV_POLICIES.register("random", help="k KV heads drawn per step from a seeded generator")
@retention_policy(dynamic=True, style=PlotStyle("C2", "^", ":"))
def _random(inputs: PolicyInputs) -> list[KVHead]:
    every = inputs.every
    return [every[int(i)] for i in sorted(inputs.rng.choice(len(every), size=inputs.k, replace=False))]


def fill_from_static(first: Sequence[KVHead], inputs: PolicyInputs) -> list[KVHead]:
    """``first`` (a step's own picks, best first), then the static ranking's KV heads not among them, k in all: the
    step's set keeps its place and the budget is filled in static order (short only where the static list's
    positive-score heads run out, as for ``static``)."""
    return list(dict.fromkeys([*first[: inputs.k], *inputs.static_ranking]))[: inputs.k]


def kv_heads_of(heads: Sequence[Head], groups: int) -> list[KVHead]:
    """The KV heads the query heads read, in the order of their first query head."""
    return list(dict.fromkeys((layer, head // groups) for layer, head in heads))
