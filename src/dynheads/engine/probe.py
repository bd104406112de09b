"""The attention probe: one attention function, registered with transformers, that measures and edits heads.

At every forward pass it computes, for the *last query position* only, the exact eager attention row
of every query head (fp32 softmax) and reduces it on the spot, for each sequence of the batch:

- ``argmax_pos [L, H]``: absolute position of the most-attended key (Eq. 1 needs it),
- ``max_prob [L, H]``: the attention weight on that key,
- ``needle_mass [L, H]``: attention mass on the needle positions,
- ``excluded_mass [L, H]``: mass on sink/local positions that are not needle positions,
- ``kept_mass [L, H]``: mass on every other key, summed directly (Eq. 2 denominator; ``total - excluded`` loses
  the digits of a sink-dominated row),
- ``context_mass [L, H]``: mass on positions before ``context_end`` (the prompt; Lookback-Lens ratios),
- ``context_entropy [L, H]``: entropy (nats) of the row restricted to those positions and renormalised (how
  sharply a head looks into the context; 0 where it puts no mass there),
- ``needle_values`` / ``off_values [L, H, D]``: the head's attention output split into the part its needle keys
  give (``sum over needle keys j of a_j v_j``, a gather of the few needle keys) and the rest (its output minus that
  part); the write score reads them through each head's output projection (``dynheads.engine.readout``),
- full rows of the heads the pass's ``Measure`` names (``rows``) only,
- ``span_mass [L, H, S]`` (when the pass's ``Measure`` has a span score, batch 1): the attention that a range of
  query positions (a question) puts on each of S key spans (candidate paragraphs), averaged over those query rows
  and summed over the span's keys (``dynheads.scores.SpanScore``; ICR / QRHead). Only those query rows are
  computed, in chunks, and reduced at once: O(query x context) per chunk, never the whole attention matrix.

Memory per step is O(heads x context). The outputs of all other query positions (prefill) come from
torch's fused SDPA kernel, so no attention matrix is ever materialised.

Interventions are one ``RowEdit`` per batch row (``set_edits``; one edit applies to every row): heads to remove
at the last query row (``zero``: drop the head's slice of the o_proj input; ``uniform``: uniform attention over
the keys the row may see; ``mean``: the head's mean output over the row's prompt, ``head_means``), key
positions to hide from every head (in-context RAG), and per-head KV retention (``kv.retention``): at decode steps
every query head outside ``full_kv`` becomes a DuoAttention "streaming" head that sees only the first ``kv_sink``
and the last ``kv_recent`` key positions (the current token included), and the step statistics are those of the
attention actually applied. Passes of several tokens (prefill) never stream.
``KeyMasks`` builds the masks a pass needs over its keys (needle, sink/local, context, hidden, streaming).

Key indices are mapped to absolute positions with ``offset = last_position - (kv_len - 1)``: the keys a
layer receives always end at the current token, and sliding-window caches keep only a suffix of them.

Batches: sequence ``b`` has its own ``last_position`` and needle positions. Shorter sequences are
left-padded in the KV cache; the model's attention mask hides the pad keys (probability exactly 0), and
they map to positions that are negative or outside the window, so no statistic counts them. The needle
and sink/local key masks of a step are built once per key length with tensor ops (no host-device sync
inside the layers). ``StepStats`` tensors are ``[B, L, H]``; ``sequence_stats(b)`` gives the ``[L, H]``
views of one sequence, which is what batch-1 callers use (``pass_stats()``: those of every sequence).

Cost per decode step: a layer runs its few reductions (one max, one matrix product of the rows p and p log p with
the key masks) and keeps the results on the device (``LayerReduction``); ``stats`` joins the layers once per pass,
at its first read. Nothing inside the pass reads a value on the host (``benchmarks/bench_step_overhead.py``).

No global state: the probe reaches the attention function as the forward keyword argument ``PROBE_KWARG``
(transformers passes the extra keyword arguments of ``model(...)`` down to the registered attention function);
``attached`` switches the model's attention implementation for a block and gives those keyword arguments. A
forward without them runs plain attention (SDPA; chunked eager for soft-capped logits). Before each pass the
decoding session hands the probe everything that pass depends on in one frozen ``PassSpec`` (``begin_pass``: the
rows' last positions, needles, context ends and mean head outputs, Eq. 2's window, the pass's measure and edits).
The probe holds three kinds of data: ``ProbeSettings`` (frozen; ``begin_pass`` and the setters replace them), the
sequences' needle positions and context ends, and the state of the current pass (the layers' reductions and the
key masks of this step), renewed by ``begin_pass`` (``begin_forward``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple, cast

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from dynheads.engine.readout import HeadReadout
from dynheads.errors import DynheadsError
from dynheads.heads import Head, check_heads  # (layer, query head), zero-based
from dynheads.scores import LOCAL_WINDOW, SINK_SIZE, SpanScore, reasoning_scores
from dynheads.thresholds import chance_share

ATTN_NAME = "dynheads_probe"  # neutral name: transformers tests implementation names by substring
AblationMode = Literal["zero", "uniform", "mean"]
ABLATION_MODES: tuple[AblationMode, ...] = ("zero", "uniform", "mean")

PROBE_KWARG = "dynheads_probe"  # the forward keyword argument that carries the probe to the attention function


@dataclass
class StepStats:
    """What the probe measured at one forward pass, for its last query position.

    Tensors are ``[L, H]`` for one sequence (``AttentionProbe.sequence_stats``) and ``[B, L, H]`` for the
    batch (``AttentionProbe.stats``).
    """

    argmax_pos: torch.Tensor  # int64, absolute key position
    max_prob: torch.Tensor  # float32
    needle_mass: torch.Tensor  # float32
    excluded_mass: torch.Tensor  # float32, mass on (sink U local) \ needle
    total_mass: torch.Tensor  # float32, sum of the row (1 up to rounding)
    kept_mass: torch.Tensor  # float32, mass outside (sink U local) \ needle, summed from the row itself
    context_mass: torch.Tensor  # float32, mass on positions < the sequence's context end (prompt)
    context_entropy: torch.Tensor  # float32, entropy of the row renormalised over those positions
    # float32 [.., L, H, D], measured when the pass asks (``Measure.head_outputs``; None otherwise): the head's
    # output from its needle keys, sum_j a_j v_j, and from every other key
    needle_values: torch.Tensor | None
    off_values: torch.Tensor | None
    rows: dict[Head, torch.Tensor] = field(default_factory=dict)  # [last_position + 1] rows of requested heads
    span_mass: torch.Tensor | None = None  # float32 [.., L, H, S]: query rows' mean mass on key spans (SpanScore)
    readout: HeadReadout | None = None  # the model's unembedding through each head's output projection

    def reasoning_scores(self) -> torch.Tensor:
        """Eq. 2 of these statistics (``dynheads.scores.reasoning_scores``)."""
        return reasoning_scores(self.needle_mass, self.kept_mass)

    def logit_contributions(self, token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[L, H]`` twice: what each head's needle keys and its other keys add to ``token``'s logit, directly
        (``u_yᵀ W_O^{l,h} sum_j a_j v_j``; one sequence's statistics)."""
        if self.readout is None:
            raise DynheadsError("these statistics were measured without the model's readout: no write score")
        needle, off = self.needle_values, self.off_values
        if needle is None or off is None:
            raise DynheadsError(
                "this pass did not measure the heads' outputs (Measure(head_outputs=True)): no write score"
            )
        directions = self.readout(token)  # [L, H, D]
        if directions.device != needle.device:
            directions = directions.to(needle.device)
        return (directions * needle).sum(-1), (directions * off).sum(-1)


