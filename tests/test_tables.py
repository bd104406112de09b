"""The one table renderer: the same table as markdown and HTML, escaping, number formats, and stage summaries
written as markdown plus summary.json and read back (docs/formats.md, "summary.json")."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from dynheads.errors import DynheadsError
from dynheads.io import write_text
from dynheads.report import write_report
from dynheads.tables import Summary, Table, frame_table, read_summaries, to_html, to_markdown, write_summary

TABLE = Table(["model", "F1", "count", "note"], [["ours", 0.12345, 7, "a | b"], ["paper", None, 12, "<x> & y"]],
              formats={"F1": ".4f"})


def test_the_same_table_as_markdown_and_html():
    assert to_markdown(TABLE) == ("| model | F1 | count | note |\n|---|---|---|---|\n| ours | 0.1235 | 7 | a \\| b |\n"
                                  "| paper |  | 12 | <x> & y |")
    assert to_html(TABLE) == ("<table><tr><th>model</th><th>F1</th><th>count</th><th>note</th></tr>"
                              "<tr><td>ours</td><td>0.1235</td><td>7</td><td>a | b</td></tr>"
                              "<tr><td>paper</td><td></td><td>12</td><td>&lt;x&gt; &amp; y</td></tr></table>")


def test_escaping_of_headers_and_cells():
    table = Table(["mean |D_t|", "a\nb"], [["<script>", "line\nbreak"]])
    assert to_markdown(table).splitlines() == ["| mean \\|D_t\\| | a b |", "|---|---|", "| <script> | line break |"]
    assert "<th>mean |D_t|</th>" in to_html(table) and "&lt;script&gt;" in to_html(table)
    assert "<script>" not in to_html(table)


def test_number_formats():
    table = Table(["x", "y", "z"], [[1.0, 2, math.nan], [np.float64(0.5), np.int64(3), None], [True, "7.25", -0.0004]],
                  formats={"y": "03d"}, float_format=".2f", missing="n/a")
    assert table.cells() == [["1.00", "002", "n/a"], ["0.50", "003", "n/a"], ["True", "7.25", "-0.00"]]
    assert Table(["x"], [[1 / 3]]).cells() == [["0.333"]]  # floats default to 3 decimals, like the stage tables


def test_frame_table_formats_floats_and_keeps_ints_and_text():
    frame = pd.DataFrame({"strategy": pd.Categorical(["dynamic", "static"]), "records": [3, 4],
                          "accuracy": [0.5, math.nan]})
    table = frame_table(frame, {"strategy": "strategy", "records": "records", "accuracy": "acc"})
    assert table.columns == ["strategy", "records", "acc"]
    assert table.cells() == [["dynamic", "3", "0.500"], ["static", "4", "nan"]]
    assert all(type(row[1]) is int for row in table.rows)  # plain ints in summary.json, not numpy


def test_a_summary_is_written_as_markdown_and_data_and_reads_back(tmp_path):
    summary = Summary(["Some *text*.\nSecond line.", TABLE, "## Table 5", Table(["k"], [[5]])],
                      {"records": 4, "mean": 0.25}, "Per-step ablation: tiny")
    path = write_summary(tmp_path, "summary.md", summary)
    markdown = path.read_text(encoding="utf-8")
    assert markdown.startswith("# Per-step ablation: tiny\n\nSome *text*.\nSecond line.\n\n| model | F1 |")
    assert markdown.endswith("## Table 5\n\n| k |\n|---|\n| 5 |\n")
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["format"] == 1 and data["documents"]["summary.md"]["numbers"] == {"records": 4, "mean": 0.25}
    assert data["documents"]["summary.md"]["blocks"][1]["table"]["rows"][1][1] is None  # JSON has no NaN
    back = read_summaries(tmp_path)["summary.md"]
    assert back == summary and back.to_markdown() == markdown
    write_summary(tmp_path, "cca.md", Summary([Table(["offset"], [[0]])]))  # a second document of the folder
    assert list(read_summaries(tmp_path)) == ["cca.md", "summary.md"]


def test_nan_cells_round_trip_as_missing(tmp_path):
    write_summary(tmp_path, "x.md", Summary([Table(["v"], [[np.float64("nan")], [np.float32(0.5)]], missing="nan")]))
    assert (tmp_path / "x.md").read_text() == "| v |\n|---|\n| nan |\n| 0.500 |\n"
    assert "NaN" not in (tmp_path / "summary.json").read_text()
    assert read_summaries(tmp_path)["x.md"].to_markdown() == (tmp_path / "x.md").read_text()


def test_old_and_broken_summary_folders_are_one_line_errors(tmp_path):
    assert read_summaries(tmp_path) == {}  # no results at all: nothing to show, no error
    write_text(tmp_path / "stage" / "summary.md", "# old\n")
    with pytest.raises(DynheadsError, match="no summary.json: it was written by an older dynheads"):
        read_summaries(tmp_path / "stage")
    write_text(tmp_path / "bad" / "summary.json", "{not json")
    with pytest.raises(DynheadsError, match="not valid JSON"):
        read_summaries(tmp_path / "bad")
    write_text(tmp_path / "newer" / "summary.json", json.dumps({"format": 99, "documents": {}}))
    with pytest.raises(DynheadsError, match="99"):
        read_summaries(tmp_path / "newer")


def test_the_report_refuses_a_study_from_before_summary_json(tmp_path):
    write_text(tmp_path / "ablation" / "summary.md", "# Per-step ablation\n\n| strategy |\n|---|\n| dynamic |\n")
    with pytest.raises(DynheadsError, match=r"stage folder\(s\) ablation have markdown results but no summary.json"):
        write_report(tmp_path)


def test_the_report_renders_stage_tables_from_data_not_markdown(tmp_path):
    summary = Summary(["Means per strategy.", Table(["strategy", "mean |D_t|"], [["dynamic", 2.5]])],
                      title="Per-step ablation: tiny")
    write_summary(tmp_path / "ablation", "summary.md", summary)
    write_text(tmp_path / "ablation" / "summary.md", "stale text the report must not show\n")
    md_path, html_path = write_report(tmp_path)
    md, page = md_path.read_text(), html_path.read_text()
    assert "From `ablation/summary.md`:\n\n#### Per-step ablation: tiny\n\nMeans per strategy.\n\n" in md
    assert "| strategy | mean \\|D_t\\| |\n|---|---|\n| dynamic | 2.500 |" in md and "stale text" not in md
    assert "<h4>Per-step ablation: tiny</h4>" in page and "stale text" not in page
    assert to_html(Table(["strategy", "mean |D_t|"], [["dynamic", 2.5]])) in page


def test_a_long_table_is_collapsed_in_the_html(tmp_path):
    write_summary(tmp_path / "cca", "cca.md", Summary([Table(["offset"], [[k] for k in range(9)])]))
    page = write_report(tmp_path)[1].read_text()
    assert "<details><summary>Table of 9 rows (click to show)</summary><table><tr><th>offset</th></tr>" in page
