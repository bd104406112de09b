"""RIND on hand-made drafts: word merging, worked-out scores, sentence retraction, edge cases."""

import numpy as np
import pytest
import spacy
import spacy.util

from dynheads.errors import DynheadsError
from dynheads.rag import trigger
from dynheads.rag.trigger import TriggerConfig, merge_tokens, rind

# Two sentences; "rains" is two tokens. Head-mean attention is [.4, .1, .2, .1, .1, .15, .05, .1].
TOKENS = ["▁Paris", "▁is", "▁big", ".", "▁It", "▁rain", "s", "."]
ENTROPY = np.array([0.5, 0.5, 1.0, 0.1, 0.2, 4.0, 2.0, 0.1])
MEAN_ATTENTION = np.array([0.4, 0.1, 0.2, 0.1, 0.1, 0.15, 0.05, 0.1])
SPREAD = np.array([0.2, 0.0, 0.1, 0.0, 0.1, 0.05, 0.05, 0.1])
ATTENTION = np.stack([MEAN_ATTENTION + SPREAD, MEAN_ATTENTION - SPREAD])  # [H=2, T=8]


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (["Paris", " is", " big", "."], [(0, 1), (1, 2), (2, 3), (3, 4)]),  # space-prefixed, punctuation split
        (["▁Par", "is", "▁is", "."], [(0, 2), (2, 3), (3, 4)]),  # SentencePiece marker
        (["ĠPar", "is", "Ġis", "."], [(0, 2), (2, 3), (3, 4)]),  # GPT-2 marker
        (["Paris", ",", "!", "!"], [(0, 1), (1, 4)]),  # a punctuation run is one word
        (["(", "Paris", ")"], [(0, 2), (2, 3)]),  # text after punctuation joins it
        ([" he", "'s"], [(0, 2)]),  # a clitic with letters joins its word
        (["Paris", "\n", "The", " ", "end"], [(0, 1), (2, 3), (4, 5)]),  # whitespace tokens belong to no word
        (["end", ".\n", "Next"], [(0, 1), (1, 2), (2, 3)]),  # trailing whitespace ends a word
        (["Par", "", "is"], [(0, 3)]),  # empty tokens join the current word
        (["", "\n", " "], []),
    ],
)
def test_merge_tokens(tokens, expected):
    assert merge_tokens(tokens) == expected


def test_worked_example_scores_and_sentence_retraction():
    result = rind(TOKENS, ENTROPY, ATTENTION, TriggerConfig(threshold=1.4))
    assert [w.text for w in result.words] == ["Paris", "is", "big", ".", "It", "rains", "."]
    assert [w.sentence for w in result.words] == [0, 0, 0, 0, 1, 1, 1]
    np.testing.assert_allclose([w.entropy for w in result.words], [0.5, 0.5, 1.0, 0.1, 0.2, 3.0, 0.1])
    np.testing.assert_allclose([w.attention for w in result.words], [0.4, 0.1, 0.2, 0.1, 0.1, 0.2, 0.1])
    # Sentence means: 0.8 / 4 = 0.2 and 0.4 / 3; scaled attention has mean 1 in each sentence.
    np.testing.assert_allclose([w.scaled_attention for w in result.words], [2, 0.5, 1, 0.5, 0.75, 1.5, 0.75])
    np.testing.assert_allclose([w.score for w in result.words], [1.0, 0.25, 1.0, 0.05, 0.15, 4.5, 0.075])
    assert [w.content for w in result.words] == [True, False, True, False, False, True, False]
    np.testing.assert_allclose(result.scores, [1.0, 0, 1.0, 0, 0, 4.5, 0])
    assert result.triggered
    assert (result.word_index, result.token_index, result.sentence_token_start) == (5, 5, 4)


def test_threshold_is_strict_and_above_every_score_never_triggers():
    assert not rind(TOKENS, ENTROPY, ATTENTION, TriggerConfig(threshold=4.5)).triggered
    result = rind(TOKENS, ENTROPY, ATTENTION, TriggerConfig(threshold=0.9))  # "Paris" scores 1.0
    assert (result.word_index, result.token_index, result.sentence_token_start) == (0, 0, 0)


