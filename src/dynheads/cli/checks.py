"""Input checks every command runs before it loads a model, so that a bad input costs no model load.

Files that must be readable JSON or Parquet, folders that must be runs of the right kind, settings that must be in
range. Each failure is a ``DynheadsError``: one line naming the file or the flag, exit code 2 (``app.main``).
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dynheads.cli.options import flag_name
from dynheads.config import C, Rule, build_config
from dynheads.errors import DynheadsError
from dynheads.io import read_json, read_user_text


# ---- files and folders --------------------------------------------------------------------------------------------
def json_file(path: str | Path, what: str) -> Any:
    """The content of the JSON file ``path`` (``what`` names it in the error: "detector", "head list", ...)."""
    path = Path(path)
    if not path.is_file():
        raise DynheadsError(f"{what} not found: {path}" + (" (a folder, not a file)" if path.is_dir() else ""))
    try:
        return read_json(path)
    except (OSError, UnicodeDecodeError) as error:
        raise DynheadsError(f"cannot read {what} {path}: {error}") from None
    except json.JSONDecodeError as error:
        lines = " (one JSON value per line is JSON Lines: name the file .jsonl)" if error.msg == "Extra data" else ""
        raise DynheadsError(
            f"{what} {path} is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno}){lines}"
        ) from None


def parquet_file(path: str | Path, what: str = "trace") -> None:
    """Refuse a missing file or one that is not Parquet (its footer is read, not its data)."""
    import pyarrow
    import pyarrow.parquet

    path = Path(path)
    if not path.is_file():
        raise DynheadsError(f"{what} not found: {path}")
    try:
        pyarrow.parquet.read_metadata(path)
    except (OSError, pyarrow.ArrowException) as error:
        raise DynheadsError(f"{what} {path} is not a readable Parquet file: {error}") from None


def run_manifest(path: str | Path) -> dict:
    """The manifest of the run directory ``path``; a folder without one (or with a broken one) is refused."""
    path = Path(path)
    if path.is_file():
        raise DynheadsError(f"{path} is a file, not a run directory")
    if not path.is_dir():
        raise DynheadsError(f"run directory not found: {path}")
    manifest = json_file(path / "manifest.json", "run manifest") if (path / "manifest.json").exists() else None
    if not isinstance(manifest, dict):
        inside = sorted(str(folder.parent) for folder in path.glob("*/manifest.json"))
        shown = ", ".join(inside[:6]) + (", ..." if len(inside) > 6 else "")
        raise DynheadsError(
            f"{path} is not a dynheads run directory (no manifest.json)"
            + (f"; the runs inside it (a study's stage folders): {shown}: give one of them" if inside else "")
        )
    return manifest


def traced_run(path: str | Path) -> dict:
    """The manifest of a traced run (``dynheads trace``, ``niah``, ``hotpotqa``, ...): one with per-step traces,
    each a readable Parquet file; a run of another stage (``kv``, ``rag``, ...) is refused by its kind."""
    manifest = run_manifest(path)
    traces = sorted((Path(path) / "traces").glob("*.parquet"))
    if not traces:
        inside = sorted(str(folder.parent.parent) for folder in Path(path).glob("*/traces/*.parquet"))
        runs = ", ".join(dict.fromkeys(inside))
        raise DynheadsError(
            f"{path} has no traced samples yet (a '{manifest.get('kind')}' run with no traces/*.parquet): "
            + (
                f"the traced runs inside it: {runs}: give one of them"
                if inside
                else "give a traced run ('dynheads trace')"
            )
        )
    for trace in traces:
        parquet_file(trace)
    return manifest


def out_dir(path: str | Path, kind: str, config: Any = None) -> None:
    """Refuse an ``--out`` that is a file or holds a run of another kind, or (``config`` given: the config the run
    starts with) one with other settings, before any model loads; resuming a run of ``kind`` is fine."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DynheadsError(f"--out {path} is a file, not a folder")
    if (path / "manifest.json").exists():
        found = run_manifest(path).get("kind")
        if found != kind:
            raise DynheadsError(f"--out {path} already holds a '{found}' run, not a '{kind}' one: choose another --out")
        if config is not None:
            from dynheads.runs import RunDir

            RunDir(path).check_resume(kind, config)


