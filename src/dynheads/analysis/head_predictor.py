"""The head predictor (the paper's "MLP probe"): an MLP from the final hidden state to every head's score at the
same step (paper Sec. 3.3, App. A.5). It is a different thing from the attention probe (``dynheads.engine.probe``),
which measures the scores; files and metric names keep the paper's word "probe".

Binary targets (Eq. 1, NIAH) train with the Asymmetric Loss and report F1 / precision / recall at the threshold
that maximises F1 on the validation PR curve, plus AUPRC, on the test split. Continuous targets (Eq. 2,
HotpotQA) train with MSE and report MSE, MAE and R². Metrics are micro: flattened over heads and steps (R² is
also given over heads, each weighted by its variance: the headline; and as their plain mean). Beside each probe,
a frequency baseline that ignores the hidden state: every head's training-set activation rate (binary) or mean
score (continuous), evaluated the same way.

Samples are split 70/20/10 by sample, never by step: steps of one answer are strongly correlated.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from sklearn.metrics import (
    average_precision_score,
    f1_score,
    mean_absolute_error,
    mean_squared_error,
    precision_recall_curve,
    precision_score,
    r2_score,
    recall_score,
)
from torch import nn
from tqdm.auto import tqdm

from dynheads.analysis.cca import Sample, check_samples, nonempty_samples
from dynheads.analysis.evidence import EvidenceSettings, Interval, interval, pooled_interval
from dynheads.analysis.predictor_baselines import (
    step_index_baseline,
    step_index_profile,
    weighted_average_precision,
    within_step_ranking,
)
from dynheads.analysis.settings import HeadPredictorConfig
from dynheads.errors import DynheadsError
from dynheads.heads import Head
from dynheads.io import atomic_path, read_json, write_json

Task = Literal["binary", "continuous"]
_FORMAT = "dynheads-probe/1"
_ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


VARYING_STD = 1e-3  # a head whose test scores vary less has no usable R² (Eq. 2 scores are shares in [0, 1])


class HeadPredictorNet(nn.Module):
    """``hidden [N, D] -> [N, L*H]``: one logit (binary) or value (continuous) per head, layer-major."""

    mean: torch.Tensor  # buffers (registered in __init__)
    scale: torch.Tensor

    def __init__(self, input_dim: int, output_dim: int, config: HeadPredictorConfig) -> None:
        super().__init__()
        # Input standardisation lives in buffers so that the state_dict alone reproduces predictions.
        self.register_buffer("mean", torch.zeros(input_dim))
        self.register_buffer("scale", torch.ones(input_dim))
        layers: list[nn.Module] = []
        width = input_dim
        for size in config.hidden_sizes:
            layers += [nn.Linear(width, size), _ACTIVATIONS[config.activation](), nn.Dropout(config.dropout)]
            width = size
        layers.append(nn.Linear(width, output_dim))
        self.layers = nn.Sequential(*layers)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.layers((hidden - self.mean) / self.scale)


def asymmetric_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    gamma_neg: float = 4.0,
    gamma_pos: float = 1.0,
    clip: float = 0.05,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Element-wise Asymmetric Loss (Ridnik et al. 2021, Eq. 4 with the shifted probability of Eq. 6).

    With ``p = sigmoid(logit)`` and ``p_m = max(p - clip, 0)``:
    positives ``-(1 - p)^gamma_pos * log(p)``, negatives ``-p_m^gamma_neg * log(1 - p_m)``. ``eps`` guards the
    logs as in the authors' code. Gradients flow through the focusing weights (the published formula).
    Shapes: ``logits``, ``targets`` and the result are ``[N, W]``.
    """
    p = torch.sigmoid(logits)
    p_m = (p - clip).clamp(min=0) if clip > 0 else p
    positive = (1 - p) ** gamma_pos * torch.log(p.clamp(min=eps))
    negative = p_m**gamma_neg * torch.log((1 - p_m).clamp(min=eps))
    return -(targets * positive + (1 - targets) * negative)


