"""CLI for static heads and the analyses of a run: ``static``, ``dynamism``, ``plot heads``, ``cca``,
``predictor train`` (the MLP head predictor; ``probe train`` is its older name).

Each command parses its options, calls the Python API (``dynheads.experiments``) and prints a short summary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from dynheads.analysis.settings import CCAConfig, HeadPredictorConfig
from dynheads.cli import checks
from dynheads.cli.app import app, plot_app, predictor_app
from dynheads.cli.options import STATIC_HELP, ConfigFile, Opt, RunArg, RunOut, config_options, with_options
from dynheads.config import parse_range
from dynheads.errors import DynheadsError
from dynheads.settings import (
    DynamismSettings,
    HeadPlotSettings,
    PredictorTarget,
    ScoreChoice,
    StaticConfig,
    StaticReasoningConfig,
)

OutDir = Annotated[Path | None, Opt("--out", help="folder for the outputs (default: inside the run directory)")]


@app.command()
@with_options(config_options(StaticConfig))
def static(out: RunOut, config: ConfigFile = None, **settings) -> None:
    """Find the static retrieval heads of a model (Wu et al.'s scoring) on NIAH samples disjoint from analysis runs."""
    from dynheads.experiments.static import run_static

    cfg = checks.checked_config(StaticConfig, config, **settings)
    checks.out_dir(out, cfg.task)  # the static grid is a run of the needle task
    heads = run_static(cfg, out)
    suffix = "" if cfg.score == "copy" else f"-{cfg.score}"
    typer.echo(
        f"pass rate {heads.num_counted}/{heads.num_tests} ({heads.pass_rate:.0%}) at ROUGE-1 recall > "
        f"{cfg.success_threshold}; wrote {out}/static_heads{suffix}.json, static_ranking{suffix}.csv, "
        f"static_summary{suffix}.json"
    )
    typer.echo(_top20(heads))


@app.command("static-qrhead")
@with_options(config_options(StaticConfig, skip=("score", "success_threshold", "max_new_tokens")))
def static_qrhead(out: RunOut, config: ConfigFile = None, **settings) -> None:
    """QRHead's heads on the static needle stream: the question rows' attention on the needle, calibrated by a
    content-free query, mean over tests (no generation); a list beside Wu's for the detector panel (ablate --panel)."""
    from dynheads.experiments.static import run_static_qrhead

    cfg = checks.checked_config(StaticConfig, config, **settings)
    checks.out_dir(out, "static-qrhead", cfg)
    run_static_qrhead(cfg, out)
    summary = (Path(out) / "static_summary-qrhead.json").read_text(encoding="utf-8")
    typer.echo(f"wrote {out}/static_heads-qrhead.json, static_ranking-qrhead.csv, static_summary-qrhead.json")
    typer.echo("top-20: " + " ".join(json.loads(summary)["top20"]))


@app.command("static-reasoning")
@with_options(config_options(StaticReasoningConfig))
def static_reasoning(out: RunOut, config: ConfigFile = None, **settings) -> None:
    """Static reasoning heads for HotpotQA: mean Eq. 2 score per head over a question stream of their own."""
    from dynheads.experiments.static import run_static_reasoning

    heads = run_static_reasoning(checks.checked_config(StaticReasoningConfig, config, **settings), out)
    typer.echo(
        f"{heads.num_counted}/{heads.num_tests} questions counted; wrote {out}/static_heads.json, "
        "static_ranking.csv, static_summary.json"
    )
    typer.echo(_top20(heads))


@app.command()
@with_options(config_options(DynamismSettings))
def dynamism(
    run_dir: RunArg, static_file: Annotated[Path, Opt("--static", help=STATIC_HELP)], out: OutDir = None, **settings
) -> None:
    """Table 1 / Table 5 statistics of a run's dynamic heads beside the paper's; writes dynamism.md/.csv/.json."""
    from dynheads.views.analyses import dynamism_report

    cfg = checks.checked_config(DynamismSettings, **settings)
    checks.traced_run(run_dir)
    checks.head_list(static_file)
    dynamism_report(
        run_dir,
        static_file,
        score=cfg.score,
        threshold=cfg.threshold,
        fit_run=cfg.fit_run,
        out_dir=out,
        beside=cfg.beside,
    )
    typer.echo((out or run_dir).joinpath("dynamism.md").read_text(encoding="utf-8"), nl=False)


@plot_app.command("heads")
@with_options(config_options(HeadPlotSettings))
def plot_heads(
    run_dir: RunArg,
    sample: Annotated[list[str] | None, Opt(help="sample id (repeatable; default: every sample)")] = None,
    out: Annotated[Path | None, Opt("--out", help="folder for the PNGs (default: RUN_DIR/plots)")] = None,
    **settings,
) -> None:
    """Figure 1: per-step scores of the most varying heads, one PNG per sample (heads-<sample_id>.png)."""
    from dynheads.views.analyses import plot_heads as plot

    cfg = checks.checked_config(HeadPlotSettings, **settings)
    checks.traced_run(run_dir)
    for path in plot(run_dir, sample, score=cfg.score, top=cfg.top, out_dir=out):
        typer.echo(str(path))


@app.command("compare-records")
def compare_records(
    run_dir: RunArg,
    first: Annotated[str, typer.Argument(help="a sample id of the run (a custom run: your record's id)")],
    second: Annotated[str, typer.Argument(help="another sample id of the same run")],
    threshold: Annotated[
        str | None,
        Opt(
            help="Eq. 2 threshold of a reasoning task's dynamic heads (default: the dynamism default; a copy task "
            "uses Eq. 1)"
        ),
    ] = None,
) -> None:
    """Two records of a traced run side by side: heads dynamic in both, in one only, over the answer and per step."""
    from dynheads.views.record_compare import compare_records as compare

    checks.traced_run(run_dir)
    typer.echo(compare(run_dir, first, second, **({"threshold": threshold} if threshold else {})).text())


@app.command()
@with_options(config_options(CCAConfig), config_options(ScoreChoice))
def cca(
    run_dir: RunArg,
    offsets: Annotated[str, Opt(help="temporal offsets k, e.g. 0-10 or 0,1,5")] = "0-10",
    out: OutDir = None,
    config: Annotated[Path | None, Opt("--config", help="TOML file with CCAConfig settings")] = None,
    **settings,
) -> None:
    """Temporal-offset CCA of hidden states against head scores (in-sample, held-out, shuffled); cca.* and cca.png."""
    from dynheads.analysis.cca import cca_markdown
    from dynheads.views.analyses import cca_report

    score = checks.checked_config(ScoreChoice, score=settings.pop("score")).score
    cca_config, steps = checks.checked_config(CCAConfig, config, **settings), parse_range(offsets)
    checks.value("--offsets", "offset", checks.at_least(0), steps)
    checks.traced_run(run_dir)
    table = cca_report(run_dir, steps, cca_config, score=score, out_dir=out)
    typer.echo(cca_markdown(table), nl=False)


@predictor_app.command("train")
@with_options(config_options(HeadPredictorConfig), config_options(PredictorTarget))
def predictor_train(
    run_dir: RunArg,
    device: Annotated[str, Opt(help="cpu or cuda")] = "cpu",
    out: Annotated[Path | None, Opt("--out", help="probe folder (default: RUN_DIR/probe)")] = None,
    config: Annotated[Path | None, Opt("--config", help="TOML file with HeadPredictorConfig settings")] = None,
    **settings,
) -> None:
    """Train the MLP head predictor from the hidden state to every head's score (offset 0).

    Saves it with metrics.md/.json into OUT (default RUN_DIR/probe); 'dynheads probe train' is its older name."""
    from dynheads.views.probing import train_probe_on_run
    from dynheads.views.threshold_fit import resolve_threshold

    target = checks.checked_config(PredictorTarget, **{k: settings.pop(k) for k in ("score", "threshold", "fit_run")})
    cfg = checks.checked_config(HeadPredictorConfig, config, **settings)
    checks.traced_run(run_dir)
    sets = None
    if target.threshold is not None:  # W_t: the sets the threshold decides, checked and fitted as dynamism's
        sets = resolve_threshold(target.threshold, target.score, run_dir, target.fit_run)
    elif target.fit_run is not None:
        raise DynheadsError("--fit-run fits a --threshold: give one (e.g. --threshold null:0.1)")
    train_probe_on_run(run_dir, cfg, score=target.score, out_dir=out, device=device, sets=sets)
    typer.echo((out or run_dir / "probe").joinpath("metrics.md").read_text(encoding="utf-8"), nl=False)


def _top20(heads) -> str:
    """The static list's best 20 heads that score above 0, and how many those are when fewer."""
    from dynheads.heads import head_label

    top = heads.scored_top(20)
    note = "" if len(top) >= 20 else f" (only {len(top)} heads score above 0)"
    return f"top-20{note}: " + " ".join(head_label(head) for head in top)
