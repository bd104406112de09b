"""CLI commands. Each one parses options into a config and calls the Python API; nothing else happens here."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dynheads.cli.app import app
from dynheads.config import build_config, parse_list
from dynheads.distributed import is_main

Opt = typer.Option
ConfigFile = Annotated[Path | None, Opt("--config", help="TOML file with settings; flags override it")]
First = Annotated[int | None, Opt(help="index of the first question in the data (question streams must not overlap)")]
Model = Annotated[str | None, Opt("--model", help="hub id, local folder or .gguf file (default: embedded SmolLM2)")]
ChatTemplateKwargs = Annotated[str | None, Opt(
    "--chat-template-kwargs",
    help='JSON object of chat-template variables over the pinned ones (enable_thinking false, date_string '
         '"26 Jul 2024"), e.g. \'{"enable_thinking": true}\'')]
BatchSize = Annotated[int, Opt("--batch-size", help="samples decoded together (1 = reference path; same results)")]
DeviceMap = Annotated[str | None, Opt("--device-map", help="spread a large model over GPUs, e.g. auto")]


@app.command()
def niah(
    out: Annotated[Path, Opt("--out", help="run directory (re-running resumes it)")],
    model: Model = None,
    lengths: Annotated[str | None, Opt(help="haystack lengths in tokens, e.g. 500,1000,2000")] = None,
    depths: Annotated[str | None, Opt(help="needle depths in [0, 1], e.g. 0,0.25,0.5,0.75,1")] = None,
    runs: Annotated[int | None, Opt(help="samples per (length, depth) cell")] = None,
    seed: Annotated[int | None, Opt(help="master seed")] = None,
    max_new_tokens: Annotated[int | None, Opt(help="generation budget per sample")] = None,
    haystack: Annotated[str | None, Opt(help="folder of .txt files (default: Paul Graham essays)")] = None,
    distractor_depth: Annotated[float | None, Opt(help="add a similar 'secret word' distractor at this depth")] = None,
    distractor_prefix: Annotated[int | None, Opt(help="characters the distractor UUID shares with the needle")] = None,
    device: Annotated[str | None, Opt(help="cpu or cuda")] = None,
    chat_template_kwargs: ChatTemplateKwargs = None,
    batch_size: BatchSize = 1,
    device_map: DeviceMap = None,
    config: ConfigFile = None,
) -> None:
    """Trace greedy generation on a Needle-in-a-Haystack grid, scoring every head at every step."""
    from dynheads.experiments.niah import NiahConfig, run_niah

    cfg = build_config(
        NiahConfig, config, model=model, lengths=parse_list(lengths, int), depths=parse_list(depths, float),
        runs=runs, seed=seed, max_new_tokens=max_new_tokens, haystack=haystack, device=device,
        distractor_depth=distractor_depth, distractor_prefix=distractor_prefix,
        chat_template_kwargs=chat_template_kwargs,
    )
    run = run_niah(cfg, out, batch_size=batch_size, device_map=device_map)
    if not is_main():  # under torchrun / accelerate launch, rank 0 summarises
        return
    frame = run.write_results()
    typer.echo(
        f"{len(frame)} samples in {out}: accuracy {frame['metrics.accuracy'].mean():.3f}, "
        f"ROUGE-L {frame['metrics.rouge_l'].mean():.3f}"
    )


@app.command()
def hotpotqa(
    out: Annotated[Path, Opt("--out", help="run directory (re-running resumes it)")],
    model: Model = None,
    data: Annotated[str | None, Opt(
        help="HotpotQA JSON/JSONL file or saved dataset (default: synthetic); multihop[:hops=2,...]: multihop task"),
    ] = None,
    questions: Annotated[int | None, Opt(help="number of questions")] = None,
    first: First = None,
    lengths: Annotated[str | None, Opt(help="context lengths in tokens, e.g. 250,500,1000")] = None,
    depths: Annotated[str | None, Opt(help="gold-paragraph depths in [0, 1], e.g. 0.05,0.5,0.95")] = None,
    seed: Annotated[int | None, Opt(help="master seed")] = None,
    max_new_tokens: Annotated[int | None, Opt(help="generation budget per question")] = None,
    device: Annotated[str | None, Opt(help="cpu or cuda")] = None,
    chat_template_kwargs: ChatTemplateKwargs = None,
    batch_size: BatchSize = 1,
    device_map: DeviceMap = None,
    config: ConfigFile = None,
) -> None:
    """Trace multi-hop QA (HotpotQA or its synthetic stand-in), scoring every head at every step with Eq. 2."""
    from dynheads.experiments.hotpotqa import HotpotConfig, run_hotpotqa

    cfg = build_config(
        HotpotConfig, config, model=model, data=data, questions=questions, first=first,
        lengths=parse_list(lengths, int),
        depths=parse_list(depths, float), seed=seed, max_new_tokens=max_new_tokens, device=device,
        chat_template_kwargs=chat_template_kwargs,
    )
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
def rag(
    out: Annotated[Path, Opt("--out", help="run directory (re-running resumes it)")],
    model: Model = None,
    probe: Annotated[str | None, Opt(help="trained probe folder, for the 'dynamic' strategy")] = None,
    static: Annotated[str | None, Opt(help="static head list JSON, for the 'static' strategy")] = None,
    strategies: Annotated[str | None, Opt(help="dynamic,static,dynamic-random,fixed-random,none,full-context")] = None,
    k: Annotated[str | None, Opt("--k", help="heads per retrieval, e.g. 5,10,20")] = None,
    data: Annotated[str | None, Opt(
        help="HotpotQA file (default: synthetic questions); multihop[:hops=2,...]: the multihop task")] = None,
    questions: Annotated[int | None, Opt(help="number of questions")] = None,
    first: First = None,
    lengths: Annotated[str | None, Opt(help="context lengths in tokens")] = None,
    depths: Annotated[str | None, Opt(help="gold-paragraph depths in [0, 1]")] = None,
    seed: Annotated[int | None, Opt(help="master seed")] = None,
    threshold: Annotated[float | None, Opt(help="RIND threshold θ")] = None,
    top_n: Annotated[int | None, Opt(help="top attended context positions that are clustered")] = None,
    window: Annotated[int | None, Opt(help="tokens shown around each cluster")] = None,
    max_new_tokens: Annotated[int | None, Opt(help="answer budget in tokens")] = None,
    device: Annotated[str | None, Opt(help="cpu or cuda")] = None,
    config: ConfigFile = None,
) -> None:
    """Dynamic RAG with head-based in-context retrieval: EM/F1 and retrieval recall per strategy and k."""
    from dynheads.experiments.rag import RagConfig, run_rag

    cfg = build_config(
        RagConfig, config, model=model, probe=probe, static=static, strategies=parse_list(strategies, str),
        ks=parse_list(k, int), data=data, questions=questions, first=first, lengths=parse_list(lengths, int),
        depths=parse_list(depths, float), seed=seed, threshold=threshold, top_n=top_n, window=window,
        max_new_tokens=max_new_tokens, device=device,
    )
    run = run_rag(cfg, out)
    typer.echo((run.path / "rag.md").read_text(encoding="utf-8"), nl=False)  # the table and its notes (skips)


@app.command()
def reproduce(
    out: Annotated[Path, Opt("--out", help="output folder (re-running continues where it stopped)")],
    model: Model = None,
    preset: Annotated[str, Opt(help="quick: 2-core CPU, minutes; paper: the paper's sizes (GPU); smoke")] = "quick",
    hotpotqa: Annotated[str | None, Opt("--hotpotqa", help="real HotpotQA file (default: synthetic)")] = None,
    seed: Annotated[int, Opt(help="master seed of every stage")] = 0,
    device: Annotated[str | None, Opt(help="cpu or cuda")] = None,
) -> None:
    """Run the whole study (every table and figure of the paper) and write report.md and report.html."""
    from dynheads.experiments.reproduce import ReproduceConfig
    from dynheads.experiments.reproduce import reproduce as run_all
    from dynheads.report import write_report

    folder = run_all(ReproduceConfig(model=model, preset=preset, hotpotqa=hotpotqa, seed=seed, device=device), out)
    _, html = write_report(folder)
    typer.echo(f"report: {html} and {html.with_suffix('.md')}")
