"""The Dynamic RAG loop on a tiny model: masking in the attention, every strategy, the resumable evaluation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dynheads.analysis.head_predictor import train_head_predictor
from dynheads.analysis.settings import HeadPredictorConfig
from dynheads.engine.decoding import decode
from dynheads.experiments.hotpotqa import HotpotConfig, hotpot_samples
from dynheads.experiments.rag import RagConfig, run_rag
from dynheads.rag import loop
from dynheads.rag.loop import Answerer, RagSettings, answer_question, answer_questions
from dynheads.rag.results import rag_table
from dynheads.rag.strategies import HeadSelector
from dynheads.rag.trigger import TriggerConfig
from dynheads.tasks.prompting import PINNED_TEMPLATE_VARIABLES


@pytest.fixture(scope="module")
def sample(tiny_lm):
    config = HotpotConfig(questions=1, lengths=(300,), depths=(0.5,))
    return hotpot_samples(config, tiny_lm.tokenizer)[0]


def test_hidden_context_gets_zero_attention_in_every_head(tiny_lm, sample):
    state = Answerer(tiny_lm, list(sample.input_ids), sample.context_span, RagSettings())
    start, stop = sample.context_span
    every = {(layer, head) for layer in range(tiny_lm.num_layers) for head in range(tiny_lm.num_heads)}
    visible = np.zeros(stop - start, dtype=bool)
    visible[10:20] = True  # one retrieved window
    step = state.read(visible, rows_for=every)
    for row in step.stats.rows.values():
        context = row[start:stop].numpy()
        assert np.abs(context[~visible]).max() == 0.0
        assert context[visible].sum() > 0
        assert abs(float(row.sum()) - 1.0) < 1e-5
    # With nothing hidden, the same heads do attend to the rest of the context.
    step = state.read(None, rows_for=every)
    assert max(float(row[start:stop][~visible].sum()) for row in step.stats.rows.values()) > 0


def _selector(strategy, lm, k=3):
    ranking = [(layer, head) for layer in range(lm.num_layers) for head in range(lm.num_heads)]
    return HeadSelector(
        strategy,
        k=k,
        num_layers=lm.num_layers,
        num_heads=lm.num_heads,
        rng=0,
        static_ranking=ranking,
        predict_top=lambda hidden, k: ranking[-k:],
    )


def test_strategies_without_heads_never_retrieve(tiny_lm, sample):
    always = RagSettings(max_new_tokens=6, draft_tokens=3, trigger=TriggerConfig(threshold=0.0))
    for strategy in ("none", "full-context"):
        answer = answer_question(tiny_lm, sample, _selector(strategy, tiny_lm), always)
        assert answer.retrievals == 0 and answer.windows == []


@pytest.mark.parametrize("strategy", ["static", "dynamic", "dynamic-random", "fixed-random"])
def test_a_trigger_retrieves_windows_inside_the_context(tiny_lm, sample, strategy):
    # θ = 0: any content word with some entropy and attention triggers retrieval.
    settings = RagSettings(max_new_tokens=8, draft_tokens=4, max_retrievals=2, trigger=TriggerConfig(threshold=0.0))
    answer = answer_question(tiny_lm, sample, _selector(strategy, tiny_lm), settings)
    start, stop = sample.context_span
    if strategy == "static":  # known to trigger on this seeded model and sample
        assert answer.retrievals >= 1
    if answer.retrievals:  # a random model may draft only punctuation, which never triggers
        assert all(start <= a < b <= stop for a, b in answer.windows)
        assert all(0 < v <= stop - start for v in answer.visible_tokens)
        assert all(len(h) == 3 for h in answer.heads)
        assert 0.0 <= answer.retrieval_recall <= 1.0
    assert answer.retrievals <= 2 and len(answer.tokens) <= 8


def test_a_batch_of_answers_equals_answering_one_by_one(tiny_lm):
    """Drafts and rewrites of several questions decode as one batch (each with its own visibility, retrievals
    and stop); every answer equals the one answered alone."""
    config = HotpotConfig(questions=4, lengths=(300,), depths=(0.5,))
    samples = hotpot_samples(config, tiny_lm.tokenizer)
    assert len(samples) == 4
    settings = RagSettings(max_new_tokens=8, draft_tokens=3, max_retrievals=2, trigger=TriggerConfig(threshold=0.0))
    strategies = ["static", "none", "full-context", "fixed-random"]
    alone = [
        answer_question(tiny_lm, sample, _selector(strategy, tiny_lm), settings)
        for sample, strategy in zip(samples, strategies, strict=True)
    ]
    together = answer_questions(tiny_lm, samples, [_selector(s, tiny_lm) for s in strategies], settings)
    assert sum(answer.retrievals for answer in alone) >= 1  # the batch mixes retrieving and plain answers
    for one, batched in zip(alone, together, strict=True):
        assert (batched.tokens, batched.windows, batched.heads, batched.visible_tokens) == (
            one.tokens,
            one.windows,
            one.heads,
            one.visible_tokens,
        )


def test_one_question_under_every_strategy_is_prefilled_once(tiny_lm, sample, monkeypatch):
    """Issue 36: the strategies of one question fork one prefill of its prompt; answered one at a time they equal
    each answered alone exactly, as one batch as the batch test above."""
    settings = RagSettings(max_new_tokens=8, draft_tokens=3, max_retrievals=2, trigger=TriggerConfig(threshold=0.0))
    strategies = ["static", "none", "full-context", "fixed-random"]
    alone = [answer_question(tiny_lm, sample, _selector(strategy, tiny_lm), settings) for strategy in strategies]
    assert sum(answer.retrievals for answer in alone) >= 1
    prefilled, real = [], loop.context_session
    monkeypatch.setattr(loop, "context_session", lambda lm, ids, *a: prefilled.append(ids) or real(lm, ids, *a))
    for rows_together in (1, None):
        prefilled.clear()
        selectors = [_selector(s, tiny_lm) for s in strategies]
        shared = answer_questions(tiny_lm, [sample] * 4, selectors, settings, rows_together=rows_together)
        assert len(prefilled) == 1
        assert [(a.tokens, a.windows, a.heads, a.visible_tokens) for a in shared] == [
            (a.tokens, a.windows, a.heads, a.visible_tokens) for a in alone
        ]


def test_answers_that_agree_share_their_drafts_and_read_passes(tiny_lm, sample, monkeypatch):
    """Issue 36: the strategies of one question draft the same tokens under the same visibility until they retrieve
    different windows; such drafts decode once, a retrieval's read pass over the same answer runs once, and every
    answer still equals the one answered alone."""
    settings = RagSettings(max_new_tokens=8, draft_tokens=3, max_retrievals=2, trigger=TriggerConfig(threshold=0.0))
    strategies = ["static", "dynamic", "dynamic-random", "fixed-random", "none"]
    rows, reads, real_decode, real_read = [], [], loop.decode, Answerer.read
    monkeypatch.setattr(loop, "decode", lambda sessions, *a: rows.append(len(sessions)) or real_decode(sessions, *a))
    monkeypatch.setattr(Answerer, "read", lambda self, *a, **k: reads.append(1) or real_read(self, *a, **k))
    alone = [answer_question(tiny_lm, sample, _selector(strategy, tiny_lm), settings) for strategy in strategies]
    drafts_alone, reads_alone = sum(rows), len(reads)
    assert reads_alone == sum(answer.retrievals for answer in alone) >= 2  # several strategies retrieve
    for rows_together in (1, None):
        rows.clear(), reads.clear()
        selectors = [_selector(s, tiny_lm) for s in strategies]
        shared = answer_questions(tiny_lm, [sample] * 5, selectors, settings, rows_together=rows_together)
        assert [(a.tokens, a.windows, a.heads, a.visible_tokens) for a in shared] == [
            (a.tokens, a.windows, a.heads, a.visible_tokens) for a in alone
        ]
        assert rows[0] == 1  # the five first drafts (context hidden, nothing answered yet) decode as one
        assert sum(rows) <= drafts_alone - 4
        assert len(reads) <= reads_alone - 1  # the first retrievals read the same answer once


def test_rag_evaluation_runs_every_strategy_and_resumes(tiny_lm, tiny_model_dir, tmp_path):
    static = tmp_path / "static.json"
    static.write_text(json.dumps([[layer, head] for layer in range(3) for head in range(4)]))
    hidden = [np.random.default_rng(i).normal(size=(5, 64)).astype(np.float32) for i in range(10)]
    targets = [(h[:, :12] > 0.5).astype(np.float32) for h in hidden]
    probe = train_head_predictor(
        list(zip(hidden, targets, strict=True)),
        HeadPredictorConfig(hidden_sizes=(8,), epochs=1),
        task="binary",
        shape=(3, 4),
        progress=False,
    )
    probe.save(tmp_path / "probe")
    # a probe folder records its training questions (dynheads predictor train writes it); these are not RAG's questions
    (tmp_path / "probe" / "questions.json").write_text(json.dumps({"train": ["other-1"], "validation": ["other-2"]}))
    config = RagConfig(
        model=str(tiny_model_dir),
        probe=str(tmp_path / "probe"),
        static=str(static),
        ks=(2, 3),
        questions=2,
        lengths=(300,),
        max_new_tokens=4,
        draft_tokens=2,
    )
    run = run_rag(config, tmp_path / "rag", lm=tiny_lm, progress=False)
    records = run.records()
    assert len(records) == 2 * (4 * 2 + 2)  # 4 head strategies x 2 ks + none + full-context, per question
    manifest = run.manifest()  # how the prompts were rendered (docs/formats.md); absent before
    assert manifest["prompt_template"] == "chat" and manifest["chat_template_kwargs"] == PINNED_TEMPLATE_VARIABLES
    table = rag_table(run)
    assert set(table["strategy"]) == {"dynamic", "static", "dynamic-random", "fixed-random", "none", "full-context"}
    blocks = (run.path / "rag.md").read_text().split("\n\n")
    assert blocks[0].count("\n") == len(table) + 1  # the table: header, rule and one line per (strategy, k)
    arms = {(r["strategy"], r["k"]) for r in records if r["retrieval_recall"] is not None}
    paired = [b for b in blocks if b.startswith("Retrieval recall paired by question")]
    assert len(paired) == (len(arms) >= 2)  # each strategy's recall against the first one's, by question
    first = records[0]
    run.record_path(first["sample_id"]).unlink()
    again = run_rag(config, tmp_path / "rag", lm=tiny_lm, progress=False)
    assert again.records() == records  # the deleted answer is recomputed identically


def test_rag_batch_size_four_and_separate_prefills_equal_batch_one(tiny_lm, tiny_model_dir, tmp_path, monkeypatch):
    """``dynheads rag --batch-size 4``: four answers decode together; the records equal batch 1's, which prefills each
    question once for all its strategies (issue 36), and those of every answer prefilled alone."""
    static = tmp_path / "static.json"
    static.write_text(json.dumps([[layer, head] for layer in range(3) for head in range(4)]))
    config = RagConfig(
        model=str(tiny_model_dir),
        static=str(static),
        strategies=("static", "none", "fixed-random"),
        ks=(2,),
        questions=3,
        lengths=(300,),
        max_new_tokens=6,
        draft_tokens=2,
        threshold=0.0,
    )
    prefilled, real = [], loop.context_session
    monkeypatch.setattr(loop, "context_session", lambda lm, ids, *a: prefilled.append(ids) or real(lm, ids, *a))
    one = run_rag(config, tmp_path / "b1", lm=tiny_lm, progress=False).records()
    assert len(prefilled) == 3  # one per question, for its three strategies
    four = run_rag(config, tmp_path / "b4", lm=tiny_lm, progress=False, batch_size=4).records()
    assert len(one) == 3 * 3 and any(r["retrievals"] for r in one)  # the batches mix retrieving answers
    assert four == one
    monkeypatch.setattr(
        loop,
        "shared_context_sessions",
        lambda lm, samples, s: [real(lm, x.input_ids, x.context_span, s) for x in samples],
    )
    assert run_rag(config, tmp_path / "per-answer", lm=tiny_lm, progress=False).records() == one


def test_the_last_drafted_token_receives_its_own_query_attention(tiny_lm, sample):
    # RIND's attention term: every drafted token, the last one included, receives attention from the drafted
    # queries up to and including the last drafted position (the last token used to get 0 and never trigger).
    state = Answerer(tiny_lm, list(sample.input_ids), sample.context_span, RagSettings())
    first = sample.context_span[1] + len(state.question)
    policy = state.draft(None, 4, sentence=False)
    decode([state.session], [policy], policy.steps)
    draft, rows = policy.tokens, policy.rows
    assert len(draft) == 4  # the seeded tiny model drafts 4 tokens here
    received = state.received_attention(rows, first, len(draft))
    assert received.shape == (tiny_lm.num_heads, 4)
    assert (received[:, -1] > 0).all()
    # Independent check: read question + full draft once; the last query's row over the drafted keys.
    last_layer = tiny_lm.num_layers - 1
    state.answer = list(draft)
    step = state.read(None, rows_for={(last_layer, h) for h in range(tiny_lm.num_heads)})
    last_row = np.stack([step.stats.rows[(last_layer, h)][first : first + 4].numpy() for h in range(tiny_lm.num_heads)])
    np.testing.assert_allclose(received[:, -1], last_row[:, -1], rtol=1e-5, atol=1e-7)
    assert (received >= last_row - 1e-7).all()  # a max over queries that include the last one


def test_the_rag_table_orders_k_as_numbers():
    class Run:  # the two things rag_table reads from a run directory
        path = "run"

        @staticmethod
        def records():
            return [
                {
                    "strategy": strategy,
                    "k": k,
                    "metrics": {"em": 0.0, "f1": 0.0},
                    "retrieval_recall": 0.0,
                    "retrievals": 1,
                    "visible_tokens": [10],
                    "context_tokens": 100,
                }
                for strategy, k in [("static", 20), ("static", 5), ("static", 10), ("none", None)]
            ]

    table = rag_table(Run())
    assert list(zip(table["strategy"], table["k"], strict=True)) == [
        ("static", 5),
        ("static", 10),
        ("static", 20),
        ("none", "-"),
    ]
