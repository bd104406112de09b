"""Every step of a teacher-forced answer in one pass: single-step edits measured on a clean history.

The teacher-forced ablation (``ablation.teacher_forced``) asks, for each step t of a clean greedy answer and each
setting r, what the model predicts when it feeds the clean input of step t with the setting's heads removed *at that
step only*. Every earlier position keeps the key and value states the clean pass wrote, so the query of step t sees
the clean cache up to step t and its own key and value at step t, nothing else of row r. Steps do not depend on each
other: all of them are one pass of T query positions per row, against the one clean cache all rows share (never
copied per row), instead of T passes of R one-token rows over R copies of the cache.

``teacher_pass`` runs that pass: ``teacher_attention`` (registered with transformers under ``TEACHER_ATTN``) computes
query t's attention over the clean keys before step t plus its own key, in the model's dtype with an fp32 softmax as
the probe's last row does, and replaces the removed heads' outputs at each (row, step) as the probe does at a last
row (``zero``; ``uniform`` over the keys the query sees; ``mean``: the head's mean over the prompt). Equal to the
step-by-step decode up to the order of floating-point sums (tests/test_ablation_forced.py).

Attention it does not reproduce (a sliding window, soft-capped logits, attention sinks) raises ``Unsupported`` from
inside the pass; the caller then decodes step by step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from dynheads.engine.probe import AblationMode
from dynheads.models import LoadedModel

TEACHER_ATTN = "dynheads_teacher"  # neutral name: transformers tests implementation names by substring
TEACHER_KWARG = "dynheads_teacher"  # the forward keyword argument that carries the pass to the attention function
PASS_BYTES = 256 * 2**20  # rows per pass: at most about this much for its attention logits and its output logits
_UNSUPPORTED_KWARGS = ("sliding_window", "softcap", "s_aux")


class Unsupported(Exception):
    """The model's attention has a feature the one-pass computation does not reproduce: decode step by step."""


@dataclass(frozen=True)
class TeacherPass:
    """What the attention function needs of one pass (every tensor on the model's device)."""

    clean: Sequence[tuple[torch.Tensor, torch.Tensor]]  # per layer: clean keys, values [1, H_kv, >= first + T - 1, D]
    first: int  # cache position of step 0's query (the prompt's last token)
    removed: torch.Tensor  # bool [R, T, L, H]: the heads row r removes at step t
    mode: AblationMode
    head_means: torch.Tensor | None  # [L, H, D]: each head's mean output over the prompt (mode "mean")


@dataclass(frozen=True)
class TeacherLogits:
    """Per row and step: log p of the clean token and whether the argmax differs from it."""

    logprob: torch.Tensor  # float [R, T]
    flipped: torch.Tensor  # bool [R, T]


