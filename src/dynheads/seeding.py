"""Seeds derived from names: one master seed gives every sample, stream and random draw its own stable seed."""

from __future__ import annotations

import hashlib
from typing import Any


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any values: the same sample gets the same seed in any order or process."""
    digest = hashlib.sha256("|".join(repr(p) for p in parts).encode()).hexdigest()
    return int(digest[:8], 16) & 0x7FFFFFFF
