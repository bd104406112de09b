"""Temporal-offset CCA between final hidden states and head scores (paper Sec. 3.3 and App. A.4, Claim 3).

Input: one ``(hidden [step, dim], scores [step, layer*head])`` pair per sample (Eq. 1 copy scores for NIAH,
Eq. 2 reasoning scores for HotpotQA). For offset k, a sample contributes the pairs ``(hidden[n], scores[n+k])``
with ``n + k < T``; pairs never cross samples. One fit = min-max scale the scores per head (constant heads -> 0),
PCA to 95 % (hidden) / 99 % (scores) of the variance, then closed-form CCA with up to 50 components.

Three measurements per offset (``method`` column):

- ``in_sample``: fit and measure on all pairs. The paper's number; inflated when pairs are few and PCA keeps
  many dimensions (with ``dims >= pairs`` it reaches 1 on pure noise).
- ``held_out``: fit on a seeded split of the *samples*, measure the correlation of each canonical pair on the
  projected pairs of the other samples; repeated over ``splits`` seeded splits and averaged, the spread between
  splits inside the gap's interval (``evidence.pooled_interval``). Components keep the order of the fit; they
  are never re-sorted by their held-out value (that would re-inflate).
- ``shuffled``: ``held_out`` after pairing every sample's hidden states with another sample's scores (a seeded
  derangement of the samples; the longer of the two is truncated). It keeps what all answers share at a given
  step (e.g. the position inside the answer) and breaks what is specific to a sample: the floor for ``held_out``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from sklearn.decomposition import PCA
from tqdm.auto import tqdm

from dynheads.analysis.evidence import BatchedStatistic, EvidenceSettings, pooled_interval
from dynheads.analysis.settings import CCAConfig
from dynheads.errors import DynheadsError
from dynheads.outputs import Outputs, write_outputs
from dynheads.paper import PAPER_TOP1
from dynheads.scores import ScoreKind, score_values
from dynheads.tables import Summary, Table, to_markdown
from dynheads.traces import Trace

Sample = tuple[np.ndarray, np.ndarray]  # (hidden [step, dim], scores [step, layer*head])
Method = Literal["in_sample", "held_out", "shuffled"]

_MIN_PAIRS = 3  # fewer pairs give no usable PCA or correlation
_CONSTANT = 1e-12  # a pooled variance below this share of the sum of squares: a constant variate (rounding)


def samples_from_traces(traces: Iterable[Trace], score: ScoreKind = "copy") -> list[Sample]:
    """``(hidden [T, D], scores [T, L*H])`` per trace with T >= 1, ``score`` by name (``copy`` = Eq. 1, NIAH;
    ``reasoning`` = Eq. 2; or any registered head score).

    Traces with no generated token (EOS first) hold no pair and are left out; callers count them.
    """
    return [
        (t.hidden, score_values(t.scores, score).reshape(t.num_steps, t.shape[0] * t.shape[1]))
        for t in traces
        if t.num_steps
    ]


def nonempty_samples(samples: Sequence[Sample]) -> list[Sample]:
    """The samples with at least one step: an empty one (EOS first) holds no pair and, loaded, no hidden width."""
    return [sample for sample in samples if sample[0].shape[0] > 0]


def empty_note(counts: Mapping[str, int] | None) -> str:
    """The line every analysis output carries about skipped empty traces."""
    skipped = (counts or {}).get("empty_samples_skipped", 0)
    return f"{skipped} sample(s) with no generated token skipped (EOS as the first token)." if skipped else ""


def check_samples(samples: Sequence[Sample]) -> tuple[int, int]:
    """Refuse ragged, empty or non-finite input (drop samples with no step first); return ``(hidden dim, score
    width)``. A NaN would otherwise be silent: a score column holding one has no span and is zeroed as constant,
    a NaN among the evaluation pairs turns a correlation into 0."""
    if not samples:
        raise DynheadsError("no samples with generated tokens given")
    dims = set()
    for i, (hidden, scores) in enumerate(samples):
        if hidden.ndim != 2 or scores.ndim != 2 or hidden.shape[0] != scores.shape[0]:
            raise DynheadsError(
                f"sample {i}: expected hidden [T, D] and scores [T, L*H] with the same T, "
                f"got {hidden.shape} and {scores.shape}"
            )
        for name, values in (("hidden states", hidden), ("scores", scores)):
            bad = np.flatnonzero(~np.isfinite(values).all(axis=1))
            if bad.size:
                raise DynheadsError(f"sample {i}: its {name} hold NaN or inf at step {int(bad[0])}")
        dims.add((hidden.shape[1], scores.shape[1]))
    if len(dims) > 1:
        raise DynheadsError(f"samples disagree on (hidden dim, score width): {sorted(dims)}")
    return dims.pop()


def offset_pairs(samples: Sequence[Sample], offset: int) -> tuple[np.ndarray, np.ndarray]:
    """Stack ``hidden[n]`` with ``scores[n + offset]`` within each sample: ``([N, D], [N, W])``."""
    if offset < 0:
        raise DynheadsError(f"offsets must be >= 0, got {offset}")
    hidden = [h[: max(len(h) - offset, 0)] for h, _ in samples]
    scores = [s[offset:] for _, s in samples]
    return np.concatenate(hidden), np.concatenate(scores)


def shuffled_pairing(samples: Sequence[Sample], seed: int) -> list[Sample]:
    """Sample i's hidden states with sample ``perm[i]``'s scores, ``perm`` a seeded derangement (no fixed point)."""
    perm = derangement(len(samples), seed)
    pairs = []
    for (hidden, _), j in zip(samples, perm, strict=True):
        scores = samples[j][1]
        steps = min(len(hidden), len(scores))
        pairs.append((hidden[:steps], scores[:steps]))
    return pairs


def derangement(num_samples: int, seed: int) -> np.ndarray:
    """The shuffled control's seeded permutation of sample indices with no fixed point."""
    if num_samples < 2:
        raise DynheadsError("the shuffled-pairing control needs at least 2 samples")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(num_samples)
    while np.any(perm == np.arange(num_samples)):  # rejection sampling: about e draws on average
        perm = rng.permutation(num_samples)
    return perm


