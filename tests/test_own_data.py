"""Your own text and your own data: ``sample_from_text``, the ``custom`` task's records, ``Trace.looked_at``, the
``view`` command, and the checks that refuse bad input in one line before any model loads.

Everything here runs on a tiny word-level tokenizer or on hand-made traces (no model); docs/own-data.md's examples
run against the embedded model in tests/test_own_data_docs.py."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re

import numpy as np
import pytest
from cli_main import run_main
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dynheads import DynheadsError, sample_from_text
from dynheads.engine.tracing import trace_batch
from dynheads.runs import RunDir
from dynheads.tasks import custom
from dynheads.tasks.registry import get_task
from dynheads.traces import Trace

WORDS = "the magic word is pineapple what ? context question answer : . lake baikal deep metres 1642 it in".split()
CONTEXT = "the magic word is pineapple ."


@pytest.fixture(scope="module")
def tok():
    """A word-level fast tokenizer (plain template): unknown words become [UNK], so a span can tokenise away."""
    vocab = {"[UNK]": 0, **{word: i + 1 for i, word in enumerate(WORDS)}}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="[UNK]", model_max_length=10**30)


def _decoded(tok, sample) -> str:
    return tok.decode([sample.input_ids[i] for i in sample.needle_positions])


@pytest.mark.parametrize(
    ("context", "options", "needle", "depth"),
    [
        ("the magic word is [[pineapple]] .", {}, "pineapple", 0.8),  # marked in the text
        (CONTEXT, {"spans": [(18, 27)]}, "pineapple", 0.8),  # character offsets
        (CONTEXT, {"spans": ["magic word"]}, "magic word", 0.2),  # a text: its occurrences
        (CONTEXT, {"answer": "pineapple"}, "pineapple", 0.8),  # the answer's occurrences by default
    ],
)
def test_spans_become_the_needle_positions(tok, context, options, needle, depth):
    sample = sample_from_text(tok, context, "what is the magic word ?", **options)
    assert _decoded(tok, sample) == needle
    assert sample.context_tokens == 6 and sample.depth == depth and sample.seed is None  # as written
    assert sample.question == "what is the magic word ?"
    start, stop = sample.context_span
    assert tok.decode(sample.input_ids[start:stop]) == CONTEXT


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"spans": [(5, 5)]}, r"span 0 \[5, 5\) is empty or outside the context of 29 characters"),
        ({"spans": [(20, 40)]}, r"span 0 \[20, 40\) is empty or outside"),
        ({"spans": [(-1, 3)]}, r"span 0 \[-1, 3\) is empty or outside"),
        ({"spans": [(17, 18)]}, "holds only whitespace"),
        ({"spans": []}, "spans is empty"),
        ({"spans": ["banana"]}, "'banana' does not occur in the context"),
        ({"spans": [(1.5, 3)]}, "must be \\[start, stop\\] character offsets"),
        ({"answer": "banana"}, "the answer 'banana' does not occur in the context"),
        ({}, r"no span to score \(no answer\)"),
    ],
)
def test_bad_spans_are_one_line(tok, options, says):
    with pytest.raises(DynheadsError, match=says) as error:
        sample_from_text(tok, CONTEXT, "what ?", **options)
    assert "\n" not in str(error.value)


def test_an_answer_outside_the_marked_span_is_refused(tok):
    """Looping questions over one marked paragraph: an answer the marks do not hold would score the wrong span."""
    marked = "the magic word is [[pineapple]] ."
    with pytest.raises(DynheadsError, match="the answer 'magic' is not inside the marked span\\(s\\) 'pineapple'"):
        sample_from_text(tok, marked, "what ?", answer="magic")
    for answer in ("pineapple", "Pineapple", "a pineapple .", ""):  # inside, holding it, or none given
        assert _decoded(tok, sample_from_text(tok, marked, "what ?", answer=answer)) == "pineapple"


@pytest.mark.parametrize(
    ("context", "says"),
    [
        ("the magic word is [[pineapple .", r"the \[\[ at character 18 is never closed with \]\]"),
        ("the magic word is pineapple]] .", r"the \]\] at character 27 closes no \[\["),
        ("the [[magic word is [[pineapple]] .]]", r"the \[\[ at character 20 opens a mark inside the mark at 4"),
        ("the magic word is [[ ]] pineapple .", "the mark at character 18 holds no text"),
    ],
)
def test_marks_that_do_not_pair_up_are_refused_not_left_in_the_prompt(tok, context, says):
    """They were left in the prompt as text (or a nested mark's inner [[ became part of the span), silently."""
    with pytest.raises(DynheadsError, match=says + r" \(to keep \[\[ or \]\] as text, pass spans=\[\.\.\.\]\)"):
        sample_from_text(tok, context, "what ?", answer="pineapple")
    kept = sample_from_text(tok, context, "what ?", answer="pineapple", spans=["pineapple"])  # marks as text
    assert _decoded(tok, kept) == "pineapple"


def test_whitespace_at_a_spans_ends_adds_no_token_to_the_needle(tok):
    """ " pineapple " reached into the next token; a byte-level tokenizer glues the space to it, as in " ."."""
    from zoo import byte_tokenizer

    bytes_tok = byte_tokenizer("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    marked = sample_from_text(bytes_tok, "the word is [[ pineapple ]] now", "what ?")
    plain = sample_from_text(bytes_tok, "the word is  pineapple  now", "what ?", spans=[(13, 22)])
    assert bytes_tok.decode([marked.input_ids[i] for i in marked.needle_positions]) == "pineapple"
    assert marked.needle_positions == plain.needle_positions and marked.spans == [(12, 23)]


def test_a_span_that_tokenises_away_is_refused(tok):
    with pytest.raises(DynheadsError, match="does not survive tokenisation"):
        sample_from_text(tok, "the magic word is [[Zürich]] .", "what ?")


def test_a_prompt_longer_than_the_window_is_refused(tok):
    short = PreTrainedTokenizerFast(tokenizer_object=tok.backend_tokenizer, unk_token="[UNK]", model_max_length=8)
    with pytest.raises(DynheadsError, match=r"the prompt has \d+ tokens, more than the model's context window of 8"):
        sample_from_text(short, CONTEXT, "what ?", answer="pineapple")

    class Model:  # a loaded model's window wins over its tokenizer's
        tokenizer, max_context = tok, 12

    with pytest.raises(DynheadsError, match="context window of 12"):
        sample_from_text(Model(), CONTEXT, "what ?", answer="pineapple")


def test_a_text_the_tokenizer_cannot_read_as_written_is_refused(tok, tmp_path):
    """A special token's spelling would be read as the control token (here [UNK]; a chat model's <|im_end|> would end
    the user turn); a lone surrogate (JSON's \\ud800) is no character and made the tokenizer raise a TypeError."""
    with pytest.raises(DynheadsError, match="the context holds '\\[UNK\\]', a special token of this model's tokenizer"):
        sample_from_text(tok, "the magic word is [UNK] pineapple .", "what ?", answer="pineapple")
    with pytest.raises(DynheadsError, match=r"the question holds a lone surrogate '\\ud800' at character 5"):
        sample_from_text(tok, CONTEXT, "what \ud800 ?", answer="pineapple")
    with pytest.raises(DynheadsError, match=r"the answer holds a lone surrogate"):
        sample_from_text(tok, CONTEXT, "what ?", answer="pineapple\udfff", spans=["pineapple"])
    from dynheads.models import LoadedTokenizer
    from dynheads.settings import HotpotConfig

    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({**GOOD, "context": "the magic word \ud800 is pineapple ."}) + "\n", encoding="utf-8")
    with pytest.raises(DynheadsError, match=r"line 1 \(id 'a'\): the context holds a lone surrogate"):
        custom.check_tokenised(HotpotConfig(data=str(data)), LoadedTokenizer(tok, "words", None))


def test_trace_refuses_an_empty_or_outside_needle(tok):
    sample = sample_from_text(tok, CONTEXT, "what ?", answer="pineapple")
    for needle, says in (([], "has no needle positions"), ([len(sample.input_ids)], "outside its prompt")):
        bad = dataclasses.replace(sample, needle_positions=needle)
        with pytest.raises(DynheadsError, match=says):
            trace_batch(None, [bad], 4)  # refused before the model is touched


# ---- the custom task's file -------------------------------------------------------------------------------------
def _write(tmp_path, *records) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return str(path)


GOOD = {"id": "a", "context": CONTEXT, "question": "what ?", "answer": "pineapple"}


def test_the_example_file_loads(tok):
    records = custom.load_records("docs/examples/custom.jsonl")
    assert [r.id for r in records] == ["eiffel", "curie", "baikal"]
    assert records[0].spans == ((83, 97),)  # the answer's occurrence: no spans given
    assert records[2].spans == ((0, 26), (27, 79))


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("{not json", "line 2 is not valid JSON"),
        ({"id": "b", "context": CONTEXT, "question": "q"}, r"line 2 \(id 'b'\): field 'answer' is missing"),
        ({**GOOD, "id": "b", "spans": [[3, 2]]}, r"line 2 \(id 'b'\): span 0 \[3, 2\) is empty"),
        ({**GOOD, "id": "b", "spans": [[0, 999]]}, r"span 0 \[0, 999\) is empty or outside"),
        ({**GOOD, "id": "b", "answer": "kiwi"}, "the answer 'kiwi' does not occur"),
        ({**GOOD, "id": "b", "spans": ["magic"]}, "takes \\[start, stop\\] character offsets, not text"),
        (
            {**GOOD, "id": "b", "spans": [0, 3]},
            "is a list of \\[start, stop\\] pairs, e.g. \\[\\[0, 3\\]\\], got \\[0, 3\\]",
        ),
        ({**GOOD, "context": " "}, r"line 2 \(id 'a'\): field 'context' is empty"),
        ({**GOOD, "id": "b", "answer": "A"}, r"line 2 \(id 'b'\): the answer 'A' has no word left once normalised"),
        ({**GOOD, "id": "b", "answer": "", "spans": [[4, 9]]}, "the answer '' has no word left"),
        (GOOD, "line 2: id 'a' repeats line 1"),
        ([1, 2], "line 2: a record is a JSON object"),
    ],
)
def test_a_bad_record_is_named_by_its_line(tmp_path, line, says):
    with pytest.raises(DynheadsError, match=says):
        custom.load_records(_write(tmp_path, GOOD, line))


