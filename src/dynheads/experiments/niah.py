"""Trace a NIAH grid (lengths x depths x runs) into a run directory."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dynheads.errors import DynheadsError
from dynheads.experiments.settings import NiahConfig
from dynheads.experiments.tracing import run_traced
from dynheads.models import LoadedModel
from dynheads.runs import RunDir
from dynheads.seeding import derive_seed
from dynheads.tasks import niah
from dynheads.tasks.prompting import chat_template_kwargs


def niah_samples(config: NiahConfig, tokenizer) -> list[niah.NiahSample]:
    """The grid's samples, seeded per (split, length, depth, run) so any subset is reproducible."""
    if not config.lengths or not config.depths or config.runs < 1:
        raise DynheadsError("the NIAH grid is empty: give at least one length, one depth and runs >= 1")
    template_kwargs = chat_template_kwargs(config.chat_template_kwargs)
    samples = []
    for length in config.lengths:
        for depth in config.depths:
            for run in range(config.runs):
                seed = derive_seed(config.seed, config.split, length, depth, run)
                sample_id = f"{config.split}-len{length}-depth{depth:g}-run{run}"
                samples.append(niah.make_sample(tokenizer, context_tokens=length, depth=depth, seed=seed,
                                                haystack=config.haystack, sample_id=sample_id,
                                                distractor_depth=config.distractor_depth,
                                                distractor_prefix=config.distractor_prefix,
                                                chat_template_kwargs=template_kwargs))
    return samples


def prompt_manifest() -> dict:
    return {"system": niah.SYSTEM_PROMPT, "user": niah.USER_TEMPLATE, "needle": niah.NEEDLE_TEMPLATE,
            "question": niah.QUESTION,
            "distractor": niah.DISTRACTOR_TEMPLATE}


def run_niah(config: NiahConfig, out: str | Path, *, lm: LoadedModel | None = None, progress: bool = True,
             on_sample: Callable[[dict], None] | None = None, batch_size: int = 1,
             device_map: str | None = None) -> RunDir:
    """Trace every sample of the grid into ``out``; finished samples of an earlier attempt are skipped."""

    def prepare(tokenizer) -> tuple[list[niah.NiahSample], dict]:
        samples = niah_samples(config, tokenizer)
        return samples, {"prompt": prompt_manifest(), "prompt_template": samples[0].prompt_template,
                         "chat_template_kwargs": samples[0].chat_template_kwargs}

    return run_traced("niah", config, out, prepare, lambda sample, text: niah.score(sample.answer, text), lm=lm,
                      device_map=device_map, progress=progress, on_sample=on_sample, batch_size=batch_size)
