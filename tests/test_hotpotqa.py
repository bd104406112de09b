"""HotpotQA: the official metrics (``dynheads.tasks.qa_metrics``), loaders (every layout gives the same records),
synthetic data, and samples."""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest

from dynheads import DynheadsError
from dynheads.tasks import hotpotqa as hq
from dynheads.tasks import qa_metrics


@pytest.fixture(scope="module")
def tok(embedded_tokenizer):
    """The embedded model's tokenizer alone (conftest's ``embedded_tokenizer``)."""
    return embedded_tokenizer


@pytest.fixture(scope="module")
def records():
    return hq.synthetic_hotpotqa(8, seed=0)


@pytest.fixture(scope="module")
def pool():
    return hq.paragraph_pool(hq.synthetic_hotpotqa(60, seed=1))


# ---- metrics -------------------------------------------------------------------------------------------

METRIC_CASES = [
    # prediction, ground truth, EM, F1, precision, recall
    ("The Eiffel Tower", "eiffel tower", 1, 1, 1, 1),  # case and articles
    ("A Tale", "tale", 1, 1, 1, 1),  # lower-casing comes before dropping articles
    ("an apple, a day!", "Apple Day", 1, 1, 1, 1),  # punctuation and articles
    ("U.S.A.", "USA", 1, 1, 1, 1),  # punctuation inside a word is dropped, not split on
    ("  New \t York\n", "new york", 1, 1, 1, 1),  # whitespace collapsed
    ("theatre", "the atre", 0, 0, 0, 0),  # articles only as whole words: "the atre" -> "atre"
    ("Paris\u2014France", "Paris France", 0, 0, 0, 0),  # non-ASCII punctuation (em dash) is kept
    ("yes", "no", 0, 0, 0, 0),
    ("yes", "Yes.", 1, 1, 1, 1),
    ("yes", "yes it is", 0, 0, 0, 0),  # one side is yes/no and they differ: F1 0 despite the overlap
    ("no answer here", "noanswer", 0, 0, 0, 0),
    ("", "", 1, 0, 0, 0),  # the official script: EM 1 but F1 0 (no common token)
    ("", "Paris", 0, 0, 0, 0),
    ("the city of Paris in France", "Paris, France", 0, 4 / 7, 2 / 5, 1),  # 2 common of 5 and 2 tokens
    ("paris paris paris", "paris", 0, 1 / 2, 1 / 3, 1),  # repeated tokens count once per match
    ("Velmora River", "river of Velmora", 0, 4 / 5, 1, 2 / 3),  # order does not matter
]


@pytest.mark.parametrize(("prediction", "truth", "em", "f1", "precision", "recall"), METRIC_CASES)
def test_official_metrics(prediction, truth, em, f1, precision, recall):
    assert qa_metrics.exact_match(prediction, truth) == em
    assert qa_metrics.f1(prediction, truth) == pytest.approx({"f1": f1, "precision": precision, "recall": recall})
    assert qa_metrics.score(truth, prediction, extract=False) == pytest.approx(
        {"em": em, "f1": f1, "precision": precision, "recall": recall}
    )


def test_normalize_answer():
    assert qa_metrics.normalize_answer("  The  Quick, brown FOX's an-swer.  ") == "quick brown foxs answer"


@pytest.mark.parametrize(
    ("generation", "extracted"),
    [
        ("Velmora.\nThe founder was born there.", "Velmora."),
        ("  \n Velmora River. It flows north.", "Velmora River."),
        ("No, they are not both mining companies.", "No"),
        ("Yes. Both are.", "Yes"),
        ("Nobody knows. Really.", "Nobody knows."),
        ("1.5 million people", "1.5 million people"),
        ("", ""),
    ],
)
def test_extract_answer(generation, extracted):
    assert qa_metrics.extract_answer(generation) == extracted


def test_score_uses_the_first_sentence_unless_told_otherwise():
    generated = "Velmora.\nThe founder of Kaltor Group was born in Velmora."
    assert qa_metrics.score("Velmora", generated) == {"em": 1.0, "f1": 1.0, "precision": 1.0, "recall": 1.0}
    raw = qa_metrics.score("Velmora", generated, extract=False)
    assert raw["em"] == 0.0 and raw["recall"] == 1.0 and raw["precision"] < 0.2
    assert qa_metrics.score("no", "No, they are not.")["em"] == 1.0
    assert hq.score("Velmora", generated) == qa_metrics.score("Velmora", generated)  # the task module's own score


# ---- loaders -------------------------------------------------------------------------------------------


