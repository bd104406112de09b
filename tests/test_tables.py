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
from dynheads.tables import (
    Heading,
    Items,
    Summary,
    Table,
    frame_table,
    read_summaries,
    to_html,
    to_markdown,
    write_summary,
)

TABLE = Table(
    ["model", "F1", "count", "note"],
    [["ours", 0.12345, 7, "a | b"], ["paper", None, 12, "<x> & y"]],
    formats={"F1": ".4f"},
)


def test_the_same_table_as_markdown_and_html():
    assert to_markdown(TABLE) == (
        "| model | F1 | count | note |\n|---|---|---|---|\n| ours | 0.1235 | 7 | a \\| b |\n| paper |  | 12 | <x> & y |"
    )
    assert to_html(TABLE) == (
        "<table><tr><th>model</th><th>F1</th><th>count</th><th>note</th></tr>"
        "<tr><td>ours</td><td>0.1235</td><td>7</td><td>a | b</td></tr>"
        "<tr><td>paper</td><td></td><td>12</td><td>&lt;x&gt; &amp; y</td></tr></table>"
    )


def test_escaping_of_headers_and_cells():
    table = Table(["mean |D_t|", "a\nb"], [["<script>", "line\nbreak"]])
    assert to_markdown(table).splitlines() == ["| mean \\|D_t\\| | a b |", "|---|---|", "| <script> | line break |"]
    assert "<th>mean |D_t|</th>" in to_html(table) and "&lt;script&gt;" in to_html(table)
    assert "<script>" not in to_html(table)


def test_number_formats():
    table = Table(
        ["x", "y", "z"],
        [[1.0, 2, math.nan], [np.float64(0.5), np.int64(3), None], [True, "7.25", -0.0004]],
        formats={"y": "03d"},
        float_format=".2f",
        missing="n/a",
    )
    assert table.cells() == [["1.00", "002", "n/a"], ["0.50", "003", "n/a"], ["True", "7.25", "-0.00"]]
    assert Table(["x"], [[1 / 3]]).cells() == [["0.333"]]  # floats default to 3 decimals, like the stage tables


def test_frame_table_formats_floats_and_keeps_ints_and_text():
    frame = pd.DataFrame(
        {"strategy": pd.Categorical(["dynamic", "static"]), "records": [3, 4], "accuracy": [0.5, math.nan]}
    )
    table = frame_table(frame, {"strategy": "strategy", "records": "records", "accuracy": "acc"})
    assert table.columns == ["strategy", "records", "acc"]
    assert table.cells() == [["dynamic", "3", "0.500"], ["static", "4", "nan"]]
    assert all(type(row[1]) is int for row in table.rows)  # plain ints in summary.json, not numpy


def test_a_summary_is_written_as_markdown_and_data_and_reads_back(tmp_path):
    summary = Summary(
        ["Some *text*.\nSecond line.", TABLE, Heading("Table 5"), Table(["k"], [[5]]), Items(["one", "two"])],
        {"records": 4, "mean": 0.25},
        "Per-step ablation: tiny",
    )
    path = write_summary(tmp_path, "summary.md", summary)
    markdown = path.read_text(encoding="utf-8")
    assert markdown.startswith("# Per-step ablation: tiny\n\nSome *text*.\nSecond line.\n\n| model | F1 |")
    assert markdown.endswith("## Table 5\n\n| k |\n|---|\n| 5 |\n\n- one\n- two\n")
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["format"] == 2 and data["documents"]["summary.md"]["numbers"] == {"records": 4, "mean": 0.25}
    assert data["documents"]["summary.md"]["blocks"][1]["table"]["rows"][1][1] is None  # JSON has no NaN
    assert data["documents"]["summary.md"]["blocks"][2:5:2] == [
        {"heading": "Table 5", "level": 2},
        {"items": ["one", "two"]},
    ]
    back = read_summaries(tmp_path)["summary.md"]
    assert back == summary and back.to_markdown() == markdown
    write_summary(tmp_path, "cca.md", Summary([Table(["offset"], [[0]])]))  # a second document of the folder
    assert list(read_summaries(tmp_path)) == ["cca.md", "summary.md"]


def test_a_version_1_summary_reads_its_heading_texts_as_headings_and_is_rewritten_in_version_2(tmp_path):
    write_text(
        tmp_path / "summary.json",
        json.dumps(
            {
                "format": 1,
                "documents": {
                    "dynamism.md": {
                        "title": "Dynamism",
                        "numbers": {"n": 1},
                        "blocks": [{"text": "## Table 1"}, {"text": "# not\ntwo lines"}],
                    }
                },
            }
        ),
    )
    old = read_summaries(tmp_path)["dynamism.md"]
    assert old.blocks == [Heading("Table 1"), "# not\ntwo lines"] and old.numbers == {"n": 1}
    write_summary(tmp_path, "cca.md", Summary(["new"]))
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["format"] == 2 and data["documents"]["dynamism.md"]["blocks"][0] == {"heading": "Table 1", "level": 2}
    assert read_summaries(tmp_path) == {"cca.md": Summary(["new"]), "dynamism.md": old}


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
    summary = Summary(
        ["Means per strategy.", Table(["strategy", "mean |D_t|"], [["dynamic", 2.5]])], title="Per-step ablation: tiny"
    )
    write_summary(tmp_path / "ablation", "summary.md", summary)
    write_text(tmp_path / "ablation" / "summary.md", "stale text the report must not show\n")
    md_path, html_path = write_report(tmp_path)
    md, page = md_path.read_text(), html_path.read_text()
    assert "From `ablation/summary.md`:\n\n#### Per-step ablation: tiny\n\nMeans per strategy.\n\n" in md
    assert "| strategy | mean \\|D_t\\| |\n|---|---|\n| dynamic | 2.500 |" in md and "stale text" not in md
    assert "<h4>Per-step ablation: tiny</h4>" in page and "stale text" not in page
    assert to_html(Table(["strategy", "mean |D_t|"], [["dynamic", 2.5]])) in page


def test_the_report_shows_stage_text_as_it_is_never_as_markdown(tmp_path):
    """A stage's paragraph, heading and list are blocks of their own: markup-like characters in them stay text."""
    write_summary(
        tmp_path / "ablation",
        "summary.md",
        Summary(
            ["Matching `per_step` <b>, *not italic*,\n| not a table |", Heading("Table <1>", 2), Items(["**a**", "b"])],
            title="Ablation",
        ),
    )
    md_path, html_path = write_report(tmp_path)
    md, page = md_path.read_text(), html_path.read_text()
    assert (
        "#### Ablation\n\nMatching `per_step` <b>, *not italic*,\n| not a table |\n\n##### Table <1>\n\n- **a**\n- b"
    ) in md
    assert (
        "<h4>Ablation</h4><p>Matching `per_step` &lt;b&gt;, *not italic*, | not a table |</p>"
        "<h5>Table &lt;1&gt;</h5><ul><li>**a**</li><li>b</li></ul>" in page.replace("\n", "")
    )
    assert "<code>per_step</code>" not in page and "<em>not italic</em>" not in page


def test_a_long_table_is_collapsed_in_the_html(tmp_path):
    write_summary(tmp_path / "cca", "cca.md", Summary([Table(["offset"], [[k] for k in range(9)])]))
    page = write_report(tmp_path)[1].read_text()
    assert "<details><summary>Table of 9 rows (click to show)</summary><table><tr><th>offset</th></tr>" in page
