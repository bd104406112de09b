"""The CLI's options, declared once: shared option types, the groups commands compose, and ``with_options``.

A command lists the groups it takes (``MODEL``, ``NIAH_GRID``, ...) plus its own options; ``with_options`` adds them
to the command's signature (Typer reads it) and hands them to the command as config-ready keyword arguments:
comma-separated lists parsed, renamed to their config field. ``None`` means "not given": the config's value stays.
"""

from __future__ import annotations

import functools
import inspect
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


def option(help: str, *decls: str, kind: Any = str | None, default: Any = None,
           items: Callable[[str], Any] | None = None, field: str | None = None) -> Option:
    return Option(Annotated[kind, Opt(*decls, help=help)], default, items, field)


# ---- option types shared by several commands ----------------------------------------------------------------------
ConfigFile = Annotated[Path | None, Opt("--config", help="TOML file with settings; flags override it")]
RunOut = Annotated[Path, Opt("--out", help="run directory (re-running resumes it)")]
RunArg = Annotated[Path, typer.Argument(help="run directory written by e.g. 'dynheads niah'")]
Model = Annotated[str | None, Opt("--model", help="hub id, local folder or .gguf file (default: embedded SmolLM2)")]
Dtype = Annotated[str | None, Opt(help="model dtype: auto (the checkpoint's), float32, bfloat16, float16")]
Device = Annotated[str | None, Opt(help="cpu or cuda")]
BatchSize = Annotated[int, Opt("--batch-size", help="samples decoded together (1 = reference path; same results)")]
DeviceMap = Annotated[str | None, Opt("--device-map", help="spread a large model over GPUs, e.g. auto")]
CHAT_TEMPLATE_HELP = ('JSON object of chat-template variables over the pinned ones (enable_thinking false, date_string '
                      '"26 Jul 2024"), e.g. \'{"enable_thinking": true}\'')
STATIC_HELP = "static head list (Wu et al. JSON or a ranked list)"

# ---- groups: the pieces a command's config is composed of -----------------------------------------------------------
MODEL = {"model": Option(Model), "dtype": Option(Dtype), "device": Option(Device)}
SEED = {"seed": option("master seed", kind=int | None)}
NIAH_GRID = {
    "lengths": option("haystack lengths in tokens, e.g. 500,1000,2000", items=int),
    "depths": option("needle depths in [0, 1], e.g. 0,0.25,0.5,0.75,1", items=float),
    "runs": option("samples per (length, depth) cell", kind=int | None),
    **SEED,
    "max_new_tokens": option("generation budget per sample", kind=int | None),
    "haystack": option("folder of .txt files (default: Paul Graham essays)"),
}
QA_GRID = {
    "questions": option("number of questions", kind=int | None),
    "first": option("index of the first question in the data (question streams must not overlap)", kind=int | None),
    "lengths": option("context lengths in tokens, e.g. 250,500,1000", items=int),
    "depths": option("gold-paragraph depths in [0, 1], e.g. 0.05,0.5,0.95", items=float),
    **SEED,
    "max_new_tokens": option("generation budget per question", kind=int | None),
}
# the ablation commands run on NIAH by default; these choose and shape the HotpotQA variant
ABLATION_TASK = {
    "task": option("a registered task: niah (Eq. 1), hotpotqa or multihop (Eq. 2 above --threshold); docs/tasks.md"),
    "threshold": option("hotpotqa: a head is dynamic above this Eq. 2 score (0.1) or multiple of chance (relative:3)"),
    "questions": option("hotpotqa: questions spread over the grid", kind=int | None),
    "first": option("hotpotqa: index of the first question in the data", kind=int | None),
    "data": option("hotpotqa: data file (default: synthetic questions); multihop[:hops=2,...]: the multihop task"),
}


def with_options(*groups: Mapping[str, Option], **extra: Option | None) -> Callable[[Callable], Callable]:
    """Add the options of ``groups`` and ``extra`` (an ``extra`` of the same name replaces a group's, in place; None
    drops it) to a command. Its own parameters without a default come first, the generated ones next, its other
    ones last; the command receives the generated ones, parsed, through ``**settings``."""
    options: dict[str, Option] = {}
    for group in (*groups, extra):
        options.update(group)
    options = {name: o for name, o in options.items() if o is not None}

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        own = [p.replace(kind=p.KEYWORD_ONLY) for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
        generated = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=o.annotation, default=o.default)
                     for name, o in options.items()]

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            settings = {}
            for name, o in options.items():
                value = values.pop(name)
                settings[o.field or name] = parse_list(value, o.items) if o.items is not None else value
            return command(**values, **settings)

        required = [p for p in own if p.default is p.empty]
        run.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*required, *generated, *(p for p in own if p.default is not p.empty)])
        return run

    return decorate
