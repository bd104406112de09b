"""Run the ``dynheads`` entry point in this process, as a shell would: exit code, stdout, stderr.

Typer's ``CliRunner`` invokes the app without ``main``'s error handling (one line, exit code 2); this runs
``main`` itself, so tests see what a user sees, without a subprocess's start-up time.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from dynheads.cli.app import main


@dataclass(frozen=True)
class Result:
    code: int
    stdout: str
    stderr: str


def run_main(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, *args: str) -> Result:
    monkeypatch.setattr(sys, "argv", ["dynheads", *map(str, args)])
    capsys.readouterr()  # drop what came before
    with pytest.raises(SystemExit) as stop:
        main()
    out, err = capsys.readouterr()
    code = stop.value.code
    return Result(code if isinstance(code, int) else (0 if code is None else 1), out, err)
