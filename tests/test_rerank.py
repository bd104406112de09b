"""Heads as a re-ranker: the span score against eager attention, constructed cases, metrics, stream refusal."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers as tf
from zoo import COMMON, FAMILIES, NoTokenizer, tiny_model

from dynheads.analysis.evidence import EvidenceSettings, Interval, mean_interval
from dynheads.analysis.ranking import qrhead_scores, ranking_metrics, top_heads
from dynheads.engine.decoding import DecodingSession
from dynheads.engine.probe import Measure, RowEdit
from dynheads.errors import DynheadsError
from dynheads.experiments.rerank import RerankConfig, run_rerank, summarise_scored
from dynheads.models import LoadedModel
from dynheads.rag.rerank import (
    RerankPrompt,
    bm25_scores,
    build_prompt,
    ranking,
    sample_prompt,
    shown_spans,
    span_scores,
)
from dynheads.scores import SpanScore, span_ranking
from dynheads.tasks.hotpotqa import synthetic_hotpotqa
from dynheads.tasks.prompting import PINNED_TEMPLATE_VARIABLES

TOL = 1e-5


def eager_attentions(model, ids: list[int]) -> list[torch.Tensor]:
    """``[H, q, kv]`` attention of every layer from transformers' own eager path."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_attentions=True)
    finally:
        model.set_attn_implementation(previous)
    return [a[0].float() for a in out.attentions]


SCORES = {
    "paragraphs": SpanScore(query=(22, 27), spans=((1, 6), (6, 13), (15, 20))),
    "per-key": SpanScore.per_key((22, 27), 24),  # one span per key (the token votes of dynheads.kv.token_votes)
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("split", [0, 14])  # one pass, or a cached prefix then the query part (as re-ranking runs)
@pytest.mark.parametrize("spans", sorted(SCORES))
def test_span_mass_equals_eager_attention_averaged_over_query_rows(family, split, spans, monkeypatch):
    model = tiny_model(family)
    lm = LoadedModel(model=model, tokenizer=NoTokenizer(), name=family, revision="random")
    torch.manual_seed(3)
    ids = torch.randint(3, 128, (30,)).tolist()
    score = SCORES[spans]
    assert score.unit == (spans == "per-key")
    if score.unit:  # a span per key never builds the [positions, spans] matrix (quadratic in a long prompt)
        monkeypatch.setattr(SpanScore, "key_weights", lambda self: pytest.fail("built the span matrix"))
    session = DecodingSession(lm, ids, max_new_tokens=1)
    if split:
        session.forward(split)
    mass = session.forward(len(ids) - split, Measure(span=score)).stats.span_mass  # [L, H, S]
    for layer, attention in enumerate(eager_attentions(model, ids)):
        rows = attention[:, 22:27]  # [H, query rows, kv]
        expected = torch.stack([rows[:, :, a:b].sum(dim=2).mean(dim=1) for a, b in score.spans], dim=-1)
        assert (mass[layer] - expected).abs().max() <= TOL, (family, layer)


def test_span_score_refuses_query_outside_the_pass():
    model = tiny_model("llama")
    lm = LoadedModel(model=model, tokenizer=NoTokenizer(), name="llama", revision="random")
    session = DecodingSession(lm, list(range(3, 33)), max_new_tokens=1)
    session.forward(25)
    with pytest.raises(DynheadsError, match="not all in this pass"):
        session.forward(5, Measure(span=SpanScore(query=(20, 27), spans=((1, 6),))))


# ---- a constructed case: one paragraph built to draw the query's attention ---------------------------------------
QUERY_TOKEN, NULL_TOKEN = 120, 5


def content_model(rope: bool = False) -> LoadedModel:
    """A tiny Llama whose keys are its queries (k_proj = q_proj): a query token attends most to keys of its own
    token. Without RoPE (inverse frequencies 0) attention depends on content alone, not on positions."""
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=128, **{**COMMON, "num_key_value_heads": 4})).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.copy_(layer.self_attn.q_proj.weight)
        if not rope:
            model.model.rotary_emb.inv_freq.zero_()
    return LoadedModel(model=model, tokenizer=NoTokenizer(), name="content", revision="random")


