"""The de-quantised copy of a GGUF is keyed by dtype: a float32 load never reads an earlier bfloat16 load's copy."""

from types import SimpleNamespace

import pytest
import torch

from dynheads import DynheadsError, models


def test_each_dtype_gets_its_own_dequantised_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"not a real gguf: the loader is replaced below")
    dequantised_with, read_from = [], []

    def fake_load(source, dtype, device_map=None, **extra):
        (dequantised_with if "gguf_file" in extra else read_from).append(dtype)
        return torch.nn.Linear(2, 2).to(torch.float32 if dtype == "auto" else dtype), object()

    def fake_save(model, tokenizer, target):
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_load_pretrained", fake_load)
    monkeypatch.setattr(models, "_save_atomically", fake_save)
    for dtype in ("bfloat16", "float32", "bfloat16", "auto"):
        loaded = models.load_model(gguf, dtype=dtype, device="cpu")
        assert loaded.model.weight.dtype == (torch.float32 if dtype == "auto" else getattr(torch, dtype))
    # bfloat16 and float32 each de-quantise once; every load then reads its copy (the first right after writing it,
    # tests/test_gguf_first_load.py), the repeated bfloat16 and "auto" (float32) loads without de-quantising
    assert dequantised_with == [torch.bfloat16, torch.float32]
    assert read_from == [torch.bfloat16, torch.float32, torch.bfloat16, "auto"]
    digest = models.file_sha256(gguf)
    assert len(models.dequantised_copies(digest)) == 2


def test_load_tokenizer_reads_the_tokenizer_and_window_without_weights(tiny_model_dir, embedded):
    from dynheads import load_tokenizer

    folder = load_tokenizer(tiny_model_dir)
    assert folder.max_context == 4096 and folder.name == tiny_model_dir.name
    assert folder.tokenizer("the magic word").input_ids == embedded.tokenizer("the magic word").input_ids
    gguf = load_tokenizer()  # the embedded GGUF: its de-quantised copy's tokenizer and config
    assert (gguf.name, gguf.max_context) == (embedded.name, embedded.max_context)
    with pytest.raises(DynheadsError, match="GGUF file not found"):
        load_tokenizer("missing.gguf")


def test_a_dequantised_copy_that_cannot_be_saved_is_said_and_the_load_goes_on(tmp_path, monkeypatch):
    """A full disk: the copy is not written, the load uses the model as de-quantised, and a warning says so (its
    decode steps can differ in the last digits from later loads of a saved copy); nothing half-written is left."""
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"not a real gguf: the loader is replaced below")

    class Unsaveable(torch.nn.Linear):
        config = SimpleNamespace()

        def save_pretrained(self, folder):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(models, "_load_pretrained", lambda *args, **extra: (Unsaveable(2, 2), object()))
    with pytest.warns(UserWarning, match=r"not saved to .*No space left on device.*last digits"):
        loaded = models.load_model(gguf, device="cpu")
    assert isinstance(loaded.model, Unsaveable)
    assert not any((tmp_path / "cache" / "gguf").iterdir())  # the staging folder is removed
