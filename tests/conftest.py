"""Shared fixtures: the embedded model (loaded once per session) and tiny models saved as local folders.

Every test that reads the embedded model's GGUF (its weights or its tokenizer) is marked ``embedded``, the suite's one
marker: those using a fixture of ``EMBEDDED_FIXTURES`` (or one built on it, ``tiny_model_dir`` and ``tiny_lm``)
automatically here, the rest (the CLI on its default model, ``load_model`` of the GGUF) by hand.
``pytest -m "not embedded"`` (``scripts/test.sh --fast``) is the fast lane for local work, and passes with the GGUF
absent; CI runs everything.

tests/architecture/ holds the tests of the code's structure rather than its numbers (import floors, function length,
the public API, what start-up imports); they read the sources or start an interpreter, and load no model.
"""

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
def embedded_tokenizer():
    """The embedded model's tokenizer alone (seconds), not the whole model."""
    from transformers import AutoTokenizer

    from dynheads import models

    return AutoTokenizer.from_pretrained(str(models.embedded_gguf_path().parent), gguf_file=models.EMBEDDED_FILE)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, embedded_tokenizer):
    """A tiny random Llama with the embedded model's tokenizer, saved like any local model folder (the tokenizer
    alone is read from the GGUF: it saves the same files as the loaded model's)."""
    from zoo import tiny_model

    folder = tmp_path_factory.mktemp("tiny-llama")
    model = tiny_model("llama", vocab_size=len(embedded_tokenizer))
    model.config.max_position_embeddings = 4096
    model.save_pretrained(folder)
    embedded_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir):
    """``tiny_model_dir`` loaded, once per test module (a module's tests may share it, not modules)."""
    from dynheads import load_model

    return load_model(tiny_model_dir)


EMBEDDED_FIXTURES = {"embedded", "embedded_tokenizer"}


def pytest_report_header(config):
    """Where tests/zoo.py builds its tiny models (``DYNHEADS_TEST_DEVICE``; the CPU unless it names another)."""
    from zoo import TEST_DEVICE

    return f"dynheads tiny models on: {TEST_DEVICE}"


def pytest_collection_modifyitems(items):
    """Mark ``embedded`` every test whose fixtures (with those they depend on) read the embedded model's GGUF."""
    for item in items:
        if EMBEDDED_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.embedded)
