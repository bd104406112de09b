"""CLI for Claim 2: ``ablate`` (the per-step ablation grid, Figure 2) and ``ablate-progressive`` (Figure 3).

Each command parses its options into a config, calls ``dynheads.experiments.ablation`` and prints the summary.
"""

from __future__ import annotations

import typer

from dynheads.cli.app import app
from dynheads.cli.options import ABLATION_TASK, MODEL, NIAH_GRID, STATIC_HELP, ConfigFile, RunOut, option, with_options
from dynheads.config import build_config

# the order of the options in --help: the grid, then the ablation's own settings, then the HotpotQA variant
ABLATION = {"static": option(STATIC_HELP, "--static"),
            "mode": option("zero (remove the head's output) or uniform (flat attention)")}


@app.command()
@with_options(
    MODEL, NIAH_GRID, ABLATION, ABLATION_TASK,
    strategies=option("dynamic,static,random,fixed (none always runs too)", items=str.strip),
    heads=option("heads the fixed strategy masks at every step, e.g. 12-3,4-1", items=str.strip),
    matching=option("static/random head count: per_step (|D_t| of each step's clean pass, default) or mean (the "
                    "dynamic run's mean |D_t|, the paper's)"),
)
def ablate(out: RunOut, config: ConfigFile = None, **settings) -> None:
    """Per-step head ablation on a NIAH (or HotpotQA) grid: metric heat maps per strategy (paper Figures 2, 6)."""
    from dynheads.experiments.ablation import AblationConfig, run_ablation

    run = run_ablation(build_config(AblationConfig, config, **settings), out)
    typer.echo(run.path.joinpath("summary.md").read_text(encoding="utf-8"), nl=False)
    typer.echo(f"wrote {out}/cells.csv and the heat maps in {out}/plots/")


@app.command("ablate-progressive")
@with_options(
    MODEL, NIAH_GRID, ABLATION, ABLATION_TASK,
    ks=option("dynamic heads masked per step, e.g. 0,5,10,15,20", items=int),
    top_static=option("size of the static top set the compensation is compared with", kind=int | None),
)
def ablate_progressive(out: RunOut, config: ConfigFile = None, **settings) -> None:
    """Mask the first k dynamic heads of every step; compensation by static heads and accuracy per k (Figure 3)."""
    from dynheads.experiments.ablation import ProgressiveConfig, run_progressive

    run = run_progressive(build_config(ProgressiveConfig, config, **settings), out)
    typer.echo(run.path.joinpath("summary.md").read_text(encoding="utf-8"), nl=False)
    typer.echo(f"wrote {out}/progressive.csv and {out}/plots/progressive.png")
