"""Each rule read on the paper's own published rows (``paper_rows.csv``: every number with the table it comes
from), for ``report.rules``: how many rows a rule can be read on, how many it calls supported, and how many it calls
"not supported" although the paper reports the claim there.

Claim 1's rules on Table 1 (five models), from the numbers a row gives (mean |D_t| = m, its std s, the heads H,
the Jaccard with the static top-20 J, the adjacent-step Jaccard and the entropy):

- ``containment``: the share of D_t inside the static top-20, at the mean size, solved from J:
  |D_t ∩ S_20| = J (m + 20) / (1 + J); its share above chance (20 / H) must stay below 0.8.
- ``adjacent``: (Adj. Jaccard - chance) / (ceiling - chance), the ceiling E[min/max] of two step sizes drawn
  independently from a gamma distribution of the row's mean and std (a pair with an empty step counts 0, as
  Table 1 counts it; independent sizes give the lowest ceiling, so the highest share is not claimed), chance
  m / (2H - m); it must stay below 0.5. A raw value of 0.5 or more fails under any ceiling.
- ``entropy``: (S - ln m) / (ln H - ln m), ln H bounding the entropy of random sets from above (so the share is the
  smallest the row allows); it must exceed 0.15.
- ``ranking``: the paper reports no frequency baseline and no within-step measure: no row can be read.

RAG on Table 4 (five models, k = 5) and Table 6 (llama3.1-8b, k = 10 and 20): Dynamic minus Static F1 above 0 at the
row's point estimate (the paper prints no interval); the paper itself bolds Static on llama3.2-3b, so the rule's
"not supported" there agrees with the paper. Claims 2 and 3: the paper gives no per-step harm in nats, no shuffled
CCA control and no predictor baseline, so no row can be read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

import numpy as np
import pandas as pd

from dynheads.report import claims

CEILING_DRAWS = 200_000


@dataclass(frozen=True)
class PaperCheck:
    rows: int
    supported: int
    not_supported: int
    note: str


def paper_rows() -> pd.DataFrame:
    """``paper_rows.csv``: table, model, column, value, source (one published number a row)."""
    with resources.files("dynheads.report").joinpath("paper_rows.csv").open() as handle:
        return pd.read_csv(handle)


def table_rows(table: str) -> dict[str, dict[str, float]]:
    """One published table as {model: {column: value}}."""
    rows = paper_rows()
    rows = rows[rows["table"] == table]
    return {model: dict(zip(group["column"], group["value"], strict=True)) for model, group in rows.groupby("model")}


def claim1_shares() -> pd.DataFrame:
    """Per Table 1 row: the containment, adjacent-step and entropy shares the paper's numbers imply."""
    out = []
    for model, row in table_rows("table1").items():
        m, total, jaccard = row["mean_size"], row["total_heads"], row["jaccard_static_k20"]
        inside = jaccard * (m + 20) / (1 + jaccard)
        chance = 20 / total
        containment = (min(1.0, inside / min(m, 20)) - chance) / (1 - chance)
        adjacent_chance = m / (2 * total - m)
        ceiling = size_ceiling(m, row["std_size"])
        adjacent = (row["adjacent_jaccard"] - adjacent_chance) / (ceiling - adjacent_chance)
        entropy = (row["entropy"] - math.log(m)) / (math.log(total) - math.log(m))
        out.append(
            {
                "model": model,
                "containment": containment,
                "adjacent": adjacent,
                "adjacent_raw": row["adjacent_jaccard"],
                "ceiling": ceiling,
                "entropy": entropy,
            }
        )
    return pd.DataFrame(out)


def size_ceiling(mean: float, std: float, seed: int = 0) -> float:
    """E[min/max] of two step sizes drawn independently (gamma of ``mean`` and ``std``, rounded), 0 where one is
    empty (Table 1 counts such a pair as Jaccard 0), pairs of two empty steps left out."""
    rng = np.random.default_rng(seed)
    shape = (mean / std) ** 2
    sizes = np.rint(rng.gamma(shape, mean / shape, (CEILING_DRAWS, 2)))
    kept = sizes.max(axis=1) > 0
    return float((sizes[kept].min(axis=1) / sizes[kept].max(axis=1)).mean())


def paper_checks() -> dict[tuple[str, str], PaperCheck]:
    """(claim, rule) -> what the rule says of the paper's rows (rules the paper gives no number for are absent)."""
    shares = claim1_shares()
    checks = {
        (claims.CLAIM1, "containment"): _count(shares, "containment", lambda v: v < claims.STATIC_SHARE_MAX),
        (claims.CLAIM1, "adjacent"): _count(shares, "adjacent", lambda v: v < claims.ADJACENT_SHARE_MAX),
        (claims.CLAIM1, "entropy"): _count(shares, "entropy", lambda v: v > claims.ENTROPY_SHARE_MIN),
    }
    checks[(claims.RAG, "rag")] = _rag_check()
    return checks


def _count(shares: pd.DataFrame, column: str, supports) -> PaperCheck:
    values = dict(zip(shares["model"], shares[column], strict=True))
    supported = [model for model, value in values.items() if supports(value)]
    against = [model for model in values if model not in supported]
    note = "; ".join(f"{model} {value:.3f}" for model, value in values.items())
    return PaperCheck(len(values), len(supported), len(against), f"{column} share per Table 1 row: {note}")


def _rag_check() -> PaperCheck:
    rows = {**table_rows("table4"), **table_rows("table6")}
    effects = {model: row["dynamic_f1"] - row["static_f1"] for model, row in rows.items()}
    supported = [model for model, effect in effects.items() if effect > claims.RAG_MARGIN]
    note = "; ".join(f"{model} {effect:+.4f}" for model, effect in effects.items())
    return PaperCheck(
        len(effects),
        len(supported),
        0,  # where Dynamic - Static <= 0 the paper reports Static ahead too (its bold)
        f"Dynamic - Static F1 per row (Tables 4 and 6, point estimates): {note}",
    )


# What the paper's published rows give each claim's deciding rules (``report.claims``): no number they read, except
# RAG's (Tables 4 and 6). tests/test_rules.py checks that no deciding rule of these claims has a paper check.
PAPER_UNREADABLE = {
    claims.CLAIM1: "not readable: no frequency baseline in the paper (Table 2)",
    claims.CLAIM2: "not readable: no per-step harm in nats in the paper",
    claims.CLAIM3: "not readable: in-sample CCA only, no shuffled control",
    claims.WRITE: "not readable: the paper has no write score (beyond the paper)",
}


def paper_reading(claim: str) -> str:
    """What the rule deciding ``claim`` says of the paper's own rows, in one line (``dynheads compare``'s last
    column; ``dynheads rules`` has the detail)."""
    if claim == claims.RAG:
        check = paper_checks()[(claims.RAG, "rag")]
        return f"{check.supported} of {check.rows} rows above 0 (Tables 4 and 6, point estimates)"
    return PAPER_UNREADABLE.get(claim, "–")
