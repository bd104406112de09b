"""How long a whole ``dynheads reproduce`` study will take: an estimate printed before its first stage, and an
overall line (stage i of N, about M min left) before each stage.

The estimate is a calibration times the work: the loaded model's prefill time per prompt token and decode time per
generated token, measured once on this machine (one short prompt, a few traced steps), times each stage's decodes
from its preset table (records x arms, each a prompt of the grid's mean length and its ``max_new_tokens``). What it
assumes, and says: decode time per step does not grow with the context, the stages' own work besides decoding
(scoring, writing traces) is not counted, and the analysis stages that decode nothing (dynamism, CCA, the probe)
are counted at a fixed ``ANALYSIS_SECONDS``. It is an order of magnitude, not a promise.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import torch

from dynheads import stages
from dynheads.engine.decoding import DecodingSession
from dynheads.models import LoadedModel

CALIBRATION_STEPS = 4  # decode steps timed after the calibration prompt
ANALYSIS_SECONDS = 10.0  # a stage that decodes nothing (dynamism, CCA, the probe): counted at this
RAG_STRATEGIES = 5  # dynamic, static, dynamic random, fixed random, no retrieval: one answer each per k
ABLATION_ARMS = 4  # dynamic, static, static outside D_t, random: at every dose of a teacher-forced ablation


@dataclass(frozen=True)
class Calibration:
    """Seconds this machine took with the loaded model: per prompt token of a prefill, per generated token."""

    prefill_per_token: float
    decode_per_step: float


@dataclass(frozen=True)
class StageWork:
    """What a stage decodes: ``decodes`` generations, each a prompt of ``prompt_tokens`` and ``new_tokens`` steps,
    and ``forced_passes`` teacher-forced passes over an answer of ``new_tokens`` tokens (at the prefill's speed)."""

    decodes: int
    prompt_tokens: float
    new_tokens: int
    forced_passes: int = 0


def calibrate(lm: LoadedModel, prompt_tokens: int = 256) -> Calibration:
    """Time one traced prefill of ``prompt_tokens`` tokens and ``CALIBRATION_STEPS`` traced decode steps of the
    loaded model (the decoding session every stage decodes with, its attention probe measuring each step)."""
    vocabulary = int(lm.model.config.get_text_config().vocab_size)
    ids = torch.randint(0, vocabulary, (prompt_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    session = DecodingSession(lm, ids, max_new_tokens=CALIBRATION_STEPS)
    start = time.perf_counter()
    result = session.forward()
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(CALIBRATION_STEPS):
        session.append(int(result.logits.argmax()))
        result = session.forward()
    decode = time.perf_counter() - start
    return Calibration(prefill / prompt_tokens, decode / CALIBRATION_STEPS)


def _cells(table: Mapping) -> int:
    return len(table.get("lengths", ())) * len(table.get("depths", (0.5,)))


def stage_work(stage: str, table: Mapping) -> StageWork | None:
    """The decodes of ``stage`` from its preset ``table``; None for a stage that decodes nothing."""
    lengths = table.get("lengths")
    if not lengths:
        return None
    cells = _cells(table)
    if "samples" in table:  # the static list: samples spread over the grid in whole passes
        records = math.ceil(table["samples"] / cells) * cells
    elif "questions" in table:  # question i goes to grid cell i mod cells (``experiments.hotpotqa``)
        records = table["questions"]
    else:
        records = (table.get("runs") or 1) * cells
    prompt, new = sum(lengths) / len(lengths), int(table.get("max_new_tokens", 16))
    settings = ABLATION_ARMS * (len(table.get("fractions", ())) + len(table.get("compensation", ())))
    if stage in (stages.ABLATION, stages.HOTPOTQA_ABLATION) and table.get("metric", "teacher") == "teacher":
        return StageWork(records, prompt, new, forced_passes=records * settings)
    arms = {
        stages.ABLATION: 1 + settings,  # the cascade: every arm at every dose decodes its own answer
        stages.HOTPOTQA_ABLATION: 1 + settings,
        stages.PROGRESSIVE: len(table.get("ks", (0,))),
        stages.HOTPOTQA_PROGRESSIVE: len(table.get("ks", (0,))),
        stages.RAG: len(table.get("ks", (0,))) * RAG_STRATEGIES,
    }.get(stage, 1)
    return StageWork(records * arms, prompt, new)


def estimate_seconds(
    tables: Mapping[str, Mapping],
    names: list[str],
    calibration: Calibration,
    processes: int = 1,
    dealt: Collection[str] = (),
) -> dict[str, float]:
    """Seconds per stage of ``names`` (in order), from each stage's preset table and the calibration; a stage in
    ``dealt`` shares its samples over ``processes``."""
    seconds = {}
    for name in names:
        work = stage_work(name, tables.get(name, {}))
        if work is None:
            seconds[name] = ANALYSIS_SECONDS
            continue
        decode = work.prompt_tokens * calibration.prefill_per_token + work.new_tokens * calibration.decode_per_step
        forced = work.new_tokens * calibration.prefill_per_token
        share = processes if name in dealt else 1
        seconds[name] = (work.decodes * decode + work.forced_passes * forced) / share
    return seconds


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def estimate_line(preset: str, seconds: Mapping[str, float], calibration: Calibration) -> str:
    """The line printed before the first stage: the total and what the estimate assumes."""
    return (
        f"[reproduce] estimated total for preset {preset}: about {minutes(sum(seconds.values()))} over "
        f"{len(seconds)} stages (an estimate: {calibration.prefill_per_token * 1000:.1f} ms per prompt token and "
        f"{calibration.decode_per_step * 1000:.0f} ms per generated token measured on this machine just now, times "
        f"each stage's decodes in the preset, shared over the processes; decoding only, one row at a time, at a cost "
        f"per step that does not grow with the context; stages that decode nothing count {ANALYSIS_SECONDS:.0f} s)"
    )


def progress_line(index: int, total: int, name: str, seconds_left: float, *, done: bool = False) -> str:
    """The overall line before stage ``index`` (1-based) of ``total``: the estimate of the stages from it on, or,
    for a stage an earlier run finished, that it is skipped."""
    if done:
        return f"[reproduce] stage {index}/{total} {name}: done in an earlier run, skipped"
    return f"[reproduce] stage {index}/{total} {name}, about {minutes(seconds_left)} left"
