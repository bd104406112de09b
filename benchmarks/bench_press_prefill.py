"""Cost of a sample's kvpress presses with one shared prefill vs one prefill each, side by side in one process.

One NIAH prompt (depth 0.5); every registered press that needs no head predictor, at one budget, decodes
``--new-tokens`` tokens (the stop token ignored) through ``kv.presses.press_generate_all`` twice per round: all
presses from one prefill (``shared``, what ``dynheads kv`` does) and each under its own kvpress context (``alone``,
kvpress's way). Rounds alternate the two so both see the same machine load; the wall time is the median over
``--repeats`` rounds, and every round checks that both give the same tokens and resident KV. Needs the kvpress
extra (``bash scripts/kvpress-env.sh``) and a static head list (the drivers of ``duo_attention`` and the
head-token presses).

    $(bash scripts/kvpress-env.sh) benchmarks/bench_press_prefill.py --static runs/kv-static/static_heads.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model (default: the embedded one)")
    parser.add_argument("--length", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=0.125)
    parser.add_argument("--static", required=True, help="static head list")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()

    import torch

    import dynheads
    from dynheads.analysis.headlists import load_head_list, scored_heads
    from dynheads.analysis.kvheads import kv_head_ranking
    from dynheads.kv.press_registry import KVPRESS_PRESSES, PressSpec
    from dynheads.kv.press_runs import press_generate_all
    from dynheads.kv.retention import KVSettings, num_kv_heads
    from dynheads.kv.token_votes import VOTERS
    from dynheads.tasks import niah

    lm = dynheads.load_model(args.model) if args.model else dynheads.load_model()
    sample = niah.make_sample(lm.tokenizer, context_tokens=args.length, depth=0.5, seed=0)
    heads = load_head_list(args.static, lm.num_layers, lm.num_heads)
    settings = KVSettings(
        policy="static",
        budget=args.budget,
        static_ranking=tuple(kv_head_ranking(heads, lm.num_layers, lm.num_heads, num_kv_heads(lm))),
        voters=scored_heads(heads)[:VOTERS],
    )
    names = [name for name in KVPRESS_PRESSES.names() if not KVPRESS_PRESSES.get(name).needs_probe]
    arms = [(PressSpec(name), settings) for name in names]

    def run(share: bool) -> list:
        return press_generate_all(lm, sample.input_ids, arms, args.new_tokens, stop_at_eos=False, share_prefill=share)

    run(True)  # warm-up
    seconds: dict[str, list[float]] = {"shared": [], "alone": []}
    for _ in range(args.repeats):
        results = {}
        for mode in ("shared", "alone"):
            start = time.perf_counter()
            results[mode] = run(mode == "shared")
            seconds[mode].append(time.perf_counter() - start)
        same = [(r.tokens, r.kept_kv) for r in results["shared"]] == [(r.tokens, r.kept_kv) for r in results["alone"]]
        if not same:
            raise SystemExit("the shared prefill changed a press's tokens or resident KV")
    median = {mode: statistics.median(times) for mode, times in seconds.items()}
    report = {
        "model": lm.name,
        "prompt_tokens": len(sample.input_ids),
        "new_tokens": args.new_tokens,
        "budget": args.budget,
        "presses": names,
        "threads": torch.get_num_threads(),
        "seconds": seconds,
        "median_seconds": median,
        "alone_over_shared": median["alone"] / median["shared"],
        "identical": True,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"press_prefill_{len(sample.input_ids)}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{len(names)} presses, {len(sample.input_ids)}-token prompt, {args.new_tokens} new tokens each:")
    for mode in ("shared", "alone"):
        print(f"  {mode:7s} {median[mode]:7.2f} s (median of {args.repeats})")
    print(f"  alone / shared: {report['alone_over_shared']:.2f}x; identical tokens and resident KV; wrote {path}")


if __name__ == "__main__":
    main()