def _write_every_layout(folder, records):
    official = [r.to_dict("official") for r in records]
    hf = [r.to_dict("hf") for r in records]
    files = {
        "official.json": json.dumps(official, indent=1),
        "hf.json": json.dumps(hf),
        "official.jsonl": "\n".join(json.dumps(r) for r in official) + "\n",
        "hf.jsonl": "\n\n".join(json.dumps(r) for r in hf),  # blank lines are skipped
        # HF's Dataset.to_json writes JSON lines even under a .json name; here the layouts alternate too
        "mixed.json": "\n".join(json.dumps(official[i] if i % 2 else hf[i]) for i in range(len(records))),
    }
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return [folder / name for name in files]


def test_every_layout_loads_the_same_records_and_samples(tmp_path, records, tok):
    untyped = hq.HotpotRecord("x1", "Q?", "A", records[0].supporting_facts, records[0].context)  # no type/level
    expected = [*records[:3], untyped]
    loaded = [hq.load_hotpotqa(path) for path in _write_every_layout(tmp_path, expected)]
    assert all(got == expected for got in loaded)
    samples = [hq.make_sample(tok, got[-1], context_tokens=300, depth=0.5, seed=1) for got in loaded]
    assert all(sample == samples[0] for sample in samples)


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="datasets is installed")
def test_saved_dataset_folder_without_datasets_is_a_clear_error(tmp_path):
    (tmp_path / "state.json").write_text("{}")
    with pytest.raises(DynheadsError, match="needs the 'datasets' package"):
        hq.load_hotpotqa(tmp_path)


def test_saved_dataset_folder_round_trip(tmp_path, records):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([r.to_dict("hf") for r in records]).save_to_disk(str(tmp_path / "dev"))
    assert hq.load_hotpotqa(tmp_path / "dev") == records


def test_folders_that_are_not_saved_datasets(tmp_path):
    with pytest.raises(DynheadsError, match="no state.json"):
        hq.load_hotpotqa(tmp_path)
    (tmp_path / "dataset_dict.json").write_text("{}")
    (tmp_path / "validation").mkdir()
    with pytest.raises(DynheadsError, match="several splits"):
        hq.load_hotpotqa(tmp_path)


def _drop(field):
    return lambda r: r.pop(field)


def _set(field, value):
    return lambda r: r.__setitem__(field, value)


MALFORMED = [
    (_drop("question"), "field 'question' is missing"),
    (_set("answer", 42), "field 'answer' must be a str, got int"),
    (_set("context", "text"), "field 'context' must be a list"),
    (_set("context", "text"), "a custom record {id, context, question, answer}? dynheads trace --task custom"),
    (lambda r: r["context"][1].__setitem__(1, "not a list"), "field 'context' item 1 must be"),
    (lambda r: r["context"].append(copy.deepcopy(r["context"][0])), "field 'context' repeats a paragraph title"),
    (lambda r: r["supporting_facts"][0].__setitem__(1, 9), "field 'supporting_facts' item 0 points to sentence 9"),
    (lambda r: r["supporting_facts"][1].__setitem__(1, "1"), "field 'supporting_facts' item 1 must be"),
    (lambda r: r["supporting_facts"][1].__setitem__(0, "Nowhere"), "names paragraph 'Nowhere'"),
    (_drop("supporting_facts"), "field 'supporting_facts' is missing"),
    (_set("type", 3), "field 'type' must be a str"),
]


@pytest.mark.parametrize(("mutate", "message"), MALFORMED)
def test_malformed_records_name_the_record_and_field(tmp_path, records, mutate, message):
    raws = [r.to_dict("official") for r in records[:3]]
    mutate(raws[1])
    (tmp_path / "dev.json").write_text(json.dumps(raws))
    with pytest.raises(DynheadsError, match=r"record 1 \(id 'synthetic-0-00001'\) in dev\.json: ") as error:
        hq.load_hotpotqa(tmp_path / "dev.json")
    assert message in str(error.value)