def head_list(path: str | Path) -> None:
    """Refuse a missing or unreadable static head list (either format; ``analysis.headlists``)."""
    from dynheads.analysis.headlists import load_head_list

    if Path(path).is_dir():
        inside = sorted(p.name for p in Path(path).glob("*heads*.json"))
        raise DynheadsError(
            f"--static takes a head list file, and {path} is a folder"
            + (f": give the file inside it, e.g. {Path(path) / inside[0]}" if inside else "")
        )
    if not Path(path).is_file():
        raise DynheadsError(f"static head list not found: {path}")
    load_head_list(path)


def haystack_dir(path: str | Path) -> None:
    """Refuse a ``--haystack`` that is not a folder (a .txt file given alone is named as such)."""
    from dynheads.tasks.niah import haystack_folder

    haystack_folder(path)


def probe_dir(path: str | Path) -> None:
    """Refuse a folder that is not a trained head predictor ('dynheads predictor train': probe.json, weights.pt)."""
    path = Path(path)
    if not path.is_dir():
        raise DynheadsError(f"probe folder not found: {path}")
    if not (path / "weights.pt").is_file():
        raise DynheadsError(
            f"{path} is not a trained probe folder (no weights.pt; 'dynheads predictor train' writes one)"
        )
    json_file(path / "probe.json", "probe description")


def data_file(data: str) -> None:
    """A ``--data`` value that spells a path (a folder, or .json / .jsonl / .parquet) must exist, a JSON one parse;
    named sources (``hotpotqa-dev``, ``multihop:hops=2``, ...) are their runners' to check."""
    path = Path(data)
    if path.suffix not in (".json", ".jsonl", ".parquet") and "/" not in data:
        return
    if not path.exists():
        raise DynheadsError(f"data file not found: {path}")
    if path.suffix == ".json":
        json_file(path, "data file")
    elif path.suffix == ".jsonl":
        for number, line in enumerate(read_user_text(path, "data file").splitlines(), start=1):
            try:
                json.loads(line) if line.strip() else None
            except json.JSONDecodeError as error:
                raise DynheadsError(f"data file {path}, line {number}, is not valid JSON: {error.msg}") from None
    elif path.suffix == ".parquet":
        parquet_file(path, "data file")


# ---- settings -----------------------------------------------------------------------------------------------------
def at_least(low: int) -> Rule:
    return (lambda value: value >= low), f"at least {low}"


FRACTION: Rule = (lambda value: 0 <= value <= 1), "between 0 and 1"
BUDGET: Rule = (lambda value: 0 < value <= 1), "in (0, 1]"
POSITIVE: Rule = (lambda value: value > 0), "above 0"

# Config field -> (rule, what one value is called). Tuple fields are checked item by item; None is never checked
# (it means "not given" or "none"). A field of any command's config gets its rule here, once.
RULES: dict[str, tuple[Rule, str]] = {
    "runs": (at_least(1), "runs"),
    "samples": (at_least(1), "samples"),
    "questions": (at_least(1), "questions"),
    "fit_questions": (at_least(1), "fit questions"),
    "first": (at_least(0), "first"),
    "fit_first": (at_least(0), "fit first"),
    "max_new_tokens": (at_least(1), "max_new_tokens"),
    "lengths": (at_least(1), "length"),
    "depths": (FRACTION, "depth"),
    "distractor_depth": (FRACTION, "depth"),
    "budgets": (BUDGET, "budget"),
    "success_threshold": (FRACTION, "success threshold"),
    "sink_size": (at_least(0), "sink size"),
    "local_window": (at_least(0), "local window"),
    "sink": (at_least(0), "sink"),
    "recent": (at_least(1), "recent window"),
    "k": (at_least(1), "k"),
    "ks": (at_least(0), "k"),
    "top_static": (at_least(1), "top static"),
    "rerank_top": (at_least(1), "rerank top"),
    "rerank_tokens": (at_least(1), "rerank tokens"),
    "draft_tokens": (at_least(1), "draft tokens"),
    "top_n": (at_least(1), "top n"),
    "static_k": (at_least(1), "static k"),
    "folds": (at_least(2), "folds"),
    "repeats": (at_least(1), "repeats"),
    "regularisation": (POSITIVE, "regularisation"),
    "epochs": (at_least(1), "epochs"),
    "batch_size": (at_least(1), "batch size"),
    "lr": (POSITIVE, "learning rate"),
    "hidden_sizes": (at_least(1), "hidden size"),
    "early_stopping": (at_least(0), "early stopping"),
    "top": (at_least(1), "top"),
    "full_heads": (at_least(1), "full heads"),
    "floor": (at_least(1), "floor"),
    "resamples": (at_least(1), "resamples"),
}


