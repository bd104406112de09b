"""Probe-driven dynamic KV retention, simulated exactly: greedy decoding where, at every step, a policy picks the
query heads that keep the full KV cache and every other head is a DuoAttention "streaming" head (attention sinks
+ recent window only; ``AttentionProbe.set_kv_heads``).

The prompt minus its last token is prefilled in full; the last prompt token and every generated token are decode
steps under the policy, so every emitted token is computed with the policy's head set.

Policies (budget ``b`` = a fraction of the L*H query heads, ``k = round(b * L * H)`` heads):

- ``full``: every head keeps its KV (the unmodified model, the ceiling); ``none``: every head streams,
- ``static``: the top-k heads of a static list, the same at every step (DuoAttention / RazorAttention / HeadKV),
- ``probe``: the top-k heads predicted by a trained head predictor (``analysis.head_predictor``) from the final hidden
  state of the previous step (the last one the decoder has when step t starts); or, with ``probe_select=
  "threshold"``, the heads above its decision threshold (a variable count),
- ``oracle``: the previous step's D_t (Eq. 1 copy heads) from a clean full-KV pass, at most k of them ordered by
  attention weight; ``true``: the current step's D_t from a clean pass at the same step (an offline upper bound,
  as in the ablation's two-pass scheme; the clean pass leaves the cache untouched),
- ``random``: k heads drawn per step from a seeded generator.

Dynamic policies presume that the evicted KV of a head can be brought back (e.g. offloaded); the memory counted
is what each step keeps resident. Memory is counted per KV head: under GQA a KV head is kept in full when ANY of
its query heads is a full-KV head (the ``any`` rule), else it keeps ``min(n, sink + recent)`` of the n tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from dynheads.analysis.head_predictor import TrainedHeadPredictor
from dynheads.decoding import DecodingSession, Sample, StepResult
from dynheads.errors import DynheadsError
from dynheads.heads import Head, check_heads
from dynheads.models import LoadedModel
from dynheads.scores import ranked_heads

Policy = Literal["full", "none", "static", "probe", "oracle", "true", "random"]
POLICIES: tuple[str, ...] = ("full", "none", "static", "probe", "oracle", "true", "random")
BUDGET_FREE = ("full", "none")  # policies whose head set does not depend on the budget
ProbeSelect = Literal["top", "threshold"]


@dataclass(frozen=True)
class KVSettings:
    policy: Policy = "static"
    budget: float = 0.1  # fraction of query heads kept in full (ignored by full / none)
    sink: int = 4  # DuoAttention default
    recent: int = 64  # recent window of streaming heads, current token included
    static_ranking: tuple[Head, ...] = ()
    probe_select: ProbeSelect = "top"
    seed: int = 0


@dataclass
class KVResult:
    tokens: list[int]
    text: str
    stop_reason: str
    full_heads: list[list[Head]] = field(default_factory=list)  # full-KV query heads per step
    kept_kv: list[int] = field(default_factory=list)  # KV tokens x KV heads resident per step
    total_kv: list[int] = field(default_factory=list)  # the same for the unmodified model
    dynamic: list[list[Head]] = field(default_factory=list)  # D_t of the applied pass (Eq. 1 copy heads)
    probe_scores: list[list[float]] = field(default_factory=list)  # probe(h_t) per step, when asked to record

    @property
    def kv_fraction(self) -> float:
        """Mean over steps of the resident KV over the unmodified model's KV."""
        return float(np.mean(np.asarray(self.kept_kv) / np.asarray(self.total_kv))) if self.kept_kv else 1.0


def head_count(budget: float, num_layers: int, num_heads: int) -> int:
    """Query heads kept in full at budget ``budget`` (round half up; at least 1)."""
    return max(1, int(budget * num_layers * num_heads + 0.5))