def test_tokenizer_markers_give_identical_scores():
    reference = rind(TOKENS, ENTROPY, ATTENTION).scores
    for tokens in ([t.replace("▁", "Ġ") for t in TOKENS], [t.replace("▁", " ") for t in TOKENS]):
        np.testing.assert_allclose(rind(tokens, ENTROPY, ATTENTION).scores, reference)


def test_function_words_never_trigger():
    tokens = [" The", " of", " and", " it", "."]
    result = rind(tokens, np.full(5, 50.0), np.array([[1.0, 0.0, 0.0, 0.0, 0.0]]), TriggerConfig(threshold=0.0))
    assert max(w.score for w in result.words) == pytest.approx(250.0)  # large raw score, but a stop word
    assert not result.triggered
    assert not result.scores.any()


def test_single_token_draft_scores_its_entropy():
    result = rind(["Paris"], [2.0], [[0.3], [0.5]])
    assert result.words[0].scaled_attention == pytest.approx(1.0)
    assert (result.triggered, result.word_index, result.token_index, result.sentence_token_start) == (True, 0, 0, 0)
    assert not rind(["Paris"], [2.0], [[0.0], [0.0]]).triggered  # no attention received: score 0


def test_empty_and_whitespace_only_drafts():
    empty = rind([], np.zeros(0), np.zeros((2, 0)))
    assert (empty.triggered, empty.word_index, empty.words) == (False, None, ())
    blank = rind(["\n", " "], [9.0, 9.0], np.ones((1, 2)))
    assert (blank.triggered, blank.words) == (False, ())


def test_whitespace_tokens_do_not_enter_word_scores():
    result = rind(["Paris", "\n", "rains"], [1.0, 100.0, 3.0], [[0.5, 9.0, 0.5]])
    assert [w.text for w in result.words] == ["Paris", "rains"]
    assert [w.entropy for w in result.words] == [1.0, 3.0]
    assert [w.token_start for w in result.words] == [0, 2]


@pytest.mark.parametrize(
    ("entropy", "attention"),
    [
        (np.ones(3), np.ones((2, 4))),
        (np.ones(4), np.ones(4)),
        (-np.ones(4), np.ones((2, 4))),
        (np.ones(4), np.full((2, 4), np.nan)),
        (np.ones(4), np.ones((0, 4))),
    ],
)
def test_bad_shapes_and_values_are_refused(entropy, attention):
    with pytest.raises(DynheadsError):
        rind(["a", " b", " c", " d"], entropy, attention)


def test_bad_config_is_refused():
    with pytest.raises(DynheadsError):
        TriggerConfig(threshold=-1.0)
    with pytest.raises(DynheadsError):
        TriggerConfig(form="other")


def test_dragin_form_without_spacy_model_explains_the_fix():
    config = TriggerConfig(form="dragin", spacy_model="dynheads_missing_spacy_model")
    with pytest.raises(DynheadsError, match=r"python -m spacy download dynheads_missing_spacy_model.*form='paper'"):
        rind(TOKENS, ENTROPY, ATTENTION, config)


@pytest.mark.skipif(not spacy.util.is_package("en_core_web_sm"), reason="spaCy model en_core_web_sm not installed")
def test_dragin_form_uses_parts_of_speech():
    result = rind(TOKENS, ENTROPY, ATTENTION, TriggerConfig(form="dragin"))
    assert [w.content for w in result.words] == [True, False, True, False, False, True, False]
    assert result.word_index == 5


def test_dragin_form_maps_part_of_speech_tags_onto_words(monkeypatch):
    blank = spacy.blank("en")
    tags = {"Paris": "PROPN", "big": "ADJ", "rains": "VERB", "is": "AUX", "It": "PRON"}

    def tag(text):  # stands in for a spaCy pipeline: the rule-based tokenizer plus fixed tags
        doc = blank(text)
        for token in doc:
            token.pos_ = tags.get(token.text, "PUNCT")
        return doc

    monkeypatch.setattr(trigger, "_tagger", lambda model: tag)
    result = rind(TOKENS, ENTROPY, ATTENTION, TriggerConfig(form="dragin"))
    assert [w.content for w in result.words] == [True, False, True, False, False, True, False]
    assert result.word_index == 5
