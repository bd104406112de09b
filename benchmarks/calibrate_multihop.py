"""Calibrate a question task on a model: full-context accuracy beside chance, position heuristics and fact order.

``--form`` is a ``data`` spelling of any question task (``variable_tracking:hops=2,chains=3``,
``multikey_niah:keys=4``, ``multihop:hops=1,distractors=2``; a bare ``hops=..`` is the multihop task, the old
spelling). Samples come from the task's own grid (``registry.task_of("hotpotqa", data)``), answers from greedy
decoding (``model.generate``) of the task prompt, scores from the task's ``score``. Beside the model's EM: the
expected EM of a random same-form candidate from the context (chance), of "answer the first / last candidate"
(position heuristics), EM by the gold fact's rank among the candidates (fact order) and the share of wrong
answers that are a distractor's value (``dynheads.tasks.candidates``). ``--hidden`` adds the context-hidden
baseline of the multihop task. One JSON line per form is appended to ``--out``; a markdown table is printed.

    OMP_NUM_THREADS=1 python benchmarks/calibrate_multihop.py --questions 24 --length 500 \
        --form variable_tracking:hops=2,chains=3 --form multihop:hops=1,distractors=2 --out calib.jsonl
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from dynheads.models import load_model
from dynheads.settings import HotpotConfig
from dynheads.tasks import candidates, multihop
from dynheads.tasks.prompting import render_chat
from dynheads.tasks.registry import task_of


def greedy(lm, input_ids: list[int], max_new_tokens: int) -> str:
    with torch.no_grad():
        out = lm.model.generate(
            torch.tensor([input_ids], device=lm.device), max_new_tokens=max_new_tokens, do_sample=False
        )
    return lm.tokenizer.decode(out[0, len(input_ids) :], skip_special_tokens=True)


def calibrate(
    lm,
    spec: str,
    questions: int,
    lengths: tuple[int, ...],
    depths: tuple[float, ...],
    seed: int,
    first: int,
    max_new_tokens: int,
    hidden: bool,
) -> dict:
    data = spec if ":" in spec or "=" not in spec else f"{multihop.SOURCE}:{spec}"
    task = task_of("hotpotqa", data)
    config = HotpotConfig(
        data=data, questions=questions, first=first, lengths=lengths, depths=depths, seed=seed, split="calibration"
    )
    samples = task.grid(config, lm.tokenizer).samples
    row: dict = {
        "form": data,
        "task": task.name,
        "n": len(samples),
        "lengths": list(lengths),
        "depths": list(depths),
        "first": first,
        "seed": seed,
        "prompt_tokens": float(np.mean([len(s.input_ids) for s in samples])),
    }
    start = time.perf_counter()
    texts = [greedy(lm, s.input_ids, max_new_tokens) for s in samples]
    records = [
        {
            "answer": s.answer,
            "meta": s.meta,
            "metrics": task.score(s, text),
            "context_tokens": s.context_tokens,
            "depth": s.depth,
        }
        for s, text in zip(samples, texts, strict=True)
    ]
    row["examples"] = texts[:3]
    for metric in task.metrics:
        row[f"full_{metric}"] = float(np.mean([r["metrics"][metric] for r in records]))
    row.update({f"cand_{k}": v for k, v in candidates.summarise(records).items()})
    row["by_rank"] = {str(k): v for k, v in candidates.by_gold_rank(records).items()}
    row["by_length"] = {
        str(length): float(np.mean([r["metrics"]["em"] for r in records if r["context_tokens"] == length]))
        for length in lengths
    }
    row["per_sample_em"] = [r["metrics"]["em"] for r in records]
    if hidden:
        closed = [
            render_chat(
                lm.tokenizer, multihop.SYSTEM_PROMPT, multihop.USER_TEMPLATE.format(context="", question=s.question)
            ).input_ids
            for s in samples
        ]
        row["hidden_em"] = float(
            np.mean(
                [task.score(s, greedy(lm, ids, max_new_tokens))["em"] for s, ids in zip(samples, closed, strict=True)]
            )
        )
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--form", action="append", required=True, help="a data spelling, e.g. variable_tracking:hops=2")
    parser.add_argument("--questions", type=int, default=24)
    parser.add_argument("--lengths", default="500", help="context lengths in tokens, e.g. 500,1000")
    parser.add_argument("--length", type=int, help="one context length (the old spelling of --lengths)")
    parser.add_argument("--depths", default="0.1,0.5,0.9")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--hidden", action="store_true", help="also the context-hidden baseline (multihop forms)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    lm = load_model()
    lengths = (args.length,) if args.length else tuple(int(n) for n in args.lengths.split(","))
    depths = tuple(float(d) for d in args.depths.split(","))
    rows = []
    for spec in args.form:
        row = calibrate(
            lm, spec, args.questions, lengths, depths, args.seed, args.first, args.max_new_tokens, args.hidden
        )
        rows.append(row)
        with open(args.out, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k != "per_sample_em"}), flush=True)
    print("| form | n | EM | chance | first | last | EM by gold rank (n) | wrong = distractor |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ranks = ", ".join(f"{k}: {m:.2f} ({n})" for k, (n, m) in r["by_rank"].items())
        print(
            f"| {r['form']} | {r['n']} | {r['full_em']:.2f} | {r['cand_chance']:.2f} | {r['cand_first']:.2f} | "
            f"{r['cand_last']:.2f} | {ranks} | {r['cand_distractor_share']:.2f} of {r['cand_wrong']} |"
        )


if __name__ == "__main__":
    main()
