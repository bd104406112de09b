"""Task forms: the small frozen dataclass a ``data`` value spells (``multihop:hops=2,value=word``,
``variable_tracking:hops=2,chains=3``), read and checked the same way for every task that has one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from dynheads.config import Rule, parse_fields
from dynheads.errors import DynheadsError

F = TypeVar("F")

# Where a question task's candidate facts go: uniform (the gold one by fact order) or at the cell's depth
PLACEMENTS = ("uniform", "depth")
PLACEMENT_RULE: Rule = (lambda placement: placement in PLACEMENTS, f"one of {', '.join(PLACEMENTS)}")


def parse_form(name: str, spec: str, form: type[F]) -> F:
    """``key=value,...`` (``spec``, the part after ``name:``) -> ``form(**values)``, each value cast to its field's
    type (``config.parse_fields``); defaults for what is left out. Errors name the task ``name`` and the option."""
    return form(**parse_fields(name, spec, form))


def check_form(name: str, form: Any, rules: Mapping[str, Rule]) -> None:
    """Refuse the first field of ``form`` that breaks its rule: ``{name} {field} must be {must}, got {value!r}``."""
    for field, (fine, must) in rules.items():
        value = getattr(form, field)
        if not fine(value):
            raise DynheadsError(f"{name} {field} must be {must}, got {value!r}")
