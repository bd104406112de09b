"""MLP probe: Asymmetric Loss by hand, learnable targets, determinism, save/load, bad input."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from dynheads.analysis.head_predictor import (
    HeadPredictorConfig,
    ResampledAuprc,
    asymmetric_loss,
    best_f1_threshold,
    load_head_predictor,
    regression_metrics,
    split_by_sample,
    train_head_predictor,
)
from dynheads.errors import DynheadsError

SHAPE = (2, 3)  # 2 layers x 3 heads = 6 outputs
SMALL = HeadPredictorConfig(hidden_sizes=(32,), epochs=30, batch_size=64, lr=3e-3)
WEIGHTS = np.random.default_rng(42).normal(size=(8, 6))


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny MLPs gain nothing from threads; on a busy shared CPU, thread sync made each test 30x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def binary_samples(num_samples: int = 40, steps: int = 20, seed: int = 0) -> list:
    """Head j fires when the j-th linear read-out of the hidden state exceeds 1.5 (about 25 % positives)."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(num_samples):
        hidden = rng.normal(size=(steps, 8)).astype(np.float32)
        samples.append((hidden, hidden @ WEIGHTS > 1.5))
    return samples


def continuous_samples(num_samples: int = 40, steps: int = 20, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(num_samples):
        hidden = rng.normal(size=(steps, 8)).astype(np.float32)
        samples.append((hidden, 0.1 * hidden @ WEIGHTS + 0.05 * rng.normal(size=(steps, 6))))
    return samples


def test_asymmetric_loss_matches_hand_computed_values():
    # logit 0 -> p = 0.5.  Positive: -(1 - 0.5)^1 * ln(0.5).  Negative: p_m = 0.45, -(0.45)^4 * ln(0.55).
    # logit ln(0.03/0.97) -> p = 0.03 < clip: p_m = 0, the negative costs nothing.
    # logit 2 -> p = 0.880797: positive -(0.119203)^1 * ln(0.880797); negative p_m = 0.830797,
    # -(0.830797)^4 * ln(0.169203).
    p2 = 1 / (1 + math.exp(-2))
    logits = torch.tensor([[0.0, 0.0, math.log(0.03 / 0.97), 2.0, 2.0]])
    targets = torch.tensor([[1.0, 0.0, 0.0, 1.0, 0.0]])
    expected = [
        0.5 * math.log(2),
        -(0.45**4) * math.log(0.55),
        0.0,
        -(1 - p2) * math.log(p2),
        -((p2 - 0.05) ** 4) * math.log(1 - (p2 - 0.05)),
    ]
    assert expected[0] == pytest.approx(0.346574, abs=1e-6) and expected[1] == pytest.approx(0.024515, abs=1e-6)
    loss = asymmetric_loss(logits.double(), targets.double())
    np.testing.assert_allclose(loss[0].numpy(), expected, rtol=1e-10, atol=1e-12)


def test_asymmetric_loss_without_focusing_is_binary_cross_entropy():
    logits, targets = torch.randn(4, 5, dtype=torch.float64), (torch.rand(4, 5) > 0.5).double()
    plain = asymmetric_loss(logits, targets, gamma_neg=0, gamma_pos=0, clip=0)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    torch.testing.assert_close(plain, bce)


def test_binary_probe_learns_a_known_function_and_beats_the_baseline():
    result = train_head_predictor(binary_samples(), SMALL, task="binary", shape=SHAPE, progress=False)
    probe, baseline = result.metrics["probe"], result.metrics["baseline"]
    assert probe["f1"] > 0.9 and probe["auprc"] > 0.95
    assert baseline["auprc"] < 0.4 and baseline["f1"] < 0.5
    assert 0 < result.probe.threshold < 1
    assert result.metrics["split_pairs"] == {"train": 28 * 20, "val": 8 * 20, "test": 4 * 20}
    assert len(result.history) == SMALL.epochs


def test_training_is_deterministic_for_a_seed():
    samples = binary_samples(20, 10)
    config = HeadPredictorConfig(hidden_sizes=(16,), epochs=5, batch_size=32, lr=3e-3)
    first, second = (
        train_head_predictor(samples, config, task="binary", shape=SHAPE, progress=False) for _ in range(2)
    )
    assert first.metrics == second.metrics and first.history == second.history
    for name, tensor in first.probe.network.state_dict().items():
        assert torch.equal(tensor, second.probe.network.state_dict()[name])
    other = train_head_predictor(
        samples,
        HeadPredictorConfig(hidden_sizes=(16,), epochs=5, batch_size=32, lr=3e-3, seed=1),
        task="binary",
        shape=SHAPE,
        progress=False,
    )
    assert other.history != first.history


def test_regressor_fits_a_linear_target():
    result = train_head_predictor(continuous_samples(), SMALL, task="continuous", shape=SHAPE, progress=False)
    probe, baseline = result.metrics["probe"], result.metrics["baseline"]
    assert probe["r2"] > 0.85 and probe["mse"] < baseline["mse"] / 5
    assert abs(baseline["r2"]) < 0.1  # the per-head training mean explains nothing of the per-step variation
    assert result.probe.threshold is None


def test_early_stopping_and_best_weights():
    config = HeadPredictorConfig(hidden_sizes=(16,), epochs=200, batch_size=64, lr=3e-2, early_stopping=2)
    result = train_head_predictor(binary_samples(20, 10), config, task="binary", shape=SHAPE, progress=False)
    best = result.metrics["best_epoch"]
    assert len(result.history) == best + 3 < 200
    assert result.history[best]["val_loss"] == min(h["val_loss"] for h in result.history)


def test_early_stopping_is_on_by_default_and_0_turns_it_off():
    assert HeadPredictorConfig().early_stopping == 10
    config = HeadPredictorConfig(hidden_sizes=(16,), epochs=60, batch_size=64, lr=3e-2)
    stopped = train_head_predictor(binary_samples(20, 10), config, task="binary", shape=SHAPE, progress=False)
    assert len(stopped.history) == stopped.metrics["best_epoch"] + 11 < 60
    full = train_head_predictor(
        binary_samples(20, 10), replace(config, early_stopping=0), task="binary", shape=SHAPE, progress=False
    )
    assert len(full.history) == 60
    with pytest.raises(DynheadsError, match="early_stopping must be >= 0"):
        HeadPredictorConfig(early_stopping=-1)


def test_save_load_round_trip(tmp_path):
    samples = binary_samples(20, 10)
    result = train_head_predictor(
        samples, HeadPredictorConfig(hidden_sizes=(16, 8), epochs=3), task="binary", shape=SHAPE, progress=False
    )
    result.save(tmp_path / "probe")
    loaded = load_head_predictor(tmp_path / "probe")
    hidden = np.concatenate([h for h, _ in samples])
    np.testing.assert_array_equal(loaded.predict(hidden), result.probe.predict(hidden))
    assert loaded.threshold == result.probe.threshold and (loaded.num_layers, loaded.num_heads) == SHAPE
    torch.load(tmp_path / "probe" / "weights.pt", weights_only=True)  # plain tensors only


def test_top_heads_ranks_layer_major():
    result = train_head_predictor(
        binary_samples(20, 10),
        HeadPredictorConfig(hidden_sizes=(16,), epochs=3),
        task="binary",
        shape=SHAPE,
        progress=False,
    )
    hidden = binary_samples(1, 1, seed=9)[0][0][0]
    scores = result.probe.predict(hidden[None])[0]
    heads = result.probe.top_heads(hidden, 4)
    assert [scores[layer * 3 + head] for layer, head in heads] == sorted(scores, reverse=True)[:4]
    with pytest.raises(DynheadsError, match="1..6"):
        result.probe.top_heads(hidden, 7)


def test_best_f1_threshold():
    targets = np.array([[0, 0, 1, 1]])
    probs = np.array([[0.1, 0.4, 0.35, 0.8]])
    assert best_f1_threshold(targets, probs) == pytest.approx(0.35)  # F1 0.8 beats 0.667 at 0.8


def test_bad_input_is_refused(tmp_path):
    samples = binary_samples(10, 5)
    with pytest.raises(DynheadsError, match="at least 3 samples"):
        split_by_sample(2, (0.7, 0.2, 0.1), seed=0)
    with pytest.raises(DynheadsError, match="no positive targets"):
        train_head_predictor(
            [(h, np.zeros_like(y)) for h, y in samples], SMALL, task="binary", shape=SHAPE, progress=False
        )
    with pytest.raises(DynheadsError, match="0/1"):
        train_head_predictor(continuous_samples(10, 5), SMALL, task="binary", shape=SHAPE, progress=False)
    with pytest.raises(DynheadsError, match="shape"):
        train_head_predictor(samples, SMALL, task="binary", shape=(2, 2), progress=False)
    with pytest.raises(DynheadsError, match="same T"):
        train_head_predictor([(h[:3], y) for h, y in samples], SMALL, task="binary", shape=SHAPE, progress=False)
    with pytest.raises(DynheadsError, match="summing to 1"):
        HeadPredictorConfig(split=(0.5, 0.2, 0.1))
    with pytest.raises(DynheadsError, match="no probe"):
        load_head_predictor(tmp_path)


def test_r2_on_near_constant_targets_is_undefined_not_huge():
    """A target that varies by 1e-9 gave R² of -1e16 on a real run: no varying head means R² is undefined."""
    rng = np.random.default_rng(0)
    samples = [
        (rng.normal(size=(12, 8)).astype(np.float32), 0.2 + 1e-9 * rng.normal(size=(12, SHAPE[0] * SHAPE[1])))
        for _ in range(20)
    ]
    result = train_head_predictor(samples, SMALL, task="continuous", shape=SHAPE, progress=False)
    assert math.isnan(result.metrics["probe"]["r2"]) and math.isnan(result.metrics["baseline"]["r2"])
    assert result.metrics["probe"]["heads_scored_r2"] == 0 and math.isnan(result.metrics["gap"]["effect"])


def test_the_probe_gap_has_an_interval_over_test_samples():
    result = train_head_predictor(continuous_samples(), SMALL, task="continuous", shape=SHAPE, progress=False)
    gap = result.metrics["gap"]
    probe, baseline = result.metrics["probe"]["r2"], result.metrics["baseline"]["r2"]
    assert gap["metric"] == "r2" and gap["effect"] == pytest.approx(probe - baseline)
    assert gap["low"] <= gap["effect"] <= gap["high"] and gap["low"] > 0.5
    assert gap["n"] == len(split_by_sample(len(continuous_samples()), SMALL.split, SMALL.seed)[2])


def test_r2_weighs_heads_by_their_variance_so_a_near_constant_head_cannot_blow_it_up():
    """A baseline 0.01 off on a head that varies by 0.0015 has a per-head R² near -45: the plain mean over heads
    reads that as a huge failure (a real card read "probe - baseline R² 366"); weighted by variance it is
    that head's share of the error, and MSE beside it is in the scores' own units."""
    rng = np.random.default_rng(0)
    targets = np.column_stack([0.3 + 0.1 * rng.normal(size=400), 0.2 + 0.0015 * rng.normal(size=400)])
    baseline = np.broadcast_to(targets.mean(0) + np.array([0.0, 0.01]), targets.shape)
    metrics = regression_metrics(targets, baseline)
    assert metrics["heads_scored_r2"] == 2
    assert metrics["r2_uniform"] < -20  # (0 + about -45) / 2
    assert -0.05 < metrics["r2"] < 0  # 1 - (SSE_a + SSE_b) / (SST_a + SST_b)
    assert metrics["mse"] == pytest.approx(((targets - baseline) ** 2).mean())


def test_flattened_r2_of_targets_that_never_vary_is_undefined_not_a_huge_number():
    """Eq. 2 shares constant over the test split (float32 rounding leaves a tiny total variance): the flattened R²
    read -8e13 in metrics.md; it is undefined there, as ``r2`` is."""
    targets = np.full((40, 6), 0.2, np.float32)
    predicted = targets + np.random.default_rng(0).normal(scale=0.1, size=targets.shape).astype(np.float32)
    metrics = regression_metrics(targets, predicted)
    assert math.isnan(metrics["r2"]) and math.isnan(metrics["r2_flat"]) and metrics["heads_scored_r2"] == 0
    assert metrics["mse"] == pytest.approx(0.01, rel=0.1)
    means = np.arange(6, dtype=np.float32) / 10  # the heads' means differ: flattened, the targets vary
    assert 0.5 < regression_metrics(targets + means, predicted + means)["r2_flat"] < 1


def test_the_regressor_reports_an_mse_gap_beside_the_r2_gap():
    result = train_head_predictor(continuous_samples(), SMALL, task="continuous", shape=SHAPE, progress=False)
    gap = result.metrics["mse_gap"]
    probe, baseline = result.metrics["probe"]["mse"], result.metrics["baseline"]["mse"]
    assert gap["effect"] == pytest.approx(baseline - probe, rel=1e-5) and gap["effect"] > 0
    assert gap["low"] <= gap["effect"] <= gap["high"] and gap["low"] > 0


@pytest.mark.parametrize("tied", [False, True])
def test_a_resample_s_auprc_is_that_of_its_drawn_rows_concatenated_bit_for_bit(tied):
    """The probe gap's bootstrap (issue 36: one sort, not one per resample) weighs each drawn sample by its draws;
    that is sklearn's AUPRC of the drawn rows, repeats included, to the last bit: continuous scores and a per-head
    constant score (the frequency baseline: ties across rows), samples of unequal length; NaN with no positive."""
    rng = np.random.default_rng(5)
    steps = rng.integers(1, 9, 12)
    bounds = np.cumsum([0, *steps])
    rows = [np.arange(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    targets = (rng.random((bounds[-1], 7)) < 0.2).astype(np.float32)
    scores = rng.random(targets.shape).astype(np.float32) + 0.3 * targets
    scores = np.broadcast_to(targets.mean(0), targets.shape) if tied else np.round(scores, 2)
    auprc = ResampledAuprc(targets, scores, rows)
    for _ in range(25):
        idx = rng.integers(0, len(rows), len(rows))
        drawn = np.concatenate([rows[i] for i in idx])
        assert auprc(idx) == average_precision_score(targets[drawn].ravel().astype(bool), scores[drawn].ravel())
    empty = [i for i, r in enumerate(rows) if not targets[r].any()]
    assert math.isnan(ResampledAuprc(np.zeros_like(targets), scores, rows)(np.arange(len(rows))))
    if empty:
        assert math.isnan(auprc(np.array(empty[:1] * len(rows))))


def test_the_gaps_pool_seeded_splits_and_one_split_is_the_first_splits_own():
    """Issue 59: the predictor's gaps are repeated over seeded sample splits, as the CCA's, their intervals pooling
    each split's bootstrap; the saved probe and its table are the first split's, equal to a one-split run."""
    samples = binary_samples()
    one = train_head_predictor(samples, SMALL, task="binary", shape=SHAPE, progress=False)
    three = train_head_predictor(samples, replace(SMALL, splits=3), task="binary", shape=SHAPE, progress=False)
    assert three.metrics["probe"] == one.metrics["probe"] and three.metrics["threshold"] == one.metrics["threshold"]
    seconds = [
        train_head_predictor(samples, replace(SMALL, seed=seed), task="binary", shape=SHAPE, progress=False)
        for seed in (1, 2)
    ]
    for name in ("gap", "position_gap", "step_gap"):
        effects = [one.metrics[name]["effect"], *(run.metrics[name]["effect"] for run in seconds)]
        pooled = three.metrics[name]
        assert pooled["splits"] == 3 and "splits" not in one.metrics[name]
        assert pooled["effect"] == pytest.approx(np.mean(effects))
        assert pooled["low"] < pooled["effect"] < pooled["high"] and pooled["n"] == one.metrics[name]["n"]
    assert three.metrics["step_gap"]["low"] > 0  # the read-out picks which heads fire: it ranks them within a step
    with pytest.raises(DynheadsError, match="probe splits must be >= 1"):
        replace(SMALL, splits=0)
