"""The CLI's options, generated from the config fields: ``config_options`` and ``with_options``.

A command takes the options of its config (``config_options(NiahConfig)``: one flag per field, its help from the
field's ``metadata["help"]``, its real default shown) plus its own; ``with_options`` adds them to the command's
signature (Typer reads it) and hands them to the command as config-ready keyword arguments: comma-separated lists
parsed, renamed to their config field. An option the user did not give arrives as ``None`` (its shown default is
the config's), so the config's TOML file still applies: flags override the file, the file overrides defaults.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from dynheads.config import parse_list

Opt = typer.Option


@dataclass(frozen=True)
class Option:
    """One generated option: its Typer annotation, default, list item parser and config field name."""

    annotation: Any
    default: Any = None
    items: Callable[[str], Any] | None = None  # the flag takes a comma-separated list of these
    field: str | None = None  # config field, where it differs from the option's name


# ---- option types of the commands' own parameters -----------------------------------------------------------------
ConfigFile = Annotated[Path | None, Opt("--config", help="TOML file with settings; flags override it")]
RunOut = Annotated[Path, Opt("--out", help="run directory (re-running resumes it)")]
RunArg = Annotated[Path, typer.Argument(help="run directory written by e.g. 'dynheads niah'")]
BatchSize = Annotated[
    int,
    Opt(
        "--batch-size",
        help="samples (ablation: records) decoded together; 1 = the reference "
        "path, larger batches give its results up to fp32 rounding",
    ),
]
DeviceMap = Annotated[str | None, Opt("--device-map", help="spread a large model over GPUs, e.g. auto")]
STATIC_HELP = "static head list (Wu et al. JSON or a ranked list)"
# --help groups a generated option under the config piece that declares its field (dynheads.settings); the
# command's own fields and options stay under typer's "Options".
PANELS = {
    "ModelSettings": "Model",
    "Seeded": "Grid",
    "NiahCells": "Grid",
    "NiahGrid": "Grid",
    "QaGrid": "Questions and grid",
    "TracingSettings": "Scores and chat template",
    "WriteScoreSetting": "Scores and chat template",
    "DetectConfig": "Detectors",
}
# A field whose flag says better what it is than its name (the field keeps its name in configs, TOML files and
# manifests, so runs resume); the old flag still works.
FLAG_OF_FIELD = {"probe": "predictor"}  # the trained head predictor's folder (the "probe" is the attention probe)
OLD_FLAGS = {"predictor": "--probe"}
CONTEXT = "typer_context"  # the click context Typer passes a generated command: which options the user gave


def config_options(
    config: type, *, skip: tuple[str, ...] = (), flags: Mapping[str, str] | None = None, panel: str | None = None
) -> dict[str, Option]:
    """One option per field of the dataclass ``config`` (but ``skip``): ``--field-name``, or ``--<flags[field]>``
    where the flag differs; tuples take comma-separated lists; the help is the field's, with its default; ``--help``
    groups it under ``panel`` (default: the panel of the config piece that declares it)."""
    hints = typing.get_type_hints(config)
    options = {}
    for field in dataclasses.fields(config):
        if field.name in skip:
            continue
        name = flag_name(field.name, flags)
        options[name] = _option(
            name,
            hints[field.name],
            field.metadata.get("help", ""),
            _shown_default(field.default),
            field.name if name != field.name else None,
            panel or _panel(config, field.name),
        )
    return options


def flag_name(field: str, flags: Mapping[str, str] | None = None) -> str:
    """The flag (without ``--``, underscores kept) a command gives field ``field``: ``flags[field]``, else the
    project-wide renaming (``FLAG_OF_FIELD``), else the field's name."""
    return (flags or {}).get(field) or FLAG_OF_FIELD.get(field, field)


