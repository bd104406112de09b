"""Claim 2 on a NIAH grid: per-step head ablation (Figure 2) and progressive ablation with compensation (Figure 3).

``run_ablation`` decodes every sample of a lengths x depths x runs grid once per strategy with
``dynheads.ablation.ablated_generate`` and writes, besides the run directory's records:

- ``cells.csv``: mean accuracy and ROUGE-L per strategy x length x depth, with the number of samples,
- ``summary.md``: the means per strategy, beside what the paper reports,
- ``plots/ablation-accuracy.png``, ``plots/ablation-rouge_l.png``: Figure 2's heat maps.

The un-ablated baseline ``none`` always runs too. How many heads ``static`` and ``random`` mask is the config's
``matching``: ``per_step`` (default) masks at step t exactly |D_t| heads, D_t from that step's clean pass of the
control run itself; ``mean`` (the paper's sentence) masks at every step as many heads as the dynamic run of the
same sample masked on average (rounded), so ``dynamic`` runs whenever they do, before them, and on resume the
count is read back from the saved dynamic record. Either way cells.csv counts, per cell, the samples that masked
no head at all (``zero_masked``) and the heads masked per step (``mean_masked``).

``run_progressive`` masks the first k dynamic heads of every step (ordered by their attention on the copied
position for Eq. 1, by their Eq. 2 score for ``reasoning``; k = 0 is the un-ablated run) and reports per k the
mean over samples of m_s = max_t |E_t ∩ static top-20| (E_t: the heads that copy only after masking) and the
task metrics, in ``progressive.csv``, ``summary.md`` and ``plots/progressive.png``.

Each (sample, strategy) or (sample, k) is one record, written atomically: an interrupted run resumes where it
stopped and reproduces the records it had not finished identically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from dynheads.ablation import MATCHINGS, STRATEGIES, AblationResult, AblationSettings, ablated_generate, matched_count
from dynheads.analysis.headlists import load_head_list, scored_heads
from dynheads.decoding import check_fits
from dynheads.errors import DynheadsError
from dynheads.experiments.hotpotqa import HotpotConfig, hotpot_grid, qa_score, refuse_static_overlap
from dynheads.experiments.niah import NiahConfig, niah_samples, prompt_manifest
from dynheads.heads import Head, check_heads, head_key, parse_head
from dynheads.io import atomic_path, read_json
from dynheads.models import LoadedModel, load_model
from dynheads.paper import PAPER_GRID, PAPER_MODEL, PAPER_PROGRESSIVE
from dynheads.plots.ablation import plot_ablation_cells, plot_progressive
from dynheads.probe import AblationMode
from dynheads.runs import RunDir
from dynheads.seeding import derive_seed
from dynheads.tables import Summary, frame_table, write_summary
from dynheads.tasks import hotpotqa, niah
from dynheads.thresholds import DEFAULT_REASONING_THRESHOLD, ReasoningThreshold

MODES = ("zero", "uniform")
TASK_METRICS = {"niah": {"accuracy": "accuracy", "rouge_l": "ROUGE-L"}, "hotpotqa": {"em": "EM", "f1": "F1"}}
MATCHING_RULES = {"per_step": "|D_t| of each step's clean pass of the control run",
                  "mean": "the dynamic run's mean |D_t|, rounded"}


@dataclass(frozen=True)
class _GridConfig:
    """Settings shared by both experiments: the task's grid, the model and the masking mode."""

    model: str | None = field(default=None, metadata={"help": "hub id, folder or .gguf; None = embedded SmolLM2"})
    task: str = field(default="niah", metadata={"help": "niah (D_t by Eq. 1) or hotpotqa (Eq. 2 > threshold)"})
    threshold: str = field(default=DEFAULT_REASONING_THRESHOLD, metadata={
        "help": "hotpotqa: a head is dynamic above this Eq. 2 score ('0.1') or multiple of chance ('relative:3')"})
    questions: int = field(default=45, metadata={"help": "hotpotqa: questions, spread over the grid cells"})
    first: int = field(default=0, metadata={"help": "hotpotqa: index of the first question in the data"})
    split: str = field(default="ablation", metadata={"help": "hotpotqa: name of the question stream (recorded)"})
    data: str | None = field(default=None, metadata={"help": "hotpotqa: data file; None = synthetic questions"})
    lengths: tuple[int, ...] = field(default=(500, 1000, 2000), metadata={"help": "haystack tokens"})
    depths: tuple[float, ...] = field(default=(0.0, 0.25, 0.5, 0.75, 1.0), metadata={"help": "needle depth, 0..1"})
    runs: int = field(default=2, metadata={"help": "samples (different needle and seed) per grid cell"})
    seed: int = field(default=0, metadata={"help": "master seed; samples and random heads derive from it"})
    max_new_tokens: int = field(default=48, metadata={"help": "generation budget (a UUID is ~35 tokens)"})
    static: str | None = field(default=None, metadata={"help": "static head list (Wu et al. JSON or ranked list)"})
    mode: AblationMode = field(default="zero", metadata={"help": "zero = remove head output; uniform = flat attention"})
    haystack: str | None = field(default=None, metadata={"help": "folder of .txt files; None = Paul Graham essays"})
    dtype: str = field(default="auto", metadata={"help": "model dtype (auto keeps the checkpoint's)"})
    device: str | None = field(default=None, metadata={"help": "cpu / cuda; None picks cuda when available"})

    def niah_config(self) -> NiahConfig:
        """The NIAH grid whose samples are ablated (the ``analysis`` seed stream, as ``dynheads niah``)."""
        return NiahConfig(model=self.model, lengths=self.lengths, depths=self.depths, runs=self.runs,
                          seed=self.seed, max_new_tokens=self.max_new_tokens, haystack=self.haystack,
                          dtype=self.dtype, device=self.device)

    def hotpot_config(self) -> HotpotConfig:
        """The HotpotQA grid whose questions are ablated (as ``dynheads hotpotqa``)."""
        return HotpotConfig(model=self.model, data=self.data, questions=self.questions, first=self.first,
                            split=self.split, lengths=self.lengths,
                            depths=self.depths, seed=self.seed, max_new_tokens=self.max_new_tokens,
                            dtype=self.dtype, device=self.device)

    def check(self) -> None:
        if self.mode not in MODES:
            raise DynheadsError(f"unknown masking mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.task not in TASK_METRICS:
            raise DynheadsError(f"unknown task {self.task!r}: use one of {', '.join(TASK_METRICS)}")
        ReasoningThreshold.parse(self.threshold)  # a bad threshold fails before any work


@dataclass(frozen=True)
class AblationConfig(_GridConfig):
    strategies: tuple[str, ...] = field(
        default=("dynamic", "static", "random"),
        metadata={"help": "dynamic, static, random, fixed; none (no masking) always runs too"})
    heads: tuple[str, ...] = field(default=(), metadata={"help": "heads masked by 'fixed', e.g. ('12-3', '4-1')"})
    matching: str = field(
        default="per_step",
        metadata={"help": "static/random head count: per_step = |D_t| of each step's clean pass of the control run; "
                          "mean = the dynamic run's mean |D_t|, rounded (the paper's sentence)"})

    def run_strategies(self) -> tuple[str, ...]:
        """The strategies to decode, in run order: none, dynamic (needed by static and random), the rest."""
        choices = ", ".join(s for s in STRATEGIES if s != "none")
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown:
            raise DynheadsError(f"unknown ablation strategy {', '.join(map(repr, unknown))}: use some of {choices}")
        if not self.strategies:
            raise DynheadsError(f"give at least one ablation strategy: {choices}")
        controls = {"static", "random"} & set(self.strategies)
        wanted = {"none", *self.strategies} | ({"dynamic"} if controls and self.matching == "mean" else set())
        return tuple(s for s in STRATEGIES if s in wanted)

    def check(self) -> None:
        super().check()
        if self.matching not in MATCHINGS:
            raise DynheadsError(f"unknown matching {self.matching!r}: use one of {', '.join(MATCHINGS)}")
        strategies = self.run_strategies()
        if "static" in strategies and not self.static:
            raise DynheadsError("the static strategy needs a static head list: pass --static FILE")
        if ("fixed" in strategies) != bool(self.heads):
            raise DynheadsError("the fixed strategy and --heads go together: give both or neither")


@dataclass(frozen=True)
class ProgressiveConfig(_GridConfig):
    ks: tuple[int, ...] = field(default=(0, 5, 10, 15, 20), metadata={"help": "dynamic heads masked per step"})
    lengths: tuple[int, ...] = field(default=(1000,), metadata={"help": "haystack tokens (paper: 5000)"})
    depths: tuple[float, ...] = field(default=(0.5,), metadata={"help": "needle depth, 0..1"})
    runs: int = field(default=5, metadata={"help": "samples per (length, depth) cell (paper: 20)"})
    top_static: int = field(default=20, metadata={"help": "size of the static set E_t is compared with"})

    def check(self) -> None:
        super().check()
        if not self.ks or min(self.ks) < 0:
            raise DynheadsError(f"give one or more k >= 0 (--ks), got {list(self.ks)}")
        if not self.static:
            raise DynheadsError("progressive ablation compares with the static top heads: pass --static FILE")
        if self.top_static < 1:
            raise DynheadsError(f"top_static must be at least 1, got {self.top_static}")


# ---- the grid (Figure 2) -------------------------------------------------------------------------------------------
def run_ablation(config: AblationConfig, out: str | Path, *, lm: LoadedModel | None = None,
                 progress: bool = True, on_record: Callable[[dict], None] | None = None) -> RunDir:
    """Decode every grid sample with every strategy into ``out`` (resumable); write cells.csv, summary.md, plots."""
    config.check()
    strategies = config.run_strategies()
    lm = lm or load_model(config.model, dtype=config.dtype, device=config.device)
    static = _static_ranking(config.static, lm) if config.static else ()
    fixed = tuple(parse_head(text) for text in config.heads)
    check_heads(list(fixed), lm.num_layers, lm.num_heads, source="--heads")
    run, samples = _start(config, "ablation", lm, out,
                          {"strategies_run": list(strategies), "static_top": [head_key(h) for h in static[:20]]})
    jobs = _Jobs(run, len(samples) * len(strategies), "ablate", progress, on_record)
    for sample in samples:
        count = None  # matching="mean": heads per step for static / random, from this sample's dynamic run
        for strategy in strategies:
            mean_count = config.matching == "mean" and strategy in ("static", "random")
            settings = AblationSettings(strategy=strategy, mode=config.mode, static_ranking=static, fixed_heads=fixed,
                                        matching=config.matching, count=count if mean_count else None,
                                        seed=derive_seed(config.seed, "random-heads", sample.seed),
                                        score=_score_kind(config), threshold=config.threshold)
            record = jobs.get(f"{sample.sample_id}-{strategy}",
                              partial(_ablation_record, lm, sample, settings, config))
            if strategy == "dynamic":
                count = record["matched_count"]
    jobs.close()
    write_cells(run)
    return run


def _ablation_record(lm: LoadedModel, sample, settings: AblationSettings, config: _GridConfig) -> dict:
    """One (sample, strategy) record. ``matched_count``: under mean matching the static/random count (in the
    dynamic record: the value its siblings use); None under per-step matching, where ``masked_counts`` says it."""
    result = ablated_generate(lm, sample, settings, config.max_new_tokens)
    count = None
    if settings.matching == "mean":
        count = matched_count(result.dynamic_counts) if settings.strategy == "dynamic" else settings.count
    return {**_result_record(sample, result, config.task), "strategy": settings.strategy,
            "matching": settings.matching, "matched_count": count}


def write_cells(run: RunDir) -> pd.DataFrame:
    """cells.csv, summary.md and the heat maps of a grid run, from its records."""
    frame = run.write_results()
    config = run.manifest()["config"]
    task = config.get("task", "niah")
    matching = config.get("matching", "mean")  # runs made before the option existed used the mean count
    metrics = TASK_METRICS[task]
    means = {name: (f"metrics.{name}", "mean") for name in metrics}
    frame["strategy"] = frame["strategy"].astype(pd.CategoricalDtype(STRATEGIES, ordered=True))  # run order
    # a sample that masked no head at any step is the un-ablated run: counted apart, never read as "unharmed"
    frame["zero_masked"] = frame["masked_counts"].map(lambda counts: int(sum(counts) == 0))
    keys = ["strategy", "context_tokens", "depth"]
    cells = (frame.groupby(keys, observed=True)
             .agg(**means, samples=("sample_id", "size"), mean_masked=("mean_masked", "mean"),
                  zero_masked=("zero_masked", "sum"))
             .reset_index().rename(columns={"context_tokens": "length"}))
    cells = _with_skipped_cells(cells, run.manifest())
    cells["matching"] = matching
    with atomic_path(run.path / "cells.csv") as tmp:
        cells.to_csv(tmp, index=False)
    summary = (frame.groupby("strategy", observed=True)
               .agg(records=("sample_id", "size"), **means, mean_dynamic=("mean_dynamic", "mean"),
                    masked_per_step=("mean_masked", "mean"), zero_masked=("zero_masked", "sum"))
               .reset_index())
    model = run.manifest()["model"]["name"]
    rule = MATCHING_RULES[matching]
    write_summary(run.path, "summary.md", Summary(
        ["Means over all records of each strategy. mean |D_t| = dynamic heads of the clean pass per step; "
         f"masked = heads removed per step (static and random, matching `{matching}`: {rule}); no head = samples "
         "that masked no head at any step (their run is the un-ablated one).",
         frame_table(summary, {"strategy": "strategy", "records": "records", **metrics,
                               "mean_dynamic": "mean |D_t|", "masked_per_step": "masked", "zero_masked": "no head"}),
         f"Paper ({PAPER_MODEL}): {PAPER_GRID[task]}.", *_skip_line(run.manifest())],
        {"matching": matching, "records": int(summary["records"].sum())}, f"Per-step ablation: {model}"))
    plot_ablation_cells(cells, run.path / "plots", title=f"{model}: per-step ablation ({task}, {matching} matching)",
                        metrics=metrics,
                        opacity=task == "hotpotqa")
    return cells


def _with_skipped_cells(cells: pd.DataFrame, manifest: dict) -> pd.DataFrame:
    """Every cell of the configured grid, for every strategy: cells whose questions were all skipped get
    samples 0 (blank in the heat maps: no valid sample), and ``skipped`` counts the skipped pairs per cell."""
    config = manifest["config"]
    skipped = manifest.get("skipped", {}).get("by_cell", {})
    grid = pd.MultiIndex.from_product([cells["strategy"].unique(), config["lengths"], config["depths"]],
                                      names=["strategy", "length", "depth"])
    full = cells.set_index(["strategy", "length", "depth"]).reindex(grid).reset_index()
    full["samples"] = full["samples"].fillna(0).astype(int)
    full["skipped"] = [skipped.get(f"{length}/{depth:g}", 0) for length, depth in zip(full["length"], full["depth"],
                                                                                      strict=True)]
    return full


def _skip_line(manifest: dict) -> list[str]:
    """The summary's line on skipped (question, cell) pairs; none when nothing was skipped."""
    skipped = manifest.get("skipped", {})
    if not skipped.get("count"):
        return []
    reasons = "; ".join(f"{count} {reason}" for reason, count in skipped["by_reason"].items())
    return [f"Skipped (question, cell) pairs: {skipped['count']} ({reasons}); cells without a valid sample are "
            "blank in the heat maps, and cells.csv counts them in 'skipped'."]


# ---- progressive ablation (Figure 3) -------------------------------------------------------------------------------
def run_progressive(config: ProgressiveConfig, out: str | Path, *, lm: LoadedModel | None = None,
                    progress: bool = True, on_record: Callable[[dict], None] | None = None) -> RunDir:
    """Mask the first k dynamic heads of every step, for every k and sample; write progressive.csv and the plot."""
    config.check()
    lm = lm or load_model(config.model, dtype=config.dtype, device=config.device)
    top = tuple(_static_ranking(config.static, lm)[: config.top_static])
    ks = tuple(sorted(set(config.ks)))
    run, samples = _start(config, "ablation-progressive", lm, out, {"static_top": [head_key(h) for h in top]})
    jobs = _Jobs(run, len(samples) * len(ks), "progressive", progress, on_record)
    for sample in samples:
        for k in ks:
            settings = AblationSettings(strategy="dynamic", mode=config.mode, max_dynamic=k,
                                        score=_score_kind(config), threshold=config.threshold)
            jobs.get(f"{sample.sample_id}-k{k}",
                     partial(_progressive_record, lm, sample, settings, top, config))
    jobs.close()
    write_progressive(run)
    return run


def _progressive_record(lm: LoadedModel, sample, settings: AblationSettings, top: tuple[Head, ...],
                        config: _GridConfig) -> dict:
    result = ablated_generate(lm, sample, settings, config.max_new_tokens)
    counts = [len(compensated) for compensated in result.compensated]
    overlap = [len(set(compensated) & set(top)) for compensated in result.compensated]
    return {**_result_record(sample, result, config.task), "k": settings.max_dynamic, "compensated_counts": counts,
            "max_compensated": max(counts, default=0), "static_overlap": overlap,
            "max_static_overlap": max(overlap, default=0)}


def write_progressive(run: RunDir) -> pd.DataFrame:
    """progressive.csv (per k: samples, mean m_s, mean max_t |E_t|, metrics), summary.md and plots/progressive.png."""
    frame = run.write_results()
    metrics = TASK_METRICS[run.manifest()["config"].get("task", "niah")]
    table = (frame.groupby("k")
             .agg(samples=("sample_id", "size"), static_overlap=("max_static_overlap", "mean"),
                  compensated=("max_compensated", "mean"), **{m: (f"metrics.{m}", "mean") for m in metrics},
                  masked_per_step=("mean_masked", "mean"))
             .reset_index())
    with atomic_path(run.path / "progressive.csv") as tmp:
        table.to_csv(tmp, index=False)
    manifest = run.manifest()
    model, top = manifest["model"]["name"], len(manifest["static_top"])
    write_summary(run.path, "summary.md", Summary(
        [f"Per k: the first k dynamic heads of every step masked; overlap = mean over samples of "
         f"max_t |E_t ∩ static top-{top}|; compensated = the same with all of E_t; masked = heads removed per step "
         "(fewer than k when D_t is smaller).",
         frame_table(table, {"k": "k", "samples": "samples", "static_overlap": "overlap",
                             "compensated": "compensated", **metrics, "masked_per_step": "masked"}),
         f"Paper ({PAPER_MODEL}): {PAPER_PROGRESSIVE}.", *_skip_line(manifest)],
        {"static_top": top}, f"Progressive ablation: {model}"))
    plot_progressive(table, run.path / "plots" / "progressive.png", top_static=top,
                     title=f"{model}: progressive ablation", metrics=metrics)
    return table


# ---- shared ----------------------------------------------------------------------------------------------------------
class _Jobs:
    """Records of one run: read back when finished earlier, otherwise computed, saved and counted on the bar."""

    def __init__(self, run: RunDir, total: int, desc: str, progress: bool,
                 on_record: Callable[[dict], None] | None) -> None:
        self.run, self.on_record = run, on_record
        done = len(run.records())
        self.bar = tqdm(total=total, initial=done, desc=desc, unit="record", disable=not progress)

    def get(self, record_id: str, compute: Callable[[], dict]) -> dict:
        if self.run.is_done(record_id):
            return read_json(self.run.record_path(record_id))
        record = compute()
        record["sample_id"] = record_id  # one record per (sample, strategy or k); grid_sample_id names the sample
        self.run.save_sample(record)
        if self.on_record:
            self.on_record(record)
        self.bar.update()
        return record

    def close(self) -> None:
        self.bar.close()


def _start(config: _GridConfig, kind: str, lm: LoadedModel, out: str | Path, extra: dict) -> tuple[RunDir, list]:
    """The grid's samples, checked to fit the model, and the started (or resumed) run directory."""
    if config.task == "niah":
        samples, prompt = niah_samples(config.niah_config(), lm.tokenizer), prompt_manifest()
    else:
        grid = hotpot_grid(config.hotpot_config(), lm.tokenizer)
        samples = grid.samples
        prompt = {"system": hotpotqa.SYSTEM_PROMPT, "user": hotpotqa.USER_TEMPLATE, "data": config.data or "synthetic"}
        extra = {**extra, **grid.manifest()}
        if config.static:
            refuse_static_overlap(config.static, sorted({s.record_id for s in samples}), f"this {kind} run")
    for sample in samples:  # fail before any work, not halfway through the grid
        check_fits(lm, len(sample.input_ids), config.max_new_tokens)
    run = RunDir(out)
    run.start(kind, config, lm, {"prompt": prompt, "prompt_template": samples[0].prompt_template,
                                 "chat_template_kwargs": samples[0].chat_template_kwargs, **extra})
    return run, samples


def _score_kind(config: _GridConfig) -> str:
    """How D_t is found: Eq. 1 copies on NIAH, Eq. 2 above ``threshold`` on HotpotQA."""
    return "copy" if config.task == "niah" else "reasoning"


def _static_ranking(path: str, lm: LoadedModel) -> tuple[Head, ...]:
    return scored_heads(load_head_list(path, lm.num_layers, lm.num_heads))  # never zero-score filler


def _result_record(sample, result: AblationResult, task: str) -> dict:
    """What every record holds: the sample's settings, the generation, its metrics and the per-step counts."""
    masked = [len(heads) for heads in result.masked]
    metrics = niah.score(sample.answer, result.text) if task == "niah" else qa_score(sample, result.text)
    return {**sample.describe(), "grid_sample_id": sample.sample_id, "generated": result.text,
            "stop_reason": result.stop_reason, "steps": len(result.masked),
            "metrics": metrics, "dynamic_counts": result.dynamic_counts,
            "mean_dynamic": result.mean_dynamic, "masked_counts": masked,
            "mean_masked": float(np.mean(masked)) if masked else 0.0}
