"""Probe-driven dynamic KV retention, simulated exactly: greedy decoding where, at every step, a policy picks the
KV heads whose cache stays whole and every other KV head is a DuoAttention "streaming" head (attention sinks +
recent window only; ``probe.RowEdit.full_kv``).

Memory is held per KV head, so that is the unit of every budget: a policy keeps whole KV heads (under GQA query
head h reads KV head ``h // G``, ``G = H / H_kv``), every query head of a kept KV head sees all keys, and every
query head of a streaming KV head sees the first ``sink`` and the last ``recent`` keys. A budget ``b`` is a
fraction of the ``L * H_kv`` KV heads, ``k = round(b * L * H_kv)``, so two policies at one budget hold the same
bytes (unless one of them keeps fewer than k: its shortfall is recorded).

The prompt minus its last token is prefilled in full; the last prompt token and every generated token are decode
steps under the policy, so every emitted token is computed with the policy's head set.

Policies (``dynheads.kv.policies``, a registry: ``full``, ``none``, ``static``, ``probe``, ``oracle``, ``true``,
``random`` and any policy registered there) pick the KV heads kept whole at each step; this loop runs them.

Dynamic policies (probe, oracle, true, random: ``RetentionPolicy.dynamic``) may pick any head later, so its keys
must be kept somewhere: they are costed with a second tier (``Tier``): the full KV of every head lives offloaded
(host memory), every head's window stays resident, and each step fetches the picked heads' keys beyond the window
and writes the new token's KV of every head to the tier. Static policies drop what they evict: nothing is
offloaded or moved.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from dynheads.analysis.head_predictor import TrainedHeadPredictor
from dynheads.analysis.kvheads import KVHead
from dynheads.engine.decoding import (
    Action,
    Checkpoint,
    DecodeInput,
    DecodingSession,
    Rerun,
    Row,
    StepPolicy,
    StepResult,
    decode,
    greedy,
)
from dynheads.engine.probe import NO_EDIT, RowEdit
from dynheads.errors import DynheadsError
from dynheads.heads import Head
from dynheads.kv.policies import KV_POLICIES, PolicyInputs
from dynheads.models import LoadedModel, decode_text
from dynheads.scores import ranked_heads

ProbeSelect = Literal["top", "threshold"]


@dataclass(frozen=True)
class KVSettings:
    """How one KV-retention generation keeps the cache: the ``policy`` (a name in ``KV_POLICIES``) choosing which
    KV heads keep every token, within ``budget`` (a fraction of the L x H_kv KV heads), the others streaming
    (``sink`` first and ``recent`` last tokens); the head lists and press ratio the policy reads. See docs/kv.md."""

    policy: str = "static"  # a name in ``kv_policies.KV_POLICIES``
    budget: float = 0.1  # fraction of the L * H_kv KV heads kept whole (ignored by full / none)
    sink: int = 4  # DuoAttention's code default (its published patterns use 128 / 256 on 32k-token models)
    recent: int = 64  # recent window of streaming heads, current token included
    static_ranking: tuple[KVHead, ...] = ()  # scored KV heads, best first (``analysis.kvheads.kv_head_ranking``)
    probe_select: ProbeSelect = "top"
    seed: int = 0
    voters: tuple[Head, ...] = ()  # query heads that vote on the prompt's tokens (``token_kv``; kvpress:head_tokens)
    ratio: float | None = None  # a kvpress press's compression ratio; None: the budget's bytes (``matched_ratio``)


@dataclass
class KVResult:
    tokens: list[int]
    text: str
    stop_reason: str
    budget_heads: int = 0  # k: KV heads the budget allows (0 for full / none)
    kv_heads: list[list[KVHead]] = field(default_factory=list)  # whole KV heads per step
    kept_kv: list[int] = field(default_factory=list)  # KV tokens x KV heads resident per step
    total_kv: list[int] = field(default_factory=list)  # the same for the unmodified model
    fetched_kv: list[int] = field(default_factory=list)  # tokens x KV heads fetched from the second tier per step
    fetched_new_kv: list[int] = field(default_factory=list)  # the same, re-using the previous step's picks
    dynamic: list[list[Head]] = field(default_factory=list)  # D_t of the applied pass (Eq. 1 copy heads)
    probe_scores: list[list[float]] = field(default_factory=list)  # probe(h_t) per step, when asked to record
    voters: list[Head] = field(default_factory=list)  # query heads that chose the kept tokens, where chosen per prompt

    @property
    def kv_fraction(self) -> float:
        """Mean over steps of the resident KV over the unmodified model's KV."""
        return float(np.mean(np.asarray(self.kept_kv) / np.asarray(self.total_kv))) if self.kept_kv else 1.0

    @property
    def shortfall(self) -> float:
        """Mean over steps of the KV heads the budget allowed and the policy did not keep."""
        if not self.kv_heads or not self.budget_heads:
            return 0.0
        return float(np.mean([self.budget_heads - len(heads) for heads in self.kv_heads]))


