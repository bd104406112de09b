"""Fit ``token_votes.SPAN`` (how far a head-token vote carries forward) on the fitting stream, never on evaluation.

NIAH samples of the ``static`` seed stream (the stream the static head list is fitted on, disjoint from
``analysis``) are prefilled once each; the static list's ``VOTERS`` best heads vote from the observation window, and
for every span and compression ratio the script counts the needle tokens the head-token policy keeps. The chosen
span is the smallest whose mean needle coverage reaches ``--coverage`` at every ratio; it prints a table and writes
``span.json`` (the samples, every coverage and the choice).

    python scripts/fit_vote_span.py --model qwen2.5-coder-0.5b --static STATIC/static_heads.json --out DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dynheads.analysis.headlists import load_head_list, scored_heads
from dynheads.experiments.kv import KVConfig
from dynheads.io import write_json
from dynheads.kv.retention import KVSettings
from dynheads.kv.token_votes import VOTERS, WINDOW, keep, token_scores, window_votes
from dynheads.models import load_model

SPLIT = "static"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--static", required=True, help="static_heads.json (its best heads vote)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--length", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=2, help="samples per depth (depths 0, 0.25, 0.5, 0.75, 1)")
    parser.add_argument("--ratios", default="0.75,0.875")
    parser.add_argument("--spans", default="0,8,16,24,32,48,64")
    parser.add_argument("--coverage", type=float, default=0.95, help="mean needle coverage the span must reach")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ratios = [float(r) for r in args.ratios.split(",")]
    spans = [int(s) for s in args.spans.split(",")]
    lm = load_model(args.model)
    voters = list(scored_heads(load_head_list(args.static, lm.num_layers, lm.num_heads))[:VOTERS])
    config = KVConfig(model=args.model, lengths=(args.length,), runs=args.runs, split=SPLIT, policies=("full",))
    samples = config.task_entry().grid(config.task_config(), lm.tokenizer).samples
    defaults = KVSettings()  # the sink and recent window `dynheads kv` uses unless told otherwise
    coverage: dict[str, dict[str, list[float]]] = {str(s): {str(r): [] for r in ratios} for s in spans}
    for sample in samples:
        length = len(sample.input_ids) - 1
        votes = window_votes(lm, sample.input_ids, voters, WINDOW)
        needle = set(sample.needle_positions)
        for span in spans:
            for ratio in ratios:
                kept = keep(token_scores(votes, length, sink=defaults.sink, recent=defaults.recent, span=span), ratio)
                coverage[str(span)][str(ratio)].append(len(needle.intersection(kept)) / len(needle))
        print(sample.sample_id, flush=True)
    means = {span: {ratio: sum(v) / len(v) for ratio, v in by.items()} for span, by in coverage.items()}
    print("span  " + "  ".join(f"ratio {r}" for r in ratios))
    for span, by in means.items():
        print(f"{span:>4}  " + "  ".join(f"{by[str(r)]:9.3f}" for r in ratios))
    reached = [s for s in spans if all(means[str(s)][str(r)] >= args.coverage for r in ratios)]
    chosen = reached[0] if reached else None
    print(f"chosen span: {chosen} (smallest with mean needle coverage >= {args.coverage} at every ratio)")
    write_json(
        Path(args.out) / "span.json",
        {
            "model": args.model,
            "static": args.static,
            "voters": [list(h) for h in voters],
            "split": SPLIT,
            "samples": [s.sample_id for s in samples],
            "seeds": [s.seed for s in samples],
            "coverage": coverage,
            "mean_coverage": means,
            "rule": f"smallest span with mean needle coverage >= {args.coverage} at every ratio",
            "chosen": chosen,
        },
    )


if __name__ == "__main__":
    main()
