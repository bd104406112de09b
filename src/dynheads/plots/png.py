"""Writing a finished figure: every plot of dynheads is a PNG written atomically (a crash leaves no partial file)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dynheads.io import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def save_png(figure: Figure, path: str | Path, *, dpi: int = 150) -> Path:
    """Write ``figure`` as a PNG at ``path`` (atomically); returns the path."""
    path = Path(path)
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=dpi)
    return path
