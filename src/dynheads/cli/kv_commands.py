"""CLI for KV retention: ``kv`` (accuracy against the KV budget per policy) and ``kv-export`` (DuoAttention layout).

Each command parses its options into a config, calls ``dynheads.experiments.kv`` / ``dynheads.analysis.kvheads``
and prints a summary.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated

import typer

from dynheads.cli import checks
from dynheads.cli.app import app
from dynheads.cli.options import BatchSize, ConfigFile, Opt, RunOut, config_options, with_options
from dynheads.experiments.settings import KVFields, ModelSettings


@app.command()
@with_options(config_options(KVFields))
def kv(
    out: RunOut,
    batch_size: BatchSize = 1,
    config: ConfigFile = None,
    **settings,
) -> None:
    """Dynamic vs static head-level KV retention on NIAH: accuracy and KV kept per policy and budget."""
    from dynheads.distributed import is_main
    from dynheads.experiments.kv import KVConfig, run_kv

    cfg = checks.checked_config(KVConfig, config, **settings)
    checks.out_dir(out, "kv")
    checks.batch_size(batch_size)
    run = run_kv(cfg, out, batch_size=batch_size)
    if not is_main():  # under torchrun / accelerate launch, rank 0 writes and prints the tables
        return
    typer.echo(run.path.joinpath("summary.md").read_text(encoding="utf-8"), nl=False)
    typer.echo(f"wrote {out}/table.csv, cells.csv and {out}/plots/")


@app.command("kv-export")
@with_options(config_options(ModelSettings))
def kv_export(
    static: Annotated[Path, Opt("--static", help="head list with per-head scores (Wu et al. JSON or ranked list)")],
    out: Annotated[Path, Opt("--out", help="folder for full_attention_heads.tsv and config.json")],
    aggregation: Annotated[str, Opt(help="query heads -> KV head: max or mean")] = "max",
    sink: Annotated[int, Opt(help="sink tokens of streaming heads (DuoAttention's patterns and kvpress: 128)")] = 128,
    recent: Annotated[int, Opt(help="recent window of streaming heads (DuoAttention and kvpress: 256)")] = 256,
    full_heads: Annotated[
        int | None,
        Opt(
            help="write a 0/1 pattern of this many KV heads kept whole (positive-"
            "score heads only; a shortfall is recorded)"
        ),
    ] = None,
    **settings,
) -> None:
    """Write a head list as a \\[layers x kv_heads] matrix in DuoAttention's layout (TSV + config.json).

    Scores normalised to [0, 1], or a 0/1 pattern with --full-heads; zero-score heads are never listed as full."""
    from dynheads.analysis.headlists import load_head_list
    from dynheads.analysis.kvheads import Aggregation, kv_head_matrix, query_head_scores, write_duo_attention
    from dynheads.io import read_json
    from dynheads.kv import num_kv_heads
    from dynheads.models import load_model

    model = checks.checked_config(ModelSettings, **settings)
    checks.head_list(static)
    checks.value("--sink", "sink", checks.at_least(0), sink)
    checks.value("--recent", "recent window", checks.at_least(1), recent)
    checks.value("--full-heads", "full heads", checks.at_least(1), full_heads)
    checks.choice("--aggregation", aggregation, typing.get_args(Aggregation))
    combine = typing.cast(Aggregation, aggregation)  # one of them, checked above
    lm = load_model(model.model, dtype=model.dtype, device=model.device)
    heads = load_head_list(static, lm.num_layers, lm.num_heads)
    matrix = kv_head_matrix(query_head_scores(heads, lm.num_layers, lm.num_heads), num_kv_heads(lm), combine)
    write_duo_attention(
        out,
        matrix,
        sink=sink,
        recent=recent,
        aggregation=combine,
        source=str(static),
        num_heads=lm.num_heads,
        full_heads=full_heads,
    )
    config = read_json(Path(out) / "config.json")
    shortfall = f"; {config['shortfall']} short of {full_heads}" if config.get("shortfall") else ""
    typer.echo(
        f"wrote {out}/full_attention_heads.tsv ({matrix.shape[0]} x {matrix.shape[1]}, "
        f"{config['scored_kv_heads']} KV heads with a positive score{shortfall}) and config.json"
    )
