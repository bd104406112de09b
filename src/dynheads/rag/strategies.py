"""Which heads locate the context at each retrieval: the strategies compared in the paper's Table 4.

- ``dynamic``: the probe's top-k heads predicted from this step's final hidden state (any callable);
- ``static``: the top k of a fixed ranking (e.g. the static retrieval heads);
- ``dynamic-random``: k heads drawn anew at every retrieval;
- ``fixed-random``: k heads drawn once and used for the whole answer;
- ``none`` (w/o RAG: the context stays hidden) and ``full-context`` (the context is always visible) use no heads;
- ``rerank`` (re-rank, then answer): the context's paragraphs are ranked once by in-context re-ranking
  (``dynheads.rag.rerank``, every head) and only the top ones stay visible for the whole answer; no retrieval step.

Make one :class:`HeadSelector` per answer: random draws come from its seeded generator, so an answer's heads
are reproducible from its seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

import numpy as np

from dynheads.errors import DynheadsError
from dynheads.heads import Head, check_heads

Strategy = Literal["dynamic", "static", "dynamic-random", "fixed-random", "none", "full-context", "rerank"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
PAPER_STRATEGIES = STRATEGIES[:-1]  # the paper's Table 4 (what a RAG run compares unless told otherwise)
HEAD_STRATEGIES = frozenset({"dynamic", "static", "dynamic-random", "fixed-random"})
# predict_top(hidden [d_model], k) -> the k heads with the highest predicted retrieval score, best first.
HeadPredictor = Callable[[Any, int], Sequence[Head]]


def random_heads(k: int, num_layers: int, num_heads: int, rng: np.random.Generator) -> list[Head]:
    """``k`` distinct heads drawn uniformly from all ``num_layers x num_heads``, sorted."""
    flat = rng.choice(num_layers * num_heads, size=k, replace=False)
    return sorted((int(i) // num_heads, int(i) % num_heads) for i in flat)


class HeadSelector:
    """The heads of one answer's retrievals under one strategy."""

    def __init__(
        self,
        strategy: Strategy,
        *,
        k: int,
        num_layers: int,
        num_heads: int,
        rng: np.random.Generator | int = 0,
        static_ranking: Sequence[Head] | None = None,
        predict_top: HeadPredictor | None = None,
    ):
        if strategy not in STRATEGIES:
            raise DynheadsError(f"unknown strategy {strategy!r}: expected one of {', '.join(STRATEGIES)}")
        if strategy in HEAD_STRATEGIES and not 1 <= k <= num_layers * num_heads:
            raise DynheadsError(f"k={k} heads asked, but the model has {num_layers * num_heads} heads")
        self.strategy, self.k, self.num_layers, self.num_heads = strategy, k, num_layers, num_heads
        self.predict_top = predict_top
        self.rng = np.random.default_rng(rng)  # a Generator passed in is used as is
        self.static: list[Head] | None = None
        self.fixed: list[Head] | None = None
        if strategy == "static":
            if static_ranking is None or len(static_ranking) < k:
                raise DynheadsError(f"strategy 'static' needs a ranking of at least k={k} heads")
            self.static = self._checked(static_ranking[:k], "static ranking")
        elif strategy == "dynamic" and predict_top is None:
            raise DynheadsError("strategy 'dynamic' needs predict_top(hidden, k), e.g. the trained MLP probe")
        elif strategy == "fixed-random":
            self.fixed = random_heads(k, num_layers, num_heads, self.rng)

    @property
    def needs_heads(self) -> bool:
        """False for ``none`` and ``full-context``, which never retrieve."""
        return self.strategy in HEAD_STRATEGIES

    def select(self, hidden: Any = None) -> list[Head]:
        """The k heads for this retrieval; ``hidden`` (the step's final hidden state) is used by ``dynamic`` only."""
        match self.strategy:
            case "dynamic":
                if hidden is None:
                    raise DynheadsError("strategy 'dynamic' needs the step's hidden state to predict its heads")
                return self._checked(self.predict_top(hidden, self.k), "predict_top")
            case "static":
                return list(self.static)
            case "dynamic-random":
                return random_heads(self.k, self.num_layers, self.num_heads, self.rng)
            case "fixed-random":
                return list(self.fixed)
        raise DynheadsError(f"strategy {self.strategy!r} uses no heads: it never retrieves")

    def _checked(self, heads: Sequence[Head], source: str) -> list[Head]:
        heads = [(int(layer), int(head)) for layer, head in heads]
        if len(heads) != self.k or len(set(heads)) != self.k:
            raise DynheadsError(f"{source} must give {self.k} distinct heads, got {heads}")
        check_heads(heads, self.num_layers, self.num_heads, source)
        return heads