@dataclass
class TrainedHeadPredictor:
    """A trained probe, ready to score hidden states (in eval mode, on its own device)."""

    network: HeadPredictorNet
    task: Task
    threshold: float | None  # binary: decision threshold on probabilities; continuous: None
    num_layers: int
    num_heads: int

    def predict(self, hidden: np.ndarray | torch.Tensor) -> np.ndarray:
        """``hidden [N, D] -> [N, L*H]`` float32: probabilities (binary) or predicted scores (continuous)."""
        device = self.network.mean.device
        x = torch.as_tensor(hidden)
        if x.ndim != 2 or x.shape[1] != self.network.mean.shape[0]:
            raise DynheadsError(f"probe expects hidden states [N, {self.network.mean.shape[0]}], got {tuple(x.shape)}")
        self.network.eval()
        with torch.no_grad():
            out = torch.cat([self.network(chunk.to(device, torch.float32)) for chunk in x.split(4096)])
        return (torch.sigmoid(out) if self.task == "binary" else out).cpu().numpy()

    def top_heads(self, hidden: np.ndarray | torch.Tensor, k: int) -> list[Head]:
        """The ``k`` heads with the highest predicted score for one hidden state ``[D]``, best first."""
        total = self.num_layers * self.num_heads
        if not 1 <= k <= total:
            raise DynheadsError(f"top_heads k must lie in 1..{total}, got {k}")
        if hidden.ndim != 1:
            raise DynheadsError(f"top_heads takes one hidden state [D], got shape {tuple(hidden.shape)}")
        scores = self.predict(hidden[None])[0]
        order = np.argsort(-scores, kind="stable")[:k]  # stable: ties stay in layer-major order
        return [(int(i // self.num_heads), int(i % self.num_heads)) for i in order]


@dataclass
class HeadPredictorResult:
    """A trained probe with the metrics of its test split and its training history."""

    probe: TrainedHeadPredictor
    config: HeadPredictorConfig
    metrics: dict[str, Any]  # "probe" and "baseline" test metrics, thresholds, split sizes, best epoch
    history: list[dict[str, float]]  # per epoch: train_loss, val_loss (both per element), lr

    def save(self, out_dir: str | Path) -> Path:
        """Write ``weights.pt`` (a ``state_dict``, loadable with ``weights_only=True``) and ``probe.json``."""
        out_dir = Path(out_dir)
        state = {name: tensor.detach().cpu() for name, tensor in self.probe.network.state_dict().items()}
        with atomic_path(out_dir / "weights.pt") as tmp:
            torch.save(state, tmp)
        write_json(
            out_dir / "probe.json",
            {
                "format": _FORMAT,
                "task": self.probe.task,
                "threshold": self.probe.threshold,
                "num_layers": self.probe.num_layers,
                "num_heads": self.probe.num_heads,
                "input_dim": int(self.probe.network.mean.shape[0]),
                "config": asdict(self.config),
                "metrics": self.metrics,
                "history": self.history,
            },
        )
        return out_dir


def load_head_predictor(probe_dir: str | Path, device: str | torch.device = "cpu") -> TrainedHeadPredictor:
    """Read a probe written by ``HeadPredictorResult.save``."""
    probe_dir = Path(probe_dir)
    if not (probe_dir / "probe.json").is_file() or not (probe_dir / "weights.pt").is_file():
        raise DynheadsError(f"no probe in {probe_dir}: expected probe.json and weights.pt")
    meta = read_json(probe_dir / "probe.json")
    if meta.get("format") != _FORMAT:
        raise DynheadsError(f"{probe_dir / 'probe.json'} is not a {_FORMAT} file")
    try:
        config = HeadPredictorConfig(**{name: _from_json(value) for name, value in meta["config"].items()})
    except TypeError as error:
        raise DynheadsError(f"{probe_dir / 'probe.json'} has an unreadable probe config: {error}") from None
    network = HeadPredictorNet(meta["input_dim"], meta["num_layers"] * meta["num_heads"], config)
    network.load_state_dict(torch.load(probe_dir / "weights.pt", map_location="cpu", weights_only=True))
    return TrainedHeadPredictor(
        network.to(device).eval(), meta["task"], meta["threshold"], meta["num_layers"], meta["num_heads"]
    )


def _from_json(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value  # JSON arrays back to the config's tuples


def split_by_sample(
    num_samples: int, fractions: tuple[float, float, float], seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded (train, validation, test) sample indices; validation and test get at least one sample each."""
    num_val = max(round(fractions[1] * num_samples), 1)
    num_test = max(round(fractions[2] * num_samples), 1)
    if num_samples - num_val - num_test < 1:
        raise DynheadsError(
            f"the probe needs at least 3 samples for its train/validation/test split, got {num_samples}"
        )
    perm = np.random.default_rng(seed).permutation(num_samples)
    return np.sort(perm[num_val + num_test :]), np.sort(perm[:num_val]), np.sort(perm[num_val : num_val + num_test])


def train_head_predictor(
    samples: list[Sample],
    config: HeadPredictorConfig | None = None,
    *,
    task: Task,
    shape: tuple[int, int],
    progress: bool = True,
    device: str | torch.device = "cpu",
) -> HeadPredictorResult:
    """Train a probe on ``(hidden [T, D], scores [T, L*H])`` samples; ``shape`` = (layers, heads) of the model.

    Keeps the weights of the epoch with the lowest validation loss. Deterministic for ``config.seed`` on CPU;
    torch's RNG is seeded inside a fork, so the caller's CPU RNG is untouched. With ``config.splits`` > 1 it is
    trained again on the splits of seeds seed+1, ... and the gaps pool them (``gap_interval``); the returned probe,
    its metric table and history are the first split's.
    """
    config = config or HeadPredictorConfig()
    fits = [
        fit_head_predictor(
            samples, replace(config, seed=config.seed + split), task=task, shape=shape, progress=progress, device=device
        )
        for split in range(config.splits)
    ]
    fitted = fits[0]
    metrics = _evaluate(fits, EvidenceSettings(resamples=config.resamples, seed=config.seed))
    fitted.probe.threshold = metrics.get("threshold")
    metrics.update(best_epoch=fitted.best_epoch, split_pairs={name: len(x) for name, (x, _) in fitted.splits.items()})
    return HeadPredictorResult(fitted.probe, config, metrics, fitted.history)


@dataclass
class FittedHeadPredictor:
    """A probe fitted on the train split (best validation epoch), before its test metrics: the splits' pairs and
    the steps of each of their samples (split order)."""

    probe: TrainedHeadPredictor
    splits: dict[str, tuple[torch.Tensor, torch.Tensor]]
    steps: dict[str, list[int]]
    history: list[dict[str, float]]
    best_epoch: int

    def test_view(self) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """(targets, predicted scores, each test sample's rows) of the test split."""
        return self.splits["test"][1].numpy(), self.probe.predict(self.splits["test"][0]), _rows(self.steps["test"])

    def frequency_profile(self) -> np.ndarray:
        """Each head's training-split rate (binary) or mean score (continuous): the static profile."""
        return self.splits["train"][1].numpy().mean(0)

    def step_index_baseline(self) -> np.ndarray:
        """The step-index profile's predictions for the test rows (``predictor_baselines``)."""
        profile = step_index_profile(self.splits["train"][1].numpy(), self.steps["train"])
        return step_index_baseline(profile, self.frequency_profile(), self.steps["test"])

    def ranking_statistic(self) -> GapStatistic:
        """Claim 1's within-step ranking: per test sample, the probe's ranking of each step's heads minus the
        frequency profile's (``predictor_baselines.within_step_ranking``); samples without a dynamic head left out."""
        targets, predicted, rows = self.test_view()
        prior = np.broadcast_to(self.frequency_profile(), targets.shape)
        gaps = within_step_ranking(targets, predicted, rows) - within_step_ranking(targets, prior, rows)
        defined = gaps[~np.isnan(gaps)]
        return len(defined), lambda idx: float(defined[idx].mean())

    def frequency_statistic(self) -> GapStatistic:
        """The probe's headline metric (AUPRC, or R²) minus the frequency profile's over test samples (no position
        control: a probe that knows only *when* heads fire beats it)."""
        targets, predicted, rows = self.test_view()
        baseline = np.broadcast_to(self.frequency_profile(), targets.shape)
        return len(rows), _metric_statistic(targets, predicted, (baseline,), rows, self.probe.task)

    def position_statistic(self) -> GapStatistic:
        """Claim 3's predictor half: the probe's headline metric (AUPRC, or R² for continuous scores) minus the
        better of the frequency profile's and the step-index profile's on the same resampled test samples. The
        better of the two: the step-index profile knows the step's position in the answer, but from a few samples
        per index it is noisier than the whole-split profile where position carries nothing."""
        targets, predicted, rows = self.test_view()
        frequency = np.broadcast_to(self.frequency_profile(), targets.shape)
        baselines = (frequency, self.step_index_baseline())
        return len(rows), _metric_statistic(targets, predicted, baselines, rows, self.probe.task)

    def mse_statistic(self) -> GapStatistic:
        """The frequency profile's MSE minus the probe's over test samples (continuous scores)."""
        targets, predicted, rows = self.test_view()
        baseline = np.broadcast_to(self.frequency_profile(), targets.shape)
        return len(rows), _score_statistic(targets, predicted, (baseline,), rows, _negative_mse)

    def ranking_gap(self, evidence: EvidenceSettings) -> Interval:
        return gap_interval([self.ranking_statistic()], evidence)

    def frequency_gap(self, evidence: EvidenceSettings) -> Interval:
        return gap_interval([self.frequency_statistic()], evidence)

    def position_gap(self, evidence: EvidenceSettings) -> Interval:
        return gap_interval([self.position_statistic()], evidence)


GapStatistic = tuple[int, Callable[[np.ndarray], float]]  # test samples, statistic of resampled sample indices


def gap_interval(parts: list[GapStatistic], evidence: EvidenceSettings) -> Interval:
    """A gap measured on one split (its bootstrap interval) or on several seeded splits (the mean of their effects,
    the interval pooling their bootstraps: ``evidence.pooled_interval``, as the CCA's)."""
    if len(parts) == 1:
        return interval(*parts[0], evidence)
    return pooled_interval(parts, evidence)


def fit_head_predictor(
    samples: list[Sample],
    config: HeadPredictorConfig,
    *,
    task: Task,
    shape: tuple[int, int],
    progress: bool = True,
    device: str | torch.device = "cpu",
) -> FittedHeadPredictor:
    """The training half of ``train_head_predictor``: split by sample, standardise, fit (no test metrics)."""
    samples = nonempty_samples(samples)  # an empty trace (EOS first) holds no pair
    input_dim, width = check_samples(samples)
    if shape[0] * shape[1] != width:
        raise DynheadsError(f"scores have {width} columns but shape {shape} has {shape[0] * shape[1]} heads")
    indices = dict(zip(("train", "val", "test"), split_by_sample(len(samples), config.split, config.seed), strict=True))
    splits = {name: _stack(samples, idx) for name, idx in indices.items()}
    _check_targets(splits, task)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        network = HeadPredictorNet(input_dim, width, config)
        if config.standardize:
            x = splits["train"][0]
            std = x.std(0)
            network.mean.copy_(x.mean(0))
            network.scale.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))  # constant dims pass through
        history, best_epoch = _fit(network.to(device), splits, config, task, progress)
    steps = {name: [len(samples[i][0]) for i in idx] for name, idx in indices.items()}
    return FittedHeadPredictor(
        TrainedHeadPredictor(network.eval(), task, None, *shape), splits, steps, history, best_epoch
    )


def _rows(steps: list[int]) -> list[np.ndarray]:
    """Each sample's row indices in a split stacked in order, from its samples' step counts."""
    bounds = np.cumsum([0, *steps])
    return [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _stack(samples: list[Sample], idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs of the chosen samples: ``(hidden [N, D], scores [N, W])`` float32."""
    hidden = np.concatenate([samples[i][0] for i in idx]).astype(np.float32)
    scores = np.concatenate([samples[i][1] for i in idx]).astype(np.float32)
    return torch.from_numpy(hidden), torch.from_numpy(scores)


def _check_targets(splits: dict[str, tuple[torch.Tensor, torch.Tensor]], task: Task) -> None:
    if task not in ("binary", "continuous"):
        raise DynheadsError(f"probe task must be 'binary' or 'continuous', got {task!r}")
    for name, (x, y) in splits.items():
        if len(x) == 0:
            raise DynheadsError(f"the probe's {name} split has no steps: give samples with generated tokens")
        if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
            raise DynheadsError(f"the probe's {name} split has non-finite hidden states or scores")
        if task == "binary" and not ((y == 0) | (y == 1)).all():
            raise DynheadsError("binary probe targets must be 0/1 (Eq. 1 copy scores); use task='continuous'")
        if task == "binary" and not y.any():
            raise DynheadsError(f"the probe's {name} split has no positive targets: use more samples")


def _fit(
    network: HeadPredictorNet,
    splits: dict[str, tuple[torch.Tensor, torch.Tensor]],
    config: HeadPredictorConfig,
    task: Task,
    progress: bool,
) -> tuple[list[dict[str, float]], int]:
    """Train in place; load the best-validation weights at the end. Returns (history, best epoch)."""
    device = network.mean.device
    x, y = splits["train"]
    optimizer = torch.optim.Adam(network.parameters(), lr=config.lr)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, factor=config.plateau_factor, patience=config.plateau_patience
    )
    generator = torch.Generator().manual_seed(config.seed)  # batch order independent of the model's RNG use
    history: list[dict[str, float]] = []
    best_loss, best_epoch, best_state = float("inf"), -1, None
    bar = tqdm(range(config.epochs), desc="probe", unit="epoch", disable=not progress)
    for epoch in bar:
        network.train()
        total = 0.0
        for batch in torch.randperm(len(x), generator=generator).split(config.batch_size):
            elementwise = _elementwise_loss(network(x[batch].to(device)), y[batch].to(device), task, config)
            loss = elementwise.sum() if task == "binary" and config.asl_reduction == "sum" else elementwise.mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(network.parameters(), config.grad_clip)
            optimizer.step()
            total += elementwise.detach().sum().item()
        val_loss = _validation_loss(network, splits["val"], task, config)
        scheduler.step(val_loss)
        history.append(
            {
                "epoch": epoch,
                "train_loss": total / y.numel(),
                "val_loss": val_loss,
                "lr": optimizer.param_groups[0]["lr"],
            }
        )
        bar.set_postfix(val_loss=f"{val_loss:.4g}")
        if val_loss < best_loss:
            best_loss, best_epoch, best_state = val_loss, epoch, copy.deepcopy(network.state_dict())
        elif config.early_stopping and epoch - best_epoch >= config.early_stopping:
            break
    if best_state is None:
        raise DynheadsError("the probe's validation loss was never finite: lower lr or check the inputs")
    network.load_state_dict(best_state)
    return history, best_epoch


def _elementwise_loss(out: torch.Tensor, target: torch.Tensor, task: Task, config: HeadPredictorConfig) -> torch.Tensor:
    if task == "binary":
        return asymmetric_loss(
            out, target, gamma_neg=config.gamma_neg, gamma_pos=config.gamma_pos, clip=config.asl_clip
        )
    return (out - target) ** 2


def _validation_loss(
    network: HeadPredictorNet, split: tuple[torch.Tensor, torch.Tensor], task: Task, config: HeadPredictorConfig
) -> float:
    network.eval()
    device = network.mean.device
    total = 0.0
    with torch.no_grad():
        for x, y in zip(split[0].split(4096), split[1].split(4096), strict=True):
            total += _elementwise_loss(network(x.to(device)), y.to(device), task, config).sum().item()
    return total / split[1].numel()


def _evaluate(fits: list[FittedHeadPredictor], evidence: EvidenceSettings) -> dict[str, Any]:
    """Test metrics of the first split's probe and of the frequency baseline (binary: with both validation
    thresholds), and three gaps over the test *samples* of every split (``gap_interval``): ``gap``, probe minus the
    frequency profile on the headline metric (AUPRC, or R²); ``position_gap``, probe minus the better of that and
    the step-index profile (Claim 3); ``step_gap``, the within-step ranking of heads, probe minus the frequency
    profile (Claim 1)."""
    fitted = fits[0]
    y_test, test_pred, rows = fitted.test_view()
    prior, by_step = fitted.frequency_profile(), fitted.step_index_baseline()
    baseline = np.broadcast_to(prior, y_test.shape)
    headline, splits = _HEADLINE[fitted.probe.task], {"splits": len(fits)}
    gaps = {
        "gap": {"metric": headline, **gap_interval([f.frequency_statistic() for f in fits], evidence).to_dict()},
        "position_gap": {
            "metric": headline,
            **gap_interval([f.position_statistic() for f in fits], evidence).to_dict(),
        },
        "step_gap": {
            "metric": "within-step ranking",
            **gap_interval([f.ranking_statistic() for f in fits], evidence).to_dict(),
        },
    }
    gaps = {name: {**gap, **splits} for name, gap in gaps.items()} if len(fits) > 1 else gaps
    if fitted.probe.task == "continuous":
        mse = gap_interval([f.mse_statistic() for f in fits], evidence).to_dict()
        return {
            "probe": regression_metrics(y_test, test_pred),
            "baseline": regression_metrics(y_test, baseline),
            "step_index_baseline": regression_metrics(y_test, by_step),
            **gaps,
            "mse_gap": {"metric": "baseline mse - probe mse", **mse},
        }
    y_val, val_pred = fitted.splits["val"][1].numpy(), fitted.probe.predict(fitted.splits["val"][0])
    threshold = best_f1_threshold(y_val, val_pred)
    baseline_threshold = best_f1_threshold(y_val, np.broadcast_to(prior, y_val.shape))
    return {
        "probe": _binary_metrics(y_test, test_pred, threshold),
        "baseline": _binary_metrics(y_test, baseline, baseline_threshold),
        "step_index_baseline": _binary_metrics(y_test, by_step, baseline_threshold),
        "threshold": threshold,
        "baseline_threshold": baseline_threshold,
        **gaps,
    }


_HEADLINE = {"binary": "auprc", "continuous": "r2"}


def _metric_statistic(
    targets: np.ndarray, predicted: np.ndarray, baselines: tuple[np.ndarray, ...], rows: list[np.ndarray], task: Task
) -> Callable[[np.ndarray], float]:
    """The headline metric (AUPRC, or R²) of the probe minus the best of the baselines' on resampled test samples
    (each resample picks the baseline that scores best on it)."""
    if task == "continuous":
        return _score_statistic(targets, predicted, baselines, rows, _r2)
    probe_auprc = ResampledAuprc(targets, predicted, rows)
    baseline_auprcs = [ResampledAuprc(targets, baseline, rows) for baseline in baselines]
    return lambda idx: probe_auprc(idx) - max(b(idx) for b in baseline_auprcs)


def _score_statistic(
    targets: np.ndarray,
    predicted: np.ndarray,
    baselines: tuple[np.ndarray, ...],
    rows: list[np.ndarray],
    metric: Callable[[np.ndarray, np.ndarray], float],
) -> Callable[[np.ndarray], float]:
    """``metric`` of the probe minus the best baseline's on resampled test samples (``rows``: each one's rows)."""

    def statistic(idx: np.ndarray) -> float:
        chosen = np.concatenate([rows[i] for i in idx])
        best = max(metric(targets[chosen], baseline[chosen]) for baseline in baselines)
        return metric(targets[chosen], predicted[chosen]) - best

    return statistic


def best_f1_threshold(targets: np.ndarray, probs: np.ndarray) -> float:
    """Threshold maximising F1 on the PR curve of ``targets``/``probs`` ``[N, W]``, flattened over heads."""
    precision, recall, thresholds = precision_recall_curve(targets.ravel(), probs.ravel())
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-12)
    return float(thresholds[np.argmax(f1[:-1])])  # the curve's last point (recall 0) has no threshold


def _binary_metrics(targets: np.ndarray, probs: np.ndarray, threshold: float) -> dict[str, float]:
    y, predicted = targets.ravel().astype(bool), probs.ravel() >= threshold
    return {
        "f1": float(f1_score(y, predicted, zero_division=0)),
        "precision": float(precision_score(y, predicted, zero_division=0)),
        "recall": float(recall_score(y, predicted, zero_division=0)),
        "auprc": float(average_precision_score(y, probs.ravel())),
        "positive_rate": float(y.mean()),
    }


def regression_metrics(targets: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """MSE, MAE flattened; ``r2`` = R² over the heads that vary in the test split, each weighted by its variance
    (1 - their summed squared error / their summed variance); ``r2_uniform`` = the plain mean of their per-head
    R²; ``r2_flat`` flattened.

    ``r2_flat`` credits the probe for the differences between head means (a per-head mean already scores
    well on it); ``r2`` does not, which is why it is the headline number. It weighs each head by its variance
    because the uniform mean divides each head's error by that head's own variance: a head that barely varies
    turns a tiny error into a huge R² (a baseline's -360 made a "probe - baseline R²" of 366 on a real run).
    A head "varies" when its test standard deviation exceeds ``VARYING_STD``; with no varying head ``r2`` is
    undefined (NaN), never a huge negative number; so is ``r2_flat`` when the flattened targets vary no more.
    MSE, in the scores' own units, cannot blow up: it is given beside R² (and ``mse_gap`` beside the R² gap).
    """
    varying = targets.std(0) > VARYING_STD
    return {
        "mse": float(mean_squared_error(targets.ravel(), predicted.ravel())),
        "mae": float(mean_absolute_error(targets.ravel(), predicted.ravel())),
        "r2": _r2(targets, predicted),
        "r2_uniform": (float(r2_score(targets[:, varying], predicted[:, varying])) if varying.any() else float("nan")),
        "r2_flat": (
            float(r2_score(targets.ravel(), predicted.ravel())) if targets.std() > VARYING_STD else float("nan")
        ),
        "heads_scored_r2": int(varying.sum()),
    }


def _r2(targets: np.ndarray, predicted: np.ndarray) -> float:
    """Variance-weighted R² over the heads that vary (NaN when none does)."""
    varying = targets.std(0) > VARYING_STD
    if not varying.any():
        return float("nan")
    return float(r2_score(targets[:, varying], predicted[:, varying], multioutput="variance_weighted"))


def _negative_mse(targets: np.ndarray, predicted: np.ndarray) -> float:
    """-MSE flattened, so that probe minus baseline is the baseline's MSE minus the probe's (higher is better)."""
    return -float(mean_squared_error(targets.ravel(), predicted.ravel()))


class ResampledAuprc:
    """AUPRC flattened over heads of a bootstrap resample of samples (blocks of rows of ``targets`` / ``scores``
    ``[N, W]``), NaN when the resample holds no positive; sorted once, not once per resample.

    Elements of one score and one target form a group (the frequency baseline's score is one per head: a few
    hundred groups for 10^5 elements); a resample weighs each group by its elements' draws (sklearn's
    ``sample_weight``). That is exactly the AUPRC of the drawn rows concatenated: the curve's counts at each
    distinct score are the same integers, so its points and its sum are too (tests/test_head_predictor.py)."""

    def __init__(self, targets: np.ndarray, scores: np.ndarray, rows: list[np.ndarray]):
        sample_of_row = np.empty(len(targets), dtype=np.intp)
        for sample, sample_rows in enumerate(rows):
            sample_of_row[sample_rows] = sample
        flat_scores, flat_targets = scores.ravel(), targets.ravel().astype(bool)
        order = np.lexsort((flat_targets, flat_scores))  # by score, then target
        flat_scores, flat_targets = flat_scores[order], flat_targets[order]
        new_group = np.r_[True, (np.diff(flat_scores) != 0) | (np.diff(flat_targets) != 0)]
        self.group_of = np.empty(len(order), dtype=np.intp)
        self.group_of[order] = np.cumsum(new_group) - 1
        self.scores, self.targets = flat_scores[new_group], flat_targets[new_group]
        self.sample_of = np.repeat(sample_of_row, targets.shape[1])
        self.samples = len(rows)

    def __call__(self, idx: np.ndarray) -> float:
        draws = np.bincount(idx, minlength=self.samples)[self.sample_of]
        weight = np.bincount(self.group_of, weights=draws, minlength=len(self.scores))
        drawn = weight > 0
        positives = weight[drawn] * self.targets[drawn]
        if not positives.any():
            return float("nan")
        return weighted_average_precision(self.scores[drawn], positives, weight[drawn] - positives)
