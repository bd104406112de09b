"""Dynamic vs static head-level KV retention on a task's grid: accuracy against the KV budget, per policy.

``run_kv`` decodes every sample of a registered task's grid (NIAH's lengths x depths x runs by default; a question
task, such as RULER's variable tracking, spreads its question stream over lengths x depths) with
``dynheads.kv.retention.kv_generate`` once per (policy, budget) (``full`` and ``none`` once per sample) and writes,
besides the run directory's records:

- ``table.csv`` / ``summary.md`` (over the samples finished under every policy and budget; an unfinished
  run's tables leave out the samples in flight): per policy and budget (a fraction of the KV heads), samples,
  accuracy (the task's first metric: NIAH accuracy, RULER's string match, HotpotQA's EM) with its 95 % interval
  over samples (exact Clopper-Pearson when every sample scores 0 or 1, a bootstrap otherwise, exact when every
  sample agrees: ``analysis.evidence.fraction_interval``), the task's other metrics (NIAH: ROUGE-L), whole KV
  heads per step and the shortfall of a policy that kept fewer than the budget allows, the resident KV (fraction
  of the unmodified model's and MB, mean over steps) and, for dynamic policies, the second tier: MB offloaded and
  MB moved per step,
- ``cells.csv``: accuracy per policy x budget x length x depth (the grid),
- ``probe_pr.json`` / ``probe_pr.md`` (when a probe is given): how well the probe applied to the hidden state of
  step t predicts the heads active (Eq. 1) at step t+1, measured on the ``full`` policy's decoding (the model's
  own steps), beside the same-step score and the "previous D_t" predictor,
- ``plots/kv-accuracy.png`` and, for a grid of more than one cell, ``plots/kv-grid.png``.

The evaluation samples come from the ``split`` seed stream (default ``analysis``; a question task: the questions
``first .. first + questions - 1`` of ``data``, a stream named ``split``). The probe and the static list are fitted
elsewhere: their training run directories are read back and any shared sample (same seed or the same needle) or
question is refused; both sample sets are written into the manifest. Every policy's D_t is Eq. 1 (copy heads of the
sample's needle tokens: a RULER sample's gold statements, a HotpotQA sample's supporting facts) whatever score the
task itself is traced with. Resumable: one record per (sample, policy, budget), written atomically.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Unpack, cast

import numpy as np

from dynheads.analysis.head_predictor import TrainedHeadPredictor
from dynheads.analysis.kvheads import KVHead, kv_head_ranking
from dynheads.config import pieces_of
from dynheads.errors import DynheadsError
from dynheads.experiments.experiment import (
    Context,
    Experiment,
    GridPlan,
    Phase,
    Work,
    grid_evaluated,
    grid_plan,
    run_experiment,
)
from dynheads.heads import Head, flat_index, head_key
from dynheads.kv.arms import KVArm, resolve_arms
from dynheads.kv.press_registry import TRACKS, PressSpec
from dynheads.kv.press_runs import press_generate_all
from dynheads.kv.retention import (
    KVResult,
    KVSettings,
    Prefill,
    ProbeSelect,
    group_size,
    kv_generate_batch,
    kv_head_count,
    kv_token_bytes,
    num_kv_heads,
    prefill,
)
from dynheads.kv.token_votes import POOL, SPAN, VOTERS, WINDOW
from dynheads.models import LoadedModel
from dynheads.resources import HEAD_PREDICTOR, STATIC_HEADS, Evaluated, StaticSource, needs_of
from dynheads.runs import Finished, Job, RunDir, RunOptions, RunView
from dynheads.seeding import derive_seed
from dynheads.settings import KVFields, ModelSettings, NiahConfig, NiahGrid, TaskGridChoice
from dynheads.tasks.registry import Task
from dynheads.tasks.sample import Sample, template_fields
from dynheads.views.kv_tables import kv_tables


@dataclass(frozen=True)
class KVConfig(KVFields, TaskGridChoice):
    def niah_config(self) -> NiahConfig:
        return NiahConfig(**pieces_of(self, NiahGrid, ModelSettings), split=self.split)

    def check(self) -> None:
        self.check_task()
        if self.outside_heads and not self.static:
            raise DynheadsError("--outside-heads accepts a --static head list unchecked: pass --static FILE too")
        if self.track not in TRACKS:
            raise DynheadsError(f"unknown track {self.track!r}: use {' or '.join(TRACKS)}")

    def needs(self) -> set[str]:
        """The head sources the run reads (``resources``): those the chosen policies and presses declare, and any
        source given (the full policy's decoding measures a given predictor; the manifest lists a given list's
        heads per budget)."""
        given = {STATIC_HEADS} if self.static else set()
        return needs_of(self.arms()) | given | ({HEAD_PREDICTOR} if self.probe else set())

    def arms(self) -> list[KVArm]:
        """The run's (policy or press, budget) arms in run order, each name resolved once (``kv.arms``)."""
        return resolve_arms(
            self.policies,
            self.budgets,
            static_given=bool(self.static),
            predictor_given=bool(self.probe),
            ratios=self.ratios,
        )


