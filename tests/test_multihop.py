"""The multihop key-value task: exact spans, seeding, distractors, the grid, errors, and the runner dispatch."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dynheads import DynheadsError
from dynheads.experiments.hotpotqa import HotpotConfig, hotpot_samples
from dynheads.tasks import candidates, hotpotqa, multihop
from dynheads.tasks.grid import QuestionGrid

FACT = re.compile(r"The (?:code of the \w+ is the \w+|magic word for the \w+ is \w+)\.")


@pytest.mark.parametrize("hops", [1, 2])
@pytest.mark.parametrize("value", multihop.VALUE_FORMATS)
def test_supporting_spans_decode_to_exactly_the_facts(embedded, hops, value):
    tok = embedded.tokenizer
    form = multihop.MultihopForm(hops=hops, value=value)
    sample = multihop.make_sample(tok, context_tokens=700, depth=0.5, seed=5, form=form)
    assert len(sample.supporting_spans) == hops == len(sample.supporting_facts)
    for (start, stop), (fact, _) in zip(sample.supporting_spans, sample.supporting_facts, strict=True):
        assert tok.decode(sample.input_ids[start:stop]).strip() == fact
    union = sorted({i for start, stop in sample.supporting_spans for i in range(start, stop)})
    assert sample.needle_positions == union
    assert sample.supporting_facts[-1][0].endswith(f" is {sample.answer}.")
    start, stop = sample.context_span
    context = tok.decode(sample.input_ids[start:stop])
    assert all(fact in context for fact, _ in sample.supporting_facts)
    assert sample.question not in context and sample.answer not in sample.question
    assert abs(sample.meta["context_tokens_actual"] - 700) <= 8


def test_two_hop_chain_links_key_bridge_and_value(embedded):
    form = multihop.MultihopForm(hops=2)
    sample = multihop.make_sample(embedded.tokenizer, context_tokens=600, depth=0.2, seed=9, form=form)
    (hop1, first), (hop2, second) = sample.supporting_facts
    key, bridge = re.fullmatch(r"The code of the (\w+) is the (\w+)\.", hop1).groups()
    assert (first, second) == (1, 2)
    assert hop2 == f"The magic word for the {bridge} is {sample.answer}."
    assert sample.question == f"What is the magic word for the code of the {key}?"
    assert bridge not in sample.question and sample.type == "two-hop"


def test_distractors_are_present_and_of_the_same_form(embedded):
    tok = embedded.tokenizer
    form = multihop.MultihopForm(distractors=7)
    sample = multihop.make_sample(tok, context_tokens=900, depth=0.5, seed=2, form=form)
    distractors = sample.meta["distractor_facts"]
    assert len(distractors) == 7
    assert sum(d.startswith("The code of") for d in distractors) == 4  # both forms, as the supporting facts
    context = tok.decode(sample.input_ids[slice(*sample.context_span)])
    facts = FACT.findall(context)
    assert sorted(facts) == sorted(distractors + [f for f, _ in sample.supporting_facts])
    assert all(sample.answer not in d for d in distractors)
    assert sum(sample.answer in f for f in facts) == 1  # the value occurs once: it cannot be copied by mistake


def test_samples_are_seeded_and_depth_moves_the_facts(embedded):
    tok = embedded.tokenizer
    first = multihop.make_sample(tok, context_tokens=600, depth=0.5, seed=3)
    assert first == multihop.make_sample(tok, context_tokens=600, depth=0.5, seed=3)
    assert multihop.make_sample(tok, context_tokens=600, depth=0.5, seed=4).answer != first.answer
    by_depth = multihop.MultihopForm(placement="depth")  # the uniform placement (default) ignores depth
    spans = [
        multihop.make_sample(tok, context_tokens=900, depth=d, seed=3, form=by_depth).supporting_spans
        for d in (0.0, 0.5, 1.0)
    ]
    starts = [min(s for s, _ in facts) for facts in spans]
    assert starts[0] < starts[1] < starts[2]


def test_grid_and_runner_dispatch(embedded):
    tok = embedded.tokenizer
    config = HotpotConfig(
        data="multihop:hops=1,distractors=4,value=word", questions=5, lengths=(300, 500), depths=(0.1, 0.9)
    )
    samples = hotpot_samples(config, tok)
    cells = [(s.context_tokens, s.depth) for s in samples]
    assert cells == [(300, 0.1), (300, 0.9), (500, 0.1), (500, 0.9), (300, 0.1)]
    assert all(isinstance(s, multihop.MultihopSample) and s.type == "one-hop" for s in samples)
    assert len({s.answer for s in samples}) == 5
    assert samples == hotpot_samples(config, tok)
    assert set(hotpotqa.HotpotSample.__dataclass_fields__) <= set(multihop.MultihopSample.__dataclass_fields__)
    assert "prompt_tokens" in samples[0].describe() and "input_ids" not in samples[0].describe()


def test_score_is_official_em_f1_plus_containment():
    assert multihop.score("482913", "482913.")["em"] == 1.0
    assert multihop.score("482913", "The magic word for the code of the tiger is 482913.")["em"] == 1.0
    assert multihop.score("482913", 'The magic word for the lamp is "482913".')["em"] == 1.0
    wordy = multihop.score("482913", "I think it is 482913.")
    assert wordy["em"] == 0.0 and wordy["accuracy"] == 1.0 and 0 < wordy["f1"] < 1
    assert multihop.score("482913", "The magic word for the lamp is 129724.")["em"] == 0.0
    assert multihop.score("482913", "48291")["accuracy"] == 0.0


@pytest.mark.parametrize(
    "data, message",
    [
        ("multihop:hops=3", "hops must be 1 or 2"),
        ("multihop:value=uuid", "value must be one of"),
        ("multihop:distractors=-1", "distractors must be >= 0"),
        ("multihop:depth=1", "bad multihop option"),
        ("multihop:hops=two", "needs an int"),
        ("multihop:spread=2", "spread must be between 0 and 1"),
    ],
)
def test_bad_forms_are_refused(data, message):
    with pytest.raises(DynheadsError, match=message):
        multihop.parse_source(data)


def test_bad_input_is_refused(embedded):
    tok = embedded.tokenizer
    with pytest.raises(DynheadsError, match="too short for"):
        multihop.make_sample(tok, context_tokens=40, depth=0.5, seed=0)
    with pytest.raises(DynheadsError, match="depth must be between"):
        multihop.make_sample(tok, context_tokens=600, depth=1.5, seed=0)
    with pytest.raises(DynheadsError, match="grid is empty"):
        multihop.grid_samples(tok, QuestionGrid((600,), (0.5,), seed=0, questions=0))
    config = HotpotConfig(data="multihop", lengths=(), questions=3)
    with pytest.raises(DynheadsError, match="the multihop grid is empty"):
        multihop.multihop_grid(config, tok)
    assert multihop.parse_source("multihop") == multihop.MultihopForm()
    assert not multihop.is_source("multihop.json") and not multihop.is_source(None)


def test_a_fact_lost_in_tokenisation_is_refused(tmp_path):
    # A word-level tokenizer that knows the haystack and template words but not the invented names: [UNK].
    words = "The code of magic word for is . the cat sat".split()  # no keys, no values
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    (tmp_path / "a.txt").write_text("the cat sat . " * 200)
    with pytest.raises(DynheadsError, match="does not survive tokenisation"):
        multihop.make_sample(tok, context_tokens=300, depth=0.5, seed=0, haystack=str(tmp_path))


def test_hotpotqa_side_runners_take_multihop_questions(tiny_model_dir, tmp_path):
    # Plumbing on a tiny random model: tracing (Eq. 2), the ablation grid and RAG read data="multihop" unchanged.
    from dynheads.experiments.ablation import AblationConfig, run_ablation
    from dynheads.experiments.hotpotqa import HotpotConfig, run_hotpotqa
    from dynheads.experiments.rag import RagConfig, run_rag
    from dynheads.models import load_model

    lm = load_model(tiny_model_dir)
    data = "multihop:hops=2,distractors=2"
    run = run_hotpotqa(
        HotpotConfig(data=data, questions=2, lengths=(300,), depths=(0.5,), max_new_tokens=2),
        tmp_path / "trace",
        lm=lm,
        progress=False,
    )
    records = run.records()
    assert [r["type"] for r in records] == ["two-hop", "two-hop"]
    assert {"em", "f1", "accuracy"} <= set(records[0]["metrics"]) and records[0]["needle_positions"]
    assert run.manifest()["prompt"]["data"] == data
    grid = AblationConfig(
        task="hotpotqa",
        data=data,
        questions=1,
        lengths=(300,),
        depths=(0.5,),
        max_new_tokens=2,
        strategies=("random",),
        model=str(tiny_model_dir),
    )
    ablated = run_ablation(grid, tmp_path / "ablation", lm=lm, progress=False).records()
    # per-step matching (the default) needs no dynamic run: each control step counts its own clean pass's D_t
    assert {r["strategy"] for r in ablated} == {"none", "random"}
    assert all("accuracy" in r["metrics"] for r in ablated)
    rag = RagConfig(
        data=data,
        questions=1,
        lengths=(300,),
        strategies=("none", "full-context", "fixed-random"),
        ks=(2,),
        max_new_tokens=2,
        draft_tokens=2,
    )
    answers = run_rag(rag, tmp_path / "rag", lm=lm, progress=False).records()
    assert sorted(r["strategy"] for r in answers) == ["fixed-random", "full-context", "none"]
    assert all(r["type"] == "two-hop" and "accuracy" in r["metrics"] for r in answers)


def test_embedded_model_answers_with_the_full_context(embedded):
    # docs/multihop.md calibration: the default form is answered reliably at 1000 tokens.
    from dynheads import trace

    grid = QuestionGrid(lengths=(1000,), depths=(0.1, 0.5, 0.9), seed=0, questions=3)
    samples = multihop.grid_samples(embedded.tokenizer, grid)
    results = [trace(embedded, sample, max_new_tokens=24) for sample in samples]
    scores = [multihop.score(s.answer, r.text) for s, r in zip(samples, results, strict=True)]
    assert sum(score["em"] for score in scores) >= 2, [r.text for r in results]
    assert all(r.reasoning_scores.shape == (r.num_steps, 30, 9) for r in results)


def test_candidates_fact_order_and_realised_depths_are_recorded(embedded):
    tok = embedded.tokenizer
    sample = multihop.make_sample(tok, context_tokens=700, depth=0.5, seed=3, form=multihop.MultihopForm(distractors=4))
    context = tok.decode(sample.input_ids[slice(*sample.context_span)])
    values = re.findall(r"The magic word for the \w+ is (\w+)\.", context)
    # every value fact's value, in context order: the gold one and two distractors of the same form
    assert sample.meta["candidates"] == values and len(values) == 3
    assert values[sample.meta["gold_rank"]] == sample.answer
    assert 0 <= sample.meta["depth_realised"] <= 1 and len(sample.meta["fact_depths"]) == 1
    other = next(v for v in values if v != sample.answer)
    assert multihop.score(sample.answer, f"The magic word for the x is {other}.", values)["distractor"] == 1.0
    assert multihop.score(sample.answer, f"{sample.answer}", values)["distractor"] == 0.0


def test_multihop_gold_position_spreads_and_fact_order_is_balanced(embedded):
    """Issue 32 item 5 for the multihop task: the gold value fact in every third of the context over 300 questions
    (20-47 % each), the gold rank among the value facts cycling; the former placement (depth) is still an option."""
    form = multihop.MultihopForm(distractors=4)  # three value facts: the gold one and two distractors
    grid = QuestionGrid(lengths=(300,), depths=(0.05, 0.5, 0.95), seed=0, questions=300)
    samples = multihop.grid_samples(embedded.tokenizer, grid, form=form)
    depths = [s.meta["candidate_depths"][s.meta["gold_rank"]] for s in samples]
    shares = Counter(candidates.third_of(d) for d in depths)
    assert all(0.20 <= shares[third] / 300 <= 0.47 for third in candidates.THIRDS), shares
    assert Counter(s.meta["gold_rank"] for s in samples) == {0: 100, 1: 100, 2: 100}
    assert all(s.meta["candidates"][s.meta["gold_rank"]] == s.answer for s in samples)
    old = multihop.make_sample(
        embedded.tokenizer, context_tokens=300, depth=0.0, seed=1, form=multihop.MultihopForm(placement="depth")
    )
    assert old.meta["candidate_depths"][old.meta["gold_rank"]] < 0.3
