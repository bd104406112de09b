"""What the probe costs a decode step: no read of a device value on the host beyond the plain forward's own."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from zoo import FAMILIES, NoTokenizer, tiny_model

from dynheads.engine.decoding import DecodingSession
from dynheads.hostreads import HostReads
from dynheads.models import LoadedModel, with_cache


def test_host_reads_are_counted():
    values = torch.tensor([0.0, 2.0, 3.0])
    with HostReads() as reads:
        values.sum().item()
        values.tolist()
        values[values > 1]
        torch.nonzero(values)
        values + 1  # stays on the device
    assert reads.counts == {"item": 1, "tolist": 1, "mask index": 1, "nonzero": 1}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_probed_decode_step_reads_nothing_more_on_the_host(family):
    """The probe's reductions stay on the device: a probed decode pass (statistics assembled) makes exactly the host
    reads of the plain forward of the same step."""
    model = tiny_model(family)
    prompt = torch.randint(3, 128, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    lm = LoadedModel(model, NoTokenizer(), family, "random")
    session = DecodingSession(lm, prompt, range(4, 9), max_new_tokens=2)
    token = int(session.forward().logits.argmax())
    session.append(token)
    with HostReads() as probed:
        stats = session.forward(1).stats
    assert stats.total_mass.shape == (model.config.num_hidden_layers, model.config.num_attention_heads)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(torch.tensor([prompt]), **with_cache(model, cache), use_cache=True)
        with HostReads() as plain:
            model(torch.tensor([[token]]), **with_cache(model, cache), use_cache=True)
    assert probed.counts == plain.counts
