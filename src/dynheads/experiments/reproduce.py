"""``dynheads reproduce``: every stage of the paper in order, into sub-folders of one directory.

A stage of the study is one entry of ``dynheads.stages.STAGES``: its runner (a function of the ``Study``, imported
when the study runs it; the paper's are in ``paper_stages``) builds its config from the preset's table and runs into
its folder. ``reproduce`` runs the study's stages (``stages.study_stages``: every stage that is not optional, and the
optional ones the preset has a table for) in the registry's order.

Each stage is resumable on its own (run directories skip finished samples; analysis stages are skipped when
their output exists), so an interrupted ``reproduce`` continues where it stopped and ends with the same
stage outputs. Stage wall times are recorded in ``stages.json``.

Under a launcher (``torchrun`` / ``accelerate launch``, ``dynheads.distributed``) the processes go through the
stages together: a stage whose runner deals samples (``deals_samples``: its ``runs.run_jobs`` gives each rank its
share) runs on every rank; any other stage (an analysis of finished runs) runs on rank 0 alone, with the CPU
threads of every process on this machine while the others wait; every stage ends at a barrier, so the next one
reads finished files. On a CPU, two one-thread processes ran the standard study in half the time of one two-thread
process (docs/results/2026-11-study-cost-processes-smollm2.md). The report (``dynheads.report.write_report``)
is written from the finished folder by the caller (the CLI's ``reproduce`` command): experiments never import
the report.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
import tomllib
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from dynheads import distributed, stages
from dynheads.analysis.settings import HeadPredictorConfig
from dynheads.config import as_tuples, check_types
from dynheads.errors import DynheadsError, did_you_mean
from dynheads.experiments import study_time
from dynheads.io import read_json, write_json
from dynheads.models import LoadedModel, load_model
from dynheads.runs import RunDir, RunOptions, start_run
from dynheads.scores import DEFAULT_REASONING_THRESHOLD
from dynheads.settings import ReproduceConfig
from dynheads.tasks.hotpotqa import HOTPOTQA
from dynheads.tasks.questions import QuestionStream, disjoint_streams
from dynheads.tasks.registry import Task, task_of
from dynheads.views.threshold_fit import ThresholdFit, fit_threshold

PRESET_FOLDER = Path(__file__).resolve().parent.parent / "presets"


def load_preset(name: str) -> dict:
    """``presets/<name>.toml``: one table of settings per stage (keyed like the stage's config), plus
    ``qa_source`` (questions when no HotpotQA file is given), ``batch_size`` (records decoded together unless the
    command gives one; default 1, the reference path) and, for ``paper``, ``sources``."""
    with (PRESET_FOLDER / f"{name}.toml").open("rb") as file:
        return _checked_tables(tomllib.load(file))


def _checked_tables(preset: dict) -> dict:
    """``preset``, once every table names a registered stage (``stages.STAGES``): a misspelt one would silently
    set nothing."""

    def tables(mapping: dict) -> list[str]:
        return [key for key, value in mapping.items() if isinstance(value, dict)]

    stages.STAGES.check([key for key in tables(preset) if key != "sources"] + tables(preset.get("sources", {})))
    return preset


# smoke: seconds, any model (the test suite's); quick: a 2-core CPU in minutes; standard: every verdict at the
# evidence floor (30 samples per arm); paper: the paper's sizes (GPU)
PRESETS = {name: load_preset(name) for name in ("smoke", "quick", "standard", "paper")}
# Where each value of the ``paper`` preset comes from, per stage (recorded in the manifest of a paper run).
PAPER_PRESET_SOURCES = PRESETS["paper"]["sources"]


def resolve_preset(preset: str) -> dict:
    """A packaged preset by name, or a preset file of one's own (``my-study.toml``): ``base = "standard"`` (a
    packaged preset, required) and the tables that change, each merged key by key over the base's table of that
    stage (docs/report.md, "Your own preset")."""
    if preset in PRESETS:
        return PRESETS[preset]
    path = Path(preset)
    if path.suffix != ".toml" or not path.is_file():
        raise DynheadsError(
            f"unknown preset {preset!r}: use {', '.join(PRESETS)} or a .toml preset file of your own"
            + did_you_mean(preset, PRESETS)
        )
    try:
        own = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise DynheadsError(f"preset file {path} is not valid TOML: {error}") from None
    base = own.pop("base", None)
    if base not in PRESETS:
        raise DynheadsError(
            f'preset file {path} must name its base, one of {", ".join(PRESETS)} (base = "standard"), '
            f"got {base!r}: its tables change the base's"
        )
    merged = copy.deepcopy(PRESETS[base])  # the packaged preset stays as it is
    for key, value in own.items():
        both_tables = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = {**merged[key], **value} if both_tables else value
    return check_stage_settings(_checked_tables(merged), f"preset file {path}")


RETIRED = {
    "relative_doses": "relative_doses (a fixed k heads per step, from the mean |D_t|) are retired: past |D_t| they "
    "measure compensation; give fractions of each step's |D_t| (fractions = [0.25, 0.5, 0.75, 1.0], compensation "
    "= [1.5, 2.0]; docs/ablation.md)"
}


def check_stage_settings(preset: dict, source: str) -> dict:
    """``preset``, once each table of a stage that builds a config (``Stage.config``) names only that config's
    settings, each of its declared type: a misspelt key or a string for a list is refused before any model loads
    or any file is written (``source`` names the preset in the message)."""
    for name in stages.STAGES.names():
        config, table = stages.STAGES.get(name).config_class(), stages.preset_table(name)
        if config is None or table not in preset:
            continue
        settings = stage_settings(preset, name)
        retired = [RETIRED[key] for key in settings if key in RETIRED]
        if retired:
            raise DynheadsError(f"{source}, table [{table}]: {retired[0]}")
        fields = [field.name for field in dataclasses.fields(config)]
        unknown = [key for key in settings if key not in fields]
        if unknown:
            raise DynheadsError(
                f"{source}, table [{table}]: no setting {unknown[0]!r}{did_you_mean(unknown[0], fields)}"
            )
        check_types(config, settings, f"{source}, table [{table}]")
    return preset


def stage_settings(preset: Mapping, stage: str) -> dict:
    """The preset's table for ``stage`` (``stages.preset_table``), its lists as tuples (configs hold tuples)."""
    table = preset.get(stages.preset_table(stage), {})
    return {key: as_tuples(value) for key, value in table.items()}


