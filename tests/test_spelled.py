"""The spelled-number needle (``dynheads.tasks.spelled``): an answer that is never written in its needle."""

from __future__ import annotations

import random
import re

import pytest

from dynheads import DynheadsError, niah
from dynheads.tasks.registry import get_task
from dynheads.tasks.spelled import DIGIT_WORDS, KEYED, PARAPHRASED, content_overlap, score, spelled_number


def test_the_needle_states_the_number_in_words_and_holds_no_digit(embedded_tokenizer):
    tok = embedded_tokenizer
    sample = niah.make_sample(tok, context_tokens=600, depth=0.5, seed=7, form=KEYED)
    needle = tok.decode([sample.input_ids[i] for i in sample.needle_positions]).strip()
    words = " ".join(DIGIT_WORDS[int(d)] for d in sample.answer)
    assert needle == f"The magic number is {words}."
    assert re.fullmatch(r"[1-9][0-9]{6}", sample.answer)
    assert not re.search(r"[0-9]", needle)  # Eq. 1 cannot fire: no needle token carries a digit
    assert "What is the magic number? Write it with digits." in tok.decode(sample.input_ids)
    assert sample.answer_token_count == len(tok(" " + words, add_special_tokens=False)["input_ids"])


def test_the_paraphrased_question_shares_no_content_word_with_its_needle(embedded_tokenizer):
    assert (content_overlap(KEYED), content_overlap(PARAPHRASED)) == (1.0, 0.0)
    sample = niah.make_sample(embedded_tokenizer, context_tokens=500, depth=0.25, seed=3, form=PARAPHRASED)
    prompt = embedded_tokenizer.decode(sample.input_ids)
    assert "The combination of the old safe is " in prompt and "Which digits unlock the vault?" in prompt
    manifest = get_task("spelled_niah_paraphrased").prompt(None)
    assert manifest["content_overlap"] == 0.0 and manifest["needle"] == PARAPHRASED.needle


def test_answers_are_seeded_seven_digits_and_the_uuid_needle_is_unchanged(embedded_tokenizer):
    assert spelled_number(random.Random(5)) == spelled_number(random.Random(5))
    assert {len(spelled_number(random.Random(seed))[0]) for seed in range(50)} == {7}
    # NIAH with its default form draws the same UUID as before forms existed
    sample = niah.make_sample(embedded_tokenizer, context_tokens=500, depth=0.5, seed=3)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", sample.answer)
    assert sample.answer == "21636369-8b52-4b4a-97b7-50923ceb3ffd"  # what the code before the forms drew


@pytest.mark.parametrize(
    ("generated", "right"),
    [
        ("4718250", 1.0),
        ("The magic number is 4 7 1 8 2 5 0.", 1.0),
        ("4,718,250", 1.0),
        ("4-7-1-8-2-5-0", 1.0),
        ("471825", 0.0),
        ("four seven one eight two five zero", 0.0),
    ],
)
def test_accuracy_reads_the_digits_whatever_separates_them(generated, right):
    sample = type("S", (), {"answer": "4718250"})()
    assert score(sample, generated)["accuracy"] == right


def test_copying_the_number_words_is_counted_apart_from_answering():
    sample = type("S", (), {"answer": "4718250"})()
    assert score(sample, "The magic number is four seven one eight two five zero.") == {"accuracy": 0.0, "words": 1.0}
    assert score(sample, "Four, seven, one, eight, two, five, zero") == {"accuracy": 0.0, "words": 1.0}
    assert score(sample, "4718250") == {"accuracy": 1.0, "words": 0.0}


def test_the_distractor_is_refused_for_a_needle_that_is_not_a_uuid(embedded_tokenizer):
    with pytest.raises(DynheadsError, match="only the UUID needle"):
        niah.make_sample(embedded_tokenizer, context_tokens=500, depth=0.5, seed=1, distractor_depth=0.2, form=KEYED)


def test_both_forms_are_registered_tasks_at_chance_zero():
    for name in ("spelled_niah", "spelled_niah_paraphrased"):
        task = get_task(name)
        assert list(task.metrics) == ["accuracy", "words"] and task.chance is not None and task.chance(None) == 0.0
        assert task.paper_name == "niah"
