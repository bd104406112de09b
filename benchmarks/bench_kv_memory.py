"""Memory the real per-head KV cache frees: cache bytes and peak resident memory against the full cache.

For each context length, one NIAH prompt (depth 0.5) is decoded greedily (``--new-tokens``, the stop token
ignored) by each mode, every mode in a fresh process of its own, interleaved length by length in one run so that
the modes see the same machine:

- ``full``: transformers' ``DynamicCache`` with SDPA (the unmodified model),
- ``headwise-S/R``: ``dynheads.kv.cache.HeadwiseCache`` with the ``--whole`` best-scored KV heads of ``--static``
  (scored heads only) kept whole and every other KV head streaming with S sink and R recent tokens.

Per run: ``cache_mb``, the bytes the cache holds after the last step (keys + values of every layer), and
``peak_mb``, the growth of the process's peak resident set (VmHWM, reset through /proc/self/clear_refs once the
model is loaded, one warm-up forward has paged its weights in and the prompt is built) over the prefill and the
decode steps: the cache, the prefill's activations and the transient copies together (glibc's mmap threshold
fixed at 128 KiB so freed tensors leave the resident set). Ratios are against ``full`` at the same length.

    python benchmarks/bench_kv_memory.py --lengths 2000,4000,8000 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

DEFAULT_STATIC = Path(__file__).resolve().parents[1] / "docs" / "kv-export" / "smollm2-static-max"


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(length: int, mode: str, new_tokens: int, whole: int, static: Path) -> dict:
    import numpy as np
    import torch
    from transformers import DynamicCache

    import dynheads
    from dynheads.kv.cache import headwise_generate
    from dynheads.models import with_cache
    from dynheads.tasks import niah

    lm = dynheads.load_model()
    sample = niah.make_sample(lm.tokenizer, context_tokens=length, depth=0.5, seed=0)
    ids = list(sample.input_ids)
    matrix = np.loadtxt(static / "full_attention_heads.tsv", delimiter="\t", ndmin=2)
    order = sorted(
        ((layer, kv) for layer, kv in zip(*np.nonzero(matrix > 0), strict=True)), key=lambda h: (-matrix[h], h)
    )
    kept = [(int(layer), int(kv)) for layer, kv in order[:whole]]
    with torch.inference_mode():  # touch every weight page first: the peak should measure the decoding only
        lm.model(input_ids=torch.tensor([ids[:16]]))
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    before = _status_kb("VmRSS")
    if mode == "full":
        cache = DynamicCache(config=lm.model.config)
        tokens = []
        with torch.inference_mode():
            prompt = torch.tensor([ids])
            out = lm.model(input_ids=prompt, **with_cache(lm.model, cache), use_cache=True, logits_to_keep=1)
            for _ in range(new_tokens):
                token = int(out.logits[0, -1].argmax())
                tokens.append(token)
                out = lm.model(input_ids=torch.tensor([[token]]), **with_cache(lm.model, cache), use_cache=True)
        cache_bytes = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    else:
        sink, recent = (int(x) for x in mode.removeprefix("headwise-").split("/"))
        result = headwise_generate(
            lm, ids, kept, sink=sink, recent=recent, max_new_tokens=new_tokens, stop_at_eos=False
        )
        cache_bytes, tokens = result.cache_bytes, result.tokens
    peak = _status_kb("VmHWM")
    return {
        "length": length,
        "prompt_tokens": len(ids),
        "mode": mode,
        "whole_kv_heads": len(kept),
        "cache_mb": cache_bytes / 1e6,
        "peak_mb": (peak - before) / 1024,
        "tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="2000,4000,8000")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--whole", type=int, default=9, help="KV heads kept whole (SmolLM2: 9 of 90 = 10 %%)")
    parser.add_argument("--windows", default="4/64,128/256", help="sink/recent of the streaming heads, per mode")
    parser.add_argument("--static", type=Path, default=DEFAULT_STATIC, help="a kv-export folder (its TSV ranks)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        length, mode = args.child.split(":", 1)
        print(json.dumps(child(int(length), mode, args.new_tokens, args.whole, args.static)))
        return
    modes = ["full"] + [f"headwise-{w}" for w in args.windows.split(",")]
    # A fixed mmap threshold: every large tensor is its own mapping, returned to the system when freed, so the peak
    # counts live memory rather than glibc's heap growth (its default threshold adapts upward after frees).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        for mode in modes:
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    f"{length}:{mode}",
                    "--new-tokens",
                    str(args.new_tokens),
                    "--whole",
                    str(args.whole),
                    "--static",
                    str(args.static),
                ],
                check=True,
                capture_output=True,
                text=True,
                env=env,
            )
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    for row in rows:
        full = next(r for r in rows if r["length"] == row["length"] and r["mode"] == "full")
        row["cache_vs_full"] = row["cache_mb"] / full["cache_mb"]
        row["peak_vs_full"] = row["peak_mb"] / full["peak_mb"]
        row["same_tokens_as_full"] = row["tokens"] == full["tokens"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kv-memory.json").write_text(
        json.dumps({"new_tokens": args.new_tokens, "whole": args.whole, "rows": rows}, indent=2) + "\n",
        encoding="utf-8",
    )
    print("| length | mode | cache MB | vs full | peak RSS growth MB | vs full |\n|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['prompt_tokens']} | {row['mode']} | {row['cache_mb']:.1f} | {row['cache_vs_full']:.3f} | "
            f"{row['peak_mb']:.1f} | {row['peak_vs_full']:.3f} |"
        )


if __name__ == "__main__":
    main()
