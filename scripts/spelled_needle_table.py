"""The spelled-number needle's table: per traced run, its accuracy with an exact interval and the test against
chance, and what the two per-step scores see on the answer's digit steps of the correct answers.

    python scripts/spelled_needle_table.py RUN [RUN ...]

A run is a ``dynheads trace --task spelled_niah[_paraphrased]`` folder. Per run, every answer re-scored with the
task's own ``score`` (so runs traced before its ``words`` metric read the same): n, correct answers, accuracy with
its Clopper-Pearson 95 % interval, the one-sided exact p-value against chance (0 here: a guess of 7 digits is right
with probability 1e-7, tested at that), the answers that copy the needle's number words instead, and over the digit
steps of the correct answers (the steps that emit digits): the share with at least one Eq. 1 copy event (a head whose
argmax key is a needle token carrying the emitted token: none can, the needle holds no digit), the mean of the
step's largest write score and the share of steps where some head writes more than ``--logit`` (1.0) logits toward
the digit from the needle than an equally long stretch of the rest does. Descriptive: no W_t threshold is fitted.
"""

from __future__ import annotations

import argparse
import re

import numpy as np

from dynheads.analysis.evidence import EvidenceSettings, above_chance_p_value, proportion_interval
from dynheads.runs import RunDir
from dynheads.tasks.spelled import score

GUESS = 1e-7  # 7 random digits


def digit_steps(trace) -> np.ndarray:
    """Indices of the steps whose emitted token is digits (a leading space allowed) and nothing else."""
    return np.array(
        [step for step, text in enumerate(trace.token_texts) if re.fullmatch(r"\s*[0-9]+", text or "")], dtype=int
    )


def summarise(folder: str, logit: float) -> dict:
    run = RunDir(folder)
    records = list(run.records())
    scored = [score(type("Answer", (), {"answer": r["answer"]})(), r["generated"]) for r in records]
    correct = [r for r, s in zip(records, scored, strict=True) if s["accuracy"] == 1.0]
    copied_words = sum(s["words"] for s in scored)
    found = proportion_interval(len(correct), len(records), EvidenceSettings())
    copy_steps, write_max, write_over = [], [], []
    wanted = {r["sample_id"] for r in correct}
    for record, trace in run.iter_traces():
        if record["sample_id"] not in wanted:
            continue
        steps = digit_steps(trace)
        if not steps.size:
            continue
        copies = trace.scores["copy"][steps].reshape(steps.size, -1)
        writes = trace.scores["write"][steps].reshape(steps.size, -1)
        copy_steps.extend(copies.any(axis=1).tolist())
        write_max.extend(writes.max(axis=1).tolist())
        write_over.extend((writes > logit).any(axis=1).tolist())
    manifest = run.manifest()
    return {
        "run": folder,
        "task": manifest["config"].get("task") or manifest.get("kind"),
        "model": manifest["model"]["name"],
        "n": len(records),
        "correct": len(correct),
        "accuracy": found,
        "words_copied": int(copied_words),
        "p_above_chance": above_chance_p_value(len(correct), len(records), GUESS),
        "digit_steps": len(write_max),
        "steps_with_a_copy_event": float(np.mean(copy_steps)) if copy_steps else float("nan"),
        "mean_largest_write": float(np.mean(write_max)) if write_max else float("nan"),
        "steps_with_a_write_above": float(np.mean(write_over)) if write_over else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--logit", type=float, default=1.0)
    args = parser.parse_args()
    print(
        "| model | task | n | correct | accuracy [95 % exact] | p vs chance | words copied | digit steps "
        "| with a copy event "
        f"| mean largest write | with a write > {args.logit:g} |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for folder in args.runs:
        row = summarise(folder, args.logit)
        acc = row["accuracy"]
        print(
            f"| {row['model']} | {row['task']} | {row['n']} | {row['correct']} | {acc.effect:.3f} "
            f"[{acc.low:.3f}, {acc.high:.3f}] | {row['p_above_chance']:.1e} | {row['words_copied']} "
            f"| {row['digit_steps']} "
            + (
                f"| {row['steps_with_a_copy_event']:.3f} | {row['mean_largest_write']:.2f} "
                f"| {row['steps_with_a_write_above']:.3f} |"
                if row["digit_steps"]
                else "| — | — | — |"  # no correct answer: no digit step to score
            )
        )


if __name__ == "__main__":
    main()
