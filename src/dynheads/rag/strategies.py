"""Which heads locate the context at each retrieval: the strategies compared in the paper's Table 4, as the registry
``RAG_STRATEGIES``.

- ``dynamic``: the probe's top-k heads predicted from this step's final hidden state (any callable);
- ``static``: the top k of a fixed ranking (e.g. the static retrieval heads);
- ``dynamic-random``: k heads drawn anew at every retrieval;
- ``fixed-random``: k heads drawn once and used for the whole answer;
- ``none`` (w/o RAG: the context stays hidden) and ``full-context`` (the context is always visible) use no heads;
- ``rerank`` (re-rank, then answer): the context's paragraphs are ranked once by in-context re-ranking
  (``dynheads.rag.rerank``, every head) and only the top ones stay visible for the whole answer; no retrieval step.

A ``RagStrategy`` entry holds ``select(selector, hidden)`` (the k heads of one retrieval; None for a strategy
that never retrieves), ``start(selector)`` (checks and draws made once per answer), what it needs (a static
ranking, the probe), whether the paper compares it and what of the context the answer sees outside retrievals
(``visibility``). ``HeadSelector``, the RAG run's jobs and checks and
``--strategies``' help read the entries.

Make one :class:`HeadSelector` per answer: random draws come from its seeded generator, so an answer's heads
are reproducible from its seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from dynheads.analysis.ranking import check_head_count
from dynheads.errors import DynheadsError
from dynheads.heads import Head, check_heads
from dynheads.registry import Registry

# predict_top(hidden [d_model], k) -> the k heads with the highest predicted retrieval score, best first.
HeadPredictor = Callable[[Any, int], Sequence[Head]]
# What of the context an answer sees outside a retrieval's windows: nothing ("hidden"; the windows of the last
# retrieval while it rewrites), all of it ("all"), or the windows the run gives it for the whole answer ("given").
Visibility = Literal["hidden", "all", "given"]


def random_heads(k: int, num_layers: int, num_heads: int, rng: np.random.Generator) -> list[Head]:
    """``k`` distinct heads drawn uniformly from all ``num_layers x num_heads``, sorted."""
    flat = rng.choice(num_layers * num_heads, size=k, replace=False)
    return sorted((int(i) // num_heads, int(i) % num_heads) for i in flat)


@dataclass(frozen=True)
class RagStrategy:
    """A RAG strategy in ``RAG_STRATEGIES``: ``select(selector, hidden)`` gives the k heads that choose a retrieval's
    windows (None: the arm never retrieves), ``start`` runs once per answer, the head sources it reads
    (``needs_static``, ``needs_probe``) and what of the context the answer sees (``visibility``). See docs/rag.md."""

    select: Callable[[HeadSelector, Any], list[Head]] | None  # (selector, hidden) -> k heads; None: never retrieves
    start: Callable[[HeadSelector], object] | None = None  # once per answer: checks, draws kept for the whole answer
    needs_static: bool = False  # reads the static ranking (--static FILE)
    needs_probe: bool = False  # reads the probe's predict_top (--predictor DIR)
    paper: bool = True  # compared in the paper's Table 4 (what a RAG run compares unless told otherwise)
    visibility: Visibility = "hidden"  # what of the context the answer sees outside a retrieval's windows

    @property
    def uses_heads(self) -> bool:
        return self.select is not None


RAG_STRATEGIES = Registry[RagStrategy]("RAG strategy")


class HeadSelector:
    """The heads of one answer's retrievals under one strategy."""

    def __init__(
        self,
        strategy: str,
        *,
        k: int,
        num_layers: int,
        num_heads: int,
        rng: np.random.Generator | int = 0,
        static_ranking: Sequence[Head] | None = None,
        predict_top: HeadPredictor | None = None,
    ):
        self.entry = RAG_STRATEGIES.get(strategy)  # an unknown name is the registry's one-line error
        if self.entry.uses_heads:
            check_head_count(k, num_layers * num_heads)
        self.strategy, self.k, self.num_layers, self.num_heads = strategy, k, num_layers, num_heads
        self.predict_top = predict_top
        self.rng = np.random.default_rng(rng)  # a Generator passed in is used as is
        self.static_ranking = static_ranking
        self.heads: list[Head] | None = None  # heads chosen once for the whole answer (static, fixed-random)
        if self.entry.start is not None:
            self.entry.start(self)

    @property
    def needs_heads(self) -> bool:
        """False for ``none`` and ``full-context``, which never retrieve."""
        return self.entry.uses_heads

    def select(self, hidden: Any = None) -> list[Head]:
        """The k heads for this retrieval; ``hidden`` (the step's final hidden state) is used by ``dynamic`` only."""
        if self.entry.select is None:
            raise DynheadsError(f"strategy {self.strategy!r} uses no heads: it never retrieves")
        return self.entry.select(self, hidden)

    def checked(self, heads: Sequence[Head], source: str) -> list[Head]:
        """``heads`` as k distinct valid heads, or a one-line error naming ``source``."""
        heads = [(int(layer), int(head)) for layer, head in heads]
        if len(heads) != self.k or len(set(heads)) != self.k:
            raise DynheadsError(f"{source} must give {self.k} distinct heads, got {heads}")
        check_heads(heads, self.num_layers, self.num_heads, source)
        return heads


