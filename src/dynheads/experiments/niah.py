"""Trace a NIAH grid (lengths x depths x runs) into a run directory; refuse a head source (probe, static list)
fitted on a sample that is evaluated."""

from __future__ import annotations

from pathlib import Path
from typing import Unpack

from dynheads.errors import DynheadsError
from dynheads.experiments.settings import NiahConfig
from dynheads.experiments.tracing import run_task
from dynheads.io import read_json
from dynheads.runs import RunDir, RunOptions
from dynheads.tasks.niah import NIAH
from dynheads.tasks.sample import Sample


def niah_samples(config: NiahConfig, tokenizer) -> list[Sample]:
    """The grid's samples, seeded per (split, length, depth, run) so any subset is reproducible."""
    return NIAH.grid(config, tokenizer).samples


def prompt_manifest() -> dict:
    return NIAH.prompt(None)


def run_niah(
    config: NiahConfig, out: str | Path, *, device_map: str | None = None, **options: Unpack[RunOptions]
) -> RunDir:
    """Trace every sample of the grid into ``out``; finished samples of an earlier attempt are skipped."""
    return run_task(NIAH, config, out, device_map=device_map, **options)


def sample_identity(sample_id: str, seed: int | None, answer: str) -> dict:
    """What tells NIAH samples apart across seed streams: sample ids repeat (split-length-depth-run), seeds and
    needle values do not."""
    return {"sample_id": sample_id, "seed": None if seed is None else int(seed), "answer": answer}


def refuse_seed_overlap(path: str, what: str, evaluation: list[dict]) -> dict:
    """Refuse a probe / static list (``what``, at ``path``) fitted on a sample of ``evaluation`` (``sample_identity``
    dicts) with the same seed or needle value; returns the samples it was fitted on (from its run directory)."""
    source = Path(path)
    folder = source if source.is_dir() else source.parent
    metrics = folder / "metrics.json"
    run_path = Path(read_json(metrics)["run"]) if metrics.is_file() else folder
    if not (run_path / "manifest.json").is_file():
        run_path = folder.parent
    run = RunDir(run_path)
    if not run.exists():
        raise DynheadsError(
            f"cannot tell which samples the {what} {path} was fitted on (no run directory beside "
            "it), so its disjointness from the evaluation cannot be checked"
        )
    fitted = [sample_identity(r["sample_id"], r["seed"], r["answer"]) for r in run.records()]
    seeds, answers = {f["seed"] for f in fitted}, {f["answer"] for f in fitted}
    shared = [e["sample_id"] for e in evaluation if e["seed"] in seeds or e["answer"] in answers]
    if shared:
        raise DynheadsError(
            f"the {what} {path} was fitted on {len(shared)} of the evaluation samples "
            f"(e.g. {shared[0]}): evaluate on another seed stream (--split / --seed)"
        )
    return {"path": str(path), "run": str(run.path), "samples": fitted}
