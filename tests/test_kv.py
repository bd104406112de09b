"""The KV-retention policy loop, its memory count, the disjointness guard and the DuoAttention export."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from zoo import NoTokenizer, tiny_model

from dynheads.analysis.headlists import RankedHeads
from dynheads.analysis.kvheads import kv_head_matrix, kv_head_ranking, query_head_scores, write_duo_attention
from dynheads.engine.tracing import trace
from dynheads.errors import DynheadsError
from dynheads.experiments.kv import KVConfig
from dynheads.io import read_json
from dynheads.kv.policies import KV_POLICIES, PolicyInputs
from dynheads.kv.retention import (
    KVSettings,
    kv_generate,
    kv_generate_batch,
    kv_head_count,
    kv_memory,
    kv_token_bytes,
    prefill,
    query_heads,
)
from dynheads.models import LoadedModel
from dynheads.runs import RunDir
from dynheads.tasks.prompting import PINNED_TEMPLATE_VARIABLES
from dynheads.views.kv_tables import probe_precision_recall


class _Sample:
    def __init__(self, ids, needle=()):
        self.input_ids, self.needle_positions = ids, list(needle)


@pytest.fixture(scope="module")
def lm():
    return LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")


EVERY_KV_HEAD = tuple((layer, kv) for layer in range(3) for kv in range(2))  # the tiny llama: 3 layers x 2 KV heads


def _prompt(seed=0, length=40):
    return torch.randint(3, 128, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_full_policy_is_plain_greedy_decoding(lm):
    sample = _Sample(_prompt(), needle=range(5, 10))
    result = kv_generate(lm, sample, KVSettings(policy="full"), max_new_tokens=8)
    assert result.tokens == trace(lm, sample, max_new_tokens=8).tokens.tolist()
    assert result.kept_kv == result.total_kv and result.kv_fraction == 1.0


def test_streaming_heads_with_a_window_over_everything_change_nothing(lm):
    sample = _Sample(_prompt(1))
    plain = kv_generate(lm, sample, KVSettings(policy="full"), max_new_tokens=6).tokens
    wide = kv_generate(lm, sample, KVSettings(policy="none", sink=0, recent=100), max_new_tokens=6)
    narrow = kv_generate(lm, sample, KVSettings(policy="none", sink=1, recent=2), max_new_tokens=6)
    assert wide.tokens == plain
    assert narrow.tokens != plain  # hiding most keys from every head changes the generation
    assert narrow.kept_kv[0] == 3 * 2 * 3  # 3 layers x 2 KV heads x (sink 1 + recent 2) tokens
    shared = prefill(lm, sample, 6)  # one prefill, reused by several policies, gives the same generations
    for settings, tokens in (
        (KVSettings(policy="none", sink=1, recent=2), narrow.tokens),
        (KVSettings(policy="full"), plain),
        (KVSettings(policy="none", sink=1, recent=2), narrow.tokens),
    ):
        assert kv_generate(lm, sample, settings, max_new_tokens=6, prefilled=shared).tokens == tokens


def test_static_and_random_keep_k_whole_kv_heads_and_count_kv_per_kv_head(lm):
    ranking = ((0, 0), (2, 1), (1, 1))  # KV heads (layer, KV head): 3 layers x 2 KV heads, G = 2
    k = kv_head_count(0.25, lm.num_layers, 2)  # 6 KV heads -> 2 (round half up)
    static = kv_generate(
        lm, _Sample(_prompt(2)), KVSettings(policy="static", budget=0.25, static_ranking=ranking), max_new_tokens=4
    )
    assert k == 2 and all(heads == list(ranking[:2]) for heads in static.kv_heads) and static.shortfall == 0
    assert query_heads(ranking[:2], 2) == [(0, 0), (0, 1), (2, 2), (2, 3)]  # every query head of a kept KV head
    length = 40
    assert kv_memory(list(ranking[:2]), lm, length, 4, 8) == 2 * length + 4 * 12
    assert static.fetched_kv == [0] * 4  # a static policy drops what it evicts: nothing to fetch
    random = kv_generate(
        lm, _Sample(_prompt(2)), KVSettings(policy="random", budget=0.25, seed=3, sink=1, recent=4), max_new_tokens=4
    )
    assert all(len(heads) == 2 for heads in random.kv_heads) and len({tuple(h) for h in random.kv_heads}) > 1
    # second tier: each step fetches the picked KV heads' keys beyond their resident window (sink 1 + recent 4)
    assert random.fetched_kv == [2 * (40 + step - 5) for step in range(4)]
    assert all(new <= every for new, every in zip(random.fetched_new_kv, random.fetched_kv, strict=True))


def test_every_kv_head_kept_whole_is_the_unmodified_model(lm):
    sample = _Sample(_prompt(4))
    every = tuple((layer, kv) for layer in range(3) for kv in range(2))
    whole = kv_generate(
        lm, sample, KVSettings(policy="static", budget=1.0, static_ranking=every, sink=1, recent=2), max_new_tokens=6
    )
    assert whole.tokens == kv_generate(lm, sample, KVSettings(policy="full"), max_new_tokens=6).tokens
    assert whole.kv_fraction == 1.0
    assert kv_token_bytes(lm) == 2 * 16 * 4  # key + value, head_dim 16, float32


def test_static_ranking_never_promotes_a_zero_score_head(lm):
    heads = RankedHeads(
        heads=((0, 3), (1, 0), (2, 1), (0, 0), (1, 3)),
        scores=(0.9, 0.5, 0.2, 0.0, 0.0),
        test_scores=None,
        format="wu",
        source="x",
    )
    ranking = kv_head_ranking(heads, 3, 4, 2)
    assert ranking == ((0, 1), (1, 0), (2, 0))  # (0, 0) and (1, 3) score 0: their KV heads are not ranked
    result = kv_generate(
        lm, _Sample(_prompt(5)), KVSettings(policy="static", budget=1.0, static_ranking=ranking), max_new_tokens=3
    )
    assert all(kept == list(ranking) for kept in result.kv_heads)
    assert result.budget_heads == 6 and result.shortfall == 3  # the budget beyond the scored heads is recorded


def test_true_policy_leaves_the_cache_as_a_single_pass_would(lm):
    sample = _Sample(_prompt(3), needle=range(2, 30))
    settings = KVSettings(policy="true", budget=1.0, sink=1, recent=2, static_ranking=EVERY_KV_HEAD)
    result = kv_generate(lm, sample, settings, max_new_tokens=5)
    assert all(len(heads) <= lm.num_layers * 2 for heads in result.kv_heads)
    assert len(result.kv_heads) == len(result.dynamic) == 5


def test_every_policy_holds_the_budget_on_the_same_prompt(lm):
    """oracle and true fill the budget beyond their step's D_t in static order: at one budget every policy keeps k
    KV heads, so every step holds the same resident KV."""
    sample = _Sample(_prompt(6, 48), needle=range(2, 40))
    ranking = EVERY_KV_HEAD[::-1]
    held = {}
    for policy in ("static", "random", "oracle", "true"):
        settings = KVSettings(policy=policy, budget=0.5, sink=1, recent=4, static_ranking=ranking, seed=2)
        result = kv_generate(lm, sample, settings, max_new_tokens=6)
        assert result.budget_heads == 3 and result.shortfall == 0
        assert all(len(set(heads)) == 3 for heads in result.kv_heads)
        held[policy] = result.kept_kv
    steps = min(len(kept) for kept in held.values())
    assert steps > 1 and len({tuple(kept[:steps]) for kept in held.values()}) == 1


@pytest.mark.parametrize("policy", ["oracle", "true"])
def test_oracle_and_true_keep_their_step_heads_first_and_fill_in_static_order(policy):
    dynamic = [(2, 3), (0, 1), (2, 2)]  # query heads, G = 2: KV heads (2, 1), (0, 0)
    static = ((0, 0), (1, 1), (2, 0), (1, 0))

    def chosen(k: int) -> list:
        inputs = PolicyInputs(
            k=k,
            every=EVERY_KV_HEAD,
            groups=2,
            static_ranking=static,
            previous_dynamic=dynamic if policy == "oracle" else [],
            clean_dynamic=dynamic if policy == "true" else None,
            probe_scores=None,
            probe_threshold=None,
            probe_select="top",
            rng=np.random.default_rng(0),
        )
        return KV_POLICIES.get(policy).choose(inputs)

    assert chosen(4) == [(2, 1), (0, 0), (1, 1), (2, 0)]  # D_t's KV heads, then the static list without (0, 0)
    assert chosen(1) == [(2, 1)]  # a budget below D_t keeps its best heads
    assert chosen(6) == [(2, 1), (0, 0), (1, 1), (2, 0), (1, 0)]  # short where the static list runs out
    assert KV_POLICIES.get(policy).needs_static


@pytest.mark.parametrize("policy", ["full", "none", "static", "random", "oracle", "true"])
def test_a_batch_of_four_equals_batch_one(lm, policy):
    """Four prompts of different lengths decoded as one batch under a policy (per-row streaming masks, the oracle
    policies' reruns, rows ending at their own step) give each prompt's batch-1 result; one prefill per prompt
    serves both."""
    samples = [
        _Sample(_prompt(seed, length), needle=range(2, length - 8))
        for seed, length in ((11, 40), (12, 52), (13, 33), (14, 47))
    ]
    ranking = EVERY_KV_HEAD[::-1]
    settings = KVSettings(policy=policy, budget=0.5, sink=1, recent=4, static_ranking=ranking, seed=5)
    shared = [prefill(lm, sample, 6) for sample in samples]
    alone = [
        kv_generate(lm, sample, settings, max_new_tokens=6, prefilled=one)
        for sample, one in zip(samples, shared, strict=True)
    ]
    together = kv_generate_batch(lm, shared, settings, max_new_tokens=6)
    for one, batched in zip(alone, together, strict=True):
        assert batched.tokens == one.tokens and batched.stop_reason == one.stop_reason
        assert batched.kv_heads == one.kv_heads and batched.kept_kv == one.kept_kv
        assert batched.fetched_kv == one.fetched_kv and batched.dynamic == one.dynamic


def test_bad_settings_are_refused(lm):
    with pytest.raises(DynheadsError, match="unknown KV policy"):
        kv_generate(lm, _Sample(_prompt()), KVSettings(policy="sometimes"), max_new_tokens=2)
    with pytest.raises(DynheadsError, match="static head list"):
        kv_generate(lm, _Sample(_prompt()), KVSettings(policy="static"), max_new_tokens=2)
    with pytest.raises(DynheadsError, match="trained head predictor"):
        kv_generate(lm, _Sample(_prompt()), KVSettings(policy="probe"), max_new_tokens=2)
    with pytest.raises(DynheadsError, match="fraction of KV heads"):
        kv_generate(lm, _Sample(_prompt()), KVSettings(policy="random", budget=0.0), max_new_tokens=2)
    with pytest.raises(DynheadsError, match="needs a trained probe"):
        KVConfig(policies=("probe",)).arms()


def test_precision_recall_pairs_step_t_predictions_with_step_t_plus_1():
    records = [
        {
            "policy": "full",
            "dynamic": [[0], [1], [1]],
            "probe_scores": [[0.1, 0.9, 0.0], [0.2, 0.8, 0.0], [0.9, 0.0, 0.0]],
        }
    ]
    pr = probe_precision_recall(records, {"probe_threshold": 0.5, "heads_per_budget": {"0.34": 1}})
    rows = pr["predictors"]
    assert pr["step_pairs"] == 2
    assert rows["probe(h_t) > 0.500"] == {"precision": 1.0, "recall": 1.0, "predicted_per_step": 1.0}
    assert rows["previous D_t (D_t itself)"]["precision"] == 0.5


def test_kv_head_matrix_and_duo_attention_files(tmp_path):
    heads = RankedHeads(
        heads=((0, 3), (1, 0), (0, 2)), scores=(0.9, 0.5, 0.1), test_scores=None, format="wu", source="x"
    )
    scores = query_head_scores(heads, 2, 4)
    assert scores[0, 3] == 0.9 and scores[1, 1] == 0.0
    np.testing.assert_allclose(kv_head_matrix(scores, 2, "max"), [[0.0, 0.9], [0.5, 0.0]])
    np.testing.assert_allclose(kv_head_matrix(scores, 2, "mean"), [[0.0, 0.5], [0.25, 0.0]])
    with pytest.raises(DynheadsError, match="cannot be grouped"):
        kv_head_matrix(scores, 3)
    write_duo_attention(
        tmp_path, kv_head_matrix(scores, 2), sink=4, recent=64, aggregation="max", source="x", num_heads=4
    )
    assert (tmp_path / "full_attention_heads.tsv").read_text() == "0\t1\n0.555556\t0\n"  # / max: in [0, 1]
    config = read_json(tmp_path / "config.json")
    assert (config["sink_size"], config["recent_size"], config["aggregation"]) == (4, 64, "max")
    assert config["raw_max"] == 0.9 and "normalised to [0, 1]" in config["values"]
    write_duo_attention(tmp_path / "default", kv_head_matrix(scores, 2), aggregation="max", source="x", num_heads=4)
    assert read_json(tmp_path / "default" / "config.json")["sink_size"] == 128  # DuoAttention's windows
    assert read_json(tmp_path / "default" / "config.json")["recent_size"] == 256


def _duo_attention_sparsify(heads: np.ndarray, sparsity: float, seed: int) -> np.ndarray:
    """What DuoAttention's loader does with a pattern and a sparsity: tiny noise, then the sparsity quantile."""
    noisy = heads + np.random.default_rng(seed).uniform(0, 1e-6, heads.shape)
    return (noisy >= np.quantile(noisy, sparsity)).astype(float)


@pytest.mark.parametrize("full_heads", [1, 2, 3, 5])
def test_thresholded_export_never_lists_a_zero_score_head_as_full(tmp_path, full_heads):
    matrix = np.zeros((4, 3))  # 12 KV heads, 3 with a positive score
    matrix[0, 2], matrix[2, 1], matrix[3, 0] = 0.9, 0.4, 0.4
    write_duo_attention(tmp_path, matrix, aggregation="max", source="x", num_heads=6, full_heads=full_heads)
    pattern = np.loadtxt(tmp_path / "full_attention_heads.tsv", delimiter="\t")
    config = read_json(tmp_path / "config.json")
    assert set(np.unique(pattern)) <= {0.0, 1.0} and not (pattern[matrix == 0]).any()
    assert pattern.sum() == config["full_kv_heads"] == min(full_heads, 3)
    assert config["shortfall"] == max(0, full_heads - 3)
    if full_heads <= 3:  # ties (2, 1) / (3, 0) at 0.4 go to the lower (layer, KV head)
        assert pattern[0, 2] == 1 and (full_heads < 2 or pattern[2, 1] == 1)
    for seed in range(5):  # DuoAttention's own sparsity mode selects exactly the exported heads
        np.testing.assert_array_equal(_duo_attention_sparsify(pattern, config["duo_attention_sparsity"], seed), pattern)


def test_kv_export_help_keeps_its_brackets():
    from typer.testing import CliRunner

    from dynheads.cli.app import app, register_commands

    register_commands()
    result = CliRunner().invoke(app, ["kv-export", "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert result.exit_code == 0 and "[layers x kv_heads]" in result.output


def test_run_kv_end_to_end_on_the_embedded_model(tmp_path, embedded, monkeypatch):
    from dynheads import distributed
    from dynheads.experiments.kv import run_kv

    static_run = RunDir(tmp_path / "static")  # a static list fitted on one (fake) sample of another stream
    static_run.start("static", {"seed": 0}, None)
    static_run.save_sample({"sample_id": "static-x", "seed": 1, "answer": "not-an-evaluation-uuid"})
    (tmp_path / "static" / "list.json").write_text('["18-6", "17-3", "17-4"]')
    config = KVConfig(
        policies=("full", "none", "static"),
        budgets=(0.01,),
        lengths=(200,),
        depths=(0.5,),
        runs=2,
        max_new_tokens=6,
        static=str(tmp_path / "static" / "list.json"),
    )
    monkeypatch.setattr(distributed, "barrier", lambda: None)  # the two ranks run one after the other here
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (1, 0):  # two launcher ranks fill one run directory; rank 0 writes the tables from all records
        monkeypatch.setenv("RANK", str(rank))
        run = run_kv(config, tmp_path / "kv", lm=embedded, progress=False)
        assert len(run.records()) == 3 * (2 - rank)  # rank 1 decodes every policy of one sample, rank 0 the other
        assert (run.path / "table.csv").is_file() == (rank == 0)
    table = read_json(run.manifest_path)
    assert table["fit_samples"]["static"]["samples"][0]["sample_id"] == "static-x"
    assert [e["sample_id"] for e in table["evaluation_samples"]] == [
        "analysis-len200-depth0.5-run0",
        "analysis-len200-depth0.5-run1",
    ]
    assert len(run.records()) == 2 * 3
    import pandas as pd

    frame = pd.read_csv(run.path / "table.csv")
    assert set(frame["policy"]) == {"full", "none", "static"} and (frame["samples"] == 2).all()
    static_row = frame[frame["policy"] == "static"].iloc[0]
    assert static_row["kv_heads"] == 1 and 0 < static_row["kv_fraction"] < 1  # 1 % of 90 KV heads -> 1
    assert static_row["accuracy_low"] <= static_row["accuracy"] <= static_row["accuracy_high"]
    assert frame[frame["policy"] == "full"].iloc[0]["kv_fraction"] == 1.0
    assert (run.path / "plots" / "kv-accuracy.png").is_file()


def _comparable(records):
    """Records without what depends on when they were made."""
    return sorted(
        ({k: v for k, v in r.items() if k not in ("seconds", "created", "time")} for r in records),
        key=lambda r: r["sample_id"],
    )


def test_kv_batch_size_four_equals_batch_one(tiny_model_dir, tmp_path):
    """``dynheads kv --batch-size 4``: every policy decodes four samples as one batch; the records equal batch 1's."""
    from dynheads.experiments.kv import run_kv
    from dynheads.models import load_model

    lm = load_model(tiny_model_dir)
    static_run = RunDir(tmp_path / "static")  # true fills its budget from a static list, fitted on another stream
    static_run.start("static", {"seed": 0}, None)
    static_run.save_sample({"sample_id": "static-x", "seed": 1, "answer": "not-an-evaluation-uuid"})
    (tmp_path / "static" / "list.json").write_text('["2-3", "0-0", "1-2"]')
    config = KVConfig(
        model=str(tiny_model_dir),
        static=str(tmp_path / "static" / "list.json"),
        policies=("full", "none", "random", "true"),
        budgets=(0.25, 0.5),
        lengths=(120, 160),
        depths=(0.5,),
        runs=2,
        max_new_tokens=4,
        sink=1,
        recent=8,
    )
    one = run_kv(config, tmp_path / "b1", lm=lm, progress=False)
    four = run_kv(config, tmp_path / "b4", lm=lm, progress=False, batch_size=4)
    assert len(one.records()) == 4 * (2 + 2 * 2)  # 4 samples x (full, none, random and true at 2 budgets)
    assert one.manifest()["chat_template_kwargs"] == PINNED_TEMPLATE_VARIABLES  # absent before
    assert _comparable(four.records()) == _comparable(one.records())


def test_the_pareto_front_keeps_the_points_nothing_beats():
    from dynheads.plots.kv import pareto_front

    resident = np.array([0.1, 0.1, 0.2, 0.3, 0.3, 1.0, 0.05])
    accuracy = np.array([0.2, 0.0, 0.2, 0.5, 0.5, 0.8, 0.0])
    # (0.1, 0.0) is beaten by (0.05, 0.0); (0.2, 0.2) by (0.1, 0.2); the two equal (0.3, 0.5) both stay
    assert pareto_front(resident, accuracy).tolist() == [True, False, False, True, True, True, True]


def test_tied_points_are_drawn_apart_and_the_others_where_they_are():
    from dynheads.plots.kv import dodge_ties

    resident = np.array([0.125, 0.1251, 0.125, 0.25, 0.5, 0.125])
    accuracy = np.array([0.9, 0.9, 0.5, 0.9, 1.0, 0.9])
    drawn = dodge_ties(resident, accuracy)
    tied = drawn[[0, 1, 5]]
    # the three ties (0.9 at ~1/8) sit apart, in the order given, around their mean on the log axis
    assert tied[0] < tied[1] < tied[2]
    assert np.log(tied).mean() == pytest.approx(np.log(resident[[0, 1, 5]]).mean())
    assert np.diff(np.log(tied)) == pytest.approx([0.04, 0.04])
    # a point with another accuracy, or far enough along the axis, keeps its measured resident KV
    assert drawn[[2, 3, 4]].tolist() == [0.125, 0.25, 0.5]


def test_kv_runs_a_question_task_and_judges_it_by_the_tasks_first_metric(tiny_model_dir, tmp_path):
    """``dynheads kv --task variable_tracking``: RULER's samples (a question stream over the grid), judged by its
    score; the table's accuracy is the task's first metric (string match), its other metrics keep their names."""
    import pandas as pd

    from dynheads.experiments.kv import run_kv
    from dynheads.models import load_model
    from dynheads.views.kv_tables import write_kv_tables

    lm = load_model(tiny_model_dir)
    config = KVConfig(
        model=str(tiny_model_dir),
        task="variable_tracking",
        data="variable_tracking:hops=1,chains=2",
        questions=2,
        lengths=(250,),
        depths=(0.5,),
        policies=("full", "none", "random"),
        budgets=(0.5,),
        max_new_tokens=3,
        sink=1,
        recent=8,
    )
    run = run_kv(config, tmp_path / "vt", lm=lm, progress=False)
    records = run.records()
    assert len(records) == 2 * 3 and all({"string_match", "em", "f1"} <= set(r["metrics"]) for r in records)
    manifest = run.manifest()
    assert len(manifest["questions"]["ids"]) == 2 and manifest["config"]["task"] == "variable_tracking"
    questions = sorted({r["record_id"] for r in records})
    assert questions == manifest["evaluation_questions"] == sorted(manifest["questions"]["ids"])
    # one sample made right under `full`: the table's accuracy follows string match, EM stays its own column
    record = next(r for r in records if r["policy"] == "full")
    run.save_sample({**record, "metrics": {**record["metrics"], "string_match": 1.0, "em": 0.0}})
    table = write_kv_tables(run).set_index("policy")
    assert table.loc["full", "accuracy"] == 0.5 and table.loc["full", "em"] == 0.0 and "rouge_l" not in table
    assert (
        table.loc["none", "accuracy"]
        == pd.read_csv(run.path / "results.csv").query("policy == 'none'")["metrics.string_match"].mean()
    )
    summary = (run.path / "summary.md").read_text()
    assert "accuracy = string match" in summary and "| EM | F1 |" in summary


def test_kv_on_your_own_records_judges_by_recall_not_exact_match(tiny_model_dir, tmp_path):
    """A chat model answers in sentences: ``kv --task custom``'s accuracy is recall (the answer inside the reply)."""
    from dynheads.experiments.kv import run_kv
    from dynheads.models import load_model
    from dynheads.views.kv_tables import write_kv_tables

    config = KVConfig(
        model=str(tiny_model_dir),
        task="custom",
        data="docs/examples/custom.jsonl",
        questions=2,
        lengths=(250,),
        depths=(0.5,),
        policies=("full", "none"),
        budgets=(0.5,),
        max_new_tokens=2,
        sink=1,
        recent=8,
    )
    run = run_kv(config, tmp_path / "custom", lm=load_model(tiny_model_dir), progress=False)
    record = next(r for r in run.records() if r["policy"] == "full")
    run.save_sample({**record, "metrics": {**record["metrics"], "recall": 1.0, "em": 0.0}})
    table = write_kv_tables(run).set_index("policy")
    assert table.loc["full", "accuracy"] >= 0.5 and table.loc["full", "em"] == 0.0
    assert "accuracy = recall" in (run.path / "summary.md").read_text()


def test_an_unknown_kv_task_is_refused_before_a_model_loads(tmp_path):
    from dynheads.experiments.kv import run_kv

    with pytest.raises(DynheadsError, match="unknown task 'nope'"):
        run_kv(KVConfig(task="nope", policies=("full",), model="/no/such/model"), tmp_path / "kv", progress=False)


@pytest.mark.parametrize("listing", ['{"2-3": [0.9, 0.5], "0-0": [0.2], "1-2": [0.0]}', '["2-3", "0-0", "1-2"]'])
def test_an_outside_head_list_needs_outside_heads_and_the_run_says_it_was_not_checked(
    tiny_model_dir, tmp_path, listing
):
    """A published list (Wu et al. JSON or a ranked list) with no run beside it: refused with the way out named;
    with ``--outside-heads`` it runs, and the manifest and summary say its disjointness was not checked."""
    from dynheads.experiments.kv import run_kv
    from dynheads.models import load_model

    lm = load_model(tiny_model_dir)
    (tmp_path / "published").mkdir()
    heads = tmp_path / "published" / "heads.json"
    heads.write_text(listing)
    settings = dict(
        model=str(tiny_model_dir),
        static=str(heads),
        policies=("full", "static"),
        budgets=(0.5,),
        lengths=(120,),
        depths=(0.5,),
        runs=1,
        max_new_tokens=2,
        sink=1,
        recent=8,
    )
    with pytest.raises(DynheadsError, match="cannot tell which samples.*pass --outside-heads"):
        run_kv(KVConfig(**settings), tmp_path / "refused", lm=lm, progress=False)
    run = run_kv(KVConfig(**settings, outside_heads=True), tmp_path / "kv", lm=lm, progress=False)
    manifest = run.manifest()
    assert manifest["config"]["outside_heads"] is True
    assert manifest["fit_samples"]["static"]["checked"].startswith("unknown")
    assert "not checked for disjointness" in (run.path / "summary.md").read_text()
    assert {r["policy"] for r in run.records()} == {"full", "static"}


def test_outside_heads_without_a_static_list_is_refused_before_a_model_loads(tmp_path):
    from dynheads.experiments.kv import run_kv

    with pytest.raises(DynheadsError, match="--outside-heads accepts a --static head list"):
        run_kv(KVConfig(policies=("full",), outside_heads=True, model="/no/such/model"), tmp_path / "kv")


def test_each_dynheads_press_is_paired_with_the_best_kvpress_press_at_its_size():
    """presses.csv: at each ratio, every press dynheads builds minus the kvpress press with the highest accuracy
    there (snapkv at 0.5, knorm at 0.875), over the samples both finished, with a bounded paired interval."""
    import pandas as pd

    from dynheads.analysis.evidence import EvidenceSettings
    from dynheads.tables import to_markdown
    from dynheads.views.kv_tables import is_kvpress_own, press_blocks, press_comparison

    accuracy = {  # per (press, ratio): four samples' 0/1 scores
        ("kvpress:snapkv", 0.5): [1, 1, 1, 0],
        ("kvpress:knorm", 0.5): [1, 0, 0, 0],
        ("kvpress:head_spans", 0.5): [1, 1, 1, 1],
        ("kvpress:snapkv", 0.875): [0, 0, 0, 0],
        ("kvpress:knorm", 0.875): [1, 0, 0, 0],
        ("kvpress:head_spans", 0.875): [1, 1, 0, 0],
        ("full", None): [1, 1, 1, 1],
    }
    frame = pd.DataFrame(
        [
            {"policy": p, "ratio": r, "budget": 1.0 if r is None else 1 - r, "grid_sample_id": f"s{i}", "accuracy": a}
            for (p, r), scores in accuracy.items()
            for i, a in enumerate(scores)
        ]
    )
    assert is_kvpress_own("kvpress:snapkv") and not is_kvpress_own("kvpress:head_spans") and not is_kvpress_own("full")
    # kvpress's presses composed at kvpress's defaults are kvpress's methods; the span ablation is dynheads'
    assert is_kvpress_own("kvpress:chunkkv") and is_kvpress_own("kvpress:adakv_snapkv")
    assert not is_kvpress_own("kvpress:snapkv_spans") and not is_kvpress_own("kvpress:duo_attention")
    versus = press_comparison(frame, EvidenceSettings(resamples=200)).set_index("ratio")
    assert list(versus["best_kvpress"]) == ["kvpress:knorm", "kvpress:snapkv"]  # 0.875 (budget 0.125) first
    assert list(versus["best_kvpress_ties"]) == [1, 1]
    tied = frame[~frame["policy"].eq("kvpress:knorm")].assign(accuracy=0)  # every press fails: a tie
    tied_versus = press_comparison(tied, EvidenceSettings(resamples=200))
    assert list(tied_versus["best_kvpress_ties"]) == [1, 1]  # one kvpress press left: no tie
    tied = frame.assign(accuracy=0)
    tied_versus = press_comparison(tied, EvidenceSettings(resamples=200))
    assert list(tied_versus["best_kvpress_ties"]) == [2, 2] and set(tied_versus["best_kvpress"]) == {"kvpress:snapkv"}
    assert "kvpress:snapkv (first of 2 tied)" in to_markdown(press_blocks(tied_versus, "question-free")[1])
    assert versus.loc[0.5, "difference"] == pytest.approx(0.25) and versus.loc[0.875, "difference"] == 0.25
    assert (versus["samples"] == 4).all() and (versus["difference_low"] >= -1).all()
    assert (versus["difference_high"] <= 1).all()
    assert press_comparison(frame[~frame["policy"].eq("kvpress:head_spans")], EvidenceSettings()) is None
