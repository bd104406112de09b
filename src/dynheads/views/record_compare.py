"""Two records of one traced run side by side: which heads retrieve in both prompts, and which in one only.

``compare_records(run_dir, first, second)`` reads both samples' traces and, at every generated step, splits the
dynamic heads (D_t: Eq. 1 copies for a copy task such as ``custom`` and NIAH, Eq. 2 above ``threshold`` for a
reasoning task such as HotpotQA; the run's task decides) into those dynamic in both records at that step, in the
first only and in the second only; over the whole answer, the same split of the heads dynamic at some step.
``dynheads compare-records RUN ID1 ID2`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dynheads.heads import Head, head_label
from dynheads.runs import RunDir
from dynheads.scores import DEFAULT_REASONING_THRESHOLD, ScoreSpec, active_heads
from dynheads.tasks.registry import task_of_manifest


@dataclass(frozen=True)
class HeadSplit:
    """Heads dynamic in both records, in the first only and in the second only."""

    both: tuple[Head, ...]
    only_first: tuple[Head, ...]
    only_second: tuple[Head, ...]

    @classmethod
    def of(cls, first: set[Head], second: set[Head]) -> HeadSplit:
        return cls(tuple(sorted(first & second)), tuple(sorted(first - second)), tuple(sorted(second - first)))


@dataclass(frozen=True)
class StepSplit:
    """One generated step: each record's token there ("" past its end) and the split of its dynamic heads."""

    step: int
    tokens: tuple[str, str]
    heads: HeadSplit


@dataclass(frozen=True)
class RecordComparison:
    run: str
    ids: tuple[str, str]
    rule: str  # when a head counts as dynamic, in words
    overall: HeadSplit  # heads dynamic at some step of each record
    steps: tuple[StepSplit, ...]

    def text(self, max_heads: int = 8) -> str:
        """What ``dynheads compare-records`` prints: the whole answer's split, then one line per step."""
        first, second = self.ids
        lines = [
            f"{first} vs {second} in {self.run} ({self.rule}); heads dynamic at some step:",
            f"  in both: {_heads(self.overall.both, max_heads)}",
            f"  only in {first}: {_heads(self.overall.only_first, max_heads)}",
            f"  only in {second}: {_heads(self.overall.only_second, max_heads)}",
            "per step (token in each; heads dynamic at that step):",
        ]
        for step in self.steps:
            split = step.heads
            lines.append(
                f"  {step.step:>3} {step.tokens[0]!r} | {step.tokens[1]!r}: both {_heads(split.both, max_heads)}; "
                f"only {first} {_heads(split.only_first, max_heads)}; "
                f"only {second} {_heads(split.only_second, max_heads)}"
            )
        return "\n".join(lines)


def _heads(heads: tuple[Head, ...], limit: int) -> str:
    shown = " ".join(head_label(h) for h in heads[:limit])
    more = f" +{len(heads) - limit}" if len(heads) > limit else ""
    return f"{len(heads)}" + (f" ({shown}{more})" if heads else "")


def compare_records(
    run_dir: str | Path, first: str, second: str, *, threshold: str = DEFAULT_REASONING_THRESHOLD
) -> RecordComparison:
    """The dynamic heads of records ``first`` and ``second`` of the traced run ``run_dir``, step by step."""
    run = RunDir(run_dir)
    traces = run.load_trace(first), run.load_trace(second)
    task = task_of_manifest(run.manifest())
    spec = ScoreSpec(task.score_kind if task is not None else "copy", threshold)
    active = [spec.active(trace.scores, trace.chance) for trace in traces]
    steps = []
    for step in range(max(trace.num_steps for trace in traces)):
        heads = [set(active_heads(a[step])) if step < len(a) else set() for a in active]
        tokens = tuple(t.token_texts[step] if step < t.num_steps else "" for t in traces)
        steps.append(StepSplit(step, (tokens[0], tokens[1]), HeadSplit.of(heads[0], heads[1])))
    anywhere = [set(active_heads(np.any(a, axis=0))) if len(a) else set() for a in active]
    rule = "Eq. 1 copy score = 1" if spec.score.binary else f"Eq. 2 score above {threshold}"
    return RecordComparison(str(run.path), (first, second), rule, HeadSplit.of(anywhere[0], anywhere[1]), tuple(steps))