def _kv_plan(config: KVConfig, lm: LoadedModel) -> GridPlan:
    """The task's grid; the static list and predictor the policies and presses read (a given one is read too),
    refused where fitted on an evaluated sample or question, or, with no run beside it, unless --outside-heads."""

    def evaluated(task: Task, task_config, samples) -> Evaluated:
        stream = task_config.split if task.questions else None  # NIAH: its seeds and needles tell the samples apart
        return replace(
            grid_evaluated(task, stream, samples, "this KV run"),
            unknown_fit="record" if config.outside_heads else "refuse",
            way_out="--outside-heads",
        )

    return grid_plan(config, lm, config.needs(), "this KV run", predictor=config.probe, evaluated=evaluated)


def _kv_work(context: Context[KVConfig, GridPlan]) -> Work:
    """Every sample under every (policy, budget), samples visited run by run (every cell's first sample, then every
    cell's second, ...) so that a run stopped early still covers the grid; a sample's policies are one batch."""
    config, lm, plan, sources = context.config, context.lm, context.plan, context.sources
    task, samples, arms = plan.task, plan.samples, config.arms()
    num_kv = num_kv_heads(lm)
    static, voters = _static_heads(sources.static, lm, num_kv)
    probe = sources.predictor.predictor if sources.predictor else None
    fitted = {"static": sources.manifest()[STATIC_HEADS], "probe": sources.manifest()[HEAD_PREDICTOR]}
    evaluated = plan.evaluated
    manifest = {
        "prompt": task.prompt(plan.task_config),
        **template_fields(samples),
        **plan.grid.manifest(),
        "evaluation_samples": list(evaluated.samples),  # NIAH: seeds and needles; a question task: its ids
        **({"evaluation_questions": list(evaluated.questions)} if task.questions else {}),
        "fit_samples": fitted,
        **_head_budgets(config, lm, num_kv, static),
        "token_votes": {
            "voters": [head_key(h) for h in voters],
            "window": WINDOW,
            "pool": POOL,
            "span": SPAN,  # head_spans, snapkv_spans
            "span_fitted_on": "NIAH's 'static' seed stream (scripts/fit_vote_span.py, docs/kv.md)",
        },
        "probe_threshold": probe.threshold if probe else None,
    }
    runs = 1 if task.questions else config.runs  # NIAH grids: runs vary fastest, every cell's first sample first
    order = sorted(range(len(samples)), key=lambda i: (i % runs, i))
    decoding = [
        Job(samples[i].sample_id + arm.record_id, (samples[i], arm), group=samples[i].sample_id)
        for i in order
        for arm in arms
    ]
    decoder = _KVDecoder(lm, config, task, static, voters, probe)
    return Work(manifest, [Phase(decoding, decoder, "kv")])


def _check_kv(config: KVConfig) -> None:
    config.arms()  # unknown policies first
    config.check()


KV = Experiment("kv", _kv_plan, _kv_work, tables=lambda context: kv_tables(RunView.of(context.run)), check=_check_kv)


def run_kv(config: KVConfig, out: str | Path, **options: Unpack[RunOptions]) -> RunDir:
    """Decode every grid sample under every (policy, budget) into ``out`` (resumable); write tables and plots.

    Under ``torchrun`` / ``accelerate launch`` each process decodes every policy of its share of the samples
    (``runs.run_jobs``), and rank 0 writes the tables from all records. ``batch_size`` samples decode together: each
    policy's rows as one batch (``kv.kv_generate_batch``; the records equal batch 1's).
    """
    return run_experiment(KV, config, out, **options)


