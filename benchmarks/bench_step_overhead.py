"""What the probe adds to one decode step, counted on the CPU (the GPU's proxy): operator calls and host reads.

A GPU decode step of a large model is short, so its cost is the host's: every operator call (dispatch, kernel
launch) and every read of a device value on the host (a sync that drains the GPU's queue). Both can be counted on
a CPU. The model is a skinny random-weight Llama built from a config (32 layers, hidden 256, 8 query / 2 KV
heads: the 8B's layer count and GQA with tiny matrices, so the per-layer work shows), prompt of random ids.
Side by side in one run:
``plain``  = ``model.generate`` (SDPA, greedy, exactly N new tokens),
``traced`` = ``dynheads.trace`` (probe on every layer, every step, every head score recorded but the write score),
``traced_write`` = the same with ``head_outputs=True`` (the write score too: each head's output measured).

Per decode step = (run with 1 + N new tokens - run with 1 new token) / N, so the prefill and what runs once
per sample (the trace's assembly) cancel out. Counted:
- aten operator calls (``torch.profiler``, every ``aten::`` event, nested ones included) and those called
  directly (no ``aten::`` parent), with the top operators per layer (per decode step / layers);
- host reads: calls that bring a tensor's value to the host (``item``, ``tolist``, ``cpu``, ``bool`` of a tensor,
  ``nonzero``, ...: ``dynheads.hostreads``; moves with ``Tensor.to`` are not counted);
- switches of the model's attention implementation (``set_attn_implementation``: a walk over every module, no
  operator call, so the profiler does not see it).

    OMP_NUM_THREADS=1 python benchmarks/bench_step_overhead.py --out benchmarks/results/step-overhead.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from bench_gpu import build
from torch.profiler import ProfilerActivity, profile

from dynheads.hostreads import HostReads

SKINNY = dict(
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=32,
    num_attention_heads=8,
    num_key_value_heads=2,
    vocab_size=32000,
    max_position_embeddings=4096,
)


def operator_calls(run: Callable[[], None]) -> tuple[Counter[str], int]:
    """Every ``aten::`` event of ``run`` by name, and how many were called directly (no ``aten::`` parent)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    counts: Counter[str] = Counter()
    direct = 0
    for event in prof.events():
        if event.name.startswith("aten::"):
            counts[event.name] += 1
            parent = event.cpu_parent
            direct += parent is None or not parent.name.startswith("aten::")
    return counts, direct


def host_reads(run: Callable[[], None]) -> Counter[str]:
    with HostReads() as reads:
        run()
    return reads.counts


def attention_switches(model, run: Callable[[], None]) -> Counter[str]:
    """How often ``run`` switches ``model``'s attention implementation."""
    switch, calls = model.set_attn_implementation, Counter[str]()

    def counted(*args, **kwargs):
        calls["set_attn_implementation"] += 1
        return switch(*args, **kwargs)

    model.set_attn_implementation = counted
    try:
        run()
    finally:
        del model.set_attn_implementation  # the instance attribute goes, the method is back
    return calls


def switch_seconds(model, repeats: int = 200) -> float:
    """Seconds one switch of ``model``'s attention implementation there and back takes (what ``attached`` costs a
    pass outside a decoding loop)."""
    from dynheads.engine.probe import ATTN_NAME

    previous = model.config._attn_implementation
    start = time.perf_counter()
    for _ in range(repeats):
        model.set_attn_implementation(ATTN_NAME)
        model.set_attn_implementation(previous)
    return (time.perf_counter() - start) / repeats


def per_step(count: Callable[[int], Counter[str]], steps: int) -> dict[str, float]:
    """Per decode step: counts of a run with ``1 + steps`` new tokens minus those of a run with 1, over ``steps``."""
    one, full = count(1), count(1 + steps)
    names = set(one) | set(full)
    return {name: (full[name] - one[name]) / steps for name in names if full[name] != one[name]}


