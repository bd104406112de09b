"""Per-head KV visibility (DuoAttention streaming heads) against an eager reference with the same per-head masks.

Oracle: a from-scratch eager attention function (repeat the KV heads, matmul, soft-cap, mask, fp32 softmax)
runs the whole sequence without a cache, with a ``[H, T, T]`` mask per layer: plain causal (and sliding window)
for every prefill row and for full-KV heads, sink + recent keys only for the streaming heads of each decoded
row. The probe, decoding from the KV cache with its ``RowEdit.full_kv`` changed at every step, must give the same
last-row attention of every head (fp32, 1e-5) and the same logits, for every family, GQA included.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from zoo import FAMILIES, NoTokenizer, tiny_model

from dynheads.engine.decoding import DecodingSession
from dynheads.engine.probe import Measure, RowEdit
from dynheads.models import LoadedModel

TOL = 1e-5
PROMPT_LEN, SINK, RECENT = 20, 2, 3
REF_NAME = "kv_reference_eager"
_REF: dict = {"masks": None, "rows": {}}


def _reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Plain eager attention with a per-head mask ``[H, q, kv]`` on top of the model's own (causal) mask."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    logits = torch.matmul(query, key.transpose(-1, -2)) * scaling  # [1, H, q, kv]
    if kwargs.get("softcap") is not None:
        logits = torch.tanh(logits / kwargs["softcap"]) * kwargs["softcap"]
    mask = _REF["masks"][module.layer_idx][None]  # [1, H, q, kv]
    if attention_mask is None:  # sdpa_mask skips plain causal masks: rebuild it (no cache: q = kv)
        length = query.shape[2]
        attention_mask = torch.ones(length, length, dtype=torch.bool).tril()
        if kwargs.get("sliding_window"):
            attention_mask &= ~torch.ones(length, length, dtype=torch.bool).tril(-kwargs["sliding_window"])
    mask = mask & attention_mask
    probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1, dtype=torch.float32)
    _REF["rows"][module.layer_idx] = probs[0, :, -1]
    return torch.matmul(probs.to(value.dtype), value).transpose(1, 2).contiguous(), None


AttentionInterface.register(REF_NAME, _reference_attention)
AttentionMaskInterface.register(REF_NAME, sdpa_mask)


def _reference_masks(layers: int, heads: int, length: int, full_by_row: dict[int, set]) -> list[torch.Tensor]:
    """Per layer ``[H, T, T]``: row r of a streaming head at a decoded position sees keys < SINK or > r - RECENT."""
    cols = torch.arange(length)
    masks = []
    for layer in range(layers):
        mask = torch.ones(heads, length, length, dtype=torch.bool)
        for row, full in full_by_row.items():
            for head in range(heads):
                if (layer, head) not in full:
                    mask[head, row] = (cols < SINK) | (cols > row - RECENT)
        masks.append(mask)
    return masks


def _reference(model, ids: torch.Tensor, masks: list[torch.Tensor]) -> tuple[dict, torch.Tensor]:
    previous = model.config._attn_implementation
    _REF["masks"], _REF["rows"] = masks, {}
    model.set_attn_implementation(REF_NAME)
    try:
        with torch.no_grad():
            logits = model(ids).logits[0, -1]
    finally:
        model.set_attn_implementation(previous)
    return dict(_REF["rows"]), logits


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_per_head_visibility_equals_eager_with_per_head_masks(family):
    model = tiny_model(family)
    lm = LoadedModel(model=model, tokenizer=NoTokenizer(), name=family, revision="random")
    layers, heads = lm.num_layers, lm.num_heads
    assert model.config.num_key_value_heads < heads  # GQA: query heads share KV heads
    torch.manual_seed(1)
    prompt = torch.randint(3, 128, (PROMPT_LEN,)).tolist()
    every = {(layer, head) for layer in range(layers) for head in range(heads)}
    # A different full-KV set per decoded step: some heads, one head, none (all streaming), every head.
    schedule = [{(0, 1), (2, 3), (1, 0)}, {(1, 2)}, set(), every, {(0, 0), (0, 1), (2, 2)}]
    session = DecodingSession(lm, prompt, (), max_new_tokens=len(schedule))
    session.forward(PROMPT_LEN - 1)  # prefill stays full; the last prompt token is the first decoded row
    full_by_row: dict[int, set] = {}
    for full in schedule:
        session.probe.set_edits([RowEdit(full_kv=frozenset(full), kv_sink=SINK, kv_recent=RECENT)])
        row = session.length
        result = session.forward(1, Measure(rows=frozenset(every)))
        full_by_row[row] = full
        ids = session.ids[: session.length][None]
        rows, logits = _reference(model, ids, _reference_masks(layers, heads, session.length, full_by_row))
        for layer in range(layers):
            probe_rows = torch.stack([result.stats.rows[(layer, h)] for h in range(heads)])
            assert (probe_rows - rows[layer]).abs().max() <= TOL, (family, row, layer)
            assert (result.stats.total_mass[layer] - 1).abs().max() <= TOL
        assert (result.logits - logits).abs().max() <= 1e-4, (family, row)
        session.append(int(result.logits.argmax()))


def test_streaming_heads_see_only_sink_and_recent_keys():
    model = tiny_model("llama")
    lm = LoadedModel(model=model, tokenizer=NoTokenizer(), name="llama", revision="random")
    prompt = torch.randint(3, 128, (PROMPT_LEN,), generator=torch.Generator().manual_seed(4)).tolist()
    session = DecodingSession(lm, prompt, (), max_new_tokens=1)
    session.forward(PROMPT_LEN - 1)
    session.probe.set_edits([RowEdit(full_kv=frozenset({(1, 1)}), kv_sink=SINK, kv_recent=RECENT)])
    stats = session.forward(1, Measure(rows=frozenset({(1, 0), (1, 1)}))).stats
    last = PROMPT_LEN - 1
    streaming, full = stats.rows[(1, 0)], stats.rows[(1, 1)]
    hidden = torch.ones(PROMPT_LEN, dtype=torch.bool)
    hidden[:SINK] = False
    hidden[last - RECENT + 1 :] = False
    assert streaming[hidden].abs().max() == 0 and abs(float(streaming.sum()) - 1) <= TOL
    assert (full[hidden] > 0).all()  # head 1 shares its KV head with head 0 (GQA) yet still sees every key


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_every_head_full_is_the_unmodified_model(family):
    model = tiny_model(family)
    lm = LoadedModel(model=model, tokenizer=NoTokenizer(), name=family, revision="random")
    every = [(layer, head) for layer in range(lm.num_layers) for head in range(lm.num_heads)]
    prompt = torch.randint(3, 128, (PROMPT_LEN,), generator=torch.Generator().manual_seed(5)).tolist()
    outputs = []
    for full in (None, every):
        session = DecodingSession(lm, prompt, (), max_new_tokens=3)
        session.forward(PROMPT_LEN - 1)
        kept = None if full is None else frozenset(full)
        session.probe.set_edits([RowEdit(full_kv=kept, kv_sink=SINK, kv_recent=RECENT)])
        logits = []
        for _ in range(3):
            result = session.forward(1)
            logits.append(result.logits)
            session.append(int(result.logits.argmax()))
        outputs.append(torch.stack(logits))
    assert torch.equal(outputs[0], outputs[1])