def test_malformed_hf_records_and_files(tmp_path, records):
    raw = records[0].to_dict("hf")
    raw["supporting_facts"]["sent_id"].pop()
    with pytest.raises(DynheadsError, match=r"record 4 \(id 'synthetic-0-00000'\) in x: field 'supporting_facts'"):
        hq.parse_record(raw, 4, "x")
    with pytest.raises(DynheadsError, match="record 3 \\(id 7\\) in x: field '_id' must be a str, got int"):
        hq.parse_record({**records[0].to_dict(), "_id": 7}, 3, "x")
    with pytest.raises(DynheadsError, match="record 0 in x: field '_id' is missing"):
        hq.parse_record({"question": "Q"}, 0, "x")
    with pytest.raises(DynheadsError, match="record 2 in x is not a JSON object"):
        hq.parse_record(["a"], 2, "x")

    path = tmp_path / "dev.jsonl"
    path.write_text(json.dumps(records[0].to_dict()) + "\n{broken\n")
    with pytest.raises(DynheadsError, match="line 2 of .*dev.jsonl is not valid JSON"):
        hq.load_hotpotqa(path)
    path.write_text("\n".join(json.dumps(records[0].to_dict(layout)) for layout in ("official", "hf")))
    with pytest.raises(DynheadsError, match=r"record 1 \(id 'synthetic-0-00000'\) .*'id' repeats record 0"):
        hq.load_hotpotqa(path)
    path.write_text("\n \n")
    with pytest.raises(DynheadsError, match="holds no records"):
        hq.load_hotpotqa(path)
    with pytest.raises(DynheadsError, match="not found"):
        hq.load_hotpotqa(tmp_path / "missing.json")


# ---- synthetic data ------------------------------------------------------------------------------------


def test_synthetic_data_is_seeded_and_in_the_official_schema(tmp_path):
    data = hq.synthetic_hotpotqa(40, seed=5)
    assert data == hq.synthetic_hotpotqa(40, seed=5)
    assert data[:10] == hq.synthetic_hotpotqa(10, seed=5)  # generated one after the other
    assert data[0] != hq.synthetic_hotpotqa(1, seed=6)[0]
    (tmp_path / "s.json").write_text(json.dumps([r.to_dict() for r in data]))
    assert hq.load_hotpotqa(tmp_path / "s.json") == data  # passes the loader's validation
    assert {r.type for r in data} == {"bridge", "comparison"}
    assert {r.answer for r in data} >= {"yes", "no"}
    titles = [title for r in data for title, _ in r.context]
    assert len(titles) == len(set(titles)) == 40 * 10  # names unique across the set, 10 paragraphs each


def test_synthetic_supporting_facts_hold_the_bridge_and_the_answer():
    for record in hq.synthetic_hotpotqa(12, seed=2):
        facts = [record.sentence(title, index) for title, index in record.supporting_facts]
        first, second = record.gold_titles
        assert len(record.supporting_facts) == 2 and first in facts[0] and second in facts[1]
        if record.type == "bridge":
            assert second.split()[-1] in facts[0]  # the bridge entity links the first fact to the second paragraph
            assert record.answer.removesuffix(" River") in facts[1]
        elif record.answer in ("yes", "no"):
            kind = record.question.split(" both ")[1].split()[0]
            assert (kind in facts[0] and kind in facts[1]) == (record.answer == "yes")
        else:
            assert record.answer in (first, second)


# ---- samples -------------------------------------------------------------------------------------------


def test_needle_positions_cover_every_supporting_sentence(tok, records, pool):
    for record in records[:4]:
        sample = hq.make_sample(tok, record, context_tokens=700, depth=0.3, seed=0, distractors=pool)
        covered = set()
        for (title, index), (start, stop) in zip(sample.supporting_facts, sample.supporting_spans, strict=True):
            assert record.sentence(title, index).strip() in tok.decode(sample.input_ids[start:stop])
            covered |= set(range(start, stop))
        assert sample.needle_positions == sorted(covered)
        assert 600 < sample.meta["context_tokens_actual"] <= 700
        assert sample.describe()["prompt_tokens"] == len(sample.input_ids)
        assert "input_ids" not in sample.describe()


def test_a_repeated_sentence_is_found_in_its_own_paragraph(tok, pool):
    same = "Kaltor Group is a mining company."
    context = (("Kaltor Group", (same, " " + same, " It was founded in 1901.")), ("Other", (same,)))
    record = hq.HotpotRecord("dup", "What kind of company is Kaltor Group?", "mining", (("Kaltor Group", 1),), context)
    sample = hq.make_sample(tok, record, context_tokens=200, depth=0.0, seed=0, distractors=pool)
    start, stop = sample.supporting_spans[0]
    assert tok.decode(sample.input_ids[start:stop]).strip() == same
    assert tok.decode(sample.input_ids[:start]).endswith(f"Kaltor Group: {same}")  # the second one, not the first