def _static_heads(
    source: StaticSource | None, lm: LoadedModel, num_kv: int
) -> tuple[tuple[KVHead, ...], tuple[Head, ...]]:
    """The KV heads of the static head list, best first, and its ``VOTERS`` best positive-score query heads (the
    voters of ``kvpress:head_tokens``); none without a list."""
    if source is None:
        return (), ()
    return kv_head_ranking(source.heads, lm.num_layers, lm.num_heads, num_kv), source.ranking[:VOTERS]


def _head_budgets(config: KVConfig, lm: LoadedModel, num_kv: int, static: tuple[KVHead, ...]) -> dict:
    """What the manifest records of the KV heads: the static ranking's top, and the heads each budget keeps."""
    return {
        "num_kv_heads": num_kv,
        "static_top": [head_key(h) for h in static[:20]],
        "static_scored_kv_heads": len(static) if config.static else None,
        "gqa_rule": "budgets count whole KV heads; every query head of a kept KV head sees all keys",
        "kv_heads_per_budget": {str(b): kv_head_count(b, lm.num_layers, num_kv) for b in config.budgets},
        "heads_per_budget": {str(b): kv_head_count(b, lm.num_layers, num_kv) * group_size(lm) for b in config.budgets},
        "kv_token_bytes": kv_token_bytes(lm),
    }


@dataclass(frozen=True)
class _KVDecoder:
    """The work of ``run_jobs``: decode a batch of (sample, arm) jobs into records."""

    lm: LoadedModel
    config: KVConfig
    task: Task  # its score judges each generation
    static: tuple[KVHead, ...]
    voters: tuple[Head, ...]
    probe: TrainedHeadPredictor | None

    def settings_of(self, sample: Sample, arm: KVArm) -> KVSettings:
        config = self.config
        # probe_select: kv_generate_batch refuses a value that is no ProbeSelect
        return KVSettings(
            policy=arm.name,
            budget=arm.kv_budget,
            sink=config.sink,
            recent=config.recent,
            static_ranking=self.static,
            probe_select=cast(ProbeSelect, config.probe_select),
            seed=derive_seed(config.seed, "kv-random", sample.seed),
            voters=self.voters,
            ratio=arm.ratio,
        )

    def records_probe(self, arm: KVArm) -> bool:
        """A given predictor's scores are recorded along the reference (full) cache's decoding."""
        return arm.reference and self.probe is not None

    def __call__(self, batch: list[tuple[Sample, KVArm]]) -> list[Finished]:
        finished = []
        for (sample, arm), result in zip(batch, self.decode(batch), strict=True):
            settings = self.settings_of(sample, arm)
            record = _record(self.lm, self.task, sample, arm, settings, result, self.records_probe(arm))
            record.update(grid_sample_id=sample.sample_id, budget=arm.budget)
            if arm.ratio is not None:
                record["ratio"] = arm.ratio
            finished.append(Finished(record))
        return finished

    def predicted_voters(self, prefilled: Prefill) -> tuple[Head, ...]:
        """The head predictor's ``VOTERS`` best heads for the prompt: from the hidden state of the prefill's last
        position (the probe policy's input at the first step)."""
        if self.probe is None or prefilled.last is None:  # resolve_arms refuses the press without --predictor
            raise DynheadsError("the predictor's voters need --predictor DIR and a prompt of at least 2 tokens")
        return tuple(self.probe.top_heads(prefilled.last.hidden.cpu(), VOTERS))

    def decode(self, batch: list[tuple[Sample, KVArm]]) -> list[KVResult]:
        """Each retention arm of the batch decodes its samples as one batch (``kv_generate_batch``) from one
        full-attention prefill per sample, shared by the sample's arms; a sample's kvpress presses share their own
        prefill (plain attention, no probe; ``press_generate_all``) and decode one by one."""
        lm, config = self.lm, self.config
        prefills: dict[str, Prefill] = {}
        results: list[KVResult | None] = [None] * len(batch)
        groups: dict[KVArm, list[int]] = {}
        pressed: dict[str, list[int]] = {}
        for i, (sample, arm) in enumerate(batch):
            if sample.sample_id not in prefills and arm.decodes_from_prefill:
                prefills[sample.sample_id] = prefill(lm, sample, config.max_new_tokens)
            if arm.press is not None:
                pressed.setdefault(sample.sample_id, []).append(i)
            else:
                groups.setdefault(arm, []).append(i)
        for rows in pressed.values():
            for i, result in zip(rows, self.decode_presses([batch[i] for i in rows], prefills), strict=True):
                results[i] = result
        for arm, rows in groups.items():
            decoded = kv_generate_batch(
                lm,
                [prefills[batch[i][0].sample_id] for i in rows],
                [self.settings_of(batch[i][0], arm) for i in rows],
                config.max_new_tokens,
                probe=self.probe,
                record_probe=self.records_probe(arm),
            )
            for i, result in zip(rows, decoded, strict=True):
                results[i] = result
        return cast(list[KVResult], results)  # every slot holds its result now

    def compressed(self, sample: Sample) -> int | None:
        """What the presses compress of ``sample``'s prompt: all of it but its last token (question-aware, None), or
        its context alone (question-free: up to the end of the task's ``context_span``)."""
        if self.config.track == "question-aware":
            return None
        span = getattr(sample, "context_span", None)
        if span is None:
            raise DynheadsError(f"{sample.sample_id} marks no context span: the question-free track needs one")
        return int(span[1])

    def decode_presses(self, jobs: list[tuple[Sample, KVArm]], prefills: dict[str, Prefill]) -> list[KVResult]:
        """The kvpress presses of one sample, from one prefill they share; a press the predictor votes for gets the
        predictor's heads for the prompt (read from the sample's dynheads prefill) and records them."""
        sample = jobs[0][0]
        arms, voted = [], []
        for _, arm in jobs:
            settings = self.settings_of(sample, arm)
            predicted = self.predicted_voters(prefills[sample.sample_id]) if arm.decodes_from_prefill else ()
            press = cast(PressSpec, arm.press)  # decode routes press arms alone here
            arms.append((press, replace(settings, voters=predicted) if predicted else settings))
            voted.append(list(predicted))
        results = press_generate_all(
            self.lm, sample.input_ids, arms, self.config.max_new_tokens, compress_until=self.compressed(sample)
        )
        for result, voters in zip(results, voted, strict=True):
            result.voters = voters
        return results


