"""An experiment is a declaration (issue 62): one declared in this file alone runs through ``run_experiment`` (the
API) and, as a stage registered here, through a study; the runner refuses what it must before it writes anything."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pytest
from zoo import NoTokenizer, random_prompt, tiny_model

from dynheads import stages
from dynheads.engine.tracing import trace_batch
from dynheads.errors import DynheadsError
from dynheads.experiments import reproduce as reproduce_module
from dynheads.experiments.experiment import Context, Experiment, Phase, Plan, Work, run_experiment
from dynheads.experiments.reproduce import ReproduceConfig, Study, reproduce
from dynheads.io import read_json
from dynheads.models import LoadedModel
from dynheads.outputs import Outputs
from dynheads.registry import Registry
from dynheads.resources import STATIC_HEADS, Evaluated
from dynheads.runs import Finished, Job, RunDir, RunView
from dynheads.stages import Stage

SEEN: list[str] = []  # what the declaration was asked for, in order


@dataclass(frozen=True)
class StepsConfig:
    model: str = "tiny-llama"
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    prompts: int = 3
    prompt_length: int = 40
    max_new_tokens: int = 4
    static: str | None = None

    def check(self) -> None:
        if self.prompts < 1:
            raise DynheadsError("give at least one prompt")
        SEEN.append("check")


@dataclass(frozen=True)
class Prompt:
    sample_id: str
    input_ids: list[int]
    needle_positions: list[int]


def _plan(config: StepsConfig, lm: LoadedModel) -> Plan:
    SEEN.append("plan")
    prompts = [
        Prompt(f"p{i}", random_prompt(seed=i, length=config.prompt_length), [5, 6, 7]) for i in range(config.prompts)
    ]
    needs = frozenset({STATIC_HEADS}) if config.static == "needed" else frozenset()
    return Plan(
        samples=prompts,
        max_new_tokens=config.max_new_tokens,
        needs=needs,
        evaluated=Evaluated("this steps run"),
        missing="refuse",
    )


def _work(context: Context[StepsConfig, Plan]) -> Work:
    SEEN.append("work")

    def traced(batch: list[Prompt]) -> list[Finished]:
        traces = trace_batch(context.lm, batch, context.config.max_new_tokens, stop_at_eos=False)
        return [Finished({"steps": trace.num_steps, "tokens": trace.tokens}, trace) for trace in traces]

    jobs = [Job(prompt.sample_id, prompt) for prompt in context.plan.samples]
    return Work({"prompts": len(jobs)}, [Phase(jobs, traced, "steps")])


def _tables(context: Context[StepsConfig, Plan]) -> Outputs:
    """Pure: the files, which the runner writes."""
    records = RunView.of(context.run).records
    steps = pd.DataFrame({"sample_id": [r["sample_id"] for r in records], "steps": [r["steps"] for r in records]})
    return Outputs().add("steps.csv", steps).add("steps.json", {"total": int(steps["steps"].sum())})


STEPS = Experiment("steps", _plan, _work, _tables)


@pytest.fixture(scope="module")
def lm():
    return LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")


def test_an_experiment_declared_in_a_test_runs_and_resumes(lm, tmp_path):
    config = StepsConfig()
    SEEN.clear()
    run = run_experiment(STEPS, config, tmp_path / "run", lm=lm, progress=False)
    assert SEEN == ["check", "plan", "work"]  # refused-before-load first, the work once sources are read
    manifest = run.manifest()
    assert manifest["kind"] == "steps" and manifest["prompts"] == 3 and manifest["batch_size"] == 1
    table = pd.read_csv(run.path / "steps.csv")
    assert list(table["sample_id"]) == ["p0", "p1", "p2"] and set(table["steps"]) == {4}
    assert read_json(run.path / "steps.json") == {"total": 12}
    made: list[dict] = []
    again = run_experiment(STEPS, config, tmp_path / "run", lm=lm, progress=False, on_record=made.append)
    assert made == [] and [r["tokens"] for r in again.records()] == [r["tokens"] for r in run.records()]
    batched = run_experiment(STEPS, config, tmp_path / "batched", lm=lm, progress=False, batch_size=3)
    assert [r["tokens"] for r in batched.records()] == [r["tokens"] for r in run.records()]


def test_the_runner_refuses_before_it_writes_anything(lm, tmp_path):
    with pytest.raises(DynheadsError, match="at least one prompt"):
        run_experiment(STEPS, StepsConfig(prompts=0), tmp_path / "none", lm=lm)
    window = lm.model.config.max_position_embeddings
    with pytest.raises(DynheadsError, match="exceeds the model's context window"):
        run_experiment(STEPS, StepsConfig(prompt_length=window), tmp_path / "long", lm=lm)
    with pytest.raises(DynheadsError, match="this run needs a static head list: no --static head list given"):
        run_experiment(STEPS, StepsConfig(static="needed"), tmp_path / "sourceless", lm=lm)
    assert not any(tmp_path.iterdir())


def steps_stage(study: Study) -> object:
    """A study stage of our own: the experiment above, in the stage's folder, with the study's model."""
    return run_experiment(STEPS, StepsConfig(**study.settings("steps")), study.folder("steps"), **study.options)


def test_an_experiment_declared_in_a_test_runs_as_a_study_stage(lm, tmp_path, monkeypatch):
    registry = Registry(stages.STAGES.kind)
    registry.register("steps", Stage(f"{__name__}:steps_stage", optional=True), help="steps per prompt")
    monkeypatch.setattr(stages, "STAGES", registry)
    monkeypatch.setitem(
        reproduce_module.PRESETS, "smoke", {**reproduce_module.PRESETS["smoke"], "steps": {"prompts": 2}}
    )
    out = reproduce(ReproduceConfig(model="tiny-llama", preset="smoke"), tmp_path / "study", lm=lm, progress=False)
    assert list(read_json(out / "stages.json")) == ["steps"]
    assert "error" not in read_json(out / "stages.json")["steps"]
    assert RunDir(out / "steps").manifest()["kind"] == "steps"
    assert len(pd.read_csv(out / "steps" / "steps.csv")) == 2  # the preset's table set the config
