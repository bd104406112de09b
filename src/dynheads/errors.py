"""The one exception type users see: its message is a complete, one-line explanation of a bad input."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class DynheadsError(Exception):
    """A problem with the user's input or environment, reported as one line (never a traceback)."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the known name closest to a mistyped ``name`` ('' when none is close)."""
    by_lower = {item.lower(): item for item in known}  # case does not count: kvpress:SnapKVPress -> 'snapkv'
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean {by_lower[close[0]]!r}?" if close else ""
