"""The answer metrics of every QA task: the official HotpotQA EM / F1 (``hotpot_evaluate_v1.py``, answer part)
and the extraction of the answer from a generation.

HotpotQA, the multi-hop key-value task and RULER's tasks score with these (``score``), and their ``Task``
entries label them with ``QA_METRICS``.
"""

from __future__ import annotations

import re
import string
from collections import Counter

QA_METRICS = {"em": "EM", "f1": "F1"}  # record metric key -> label, for every QA task's registry entry

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_YES_NO = re.compile(r"(yes|no)\b[,.!;:]", re.IGNORECASE)
_PUNCTUATION = frozenset(string.punctuation)  # ASCII only, as in the official script


def normalize_answer(text: str) -> str:
    """Lower case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace (official)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, ground_truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1(prediction: str, ground_truth: str) -> dict[str, float]:
    """Token F1 on normalised answers; 0 when either side is yes/no/noanswer and they differ (official)."""
    pred, truth = normalize_answer(prediction), normalize_answer(ground_truth)
    zero = {"f1": 0.0, "precision": 0.0, "recall": 0.0}
    if (pred in ("yes", "no", "noanswer") or truth in ("yes", "no", "noanswer")) and pred != truth:
        return zero
    pred_tokens, truth_tokens = pred.split(), truth.split()
    same = sum((Counter(pred_tokens) & Counter(truth_tokens)).values())
    if same == 0:  # also when both are empty: the official script gives F1 0 there (and EM 1)
        return zero
    precision, recall = same / len(pred_tokens), same / len(truth_tokens)
    return {"f1": 2 * precision * recall / (precision + recall), "precision": precision, "recall": recall}


def extract_answer(generation: str) -> str:
    """The generation's first non-empty line up to its first sentence end (". ", "! ", "? ").

    A leading "Yes," / "No." keeps only that word: otherwise the yes/no rule of ``f1`` zeroes a right answer
    followed by an explanation.
    """
    lines = [line.strip() for line in generation.splitlines() if line.strip()]
    first = _SENTENCE_END.split(lines[0], maxsplit=1)[0] if lines else ""
    yes_no = _YES_NO.match(first)
    return yes_no.group(1) if yes_no else first


def score(answer: str, generated: str, *, extract: bool = True) -> dict[str, float]:
    """EM, F1, precision and recall of the generation (its first sentence unless ``extract=False``)."""
    prediction = extract_answer(generated) if extract else generated
    return {"em": exact_match(prediction, answer), **f1(prediction, answer)}
