"""Token-level hallucination labels, per-token features from a trace, and the detector's metrics.

Labels (exact, from decode-level alignment). The generated text is the concatenation of the tokens decoded
one by one (``Trace.token_texts``). The *value span* is the character span of the answer value in it (for
NIAH: the first UUID-shaped string, ``find_value``; any task can pass its own span). Tokens that do not
overlap the value span (e.g. "The magic word is", the final ".") get no label. A token overlapping the span is
**faithful** (0) when the generated value up to the token's last character inside the span equals the true
value's prefix of the same length, i.e. it continues the true value; otherwise it is **hallucinated** (1),
and so is every later token of the span (after a wrong character the value can no longer be continued).
Any sample with a true value and a value span can be labelled this way (the multi-hop task plugs in so).

Teacher-forced responses (HaluEval) are labelled whole: every step of a response carries its ``response_label``.

Features per labelled token (the trace's step that emitted it); each feature set is one detector. The sets a
deployed detector can compute (``DEPLOYABLE``: no answer key, no needle position at test time):

- ``retrieval_no_needle``: number of heads whose most-attended key is a prompt position past the attention
  sink, and for the static top-k heads that indicator and their max attention (``2k + 1`` columns);
- ``context_attention``: how much and how sharply heads look into the context: mean context mass over heads,
  that count of heads looking into the prompt, and every head's attention entropy over the context (``L*H + 2``);
- ``probe``: the MLP head predictor's output on the step's hidden state: the sum and max of its per-head
  probabilities, and its needle-free "silence" (predicted mass on heads whose most-attended key is not in the
  prompt past the sink: heads that should retrieve and do not look into the context);
- ``lookback``: Lookback-Lens ratio per head, ``c / (c + g)`` with ``c`` = mean attention on the context
  positions and ``g`` = mean attention on the generated tokens seen so far (``L*H`` columns; see
  ``lookback_ratios`` for the context boundary and step 0);
- ``entropy``, ``max_softmax`` and ``token_prob``: the next-token distribution's entropy, top probability and
  the emitted token's probability (logit baselines; ``token_prob`` differs from ``max_softmax`` only when the
  response is forced);
- ``length`` (responses only): the response's token count, a confound check (HaluEval's right QA answers are
  much shorter than its hallucinated ones).

The sets that read the needle positions (``ANSWER_KEY``; on NIAH the needle is the gold value, so they are an
upper bound that a deployed detector cannot reach; on HaluEval the needle is the whole knowledge passage):

- ``copy_heads``: number of heads with Eq. 1 = 1 (active copy heads);
- ``retrieval``: that count, Eq. 2 max over heads, and needle mass, max attention and Eq. 2 of the static
  top-k heads (``3k + 2`` columns);
- ``probe_copy_silence``: the head predictor's predicted mass on heads that did not copy (Eq. 1 = 0).

Evaluation (``grouped_folds``): grouped K-fold cross-validation whose groups are questions (HaluEval: both
answers of a question) or samples (NIAH), repeated over seeds; intervals by bootstrap over the same groups
(``evidence.group_interval``).

Within-question pairs (``group_wins``, ``paired_win_rate``): for each question holding both a faithful and a
hallucinated response, whether the detector scores the hallucinated one higher (a tie counts one half): the AUROC
restricted to the pairs of one question, so what questions differ in (topic, knowledge passage, prompt length)
cancels. Its mean over questions is the paired AUROC (win rate), with ``evidence.fraction_interval``'s interval over
questions (exact when every win is 0 or 1; a bootstrap bounded to [0, 1] when a tie's one half is among them).
``length_strata`` sorts the questions by how much longer the hallucinated answer is than the right one
(HaluEval QA's hallucinated answers are sentences, its right ones entity names): the answers are read whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve
from sklearn.model_selection import StratifiedGroupKFold

from dynheads.analysis.evidence import EvidenceSettings, Interval, fraction_interval, group_interval
from dynheads.errors import DynheadsError
from dynheads.heads import Head
from dynheads.scores import SINK_SIZE
from dynheads.traces import Trace

FAITHFUL, HALLUCINATED, UNLABELLED = 0, 1, -1
# A UUID-shaped value: alphanumeric groups joined by hyphens (a wrong UUID still matches), else a long hex run.
UUID_LIKE = re.compile(r"[0-9A-Za-z]+(?:-[0-9A-Za-z]*)+|[0-9a-fA-F]{8,}")
# Strata of a question's answer pair by the hallucinated answer's token count over the right one's: (upper bound of
# the ratio, inclusive; name). The first holds the pairs where length cannot favour the hallucinated answer.
LENGTH_STRATA = ((1.0, "hallucinated not longer"), (2.0, "up to 2x longer"), (4.0, "2-4x longer"))
LONGEST_STRATUM = "over 4x longer"


def find_value(text: str, pattern: re.Pattern = UUID_LIKE) -> tuple[int, int] | None:
    """Character span of the first match of ``pattern`` in ``text`` (None when the answer holds no value)."""
    match = pattern.search(text)
    return (match.start(), match.end()) if match else None


def label_tokens(token_texts: Sequence[str], true_value: str, span: tuple[int, int] | None) -> np.ndarray:
    """``[T]`` int8 labels: FAITHFUL / HALLUCINATED for tokens overlapping ``span``, UNLABELLED elsewhere.

    ``span`` is a character span of ``"".join(token_texts)`` (see the module docstring for the rule).
    """
    labels = np.full(len(token_texts), UNLABELLED, dtype=np.int8)
    if span is None:
        return labels
    text = "".join(token_texts)
    start, stop = span
    if not 0 <= start <= stop <= len(text):
        raise DynheadsError(f"value span {span} lies outside the generated text of {len(text)} characters")
    value = text[start:stop]
    agree = 0  # length of the common prefix of the generated and the true value
    while agree < min(len(value), len(true_value)) and value[agree] == true_value[agree]:
        agree += 1
    end = 0
    for index, piece in enumerate(token_texts):
        begin, end = end, end + len(piece)
        if begin >= stop or end <= start or begin == end:
            continue
        last = min(end, stop) - start  # characters of the value up to this token's last one inside it
        labels[index] = FAITHFUL if last <= agree and last <= len(true_value) else HALLUCINATED
    return labels


def lookback_ratios(trace: Trace, response_prefix: int = 0) -> np.ndarray:
    """``[T, L, H]`` Lookback-Lens ratio at every step (needs a trace with ``context_mass``).

    ``response_prefix``: the last prompt tokens counted as generated, not as context (Lookback Lens's boundary:
    the end-of-turn marker and the assistant header); the trace must have been traced with its context ending
    there (``trace(..., context_end=prompt_length - response_prefix)``). With 0, step 0 sees no generated key
    and its ratio is the constant 1; with a prefix every step sees at least the prefix.
    """
    if trace.context_mass is None:
        raise DynheadsError("this trace has no context_mass column (written before it existed): re-trace it")
    if not 0 <= response_prefix < trace.prompt_length:
        raise DynheadsError(f"response prefix {response_prefix} must lie in 0..{trace.prompt_length - 1}")
    context_mean = trace.context_mass / max(trace.prompt_length - response_prefix, 1)
    # step t sees t generated keys, plus the prefix
    generated_seen = np.arange(trace.num_steps, dtype=np.float32)[:, None, None] + response_prefix
    generated_mass = np.clip(1.0 - trace.context_mass, 0.0, None)  # rows sum to 1: the rest is generated
    generated_mean = np.where(generated_seen > 0, generated_mass / np.maximum(generated_seen, 1), 0.0)
    denominator = context_mean + generated_mean
    return np.where(denominator > 0, context_mean / np.maximum(denominator, 1e-30), 0.5).astype(np.float32)


@dataclass(frozen=True)
class FeatureSpec:
    """What the features need beyond the trace: static heads (best first) and optional probe outputs."""

    static_heads: tuple[Head, ...]
    static_k: int = 10
    sink_size: int = SINK_SIZE  # keys before this position are the attention sink, not retrieval
    response_prefix: int = 0  # prompt tokens the lookback ratio counts as generated (``lookback_ratios``)


def token_features(
    trace: Trace, steps: np.ndarray, spec: FeatureSpec, probe_output: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Feature sets at ``steps [N]``: name -> ``[N, F]`` float64. Sets the trace cannot give are left out.

    ``probe_output [T, L*H]`` is the head predictor's output for every step of the trace (None: no probe).
    """
    layers, heads = trace.shape
    steps = np.asarray(steps, dtype=np.int64)
    if steps.size and not (0 <= steps.min() and steps.max() < trace.num_steps):
        raise DynheadsError(f"token_features: steps must be in 0..{trace.num_steps - 1}, got {steps.tolist()[:8]}")
    copy = trace.copy_scores[steps].reshape(len(steps), -1)
    n_active = copy.sum(1, keepdims=True).astype(np.float64)
    static = spec.static_heads[: spec.static_k]
    flat = [layer * heads + head for layer, head in static]

    def of_static(array: np.ndarray) -> np.ndarray:
        return array[steps].reshape(len(steps), -1)[:, flat].astype(np.float64)

    reasoning = trace.reasoning_scores[steps]
    in_context = ((trace.argmax_pos >= spec.sink_size) & (trace.argmax_pos < trace.prompt_length)).astype(np.float64)
    looking = in_context[steps].reshape(len(steps), -1)
    features = {
        "copy_heads": n_active,
        "retrieval": np.hstack(
            [
                n_active,
                reasoning.reshape(len(steps), -1).max(1, keepdims=True),
                of_static(trace.needle_mass),
                of_static(trace.max_prob),
                of_static(trace.reasoning_scores),
            ]
        ),
        "retrieval_no_needle": np.hstack(
            [looking.sum(1, keepdims=True), of_static(in_context), of_static(trace.max_prob)]
        ),
    }
    if trace.context_mass is not None and trace.context_entropy is not None:
        mass = trace.context_mass[steps].reshape(len(steps), -1)
        features["context_attention"] = np.hstack(
            [
                mass.mean(1, keepdims=True),
                looking.sum(1, keepdims=True),
                trace.context_entropy[steps].reshape(len(steps), -1),
            ]
        ).astype(np.float64)
    if probe_output is not None:
        predicted = probe_output[steps].astype(np.float64)
        features["probe"] = np.hstack(
            [
                predicted.sum(1, keepdims=True),
                predicted.max(1, keepdims=True),
                (predicted * (1 - looking)).sum(1, keepdims=True),
            ]
        )
        features["probe_copy_silence"] = (predicted * (1 - copy)).sum(1, keepdims=True)
    if trace.context_mass is not None:
        ratios = lookback_ratios(trace, spec.response_prefix)
        features["lookback"] = ratios[steps].reshape(len(steps), -1).astype(np.float64)
    if trace.token_entropy is not None and trace.token_max_prob is not None:  # written together
        features["entropy"] = trace.token_entropy[steps, None].astype(np.float64)
        features["max_softmax"] = trace.token_max_prob[steps, None].astype(np.float64)
    if trace.token_prob is not None:
        features["token_prob"] = trace.token_prob[steps, None].astype(np.float64)
    return features