def test_a_file_that_is_not_utf8_text_is_one_line_and_a_byte_order_mark_is_read(tmp_path, capsys, monkeypatch):
    import dynheads.runs

    monkeypatch.setattr(dynheads.runs, "load_model", _no_model)
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(GOOD).encode())  # what Windows editors save as "UTF-8"
    assert [r.id for r in custom.load_records(path)] == ["a"]
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(json.dumps({**GOOD, "context": "caf\u00e9 " + CONTEXT}, ensure_ascii=False).encode("latin-1"))
    says = f"data file {latin1} is not UTF-8 text: byte 0xe9 at byte offset"
    with pytest.raises(DynheadsError, match=re.escape(says)):
        custom.load_records(latin1)
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    out = tmp_path / "run"
    for data, message in ((latin1, says), (folder, "(a folder, not a file)")):
        result = run_main(capsys, monkeypatch, "trace", "--task", "custom", "--data", data, "--out", out)
        assert result.code == 2 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
        assert not out.exists()


def test_custom_grid_traces_each_record_as_written(tmp_path, tok):
    from dynheads.settings import HotpotConfig

    config = HotpotConfig(data=_write(tmp_path, GOOD, {**GOOD, "id": 7, "spans": [[4, 14]]}), split="mine")
    grid = get_task("custom").grid(config, tok)
    assert [s.record_id for s in grid.samples] == ["a", "7"]
    assert [s.sample_id for s in grid.samples] == ["a", "7"]  # the file's ids name the samples (not r0000)
    assert [_decoded(tok, s) for s in grid.samples] == ["pineapple", "magic word"]
    assert grid.manifest()["questions"] == {"split": "mine", "first": 0, "count": 2, "ids": ["a", "7"]}


