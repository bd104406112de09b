"""The head sources a run reads, loaded in one place with what they were fitted on, and refused where that overlaps
what the run evaluates (issue 35).

Two kinds of source: a **static head list** (a ranked JSON file, usually ``static_heads.json`` of a static stage)
and a **head predictor** (a folder written by ``dynheads predictor train``). What a source was fitted on is read
from beside it:

- question ids: a static list's run manifest (``questions``), a predictor's ``questions.json`` (required: a
  predictor that records none is refused);
- NIAH samples: the records of the run the source was made from (its folder, or the folder above; a predictor's
  ``metrics.json`` names its run): seeds and needle values, since NIAH sample ids repeat across seed streams;
- the stream: a static list's ``static_summary.json`` (``split``).

``Evaluated`` says what a run evaluates; ``fit_record`` checks a source against it and returns what the manifest
records (with the source's ``sha256``: a file's, or a folder's over its files, so runs can tell one list from
another whatever path named it); ``static_heads`` and ``head_predictor`` load a source after that check;
``resolve`` loads the sources that a run's variants declare they need (``STATIC_HEADS``, ``HEAD_PREDICTOR``) and
says why any is missing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dynheads.analysis.head_predictor import TrainedHeadPredictor, load_head_predictor
from dynheads.analysis.headlists import RankedHeads, load_head_list, scored_heads
from dynheads.errors import DynheadsError
from dynheads.heads import Head
from dynheads.io import content_sha256, read_json
from dynheads.models import model_difference
from dynheads.runs import RunDir
from dynheads.tasks.questions import refuse_overlap

STATIC_HEADS = "static head list"
HEAD_PREDICTOR = "head predictor"
UNCHECKED = "unknown: no run directory beside it"  # what the manifest records of a source whose fit is unknown
# what it records of a static list scored on NIAH and evaluated on a question task
NIAH_FIT = "no shared question: fitted on NIAH samples (the niah run beside the list), which are not questions"
QUESTIONS_FILE = "questions.json"  # beside a trained predictor: the question ids it was trained and validated on


@dataclass(frozen=True)
class Evaluated:
    """What a run evaluates, as the overlap checks read it."""

    run: str  # how an error names the evaluation ("this RAG run")
    questions: tuple[str, ...] = ()  # question ids (question tasks)
    samples: tuple[dict, ...] = ()  # NIAH: ``sample_identity`` of every evaluated sample
    split: str | None = None  # the evaluated stream: a static list whose summary names it is refused
    unknown_fit: Literal["record", "refuse"] = "record"  # a NIAH source with no run beside it: say so, or refuse
    way_out: str = ""  # the option that accepts such a source unchecked, named in the refusal ("--outside-heads")


def sample_identity(sample_id: str, seed: int | None, answer: str) -> dict:
    """What tells NIAH samples apart across seed streams: sample ids repeat (split-length-depth-run), seeds and
    needle values do not."""
    return {"sample_id": sample_id, "seed": None if seed is None else int(seed), "answer": answer}


def fit_record(path: str | Path, what: str, evaluated: Evaluated) -> dict[str, Any]:
    """Refuse the source at ``path`` (``STATIC_HEADS`` or ``HEAD_PREDICTOR``) where what it was fitted on overlaps
    ``evaluated``; return what the manifest records of it."""
    record: dict[str, Any] = {"path": str(path)}
    if Path(path).exists():  # a missing source is refused by its loader
        record["sha256"] = content_sha256(path)
    if what == STATIC_HEADS and evaluated.split is not None:
        record |= _refuse_same_stream(path, evaluated.split)
    if evaluated.samples:
        record |= _refuse_shared_samples(path, what, evaluated)
    elif what == HEAD_PREDICTOR:
        refuse_overlap(predictor_questions(path), f"the probe in {path}", evaluated.questions, evaluated.run)
        record["checked"] = "question ids"
    elif evaluated.questions:
        record["checked"] = _refuse_shared_questions(path, evaluated)
    return record


def predictor_questions(predictor_dir: str | Path) -> list[str]:
    """Question ids the predictor in ``predictor_dir`` was trained or validated on; refuses one that records none."""
    path = Path(predictor_dir) / QUESTIONS_FILE
    if not path.is_file():
        raise DynheadsError(
            f"the probe in {predictor_dir} records no training questions ({QUESTIONS_FILE}), so it "
            "cannot be shown disjoint from the evaluation: retrain it with 'dynheads predictor train'"
        )
    data = read_json(path)
    return sorted(set(data.get("train", [])) | set(data.get("validation", [])))


def _refuse_shared_questions(path: str | Path, evaluated: Evaluated) -> str:
    """A static list scored on a run whose manifest records its questions; a list scored on NIAH samples shares no
    question by construction; a list from elsewhere passes, recorded as unknown."""
    manifest = Path(path).parent / "manifest.json"
    beside = read_json(manifest) if manifest.is_file() else {}
    if beside.get("kind") == "niah":
        return NIAH_FIT
    if not beside.get("questions"):
        return "unknown: no run manifest with questions beside the list"
    refuse_overlap(beside["questions"]["ids"], f"the {STATIC_HEADS} {path}", evaluated.questions, evaluated.run)
    return "question ids"


def _refuse_shared_samples(path: str | Path, what: str, evaluated: Evaluated) -> dict[str, Any]:
    """A source fitted on a NIAH sample with an evaluated seed or needle value is refused."""
    run = _fitted_run(path)
    if run is None:
        if evaluated.unknown_fit == "refuse":
            unchecked = f"pass {evaluated.way_out} to use it unchecked (the run records that)"
            way_out = f": {unchecked}" if evaluated.way_out else ""
            raise DynheadsError(
                f"cannot tell which samples the {what} {path} was fitted on (no run directory beside "
                f"it), so its disjointness from the evaluation cannot be checked{way_out}"
            )
        return {"checked": UNCHECKED}
    fitted = [sample_identity(r["sample_id"], r.get("seed"), r.get("answer", "")) for r in run.records()]
    seeds, answers = {f["seed"] for f in fitted}, {f["answer"] for f in fitted}
    shared = [e["sample_id"] for e in evaluated.samples if e["seed"] in seeds or e["answer"] in answers]
    if shared:
        raise DynheadsError(
            f"the {what} {path} was fitted on {len(shared)} of the evaluation samples "
            f"(e.g. {shared[0]}): evaluate on another seed stream (--split / --seed)"
        )
    return {"checked": "seeds and needle values", "run": str(run.path), "samples": fitted}


def refuse_other_model(path: str | Path, what: str, model: dict[str, Any] | None) -> None:
    """Refuse a source made from a run of another model than ``model`` (a run manifest's ``model``): its head
    numbers, or its predictor's hidden states, belong to that model even where the shapes agree. Nothing to check
    without a run beside the source; a folder's revision ("local") pins nothing and is not compared."""
    run = _fitted_run(path)
    fitted = run.manifest().get("model") if run is not None and model else None
    differ = model_difference(model, fitted)
    if differ is None:  # the same model, or either not recorded
        return
    key, mine, theirs = differ
    raise DynheadsError(
        f"the {what} {path} comes from a run of another model ({(fitted or {}).get('name')}: {key} {theirs}; "
        f"this run's {(model or {}).get('name')}: {mine}): fit it on this model's run"
    )


def _fitted_run(path: str | Path) -> RunDir | None:
    """The run a source was made from: the run its ``metrics.json`` names, its folder, or the folder above."""
    source = Path(path)
    folder = source if source.is_dir() else source.parent
    metrics = folder / "metrics.json"
    named = read_json(metrics).get("run") if metrics.is_file() else None
    for candidate in (Path(named) if named else folder, folder, folder.parent):
        if (candidate / "manifest.json").is_file():
            return RunDir(candidate)
    return None


def _refuse_same_stream(path: str | Path, split: str) -> dict[str, Any]:
    """What fitted the static list (its ``static_summary.json``, when a static stage wrote it; a score's list
    ``static_heads-<score>.json`` has ``static_summary-<score>.json``); a list fitted on the stream being evaluated is
    refused."""
    name = Path(path).name
    summary_name = "static_summary" + name.removeprefix("static_heads") if name.startswith("static_heads-") else ""
    summary_path = Path(path).parent / (summary_name or "static_summary.json")
    if not summary_path.is_file():
        return {"file": str(path), "fitted_on": f"unknown: no {summary_path.name} beside the list"}
    summary = read_json(summary_path)
    fitted_split = summary.get("split")
    if fitted_split == split:
        raise DynheadsError(f"the static list {path} was fitted on the {fitted_split!r} stream, the one evaluated here")
    config = summary.get("config", {})
    fitted = {key: config.get(key) for key in ("seed", "lengths", "depths", "samples", "questions", "first", "data")}
    return {
        "file": str(path),
        "fitted_on": {
            "split": fitted_split,
            "tests": summary.get("num_tests"),
            "counted": summary.get("num_counted"),
            **{k: v for k, v in fitted.items() if v is not None},
        },
    }


@dataclass(frozen=True)
class StaticSource:
    """A static head list: every head as the file ranks it, the heads with a positive score (best first; never
    zero-score filler) and what it was fitted on."""

    heads: RankedHeads
    ranking: tuple[Head, ...]
    fitted: dict[str, Any]


@dataclass(frozen=True)
class PredictorSource:
    """A trained head predictor and what it was fitted on."""

    predictor: TrainedHeadPredictor
    fitted: dict[str, Any]

    def top_heads(self, hidden, k: int) -> list[Head]:
        return self.predictor.top_heads(hidden, k)


def static_heads(
    path: str | Path, shape: tuple[int, int], evaluated: Evaluated, model: dict[str, Any] | None = None
) -> StaticSource:
    """The static list at ``path`` for a model of ``shape`` (layers, heads), checked against ``evaluated`` and, given
    the run's ``model`` (its manifest entry), against the model of the run it was scored on; a list with no positive
    score is refused."""
    fitted = fit_record(path, STATIC_HEADS, evaluated)
    refuse_other_model(path, STATIC_HEADS, model)
    heads = load_head_list(path, *shape)
    ranking = scored_heads(heads)
    if not ranking:
        raise DynheadsError(f"{path} gives every head a zero score: it names no static head")
    return StaticSource(heads, ranking, fitted)


def head_predictor(
    path: str | Path, shape: tuple[int, int], evaluated: Evaluated, model: dict[str, Any] | None = None
) -> PredictorSource:
    """The predictor in ``path``, checked against ``evaluated``, the model's ``shape`` and (given the run's
    ``model``) the model of the run it was trained on."""
    fitted = fit_record(path, HEAD_PREDICTOR, evaluated)
    refuse_other_model(path, HEAD_PREDICTOR, model)
    predictor = load_head_predictor(path)
    if (predictor.num_layers, predictor.num_heads) != tuple(shape):
        raise DynheadsError(
            f"the {HEAD_PREDICTOR} in {path} predicts {predictor.num_layers} x {predictor.num_heads} heads, "
            f"but this model has {shape[0]} x {shape[1]}: train it on this model's run"
        )
    return PredictorSource(predictor, fitted)


@dataclass(frozen=True)
class Resources:
    """The sources a run's variants need, loaded and checked; ``missing``: a needed source not given, and why."""

    static: StaticSource | None = None
    predictor: PredictorSource | None = None
    missing: dict[str, str] = field(default_factory=dict)

    @property
    def static_ranking(self) -> tuple[Head, ...]:
        """The static list's scored heads, best first (() without a list)."""
        return self.static.ranking if self.static else ()

    def manifest(self) -> dict[str, Any]:
        """What the run's manifest records of its sources."""
        return {
            STATIC_HEADS: self.static.fitted if self.static else None,
            HEAD_PREDICTOR: self.predictor.fitted if self.predictor else None,
        }


def needs_of(variants: Iterable[object]) -> set[str]:
    """The sources that registered variants declare (their ``needs_static`` / ``needs_probe`` fields)."""
    needs = set()
    for variant in variants:
        if getattr(variant, "needs_static", False):
            needs.add(STATIC_HEADS)
        if getattr(variant, "needs_probe", False):
            needs.add(HEAD_PREDICTOR)
    return needs


def resolve(
    needs: Iterable[str],
    *,
    static: str | Path | None,
    predictor: str | Path | None,
    shape: tuple[int, int],
    evaluated: Evaluated,
    model: dict[str, Any] | None = None,
) -> Resources:
    """Load (and check) every source in ``needs`` that was given (against the run's ``model`` too, its manifest
    entry, when given); a needed source not given is in ``missing`` with the option that gives it (a runner refuses
    it, or skips the variants that need it)."""
    needed = set(needs)
    unknown = needed - {STATIC_HEADS, HEAD_PREDICTOR}
    if unknown:
        raise DynheadsError(f"unknown head source {sorted(unknown)[0]!r}: use {STATIC_HEADS!r} or {HEAD_PREDICTOR!r}")
    missing = {}
    if STATIC_HEADS in needed and not static:
        missing[STATIC_HEADS] = "no --static head list given"
    if HEAD_PREDICTOR in needed and not predictor:
        missing[HEAD_PREDICTOR] = "no --predictor (trained head predictor) given"
    return Resources(
        static_heads(static, shape, evaluated, model) if STATIC_HEADS in needed and static else None,
        head_predictor(predictor, shape, evaluated, model) if HEAD_PREDICTOR in needed and predictor else None,
        missing,
    )
