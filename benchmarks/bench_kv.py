"""Cost of the KV-retention simulation vs traced decoding, per decode step, side by side in one process.

One NIAH prompt (depth 0.5) is prefilled once; then every mode decodes ``--new-tokens`` tokens from that same
prefill (the stop token ignored), round-robin over ``--repeats`` rounds so that every mode sees the same machine
load. Time per step = the median over rounds of (decode time / new tokens); the prefill is not counted.

``traced``: the decode loop of ``dynheads.trace`` (probe on every layer, Eq. 1 / Eq. 2 / hidden state recorded);
``kv-<policy>``: ``kv.retention.kv_generate`` with that policy at budget ``--budget`` (per-head streaming masks,
memory count, D_t; ``probe`` adds one MLP forward per step, ``true`` a clean pass per step).

    python benchmarks/bench_kv.py --length 2000 --static runs/kv-static/static_heads.json \
        --probe runs/kv-probe-train/probe --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=2000)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=0.1)
    parser.add_argument("--static", required=True, help="static head list")
    parser.add_argument("--probe", required=True, help="trained probe folder")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()

    import torch

    import dynheads
    from dynheads.analysis.head_predictor import load_head_predictor
    from dynheads.analysis.headlists import load_head_list
    from dynheads.analysis.kvheads import kv_head_ranking
    from dynheads.engine.probe import NO_EDIT
    from dynheads.engine.tracing import TraceRecorder
    from dynheads.kv.retention import KVSettings, kv_generate, num_kv_heads, prefill
    from dynheads.tasks import niah

    lm = dynheads.load_model()
    sample = niah.make_sample(lm.tokenizer, context_tokens=args.length, depth=0.5, seed=0)
    static = kv_head_ranking(
        load_head_list(args.static, lm.num_layers, lm.num_heads), lm.num_layers, lm.num_heads, num_kv_heads(lm)
    )
    probe = load_head_predictor(args.probe)
    shared = prefill(lm, sample, args.new_tokens)

    def traced() -> None:  # trace()'s decode loop, from the shared prefill
        session = shared.session
        session.rollback(shared.checkpoint)
        session.probe.set_edits([NO_EDIT])
        recorder = TraceRecorder()
        for _ in range(args.new_tokens):
            result = session.forward(1)
            token = int(result.logits.argmax())
            recorder.add(session, result, token)
            session.append(token)

    modes = {"traced": traced}
    for policy in ("full", "static", "probe", "random", "true"):
        settings = KVSettings(policy=policy, budget=args.budget, static_ranking=static)
        modes[f"kv-{policy}"] = (
            lambda s: (
                lambda: kv_generate(lm, sample, s, args.new_tokens, probe=probe, stop_at_eos=False, prefilled=shared)
            )
        )(settings)
    for run in modes.values():  # warm-up
        run()
    per_step: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(args.repeats):
        for name, run in modes.items():
            start = time.perf_counter()
            run()
            per_step[name].append((time.perf_counter() - start) / args.new_tokens)
    base = statistics.median(per_step["traced"])
    rows = [
        {
            "mode": name,
            "ms_per_step": 1000 * statistics.median(times),
            "vs_traced": statistics.median(times) / base,
            "all_ms": [1000 * t for t in times],
        }
        for name, times in per_step.items()
    ]
    result = {
        "context_tokens": args.length,
        "prompt_tokens": len(sample.input_ids),
        "new_tokens": args.new_tokens,
        "budget": args.budget,
        "repeats": args.repeats,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kv.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print("| mode | ms / step | vs traced |\n|---|---|---|")
    for row in rows:
        print(f"| {row['mode']} | {row['ms_per_step']:.1f} | {row['vs_traced']:.2f}x |")


if __name__ == "__main__":
    main()
