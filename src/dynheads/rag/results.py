"""The RAG stage's results as one table: mean scores per (strategy, k) over the answers a RAG run recorded.

Both the ``rag`` stage (its ``rag.md``) and the report (the Dynamic RAG verdict) read a run through this.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dynheads.errors import DynheadsError
from dynheads.rag.strategies import RAG_STRATEGIES
from dynheads.runs import RunDir


def rag_table(run: RunDir) -> pd.DataFrame:
    """Mean EM, F1, retrieval recall, retrievals and visible tokens per (strategy, k)."""
    records = run.records()
    if not records:
        raise DynheadsError(f"{run.path} has no finished RAG answers")
    frame = pd.DataFrame(
        [
            {
                "strategy": r["strategy"],
                "k": r["k"] if r["k"] is not None else "-",
                "em": r["metrics"]["em"],
                "f1": r["metrics"]["f1"],
                "retrieval_recall": r["retrieval_recall"],
                "retrievals": r["retrievals"],
                "visible_tokens": float(np.mean(r["visible_tokens"])) if r["visible_tokens"] else np.nan,
                "context_tokens": r["context_tokens"],
            }
            for r in records
        ]
    )
    order = {name: i for i, name in enumerate(RAG_STRATEGIES.names())}  # registration order
    table = (
        frame.groupby(["strategy", "k"], sort=False)
        .agg(
            questions=("em", "size"),
            em=("em", "mean"),
            f1=("f1", "mean"),
            retrieval_recall=("retrieval_recall", "mean"),
            retrievals=("retrievals", "mean"),
            visible_tokens=("visible_tokens", "mean"),
            context_tokens=("context_tokens", "mean"),
        )
        .reset_index()
    )
    # k is an int, or "-" for strategies without heads: sort numerically (as text, 10 and 20 came before 5)
    return table.sort_values(
        ["strategy", "k"],
        key=lambda c: c.map(order) if c.name == "strategy" else c.map(lambda k: -1 if k == "-" else int(k)),
    )
