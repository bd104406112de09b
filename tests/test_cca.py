"""Temporal-offset CCA: planted correlations, pairing by offset, and the held-out / shuffled controls."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.cross_decomposition import CCA

from dynheads.analysis.cca import (
    CCAConfig,
    canonical_correlations,
    cca_notes,
    cca_offsets,
    cca_table,
    fit_cca,
    gap_statistic,
    offset_pairs,
    shuffled_pairing,
    split_samples,
    write_cca,
)
from dynheads.errors import DynheadsError
from dynheads.paper import PAPER_TOP1
from dynheads.plots.cca import plot_cca
from dynheads.tables import read_summaries

RHOS = (0.9, 0.6, 0.3)


def planted(num_samples: int, steps: int, seed: int = 0, dim_x: int = 8, dim_y: int = 6) -> list:
    """Samples whose views share latents z with correlations RHOS at the same step, rotated and padded with noise.

    Every direction has unit variance, so PCA at 95 % / 99 % keeps all of them and CCA must find RHOS.
    """
    rng = np.random.default_rng(seed)
    rot_x = np.linalg.qr(rng.normal(size=(dim_x, dim_x)))[0]
    rot_y = np.linalg.qr(rng.normal(size=(dim_y, dim_y)))[0]
    rhos = np.array(RHOS)
    samples = []
    for _ in range(num_samples):
        z = rng.normal(size=(steps, len(rhos)))
        x = np.hstack([z, rng.normal(size=(steps, dim_x - len(rhos)))])
        y_signal = rhos * z + np.sqrt(1 - rhos**2) * rng.normal(size=z.shape)
        y = np.hstack([y_signal, rng.normal(size=(steps, dim_y - len(rhos)))])
        samples.append(((x @ rot_x).astype(np.float32), y @ rot_y))
    return samples


def noise(num_samples: int, steps: int, dim_x: int, dim_y: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(steps, dim_x)).astype(np.float32), rng.normal(size=(steps, dim_y)))
        for _ in range(num_samples)
    ]


def test_recovers_planted_correlations():
    correlations, dims = canonical_correlations(offset_pairs(planted(200, 100), 0))
    assert dims == {"n_components": 6, "hidden_dims": 8, "score_dims": 6}
    np.testing.assert_allclose(correlations[:3], RHOS, atol=0.02)
    assert np.all(np.abs(correlations[3:]) < 0.05)


def test_closed_form_matches_sklearn():
    x, y = offset_pairs(planted(10, 50, seed=1), 0)
    x, y = x.astype(np.float64), y.astype(np.float64)
    ours = fit_cca(x, y, n_components=2, ridge=0.0).correlations
    u, v = CCA(n_components=2, scale=False, max_iter=2000, tol=1e-10).fit(x, y).transform(x, y)
    theirs = [np.corrcoef(u[:, i], v[:, i])[0, 1] for i in range(2)]
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_offsets_held_out_and_shuffled_on_planted_signal():
    table = cca_offsets(planted(100, 60), offsets=[0, 1]).set_index(["offset", "method"])
    assert table.loc[(0, "in_sample"), "top1"] == pytest.approx(0.9, abs=0.02)
    assert table.loc[(0, "held_out"), "top1"] == pytest.approx(0.9, abs=0.02)
    assert abs(table.loc[(0, "shuffled"), "top1"]) < 0.1  # the pairing carries all of the signal
    assert table.loc[(1, "held_out"), "top1"] < 0.15  # the latents are independent across steps
    assert table.loc[(0, "held_out"), "eval_pairs"] == 30 * 60
    assert table.loc[(1, "in_sample"), "fit_pairs"] == 100 * 59


def test_offset_pairs_drop_pairs_past_the_end():
    def sample(steps: int, base: int):  # row n holds base + n in both views
        rows = (base + np.arange(steps, dtype=np.float32))[:, None]
        return rows, rows.astype(np.float64)

    hidden, scores = offset_pairs([sample(5, 0), sample(2, 100), sample(4, 200)], 2)
    np.testing.assert_array_equal(hidden[:, 0], [0, 1, 2, 200, 201])
    np.testing.assert_array_equal(scores[:, 0], [2, 3, 4, 202, 203])
    with pytest.raises(DynheadsError, match="offsets must be >= 0"):
        offset_pairs([sample(3, 0)], -1)


def test_shuffled_pairing_is_a_seeded_derangement_and_truncates():
    samples = [
        (np.full((steps, 1), i, np.float32), np.full((steps + 1, 1), i, np.float64)[:steps])
        for i, steps in enumerate([3, 5, 4, 6, 2])
    ]
    shuffled = shuffled_pairing(samples, seed=3)
    for i, (hidden, scores) in enumerate(shuffled):
        assert np.all(hidden == i) and scores[0, 0] != i
        assert len(hidden) == min(len(samples[i][0]), len(samples[int(scores[0, 0])][1]))
    again = shuffled_pairing(samples, seed=3)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(shuffled, again, strict=True))


def test_split_is_by_sample_disjoint_and_seeded():
    fit, test = split_samples(10, 0.3, seed=0)
    assert len(test) == 3 and set(fit).isdisjoint(test) and set(fit) | set(test) == set(range(10))
    np.testing.assert_array_equal(test, split_samples(10, 0.3, seed=0)[1])


def test_in_sample_is_inflated_on_noise_held_out_is_not():
    table = cca_offsets(noise(20, 10, 40, 20), offsets=[0]).set_index("method")
    assert table.loc["in_sample", "top1"] > 0.6 and table.loc["in_sample", "top10_mean"] > 0.45
    assert table.loc["held_out", "top1"] < 0.3
    assert abs(table.loc["held_out", "top10_mean"]) < 0.1 and abs(table.loc["held_out", "top50_mean"]) < 0.1


def test_more_dimensions_than_pairs_gives_perfect_in_sample_correlation():
    correlations, _ = canonical_correlations(offset_pairs(noise(5, 6, 64, 20), 0))
    assert correlations[0] > 0.99


def test_bad_input_is_refused():
    with pytest.raises(DynheadsError, match="at least 2 samples"):
        cca_offsets(noise(1, 10, 4, 3))
    with pytest.raises(DynheadsError, match="same T"):
        cca_offsets([(np.zeros((3, 4), np.float32), np.zeros((2, 3)))] * 2)
    constant = [(h, np.ones_like(s)) for h, s in noise(4, 10, 4, 3)]
    with pytest.raises(DynheadsError, match="constant"):
        cca_offsets(constant, offsets=[0])
    with pytest.raises(DynheadsError, match="offset 9"):
        cca_offsets(noise(4, 10, 4, 3), offsets=[9])
    with pytest.raises(DynheadsError, match="between 0 and 1"):
        CCAConfig(hidden_variance=1.0)


def test_reports_and_plot_are_written(tmp_path):
    table = cca_offsets(planted(20, 20), offsets=range(3))
    paths = write_cca(table, tmp_path, config=CCAConfig(), model="llama3.1-8b")
    markdown = paths["md"].read_text()
    assert "paper top-1" in markdown and "0.966" in markdown
    assert len(markdown.strip().splitlines()) == 2 + 9
    png = plot_cca(table, tmp_path / "cca.png", title="planted", paper=PAPER_TOP1["llama3.1-8b"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cca.csv", "cca.json", "cca.md", "cca.png", "summary.json"]
    assert read_summaries(tmp_path)["cca.md"].to_markdown() == markdown  # the same results, as data


def test_held_out_rows_carry_the_gap_to_the_shuffled_control_with_an_interval():
    table = cca_offsets(planted(40, 20), offsets=[0, 1]).set_index(["offset", "method"])
    row = table.loc[(0, "held_out")]
    shuffled = table.loc[(0, "shuffled"), "top1"]
    assert row["gap"] == pytest.approx(row["top1"] - shuffled, abs=1e-9)
    assert row["gap_low"] <= row["gap"] <= row["gap_high"] and row["gap_low"] > 0.3  # planted: far above the control
    assert row["test_samples"] == 12  # 30 % of 40 samples
    assert np.isnan(table.loc[(0, "in_sample"), "gap"])


def test_an_offset_that_cannot_be_measured_is_noted_and_the_others_kept():
    samples = noise(10, 4, 4, 3) + noise(2, 12, 4, 3, seed=1)  # only two samples reach offset 6
    table = cca_offsets(samples, offsets=[1, 6])
    measured = table[table["offset"] == 1]
    assert measured["top1"].notna().all()
    failed = table[(table["offset"] == 6) & table["note"].notna()]
    assert len(failed) >= 1 and failed["note"].str.contains("offset 6").all()
    assert cca_notes(table) == list(failed["note"])


def test_the_held_out_measures_are_repeated_over_seeded_splits_and_their_spread_is_in_the_interval():
    samples = noise(30, 10, 4, 3)
    pooled = cca_offsets(samples, offsets=[1], config=CCAConfig(splits=4)).set_index("method")
    singles = [
        cca_offsets(samples, offsets=[1], config=CCAConfig(splits=1, seed=seed)).set_index("method")
        for seed in range(4)
    ]
    assert pooled.loc["held_out", "splits"] == 4 and pooled.loc["shuffled", "splits"] == 4
    for method in ("held_out", "shuffled"):
        assert pooled.loc[method, "top1"] == pytest.approx(np.mean([s.loc[method, "top1"] for s in singles]))
    gaps = [s.loc["held_out", "gap"] for s in singles]
    assert pooled.loc["held_out", "gap"] == pytest.approx(np.mean(gaps))
    assert pooled.loc["held_out", "gap_low"] <= min(gaps) and pooled.loc["held_out", "gap_high"] >= max(gaps)
    assert pooled.loc["in_sample", "top1"] == singles[0].loc["in_sample", "top1"]  # no split: unchanged
    with pytest.raises(DynheadsError, match="splits must be >= 1"):
        CCAConfig(splits=0)


def test_the_gap_statistic_of_many_resamples_equals_each_resample_alone():
    """The bootstrap's batched form (pooled per-sample moments) against concatenating each resample's variates:
    equal to rounding, NaN where a resample has too few pairs, 0 where a side is constant."""
    rng = np.random.default_rng(5)

    def variates(count: int, slope: float) -> list[tuple[np.ndarray, np.ndarray]]:
        found = []
        for size in rng.integers(0, 12, count):
            u = rng.normal(3.0, 2.0, size)
            found.append((u, slope * u + rng.normal(0, 1, size)))
        return found

    held_out, shuffled = variates(8, 0.8), variates(8, 0.0)
    held_out[2] = (np.zeros(0), np.zeros(0))  # a sample too short for the offset
    statistic = gap_statistic(held_out, shuffled)
    rows = np.vstack([rng.integers(0, 8, (200, 8)), np.full((1, 8), 2), np.full((1, 8), 3)])
    expected = np.array([statistic.one(row) for row in rows])
    assert np.isnan(expected[-2]) and np.isnan(statistic.many(rows)[-2])  # only the empty sample: no pairs
    np.testing.assert_allclose(statistic.many(rows), expected, rtol=0, atol=1e-12)
    constant = [(np.full(5, 2.0), rng.normal(size=5)) for _ in range(3)]
    flat = gap_statistic(constant, constant)
    assert flat.one(np.arange(3)) == 0.0 and flat.many(np.arange(3)[None, :])[0] == 0.0


def test_cca_offsets_shows_a_bar_unless_told_not_to(capsys):
    quiet = cca_offsets(planted(20, 20), offsets=[0], progress=False)
    assert "cca" not in capsys.readouterr().err
    shown = cca_offsets(planted(20, 20), offsets=[0])
    assert "cca" in capsys.readouterr().err
    pd.testing.assert_frame_equal(quiet, shown)


def test_a_gap_without_an_interval_says_so_instead_of_printing_nan():
    """One test sample gives the held-out minus shuffled gap no bootstrap interval: the cell says "no interval" (as
    the probe says "undefined"), never "[nan, nan]"; with an interval it is printed as usual."""
    row = dict(
        offset=0,
        top1=1.0,
        top10_mean=0.8,
        top50_mean=0.8,
        n_components=3,
        hidden_dims=3,
        score_dims=6,
        fit_pairs=12,
        eval_pairs=4,
        test_samples=1,
        gap=0.0,
        gap_low=np.nan,
        gap_high=np.nan,
    )
    rows = [{**row, "method": "held_out"}, {**row, "method": "held_out", "offset": 1, "gap_low": -0.1, "gap_high": 0.2}]
    cells = [line[-1] for line in cca_table(pd.DataFrame(rows)).cells()]
    assert cells == ["0.000, no interval (1)", "0.000 [-0.100, 0.200] (1)"]


def test_non_finite_input_is_refused_never_a_silent_number():
    """A NaN score used to zero its head as "constant" (no span) and a NaN among the evaluation pairs turned a
    correlation into 0; a NaN hidden state reached scikit-learn's PCA as a raw ValueError."""
    for view, value in ((1, np.nan), (1, np.inf), (0, np.nan), (0, -np.inf)):
        samples = [(h.copy(), s.copy()) for h, s in noise(6, 10, 4, 3)]
        samples[2][view][4, 1] = value
        name = "scores" if view else "hidden states"
        with pytest.raises(DynheadsError, match=f"sample 2: its {name} hold NaN or inf at step 4"):
            cca_offsets(samples, offsets=[0], progress=False)
    fit, test = offset_pairs(noise(4, 10, 4, 3), 0), offset_pairs(noise(2, 10, 4, 3, seed=1), 0)
    test[1][3, 0] = np.nan
    with pytest.raises(DynheadsError, match="evaluation pairs hold NaN or inf"):
        canonical_correlations(fit, test)


