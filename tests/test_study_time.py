"""The whole study's time (issue 60 item 9): ``reproduce`` prints its estimated total before the first stage, from
the preset's counts and a calibration of the loaded model, and "stage i/N, about M left" before each stage."""

from __future__ import annotations

import re

import pytest

from dynheads import stages
from dynheads.experiments import reproduce as reproduce_module
from dynheads.experiments import study_time
from dynheads.experiments.reproduce import PRESETS, ReproduceConfig, reproduce
from dynheads.models import load_model

FAKE = study_time.Calibration(prefill_per_token=1e-4, decode_per_step=2e-2)


def _total(preset: str) -> float:
    tables = {key: value for key, value in PRESETS[preset].items() if key != "sources"}
    return sum(study_time.estimate_seconds(tables, stages.study_stages(), FAKE).values())


def test_the_estimate_scales_with_the_presets_counts():
    assert _total("smoke") < _total("quick") < _total("standard")
    # twice as slow a machine: twice the decoding time (the analysis stages' fixed allowance aside)
    slow = study_time.Calibration(2 * FAKE.prefill_per_token, 2 * FAKE.decode_per_step)
    tables = {key: value for key, value in PRESETS["standard"].items() if key != "sources"}
    fast, twice = (study_time.estimate_seconds(tables, stages.study_stages(), c) for c in (FAKE, slow))
    assert twice["niah"] == pytest.approx(2 * fast["niah"]) and twice["rag"] == pytest.approx(2 * fast["rag"])
    assert study_time.stage_work("cca", tables["cca"]) is None  # decodes nothing: the fixed allowance


def test_questions_are_counted_once_teacher_forced_arms_at_prefill_speed_and_processes_share():
    """A Qwen2.5-Coder-0.5B standard study was announced at 1,604 min for about 90: questions were counted once per
    grid cell and every teacher-forced arm as a whole decode."""
    table = {"questions": 40, "lengths": [500, 1000], "depths": [0.05, 0.95], "max_new_tokens": 16}
    assert study_time.stage_work("hotpotqa", table) == study_time.StageWork(40, 750.0, 16)
    forced = {**table, "fractions": [0.25, 0.5, 0.75, 1.0], "compensation": [1.5, 2.0], "metric": "teacher"}
    work = study_time.stage_work("hotpotqa-ablation", forced)
    assert work == study_time.StageWork(40, 750.0, 16, forced_passes=40 * 4 * 6)
    cascade = study_time.stage_work("hotpotqa-ablation", {**forced, "metric": "cascade"})
    assert cascade == study_time.StageWork(40 * (1 + 4 * 6), 750.0, 16)
    clean = 40 * (750 * FAKE.prefill_per_token + 16 * FAKE.decode_per_step)
    one = study_time.estimate_seconds({"hotpotqa-ablation": forced}, ["hotpotqa-ablation"], FAKE)
    assert one["hotpotqa-ablation"] == pytest.approx(clean + 40 * 24 * 16 * FAKE.prefill_per_token)
    two = study_time.estimate_seconds(
        {"hotpotqa-ablation": forced}, ["hotpotqa-ablation"], FAKE, 2, {"hotpotqa-ablation"}
    )
    assert two["hotpotqa-ablation"] == pytest.approx(one["hotpotqa-ablation"] / 2)
    alone = study_time.estimate_seconds({"hotpotqa-ablation": forced}, ["hotpotqa-ablation"], FAKE, 2, ())
    assert alone == one  # a stage rank 0 runs alone takes no share


def test_the_estimate_line_says_it_is_an_estimate_and_what_it_assumes():
    seconds = {"niah": 600.0, "cca": 10.0}
    line = study_time.estimate_line("standard", seconds, FAKE)
    assert line.startswith("[reproduce] estimated total for preset standard: about 10 min over 2 stages")
    assert "an estimate" in line and "measured on this machine" in line and "decoding only" in line
    assert "shared over the processes" in line
    assert study_time.progress_line(3, 15, "ablation", 150.0) == "[reproduce] stage 3/15 ablation, about 2 min left"
    done = study_time.progress_line(3, 15, "ablation", 0.0, done=True)
    assert done == "[reproduce] stage 3/15 ablation: done in an earlier run, skipped"


def test_reproduce_prints_the_estimate_before_the_first_stage_and_each_stage_i_of_n(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    ran = []  # the stages themselves are not run here: only what reproduce prints around them
    monkeypatch.setattr(reproduce_module._Stages, "run", lambda self, name, fn, every_rank, preset: ran.append(name))
    reproduce(ReproduceConfig(model=str(tiny_model_dir), preset="smoke"), tmp_path / "s", lm=load_model(tiny_model_dir))
    lines = capsys.readouterr().out.splitlines()
    names = stages.study_stages()  # the run order itself is pinned in the fast lane (tests/test_stages.py)
    count = len(names)
    assert ran == names and count > 10
    estimate = next(i for i, line in enumerate(lines) if line.startswith("[reproduce] estimated total"))
    stage_lines = [i for i, line in enumerate(lines) if re.match(rf"\[reproduce\] stage \d+/{count} ", line)]
    assert len(stage_lines) == count and estimate < stage_lines[0]
    for index, (number, name) in enumerate(zip(stage_lines, names, strict=True), 1):
        assert re.fullmatch(rf"\[reproduce\] stage {index}/{count} {name}, about \d+ (s|min) left", lines[number])
