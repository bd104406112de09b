"""Head naming, shared by every module: (layer, head) zero-based, ``"l-h"`` in JSON, ``L{l}-H{h}`` in plots."""

from __future__ import annotations

from numbers import Integral

from dynheads.errors import DynheadsError

Head = tuple[int, int]


def head_key(head: Head) -> str:
    """JSON key of a head, as in the published retrieval-head lists: ``"layer-head"``."""
    return f"{head[0]}-{head[1]}"


def head_label(head: Head) -> str:
    """Plot label of a head: ``L{layer}-H{head}``."""
    return f"L{head[0]}-H{head[1]}"


def parse_head(text: str) -> Head:
    """Parse ``"12-3"`` or ``"L12-H3"`` into ``(12, 3)``."""
    cleaned = text.strip().upper().replace("L", "").replace("H", "")
    try:
        layer, head = (int(part) for part in cleaned.split("-"))
    except ValueError:
        raise DynheadsError(f"cannot read head {text!r}: expected 'layer-head' such as '12-3'") from None
    return layer, head


def flat_index(head: Head, num_heads: int) -> int:
    """Index of a head in layer-major flattened ``[L * H]`` vectors."""
    return head[0] * num_heads + head[1]


def check_heads(heads: list[Head], num_layers: int, num_heads: int, source: str = "head list") -> None:
    """Refuse heads that do not exist in a model of ``num_layers`` x ``num_heads``, and entries that are no
    ``(layer, head)`` pair of integers (``check_pairs``)."""
    check_pairs(heads, source)
    bad = [h for h in heads if not (0 <= h[0] < num_layers and 0 <= h[1] < num_heads)]
    if bad:
        shown = ", ".join(head_label(h) for h in bad[:5])
        raise DynheadsError(
            f"{source} names {len(bad)} head(s) that this model ({num_layers} layers x {num_heads} heads) "
            f"does not have: {shown}"
        )


def check_pairs(heads: list, source: str = "head list") -> None:
    """Refuse an entry that is no ``(layer, head)`` pair of integers (a ``"layer-head"`` string: ``parse_head``
    reads one)."""
    for head in heads:
        if not (
            isinstance(head, tuple | list)
            and len(head) == 2
            and all(isinstance(i, Integral) and not isinstance(i, bool) for i in head)
        ):
            raise DynheadsError(f"{source}: a head is a (layer, head) pair of integers, got {head!r}")