def kv_head_count(budget: float, num_layers: int, num_kv: int) -> int:
    """KV heads kept whole at budget ``budget`` (round half up; at least 1)."""
    return max(1, int(budget * num_layers * num_kv + 0.5))


def num_kv_heads(lm: LoadedModel) -> int:
    return int(getattr(lm.model.config, "num_key_value_heads", None) or lm.num_heads)


def group_size(lm: LoadedModel) -> int:
    """G: query heads per KV head."""
    return lm.num_heads // num_kv_heads(lm)


def kv_token_bytes(lm: LoadedModel) -> int:
    """Bytes one token costs in one KV head of the cache: key + value, ``head_dim`` values each, model dtype."""
    config = lm.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * int(head_dim) * lm.model.dtype.itemsize


def query_heads(kv_heads: Sequence[KVHead], groups: int) -> list[Head]:
    """Every query head reading the given KV heads (query head h reads KV head h // G)."""
    return [(layer, kv * groups + g) for layer, kv in kv_heads for g in range(groups)]


def kv_memory(kv_heads: Sequence[KVHead], lm: LoadedModel, length: int, sink: int, recent: int) -> int:
    """Resident KV (tokens x KV heads, summed over layers) with ``kv_heads`` whole and every other KV head
    streaming (``min(length, sink + recent)`` tokens)."""
    streaming = lm.num_layers * num_kv_heads(lm) - len(set(kv_heads))
    return len(set(kv_heads)) * length + streaming * min(length, sink + recent)


@dataclass
class Prefill:
    """A session holding the full-attention prefill of a prompt minus its last token, reusable by every policy."""

    session: DecodingSession
    checkpoint: Checkpoint
    last: StepResult | None  # the prefill's last position (its hidden state feeds the probe at the first step)


def prefill(lm: LoadedModel, sample: DecodeInput, max_new_tokens: int) -> Prefill:
    session = DecodingSession(lm, sample.input_ids, sample.needle_positions, max_new_tokens=max_new_tokens)
    last = session.forward(len(sample.input_ids) - 1) if len(sample.input_ids) > 1 else None
    return Prefill(session, session.checkpoint(), last)


