"""RIND (DRAGIN's Real-time Information Needs Detection): decide when a drafted span needs retrieval.

For a drafted span of ``T`` generated tokens the caller supplies the tokens' texts, the entropy of each token's
next-token distribution ``[T]`` and, from the last layer, the largest attention each drafted token receives from
the later drafted tokens, per head ``[H, T]``. Then, as DRAGIN's code does:

1. tokens are merged into words (rule in :func:`merge_tokens`);
2. word entropy = mean of its tokens' entropies; word attention = sum over its tokens of the head-mean attention;
3. within each sentence (spaCy's rule-based sentencizer, no model), attention is scaled to mean 1;
4. score = entropy x scaled attention;
5. the draft triggers retrieval when a *content* word scores above ``threshold`` (strictly).

The two forms differ only in what a content word is:

- ``"paper"``: not in spaCy's English stop-word list and holding a letter or digit (the stop-word indicator
  s_i of the S_RIND formula in the DRAGIN paper); needs no spaCy model;
- ``"dragin"``: a word overlapping a spaCy token whose part of speech is NOUN, ADJ, VERB, PROPN or NUM (DRAGIN's
  ``check_real_words``); needs an English spaCy pipeline (``en_core_web_sm`` by default).

On a trigger the caller retracts the draft to ``sentence_token_start``, the first token of the triggering word's
sentence (Algorithm 1, ``Retract``). DRAGIN's stop at a sentence containing "the answer is" is left to the caller.
"""

from __future__ import annotations

import bisect
import math
import string
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from dynheads.config import setting
from dynheads.errors import DynheadsError

TriggerForm = Literal["paper", "dragin"]
CONTENT_POS = frozenset({"NOUN", "ADJ", "VERB", "PROPN", "NUM"})  # DRAGIN's "real words"
# Word-start markers that tokenizers put in place of a leading space: SentencePiece and GPT-2 byte-level BPE.
SPACE_MARKERS = ("\u2581", "\u0120")  # '▁', 'Ġ'


@dataclass(frozen=True)
class TriggerConfig:
    threshold: float = setting(
        1.4,
        "θ: retrieve when a content word's score exceeds it. 1.4 is the HotpotQA value "
        "in DRAGIN's paper (Su et al. 2024, Table 9, for its Llama2/Vicuna models); the "
        "paper we reproduce does not state its θ. Uncalibrated here: our attention "
        "source (last-layer rows of this model) differs.",
    )
    form: TriggerForm = setting(
        "paper",
        "'paper': content word = not a spaCy English stop word (no model "
        "needed); 'dragin': content word = POS in NOUN/ADJ/VERB/PROPN/NUM, tagged "
        "by `spacy_model`.",
    )
    spacy_model: str = setting("en_core_web_sm", "spaCy pipeline used by form='dragin' for part-of-speech tags.")

    def __post_init__(self) -> None:
        if not (math.isfinite(self.threshold) and self.threshold >= 0):
            raise DynheadsError(f"RIND threshold must be a finite number >= 0, got {self.threshold}")
        if self.form not in ("paper", "dragin"):
            raise DynheadsError(f"unknown RIND form {self.form!r}: expected 'paper' or 'dragin'")


@dataclass(frozen=True)
class WordScore:
    text: str
    token_start: int  # the word is tokens [token_start, token_stop) of the draft
    token_stop: int
    sentence: int
    entropy: float  # mean token entropy
    attention: float  # sum over tokens of the head-mean max attention received
    scaled_attention: float  # attention / mean attention of the sentence's words
    content: bool
    score: float  # entropy x scaled_attention (compared with θ only when `content`)


@dataclass(frozen=True)
class RindResult:
    triggered: bool
    word_index: int | None  # first triggering word
    token_index: int | None  # its first token
    sentence_token_start: int | None  # first token of its sentence: where to retract the draft to
    words: tuple[WordScore, ...]

    @property
    def scores(self) -> np.ndarray:
        """``[W]`` the thresholded quantity: score for content words, 0 for the others."""
        return np.array([w.score if w.content else 0.0 for w in self.words], dtype=np.float64)


