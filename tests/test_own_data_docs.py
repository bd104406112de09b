"""docs/own-data.md's two promises, run against the embedded model: its Python snippet takes a paragraph and a
question to the table of heads per generated token in under ten lines, and its one command traces the three-record
example file."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

from cli_main import run_main

import dynheads
import dynheads.runs

PAGE = Path(__file__).resolve().parents[1] / "docs" / "own-data.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.DOTALL)


def test_the_python_snippet_prints_the_heads_per_generated_token(embedded, monkeypatch):
    (snippet,) = _blocks("python")
    assert len([line for line in snippet.splitlines() if line.strip()]) < 10
    monkeypatch.setattr(dynheads, "load_model", lambda *args, **kwargs: embedded)  # the model the test holds
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(snippet, {})
    text, table = printed.getvalue().split("\n", 1)
    assert "Gustave Eiffel" in text
    rows = [line.split() for line in table.splitlines()[1:]]
    assert rows and all(row[3].count("-") == 1 for row in rows)  # head "layer-head"
    assert any(row[-1] == "Gust" for row in rows)  # a head copied the span's first token


def test_the_one_command_traces_the_example_file(embedded, tmp_path, capsys, monkeypatch):
    (command,) = [line for block in _blocks("bash") for line in block.splitlines() if "--task custom" in line]
    words = shlex.split(command)
    assert words[:2] == ["dynheads", "trace"]
    words[words.index("--out") + 1] = str(tmp_path / "mine")
    monkeypatch.setattr(dynheads.runs, "load_model", lambda *args, **kwargs: embedded)
    monkeypatch.chdir(PAGE.parents[1])
    result = run_main(capsys, monkeypatch, "--threads", "1", *words[1:])
    assert result.code == 0, result.stderr
    assert result.stdout.startswith(f"3 records in {tmp_path / 'mine'}: recall ")
    records = dynheads.RunDir(tmp_path / "mine").records()
    assert [r["record_id"] for r in records] == ["baikal", "curie", "eiffel"]  # in sample-id order: the file's ids
    assert all(r["sample_id"] == r["record_id"] for r in records)
    assert all(r["needle_positions"] for r in records)
    trace = dynheads.RunDir(tmp_path / "mine").load_trace("eiffel")
    assert len(trace.prompt_ids) == records[2]["prompt_tokens"]
    viewed = run_main(capsys, monkeypatch, "view", tmp_path / "mine")
    assert viewed.code == 0 and (tmp_path / "mine" / "view.html").is_file()
