"""CLI for hallucination detection: ``detect`` (train and evaluate), ``detect-transfer`` and ``detect-apply``."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated, Any

import typer

from dynheads.cli import checks
from dynheads.cli.app import app
from dynheads.cli.options import Opt, Option, with_options
from dynheads.errors import DynheadsError

# detect's --help groups: tracing HaluEval (with --data) and the detectors
Traced = functools.partial(Opt, rich_help_panel="Tracing HaluEval (with --data)")
Fit = functools.partial(Opt, rich_help_panel="Detectors")
DetectConfigFile = Annotated[Path | None, Opt("--config", help="TOML file with DetectConfig settings")]


# The DetectConfig settings both detect and detect-transfer take (declared here, not generated from DetectConfig:
# importing it loads torch, and --help must not).
DETECTOR_OPTIONS = {
    "static_k": Option(Annotated[int | None, Fit(help="static top-k heads in the retrieval features")]),
    "probe": Option(Annotated[str | None, Fit(help="trained MLP probe folder (adds the probe feature sets)")]),
    "feature_sets": Option(
        Annotated[str | None, Fit(help="e.g. retrieval_no_needle,lookback,entropy")], items=str.strip
    ),
    "seed": Option(Annotated[int | None, Fit(help="seed of the cross-validation folds and of the bootstrap")]),
    "bootstrap": Option(Annotated[int | None, Fit(help="bootstrap resamples for the confidence intervals")]),
    "match_length": Option(
        Annotated[
            bool | None,
            Fit(
                "--match-length/--full-length",
                help="compare the answers of a question on their common first tokens only (length control)",
            ),
        ]
    ),
}


def _detect_config(config, **values):
    from dynheads.experiments.detect import DetectConfig

    return checks.checked_config(DetectConfig, config, **values)


@app.command()
@with_options(DETECTOR_OPTIONS)
def detect(
    run_dir: Annotated[
        Path | None,
        typer.Argument(help="traced run directory (e.g. 'dynheads niah --distractor-depth'); leave out with --data"),
    ] = None,
    data: Annotated[
        str | None,
        Traced(
            help="halueval:qa or halueval:dialogue: teacher-force HaluEval's right and "
            "hallucinated answers and detect on them (traces into OUT/trace)"
        ),
    ] = None,
    questions: Annotated[int | None, Traced(help="with --data: questions of the stream (two responses each)")] = None,
    first: Annotated[int | None, Traced(help="with --data: index of the stream's first question")] = None,
    context_boundary: Annotated[
        str | None, Traced(help="with --data: 'prompt' or 'lookback-lens' (assistant header counted as generated)")
    ] = None,
    model: Annotated[str | None, Traced(help="with --data: model (default: the embedded SmolLM2)")] = None,
    static: Annotated[str | None, Fit("--static", help="static head list (default: Eq. 1 ranking per fold)")] = None,
    folds: Annotated[int | None, Fit(help="folds of the cross-validation grouped by question / sample")] = None,
    repeats: Annotated[int | None, Fit(help="cross-validation repeats (seeds seed, seed+1, ...)")] = None,
    out: Annotated[Path | None, Opt("--out", help="output folder (default: RUN_DIR/detect)")] = None,
    config: DetectConfigFile = None,
    **settings,
) -> None:
    """Hallucination detectors (logistic regression per feature set), grouped cross-validation; AUROC/AUPRC."""
    from dynheads.experiments.detect import run_detect

    cfg = _detect_config(config, static=static, folds=folds, repeats=repeats, **settings)
    tracing: dict[str, Any] = {
        "questions": questions,
        "first": first,
        "context_boundary": context_boundary,
        "model": model,
    }
    if data is not None:
        from dynheads.experiments.halueval import HaluevalConfig, trace_halueval

        if run_dir is not None or out is None:
            raise DynheadsError("--data traces its own run: give --out DIR and no RUN_DIR")
        source = trace_halueval(checks.checked_config(HaluevalConfig, None, data=data, **tracing), out / "trace").path
    elif run_dir is None:
        raise DynheadsError("give a traced RUN_DIR or --data halueval:qa / halueval:dialogue")
    elif any(value is not None for value in tracing.values()):
        raise DynheadsError(
            f"--{next(k for k, v in tracing.items() if v is not None).replace('_', '-')} applies only with --data"
        )
    else:
        checks.traced_run(run_dir)
        source = run_dir
    run_detect(source, cfg, out)  # without --out, source is RUN_DIR
    typer.echo((out or source / "detect").joinpath("results.md").read_text(encoding="utf-8"), nl=False)


@app.command("detect-transfer")
@with_options(DETECTOR_OPTIONS)
def detect_transfer(
    first: Annotated[Path, typer.Argument(help="output folder of 'dynheads detect --data halueval:qa'")],
    second: Annotated[Path, typer.Argument(help="output folder of 'dynheads detect --data halueval:dialogue'")],
    out: Annotated[Path, Opt("--out", help="output folder of the transfer table")],
    config: DetectConfigFile = None,
    **settings,
) -> None:
    """Train on one HaluEval task, test on the other (both ways), beside the in-task numbers."""
    from dynheads.experiments.halueval import run_transfer

    cfg = _detect_config(config, **settings)
    for folder in (first, second):
        checks.run_manifest(folder)
    run_transfer(first, second, cfg, out)
    typer.echo((out / "transfer.md").read_text(encoding="utf-8"), nl=False)


@app.command("detect-apply")
def detect_apply(
    detector: Annotated[Path, typer.Argument(help="detector.json written by 'dynheads detect'")],
    trace: Annotated[Path, typer.Argument(help="trace .parquet file of a new generation")],
    answer: Annotated[str | None, Opt(help="true value, to label the tokens beside the scores")] = None,
    out: Annotated[Path | None, Opt("--out", help="CSV file for the per-token scores (default: print)")] = None,
) -> None:
    """Score every token of a trace with a saved detector: probability that it is hallucinated."""
    from dynheads.experiments.detect import apply_detector

    checks.json_file(detector, "detector")
    checks.parquet_file(trace)
    frame = apply_detector(detector, trace, answer)
    if out is None:
        typer.echo(frame.to_string(index=False))
    else:
        frame.to_csv(out, index=False)
        typer.echo(f"wrote {len(frame)} tokens to {out}")