class LayerReduction(NamedTuple):
    """What one layer's pass leaves on the device; ``assemble_stats`` joins the layers of a pass."""

    max_prob: torch.Tensor  # float32 [B, H, 1]
    argmax: torch.Tensor  # int64 [B, H, 1], key index
    first_position: torch.Tensor  # int64 [B, 1, 1], absolute position of key index 0 (``KeyMasks.first_position``)
    sums: torch.Tensor  # float32 [B, 2H, 5]: rows p then p log p, summed over ``KeyMasks.weights``' key sets
    needle_values: torch.Tensor | None  # float32 [B, H, D]: the head's output from its needle keys (``needle_values``)
    head_values: torch.Tensor | None  # [B, H, D]: the head's whole output at the last query row (both: head outputs)


def assemble_stats(
    layers: dict[int, LayerReduction], num_layers: int, batch: int, heads: int, device: torch.device
) -> StepStats:
    """``[B, L, H]`` statistics of one pass from its layers' reductions: one concatenation per field, and the
    context entropy computed once for every layer; zeros for layers missing from ``layers``. The heads' outputs
    are there when the layers measured them (``Measure.head_outputs``: every layer of a pass or none)."""
    measured = [reduction.head_values for reduction in layers.values() if reduction.head_values is not None]
    if len(layers) < num_layers:
        zero = torch.zeros(batch, heads, 1, device=device)
        no_values = torch.zeros(batch, heads, measured[0].shape[-1], device=device) if measured else None
        empty = LayerReduction(
            zero, zero.long(), zero[:, :1].long(), torch.zeros(batch, 2 * heads, 5, device=device), no_values, no_values
        )
        layers = {layer: layers.get(layer, empty) for layer in range(num_layers)}
    ordered = [layers[layer] for layer in range(num_layers)]
    fields = zip(*(reduction[:4] for reduction in ordered), strict=True)
    max_prob, argmax, first, sums = (torch.cat(list(parts), dim=1) for parts in fields)  # by layer
    sums = sums.view(batch, num_layers, 2, heads, 5)
    needle = off = None
    if measured:
        needle = torch.cat([cast(torch.Tensor, r.needle_values) for r in ordered], dim=1)
        whole = torch.cat([cast(torch.Tensor, r.head_values) for r in ordered], dim=1)
        needle = needle.view(batch, num_layers, heads, -1)
        off = whole.float().view(needle.shape) - needle
    masses, context = sums[:, :, 0], sums[:, :, 0, :, 3]
    # H(p restricted to the context, renormalised) = log c - sum_ctx p log p / c, with c the context mass
    plogp = sums[:, :, 1, :, 3]
    entropy = torch.where(context > 0, torch.log(context.clamp_min(1e-30)) - plogp / context.clamp_min(1e-30), 0.0)
    return StepStats(
        argmax_pos=argmax.view(batch, num_layers, heads) + first,  # [B, L, 1]: each layer's first key
        max_prob=max_prob.view(batch, num_layers, heads),
        needle_mass=masses[..., 0],
        excluded_mass=masses[..., 1],
        total_mass=masses[..., 4],
        kept_mass=masses[..., 2],
        context_mass=context,
        context_entropy=entropy,
        needle_values=needle,
        off_values=off,
    )


@dataclass(frozen=True)
class RowEdit:
    """What one batch row changes in its next passes; the default changes nothing (the plain model).

    - ``removed``: query heads whose output at the last query row is replaced (``mode``: ``zero`` drops the
      head's slice of the o_proj input; ``uniform`` attends uniformly over the keys the row may see; ``mean``
      puts the head's mean output over the row's prompt, ``AttentionProbe.head_means``),
    - ``hidden_keys``: absolute key positions no head may see, at every query row of the pass (in-context RAG),
    - ``full_kv``: at decode steps (one query row), the query heads that see every key; every other head is a
      DuoAttention streaming head that sees the first ``kv_sink`` and the last ``kv_recent`` positions (the
      current token included). None: every head sees every key. Passes of several tokens always attend in full.
    """

    removed: frozenset[Head] = frozenset()
    mode: AblationMode = "zero"
    hidden_keys: frozenset[int] = frozenset()
    full_kv: frozenset[Head] | None = None
    kv_sink: int = 4
    kv_recent: int = 64


NO_EDIT = RowEdit()


@dataclass(frozen=True)
class Measure:
    """What one pass measures beyond every head's step statistics: the full last attention rows of the ``rows``
    heads (``StepStats.rows``), a span score (``StepStats.span_mass``; batch 1, re-ranking and token votes), and
    each head's output from its needle keys and from the rest (``head_outputs``: ``StepStats.needle_values`` and
    ``off_values``, what the write score reads; a gather and a small product per layer, off unless asked for).
    A pass measures what its caller declares for it (``DecodingSession.forward``'s ``measure``, a step policy's
    ``measure``): nothing carries over to the next pass."""

    rows: frozenset[Head] = frozenset()
    span: SpanScore | None = None
    head_outputs: bool = False  # each head's output split into its needle keys' part and the rest (the write score)


STEP_STATS = Measure()  # the step statistics alone


