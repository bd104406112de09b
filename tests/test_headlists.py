"""Head-list files: Wu et al.'s score lists (byte-exact) and ranked lists such as QRHead's."""

import json

import pytest

from dynheads.analysis.headlists import load_head_list, rank_by_score, save_head_scores
from dynheads.errors import DynheadsError

# Written the way Wu et al.'s code writes it: json.dump on one line, zeros as the integer 0, no newline.
PUBLISHED = '{"0-0": [0, 0.034482758620689655], "0-1": [0.05, 0], "1-0": [0, 0], "1-1": [0.1, 0.05]}'


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_write_read_write_is_byte_identical(tmp_path):
    scores = {(0, 0): [0.0, 0.0], (0, 1): [1 / 3, 0.75], (1, 0): [0.1, 1.0], (1, 1): [2 / 7, 0.0]}
    save_head_scores(tmp_path / "a.json", scores)
    loaded = load_head_list(tmp_path / "a.json")
    save_head_scores(tmp_path / "b.json", loaded.test_scores)
    first = (tmp_path / "a.json").read_bytes()
    assert first == (tmp_path / "b.json").read_bytes()
    assert first.startswith(b'{"0-0": [0, 0], "0-1": [0.3333333333333333, 0.75], "1-0": [0.1, 1.0]')


def test_published_file_is_read_ranked_and_rewritten_unchanged(tmp_path):
    path = write(tmp_path / "wu.json", PUBLISHED)
    loaded = load_head_list(path, num_layers=2, num_heads=2)
    assert loaded.format == "wu"
    # Means: 0-0 = .01724, 0-1 = .025, 1-0 = 0, 1-1 = .075.
    assert loaded.heads == ((1, 1), (0, 1), (0, 0), (1, 0))
    assert loaded.scores == pytest.approx((0.075, 0.025, 0.034482758620689655 / 2, 0.0))
    assert loaded.top(2) == [(1, 1), (0, 1)]
    save_head_scores(tmp_path / "again.json", loaded.test_scores)
    assert (tmp_path / "again.json").read_text(encoding="utf-8") == PUBLISHED


def test_ties_are_ranked_by_layer_then_head_not_file_order(tmp_path):
    path = write(tmp_path / "tie.json", json.dumps({"1-0": [0.5], "0-1": [0.25, 0.75], "0-0": [0.5, 0.5]}))
    assert load_head_list(path).heads == ((0, 0), (0, 1), (1, 0))
    assert rank_by_score({(2, 0): 1.0, (1, 5): 1.0, (1, 2): 3.0}) == ((1, 2), (1, 5), (2, 0))


def test_ranked_lists_keep_file_order_in_every_entry_form(tmp_path):
    strings = load_head_list(write(tmp_path / "s.json", '["14-22", "L13-H16", "0-3"]'))
    pairs = load_head_list(write(tmp_path / "p.json", "[[14, 22], [13, 16], [0, 3]]"))
    qrhead = load_head_list(write(tmp_path / "q.json", '[["14-22", 0.9], ["13-16", 0.5], ["0-3", 0.7]]'))
    assert strings.heads == pairs.heads == qrhead.heads == ((14, 22), (13, 16), (0, 3))
    assert strings.format == "ranked" and strings.scores is None and strings.test_scores is None
    assert qrhead.scores == (0.9, 0.5, 0.7)  # the file's order wins even where its scores disagree