def span_features(
    trace: Trace, spec: FeatureSpec, probe_output: np.ndarray | None = None, steps: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Response-level features ``name -> [1, F]``: the token features averaged over ``steps`` (default: every step
    of the response; Lookback Lens's span average), plus ``length`` (the number of steps). With no response
    prefix the lookback ratio of step 0 is the constant 1, so it is left out of the lookback average (a constant
    term would make the mean a function of the response length); a span of step 0 alone keeps it."""
    steps = np.arange(trace.num_steps) if steps is None else np.asarray(steps, dtype=np.int64)
    if steps.size == 0:
        raise DynheadsError("a response with no token has no span features")
    features = {name: x.mean(0, keepdims=True) for name, x in token_features(trace, steps, spec, probe_output).items()}
    looked = steps[steps > 0] if spec.response_prefix == 0 else steps
    if "lookback" in features and looked.size:
        ratios = lookback_ratios(trace, spec.response_prefix)[looked]
        features["lookback"] = ratios.reshape(len(looked), -1).mean(0, keepdims=True)
    features["length"] = np.array([[float(steps.size)]])
    return {name: x.astype(np.float64) for name, x in features.items()}


def rank_heads_by_copy(traces: Sequence[Trace]) -> tuple[Head, ...]:
    """Heads by how often Eq. 1 fires over all steps of ``traces`` (a stand-in for a static head list)."""
    if not traces:
        raise DynheadsError("no traces to rank heads on")
    layers, heads = traces[0].shape
    counts = sum(t.copy_scores.reshape(t.num_steps, -1).sum(0) for t in traces)
    order = np.lexsort((np.arange(layers * heads), -np.asarray(counts)))
    return tuple((int(i // heads), int(i % heads)) for i in order)


def grouped_folds(
    groups: Sequence[str], labels: Sequence[int], folds: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``folds`` (train, test) index pairs over units whose ``groups`` (questions) never straddle a split.

    Stratified by ``labels`` as far as whole groups allow (sklearn's ``StratifiedGroupKFold``), shuffled by
    ``seed``; every unit is tested exactly once.
    """
    group_of = np.asarray(groups)
    distinct = len(np.unique(group_of))
    if folds < 2:
        raise DynheadsError(f"cross-validation needs at least 2 folds, got {folds}")
    if distinct < folds:
        raise DynheadsError(
            f"{folds} folds need at least {folds} questions (or samples), found {distinct}: "
            "use more questions or fewer --folds"
        )
    splitter = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed)
    return [(train, test) for train, test in splitter.split(np.zeros(len(group_of)), np.asarray(labels), group_of)]


def auroc_auprc(labels: np.ndarray, scores: np.ndarray) -> tuple[float, float]:
    """AUROC and AUPRC (average precision) of ``scores`` for label 1; NaN when one class is missing."""
    return _metric(roc_auc_score, labels, scores), _metric(average_precision_score, labels, scores)


def _metric(metric: Callable[[np.ndarray, np.ndarray], float], labels: np.ndarray, scores: np.ndarray) -> float:
    """``metric(labels, scores)``, NaN when one class is missing."""
    return float(metric(labels, scores)) if len(np.unique(labels)) > 1 else float("nan")


def bootstrap_ci(
    labels: np.ndarray, scores: np.ndarray, groups: np.ndarray, settings: EvidenceSettings
) -> dict[str, tuple[float, float]]:
    """Percentile CIs of AUROC and AUPRC, resampling whole samples (``groups``): tokens of one answer correlate. A
    resample holding one label only is left out (it has no AUROC); both metrics see the same resamples."""

    def on(metric: Callable[[np.ndarray, np.ndarray], float]) -> Callable[[np.ndarray], float]:
        return lambda idx: _metric(metric, labels[idx], scores[idx])

    found = {
        name: group_interval(groups, on(metric), settings, skip_undefined=True)
        for name, metric in (("auroc", roc_auc_score), ("auprc", average_precision_score))
    }
    return {name: (bounds.low, bounds.high) for name, bounds in found.items()}


def paired_auroc_difference(
    labels: np.ndarray, scores: np.ndarray, reference: np.ndarray, groups: np.ndarray, settings: EvidenceSettings
) -> tuple[float, float, float]:
    """AUROC of ``scores`` minus AUROC of ``reference`` on the same units, with a percentile interval from
    resampling whole groups (both detectors see the same resample: a paired bootstrap)."""

    def difference(idx: np.ndarray) -> float:
        return _metric(roc_auc_score, labels[idx], scores[idx]) - _metric(roc_auc_score, labels[idx], reference[idx])

    delta = group_interval(groups, difference, settings, skip_undefined=True)
    return delta.effect, delta.low, delta.high


def by_class(
    values: np.ndarray, labels: np.ndarray, groups: np.ndarray
) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(group, its hallucinated units' values, its faithful units' values) for every group holding both classes,
    in the order groups first appear."""
    values, labels, groups = np.asarray(values, dtype=float), np.asarray(labels), np.asarray(groups)
    for group in dict.fromkeys(groups.tolist()):
        member = groups == group
        hallucinated, faithful = values[member & (labels == HALLUCINATED)], values[member & (labels == FAITHFUL)]
        if hallucinated.size and faithful.size:
            yield str(group), hallucinated, faithful


def group_wins(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    """Per group (question): the share of its (hallucinated, faithful) unit pairs in which the hallucinated unit
    scores higher, a tie counting one half (one pair per HaluEval question: 1, 0.5 or 0). A group without both
    classes is left out."""
    wins = {}
    for group, hallucinated, faithful in by_class(scores, labels, groups):
        difference = hallucinated[:, None] - faithful[None, :]
        wins[group] = float(((difference > 0) + 0.5 * (difference == 0)).mean())
    return wins


def paired_win_rate(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray, settings: EvidenceSettings) -> Interval:
    """The mean over questions of ``group_wins`` (the within-question, paired AUROC) with its bootstrap interval
    over questions (``evidence.fraction_interval``: exact Clopper-Pearson when every question's win is 0 or 1, the
    bootstrap bounded to [0, 1] otherwise, never of zero width); n = the questions holding both classes."""
    return fraction_interval(np.fromiter(group_wins(labels, scores, groups).values(), float), settings)


def length_stratum(ratio: float) -> str:
    """The ``LENGTH_STRATA`` name of a hallucinated / right token-count ratio."""
    return next((name for bound, name in LENGTH_STRATA if ratio <= bound), LONGEST_STRATUM)


def length_strata(lengths: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> dict[str, str]:
    """Per group holding both classes: the stratum of its mean hallucinated over its mean faithful length."""
    return {
        group: length_stratum(float(hallucinated.mean() / faithful.mean()))
        for group, hallucinated, faithful in by_class(lengths, labels, groups)
    }


def roc_points(labels: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(false positive rate, true positive rate) of the ROC curve."""
    fpr, tpr, _ = roc_curve(labels, scores)
    return fpr, tpr