@dataclass(frozen=True)
class ProbeSettings:
    """What the probe measures and changes; fixed during a pass (``AttentionProbe``'s setters replace it).

    The edit fields are ``set_edits``' compiled form of ``edits`` (one edit applies to every row): tensors whose
    first dimension is the row (or 1), and on the host the layers that need work (no device sync in the hot path).
    """

    sink_size: int = SINK_SIZE  # Eq. 2: first keys excluded from the denominator
    local_window: int = LOCAL_WINDOW  # Eq. 2: last keys excluded from the denominator (current token included)
    rows_for: frozenset[Head] = frozenset()  # heads whose full last row is kept
    edits: tuple[RowEdit, ...] = (NO_EDIT,)
    removed: torch.Tensor | None = None  # bool [R, L, H]: heads each row removes at the last query row
    removed_heads: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> heads some row removes
    ablation_mode: AblationMode = "zero"  # shared by the rows that remove heads
    hidden_keys: torch.Tensor | None = None  # bool [R, positions]: keys no head of the row may see
    kv_full: torch.Tensor | None = None  # bool [R, L, H]: heads that see every key at decode steps
    streaming_layers: frozenset[int] = frozenset()  # layers where some row has a streaming head
    kv_sink: int = 4  # shared by the rows that stream
    kv_recent: int = 64
    span_score: SpanScore | None = None  # query rows x key spans reduced in the pass (batch 1; re-ranking)
    span_weights: torch.Tensor | None = None  # float [positions, S]: the span score's key spans
    head_outputs: bool = False  # each head's output from its needle keys and whole (``Measure.head_outputs``)


@dataclass(frozen=True, eq=False)
class PassSpec:
    """Everything the probe needs to know about one forward pass, handed over in one call before it
    (``AttentionProbe.begin_pass``); the decoding session builds one per pass. Per row b of the batch:

    - ``last_positions[b]``: the absolute position of the row's last input token,
    - ``needles[b]``: its needle positions (sorted), ``context_ends[b]``: its context end (positions before it
      are the context: ``context_mass``, ``context_entropy``),
    - ``head_means[b]``: its mean head output over its prompt (``[B, L, H, D]``; mean ablation; None: not
      measured).

    For the whole pass: Eq. 2's ``sink_size`` and ``local_window``, what it measures beyond the step statistics
    (``measure``), the rows' edits (``edits``: one per row, or one for every row; None keeps the edits in force,
    ``set_edits``' or an earlier pass's), and whether it measures each row's mean head output over its positions
    (``capture_means``: a prefill; ``AttentionProbe.captured_head_means``).
    """

    last_positions: tuple[int, ...]
    needles: tuple[tuple[int, ...], ...]
    context_ends: tuple[int, ...]
    head_means: torch.Tensor | None = None
    sink_size: int = SINK_SIZE
    local_window: int = LOCAL_WINDOW
    measure: Measure = STEP_STATS
    edits: tuple[RowEdit, ...] | None = None
    capture_means: bool = False