ANY = "*"  # what a stage logged without its reads is taken to have read


class PresetReads(Mapping[str, Any]):
    """A study's preset as its stages see it (``Study.preset``), noting what they read: ``"table.key"`` for a key
    read from a table, ``"table.*"`` when a table's keys are listed (``stage_settings`` builds a config from all of
    them), ``"key"`` for a top-level value or a table looked up whole or found missing. ``_Stages`` logs each stage's
    reads, so a study may resume under a preset changed where no finished stage read it (``_check_same_preset``)."""

    def __init__(self, tables: dict, reads: set[str] | None = None, prefix: str = ""):
        self._tables, self._prefix = tables, prefix
        self.reads: set[str] = set() if reads is None else reads

    def __getitem__(self, key: str) -> Any:
        self.reads.add(self._prefix + key)
        value = self._tables[key]
        return PresetReads(value, self.reads, f"{key}.") if isinstance(value, dict) and not self._prefix else value

    def __iter__(self) -> Iterator[str]:
        self.reads.add(self._prefix + "*")
        return iter(self._tables)

    def __len__(self) -> int:
        self.reads.add(self._prefix + "*")
        return len(self._tables)


class _Stages:
    """Runs named stages once each. A stage is logged in ``stages.json`` (with the wall time of the attempt that
    finished it) only after it completes, so a re-run skips finished stages and resumes the interrupted one; a stage
    logged as failed (its error) is tried again, so a re-run after a fix (a missing input, a value of one's own
    preset) completes the study. Every process of a launch reads the log before any stage runs (and rank 0 alone
    writes it), so all of them skip the same stages and meet at the same barriers."""

    def __init__(self, out: Path):
        self.out, self.log_path = out, out / "stages.json"
        self.log: dict = read_json(self.log_path) if self.log_path.is_file() else {}

    def done(self, name: str) -> bool:
        """Whether ``name`` completed in an earlier run and the folder it left is still there (a failed stage is not
        done, nor one whose folder was deleted or not copied with the study: it runs again; a stage logged before
        ``folder`` was recorded is taken to have left one)."""
        if not self.finished(name):
            return False
        return not self.log[name].get("folder", True) or (self.out / name).is_dir()

    def finished(self, name: str) -> bool:
        """Whether ``name`` is logged as having completed (its folder there or not): what it read of the preset
        binds the study, whose later stages were built on it."""
        return isinstance(self.log.get(name), dict) and "error" not in self.log[name]

    def reads(self, name: str) -> set[str]:
        """What stage ``name`` read of the preset when it ran (``PresetReads``); a stage logged before reads were
        logged is taken to have read it all (``ANY``)."""
        return set(self.log[name].get("reads", [ANY]))

    def run(self, name: str, fn: Callable[[], object], *, every_rank: bool, preset: PresetReads) -> None:
        """Run ``fn`` unless logged (on every rank, or on rank 0 alone with this machine's threads, see the module
        docstring); a stage this model cannot support (a ``DynheadsError``, e.g. constant head scores for CCA) is
        logged with its reason, which the report shows, and the study goes on."""
        stages.STAGES.check([name])  # a stage the report could not find is refused before it runs
        if self.done(name):
            return
        if every_rank or distributed.is_main():
            preset.reads.clear()
            with nullcontext() if every_rank else local_threads():
                entry = {**_attempt(name, fn), "reads": sorted(preset.reads)}
            if distributed.is_main():
                if "error" not in entry:  # whether it left its folder (``done`` checks the folder is still there)
                    entry["folder"] = (self.out / name).is_dir()
                self.log[name] = entry
                write_json(self.log_path, self.log)
        distributed.barrier()  # the next stage reads this one's files


