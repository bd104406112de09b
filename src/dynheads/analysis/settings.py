"""The settings of the analyses of a traced run: CCA (``CCAConfig``), the MLP head predictor
(``HeadPredictorConfig``) and the names of the hallucination detectors' feature sets.

Declared here, apart from the code that runs them, because this module imports nothing heavy (no torch, no
scikit-learn): the CLI generates ``dynheads cca`` and ``dynheads predictor train`` options from these fields at
start-up (``dynheads.cli.options``).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Literal

from dynheads.errors import DynheadsError

Activation = Literal["relu", "gelu"]
ACTIVATIONS: tuple[str, ...] = typing.get_args(Activation)
# The paper's probe on 53 questions / 2 CPU cores: best epoch 11 of 100, 590 s for all 100 epochs. After 10 epochs
# without improvement ReduceLROnPlateau (patience 3, factor 0.1) has cut the learning rate 100-1000x: little is left.
EARLY_STOPPING_PATIENCE = 10
# Hallucination detectors (dynheads.analysis.hallucination): the feature sets a deployed detector can compute, and
# those that read the needle positions (on NIAH the gold answer: an upper bound, never a headline number).
DEPLOYABLE = (
    "retrieval_no_needle",
    "context_attention",
    "probe",
    "lookback",
    "entropy",
    "max_softmax",
    "token_prob",
    "length",
)
ANSWER_KEY = ("copy_heads", "retrieval", "probe_copy_silence")
FEATURE_SETS = DEPLOYABLE + ANSWER_KEY


@dataclass(frozen=True)
class CCAConfig:
    """Settings of one temporal-offset CCA analysis (defaults: paper App. A.4 and notes/algorithms.md)."""

    hidden_variance: float = field(
        default=0.95, metadata={"help": "PCA on the hidden states keeps this fraction of their variance."}
    )
    score_variance: float = field(
        default=0.99, metadata={"help": "PCA on the min-max scaled scores keeps this fraction of their variance."}
    )
    n_components: int = field(
        default=50, metadata={"help": "Canonical components (fewer when PCA keeps fewer dimensions)."}
    )
    ridge: float = field(
        default=1e-6,
        metadata={
            "help": "Added to each covariance diagonal, relative to its mean variance, before whitening "
            "(ours: keeps near-zero PCA directions from blowing up). 0 = plain CCA."
        },
    )
    test_fraction: float = field(
        default=0.3, metadata={"help": "Share of the samples held out for the held_out and shuffled measures."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the sample split, the shuffled pairing and the bootstrap."})
    resamples: int = field(
        default=2000, metadata={"help": "Bootstrap resamples (of test samples) for the held-out minus shuffled gap."}
    )
    splits: int = field(
        default=5,
        metadata={
            "help": "Seeded sample splits (seeds seed, seed+1, ...) the held_out and shuffled measures are repeated "
            "over: the table shows their means, the gap's interval pools their bootstraps."
        },
    )

    def __post_init__(self) -> None:
        if self.splits < 1:
            raise DynheadsError(f"CCA splits must be >= 1, got {self.splits}")
        for name in ("hidden_variance", "score_variance", "test_fraction"):
            if not 0 < getattr(self, name) < 1:
                raise DynheadsError(f"CCA {name} must lie strictly between 0 and 1, got {getattr(self, name)}")
        if self.n_components < 1 or self.ridge < 0:
            raise DynheadsError("CCA n_components must be >= 1 and ridge >= 0")


@dataclass(frozen=True)
class HeadPredictorConfig:
    """MLP probe settings. Defaults: paper App. A.5; fields marked "ours" are choices the paper does not state."""

    hidden_sizes: tuple[int, ...] = field(default=(8192, 4096, 4096), metadata={"help": "Widths of the hidden layers."})
    dropout: float = field(default=0.1, metadata={"help": "Dropout after each hidden layer."})
    activation: Activation = field(default="relu", metadata={"help": "Nonlinearity after each hidden layer (ours)."})
    standardize: bool = field(
        default=True,
        metadata={
            "help": "Z-score the inputs with the training split's per-dimension mean/std, stored with the "
            "weights (ours: LLM hidden states have a few huge outlier dimensions)."
        },
    )
    lr: float = field(default=3e-4, metadata={"help": "Adam learning rate."})
    plateau_patience: int = field(
        default=3, metadata={"help": "ReduceLROnPlateau: epochs without validation-loss improvement before a cut."}
    )
    plateau_factor: float = field(
        default=0.1, metadata={"help": "ReduceLROnPlateau: factor of each learning-rate cut (ours: torch's default)."}
    )
    epochs: int = field(default=100, metadata={"help": "Training epochs."})
    batch_size: int = field(default=128, metadata={"help": "Pairs (steps) per batch."})
    grad_clip: float = field(default=1.0, metadata={"help": "Maximum gradient norm."})
    gamma_neg: float = field(default=4.0, metadata={"help": "Asymmetric Loss focusing exponent for negatives."})
    gamma_pos: float = field(default=1.0, metadata={"help": "Asymmetric Loss focusing exponent for positives."})
    asl_clip: float = field(
        default=0.05, metadata={"help": "Asymmetric Loss probability margin m: negatives with p < m cost nothing."}
    )
    asl_reduction: Literal["sum", "mean"] = field(
        default="sum",
        metadata={
            "help": "Asymmetric Loss batch reduction (ours): 'sum' as in Ridnik et al.'s code, 'mean' over "
            "heads and steps. Validation loss is always the mean."
        },
    )
    split: tuple[float, float, float] = field(
        default=(0.7, 0.2, 0.1), metadata={"help": "Train/validation/test fractions of the samples (by sample)."}
    )
    seed: int = field(
        default=0, metadata={"help": "Seed of the split, initialisation, dropout, batch order and the bootstrap."}
    )
    resamples: int = field(
        default=1000,
        metadata={"help": "Bootstrap resamples (of test samples) for the interval of probe minus baseline."},
    )
    splits: int = field(
        default=1,
        metadata={
            "help": "Seeded sample splits (seeds seed, seed+1, ...) the probe is trained and tested on (ours): the "
            "probe-minus-baseline gaps are their means, with intervals that pool each split's bootstrap, as the "
            "CCA's; the saved probe and its metric table are the first split's."
        },
    )
    early_stopping: int | None = field(
        default=EARLY_STOPPING_PATIENCE,
        metadata={
            "help": f"Stop after this many epochs without validation improvement (ours: default "
            f"{EARLY_STOPPING_PATIENCE}; 0 or None: train all epochs as the paper). The best-validation "
            "weights are kept either way."
        },
    )

    def __post_init__(self) -> None:
        if len(self.split) != 3 or min(self.split) <= 0 or abs(sum(self.split) - 1) > 1e-6:
            raise DynheadsError(f"probe split must be three positive fractions summing to 1, got {self.split}")
        if self.splits < 1:
            raise DynheadsError(f"probe splits must be >= 1, got {self.splits}")
        if self.epochs < 1 or self.batch_size < 1 or not 0 <= self.dropout < 1:
            raise DynheadsError("probe epochs and batch_size must be >= 1 and dropout in [0, 1)")
        if self.early_stopping is not None and self.early_stopping < 0:
            raise DynheadsError(f"probe early_stopping must be >= 0 epochs (0: off), got {self.early_stopping}")
        if self.activation not in ACTIVATIONS:
            raise DynheadsError(f"unknown probe activation {self.activation!r}: use one of {list(ACTIVATIONS)}")
