"""Table 1 / Table 5 statistics on hand-made dynamic sets (2 layers x 3 heads = 6 heads).

Flat head indices (layer-major): (0,0)=0 (0,1)=1 (0,2)=2 (1,0)=3 (1,1)=4 (1,2)=5.
"""

import io
import math

import numpy as np
import pandas as pd
import pytest

from dynheads.analysis.dynamism import (
    binarize,
    dynamism_csv,
    dynamism_stats,
    per_sample_dynamism,
    table1_markdown,
    table5_markdown,
)
from dynheads.errors import DynheadsError
from dynheads.paper import ENTROPY_BASELINE, PAPER_DYNAMISM

SHAPE = (2, 3)
HEADS = [(layer, head) for layer in range(2) for head in range(3)]
STATIC = [(0, 1), (1, 0), (0, 0), (1, 2), (0, 2), (1, 1)]  # top-2 = flat {1, 3}


def sets(*steps: set[int]) -> np.ndarray:
    """One sample: a bool [step, layer, head] array from the flat indices active at each step."""
    out = np.zeros((len(steps), *SHAPE), dtype=bool)
    for t, active in enumerate(steps):
        for index in active:
            out[t, index // 3, index % 3] = True
    return out


SAMPLE_A = sets({0, 1}, {1, 2}, set(), set())  # two trailing empty steps
SAMPLE_B = sets({0, 1, 3})  # a single step: no adjacent pair
SAMPLE_C = sets({5}, {5})


def test_statistics_worked_out_by_hand():
    stats = dynamism_stats([SAMPLE_A, SAMPLE_B, SAMPLE_C], STATIC, ks=(2, 6, 7))
    assert (stats.num_samples, stats.num_steps, stats.total_heads) == (3, 7, 6)
    # |D_t| = 2, 2, 0, 0, 3, 1, 1: mean 9/7; population variance 19/7 - (9/7)^2 = 52/49.
    assert stats.mean_size == pytest.approx(9 / 7)
    assert stats.std_size == pytest.approx(math.sqrt(52) / 7)
    assert stats.empty_steps == 2
    assert stats.unique_heads == 5  # head 4 is never active
    # k=2, S = {1, 3}: J = 1/3, 1/3, 0, 0, 2/3, 0, 0 -> (4/3) / 7.
    assert stats.jaccard_static[2] == pytest.approx(4 / 21)
    # k=6, S = all heads: J = |D_t| / 6 -> (9/6) / 7.
    assert stats.jaccard_static[6] == pytest.approx(3 / 14)
    assert math.isnan(stats.jaccard_static[7])  # the static list has only 6 heads
    # Pairs: A: 1/3, 0, (∅, ∅) skipped; B: none; C: 1 -> mean of 3 pairs = 4/9.
    assert stats.adjacent_jaccard == pytest.approx(4 / 9)
    assert (stats.adjacent_pairs, stats.adjacent_skipped) == (3, 1)
    # Counts per head 2, 3, 1, 1, 0, 2 (sum 9): S = ln 9 - (2 ln 2 + 3 ln 3 + 2 ln 2) / 9.
    assert stats.entropy == pytest.approx(math.log(9) - (4 * math.log(2) + 3 * math.log(3)) / 9)


def test_to_dict_is_flat_and_names_each_k():
    row = dynamism_stats([SAMPLE_A, SAMPLE_C], STATIC, ks=(2, 6)).to_dict()
    assert row["jaccard_static_k2"] == pytest.approx((1 / 3 + 1 / 3) / 6)
    assert row["entropy_baseline"] == pytest.approx(2.9957, abs=1e-4) == ENTROPY_BASELINE
    assert all(isinstance(value, int | float) for value in row.values())


def test_binarize_is_strictly_above_threshold():
    scores = np.array([0.05, 0.1, 0.2, 0.9]).reshape(4, 1, 1)
    assert binarize(scores).ravel().tolist() == [False, False, True, True]
    assert binarize(scores, 0.5).ravel().tolist() == [False, False, False, True]


def test_all_empty_steps_leave_undefined_statistics_as_nan():
    stats = dynamism_stats([sets(set(), set(), set())], STATIC, ks=(2,))
    assert stats.mean_size == 0 and stats.empty_steps == 3 and stats.unique_heads == 0
    assert stats.jaccard_static[2] == 0.0  # J(∅, S_k) = 0: S_k is never empty
    assert math.isnan(stats.adjacent_jaccard) and stats.adjacent_skipped == 2
    assert math.isnan(stats.entropy)
    row = {"empty": stats.to_dict()}
    assert "| empty | 0.00 ± 0.00 | 0 / 6 | n/a | n/a | n/a |" in table1_markdown(row)  # no k=20 on 6 heads
    assert "| empty | 0.0000 |" in table5_markdown(row, ks=(2,))


@pytest.mark.parametrize(
    ("samples", "ranking", "message"),
    [
        ([], STATIC, "no samples"),
        ([np.zeros((0, *SHAPE), bool), np.zeros((0, *SHAPE), bool)], STATIC, "no generated steps"),
        ([SAMPLE_A.astype(float)], STATIC, "binarize"),
        ([SAMPLE_A, np.zeros((2, 3, 3), bool)], STATIC, "one model"),
        ([SAMPLE_A], [(0, 1), (4, 0)], "static head list names 1 head"),
    ],
)
def test_bad_input_is_refused(samples, ranking, message):
    with pytest.raises(DynheadsError, match=message):
        dynamism_stats(samples, ranking)


def test_markdown_tables_follow_the_paper_layout():
    ours = dynamism_stats([SAMPLE_A, SAMPLE_B, SAMPLE_C], STATIC, ks=(2, 6)).to_dict()
    table1 = table1_markdown({"llama3.1-8b (paper)": PAPER_DYNAMISM["llama3.1-8b"], "toy": ours})
    lines = table1.splitlines()
    assert lines[0] == "| Model | Mean ± Std | Unique / Total | Jaccard w/ Static | Adj. Jaccard | Entropy |"
    assert lines[2] == "| llama3.1-8b (paper) | 12.97 ± 7.69 | 238 / 1024 | 0.3512 | 0.2793 | 3.8154 |"
    assert lines[3] == "| toy | 1.29 ± 1.03 | 5 / 6 | n/a | 0.4444 | 1.5230 |"  # toy has no k=20 Jaccard
    table5 = table5_markdown({"phi4-mini": PAPER_DYNAMISM["phi4-mini"], "toy": ours}, ks=(20, 50, 100)).splitlines()
    assert table5[0] == "| Model | Jaccard (k=20) | Jaccard (k=50) | Jaccard (k=100) |"
    assert table5[1] == "|---|---|---|---|"
    assert table5[2] == "| phi4-mini | 0.1845 | 0.1087 | 0.0606 |"


def test_csv_has_one_row_per_model():
    ours = dynamism_stats([SAMPLE_A, SAMPLE_B, SAMPLE_C], STATIC, ks=(2,)).to_dict()
    frame = pd.read_csv(io.StringIO(dynamism_csv({"toy": ours, **PAPER_DYNAMISM})), index_col="model")
    assert list(frame.index) == ["toy", *PAPER_DYNAMISM]
    assert frame.loc["toy", "unique_heads"] == 5
    assert frame.loc["toy", "adjacent_jaccard"] == pytest.approx(4 / 9)
    assert frame.loc["qwen3-8b", "jaccard_static_k50"] == pytest.approx(0.3011)
    assert math.isnan(frame.loc["qwen3-8b", "num_steps"])  # the paper does not report it


def test_paper_values_match_the_models_head_counts():
    # layers x query heads: Llama-3.1-8B 32x32, Llama-3.2-3B 28x24, Qwen3-8B 36x32, Llama-2-13B 40x40,
    # Phi-4-mini 32x24; Table 1's k=20 column is Table 5's first column.
    sizes = {"llama3.1-8b": 1024, "llama3.2-3b": 672, "qwen3-8b": 1152, "llama2-13b": 1600, "phi4-mini": 768}
    assert {name: row["total_heads"] for name, row in PAPER_DYNAMISM.items()} == sizes
    for row in PAPER_DYNAMISM.values():
        assert row["unique_heads"] < row["total_heads"]
        assert row["jaccard_static_k20"] > row["jaccard_static_k50"] > row["jaccard_static_k100"]


def test_containment_and_size_matched_jaccard_worked_out_by_hand():
    # static order STATIC: flat 1, 3, 0, 5, 2, 4; S_2 = {1, 3}
    stats = dynamism_stats([SAMPLE_A, SAMPLE_B, SAMPLE_C], STATIC, ks=(2,))
    # containment in S_k, k = min(20, 6 scored heads) = all six: every head is static, so 1 at every step
    assert stats.containment_k20 == 1.0
    # size-matched: A {0,1} vs {1,3}: 1/3; A {1,2} vs {1,3}: 1/3; B {0,1,3} vs {1,3,0}: 1; C {5} vs {1}: 0 (twice)
    assert stats.matched_jaccard == pytest.approx((1 / 3 + 1 / 3 + 1 + 0 + 0) / 5)
    assert stats.jaccard_ceiling_k20 == pytest.approx(np.mean([2 / 20, 2 / 20, 0, 0, 3 / 20, 1 / 20, 1 / 20]))
    per_sample = per_sample_dynamism([SAMPLE_A, SAMPLE_B, SAMPLE_C], STATIC)
    assert per_sample["matched_jaccard"] == pytest.approx([1 / 3, 1.0, 0.0])
    assert per_sample["head_counts"][0] == [1, 2, 1, 0, 0, 0]
    short = per_sample_dynamism([SAMPLE_A, SAMPLE_C], STATIC[:2])  # a static list of two scored heads
    assert short["containment_k20"] == pytest.approx([(1 / 2 + 1 / 2) / 2, 0.0])


def test_table5_shows_no_zero_score_filler():
    """k beyond the scored heads is n/a, never a Jaccard against zero-score filler heads."""
    stats = dynamism_stats([SAMPLE_A, SAMPLE_B], STATIC[:3], ks=(2, 5))
    assert not math.isnan(stats.jaccard_static[2]) and math.isnan(stats.jaccard_static[5])
    assert "n/a" in table5_markdown({"ours": stats.to_dict()}, ks=(2, 5))
