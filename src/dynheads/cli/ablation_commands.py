"""CLI for Claim 2: ``ablate`` (the per-step ablation grid, Figure 2) and ``ablate-progressive`` (Figure 3).

Each command parses its options into a config, calls ``dynheads.experiments.ablation`` and prints the summary.
"""

from __future__ import annotations

import typer

from dynheads.cli import checks
from dynheads.cli.app import app
from dynheads.cli.options import BatchSize, ConfigFile, RunOut, config_options, with_options
from dynheads.settings import AblationFields, ProgressiveFields


@app.command()
@with_options(config_options(AblationFields))
def ablate(out: RunOut, batch_size: BatchSize = 1, config: ConfigFile = None, **settings) -> None:
    """Per-step head ablation on a NIAH (or HotpotQA) grid: a dose-response of four arms in fractions of each
    step's |D_t| (f = 1, exactly D_t, decides Claim 2; fractions above 1 show compensation, apart), or, with empty
    fractions, the matched grid's heat maps per strategy (paper Figures 2, 6)."""
    from dynheads.experiments.ablation import AblationConfig
    from dynheads.experiments.paper_stages import run_claim2

    if _run(AblationConfig, run_claim2, "ablation", out, batch_size, config, settings):
        typer.echo(f"wrote {out}/summary.md (dose.csv or cells.csv beside it) and the figures in {out}/plots/")


@app.command("ablate-progressive")
@with_options(config_options(ProgressiveFields))
def ablate_progressive(out: RunOut, batch_size: BatchSize = 1, config: ConfigFile = None, **settings) -> None:
    """Mask the first k dynamic heads of every step; compensation by static heads and accuracy per k (Figure 3)."""
    from dynheads.experiments.ablation import ProgressiveConfig, run_progressive

    if _run(ProgressiveConfig, run_progressive, "ablation-progressive", out, batch_size, config, settings):
        typer.echo(f"wrote {out}/progressive.csv and {out}/plots/progressive.png")


def _run(config_class, runner, kind: str, out, batch_size: int, config, settings: dict) -> bool:
    """Check the config, the batch size and ``out`` (a run of ``kind``), run, print the run's summary; False on the
    other ranks of a launcher (torchrun / accelerate launch), where rank 0 alone writes and prints the tables."""
    from dynheads.distributed import is_main

    cfg = checks.checked_config(config_class, config, **settings)
    checks.batch_size(batch_size)
    checks.out_dir(out, kind, cfg)
    run = runner(cfg, out, batch_size=batch_size)
    if not is_main():  # its share is decoded; rank 0 writes summary.md, perhaps after this rank is done
        return False
    typer.echo(run.path.joinpath("summary.md").read_text(encoding="utf-8"), nl=False)
    return True
