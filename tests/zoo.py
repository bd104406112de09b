"""Tiny randomly initialised causal LMs of every supported family, built from configs (no downloads).

Small sliding windows (8) make the sliding-window code paths run on short prompts. The models live on
``TEST_DEVICE``: the CPU, or what ``DYNHEADS_TEST_DEVICE`` names (``cuda``: the oracle tests run on a GPU, see
``benchmarks/gpu_checks.sh``).
"""

from __future__ import annotations

import os

import torch
import transformers as tf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
TEST_DEVICE = torch.device(os.environ.get("DYNHEADS_TEST_DEVICE", "cpu"))
SLIDING = ["sliding_attention", "full_attention", "sliding_attention"]

FAMILIES = {
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {}),
    "mistral": (tf.MistralConfig, tf.MistralForCausalLM, {"sliding_window": 8}),
    "qwen2": (
        tf.Qwen2Config,
        tf.Qwen2ForCausalLM,
        {"use_sliding_window": True, "sliding_window": 8, "layer_types": SLIDING},
    ),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, {"head_dim": 16}),
    "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}),
    "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM, {"sliding_window": 8, "head_dim": 16, "layer_types": SLIDING}),
    "gemma3": (
        tf.Gemma3TextConfig,
        tf.Gemma3ForCausalLM,
        {"sliding_window": 8, "head_dim": 16, "layer_types": SLIDING},
    ),
}
# Beyond the seven the project names: exact too (tests/test_probe_exactness.py checks the rows), not run by the other
# tests (GPT-NeoX and GPT-2 have no grouped KV heads: their configs say so, as a real config's missing field would).
# StableLM and Falcon are refused: their layers drop the forward's keyword arguments (UNPROBED).
MORE_FAMILIES = {
    "olmo": (tf.OlmoConfig, tf.OlmoForCausalLM, {"pad_token_id": 0}),
    "olmo2": (tf.Olmo2Config, tf.Olmo2ForCausalLM, {}),
    "granite": (tf.GraniteConfig, tf.GraniteForCausalLM, {}),
    "cohere": (tf.CohereConfig, tf.CohereForCausalLM, {}),
    "gpt_neox": (tf.GPTNeoXConfig, tf.GPTNeoXForCausalLM, {"rotary_pct": 0.5, "num_key_value_heads": 4}),
    "gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel, {"num_key_value_heads": 4}),
    "phi": (tf.PhiConfig, tf.PhiForCausalLM, {}),
    "gemma": (tf.GemmaConfig, tf.GemmaForCausalLM, {"head_dim": 16}),
    "glm": (tf.GlmConfig, tf.GlmForCausalLM, {"head_dim": 16, "pad_token_id": 0}),
    "starcoder2": (tf.Starcoder2Config, tf.Starcoder2ForCausalLM, {"sliding_window": 8}),
    "qwen3_moe": (
        tf.Qwen3MoeConfig,
        tf.Qwen3MoeForCausalLM,
        {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    ),
}
UNPROBED = {
    "stablelm": (tf.StableLmConfig, tf.StableLmForCausalLM, {}),
    "falcon": (tf.FalconConfig, tf.FalconForCausalLM, {"num_kv_heads": 2, "new_decoder_architecture": True}),
}


def tiny_model(family: str, vocab_size: int = 128, seed: int = 0) -> tf.PreTrainedModel:
    config_cls, model_cls, extra = {**FAMILIES, **MORE_FAMILIES, **UNPROBED}[family]
    torch.manual_seed(seed)
    config = config_cls(vocab_size=vocab_size, **{**COMMON, **extra})
    model = model_cls(config).eval()
    model.to(TEST_DEVICE)  # after seeding and building on the CPU: the same weights on every device
    # Random init gives near-uniform attention; sharper queries make argmax tests meaningful.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "q_proj" in name and param.dim() == 2 or "qkv_proj" in name:
                param.mul_(4.0)
    return model


def eager_forward(model: tf.PreTrainedModel, ids: torch.Tensor):
    """transformers' own eager forward over ``ids`` (moved to the model's device) with every attention matrix (the
    tests' oracle), the model's attention implementation restored after it."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(ids.to(model.device), output_attentions=True)
    finally:
        model.set_attn_implementation(previous)


class NoTokenizer:
    """Stands in for a tokenizer where tests feed token ids directly: no vocabulary, ids decode to numbers."""

    eos_token_id = None

    def get_vocab(self) -> dict:
        return {}

    def convert_tokens_to_ids(self, token: str) -> None:  # no vocabulary: no token has an id
        return None

    def convert_ids_to_tokens(self, index: int) -> None:
        return None

    def decode(self, ids, **kwargs) -> str:
        return " ".join(map(str, ids))


def byte_tokenizer(template: str) -> tf.PreTrainedTokenizerFast:
    """A fast byte-level tokenizer (one token per byte, no merges) with ``template`` as its chat template."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    vocab["<eos>"] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = tf.PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>")
    tokenizer.chat_template = template
    return tokenizer


def tiny_sdpa_lm(family: str = "llama"):
    """A tiny random model on SDPA attention, wrapped as a ``LoadedModel`` (token ids only)."""
    from dynheads.models import LoadedModel

    model = tiny_model(family)
    model.set_attn_implementation("sdpa")
    return LoadedModel(model=model, tokenizer=NoTokenizer(), name=family, revision="random")


def random_prompt(seed: int = 0, length: int = 100) -> list[int]:
    """``length`` token ids drawn from 3..127 with ``seed``."""
    return torch.randint(3, 128, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