def shared_options(configs: Mapping[str, type]) -> dict[str, Option]:
    """The options of a command that builds one of several configs (``trace``: the NIAH-shaped or the
    question-shaped one, by task), each config under a label: every field once; a field whose defaults differ
    shows none and its help names each (``default: niah 48, question tasks 24``); a field of some configs only
    says which (``niah only``)."""
    declared: dict[str, list[tuple[str, dataclasses.Field, Any]]] = {}
    for label, config in configs.items():
        hints = typing.get_type_hints(config)
        for field in dataclasses.fields(config):
            declared.setdefault(field.name, []).append((label, field, hints[field.name]))
    options = {}
    for field_name, entries in declared.items():
        _, field, hint = entries[0]
        name = flag_name(field_name)
        shown = {label: _shown_default(f.default) for label, f, _ in entries}
        help, default = field.metadata.get("help", ""), shown[entries[0][0]]
        if len(set(map(repr, shown.values()))) > 1:
            help, default = help + " (default: " + ", ".join(f"{k} {v}" for k, v in shown.items()) + ")", None
        elif len(entries) < len(configs):
            help += f" ({', '.join(shown)} only)"
        renamed = field_name if name != field_name else None
        options[name] = _option(name, hint, help, default, renamed, _panel(configs[entries[0][0]], field_name))
    return options


def _option(name: str, hint: Any, help: str, default: Any, field: str | None, panel: str | None) -> Option:
    kind, items = _option_kind(hint)
    flag = f"--{name.replace('_', '-')}"
    if kind == bool | None:  # a switch: --name / --no-name
        flag += f"/--no-{name.replace('_', '-')}"
    old = (OLD_FLAGS[name],) if name in OLD_FLAGS else ()
    declaration = Opt(flag, *old, help=help, rich_help_panel=panel)
    return Option(Annotated[kind, declaration], default, items, field)


def _panel(config: type, name: str) -> str | None:
    """The ``--help`` group of field ``name``: that of the first piece of ``config`` that declares it (None: the
    command's own field, under "Options")."""
    return next(
        (
            PANELS[cls.__name__]
            for cls in config.__mro__
            if cls.__name__ in PANELS and name in cls.__dict__.get("__annotations__", {})
        ),
        None,
    )


def _option_kind(hint: Any) -> tuple[Any, Callable[[str], Any] | None]:
    """(option type, list item parser): a tuple field is a comma-separated string; None always means 'not given'."""
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        return str | None, (str.strip if item is str else item)
    scalar = [arg for arg in typing.get_args(hint) if arg is not type(None)] or [hint]
    kind = scalar[0] if scalar[0] in (bool, int, float, str) else str  # Literal modes are strings on the command line
    return kind | None, None


def _shown_default(value: Any) -> Any:
    """The default as ``--help`` shows it (lists comma-separated); None where the help says what None means."""
    if isinstance(value, tuple):
        return ",".join(f"{item:g}" if isinstance(item, float) else str(item) for item in value) or None
    return None if value == "" else value


def _given(context: typer.Context | None, name: str, value: Any, option: Option) -> bool:
    """Whether the user gave ``--name`` (on the command line or in the environment), not Typer its default."""
    if context is None:  # called as a plain function
        return value != option.default
    source = context.get_parameter_source(name)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def with_options(*groups: Mapping[str, Option]) -> Callable[[Callable], Callable]:
    """Add the options of ``groups`` (e.g. ``config_options(NiahConfig)``) to a command. Its own parameters without
    a default come first, the generated ones next, its other ones last; the command receives the generated ones,
    parsed, through ``**settings``."""
    options: dict[str, Option] = {}
    for group in groups:
        options.update(group)

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        own = [p.replace(kind=p.KEYWORD_ONLY) for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        generated = [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=o.annotation, default=o.default)
            for name, o in options.items()
        ]

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            context, settings = values.pop(CONTEXT, None), {}
            for name, o in options.items():
                value = values.pop(name)
                if not _given(context, name, value, o):
                    value = None  # the config (or its TOML file) keeps its value
                settings[o.field or name] = parse_list(value, o.items) if o.items is not None else value
            return command(**values, **settings)

        required = [p for p in own if p.default is p.empty]
        context = inspect.Parameter(CONTEXT, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)
        run.__signature__ = signature.replace(  # type: ignore[attr-defined]  # what typer reads
            parameters=[*required, *generated, *(p for p in own if p.default is not p.empty), context]
        )
        return run

    return decorate
