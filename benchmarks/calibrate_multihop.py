"""Calibrate the multihop task on a model: full-context vs context-hidden EM / accuracy per question form.

"full": greedy decoding (``model.generate``) of the task prompt. "hidden": the same prompt with the context
left out (the question alone, closed book). Generations are scored by ``multihop.score``. One JSON line per
form is appended to ``--out``; the markdown table is printed at the end.

    OMP_NUM_THREADS=1 python benchmarks/calibrate_multihop.py --questions 50 --length 1000 \
        --form hops=2,distractors=6,value=number --form hops=1,distractors=6,value=number --out calib.jsonl
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from dynheads.models import load_model
from dynheads.tasks import multihop
from dynheads.tasks.prompting import render_chat


def greedy(lm, input_ids: list[int], max_new_tokens: int) -> str:
    with torch.no_grad():
        out = lm.model.generate(torch.tensor([input_ids], device=lm.device), max_new_tokens=max_new_tokens,
                                do_sample=False)
    return lm.tokenizer.decode(out[0, len(input_ids):], skip_special_tokens=True)


def calibrate(lm, spec: str, questions: int, length: int, depths: tuple[float, ...], seed: int,
              max_new_tokens: int) -> dict:
    form = multihop.parse_source(f"{multihop.SOURCE}:{spec}")
    samples = multihop.grid_samples(lm.tokenizer, questions=questions, lengths=(length,), depths=depths,
                                    seed=seed, form=form)
    row: dict = {"form": spec, "n": len(samples), "context_tokens": length,
                 "prompt_tokens": float(np.mean([len(s.input_ids) for s in samples]))}
    start = time.perf_counter()
    closed = {s.sample_id: render_chat(lm.tokenizer, multihop.SYSTEM_PROMPT, multihop.USER_TEMPLATE.format(
        context="", question=s.question)).input_ids for s in samples}
    for name in ("full", "hidden"):
        texts = [greedy(lm, s.input_ids if name == "full" else closed[s.sample_id], max_new_tokens) for s in samples]
        scores = [multihop.score(s.answer, text) for s, text in zip(samples, texts, strict=True)]
        row[f"{name}_examples"] = texts[:3]
        row[f"{name}_em"] = float(np.mean([s["em"] for s in scores]))
        row[f"{name}_acc"] = float(np.mean([s["accuracy"] for s in scores]))
        row[f"{name}_f1"] = float(np.mean([s["f1"] for s in scores]))
    row["seconds"] = round(time.perf_counter() - start, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--form", action="append", required=True, help="hops=..,distractors=..,value=..")
    parser.add_argument("--questions", type=int, default=50)
    parser.add_argument("--length", type=int, default=1000)
    parser.add_argument("--depths", default="0.1,0.5,0.9")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    lm = load_model()
    depths = tuple(float(d) for d in args.depths.split(","))
    rows = []
    for spec in args.form:
        row = calibrate(lm, spec, args.questions, args.length, depths, args.seed, args.max_new_tokens)
        rows.append(row)
        with open(args.out, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    print("| form | n | context tokens | full EM | full acc | hidden EM | hidden acc |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['form']} | {r['n']} | {r['context_tokens']} | {r['full_em']:.2f} | {r['full_acc']:.2f} | "
              f"{r['hidden_em']:.2f} | {r['hidden_acc']:.2f} |")


if __name__ == "__main__":
    main()
