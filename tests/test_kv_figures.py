"""The KV figures with kvpress rows (issue 60 item 8): no empty panel, no titles or labels running into each other,
no press drawn on top of another."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from dynheads.plots import ablation as ablation_plots
from dynheads.plots import kv as kv_plots

PRESSES = ("kvpress:snapkv", "kvpress:expected_attention", "kvpress:knorm")


@pytest.fixture
def figures(monkeypatch):
    """The figures the KV plots save, in order (and still written); the grid's heat maps are saved by the ablation
    plots'."""
    drawn = []
    for module in (kv_plots, ablation_plots):
        save = module.save_png
        monkeypatch.setattr(
            module, "save_png", lambda figure, path, save=save: drawn.append(figure) or save(figure, path)
        )
    return drawn


def _table(rows: list[tuple[str, float, float, float, float]]) -> pd.DataFrame:
    """table.csv's columns from (policy, budget, resident fraction, accuracy, MB moved per step) rows."""
    return pd.DataFrame(
        [
            dict(
                policy=policy,
                budget=budget,
                kv_fraction=fraction,
                accuracy=accuracy,
                accuracy_low=max(0.0, accuracy - 0.1),
                accuracy_high=min(1.0, accuracy + 0.1),
                offloaded_mb=10.0 * moved,
                moved_mb_per_step=moved,
            )
            for policy, budget, fraction, accuracy, moved in rows
        ]
    )


STATIC_AND_PRESS = [("full", 1.0, 1.0, 1.0, 0.0), ("static", 0.25, 0.3, 0.5, 0.0)] + [
    (press, 0.25, fraction, 0.5, 0.0) for press, fraction in zip(PRESSES, (0.25, 0.25, 0.26), strict=True)
]


def _has_data(axes) -> bool:
    return bool(axes.lines or axes.collections or axes.images)


def test_without_a_dynamic_policy_the_kv_figure_has_no_empty_moved_panel(figures, tmp_path):
    kv_plots.plot_kv_accuracy(_table(STATIC_AND_PRESS), tmp_path / "kv-accuracy.png", title="static and presses")
    (figure,) = figures
    assert len(figure.axes) == 1 and all(_has_data(axes) for axes in figure.axes)
    (legend,) = figure.legends
    assert {text.get_text() for text in legend.get_texts()} >= {"full", "static", *PRESSES}


def test_a_dynamic_policy_keeps_its_moved_panel(figures, tmp_path):
    rows = [*STATIC_AND_PRESS, ("true", 0.25, 0.25, 0.75, 1.5)]
    kv_plots.plot_kv_accuracy(_table(rows), tmp_path / "kv-accuracy.png")
    (figure,) = figures
    assert len(figure.axes) == 2 and all(_has_data(axes) for axes in figure.axes)
    assert figure.axes[1].get_ylabel() == "MB moved per step (second tier)"


def test_presses_at_almost_the_same_resident_kv_are_drawn_a_marker_apart(figures, tmp_path):
    kv_plots.plot_kv_accuracy(_table(STATIC_AND_PRESS), tmp_path / "kv-accuracy.png")
    (figure,) = figures
    centres = {}
    for container in figure.axes[0].containers:  # one errorbar per policy: its line holds the drawn points
        centres[container.get_label()] = container.lines[0].get_xdata()[0]
    drawn = np.log(sorted(centres[press] for press in PRESSES))
    # 0.25, 0.25 and 0.26 at one accuracy: before, the first two coincided and the third sat within a marker
    assert np.diff(drawn) == pytest.approx([kv_plots.MARKER_WIDTH_LOG] * 2)


def _overlapping(texts) -> list[tuple[str, str]]:
    boxes = [(text.get_text(), text.get_window_extent()) for text in texts if text.get_text()]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2) if box_a.overlaps(box_b)]


def test_kv_grid_titles_and_labels_with_press_names_do_not_run_into_each_other(figures, tmp_path):
    cells = pd.DataFrame(
        [
            dict(policy=policy, budget=budget, context_tokens=1000, depth=depth, accuracy=0.5)
            for policy, budget in [("full", 1.0), ("static", 0.25), *((press, 0.25) for press in PRESSES)]
            for depth in (0.25, 0.75)
        ]
    )
    kv_plots.plot_kv_grid(cells, tmp_path / "kv-grid.png", title="NIAH accuracy per cell")
    (figure,) = figures
    FigureCanvasAgg(figure).draw()  # lay the figure out (constrained layout) on a real canvas, as when saved
    panels = [axes for axes in figure.axes if axes.images]
    assert len(panels) == 5 and all(_has_data(axes) for axes in panels)
    titles = [axes.title for axes in panels]
    labels = [axes.xaxis.label for axes in panels] + list(figure.texts)  # the figure's texts: its title, shared label
    assert _overlapping(titles + labels) == []