def teacher_pass(
    lm: LoadedModel,
    inputs: Sequence[int],
    targets: Sequence[int],
    clean: Sequence[tuple[torch.Tensor, torch.Tensor]],
    first: int,
    removed: torch.Tensor,
    mode: AblationMode,
    head_means: torch.Tensor | None,
    run: Callable[..., torch.Tensor],
) -> TeacherLogits:
    """Feed ``inputs`` (step t's input token, at position ``first + t``) under each row's ``removed`` heads
    (bool ``[R, T, L, H]``) against the ``clean`` cache; score ``targets`` (the clean token of each step). Rows go
    through in groups sized by ``PASS_BYTES``, each one call of ``run(input_ids, position_ids, **kwargs)`` (the
    session's pass without a cache: logits of every position). Raises ``Unsupported`` for attention it does not
    reproduce."""
    rows, steps = removed.shape[0], len(inputs)
    device = lm.device
    head = lm.model.get_output_embeddings()
    vocab = int(head.weight.shape[0]) if head is not None else 0
    per_row = steps * max(lm.num_heads * (first + steps), vocab) * 4
    group = max(1, min(rows, PASS_BYTES // max(per_row, 1)))
    ids = torch.tensor(list(inputs), device=device)
    positions = torch.arange(first, first + steps, device=device)
    target = torch.tensor(list(targets), device=device)
    logprobs, flips = [], []
    model = lm.model
    previous = model.config._attn_implementation
    model.set_attn_implementation(TEACHER_ATTN)
    try:
        for start in range(0, rows, group):
            part = removed[start : start + group].to(device)
            state = TeacherPass(clean, first, part, mode, head_means)
            count = part.shape[0]
            logits = run(
                ids[None].expand(count, steps), positions[None].expand(count, steps), **{TEACHER_KWARG: state}
            ).float()
            logprobs.append(
                torch.log_softmax(logits, -1).gather(-1, target[None, :, None].expand(count, steps, 1))[..., 0]
            )
            flips.append(logits.argmax(-1) != target[None])
    finally:
        model.set_attn_implementation(previous)
    return TeacherLogits(torch.cat(logprobs), torch.cat(flips))


def teacher_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [R, H, T, D], after RoPE
    key: torch.Tensor,  # [R, H_kv, T, D]: each step's own key
    value: torch.Tensor,  # [R, H_kv, T, D]
    attention_mask: torch.Tensor | None,  # ignored: the pass builds its own visibility
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention function of ``teacher_pass``; returns ``[R, T, H, D]`` like every interface function."""
    state: TeacherPass = kwargs.pop(TEACHER_KWARG)
    if any(kwargs.get(name) is not None for name in _UNSUPPORTED_KWARGS):
        raise Unsupported(f"attention with {', '.join(n for n in _UNSUPPORTED_KWARGS if kwargs.get(n) is not None)}")
    rows, num_heads, steps, head_dim = query.shape
    num_kv = key.shape[1]
    groups = num_heads // num_kv
    scaling = head_dim**-0.5 if scaling is None else scaling
    layer = cast(int, module.layer_idx)  # transformers numbers every attention module
    width = state.first + steps - 1  # clean keys any step sees: those before the last step's position
    clean_keys, clean_values = (states[:, :, :width] for states in state.clean[layer])
    # one product per KV head over every (row, group, step) query: the clean keys and values are read as they are,
    # never copied per row; scores over the clean keys and, in the last column, the step's own key are written in
    # place, never concatenated
    queries = query.reshape(rows, num_kv, groups * steps, head_dim).transpose(0, 1).reshape(num_kv, -1, head_dim)
    scores = query.new_empty(num_kv, queries.shape[1], width + 1)
    torch.bmm(queries, clean_keys[0].transpose(-1, -2), out=scores[..., :width])
    scores[..., :width].mul_(scaling)
    by_step = scores.view(num_kv, rows, groups, steps, width + 1)
    steps_seen = state.first + torch.arange(steps, device=query.device)  # clean keys step t sees: those before it
    later = torch.arange(state.first, width, device=query.device)[None] >= steps_seen[:, None]  # only the answer's
    by_step[..., state.first : width].masked_fill_(later, float("-inf"))
    own = (query.view(rows, num_kv, groups, steps, head_dim) * key[:, :, None]).sum(-1).mul_(scaling)
    by_step[..., width] = own.transpose(0, 1)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    mixed = torch.bmm(probs[..., :width].to(value.dtype), clean_values[0])  # [H_kv, rows x groups x steps, D]
    own_share = probs[..., width:].view(num_kv, rows, groups, steps, 1).transpose(0, 1).to(value.dtype)
    output = mixed.view(num_kv, rows, groups, steps, head_dim).transpose(0, 1) + own_share * value[:, :, None]
    output = output.reshape(rows, num_heads, steps, head_dim)
    removed = state.removed[:, :, layer].transpose(1, 2)  # [R, H, T]
    if bool(removed.any()):
        replacement = _replacement(state, layer, clean_values, value, groups, output)
        output = torch.where(removed[..., None], replacement, output)
    return output.transpose(1, 2).contiguous(), None


def _replacement(
    state: TeacherPass, layer: int, clean_values: torch.Tensor, value: torch.Tensor, groups: int, like: torch.Tensor
) -> torch.Tensor:
    """What a removed head outputs at each (row, step), broadcastable to ``[R, H, T, D]``."""
    if state.mode == "zero":
        return torch.zeros((), dtype=like.dtype, device=like.device)
    if state.mode == "mean":
        if state.head_means is None:
            raise ValueError("mean ablation needs each head's mean output over the prompt")
        return state.head_means[layer].to(like.device, like.dtype)[None, :, None]  # [1, H, 1, D]
    # uniform: the mean value over the keys step t's query sees (clean keys before it, its own)
    steps = value.shape[2]
    sums = torch.cumsum(clean_values.float(), dim=2)  # [1, H_kv, width, D]
    seen = state.first + torch.arange(steps, device=like.device)  # clean keys before step t
    before = torch.where((seen > 0)[:, None], sums[:, :, (seen - 1).clamp_min(0)], torch.zeros_like(sums[:, :, :1]))
    mean = (before + value.float()) / (seen + 1).to(torch.float32)[:, None]  # [R, H_kv, T, D]
    return mean.repeat_interleave(groups, dim=1).to(like.dtype)


def _register() -> None:
    AttentionInterface.register(TEACHER_ATTN, teacher_attention)
    AttentionMaskInterface.register(TEACHER_ATTN, sdpa_mask)


_register()
