"""Task forms: the small frozen dataclass a ``data`` value spells (``multihop:hops=2,value=word``,
``variable_tracking:hops=2,chains=3``), read and checked the same way for every task that has one."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from dynheads.config import Rule
from dynheads.errors import DynheadsError

F = TypeVar("F")


def parse_form(name: str, spec: str, form: type[F]) -> F:
    """``key=value,...`` (``spec``, the part after ``name:``) -> ``form(**values)``, each value cast to its field's
    type; defaults for what is left out. Errors name the task ``name`` and the option."""
    kinds = typing.get_type_hints(form)
    keys = [field.name for field in dataclasses.fields(form)]  # type: ignore[arg-type]  # forms are dataclasses
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, _, text = item.partition("=")
        if key not in keys or not text:
            raise DynheadsError(f"bad {name} option {item!r}: use {', '.join(f'{k}=...' for k in keys)}")
        try:
            values[key] = kinds[key](text)
        except ValueError:
            raise DynheadsError(f"{name} option {key} needs a {kinds[key].__name__}, got {text!r}") from None
    return form(**values)


def check_form(name: str, form: Any, rules: Mapping[str, Rule]) -> None:
    """Refuse the first field of ``form`` that breaks its rule: ``{name} {field} must be {must}, got {value!r}``."""
    for field, (fine, must) in rules.items():
        value = getattr(form, field)
        if not fine(value):
            raise DynheadsError(f"{name} {field} must be {must}, got {value!r}")
