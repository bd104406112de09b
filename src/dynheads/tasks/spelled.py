"""Needles whose answer is never written in them: a number stated digit by digit in words, asked for in digits.

The needle "The magic number is four seven one ..." goes into the NIAH haystack exactly as the UUID does
(``niah.make_sample`` with a ``NeedleForm``); the question asks for the number in digits, so the tokens the model
must emit ("4", "7", "1", ...) appear nowhere in the needle. Eq. 1 (a head's argmax key carries the emitted token)
cannot fire on them by construction: a head that reads "four" while the model writes "4" is retrieving without
copying, which the write score (``dynheads.scores.write_scores``) can see. NoLiMa (Modarressi et al. 2025) removes
the literal match by needing world knowledge (a landmark for a city), which small models lack; a digit's word is
knowledge every model here has.

Two forms, with controlled lexical overlap between the question and the needle (``content_overlap``, the share of
the question's content words that the needle holds, recorded in the prompt manifest):

- ``spelled_niah``: the question repeats the needle's key ("magic number"), as NIAH's does;
- ``spelled_niah_paraphrased``: the question shares no content word with the needle ("the combination of the old
  safe" asked as "which digits unlock the vault").

Answers are 7 digits (RULER's magic numbers), the first not 0; accuracy: the digits appear in the answer in order
(separators between digits removed: "4 7 1", "4-7-1" and "471" all count). Chance: a guess of 7 digits is right
with probability 1e-7 (0 in the tables). Beside it, ``words``: the needle's number words appear in the answer as
they stand (the model found the needle and copied it instead of answering in digits: retrieval without the step
that makes it non-literal).
"""

from __future__ import annotations

import random
import re
from typing import Any

from dynheads.tasks.niah import NeedleForm, needle_grid, needle_prompt
from dynheads.tasks.registry import Task, register
from dynheads.tasks.sample import Sample

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIGITS = 7
# Words of the instruction or of no content, left out when the overlap between a question and a needle is counted.
FUNCTION_WORDS = frozenset("a an and are as digits for in is it its of only the them to what which with write".split())


def spelled_number(rng: random.Random) -> tuple[str, str]:
    """A 7-digit answer (first digit not 0) and its digits as words, one word each."""
    digits = str(rng.randrange(1, 10)) + "".join(str(rng.randrange(10)) for _ in range(DIGITS - 1))
    return digits, spelled(digits)


KEYED = NeedleForm(
    needle="The magic number is {answer}.",
    question="What is the magic number? Write it with digits.",
    draw=spelled_number,
)
PARAPHRASED = NeedleForm(
    needle="The combination of the old safe is {answer}.",
    question="Which digits unlock the vault? Write them as a number.",
    draw=spelled_number,
)


def content_overlap(form: NeedleForm) -> float:
    """The share of the question's content words (lower case, function words left out) that the needle holds."""

    def words(text: str) -> set[str]:
        return set(re.findall(r"[a-z]+", text.lower())) - FUNCTION_WORDS - {"answer"}  # the template's slot

    question = words(form.question)
    return len(question & words(form.needle)) / len(question) if question else 0.0


def digits_in(generated: str) -> str:
    """``generated`` with the separators between digits removed (spaces, commas, dots, hyphens)."""
    return re.sub(r"(?<=\d)[\s,.\-]+(?=\d)", "", generated)


def spelled(answer: str) -> str:
    """The answer's digits as the needle states them, one word each."""
    return " ".join(DIGIT_WORDS[int(d)] for d in answer)


def score(sample: Sample, generated: str) -> dict[str, float]:
    """Accuracy: the answer's digits appear, in order, in the generation; words: the needle's words do."""
    words = " ".join(re.findall(r"[a-z]+", generated.lower()))
    return {"accuracy": float(sample.answer in digits_in(generated)), "words": float(spelled(sample.answer) in words)}


def _prompt(form: NeedleForm):
    base = needle_prompt(form)

    def manifest(config: Any) -> dict:
        return {**base(config), "content_overlap": content_overlap(form), "answer_digits": DIGITS}

    return manifest


def _register(name: str, label: str, form: NeedleForm, help: str) -> Task:
    return register(
        Task(
            name=name,
            label=label,
            score_kind="copy",
            static_kind="copy",
            metrics={"accuracy": "accuracy", "words": "number words copied"},
            score=score,
            grid=needle_grid(form),
            prompt=_prompt(form),
            paper_task="niah",
            help=help,
            chance=lambda data: 0.0,  # 7 random digits: a guess is right with probability 1e-7
        )
    )


SPELLED_NIAH = _register(
    "spelled_niah",
    "NIAH, spelled number",
    KEYED,
    "a 7-digit number stated in words in the haystack, asked for in digits: the answer is never copied",
)
SPELLED_NIAH_PARAPHRASED = _register(
    "spelled_niah_paraphrased",
    "NIAH, spelled number, paraphrased question",
    PARAPHRASED,
    "the spelled number asked with no content word of its needle: no literal match at all",
)