def _attempt(name: str, fn: Callable[[], object]) -> dict:
    """Run one stage: its wall time, and the error when the model cannot support it."""
    print(f"[reproduce] {name}", flush=True)
    start = time.perf_counter()
    try:
        fn()
        return {"seconds": round(time.perf_counter() - start, 1)}
    except DynheadsError as error:
        print(f"[reproduce] {name} failed: {error}", flush=True)
        return {"seconds": round(time.perf_counter() - start, 1), "error": str(error)}


@contextmanager
def local_threads() -> Iterator[None]:
    """While rank 0 runs a stage alone, torch uses the CPU threads of every process of this launch on this machine
    (the others wait at a barrier, which takes no CPU), no more than the usable cores; one process: unchanged."""
    threads = torch.get_num_threads()
    torch.set_num_threads(distributed.pooled_threads(threads))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reproduce(
    config: ReproduceConfig,
    out: str | Path,
    *,
    lm: LoadedModel | None = None,
    progress: bool = True,
    processes: int = 1,
    batch_size: int | None = None,
    only: Collection[str] | None = None,
) -> Path:
    """Run the whole study into ``out`` (one sub-folder per stage of ``stages.study_stages``, in order); returns
    ``out``, ready for ``write_report`` (by rank 0, under a launcher). ``processes`` > 1: the study runs in that many
    processes started here (``distributed.spawn``, each loading the model, with its share of the CPU threads), as
    under ``torchrun``; this process waits for them. ``batch_size`` > 1: every stage that decodes decodes that many
    records together (results equal batch 1's up to fp32 rounding; the manifest records it); None: the preset's
    ``batch_size`` (``standard``: 4), else 1. ``only``: run just these stages of the study (the others are left
    as they are, to run later into the same folder; a stage that reads another's output needs it run)."""
    preset = resolve_preset(config.preset)
    stage_tables = {key: value for key, value in preset.items() if key != "sources"}
    names = _selected(stages.study_stages(stage_tables), only)  # refused before any model loads
    batch_size = preset.get("batch_size", 1) if batch_size is None else batch_size
    if processes < 1:
        raise DynheadsError(f"processes must be at least 1, got {processes}")
    if batch_size < 1:
        raise DynheadsError(f"batch size must be at least 1, got {batch_size}")
    if processes > 1:
        if lm is not None:
            raise DynheadsError("each of several processes loads its own model: pass no lm with processes > 1")
        distributed.spawn(
            partial(reproduce, config, out, progress=progress, batch_size=batch_size, only=only), processes
        )
        return Path(out)
    out = Path(out)
    lm = lm or load_model(config.model, dtype=config.dtype, device=config.device)
    log = _Stages(out)  # read by every rank before the first barrier (see _Stages)
    manifest = start_run(
        RunDir(out),
        "reproduce",
        config,
        lm,
        {
            "folder": str(out.resolve()),  # where it was written: its report shows paths inside it relative to it
            "preset_settings": _jsonable(stage_tables),
            **({"preset_sources": preset["sources"]} if "sources" in preset else {}),
        },
        batch_size=batch_size,
    )
    _check_same_preset(RunDir(out), manifest, _jsonable(stage_tables), log)
    study = Study(config, PresetReads(preset), out, lm, progress, log, batch_size)
    runners = {name: stages.STAGES.get(name).runner() for name in names}  # a misnamed one fails before any stage runs
    dealt = {name for name in names if stages.STAGES.get(name).deals_samples}  # the others run on rank 0 alone
    to_run = [n for n in names if not log.done(n)]
    seconds = _announce_estimate(config.preset, stage_tables, to_run, dealt, lm) if progress else {}
    for index, name in enumerate(names, 1):
        if progress and distributed.is_main():
            left = sum(seconds.get(later, 0.0) for later in names[index - 1 :])
            print(study_time.progress_line(index, len(names), name, left, done=log.done(name)), flush=True)
        study.log.run(name, partial(runners[name], study), every_rank=name in dealt, preset=study.preset)
    return out