class KVPolicy(StepPolicy):
    """One row under a KV policy: before each pass the whole KV heads of the step (streaming every other one);
    ``oracle`` / ``true`` first run a clean full-KV pass and rerun the step under the heads it gives."""

    def __init__(
        self,
        lm: LoadedModel,
        settings: KVSettings,
        previous: StepResult | None,
        stop_ids: Collection[int],
        probe: TrainedHeadPredictor | None,
        record_probe: bool,
    ):
        self.lm, self.settings, self.stop_ids = lm, settings, stop_ids
        self.probe, self.record_probe = probe, record_probe
        self.retention = KV_POLICIES.get(settings.policy)
        self.rerunnable = self.retention.clean_pass  # a clean full-KV pass first, then the step under its heads
        self.rng = np.random.default_rng(settings.seed)
        self.groups = group_size(lm)
        self.every = [(layer, kv) for layer in range(lm.num_layers) for kv in range(num_kv_heads(lm))]
        self.k = kv_head_count(settings.budget, lm.num_layers, num_kv_heads(lm))
        self.previous = previous  # the last pass the decoder has when a step starts (the probe reads its hidden)
        self.previous_dynamic: list[Head] = []  # oracle: the previous step's clean D_t
        self.picked_before: set[KVHead] = set()
        self.result = KVResult(
            tokens=[], text="", stop_reason="max_new_tokens", budget_heads=0 if self.retention.budget_free else self.k
        )

    def _streaming(self, kept: list[KVHead]) -> RowEdit:
        self.kept = kept
        return RowEdit(
            full_kv=frozenset(query_heads(kept, self.groups)),
            kv_sink=self.settings.sink,
            kv_recent=self.settings.recent,
        )

    def edit(self, index: int) -> RowEdit:
        if self.rerunnable:
            return NO_EDIT  # the clean full-KV pass; ``after`` reruns the step under the heads it gives
        return self._streaming(self._choose([], None))

    def _choose(self, previous_dynamic: list[Head], clean_dynamic: list[Head] | None) -> list[KVHead]:
        return _choose(
            self.settings,
            self.k,
            self.groups,
            self.every,
            self.probe,
            self.previous,
            previous_dynamic,
            clean_dynamic,
            self.rng,
        )

    def after(self, index: int, row: Row, result: StepResult, rerun: bool) -> Action:
        if self.rerunnable and not rerun:
            clean = dynamic_heads(row, result, int(result.logits.argmax()))
            kept = self._choose(self.previous_dynamic, clean)
            self.previous_dynamic = clean
            return Rerun(self._streaming(kept))
        lm, settings, kept, out = self.lm, self.settings, self.kept, self.result
        length = row.length
        beyond = max(0, length - (settings.sink + settings.recent))  # tokens of a whole head beyond its window
        moves = self.retention.dynamic
        out.kv_heads.append(kept)
        out.kept_kv.append(kv_memory(kept, lm, length, settings.sink, settings.recent))
        out.total_kv.append(len(self.every) * length)
        out.fetched_kv.append(len(kept) * beyond if moves else 0)
        out.fetched_new_kv.append(len(set(kept) - self.picked_before) * beyond if moves else 0)
        self.picked_before = set(kept)
        out.dynamic.append(dynamic_heads(row, result, int(result.logits.argmax())))
        if self.record_probe and self.probe is not None:  # _validate refuses record_probe without a probe
            out.probe_scores.append(self.probe.predict(result.hidden[None])[0].round(4).tolist())
        self.previous = result
        return greedy(result, self.stop_ids)


def kv_generate(
    lm: LoadedModel,
    sample: DecodeInput,
    settings: KVSettings,
    max_new_tokens: int = 48,
    *,
    probe: TrainedHeadPredictor | None = None,
    record_probe: bool = False,
    stop_at_eos: bool = True,
    prefilled: Prefill | None = None,
) -> KVResult:
    """Greedy decoding of ``sample`` with the whole KV heads of every step chosen by ``settings.policy``.

    ``probe`` drives the ``probe`` policy; with ``record_probe`` its scores for the hidden state of every step
    are kept too (to measure how well it predicts the next step's heads). ``prefilled`` (from ``prefill`` on the
    same sample and budget of new tokens) saves the prefill when several policies decode one sample.
    """
    prefilled = prefilled or prefill(lm, sample, max_new_tokens)
    return kv_generate_batch(
        lm, [prefilled], settings, max_new_tokens, probe=probe, record_probe=record_probe, stop_at_eos=stop_at_eos
    )[0]


