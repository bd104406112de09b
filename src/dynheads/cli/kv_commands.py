"""CLI for KV retention: ``kv`` (accuracy against the KV budget per policy), ``kv-join`` (one table of several KV
runs of the same samples) and ``kv-export`` (DuoAttention layout).

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
from dynheads.settings import KVExportSettings, KVFields


@app.command()
@with_options(config_options(KVFields))
def kv(
    out: RunOut,
    batch_size: BatchSize = 1,
    config: ConfigFile = None,
    **settings,
) -> None:
    """Dynamic vs static head-level KV retention on NIAH (or any registered task, --task): accuracy and KV kept
    per policy and budget."""
    from dynheads.distributed import is_main
    from dynheads.experiments.kv import KVConfig, run_kv

    cfg = checks.checked_config(KVConfig, config, **settings)
    checks.out_dir(out, "kv", cfg)
    checks.batch_size(batch_size)
    run = run_kv(cfg, out, batch_size=batch_size)
    if not is_main():  # under torchrun / accelerate launch, rank 0 writes and prints the tables
        return
    typer.echo(run.path.joinpath("summary.md").read_text(encoding="utf-8"), nl=False)
    typer.echo(f"wrote {out}/table.csv, cells.csv and {out}/plots/")


@app.command("kv-join")
def kv_join(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help="KV run folders ('dynheads kv') of the same samples (one: its own tables with --pair rows)"
        ),
    ],
    out: Annotated[Path, Opt("--out", help="folder for the joined table.csv, summary.md, join.json and plots/")],
    pair: Annotated[
        list[str] | None,
        Opt(
            "--pair",
            help="TREATED,CONTROL: paired difference by sample at every budget both were measured at (repeatable), "
            "e.g. --pair kvpress:head_tokens,kvpress:snapkv",
        ),
    ] = None,
) -> None:
    """One KV table and Pareto figure of several KV runs of the same samples (more budgets, policies or presses
    measured later); arms measured twice are checked for equal generations (no model is loaded)."""
    from dynheads.views.kv_join import join_kv_runs

    joined = join_kv_runs(runs, out, [checks.policy_pair(p) for p in pair or []])
    typer.echo(out.joinpath("summary.md").read_text(encoding="utf-8"), nl=False)
    typer.echo(f"joined {len(runs)} runs on {joined['samples']} samples: wrote {out}/table.csv, join.json, plots/")


@app.command("kv-export")
@with_options(config_options(KVExportSettings))
def kv_export(
    static: Annotated[Path, Opt("--static", help="head list with per-head scores (Wu et al. JSON or ranked list)")],
    out: Annotated[Path, Opt("--out", help="folder for full_attention_heads.tsv and config.json")],
    **settings,
) -> None:
    """Write a head list as a \\[layers x kv_heads] matrix in DuoAttention's layout (TSV + config.json).

    Scores normalised to [0, 1], or a 0/1 pattern with --full-heads; zero-score heads are never listed as full.
    Reads the model's config only (layers, query and KV heads), never its weights."""
    from dynheads.analysis.headlists import load_head_list, scored_heads
    from dynheads.analysis.kvheads import Aggregation, kv_head_matrix, query_head_scores, write_duo_attention
    from dynheads.io import read_json
    from dynheads.models import load_shape

    cfg = checks.checked_config(KVExportSettings, **settings)
    checks.head_list(static)
    combine = typing.cast(Aggregation, cfg.aggregation)  # one of them, checked by the config
    shape = load_shape(cfg.model)
    heads = load_head_list(static, shape.num_layers, shape.num_heads)
    scores = query_head_scores(heads, shape.num_layers, shape.num_heads)
    matrix = kv_head_matrix(scores, shape.num_kv_heads, combine)
    write_duo_attention(
        out,
        matrix,
        sink=cfg.sink,
        recent=cfg.recent,
        aggregation=combine,
        source=str(static),
        num_heads=shape.num_heads,
        full_heads=cfg.full_heads,
        voters=scored_heads(heads),
    )
    written = f"{matrix.shape[0]} x {matrix.shape[1]}, {kept_heads_line(read_json(Path(out) / 'config.json'))}"
    typer.echo(f"wrote {out}/full_attention_heads.tsv ({written}) and config.json")


def kept_heads_line(config: dict) -> str:
    """What an export's TSV holds, from its config.json: with --full-heads the KV heads kept whole (and any
    shortfall: fewer KV heads than asked have a positive score), else how many KV heads have a positive score."""
    scored = f"{config['scored_kv_heads']} KV heads with a positive score"
    if "full_kv_heads" not in config:
        return scored
    shortfall = config.get("shortfall")
    short = f", {shortfall} short of {config['requested_full_kv_heads']}" if shortfall else ""
    return f"{config['full_kv_heads']} KV heads kept whole ({scored}{short})"
