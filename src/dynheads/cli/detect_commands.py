"""CLI for token-level hallucination detection: ``detect`` (train and evaluate) and ``detect-apply``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynheads.cli.app import app
from dynheads.cli.options import Opt
from dynheads.config import build_config, parse_list


@app.command()
def detect(
    run_dir: Annotated[Path, typer.Argument(help="traced run directory (e.g. 'dynheads niah --distractor-depth')")],
    static: Annotated[str | None, Opt("--static", help="static head list (default: Eq. 1 ranking on train)")] = None,
    static_k: Annotated[int | None, Opt(help="static top-k heads in the retrieval features")] = None,
    probe: Annotated[str | None, Opt(help="trained MLP probe folder (adds the 'probe' feature set)")] = None,
    feature_sets: Annotated[str | None, Opt(help="e.g. copy_heads,retrieval,lookback,entropy")] = None,
    test_fraction: Annotated[float | None, Opt(help="share of samples held out for evaluation")] = None,
    seed: Annotated[int | None, Opt(help="seed of the split and the bootstrap")] = None,
    bootstrap: Annotated[int | None, Opt(help="bootstrap resamples for the confidence intervals")] = None,
    out: Annotated[Path | None, Opt("--out", help="output folder (default: RUN_DIR/detect)")] = None,
    config: Annotated[Path | None, Opt("--config", help="TOML file with DetectConfig settings")] = None,
) -> None:
    """Token-level hallucination detectors (logistic regression per feature set), split by sample; AUROC/AUPRC."""
    from dynheads.experiments.detect import DetectConfig, run_detect

    cfg = build_config(DetectConfig, config, static=static, static_k=static_k, probe=probe,
                       feature_sets=parse_list(feature_sets, str), test_fraction=test_fraction, seed=seed,
                       bootstrap=bootstrap)
    run_detect(run_dir, cfg, out)
    typer.echo((out or run_dir / "detect").joinpath("results.md").read_text(encoding="utf-8"), nl=False)


@app.command("detect-apply")
def detect_apply(
    detector: Annotated[Path, typer.Argument(help="detector.json written by 'dynheads detect'")],
    trace: Annotated[Path, typer.Argument(help="trace .parquet file of a new generation")],
    answer: Annotated[str | None, Opt(help="true value, to label the tokens beside the scores")] = None,
    out: Annotated[Path | None, Opt("--out", help="CSV file for the per-token scores (default: print)")] = None,
) -> None:
    """Score every token of a trace with a saved detector: probability that it is hallucinated."""
    from dynheads.experiments.detect import apply_detector

    frame = apply_detector(detector, trace, answer)
    if out is None:
        typer.echo(frame.to_string(index=False))
    else:
        frame.to_csv(out, index=False)
        typer.echo(f"wrote {len(frame)} tokens to {out}")
