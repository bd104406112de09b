"""Start-up: the commands that load no model (``tasks``, every ``--help``, the checks of a malformed data file)
import none of the libraries that take seconds to import (torch, transformers, scipy, sklearn through rouge_score's
nltk, pandas). Each case runs the ``dynheads`` entry point in a fresh interpreter and reads its ``sys.modules``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "scipy", "sklearn", "rouge_score", "nltk", "pandas")

# Runs ``main`` with the arguments in argv[1:] and prints, after it exits, the heavy modules it imported.
ENTRY = f"""
import sys
from dynheads.cli import main
sys.argv = ["dynheads", *sys.argv[1:]]
try:
    main()
except SystemExit as stop:
    code = stop.code
print("heavy:", sorted(set({HEAVY!r}) & set(sys.modules)), "exit:", code)
"""


def heavy_modules_of(*args: str, cwd: Path) -> tuple[str, str]:
    """The last line the entry point printed (``heavy: [...] exit: N``) and its stderr."""
    done = subprocess.run(
        [sys.executable, "-c", ENTRY, *args], capture_output=True, text=True, check=True, cwd=cwd, timeout=120
    )
    return done.stdout.strip().splitlines()[-1], done.stderr


@pytest.mark.parametrize(
    "args",
    [["tasks"], ["--help"], ["trace", "--help"], ["kv-export", "--help"], ["reproduce", "--help"], ["plot", "--help"]],
)
def test_commands_that_load_no_model_import_no_heavy_library(args, tmp_path):
    last, _ = heavy_modules_of(*args, cwd=tmp_path)
    assert last == "heavy: [] exit: 0"


def test_a_malformed_data_file_is_refused_before_any_heavy_import(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "question": "q"\n', encoding="utf-8")
    last, err = heavy_modules_of("trace", "--task", "custom", "--data", "bad.jsonl", "--out", "x", cwd=tmp_path)
    assert last == "heavy: [] exit: 2"
    assert "line 1, is not valid JSON" in err


def test_a_record_whose_answer_is_not_in_its_context_is_refused_before_any_heavy_import(tmp_path):
    record = {"id": "a", "context": "The word is x.", "question": "What is the word?", "answer": "zz"}
    (tmp_path / "bad.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    last, err = heavy_modules_of("trace", "--task", "custom", "--data", "bad.jsonl", "--out", "x", cwd=tmp_path)
    assert last == "heavy: [] exit: 2"
    assert "no span to score" in err