def _selected(names: list[str], only: Collection[str] | None) -> list[str]:
    """The study's stages ``names`` that ``only`` keeps (all when None), in run order; an unknown name is refused."""
    if only is None:
        return names
    if not only:
        raise DynheadsError(f"no stage named to run: name some of {', '.join(names)}")
    unknown = sorted(set(only) - set(names))
    if unknown:
        raise DynheadsError(
            f"no stage {unknown[0]!r} in this study: its stages are {', '.join(names)}{did_you_mean(unknown[0], names)}"
        )
    return [name for name in names if name in only]


def _announce_estimate(
    preset: str, tables: dict, to_run: list[str], dealt: Collection[str], lm: LoadedModel
) -> dict[str, float]:
    """Rank 0 times the loaded model once and prints the study's estimated total (``study_time``; the stages of
    ``dealt`` share their samples over the processes); the seconds per stage still to run (none on the other ranks,
    which print nothing)."""
    if not distributed.is_main() or not to_run:
        return {}
    calibration = study_time.calibrate(lm, min(CALIBRATION_PROMPT, lm.max_context or CALIBRATION_PROMPT))
    seconds = study_time.estimate_seconds(tables, to_run, calibration, distributed.rank_and_world()[1], dealt)
    print(study_time.estimate_line(preset, seconds, calibration), flush=True)
    return seconds


CALIBRATION_PROMPT = 256  # tokens of the prompt the estimate's calibration prefills


@dataclass(frozen=True)
class Study:
    """What every stage of one study shares: its config and preset, its folder, the model and the stage log."""

    config: ReproduceConfig
    preset: PresetReads
    out: Path
    lm: LoadedModel
    progress: bool
    log: _Stages
    batch_size: int = 1

    def settings(self, stage: str, **extra) -> dict:
        """What a stage's config is built from: the preset's table, the study's model and seed, ``extra``."""
        config = self.config
        common = dict(model=config.model, seed=config.seed, dtype=config.dtype, device=config.device)
        return {**stage_settings(self.preset, stage), **common, **extra}

    def folder(self, stage: str) -> Path:
        return self.out / stage

    @property
    def options(self) -> RunOptions:
        """What every runner of the study is given: the loaded model, whether to draw progress bars, and how many
        records to decode together."""
        return {"lm": self.lm, "progress": self.progress, "batch_size": self.batch_size}

    @property
    def static_file(self) -> Path:
        """The NIAH static list (Eq. 1, Wu et al.'s retrieval heads)."""
        return self.out / stages.STATIC / "static_heads.json"

    @property
    def probe_config(self) -> HeadPredictorConfig:
        return HeadPredictorConfig(**stage_settings(self.preset, stages.PROBE), seed=self.config.seed)

    @property
    def offsets(self) -> tuple[int, ...]:
        """The CCA's temporal offsets (NIAH's and HotpotQA's)."""
        return stage_settings(self.preset, stages.CCA)["offsets"]

    @property
    def questions(self) -> Questions:  # built at each use, so each stage's reads of the preset are logged
        return Questions.of(self)