def kv_generate_batch(
    lm: LoadedModel,
    prefilled: Sequence[Prefill],
    settings: KVSettings | Sequence[KVSettings],
    max_new_tokens: int = 48,
    *,
    probe: TrainedHeadPredictor | None = None,
    record_probe: bool = False,
    stop_at_eos: bool = True,
) -> list[KVResult]:
    """``kv_generate`` for several prefilled samples decoded as one batch (``settings[i]`` for sample i, or one
    settings for all; the rows share a sink and recent window); ``result[i]`` equals ``kv_generate`` of sample i
    up to fp32 rounding. Each ``Prefill`` is rolled back first, so one prefill serves every policy; a batch holds
    each prefill once."""
    per_row = [settings] * len(prefilled) if isinstance(settings, KVSettings) else list(settings)
    if len(per_row) != len(prefilled) or len({id(shared.session) for shared in prefilled}) != len(prefilled):
        raise DynheadsError("a KV batch needs one settings per prefilled sample, each prefill once")
    for row_settings in per_row:
        _validate(lm, row_settings, probe, record_probe)
    stop_ids = lm.stop_token_ids() if stop_at_eos else set()
    policies = []
    for shared, row_settings in zip(prefilled, per_row, strict=True):
        shared.session.rollback(shared.checkpoint)
        policies.append(KVPolicy(lm, row_settings, shared.last, stop_ids, probe, record_probe))
    decoded = decode([shared.session for shared in prefilled], policies, max_new_tokens)
    for policy, result in zip(policies, decoded, strict=True):
        policy.result.tokens, policy.result.stop_reason = result.tokens, result.stop_reason
        policy.result.text = decode_text(lm.tokenizer, result.tokens, skip_special_tokens=True)
    return [policy.result for policy in policies]


def dynamic_heads(row: Row, step: StepResult, predicted: int) -> list[Head]:
    """D_t: heads whose argmax key is a needle token carrying ``predicted``, by attention weight (highest first)."""
    return ranked_heads(row.copy_scores(step.stats, predicted), step.stats.max_prob)


def _choose(
    settings: KVSettings,
    k: int,
    groups: int,
    every: list[KVHead],
    probe: TrainedHeadPredictor | None,
    previous: StepResult | None,
    previous_dynamic: list[Head],
    clean_dynamic: list[Head] | None,
    rng: np.random.Generator,
) -> list[KVHead]:
    """The KV heads ``settings.policy`` keeps whole at this step (the probe is run only for policies that read it)."""
    policy = KV_POLICIES.get(settings.policy)
    scores = None
    # a one-token prompt has no hidden state yet; _validate refuses a policy that needs the probe without one
    if policy.needs_probe and probe is not None and previous is not None:
        scores = probe.predict(previous.hidden.cpu()[None])[0].reshape(len(every), groups)
    return policy.choose(
        PolicyInputs(
            k=k,
            every=every,
            groups=groups,
            static_ranking=settings.static_ranking,
            previous_dynamic=previous_dynamic,
            clean_dynamic=clean_dynamic,
            probe_scores=scores,
            probe_threshold=probe.threshold if probe else None,
            probe_select=settings.probe_select,
            rng=rng,
        )
    )


def _validate(lm: LoadedModel, settings: KVSettings, probe: TrainedHeadPredictor | None, record_probe: bool) -> None:
    policy = KV_POLICIES.get(settings.policy)  # an unknown name is the registry's one-line error
    if not 0 < settings.budget <= 1:
        raise DynheadsError(f"the KV budget is a fraction of KV heads in (0, 1], got {settings.budget}")
    if settings.sink < 0 or settings.recent < 1:
        raise DynheadsError(f"streaming heads need sink >= 0 and recent >= 1, got {settings.sink}, {settings.recent}")
    if policy.needs_static and not settings.static_ranking:
        raise DynheadsError(
            f"the {settings.policy} KV policy needs a static head list with positive scores (--static FILE)"
        )
    if settings.probe_select not in ("top", "threshold"):
        raise DynheadsError(f"unknown probe selection {settings.probe_select!r}: use 'top' or 'threshold'")
    if (policy.needs_probe or record_probe) and probe is None:
        raise DynheadsError(f"the {settings.policy} KV policy needs a trained head predictor (--predictor DIR)")
    if probe is not None:
        if (probe.num_layers, probe.num_heads) != (lm.num_layers, lm.num_heads) or probe.task != "binary":
            raise DynheadsError(
                f"the probe predicts {probe.num_layers} x {probe.num_heads} {probe.task} head scores; "
                f"the KV policy needs binary copy-head predictions for {lm.num_layers} x "
                f"{lm.num_heads} heads"
            )
    num_kv = num_kv_heads(lm)
    bad = [kv for kv in settings.static_ranking if not (0 <= kv[0] < lm.num_layers and 0 <= kv[1] < num_kv)]
    if bad:
        raise DynheadsError(
            f"the static KV-head ranking names {bad[0]}, outside {lm.num_layers} layers x {num_kv} KV heads"
        )
