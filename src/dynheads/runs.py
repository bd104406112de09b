"""Run directories: the artifact every command writes, resumable and crash-safe.

Layout (docs/formats.md)::

    RUN_DIR/
      manifest.json            resolved config, model id/revision, library versions, seed, prompt template
      samples/<sample_id>.json one record per finished sample (settings, generated text, metrics)
      traces/<sample_id>.parquet   per-step head scores and hidden states (see dynheads.traces)
      results.csv              all records in one table, rewritten when the run finishes

A sample is finished when its record exists. The trace is written first and the record last, each
atomically, so a crash at any moment loses at most the batch in flight and leaves no partial file.
Re-running the same command skips finished samples; a different config in the same folder is refused.

``run_jobs`` is the one loop every resumable command shares (tracing, ablation, RAG, KV, HaluEval): it hands the
unfinished jobs to a batch function ``batch_size`` at a time and writes one record per job. Under ``torchrun`` /
``accelerate launch`` each process takes its share of the jobs (``dynheads.distributed``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import re
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypedDict, TypeVar, Unpack

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from dynheads import distributed
from dynheads.config import settings_of
from dynheads.errors import DynheadsError
from dynheads.io import atomic_path, format_version, read_json, remove_temporaries, write_json
from dynheads.models import LoadedModel, library_versions, load_model, model_difference
from dynheads.scores import LOCAL_WINDOW, SINK_SIZE
from dynheads.thresholds import chance_per_step
from dynheads.traces import Trace

# 1: no format_version key (manifests before it existed); 2: the key is written
MANIFEST_FORMAT_VERSION = 2


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_STEM_LIMIT = 100


def file_stem(sample_id: str) -> str:
    """The file name (without suffix) a sample's record, trace or figure is saved under: the id itself where it is
    a safe file name, else its safe characters (others as ``_``) and a digest of the whole id, so ids that differ
    never share a file."""
    safe = _UNSAFE.sub("_", sample_id)
    if safe == sample_id and not sample_id.startswith(".") and 0 < len(sample_id) <= _STEM_LIMIT:
        return sample_id
    digest = hashlib.sha256(sample_id.encode("utf-8")).hexdigest()[:10]
    return f"{safe.lstrip('.')[:_STEM_LIMIT] or 'sample'}-{digest}"


def _run_json(path: Path) -> Any:
    """A run's JSON file (its manifest, a record), or one line naming it when it is not JSON (a hand edit; dynheads
    writes them whole, ``io.write_json``)."""
    try:
        return read_json(path)
    except (ValueError, UnicodeDecodeError) as error:
        raise DynheadsError(f"{path} is not valid JSON ({error}): restore it, or delete it to recompute it") from None


class RunDir:
    """A run directory (docs/formats.md): ``manifest.json``, ``samples/<id>.json``, ``traces/<id>.parquet``, ...

    Reading: ``manifest()`` (refused in one line where the folder holds none), ``records()`` (the finished records,
    in sample-id order), ``load_trace(sample_id)`` and ``iter_traces()``. Writing: ``start`` (or check, to resume)
    the manifest, ``save_sample`` each finished record. Making one reads nothing: a path that is no run is refused
    when it is read."""

    def __init__(self, path: str | os.PathLike):
        if not isinstance(path, str | os.PathLike):
            raise DynheadsError(f"a run directory is a path, got {type(path).__name__}")
        self.path = Path(path)

    def __fspath__(self) -> str:
        """A ``RunDir`` goes wherever a run's path does (``compare_records(RunDir(...), ...)``, ``Path(run)``)."""
        return str(self.path)

    @property
    def manifest_path(self) -> Path:
        """``RUN_DIR/manifest.json``."""
        return self.path / "manifest.json"

    def exists(self) -> bool:
        """Whether the folder holds a manifest (a run was started in it)."""
        return self.manifest_path.is_file()

    def manifest(self) -> dict:
        """The run's manifest (docs/formats.md); refused in one line where there is none or it is newer than this
        code reads."""
        if not self.exists():
            raise DynheadsError(f"{self.path} is not a dynheads run directory (no manifest.json)")
        manifest = _run_json(self.manifest_path)
        format_version(manifest.get("format_version"), MANIFEST_FORMAT_VERSION, "run manifest", self.manifest_path)
        return manifest

    def refuse_other_kind(self, kind: str) -> None:
        """One line where this folder holds a run of another kind (an ``--out`` that would be overwritten)."""
        other = self.manifest().get("kind") if self.exists() else kind
        if other != kind:
            raise DynheadsError(f"{self.path} holds a {other} run: choose another --out")

    def restart(self, kind: str, config: Any, lm: LoadedModel | None, extra: dict | None = None) -> dict:
        """Start a run that recomputes everything from its sources (``detect``, ``detect-transfer``): a run of another
        kind is refused; its own earlier manifest and the temporary files a killed write left are removed first."""
        self.refuse_other_kind(kind)
        self.manifest_path.unlink(missing_ok=True)
        remove_temporaries(self.path)
        return self.start(kind, config, lm, extra)

    def start(self, kind: str, config: Any, lm: LoadedModel | None, extra: dict | None = None) -> dict:
        """Write the manifest of a new run, or check that an existing one has the same config (resume)."""
        config_dict = settings_of(config)
        if self.exists():
            previous = self.check_resume(kind, config)
            if lm is not None:
                self._check_model(previous.get("model"), lm.describe())
            return previous
        manifest = {
            "format_version": MANIFEST_FORMAT_VERSION,
            "kind": kind,
            "config": config_dict,
            "model": lm.describe() if lm is not None else None,
            "versions": library_versions(),
            "python": platform.python_version(),
            "seed": config_dict.get("seed"),
            **(extra or {}),
        }
        write_json(self.manifest_path, manifest)
        return self.manifest()

    def check_resume(self, kind: str, config: Any) -> dict:
        """The manifest of this existing run, refused (naming the settings that differ) unless a run of ``kind``
        under ``config`` resumes it: what ``start`` checks, and what the CLI checks before any model loads."""
        previous = self.manifest()
        if previous.get("kind") != kind:
            raise DynheadsError(
                f"{self.path} already holds a different run (a '{previous.get('kind')}' run, not a '{kind}' "
                "one): choose another --out"
            )
        differs = setting_differences(previous.get("config") or {}, _resumable(config, previous.get("config")))
        if differs:
            raise DynheadsError(
                f"{self.path} already holds a different run ({differs}); "
                "resume it with the same settings or choose another --out"
            )
        return previous

    def _check_model(self, previous: dict | None, now: dict) -> None:
        """Refuse to resume with another model than the run's: under the same ``--model`` a hub cache updated to
        another commit, a GGUF file replaced, or a folder holding another shape. A folder's revision ("local")
        pins nothing and is not compared."""
        differ = model_difference(previous, now)
        if differ is not None:
            key, was, is_now = differ
            raise DynheadsError(
                f"{self.path} was run with another model ({key} {was} there, {is_now} now, for the same "
                "--model): resume it with its model or choose another --out"
            )

    # ---- samples ----------------------------------------------------------------------------------
    def record_path(self, sample_id: str) -> Path:
        """``samples/<file stem>.json`` (``file_stem``: the id itself where it is a safe file name)."""
        return self.path / "samples" / f"{file_stem(sample_id)}.json"

    def trace_path(self, sample_id: str) -> Path:
        """``traces/<file stem>.parquet``."""
        return self.path / "traces" / f"{file_stem(sample_id)}.parquet"

    def is_done(self, sample_id: str) -> bool:
        """Whether the sample's record exists (written last: the sample is finished)."""
        return self.record_path(sample_id).is_file()

    def save_sample(self, record: dict, trace: Trace | None = None, arrays: dict[str, Any] | None = None) -> None:
        """Save a finished record, its trace and its ``arrays`` (``scores/<sample id>.npz``) first: the record
        marks the sample done."""
        sample_id = record["sample_id"]
        if trace is not None:
            trace.save(self.trace_path(sample_id))
        if arrays is not None:
            with atomic_path(self.arrays_path(sample_id)) as tmp, open(tmp, "wb") as handle:
                np.savez(handle, **arrays)
        write_json(self.record_path(sample_id), record)

    def arrays_path(self, sample_id: str) -> Path:
        """``scores/<file stem>.npz`` (re-rank runs' span scores), named as the record and trace are."""
        return self.path / "scores" / f"{file_stem(sample_id)}.npz"

    def records(self) -> list[dict]:
        """All finished sample records, in sample-id order."""
        folder = self.path / "samples"
        return [_run_json(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []

    def load_trace(self, sample_id: str) -> Trace:
        """The sample's trace; a file written before the ``chance`` column existed gets it recomputed from the
        record's needle positions and the manifest's sink/local settings (the probe's own rule)."""
        path = self.trace_path(sample_id)
        if not self.path.is_dir():
            raise DynheadsError(f"no run folder {self.path}: give the --out folder of a traced run")
        if not path.is_file():
            known = [r["sample_id"] for r in self.records() if self.trace_path(r["sample_id"]).is_file()]
            shown = ", ".join(repr(k) for k in known[:8]) + (", ..." if len(known) > 8 else "")
            raise DynheadsError(
                f"no trace for sample {sample_id!r} in {self.path}"
                + (f" (its traced samples: {shown})" if known else " (it holds no traces)")
            )
        trace = Trace.load(path)
        if trace.chance is None and self.record_path(sample_id).is_file():
            needle = read_json(self.record_path(sample_id)).get("needle_positions")
            if needle is not None:
                config = self.manifest().get("config") or {}
                trace.chance = chance_per_step(
                    needle,
                    trace.prompt_length,
                    trace.num_steps,
                    config.get("sink_size", SINK_SIZE),
                    config.get("local_window", LOCAL_WINDOW),
                )
        return trace

    def iter_traces(self) -> Iterator[tuple[dict, Trace]]:
        """(record, trace) for every finished sample that has a trace."""
        for record in self.records():
            if self.trace_path(record["sample_id"]).is_file():
                yield record, self.load_trace(record["sample_id"])

    def write_results(self) -> pd.DataFrame:
        """Flatten the records (metrics as columns) into results.csv."""
        frame = RunView.of(self).results()
        with atomic_path(self.path / RESULTS_FILE) as tmp:
            frame.to_csv(tmp, index=False)
        return frame


RESULTS_FILE = "results.csv"  # every record, flattened (``RunView.results``)


@dataclasses.dataclass(frozen=True)
class RunView:
    """A run read once for its tables: its folder, manifest and finished records (in sample-id order)."""

    run: RunDir
    manifest: dict
    records: list[dict]

    @classmethod
    def of(cls, run: RunDir) -> RunView:
        return cls(run, run.manifest(), run.records())

    @property
    def path(self) -> Path:
        return self.run.path

    def results(self) -> pd.DataFrame:
        """The records flattened, metrics as columns (``results.csv``); refused while none is finished."""
        if not self.records:
            raise DynheadsError(f"{self.run.path} has no finished samples yet")
        return pd.json_normalize(self.records, sep=".")


def start_run(
    run: RunDir, kind: str, config: Any, lm: LoadedModel | None, extra: dict | None = None, *, batch_size: int = 1
) -> dict:
    """``run.start`` once per launch: rank 0 writes (or checks) the manifest and deletes the temporary files a killed
    launch left in the folder, then the other ranks check it; the manifest records how many processes shared the
    run and how many records were decoded together (its first launch's: results depend on it only through fp32
    rounding)."""
    _, world = distributed.rank_and_world()
    extra = {**(extra or {}), "processes": world, "batch_size": batch_size}
    manifest = run.start(kind, config, lm, extra) if distributed.is_main() else None
    if manifest is not None:  # the other ranks wait at the barrier: nothing else writes into the folder now
        remove_temporaries(run.path)
    distributed.barrier()
    return manifest if manifest is not None else run.start(kind, config, lm, extra)


Item = TypeVar("Item")


@dataclasses.dataclass(frozen=True)
class Job(Generic[Item]):
    """One record to produce: its id in the run (the record's ``sample_id``), what the batch function needs to
    make it, and its ``group``: jobs of one group go to one process (KV policies share a sample's prefill)."""

    record_id: str
    item: Item
    group: Hashable | None = None


class Finished(NamedTuple):
    """What a batch function returns per job: the record and, for a traced job, its trace, for a job that scores
    arrays, its arrays (both saved first: ``RunDir.save_sample``)."""

    record: dict
    trace: Trace | None = None
    arrays: dict[str, Any] | None = None  # name -> numpy array


class RunOptions(TypedDict, total=False):
    """How a ``run_*`` function runs, apart from what it computes (its config): keyword arguments every one of them
    takes and hands on to ``run_jobs``."""

    lm: LoadedModel | None  # a model already loaded (default: the config's model, loaded); not read by run_jobs
    progress: bool  # progress bars (default: True)
    on_record: Callable[[dict], None] | None  # called with each record once it is saved
    batch_size: int  # records decoded together (default: 1, the reference path; larger batches give its results)


def batch_size_of(options: RunOptions) -> int:
    return options.get("batch_size", 1)


def run_model(config: Any, options: RunOptions, device_map: str | None = None) -> LoadedModel:
    """The model a run uses: ``options``' ``lm``, else ``config``'s (its ``model``, ``dtype``, ``device``) loaded."""
    return options.get("lm") or load_model(
        config.model, dtype=config.dtype, device=config.device, device_map=device_map
    )


def run_jobs(
    run: RunDir,
    jobs: Sequence[Job[Item]],
    work: Callable[[list[Item]], list[Finished]],
    *,
    desc: str,
    **options: Unpack[RunOptions],
) -> list[dict]:
    """Make the records of ``jobs`` not yet finished in ``run``: ``work(items)`` gets up to ``batch_size`` items
    at a time and returns one ``Finished`` per item, in order; each is saved (its ``sample_id`` set to the job's
    id) before the next batch starts. Batches are cut at fixed places of this process's share, finished jobs
    included: a batch a kill interrupted is decoded whole again (only its unfinished records saved), so a resumed
    run decodes every record in the batch an uninterrupted one would, and writes its files. Returns, once every
    process has finished its share, the records of this process's share in job order (those finished earlier read
    back). Calls with the same groups deal the same groups to this process, so a later call can build on an earlier
    one's records (ablation's static and random runs use their sample's dynamic record)."""
    batch_size, on_record = batch_size_of(options), options.get("on_record")
    if batch_size < 1:
        raise DynheadsError("batch size must be at least 1")
    mine = _my_share(jobs)
    todo = {job.record_id for job in mine if not run.is_done(job.record_id)}
    bar = tqdm(
        total=len(mine),
        initial=len(mine) - len(todo),
        desc=desc,
        unit="record",
        disable=not options.get("progress", True),
    )
    made: dict[str, dict] = {}
    for batch in _batches(mine, todo, batch_size):
        for job, finished in zip(batch, work([job.item for job in batch]), strict=True):
            if job.record_id not in todo:  # finished before the run was killed: its files are this batch's
                continue
            record = finished.record
            record["sample_id"] = job.record_id
            run.save_sample(record, finished.trace, finished.arrays)
            if on_record:
                on_record(record)
            made[job.record_id] = record
            bar.update()
    bar.close()
    distributed.barrier()  # every process's records are on disk before rank 0 writes the run's tables
    return [made[job.record_id] if job.record_id in made else read_json(run.record_path(job.record_id)) for job in mine]


def _batches(mine: list[Job], todo: set[str], batch_size: int) -> Iterator[list[Job]]:
    """``mine`` cut every ``batch_size`` jobs, the batches that hold an unfinished job (those of ``todo``)."""
    for start in range(0, len(mine), batch_size):
        batch = mine[start : start + batch_size]
        if any(job.record_id in todo for job in batch):
            yield batch


def _my_share(jobs: Sequence[Job]) -> list[Job]:
    """This process's jobs: whole groups (a job without one is its own), dealt out in order of first appearance."""
    groups = list(dict.fromkeys(job.record_id if job.group is None else job.group for job in jobs))
    mine = set(distributed.shard(groups))
    return [job for job in jobs if (job.record_id if job.group is None else job.group) in mine]


def setting_differences(previous: dict, now: dict, shown: int = 3) -> str:
    """The settings that differ between a run's recorded config and this one, for one line: ``--lengths was
    [500] there, [250] now`` (at most ``shown``, then how many more); '' when none differ."""
    names = [name for name in sorted(set(previous) | set(now)) if previous.get(name) != now.get(name)]
    parts = [
        f"--{name.replace('_', '-')} was {_value_of(previous, name)} there, {_value_of(now, name)} now"
        for name in names[:shown]
    ]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return "; ".join(parts) + more


def _value_of(config: dict, name: str) -> str:
    return json.dumps(config[name]) if name in config else "unset"


def _resumable(config: Any, previous: dict | None) -> dict:
    """``config`` as a manifest compares it, less the settings added since ``previous`` was written that are at
    their default (e.g. ``reproduce``'s ``dtype``): an older run resumes under the same settings it had."""
    config_dict = _jsonable(settings_of(config))
    if not dataclasses.is_dataclass(config) or previous is None:
        return config_dict
    fields = dataclasses.fields(config)
    defaults = {f.name: _jsonable(f.default) for f in fields if f.default is not dataclasses.MISSING}
    return {
        name: value
        for name, value in config_dict.items()
        if name in previous or name not in defaults or value != defaults[name]
    }


def _jsonable(value: Any) -> Any:
    """Round-trip through JSON types so a config compares equal to the one read back from a manifest."""
    return json.loads(json.dumps(value, default=str))
