"""Static heads as Wu et al. score them, on hand-made copy-score arrays (2 layers x 2 heads)."""

import numpy as np
import pytest

from dynheads.analysis.headlists import load_head_list, save_head_scores
from dynheads.analysis.static import NiahTest, rouge1_recall, static_heads
from dynheads.errors import DynheadsError
from dynheads.traces import Trace

UUID = "3f2a9c1e-7b4d-4e8a-9c1f-2d3e4f5a6b7c"  # ROUGE tokenises it into its 5 hyphen-separated parts
PASS = f"The magic word is {UUID}."
FAIL = "I could not find a magic word."


def make_trace(active: list[list[tuple[int, int]]], shape: tuple[int, int] = (2, 2), text: str = "") -> Trace:
    """A trace whose copy score is 1 exactly for the listed (layer, head) at each step."""
    copy = np.zeros((len(active), *shape), dtype=bool)
    for step, heads in enumerate(active):
        for layer, head in heads:
            copy[step, layer, head] = True
    zeros = np.zeros(copy.shape, dtype=np.float32)
    return Trace(
        tokens=np.arange(len(active), dtype=np.int64),
        token_texts=[f"t{i}" for i in range(len(active))],
        text=text,
        argmax_pos=zeros.astype(np.int32),
        needle_mass=zeros,
        max_prob=zeros,
        scores={"copy": copy, "reasoning": zeros},
        hidden=np.zeros((len(active), 4), np.float32),
        prompt_length=10,
        stop_reason="eos",
    )


# Test A (4 answer tokens, 3 steps): counts (0,0)=0 (0,1)=3 (1,0)=1 (1,1)=1 -> 0, .75, .25, .25
TEST_A = NiahTest(make_trace([[(0, 1), (1, 0)], [(0, 1)], [(0, 1), (1, 1)]]), UUID, 4, PASS)
# Test B (2 answer tokens, a single step): (1,0) once -> 0, 0, .5, 0
TEST_B = NiahTest(make_trace([[(1, 0)]]), UUID, 2, PASS)
# Test C fails the success filter: its (very active) heads must not count.
TEST_C = NiahTest(make_trace([[(0, 0), (1, 1)]] * 5), UUID, 2, FAIL)


def test_scores_pass_rate_and_tied_ranking():
    result = static_heads([TEST_A, TEST_B, TEST_C])
    assert result.num_tests == 3 and result.num_counted == 2
    assert result.pass_rate == pytest.approx(2 / 3)
    np.testing.assert_allclose(result.test_scores[0], [[0, 0.75], [0.25, 0.25]])
    np.testing.assert_allclose(result.test_scores[1], [[0, 0], [0.5, 0]])
    # Means: (0,0)=0, (0,1)=.375, (1,0)=.375, (1,1)=.125; the tie goes to the lower (layer, head).
    np.testing.assert_allclose(result.mean_scores, [[0, 0.375], [0.375, 0.125]])
    assert result.ranking == ((0, 1), (1, 0), (1, 1), (0, 0))
    assert result.top(2) == [(0, 1), (1, 0)]
    assert result.top(10) == list(result.ranking)
    assert result.recalls[2] == 0.0


def test_per_head_lists_are_layer_major_per_counted_test():
    per_head = static_heads([TEST_A, TEST_B, TEST_C]).per_head()
    assert list(per_head) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert per_head[(0, 1)] == [0.75, 0.0]
    assert per_head[(1, 0)] == [0.25, 0.5]


def test_result_survives_the_published_file_format(tmp_path):
    result = static_heads([TEST_A, TEST_B])
    save_head_scores(tmp_path / "heads.json", result.per_head())
    loaded = load_head_list(tmp_path / "heads.json", num_layers=2, num_heads=2)
    assert loaded.heads == result.ranking


def test_success_filter_is_rouge1_recall_strictly_above_threshold():
    assert rouge1_recall(UUID, PASS) == 1.0
    partial = "3f2a9c1e-7b4d"  # 2 of the 5 answer tokens: recall 0.4
    assert rouge1_recall(UUID, partial) == pytest.approx(0.4)
    test = NiahTest(make_trace([[(1, 1)]]), UUID, 1, partial)
    assert static_heads([TEST_A, test]).num_counted == 1
    assert static_heads([TEST_A, test], success_threshold=0.3).num_counted == 2
    # Recall exactly at the threshold does not count (reference: score > 50).
    half = NiahTest(make_trace([[(1, 1)]]), "alpha-beta", 1, "alpha")
    assert static_heads([TEST_A, half]).num_counted == 1


def test_generated_defaults_to_trace_text():
    test = NiahTest(make_trace([[(0, 0)]], text=PASS), UUID, 1)
    assert static_heads([test]).ranking[0] == (0, 0)


def test_zero_pass_rate_is_an_error_not_an_empty_result():
    with pytest.raises(DynheadsError, match=r"pass rate 0/2.*max-new-tokens"):
        static_heads([TEST_C, TEST_C])


@pytest.mark.parametrize(
    ("tests", "message"),
    [
        ([], "no NIAH tests"),
        ([TEST_A, NiahTest(make_trace([[]], shape=(3, 2)), UUID, 1, PASS)], "test 1 has"),
        ([NiahTest(make_trace([[]]), UUID, 0, PASS)], "answer_tokens=0"),
    ],
)
def test_bad_input_is_refused(tests, message):
    with pytest.raises(DynheadsError, match=message):
        static_heads(tests)
