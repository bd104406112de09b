"""CLI commands. Each one parses options into a config and calls the Python API; nothing else happens here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynheads.cli.app import app
from dynheads.cli.options import BatchSize, ConfigFile, DeviceMap, Opt, RunOut, config_options, with_options
from dynheads.config import build_config
from dynheads.distributed import is_main
from dynheads.errors import DynheadsError
from dynheads.experiments.settings import HotpotConfig, NiahConfig, RagFields, ReproduceConfig, RerankFields
from dynheads.io import read_json


@app.command()
@with_options(config_options(NiahConfig))
def niah(out: RunOut, batch_size: BatchSize = 1, device_map: DeviceMap = None, config: ConfigFile = None,
         **settings) -> None:
    """Trace greedy generation on a Needle-in-a-Haystack grid, scoring every head at every step."""
    from dynheads.experiments.niah import run_niah

    run = run_niah(build_config(NiahConfig, config, **settings), out, batch_size=batch_size, device_map=device_map)
    if not is_main():  # under torchrun / accelerate launch, rank 0 summarises
        return
    frame = run.write_results()
    typer.echo(
        f"{len(frame)} samples in {out}: accuracy {frame['metrics.accuracy'].mean():.3f}, "
        f"ROUGE-L {frame['metrics.rouge_l'].mean():.3f}"
    )


@app.command()
@with_options(config_options(HotpotConfig))
def hotpotqa(out: RunOut, batch_size: BatchSize = 1, device_map: DeviceMap = None, config: ConfigFile = None,
             **settings) -> None:
    """Trace multi-hop QA (HotpotQA or its synthetic stand-in), scoring every head at every step with Eq. 2."""
    from dynheads.experiments.hotpotqa import run_hotpotqa

    cfg = build_config(HotpotConfig, config, **settings)
    run = run_hotpotqa(cfg, out, batch_size=batch_size, device_map=device_map)
    if not is_main():
        return
    frame = run.write_results()
    em, f1 = frame["metrics.em"].mean(), frame["metrics.f1"].mean()
    skipped = run.manifest().get("skipped", {})
    reasons = "; ".join(f"{n} {why}" for why, n in skipped.get("by_reason", {}).items())
    chance = (run.path / "summary.json").is_file() and read_json(run.path / "summary.json")["documents"][
        "summary.md"]["numbers"].get("candidates")
    typer.echo(f"{len(frame)} questions in {out}: EM {em:.3f}, F1 {f1:.3f}; "
               f"{skipped.get('count', 0)} (question, cell) pairs skipped" + (f" ({reasons})" if reasons else "")
               + (f"; chance (random candidate) EM {chance['chance']:.3f}, first / last candidate "
                  f"{chance['first']:.3f} / {chance['last']:.3f} (summary.md)" if chance else ""))


@app.command()
@with_options(config_options(RagFields, flags={"ks": "k"}))
def rag(out: RunOut, config: ConfigFile = None, **settings) -> None:
    """Dynamic RAG with head-based in-context retrieval: EM/F1 and retrieval recall per strategy and k."""
    from dynheads.experiments.rag import RagConfig, run_rag

    run = run_rag(build_config(RagConfig, config, **settings), out)
    typer.echo((run.path / "rag.md").read_text(encoding="utf-8"), nl=False)  # the table and its notes (skips)


@app.command()
@with_options(config_options(ReproduceConfig))
def reproduce(
    out: Annotated[Path, Opt("--out", help="output folder (re-running continues where it stopped)")],
    config: ConfigFile = None,
    **settings,
) -> None:
    """Run the whole study (every table and figure of the paper) and write report.md and report.html."""
    from dynheads.experiments.reproduce import reproduce as run_all
    from dynheads.report import write_report

    folder = run_all(build_config(ReproduceConfig, config, **settings), out)
    _, html = write_report(folder)
    typer.echo(f"report: {html} and {html.with_suffix('.md')}")


@app.command()
def report(study: Annotated[Path, typer.Argument(help="study folder written by 'dynheads reproduce'")]) -> None:
    """Write report.md and report.html again from a study folder's stage results (no model is loaded)."""
    from dynheads.report import write_report

    manifest = study / "manifest.json"
    if not manifest.is_file() or read_json(manifest).get("kind") != "reproduce":
        raise DynheadsError(f"{study} is not a study folder written by 'dynheads reproduce' (its manifest.json "
                            "does not say kind=reproduce)")
    _, html = write_report(study)
    typer.echo(f"report: {html} and {html.with_suffix('.md')}")


@app.command()
@with_options(config_options(RerankFields))
def rerank(out: RunOut, config: ConfigFile = None,
           summary_only: Annotated[bool, Opt("--summary-only", help="rank and summarise the questions already scored "
                                                                    "in --out; score none, load no model")] = False,
           **settings) -> None:
    """Heads as a re-ranker (ICR, QRHead, static, predicted, random heads) beside BM25 on HotpotQA's candidates."""
    from dynheads.experiments.rerank import RerankConfig, run_rerank, summarise_scored

    cfg = build_config(RerankConfig, config, **settings)
    run = summarise_scored(cfg, out) if summary_only else run_rerank(cfg, out)
    typer.echo((run.path / "rerank.md").read_text(encoding="utf-8"), nl=False)