@dataclass(frozen=True)
class Questions:
    """What the HotpotQA-side stages share: the questions' source and task, the disjoint question streams, the
    reasoning head list, and Eq. 2's threshold rule with the traces it is fitted on. The streams and the threshold
    are read from the preset when a stage asks for them, so each stage's log names only what it read."""

    data: str | None
    task: Task
    preset: Mapping
    reasoning_file: Path
    fit_stream: Path

    @classmethod
    def of(cls, study: Study) -> Questions:
        data = study.config.hotpotqa or study.preset.get("qa_source")  # a HotpotQA file, when given, always wins
        return cls(
            data=data,
            task=task_of(HOTPOTQA.name, data),  # HotpotQA, or the multi-hop task standing for it
            preset=study.preset,
            reasoning_file=study.out / stages.HOTPOTQA_STATIC / "static_heads.json",
            fit_stream=study.out / stages.HOTPOTQA_STATIC,
        )

    @property
    def threshold(self) -> str | float:
        """Eq. 2's threshold (a calibrated one is fitted on the static stream's traces, which nothing evaluates)."""
        return stage_settings(self.preset, stages.HOTPOTQA_DYNAMISM).get("threshold", DEFAULT_REASONING_THRESHOLD)

    def fit(self) -> ThresholdFit:  # fitted when a stage needs it: the static stage may have failed
        return fit_threshold(self.threshold, self.task.score_kind, self.fit_stream)

    def grid(self, study: Study, stage: str, stream: str, **extra) -> dict:
        """A QA stage's settings on its own question stream (disjoint question ranges: nothing is fitted and
        evaluated on one question)."""
        return study.settings(stage, data=self.data, first=hotpot_streams(self.preset, stream)[stream].first, **extra)


QA_STREAMS = (  # the HotpotQA question streams of a study, end to end in this order, and the stage of each
    ("static", stages.HOTPOTQA_STATIC),
    ("analysis", stages.HOTPOTQA),  # the traced analysis run (dynamism, CCA, probe)
    ("ablation", stages.HOTPOTQA_ABLATION),
    ("progressive", stages.HOTPOTQA_PROGRESSIVE),
    ("rag", stages.RAG),
)


def hotpot_streams(preset: Mapping, through: str | None = None) -> dict[str, QuestionStream]:
    """The HotpotQA question streams of a study (``QA_STREAMS``), or those up to stream ``through``: where a stream
    starts depends only on the streams before it, and a stage reads no more of the preset than that."""
    names = [name for name, _ in QA_STREAMS]
    order = QA_STREAMS[: names.index(through) + 1] if through else QA_STREAMS
    return disjoint_streams([(name, preset[stage]["questions"]) for name, stage in order])


def _check_same_preset(run: RunDir, manifest: dict, tables: dict, log: _Stages) -> None:
    """A study resumes under the preset tables it started with, or under tables changed only where no finished
    stage read them (``PresetReads``: a failed stage runs again under its edited table; a newer dynheads may have
    changed a preset): else its finished stages and the rest would follow two designs. A change that is let through
    is written into the manifest's ``preset_settings``, which then describes every stage's settings."""
    recorded = manifest.get("preset_settings")
    if recorded is None or recorded == tables:
        return
    changed = _changed_paths(recorded, tables)
    blocked = {name: sorted(log.reads(name) & changed) for name in log.log if log.finished(name)}
    blocked = {name: paths for name, paths in blocked.items() if paths}
    if blocked:
        name, paths = next(iter(blocked.items()))
        tables_changed = sorted({path.split(".")[0] for path in changed - {ANY}})
        what = "the whole preset" if ANY in paths else ", ".join(paths)
        raise DynheadsError(
            f"{run.path} was started under other settings of preset {manifest['config'].get('preset')!r} (the tables "
            f"{', '.join(tables_changed)} differ now, e.g. after an update of dynheads or an edit of the preset "
            f"file), and its finished stage {name} read {what}"
            f"{f' (and {len(blocked) - 1} more finished stage(s))' if len(blocked) > 1 else ''}: set those back, "
            "resume it with the version that started it, or choose another --out (a value only unfinished stages "
            "read may change)"
        )
    if distributed.is_main():
        write_json(run.manifest_path, {**manifest, "preset_settings": tables})
        print(
            f"[reproduce] preset changed where no finished stage read it: {', '.join(sorted(changed - {ANY}))}",
            flush=True,
        )


def _changed_paths(recorded: dict, tables: dict) -> set[str]:
    """Where two presets differ, as ``PresetReads`` names its reads: ``table.key`` and, for a table changed
    key by key, ``table.*`` (its list of keys); ``key`` for a top-level value or a table added or removed; and
    ``ANY``, which a stage logged before reads were logged is taken to have read."""
    changed = {ANY}
    for key in set(recorded) | set(tables):
        old, new = recorded.get(key), tables.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            keys = {sub for sub in set(old) | set(new) if old.get(sub) != new.get(sub)}
            changed |= {f"{key}.{sub}" for sub in keys} | ({f"{key}.*"} if keys else set())
        elif old != new:
            changed.add(key)
    return changed


def _jsonable(value: dict) -> dict:
    return json.loads(json.dumps(value, default=str))
