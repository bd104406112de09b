"""Frozen dataclass configs, buildable from the CLI and from a TOML file (CLI flags win).

A config field is declared once, with its help: ``setting(default, help)``. A config that shares a piece
(``dynheads.settings``) but wants another default redeclares just that: ``redefault(Piece, name, v)``
keeps the piece's help. The CLI generates its options from these fields (``dynheads.cli.options``).
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from dynheads.errors import DynheadsError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")
Rule = tuple[Callable[[Any], bool], str]  # a value check: (is the value fine, what it must be: "at least 1", ...)


def setting(default: Any, help: str) -> Any:
    """A config field with its default and the help text the CLI shows."""
    return dataclasses.field(default=default, metadata={"help": help})


def redefault(piece: type[DataclassInstance], name: str, default: Any) -> Any:
    """Field ``name`` of the config piece ``piece`` with another default (same help)."""
    return dataclasses.field(default=default, metadata=piece.__dataclass_fields__[name].metadata)


def pieces_of(config: Any, *pieces: type[DataclassInstance]) -> dict[str, Any]:
    """``config``'s values of the fields of ``pieces``: another config that shares them is built from these."""
    return {field.name: getattr(config, field.name) for piece in pieces for field in dataclasses.fields(piece)}


def settings_of(config: Any) -> dict[str, Any]:
    """A dataclass config's fields (recursively) or a mapping's items, as a dict."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return dict(config)


def build_config(cls: type[C], file: str | Path | None = None, **overrides: Any) -> C:
    """``cls`` from its defaults, then the TOML ``file`` (if any), then ``overrides`` that are not None."""
    values: dict[str, Any] = {}
    if file is not None:
        try:
            values.update(tomllib.loads(Path(file).read_text(encoding="utf-8")))
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise DynheadsError(f"cannot read config file {file}: {error}") from None
    # TOML arrays arrive as lists; configs hold tuples
    values = {key: as_tuples(value) for key, value in values.items()}
    values.update({k: v for k, v in overrides.items() if v is not None})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise DynheadsError(f"unknown {cls.__name__} setting(s): {', '.join(unknown)}")
    check_types(cls, {key: values[key] for key in values if overrides.get(key) is None}, f"config file {file}")
    return cls(**values)


def as_tuples(value: Any) -> Any:
    """``value`` with every list in it a tuple (TOML arrays arrive as lists; configs hold tuples)."""
    return tuple(as_tuples(item) for item in value) if isinstance(value, list) else value


def check_types(cls: type, values: dict[str, Any], source: str) -> None:
    """A one-line error for the first value of ``values`` that is not of its ``cls`` field's declared type (a string
    where a list of numbers goes, a number where a list goes); ``source`` names where the values came from."""
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        if key in hints and not _fits(hints[key], value):
            shown = str(hints[key]).replace("typing.", "").removeprefix("<class '").removesuffix("'>")
            raise DynheadsError(f"{source}: {key} takes {shown}, got {value!r}")


def _fits(hint: Any, value: Any) -> bool:
    """Whether ``value`` is of the type ``hint`` (an int where a float goes; a hint this does not read passes)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(arg, value) for arg in args)
    if origin is typing.Literal:
        return value in args
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(args[0], item) for item in value)
        return len(args) == len(value) and all(_fits(arg, item) for arg, item in zip(args, value, strict=True))
    if hint is type(None):
        return value is None
    if hint in (int, float):
        return isinstance(value, int if hint is int else (int, float)) and not isinstance(value, bool)
    return not isinstance(hint, type) or isinstance(value, hint)


def parse_list(text: str | None, kind: Callable[[str], Any] = float) -> tuple | None:
    """'500,1000,2000' -> (500, 1000, 2000); None stays None (use the config's value)."""
    if text is None:
        return None
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise DynheadsError(f"cannot read {text!r} as a comma-separated list of {kind.__name__}") from None


def parse_fields(label: str, spec: str, form: type, refused: Collection[str] = ()) -> dict[str, Any]:
    """``key=value,...`` -> the named fields of the dataclass ``form``, each value cast to its field's type (int,
    float, str, or bool: true/false); what is left out is not in the result. Errors name ``label`` and the
    option; a field of ``refused`` (set elsewhere), or one of another type, cannot be set this way."""
    kinds = typing.get_type_hints(form)
    keys = [field.name for field in dataclasses.fields(form) if field.name not in refused]
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, _, text = item.partition("=")
        if key not in keys or not text:
            takes = f"use {', '.join(f'{k}=...' for k in keys)}" if keys else "it takes none"
            raise DynheadsError(f"bad {label} option {item!r}: {takes}")
        values[key] = _cast(label, key, kinds.get(key), text)
    return values


def _cast(label: str, key: str, kind: Any, text: str) -> Any:
    """``text`` as a value of ``kind`` (int, float, str or bool)."""
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise DynheadsError(f"{label} option {key} needs true or false, got {text!r}")
        return text.lower() == "true"
    if kind not in (int, float, str):
        raise DynheadsError(f"{label} option {key} ({kind}) cannot be set as text")
    try:
        return kind(text)
    except ValueError:
        article = "an" if kind.__name__[0] in "aeiou" else "a"
        raise DynheadsError(f"{label} option {key} needs {article} {kind.__name__}, got {text!r}") from None


def parse_range(text: str) -> tuple[int, ...]:
    """'0-10' -> (0, ..., 10); '0,2,5' -> (0, 2, 5)."""
    if "-" in text and "," not in text:
        try:
            low, high = (int(part) for part in text.split("-"))
        except ValueError:
            raise DynheadsError(f"cannot read {text!r} as a range such as 0-10") from None
        return tuple(range(low, high + 1))
    return parse_list(text, int) or ()
