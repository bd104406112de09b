"""The hallucination detector as analysis of finished traces: logistic regressions on per-token (or per-response)
attention features, saved and applied (``Detector``, ``apply_detector``), and their grouped cross-validation with
intervals (``cross_validate``). The runner that reads traced runs and writes the tables is
``dynheads.views.detect``; the features are ``dynheads.analysis.hallucination``'s."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from dynheads.analysis import hallucination as hl
from dynheads.analysis.evidence import EvidenceSettings
from dynheads.analysis.head_predictor import TrainedHeadPredictor, load_head_predictor
from dynheads.analysis.headlists import load_head_list
from dynheads.analysis.settings import ANSWER_KEY
from dynheads.errors import DynheadsError
from dynheads.io import read_json, write_json
from dynheads.models import model_difference
from dynheads.traces import Trace


class FitSettings(Protocol):
    """What fitting and cross-validating a detector reads (``DetectConfig`` has it): the given static list (or
    None: ranked on each training fold), its top-k, the folds, repeats and seed, the bootstrap resamples and the
    logistic regression's inverse L2 strength."""

    @property
    def static(self) -> str | None: ...
    @property
    def static_k(self) -> int: ...
    @property
    def folds(self) -> int: ...
    @property
    def repeats(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def bootstrap(self) -> int: ...
    @property
    def regularisation(self) -> float: ...


DETECTOR_FORMAT = "dynheads-detector/2"  # 2: needle-free probe silence, context attention, response-level detectors
Level = Literal["token", "response"]


REFERENCE = "lookback"  # every other set's AUROC is also given as a paired difference to this one


@dataclass
class LabelledSample:
    sample_id: str
    trace: Trace
    steps: np.ndarray  # [N] labelled steps
    labels: np.ndarray  # [N] 0 faithful / 1 hallucinated
    group: str = ""  # the question (both answers of a HaluEval question share it); the sample id otherwise
    response_label: int | None = None  # a teacher-forced response's label (every step carries it)

    def __post_init__(self) -> None:
        self.group = self.group or self.sample_id


def fit_detectors(features: dict[str, np.ndarray], labels: np.ndarray, regularisation: float) -> dict[str, dict]:
    """A logistic regression (standardised inputs, balanced classes) per feature set (name -> ``[N, F]``), kept as
    plain numbers: the scaler's mean and scale, the coefficients and the intercept."""
    models = {}
    for name, x in features.items():
        scaler = StandardScaler().fit(x)
        regression = LogisticRegression(C=regularisation, class_weight="balanced", max_iter=2000)
        regression.fit(scaler.transform(x), labels)
        models[name] = {
            "mean": scaler.mean_.tolist(),
            "scale": scaler.scale_.tolist(),
            "coef": regression.coef_[0].tolist(),
            "intercept": float(regression.intercept_[0]),
        }
    return models


def hallucination_probability(model: dict, x: np.ndarray) -> np.ndarray:
    """``[N, F] -> [N]``: the probability of a ``fit_detectors`` model that each row is hallucinated."""
    z = (x - np.asarray(model["mean"])) / np.asarray(model["scale"])
    return 1.0 / (1.0 + np.exp(-(z @ np.asarray(model["coef"]) + model["intercept"])))


class Detector:
    """Fitted logistic regressions per level and feature set, plus what the features need (static heads, probe)."""

    def __init__(
        self,
        spec: hl.FeatureSpec,
        probe_dir: str | None,
        models: dict[str, dict],
        response_models: dict[str, dict] | None = None,
        fitted_prompts: frozenset[str] | None = None,
        model: dict[str, Any] | None = None,
    ):
        self.spec, self.probe_dir, self.models = spec, probe_dir, models
        self.response_models = response_models or {}
        # the prompts of the traces it was fitted on (``Trace.prompt_digest``); None: not recorded (an older file)
        self.fitted_prompts = fitted_prompts
        # the model of the run it was fitted on (its manifest's ``model``); None: not recorded (an older file)
        self.model = model
        self._probe: TrainedHeadPredictor | None = None

    @classmethod
    def fit(
        cls,
        spec: hl.FeatureSpec,
        probe_dir: str | None,
        features: dict[str, np.ndarray],
        labels: np.ndarray,
        regularisation: float,
    ) -> Detector:
        """Token-level detectors of ``features`` (name -> ``[N, F]``)."""
        return cls(spec, probe_dir, fit_detectors(features, labels, regularisation))

    def score(self, name: str, x: np.ndarray, level: Level = "token") -> np.ndarray:
        """``[N, F] -> [N]`` probability that each token (response) is hallucinated."""
        return hallucination_probability((self.models if level == "token" else self.response_models)[name], x)

    def probe_output(self, trace: Trace) -> np.ndarray | None:
        if self.probe_dir is None:
            return None
        self._probe = self._probe or load_head_predictor(self.probe_dir)
        return self._probe.predict(trace.hidden)

    def save(self, path: str | Path) -> None:
        write_json(
            path,
            {
                "format": DETECTOR_FORMAT,
                "static_heads": [list(h) for h in self.spec.static_heads],
                "static_k": self.spec.static_k,
                "response_prefix": self.spec.response_prefix,
                "probe": self.probe_dir,
                "models": self.models,
                "response_models": self.response_models,
                **({"fitted_prompts": sorted(self.fitted_prompts)} if self.fitted_prompts is not None else {}),
                **({"model": self.model} if self.model is not None else {}),
            },
        )

    @classmethod
    def load(cls, path: str | Path) -> Detector:
        path = Path(path)
        if not path.is_file():
            raise DynheadsError(f"detector file not found: {path}")
        try:
            data = read_json(path)
            if data.get("format") != DETECTOR_FORMAT:
                raise DynheadsError(
                    f"{path} is a detector of format {data.get('format')!r}, not {DETECTOR_FORMAT!r}: "
                    "re-run 'dynheads detect' to write one"
                )
            spec = hl.FeatureSpec(
                tuple((int(a), int(b)) for a, b in data["static_heads"]),
                int(data["static_k"]),
                response_prefix=int(data["response_prefix"]),
            )
            fitted = data.get("fitted_prompts")
            prompts = frozenset(map(str, fitted)) if fitted is not None else None
            model = dict(data["model"]) if data.get("model") is not None else None
            return cls(spec, data["probe"], dict(data["models"]), dict(data["response_models"]), prompts, model)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise DynheadsError(
                f"{path} is not a valid dynheads detector file (written by 'dynheads detect'): "
                f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            ) from None


def apply_detector(
    detector: Detector | str | Path, trace: Trace | str | Path, answer: str | None = None
) -> pd.DataFrame:
    """Score every generated token of a trace with every saved detector; label it when ``answer`` is given.

    Response-level detectors (saved by a run of teacher-forced responses) add one constant column each, the
    probability that the whole response is hallucinated.
    """
    detector = detector if isinstance(detector, Detector) else Detector.load(detector)
    if not isinstance(trace, Trace):
        if not Path(trace).is_file():
            raise DynheadsError(f"trace file not found: {trace}")
        refuse_other_run_model(detector, trace_run_model(trace))
        trace = Trace.load(trace)
    steps = np.arange(trace.num_steps)
    frame = pd.DataFrame({"step": steps, "token": trace.token_texts})
    if answer is not None:
        span = hl.find_value("".join(trace.token_texts))
        frame["label"] = hl.label_tokens(trace.token_texts, answer, span)
    refuse_other_model(detector, trace)
    refuse_fitted_trace(detector, trace)
    probe_output = detector.probe_output(trace)
    features = hl.token_features(trace, steps, detector.spec, probe_output)
    for name in detector.models:
        if name in features:
            refuse_other_width(detector.models[name], name, features[name])
            frame[f"p_hallucinated.{name}"] = detector.score(name, features[name])
    if detector.response_models and trace.num_steps:
        response = hl.span_features(trace, detector.spec, probe_output)  # the whole response
        for name in detector.response_models:
            if name in response:
                refuse_other_width(detector.response_models[name], name, response[name])
                frame[f"p_hallucinated_response.{name}"] = float(detector.score(name, response[name], "response")[0])
    return frame


def refuse_other_model(detector: Detector, trace: Trace) -> None:
    """A trace without the detector's static heads is of another model: one line, not an index error."""
    layers, heads = trace.shape
    outside = [(layer, head) for layer, head in detector.spec.static_heads if layer >= layers or head >= heads]
    if outside:
        raise DynheadsError(
            f"the detector reads head L{outside[0][0]}-H{outside[0][1]}, which this trace ({layers} layers x {heads} "
            "heads) does not have: the trace is of another model than the detector was fitted on"
        )


def trace_run_model(path: str | Path) -> dict[str, Any] | None:
    """The ``model`` that the manifest of the run holding a trace file records (``RUN/traces/NAME.parquet``);
    None for a trace outside a run folder or a manifest that records none."""
    path = Path(path)
    manifest = path.parent.parent / "manifest.json"
    if path.parent.name != "traces" or not manifest.is_file():
        return None
    try:
        model = read_json(manifest).get("model")
    except (ValueError, AttributeError):
        return None  # not a run manifest: nothing to compare
    return model if isinstance(model, dict) else None


def refuse_other_run_model(detector: Detector, model: dict[str, Any] | None) -> None:
    """A trace whose run records another model than the one the detector was fitted on (``model_difference``: the
    shapes may agree, the heads do not): one line. Nothing to check where either is not recorded."""
    differ = model_difference(model, detector.model)
    if differ is not None:  # both recorded (None otherwise)
        key, mine, theirs = differ
        raise DynheadsError(
            f"the detector was fitted on a run of {(detector.model or {}).get('name')} ({key} {theirs}); this trace's "
            f"run is of {(model or {}).get('name')} ({key} {mine}): fit a detector on this model's traces"
        )


def refuse_fitted_trace(detector: Detector, trace: Trace) -> None:
    """A trace whose prompt the detector was fitted on would get in-sample scores: one line (the prompt's digest
    is compared; a trace or detector written before they recorded prompts is not checked)."""
    digest = trace.prompt_digest()
    if detector.fitted_prompts is not None and digest is not None and digest in detector.fitted_prompts:
        raise DynheadsError(
            f"the detector was fitted on this trace's prompt (digest {digest} in its fitted_prompts): its scores "
            "would be in-sample; apply it to a generation from a prompt it was not fitted on"
        )


def refuse_other_width(model: dict, name: str, x: np.ndarray) -> None:
    """Features of another width than the fitted ones (another model's head count): one line."""
    if x.shape[1] != len(model["coef"]):
        raise DynheadsError(
            f"feature set {name!r} has {x.shape[1]} columns in this trace, but the detector was fitted on "
            f"{len(model['coef'])}: the trace is of another model than the detector was fitted on"
        )


class Featuriser:
    """Features of every sample under a feature spec; probe outputs computed once per sample."""

    def __init__(self, samples: Sequence[LabelledSample], probe_dir: str | None):
        self.samples = samples
        probe = load_head_predictor(probe_dir) if probe_dir else None
        self.probe_outputs = [probe.predict(s.trace.hidden) if probe else None for s in samples]

    def __call__(self, index: int, spec: hl.FeatureSpec, level: Level) -> dict[str, np.ndarray]:
        sample, output = self.samples[index], self.probe_outputs[index]
        if level == "response":
            return hl.span_features(sample.trace, spec, output, sample.steps)
        return hl.token_features(sample.trace, sample.steps, spec, output)


def training_feature_spec(config: FitSettings, train: Sequence[LabelledSample], response_prefix: int) -> hl.FeatureSpec:
    """The feature spec fitted on ``train`` (a fold, or every sample of the training task): the given static head
    list, or heads ranked on ``train`` alone (never on what is scored)."""
    if config.static:
        layers, heads = train[0].trace.shape
        static = tuple(load_head_list(config.static, layers, heads).heads)
    else:
        static = hl.rank_heads_by_copy([s.trace for s in train])  # the training fold only: no test leak
    return hl.FeatureSpec(static, config.static_k, response_prefix=response_prefix)


@dataclass
class CrossValidation:
    """What ``cross_validate`` measured at one level: result rows, ROC curves and the folds of the first repeat,
    and the first repeat's out-of-fold score of every unit per feature set (with the units' labels and groups)."""

    rows: list[dict]
    curves: dict
    folds: list[dict]
    scores: dict[str, np.ndarray]
    labels: np.ndarray
    groups: np.ndarray


def cross_validate(
    samples: Sequence[LabelledSample],
    config: FitSettings,
    level: Level,
    names: Sequence[str],
    featurise: Featuriser,
    response_prefix: int = 0,
) -> CrossValidation:
    """Grouped K-fold cross-validation of every feature set at ``level``, repeated ``config.repeats`` times."""
    unit_labels = [s.labels for s in samples] if level == "token" else [np.array([s.response_label]) for s in samples]
    sizes = np.array([len(y) for y in unit_labels])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    y = np.concatenate(unit_labels)
    row_groups = np.repeat([s.group for s in samples], sizes)
    sample_labels = [int(labels.max()) for labels in unit_labels]  # stratify by "holds a hallucinated token"
    out_of_fold = np.full((config.repeats, len(names), len(y)), np.nan)
    fold_auroc: dict[str, list[float]] = {name: [] for name in names}
    folds = []
    for repeat in range(config.repeats):
        splits = hl.grouped_folds([s.group for s in samples], sample_labels, config.folds, config.seed + repeat)
        folds.append(
            {
                "seed": config.seed + repeat,
                "test_groups": [sorted({samples[i].group for i in test}) for _, test in splits],
            }
        )
        for train, test in splits:
            spec = training_feature_spec(config, [samples[i] for i in train], response_prefix)
            features = {i: featurise(i, spec, level) for i in np.concatenate([train, test])}
            train_rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in train])
            test_rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in test])
            if len(np.unique(y[train_rows])) < 2:
                raise DynheadsError("a training fold holds only one class: use more samples or fewer --folds")
            for n, name in enumerate(names):
                model = fit_detectors(
                    {name: np.vstack([features[i][name] for i in train])}, y[train_rows], config.regularisation
                )[name]
                scores = hallucination_probability(model, np.vstack([features[i][name] for i in test]))
                out_of_fold[repeat, n, test_rows] = scores
                fold_auroc[name].append(hl.auroc_auprc(y[test_rows], scores)[0])
    widths = featurise(0, training_feature_spec(config, samples, response_prefix), level)
    measured = CrossValidation([], {}, folds, dict(zip(names, out_of_fold[0], strict=True)), y, row_groups)
    for n, name in enumerate(names):
        repeats = [hl.auroc_auprc(y, out_of_fold[r, n])[0] for r in range(config.repeats)]
        per_fold = np.asarray(fold_auroc[name], dtype=float)
        row = _result_row(measured, name, config, level, (repeats, per_fold), int(widths[name].shape[1]))
        measured.rows.append(row)
        fpr, tpr = hl.roc_points(y, measured.scores[name])
        measured.curves[name] = (fpr, tpr, row["auroc"])
    return measured