def id_prompt(paragraphs: list[list[int]], query: list[int], null: list[int] | None = None) -> RerankPrompt:
    """[prefix, paragraphs, query, tail] as token ids, the query rows being query and tail; the content-free twin
    has ``null`` (one null token) as its query."""
    ids, spans = [1, 2], []
    for paragraph in paragraphs:
        spans.append((len(ids), len(ids) + len(paragraph)))
        ids += paragraph + [3]
    shared, tail, null = len(ids), [4, 6], null or [NULL_TOKEN]
    real, content_free = ids + query + tail, ids + null + tail
    return RerankPrompt(real, (shared, len(real)), content_free, (shared, len(content_free)), tuple(spans))


def candidates(seed: int, count: int = 5, size: int = 8) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, 100, (count, size), generator=generator).tolist()  # never the query token


def test_the_paragraph_built_to_draw_the_query_ranks_first():
    lm = content_model()
    query = [QUERY_TOKEN] * 3
    control = span_scores(lm, id_prompt(candidates(1), query)).calibrated.sum(axis=(0, 1))
    places = [p for p in range(5) if p != ranking(control)[0]]  # each place whose paragraph was not first
    for magnet_at in places:
        paragraphs = candidates(1)
        paragraphs[magnet_at][2:5] = [QUERY_TOKEN] * 3  # the magnet: the query's own tokens
        scores = span_scores(lm, id_prompt(paragraphs, query)).calibrated.sum(axis=(0, 1))
        assert ranking(scores)[0] == magnet_at, magnet_at  # a span mapped to the wrong tokens would fail here
        rows = len(query) + 2  # the query rows: the query and the tail
        assert scores[magnet_at] > control[magnet_at] + 1.0 / rows  # a gain of 1.0 summed over the rows, per row


def test_the_content_free_query_in_both_passes_calibrates_every_score_to_zero(tiny_lm):
    lm = content_model(rope=True)
    scores = span_scores(lm, id_prompt(candidates(4), [NULL_TOKEN]))
    assert np.abs(scores.real).max() > 0 and np.abs(scores.calibrated).max() == 0
    assert np.abs(span_scores(lm, id_prompt(candidates(4), [QUERY_TOKEN, 77])).calibrated).max() > 1e-3
    prompt = build_prompt(tiny_lm.tokenizer, ["Alpha: one.", "Beta: two.", "Gamma: three."], "N/A")
    assert prompt.input_ids == prompt.null_ids and prompt.query == prompt.null_query
    assert np.abs(span_scores(tiny_lm, prompt).calibrated).max() == 0


def test_doubled_query_rows_score_the_same():
    """The span score is a mean over the query rows: rows that attend alike count once however many there are
    (a sum doubles, which is what left the content-free pass, with fewer rows, unable to calibrate the real one)."""
    lm = content_model()  # no RoPE: a row's attention depends on its token and the keys it sees
    paragraphs = candidates(5)
    prefix = id_prompt(paragraphs, []).shared
    base = id_prompt(paragraphs, [QUERY_TOKEN, 77]).input_ids
    masses = []
    for ids in (base, base + base[prefix:]):  # the query rows (query and tail) twice
        session = DecodingSession(lm, ids, max_new_tokens=1)
        session.forward(prefix)
        # every row sees the paragraphs alone
        session.probe.set_edits([RowEdit(hidden_keys=frozenset(range(prefix, len(ids))))])
        score = SpanScore((prefix, len(ids)), id_prompt(paragraphs, []).spans)
        mass = session.forward(len(ids) - prefix, Measure(span=score)).stats.span_mass
        assert mass is not None
        masses.append(mass.numpy().copy())
    assert masses[0].max() > 0.05 and np.abs(masses[1] - masses[0]).max() < 1e-5