class AttentionProbe:
    """Measurement and intervention settings shared by the decoding loop and the attention function.

    Positions are absolute token indices of each sequence being decoded (batch row b = sequence b).
    """

    def __init__(
        self, num_layers: int, num_heads: int, device: torch.device | str = "cpu", readout: HeadReadout | None = None
    ):
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.device = torch.device(device)
        self.readout = readout  # the write score's (``StepStats.logit_contributions``); None: no write score
        self.settings = ProbeSettings()
        # The sequences: needle positions and context ends (positions < context end are the prompt).
        self._needle = torch.zeros(1, 1, dtype=torch.bool, device=self.device)  # [B, positions]
        self._needle_index = torch.zeros(1, 0, dtype=torch.long, device=self.device)  # [B, n]: positions, -1 pads
        self._needle_lists: tuple[tuple[int, ...], ...] = ((),)  # what ``_needle`` was built from
        self.context_ends: list[int] = [0]
        # The current pass (begin_forward renews it).
        self.last_positions: list[int] = [0]  # per sequence, known on the host: no device sync needed
        self.rows: list[dict[Head, torch.Tensor]] = [{}]  # per sequence: full last rows of ``rows_for`` heads
        self.keys = KeyMasks(self, torch.zeros(1, dtype=torch.long, device=self.device))
        # Mean ablation: each row's mean head output over its prompt ``[B, L, H, D]`` (None: not measured), and
        # whether a pass of several tokens (a prefill) measures it into ``captured_means`` (layer -> ``[B, H, D]``).
        self.head_means: torch.Tensor | None = None
        self.capture_means = False
        self.captured_means: dict[int, torch.Tensor] = {}
        self._new_pass()

    # ---- settings -------------------------------------------------------------------------------
    def _update(self, **changes: Any) -> None:
        self.settings = replace(self.settings, **changes)

    # Views of single settings (the setters replace the frozen settings; set_* methods validate the rest).
    sink_size = property(lambda self: self.settings.sink_size, lambda self, size: self._update(sink_size=int(size)))
    local_window = property(
        lambda self: self.settings.local_window, lambda self, size: self._update(local_window=int(size))
    )

    def chance_share(self, b: int = 0, last_position: int | None = None) -> float:
        """Eq. 2 score of a head attending uniformly: needle keys / keys outside (sink U local) minus needle.

        Counted over every position up to ``last_position`` (default: sequence ``b``'s current one; full
        attention, hidden keys are not discounted).
        """
        needle = self.needle_positions(b)
        last = self.last_positions[b] if last_position is None else last_position
        return chance_share(needle, last, self.sink_size, self.local_window)

    def set_needles(self, per_sequence: Sequence[Iterable[int]]) -> None:
        """Needle positions of each sequence of the batch (absolute positions of that sequence)."""
        lists = [sorted(set(int(p) for p in positions)) for positions in per_sequence]
        size = max([p + 1 for positions in lists for p in positions], default=1)
        needle = torch.zeros(len(lists), size, dtype=torch.bool)
        for b, positions in enumerate(lists):
            needle[b, [p for p in positions if p >= 0]] = True
        self._needle = needle.to(self.device)
        self._needle_lists = tuple(tuple(positions) for positions in lists)
        index = torch.full((len(lists), max(map(len, lists), default=0)), -1, dtype=torch.long)
        for b, positions in enumerate(lists):
            index[b, : len(positions)] = torch.tensor(positions, dtype=torch.long)
        self._needle_index = index.to(self.device)

    @property
    def needle(self) -> torch.Tensor:
        """Bool ``[B, positions]``: the needle positions of each sequence."""
        return self._needle

    @property
    def needle_index(self) -> torch.Tensor:
        """Long ``[B, n]``: each sequence's needle positions, padded with -1 to the longest needle."""
        return self._needle_index

    def needle_positions(self, b: int = 0) -> list[int]:
        """Sequence ``b``'s needle positions, sorted."""
        return self._needle[b].nonzero().flatten().tolist()

    def set_edits(self, edits: Sequence[RowEdit]) -> None:
        """What each row of the next passes changes (``edits[b]`` for row b, or one edit for every row).

        Rows that remove heads share one mode, and rows that stream share one sink and recent window.
        """
        edits = tuple(edits)
        if edits == self.settings.edits:
            return
        if not edits:
            raise DynheadsError("set_edits needs one edit per batch row (or one for all)")
        removing = [e for e in edits if e.removed]
        modes = {e.mode for e in removing}
        for mode in modes | {e.mode for e in edits}:
            if mode not in ABLATION_MODES:
                raise DynheadsError(f"unknown ablation mode {mode!r}: use one of {', '.join(ABLATION_MODES)}")
        if len(modes) > 1:
            raise DynheadsError("the rows of one batch that remove heads share one ablation mode")
        streaming = [e for e in edits if e.full_kv is not None]
        windows = {(e.kv_sink, e.kv_recent) for e in streaming}
        if len(windows) > 1:
            raise DynheadsError("the rows of one batch that stream share one sink and recent window")
        sink, recent = windows.pop() if windows else (4, 64)
        if sink < 0 or recent < 1:
            raise DynheadsError(f"streaming heads need sink >= 0 and recent >= 1 tokens, got {sink} and {recent}")
        shape = (len(edits), self.num_layers, self.num_heads)
        removed, full = torch.zeros(shape, dtype=torch.bool), torch.ones(shape, dtype=torch.bool)
        for b, edit in enumerate(edits):
            for layer, head in edit.removed:
                self._check_head(layer, head)
                removed[b, layer, head] = True
            if edit.full_kv is not None:
                full[b] = False
                for layer, head in edit.full_kv:
                    self._check_head(layer, head)
                    full[b, layer, head] = True
        if any(p < 0 for e in edits for p in e.hidden_keys):
            raise DynheadsError("hidden key positions are absolute positions (>= 0)")
        hidden = None
        if any(e.hidden_keys for e in edits):
            hidden = torch.zeros(len(edits), max(max(e.hidden_keys, default=0) for e in edits) + 1, dtype=torch.bool)
            for b, edit in enumerate(edits):
                hidden[b, sorted(edit.hidden_keys)] = True
        removed_heads = {
            layer: removed[:, layer].any(0).nonzero().flatten().to(self.device)
            for layer in removed.any(2).any(0).nonzero().flatten().tolist()
        }
        streaming_layers = frozenset((~full).any(2).any(0).nonzero().flatten().tolist())
        self._update(
            edits=edits,
            removed=removed.to(self.device) if removed_heads else None,
            removed_heads=removed_heads,
            ablation_mode=modes.pop() if modes else "zero",
            hidden_keys=None if hidden is None else hidden.to(self.device),
            kv_full=full.to(self.device) if streaming_layers else None,
            streaming_layers=streaming_layers,
            kv_sink=sink,
            kv_recent=recent,
        )

    def set_measure(self, measure: Measure) -> None:
        """What the next pass measures beyond the step statistics (``Measure``)."""
        settings = self.settings
        if measure == Measure(settings.rows_for, settings.span_score, settings.head_outputs):
            return
        score = measure.span
        unit = score is not None and score.unit  # one span per key: rows added per key, no [positions, S] matrix
        weights = None if score is None or unit else score.key_weights().to(self.device)  # [positions, S]
        self._update(
            rows_for=frozenset(measure.rows), span_score=score, span_weights=weights, head_outputs=measure.head_outputs
        )

    def _check_head(self, layer: int, head: int) -> None:
        check_heads([(layer, head)], self.num_layers, self.num_heads, source="the ablation")

    # ---- per-forward bookkeeping ------------------------------------------------------------------
    def begin_pass(self, spec: PassSpec) -> None:
        """Call before each forward pass with everything it depends on (``PassSpec``); the rows' statistics of the
        pass are ``pass_stats()`` after it. The needle masks are rebuilt only when the needles change."""
        if spec.needles != self._needle_lists:
            self.set_needles(spec.needles)
        self.context_ends = list(spec.context_ends)
        if (spec.sink_size, spec.local_window) != (self.sink_size, self.local_window):
            self._update(sink_size=int(spec.sink_size), local_window=int(spec.local_window))
        if spec.edits is not None:
            self.set_edits(spec.edits)
        self.set_measure(spec.measure)
        self.head_means, self.capture_means = spec.head_means, spec.capture_means
        self.begin_forward(spec.last_positions)

    def _new_pass(self) -> None:
        """Forget the last pass's reductions; allocate the span score's buffer when one is set."""
        self._layers: dict[int, LayerReduction] = {}
        self._stats: StepStats | None = None
        score = self.settings.span_score
        self.span_mass = None
        if score is not None:
            shape = (len(self.last_positions), self.num_layers, self.num_heads, len(score.spans))
            self.span_mass = torch.zeros(shape, dtype=torch.float32, device=self.device)

    def begin_forward(self, last_position: int | Sequence[int]) -> None:
        """Call before each forward pass (after its edits are set) with the absolute position of its last input
        token, per sequence. The pass's ``[B, L, H]`` statistics are ``stats`` after it.
        """
        positions = [last_position] if isinstance(last_position, int) else [int(p) for p in last_position]
        if len(positions) != self._needle.shape[0]:
            raise DynheadsError(f"{len(positions)} sequences in the batch but needles set for {self._needle.shape[0]}")
        if len(self.settings.edits) not in (1, len(positions)):
            raise DynheadsError(f"{len(self.settings.edits)} row edits for a batch of {len(positions)} sequences")
        if len(self.context_ends) not in (1, len(positions)):
            raise DynheadsError(f"{len(self.context_ends)} context ends for a batch of {len(positions)} sequences")
        self.last_positions = positions
        self.keys = KeyMasks(self, torch.tensor(positions, dtype=torch.long).to(self.device, non_blocking=True))
        self.rows = [{} for _ in positions]
        self._new_pass()

    def record_layer(self, layer: int, reduction: LayerReduction) -> None:
        """Keep one layer's reductions of this pass, on the device (``stats`` assembles them)."""
        if reduction.sums.device != self.device:  # device_map: the layer runs on another device
            moved = [part.to(self.device) for part in reduction[:4]]
            values = [None if part is None else part.to(self.device) for part in reduction[4:]]
            reduction = LayerReduction(*moved, *values)
        self._layers[layer] = reduction
        self._stats = None

    @property
    def reached_layers(self) -> int:
        """How many layers of the current pass ran their attention through the probe (0: the model's layers do not
        pass the forward's keyword arguments on to their attention, so nothing can be measured or edited)."""
        return len(self._layers)

    @property
    def stats(self) -> StepStats:
        """The batch's ``[B, L, H]`` statistics of the current pass, assembled from its layers' reductions at the
        first read (a few tensor operations per pass, none per layer); zeros for layers the pass did not reach."""
        if self._stats is None:
            shape = (len(self.last_positions), self.num_heads)
            self._stats = assemble_stats(self._layers, self.num_layers, *shape, self.device)
            self._stats.span_mass = self.span_mass
            self._stats.readout = self.readout
        return self._stats

    def pass_stats(self) -> list[StepStats]:
        """Each sequence's ``[L, H]`` statistics of the current pass (``sequence_stats`` of every row)."""
        return [self.sequence_stats(b) for b in range(len(self.last_positions))]

    def captured_head_means(self) -> torch.Tensor:
        """``[B, L, H, D]``: each sequence's mean head output over the positions of the last pass that captured
        them (``capture_means``: a prefill)."""
        return torch.stack([self.captured_means[layer] for layer in range(self.num_layers)], 1)

    def sequence_stats(self, b: int = 0) -> StepStats:
        """Sequence ``b``'s ``[L, H]`` statistics of the current pass (views of the batch tensors)."""
        s = self.stats
        return StepStats(
            argmax_pos=s.argmax_pos[b],
            max_prob=s.max_prob[b],
            needle_mass=s.needle_mass[b],
            excluded_mass=s.excluded_mass[b],
            total_mass=s.total_mass[b],
            kept_mass=s.kept_mass[b],
            context_mass=s.context_mass[b],
            context_entropy=s.context_entropy[b],
            needle_values=None if s.needle_values is None else s.needle_values[b],
            off_values=None if s.off_values is None else s.off_values[b],
            rows=self.rows[b],
            span_mass=None if s.span_mass is None else s.span_mass[b],
            readout=self.readout,
        )