def test_an_id_that_is_no_file_name_is_sanitised_only_in_the_file_name(tmp_path):
    from dynheads.runs import file_stem

    assert file_stem("q0000-len250-depth0.5") == "q0000-len250-depth0.5"  # every id a run wrote before
    odd = ["a/b c", "a_b_c", "..", "é"]
    stems = [file_stem(i) for i in odd]
    assert stems[1] == "a_b_c" and len(set(stems)) == 4 and all("/" not in s and s[0] != "." for s in stems)
    run = RunDir(tmp_path / "run")
    run.start("custom", {"data": "x"}, None)
    run.save_sample({"sample_id": "a/b c", "answer": "x"}, _trace(), arrays={"real": np.ones(3)})
    assert run.records()[0]["sample_id"] == "a/b c" and run.load_trace("a/b c").num_steps == 2
    stem = file_stem("a/b c")  # the arrays (scores/*.npz) are named as the record and trace, not in a folder "a"
    assert [p.name for p in (tmp_path / "run" / "scores").iterdir()] == [f"{stem}.npz"]
    assert run.arrays_path("a/b c").name == f"{stem}.npz" and np.load(run.arrays_path("a/b c"))["real"].sum() == 3
    with pytest.raises(DynheadsError, match="no trace for sample 'nope' .*its traced samples: 'a/b c'"):
        run.load_trace("nope")
    with pytest.raises(DynheadsError, match="no run folder .*nope"):
        RunDir(tmp_path / "nope").load_trace("a")