def test_shuffling_moves_layer0_scores_with_their_paragraphs_and_only_positions_change_the_rest():
    paragraphs, query = candidates(2), [QUERY_TOKEN, 77, 78]
    paragraphs[1][0] = QUERY_TOKEN
    permutation = [3, 0, 4, 1, 2]
    shuffled = [paragraphs[i] for i in permutation]
    for rope in (False, True):
        lm = content_model(rope=rope)
        before = span_scores(lm, id_prompt(paragraphs, query)).calibrated
        after = span_scores(lm, id_prompt(shuffled, query)).calibrated
        moved = before[:, :, permutation]  # each paragraph's scores, in the shuffled order
        layer0 = np.abs(after[0] - moved[0]).max()
        if not rope:  # content-only attention: layer 0's keys depend on their token alone, so the scores move
            assert layer0 < 1e-5  # with their paragraphs exactly
        else:  # RoPE: the same keys at other positions score differently (a position effect, measured on the page)
            assert layer0 > 1e-4
    # BM25 reads text only: its scores move with their paragraphs exactly.
    texts = ["The cat sat on the mat.", "Dogs bark at night.", "A mat of woven grass.", "Cats chase mice."]
    question = "Where did the cat sit?"
    forward, _ = bm25_scores(texts, question)
    backward, _ = bm25_scores(texts[::-1], question)
    assert np.array_equal(forward, backward[::-1]) and forward.max() > 0


# ---- metrics --------------------------------------------------------------------------------------------------------
def test_metrics_of_a_hand_made_ranking():
    ranking_ = [4, 0, 7, 2, 9, 1, 3, 5, 6, 8]  # gold 0 at rank 2, gold 9 at rank 5
    metrics = ranking_metrics(ranking_, [9, 0])
    assert metrics["recall@2"] == 0.5 and metrics["recall@5"] == 1.0 and metrics["mrr"] == 0.5
    ideal = 1 + 1 / np.log2(3)
    assert metrics["ndcg@10"] == pytest.approx((1 / np.log2(3) + 1 / np.log2(6)) / ideal)
    assert ranking_metrics([1, 0, 2], [1, 0]) == {"recall@2": 1.0, "recall@5": 1.0, "mrr": 1.0, "ndcg@10": 1.0}
    with pytest.raises(DynheadsError):
        ranking_metrics([0, 1, 1], [0])


def test_paired_interval_and_qrhead_choice():
    assert mean_interval(np.full(10, 0.5), EvidenceSettings()) == Interval(0.5, 0.5, 0.5, 10)
    half = mean_interval(np.r_[np.zeros(50), np.ones(50)], EvidenceSettings(resamples=500))
    assert half.effect == 0.5 and 0.35 < half.low < 0.5 < half.high < 0.65
    scores = np.zeros((2, 3, 4))
    scores[1, 2, [0, 3]] = 1.0  # head (1, 2) attends to candidates 0 and 3
    scores[0, 1, 1] = 5.0  # head (0, 1) attends hard to candidate 1, never gold
    qr = qrhead_scores([scores, scores], [[0, 3], [3]])
    assert top_heads(qr, 1) == [(1, 2)] and qr[1, 2] == pytest.approx(1.5) and qr[0, 1] == 0
    assert list(span_ranking(scores, [(1, 2)])) == [1, 0, 0, 1]


# ---- streams and the run ------------------------------------------------------------------------------------------
def test_overlapping_streams_are_refused_before_any_work(tmp_path):
    with pytest.raises(DynheadsError, match="overlaps the evaluation stream"):
        RerankConfig(first=10, questions=5, fit_first=12, fit_questions=5).check()
    RerankConfig(first=10, questions=5, fit_first=15, fit_questions=5).check()  # adjacent is fine
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dynheads",
            "rerank",
            "--first",
            "0",
            "--questions",
            "3",
            "--fit-first",
            "2",
            "--fit-questions",
            "4",
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")][0].count("overlaps") == 1
    assert not (tmp_path / "r").exists()


