"""Head-selection strategies: seeded draws, fixed vs. per-retrieval randomness, static top-k, the probe callable."""

import numpy as np
import pytest

from dynheads.errors import DynheadsError
from dynheads.rag.strategies import PAPER_STRATEGIES, RAG_STRATEGIES, HeadSelector, RagStrategy, random_heads

SHAPE = {"num_layers": 32, "num_heads": 32}


def test_random_heads_are_distinct_valid_and_seeded():
    heads = random_heads(20, 4, 8, np.random.default_rng(3))
    assert len(set(heads)) == 20 and heads == sorted(heads)
    assert all(0 <= layer < 4 and 0 <= head < 8 for layer, head in heads)
    assert heads == random_heads(20, 4, 8, np.random.default_rng(3))
    assert random_heads(32, 4, 8, np.random.default_rng(0)) == [(a, b) for a in range(4) for b in range(8)]


def test_dynamic_random_is_reproducible_and_changes_each_retrieval():
    draws = [HeadSelector("dynamic-random", k=5, rng=7, **SHAPE) for _ in range(2)]
    first = [draws[0].select() for _ in range(5)]
    assert first == [draws[1].select() for _ in range(5)]
    assert len({tuple(h) for h in first}) == 5


def test_fixed_random_stays_fixed_for_the_answer():
    selector = HeadSelector("fixed-random", k=5, rng=7, **SHAPE)
    heads = selector.select()
    assert all(selector.select() == heads for _ in range(5))
    assert HeadSelector("fixed-random", k=5, rng=7, **SHAPE).select() == heads
    assert HeadSelector("fixed-random", k=5, rng=8, **SHAPE).select() != heads


def test_static_takes_the_top_k_of_the_ranking():
    ranking = [(3, 1), (0, 0), (7, 2), (1, 5), (2, 2)]
    selector = HeadSelector("static", k=3, static_ranking=ranking, **SHAPE)
    assert selector.select() == [(3, 1), (0, 0), (7, 2)]
    with pytest.raises(DynheadsError):
        HeadSelector("static", k=6, static_ranking=ranking, **SHAPE)
    with pytest.raises(DynheadsError):
        HeadSelector("static", k=1, static_ranking=[(40, 0)], **SHAPE)


def test_dynamic_asks_the_predictor_with_the_hidden_state():
    calls = []

    def predict_top(hidden, k):
        calls.append((hidden, k))
        return [(int(hidden), h) for h in range(k)]

    selector = HeadSelector("dynamic", k=3, predict_top=predict_top, **SHAPE)
    assert selector.select(hidden=4) == [(4, 0), (4, 1), (4, 2)]
    assert selector.select(hidden=9) == [(9, 0), (9, 1), (9, 2)]
    assert calls == [(4, 3), (9, 3)]
    with pytest.raises(DynheadsError):
        selector.select()  # no hidden state
    with pytest.raises(DynheadsError):
        HeadSelector("dynamic", k=3, **SHAPE)  # no predictor


@pytest.mark.parametrize("bad", [[(0, 0), (0, 0), (0, 1)], [(0, 0), (0, 1)], [(0, 0), (0, 1), (99, 0)]])
def test_dynamic_refuses_bad_predictions(bad):
    selector = HeadSelector("dynamic", k=3, predict_top=lambda hidden, k: bad, **SHAPE)
    with pytest.raises(DynheadsError):
        selector.select(hidden=0)


def test_context_strategies_use_no_heads():
    assert RAG_STRATEGIES.names() == [
        "dynamic",
        "static",
        "dynamic-random",
        "fixed-random",
        "none",
        "full-context",
        "rerank",
    ]
    assert set(PAPER_STRATEGIES) == set(RAG_STRATEGIES.names()) - {"rerank"}  # what a RAG run compares by default
    for name in ("none", "full-context", "rerank"):
        selector = HeadSelector(name, k=5, **SHAPE)
        assert not selector.needs_heads
        with pytest.raises(DynheadsError):
            selector.select()
    assert HeadSelector("dynamic-random", k=5, **SHAPE).needs_heads


@pytest.mark.parametrize(("strategy", "k"), [("oracle", 5), ("dynamic-random", 0), ("dynamic-random", 32 * 32 + 1)])
def test_bad_arguments_are_refused(strategy, k):
    with pytest.raises(DynheadsError):
        HeadSelector(strategy, k=k, **SHAPE)


def test_a_strategy_registered_here_selects_and_is_planned_like_the_built_in_ones():
    from dynheads.experiments.rag import RagConfig, rag_arms

    def first_heads(selector, hidden):
        return selector.checked([(0, head) for head in range(selector.k)], "first heads")

    RAG_STRATEGIES.register("first-heads", RagStrategy(first_heads, paper=False), help="heads 0..k-1 of layer 0")
    try:
        selector = HeadSelector("first-heads", k=3, **SHAPE)
        assert selector.needs_heads and selector.select() == [(0, 0), (0, 1), (0, 2)]
        with pytest.raises(DynheadsError, match="k=0 heads asked"):
            HeadSelector("first-heads", k=0, **SHAPE)
        arms = rag_arms(RagConfig(strategies=("none", "first-heads"), ks=(5, 10)))
        assert [(arm.name, arm.k) for arm in arms] == [
            ("none", None),
            ("first-heads", 5),
            ("first-heads", 10),
        ]
        assert "first-heads" not in PAPER_STRATEGIES  # the paper's default set stays the paper's
    finally:
        RAG_STRATEGIES.unregister("first-heads")
    with pytest.raises(DynheadsError, match="unknown RAG strategy 'first-heads': use one of dynamic, static"):
        rag_arms(RagConfig(strategies=("first-heads",)))


@pytest.mark.parametrize(
    ("strategies", "ks", "message"),
    [(("none", "dynamic-random", "none"), (5,), "--strategies names 'none' twice"), (("none",), (5, 5), "--k names 5")],
)
def test_a_repeated_strategy_or_k_is_refused(strategies, ks, message):
    """One record per (question, strategy, k): a repeat would answer it twice and keep one."""
    from dynheads.experiments.rag import RagConfig, rag_arms

    with pytest.raises(DynheadsError, match=message):
        rag_arms(RagConfig(strategies=strategies, ks=ks))
