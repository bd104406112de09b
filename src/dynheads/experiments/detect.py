"""``dynheads detect``: token-level hallucination detection from a traced run, and the saved detector.

For every feature set (``dynheads.analysis.hallucination``) a logistic regression (standardised inputs) is
trained on the labelled tokens of the *training* samples and evaluated on the tokens of the disjoint *test*
samples (split by sample, never by token; both lists are in the manifest). Writes into ``out``:

- ``manifest.json``: config, source run, train/test sample ids, static heads and where they came from, counts;
- ``labels.csv``: every labelled token (sample, step, token, label, split);
- ``results.md`` / ``results.csv`` / ``results.json``: AUROC and AUPRC with sample-bootstrap CIs per feature set;
- ``roc.png``; ``detector.json``: the fitted detectors (plain numbers, no pickle), for ``apply_detector``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from dynheads.analysis import hallucination as hl
from dynheads.analysis.head_predictor import load_head_predictor
from dynheads.analysis.headlists import load_head_list
from dynheads.errors import DynheadsError
from dynheads.io import read_json, write_json, write_text
from dynheads.plots.roc import plot_roc
from dynheads.runs import RunDir
from dynheads.traces import Trace

_FORMAT = "dynheads-detector/1"
# Published numbers of other detectors, on other tasks (docs/hallucination.md says how they differ).
PUBLISHED = (
    ("Lookback Lens, annotated spans (summarisation / QA)", "AUROC 85.3 / 82.0"),
    ("Lookback Lens, 8-token sliding windows (summarisation / QA)", "AUROC 66.1 / 66.0"),
    ("ReDeEP (RAGTruth)", "AUC 0.75"),
)


@dataclass(frozen=True)
class DetectConfig:
    static: str | None = field(default=None, metadata={
        "help": "static head list (Wu et al. JSON or ranked list); None = heads ranked by Eq. 1 frequency on "
                "the training samples only"})
    static_k: int = field(default=10, metadata={"help": "static top-k heads used by the retrieval features"})
    probe: str | None = field(default=None, metadata={"help": "trained MLP probe folder (probe feature set)"})
    feature_sets: tuple[str, ...] = field(default=hl.FEATURE_SETS, metadata={"help": "detectors to train"})
    test_fraction: float = field(default=0.5, metadata={"help": "share of samples held out for evaluation"})
    seed: int = field(default=0, metadata={"help": "seed of the sample split and the bootstrap"})
    bootstrap: int = field(default=1000, metadata={"help": "bootstrap resamples (of test samples) for the CIs"})
    regularisation: float = field(default=1.0, metadata={"help": "inverse L2 strength C of the regression"})


@dataclass
class LabelledSample:
    sample_id: str
    trace: Trace
    steps: np.ndarray  # [N] labelled steps
    labels: np.ndarray  # [N] 0 faithful / 1 hallucinated


SpanFinder = Callable[[str, dict], "tuple[int, int] | None"]  # (generated text, record) -> value span


def uuid_span(text: str, record: dict) -> tuple[int, int] | None:
    """NIAH: the first UUID-shaped string of the generated text."""
    return hl.find_value(text)


def labelled_samples(run: RunDir, span_finder: SpanFinder = uuid_span) -> tuple[list[LabelledSample], int]:
    """Label every finished sample that has a trace and an ``answer``; also return how many had no value.

    ``span_finder`` locates the answer value in the generated text (other tasks, e.g. multi-hop QA, pass theirs).
    """
    samples, no_value = [], 0
    for record, trace in run.iter_traces():
        if "answer" not in record:
            raise DynheadsError(f"sample {record.get('sample_id')!r} of {run.path} has no 'answer' to label against")
        span = span_finder("".join(trace.token_texts), record)
        labels = hl.label_tokens(trace.token_texts, str(record["answer"]), span)
        steps = np.flatnonzero(labels != hl.UNLABELLED)
        if steps.size == 0:
            no_value += 1
            continue
        samples.append(LabelledSample(record["sample_id"], trace, steps, labels[steps].astype(np.int64)))
    if not samples:
        raise DynheadsError(f"{run.path} has no sample with a labelled answer value")
    return samples, no_value


class Detector:
    """Fitted logistic regressions, one per feature set, plus what the features need (static heads, probe)."""

    def __init__(self, spec: hl.FeatureSpec, probe_dir: str | None, models: dict[str, dict]):
        self.spec, self.probe_dir, self.models = spec, probe_dir, models
        self._probe = None

    @classmethod
    def fit(cls, spec: hl.FeatureSpec, probe_dir: str | None, features: dict[str, np.ndarray],
            labels: np.ndarray, regularisation: float) -> Detector:
        models = {}
        for name, x in features.items():
            scaler = StandardScaler().fit(x)
            regression = LogisticRegression(C=regularisation, class_weight="balanced", max_iter=2000)
            regression.fit(scaler.transform(x), labels)
            models[name] = {"mean": scaler.mean_.tolist(), "scale": scaler.scale_.tolist(),
                            "coef": regression.coef_[0].tolist(), "intercept": float(regression.intercept_[0])}
        return cls(spec, probe_dir, models)

    def score(self, name: str, x: np.ndarray) -> np.ndarray:
        """``[N, F] -> [N]`` probability that each token is hallucinated."""
        model = self.models[name]
        z = (x - np.asarray(model["mean"])) / np.asarray(model["scale"])
        return 1.0 / (1.0 + np.exp(-(z @ np.asarray(model["coef"]) + model["intercept"])))

    def features(self, trace: Trace, steps: np.ndarray) -> dict[str, np.ndarray]:
        probe_output = None
        if self.probe_dir is not None:
            self._probe = self._probe or load_head_predictor(self.probe_dir)
            probe_output = self._probe.predict(trace.hidden)
        return hl.token_features(trace, steps, self.spec, probe_output)

    def save(self, path: str | Path) -> None:
        write_json(path, {"format": _FORMAT, "static_heads": [list(h) for h in self.spec.static_heads],
                          "static_k": self.spec.static_k, "probe": self.probe_dir, "models": self.models})

    @classmethod
    def load(cls, path: str | Path) -> Detector:
        path = Path(path)
        data = read_json(path) if path.is_file() else None
        if not data or data.get("format") != _FORMAT:
            raise DynheadsError(f"{path} is not a dynheads detector file (written by 'dynheads detect')")
        spec = hl.FeatureSpec(tuple(tuple(h) for h in data["static_heads"]), data["static_k"])
        return cls(spec, data["probe"], data["models"])


def apply_detector(detector: Detector | str | Path, trace: Trace | str | Path,
                   answer: str | None = None) -> pd.DataFrame:
    """Score every generated token of a trace with every saved detector; label it when ``answer`` is given."""
    detector = detector if isinstance(detector, Detector) else Detector.load(detector)
    if not isinstance(trace, Trace):
        if not Path(trace).is_file():
            raise DynheadsError(f"trace file not found: {trace}")
        trace = Trace.load(trace)
    steps = np.arange(trace.num_steps)
    frame = pd.DataFrame({"step": steps, "token": trace.token_texts})
    if answer is not None:
        span = hl.find_value("".join(trace.token_texts))
        frame["label"] = hl.label_tokens(trace.token_texts, answer, span)
    features = detector.features(trace, steps)
    for name in detector.models:
        if name in features:
            frame[f"p_hallucinated.{name}"] = detector.score(name, features[name])
    return frame


def run_detect(run_dir: str | Path, config: DetectConfig, out: str | Path | None = None,
               span_finder: SpanFinder = uuid_span) -> pd.DataFrame:
    """Label, featurise, fit on the training samples, evaluate on the test samples; write everything to ``out``."""
    source = RunDir(run_dir)
    source.manifest()  # refuses a folder that is not a run
    out_run = RunDir(out if out is not None else source.path / "detect")
    if out_run.exists() and out_run.manifest().get("kind") != "detect":
        raise DynheadsError(f"{out_run.path} holds a {out_run.manifest().get('kind')} run: choose another --out")
    unknown = sorted(set(config.feature_sets) - set(hl.FEATURE_SETS))
    if unknown:
        raise DynheadsError(f"unknown feature set(s) {', '.join(unknown)}: choose from {', '.join(hl.FEATURE_SETS)}")
    samples, no_value = labelled_samples(source, span_finder)
    train_ids, test_ids = hl.split_samples([s.sample_id for s in samples], config.test_fraction, config.seed)
    train = [s for s in samples if s.sample_id in set(train_ids)]
    test = [s for s in samples if s.sample_id in set(test_ids)]
    layers, heads = samples[0].trace.shape
    if config.static:
        static = load_head_list(config.static, layers, heads).heads
        static_source = config.static
    else:
        static = hl.rank_heads_by_copy([s.trace for s in train])  # training samples only: no test leak
        static_source = "Eq. 1 frequency on the training samples"
    detector = Detector(hl.FeatureSpec(tuple(static), config.static_k), config.probe, {})

    def stack(group: list[LabelledSample]) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        per_sample = [detector.features(s.trace, s.steps) for s in group]
        names = [n for n in config.feature_sets if all(n in f for f in per_sample)]
        features = {n: np.vstack([f[n] for f in per_sample]) for n in names}
        labels = np.concatenate([s.labels for s in group])
        groups = np.concatenate([np.full(len(s.steps), i) for i, s in enumerate(group)])
        return features, labels, groups

    train_x, train_y, _ = stack(train)
    test_x, test_y, test_groups = stack(test)
    for split, y in (("training", train_y), ("test", test_y)):
        if len(np.unique(y)) < 2:
            raise DynheadsError(f"the {split} samples hold only {'hallucinated' if y[0] else 'faithful'} tokens: "
                                "use a harder setting (e.g. --distractor-depth) or more samples")
    names = [n for n in train_x if n in test_x]
    skipped = sorted(set(config.feature_sets) - set(names))
    fitted = Detector.fit(detector.spec, config.probe, {n: train_x[n] for n in names}, train_y,
                          config.regularisation)
    rows, curves = [], {}
    for name in names:
        scores = fitted.score(name, test_x[name])
        auroc, auprc = hl.auroc_auprc(test_y, scores)
        ci = hl.bootstrap_ci(test_y, scores, test_groups, resamples=config.bootstrap, seed=config.seed)
        rows.append({"feature_set": name, "features": test_x[name].shape[1], "auroc": auroc,
                     "auroc_low": ci["auroc"][0], "auroc_high": ci["auroc"][1], "auprc": auprc,
                     "auprc_low": ci["auprc"][0], "auprc_high": ci["auprc"][1],
                     "test_positive_rate": float(test_y.mean())})
        fpr, tpr = hl.roc_points(test_y, scores)
        curves[name] = (fpr, tpr, auroc)
    table = pd.DataFrame(rows)
    counts = {split: {"samples": len(group), "faithful": int((y == 0).sum()), "hallucinated": int((y == 1).sum())}
              for split, group, y in (("train", train, train_y), ("test", test, test_y))}
    if out_run.exists():  # detect recomputes everything: a rerun replaces its own outputs
        out_run.manifest_path.unlink()
    out_run.start("detect", config, None, {
        "source_run": str(source.path), "source_kind": source.manifest().get("kind"),
        "split": {"unit": "sample", "train": train_ids, "test": test_ids},
        "static_heads": {"source": static_source, "top": [list(h) for h in static[: config.static_k]]},
        "class_counts": counts, "samples_without_value": no_value, "skipped_feature_sets": skipped,
    })
    _write_labels(out_run.path / "labels.csv", train, test)
    fitted.save(out_run.path / "detector.json")
    plot_roc(curves, out_run.path / "roc.png", title=f"held-out tokens of {len(test)} samples")
    table.to_csv(out_run.path / "results.csv", index=False)
    write_json(out_run.path / "results.json", {"class_counts": counts, "results": rows, "skipped": skipped})
    write_text(out_run.path / "results.md", results_markdown(table, counts, skipped))
    return table


def _write_labels(path: Path, train: list[LabelledSample], test: list[LabelledSample]) -> None:
    rows = [{"sample_id": s.sample_id, "split": split, "step": int(step), "token": s.trace.token_texts[step],
             "label": int(label)}
            for split, group in (("train", train), ("test", test)) for s in group
            for step, label in zip(s.steps, s.labels, strict=True)]
    pd.DataFrame(rows).to_csv(path, index=False)


def results_markdown(table: pd.DataFrame, counts: dict, skipped: list[str]) -> str:
    def ci(row, metric: str) -> str:
        value, low, high = row[metric], row[f"{metric}_low"], row[f"{metric}_high"]
        return "n/a" if math.isnan(value) else f"{value:.3f} [{low:.3f}, {high:.3f}]"

    lines = ["| feature set | features | AUROC [95% CI] | AUPRC [95% CI] |", "|---|---|---|---|"]
    lines += [f"| {row['feature_set']} | {row['features']} | {ci(row, 'auroc')} | {ci(row, 'auprc')} |"
              for row in table.to_dict("records")]
    for split in ("train", "test"):
        c = counts[split]
        lines.append(f"\n{split}: {c['samples']} samples, {c['faithful']} faithful / {c['hallucinated']} "
                     "hallucinated tokens")
    if skipped:
        lines.append(f"\nskipped (not in every trace, or no probe given): {', '.join(skipped)}")
    lines.append("\npublished detectors, on other tasks and models (not comparable one to one):")
    lines += [f"- {name}: {value}" for name, value in PUBLISHED]
    return "\n".join(lines) + "\n"
