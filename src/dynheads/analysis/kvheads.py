"""Export per-head scores as a KV-head matrix ``[layers x kv_heads]`` in DuoAttention's layout.

DuoAttention stores an attention pattern as ``full_attention_heads.tsv`` (one line per layer, one tab-separated
value per KV head: the gate of that KV head in [0, 1], high = retrieval / full KV) and a ``config.json`` that names
the attention-sink and recent-window sizes of the streaming heads. Query-head scores ``[L, H]`` are aggregated over
the ``H / H_kv`` query heads that share a KV head, by ``max`` (a KV head is as important as its best query head:
it must stay whole when any of its query heads retrieves) or ``mean``.

What the clients do with the file (DuoAttention's ``load_attn_pattern`` / ``sparsify_attention_heads``, kvpress's
``DuoAttentionPress``): they clip values to [0, 1] and keep the top fraction of KV heads, ties broken by noise or
sort order. So the export (1) divides the scores by their maximum, so they lie in [0, 1] and none is clipped, (2)
writes DuoAttention's windows (sink 128, recent 256, as in its published patterns and kvpress) unless told
otherwise, always into ``config.json``, and (3) with ``full_heads=N`` writes a thresholded pattern instead: 1 for
the N best KV heads **with a positive score**, 0 elsewhere, and the sparsity that selects exactly them. A budget
beyond the scored heads keeps only those and records the shortfall: a zero-score head is never listed as full.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from dynheads.analysis.headlists import RankedHeads, scored_heads
from dynheads.errors import DynheadsError
from dynheads.heads import check_heads
from dynheads.io import write_json, write_text

Aggregation = Literal["max", "mean"]
AGGREGATIONS: tuple[str, ...] = typing.get_args(Aggregation)
FORMAT = "dynheads-kvheads/1"


KVHead = tuple[int, int]  # (layer, KV head), zero-based


def query_head_scores(heads: RankedHeads, num_layers: int, num_heads: int) -> np.ndarray:
    """``[L, H]`` scores of a head list: its scores (Wu et al.'s mean), or for a ranked list ``1 - rank / N``.
    Heads the list does not name, or names with a score <= 0, score 0; a head the model does not have is refused
    in one line."""
    check_heads(list(heads.heads), num_layers, num_heads)
    scores = np.zeros((num_layers, num_heads), dtype=np.float64)
    total = len(heads.heads)
    for rank, (layer, head) in enumerate(heads.heads):
        scores[layer, head] = max(heads.scores[rank], 0.0) if heads.scores is not None else 1.0 - rank / total
    return scores


def kv_head_ranking(
    heads: RankedHeads, num_layers: int, num_heads: int, num_kv_heads: int, aggregation: Aggregation = "max"
) -> tuple[KVHead, ...]:
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
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise DynheadsError(f"kv_head_matrix takes [layer, head] scores, got shape {scores.shape}")
    layers, heads = scores.shape
    if num_kv_heads < 1 or heads % num_kv_heads:
        raise DynheadsError(f"{heads} query heads cannot be grouped into {num_kv_heads} KV heads")
    grouped = scores.reshape(layers, num_kv_heads, heads // num_kv_heads)
    return grouped.max(-1) if aggregation == "max" else grouped.mean(-1)


DUO_SINK, DUO_RECENT = 128, 256  # DuoAttention's published patterns; kvpress's DuoAttentionPress


def duo_attention_pattern(matrix: np.ndarray, full_heads: int | None = None) -> tuple[np.ndarray, dict]:
    """``[L, H_kv]`` values for the TSV and what they mean: the scores over their maximum (in [0, 1]), or with
    ``full_heads`` a 0/1 pattern of the best ``full_heads`` positive-score KV heads (fewer when fewer score)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if (matrix < 0).any() or not np.isfinite(matrix).all():
        raise DynheadsError("KV-head scores must be finite and non-negative")
    top = float(matrix.max()) if matrix.size else 0.0
    scored = int((matrix > 0).sum())
    meta: dict[str, Any] = {"scored_kv_heads": scored, "raw_max": top}
    if full_heads is None:
        meta["values"] = "scores normalised to [0, 1]: aggregated score / raw_max (0 = no positive score)"
        return (matrix / top if top > 0 else matrix), meta
    if full_heads < 0:
        raise DynheadsError(f"--full-heads takes a number of KV heads >= 0, got {full_heads}")
    order = sorted(zip(*np.nonzero(matrix > 0), strict=True), key=lambda kv: (-matrix[kv], kv))[:full_heads]
    pattern = np.zeros_like(matrix)
    for kv in order:
        pattern[kv] = 1.0
    kept = len(order)
    meta.update(
        values="thresholded: 1 = KV head kept whole (the best positive-score KV heads), 0 = streaming",
        requested_full_kv_heads=full_heads,
        full_kv_heads=kept,
        shortfall=full_heads - kept,
        threshold=0.5,
        duo_attention_sparsity=1.0 - kept / matrix.size,
        how_to_load="DuoAttention: sparsify_attention_heads(heads, sparsity=duo_attention_sparsity) keeps "
        "exactly the 1s (its threshold mode fails upstream when sparsity is None); kvpress: "
        "dynheads.kv.presses.press_from_export(folder) (kvpress's own DuoAttentionPress fetches its published "
        "patterns by checkpoint name and reads no folder)",
    )
    return pattern, meta


def write_duo_attention(
    out_dir: str | Path,
    matrix: np.ndarray,
    *,
    sink: int = DUO_SINK,
    recent: int = DUO_RECENT,
    aggregation: Aggregation,
    source: str,
    num_heads: int,
    full_heads: int | None = None,
    voters: Sequence[tuple[int, int]] = (),
) -> Path:
    """``full_attention_heads.tsv`` (``[L, H_kv]`` values in [0, 1], see ``duo_attention_pattern``) and
    ``config.json`` (window sizes, what the values are, aggregation, source, and ``voters``: the source list's
    positive-score query heads, best first, which ``kv.presses.load_voters`` reads back as the list itself)."""
    out_dir = Path(out_dir)
    values, meta = duo_attention_pattern(matrix, full_heads)
    write_text(
        out_dir / "full_attention_heads.tsv",
        "".join("\t".join(f"{value:.6g}" for value in row) + "\n" for row in values),
    )
    write_json(
        out_dir / "config.json",
        {
            "format": FORMAT,
            "sink_size": sink,
            "recent_size": recent,
            "aggregation": aggregation,
            "num_layers": int(matrix.shape[0]),
            "num_kv_heads": int(matrix.shape[1]),
            "num_query_heads": num_heads,
            "source": source,
            "layout": "rows = layers, columns = KV heads; query head h -> KV head h // (H / H_kv)",
            **meta,
            **({"voters": [[int(layer), int(head)] for layer, head in voters]} if voters else {}),
        },
    )
    return out_dir