def _result_row(
    measured: CrossValidation,
    name: str,
    config: FitSettings,
    level: Level,
    spread: tuple[list[float], np.ndarray],
    features: int,
) -> dict:
    """One feature set's row: pooled AUROC / AUPRC of the first repeat with intervals over groups, the spread
    (out-of-fold AUROC per repeat, AUROC per fold), the paired difference to the lookback ratio and (responses) the
    within-question win rate."""
    y, groups, scores = measured.labels, measured.groups, measured.scores[name]
    per_repeat, per_fold = spread
    # paired against the lookback ratio (the deployable reference): the same bootstrap resamples of groups
    delta = (
        hl.paired_auroc_difference(y, scores, measured.scores[REFERENCE], groups, evidence_settings(config))
        if REFERENCE in measured.scores and name != REFERENCE
        else (math.nan,) * 3
    )
    paired = hl.paired_win_rate(y, scores, groups, evidence_settings(config)) if level == "response" else None
    auroc, auprc = hl.auroc_auprc(y, scores)
    ci = hl.bootstrap_ci(y, scores, groups, evidence_settings(config))
    return {
        "level": level,
        "feature_set": name,
        "section": "upper_bound" if name in ANSWER_KEY else "deployable",
        "features": features,
        "auroc": auroc,
        "auroc_low": ci["auroc"][0],
        "auroc_high": ci["auroc"][1],
        "paired_win": paired.effect if paired else math.nan,
        "paired_win_low": paired.low if paired else math.nan,
        "paired_win_high": paired.high if paired else math.nan,
        "paired_questions": paired.n if paired else 0,
        "fold_auroc_mean": float(np.nanmean(per_fold)),
        "fold_auroc_sd": float(np.nanstd(per_fold)),
        "repeat_auroc_min": float(np.nanmin(per_repeat)),
        "repeat_auroc_max": float(np.nanmax(per_repeat)),
        "auprc": auprc,
        "auprc_low": ci["auprc"][0],
        "auprc_high": ci["auprc"][1],
        "delta_lookback": delta[0],
        "delta_lookback_low": delta[1],
        "delta_lookback_high": delta[2],
        "positive_rate": float(y.mean()),
        "units": int(len(y)),
        "groups": int(len(set(groups))),
    }


def evidence_settings(config: FitSettings) -> EvidenceSettings:
    """Every interval's bootstrap (AUROC over groups, the paired difference, the within-question win rates):
    ``config.bootstrap`` resamples, its seed."""
    return EvidenceSettings(resamples=config.bootstrap, seed=config.seed)


def length_strata_rows(measured: CrossValidation, lengths: np.ndarray, config: FitSettings) -> list[dict]:
    """Per feature set and length stratum (``hl.length_strata``: the hallucinated answer's token count over the
    right one's), the within-question win rate of the response-level out-of-fold scores, answers read whole."""
    strata = hl.length_strata(lengths, measured.labels, measured.groups)
    rows = []
    for stratum in [name for _, name in hl.LENGTH_STRATA] + [hl.LONGEST_STRATUM]:
        inside = np.isin(measured.groups, [group for group, name in strata.items() if name == stratum])
        for name, scores in measured.scores.items():
            win = hl.paired_win_rate(
                measured.labels[inside], scores[inside], measured.groups[inside], evidence_settings(config)
            )
            rows.append({"stratum": stratum, "feature_set": name, **win.to_dict()})
    return rows
