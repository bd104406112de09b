"""CLI commands. Each one parses options into a config and calls the Python API; nothing else happens here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynheads.cli.app import app
from dynheads.cli.options import (
    CHAT_TEMPLATE_HELP,
    MODEL,
    NIAH_GRID,
    QA_GRID,
    BatchSize,
    ConfigFile,
    Device,
    DeviceMap,
    Model,
    Opt,
    RunOut,
    option,
    with_options,
)
from dynheads.config import build_config
from dynheads.distributed import is_main

TRACING = {"chat_template_kwargs": option(CHAT_TEMPLATE_HELP, "--chat-template-kwargs")}


@app.command()
@with_options(MODEL, NIAH_GRID, TRACING,
              distractor_depth=option("add a similar 'secret word' distractor at this depth", kind=float | None),
              distractor_prefix=option("characters the distractor UUID shares with the needle", kind=int | None))
def niah(out: RunOut, batch_size: BatchSize = 1, device_map: DeviceMap = None, config: ConfigFile = None,
         **settings) -> None:
    """Trace greedy generation on a Needle-in-a-Haystack grid, scoring every head at every step."""
    from dynheads.experiments.niah import NiahConfig, run_niah

    run = run_niah(build_config(NiahConfig, config, **settings), out, batch_size=batch_size, device_map=device_map)
    if not is_main():  # under torchrun / accelerate launch, rank 0 summarises
        return
    frame = run.write_results()
    typer.echo(
        f"{len(frame)} samples in {out}: accuracy {frame['metrics.accuracy'].mean():.3f}, "
        f"ROUGE-L {frame['metrics.rouge_l'].mean():.3f}"
    )


QA_DATA = {"data": option(
    "HotpotQA JSON/JSONL file or saved dataset (default: synthetic); multihop[:hops=2,...]: multihop task")}


@app.command()
@with_options(MODEL, QA_DATA, QA_GRID, TRACING)
def hotpotqa(out: RunOut, batch_size: BatchSize = 1, device_map: DeviceMap = None, config: ConfigFile = None,
             **settings) -> None:
    """Trace multi-hop QA (HotpotQA or its synthetic stand-in), scoring every head at every step with Eq. 2."""
    from dynheads.experiments.hotpotqa import HotpotConfig, run_hotpotqa

    cfg = build_config(HotpotConfig, config, **settings)
    run = run_hotpotqa(cfg, out, batch_size=batch_size, device_map=device_map)
    if not is_main():
        return
    frame = run.write_results()
    em, f1 = frame["metrics.em"].mean(), frame["metrics.f1"].mean()
    skipped = run.manifest().get("skipped", {})
    reasons = "; ".join(f"{n} {why}" for why, n in skipped.get("by_reason", {}).items())
    typer.echo(f"{len(frame)} questions in {out}: EM {em:.3f}, F1 {f1:.3f}; "
               f"{skipped.get('count', 0)} (question, cell) pairs skipped" + (f" ({reasons})" if reasons else ""))


@app.command()
@with_options(
    MODEL, QA_GRID,
    probe=option("trained probe folder, for the 'dynamic' strategy"),
    static=option("static head list JSON, for the 'static' strategy", "--static"),
    strategies=option("dynamic,static,dynamic-random,fixed-random,none,full-context", items=str),
    k=option("heads per retrieval, e.g. 5,10,20", "--k", items=int, field="ks"),
    data=option("HotpotQA file (default: synthetic questions); multihop[:hops=2,...]: the multihop task"),
    lengths=option("context lengths in tokens", items=int),
    depths=option("gold-paragraph depths in [0, 1]", items=float),
    threshold=option("RIND threshold θ", kind=float | None),
    top_n=option("top attended context positions that are clustered", kind=int | None),
    window=option("tokens shown around each cluster", kind=int | None),
    max_new_tokens=option("answer budget in tokens", kind=int | None),
)
def rag(out: RunOut, config: ConfigFile = None, **settings) -> None:
    """Dynamic RAG with head-based in-context retrieval: EM/F1 and retrieval recall per strategy and k."""
    from dynheads.experiments.rag import RagConfig, run_rag

    run = run_rag(build_config(RagConfig, config, **settings), out)
    typer.echo((run.path / "rag.md").read_text(encoding="utf-8"), nl=False)  # the table and its notes (skips)


@app.command()
def reproduce(
    out: Annotated[Path, Opt("--out", help="output folder (re-running continues where it stopped)")],
    model: Model = None,
    preset: Annotated[str, Opt(help="quick: 2-core CPU, minutes; paper: the paper's sizes (GPU); smoke")] = "quick",
    hotpotqa: Annotated[str | None, Opt("--hotpotqa", help="real HotpotQA file (default: synthetic)")] = None,
    seed: Annotated[int, Opt(help="master seed of every stage")] = 0,
    device: Device = None,
) -> None:
    """Run the whole study (every table and figure of the paper) and write report.md and report.html."""
    from dynheads.experiments.reproduce import ReproduceConfig
    from dynheads.experiments.reproduce import reproduce as run_all
    from dynheads.report import write_report

    folder = run_all(ReproduceConfig(model=model, preset=preset, hotpotqa=hotpotqa, seed=seed, device=device), out)
    _, html = write_report(folder)
    typer.echo(f"report: {html} and {html.with_suffix('.md')}")
