"""The task registry: a toy third task registered from this file alone runs through the generic tracing runner
and the ablation grid; unknown tasks are one-line errors; multi-hop runs are labelled as such."""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import dataclass

import pandas as pd
import pytest

from dynheads.errors import DynheadsError
from dynheads.experiments.ablation import AblationConfig, run_ablation
from dynheads.experiments.experiment import run_task
from dynheads.io import write_json
from dynheads.report.sections import build_sections
from dynheads.tasks import niah
from dynheads.tasks.grid import TaskGrid
from dynheads.tasks.prompting import locate, render_chat, token_span
from dynheads.tasks.registry import Task, get_task, register, task_names, task_of, task_of_manifest, unregister
from dynheads.tasks.sample import Sample, build_sample

# ---- the toy task: repeat the code word hidden in filler text (everything a task needs, in ~40 lines) ----------
WORDS = ("lantern", "walrus", "teapot", "glacier", "cactus", "falcon")
FILLER = "The grass is green and the sky is blue. "
USER = "{context}\n\nWhat is the code word? Answer with the word only."


@dataclass(frozen=True)
class CodeWordExtras:
    word_tokens: int  # tokens of the code word in the prompt


@dataclass(frozen=True)
class ToyConfig:
    model: str | None = None
    lengths: tuple[int, ...] = (60,)
    depths: tuple[float, ...] = (0.0, 1.0)
    runs: int = 1
    seed: int = 0
    max_new_tokens: int = 3
    sink_size: int = 4
    local_window: int = 8
    dtype: str = "auto"
    device: str | None = None


