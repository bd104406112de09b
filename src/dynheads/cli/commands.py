"""CLI commands ``rag``, ``reproduce``, ``report``, ``compare``, ``rules``, ``view`` and ``rerank``. Each one parses
its options into a config, checks it and calls the Python API; nothing else happens here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynheads.cli import checks
from dynheads.cli.app import app
from dynheads.cli.options import BatchSize, ConfigFile, Opt, RunArg, RunOut, config_options, with_options
from dynheads.errors import DynheadsError
from dynheads.settings import RagFields, ReproduceConfig, RerankFields
from dynheads.stages import study_stages


@app.command()
@with_options(config_options(RagFields, flags={"ks": "k"}))
def rag(out: RunOut, batch_size: BatchSize = 1, config: ConfigFile = None, **settings) -> None:
    """Dynamic RAG with head-based in-context retrieval: EM/F1 and retrieval recall per strategy and k."""
    from dynheads.distributed import is_main
    from dynheads.experiments.rag import RagConfig, run_rag

    cfg = checks.checked_config(RagConfig, config, flags={"ks": "k"}, **settings)
    checks.out_dir(out, "rag", cfg)
    checks.batch_size(batch_size)
    run = run_rag(cfg, out, batch_size=batch_size)
    if not is_main():  # under torchrun / accelerate launch, rank 0 writes and prints the tables
        return
    typer.echo((run.path / "rag.md").read_text(encoding="utf-8"), nl=False)  # the table and its notes (skips)


@app.command()
@with_options(config_options(ReproduceConfig))
def reproduce(
    out: Annotated[Path, Opt("--out", help="output folder (re-running continues where it stopped)")],
    processes: Annotated[
        int,
        Opt(
            "--processes",
            help="run the study in this many processes on this machine (a CPU: one per core, each with its share "
            "of --threads; the same results as one process); under torchrun, leave it at 1",
        ),
    ] = 1,
    batch_size: Annotated[
        int | None,
        Opt(
            "--batch-size",
            help="records decoded together by every stage that decodes (tracing, static, the dose-responses' "
            "clean answers, progressive, RAG; default: the preset's, standard 4, else 1, the reference path); "
            "larger batches give batch 1's results up to fp32 rounding",
        ),
    ] = None,
    stages: Annotated[
        str | None,
        Opt(
            "--stages",
            help="run only these stages of the study, comma-separated, e.g. hotpotqa-static,hotpotqa,"
            "hotpotqa-set-probe (the others later, into the same --out; the report says which did not run); the "
            f"stages, in run order: {', '.join(study_stages())}",
        ),
    ] = None,
    config: ConfigFile = None,
    **settings,
) -> None:
    """Run the whole study (every table and figure of the paper) and write report.md and report.html."""
    from dynheads.distributed import is_main
    from dynheads.experiments.reproduce import reproduce as run_all
    from dynheads.report import write_report

    cfg = checks.checked_config(ReproduceConfig, config, **settings)
    checks.preset_values(cfg.preset)
    checks.out_dir(out, "reproduce")
    if batch_size is not None:
        checks.batch_size(batch_size)
    only = [name.strip() for name in stages.split(",") if name.strip()] if stages is not None else None
    folder = run_all(cfg, out, processes=processes, batch_size=batch_size, only=only)
    if not is_main():  # under torchrun / accelerate launch, rank 0 writes the report
        return
    _, html = write_report(folder)
    typer.echo(f"report: {html} and {html.with_suffix('.md')}")


@app.command()
def report(study: Annotated[Path, typer.Argument(help="study folder written by 'dynheads reproduce'")]) -> None:
    """Write report.md and report.html again from a study folder's stage results (no model is loaded)."""
    from dynheads.report import write_report

    manifest = study / "manifest.json"
    found = checks.json_file(manifest, "study manifest") if manifest.is_file() else None
    if not isinstance(found, dict) or found.get("kind") != "reproduce":
        why = "its manifest.json does not say kind=reproduce" if manifest.is_file() else "it has no manifest.json"
        raise DynheadsError(f"{study} is not a study folder written by 'dynheads reproduce' ({why})")
    _, html = write_report(study)
    typer.echo(f"report: {html} and {html.with_suffix('.md')}")


