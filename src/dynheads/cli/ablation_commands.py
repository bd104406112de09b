"""CLI for Claim 2: ``ablate`` (the per-step ablation grid, Figure 2) and ``ablate-progressive`` (Figure 3).

Each command parses its options into a config, calls ``dynheads.experiments.ablation`` and prints the summary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynheads.cli.app import app
from dynheads.cli.commands import ConfigFile, Model, Opt
from dynheads.config import build_config, parse_list

Out = Annotated[Path, Opt("--out", help="run directory (re-running resumes it)")]
Lengths = Annotated[str | None, Opt(help="haystack lengths in tokens, e.g. 500,1000,2000")]
Depths = Annotated[str | None, Opt(help="needle depths in [0, 1], e.g. 0,0.25,0.5,0.75,1")]
Runs = Annotated[int | None, Opt(help="samples per (length, depth) cell")]
Static = Annotated[str | None, Opt("--static", help="static head list (Wu et al. JSON or a ranked list)")]
Mode = Annotated[str | None, Opt(help="zero (remove the head's output) or uniform (flat attention)")]
Seed = Annotated[int | None, Opt(help="master seed")]
MaxNewTokens = Annotated[int | None, Opt(help="generation budget per sample")]
Haystack = Annotated[str | None, Opt(help="folder of .txt files (default: Paul Graham essays)")]
Device = Annotated[str | None, Opt(help="cpu or cuda")]
Task = Annotated[str | None, Opt(help="niah (Eq. 1) or hotpotqa (Eq. 2 above --threshold)")]
Threshold = Annotated[str | None, Opt(help="hotpotqa: a head is dynamic above this Eq. 2 score (0.1) or multiple "
                                          "of chance (relative:3)")]
Questions = Annotated[int | None, Opt(help="hotpotqa: questions spread over the grid")]
First = Annotated[int | None, Opt(help="hotpotqa: index of the first question in the data")]
Data = Annotated[str | None, Opt(
    help="hotpotqa: data file (default: synthetic questions); multihop[:hops=2,...]: the multihop task")]


@app.command()
def ablate(
    out: Out,
    model: Model = None,
    strategies: Annotated[str | None, Opt(help="dynamic,static,random,fixed (none always runs too)")] = None,
    heads: Annotated[str | None, Opt(help="heads the fixed strategy masks at every step, e.g. 12-3,4-1")] = None,
    matching: Annotated[str | None, Opt(help="static/random head count: per_step (|D_t| of each step's clean pass, "
                                             "default) or mean (the dynamic run's mean |D_t|, the paper's)")] = None,
    lengths: Lengths = None,
    depths: Depths = None,
    runs: Runs = None,
    static: Static = None,
    mode: Mode = None,
    seed: Seed = None,
    max_new_tokens: MaxNewTokens = None,
    haystack: Haystack = None,
    task: Task = None,
    threshold: Threshold = None,
    questions: Questions = None,
    first: First = None,
    data: Data = None,
    device: Device = None,
    config: ConfigFile = None,
) -> None:
    """Per-step head ablation on a NIAH (or HotpotQA) grid: metric heat maps per strategy (paper Figures 2, 6)."""
    from dynheads.experiments.ablation import AblationConfig, run_ablation

    cfg = build_config(
        AblationConfig, config, model=model, strategies=parse_list(strategies, str.strip),
        heads=parse_list(heads, str.strip), matching=matching, lengths=parse_list(lengths, int),
        depths=parse_list(depths, float),
        runs=runs, static=static, mode=mode, seed=seed, max_new_tokens=max_new_tokens, haystack=haystack, device=device,
        task=task, threshold=threshold, questions=questions, first=first, data=data,
    )
    run = run_ablation(cfg, out)
    typer.echo(run.path.joinpath("summary.md").read_text(encoding="utf-8"), nl=False)
    typer.echo(f"wrote {out}/cells.csv and the heat maps in {out}/plots/")


@app.command("ablate-progressive")
def ablate_progressive(
    out: Out,
    model: Model = None,
    static: Static = None,
    ks: Annotated[str | None, Opt(help="dynamic heads masked per step, e.g. 0,5,10,15,20")] = None,
    lengths: Lengths = None,
    depths: Depths = None,
    runs: Runs = None,
    top_static: Annotated[int | None, Opt(help="size of the static top set the compensation is compared with")] = None,
    mode: Mode = None,
    seed: Seed = None,
    max_new_tokens: MaxNewTokens = None,
    haystack: Haystack = None,
    task: Task = None,
    threshold: Threshold = None,
    questions: Questions = None,
    first: First = None,
    data: Data = None,
    device: Device = None,
    config: ConfigFile = None,
) -> None:
    """Mask the first k dynamic heads of every step; compensation by static heads and accuracy per k (Figure 3)."""
    from dynheads.experiments.ablation import ProgressiveConfig, run_progressive

    cfg = build_config(
        ProgressiveConfig, config, model=model, ks=parse_list(ks, int), lengths=parse_list(lengths, int),
        depths=parse_list(depths, float), runs=runs, static=static, top_static=top_static, mode=mode, seed=seed,
        max_new_tokens=max_new_tokens, haystack=haystack, device=device, task=task, threshold=threshold,
        questions=questions, first=first, data=data,
    )
    run = run_progressive(cfg, out)
    typer.echo(run.path.joinpath("summary.md").read_text(encoding="utf-8"), nl=False)
    typer.echo(f"wrote {out}/progressive.csv and {out}/plots/progressive.png")
