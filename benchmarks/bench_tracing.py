"""Cost of tracing vs plain generation, side by side in one run (issue: traced <= 1.15x time, <= 1.2x memory).

For each context length, each mode runs in its own fresh subprocess (so memory peaks do not mix):
``plain``  = ``model.generate`` with SDPA attention, greedy, exactly N new tokens;
``traced`` = ``dynheads.trace`` (probe on every layer, every step), exactly N new tokens;
``traced_write`` = the same with the write score (``head_outputs=True``: each head's output measured too);
``eager``  = ``model.generate`` with eager attention and ``output_attentions=True`` (what the probe replaces);
``ablated`` = ``ablated_generate`` with the ``dynamic`` strategy (clean pass + masked pass at every step).
Time = median of ``--repeats`` timed runs after one warm-up. Memory = peak resident set size of the process
(VmHWM) during the timed runs, and the same peak minus the resident size just before them ("increment").

    python benchmarks/bench_tracing.py --lengths 1000,2000,4000 --new-tokens 32 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure(mode: str, length: int, new_tokens: int, repeats: int) -> dict:
    """Run inside a fresh process: load the embedded model, time ``mode``, report seconds and memory."""
    import torch

    import dynheads
    from dynheads.ablation.cascade import AblationSettings, ablated_generate
    from dynheads.tasks import niah

    lm = dynheads.load_model()
    sample = niah.make_sample(lm.tokenizer, context_tokens=length, depth=0.5, seed=0)
    ids = torch.tensor([sample.input_ids])

    def run_once() -> None:
        if mode in ("traced", "traced_write"):
            write = mode == "traced_write"
            dynheads.trace(lm, sample, max_new_tokens=new_tokens, stop_at_eos=False, head_outputs=write)
            return
        if mode == "ablated":
            ablated_generate(lm, sample, AblationSettings(strategy="dynamic"), new_tokens, stop_at_eos=False)
            return
        lm.model.set_attn_implementation("eager" if mode == "eager" else "sdpa")
        with torch.inference_mode():
            lm.model.generate(
                ids,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                output_attentions=mode == "eager",
                return_dict_in_generate=mode == "eager",
                pad_token_id=lm.tokenizer.eos_token_id,
            )

    run_once()  # warm-up
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS counter (Linux)
    before = _rss_kb("VmRSS:")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run_once()
        times.append(time.perf_counter() - start)
    peak = _rss_kb("VmHWM:")
    return {
        "mode": mode,
        "context_tokens": length,
        "prompt_tokens": len(sample.input_ids),
        "new_tokens": new_tokens,
        "seconds": statistics.median(times),
        "all_seconds": times,
        "peak_rss_mb": peak / 1024,
        "increment_mb": (peak - before) / 1024,
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="1000,2000,4000")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eager-lengths", default="1000,2000,4000", help="lengths at which to run eager too")
    parser.add_argument("--ablated-lengths", default="2000", help="lengths at which to run ablated decoding too")
    parser.add_argument("--write-lengths", default="", help="lengths at which to trace with the write score too")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every mode, one after the other")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--child", nargs=2, metavar=("MODE", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), args.new_tokens, args.repeats)))
        return

    lengths = [int(x) for x in args.lengths.split(",")]
    eager = {int(x) for x in args.eager_lengths.split(",") if x}
    ablated = {int(x) for x in args.ablated_lengths.split(",") if x}
    write = {int(x) for x in args.write_lengths.split(",") if x}
    rows = []
    for length, round_ in ((length, r) for r in range(args.rounds) for length in lengths):
        extra = (["traced_write"] if length in write else []) + (["ablated"] if length in ablated else [])
        extra += ["eager"] if length in eager else []
        for mode in ["plain", "traced", *extra]:
            command = [
                sys.executable,
                __file__,
                "--child",
                mode,
                str(length),
                "--new-tokens",
                str(args.new_tokens),
                "--repeats",
                str(args.repeats),
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{mode} at {length}: failed ({done.stderr.strip().splitlines()[-1:]})", file=sys.stderr)
                continue
            rows.append({**json.loads(done.stdout.strip().splitlines()[-1]), "round": round_})
            print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tracing.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(table(rows))


def table(rows: list[dict]) -> str:
    """Markdown table of ratios against plain generate (and, for ablated decoding, traced) at the same length and
    round."""
    by = {(r["context_tokens"], r["mode"], r.get("round", 0)): r for r in rows}
    lines = [
        "| context | mode | time (s) | time / plain | time / traced | peak RSS (MB) | peak / plain | increment (MB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        key = (r["context_tokens"], r.get("round", 0))
        plain, traced = by.get((key[0], "plain", key[1])), by.get((key[0], "traced", key[1]))
        time_ratio = f"{r['seconds'] / plain['seconds']:.2f}x" if plain else "n/a"
        against_traced = r["mode"] in ("ablated", "traced_write")
        traced_ratio = f"{r['seconds'] / traced['seconds']:.2f}x" if traced and against_traced else ""
        mem_ratio = f"{r['peak_rss_mb'] / plain['peak_rss_mb']:.2f}x" if plain else "n/a"
        lines.append(
            f"| {r['context_tokens']} | {r['mode']} | {r['seconds']:.2f} | {time_ratio} | {traced_ratio} | "
            f"{r['peak_rss_mb']:.0f} | {mem_ratio} | {r['increment_mb']:.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
