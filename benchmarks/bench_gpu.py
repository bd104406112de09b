"""GPU section of BENCHMARKS.md: traced vs plain generation on a Llama-3.1-8B-shaped model, 8k-64k context.

The model is built from a config with random weights (no download): 32 layers, 32 query / 8 KV heads,
hidden 4096, MLP 14336, vocabulary 128256, bf16 on CUDA. Prompts are random token ids (attention patterns
do not change the cost). Per context length, one process runs, interleaved per round:
``plain``  = ``model.generate`` (SDPA, greedy, exactly N new tokens),
``traced`` = ``dynheads.trace`` at batch 1, and ``trace_batch`` at ``--batch-sizes`` > 1,
and records wall time and ``torch.cuda.max_memory_allocated`` (peak) per mode.
``--write-score`` adds a traced B = 1 mode with the write score (``head_outputs=True``; off in ``traced``).
``--row-alignments 8,1`` adds a traced B = 1 mode per value of ``dynheads.engine.probe.ROW_ALIGNMENT`` (8 is the
default, 1 the unpadded rows of before) in the same rounds, and per length compares the two traces' statistics
(``alignment_check`` rows: the second trace is teacher-forced on the first's tokens, so both see the same inputs;
the greatest difference of any statistic, and at how many steps the second would have chosen another token).

    python benchmarks/bench_gpu.py --lengths 8192,16384,32768,65536 --new-tokens 32 \
        --out benchmarks/results/gpu.json
    python benchmarks/bench_gpu.py --tiny --device cpu --lengths 64 --new-tokens 4   # smoke test, any machine
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

import torch
import transformers as tf

LLAMA_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    max_position_embeddings=131072,
    rope_theta=500000.0,
)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=4096,
)


class IdTokenizer:
    """Token ids only: nothing is decoded into words here."""

    eos_token_id = None

    def get_vocab(self) -> dict:
        return {}

    def decode(self, ids, **kwargs) -> str:
        return " ".join(map(str, ids))


def build(shape: dict, device: str, dtype: torch.dtype):
    """A random-weight Llama of ``shape`` (``LLAMA_8B``, ``TINY``, ...) on ``device``, SDPA attention, no stop token."""
    from dynheads.models import LoadedModel

    config = tf.LlamaConfig(**shape, eos_token_id=None, bos_token_id=None)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = tf.LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(previous)
    model.set_attn_implementation("sdpa")
    model.generation_config.eos_token_id = None
    return LoadedModel(model=model, tokenizer=IdTokenizer(), name="random Llama", revision="random")


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(name: str, device: str, run) -> dict:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    synchronize(device)
    start = time.perf_counter()
    run()
    synchronize(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else float("nan")
    return {"mode": name, "seconds": seconds, "peak_gib": peak}


def alignment_check(first, second, alignments: list[int], length: int) -> dict:
    """How far two traces of the same prompt at two row alignments are apart: every statistic's largest difference."""
    import numpy as np

    arrays = {"needle_mass": first.needle_mass, "max_prob": first.max_prob, "hidden": first.hidden}
    arrays.update({f"score_{name}": values for name, values in first.scores.items()})
    others = {"needle_mass": second.needle_mass, "max_prob": second.max_prob, "hidden": second.hidden}
    others.update({f"score_{name}": values for name, values in second.scores.items()})
    return {
        "mode": "alignment_check",
        "alignments": alignments,
        "context_tokens": length,
        "steps": int(first.num_steps),
        "steps_second_would_choose_otherwise": int((second.token_prob < second.token_max_prob).sum()),
        "argmax_pos_equal_share": float((first.argmax_pos == second.argmax_pos).mean()),
        "max_abs_diff": {
            name: float(np.abs(values.astype(np.float64) - others[name].astype(np.float64)).max())
            for name, values in arrays.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="8192,16384,32768,65536")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batch-sizes", default="1,4", help="traced batch sizes (1 = dynheads.trace)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--row-alignments", default="", help="e.g. 8,1: a traced B = 1 mode per probe.ROW_ALIGNMENT")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model: check the script runs")
    parser.add_argument(
        "--write-score", action="store_true", help="also a traced B = 1 mode with the write score (head_outputs=True)"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu.json"))
    args = parser.parse_args()
    alignments = [int(a) for a in args.row_alignments.split(",") if a]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    if not batch_sizes and not alignments:  # plain generate alone compares nothing
        parser.error("nothing traced: give --batch-sizes (1 = dynheads.trace) or --row-alignments")

    from dynheads.engine import probe
    from dynheads.engine.tracing import trace, trace_batch

    lm = build(TINY if args.tiny else LLAMA_8B, args.device, getattr(torch, args.dtype))
    default_alignment = probe.ROW_ALIGNMENT
    vocab = lm.model.config.vocab_size
    rows = []
    for length in [int(n) for n in args.lengths.split(",")]:
        generator = torch.Generator().manual_seed(length)
        prompts = [
            torch.randint(vocab, (length,), generator=generator).tolist() for _ in range(max(batch_sizes, default=1))
        ]
        needle = list(range(length // 2, length // 2 + 16))
        samples = [type("Sample", (), {"input_ids": p, "needle_positions": needle})() for p in prompts]
        ids = torch.tensor([prompts[0]], device=args.device)

        def traced(alignment: int, samples=samples, forced=None):
            probe.ROW_ALIGNMENT = alignment
            try:
                if forced is not None:  # the same tokens: the two traces see the same inputs at every step
                    return trace(lm, samples[0], args.new_tokens, stop_at_eos=False, forced_tokens=forced)
                return trace_batch(lm, samples[:1], args.new_tokens, stop_at_eos=False)[0]
            finally:
                probe.ROW_ALIGNMENT = default_alignment

        def plain(ids=ids) -> None:
            with torch.inference_mode():
                lm.model.generate(
                    ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0
                )

        for round_ in range(args.rounds + 1):  # round 0 warms up
            results = [measure("plain", args.device, plain)]
            for size in batch_sizes:
                results.append(
                    measure(
                        f"traced_b{size}",
                        args.device,
                        lambda size=size, samples=samples: trace_batch(
                            lm, samples[:size], args.new_tokens, stop_at_eos=False
                        ),
                    )
                )
                results[-1]["tokens_per_s"] = size * args.new_tokens / results[-1]["seconds"]
            for alignment in alignments:
                results.append(measure(f"traced_b1_align{alignment}", args.device, lambda a=alignment: traced(a)))
            if args.write_score:  # what the write score adds to a traced step, beside the default trace
                write = partial(trace, lm, samples[0], args.new_tokens, stop_at_eos=False, head_outputs=True)
                results.append(measure("traced_b1_write", args.device, write))
            for entry in results:
                entry.update(context_tokens=length, round=round_, new_tokens=args.new_tokens)
                print(json.dumps(entry), flush=True)
            if round_:
                rows.extend(results)
        if len(alignments) > 1:
            first = traced(alignments[0])
            second = traced(alignments[1], forced=first.tokens.tolist())
            rows.append(alignment_check(first, second, alignments[:2], length))
            print(json.dumps(rows[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    args.out.write_text(
        json.dumps(
            {"device": device, "torch": torch.__version__, "dtype": args.dtype, "tiny": args.tiny, "runs": rows},
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
