"""Static retrieval heads, scored as Wu et al.'s reference code (``retrieval_head_detection.py``) scores them.

Per NIAH test, a head's score is the number of generation steps at which it copy-pastes (Eq. 1 copy score 1)
divided by the number of answer tokens. A test counts only if the generation passes the success filter:
ROUGE-1 recall of the answer against the generated text above a threshold (reference: ``> 50`` on a 0-100
scale, with the Porter stemmer). The static score of a head is its mean over the counted tests; the ranking
sorts heads by that mean, best first, ties broken by (layer, head) ascending.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rouge_score import rouge_scorer

from dynheads.analysis.headlists import rank_by_score
from dynheads.errors import DynheadsError
from dynheads.heads import Head
from dynheads.scores import ScoreKind, score_values
from dynheads.traces import Trace

# The reference filter: RougeScorer(['rouge1', 'rougeL'], use_stemmer=True), recall of the needle answer.
_SCORER = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)


@dataclass(frozen=True, eq=False)  # eq=False: arrays inside have no single truth value
class NiahTest:
    """One traced NIAH test: what static scoring needs from it.

    ``answer`` is the needle's answer string (the UUID), ``answer_tokens`` the number of model tokens it
    spans in the prompt (the reference's normaliser). ``generated`` is the decoded answer the success filter
    reads; ``None`` means ``trace.text``.
    """

    trace: Trace
    answer: str
    answer_tokens: int
    generated: str | None = None

    @property
    def response(self) -> str:
        return self.trace.text if self.generated is None else self.generated


@dataclass(frozen=True, eq=False)
class StaticHeads:
    """Static retrieval-head scores over a set of NIAH tests."""

    test_scores: np.ndarray  # [counted_test, layer, head] float64, one score per head per counted test
    recalls: tuple[float, ...]  # ROUGE-1 recall of every input test, counted or not
    success_threshold: float
    ranking: tuple[Head, ...]  # all L*H heads, best mean score first

    @property
    def num_tests(self) -> int:
        return len(self.recalls)

    @property
    def num_counted(self) -> int:
        return int(self.test_scores.shape[0])

    @property
    def pass_rate(self) -> float:
        """Fraction of tests that passed the success filter (counted / total)."""
        return self.num_counted / self.num_tests

    @property
    def mean_scores(self) -> np.ndarray:
        """``[layer, head]`` static score: mean over counted tests."""
        return self.test_scores.mean(axis=0)

    def top(self, k: int) -> list[Head]:
        """The ``k`` best heads (fewer if the model has fewer)."""
        return list(self.ranking[:k])

    def scored_top(self, k: int) -> list[Head]:
        """The ``k`` best heads whose mean score is above 0 (fewer when fewer score: the rest of ``top(k)`` are
        zero-score heads in layer order, no retrieval heads)."""
        scores = self.mean_scores
        return [head for head in self.top(k) if scores[head] > 0]

    def per_head(self) -> dict[Head, list[float]]:
        """Scores per counted test for every head, layer-major: the content of the published JSON lists."""
        _, layers, heads = self.test_scores.shape
        return {
            (layer, head): self.test_scores[:, layer, head].tolist() for layer in range(layers) for head in range(heads)
        }


def rouge1_recall(answer: str, generated: str) -> float:
    """ROUGE-1 recall of ``answer`` (the reference) against ``generated``, with the Porter stemmer."""
    return _SCORER.score(answer, generated)["rouge1"].recall


def static_heads(tests: Sequence[NiahTest], *, success_threshold: float = 0.5) -> StaticHeads:
    """Score every head on ``tests`` as Wu et al. do and rank them (see the module docstring)."""
    if not tests:
        raise DynheadsError("no NIAH tests given: static heads need at least one traced test")
    shape = tests[0].trace.shape
    recalls, counted = [], []
    for index, test in enumerate(tests):
        if test.trace.shape != shape:
            raise DynheadsError(f"test {index} has {test.trace.shape} (layers, heads), test 0 has {shape}")
        if test.answer_tokens <= 0:
            raise DynheadsError(f"test {index} has answer_tokens={test.answer_tokens}; it must be positive")
        recall = rouge1_recall(test.answer, test.response)
        recalls.append(recall)
        if recall > success_threshold:
            counted.append(test.trace.copy_scores.sum(axis=0) / test.answer_tokens)
    if not counted:
        raise DynheadsError(
            f"pass rate 0/{len(tests)}: no test's ROUGE-1 recall of the answer exceeded {success_threshold}, so "
            "no head can be scored; use more samples or a larger --max-new-tokens, and check the generations"
        )
    scores = np.stack(counted).astype(np.float64)
    return StaticHeads(
        test_scores=scores,
        recalls=tuple(recalls),
        success_threshold=success_threshold,
        ranking=rank_by_score({head: float(mean) for head, mean in np.ndenumerate(scores.mean(axis=0))}),
    )


def unfiltered_static_heads(per_test: Sequence[np.ndarray]) -> StaticHeads:
    """Heads ranked by their mean over ``per_test`` (``[layer, head]`` scores of each test), every test counted:
    a score read from the prompt alone (QRHead's), with no answer to filter on (``recalls`` are NaN)."""
    if not per_test:
        raise DynheadsError("no scored test given: a static list needs at least one")
    shapes = {np.shape(scores) for scores in per_test}
    if len(shapes) != 1:
        raise DynheadsError(f"the tests' head scores differ in shape (layers, heads): {sorted(shapes)}")
    scores = np.stack([np.asarray(s, dtype=np.float64) for s in per_test])
    return StaticHeads(
        test_scores=scores,
        recalls=tuple(math.nan for _ in per_test),
        success_threshold=-math.inf,
        ranking=rank_by_score({head: float(mean) for head, mean in np.ndenumerate(scores.mean(axis=0))}),
    )


# ---- static reasoning heads (HotpotQA, Eq. 2) -----------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ReasoningTest:
    """One traced HotpotQA question: its Eq. 2 scores and the F1 of its answer (the success filter reads it)."""

    trace: Trace
    f1: float


def static_reasoning_heads(
    tests: Sequence[ReasoningTest], *, success_threshold: float = -1.0, score: ScoreKind = "reasoning"
) -> tuple[StaticHeads, int]:
    """Static reasoning heads, aggregated as Wu et al. aggregate copy scores: per test, a head's score is its mean
    ``score`` (Eq. 2 by default; any registered head score, by name) over the generation steps; the static score is
    the mean over counted tests (F1 above ``success_threshold``; the default -1 counts every test). Returns the
    heads (``recalls`` holds each test's F1) and the number of tests skipped because they generated no token (no
    step to average)."""
    if not tests:
        raise DynheadsError("no tests given: a pooled static list needs at least one traced test")
    shape = tests[0].trace.shape
    f1s, counted, empty = [], [], 0
    for index, test in enumerate(tests):
        if test.trace.shape != shape:
            raise DynheadsError(f"test {index} has {test.trace.shape} (layers, heads), test 0 has {shape}")
        if test.trace.num_steps == 0:
            empty += 1
            continue
        f1s.append(test.f1)
        if test.f1 > success_threshold:
            counted.append(score_values(test.trace.scores, score).astype(np.float64).mean(axis=0))
    if not counted:
        raise DynheadsError(
            f"none of the {len(tests)} tests counts ({empty} generated nothing, the rest scored <= "
            f"{success_threshold}: F1 for a question, the answer's ROUGE-1 recall for a needle): no head can be scored"
        )
    scores = np.stack(counted)
    return StaticHeads(
        test_scores=scores,
        recalls=tuple(f1s),
        success_threshold=success_threshold,
        ranking=rank_by_score({head: float(mean) for head, mean in np.ndenumerate(scores.mean(axis=0))}),
    ), empty