def normalise_token(text: str) -> str:
    """Replace the SentencePiece/GPT-2 word-start markers with spaces, so every tokenizer looks alike."""
    for marker in SPACE_MARKERS:
        text = text.replace(marker, " ")
    return text


def _is_punctuation(text: str) -> bool:
    """Non-blank text without a letter or digit (punctuation and symbols)."""
    stripped = text.strip()
    return bool(stripped) and not any(ch.isalnum() for ch in stripped)


def merge_tokens(token_texts: list[str]) -> list[tuple[int, int]]:
    """Group draft tokens into words; returns each word's ``(token_start, token_stop)``, half-open.

    Rule, after :func:`normalise_token`: a whitespace-only token belongs to no word and ends the current one;
    a token ending in whitespace ends its word; an empty token joins the current word. Any other token starts
    a new word when there is no current word, when it begins with whitespace, or when it is punctuation and the
    previous token was not (so "Paris" + "." are two words, while "'s" or "(Paris" stay one).
    """
    words: list[tuple[int, int]] = []
    open_word = False  # whether the last word can still grow
    prev_punct = False
    for i, raw in enumerate(token_texts):
        text = normalise_token(raw)
        if text == "":
            if open_word:
                words[-1] = (words[-1][0], i + 1)
            continue
        if text.isspace():
            open_word = False
            continue
        punct = _is_punctuation(text)
        if not open_word or text[0].isspace() or (punct and not prev_punct):
            words.append((i, i + 1))
        else:
            words[-1] = (words[-1][0], i + 1)
        open_word = not text[-1].isspace()
        prev_punct = punct
    return words


def rind(
    token_texts: list[str],
    entropy: ArrayLike,
    max_attention: ArrayLike,
    config: TriggerConfig | None = None,
) -> RindResult:
    """Score a draft and decide whether it needs retrieval.

    ``token_texts``: the ``T`` draft tokens, each decoded on its own (markers '▁'/'Ġ' allowed).
    ``entropy [T]``: entropy (nats) of the distribution each token was drawn from.
    ``max_attention [H, T]``: last layer, per head, the largest attention each token receives from later draft
    tokens. Arrays may be numpy or CPU float tensors.
    """
    config = config or TriggerConfig()
    entropy, attention = _check_inputs(token_texts, entropy, max_attention)
    spans = merge_tokens(token_texts)
    if not spans:
        return RindResult(False, None, None, None, ())

    parts = [normalise_token(t) for t in token_texts]
    text = "".join(parts)
    starts = list(accumulate((len(p) for p in parts), initial=0))  # token i is text[starts[i]:starts[i + 1]]
    # Each word's visible characters, [first, last): the first places it in a sentence.
    first_chars = [starts[a] + len(parts[a]) - len(parts[a].lstrip()) for a, _ in spans]
    last_chars = [starts[b - 1] + len(parts[b - 1].rstrip()) for _, b in spans]
    sentence_of = _sentence_indices(text, first_chars)
    words_text = [text[a:b].strip() for a, b in zip(first_chars, last_chars, strict=True)]
    if config.form == "paper":
        content = [_not_stop_word(w) for w in words_text]
    else:
        content = _pos_content(text, first_chars, last_chars, config.spacy_model)

    head_mean = attention.mean(axis=0)
    word_entropy = np.array([entropy[a:b].mean() for a, b in spans])
    word_attention = np.array([head_mean[a:b].sum() for a, b in spans])
    scaled = _scale_per_sentence(word_attention, np.array(sentence_of))
    words = tuple(
        WordScore(
            text=words_text[i],
            token_start=a,
            token_stop=b,
            sentence=sentence_of[i],
            entropy=float(word_entropy[i]),
            attention=float(word_attention[i]),
            scaled_attention=float(scaled[i]),
            content=content[i],
            score=float(word_entropy[i] * scaled[i]),
        )
        for i, (a, b) in enumerate(spans)
    )
    for i, word in enumerate(words):
        if word.content and word.score > config.threshold:
            sentence_start = next(w.token_start for w in words if w.sentence == word.sentence)
            return RindResult(True, i, word.token_start, sentence_start, words)
    return RindResult(False, None, None, None, words)


