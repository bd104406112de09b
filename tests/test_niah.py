"""NIAH samples on the embedded tokenizer, tracing on the embedded model, and bad-input errors."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dynheads import DynheadsError, niah, trace
from dynheads.engine.decoding import check_fits


def test_needle_span_is_exactly_the_needle_sentence(embedded):
    tok = embedded.tokenizer
    sample = niah.make_sample(tok, context_tokens=600, depth=0.5, seed=7)
    decoded = tok.decode([sample.input_ids[i] for i in sample.needle_positions])
    assert decoded.strip() == f"The magic word is {sample.answer}."
    positions = sample.needle_positions
    assert positions == list(range(positions[0], positions[-1] + 1))  # one contiguous span
    assert abs(len(sample.input_ids) - 600) < 120  # haystack length + chat markup and question


def test_a_sample_is_made_from_the_loaded_model_as_from_its_tokenizer(embedded):
    from_model = niah.make_sample(embedded, context_tokens=300, depth=0.5, seed=7)
    assert from_model == niah.make_sample(embedded.tokenizer, context_tokens=300, depth=0.5, seed=7)


def test_a_sample_longer_than_the_loaded_window_is_refused_when_made(embedded_tokenizer):
    from dynheads.models import LoadedTokenizer

    loaded = LoadedTokenizer(embedded_tokenizer, name="embedded", max_context=400)
    with pytest.raises(DynheadsError, match="context_tokens=100000 exceeds the model's context window of 400"):
        niah.make_sample(loaded, context_tokens=100000, depth=0.5, seed=7)  # refused before any haystack is built
    with pytest.raises(DynheadsError, match=r"a prompt of \d+ tokens around a haystack of 390 exceeds .* of 400"):
        niah.make_sample(loaded, context_tokens=390, depth=0.5, seed=7)  # the chat markup and question push it over
    assert len(niah.make_sample(loaded, context_tokens=300, depth=0.5, seed=7).input_ids) <= 400


def test_samples_are_seeded_and_depth_moves_the_needle(embedded):
    tok = embedded.tokenizer
    first = niah.make_sample(tok, context_tokens=500, depth=0.25, seed=3)
    again = niah.make_sample(tok, context_tokens=500, depth=0.25, seed=3)
    other = niah.make_sample(tok, context_tokens=500, depth=0.25, seed=4)
    assert first == again
    assert other.answer != first.answer
    starts = [niah.make_sample(tok, context_tokens=800, depth=d, seed=3).needle_positions[0] for d in (0, 0.5, 1)]
    assert starts[0] < starts[1] < starts[2]


def test_needle_goes_back_to_a_sentence_end(embedded):
    tok = embedded.tokenizer
    sample = niah.make_sample(tok, context_tokens=700, depth=0.6, seed=11)
    before = tok.decode(sample.input_ids[sample.needle_positions[0] - 3 : sample.needle_positions[0]])
    assert before.rstrip().endswith((".", "!", "?", '."', ".'", ".)"))


def test_bad_depth_and_haystack_errors(embedded, tmp_path):
    tok = embedded.tokenizer
    with pytest.raises(DynheadsError, match="depth"):
        niah.make_sample(tok, context_tokens=500, depth=1.5, seed=0)
    with pytest.raises(DynheadsError, match="depth"):
        niah.make_sample(tok, context_tokens=500, depth=-0.1, seed=0)
    with pytest.raises(DynheadsError, match="not found"):
        niah.make_sample(tok, context_tokens=500, depth=0.5, seed=0, haystack=tmp_path / "missing")
    with pytest.raises(DynheadsError, match="no non-empty .txt file"):
        niah.make_sample(tok, context_tokens=500, depth=0.5, seed=0, haystack=tmp_path)
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\xfa not utf-8")
    with pytest.raises(DynheadsError, match="bad.txt is not UTF-8 text: byte 0xff at byte offset 0"):
        niah.load_haystack(tmp_path)


def test_a_haystack_of_your_own_is_read_as_utf8_text(tmp_path):
    """A byte-order mark (Windows editors write one) is not text; one .txt file given alone is named as a file."""
    (tmp_path / "b.txt").write_bytes(b"\xef\xbb\xbfSecond file.\n")
    (tmp_path / "a.txt").write_text("  First file.  ", encoding="utf-8")
    (tmp_path / "notes.md").write_text("Not read.", encoding="utf-8")
    assert niah.load_haystack(tmp_path) == "First file.\n\nSecond file."  # name order, no U+FEFF
    with pytest.raises(DynheadsError, match=r"the haystack is a folder of .txt files, and .*a.txt is a file"):
        niah.load_haystack(tmp_path / "a.txt")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deeper").mkdir()
    (tmp_path / "sub" / "deeper" / "c.txt").write_text("Too deep.", encoding="utf-8")
    with pytest.raises(DynheadsError, match=r"no non-empty .txt file \(only the .txt files directly in it"):
        niah.load_haystack(tmp_path / "sub")


def test_needle_lost_in_tokenisation_is_refused(tmp_path):
    # A word-level tokenizer that knows the haystack words but not the UUID: the needle decodes to [UNK].
    vocab = {"[UNK]": 0, "The": 1, "magic": 2, "word": 3, "is": 4, ".": 5, "the": 6, "cat": 7, "sat": 8}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    (tmp_path / "a.txt").write_text("the cat sat . " * 200)
    with pytest.raises(DynheadsError, match="does not survive tokenisation"):
        niah.make_sample(tok, context_tokens=200, depth=0.5, seed=0, haystack=tmp_path)


def test_context_longer_than_the_window_is_refused(embedded):
    with pytest.raises(DynheadsError, match="exceeds the model's context window of 8192"):
        check_fits(embedded, 8190, 10)


def test_metrics():
    answer = "0bf99a6a-75b9-469d-9b51-20ad9f2c240e"
    assert niah.score(answer, f"The magic word is {answer}.")["accuracy"] == 1.0
    partial = niah.score(answer, "The magic word is 0bf99a6a-75b9-469d-9b51-20ad9f2c")
    assert partial["accuracy"] == 0.0
    assert partial["rouge1_recall"] == pytest.approx(4 / 5)  # four of the five hex groups
    assert niah.score(answer, "")["rouge_l"] == 0.0


def test_embedded_model_retrieves_the_uuid(embedded):
    sample = niah.make_sample(embedded.tokenizer, context_tokens=1000, depth=0.5, seed=0)
    result = trace(embedded, sample, max_new_tokens=48)
    assert sample.answer in result.text
    steps, layers, heads = result.copy_scores.shape
    assert (layers, heads) == (30, 9) and steps == result.num_steps
    assert result.hidden.shape == (steps, 576)
    # Copy events happen while the UUID is being copied, and only on needle tokens.
    assert result.copy_scores.any(axis=(1, 2)).sum() >= 10
    copied = result.argmax_pos[result.copy_scores]
    assert set(copied.tolist()) <= set(sample.needle_positions)
    assert ((result.reasoning_scores >= 0) & (result.reasoning_scores <= 1 + 1e-6)).all()
