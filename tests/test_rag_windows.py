"""Algorithm 2's position selection on hand-made scores: clusters, representatives, clipping, merging, recall."""

import numpy as np
import pytest

from dynheads.errors import DynheadsError
from dynheads.rag.windows import (
    RetrievalConfig,
    cluster_positions,
    merge_windows,
    retrieval_recall,
    select_windows,
    windows_to_mask,
    windows_to_positions,
)


def peaked_scores() -> np.ndarray:
    """100 context positions, five peaks: a cluster 10/12/14, then 50 and 95."""
    scores = np.zeros(100)
    scores[[10, 12, 14, 50, 95]] = [0.9, 0.8, 0.5, 0.7, 0.6]
    return scores


def test_gap_clustering_splits_where_neighbours_are_far():
    clusters = cluster_positions([3, 1, 20, 2, 30, 25], gap=5)
    assert [c.tolist() for c in clusters] == [[1, 2, 3], [20, 25, 30]]
    assert [c.tolist() for c in cluster_positions([1, 7], gap=5)] == [[1], [7]]
    assert cluster_positions([], gap=5) == []


def test_dbscan_matches_gap_clustering():
    rng = np.random.default_rng(0)
    for _ in range(20):
        positions = rng.choice(200, size=10, replace=False)
        gap = int(rng.integers(0, 20))
        by_gap = [c.tolist() for c in cluster_positions(positions, gap, "gap")]
        assert [c.tolist() for c in cluster_positions(positions, gap, "dbscan")] == by_gap
    adjacent = [5, 6, 7, 9]
    assert [c.tolist() for c in cluster_positions(adjacent, 0, "dbscan")] == [[5], [6], [7], [9]]  # gap 0: alone
    assert [c.tolist() for c in cluster_positions(adjacent, 1, "dbscan")] == [[5, 6, 7], [9]]


def test_select_windows_max_representatives_and_end_clipping():
    result = select_windows(peaked_scores(), RetrievalConfig(top_n=5, gap=8, window=10))
    assert result.top_positions == (10, 12, 50, 95, 14)
    assert result.clusters == ((10, 12, 14), (50,), (95,))
    assert result.representatives == (10, 50, 95)
    assert result.windows == ((5, 15), (45, 55), (90, 100))  # 95 + 5 clipped at the context's end
    assert result.mask.tolist() == [any(a <= i < b for a, b in result.windows) for i in range(100)]


def test_median_representative_and_offset():
    config = RetrievalConfig(top_n=5, gap=8, window=10, representative="median")
    result = select_windows(peaked_scores(), config, offset=1000)
    assert result.representatives == (1012, 1050, 1095)
    assert result.windows == ((1007, 1017), (1045, 1055), (1090, 1100))
    assert result.mask.shape == (100,) and result.mask[7:17].all() and not result.mask[17]


def test_window_is_clipped_not_shifted_at_the_start():
    scores = np.zeros(30)
    scores[2] = 1.0
    assert select_windows(scores, RetrievalConfig(top_n=1, window=10)).windows == ((0, 7),)


def test_overlapping_windows_merge():
    scores = np.zeros(60)
    scores[[10, 25]] = [1.0, 0.9]  # two clusters (gap 8), windows [0, 20) and [15, 35)
    result = select_windows(scores, RetrievalConfig(top_n=2, gap=8, window=20))
    assert len(result.clusters) == 2
    assert result.windows == ((0, 35),)


def test_merge_windows_joins_overlapping_and_touching():
    assert merge_windows([(5, 10), (10, 12), (1, 3), (2, 4), (20, 20)]) == [(1, 4), (5, 12)]
    assert merge_windows([]) == []


def test_top_n_larger_than_context_and_empty_context():
    result = select_windows([0.1, 0.5, 0.2], RetrievalConfig(top_n=10, gap=0, window=1))
    assert result.top_positions == (1, 2, 0)
    assert result.clusters == ((0,), (1,), (2,))
    assert result.windows == ((0, 3),)  # three touching one-token windows
    empty = select_windows(np.zeros(0))
    assert empty.windows == () and empty.mask.shape == (0,)


def test_positions_mask_and_recall():
    windows = [(0, 10), (20, 25)]
    assert windows_to_positions(windows).tolist() == list(range(10)) + list(range(20, 25))
    assert windows_to_positions([]).tolist() == []
    assert windows_to_mask(windows, 10, offset=18).tolist() == [False] * 2 + [True] * 5 + [False] * 3
    assert retrieval_recall(windows, [5, 9, 10, 22, 22, 30]) == pytest.approx(3 / 5)  # duplicates count once
    with pytest.raises(DynheadsError):
        retrieval_recall(windows, [])


@pytest.mark.parametrize(
    "kwargs", [{"top_n": 0}, {"window": 0}, {"gap": -1}, {"cluster": "kmeans"}, {"representative": "mean"}]
)
def test_bad_config_is_refused(kwargs):
    with pytest.raises(DynheadsError):
        RetrievalConfig(**kwargs)


def test_bad_scores_are_refused():
    with pytest.raises(DynheadsError):
        select_windows(np.ones((2, 3)))
    with pytest.raises(DynheadsError):
        select_windows([0.1, np.nan])
