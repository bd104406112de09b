"""Traced tokens per second at several batch sizes, side by side in one process, plus the exactness check.

One process loads the embedded model once; for each context length the batch sizes are run interleaved
(round 1: B=1, 4, 8, 16; round 2: the same ...) so that load from other jobs on a shared machine hits all
of them alike. Each batch is B different NIAH samples (seeds and depths differ, so prompt lengths differ
by a few tokens and the batch is really padded), every sample decodes exactly ``--new-tokens`` tokens
(stop token ignored). Reported per (context, B):

- ``tokens_per_s``: B x new tokens / wall time of ``trace_batch`` (prefill included: end to end),
- ``decode_tokens_per_s``: B x (new tokens - 1) / time after the last prefill (the batched decode phase),
- the same per second of process CPU time (``tokens_per_cpu_s``...): with ``OMP_NUM_THREADS=1`` this is
  compute, robust to other jobs on a shared machine, where wall time is not,
- ``speedup_per_*`` of each relative to B=1 (medians over rounds),
- exactness: the batch's traces against batch-1 traces of the same samples (first round only): tokens
  equal, argmax / Eq. 1 equal, max abs difference of needle mass, max prob and hidden states.

    python benchmarks/bench_batching.py --lengths 1000,4000 --batch-sizes 1,4,8,16 --new-tokens 32 \
        --rounds 2 --out benchmarks/results/batching.json

``--what ablation`` times the per-step two-pass ablation instead (``ablated_generate_batch``, every row the
``dynamic`` strategy; B = 1 is ``ablated_generate``); its exactness check compares tokens and the heads masked
at every step with batch-1 runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1000,4000")
    parser.add_argument("--batch-sizes", default="1,4,8,16")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--check-samples",
        type=int,
        default=None,
        help="samples of each batch compared with batch-1 traces (default: all)",
    )
    parser.add_argument("--what", choices=("trace", "ablation"), default="trace")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/batching.json"))
    args = parser.parse_args()

    import torch

    import dynheads
    from dynheads.ablation.cascade import AblationSettings, ablated_generate_batch
    from dynheads.engine import decoding
    from dynheads.engine.tracing import trace_batch
    from dynheads.tasks import niah

    def run_batch(batch):
        if args.what == "trace":
            return trace_batch(lm, batch, args.new_tokens, stop_at_eos=False)
        dynamic = [AblationSettings(strategy="dynamic")] * len(batch)
        return ablated_generate_batch(lm, batch, dynamic, args.new_tokens, stop_at_eos=False)

    prefill_done = [0.0, 0.0]  # wall clock, process CPU time
    forward = decoding.DecodingSession.forward

    def timed_forward(self, num_tokens, **kwargs):  # the batch-1 sessions run only the prefills
        result = forward(self, num_tokens, **kwargs)
        if num_tokens > 1:
            prefill_done[:] = [time.perf_counter(), time.process_time()]
        return result

    decoding.DecodingSession.forward = timed_forward
    lm = dynheads.load_model()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    rows, exactness = [], []
    for length in [int(n) for n in args.lengths.split(",")]:
        samples = [
            niah.make_sample(lm.tokenizer, context_tokens=length, depth=(i % 5) / 4, seed=i) for i in range(max(sizes))
        ]
        singles = None
        for round_ in range(args.rounds):
            for size in sizes:
                start, cpu_start = time.perf_counter(), time.process_time()
                traces = run_batch(samples[:size])
                end, cpu_end = time.perf_counter(), time.process_time()
                total, decode = end - start, end - prefill_done[0]
                cpu_total, cpu_decode = cpu_end - cpu_start, cpu_end - prefill_done[1]
                rows.append(
                    {
                        "what": args.what,
                        "context_tokens": length,
                        "batch_size": size,
                        "round": round_,
                        "prompt_tokens": [len(s.input_ids) for s in samples[:size]],
                        "new_tokens": args.new_tokens,
                        "seconds": total,
                        "decode_seconds": decode,
                        "tokens_per_s": size * args.new_tokens / total,
                        "decode_tokens_per_s": size * (args.new_tokens - 1) / decode,
                        "cpu_seconds": cpu_total,
                        "decode_cpu_seconds": cpu_decode,
                        "tokens_per_cpu_s": size * args.new_tokens / cpu_total,
                        "decode_tokens_per_cpu_s": size * (args.new_tokens - 1) / cpu_decode,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
                if size == 1:
                    singles = singles or traces
                    continue
                if round_ == 0:
                    check = min(size, args.check_samples or size)
                    while len(singles or []) < check:
                        singles = (singles or []) + run_batch([samples[len(singles or [])]])
                    compared = compare if args.what == "trace" else compare_ablations
                    exactness.append(compared(length, size, singles[:check], traces[:check]))
                    print(json.dumps(exactness[-1]), flush=True)
    summary = summarise(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "what": args.what,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "summary": summary,
                "exactness": exactness,
                "runs": rows,
            },
            indent=2,
        )
        + "\n"
    )
    for line in summary:
        print(line)


def compare(length: int, size: int, singles, batched) -> dict:
    """Batch traces against batch-1 traces of the same samples."""
    pairs = list(zip(singles, batched, strict=True))

    def max_diff(name: str) -> float:
        return float(max(np.abs(getattr(a, name) - getattr(b, name)).max(initial=0) for a, b in pairs))

    return {
        "context_tokens": length,
        "batch_size": size,
        "tokens_equal": all(a.tokens.tolist() == b.tokens.tolist() for a, b in pairs),
        "argmax_equal": all(np.array_equal(a.argmax_pos, b.argmax_pos) for a, b in pairs),
        "copy_scores_equal": all(np.array_equal(a.copy_scores, b.copy_scores) for a, b in pairs),
        "needle_mass_max_diff": max_diff("needle_mass"),
        "max_prob_max_diff": max_diff("max_prob"),
        "hidden_max_diff": max_diff("hidden"),
    }


def compare_ablations(length: int, size: int, singles, batched) -> dict:
    """Batched ablations against batch-1 ablations of the same samples."""
    pairs = list(zip(singles, batched, strict=True))
    return {
        "context_tokens": length,
        "batch_size": size,
        "tokens_equal": all(a.tokens == b.tokens for a, b in pairs),
        "masked_equal": all(a.masked == b.masked for a, b in pairs),
        "heads_masked": sum(len(m) for a in singles for m in a.masked),
    }


KEYS = ("tokens_per_s", "decode_tokens_per_s", "tokens_per_cpu_s", "decode_tokens_per_cpu_s")


def summarise(rows: list[dict]) -> list[dict]:
    """Median over rounds per (context, B), with speed-ups against B=1 of the same context."""
    out = []
    for length in sorted({r["context_tokens"] for r in rows}):
        at = [r for r in rows if r["context_tokens"] == length]
        base = (
            {k: statistics.median(r[k] for r in at if r["batch_size"] == 1) for k in KEYS}
            if any(r["batch_size"] == 1 for r in at)
            else None
        )
        for size in sorted({r["batch_size"] for r in at}):
            mine = [r for r in at if r["batch_size"] == size]
            entry = {"context_tokens": length, "batch_size": size, "rounds": len(mine)}
            for key in KEYS:
                entry[key] = statistics.median(r[key] for r in mine)
                if base:
                    entry[key.replace("tokens_per", "speedup_per")] = entry[key] / base[key]
            out.append(entry)
    return out


if __name__ == "__main__":
    main()