@app.command()
def compare(
    folders: Annotated[
        list[Path],
        typer.Argument(
            help="study folders ('dynheads reproduce'), traced run folders, or the compare.json of an earlier "
            "comparison (its models without their folders), of any number of models"
        ),
    ],
    out: Annotated[Path, Opt("--out", help="folder for compare.md, compare.html, compare.json and the figure")],
    by_study: Annotated[bool, Opt("--by-study", help="a column per study folder, not per model")] = False,
) -> None:
    """Put studies of several models side by side: the verdict matrix, Table 1 beside the paper's rows, the
    statistics against model size and each model's task accuracy (no model is loaded)."""
    from dynheads.report.compare_page import write_compare

    _, html = write_compare(folders, out, by_study=by_study)
    typer.echo(f"comparison: {html} and {html.with_suffix('.md')}")


@app.command()
def rules(
    out: Annotated[Path, Opt("--out", help="folder for rules.csv and rules.md")],
    studies: Annotated[
        int, Opt("--studies", min=1, help="simulated studies per scenario (power and false alarms: SE ~ 0.5/sqrt(n))")
    ] = 40,
    seed: Annotated[int, Opt("--seed", help="seed of the simulated studies")] = 0,
    claim: Annotated[
        list[str] | None,
        Opt("--claim", help="only this claim's rules: 1, 2, 3, rag or write (repeatable; default: all)"),
    ] = None,
    scenario: Annotated[
        list[str] | None,
        Opt(
            "--scenario",
            help="only the scenario of this name (repeatable; its first studies are the full run's: pin one rule's "
            "power or false alarm with more --studies); an unknown name lists them",
        ),
    ] = None,
    threads: Annotated[int | None, Opt("--threads", min=1, help="torch CPU threads (default: torch's)")] = None,
) -> None:
    """Run every verdict rule on simulated studies whose answer is known, at the standard preset's sample counts:
    each rule's power, false alarms and what it says of the paper's own rows; which rules may decide a verdict
    (no model is loaded)."""
    from dynheads.report import claims as claim_names
    from dynheads.report.rules import rules_table, run_rules
    from dynheads.tables import to_markdown

    if threads:
        import torch

        torch.set_num_threads(threads)
    names = {
        "1": claim_names.CLAIM1,
        "2": claim_names.CLAIM2,
        "3": claim_names.CLAIM3,
        "rag": claim_names.RAG,
        "write": claim_names.WRITE,
    }
    unknown = [c for c in claim or [] if c not in names]
    if unknown:
        raise typer.BadParameter(f"unknown claim {unknown[0]!r}: use one of {', '.join(names)}", param_hint="--claim")
    checks = run_rules(
        out,
        studies,
        seed,
        [names[c] for c in claim] if claim else None,
        lambda line: typer.echo(line, err=True),
        scenarios=scenario,
    )
    typer.echo(to_markdown(rules_table(checks)))
    typer.echo(f"wrote {out}/rules.csv and {out}/rules.md")


@app.command()
def view(
    run: RunArg,
    out: Annotated[Path | None, Opt("--out", help="HTML file to write; default RUN_DIR/view.html")] = None,
) -> None:
    """Write the per-step view of any traced run: at each generated token, which heads retrieved and where each
    looked (one HTML file, no model is loaded)."""
    from dynheads.report.view import write_view

    checks.traced_run(run)
    if out is not None and out.is_dir():
        raise DynheadsError(f"--out {out} is a folder: give the HTML file to write")
    typer.echo(f"per-step view: {write_view(run, out)}")


@app.command()
@with_options(config_options(RerankFields))
def rerank(
    out: RunOut,
    config: ConfigFile = None,
    summary_only: Annotated[
        bool,
        Opt(
            "--summary-only", help="rank and summarise the questions already scored in --out; score none, load no model"
        ),
    ] = False,
    **settings,
) -> None:
    """Heads as a re-ranker (ICR, QRHead, static, predicted, random heads) beside BM25 on HotpotQA's candidates."""
    from dynheads.distributed import is_main
    from dynheads.experiments.rerank import RerankConfig, run_rerank, summarise_scored

    cfg = checks.checked_config(RerankConfig, config, **settings)
    checks.out_dir(out, "rerank")
    run = summarise_scored(cfg, out) if summary_only else run_rerank(cfg, out)
    if not is_main():  # under torchrun / accelerate launch, rank 0 writes and prints the tables
        return
    typer.echo((run.path / "rerank.md").read_text(encoding="utf-8"), nl=False)