class KeyMasks:
    """Masks over the keys of one pass, built once per key length and device and shared by the layers of one kind
    (``device_map`` spreads layers over devices).

    A layer receives keys that end at the current token (sliding-window caches keep a suffix), so key index i of
    row b is absolute position ``offsets[b] + i``; left pads map to negative positions: never needle, never
    excluded, never context.
    """

    def __init__(self, probe: AttentionProbe, last: torch.Tensor):
        self.settings = probe.settings
        self.needle = probe.needle
        self.needle_index = probe.needle_index
        self.context_ends = probe.context_ends
        self.last = last  # [B] last input position of each row
        self._built: dict[tuple, torch.Tensor] = {}

    def _cached(self, name: str, kv_len: int, device: torch.device, build: Callable[[], torch.Tensor]) -> torch.Tensor:
        key = (name, kv_len, device)
        if key not in self._built:
            self._built[key] = build()
        return self._built[key]

    def positions(self, kv_len: int, device: torch.device) -> torch.Tensor:
        """Long ``[B, kv]``: the absolute position of every key of every row."""
        return self._cached(
            "positions",
            kv_len,
            device,
            lambda: (self.last.to(device) - (kv_len - 1))[:, None] + torch.arange(kv_len, device=device),
        )

    def weights(self, kv_len: int, device: torch.device) -> torch.Tensor:
        """Float ``[B, kv, 5]``: needle, excluded (sink/local minus needle), kept (every other real key: the Eq. 2
        denominator), context (before the row's context end) and every key (the row's sum)."""

        def build() -> torch.Tensor:
            positions = self.positions(kv_len, device)
            real = positions >= 0
            size = self.needle.shape[1]
            needle = self.needle.to(device).gather(1, positions.clamp(0, size - 1)) & real & (positions < size)
            first_local = (self.last.to(device) - self.settings.local_window + 1)[:, None]
            excluded = real & ((positions < self.settings.sink_size) | (positions >= first_local)) & ~needle
            ends = torch.tensor(self.context_ends, dtype=torch.long, device=device)[:, None]
            context = real & (positions < ends)
            every = torch.ones_like(real)
            return torch.stack([needle, excluded, real & ~excluded, context, every], dim=-1).float()

        return self._cached("weights", kv_len, device, build)

    def needle_gather(
        self, kv_len: int, device: torch.device, heads: int, value_shape: torch.Size
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What gathers each row's needle keys (n: the longest needle) from a layer's last rows ``[B, H, kv]`` and
        values ``value_shape = [B, H_kv, kv, D]``: long indices ``[B, H, n]`` and ``[B, H_kv, n, D]``, and float
        ``[B, 1, n]`` 1 where the needle position is among this layer's keys (a sliding window may have dropped it;
        the -1 pads never are). Built once per key length and shape, shared by the layers."""
        _, num_kv, _, head_dim = value_shape

        def keys() -> torch.Tensor:
            positions = self.needle_index.to(device)
            return positions - (self.last.to(device) - (kv_len - 1))[:, None]

        def inside() -> torch.Tensor:
            positions, index = self.needle_index.to(device), keys()
            return ((positions >= 0) & (index >= 0) & (index < kv_len)).float()[:, None, :]

        index = self._cached("needle_keys", kv_len, device, lambda: keys().clamp(0, max(kv_len - 1, 0)))
        batch, count = index.shape
        rows = self._cached(
            f"needle_rows_{heads}", kv_len, device, lambda: index[:, None, :].expand(batch, heads, count)
        )
        values = self._cached(
            f"needle_values_{num_kv}_{head_dim}",
            kv_len,
            device,
            lambda: index[:, None, :, None].expand(batch, num_kv, count, head_dim),
        )
        return rows, values, self._cached("needle_inside", kv_len, device, inside)

    def first_position(self, kv_len: int, device: torch.device) -> torch.Tensor:
        """Long ``[B, 1, 1]``: the absolute position of every row's first key."""
        return self._cached("first", kv_len, device, lambda: self.positions(kv_len, device)[:, :1, None])

    def hidden(self, kv_len: int, device: torch.device) -> torch.Tensor | None:
        """Bool ``[B, kv]``: keys no head of the row may see, or None when every key may be seen."""
        hidden = self.settings.hidden_keys
        if hidden is None:
            return None

        def build() -> torch.Tensor:
            positions = self.positions(kv_len, device)  # one edit for every row: each row's own positions
            per_row = hidden.to(device).expand(positions.shape[0], -1)
            inside = (positions >= 0) & (positions < hidden.shape[1])
            return per_row.gather(1, positions.clamp(0, hidden.shape[1] - 1)) & inside

        return self._cached("hidden", kv_len, device, build)

    def streaming(self, layer: int, kv_len: int, device: torch.device) -> torch.Tensor | None:
        """Bool ``[B or 1, H, kv]``: keys each query head may see at a decode step, or None when all see all."""
        if layer not in self.settings.streaming_layers:
            return None
        window = self._cached("window", kv_len, device, lambda: self._window(kv_len, device))
        assert self.settings.kv_full is not None  # set with streaming_layers
        full = self.settings.kv_full[:, layer].to(device)  # [R, H]
        return full[:, :, None] | window[:, None, :]

    def _window(self, kv_len: int, device: torch.device) -> torch.Tensor:
        """Bool ``[B, kv]``: the sink and recent keys a streaming head sees."""
        positions = self.positions(kv_len, device)
        recent_start = self.last.to(device)[:, None] - self.settings.kv_recent
        return (positions < self.settings.kv_sink) | (positions > recent_start)


