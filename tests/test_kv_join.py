"""``dynheads kv-join``: KV runs measured in pieces give the table one run of every arm gives, or a clear refusal."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pandas as pd
import pytest

from dynheads.errors import DynheadsError
from dynheads.experiments.kv import KVConfig, run_kv
from dynheads.io import read_json, write_json
from dynheads.views.kv_join import join_kv_runs


@pytest.fixture(scope="module")
def pieces(tiny_model_dir, tmp_path_factory):
    """One run of every arm, and the same arms measured in two pieces (``full`` in both)."""
    from dynheads.models import load_model

    lm = load_model(tiny_model_dir)
    root = tmp_path_factory.mktemp("kvjoin")
    base = KVConfig(
        model=str(tiny_model_dir),
        lengths=(120, 160),
        depths=(0.5,),
        runs=2,
        max_new_tokens=4,
        sink=1,
        recent=8,
        policies=("full", "none", "random"),
        budgets=(0.25, 0.5),
    )

    def run(name: str, **changes):
        return run_kv(dataclasses.replace(base, **changes), root / name, lm=lm, progress=False).path

    whole = run("whole")
    first = run("first", policies=("full", "none", "random"), budgets=(0.5,))
    second = run("second", policies=("full", "random"), budgets=(0.25,))
    other_length = run("other", lengths=(140,), policies=("full",))
    return root, whole, first, second, other_length


def test_joined_pieces_give_the_table_of_one_run_of_every_arm(pieces):
    root, whole, first, second, _ = pieces
    joined = join_kv_runs([first, second], root / "joined")
    mine = pd.read_csv(root / "joined" / "table.csv")
    reference = pd.read_csv(whole / "table.csv")
    pd.testing.assert_frame_equal(mine, reference)
    assert joined["samples"] == 4
    arms = {(a["policy"], a["budget"]): a for a in joined["arms"]}
    assert set(arms) == {("full", 1.0), ("none", 0.0), ("random", 0.5), ("random", 0.25)}
    assert arms[("random", 0.25)]["from"] == str(second)
    # measured by both runs: the first listed keeps its records, and the other's generations are checked against them
    assert arms[("full", 1.0)]["from"] == str(first) and arms[("full", 1.0)]["equal_generations"] == {str(second): 4}
    assert read_json(root / "joined" / "manifest.json")["kind"] == "kv-join"
    summary = (root / "joined" / "summary.md").read_text()
    assert "Joined from 2 KV runs" in summary and "full@1: 4 in" in summary
    assert (root / "joined" / "plots" / "kv-accuracy.png").is_file()


def test_paired_differences_are_the_mean_per_sample_difference_at_every_budget(pieces):
    root, _, first, second, _ = pieces
    joined = join_kv_runs([first, second], root / "paired", pairs=[("random", "full")])
    rows = joined["paired"]
    assert [row["budget"] for row in rows] == [0.25, 0.5] and all(row["samples"] == 4 for row in rows)
    results = pd.read_csv(root / "paired" / "results.csv")
    accuracy = results.set_index(["policy", "budget", "grid_sample_id"])["metrics.accuracy"]
    full = results[results["policy"] == "full"].set_index("grid_sample_id")["metrics.accuracy"]
    for row in rows:
        random = accuracy.xs(("random", row["budget"]), level=("policy", "budget"))
        assert row["difference"] == pytest.approx(float(np.mean(random - full.loc[random.index])))
        assert row["low"] <= row["difference"] <= row["high"]
    assert "random - full" in (root / "paired" / "summary.md").read_text()
    alone = join_kv_runs([first], root / "alone", pairs=[("random", "full")])  # one run: its table, paired rows
    assert pd.read_csv(root / "alone" / "table.csv").equals(pd.read_csv(first / "table.csv"))
    assert alone["paired"] == [row for row in rows if row["budget"] == 0.5]
    assert "The tables of the KV run" in (root / "alone" / "summary.md").read_text()
    with pytest.raises(DynheadsError, match="no budget has both arms"):
        join_kv_runs([first, second], root / "nopair", pairs=[("static", "full")])


def test_runs_of_other_samples_or_fits_are_refused(pieces, tmp_path):
    root, _, first, second, other_length = pieces
    with pytest.raises(DynheadsError, match="differ in"):
        join_kv_runs([first, other_length], tmp_path / "a")
    with pytest.raises(DynheadsError, match="one of the runs joined"):
        join_kv_runs([first, second], first)
    with pytest.raises(DynheadsError, match="holds a 'kv' run"):
        join_kv_runs([first], other_length)
    with pytest.raises(DynheadsError, match="given twice"):
        join_kv_runs([first, first], tmp_path / "twice")
    with pytest.raises(DynheadsError, match="needs a KV run folder"):
        join_kv_runs([], tmp_path / "b")
    with pytest.raises(DynheadsError, match="not a run folder"):
        join_kv_runs([first, tmp_path], tmp_path / "c")
    # the same samples, but one run read another static list: its static-based arms would be another policy
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    for copy, source, static in ((mine, first, "mine.json"), (theirs, second, "theirs.json")):
        shutil.copytree(source, copy)
        manifest = read_json(copy / "manifest.json")
        write_json(copy / "manifest.json", {**manifest, "config": {**manifest["config"], "static": static}})
    with pytest.raises(DynheadsError, match="different static settings"):
        join_kv_runs([mine, theirs], tmp_path / "d")


def test_a_run_from_before_a_library_was_recorded_joins_one_that_records_it(pieces, tmp_path):
    """Manifests record kvpress's and bm25s's versions since 2026-12-04: an older run's manifest lacks them, which
    is not a difference; a version both record and that differs still refuses the join."""
    _, _, first, second, _ = pieces

    def with_versions(copy, source, change):
        shutil.copytree(source, copy)
        manifest = read_json(copy / "manifest.json")
        write_json(copy / "manifest.json", {**manifest, "versions": change(dict(manifest["versions"]))})
        return copy

    older = with_versions(tmp_path / "older", first, lambda v: {k: x for k, x in v.items() if k != "kvpress"})
    newer = with_versions(tmp_path / "newer", second, lambda v: {**v, "kvpress": "0.5.5"})
    assert join_kv_runs([older, newer], tmp_path / "joined")["samples"] == 4
    other = with_versions(tmp_path / "other", second, lambda v: {**v, "torch": "0.0.1"})
    with pytest.raises(DynheadsError, match="differ in versions"):
        join_kv_runs([older, other], tmp_path / "refused")


def test_runs_that_read_one_list_at_two_paths_join_and_two_lists_do_not(pieces, tmp_path):
    """kv-join compares the checksum a manifest records of its head list, not the path it was given by."""
    _, _, first, second, _ = pieces

    def reading(copy, source, path, digest):
        shutil.copytree(source, copy)
        manifest = read_json(copy / "manifest.json")
        fitted = {**manifest["fit_samples"], "static": {"path": path} | ({"sha256": digest} if digest else {})}
        config = {**manifest["config"], "static": path}
        write_json(copy / "manifest.json", {**manifest, "config": config, "fit_samples": fitted})
        return copy

    a = reading(tmp_path / "a", first, "/runs/a/static_heads.json", "1" * 64)
    b = reading(tmp_path / "b", second, "/copy/static_heads.json", "1" * 64)
    assert join_kv_runs([a, b], tmp_path / "same")["samples"] == 4
    c = reading(tmp_path / "c", second, "/runs/a/static_heads.json", "2" * 64)
    with pytest.raises(DynheadsError, match="different static settings .sha256:111"):
        join_kv_runs([a, c], tmp_path / "other")
    # a run written before the checksum was recorded: compared by path, as given
    old = reading(tmp_path / "old", second, "/runs/a/static_heads.json", None)
    assert join_kv_runs([a, old], tmp_path / "old-same")["samples"] == 4
    moved = reading(tmp_path / "moved", second, "/copy/static_heads.json", None)
    with pytest.raises(DynheadsError, match="different static settings"):
        join_kv_runs([a, moved], tmp_path / "old-other")


def test_a_press_at_a_ratio_and_the_same_press_at_a_budgets_bytes_are_not_joined_as_one_arm(pieces, tmp_path):
    """A press at compression ratio r (``--ratios``) carries the kept share 1 - r as its budget, so ``kvpress:snapkv``
    at ratio 0.875 and at budget 0.125 (the static policy's bytes there: another cache) share one (policy, budget):
    the join kept one run's records and dropped the other's without a word. Refused in one line."""
    _, _, first, _, _ = pieces
    at_ratio = tmp_path / "at-ratio"
    shutil.copytree(first, at_ratio)
    for path in (at_ratio / "samples").glob("*.json"):
        record = read_json(path)
        if record["policy"] == "random":  # as a ratio press's record reads: its ratio beside the kept share
            write_json(path, {**record, "ratio": 1 - record["budget"]})
    with pytest.raises(DynheadsError, match=r"random at budget 0.5 .* at compression ratio 0.5") as error:
        join_kv_runs([first, at_ratio], tmp_path / "joined")
    assert "\n" not in str(error.value)
    assert join_kv_runs([at_ratio], tmp_path / "alone")["samples"] == 4  # one way of sizing: joins
