"""CLI for hallucination detection: ``detect`` (train and evaluate), ``detect-transfer`` and ``detect-apply``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynheads.cli import checks
from dynheads.cli.app import app
from dynheads.cli.options import BatchSize, Opt, config_options, with_options
from dynheads.errors import DynheadsError
from dynheads.settings import DetectConfig, HaluevalConfig

DetectConfigFile = Annotated[Path | None, Opt("--config", help="TOML file with DetectConfig settings")]
# detect also traces HaluEval (with --data); what it traces is a HaluevalConfig, the detectors a DetectConfig
TRACED = "Tracing HaluEval (with --data)"  # --help panel of the options that apply only with --data
TRACING = config_options(HaluevalConfig, skip=("data",), panel=TRACED)


@app.command()
@with_options(TRACING, config_options(DetectConfig))
def detect(
    run_dir: Annotated[
        Path | None,
        typer.Argument(help="traced run directory (e.g. 'dynheads niah --distractor-depth'); leave out with --data"),
    ] = None,
    data: Annotated[
        str | None,
        Opt(
            help="halueval:qa or halueval:dialogue: teacher-force HaluEval's right and "
            "hallucinated answers and detect on them (traces into OUT/trace)",
            rich_help_panel=TRACED,
        ),
    ] = None,
    out: Annotated[Path | None, Opt("--out", help="output folder (default: RUN_DIR/detect)")] = None,
    batch_size: BatchSize = 1,
    config: DetectConfigFile = None,
    **settings,
) -> None:
    """Hallucination detectors (logistic regression per feature set), grouped cross-validation; AUROC/AUPRC."""
    from dynheads.distributed import is_main
    from dynheads.views.detect import run_detect

    tracing = {name: settings.pop(name) for name in TRACING}
    cfg = checks.checked_config(DetectConfig, config, **settings)
    if data is not None:
        from dynheads.experiments.halueval import trace_halueval

        if run_dir is not None or out is None:
            raise DynheadsError("--data traces its own run: give --out DIR and no RUN_DIR")
        traced = checks.checked_config(HaluevalConfig, None, data=data, **tracing)
        source = trace_halueval(traced, out / "trace", batch_size=checks.batch_size(batch_size)).path
        if not is_main():  # under torchrun / accelerate launch, every rank traced its share; rank 0 detects
            return
    elif run_dir is None:
        raise DynheadsError("give a traced RUN_DIR or --data halueval:qa / halueval:dialogue")
    elif batch_size != 1 or any(value is not None for value in tracing.values()):
        given = "batch_size" if batch_size != 1 else next(k for k, v in tracing.items() if v is not None)
        raise DynheadsError(f"--{given.replace('_', '-')} applies only with --data")
    else:
        checks.traced_run(run_dir)
        source = run_dir
    run_detect(source, cfg, out)  # without --out, source is RUN_DIR
    typer.echo((out or source / "detect").joinpath("results.md").read_text(encoding="utf-8"), nl=False)


@app.command("detect-transfer")
@with_options(config_options(DetectConfig, skip=("static", "folds", "repeats")))  # no folds: one task trains
def detect_transfer(
    first: Annotated[Path, typer.Argument(help="output folder of 'dynheads detect --data halueval:qa'")],
    second: Annotated[Path, typer.Argument(help="output folder of 'dynheads detect --data halueval:dialogue'")],
    out: Annotated[Path, Opt("--out", help="output folder of the transfer table")],
    config: DetectConfigFile = None,
    **settings,
) -> None:
    """Train on one HaluEval task, test on the other (both ways), beside the in-task numbers."""
    from dynheads.experiments.halueval import run_transfer

    cfg = checks.checked_config(DetectConfig, config, **settings)
    for folder in (first, second):
        checks.run_manifest(folder)
    run_transfer(first, second, cfg, out)
    typer.echo((out / "transfer.md").read_text(encoding="utf-8"), nl=False)


@app.command("detect-apply")
def detect_apply(
    detector: Annotated[Path, typer.Argument(help="detector.json written by 'dynheads detect'")],
    trace: Annotated[Path, typer.Argument(help="trace .parquet file of a new generation")],
    answer: Annotated[
        str | None,
        Opt(help="true value, to label the tokens beside the scores: 0 faithful, 1 hallucinated, -1 outside the value"),
    ] = None,
    out: Annotated[Path | None, Opt("--out", help="CSV file for the per-token scores (default: print)")] = None,
) -> None:
    """Score every token of a trace with a saved detector: probability that it is hallucinated."""
    from dynheads.analysis.detector import apply_detector

    checks.json_file(detector, "detector")
    checks.parquet_file(trace)
    frame = apply_detector(detector, trace, answer)
    if out is None:
        typer.echo(frame.to_string(index=False))
    else:
        frame.to_csv(out, index=False)
        typer.echo(f"wrote {len(frame)} tokens to {out}")
