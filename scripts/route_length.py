"""How far a config travels: the distinct project functions that run between a Claim 2 stage's config and the
files it writes, counted by running the stage a second time (``sys.setprofile``; the first run does the imports)
on a tiny random Llama with the embedded model's tokenizer, one sample and one fraction. Run it against two
checkouts to compare them on the same footing:

    PYTHONPATH=src python scripts/route_length.py            # this checkout
    PYTHONPATH=/path/to/other/src python scripts/route_length.py

Prints the functions of ``src/dynheads`` called at least once (the steps; comprehensions and lambdas are not),
split into the route (every module but the mechanisms ``engine/``, ``ablation/``, ``kv/``, ``models``, which the
stage drives and no restructuring of the runners changes), the runner's part of it (``experiments/``) and the
mechanisms, with the return events of each. Issue 62 asked for the route "from the config to its files" in under
half of the steps it took before; this is that count as code.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

MECHANISMS = ("dynheads/engine/", "dynheads/ablation/", "dynheads/kv/", "dynheads/models.py")


def _tiny_model(folder: Path) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    from dynheads.models import load_tokenizer

    tokenizer = load_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer.tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    import torch

    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.tokenizer.save_pretrained(folder)
    return str(folder)


def main() -> None:
    import dynheads
    from dynheads import experiments
    from dynheads.models import load_model

    root = str(Path(dynheads.__file__).parent.parent)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model_dir = _tiny_model(folder / "model")
        (folder / "static_summary.json").write_text(json.dumps({"split": "static", "num_tests": 4, "num_counted": 3}))
        (folder / "static_heads.json").write_text(json.dumps(["2-1", "0-3", "1-2", "2-0", "0-0"]))
        config = experiments.AblationConfig(
            model=model_dir,
            lengths=(200,),
            depths=(0.5,),
            runs=1,
            max_new_tokens=3,
            seed=3,
            static=str(folder / "static_heads.json"),
            fractions=(1.0,),
            metric="teacher",
        )
        lm = load_model(model_dir)
        calls: Counter[str] = Counter()
        returns: Counter[str] = Counter()

        def profile(frame, event, arg):
            path = frame.f_code.co_filename
            name = frame.f_code.co_name
            if path.startswith(root) and event in ("call", "return") and not name.startswith("<"):
                key = f"{path[len(root) + 1 :]}:{frame.f_code.co_qualname}"
                (calls if event == "call" else returns)[key] += 1

        experiments.run_claim2(config, folder / "warm-up", lm=lm, progress=False)  # every lazy import done before
        sys.setprofile(profile)
        try:
            experiments.run_claim2(config, folder / "run", lm=lm, progress=False)
        finally:
            sys.setprofile(None)
    route = [name for name in calls if not name.startswith(MECHANISMS)]
    runners = [name for name in route if name.startswith("dynheads/experiments/")]
    mechanisms = [name for name in calls if name.startswith(MECHANISMS)]
    print(
        f"route (runner, settings, views, tables, runs, ...): {len(route)} functions, "
        f"{sum(returns[n] for n in route)} returns"
    )
    print(f"of which experiments/ (the runner): {len(runners)} functions, {sum(returns[n] for n in runners)} returns")
    print(f"mechanisms (engine, ablation, kv, models): {len(mechanisms)} functions")
    for name in sorted(route):
        print("  ", name, calls[name])


if __name__ == "__main__":
    main()