def _record(
    lm: LoadedModel,
    task: Task,
    sample: Sample,
    arm: KVArm,
    settings: KVSettings,
    result: KVResult,
    record_probe: bool,
) -> dict:
    token_bytes = kv_token_bytes(lm)
    steps = len(result.kv_heads)
    # Dynamic policies write each step's new token of every KV head to the second tier (any head may be fetched).
    written = lm.num_layers * num_kv_heads(lm) * token_bytes if arm.dynamic else 0
    record = {
        **sample.describe(),
        "policy": arm.name,
        "generated": result.text,
        "stop_reason": result.stop_reason,
        "steps": steps,
        "metrics": task.score(sample, result.text),
        # token-level presses keep no whole head: their KV-head count is undefined (null), not 0
        "mean_kv_heads": float(np.mean([len(heads) for heads in result.kv_heads])) if arm.whole_heads else None,
        "budget_kv_heads": result.budget_heads,
        "shortfall": result.shortfall,
        "kv_fraction": result.kv_fraction,
        "mean_kept_kv": float(np.mean(result.kept_kv)),
        "mean_total_kv": float(np.mean(result.total_kv)),
        "kv_bytes": float(np.mean(result.kept_kv)) * token_bytes,
        "offloaded_bytes": float(np.mean(result.total_kv)) * token_bytes if arm.dynamic else 0.0,
        "moved_bytes_per_step": float(np.mean(result.fetched_kv)) * token_bytes + written,
        "moved_new_bytes_per_step": float(np.mean(result.fetched_new_kv)) * token_bytes + written,
        "dynamic": [[flat_index(h, lm.num_heads) for h in heads] for heads in result.dynamic],
    }
    if result.voters:  # head_tokens_predicted: the predictor's voters for this prompt
        record["voters"] = [head_key(h) for h in result.voters]
    if record_probe:
        record["probe_scores"] = result.probe_scores
    return record