def test_a_custom_run_keeps_the_record_ids_and_compares_two_records(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """Ids ``velmora`` and ``osk`` name the run's samples, traces and view entries; the view shows the question;
    ``compare-records`` splits the heads dynamic in both, and in one only, per step."""
    from dynheads import load_model
    from dynheads.experiments.experiment import run_task
    from dynheads.settings import HotpotConfig
    from dynheads.views.record_compare import compare_records

    lines = [
        {
            "id": "velmora",
            "context": "The founder of Velmora was Ada Quill.",
            "question": "Who founded Velmora?",
            "answer": "Ada Quill",
        },
        {
            "id": "osk",
            "context": "The detector in Osk was built by Ben Roe.",
            "question": "Who built it?",
            "answer": "Ben Roe",
        },
    ]
    config = HotpotConfig(data=_write(tmp_path, *lines), max_new_tokens=4, model=str(tiny_model_dir))
    out = tmp_path / "mine"
    run_task("custom", config, out, lm=load_model(tiny_model_dir), progress=False)
    assert sorted(r["sample_id"] for r in RunDir(out).records()) == ["osk", "velmora"]
    assert RunDir(out).load_trace("velmora").num_steps == 4
    assert run_main(capsys, monkeypatch, "view", out).code == 0
    data = json.loads(
        (out / "view.html").read_text(encoding="utf-8").split('id="stepview-data">')[1].split("</script>")[0]
    )
    shown = {s["id"]: s for s in data["runs"][0]["samples"]}
    assert set(shown) == {"velmora", "osk"} and shown["velmora"]["question"] == "Who founded Velmora?"
    compared = compare_records(out, "velmora", "osk")
    assert len(compared.steps) == 4
    assert compare_records(RunDir(out), "velmora", "osk") == compared  # a RunDir goes where its path does
    for step in compared.steps:
        split = step.heads
        assert not set(split.both) & set(split.only_first) and not set(split.both) & set(split.only_second)
    printed = run_main(capsys, monkeypatch, "compare-records", out, "velmora", "osk")
    assert printed.code == 0, printed.stderr
    assert printed.stdout.startswith("velmora vs osk in ") and "only in osk:" in printed.stdout
    missing = run_main(capsys, monkeypatch, "compare-records", out, "velmora", "founder")
    assert missing.code == 2 and "no trace for sample 'founder'" in missing.stderr


def test_bad_records_exit_2_before_a_model_loads(tmp_path, capsys, monkeypatch):
    import dynheads.runs

    monkeypatch.setattr(dynheads.runs, "load_model", _no_model)
    data = _write(tmp_path, GOOD, {**GOOD, "id": "b", "spans": [[0, 0]]})
    out = tmp_path / "run"
    result = run_main(capsys, monkeypatch, "trace", "--task", "custom", "--data", data, "--out", out)
    assert result.code == 2 and result.stderr.count("\n") == 1
    assert "line 2 (id 'b'): span 0 [0, 0) is empty" in result.stderr
    assert not out.exists()  # a failed check writes nothing into --out
    no_data = run_main(capsys, monkeypatch, "trace", "--task", "custom", "--out", out)
    assert no_data.code == 2 and "pass --data FILE.jsonl" in no_data.stderr
    ablate = run_main(capsys, monkeypatch, "ablate", "--task", "custom", "--data", data, "--out", out)
    assert ablate.code == 2 and "line 2 (id 'b')" in ablate.stderr and not out.exists()
    rag = run_main(capsys, monkeypatch, "rag", "--task", "custom", "--data", data, "--out", out)
    assert rag.code == 2 and "line 2 (id 'b')" in rag.stderr and not out.exists()
    niah = run_main(capsys, monkeypatch, "rag", "--task", "niah", "--out", out)
    assert niah.code == 2 and "rag answers questions" in niah.stderr and not out.exists()


def test_rag_answers_your_records_as_written(tmp_path, tiny_model_dir):
    from dynheads import load_model
    from dynheads.experiments.rag import RagConfig, run_rag

    config = RagConfig(task="custom", data="docs/examples/custom.jsonl", strategies=("full-context", "none"))
    run = run_rag(config, tmp_path / "rag", lm=load_model(tiny_model_dir), progress=False)
    records = run.records()
    assert len(records) == 6 and {r["strategy"] for r in records} == {"full-context", "none"}
    assert {r["question_id"] for r in records} == {"eiffel", "curie", "baikal"}  # the file's ids
    assert all("f1" in r["metrics"] for r in records)


def test_what_only_the_tokenizer_can_tell_is_named_by_its_line(tmp_path, tok):
    from dynheads.models import LoadedTokenizer
    from dynheads.settings import HotpotConfig

    away = {**GOOD, "id": "z", "context": "the magic word is Zürich .", "answer": "Zürich"}
    config = HotpotConfig(data=_write(tmp_path, GOOD, away))
    with pytest.raises(DynheadsError, match=r"line 2 \(id 'z'\): .*tokenis"):
        custom.check_tokenised(config, LoadedTokenizer(tok, "words", None))
    fits = HotpotConfig(data=_write(tmp_path, GOOD), max_new_tokens=4)
    prompt = len(get_task("custom").grid(fits, tok).samples[0].input_ids)
    custom.check_tokenised(fits, LoadedTokenizer(tok, "words", prompt + 4))  # exactly the window: accepted
    with pytest.raises(DynheadsError, match=rf"line 1 \(id 'a'\): the prompt has {prompt} tokens \+ 4 new tokens"):
        custom.check_tokenised(fits, LoadedTokenizer(tok, "words", prompt + 3))


@pytest.mark.embedded  # the embedded model's tokenizer and window, read from its GGUF
def test_a_record_past_the_window_exits_2_before_a_model_loads(tmp_path, capsys, monkeypatch):
    import dynheads.runs

    monkeypatch.setattr(dynheads.runs, "load_model", _no_model)
    long = {**GOOD, "id": "long", "context": "word " * 8200 + CONTEXT}  # the embedded model's window: 8192
    out = tmp_path / "run"
    result = run_main(capsys, monkeypatch, "trace", "--task", "custom", "--data", _write(tmp_path, long), "--out", out)
    assert result.code == 2 and result.stderr.count("\n") == 1
    assert "line 1 (id 'long'): the prompt has" in result.stderr and "context window of 8192" in result.stderr
    assert not out.exists()


def _no_model(*args, **kwargs):
    raise AssertionError("a model was loaded before the input checks")


# ---- names, re-runs, models -------------------------------------------------------------------------------------
def test_a_mistyped_task_gets_a_suggestion():
    with pytest.raises(DynheadsError, match="unknown task 'custon': use one of .*; did you mean 'custom'\\?"):
        get_task("custon")


def test_a_mistyped_packaged_model_and_an_uncached_hub_id_fail_at_once(monkeypatch):
    import huggingface_hub.constants

    from dynheads.models import check_hub_id

    with pytest.raises(DynheadsError, match="did you mean 'qwen2.5-coder-0.5b'"):
        check_hub_id("qwen2.5-coder-0.5")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DynheadsError, match=r"hub id in the local Hugging Face cache \(offline.*hf download"):
        check_hub_id("nobody-here/no-such-model")