# ---- the built-in strategies ----------------------------------------------------------------------------------------
def _need_predictor(selector: HeadSelector) -> HeadPredictor:
    if selector.predict_top is None:
        raise DynheadsError(f"strategy {selector.strategy!r} needs predict_top(hidden, k), e.g. the trained MLP probe")
    return selector.predict_top


def _predicted(selector: HeadSelector, hidden: Any) -> list[Head]:
    if hidden is None:
        raise DynheadsError(f"strategy {selector.strategy!r} needs the step's hidden state to predict its heads")
    return selector.checked(_need_predictor(selector)(hidden, selector.k), "predict_top")


def _top_of_ranking(selector: HeadSelector) -> None:
    ranking, k = selector.static_ranking, selector.k
    if ranking is None or len(ranking) < k:
        raise DynheadsError(f"strategy {selector.strategy!r} needs a ranking of at least k={k} heads")
    selector.heads = selector.checked(ranking[:k], "static ranking")


def _draw_once(selector: HeadSelector) -> None:
    selector.heads = random_heads(selector.k, selector.num_layers, selector.num_heads, selector.rng)


def _chosen(selector: HeadSelector, hidden: Any) -> list[Head]:
    assert selector.heads is not None  # chosen by the strategy's start
    return list(selector.heads)


def _drawn(selector: HeadSelector, hidden: Any) -> list[Head]:
    return random_heads(selector.k, selector.num_layers, selector.num_heads, selector.rng)


RAG_STRATEGIES.register(
    "dynamic",
    RagStrategy(_predicted, _need_predictor, needs_probe=True),
    help="the probe's top-k heads, predicted from each retrieval step's hidden state",
)
RAG_STRATEGIES.register(
    "static",
    RagStrategy(_chosen, _top_of_ranking, needs_static=True),
    help="the top k heads of the static list, at every retrieval",
)
RAG_STRATEGIES.register("dynamic-random", RagStrategy(_drawn), help="k heads drawn anew at every retrieval")
RAG_STRATEGIES.register(
    "fixed-random", RagStrategy(_chosen, _draw_once), help="k heads drawn once, for the whole answer"
)
RAG_STRATEGIES.register("none", RagStrategy(None), help="w/o RAG: the context stays hidden")
RAG_STRATEGIES.register("full-context", RagStrategy(None, visibility="all"), help="the context is always visible")
RAG_STRATEGIES.register(
    "rerank",
    RagStrategy(None, paper=False, visibility="given"),
    help="in-context re-ranking once; the top paragraphs stay visible for the whole answer",
)
PAPER_STRATEGIES = tuple(entry.name for entry in RAG_STRATEGIES if entry.value.paper)  # the built-in default
