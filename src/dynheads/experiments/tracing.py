"""The loop every tracing run shares: check the samples fit, trace the unfinished ones, save, summarise."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tqdm.auto import tqdm

from dynheads.decoding import check_fits, trace
from dynheads.models import LoadedModel
from dynheads.runs import RunDir


def trace_samples(
    run: RunDir,
    lm: LoadedModel,
    samples: Sequence,
    score: Callable[[object, str], dict],
    *,
    max_new_tokens: int,
    sink_size: int,
    local_window: int,
    desc: str,
    progress: bool = True,
    on_sample: Callable[[dict], None] | None = None,
) -> RunDir:
    """Trace every sample not yet finished in ``run``; ``score(sample, generated)`` gives its metrics."""
    for sample in samples:  # fail before any work, not halfway through the grid
        check_fits(lm, len(sample.input_ids), max_new_tokens)
    todo = [s for s in samples if not run.is_done(s.sample_id)]
    bar = tqdm(total=len(samples), initial=len(samples) - len(todo), desc=desc, unit="sample", disable=not progress)
    for sample in todo:
        result = trace(lm, sample, max_new_tokens, sink_size=sink_size, local_window=local_window)
        record = {**sample.describe(), "generated": result.text, "stop_reason": result.stop_reason,
                  "steps": result.num_steps, "metrics": score(sample, result.text)}
        run.save_sample(record, result)
        if on_sample:
            on_sample(record)
        bar.update()
    bar.close()
    run.write_results()
    return run
