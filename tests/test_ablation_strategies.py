"""Adding an ablation strategy: one registered from this test file alone is decoded, checked, run in order by the
grid and drawn in its own heat-map panel, like the built-in ones."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from zoo import NoTokenizer, tiny_model

from dynheads.ablation.cascade import AblationSettings, ablated_generate
from dynheads.ablation.strategies import ABLATION_STRATEGIES, MaskInputs, ablation_strategy, panel_order
from dynheads.errors import DynheadsError
from dynheads.experiments.ablation import AblationConfig
from dynheads.models import LoadedModel
from dynheads.plots import ablation as ablation_plots


class _Sample:
    def __init__(self, ids, needle):
        self.input_ids, self.needle_positions = ids, needle


@pytest.fixture
def last_layer():
    """A matched control: as many heads as D_t, taken from the last layer."""

    @ABLATION_STRATEGIES.register("last-layer", help="mask heads of the last layer, as many as D_t")
    @ablation_strategy("last-layer heads masked", matched=True)
    def choose(inputs: MaskInputs) -> list:
        return [(inputs.num_layers - 1, head) for head in range(min(inputs.count, inputs.num_heads))]

    yield "last-layer"
    ABLATION_STRATEGIES.unregister("last-layer")


def test_a_registered_strategy_masks_the_heads_it_picks(last_layer):
    lm = LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")
    ids = torch.randint(3, 128, (24,), generator=torch.Generator().manual_seed(4)).tolist()
    result = ablated_generate(
        lm, _Sample(ids, list(range(4, 14))), AblationSettings(strategy=last_layer, matching="mean", count=2), 4
    )
    assert result.masked == [[(2, 0), (2, 1)]] * len(result.masked) and len(result.masked) >= 1
    with pytest.raises(DynheadsError, match="the last-layer strategy needs a head count"):
        ablated_generate(lm, _Sample(ids, []), AblationSettings(strategy=last_layer, matching="mean"), 2)


def test_a_registered_strategy_is_offered_run_in_order_and_drawn(last_layer, tmp_path, monkeypatch):
    config = AblationConfig(strategies=(last_layer, "static"), matching="mean", static="list.json")
    # none (baseline) always, dynamic for the mean-matched controls' count, then the registration order
    assert config.run_strategies() == ("none", "dynamic", "static", last_layer)
    with pytest.raises(
        DynheadsError,
        match="unknown ablation strategy 'bogus': use some of "
        "dynamic, static, static_outside, random, contrast, fixed, last-layer",
    ):
        AblationConfig(strategies=("bogus",)).run_strategies()
    assert panel_order()[-2:] == [last_layer, "none"]  # the baseline's panel last
    drawn = {}
    monkeypatch.setattr(ablation_plots, "plot_heatmaps", lambda panels, path, **kwargs: drawn.update(panels) or path)
    cells = pd.DataFrame(
        [
            {"strategy": s, "length": 100, "depth": 0.5, "accuracy": 1.0, "rouge_l": 1.0, "samples": 1}
            for s in ("none", "dynamic", last_layer, "retired")
        ]
    )
    ablation_plots.plot_ablation_cells(cells, tmp_path)
    assert list(drawn) == [
        "dynamic heads masked",
        "last-layer heads masked",
        "no masking (baseline)",
        "retired heads masked",
    ]  # no strategy of the cells is left out


def test_matchings_are_a_registry_read_by_the_settings_and_the_grid():
    from dynheads.ablation.strategies import MATCHINGS

    assert MATCHINGS.names() == ["per_step", "mean"]
    assert MATCHINGS.get("per_step").count([(0, 1), (2, 3)], None) == 2 and MATCHINGS.get("mean").count([], 3) == 3
    with pytest.raises(DynheadsError, match="unknown matching 'median': use one of per_step, mean"):
        AblationConfig(matching="median").check()
    assert AblationConfig(strategies=("random",), matching="per_step").run_strategies() == ("none", "random")
