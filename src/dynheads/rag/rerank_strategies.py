"""The re-ranking strategies, a registry (issue 35): each scores one question's candidates from what its single
scoring pass stored, and says which heads it read and what it cost.

A strategy receives ``Candidates`` (the question's record, its stored ``[L, H, S]`` span scores under the real and
the content-free query and its hidden state, k, the seed, and the head sources the run resolved) and returns the
candidates' scores (higher ranks first), the heads it read (None: every head, or none) and the seconds they cost.
A strategy that reads heads (``reads_heads``) can be fused with BM25 (``rrf:S`` / ``mix:S``); one that reads a
static list or a head predictor declares it (``needs_static`` / ``needs_probe``: ``resources.needs_of``), and is
skipped, and said so, when the run was given none. Register one from anywhere (a test file, a notebook)::

    @RERANK_STRATEGIES.register("last-layer", help="the last layer's heads, calibrated")
    def _last_layer(question): ...  (a RerankStrategy)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dynheads.errors import DynheadsError
from dynheads.heads import Head
from dynheads.rag import fusion
from dynheads.rag.strategies import random_heads
from dynheads.registry import Registry
from dynheads.seeding import derive_seed


@dataclass(frozen=True)
class Candidates:
    """What a strategy scores one question from."""

    record: dict  # the question's record: question_id, gold, bm25 scores, timings
    arrays: dict[str, np.ndarray]  # "real" / "content_free" span scores [L, H, S], "hidden" [D]
    k: int  # heads of a head-subset strategy
    seed: int
    qrhead: Sequence[Head] | None = None  # QRHead's ranking, once fitted
    static: Sequence[Head] | None = None  # the static list's scored heads
    predict_top: Callable[[np.ndarray, int], list[Head]] | None = None  # the head predictor

    def head_scores(self, heads: Sequence[Head] | None) -> tuple[np.ndarray, list[Head] | None, float]:
        """The calibrated span scores of ``heads`` (None: every head), and the passes' seconds."""
        from dynheads.scores import span_ranking  # here: the settings read this registry, --help loads no torch

        seconds = self.record["prefill_seconds"] + self.record["calibration_seconds"]
        chosen = None if heads is None else list(heads)
        return span_ranking(calibrated(self.arrays), chosen), chosen, seconds


def calibrated(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """ICR's calibration: the real query's span scores minus the content-free query's, per head ``[L, H, S]``."""
    return arrays["real"].astype(np.float64) - arrays["content_free"].astype(np.float64)


Scored = tuple[np.ndarray, list[Head] | None, float]


@dataclass(frozen=True)
class RerankStrategy:
    scores: Callable[[Candidates], Scored]
    reads_heads: bool = True  # scores from attention heads: fusable with BM25
    needs_static: bool = False  # reads the static list (--static)
    needs_probe: bool = False  # reads the head predictor (--predictor)
    takes_k: bool = False  # scores a subset of k heads (--k)


RERANK_STRATEGIES = Registry[RerankStrategy]("rerank strategy")


def _icr(question: Candidates) -> Scored:
    return question.head_scores(None)


def _uncalibrated(question: Candidates) -> Scored:
    from dynheads.scores import span_ranking  # here: the settings read this registry, --help loads no torch

    return span_ranking(question.arrays["real"].astype(np.float64)), None, question.record["prefill_seconds"]


def _qrhead(question: Candidates) -> Scored:
    assert question.qrhead is not None  # the strategy is skipped until QRHead is fitted
    return question.head_scores(question.qrhead[: question.k])


def _static(question: Candidates) -> Scored:
    assert question.static is not None  # the strategy is skipped without a static list
    return question.head_scores(question.static[: question.k])


def _predictor(question: Candidates) -> Scored:
    assert question.predict_top is not None  # the strategy is skipped without a predictor
    return question.head_scores(question.predict_top(question.arrays["hidden"], question.k))


def _random(question: Candidates) -> Scored:
    layers, heads = question.arrays["real"].shape[:2]
    rng = np.random.default_rng(derive_seed(question.seed, question.record["question_id"], "random"))
    return question.head_scores(random_heads(question.k, layers, heads, rng))


def _bm25(question: Candidates) -> Scored:
    return np.asarray(question.record["bm25"]), None, question.record["bm25_seconds"]


RERANK_STRATEGIES.register("icr", RerankStrategy(_icr), help="ICR: every head, calibrated by the content-free query")
RERANK_STRATEGIES.register(
    "icr-uncalibrated", RerankStrategy(_uncalibrated), help="every head, raw (what the calibration buys)"
)
RERANK_STRATEGIES.register(
    "qrhead", RerankStrategy(_qrhead, takes_k=True), help="QRHead: the k heads best on the fitting stream's gold"
)
RERANK_STRATEGIES.register(
    "static",
    RerankStrategy(_static, needs_static=True, takes_k=True),
    help="the k best heads of the static list (--static)",
)
RERANK_STRATEGIES.register(
    "predictor",
    RerankStrategy(_predictor, needs_probe=True, takes_k=True),
    help="the k heads the head predictor (--predictor) ranks highest from the hidden state",
)
RERANK_STRATEGIES.register("random", RerankStrategy(_random, takes_k=True), help="k heads drawn per question (seeded)")
RERANK_STRATEGIES.register("bm25", RerankStrategy(_bm25, reads_heads=False), help="BM25 (bm25s) over the candidates")


# ---- the one parser of strategy names: a registered strategy, or a fusion of one with BM25 ------------------------
def head_strategies() -> list[str]:
    """The registered strategies that read heads: what a fusion may combine with BM25."""
    return [name for name in RERANK_STRATEGIES.names() if RERANK_STRATEGIES.get(name).reads_heads]


def fused_parts(strategy: str) -> tuple[str, str] | None:
    """(fusion, head strategy) of a fused strategy's name (``rrf:static``), None for any other name."""
    kind, _, base = strategy.partition(":")
    return (kind, base) if kind in fusion.FUSIONS and base in head_strategies() else None


def base_strategies(strategies: tuple[str, ...]) -> set[str]:
    """The strategies whose scores the chosen ones read (a fusion reads its head strategy's and BM25's)."""
    parts = [fused_parts(s) for s in strategies]
    return {s for s, part in zip(strategies, parts, strict=True) if part is None} | {
        name for part in parts if part is not None for name in (part[1], "bm25")
    }


def check_strategy_names(strategies: Sequence[str]) -> None:
    """One line for an unknown strategy name (or none given): the registered ones and the fusions they allow."""
    unknown = sorted(s for s in strategies if s not in RERANK_STRATEGIES and fused_parts(s) is None)
    if unknown or not strategies:
        raise DynheadsError(
            f"unknown rerank strategy {', '.join(unknown) or '(none given)'}: use {RERANK_STRATEGIES.choices()}, "
            f"or {'/'.join(fusion.FUSIONS)}:<one of {', '.join(head_strategies())}> (fused with bm25)"
        )
