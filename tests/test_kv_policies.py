"""Adding a KV policy: one registered from this test file alone runs through the decoding loop, the KV experiment
(its jobs, checks, records and tables) and its figure, like the built-in ones."""

from __future__ import annotations

import matplotlib.text
import pandas as pd
import pytest
import torch
from zoo import NoTokenizer, tiny_model

from dynheads.errors import DynheadsError
from dynheads.experiments.kv import KVConfig, run_kv
from dynheads.kv.policies import KV_POLICIES, PolicyInputs, plot_style, retention_policy
from dynheads.kv.retention import KVSettings, kv_generate
from dynheads.models import LoadedModel, load_model
from dynheads.plots import kv as kv_plots
from dynheads.settings import KVFields
from dynheads.views.kv_tables import AT_CHANCE


@pytest.fixture
def first_layers():
    """A static policy: the first k KV heads in layer order."""

    @KV_POLICIES.register("first-layers", help="the first k KV heads in layer order")
    @retention_policy()
    def choose(inputs: PolicyInputs) -> list:
        return list(inputs.every[: inputs.k])

    yield "first-layers"
    KV_POLICIES.unregister("first-layers")


@pytest.fixture
def needs_list():
    KV_POLICIES.register("listed", retention_policy(needs_static=True)(lambda inputs: []), help="reads --static")
    yield "listed"
    KV_POLICIES.unregister("listed")