def test_an_uncached_hub_id_fails_fast_and_once_when_the_hub_does_not_answer(tmp_path, capsys, monkeypatch):
    """HF_HUB_OFFLINE unset and no hub (a closed local port stands for a machine without network): one probe,
    one line, exit 2, in well under 15 s, where transformers' retries took about a minute."""
    import time

    import huggingface_hub.constants

    from dynheads import models

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    for variable in models.PROXY_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    models.hub_unreachable.cache_clear()
    monkeypatch.setattr(models, "_load_pretrained", _no_model)
    started = time.monotonic()
    result = run_main(capsys, monkeypatch, "trace", "--model", "nobody-here/no-such-model", "--out", tmp_path / "x")
    models.hub_unreachable.cache_clear()
    assert time.monotonic() - started < 15
    assert result.code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "the hub at 127.0.0.1 is unreachable" in result.stderr and "hf download nobody-here/no-such-model" in (
        result.stderr
    )


def test_the_names_the_docs_give_the_embedded_and_packaged_models_resolve(monkeypatch):
    from dynheads import models

    assert models.resolve_source("SmolLM2-135M-Instruct").name == models.EMBEDDED_NAME
    assert models.resolve_source("smollm2-135m-instruct").gguf == models.embedded_gguf_path()
    with pytest.raises(DynheadsError, match="did you mean 'SmolLM2-135M-Instruct'"):
        models.resolve_source("SmolLM2-135M")
    monkeypatch.setattr(models, "packaged_file", lambda name: models.Path(f"/cache/{name}.gguf"))
    assert models.resolve_source("Qwen2.5-Coder-0.5B").name == models.PACKAGED_MODELS["qwen2.5-coder-0.5b"]