def measure(mode: str, run: Callable[[int], None], steps: int, layers: int, model) -> dict:
    run(1 + steps)  # warm-up: lazy initialisation is not a step's cost

    def ops(new_tokens: int) -> Counter[str]:
        counts, direct = operator_calls(lambda: run(new_tokens))
        counts["(direct)"] = direct
        return counts

    calls = per_step(ops, steps)
    direct = calls.pop("(direct)", 0.0)
    reads = per_step(lambda new_tokens: host_reads(lambda: run(new_tokens)), steps)
    switches = per_step(lambda new_tokens: attention_switches(model, lambda: run(new_tokens)), steps)
    return {
        "mode": mode,
        "aten_calls_per_step": sum(calls.values()),
        "direct_calls_per_step": direct,
        "host_reads_per_step": sum(reads.values()),
        "host_reads": dict(sorted(reads.items())),
        "attention_switches_per_step": switches.get("set_attn_implementation", 0.0),
        "per_layer": {name: value / layers for name, value in sorted(calls.items(), key=lambda kv: -kv[1])},
    }


def table(plain: dict, traced: dict, traced_write: dict, top: int) -> str:
    """Markdown: totals side by side, then the operators whose per-layer counts differ most (plain vs traced)."""
    lines = [
        "| per decode step | plain | traced | traced / plain | traced, write score | its / plain |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in [
        ("aten_calls_per_step", "aten operator calls"),
        ("direct_calls_per_step", "called directly"),
        ("host_reads_per_step", "host reads"),
        ("attention_switches_per_step", "attention switches"),
    ]:
        ratios = [f"{run[key] / plain[key]:.2f}x" if plain[key] else "n/a" for run in (traced, traced_write)]
        cells = f"{traced[key]:.0f} | {ratios[0]} | {traced_write[key]:.0f} | {ratios[1]}"
        lines.append(f"| {label} | {plain[key]:.0f} | {cells} |")
    lines += ["", "| operator (calls per layer per step) | plain | traced | difference |", "|---|---|---|---|"]
    names = set(plain["per_layer"]) | set(traced["per_layer"])
    differences = {n: traced["per_layer"].get(n, 0.0) - plain["per_layer"].get(n, 0.0) for n in names}
    for name in sorted(names, key=lambda n: -abs(differences[n]))[:top]:
        p, t = plain["per_layer"].get(name, 0.0), traced["per_layer"].get(name, 0.0)
        lines.append(f"| `{name}` | {p:.2f} | {t:.2f} | {differences[name]:+.2f} |")
    lines += ["", f"host reads per step: plain {plain['host_reads']}, traced {traced['host_reads']}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    parser.add_argument("--steps", type=int, default=16, help="decode steps counted")
    parser.add_argument("--top", type=int, default=15, help="operators listed per layer")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/step-overhead.json"))
    args = parser.parse_args()

    from dynheads.engine.tracing import trace

    torch.manual_seed(0)
    lm = build(SKINNY, "cpu", torch.float32)
    prompt = torch.randint(SKINNY["vocab_size"], (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    sample = type(
        "Sample", (), {"input_ids": prompt, "needle_positions": range(args.prompt // 2, args.prompt // 2 + 16)}
    )
    ids = torch.tensor([prompt])

    def plain(new_tokens: int) -> None:
        with torch.inference_mode():
            lm.model.generate(
                ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0
            )

    def traced(new_tokens: int) -> None:
        trace(lm, sample, max_new_tokens=new_tokens, stop_at_eos=False)

    def traced_write(new_tokens: int) -> None:
        trace(lm, sample, max_new_tokens=new_tokens, stop_at_eos=False, head_outputs=True)

    layers = SKINNY["num_hidden_layers"]
    results = [
        measure("plain", plain, args.steps, layers, lm.model),
        measure("traced", traced, args.steps, layers, lm.model),
        measure("traced_write", traced_write, args.steps, layers, lm.model),
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    setup = {
        "model": SKINNY,
        "prompt_tokens": args.prompt,
        "decode_steps": args.steps,
        "torch": torch.__version__,
        "modules": sum(1 for _ in lm.model.modules()),
        "switch_there_and_back_ms": 1e3 * switch_seconds(lm.model),
    }
    args.out.write_text(json.dumps({**setup, "runs": results}, indent=2) + "\n")
    print(table(*results, top=args.top))
    switch = f"{setup['switch_there_and_back_ms']:.2f} ms ({setup['modules']} modules)"
    print(f"one switch of the attention there and back: {switch}")


if __name__ == "__main__":
    main()