def code_word_sample(tokenizer, length: int, depth: float, seed: int) -> Sample:
    word = random.Random(seed).choice(WORDS)
    needle = f"The code word is {word}."
    filler = FILLER * max(1, length // 10)
    cut = round(depth * len(filler) / len(FILLER)) * len(FILLER)  # at a sentence boundary
    prompt = render_chat(
        tokenizer, "You answer briefly.", USER.format(context=filler[:cut] + needle + " " + filler[cut:])
    )
    start, stop = locate(prompt, needle)
    word_start = start + needle.index(word)
    return build_sample(
        prompt,
        sample_id=f"len{length}-depth{depth:g}-seed{seed}",
        needle_positions=token_span(prompt, start, stop),
        answer=word,
        context_tokens=length,
        depth=depth,
        seed=seed,
        extras=CodeWordExtras(len(token_span(prompt, word_start, word_start + len(word)))),
    )


def code_word_grid(config, tokenizer) -> TaskGrid:
    return TaskGrid(
        [
            code_word_sample(tokenizer, length, depth, config.seed + run)
            for length in config.lengths
            for depth in config.depths
            for run in range(config.runs)
        ]
    )


TOY = Task(
    name="codeword",
    label="Code word",
    score_kind="copy",
    static_kind="copy",
    metrics={"hit": "hit rate"},
    score=lambda sample, text: {"hit": float(sample.answer in text)},
    grid=code_word_grid,
    prompt=lambda config: {"user": USER, "filler": FILLER},
)


@pytest.fixture
def toy_task():
    register(TOY)
    yield TOY
    unregister(TOY.name)


# ---- tests ------------------------------------------------------------------------------------------------------
def test_toy_task_runs_through_the_tracing_runner(toy_task, tiny_model_dir, tiny_lm, tmp_path):
    run = run_task("codeword", ToyConfig(model=str(tiny_model_dir)), tmp_path / "toy", lm=tiny_lm, progress=False)
    manifest = run.manifest()
    assert manifest["kind"] == "codeword" and manifest["prompt"]["filler"] == FILLER
    records = run.records()
    assert [r["sample_id"] for r in records] == ["len60-depth0-seed0", "len60-depth1-seed0"]
    for record in records:
        assert set(record["metrics"]) == {"hit"} and record["word_tokens"] >= 1  # extras flattened into the record
        assert record["answer"] in WORDS and "input_ids" not in record
        trace = run.load_trace(record["sample_id"])
        assert trace.num_steps == record["steps"] >= 1
        assert trace.copy_scores.shape == (trace.num_steps, tiny_lm.num_layers, tiny_lm.num_heads)
        assert trace.chance is not None  # the Eq. 2 chance share is recorded for every task
    assert task_of_manifest(manifest) is toy_task


def test_toy_task_runs_through_the_ablation_grid(toy_task, tiny_model_dir, tiny_lm, tmp_path):
    config = AblationConfig(
        model=str(tiny_model_dir),
        task="codeword",
        lengths=(60,),
        depths=(0.5,),
        runs=2,
        max_new_tokens=3,
        strategies=("dynamic", "random"),
    )
    run = run_ablation(config, tmp_path / "ablate", lm=tiny_lm, progress=False)
    records = run.records()
    assert len(records) == 2 * 3  # none, dynamic, random per sample
    assert all(set(r["metrics"]) == {"hit"} for r in records)
    assert run.manifest()["prompt"] == {"user": USER, "filler": FILLER}
    cells = pd.read_csv(tmp_path / "ablate" / "cells.csv")
    assert list(cells.columns[:5]) == ["strategy", "length", "depth", "hit", "samples"]
    assert set(cells["strategy"]) == {"none", "dynamic", "random"} and (cells["samples"] == 2).all()
    assert (tmp_path / "ablate" / "plots" / "ablation-hit.png").is_file()
    summary = (tmp_path / "ablate" / "summary.md").read_text()
    assert "| hit rate |" in summary and "Paper (" not in summary  # the paper has no such task


def test_unknown_task_is_one_line_naming_the_registered_ones():
    with pytest.raises(DynheadsError) as error:
        get_task("bogus")
    assert str(error.value) == f"unknown task 'bogus': use one of {', '.join(task_names())}"
    assert {"niah", "hotpotqa", "multihop"} <= set(task_names())
    with pytest.raises(DynheadsError, match="unknown task 'bogus'"):
        AblationConfig(task="bogus").check()
    with pytest.raises(DynheadsError, match="already registered"):
        register(get_task("niah"))


def test_a_task_module_registers_itself_on_first_lookup(tmp_path, monkeypatch):
    import sys

    import dynheads.tasks

    (tmp_path / "toyfile.py").write_text(
        "from dynheads.tasks.registry import Task, register\n"
        "TASK = register(Task(name='toyfile', label='Toy file', score_kind='reasoning', static_kind='reasoning',\n"
        "                     metrics={'hit': 'hit'}, score=None, grid=None, prompt=None))\n"
    )
    monkeypatch.setattr(dynheads.tasks, "__path__", [*dynheads.tasks.__path__, str(tmp_path)])
    try:
        assert "toyfile" not in task_names()
        assert get_task("toyfile").label == "Toy file" and "toyfile" in task_names()
        assert task_of_manifest({"kind": "toyfile", "config": {}}).name == "toyfile"
        assert task_of_manifest({"kind": "rag", "config": {}}) is None
    finally:
        unregister("toyfile")
        sys.modules.pop("dynheads.tasks.toyfile", None)


def test_multihop_data_selects_the_multihop_task_and_its_label(tmp_path):
    assert task_of("hotpotqa", None).label == "HotpotQA"
    multi = task_of("hotpotqa", "multihop:hops=2")
    assert (multi.name, multi.label, multi.paper_label, multi.score_kind) == (
        "multihop",
        "Multi-hop",
        "HotpotQA",
        "reasoning",
    )
    assert task_of("niah").metrics == {"accuracy": "accuracy", "rouge_l": "ROUGE-L"}
    # a multi-hop study written before runs were named by their task still reads as multi-hop
    write_json(tmp_path / "hotpotqa" / "manifest.json", {"kind": "hotpotqa", "config": {"data": "multihop:hops=2"}})
    titles = [section.title for section in build_sections(tmp_path)]
    assert (
        "Multi-hop setup (Section 5)" in titles
        and "Claim 2, irreplaceability, on Multi-hop (Figures 6 and 7)" in titles
    )
    assert not any("HotpotQA" in title for title in titles)
    # the one-hop form (multihop's default) is one retrieval: a key-value lookup, however the run was named
    for manifest in (
        {"kind": "hotpotqa", "config": {"data": "multihop"}},
        {"kind": "multihop", "config": {"data": "multihop:hops=1"}},
    ):
        write_json(tmp_path / "hotpotqa" / "manifest.json", manifest)
        titles = [section.title for section in build_sections(tmp_path)]
        assert "Key-value lookup setup (Section 5)" in titles and not any("Multi-hop" in t for t in titles)
    assert task_of("multihop", None).name == "kv_lookup"
    # RULER's tasks are reached by their data spelling, and by name
    assert task_of("hotpotqa", "variable_tracking:hops=2").label == "Variable tracking"
    assert task_of("hotpotqa", "multikey_niah").label == "Multi-key NIAH"
    assert get_task("variable_tracking").metrics["string_match"] == "string match"
    write_json(tmp_path / "hotpotqa" / "manifest.json", {"kind": "hotpotqa", "config": {"data": None}})
    assert "HotpotQA setup (Section 5)" in [section.title for section in build_sections(tmp_path)]


def test_a_task_registered_here_is_selected_by_the_data_it_declares():
    # two forms of one toy source, declared on their entries alone: task_of reads them, the CLI's default too
    from dynheads.cli.trace_commands import default_data

    def toy(name: str, long: bool) -> Task:
        return Task(
            name=name,
            label=name,
            score_kind="reasoning",
            static_kind="reasoning",
            metrics={"hit": "hit"},
            score=None,
            grid=None,
            prompt=None,  # a toy entry: only its data declarations are read here
            data_source="toyq",
            selects=lambda data: ("long" in data) == long,
            default_data="toyq:long" if long else "toyq",
        )

    short, long = register(toy("toy_short", False)), register(toy("toy_long", True))
    try:
        assert task_of("hotpotqa", "toyq:long") is long and task_of("hotpotqa", "toyq") is short  # HotpotQA's spelling
        assert task_of("toy_short", "toyq:long") is long and task_of("toy_long", None) is long
        assert task_of("niah", "toyq:long").name == "niah"  # a task that reads no toyq data keeps its name
        assert task_of("multihop", "toyq:long").name == "multihop"  # nor does another source's task
        assert default_data("toy_long") == "toyq:long" and default_data("toy_short") == "toyq"
    finally:
        unregister("toy_short")
        unregister("toy_long")


def test_one_sample_type_keeps_the_record_columns(tiny_lm):
    sample = niah.make_sample(tiny_lm.tokenizer, context_tokens=120, depth=0.5, seed=1)
    assert isinstance(sample, Sample) and sample.answer_token_count == sample.extras.answer_token_count >= 1
    assert list(sample.describe()) == [
        "sample_id",
        "needle_positions",
        "answer",
        "answer_token_count",
        "context_span",  # the haystack's token range (issue 61: what a question-free press compresses)
        "context_tokens",
        "depth",
        "seed",
        "prompt_template",
        "meta",
        "chat_template_kwargs",
        "prompt_tokens",
    ]
    start, stop = sample.context_span  # the haystack, the needle inside it, the question after it
    assert start < min(sample.needle_positions) <= max(sample.needle_positions) < stop < len(sample.input_ids)
    with pytest.raises(AttributeError):
        sample.question  # noqa: B018 - a NIAH sample has no QA extras


def test_each_built_in_task_is_registered_by_its_own_module():
    import ast
    from pathlib import Path

    from dynheads.tasks import hotpotqa, multihop, ruler
    from dynheads.tasks import registry as task_registry

    owners = {
        "niah": niah.NIAH,
        "hotpotqa": hotpotqa.HOTPOTQA,
        "multihop": multihop.MULTIHOP,
        "kv_lookup": multihop.KV_LOOKUP,
        "variable_tracking": ruler.VARIABLE_TRACKING,
        "vt_lookup": ruler.VT_LOOKUP,
        "multikey_niah": ruler.MULTIKEY_NIAH,
    }
    assert set(owners) <= set(task_names())
    for name, task in owners.items():
        assert get_task(name) is task and task_registry.TASKS.help(name) == task.help != ""
    # the registry module names no task module at import time (each module registers itself)
    tree = ast.parse(Path(task_registry.__file__).read_text(encoding="utf-8"))
    imported = {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert (
        "dynheads.tasks" not in imported
        and not {f"dynheads.tasks.{name}" for name in task_registry.BUILTIN_MODULES} & imported
    )


def test_built_in_tasks_list_in_their_declared_order_whichever_module_was_imported_first():
    code = (
        "import dynheads.tasks.ruler, dynheads.tasks.hotpotqa\n"
        "from dynheads.tasks.registry import task_names\n"
        "print(','.join(task_names()))"
    )
    listed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(",")
    assert listed[:4] == ["niah", "spelled_niah", "spelled_niah_paraphrased", "hotpotqa"]
    assert listed.index("multihop") < listed.index("variable_tracking")
    assert listed[-1].strip() == "custom"