def test_constant_evaluation_pairs_are_refused_not_read_as_a_zero_correlation():
    """Test samples whose scores never vary (e.g. answers that copied nothing) hold no correlation: the held-out
    value used to read 0 (Pearson's guard for a constant column), pulling the mean over splits and the gap down."""
    fit = offset_pairs(noise(4, 20, 4, 3), 0)
    hidden, _ = offset_pairs(noise(2, 20, 4, 3, seed=1), 0)
    for constant in (0.0, 0.37):
        with pytest.raises(DynheadsError, match="scores are constant over the evaluation pairs"):
            canonical_correlations(fit, (hidden, np.full((len(hidden), 3), constant)))
    with pytest.raises(DynheadsError, match="hidden states are constant over the evaluation pairs"):
        canonical_correlations(fit, (np.ones_like(hidden), offset_pairs(noise(2, 20, 4, 3, seed=2), 0)[1]))
    # a split whose test samples are all constant is left out (``splits`` counts the others); here every split is
    samples = [(h, np.zeros_like(s) if i in (0, 1) else s) for i, (h, s) in enumerate(noise(4, 20, 4, 3))]
    with pytest.raises(DynheadsError, match="scores are constant over the evaluation pairs.*on every split"):
        cca_offsets(samples, offsets=[0], config=CCAConfig(splits=3, test_fraction=0.25), progress=False)


@pytest.mark.filterwarnings("ignore::scipy.stats.DegenerateDataWarning")  # resamples with no shuffled pair
def test_test_samples_shorter_than_the_offset_are_not_counted_in_the_gap():
    """A test sample of T <= k steps holds no pair at offset k: it used to count among the gap's test samples (the
    number the 30-sample floor reads) and be drawn by its bootstrap, contributing nothing."""
    samples = [(h[:1], s[:1]) if i % 2 else (h, s) for i, (h, s) in enumerate(planted(20, 30))]
    config = CCAConfig(splits=3, resamples=100)
    table = cca_offsets(samples, offsets=[0, 1], config=config, progress=False).set_index(["offset", "method"])
    tests = [split_samples(20, config.test_fraction, seed)[1] for seed in range(config.splits)]
    assert table.loc[(0, "held_out"), "test_samples"] == min(len(test) for test in tests) == 6
    assert table.loc[(1, "held_out"), "test_samples"] == min(sum(i % 2 == 0 for i in test) for test in tests) < 6