def probe_attention(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, q, D], after RoPE
    key: torch.Tensor,  # [B, H_kv, kv, D], cache included, not repeated for GQA
    value: torch.Tensor,  # [B, H_kv, kv, D]
    attention_mask: torch.Tensor | None,  # bool [B, 1, q, kv] (True = attend) or None for plain causal
    dropout: float = 0.0,  # transformers' order (sdpa_attention_forward's): wrappers such as kvpress's pass it 6th
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention function registered under ``ATTN_NAME``; returns ``[B, q, H, D]`` like every interface function.

    The probe comes in ``kwargs[PROBE_KWARG]``; without it this is plain SDPA.
    """
    probe: AttentionProbe | None = kwargs.pop(PROBE_KWARG, None)
    if probe is None:  # plain attention: SDPA, or chunked eager for soft-capped logits (SDPA has no softcap)
        if kwargs.get("softcap") is None:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        output = _all_rows_output(module, query, key, value, attention_mask, None, scale, kwargs["softcap"], kwargs)
        return output.transpose(1, 2).contiguous(), None
    batch, num_heads, q_len, head_dim = query.shape
    num_kv, kv_len = key.shape[1], key.shape[2]
    groups = num_heads // num_kv
    scaling = head_dim**-0.5 if scaling is None else scaling
    softcap = kwargs.get("softcap")
    layer = cast(int, module.layer_idx)  # transformers numbers every attention module
    hidden = probe.keys.hidden(kv_len, query.device)

    # Last query row, exactly as eager attention computes it: matmul in the model dtype, fp32 softmax.
    # The matrix products are the ones eager's matmul runs (over B x H_kv, G query heads per KV head), called directly.
    q_last = (query if q_len == 1 else query[:, :, -1]).reshape(batch * num_kv, groups, head_dim)
    keys_t = key.reshape(batch * num_kv, kv_len, head_dim).transpose(1, 2)
    padded = query.device.type in ROW_ALIGNMENT_DEVICES and kv_len % ROW_ALIGNMENT != 0
    if padded:  # the same product into rows that start at aligned addresses (see ROW_ALIGNMENT)
        logits = torch.bmm(q_last, keys_t, out=_aligned_rows(q_last, kv_len, query.dtype)).mul_(scaling)
    else:
        logits = torch.bmm(q_last, keys_t) * scaling
    logits = logits.view(batch, num_kv, groups, kv_len)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    visible = _last_row_visibility(attention_mask, hidden)
    if visible is not None:
        logits = logits.masked_fill(~visible[:, None, None, :], float("-inf"))
    streaming = probe.keys.streaming(layer, kv_len, query.device) if q_len == 1 else None
    if streaming is not None:  # DuoAttention streaming heads: sink + recent keys only
        logits = logits.masked_fill(~streaming.view(-1, num_kv, groups, kv_len), float("-inf"))
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)  # [B, H_kv, G, kv]

    if q_len == 1:
        rows = probs.view(batch * num_kv, groups, kv_len)
        rows = _aligned_rows(rows, kv_len, value.dtype).copy_(rows) if padded else rows.to(value.dtype)
        values = value.reshape(batch * num_kv, kv_len, head_dim)
        output = (_split_product(rows, values) if padded else torch.bmm(rows, values)).view(
            batch, num_heads, 1, head_dim
        )
    else:
        output = _all_rows_output(module, query, key, value, attention_mask, hidden, scaling, softcap, kwargs)
        if probe.capture_means:  # a prefill: each head's mean output over the positions of this pass
            probe.captured_means[layer] = output.float().mean(dim=2)
    probs = probs.view(batch, num_heads, kv_len)
    head_outputs = None
    if probe.settings.head_outputs:  # the write score's: the heads' outputs before any removal, and their needle part
        whole = output[:, :, -1]
        if q_len > 1 or layer in probe.settings.removed_heads:  # a copy: a view would keep a prefill's rows alive
            whole = whole.clone()
        head_outputs = (needle_values(probe, probs, value, kv_len), whole)
    if layer in probe.settings.removed_heads:
        _remove_heads(output, probe, layer, value, groups, visible, kwargs)

    record_layer_attention(probe, layer, probs, kv_len, head_outputs)
    if probe.settings.span_score is not None:
        _record_spans(probe, layer, query, key, attention_mask, hidden, scaling, softcap, kwargs)
    if q_len == 1:  # [B, H, 1, D] is laid out as [B, 1, H, D]
        return output.view(batch, 1, num_heads, head_dim), None
    return output.transpose(1, 2).contiguous(), None


ROW_ALIGNMENT = 8
ROW_ALIGNMENT_DEVICES = frozenset({"cuda"})
"""On these devices, when the key count is not a multiple of ``ROW_ALIGNMENT``, the rows of the last-row products
(the logits q K^T and the probabilities that multiply V) are laid out with a stride rounded up to a multiple of it,
and the product with V is split at the last multiple: at odd key counts cuBLAS ran a kernel that took 2.1 ms per
call at 64k keys on an H100 instead of tens of microseconds (BENCHMARKS.md, GPU section). The split changes only
the order of the fp32 sums (tests/test_probe_exactness.py runs this path on the CPU against eager rows);
``ROW_ALIGNMENT = 1`` turns both off."""


def _split_product(rows: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``rows @ values`` over the keys as the product over the first multiple of ``ROW_ALIGNMENT`` keys added to
    the product over the rest (an odd reduction length is what sent cuBLAS to its slow kernel)."""
    kv_len = rows.shape[-1]
    cut = kv_len - kv_len % ROW_ALIGNMENT
    if cut == 0:
        return torch.bmm(rows, values)
    return torch.baddbmm(torch.bmm(rows[..., cut:], values[:, cut:]), rows[..., :cut], values[:, :cut])


