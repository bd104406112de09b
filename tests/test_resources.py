"""Head sources in one place (issue 35): a static head list and a head predictor load with what they were fitted
on, and an overlap with what a run evaluates is refused by ``resources`` alone, whichever runner reads them."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import dynheads
from dynheads.errors import DynheadsError
from dynheads.resources import (
    HEAD_PREDICTOR,
    STATIC_HEADS,
    Evaluated,
    fit_record,
    needs_of,
    resolve,
    static_heads,
)
from dynheads.runs import RunDir

NIAH = Evaluated("this run", samples=({"sample_id": "analysis-b", "seed": 12, "answer": "uuid-b"},))


def niah_run(folder: Path, seed: int = 11, answer: str = "uuid-a") -> RunDir:
    run = RunDir(folder)
    run.start("niah", {"seed": 1}, None)
    run.save_sample({"sample_id": "static-a", "seed": seed, "answer": answer})
    return run


def ranked_list(path: Path, scores: dict[str, float] | None = None) -> Path:
    scores = scores or {f"{layer}-{head}": float(layer + head) for layer in range(3) for head in range(4)}
    path.write_text(json.dumps({key: [value] for key, value in scores.items()}))
    return path


def test_a_niah_source_records_its_samples_and_is_refused_on_a_shared_seed_or_needle(tmp_path):
    run = niah_run(tmp_path / "train")
    (tmp_path / "train" / "probe").mkdir()
    probe = str(tmp_path / "train" / "probe")
    record = fit_record(probe, HEAD_PREDICTOR, NIAH)
    assert record["samples"] == [{"sample_id": "static-a", "seed": 11, "answer": "uuid-a"}]
    assert record["checked"] == "seeds and needle values" and record["run"] == str(run.path)
    for shared in ({"seed": 11, "answer": "uuid-c"}, {"seed": 13, "answer": "uuid-a"}):
        evaluated = Evaluated("this run", samples=NIAH.samples + ({"sample_id": "analysis-c", **shared},))
        with pytest.raises(DynheadsError, match="fitted on 1 of the evaluation samples .e.g. analysis-c"):
            fit_record(probe, HEAD_PREDICTOR, evaluated)
    elsewhere = str(tmp_path / "elsewhere" / "probe")
    with pytest.raises(DynheadsError, match="cannot tell which samples"):
        fit_record(elsewhere, HEAD_PREDICTOR, Evaluated("this run", samples=NIAH.samples, unknown_fit="refuse"))
    assert fit_record(elsewhere, HEAD_PREDICTOR, NIAH)["checked"].startswith("unknown")


def test_a_question_source_is_refused_on_a_shared_question(tmp_path):
    run = RunDir(tmp_path / "static")
    run.start("hotpotqa-static", {"seed": 1}, None, {"questions": {"ids": ["q1", "q2"]}})
    listed = ranked_list(tmp_path / "static" / "static_heads.json")
    evaluated = Evaluated("this RAG run", questions=("q2", "q3"))
    with pytest.raises(DynheadsError, match=r"static head list .* fitted on 1 of the questions this RAG run"):
        fit_record(listed, STATIC_HEADS, evaluated)
    assert fit_record(listed, STATIC_HEADS, Evaluated("this RAG run", questions=("q3",)))["checked"] == "question ids"
    bare = ranked_list(tmp_path / "bare.json")  # a list from elsewhere: passes, and says it could not be checked
    assert fit_record(bare, STATIC_HEADS, evaluated)["checked"].startswith("unknown")
    (tmp_path / "probe").mkdir()
    with pytest.raises(DynheadsError, match="records no training questions"):
        fit_record(tmp_path / "probe", HEAD_PREDICTOR, evaluated)
    (tmp_path / "probe" / "questions.json").write_text(json.dumps({"train": ["q3"], "validation": []}))
    with pytest.raises(DynheadsError, match="the probe in .* fitted on 1 of the questions"):
        fit_record(tmp_path / "probe", HEAD_PREDICTOR, evaluated)


def test_a_static_list_fitted_on_niah_shares_no_question_with_a_question_task(tmp_path):
    """A list scored on NIAH samples (a niah run beside it) evaluated on a question task (RULER, HotpotQA): no
    question can be shared, so the manifest says so instead of "unknown" (and the KV tables print no warning)."""
    niah_run(tmp_path / "static")
    listed = ranked_list(tmp_path / "static" / "static_heads.json")
    checked = fit_record(listed, STATIC_HEADS, Evaluated("this KV run", questions=("q1",)))["checked"]
    assert (
        checked == "no shared question: fitted on NIAH samples (the niah run beside the list), which are not questions"
    )
    bare = ranked_list(tmp_path / "bare.json")  # no run beside it: still unknown
    assert fit_record(bare, STATIC_HEADS, Evaluated("this KV run", questions=("q1",)))["checked"].startswith("unknown")


def test_a_static_list_fitted_on_the_evaluated_stream_is_refused_and_its_stream_recorded(tmp_path):
    listed = ranked_list(tmp_path / "static_heads.json")
    (tmp_path / "static_summary.json").write_text(
        json.dumps({"split": "static", "num_tests": 4, "config": {"seed": 2}})
    )
    record = fit_record(listed, STATIC_HEADS, Evaluated("this run", split="analysis"))
    assert record["file"] == str(listed) and record["fitted_on"] == {
        "split": "static",
        "tests": 4,
        "counted": None,
        "seed": 2,
    }
    with pytest.raises(DynheadsError, match="fitted on the 'static' stream, the one evaluated here"):
        fit_record(listed, STATIC_HEADS, Evaluated("this run", split="static"))


def test_resolve_loads_what_is_needed_and_says_what_is_missing(tmp_path):
    listed = ranked_list(tmp_path / "static_heads.json", {"0-1": 0.5, "2-3": 0.9, "1-0": 0.0})
    sources = resolve([STATIC_HEADS, HEAD_PREDICTOR], static=listed, predictor=None, shape=(3, 4), evaluated=NIAH)
    assert sources.static.ranking == ((2, 3), (0, 1))  # scored heads only, best first: never zero-score filler
    assert sources.predictor is None and set(sources.missing) == {HEAD_PREDICTOR}
    assert sources.manifest()[STATIC_HEADS]["path"] == str(listed)
    assert resolve([], static=listed, predictor=None, shape=(3, 4), evaluated=NIAH).static is None  # not needed
    zero = ranked_list(tmp_path / "zero.json", {"0-0": 0.0})
    with pytest.raises(DynheadsError, match="zero score"):
        static_heads(zero, (3, 4), NIAH)
    with pytest.raises(DynheadsError, match="unknown head source 'bogus'"):
        resolve(["bogus"], static=None, predictor=None, shape=(3, 4), evaluated=NIAH)


def test_a_source_from_a_run_of_another_model_is_refused(tmp_path):
    """Same shape is not same model: a list or predictor made on another model's run is refused by resolve, and a
    folder's revision ("local") is not read as a difference."""
    model = {"name": "tiny-llama", "revision": "local", "architecture": "LlamaForCausalLM", "num_layers": 3}
    model |= {"num_heads": 4, "hidden_size": 64, "parameters": 1000}
    for name, other in [("arch", {"architecture": "Qwen2ForCausalLM"}), ("weights", {"revision": "sha256:a"})]:
        run = RunDir(tmp_path / name)
        run.start("hotpotqa-static", {"seed": 1}, None, {"model": {**model, "revision": "sha256:b"} | other})
        listed = ranked_list(tmp_path / name / "static_heads.json")
        this = {**model, "revision": "sha256:b"}
        with pytest.raises(DynheadsError, match=f"comes from a run of another model .* {next(iter(other))}"):
            resolve([STATIC_HEADS], static=listed, predictor=None, shape=(3, 4), evaluated=NIAH, model=this)
    run = RunDir(tmp_path / "same")
    run.start("hotpotqa-static", {"seed": 1}, None, {"model": {**model, "name": "elsewhere/tiny-llama"}})
    listed = ranked_list(tmp_path / "same" / "static_heads.json")
    sources = resolve([STATIC_HEADS], static=listed, predictor=None, shape=(3, 4), evaluated=NIAH, model=model)
    assert sources.static is not None and sources.static.ranking[0] == (2, 3)