def test_samples_are_seeded_and_depth_moves_the_gold_paragraphs(tok, records, pool):
    record = records[2]
    first = hq.make_sample(tok, record, context_tokens=800, depth=0.5, seed=3, distractors=pool)
    assert first == hq.make_sample(tok, record, context_tokens=800, depth=0.5, seed=3, distractors=pool)
    assert (
        first.meta["paragraph_titles"]
        != hq.make_sample(tok, record, context_tokens=800, depth=0.5, seed=4, distractors=pool).meta["paragraph_titles"]
    )
    by_depth = [
        hq.make_sample(tok, record, context_tokens=800, depth=d, seed=3, distractors=pool)
        for d in (0.0, 0.05, 0.5, 0.95, 1.0)
    ]
    starts = [s.needle_positions[0] for s in by_depth]
    assert starts == sorted(starts) and starts[0] < starts[2] < starts[4]
    titles = by_depth[0].meta["paragraph_titles"]
    assert titles[:2] == record.gold_titles and by_depth[-1].meta["paragraph_titles"][-2:] == record.gold_titles
    assert {frozenset(s.meta["paragraph_titles"]) for s in by_depth} == {frozenset(titles)}  # same paragraphs
    assert first.sample_id == f"{record.id}-len800-depth0.5-seed3" and first.answer == record.answer


def test_own_distractors_come_before_the_pool(tok, records, pool):
    short = hq.make_sample(tok, records[0], context_tokens=300, depth=0.5, seed=0, distractors=pool)
    assert short.meta["distractors_from_pool"] == 0
    assert set(short.meta["paragraph_titles"]) <= {title for title, _ in records[0].context}
    long = hq.make_sample(tok, records[0], context_tokens=1500, depth=0.5, seed=0, distractors=pool)
    assert set(long.meta["paragraph_titles"]) >= {title for title, _ in records[0].context}


def test_bad_sample_inputs(tok, records, pool):
    record = records[0]
    for depth in (-0.1, 1.5):
        with pytest.raises(DynheadsError, match="depth"):
            hq.make_sample(tok, record, context_tokens=500, depth=depth, seed=0)
    with pytest.raises(DynheadsError, match="too small for the gold paragraphs"):
        hq.make_sample(tok, record, context_tokens=40, depth=0.5, seed=0)
    with pytest.raises(DynheadsError, match="no supporting facts"):
        hq.make_sample(tok, hq.HotpotRecord("n", "Q?", "A", (), record.context), context_tokens=500, depth=0, seed=0)
    with pytest.raises(DynheadsError, match="pass more distractors"):
        hq.make_sample(tok, record, context_tokens=2000, depth=0.5, seed=0)
    with pytest.raises(DynheadsError, match="distractor paragraph 1 must be"):
        hq.make_sample(tok, record, context_tokens=500, depth=0.5, seed=0, distractors=[pool[0], ("T", "text")])


def test_a_record_fits_at_its_own_size_and_keeps_every_paragraph(tok, records):
    record = records[0]
    size = hq.record_size(tok, record)
    sample = hq.make_sample(tok, record, context_tokens=size, depth=0.5, seed=0)
    assert sorted(sample.meta["paragraph_titles"]) == sorted(title for title, _ in record.context)
    with pytest.raises(DynheadsError, match=f"fill {size} tokens, fewer than context_tokens={size + 1}: a length of "):
        hq.make_sample(tok, record, context_tokens=size + 1, depth=0.5, seed=0)


def test_an_all_gold_record_traces_at_its_own_size_and_as_written(tok, tmp_path):
    from dynheads.settings import HotpotConfig

    sentences = ("Velmora Works is a mining company.", " It was founded by Dorel Ban.")
    record = hq.HotpotRecord(
        "one", "Who founded Velmora Works?", "Dorel Ban", (("Velmora Works", 1),), (("Velmora Works", sentences),)
    )
    size = hq.record_size(tok, record)
    at_size = hq.make_sample(tok, record, context_tokens=size, depth=0.5, seed=0)
    written = hq.as_written(tok, record)
    assert at_size.input_ids == written.input_ids and at_size.needle_positions == written.needle_positions
    assert tok.decode([written.input_ids[i] for i in written.needle_positions]).strip() == sentences[1].strip()
    assert written.depth == 0.64 and written.meta["paragraph_titles"] == ["Velmora Works"]
    path = tmp_path / "one.json"
    path.write_text(json.dumps([record.to_dict()]), encoding="utf-8")
    grid = hq.hotpotqa_grid(HotpotConfig(data=str(path), questions=1, pad=False), tok)
    assert [s.input_ids for s in grid.samples] == [written.input_ids] and grid.skipped == []
    with pytest.raises(DynheadsError, match=f"a length of {size} or less fits .*--no-pad"):
        hq.hotpotqa_grid(HotpotConfig(data=str(path), questions=1), tok)  # padded to 250 tokens: nothing to pad with
