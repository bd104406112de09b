"""Figure 1 heat map: head selection, token labels, and the PNG it writes."""

import numpy as np
import pytest
from matplotlib.image import imread

from dynheads.errors import DynheadsError
from dynheads.plots.heads import head_dynamics_figure, most_varying_heads, plot_head_dynamics, token_label

# [step=4, layer=2, head=2]. Variance over steps: (0,0) constant -> 0; (0,1) 1,0,1,0 -> .25;
# (1,0) 1,1,0,0 -> .25 (tied with (0,1)); (1,1) 1,0,0,0 -> .1875.
SCORES = np.zeros((4, 2, 2), dtype=bool)
SCORES[[0, 2], 0, 1] = True
SCORES[[0, 1], 1, 0] = True
SCORES[0, 1, 1] = True
TOKENS = ["The", " magic", "\n", "$"]


def test_most_varying_heads_breaks_ties_by_layer_then_head():
    assert most_varying_heads(SCORES, 2) == [(0, 1), (1, 0)]
    assert most_varying_heads(SCORES, 3) == [(0, 1), (1, 0), (1, 1)]
    assert most_varying_heads(SCORES, 99) == [(0, 1), (1, 0), (1, 1), (0, 0)]  # capped at L*H


def test_token_labels_make_whitespace_visible():
    assert token_label(" the") == "␣the"
    assert token_label("\n\n") == "\\n\\n"
    assert token_label("") == "∅"
    assert token_label("$5") == r"\$5"  # a bare "$" would switch matplotlib to mathtext
    long = token_label("x" * 30)
    assert len(long) == 12 and long.endswith("…")


def test_binary_scores_get_a_legend_and_rows_in_layer_order():
    figure, heads = head_dynamics_figure(SCORES, TOKENS, top=3)
    axes = figure.axes
    assert len(axes) == 1 and axes[0].get_legend() is not None  # no colour bar
    assert heads == [(0, 1), (1, 0), (1, 1)]
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["L0-H1", "L1-H0", "L1-H1"]
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["The", "␣magic", "\\n", r"\$"]
    np.testing.assert_array_equal(axes[0].images[0].get_array(), [[1, 0, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])


def test_continuous_scores_get_a_colour_bar():
    scores = SCORES * 0.5 + 0.1  # Eq. 2-like values, not 0/1
    figure, _ = head_dynamics_figure(scores, TOKENS, top=2, title="sample 7")
    assert len(figure.axes) == 2 and figure.axes[0].get_legend() is None
    assert figure.axes[0].get_title() == "sample 7"
    # 0/1 floats count as binary unless told otherwise.
    assert len(head_dynamics_figure(SCORES.astype(float), TOKENS)[0].axes) == 1
    assert len(head_dynamics_figure(SCORES.astype(float), TOKENS, binary=False)[0].axes) == 2


def test_figure_widens_with_steps_and_thins_labels_past_the_cap():
    short = head_dynamics_figure(SCORES, TOKENS)[0].get_size_inches()[0]
    many = np.tile(SCORES, (15, 1, 1))  # 60 steps: every one still labelled
    figure60 = head_dynamics_figure(many, [f"t{i}" for i in range(60)])[0]
    assert figure60.get_size_inches()[0] > short
    assert len(figure60.axes[0].get_xticklabels()) == 60
    huge = np.tile(SCORES, (100, 1, 1))  # 400 steps: width capped, every n-th step labelled
    figure400 = head_dynamics_figure(huge, [f"t{i}" for i in range(400)])[0]
    assert figure400.get_size_inches()[0] == 40.0
    assert 100 < len(figure400.axes[0].get_xticklabels()) < 400


def test_png_is_written_atomically(tmp_path):
    path = tmp_path / "plots" / "heads.png"
    heads = plot_head_dynamics(SCORES, TOKENS, path, top=2)
    assert heads == [(0, 1), (1, 0)]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = imread(path).shape
    assert width > height > 100
    assert [p.name for p in path.parent.iterdir()] == ["heads.png"]  # no temporary file left behind


@pytest.mark.parametrize(
    ("scores", "labels", "top", "message"),
    [
        (SCORES, TOKENS[:3], 10, "3 token labels for 4 steps"),
        (np.zeros((0, 2, 2)), [], 10, "at least one step"),
        (SCORES[0], TOKENS, 10, "at least one step"),
        (SCORES, TOKENS, 0, "top must be at least 1"),
        (SCORES, np.arange(4), 10, "token_labels are the generated tokens' texts .*not trace.tokens"),
        (type("Trace", (), {"token_texts": TOKENS})(), TOKENS, 10, "not a trace: pass trace.copy_scores"),
    ],
)
def test_bad_input_is_refused(tmp_path, scores, labels, top, message):
    with pytest.raises(DynheadsError, match=message):
        plot_head_dynamics(scores, labels, tmp_path / "x.png", top=top)
    assert not (tmp_path / "x.png").exists()


def test_a_signed_score_gets_a_diverging_scale_centred_on_zero_and_its_own_name():
    """The write score (logits, negative where a head writes against the token) was drawn on the one-sided 'Blues'
    map under 'retrieval score': its negative cells looked like zeros."""
    writes = SCORES * 3.0 - 1.0  # values -1 and 2
    figure, _ = head_dynamics_figure(writes, TOKENS, top=2, scale_label="write score")
    image, bar = figure.axes[0].images[0], figure.axes[1]
    assert image.get_cmap().name == "RdBu_r" and image.get_clim() == (-2.0, 2.0)
    assert bar.get_ylabel() == "write score"
    shares = head_dynamics_figure(SCORES * 0.5 + 0.1, TOKENS, top=2)[0]  # Eq. 2-like: one-sided, as before
    assert shares.axes[0].images[0].get_cmap().name == "Blues" and shares.axes[1].get_ylabel() == "retrieval score"


def test_plot_heads_names_the_plotted_score_on_its_scale(tmp_path, monkeypatch):
    from dynheads.runs import RunDir
    from dynheads.traces import Trace
    from dynheads.views import analyses

    rng = np.random.default_rng(0)
    head = rng.random((4, 2, 2)).astype(np.float32)
    trace = Trace(
        tokens=np.arange(4),
        token_texts=TOKENS,
        text="".join(TOKENS),
        argmax_pos=np.zeros((4, 2, 2), np.int32),
        needle_mass=head,
        scores={"copy": SCORES, "reasoning": head, "write": head - 0.5},
        max_prob=head,
        hidden=rng.random((4, 8)),
        prompt_length=10,
        stop_reason="eos",
    )
    run = RunDir(tmp_path / "run")
    run.start("niah", {"synthetic": True}, None)
    run.save_sample({"sample_id": "s0", "needle_positions": [1, 2]}, trace)
    seen = {}
    monkeypatch.setattr(analyses, "plot_head_dynamics", lambda *args, **kwargs: seen.update(kwargs))
    analyses.plot_heads(run.path, score="write", top=2)
    assert seen["scale_label"] == "write score"