def _template_kwargs(text: str) -> None:
    from dynheads.tasks.prompting import chat_template_kwargs

    chat_template_kwargs(text)  # a JSON object, or a one-line error


def _trigger_form(form: str) -> None:
    from dynheads.rag.trigger import TriggerForm

    choice("--trigger-form", form, typing.get_args(TriggerForm))


def _fitting_run(path: str) -> None:
    """A fitted threshold's fitting run (``--fit-run``) is a traced run."""
    traced_run(path)


def _head_score(name: str) -> None:
    from dynheads.scores import check_kind

    check_kind(name)


# Config field -> its check: the files and folders a field names, and text settings read only after the model loads.
FIELD_CHECKS: dict[str, Callable[[Any], None]] = {
    "score": _head_score,
    "contrast": _head_score,
    "beside": _head_score,
    "static": head_list,
    "probe": probe_dir,
    "data": data_file,
    "haystack": haystack_dir,
    "chat_template_kwargs": _template_kwargs,
    "trigger_form": _trigger_form,
    "fit_run": _fitting_run,
}


def value(flag: str, what: str, rule: Rule, given: Any) -> None:
    """Refuse ``given`` (or any item of it, for a list) that breaks ``rule``: ``--depths: depth must be between
    0 and 1, got 1.5``."""
    fine, must = rule
    for item in given if isinstance(given, tuple) else (given,):
        if isinstance(item, int | float) and not (math.isfinite(item) and fine(item)):
            raise DynheadsError(f"{flag}: {what} must be {must}, got {item:g}")


def choice(flag: str, given: str, choices: tuple[str, ...]) -> None:
    if given not in choices:
        raise DynheadsError(f"{flag} takes one of {', '.join(choices)}, got {given!r}")


def config_values(config: Any, flags: Mapping[str, str] | None = None) -> None:
    """Check every field of ``config`` that has a rule (``RULES``) or a check (``FIELD_CHECKS``); errors
    name the field by its flag (``flags[field]`` where it differs from ``--field-name``)."""
    for field in dataclasses.fields(config):
        given = getattr(config, field.name)
        if given is None or given == "":
            continue
        flag = "--" + flag_name(field.name, flags).replace("_", "-")
        if field.name in RULES:
            rule, what = RULES[field.name]
            value(flag, what, rule, given)
        if field.name in FIELD_CHECKS and isinstance(given, str):
            FIELD_CHECKS[field.name](given)


def checked_config(
    cls: type[C], file: str | Path | None = None, *, flags: Mapping[str, str] | None = None, **settings: Any
) -> C:
    """``build_config`` and then ``config_values``: the config a command runs, checked before any model loads."""
    config = build_config(cls, file, **settings)
    config_values(config, flags)
    return config


def preset_values(preset: str) -> None:
    """Every value a preset file of one's own sets that has a rule (``RULES``), named by its table and key: its
    ``runs = -3`` is refused before the study starts, as ``--runs -3`` is (the packaged presets are checked by their
    tests; smoke's ``success_threshold = -1`` lets a random model's every test count)."""
    from dynheads.experiments.reproduce import PRESETS, resolve_preset

    resolve_preset(preset)  # a name, or a file whose base and tables are checked
    if preset in PRESETS:
        return
    for table, settings in tomllib.loads(Path(preset).read_text(encoding="utf-8")).items():
        for key, given in settings.items() if isinstance(settings, dict) else ():
            if key in RULES and given is not None:
                rule, what = RULES[key]
                value(f"preset table [{table}] {key}", what, rule, tuple(given) if isinstance(given, list) else given)


def batch_size(given: int) -> int:
    value("--batch-size", "batch size", at_least(1), given)
    return given


def policy_pair(given: str) -> tuple[str, str]:
    """``--pair TREATED,CONTROL`` of ``kv-join``: two policy names (a kvpress press keeps its ``kvpress:`` prefix)."""
    parts = [part.strip() for part in given.split(",")]
    if len(parts) != 2 or not all(parts):
        raise DynheadsError(f"--pair {given!r}: give two policies as TREATED,CONTROL, e.g. kvpress:head_tokens,full")
    return parts[0], parts[1]