def _scale_per_sentence(attention: np.ndarray, sentence: np.ndarray) -> np.ndarray:
    """``[W]`` word attention divided by the mean over the words of its sentence (DRAGIN's per-sentence scaling)."""
    scaled = np.zeros_like(attention)
    for s in np.unique(sentence):
        members = sentence == s
        mean = attention[members].mean()
        if mean > 0:  # a sentence that receives no attention at all keeps score 0
            scaled[members] = attention[members] / mean
    return scaled


def _check_inputs(token_texts: list[str], entropy: ArrayLike, max_attention: ArrayLike) -> tuple[np.ndarray, ...]:
    n = len(token_texts)
    entropy = np.asarray(entropy, dtype=np.float64)
    attention = np.asarray(max_attention, dtype=np.float64)
    if entropy.shape != (n,):
        raise DynheadsError(f"RIND entropy must have shape [T]=[{n}] (one per draft token), got {entropy.shape}")
    if attention.ndim != 2 or attention.shape[1] != n or attention.shape[0] == 0:
        raise DynheadsError(f"RIND attention must have shape [H, T] with T={n} and H>=1, got {attention.shape}")
    for name, values in (("entropy", entropy), ("attention", attention)):
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            raise DynheadsError(f"RIND {name} values must be finite and >= 0")
    return entropy, attention


def _sentence_indices(text: str, chars: list[int]) -> list[int]:
    """Index of the sentence holding each character, with spaCy's rule-based sentencizer."""
    sentence_starts = [sent.start_char for sent in _sentencizer()(text).sents]
    return [max(bisect.bisect_right(sentence_starts, c) - 1, 0) for c in chars]


def _not_stop_word(word: str) -> bool:
    stop_words = _stop_words()
    lower = word.lower()
    # Words keep attached punctuation ("(Paris", "'s"): look up both forms.
    keys = {lower, lower.strip(string.punctuation + "‘’“”")}
    return any(ch.isalnum() for ch in word) and not keys & stop_words


def _pos_content(text: str, first_chars: list[int], last_chars: list[int], model: str) -> list[bool]:
    """Whether each word's character span overlaps a token tagged with a content part of speech."""
    content_spans = [(t.idx, t.idx + len(t)) for t in _tagger(model)(text) if t.pos_ in CONTENT_POS]
    words = zip(first_chars, last_chars, strict=True)
    return [any(a < stop and b > start for a, b in content_spans) for start, stop in words]


def _spacy_module():
    try:
        import spacy
    except ImportError:
        raise DynheadsError("RIND needs spaCy: pip install 'dynheads[rag]' (or pip install spacy)") from None
    return spacy


@lru_cache(maxsize=1)
def _stop_words() -> frozenset[str]:
    _spacy_module()
    from spacy.lang.en.stop_words import STOP_WORDS

    return frozenset(STOP_WORDS)


@lru_cache(maxsize=1)
def _sentencizer():
    nlp = _spacy_module().blank("en")
    nlp.add_pipe("sentencizer")
    return nlp


@lru_cache(maxsize=2)
def _tagger(model: str):
    try:
        return _spacy_module().load(model)
    except OSError:
        raise DynheadsError(
            f"RIND form 'dragin' needs the spaCy pipeline {model!r}, which is not installed: run "
            f"`python -m spacy download {model}`, or use form='paper' (stop-word list, no model)"
        ) from None