def test_run_writes_every_strategy_and_resumes(tiny_lm, tmp_path):
    data = tmp_path / "hotpot.json"
    data.write_text(json.dumps([r.to_dict() for r in synthetic_hotpotqa(5, seed=0)]))
    config = RerankConfig(data=str(data), first=3, questions=2, fit_first=0, fit_questions=3, k=4, bootstrap=50)
    run = run_rerank(config, tmp_path / "run", lm=tiny_lm, progress=False)
    manifest = run.manifest()
    assert manifest["questions"]["first"] == 3 and manifest["fit_questions"]["count"] == 3
    assert not set(manifest["questions"]["ids"]) & set(manifest["fit_questions"]["ids"])
    assert manifest["prompt_template"] == "chat"  # how the prompts were rendered (docs/formats.md); absent before
    assert manifest["chat_template_kwargs"] == PINNED_TEMPLATE_VARIABLES
    skipped = json.loads((run.path / "summary.json").read_text())["documents"]["rerank.md"]["numbers"]["skipped"]
    assert set(skipped) == {"static", "predictor"}  # no --static, no --probe: left out and said so
    rows = __import__("pandas").read_csv(run.path / "rankings.csv")
    assert set(rows["strategy"]) == {"icr", "icr-uncalibrated", "qrhead", "random", "bm25"} and len(rows) == 10
    assert (rows.loc[rows["strategy"] == "qrhead", "heads"] == 4).all()
    markdown = (run.path / "rerank.md").read_text()
    assert "Paired differences vs bm25" in markdown and "top-1 icr" in markdown
    assert "Holm's family-wise adjustment" in markdown and "; Holm [" in markdown  # adjusted beside unadjusted
    first = {r["sample_id"]: r["order"] for r in run.records()}
    again = run_rerank(config, tmp_path / "run", lm=tiny_lm, progress=False)  # resumes: nothing rescored
    assert {r["sample_id"]: r["order"] for r in again.records()} == first
    for record in run.records():  # the shuffle is recorded: a permutation of the record's paragraphs
        assert sorted(record["order"]) == list(range(len(record["titles"])))
    # Other ranking settings summarise the same scores again, loading no model; other scoring settings are refused.
    summarise_scored(dataclasses.replace(config, k=2, strategies=("qrhead", "bm25")), run.path)
    rows = __import__("pandas").read_csv(run.path / "rankings.csv")
    assert set(rows["strategy"]) == {"qrhead", "bm25"} and (rows.loc[rows["strategy"] == "qrhead", "heads"] == 2).all()
    with pytest.raises(DynheadsError, match="not a rerank run scored with these settings"):
        summarise_scored(dataclasses.replace(config, seed=1), run.path)
    heads = tiny_lm.num_layers * tiny_lm.num_heads
    with pytest.raises(DynheadsError, match=f"k={heads + 1} heads asked, but the model has {heads} heads"):
        summarise_scored(dataclasses.replace(config, k=heads + 1), run.path)
    with pytest.raises(DynheadsError, match=f"k={heads + 1} heads asked"):  # before any question is scored
        run_rerank(dataclasses.replace(config, k=heads + 1), tmp_path / "too-many", lm=tiny_lm, progress=False)
    assert not (tmp_path / "too-many").exists()
    summary = json.loads((run.path / "summary.json").read_text())["documents"]["rerank.md"]["numbers"]
    assert summary["fit_questions"] == 3 and len(summary["qrhead_heads"]) == 2
    # Fusions with BM25 rank the same stored scores; mix's weight is fitted on the fitting stream only.
    fused = ("icr", "bm25", "rrf:icr", "mix:icr", "mix:qrhead")
    summarise_scored(dataclasses.replace(config, strategies=fused), run.path)
    rows = __import__("pandas").read_csv(run.path / "rankings.csv")
    assert set(rows["strategy"]) == set(fused) and len(rows) == 2 * len(fused)
    weights = json.loads((run.path / "fusion_weights.json").read_text())
    assert set(weights["weights"]) == {"mix:icr", "mix:qrhead"} and weights["fit_questions"] == 3
    assert all(0 <= w <= 1 for w in weights["weights"].values()) and len(weights["grid"]["mix:icr"]) == 21
    assert "Fusions with BM25 by question type" in (run.path / "rerank.md").read_text()
    summarise_scored(dataclasses.replace(config, strategies=("icr", "bm25")), run.path)  # neither fitted now:
    assert not (run.path / "qrhead_heads.json").exists() and not (run.path / "fusion_weights.json").exists()
    summarise_scored(dataclasses.replace(config, strategies=fused), run.path)
    # QRHead is fitted on its whole fitting stream or not at all: with a fitting question unscored it is skipped.
    next(p for p in (run.path / "samples").glob("fit-*.json")).unlink()
    summarise_scored(config, run.path)
    summary = json.loads((run.path / "summary.json").read_text())["documents"]["rerank.md"]["numbers"]
    assert "2 of its 3 scored" in summary["skipped"]["qrhead"] and summary["fit_questions"] == 0
    summarise_scored(dataclasses.replace(config, strategies=fused), run.path)
    summary = json.loads((run.path / "summary.json").read_text())["documents"]["rerank.md"]["numbers"]
    assert "2 of 3 scored" in summary["skipped"]["mix:icr"] and "rrf:icr" in summary["metrics"]
    assert "qrhead" not in set(__import__("pandas").read_csv(run.path / "rankings.csv")["strategy"])
    # Scores stored under another query-row rule (the earlier sum over the question's rows) are refused.
    manifest_path = run.path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["prompt"]["query_rows"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DynheadsError, match="other query rows"):
        summarise_scored(config, run.path)