def _aligned_rows(like: torch.Tensor, kv_len: int, dtype: torch.dtype) -> torch.Tensor:
    """An empty ``[N, G, kv_len]`` view of ``like``'s first two sizes whose rows start every
    ``ROW_ALIGNMENT`` elements."""
    width = -(-kv_len // ROW_ALIGNMENT) * ROW_ALIGNMENT
    return torch.empty(like.shape[0], like.shape[1], width, dtype=dtype, device=like.device)[..., :kv_len]


SPAN_CHUNK = 64  # query rows whose attention rows exist at once while a span score is reduced


def _record_spans(
    probe: AttentionProbe,
    layer: int,
    query: torch.Tensor,  # [B, H, q, D]
    key: torch.Tensor,  # [B, H_kv, kv, D]
    attention_mask: torch.Tensor | None,  # [B, 1, q, kv], bool or additive (None: causal)
    hidden: torch.Tensor | None,  # bool [B, kv]: keys the row may not see
    scaling: float,
    softcap: float | None,
    kwargs: dict[str, Any],  # the attention function's keyword arguments (``sliding_window``)
) -> None:
    """``span_mass[:, layer]``: the exact eager attention rows (model-dtype matmul, fp32 softmax) of the span
    score's query positions, averaged over those rows (so passes with different row counts compare, as ICR's
    calibration needs) and summed over each key span. Rows come ``SPAN_CHUNK`` at a time."""
    score, weights, span_mass = probe.settings.span_score, probe.settings.span_weights, probe.span_mass
    assert score is not None and span_mass is not None  # set with the span score (weights: None for unit spans)
    batch, num_heads, q_len, head_dim = query.shape
    num_kv, kv_len = key.shape[1], key.shape[2]
    if batch != 1:
        raise DynheadsError("span scores (re-ranking) need batch size 1")
    first = probe.last_positions[0] - q_len + 1  # absolute position of this pass's first query row
    start, stop = score.query[0] - first, score.query[1] - first
    if start < 0 or stop > q_len:
        raise DynheadsError(
            f"the span score's query positions {score.query[0]}..{score.query[1] - 1} are not all "
            f"in this pass (positions {first}..{first + q_len - 1})"
        )
    offset = probe.last_positions[0] - (kv_len - 1)
    key_positions = torch.arange(kv_len, device=key.device) + offset
    spans = len(score.spans)
    inside = (key_positions >= 0) & (key_positions < (spans if weights is None else weights.shape[0]))
    span_weights = (
        None
        if weights is None
        else torch.where(inside[:, None], weights.to(key.device)[key_positions.clamp(0, weights.shape[0] - 1)], 0.0)
    )  # [kv, S]; None: one span per key
    mask = (
        attention_mask
        if attention_mask is not None
        else _causal_mask(q_len, kv_len, kwargs.get("sliding_window"), query.device)
    )
    groups = num_heads // num_kv
    total = torch.zeros(num_heads, spans, dtype=torch.float32, device=query.device)
    for chunk in range(start, stop, SPAN_CHUNK):
        end = min(chunk + SPAN_CHUNK, stop)
        rows = query[0, :, chunk:end].reshape(num_kv, groups * (end - chunk), head_dim)
        logits = torch.matmul(rows, key[0].transpose(-1, -2)) * scaling  # [H_kv, G * rows, kv]
        logits = logits.view(num_heads, end - chunk, kv_len)
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        visible = mask[0, 0, chunk:end]
        visible = visible if visible.dtype == torch.bool else visible > torch.finfo(visible.dtype).min / 2
        if hidden is not None:
            visible = visible & ~hidden[0][None]
        probs = torch.softmax(logits.masked_fill(~visible[None], float("-inf")), dim=-1, dtype=torch.float32)
        if span_weights is None:  # span s is key position s
            total.index_add_(1, key_positions[inside], probs.sum(dim=1)[:, inside])
        else:
            total += torch.matmul(probs.sum(dim=1), span_weights)  # [H, S]
    span_mass[0, layer] = total / (stop - start)  # the mean over query rows


def _remove_heads(
    output: torch.Tensor,  # [B, H, q, D]
    probe: AttentionProbe,
    layer: int,
    value: torch.Tensor,  # [B, H_kv, kv, D]
    groups: int,
    visible: torch.Tensor | None,  # bool [B or 1, kv]
    kwargs: dict[str, Any],
) -> None:
    """Replace, in place, the last query row of the heads each row removes at ``layer`` (``output [B, H, q, D]``):
    zero, uniform attention over the keys the row may see (``visible``: its last query row's keys), or the
    head's mean output over the row's prompt."""
    settings = probe.settings
    heads = settings.removed_heads[layer].to(output.device)  # heads some row removes
    assert settings.removed is not None  # set with removed_heads
    removed = settings.removed[:, layer].to(output.device)[:, heads, None]  # [R, n, 1]
    last = output[:, heads, -1]  # [B, n, D]
    if settings.ablation_mode == "zero":
        replacement = torch.zeros_like(last)
    elif settings.ablation_mode == "mean":
        if probe.head_means is None:
            raise DynheadsError("mean ablation needs each row's mean head output: prefill the prompt first")
        replacement = probe.head_means[:, layer].to(output.device, output.dtype)[:, heads]  # [B, n, D]
    else:
        key_weight = visible.float() if visible is not None else None
        replacement = _uniform_output(value, groups, heads, 1, key_weight, kwargs)[:, :, 0]
    output[:, heads, -1] = torch.where(removed, replacement, last)


def _last_row_visibility(mask: torch.Tensor | None, hidden: torch.Tensor | None) -> torch.Tensor | None:
    """Bool ``[B or 1, kv]`` of keys the last query may see, or None when it sees every key."""
    visible = None
    if mask is not None:
        row = mask[:, 0, -1]
        visible = row if row.dtype == torch.bool else row > torch.finfo(row.dtype).min / 2
    if hidden is not None:
        visible = ~hidden if visible is None else visible & ~hidden
    return visible


def _all_rows_output(
    module: torch.nn.Module,
    query: torch.Tensor,  # [B, H, q, D]
    key: torch.Tensor,  # [B, H_kv, kv, D]
    value: torch.Tensor,  # [B, H_kv, kv, D]
    attention_mask: torch.Tensor | None,  # [B, 1, q, kv], bool or additive (None: causal)
    hidden: torch.Tensor | None,  # bool [B, kv]
    scaling: float,
    softcap: float | None,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """Outputs of every query row (prefill), through SDPA; chunked eager when logits are soft-capped."""
    q_len, kv_len = query.shape[2], key.shape[2]
    mask = attention_mask
    if hidden is not None:
        if mask is None:
            mask = _causal_mask(q_len, kv_len, kwargs.get("sliding_window"), query.device)
        mask = mask & ~hidden[:, None, None, :]
    if softcap is None:
        extra = {k: v for k, v in kwargs.items() if k not in ("sliding_window", "softcap")}
        out, _ = sdpa_attention_forward(module, query, key, value, mask, 0.0, scaling, **extra)
        return out.transpose(1, 2)  # back to [B, H, q, D]
    # Soft-capped logits (Gemma 2) have no fused kernel: eager in row chunks keeps memory O(chunk x kv).
    groups = query.shape[1] // key.shape[1]
    key_r, value_r = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    chunks = []
    for start in range(0, q_len, 256):
        stop = min(start + 256, q_len)
        logits = torch.matmul(query[:, :, start:stop], key_r.transpose(-1, -2)) * scaling
        logits = torch.tanh(logits / softcap) * softcap
        chunk_mask = (
            mask[:, :, start:stop]
            if mask is not None
            else _causal_mask(q_len, kv_len, kwargs.get("sliding_window"), query.device)[:, :, start:stop]
        )
        logits = logits.masked_fill(~chunk_mask, float("-inf"))
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32).to(value.dtype)
        chunks.append(torch.matmul(probs, value_r))
    return torch.cat(chunks, dim=2)


def _causal_mask(q_len: int, kv_len: int, window: int | None, device: torch.device) -> torch.Tensor:
    """Bool ``[1, 1, q, kv]``: query row r sits at key index kv - q + r."""
    rows = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
    cols = torch.arange(kv_len, device=device)[None, :]
    mask = cols <= rows
    if window:
        mask &= cols > rows - window
    return mask[None, None]


def _uniform_output(
    value: torch.Tensor,  # [B, H_kv, kv, D]
    groups: int,
    heads: torch.Tensor,  # long [n]: query heads
    q_len: int,
    key_weight: torch.Tensor | None,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """``[B, len(heads), q, D]``: each query row's mean of the values it may see (causal, window, hidden).

    ``key_weight``: float ``[B or 1, kv]``, 1 for keys that may be seen (hidden keys, pads), or None for all.
    """
    kv_heads = heads // groups
    values = value[:, kv_heads].float()  # [B, n, kv, D]
    kv_len = values.shape[2]
    weight = torch.ones(1, kv_len, device=values.device) if key_weight is None else key_weight
    sums = torch.cumsum(values * weight[:, None, :, None], dim=2)
    counts = torch.cumsum(weight, dim=-1)  # [B or 1, kv]
    ends = torch.arange(kv_len - q_len, kv_len, device=values.device)
    window = kwargs.get("sliding_window")
    total, count = sums[:, :, ends], counts[:, ends]
    if window:
        starts = ends - window  # last index *outside* the window
        inside = starts >= 0
        starts = starts.clamp_min(0)
        total = total - sums[:, :, starts] * inside[None, None, :, None]
        count = count - counts[:, starts] * inside
    return (total / count.clamp_min(1)[:, None, :, None]).to(value.dtype)


def needle_values(
    probe: AttentionProbe,
    probs: torch.Tensor,  # float32 [B, H, kv], the last query row of every head
    value: torch.Tensor,  # [B, H_kv, kv, D]
    kv_len: int,
) -> torch.Tensor:
    """Float32 ``[B, H, D]``: each head's output from its needle keys, ``sum_j a_j v_j`` over the needle keys this
    layer holds: a gather of those few keys (``KeyMasks.needle_gather``), not a pass over all of them."""
    batch, num_heads, _ = probs.shape
    num_kv, head_dim = value.shape[1], value.shape[-1]
    row_index, value_index, inside = probe.keys.needle_gather(kv_len, probs.device, num_heads, value.shape)
    count = row_index.shape[-1]
    weights = probs.gather(2, row_index).mul_(inside).view(batch * num_kv, num_heads // num_kv, count)
    values = value.gather(2, value_index).view(batch * num_kv, count, head_dim)
    if values.dtype != torch.float32:
        values = values.float()
    return torch.bmm(weights, values).view(batch, num_heads, head_dim)


def record_layer_attention(
    probe: AttentionProbe,
    layer: int,
    probs: torch.Tensor,
    kv_len: int,
    values: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Reduce the ``[B, H, kv]`` fp32 rows of one layer (pad keys have probability 0), on the device: the most
    attended key, and one matrix product of the rows p and p log p with ``KeyMasks.weights`` (the masses on the needle
    / excluded / kept / context keys, the context's sum of p log p, the row sums); ``values``: the heads' outputs
    from their needle keys (``needle_values``) and whole (None: a pass that does not measure them,
    ``Measure.head_outputs``). ``AttentionProbe.stats`` joins the layers of a pass."""
    keys = probe.keys
    max_prob, argmax = probs.max(dim=-1, keepdim=True)
    plogp = probs * torch.log(probs.clamp_min(1e-30))
    reduction = LayerReduction(
        max_prob=max_prob,
        argmax=argmax,
        first_position=keys.first_position(kv_len, probs.device),
        sums=torch.bmm(torch.cat([probs, plogp], dim=1), keys.weights(kv_len, probs.device)),
        needle_values=values[0] if values is not None else None,
        head_values=values[1] if values is not None else None,
    )
    probe.record_layer(layer, reduction)
    for lyr, head in probe.settings.rows_for:
        if lyr == layer:
            for b, last in enumerate(probe.last_positions):
                offset = last - (kv_len - 1)
                row = torch.zeros(last + 1, dtype=torch.float32, device=probs.device)
                row[max(offset, 0) :] = probs[b, head, max(-offset, 0) :]
                probe.rows[b][(lyr, head)] = row


def _register() -> None:
    AttentionInterface.register(ATTN_NAME, probe_attention)
    AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)


_register()


@contextmanager
def attached(model: PreTrainedModel, probe: AttentionProbe) -> Iterator[dict[str, AttentionProbe]]:
    """Route the model's attention through the probe function for the block; gives the forward keyword arguments
    that carry ``probe`` to it: ``with attached(model, probe) as probe_kwargs: model(ids, **probe_kwargs)``."""
    with routed(model):
        yield {PROBE_KWARG: probe}


@contextmanager
def routed(model: PreTrainedModel) -> Iterator[None]:
    """Route the model's attention through the probe function for the block (a forward without the probe's keyword
    argument runs plain attention); inside another such block nothing changes. Switching costs a walk over every
    module (about 0.8 ms for an 8B-shaped model's 423 on a CPU), so a decoding loop routes once for all its passes."""
    previous = model.config._attn_implementation
    if previous == ATTN_NAME:
        yield
        return
    model.set_attn_implementation(ATTN_NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