def test_variants_declare_the_sources_they_read():
    from dynheads.ablation.strategies import ABLATION_STRATEGIES
    from dynheads.kv.policies import KV_POLICIES
    from dynheads.rag.strategies import RAG_STRATEGIES

    assert needs_of([ABLATION_STRATEGIES.get("static"), ABLATION_STRATEGIES.get("random")]) == {STATIC_HEADS}
    assert needs_of([RAG_STRATEGIES.get("dynamic")]) == {HEAD_PREDICTOR}
    assert needs_of([KV_POLICIES.get("full")]) == set()


RUNNERS = ("kv", "ablation", "dose", "rag", "rerank")


@pytest.mark.parametrize("runner", RUNNERS)
def test_no_runner_loads_a_head_source_itself(runner):
    """The runners that read a static list or a predictor get them from ``resources``, never from the loaders."""
    path = Path(dynheads.__file__).parent / "experiments" / f"{runner}.py"
    imported = {
        alias.name
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert not imported & {"load_head_list", "load_head_predictor", "scored_heads"}, runner


def test_a_source_is_recorded_by_its_content_whatever_path_names_it(tmp_path):
    for name in ("a", "b", "p1", "p2"):
        (tmp_path / name).mkdir()
    first = ranked_list(tmp_path / "a" / "static_heads.json")
    copy = tmp_path / "b" / "static_heads.json"
    copy.write_bytes(first.read_bytes())
    other = ranked_list(tmp_path / "other.json", {"0-0": 1.0})
    evaluated = Evaluated("this run")
    digests = [fit_record(path, STATIC_HEADS, evaluated)["sha256"] for path in (first, copy, other)]
    assert digests[0] == digests[1] != digests[2]
    # a folder (a trained predictor): by its files' names and contents
    for name in ("p1", "p2"):
        (tmp_path / name / "questions.json").write_text(json.dumps({"train": ["q1"], "validation": []}))
        (tmp_path / name / "weights.bin").write_bytes(b"\x00\x01")
    folders = [fit_record(tmp_path / name, HEAD_PREDICTOR, evaluated)["sha256"] for name in ("p1", "p2")]
    assert folders[0] == folders[1]
    (tmp_path / "p2" / "weights.bin").write_bytes(b"\x00\x02")
    assert fit_record(tmp_path / "p2", HEAD_PREDICTOR, evaluated)["sha256"] != folders[0]
