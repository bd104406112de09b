"""Export per-head scores as a KV-head matrix ``[layers x kv_heads]`` in DuoAttention's layout.

DuoAttention stores an attention pattern as ``full_attention_heads.tsv`` (one line per layer, one tab-separated
value per KV head: the gate of that KV head, high = retrieval / full KV) and a ``config.json`` that names the
attention-sink and recent-window sizes of the streaming heads. Query-head scores ``[L, H]`` are aggregated over
the ``H / H_kv`` query heads that share a KV head, by ``max`` (a KV head is as important as its best query head:
the rule under which a KV head must stay full when any of its query heads retrieves) or ``mean``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from dynheads.analysis.headlists import RankedHeads, scored_heads
from dynheads.errors import DynheadsError
from dynheads.io import write_json, write_text

Aggregation = Literal["max", "mean"]
FORMAT = "dynheads-kvheads/1"


KVHead = tuple[int, int]  # (layer, KV head), zero-based


def query_head_scores(heads: RankedHeads, num_layers: int, num_heads: int) -> np.ndarray:
    """``[L, H]`` scores of a head list: its scores (Wu et al.'s mean), or for a ranked list ``1 - rank / N``.
    Heads the list does not name, or names with a score <= 0, score 0."""
    scores = np.zeros((num_layers, num_heads), dtype=np.float64)
    total = len(heads.heads)
    for rank, (layer, head) in enumerate(heads.heads):
        scores[layer, head] = max(heads.scores[rank], 0.0) if heads.scores is not None else 1.0 - rank / total
    return scores


def kv_head_ranking(heads: RankedHeads, num_layers: int, num_heads: int, num_kv_heads: int,
                    aggregation: Aggregation = "max") -> tuple[KVHead, ...]:
    """KV heads ranked by their aggregated score, best first, **scored ones only**: a KV head none of whose query
    heads has a positive score is not in the ranking (never filler). Ties: (layer, KV head) ascending."""
    scored = set(scored_heads(heads))
    matrix = kv_head_matrix(query_head_scores(heads, num_layers, num_heads), num_kv_heads, aggregation)
    groups = num_heads // num_kv_heads
    kept = {(layer, head // groups) for layer, head in scored}
    return tuple(sorted(kept, key=lambda kv: (-matrix[kv], kv)))


def kv_head_matrix(scores: np.ndarray, num_kv_heads: int, aggregation: Aggregation = "max") -> np.ndarray:
    """``[L, H] -> [L, H_kv]``: query head h belongs to KV head ``h // (H / H_kv)`` (transformers' GQA layout)."""
    if aggregation not in ("max", "mean"):
        raise DynheadsError(f"unknown KV-head aggregation {aggregation!r}: use 'max' or 'mean'")
    layers, heads = scores.shape
    if num_kv_heads < 1 or heads % num_kv_heads:
        raise DynheadsError(f"{heads} query heads cannot be grouped into {num_kv_heads} KV heads")
    grouped = scores.reshape(layers, num_kv_heads, heads // num_kv_heads)
    return grouped.max(-1) if aggregation == "max" else grouped.mean(-1)


def write_duo_attention(out_dir: str | Path, matrix: np.ndarray, *, sink: int, recent: int,
                        aggregation: Aggregation, source: str, num_heads: int) -> Path:
    """``full_attention_heads.tsv`` (``[L, H_kv]`` scores) and ``config.json`` (sizes, aggregation, source)."""
    out_dir = Path(out_dir)
    write_text(out_dir / "full_attention_heads.tsv",
               "".join("\t".join(f"{value:.6g}" for value in row) + "\n" for row in matrix))
    write_json(out_dir / "config.json", {
        "format": FORMAT, "sink_size": sink, "recent_size": recent, "aggregation": aggregation,
        "num_layers": int(matrix.shape[0]), "num_kv_heads": int(matrix.shape[1]), "num_query_heads": num_heads,
        "source": source, "layout": "rows = layers, columns = KV heads; query head h -> KV head h // (H / H_kv)",
    })
    return out_dir