def split_record(sample_ids: Sequence[str], config: CCAConfig) -> dict:
    """Which data is which, for cca.json: the samples in analysis order and, per split seed, the samples held out
    (the rest were fitted on) and whose scores each sample's hidden states met in the shuffled control."""
    ids = list(sample_ids)
    splits = {}
    for seed in range(config.seed, config.seed + config.splits):
        test = split_samples(len(ids), config.test_fraction, seed)[1]
        splits[str(seed)] = {
            "test": [ids[i] for i in test],
            "shuffled_scores_of": [ids[j] for j in derangement(len(ids), seed)],
        }
    return {"samples": ids, "splits": splits}


def split_samples(num_samples: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of sample indices into (fit, test); both non-empty."""
    if num_samples < 2:
        raise DynheadsError(f"held-out CCA needs at least 2 samples to split, got {num_samples}")
    num_test = min(max(round(test_fraction * num_samples), 1), num_samples - 1)
    perm = np.random.default_rng(seed).permutation(num_samples)
    return np.sort(perm[num_test:]), np.sort(perm[:num_test])


@dataclass(frozen=True)
class CCAFit:
    """Closed-form CCA of centred views ``x [N, p]`` and ``y [N, q]``."""

    x_mean: np.ndarray  # [p]
    y_mean: np.ndarray  # [q]
    x_weights: np.ndarray  # [p, r]
    y_weights: np.ndarray  # [q, r]
    correlations: np.ndarray  # [r], descending, as fitted (shrunk slightly by the ridge)

    def transform(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Canonical variates ``([N, r], [N, r])``."""
        return (x - self.x_mean) @ self.x_weights, (y - self.y_mean) @ self.y_weights


def fit_cca(x: np.ndarray, y: np.ndarray, n_components: int, ridge: float = 1e-6) -> CCAFit:
    """CCA by whitening and SVD: ``svd(Cxx^-1/2 Cxy Cyy^-1/2) = U S V'``, weights ``Cxx^-1/2 U``, ``Cyy^-1/2 V``."""
    x_mean, y_mean = x.mean(0), y.mean(0)
    xc, yc = x - x_mean, y - y_mean
    n = len(x) - 1
    white_x = _inverse_sqrt(xc.T @ xc / n, ridge)
    white_y = _inverse_sqrt(yc.T @ yc / n, ridge)
    u, s, vt = np.linalg.svd(white_x @ (xc.T @ yc / n) @ white_y, full_matrices=False)
    r = min(n_components, len(s))
    return CCAFit(x_mean, y_mean, white_x @ u[:, :r], white_y @ vt[:r].T, np.clip(s[:r], 0.0, 1.0))


def _inverse_sqrt(cov: np.ndarray, ridge: float) -> np.ndarray:
    cov = cov + ridge * max(np.trace(cov) / len(cov), np.finfo(float).tiny) * np.eye(len(cov))
    values, vectors = np.linalg.eigh(cov)
    return (vectors / np.sqrt(np.maximum(values, np.finfo(float).eps * values.max()))) @ vectors.T


@dataclass(frozen=True)
class _Pipeline:
    """Scaler + two PCAs + CCA, fitted on one set of pairs and applied to any other."""

    score_min: np.ndarray  # [W]
    score_span: np.ndarray  # [W], 0 for heads constant in the fit pairs
    hidden_pca: PCA
    score_pca: PCA
    cca: CCAFit

    def variates(self, hidden: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        span = np.where(self.score_span > 0, self.score_span, 1.0)
        scaled = np.where(self.score_span > 0, (scores - self.score_min) / span, 0.0)
        u, v = self.cca.transform(self.hidden_pca.transform(hidden), self.score_pca.transform(scaled))
        for name, values in (("hidden states", u), ("scores", v)):  # else every correlation would read 0
            spread = ((values - values.mean(0)) ** 2).sum(0)
            if np.all(spread <= _CONSTANT * (values**2).sum(0)):
                raise DynheadsError(
                    f"the {name} are constant over the evaluation pairs (on every head the fit uses): "
                    "no correlation to measure"
                )
        return u, v


def _fit_pipeline(hidden: np.ndarray, scores: np.ndarray, config: CCAConfig) -> _Pipeline:
    scores = scores.astype(np.float64)
    low, span = scores.min(0), np.ptp(scores, axis=0)
    if not span.any():
        raise DynheadsError("every head's score is constant over the pairs: nothing to correlate")
    if not np.ptp(hidden, axis=0).any():
        raise DynheadsError("the hidden states are constant over the pairs: nothing to correlate")
    scaled = np.where(span > 0, (scores - low) / np.where(span > 0, span, 1.0), 0.0)
    hidden_pca = PCA(n_components=config.hidden_variance).fit(hidden)
    score_pca = PCA(n_components=config.score_variance).fit(scaled)
    cca = fit_cca(
        hidden_pca.transform(hidden).astype(np.float64), score_pca.transform(scaled), config.n_components, config.ridge
    )
    return _Pipeline(low, span, hidden_pca, score_pca, cca)


def _check_pairs(fit: tuple[np.ndarray, np.ndarray], evaluation: tuple[np.ndarray, np.ndarray]) -> None:
    """Refuse fewer than ``_MIN_PAIRS`` fit or evaluation pairs, or pairs holding NaN or inf."""
    for name, (hidden, scores) in (("fit", fit), ("evaluation", evaluation)):
        if len(hidden) < _MIN_PAIRS:
            raise DynheadsError(f"CCA needs at least {_MIN_PAIRS} {name} pairs, got {len(hidden)}")
        if not (np.isfinite(hidden).all() and np.isfinite(scores).all()):
            raise DynheadsError(f"the {name} pairs hold NaN or inf: CCA needs finite hidden states and scores")


def column_correlations(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Pearson correlation of each column pair of ``u [N, r]`` and ``v [N, r]``; 0 where a column is constant."""
    uc, vc = u - u.mean(0), v - v.mean(0)
    denom = np.sqrt((uc**2).sum(0) * (vc**2).sum(0))
    return np.where(denom > 0, (uc * vc).sum(0) / np.where(denom > 0, denom, 1.0), 0.0)


def canonical_correlations(
    fit_pairs: tuple[np.ndarray, np.ndarray],
    eval_pairs: tuple[np.ndarray, np.ndarray] | None = None,
    config: CCAConfig | None = None,
) -> tuple[np.ndarray, dict[str, int]]:
    """Fit on ``fit_pairs`` (hidden [N, D], scores [N, W]); correlations ``[r]`` measured on ``eval_pairs``.

    ``eval_pairs=None`` measures on the fit pairs (in-sample). Also returns the kept dimensions.
    """
    config = config or CCAConfig()
    _check_pairs(fit_pairs, eval_pairs or fit_pairs)
    pipeline = _fit_pipeline(*fit_pairs, config)
    correlations = column_correlations(*pipeline.variates(*(eval_pairs or fit_pairs)))
    dims = {
        "n_components": len(correlations),
        "hidden_dims": int(pipeline.hidden_pca.n_components_),
        "score_dims": int(pipeline.score_pca.n_components_),
    }
    return correlations, dims


def summarize(correlations: np.ndarray) -> dict[str, float]:
    """First correlation and the means of the first 10 and 50 (of fewer, when fewer components exist)."""
    return {
        "top1": float(correlations[0]),
        "top10_mean": float(correlations[:10].mean()),
        "top50_mean": float(correlations[:50].mean()),
    }


def cca_offsets(
    samples: Sequence[Sample],
    offsets: Iterable[int] = range(11),
    config: CCAConfig | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """One row per (offset, method): top1, top10_mean, top50_mean, kept dimensions and pair counts.

    ``held_out`` and ``shuffled`` are repeated over ``config.splits`` seeded sample splits (``splits`` says how many
    measured it); their rows show the means over the splits, and the dimensions and pair counts of the first.
    Held-out rows also carry ``gap``, ``gap_low``, ``gap_high``: held-out minus shuffled top-1, the mean over the
    splits, with an interval that pools each split's bootstrap over its test samples (both measured on the same
    resampled samples: row j of either view holds sample j's hidden states), so the spread between splits lies
    inside it; and ``test_samples`` (the fewest of a split). An offset/method that cannot be measured on any split
    (too few pairs, constant scores) gets a row of NaN with the reason in ``note``; with no held-out measure at
    any offset it is an error. Samples with no step are dropped first (they hold no pair). ``progress``: a bar over
    the offsets (the rule studies, which run it thousands of times, turn it off).
    """
    config = config or CCAConfig()
    samples = nonempty_samples(samples)
    check_samples(samples)
    evidence = EvidenceSettings(resamples=config.resamples, seed=config.seed)
    rows: list[dict] = []
    for offset in tqdm(list(offsets), desc="cca", unit="offset", leave=False, disable=not progress):
        if offset < 0:
            raise DynheadsError(f"offsets must be >= 0, got {offset}")
        base: dict = {"offset": offset, "method": "in_sample"}
        try:
            fit = offset_pairs(samples, offset)
            correlations, dims = canonical_correlations(fit, None, config)
            rows.append(
                {**base, **summarize(correlations), **dims, "fit_pairs": len(fit[0]), "eval_pairs": len(fit[0])}
            )
        except DynheadsError as error:
            rows.append({**base, "note": f"offset {offset}, in_sample: {error}"})
        rows += _split_rows(samples, offset, config, evidence)
    failed = [row["note"] for row in rows if "note" in row]
    if not any(row["method"] == "held_out" and "note" not in row for row in rows):
        raise DynheadsError(failed[0])  # no held-out measure at any offset: nothing a verdict could read
    columns = [
        "offset",
        "method",
        "top1",
        "top10_mean",
        "top50_mean",
        "n_components",
        "hidden_dims",
        "score_dims",
        "fit_pairs",
        "eval_pairs",
        "splits",
        "gap",
        "gap_low",
        "gap_high",
        "test_samples",
        "note",
    ]
    return pd.DataFrame(rows).reindex(columns=columns)


def _split_rows(samples: Sequence[Sample], offset: int, config: CCAConfig, evidence: EvidenceSettings) -> list[dict]:
    """The held_out and shuffled rows of one offset over the seeded splits on which both could be measured."""
    measured: list[dict[str, tuple]] = []
    note = ""
    for seed in range(config.seed, config.seed + config.splits):
        fit_idx, test_idx = split_samples(len(samples), config.test_fraction, seed)
        views = {"held_out": samples, "shuffled": shuffled_pairing(samples, seed)}
        try:
            measured.append(
                {
                    method: _held_out([pairs[i] for i in fit_idx], [pairs[i] for i in test_idx], offset, config)
                    for method, pairs in views.items()
                }
            )
        except DynheadsError as error:
            note = note or f"offset {offset} (split seed {seed}): {error}"
    if not measured:
        return [
            {"offset": offset, "method": method, "note": f"{note}, on every split"}
            for method in ("held_out", "shuffled")
        ]
    rows = []
    for method in ("held_out", "shuffled"):
        runs = [split[method] for split in measured]
        means = pd.DataFrame([summarize(correlations) for correlations, *_ in runs]).mean().to_dict()
        rows.append({"offset": offset, "method": method, **means, **runs[0][1], **runs[0][3], "splits": len(runs)})
    gap = pooled_interval([_gap_part(split["held_out"][2], split["shuffled"][2]) for split in measured], evidence)
    rows[0].update(gap=gap.effect, gap_low=gap.low, gap_high=gap.high, test_samples=gap.n)
    return rows


def _held_out(
    fit_samples: Sequence[Sample], test_samples: Sequence[Sample], offset: int, config: CCAConfig
) -> tuple[np.ndarray, dict[str, int], list[tuple[np.ndarray, np.ndarray]], dict[str, int]]:
    """Fit on the fit samples' pairs; the correlations on the test pairs, and each test sample's first canonical
    variates (empty arrays for a sample too short for the offset)."""
    fit = offset_pairs(fit_samples, offset)
    test = offset_pairs(test_samples, offset)
    _check_pairs(fit, test)
    pipeline = _fit_pipeline(*fit, config)
    u, v = pipeline.variates(*test)
    correlations = column_correlations(u, v)
    sizes = [max(len(hidden) - offset, 0) for hidden, _ in test_samples]
    bounds = np.cumsum([0, *sizes])
    firsts = [(u[a:b, 0], v[a:b, 0]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    dims = {
        "n_components": len(correlations),
        "hidden_dims": int(pipeline.hidden_pca.n_components_),
        "score_dims": int(pipeline.score_pca.n_components_),
    }
    return correlations, dims, firsts, {"fit_pairs": len(fit[0]), "eval_pairs": len(test[0])}


def _gap_part(
    held_out: list[tuple[np.ndarray, np.ndarray]], shuffled: list[tuple[np.ndarray, np.ndarray]]
) -> tuple[int, BatchedStatistic]:
    """One split's ``(test samples, gap statistic)``, over the test samples with a pair at the offset in either
    view: a sample shorter than the offset measures nothing and is neither counted nor drawn."""
    kept = [i for i, (own, other) in enumerate(zip(held_out, shuffled, strict=True)) if len(own[0]) or len(other[0])]
    return len(kept), gap_statistic([held_out[i] for i in kept], [shuffled[i] for i in kept])


def gap_statistic(
    held_out: list[tuple[np.ndarray, np.ndarray]], shuffled: list[tuple[np.ndarray, np.ndarray]]
) -> BatchedStatistic:
    """Held-out minus shuffled first canonical correlation over chosen test samples (paired by sample); for the
    bootstrap, the pooled correlations of many resamples at once from per-sample moments."""

    def top1(firsts: list[tuple[np.ndarray, np.ndarray]], idx: np.ndarray) -> float:
        u = np.concatenate([firsts[i][0] for i in idx])
        v = np.concatenate([firsts[i][1] for i in idx])
        return float(column_correlations(u[:, None], v[:, None])[0]) if len(u) >= _MIN_PAIRS else math.nan

    moments = [_sample_moments(held_out), _sample_moments(shuffled)]

    def many(idx: np.ndarray) -> np.ndarray:
        rows, samples = idx.shape[0], len(held_out)
        counts = np.bincount((idx + samples * np.arange(rows)[:, None]).ravel(), minlength=rows * samples)
        weights = counts.reshape(rows, samples).astype(float)
        return _pooled_correlation(weights @ moments[0]) - _pooled_correlation(weights @ moments[1])

    return BatchedStatistic(lambda idx: top1(held_out, idx) - top1(shuffled, idx), many)


def _sample_moments(firsts: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Per sample ``[count, sum u, sum v, sum u^2, sum v^2, sum uv]`` of its first variates, centred on the mean
    over all samples (a correlation does not change with a shift; centring keeps the pooled sums precise)."""
    pooled = [np.concatenate([part[side] for part in firsts] or [np.zeros(0)]) for side in (0, 1)]
    centre = [float(values.mean()) if values.size else 0.0 for values in pooled]
    rows = []
    for u, v in firsts:
        u, v = u.astype(np.float64) - centre[0], v.astype(np.float64) - centre[1]
        rows.append([len(u), u.sum(), v.sum(), (u * u).sum(), (v * v).sum(), (u * v).sum()])
    return np.asarray(rows, dtype=np.float64).reshape(len(firsts), 6)


def _pooled_correlation(totals: np.ndarray) -> np.ndarray:
    """The Pearson correlation of each row's pooled moments (``_sample_moments`` summed over the chosen samples):
    NaN below ``_MIN_PAIRS`` pairs, 0 where a side is constant (as ``column_correlations``)."""
    count, su, sv, suu, svv, suv = totals.T
    with np.errstate(divide="ignore", invalid="ignore"):
        var_u, var_v = suu - su * su / count, svv - sv * sv / count
        cov = suv - su * sv / count
        constant = (var_u <= _CONSTANT * suu) | (var_v <= _CONSTANT * svv)
        correlation = np.where(constant, 0.0, cov / np.sqrt(np.abs(var_u * var_v)))
    return np.where(count >= _MIN_PAIRS, correlation, np.nan)


def cca_table(table: pd.DataFrame, paper: Mapping[int, float] | None = None) -> Table:
    """``cca_offsets`` output as a table; ``paper`` (offset -> top-1) adds a column beside in-sample. Held-out rows
    show their gap to the shuffled control with its 95 % interval; an offset that could not be measured shows
    "–" (its reason is in ``cca_notes``)."""
    header = [
        "offset",
        "method",
        "top-1",
        "top-10 mean",
        "top-50 mean",
        "components",
        "dims (hidden/scores)",
        "pairs (fit/eval)",
        "held-out - shuffled [95% CI] (test samples)",
    ] + (["paper top-1"] if paper else [])
    rows: list[list] = []
    for row in table.itertuples(index=False):
        cells = [
            int(row.offset),
            row.method,
            float(row.top1),
            float(row.top10_mean),
            float(row.top50_mean),
            _count(row.n_components),
            f"{_count(row.hidden_dims)}/{_count(row.score_dims)}",
            f"{_count(row.fit_pairs)}/{_count(row.eval_pairs)}",
            _gap_text(row),
        ]
        if paper:
            known = row.method == "in_sample" and row.offset in paper
            cells.append(f"{paper[row.offset]:.3f}" if known else "")
        rows.append(cells)
    return Table(header, rows, missing="nan")


def cca_notes(table: pd.DataFrame) -> list[str]:
    """One line per offset/method that could not be measured."""
    return [str(note) for note in table.get("note", pd.Series(dtype=object)).dropna()]


def _count(value: float) -> str:
    return "–" if pd.isna(value) else str(int(value))


def _gap_text(row) -> str:
    if getattr(row, "method", "") != "held_out" or pd.isna(getattr(row, "gap", math.nan)):
        return ""
    if pd.isna(row.gap_low) or pd.isna(row.gap_high):  # one test sample: no interval (as the probe's "undefined")
        return f"{row.gap:.3f}, no interval ({_count(row.test_samples)})"
    return f"{row.gap:.3f} [{row.gap_low:.3f}, {row.gap_high:.3f}] ({_count(row.test_samples)})"


def held_out_rows(table: pd.DataFrame) -> dict[str, dict]:
    """Per offset (as text): the held-out top-1, the shuffled control's, and the held-out minus shuffled gap with
    its interval over test samples (or the note saying why it was not measured): Claim 3's CCA input."""
    keys = ("top1", "gap", "gap_low", "gap_high", "test_samples", "note")
    rows = {}
    for offset, at_k in table.groupby("offset"):
        by_method = at_k.set_index("method")
        if "held_out" in by_method.index:
            row = by_method.loc["held_out"]
            rows[str(offset)] = {
                **{key: row[key] for key in keys if key in row.index},
                "shuffled_top1": by_method["top1"].get("shuffled"),
            }
    return rows


def cca_markdown(table: pd.DataFrame, paper: Mapping[int, float] | None = None) -> str:
    """Markdown table of ``cca_offsets`` output; ``paper`` (offset -> top-1) adds a column beside in-sample."""
    return to_markdown(cca_table(table, paper)) + "\n"


def cca_outputs(
    table: pd.DataFrame,
    *,
    config: CCAConfig | None = None,
    model: str | None = None,
    counts: Mapping[str, int] | None = None,
    splits: Mapping | None = None,
) -> Outputs:
    """``cca.csv``, ``cca.json`` and ``cca.md``; ``model`` picks the paper's reference numbers. ``counts`` (e.g.
    ``samples``, ``empty_samples_skipped``) go into cca.json and a line of cca.md; ``splits`` (``split_record``)
    into cca.json."""
    paper = PAPER_TOP1.get(model or "")
    note = [empty_note(counts)] if counts and counts.get("empty_samples_skipped") else []
    failed = [f"Not measured: {line}." for line in cca_notes(table)]
    return (
        Outputs()
        .add("cca.csv", table.to_csv(index=False))
        .add(
            "cca.json",
            {
                "config": asdict(config) if config else None,
                "model": model,
                **dict(counts or {}),
                "paper_top1": paper,
                **({"held_out_splits": dict(splits)} if splits else {}),
                "rows": table.to_dict(orient="records"),
            },
        )
        .add(
            "cca.md",
            Summary([*note, cca_table(table, paper), *failed], {**(counts or {}), "held_out": held_out_rows(table)}),
        )
    )


def write_cca(
    table: pd.DataFrame,
    out_dir: str | Path,
    *,
    config: CCAConfig | None = None,
    model: str | None = None,
    counts: Mapping[str, int] | None = None,
) -> dict[str, Path]:
    """``cca_outputs`` written into ``out_dir`` (each file atomically); returns their paths by kind."""
    write_outputs(out_dir, cca_outputs(table, config=config, model=model, counts=counts))
    return {kind: Path(out_dir) / f"cca.{kind}" for kind in ("csv", "json", "md")}
