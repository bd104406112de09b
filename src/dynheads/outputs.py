"""What a finished run's tables are: data that pure functions return, and the one writer that puts them on disk.

A table function reads a finished run (``runs.RunView``: its manifest and records, read once) and returns
``Outputs``: the files of a folder, by path relative to it, in the order they are written. A file's content says
how it is written: a ``pandas.DataFrame`` as CSV (no index), a ``tables.Summary`` as markdown with its document in
the folder's ``summary.json`` (``tables.write_summary``), a ``str`` as text, ``Written`` by its own function (a
figure, a model's weights), ``REMOVED`` as no file (one an earlier summary wrote and this one does not, so a run
summarised again keeps no stale file), and anything else as JSON. ``write_outputs`` writes them, each file atomically;
experiments write their files through it and nothing else (tests/architecture/test_one_runner.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dynheads.io import atomic_path, write_json, write_text
from dynheads.tables import Summary, write_summary


@dataclass(frozen=True)
class Written:
    """A file (or a folder of files) written by its own function when the outputs are written: ``write(path)``
    (a ``dynheads.plots`` function with its data bound, a trained predictor's ``save``)."""

    write: Callable[[Path], object]


REMOVED = object()  # the content of a file the outputs do not have: deleted if an earlier summary wrote it


@dataclass
class Outputs:
    """The files a table function returns, by relative path, in write order (see the module's docstring)."""

    files: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, content: Any) -> Outputs:
        """Add the file ``name`` (a path relative to the folder); a name given twice keeps its first place and its
        last content."""
        self.files[name] = content
        return self

    def extend(self, other: Outputs) -> Outputs:
        for name, content in other.files.items():
            self.add(name, content)
        return self

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.files.items())


def write_outputs(folder: str | Path, outputs: Outputs) -> None:
    """Write every file of ``outputs`` under ``folder``, in order, each atomically (``Written`` ones as their
    function writes them)."""
    folder = Path(folder)
    for name, content in outputs:
        path = folder / name
        if content is REMOVED:
            path.unlink(missing_ok=True)
        elif isinstance(content, pd.DataFrame):
            with atomic_path(path) as tmp:
                content.to_csv(tmp, index=False)
        elif isinstance(content, Summary):
            write_summary(path.parent, path.name, content)
        elif isinstance(content, str):
            write_text(path, content)
        elif isinstance(content, Written):
            path.parent.mkdir(parents=True, exist_ok=True)
            content.write(path)
        else:
            write_json(path, content)