def test_a_static_list_fitted_on_evaluated_questions_is_refused(tiny_lm, tmp_path):
    data = tmp_path / "hotpot.json"
    records = synthetic_hotpotqa(4, seed=0)
    data.write_text(json.dumps([r.to_dict() for r in records]))
    static = tmp_path / "static" / "heads.json"
    static.parent.mkdir()
    static.write_text(json.dumps(["0-1", "1-2"]))
    (static.parent / "manifest.json").write_text(json.dumps({"questions": {"ids": [records[3].id]}}))
    config = RerankConfig(  # k = 4 of the tiny model's 12 heads (the default 16 is refused: more than it has)
        data=str(data), first=2, questions=2, fit_first=0, fit_questions=2, static=str(static), k=4
    )
    with pytest.raises(DynheadsError, match="fitted on 1 of the questions"):
        run_rerank(config, tmp_path / "run", lm=tiny_lm, progress=False)


def test_prompt_spans_hold_their_paragraphs(tiny_lm):
    tokenizer = tiny_lm.tokenizer
    paragraphs = ["Alpha: The first one.", "Beta: The second one.", "Gamma: The third one."]
    prompt = build_prompt(tokenizer, paragraphs, "Which one is second?")
    for (start, stop), text in zip(prompt.spans, paragraphs, strict=True):
        assert tokenizer.decode(prompt.input_ids[start:stop]).strip() == text
    rows = tokenizer.decode(prompt.input_ids[slice(*prompt.query)])  # ICR's and QRHead's query rows
    null_rows = tokenizer.decode(prompt.null_ids[slice(*prompt.null_query)])
    assert rows.startswith("Please find information") and "Query: Which one is second?" in rows
    assert null_rows == rows.replace("Which one is second?", "N/A")  # the same rows, the query swapped
    assert prompt.query[1] == len(prompt.input_ids) and prompt.null_query[1] == len(prompt.null_ids)
    assert prompt.input_ids[: prompt.shared] == prompt.null_ids[: prompt.shared] and prompt.shared == prompt.query[0]
    assert tokenizer.decode(prompt.input_ids[prompt.spans[-1][1] : prompt.shared]).strip() == ""


# ---- re-rank then answer in dynheads rag -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rag_sample(tiny_lm):
    from dynheads.experiments.hotpotqa import HotpotConfig, hotpot_samples

    return hotpot_samples(HotpotConfig(questions=1, lengths=(300,), depths=(0.5,)), tiny_lm.tokenizer)[0]


