"""Chat-template variables are pinned (no thinking mode, a fixed date) and overridable, on tokenizers built here.

Two tiny byte-level tokenizers carry Jinja templates shaped like the real ones: a Qwen3-like template that opens
a ``<think>`` block unless ``enable_thinking`` is false, and a Llama-3-like template that stamps ``date_string``
or, when it is undefined, today's date.
"""

from __future__ import annotations

from datetime import date

import pytest
from zoo import byte_tokenizer

from dynheads.errors import DynheadsError
from dynheads.experiments.hotpotqa import HotpotConfig, hotpot_samples
from dynheads.experiments.niah import NiahConfig, niah_samples
from dynheads.tasks.prompting import (
    PINNED_TEMPLATE_VARIABLES,
    SYSTEM_IN_USER_TURN,
    chat_template_kwargs,
    render_chat,
)

QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
LLAMA3_LIKE = (
    "{% if date_string is not defined %}{% set date_string = strftime_now('%d %b %Y') %}{% endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\nToday Date: {{ date_string }}\n\n"
    "{% for m in messages %}{% if m.role != 'system' %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{% endif %}"
    "{{ m.content }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def test_qwen3_like_templates_do_not_think_unless_asked():
    tokenizer = byte_tokenizer(QWEN3_LIKE)
    raw = tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True)
    assert raw.endswith("<think>\n")  # the template's own default: thinking mode
    pinned = render_chat(tokenizer, "sys", "question?")
    assert pinned.text.endswith("<think>\n\n</think>\n\n") and pinned.template == "chat"
    assert pinned.template_kwargs["enable_thinking"] is False
    thinking = render_chat(tokenizer, "sys", "question?", chat_template_kwargs('{"enable_thinking": true}'))
    assert thinking.text.endswith("<think>\n") and thinking.template_kwargs["enable_thinking"] is True
    assert tokenizer.decode(pinned.input_ids) == pinned.text  # the ids are the rendered text


def test_llama3_like_templates_get_a_fixed_date():
    tokenizer = byte_tokenizer(LLAMA3_LIKE)
    today = date.today().strftime("%d %b %Y")
    raw = tokenizer.apply_chat_template([{"role": "user", "content": "q"}], tokenize=False, add_generation_prompt=True)
    assert f"Today Date: {today}" in raw  # the template's own default: today's date
    pinned = render_chat(tokenizer, "sys", "question?")
    assert "Today Date: 26 Jul 2024" in pinned.text and today not in pinned.text.replace("26 Jul 2024", "")
    other = render_chat(tokenizer, "sys", "question?", chat_template_kwargs({"date_string": "01 Jan 2025"}))
    assert "Today Date: 01 Jan 2025" in other.text


GEMMA2_LIKE = (
    "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def test_a_template_that_refuses_a_system_turn_gets_it_in_the_user_turn_and_the_prompt_says_so():
    folded = render_chat(byte_tokenizer(GEMMA2_LIKE), "sys", "question?")
    assert folded.text == "<start_of_turn>user\nsys\n\nquestion?<end_of_turn>\n<start_of_turn>model\n"
    assert folded.template == SYSTEM_IN_USER_TURN
    assert render_chat(byte_tokenizer(QWEN3_LIKE), "sys", "question?").template == "chat"


@pytest.mark.parametrize(
    "template, says",
    [
        ("{{ messages[0].content | no_such_filter }}", "no_such_filter"),  # fails whatever the turns
        # fails on a system turn, but not through raise_exception: a bug, not a refusal; never folded silently
        ("{% if messages[0].role == 'system' %}{{ 1 // 0 }}{% endif %}{{ messages[0].content }}", "ZeroDivisionError"),
    ],
)
def test_a_template_that_fails_otherwise_is_refused_in_one_line(template, says):
    with pytest.raises(DynheadsError, match=f"chat template cannot render the prompt: .*{says}"):
        render_chat(byte_tokenizer(template), "sys", "question?")


def test_kwargs_reach_the_task_samples_and_are_recorded():
    tokenizer = byte_tokenizer(QWEN3_LIKE)
    niah = niah_samples(NiahConfig(lengths=(200,), depths=(0.5,)), tokenizer)[0]
    assert niah.chat_template_kwargs == PINNED_TEMPLATE_VARIABLES
    assert niah.describe()["chat_template_kwargs"]["enable_thinking"] is False
    assert tokenizer.decode(niah.input_ids).endswith("</think>\n\n")
    config = HotpotConfig(questions=1, lengths=(1000,), depths=(0.5,), chat_template_kwargs='{"enable_thinking": true}')
    hotpot = hotpot_samples(config, tokenizer)[0]
    assert hotpot.chat_template_kwargs["enable_thinking"] is True
    assert tokenizer.decode(hotpot.input_ids).endswith("<think>\n")


@pytest.mark.parametrize("text", ["[1, 2]", "{not json", '"enable_thinking"'])
def test_bad_kwargs_are_refused_in_one_line(text):
    with pytest.raises(DynheadsError, match="JSON object"):
        chat_template_kwargs(text)
