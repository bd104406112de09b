"""Where a traced decode step's extra time goes on a GPU (BENCHMARKS.md, "GPU profile").

Two parts, one process, on the random-weight Llama-3.1-8B shape of ``bench_gpu.py``:

1. **One layer's attention at a decode step**, timed with CUDA events over many calls, per context length:
   SDPA (what plain ``generate`` runs) against the probe's last-row attention (two ``bmm`` and an fp32 softmax)
   and its reductions (``probe._record``'s operators), each alone, so the step's extra cost splits into parts.
2. **The model**: prefill and decode timed apart for plain ``generate`` and ``dynheads.trace`` (1 and N + 1 new
   tokens), and a ``torch.profiler`` table of the traced decode's CUDA kernels and host operators.

    python benchmarks/profile_gpu.py --lengths 8192,65536 --out $OUT/profile.json
    python benchmarks/profile_gpu.py --tiny --device cpu --lengths 64 --new-tokens 4   # smoke test, any machine
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_gpu import LLAMA_8B, TINY, build, synchronize


def timed_calls(fn: Callable[[], object], device: str, calls: int) -> float:
    """Mean microseconds per call of ``fn`` after a warm-up, synchronised once around all calls."""
    for _ in range(3):
        fn()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / calls * 1e6


def layer_parts(shape: dict, length: int, device: str, dtype: torch.dtype, calls: int) -> dict:
    """Microseconds per call of one layer's decode attention: SDPA, the probe's row, its reductions."""
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    dim, groups = shape["hidden_size"] // heads, heads // kv_heads
    gen = torch.Generator(device="cpu").manual_seed(length)
    query = torch.randn(1, heads, 1, dim, generator=gen).to(device, dtype)
    key = torch.randn(1, kv_heads, length, dim, generator=gen).to(device, dtype)
    value = torch.randn(1, kv_heads, length, dim, generator=gen).to(device, dtype)
    weights = (torch.rand(1, length, 5, generator=gen) > 0.5).float().to(device)
    scaling = dim**-0.5

    def sdpa() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=scaling, enable_gqa=True)

    def row() -> tuple[torch.Tensor, torch.Tensor]:
        q_last = query.reshape(kv_heads, groups, dim)
        logits = torch.bmm(q_last, key.reshape(kv_heads, length, dim).transpose(1, 2)) * scaling
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        out = torch.bmm(probs.to(value.dtype), value.reshape(kv_heads, length, dim))
        return probs.view(1, heads, length), out

    probs = row()[0]

    def reductions() -> torch.Tensor:
        probs.max(dim=-1, keepdim=True)
        plogp = probs * torch.log(probs.clamp_min(1e-30))
        return torch.bmm(torch.cat([probs, plogp], dim=1), weights)

    def reductions_xlogy() -> torch.Tensor:
        probs.max(dim=-1, keepdim=True)
        return torch.cat([torch.bmm(probs, weights), torch.bmm(torch.special.xlogy(probs, probs), weights)], dim=1)

    layers = shape["num_hidden_layers"]
    stacked = probs.expand(layers, heads, length).contiguous()  # every layer's rows of one step
    stacked_weights = weights.expand(layers, length, 5)

    def reductions_once_per_step() -> torch.Tensor:  # all layers' reductions at once, per layer
        stacked.max(dim=-1, keepdim=True)
        both = torch.cat([stacked, torch.special.xlogy(stacked, stacked)], dim=1)
        return torch.bmm(both, stacked_weights)

    def logits_only() -> torch.Tensor:
        q_last = query.reshape(kv_heads, groups, dim)
        logits = torch.bmm(q_last, key.reshape(kv_heads, length, dim).transpose(1, 2)) * scaling
        return torch.softmax(logits, dim=-1, dtype=torch.float32)

    return {
        "context_tokens": length,
        "sdpa_us": timed_calls(sdpa, device, calls),
        "probe_row_us": timed_calls(row, device, calls),
        "probe_reductions_us": timed_calls(reductions, device, calls),
        "probe_reductions_xlogy_us": timed_calls(reductions_xlogy, device, calls),
        "probe_logits_softmax_us": timed_calls(logits_only, device, calls),
        "reductions_all_layers_once_us_per_layer": timed_calls(reductions_once_per_step, device, calls) / layers,
    }


def key_count_products(shape: dict, length: int, device: str, dtype: torch.dtype, calls: int) -> dict:
    """Microseconds per call of the products over the keys at one key count (run at an even and an odd one): the
    probabilities times V as eager lays them out, with padded rows, padded and split at a multiple of 8 keys
    (``probe.ROW_ALIGNMENT``), and the fp32 product of the rows with the key masks."""
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    dim, groups = shape["hidden_size"] // heads, heads // kv_heads
    gen = torch.Generator(device="cpu").manual_seed(length)
    probs = torch.softmax(torch.randn(kv_heads, groups, length, generator=gen), -1).to(device)
    value = torch.randn(kv_heads, length, dim, generator=gen).to(device, dtype)
    weights = (torch.rand(1, length, 5, generator=gen) > 0.5).float().to(device)
    width = -(-length // 8) * 8
    padded = torch.empty(kv_heads, groups, width, dtype=dtype, device=device)[..., :length]
    padded.copy_(probs)
    rows = probs.to(dtype)
    cut = length - length % 8

    def split() -> torch.Tensor:
        if cut == length:
            return torch.bmm(padded, value)
        return torch.baddbmm(torch.bmm(padded[..., cut:], value[:, cut:]), padded[..., :cut], value[:, :cut])

    both = torch.cat([probs.reshape(1, heads, length)] * 2, dim=1)
    return {
        "keys": length,
        "p_times_v_us": timed_calls(lambda: torch.bmm(rows, value), device, calls),
        "p_times_v_padded_us": timed_calls(lambda: torch.bmm(padded, value), device, calls),
        "p_times_v_padded_split_us": timed_calls(split, device, calls),
        "mask_product_fp32_us": timed_calls(lambda: torch.bmm(both, weights), device, calls),
    }


def model_phases(lm, length: int, new_tokens: int, device: str) -> dict:
    """Seconds of prefill (1 new token) and of ``new_tokens`` decode steps, plain ``generate`` and traced."""
    from dynheads.engine.tracing import trace_batch

    vocab = lm.model.config.vocab_size
    prompt = torch.randint(vocab, (length,), generator=torch.Generator().manual_seed(length)).tolist()
    sample = type("Sample", (), {"input_ids": prompt, "needle_positions": list(range(length // 2, length // 2 + 16))})
    ids = torch.tensor([prompt], device=device)

    def plain(n: int) -> Callable[[], object]:
        def run() -> object:
            with torch.inference_mode():
                return lm.model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

        return run

    def traced(n: int) -> Callable[[], object]:
        return lambda: trace_batch(lm, [sample()], n, stop_at_eos=False)

    row: dict = {"context_tokens": length, "new_tokens": new_tokens}
    for name, make in (("plain", plain), ("traced", traced)):
        make(2)()  # warm-up
        for n in (1, new_tokens + 1):
            synchronize(device)
            start = time.perf_counter()
            make(n)()
            synchronize(device)
            row[f"{name}_{n}_s"] = time.perf_counter() - start
        row[f"{name}_decode_ms_per_step"] = (row[f"{name}_{new_tokens + 1}_s"] - row[f"{name}_1_s"]) / new_tokens * 1e3
    return row


def profile_table(lm, length: int, new_tokens: int, device: str, traced: bool) -> str:
    """``torch.profiler``'s table (top CUDA kernels and host operators) of one generation."""
    from dynheads.engine.tracing import trace_batch

    vocab = lm.model.config.vocab_size
    prompt = torch.randint(vocab, (length,), generator=torch.Generator().manual_seed(1)).tolist()
    sample = type("Sample", (), {"input_ids": prompt, "needle_positions": [length // 2]})
    ids = torch.tensor([prompt], device=device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        if traced:
            trace_batch(lm, [sample()], new_tokens, stop_at_eos=False)
        else:
            with torch.inference_mode():
                lm.model.generate(
                    ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0
                )
        synchronize(device)
    sort = "cuda_time_total" if device.startswith("cuda") else "cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8192,65536")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model: check the script runs")
    parser.add_argument("--key-counts-only", action="store_true", help="only the products over even and odd key counts")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu-profile.json"))
    args = parser.parse_args()
    shape, dtype = (TINY if args.tiny else LLAMA_8B), getattr(torch, args.dtype)
    lengths = [int(n) for n in args.lengths.split(",")]
    result: dict = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device}
    counts = [n + odd for n in lengths for odd in (0, 1)]
    result["key_counts"] = [key_count_products(shape, n, args.device, dtype, args.calls) for n in counts]
    print(json.dumps(result["key_counts"], indent=1), flush=True)
    if args.key_counts_only:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        return
    result["layer"] = [layer_parts(shape, n, args.device, dtype, args.calls) for n in lengths]
    print(json.dumps(result["layer"], indent=1), flush=True)
    lm = build(shape, args.device, dtype)
    result["phases"] = [model_phases(lm, n, args.new_tokens, args.device) for n in lengths]
    print(json.dumps(result["phases"], indent=1), flush=True)
    for n in (lengths[0], lengths[-1]):
        for traced in (True, False):
            name = f"profile_{'traced' if traced else 'plain'}_{n}"
            result[name] = profile_table(lm, n, 8, args.device, traced=traced)
            print(name, result[name], sep="\n", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
