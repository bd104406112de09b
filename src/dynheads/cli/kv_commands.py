"""CLI for KV retention: ``kv`` (accuracy against the KV budget per policy) and ``kv-export`` (DuoAttention layout).

Each command parses its options into a config, calls ``dynheads.experiments.kv`` / ``dynheads.analysis.kvheads``
and prints a summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynheads.cli.app import app
from dynheads.cli.options import (
    MODEL,
    NIAH_GRID,
    STATIC_HELP,
    ConfigFile,
    Device,
    Dtype,
    Model,
    Opt,
    RunOut,
    option,
    with_options,
)
from dynheads.config import build_config
from dynheads.errors import DynheadsError


@app.command()
@with_options(
    MODEL, NIAH_GRID,
    policies=option("full,none,static,probe,random,oracle,true", items=str.strip),
    budgets=option("fractions of query heads with full KV, e.g. 0.05,0.1,0.25,0.5", items=float),
    sink=option("sink tokens of streaming heads (default 4)", kind=int | None),
    recent=option("recent window of streaming heads (default 64)", kind=int | None),
    static=option(STATIC_HELP, "--static"),
    probe=option("trained probe folder, for the probe policy"),
    probe_select=option("probe policy: top (k heads) or threshold"),
    lengths=option("haystack lengths in tokens, e.g. 1000", items=int),
    depths=option("needle depths in [0, 1]", items=float),
    split=option("seed stream of the evaluation samples (default analysis)"),
)
def kv(
    out: RunOut,
    shard: Annotated[str, Opt(help="i/n: decode every n-th sample from the i-th (n processes fill one run)")] = "0/1",
    config: ConfigFile = None,
    **settings,
) -> None:
    """Dynamic vs static head-level KV retention on NIAH: accuracy and KV kept per policy and budget."""
    from dynheads.experiments.kv import KVConfig, run_kv

    cfg = build_config(KVConfig, config, **settings)
    try:
        index, count = (int(part) for part in shard.split("/"))
    except ValueError:
        raise DynheadsError(f"--shard takes i/n such as 0/2, got {shard!r}") from None
    run = run_kv(cfg, out, shard=(index, count))
    typer.echo(run.path.joinpath("summary.md").read_text(encoding="utf-8"), nl=False)
    typer.echo(f"wrote {out}/table.csv, cells.csv and {out}/plots/")


@app.command("kv-export")
def kv_export(
    static: Annotated[Path, Opt("--static", help="head list with per-head scores (Wu et al. JSON or ranked list)")],
    out: Annotated[Path, Opt("--out", help="folder for full_attention_heads.tsv and config.json")],
    model: Model = None,
    dtype: Dtype = None,
    device: Device = None,
    aggregation: Annotated[str, Opt(help="query heads -> KV head: max or mean")] = "max",
    sink: Annotated[int, Opt(help="sink tokens of streaming heads")] = 4,
    recent: Annotated[int, Opt(help="recent window of streaming heads")] = 64,
) -> None:
    """Write a head list as a [layers x kv_heads] matrix in DuoAttention's layout (TSV + config.json)."""
    from dynheads.analysis.headlists import load_head_list
    from dynheads.analysis.kvheads import kv_head_matrix, query_head_scores, write_duo_attention
    from dynheads.kv import num_kv_heads
    from dynheads.models import load_model

    lm = load_model(model, dtype=dtype or "auto", device=device)
    heads = load_head_list(static, lm.num_layers, lm.num_heads)
    matrix = kv_head_matrix(query_head_scores(heads, lm.num_layers, lm.num_heads), num_kv_heads(lm), aggregation)
    write_duo_attention(out, matrix, sink=sink, recent=recent, aggregation=aggregation, source=str(static),
                        num_heads=lm.num_heads)
    typer.echo(f"wrote {out}/full_attention_heads.tsv ({matrix.shape[0]} x {matrix.shape[1]}) and config.json")