def test_heads_missing_from_the_model_are_refused_naming_file_and_heads(tmp_path):
    path = write(tmp_path / "big.json", '["1-1", "5-0", "0-9"]')
    with pytest.raises(DynheadsError) as error:
        load_head_list(path, num_layers=2, num_heads=4)
    message = str(error.value)
    assert "big.json" in message and "L5-H0" in message and "L0-H9" in message and "L1-H1" not in message
    assert load_head_list(path, num_layers=6, num_heads=10).heads[1] == (5, 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"0-0": [0.1, ', "not valid JSON"),
        ("{}", "no heads"),
        ("[]", "no heads"),
        ("3", "found int"),
        ('{"0-0": []}', "non-empty list"),
        ('{"0-0": [0.1, "x"]}', "non-empty list"),
        ('{"zero-one": [0.1]}', "cannot read head 'zero-one'"),
        ("[[1.5, 2]]", "cannot read list entry"),
        ('["0-1", [0, 1]]', "more than once: 0-1"),
        ('[["0-1", 0.3], "0-2"]', "some entries have a score"),
    ],
)
def test_malformed_files_get_one_line_errors_naming_the_file(tmp_path, text, message):
    path = write(tmp_path / "bad.json", text)
    with pytest.raises(DynheadsError, match=message) as error:
        load_head_list(path)
    assert "bad.json" in str(error.value) and "\n" not in str(error.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(DynheadsError, match="cannot read head list .*nowhere.json"):
        load_head_list(tmp_path / "nowhere.json")


def test_model_size_needs_both_numbers(tmp_path):
    with pytest.raises(ValueError, match="both"):
        load_head_list(write(tmp_path / "x.json", '["0-0"]'), num_layers=2)


def test_locos_released_lists_load_bare_or_in_their_envelope(tmp_path):
    """LOCOS publishes Wu's object, or the same object under "scores" beside a "meta" block; its write scores can be
    negative, and a head with a mean that is not positive is not a static head."""
    from dynheads.analysis.headlists import scored_heads

    scores = {"0-1": [0.4, 0.2], "1-0": [-0.3, -0.1], "2-3": [1.5, 0.5], "1-1": [0, 0]}
    bare = write(tmp_path / "bare.json", json.dumps(scores))
    wrapped = write(tmp_path / "wrapped.json", json.dumps({"meta": {"method": "logit_contrib"}, "scores": scores}))
    for path in (bare, wrapped):
        ranked = load_head_list(path, num_layers=3, num_heads=4)
        assert ranked.heads == ((2, 3), (0, 1), (1, 1), (1, 0))
        assert ranked.scores == pytest.approx((1.0, 0.3, 0.0, -0.2))
        assert scored_heads(ranked) == ((2, 3), (0, 1))


def test_public_readers_of_head_lists_refuse_heads_they_cannot_place(tmp_path):
    """A list read without the model's size, then used on the model: a head it lacks is one line, not an
    IndexError; a "layer-head" string where a (layer, head) pair is expected is named, not a TypeError."""
    import numpy as np

    from dynheads import dynamism_stats, kv_head_matrix, query_head_scores

    heads = load_head_list(write(tmp_path / "big.json", '{"99-0": [1.0], "1-2": [0.5]}'))
    with pytest.raises(DynheadsError, match=r"names 1 head\(s\) that this model \(30 layers x 9 heads\).*L99-H0"):
        query_head_scores(heads, 30, 9)
    assert query_head_scores(heads, 100, 9)[1, 2] == 0.5
    sets = [np.zeros((3, 30, 9), dtype=bool)]
    with pytest.raises(DynheadsError, match="a head is a \\(layer, head\\) pair of integers, got '1-2'"):
        dynamism_stats(sets, ["1-2"])
    assert dynamism_stats(sets, [(np.int64(1), np.int64(2))]).mean_size == 0.0
    with pytest.raises(DynheadsError, match=r"takes \[layer, head\] scores, got shape \(2, 3, 9\)"):
        kv_head_matrix(np.zeros((2, 3, 9)), 3)
    assert kv_head_matrix([[0.0, 1.0, 2.0, 3.0]], 2).tolist() == [[1.0, 3.0]]


def test_binarize_and_load_voters_refuse_what_is_no_threshold_or_head_pair():
    import numpy as np

    from dynheads import binarize, load_voters

    scores = np.array([[[0.05, 0.2]]], dtype=np.float32)
    assert binarize(scores, np.float32(0.1)).tolist() == [[[False, True]]]
    with pytest.raises(DynheadsError, match="binarize takes a numeric threshold such as 0.1, got 'relative:3'"):
        binarize(scores, "relative:3")
    assert load_voters([(1, 2), [np.int64(3), 4]]) == ((1, 2), (3, 4))
    for bad in ([(1,)], ["1-2"]):
        with pytest.raises(DynheadsError, match="the voting heads: a head is a \\(layer, head\\) pair of integers"):
            load_voters(bad)