def kv_memory(full: Sequence[Head], lm: LoadedModel, length: int, sink: int, recent: int) -> int:
    """Resident KV (tokens x KV heads, summed over layers) with ``full`` as full-KV query heads (the ``any`` rule)."""
    num_kv = num_kv_heads(lm)
    full_kv = {(layer, head // (lm.num_heads // num_kv)) for layer, head in full}
    streaming = lm.num_layers * num_kv - len(full_kv)
    return len(full_kv) * length + streaming * min(length, sink + recent)


def num_kv_heads(lm: LoadedModel) -> int:
    return int(getattr(lm.model.config, "num_key_value_heads", None) or lm.num_heads)


@dataclass
class Prefill:
    """A session holding the full-attention prefill of a prompt minus its last token, reusable by every policy."""

    session: DecodingSession
    checkpoint: tuple[int, list[dict]]
    last: StepResult | None  # the prefill's last position (its hidden state feeds the probe at the first step)


def prefill(lm: LoadedModel, sample: Sample, max_new_tokens: int) -> Prefill:
    session = DecodingSession(lm, sample.input_ids, sample.needle_positions, max_new_tokens=max_new_tokens)
    last = session.forward(len(sample.input_ids) - 1) if len(sample.input_ids) > 1 else None
    return Prefill(session, session.checkpoint(), last)


def kv_generate(lm: LoadedModel, sample: Sample, settings: KVSettings, max_new_tokens: int = 48, *,
                probe: TrainedHeadPredictor | None = None, record_probe: bool = False, stop_at_eos: bool = True,
                prefilled: Prefill | None = None) -> KVResult:
    """Greedy decoding of ``sample`` with the full-KV head set of every step chosen by ``settings.policy``.

    ``probe`` drives the ``probe`` policy; with ``record_probe`` its scores for the hidden state of every step
    are kept too (to measure how well it predicts the next step's heads). ``prefilled`` (from ``prefill`` on the
    same sample and budget of new tokens) saves the prefill when several policies decode one sample.
    """
    _validate(lm, settings, probe, record_probe)
    prefilled = prefilled or prefill(lm, sample, max_new_tokens)
    session = prefilled.session
    session.rollback(prefilled.checkpoint)
    previous = prefilled.last
    rng = np.random.default_rng(settings.seed)
    k = head_count(settings.budget, lm.num_layers, lm.num_heads)
    every = [(layer, head) for layer in range(lm.num_layers) for head in range(lm.num_heads)]
    stop_ids = lm.stop_token_ids() if stop_at_eos else set()
    previous_dynamic: list[Head] = []
    result = KVResult(tokens=[], text="", stop_reason="max_new_tokens")
    for _ in range(max_new_tokens):
        clean_dynamic = None
        if settings.policy in ("oracle", "true"):
            session.probe.set_kv_heads(None)
            clean = session.forward(1, commit=False)
            clean_dynamic = dynamic_heads(session, clean, int(clean.logits.argmax()))
        full = _choose(settings, k, every, probe, previous, previous_dynamic, clean_dynamic, rng)
        session.probe.set_kv_heads(full, settings.sink, settings.recent)
        step = session.forward(1)
        token = int(step.logits.argmax())
        if clean_dynamic is not None:
            previous_dynamic = clean_dynamic
        result.full_heads.append(full)
        result.kept_kv.append(kv_memory(full, lm, session.length, settings.sink, settings.recent))
        result.total_kv.append(lm.num_layers * num_kv_heads(lm) * session.length)
        result.dynamic.append(dynamic_heads(session, step, token))
        if record_probe:
            result.probe_scores.append(np.round(probe.predict(step.hidden[None])[0], 4).tolist())
        previous = step
        if token in stop_ids:
            result.stop_reason = "eos"
            break
        result.tokens.append(token)
        session.append(token)
    result.text = lm.tokenizer.decode(result.tokens, skip_special_tokens=True)
    return result


def dynamic_heads(session: DecodingSession, step: StepResult, predicted: int) -> list[Head]:
    """D_t: heads whose argmax key is a needle token carrying ``predicted``, by attention weight (highest first)."""
    return ranked_heads(session.copy_scores(step.stats, predicted), step.stats.max_prob)


def _choose(settings: KVSettings, k: int, every: list[Head], probe: TrainedHeadPredictor | None,
            previous: StepResult | None, previous_dynamic: list[Head], clean_dynamic: list[Head] | None,
            rng: np.random.Generator) -> list[Head]:
    policy = settings.policy
    if policy == "full":
        return every
    if policy == "none":
        return []
    if policy == "static":
        return list(settings.static_ranking[:k])
    if policy == "oracle":
        return previous_dynamic[:k]
    if policy == "true":
        return clean_dynamic[:k]
    if policy == "random":
        return [every[int(i)] for i in sorted(rng.choice(len(every), size=k, replace=False))]
    if previous is None:  # a one-token prompt: no hidden state yet
        return []
    if settings.probe_select == "top":
        return probe.top_heads(previous.hidden.cpu(), k)
    scores = probe.predict(previous.hidden.cpu()[None])[0]
    return [every[int(i)] for i in np.flatnonzero(scores > probe.threshold)]


def _validate(lm: LoadedModel, settings: KVSettings, probe: TrainedHeadPredictor | None, record_probe: bool) -> None:
    if settings.policy not in POLICIES:
        raise DynheadsError(f"unknown KV policy {settings.policy!r}: use one of {', '.join(POLICIES)}")
    if not 0 < settings.budget <= 1:
        raise DynheadsError(f"the KV budget is a fraction of heads in (0, 1], got {settings.budget}")
    if settings.sink < 0 or settings.recent < 1:
        raise DynheadsError(f"streaming heads need sink >= 0 and recent >= 1, got {settings.sink}, {settings.recent}")
    if settings.policy == "static" and not settings.static_ranking:
        raise DynheadsError("the static KV policy needs a static head list (--static FILE)")
    if settings.probe_select not in ("top", "threshold"):
        raise DynheadsError(f"unknown probe selection {settings.probe_select!r}: use 'top' or 'threshold'")
    if (settings.policy == "probe" or record_probe) and probe is None:
        raise DynheadsError("the probe KV policy needs a trained head predictor (--probe DIR)")
    if probe is not None:
        if (probe.num_layers, probe.num_heads) != (lm.num_layers, lm.num_heads) or probe.task != "binary":
            raise DynheadsError(f"the probe predicts {probe.num_layers} x {probe.num_heads} {probe.task} head scores; "
                                f"the KV policy needs binary copy-head predictions for {lm.num_layers} x "
                                f"{lm.num_heads} heads")
    check_heads(list(settings.static_ranking), lm.num_layers, lm.num_heads, source="the static head list")
