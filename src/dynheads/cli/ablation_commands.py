"""CLI for Claim 2: ``ablate`` (the per-step ablation grid, Figure 2) and ``ablate-progressive`` (Figure 3).

Each command parses its options into a config, calls ``dynheads.experiments.ablation`` and prints the summary.
"""

from __future__ import annotations

import typer

from dynheads.cli import checks
from dynheads.cli.app import app
from dynheads.cli.options import BatchSize, ConfigFile, RunOut, config_options, with_options
from dynheads.experiments.settings import AblationFields, ProgressiveFields


@app.command()
@with_options(config_options(AblationFields))
def ablate(out: RunOut, batch_size: BatchSize = 1, config: ConfigFile = None, **settings) -> None:
    """Per-step head ablation on a NIAH (or HotpotQA) grid: metric heat maps per strategy (paper Figures 2, 6)."""
    from dynheads.experiments.ablation import AblationConfig, run_ablation

    cfg = checks.checked_config(AblationConfig, config, **settings)
    checks.batch_size(batch_size)
    checks.out_dir(out, "ablation")
    run = run_ablation(cfg, out, batch_size=batch_size)
    typer.echo(run.path.joinpath("summary.md").read_text(encoding="utf-8"), nl=False)
    typer.echo(f"wrote {out}/cells.csv and the heat maps in {out}/plots/")


@app.command("ablate-progressive")
@with_options(config_options(ProgressiveFields))
def ablate_progressive(out: RunOut, batch_size: BatchSize = 1, config: ConfigFile = None, **settings) -> None:
    """Mask the first k dynamic heads of every step; compensation by static heads and accuracy per k (Figure 3)."""
    from dynheads.experiments.ablation import ProgressiveConfig, run_progressive

    cfg = checks.checked_config(ProgressiveConfig, config, **settings)
    checks.batch_size(batch_size)
    checks.out_dir(out, "ablation-progressive")
    run = run_progressive(cfg, out, batch_size=batch_size)
    typer.echo(run.path.joinpath("summary.md").read_text(encoding="utf-8"), nl=False)
    typer.echo(f"wrote {out}/progressive.csv and {out}/plots/progressive.png")
