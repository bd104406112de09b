"""CLI for KV retention: ``kv`` (accuracy against the KV budget per policy) and ``kv-export`` (DuoAttention layout).

Each command parses its options into a config, calls ``dynheads.experiments.kv`` / ``dynheads.analysis.kvheads``
and prints a summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynheads.cli.app import app
from dynheads.cli.commands import ConfigFile, Model, Opt
from dynheads.config import build_config, parse_list
from dynheads.errors import DynheadsError


@app.command()
def kv(
    out: Annotated[Path, Opt("--out", help="run directory (re-running resumes it)")],
    model: Model = None,
    policies: Annotated[str | None, Opt(help="full,none,static,probe,random,oracle,true")] = None,
    budgets: Annotated[str | None, Opt(help="fractions of query heads with full KV, e.g. 0.05,0.1,0.25,0.5")] = None,
    sink: Annotated[int | None, Opt(help="sink tokens of streaming heads (default 4)")] = None,
    recent: Annotated[int | None, Opt(help="recent window of streaming heads (default 64)")] = None,
    static: Annotated[str | None, Opt("--static", help="static head list (Wu et al. JSON or a ranked list)")] = None,
    probe: Annotated[str | None, Opt(help="trained probe folder, for the probe policy")] = None,
    probe_select: Annotated[str | None, Opt(help="probe policy: top (k heads) or threshold")] = None,
    lengths: Annotated[str | None, Opt(help="haystack lengths in tokens, e.g. 1000")] = None,
    depths: Annotated[str | None, Opt(help="needle depths in [0, 1]")] = None,
    runs: Annotated[int | None, Opt(help="samples per (length, depth) cell")] = None,
    seed: Annotated[int | None, Opt(help="master seed")] = None,
    split: Annotated[str | None, Opt(help="seed stream of the evaluation samples (default analysis)")] = None,
    max_new_tokens: Annotated[int | None, Opt(help="generation budget per sample")] = None,
    haystack: Annotated[str | None, Opt(help="folder of .txt files (default: Paul Graham essays)")] = None,
    device: Annotated[str | None, Opt(help="cpu or cuda")] = None,
    shard: Annotated[str, Opt(help="i/n: decode every n-th sample from the i-th (n processes fill one run)")] = "0/1",
    config: ConfigFile = None,
) -> None:
    """Dynamic vs static head-level KV retention on NIAH: accuracy and KV kept per policy and budget."""
    from dynheads.experiments.kv import KVConfig, run_kv

    cfg = build_config(
        KVConfig, config, model=model, policies=parse_list(policies, str.strip), budgets=parse_list(budgets, float),
        sink=sink, recent=recent, static=static, probe=probe, probe_select=probe_select,
        lengths=parse_list(lengths, int), depths=parse_list(depths, float), runs=runs, seed=seed, split=split,
        max_new_tokens=max_new_tokens, haystack=haystack, device=device,
    )
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
    aggregation: Annotated[str, Opt(help="query heads -> KV head: max or mean")] = "max",
    sink: Annotated[int, Opt(help="sink tokens of streaming heads")] = 4,
    recent: Annotated[int, Opt(help="recent window of streaming heads")] = 64,
) -> None:
    """Write a head list as a [layers x kv_heads] matrix in DuoAttention's layout (TSV + config.json)."""
    from dynheads.analysis.headlists import load_head_list
    from dynheads.analysis.kvheads import kv_head_matrix, query_head_scores, write_duo_attention
    from dynheads.kv import num_kv_heads
    from dynheads.models import load_model

    lm = load_model(model)
    heads = load_head_list(static, lm.num_layers, lm.num_heads)
    matrix = kv_head_matrix(query_head_scores(heads, lm.num_layers, lm.num_heads), num_kv_heads(lm), aggregation)
    write_duo_attention(out, matrix, sink=sink, recent=recent, aggregation=aggregation, source=str(static),
                        num_heads=lm.num_heads)
    typer.echo(f"wrote {out}/full_attention_heads.tsv ({matrix.shape[0]} x {matrix.shape[1]}) and config.json")
