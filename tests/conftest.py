"""Shared fixtures: the embedded model (loaded once per session) and tiny models saved as local folders."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def embedded():
    from dynheads import load_model

    return load_model()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, embedded):
    """A tiny random Llama with the embedded model's tokenizer, saved like any local model folder."""
    from zoo import tiny_model

    folder = tmp_path_factory.mktemp("tiny-llama")
    model = tiny_model("llama", vocab_size=len(embedded.tokenizer))
    model.config.max_position_embeddings = 4096
    model.save_pretrained(folder)
    embedded.tokenizer.save_pretrained(folder)
    return folder
