"""Head scores fused with BM25 (``dynheads.rag.fusion``): reciprocal-rank fusion, the interpolation and its fit."""

from __future__ import annotations

import numpy as np
import pytest

from dynheads import DynheadsError
from dynheads.analysis.ranking import ranking
from dynheads.rag import fusion


def test_reciprocal_rank_fusion_sums_one_over_60_plus_each_rank():
    head, bm25 = np.array([0.9, 0.1, 0.5]), np.array([1.0, 3.0, 2.0])  # head ranks 1, 3, 2; bm25 ranks 3, 1, 2
    fused = fusion.fuse("rrf", head, bm25)
    assert np.allclose(fused, [1 / 61 + 1 / 63, 1 / 63 + 1 / 61, 1 / 62 + 1 / 62])
    assert fusion.ranks(np.array([2.0, 2.0, 1.0])).tolist() == [1, 2, 3]  # ties keep candidate order


def test_interpolation_runs_from_bm25_to_the_heads():
    head, bm25 = np.array([3.0, 1.0, 2.0]), np.array([0.0, 5.0, 10.0])
    assert ranking(fusion.fuse("mix", head, bm25, 1.0)) == ranking(head)
    assert ranking(fusion.fuse("mix", head, bm25, 0.0)) == ranking(bm25)
    assert fusion.min_max(np.array([4.0, 4.0])).tolist() == [0.0, 0.0]  # a constant vector says nothing
    with pytest.raises(DynheadsError, match="needs its weight"):
        fusion.fuse("mix", head, bm25)
    with pytest.raises(DynheadsError, match="unknown fusion"):
        fusion.fuse("max", head, bm25)


def test_the_fitted_weight_is_the_one_that_ranks_the_gold_first():
    # Question a: the heads rank the gold (0, 1) first, BM25 puts them last; question b: BM25 is right and the
    # heads one place wrong; a middle weight gets every gold into the top 2, either end misses some.
    heads = [np.array([1.0, 0.9, 0.0, 0.0]), np.array([0.45, 0.4, 0.5, 0.0])]
    bm25 = [np.array([0.0, 0.0, 0.6, 1.0]), np.array([1.0, 0.9, 0.0, 0.0])]
    weight, grid = fusion.fit_weight(heads, bm25, [[0, 1], [0, 1]])
    best = max(row["recall@2"] for row in grid)
    assert best == 1.0 and 0 < weight < 1 and (grid[0]["recall@2"], grid[-1]["recall@2"]) == (0.5, 0.75)
    assert weight == min(row["weight"] for row in grid if row["recall@2"] == 1.0)  # ties go toward BM25
    same = [np.array([1.0, 0.0, 0.0])]
    assert fusion.fit_weight(same, same, [[0]])[0] == 0.0  # nothing to choose between: BM25's end
    with pytest.raises(DynheadsError, match="needs questions"):
        fusion.fit_weight([], [], [])