def test_a_rag_samples_paragraphs_are_found_in_its_own_prompt(tiny_lm, rag_sample):
    decode = tiny_lm.tokenizer.decode
    prompt = sample_prompt(tiny_lm.tokenizer, rag_sample)
    assert prompt.input_ids == list(rag_sample.input_ids)
    titles = rag_sample.meta["paragraph_titles"]
    assert len(prompt.spans) == len(titles) > 1
    assert (prompt.spans[0][0], prompt.spans[-1][1]) == tuple(rag_sample.context_span)
    texts = [decode(prompt.input_ids[start:stop]).strip() for start, stop in prompt.spans]
    assert all(text.startswith(f"{title}: ") for text, title in zip(texts, titles, strict=True))
    assert "\n\n".join(texts) == decode(prompt.input_ids[slice(*rag_sample.context_span)]).strip()  # nothing lost
    rows = tiny_lm.tokenizer.decode(prompt.input_ids[slice(*prompt.query)])
    assert rows.lstrip().startswith("Question:") and rag_sample.question in rows
    assert prompt.query[1] == len(prompt.input_ids)


def test_rerank_then_answer_shows_only_the_given_windows(tiny_lm, rag_sample):
    from dynheads.rag.loop import RagSettings, answer_question
    from dynheads.rag.strategies import HeadSelector

    settings = RagSettings(max_new_tokens=5, draft_tokens=3)
    shape = {"k": 1, "num_layers": tiny_lm.num_layers, "num_heads": tiny_lm.num_heads}
    full = answer_question(tiny_lm, rag_sample, HeadSelector("full-context", **shape), settings)
    everything = answer_question(
        tiny_lm, rag_sample, HeadSelector("rerank", **shape), settings, shown=[tuple(rag_sample.context_span)]
    )
    assert everything.tokens == full.tokens and everything.retrievals == 0  # all shown = full context
    with pytest.raises(DynheadsError, match="outside the context"):
        answer_question(tiny_lm, rag_sample, HeadSelector("rerank", **shape), settings, shown=[(0, 5)])
    with pytest.raises(DynheadsError, match="only it"):
        answer_question(tiny_lm, rag_sample, HeadSelector("rerank", **shape), settings)


def test_rerank_shows_its_top_paragraphs_or_exactly_a_token_budget():
    spans, order = [(10, 20), (20, 35), (40, 50)], [2, 0, 1]
    assert shown_spans(spans, order, 2) == [(40, 50), (10, 20)]
    assert shown_spans(spans, order, 2, tokens=15) == [(40, 50), (10, 15)]  # rank order, the last one cut
    assert shown_spans(spans, order, 1, tokens=100) == [(40, 50), (10, 20), (20, 35)]  # a budget past every one
    with pytest.raises(DynheadsError):
        shown_spans(spans, order, 2, tokens=0)


def test_recall_blocks_pair_strategies_by_question():
    from dynheads.views.rag_tables import recall_blocks

    def record(question, strategy, k, recall):
        return {"question_id": question, "strategy": strategy, "k": k, "retrieval_recall": recall}

    records = [record(q, "dynamic", 5, r) for q, r in zip("abcd", (1.0, 0.5, 0.0, 1.0), strict=True)]
    records += [record(q, "rerank", None, r) for q, r in zip("abcd", (0.5, 0.5, 0.5, 0.0), strict=True)]
    records += [record("e", "rerank", None, 1.0), record("a", "none", None, None)]  # unpaired; no recall
    text, table = recall_blocks(records)
    assert "against dynamic k=5" in text
    (row,) = table.rows
    assert row[:4] == ["rerank", 4, 0.625, 0.375] and row[5:] == [1, 2]  # more gold shown on c, less on a and d
    assert row[4].startswith("-0.250 [") and row[4].endswith("(n=4)")
    same = recall_blocks([record(q, s, 5, 1.0) for q in "ab" for s in ("dynamic", "static")])
    assert same[1].rows[0][4] == "0.000 [-0.842, 0.842] (n=2)"  # identical: the exact interval, not a bootstrap
    one = recall_blocks([record("a", "dynamic", 5, 1.0), record("a", "static", 5, 1.0)])
    assert one[1].rows[0][4] == "undefined (n=1)"  # one question: no interval at all
    assert recall_blocks([record("a", "none", None, None)]) == []


