"""Hallucination labels, features and the detector: exact labels, the probe's context mass against eager
attention, traces with and without the new columns, and end-to-end detection on synthetic traces."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from test_probe_exactness import eager_last_rows
from zoo import FAMILIES, NoTokenizer, tiny_model

from dynheads.analysis import hallucination as hl
from dynheads.analysis.detector import Detector, apply_detector
from dynheads.analysis.evidence import EvidenceSettings
from dynheads.analysis.settings import ANSWER_KEY, DEPLOYABLE
from dynheads.engine.decoding import DecodingSession
from dynheads.engine.tracing import trace
from dynheads.errors import DynheadsError
from dynheads.io import read_json
from dynheads.models import LoadedModel
from dynheads.runs import RunDir
from dynheads.settings import DetectConfig
from dynheads.traces import Trace
from dynheads.views.detect import run_detect

TRUE = "0bf99a6a-75b9-4c1e"


def test_labels_follow_the_true_value_prefix_and_skip_tokens_outside_the_value():
    tokens = ["The", " magic", " word", " is", " 0b", "f9", "9a", "6a", "-", "75", "c9", "-", "4c", "1e", "."]
    labels = hl.label_tokens(tokens, TRUE, hl.find_value("".join(tokens)))
    assert labels[:4].tolist() == [hl.UNLABELLED] * 4  # "The magic word is": not part of the value
    assert labels[-1] == hl.UNLABELLED  # the final period
    # " 0b" .. "75" continue the true value; "c9" is the first wrong token; everything after it is wrong too,
    # even "-" and "4c", "1e" that happen to equal the true characters at the same offset.
    assert labels[4:14].tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]


def test_labels_a_token_straddling_the_value_end_and_a_too_long_value():
    tokens = [" 0b", "f99a6a-75b9-4c1e", "ff", "."]
    labels = hl.label_tokens(tokens, TRUE, hl.find_value("".join(tokens)))
    assert labels.tolist() == [0, 0, 1, hl.UNLABELLED]  # characters beyond the true value are hallucinated
    tokens = ["The", " word", " is", " unknown", "."]
    assert (hl.label_tokens(tokens, TRUE, hl.find_value("".join(tokens))) == hl.UNLABELLED).all()
    with pytest.raises(DynheadsError):
        hl.label_tokens(["ab"], TRUE, (0, 5))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_context_mass_equals_eager_attention_on_the_prompt(family):
    model = tiny_model(family)
    lm = LoadedModel(model=model, tokenizer=NoTokenizer(), name=family, revision="random")
    prompt_len = 20
    torch.manual_seed(1)
    prompt = torch.randint(3, 128, (prompt_len,)).tolist()
    session = DecodingSession(lm, prompt, [5, 6], max_new_tokens=4)
    result = session.forward(prompt_len)
    for step in range(4):  # 24 tokens > sliding window 8: windowed layers see only part of the prompt
        rows, _ = eager_last_rows(model, session.ids[: session.length][None])
        for layer in range(lm.num_layers):
            expected = rows[layer][:, :prompt_len].sum(-1)
            assert (result.stats.context_mass[layer] - expected).abs().max() <= 1e-5, (family, step, layer)
            context = rows[layer][:, :prompt_len] / expected[:, None]  # the row renormalised over the prompt
            entropy = -(context * context.clamp_min(1e-30).log()).sum(-1)
            assert (result.stats.context_entropy[layer] - entropy).abs().max() <= 1e-4, (family, step, layer)
        session.append(int(result.logits.argmax()))
        result = session.forward(1)


class _Prompt:
    def __init__(self, input_ids, needle_positions):
        self.input_ids, self.needle_positions = input_ids, needle_positions


@pytest.mark.parametrize("family", ["llama", "gemma2", "qwen2"])
def test_forcing_the_greedy_tokens_gives_the_greedy_trace(family):
    lm = LoadedModel(model=tiny_model(family), tokenizer=NoTokenizer(), name=family, revision="random")
    torch.manual_seed(2)
    sample = _Prompt(torch.randint(3, 128, (18,)).tolist(), [6, 7, 8])
    greedy = trace(lm, sample, max_new_tokens=7, stop_at_eos=False)
    forced = trace(lm, sample, forced_tokens=greedy.tokens)
    assert forced.stop_reason == "forced" and forced.tokens.tolist() == greedy.tokens.tolist()
    for name in (
        "argmax_pos",
        "copy_scores",
        "needle_mass",
        "reasoning_scores",
        "max_prob",
        "context_mass",
        "context_entropy",
        "hidden",
        "token_entropy",
        "token_max_prob",
        "token_prob",
        "chance",
    ):
        np.testing.assert_array_equal(getattr(forced, name), getattr(greedy, name), err_msg=name)
    np.testing.assert_array_equal(greedy.token_prob, greedy.token_max_prob)  # greedy emits the top token


def test_forcing_other_tokens_emits_them_and_scores_their_probability():
    lm = LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")
    torch.manual_seed(3)
    sample = _Prompt(torch.randint(3, 128, (16,)).tolist(), [4, 5])
    greedy = trace(lm, sample, max_new_tokens=4, stop_at_eos=False)
    other = [(int(t) + 1) % 128 for t in greedy.tokens]
    forced = trace(lm, sample, forced_tokens=other, context_end=10)
    assert forced.tokens.tolist() == other
    np.testing.assert_array_equal(forced.token_max_prob[0], greedy.token_max_prob[0])  # same first pass
    assert (forced.token_prob < forced.token_max_prob).all()
    assert not np.array_equal(forced.context_mass, greedy.context_mass)  # the context now ends at 10
    with pytest.raises(DynheadsError, match="empty"):
        trace(lm, sample, forced_tokens=[])
    with pytest.raises(DynheadsError, match="context_end"):
        trace(lm, sample, forced_tokens=other, context_end=17)


def _trace(
    token_texts: list[str], copy_counts: np.ndarray, rng: np.random.Generator, *, layers=3, heads=4, optional=True
) -> Trace:
    steps = len(token_texts)
    copy = np.zeros((steps, layers * heads), dtype=bool)
    for step, count in enumerate(copy_counts):
        copy[step, rng.permutation(layers * heads)[:count]] = True
    head = lambda: rng.random((steps, layers, heads)).astype(np.float32)  # noqa: E731
    return Trace(
        tokens=np.arange(steps),
        token_texts=token_texts,
        text="".join(token_texts),
        argmax_pos=np.zeros((steps, layers, heads), np.int32),
        needle_mass=head(),
        scores={"copy": copy.reshape(steps, layers, heads), "reasoning": head()},
        max_prob=head(),
        hidden=rng.random((steps, 8)),
        prompt_length=100,
        stop_reason="eos",
        context_mass=head() if optional else None,
        token_entropy=rng.random(steps).astype(np.float32) if optional else None,
        token_max_prob=rng.random(steps).astype(np.float32) if optional else None,
        context_entropy=head() if optional else None,
        token_prob=rng.random(steps).astype(np.float32) if optional else None,
        prompt_ids=rng.integers(0, 1000, 100) if optional else None,  # each sample's own prompt
    )


def _synthetic_run(path, *, samples=40, shuffle=False, seed=0) -> RunDir:
    """Answers whose first ``k`` value tokens are right; copy-head count = 6 on faithful tokens, 1 otherwise."""
    rng = np.random.default_rng(seed)
    run = RunDir(path)
    run.start("niah", {"synthetic": True}, None)
    for index in range(samples):
        answer = "-".join("".join(rng.choice(list("0123456789abcdef"), 4)) for _ in range(4))
        pieces = [answer[i : i + 2] for i in range(0, len(answer), 2)]
        correct = int(rng.integers(1, len(pieces)))
        wrong = ["zz" if p != "zz" else "yy" for p in pieces[correct:]]
        generated = ["The", " word", " is", " "] + pieces[:correct] + wrong + ["."]
        labels = hl.label_tokens(generated, answer, hl.find_value("".join(generated)))
        counts = np.where(labels == hl.HALLUCINATED, 1, 6)
        if shuffle:
            counts = rng.integers(0, 8, len(generated))
        trace = _trace(generated, counts, rng)
        run.save_sample({"sample_id": f"s{index:02d}", "answer": answer, "seed": seed * 1000 + index}, trace)
    return run


def test_detector_reaches_auroc_one_when_the_label_is_a_function_of_one_feature(tmp_path):
    run = _synthetic_run(tmp_path / "run")
    config = DetectConfig(feature_sets=("copy_heads", "lookback", "entropy"), bootstrap=200)
    table = run_detect(run.path, config, tmp_path / "out").set_index("feature_set")
    assert table.loc["copy_heads", "auroc"] == 1.0
    assert table.loc["copy_heads", "auroc_low"] == 1.0
    manifest = RunDir(tmp_path / "out").manifest()
    labelled = sorted(set(__import__("pandas").read_csv(tmp_path / "out" / "labels.csv")["sample_id"]))
    assert len(labelled) + manifest["samples_without_value"] == len(run.records())
    for repeat in manifest["cross_validation"]["repeats"]:  # every sample is tested once per repeat, in one fold
        tested = [group for fold in repeat["test_groups"] for group in fold]
        assert sorted(tested) == labelled
    assert manifest["cross_validation"]["unit"] == "sample"
    assert manifest["class_counts"]["hallucinated_tokens"] > 0
    text = (tmp_path / "out" / "results.md").read_text()  # NIAH: no questions, no responses, so no win rate
    assert f"{len(labelled)} samples (each its own group);" in text and "Within-question" not in text
    assert (tmp_path / "out" / "roc.png").stat().st_size > 0
    # The saved detector scores a trace it has never seen the same way; a trace it was fitted on is refused.
    detector = Detector.load(tmp_path / "out" / "detector.json")
    fitted_ids = sorted(set(__import__("pandas").read_csv(tmp_path / "out" / "labels.csv")["sample_id"]))
    assert detector.fitted_prompts == {run.load_trace(sample_id).prompt_digest() for sample_id in fitted_ids}
    with pytest.raises(DynheadsError, match="the detector was fitted on this trace's prompt .digest [0-9a-f]{16}"):
        apply_detector(detector, run.trace_path(fitted_ids[0]))
    unseen = _synthetic_run(tmp_path / "unseen", samples=1, seed=99)
    record = unseen.records()[0]
    frame = apply_detector(detector, unseen.trace_path(record["sample_id"]), record["answer"])
    labelled = frame[frame["label"] >= 0]
    hallucinated = labelled[labelled["label"] == 1]["p_hallucinated.copy_heads"]
    faithful = labelled[labelled["label"] == 0]["p_hallucinated.copy_heads"]
    assert hallucinated.min() > faithful.max()


def test_a_detector_refuses_a_trace_of_another_model_in_one_line():
    """A detector fitted on 3 x 4 heads: a trace without its static head, or with another head count, is refused
    with one line (not an IndexError or a matmul error)."""
    width = 12  # lookback: one column per head
    flat = {"mean": [0.0] * width, "scale": [1.0] * width, "coef": [0.1] * width, "intercept": 0.0}
    detector = Detector(hl.FeatureSpec(((2, 3),), static_k=1), None, {"lookback": flat})
    rng = np.random.default_rng(0)
    texts = ["The", " word", " is", " x"]
    assert "p_hallucinated.lookback" in apply_detector(detector, _trace(texts, np.zeros(4, int), rng))
    with pytest.raises(DynheadsError, match="reads head L2-H3, which this trace .2 layers x 4 heads. does not have"):
        apply_detector(detector, _trace(texts, np.zeros(4, int), rng, layers=2))
    with pytest.raises(
        DynheadsError, match="'lookback' has 20 columns in this trace, but the detector was fitted on 12"
    ):
        apply_detector(detector, _trace(texts, np.zeros(4, int), rng, layers=4, heads=5))


def test_detect_apply_refuses_a_trace_from_a_run_of_another_model_of_the_same_shape(tmp_path):
    """The detector records its run's model; a trace of another model with the same head count (a base and an
    instruct model, say) was scored silently: now one line, read from the manifest of the trace's run."""
    import subprocess
    import sys

    model = {"name": "instruct", "architecture": "Llama", "num_layers": 3, "num_heads": 4, "revision": "sha256:aa"}
    run = _synthetic_run(tmp_path / "run", samples=12)
    _set_model(run.path, **model)
    run_detect(run.path, DetectConfig(feature_sets=("lookback", "entropy"), folds=3, bootstrap=10), tmp_path / "d")
    detector = tmp_path / "d" / "detector.json"
    assert Detector.load(detector).model == model
    same = _synthetic_run(tmp_path / "same", samples=1, seed=98)
    _set_model(same.path, **model | {"device": "cuda:0"})
    assert len(apply_detector(detector, same.trace_path("s00")))  # the same model elsewhere: scored
    other = _synthetic_run(tmp_path / "other", samples=1, seed=99)
    _set_model(other.path, **model | {"name": "base", "revision": "sha256:bb"})
    done = subprocess.run(
        [sys.executable, "-m", "dynheads", "detect-apply", str(detector), str(other.trace_path("s00"))],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "fitted on a run of instruct (revision sha256:aa); this trace's run is of base" in done.stderr


def test_detector_is_at_chance_when_the_feature_is_shuffled(tmp_path):
    run = _synthetic_run(tmp_path / "run", samples=60, shuffle=True)
    table = run_detect(run.path, DetectConfig(feature_sets=("copy_heads",), bootstrap=200), tmp_path / "out")
    auroc = table.set_index("feature_set").loc["copy_heads", "auroc"]
    assert abs(auroc - 0.5) < 0.1
    row = table.iloc[0]
    assert row["auroc_low"] < 0.5 < row["auroc_high"]


def test_traces_without_the_new_columns_still_load_and_skip_their_feature_sets(tmp_path):
    rng = np.random.default_rng(0)
    old = _trace(["a", "b"], np.array([1, 2]), rng, optional=False)
    old.save(tmp_path / "old.parquet")
    loaded = Trace.load(tmp_path / "old.parquet")
    assert loaded.context_mass is None and loaded.token_entropy is None
    new = _trace(["a", "b"], np.array([1, 2]), rng)
    new.save(tmp_path / "new.parquet")
    again = Trace.load(tmp_path / "new.parquet")
    np.testing.assert_array_equal(again.context_mass, new.context_mass)
    np.testing.assert_array_equal(again.token_entropy, new.token_entropy)
    spec = hl.FeatureSpec(((0, 0), (1, 1)), static_k=2)
    assert set(hl.token_features(loaded, np.array([0, 1]), spec)) == {"copy_heads", "retrieval", "retrieval_no_needle"}
    assert hl.token_features(again, np.array([0, 1]), spec)["retrieval"].shape == (2, 2 + 3 * 2)
    again.argmax_pos[:] = [[[0, 50, 99, 100]] * 3, [[4, 4, 4, 4]] * 3]  # sink, prompt, prompt, generated
    blind = hl.token_features(again, np.array([0, 1]), spec)["retrieval_no_needle"]
    np.testing.assert_array_equal(blind[:, :3], [[6, 0, 1], [12, 1, 1]])
    with pytest.raises(DynheadsError, match="context_mass"):
        hl.lookback_ratios(loaded)
    for steps in (np.array([2]), np.array([-1, 0])):  # the trace has steps 0 and 1: no IndexError, no wrap-around
        with pytest.raises(DynheadsError, match=r"token_features: steps must be in 0\.\.1, got \["):
            hl.token_features(again, steps, spec)


def test_lookback_ratio_is_one_at_the_first_step_and_follows_the_means():
    rng = np.random.default_rng(0)
    trace = _trace(["a", "b", "c"], np.array([0, 0, 0]), rng, layers=1, heads=1)
    trace.context_mass[:] = 0.5
    ratios = hl.lookback_ratios(trace)[:, 0, 0]
    assert ratios[0] == 1.0
    context_mean = 0.5 / trace.prompt_length
    assert ratios[2] == pytest.approx(context_mean / (context_mean + 0.5 / 2))


def test_detect_refuses_runs_without_both_classes(tmp_path):
    run = RunDir(tmp_path / "run")
    run.start("niah", {"synthetic": True}, None)
    rng = np.random.default_rng(0)
    for index in range(4):
        run.save_sample({"sample_id": f"s{index}", "answer": "ab12-cd"}, _trace([" ab12-cd"], np.array([3]), rng))
    with pytest.raises(DynheadsError, match="only faithful"):
        run_detect(run.path, DetectConfig(bootstrap=10), tmp_path / "out")


def test_niah_distractor_shares_the_prefix_and_is_not_part_of_the_needle(embedded):
    from dynheads import niah

    tok = embedded.tokenizer
    for prefix in (0, 8, 13):  # 8 and 13 end right before a hyphen: the value differs at the next free character
        sample = niah.make_sample(
            tok, context_tokens=600, depth=0.5, seed=5, distractor_depth=0.8, distractor_prefix=prefix
        )
        value = sample.meta["distractor"]
        shared = next(i for i, (a, b) in enumerate(zip(value, sample.answer, strict=True)) if a != b)
        assert shared >= prefix and value[:prefix] == sample.answer[:prefix]
        decoded = tok.decode([sample.input_ids[i] for i in sample.meta["distractor_positions"]])
        assert decoded.strip() == f"The secret word is {value}."
        assert not set(sample.meta["distractor_positions"]) & set(sample.needle_positions)
        assert sample.meta["distractor_positions"][0] > sample.needle_positions[-1]  # depth 0.8 after 0.5
    with pytest.raises(DynheadsError):
        niah.make_sample(tok, context_tokens=600, depth=0.5, seed=5, distractor_depth=1.5)


def test_probe_features_use_the_predicted_heads_and_their_silence():
    rng = np.random.default_rng(0)
    trace = _trace(["a", "b"], np.array([0, 12]), rng)  # step 1: every head copies
    trace.argmax_pos[:] = 50  # every head looks into the prompt past the sink (copying only at step 1) ...
    trace.argmax_pos[1, 0] = 2  # ... except the 4 heads of layer 0 at step 1, which look at the sink
    predicted = np.full((2, 12), 0.5)
    features = hl.token_features(trace, np.array([0, 1]), hl.FeatureSpec(((0, 0),), 1), predicted)
    # needle-free silence: predicted mass on heads not looking into the prompt (none at step 0, layer 0 at step 1)
    np.testing.assert_allclose(features["probe"], [[6.0, 0.5, 0.0], [6.0, 0.5, 2.0]])
    # the upper-bound silence reads Eq. 1: predicted mass on heads that did not copy
    np.testing.assert_allclose(features["probe_copy_silence"], [[6.0], [0.0]])
    assert "probe_copy_silence" in ANSWER_KEY and "probe" in DEPLOYABLE


def test_cli_detect_and_apply(tmp_path):
    import subprocess
    import sys

    run = _synthetic_run(tmp_path / "run", samples=12)
    cli = [sys.executable, "-m", "dynheads"]
    done = subprocess.run(
        [*cli, "detect", str(run.path), "--feature-sets", "copy_heads,entropy", "--bootstrap", "20"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "| copy_heads | 1 |" in done.stdout
    seen = subprocess.run(
        [*cli, "detect-apply", str(run.path / "detect" / "detector.json"), str(run.trace_path("s00"))],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert seen.returncode == 2 and "fitted on this trace's prompt" in seen.stderr and "Traceback" not in seen.stderr
    trace_file = _synthetic_run(tmp_path / "unseen", samples=1, seed=99).trace_path("s00")
    done = subprocess.run(
        [
            *cli,
            "detect-apply",
            str(run.path / "detect" / "detector.json"),
            str(trace_file),
            "--out",
            str(tmp_path / "scores.csv"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "p_hallucinated.copy_heads" in (tmp_path / "scores.csv").read_text()
    done = subprocess.run([*cli, "detect", str(tmp_path / "nothing")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and done.stderr.startswith("error: ")


def test_detect_never_overwrites_another_run(tmp_path):
    run = _synthetic_run(tmp_path / "run", samples=4)
    with pytest.raises(DynheadsError, match="choose another --out"):
        run_detect(run.path, DetectConfig(bootstrap=10), run.path)


def _response_run(path, *, questions=12, signal=True, seed=0) -> RunDir:
    """Teacher-forced pairs: question q has a right (label 0) and a hallucinated (label 1) response; with ``signal``
    the hallucinated one has few active copy heads, else the count is noise."""
    rng = np.random.default_rng(seed)
    run = RunDir(path)
    run.start("halueval", {"synthetic": True}, None, {"data": "halueval:qa", "response_prefix": 0})
    for q in range(questions):
        for label in (0, 1):
            steps = int(rng.integers(2, 6))
            counts = (np.where(label, 1, 6) if signal else rng.integers(0, 8)) * np.ones(steps, int)
            trace = _trace([f"t{i}" for i in range(steps)], counts, rng)
            run.save_sample(
                {"sample_id": f"q{q:02d}-{label}", "question_id": f"q{q:02d}", "response_label": label}, trace
            )
    return run


def test_grouped_folds_never_split_a_question():
    groups = np.repeat([f"q{i}" for i in range(13)], 2)  # both answers of each question
    labels = np.tile([0, 1], 13)
    for seed in range(5):
        folds = hl.grouped_folds(groups, labels, 5, seed)
        tested = np.concatenate([test for _, test in folds])
        assert sorted(tested) == list(range(len(groups)))  # every answer is tested exactly once
        for train, test in folds:
            assert not set(groups[train]) & set(groups[test])
    with pytest.raises(DynheadsError, match="at least 5 questions"):
        hl.grouped_folds(groups[:8], labels[:8], 5, 0)


def test_detect_on_responses_keeps_questions_whole_and_sets_the_upper_bound_apart(tmp_path):
    run = _response_run(tmp_path / "run")
    config = DetectConfig(feature_sets=("copy_heads", "lookback", "entropy", "length"), bootstrap=50, folds=4)
    table = run_detect(run.path, config, tmp_path / "out")
    manifest = RunDir(tmp_path / "out").manifest()
    assert manifest["cross_validation"]["unit"] == "question" and manifest["levels"] == ["response", "token"]
    for repeat in manifest["cross_validation"]["repeats"]:
        tested = [group for fold in repeat["test_groups"] for group in fold]
        assert sorted(tested) == [f"q{q:02d}" for q in range(12)]  # each question in exactly one test fold
    labels = __import__("pandas").read_csv(tmp_path / "out" / "labels.csv")
    assert (labels.groupby("group")["fold"].nunique() == 1).all()  # both answers of a question: one fold
    response = table[table["level"] == "response"].set_index("feature_set")
    assert response.loc["copy_heads", "auroc"] == 1.0 and response.loc["copy_heads", "section"] == "upper_bound"
    assert response.loc["lookback", "section"] == "deployable"
    assert "length" not in set(table[table["level"] == "token"]["feature_set"])
    text = (tmp_path / "out" / "results.md").read_text()
    headline, upper = text.split("### Upper bound")[0], text.split("### Upper bound")[1].split("## Tokens")[0]
    assert "| lookback |" in headline and "| copy_heads |" not in headline and "| copy_heads |" in upper
    assert "(reference)" in headline  # the lookback ratio's row; the others carry a paired difference to it
    assert response.loc["entropy", "delta_lookback_low"] <= response.loc["entropy", "delta_lookback_high"]
    # length control: the answers of a question cut to the shorter one's tokens; length then carries nothing
    matched = run_detect(
        run.path, DetectConfig(feature_sets=("length",), bootstrap=20, folds=4, match_length=True), tmp_path / "matched"
    )
    assert matched.set_index("level").loc["response", "auroc"] == 0.5


def test_span_features_average_the_response_and_drop_the_constant_first_lookback():
    rng = np.random.default_rng(1)
    trace = _trace(["a", "b", "c"], np.array([0, 1, 2]), rng, layers=1, heads=2)
    spec = hl.FeatureSpec(((0, 0),), 1)
    span = hl.span_features(trace, spec)
    np.testing.assert_allclose(span["copy_heads"], [[1.0]])
    np.testing.assert_allclose(span["lookback"], hl.lookback_ratios(trace)[1:].reshape(2, -1).mean(0, keepdims=True))
    assert span["length"].item() == 3
    prefixed = hl.span_features(trace, hl.FeatureSpec(((0, 0),), 1, response_prefix=5))
    np.testing.assert_allclose(prefixed["lookback"], hl.lookback_ratios(trace, 5).reshape(3, -1).mean(0, keepdims=True))
    assert (hl.lookback_ratios(trace, 5)[0] < 1).all()  # the prefix is visible at step 0


def test_detect_refuses_a_probe_fitted_on_its_questions(tmp_path):
    run = _response_run(tmp_path / "run", questions=6)
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "questions.json").write_text('{"train": ["q03"], "validation": []}')
    with pytest.raises(DynheadsError, match="fitted on 1 of the questions"):
        run_detect(run.path, DetectConfig(probe=str(probe), folds=3, bootstrap=10), tmp_path / "out")


def test_detect_refuses_a_probe_fitted_on_its_niah_seeds_not_on_shared_sample_names(tmp_path):
    run = _synthetic_run(tmp_path / "run", samples=10)
    fitted = RunDir(tmp_path / "probe-run")
    fitted.start("niah", {"synthetic": True}, None)
    probe = tmp_path / "probe-run" / "probe"
    probe.mkdir()
    (probe / "metrics.json").write_text(__import__("json").dumps({"run": str(fitted.path)}))
    (probe / "questions.json").write_text('{"train": ["s01"], "validation": []}')  # same name, other seed
    fitted.save_sample({"sample_id": "s01", "seed": 777, "answer": "other"})
    checked = __import__("dynheads.views.detect", fromlist=["x"]).refuse_probe_overlap(
        str(probe), run.records(), [r["sample_id"] for r in run.records()]
    )
    assert checked["checked"] == "seeds and needle values"
    fitted.save_sample({"sample_id": "s99", "seed": 3, "answer": "other"})  # seed 3 is evaluation sample s03's
    with pytest.raises(DynheadsError, match="fitted on 1 of the evaluation samples"):
        run_detect(run.path, DetectConfig(probe=str(probe), folds=3, bootstrap=10), tmp_path / "out")


def test_detect_refuses_a_static_list_scored_on_its_niah_samples_and_records_the_check(tmp_path):
    """--static is fitted data too: a list whose run holds an evaluated seed or needle value is refused, like
    --predictor; a disjoint one is checked and the manifest says so."""
    run = _synthetic_run(tmp_path / "run", samples=10)
    fitted = RunDir(tmp_path / "static")
    fitted.start("niah", {"synthetic": True}, None)
    fitted.save_sample({"sample_id": "s01", "seed": 777, "answer": "other"})  # same name, other seed and value
    listed = tmp_path / "static" / "static_heads.json"
    listed.write_text(
        __import__("json").dumps({f"{layer}-{head}": [1.0 + layer] for layer in range(3) for head in range(4)})
    )
    config = DetectConfig(static=str(listed), feature_sets=("retrieval", "entropy"), folds=3, bootstrap=10)
    run_detect(run.path, config, tmp_path / "out")
    assert RunDir(tmp_path / "out").manifest()["static_overlap_check"]["checked"] == "seeds and needle values"
    fitted.save_sample({"sample_id": "s99", "seed": 3, "answer": "other"})  # seed 3 is evaluation sample s03's
    with pytest.raises(DynheadsError, match="static head list .* was fitted on 1 of the evaluation samples"):
        run_detect(run.path, config, tmp_path / "out2")


def test_transfer_table_between_the_two_tasks(tmp_path):
    from dynheads.experiments.halueval import run_transfer

    for task, seed in (("qa", 0), ("dialogue", 1)):
        run = _response_run(tmp_path / task / "trace", seed=seed)
        manifest = run.manifest() | {"kind": "halueval", "data": f"halueval:{task}"}
        run.manifest_path.write_text(__import__("json").dumps(manifest))
        run_detect(
            run.path, DetectConfig(feature_sets=("copy_heads", "entropy"), folds=3, bootstrap=20), tmp_path / task
        )
    flat = run_transfer(
        tmp_path / "qa",
        tmp_path / "dialogue",
        DetectConfig(feature_sets=("copy_heads", "entropy"), folds=3, bootstrap=20),
        tmp_path / "t",
    )
    row = flat[(flat["level"] == "response") & (flat["feature_set"] == "copy_heads")].iloc[0]
    assert row["QA -> dialogue auroc"] == 1.0 and row["dialogue -> QA auroc"] == 1.0
    assert not np.isnan(row["QA in-task auroc"])  # the in-task numbers come from the detect runs
    text = (tmp_path / "t" / "transfer.md").read_text()
    assert "QA → dialogue" in text and "### Upper bound" in text
    with pytest.raises(DynheadsError, match="transfer needs the two tasks"):
        run_transfer(tmp_path / "qa", tmp_path / "qa", DetectConfig(), tmp_path / "t2")


def _transfer_pair(tmp_path, configs: dict[str, DetectConfig]) -> None:
    """Detect runs of the two tasks (QA, dialogue) in tmp_path/qa and tmp_path/dialogue, each under its config."""
    for task, seed in (("qa", 0), ("dialogue", 1)):
        run = _response_run(tmp_path / task / "trace", seed=seed)
        manifest = run.manifest() | {"kind": "halueval", "data": f"halueval:{task}"}
        run.manifest_path.write_text(__import__("json").dumps(manifest))
        run_detect(run.path, configs[task], tmp_path / task)


def test_transfer_names_the_detect_runs_folds_and_leaves_out_in_task_numbers_of_other_settings(tmp_path):
    """transfer.md said 'In-task: 5-fold' (the transfer's unused default) whatever the detect runs used, and showed
    their numbers beside the transfer's although measured with another static top-k."""
    from dynheads.experiments.halueval import run_transfer

    sets = ("copy_heads", "retrieval", "entropy")
    _transfer_pair(
        tmp_path,
        {
            "qa": DetectConfig(feature_sets=sets, folds=3, repeats=2, bootstrap=20),
            "dialogue": DetectConfig(feature_sets=sets, folds=4, repeats=1, bootstrap=20, static_k=2),
        },
    )
    flat = run_transfer(tmp_path / "qa", tmp_path / "dialogue", DetectConfig(feature_sets=sets), tmp_path / "t")
    row = flat[(flat["level"] == "response") & (flat["feature_set"] == "retrieval")].iloc[0]
    assert not np.isnan(row["QA in-task auroc"]) and np.isnan(row["dialogue in-task auroc"])
    text = (tmp_path / "t" / "transfer.md").read_text()
    assert "5-fold" not in text and "QA: 3-fold cross-validation grouped by question, first of 2 repeats" in text
    assert "dialogue: n/a" in text and "static_k 2 (here 10)" in text
    manifest = RunDir(tmp_path / "t").manifest()
    assert manifest["detect_runs"] == [str(tmp_path / "qa"), str(tmp_path / "dialogue")]
    assert manifest["in_task"][0].startswith("QA: 3-fold")


def _set_model(run_path, **model) -> None:
    """Write ``model`` as the run manifest's model entry (what ``LoadedModel.describe`` records)."""
    run = RunDir(run_path)
    run.manifest_path.write_text(__import__("json").dumps(run.manifest() | {"model": model}))


def test_transfer_refuses_runs_or_a_predictor_of_another_model_in_one_line_and_not_another_device(tmp_path):
    from dynheads.experiments.halueval import run_transfer

    sets = ("copy_heads", "entropy")
    config = DetectConfig(feature_sets=sets, folds=3, bootstrap=10)
    _transfer_pair(tmp_path, {"qa": config, "dialogue": config})
    smol = {"name": "smol", "architecture": "Llama", "num_layers": 3, "num_heads": 4, "revision": "sha256:aa"}
    _set_model(tmp_path / "qa" / "trace", **smol, device="cpu")
    _set_model(tmp_path / "dialogue" / "trace", **smol, device="cuda:0")  # the same model elsewhere: accepted
    run_transfer(tmp_path / "qa", tmp_path / "dialogue", config, tmp_path / "t")
    probe = tmp_path / "probe-run" / "probe"
    probe.mkdir(parents=True)
    (probe / "questions.json").write_text('{"train": ["other"], "validation": []}')  # no question shared
    RunDir(tmp_path / "probe-run").start("niah", {"synthetic": True}, None)
    _set_model(tmp_path / "probe-run", **smol | {"name": "base", "revision": "sha256:bb"})
    with pytest.raises(DynheadsError, match=r"head predictor .* comes from a run of another model \(base"):
        run_transfer(tmp_path / "qa", tmp_path / "dialogue", replace(config, probe=str(probe)), tmp_path / "t")
    _set_model(tmp_path / "dialogue" / "trace", **smol | {"name": "base", "revision": "sha256:bb"})
    with pytest.raises(DynheadsError, match=r"different models \(QA: smol, revision sha256:aa; dialogue: base"):
        run_transfer(tmp_path / "qa", tmp_path / "dialogue", config, tmp_path / "t")


@pytest.mark.parametrize(
    "content",
    ["{not json", "[1, 2]", '{"format": "dynheads-detector/2"}', '{"format": "dynheads-detector/1", "models": {}}'],
)
def test_detect_apply_refuses_an_invalid_detector_file_in_one_line(tmp_path, content):
    import subprocess
    import sys

    bad = tmp_path / "detector.json"
    bad.write_text(content)
    with pytest.raises(DynheadsError, match="detector"):
        Detector.load(bad)
    trace_file = tmp_path / "t.parquet"
    _trace(["a"], np.array([1]), np.random.default_rng(0)).save(trace_file)
    done = subprocess.run(
        [sys.executable, "-m", "dynheads", "detect-apply", str(bad), str(trace_file)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1


def test_halueval_samples_put_the_knowledge_in_the_prompt_and_pair_the_answers(embedded):
    from dynheads.tasks.halueval import make_samples
    from dynheads.tasks.questions import QuestionStream

    tok = embedded.tokenizer
    samples = make_samples(tok, "qa", QuestionStream("detect", 3, 2))
    assert [s.question_id for s in samples] == ["halueval-qa-00003"] * 2 + ["halueval-qa-00004"] * 2
    assert [s.response_label for s in samples] == [0, 1, 0, 1]
    right, wrong = samples[:2]
    assert right.input_ids == wrong.input_ids and right.response_ids != wrong.response_ids
    knowledge = tok.decode([right.input_ids[i] for i in right.needle_positions])
    assert knowledge.strip().startswith("Knowledge:") or len(knowledge) > 20
    header = tok.decode(right.input_ids[right.context_end :])
    assert "assistant" in header and right.response.split()[0] not in header
    repeated = make_samples(tok, "dialogue", QuestionStream("detect", 67, 1))[0]  # its passage recurs in the dialogue
    passage = tok.decode([repeated.input_ids[i] for i in repeated.needle_positions]).strip()
    assert passage == "Anita Diamant wrote The Red Tent" and repeated.needle_positions[0] < repeated.context_end
    with pytest.raises(DynheadsError, match="unknown detection data"):
        __import__("dynheads.tasks.halueval", fromlist=["x"]).parse_data("halueval:summary")


@pytest.mark.embedded  # the CLI on its default model
def test_cli_detect_on_halueval_writes_the_lookback_and_a_needle_free_retrieval_set(tmp_path):
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dynheads",
            "detect",
            "--data",
            "halueval:dialogue",
            "--questions",
            "4",
            "--folds",
            "2",
            "--repeats",
            "1",
            "--bootstrap",
            "20",
            "--context-boundary",
            "lookback-lens",
            "--out",
            str(tmp_path / "d"),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr
    headline = done.stdout.split("### Upper bound")[0]
    assert "| lookback |" in headline and "| retrieval_no_needle |" in headline
    manifest = RunDir(tmp_path / "d" / "trace").manifest()
    assert manifest["questions"]["first"] == 0 and manifest["questions"]["count"] == 4
    assert manifest["packaged"]["name"] == "halueval-dialogue"
    assert manifest["response_prefix"] > 0  # the end-of-turn marker and assistant header count as generated
    assert RunDir(tmp_path / "d").manifest()["response_prefix"] == manifest["response_prefix"]


def test_paired_auroc_difference_resamples_both_detectors_together():
    rng = np.random.default_rng(0)
    groups = np.repeat(np.arange(40), 2)
    labels = np.tile([0, 1], 40)
    perfect = labels + rng.random(80) * 0.5
    noise = rng.random(80)
    assert hl.paired_auroc_difference(labels, noise, noise, groups, EvidenceSettings(resamples=100)) == (0.0, 0.0, 0.0)
    delta, low, high = hl.paired_auroc_difference(labels, perfect, noise, groups, EvidenceSettings(resamples=200))
    assert delta == pytest.approx(1.0 - hl.auroc_auprc(labels, noise)[0]) and 0 < low <= delta <= high


def test_within_question_win_rate_is_known_by_construction_and_ignores_question_offsets():
    # 10 questions, one right (0) and one hallucinated (1) answer each: the hallucinated one scores higher in 7,
    # ties in 1 and scores lower in 2, so the win rate is 7.5 / 10; every question is shifted by its own offset,
    # which the pooled AUROC sees and the paired comparison cancels
    groups = np.repeat([f"q{i}" for i in range(10)], 2)
    labels = np.tile([0, 1], 10)
    offsets = np.repeat(np.arange(10) * 10.0, 2)
    margins = np.array([1, 1, 1, 1, 1, 1, 1, 0, -1, -1], float)
    scores = offsets + np.ravel([[0.0, m] for m in margins])
    wins = hl.group_wins(labels, scores, groups)
    assert wins == {f"q{i}": float(m > 0) + 0.5 * (m == 0) for i, m in enumerate(margins)}
    paired = hl.paired_win_rate(labels, scores, groups, EvidenceSettings(resamples=200))
    assert paired.effect == pytest.approx(0.75) and paired.n == 10 and paired.low <= 0.75 <= paired.high < 1
    assert hl.auroc_auprc(labels, scores)[0] < 0.6  # pooled over questions, the offsets swamp the margins
    # a question missing a class has no pair and is left out
    assert hl.paired_win_rate(labels[:-1], scores[:-1], groups[:-1], EvidenceSettings(resamples=50)).n == 9


def test_length_strata_sort_questions_by_how_much_longer_the_hallucinated_answer_is():
    groups = np.repeat(["a", "b", "c", "d", "e"], 2)
    labels = np.tile([0, 1], 5)
    lengths = np.array([5, 5, 4, 8, 2, 7, 1, 12, 6, 3])  # ratios 1, 2, 3.5, 12, 0.5
    assert hl.length_strata(lengths, labels, groups) == {
        "a": "hallucinated not longer",
        "b": "up to 2x longer",
        "c": "2-4x longer",
        "d": "over 4x longer",
        "e": "hallucinated not longer",
    }


def _length_run(path, lengths: list[tuple[int, int]]) -> RunDir:
    """Teacher-forced pairs of the given (right, hallucinated) token counts; features are noise."""
    rng = np.random.default_rng(3)
    run = RunDir(path)
    run.start("halueval", {"synthetic": True}, None, {"data": "halueval:qa", "response_prefix": 0})
    for q, pair in enumerate(lengths):
        for label, steps in enumerate(pair):
            trace = _trace([f"t{i}" for i in range(steps)], rng.integers(0, 8, steps), rng)
            run.save_sample(
                {"sample_id": f"q{q:02d}-{label}", "question_id": f"q{q:02d}", "response_label": label}, trace
            )
    return run


def test_detect_reports_the_within_question_win_rate_and_length_strata_on_whole_answers(tmp_path):
    # 12 questions: in 8 the hallucinated answer is 6x longer, in 4 it is 1 token against the right one's 3 tokens.
    # Every training fold has longer hallucinated answers on average, so the length detector (fitted out of fold)
    # scores the longer answer higher: its win rate is 1 in the first stratum, 0 in the second, 8/12 overall.
    pairs = [(1, 6)] * 8 + [(3, 1)] * 4
    run = _length_run(tmp_path / "run", pairs)
    config = DetectConfig(feature_sets=("length", "entropy"), bootstrap=50, folds=4)
    table = run_detect(run.path, config, tmp_path / "out")
    response = table[table["level"] == "response"].set_index("feature_set")
    assert response.loc["length", "paired_questions"] == 12
    assert response.loc["length", "paired_win"] == pytest.approx(8 / 12)
    assert table[table["level"] == "token"]["paired_questions"].eq(0).all()  # paired: responses only
    # responses.csv holds the out-of-fold scores the win rate is computed from: recomputed from it, the same numbers
    scores = __import__("pandas").read_csv(tmp_path / "out" / "responses.csv")
    assert len(scores) == 24 and set(scores.groupby("group")["hallucinated"].sum()) == {1}
    wins = [
        g.loc[g.hallucinated == 1, "length"].iloc[0] > g.loc[g.hallucinated == 0, "length"].iloc[0]
        for _, g in scores.groupby("group")
    ]
    assert sum(wins) == 8 and set(scores.columns) == {"sample_id", "group", "hallucinated", "length", "entropy"}
    labels = __import__("pandas").read_csv(tmp_path / "out" / "labels.csv")
    assert len(labels) == sum(a + b for a, b in pairs)  # no answer is cut
    strata = {
        (r["stratum"], r["feature_set"]): r for r in read_json(tmp_path / "out" / "results.json")["length_strata"]
    }
    assert strata["over 4x longer", "length"]["effect"] == 1.0 and strata["over 4x longer", "length"]["n"] == 8
    assert strata["hallucinated not longer", "length"]["effect"] == 0.0
    assert strata["hallucinated not longer", "length"]["n"] == 4 and strata["2-4x longer", "length"]["n"] == 0
    text = (tmp_path / "out" / "results.md").read_text()
    assert "within-question win [95% CI]" in text and "Within-question win rate by answer length" in text
    # every win is 0 or 1: exact (Clopper-Pearson) intervals, never of zero width
    assert "| length | 0.000 [0.000, 0.602] (n=4) | — (n=0) | — (n=0) | 1.000 [0.631, 1.000] (n=8) |" in text


@pytest.mark.parametrize("boundary", ["prompt", "lookback-lens"])
def test_halueval_teacher_forcing_in_batches_of_four_equals_batch_one(tiny_model_dir, tmp_path, boundary):
    """Issue 35: both answers of several questions (responses of different lengths, prompts of different lengths)
    are forced as one batch; the records equal batch 1's and the traces batch 1's up to fp32 rounding."""
    from test_batching import assert_same_trace

    from dynheads.experiments.halueval import trace_halueval
    from dynheads.models import load_model
    from dynheads.settings import HaluevalConfig

    lm = load_model(tiny_model_dir)
    lm.model.config.max_position_embeddings = 4096  # a random RoPE model reads any position; HaluEval prompts are long
    config = HaluevalConfig(model=str(tiny_model_dir), data="halueval:qa", questions=3, context_boundary=boundary)
    one = trace_halueval(config, tmp_path / "b1", lm=lm, progress=False)
    four = trace_halueval(config, tmp_path / "b4", lm=lm, progress=False, batch_size=4)
    records = one.records()
    assert len(records) == 6 and four.records() == records
    assert len({r["steps"] for r in records}) > 1  # rows of one batch force responses of their own lengths
    for record in records:
        sample_id = record["sample_id"]
        assert_same_trace(one.load_trace(sample_id), four.load_trace(sample_id), sample_id)