def test_a_refused_rerun_names_the_settings_that_differ(tmp_path):
    from dynheads.settings import HotpotConfig

    run = RunDir(tmp_path)
    run.start("custom", HotpotConfig(data="a.jsonl", max_new_tokens=8), None)
    run.start("custom", HotpotConfig(data="a.jsonl", max_new_tokens=8), None)  # the same settings resume
    with pytest.raises(DynheadsError, match='--data was "a.jsonl" there, "b.jsonl" now; --max-new-tokens was 8'):
        run.start("custom", HotpotConfig(data="b.jsonl", max_new_tokens=9), None)
    with pytest.raises(DynheadsError, match="holds a different run \\(a 'custom' run, not a 'niah' one\\)"):
        run.start("niah", HotpotConfig(), None)


# ---- reading a run ------------------------------------------------------------------------------------------------
def _trace(prompt_ids=(5, 6, 7, 8)) -> Trace:
    """Two steps of a 2-layer, 2-head model over a 4-token prompt: step 0 copies position 2 with head 1-0, step 1
    copies the first generated token (position 4) with heads 0-1 and 1-1."""
    copy = np.zeros((2, 2, 2), dtype=bool)
    copy[0, 1, 0] = copy[1, 0, 1] = copy[1, 1, 1] = True
    argmax = np.zeros((2, 2, 2), dtype=np.int32)
    argmax[0, 1, 0], argmax[1, 0, 1], argmax[1, 1, 1] = 2, 4, 4
    floats = np.zeros((2, 2, 2), dtype=np.float32)
    return Trace(
        tokens=np.array([7, 9]),
        token_texts=["seven", "nine"],
        text="seven nine",
        argmax_pos=argmax,
        scores={"copy": copy, "reasoning": floats},
        needle_mass=floats,
        max_prob=floats + 0.5,
        hidden=np.zeros((2, 3), dtype=np.float32),
        prompt_length=4,
        stop_reason="eos",
        prompt_ids=None if prompt_ids is None else np.asarray(prompt_ids),
    )


def test_looked_at_names_the_position_and_token_each_dynamic_head_attended(tmp_path, tok):
    trace = _trace()
    trace.save(tmp_path / "t.parquet")
    loaded = Trace.load(tmp_path / "t.parquet")
    assert loaded.prompt_ids.tolist() == [5, 6, 7, 8]
    first = loaded.looked_at(0, tok)
    assert [(r.head, r.position, r.token_id, r.token) for r in first] == [("1-0", 2, 7, tok.decode([7]))]
    every = loaded.looked_at()
    assert [(r.step, r.generated, r.head, r.position, r.token) for r in every[1:]] == [
        (1, "nine", "0-1", 4, "seven"),
        (1, "nine", "1-1", 4, "seven"),
    ]
    assert _trace(prompt_ids=None).looked_at(0)[0].token_id is None  # a trace written before the ids were kept
    with pytest.raises(DynheadsError, match="step 2 is outside this trace's 2 generated tokens"):
        loaded.looked_at(2)


def test_looked_at_takes_what_load_tokenizer_returns(tok):
    from dynheads.models import LoadedTokenizer

    loaded = LoadedTokenizer(tok, "word-level", None)
    assert _trace().looked_at(0, tokenizer=loaded)[0].token == tok.decode([7])
    with pytest.raises(DynheadsError, match="takes a tokenizer .*got int"):
        _trace().looked_at(0, tokenizer=3)