def test_recall_blocks_pair_against_the_first_strategy_and_k_asked_for():
    """The base is the first of --strategies at the first of --k, not the record id that sorts first ('k10' < 'k5')."""
    from dynheads.views.rag_tables import recall_blocks

    def record(question, strategy, k, recall):
        return {"question_id": question, "strategy": strategy, "k": k, "retrieval_recall": recall}

    recalls = {("static", 10): 0.25, ("dynamic", 10): 0.5, ("dynamic", 5): 1.0, ("static", 5): 0.0}
    records = [record(q, s, k, r) for (s, k), r in recalls.items() for q in "ab"]  # as a run lists them: by id
    text, table = recall_blocks(records, order=(("dynamic", "static"), (5, 10)))
    assert "against dynamic k=5" in text
    assert [row[0] for row in table.rows] == ["dynamic k=10", "static k=5", "static k=10"]
    assert [row[2] for row in table.rows] == [1.0, 1.0, 1.0]  # the base's recall in every row


def test_rag_run_with_the_rerank_strategy(tiny_model_dir, tiny_lm, tmp_path):
    from dynheads.experiments.rag import RagConfig, run_rag

    config = RagConfig(
        model=str(tiny_model_dir),
        questions=2,
        lengths=(300,),
        strategies=("rerank", "full-context"),
        max_new_tokens=3,
        rerank_top=2,
    )
    run = run_rag(config, tmp_path / "rag", lm=tiny_lm, progress=False)
    reranked = [r for r in run.records() if r["strategy"] == "rerank"]
    assert len(reranked) == 2
    for record in reranked:
        assert len(record["shown"]) == 2 and record["windows"] == record["shown"] and record["retrievals"] == 0
        assert sorted(record["ranking"]) == sorted(set(record["ranking"])) and 0 <= record["gold_shown"] <= 1
        assert record["retrieval_recall"] is not None
    assert "rerank" in (run.path / "rag.md").read_text()
    budget = dataclasses.replace(config, rerank_tokens=20)  # as many tokens as a windowed strategy shows
    run = run_rag(budget, tmp_path / "rag-budget", lm=tiny_lm, progress=False)
    budgeted = [r for r in run.records() if r["strategy"] == "rerank"]
    assert len(budgeted) == 2
    for record in budgeted:
        assert sum(stop - start for start, stop in record["shown"]) == 20 and record["visible_tokens"] == [20]


def test_a_strategy_registered_in_a_test_file_is_ranked_fused_and_summarised(tiny_lm, tmp_path):
    """Issue 35: a re-rank strategy is one registry entry; the run ranks it, fuses it with BM25 and reports it
    like the built-in ones, from the same stored scores."""
    from dynheads.rag.rerank_strategies import RERANK_STRATEGIES, RerankStrategy

    def last_layer(question):
        layers, heads = question.arrays["real"].shape[:2]
        return question.head_scores([(layers - 1, head) for head in range(heads)])

    RERANK_STRATEGIES.register("last-layer", RerankStrategy(last_layer), help="the last layer's heads, calibrated")
    try:
        data = tmp_path / "hotpot.json"
        data.write_text(json.dumps([r.to_dict() for r in synthetic_hotpotqa(4, seed=1)]))
        strategies = ("icr", "last-layer", "rrf:last-layer", "bm25")
        config = RerankConfig(data=str(data), first=2, questions=2, fit_first=0, fit_questions=2, bootstrap=20)
        run = run_rerank(
            dataclasses.replace(config, strategies=strategies), tmp_path / "run", lm=tiny_lm, progress=False
        )
        rows = __import__("pandas").read_csv(run.path / "rankings.csv")
        assert set(rows["strategy"]) == set(strategies)
        assert (rows.loc[rows["strategy"] == "last-layer", "heads"] == tiny_lm.num_heads).all()
        summary = (run.path / "rerank.md").read_text()
        assert "| last-layer |" in summary
        assert "QRHead not asked for, so no heads fitted on the 2 fitting questions" in summary  # not "on 0 of 2"
        with pytest.raises(DynheadsError, match="unknown rerank strategy first-layer"):
            dataclasses.replace(config, strategies=("first-layer",)).check()
    finally:
        RERANK_STRATEGIES.unregister("last-layer")
