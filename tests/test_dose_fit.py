"""Claim 2's relative doses: multiples of the mean |D_t| on a fitting stream, resolved to heads per step."""

from __future__ import annotations

import numpy as np
import pytest
from test_thresholds import trace_with

from dynheads.errors import DynheadsError
from dynheads.experiments.dose_fit import fit_doses, relative_doses
from dynheads.runs import RunDir
from dynheads.traces import Trace


def copy_trace(active: np.ndarray) -> Trace:
    """A trace whose Eq. 1 sets are ``active`` (bool [step, layer, head]); Eq. 2 scores 0.5 where active."""
    trace = trace_with(np.where(active, 0.5, 0.0), np.full(active.shape[0], 0.01, np.float32))
    trace.scores["copy"] = active
    return trace


def fitting_run(path, sizes: list[list[int]], shape=(4, 5)) -> RunDir:
    """A traced run, one sample per list, each step with that many active heads."""
    run = RunDir(path)
    run.start("niah", {"seed": 0}, None)
    for i, steps in enumerate(sizes):
        active = np.zeros((len(steps), *shape), bool)
        for t, size in enumerate(steps):
            active[t].reshape(-1)[:size] = True
        run.save_sample({"sample_id": f"s{i}"}, copy_trace(active))
    return run


def test_doses_are_multiples_of_the_mean_set_size_on_the_fitting_stream(tmp_path):
    run = fitting_run(tmp_path / "static", [[2, 6, 4], [4, 4]])  # mean |D_t| 20 / 5 = 4
    fit = fit_doses([0.25, 0.5, 1.0, 1.5, 2.0], run.path, "copy")
    assert fit.mean_size == pytest.approx(4.0) and fit.fit_steps == 5
    assert fit.doses == [1, 2, 4, 6, 8] and sorted(fit.fit_samples) == ["s0", "s1"]
    # rounded, at least one head, at most every head (4 x 5 = 20), distinct
    assert fit_doses([0.01, 0.1, 10.0], run.path, "copy").doses == [1, 20]
    assert fit_doses([0.625, 0.875], run.path, "copy").doses == [3, 4]  # 2.5 and 3.5: half up, never to even
    # a continuous score decides D_t by the threshold it is evaluated with
    by_threshold = fit_doses([1.0], run.path, "reasoning", "0.4")
    assert by_threshold.doses == [4] and by_threshold.threshold == "0.4"  # recorded
    with pytest.raises(DynheadsError, match="no head is dynamic"):
        fit_doses([1.0], run.path, "reasoning", "0.6")
    with pytest.raises(DynheadsError, match="the reasoning score is continuous: .* need the threshold"):
        fit_doses([1.0], run.path, "reasoning")  # never a silent threshold of 0


def test_a_stream_without_dynamic_heads_or_a_bad_multiple_is_refused(tmp_path):
    empty = fitting_run(tmp_path / "empty", [[0, 0], [0]])
    with pytest.raises(DynheadsError, match="no head is dynamic at any step"):
        fit_doses([1.0], empty.path, "copy")
    run = fitting_run(tmp_path / "static", [[3, 3]])
    for multiples in ([], [0.0, 1.0], [-1.0]):
        with pytest.raises(DynheadsError, match="positive multiples"):
            fit_doses(multiples, run.path, "copy")


def test_a_preset_table_gets_its_doses_from_the_fit_and_cannot_give_both(tmp_path):
    run = fitting_run(tmp_path / "static", [[8, 8]])
    settings = {"lengths": (500,), "relative_doses": (0.5, 1.0)}
    fit = relative_doses(settings, run.path, "copy")
    assert settings == {"lengths": (500,), "doses": (4, 8)} and fit is not None and fit.doses == [4, 8]
    fixed = {"doses": (1, 2)}
    assert relative_doses(fixed, run.path, "copy") is None and fixed == {"doses": (1, 2)}
    with pytest.raises(DynheadsError, match="both doses and relative_doses"):
        relative_doses({"doses": (1,), "relative_doses": (1.0,)}, run.path, "copy")