def test_view_writes_the_per_step_page_of_any_traced_run(tmp_path, capsys, monkeypatch):
    from dynheads.settings import HotpotConfig

    run = RunDir(tmp_path / "run")
    run.start("custom", HotpotConfig(data="a.jsonl"), None)
    record = {"sample_id": "r0000", "answer": "seven", "needle_positions": [2], "metrics": {"em": 1.0}}
    run.save_sample(record, _trace())
    result = run_main(capsys, monkeypatch, "view", run.path)
    assert result.code == 0, result.stderr
    page = (run.path / "view.html").read_text(encoding="utf-8")
    data = json.loads(page.split('id="stepview-data">')[1].split("</script>")[0])
    (shown,) = data["runs"]
    assert shown["label"] == "Your data" and shown["score"] == "copy"
    assert shown["samples"][0]["steps"][0]["h"] == [[1, 0, 2, 0.5]]
    assert shown["samples"][0]["spans"] == [[2, 3]]
    empty = run_main(capsys, monkeypatch, "view", tmp_path)
    assert empty.code == 2 and "not a dynheads run directory" in empty.stderr


def test_tasks_lists_the_custom_task(capsys, monkeypatch):
    result = run_main(capsys, monkeypatch, "tasks")
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("custom ")]
    assert "Your data: Eq. 1 copy score, your records (--data FILE), each as written; metrics recall, EM, F1" in line


def test_a_first_use_download_shows_a_progress_bar(tmp_path, monkeypatch):
    import dynheads.packaged as packaged

    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))  # an empty cache: the model's wheels must be fetched
    bars = []

    def recorded(items, **kwargs):
        bars.append(kwargs)
        return contextlib.nullcontext(items)  # used as a context manager, so the bar closes before an error

    monkeypatch.setattr(packaged, "tqdm", recorded)
    with pytest.raises(DynheadsError, match="is not in the cache"):
        packaged.packaged_file("qwen2.5-coder-0.5b", download=False)
    assert bars == [{"desc": "fetching qwen2.5-coder-0.5b (first use)", "unit": "wheel", "leave": False}]


def test_an_ablation_of_your_records_keeps_them_in_its_cells(tmp_path):
    """Records traced as written lie off the configured lengths x depths: cells.csv holds their own cells."""
    from dynheads.experiments.ablation import AblationConfig
    from dynheads.io import read_json, write_json
    from dynheads.views.ablation_tables import write_cells

    run = RunDir(tmp_path / "ablation")
    run.start("ablation", AblationConfig(task="custom", data="a.jsonl", strategies=("dynamic",)), None)
    write_json(run.manifest_path, {**read_json(run.manifest_path), "model": {"name": "a model"}})
    for strategy in ("none", "dynamic"):
        masked = [0, 0] if strategy == "none" else [2, 1]
        record = {"sample_id": f"r0000-{strategy}", "grid_sample_id": "r0000", "strategy": strategy}
        record |= {
            "context_tokens": 36,
            "depth": 0.6,
            "metrics": {"recall": 1.0, "em": 0.0, "f1": 0.5},
            "matching": "per_step",
        }
        record |= {"masked_counts": masked, "mean_masked": sum(masked) / 2, "mean_dynamic": 1.5}
        run.save_sample(record)
    cells = write_cells(run)
    assert cells[["strategy", "length", "depth", "samples"]].values.tolist() == [
        ["none", 36, 0.6, 1],
        ["dynamic", 36, 0.6, 1],
    ]


def test_the_view_of_traces_held_in_memory_is_one_call_of_the_api(tmp_path, tok):
    import dynheads

    assert {"write_view", "write_trace_view"} <= set(dynheads.__all__)
    sample = sample_from_text(tok, CONTEXT, "what is the magic word ?", answer="pineapple", sample_id="mine")
    page = dynheads.write_trace_view([_trace()], tmp_path / "view.html", [sample]).read_text(encoding="utf-8")
    data = json.loads(page.split('id="stepview-data">')[1].split("</script>")[0])
    (shown,) = data["runs"][0]["samples"]
    assert shown["id"] == "mine" and shown["question"] == "what is the magic word ?"
    assert shown["steps"][0]["h"] == [[1, 0, 2, 0.5]]
    with pytest.raises(DynheadsError, match="no traces to show"):
        dynheads.write_trace_view([], tmp_path / "empty.html")