def _prompt(seed: int = 0, length: int = 40) -> list[int]:
    return torch.randint(3, 128, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


class _Sample:
    def __init__(self, ids):
        self.input_ids, self.needle_positions = ids, []


def test_a_registered_policy_picks_the_heads_of_every_decode_step(first_layers):
    lm = LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")
    result = kv_generate(
        lm, _Sample(_prompt()), KVSettings(policy=first_layers, budget=0.5, sink=1, recent=2), max_new_tokens=4
    )
    assert result.budget_heads == 3 and len(result.kv_heads) == 4  # 3 layers x 2 KV heads, half kept whole
    assert all(heads == [(0, 0), (0, 1), (1, 0)] for heads in result.kv_heads)
    assert result.fetched_kv == [0] * 4 and result.shortfall == 0  # not dynamic: nothing offloaded or fetched
    assert 0 < result.kv_fraction < 1


def test_a_registered_policy_is_offered_checked_and_styled(first_layers, needs_list):
    config = KVConfig(policies=(first_layers, "full"), budgets=(0.5, 0.25))
    assert [(arm.name, arm.budget) for arm in config.arms()] == [
        ("full", None),
        (first_layers, 0.25),
        (first_layers, 0.5),
    ]
    assert KV_POLICIES.help(first_layers) in [entry.help for entry in KV_POLICIES]
    assert plot_style(first_layers, 0).marker and plot_style("full", 0).colour == "k"  # nothing goes unstyled
    looks = {(plot_style(f"kvpress:p{i}", i).colour, plot_style(f"kvpress:p{i}", i).marker) for i in range(12)}
    assert len(looks) == 12  # a figure with many presses gives each its own colour and marker
    # ten presses in a row (a full KV table: index 5-14) get ten colours, none a built-in policy's and none grey
    colours = {plot_style(f"kvpress:p{i}", i).colour for i in range(5, 15)}
    built_in = {entry.value.style.colour for entry in KV_POLICIES if entry.value.style is not None}
    assert len(colours) == 10 and not colours & (built_in | {"C7", "0.6", "grey", "gray"})
    with pytest.raises(DynheadsError, match="the listed KV policy needs a static head list"):
        KVConfig(policies=(needs_list,)).arms()
    with pytest.raises(DynheadsError, match="the listed KV policy needs a static head list"):
        lm = LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")
        kv_generate(lm, _Sample(_prompt()), KVSettings(policy=needs_list), max_new_tokens=1)
    with pytest.raises(DynheadsError, match="unknown KV policy 'sometimes': use one of full, none, static"):
        kv_generate(lm, _Sample(_prompt()), KVSettings(policy="sometimes"), max_new_tokens=1)
    assert (
        "full, none, static, probe, oracle, true, random" in KVFields.__dataclass_fields__["policies"].metadata["help"]
    )


def test_a_registered_policy_runs_through_the_kv_experiment_and_its_figure(
    first_layers, tiny_model_dir, tmp_path, monkeypatch
):
    drawn = []
    save = kv_plots.save_png
    monkeypatch.setattr(kv_plots, "save_png", lambda figure, path: drawn.append(figure) or save(figure, path))
    config = KVConfig(
        model=str(tiny_model_dir),
        policies=("full", first_layers),
        budgets=(0.5,),
        lengths=(120,),
        depths=(0.5,),
        runs=1,
        max_new_tokens=3,
    )
    run = run_kv(config, tmp_path / "kv", lm=load_model(tiny_model_dir), progress=False)
    assert sorted(r["policy"] for r in run.records()) == ["first-layers", "full"]
    table = pd.read_csv(run.path / "table.csv")
    row = table[table["policy"] == first_layers].iloc[0]
    assert row["budget"] == 0.5 and row["samples"] == 1 and 0 < row["kv_fraction"] < 1
    assert row["offloaded_mb"] == 0  # a static policy drops what it evicts
    (legend,) = drawn[0].legends  # the accuracy panel's legend sits below both panels
    labels = [text.get_text() for text in legend.get_texts()]
    # every policy of the table is in the figure; one sample of a random model answers nothing, so its full cache is
    # not above chance (issue 59): no Pareto front is drawn and the title says why
    assert sorted(labels) == [first_layers, "full"]
    texts = [text.get_text() for text in drawn[0].findobj(matplotlib.text.Text)]
    assert any(AT_CHANCE in text for text in texts)
    assert (run.path / "plots" / "kv-accuracy.png").is_file()


def test_an_arm_is_its_name_resolved_once():
    """Issue 62 item 2: the KV runner reads what an arm is from its registered entry, never from its name: the
    reference cache, the second tier, whole heads, what it needs and where it decodes from."""
    from dynheads.kv.arms import KVArm, resolve_arms
    from dynheads.kv.press_registry import PressSpec

    arms = resolve_arms(("probe", "full", "static"), (0.5, 0.25), static_given=True, predictor_given=True)
    assert [(a.name, a.budget) for a in arms] == [
        ("full", None),
        ("static", 0.25),
        ("static", 0.5),
        ("probe", 0.25),
        ("probe", 0.5),
    ]
    full, static, probe = arms[0], arms[1], arms[3]
    assert full.reference and not static.reference and full.kv_budget == 1.0 and static.kv_budget == 0.25
    assert probe.dynamic and probe.needs_probe and not static.dynamic and static.needs_static
    assert static.record_id == "-static-b0.25" and full.record_id == "-full"
    assert all(a.whole_heads and a.decodes_from_prefill for a in arms)
    snapkv, duo = (
        KVArm("kvpress:snapkv", 0.1, press=PressSpec("snapkv")),
        KVArm("kvpress:duo", 0.1, press=PressSpec("duo_attention")),
    )
    predicted = KVArm("kvpress:head_tokens_predicted", 0.1, press=PressSpec("head_tokens_predicted"))
    assert not snapkv.whole_heads and duo.whole_heads  # a head-level press keeps whole KV heads
    assert not snapkv.decodes_from_prefill and predicted.decodes_from_prefill and predicted.needs_probe
    with pytest.raises(DynheadsError, match="KV budgets are fractions"):
        resolve_arms(("full",), (1.5,), static_given=False, predictor_given=False)
    with pytest.raises(DynheadsError, match="KV policy 'static' is given twice"):  # it was merged into one row
        resolve_arms(("full", "static", "static"), (0.5,), static_given=True, predictor_given=False)


def test_ratios_without_a_kvpress_press_are_refused_not_ignored():
    """``--ratios`` sizes the ``kvpress:`` presses only (the retention policies keep ``--budgets``): given with no
    press it changed nothing, and ``dynheads kv --policies full,static --ratios 0.5`` ran every budget as if unset."""
    from dynheads.kv.arms import resolve_arms

    with pytest.raises(DynheadsError, match=r"--ratios 0.5 sizes kvpress:<press> policies.*--budgets") as error:
        resolve_arms(("full", "static"), (0.1,), static_given=True, predictor_given=False, ratios=(0.5,))
    assert "\n" not in str(error.value)
    assert len(resolve_arms(("full", "static"), (0.1,), static_given=True, predictor_given=False)) == 2
