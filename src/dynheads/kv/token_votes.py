"""Retrieval heads choose the tokens: a token-level KV policy where chosen heads vote on the prompt's tokens.

After the prefill of the prompt minus its last token (as ``kv.retention`` and ``presses.press_generate`` prefill),
the voting heads' attention rows from the last ``window`` prefilled positions (the observation window: on a chat
prompt the question and the chat suffix) are averaged, over those rows and over the voters, into one vote per key
before the window; the votes are smoothed by a mean over ``pool`` neighbouring keys (SnapKV's pooling, so a kept
token brings its neighbours: a needle is several tokens) and, with a ``span``, carried forward: a key scores the best
pooled vote among itself and the ``span`` keys before it, so a voted token keeps the ``span`` tokens that follow it (a
question's rows go to the cue of a fact, "The magic word is", more than to the fact after it; without a span the
cue is kept and the fact's middle dropped). Every KV head then keeps the same tokens: the first
``sink``, the last ``max(window, recent)`` and the best-voted others, ``int(n * (1 - ratio))`` in all for a
compression ratio ``ratio`` (kvpress's count, so its resident bytes equal a kvpress press's at the same ratio).

The rows are the attention probe's exact ones (model-dtype matmul, fp32 softmax over every key the row sees): a
``scores.SpanScore`` with one span per key (``SpanScore.per_key``: the rows are added up per key, memory linear in
the prompt's length), measured in the prefill pass itself (no ``output_attentions``).
``presses.head_tokens_press`` is the same policy as a kvpress press; ``tests/test_kvpress.py`` checks that both keep
the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from dynheads.engine.decoding import DecodingSession
from dynheads.engine.probe import Measure
from dynheads.errors import DynheadsError
from dynheads.heads import Head
from dynheads.models import LoadedModel
from dynheads.scores import SpanScore

WINDOW = 32  # observation window: the last prefilled positions whose rows vote (SnapKV's default is 64)
POOL = 5  # keys averaged around each vote (SnapKV's kernel)
VOTERS = 8  # the static list's best positive-score query heads vote
SPAN = 32  # kvpress:head_spans: keys a vote carries forward (chosen on the fitting stream: docs/kv.md)


def kept_count(length: int, ratio: float) -> int:
    """Tokens every KV head keeps of ``length`` at compression ratio ``ratio`` (kvpress's ``compute_n_kept``)."""
    if not 0 <= ratio < 1:
        raise DynheadsError(f"a compression ratio is in [0, 1), got {ratio}")
    return int(length * (1 - ratio))


def token_scores(
    votes: torch.Tensor, length: int, *, sink: int, recent: int, pool: int = POOL, span: int = 0
) -> torch.Tensor:
    """Float ``[length]``: ``votes`` (one per key before the observation window, ``[length - window]``) pooled over
    ``pool`` neighbours and carried ``span`` keys forward (``carried``), the window and the last ``recent`` keys
    above every vote (the latest highest), the first ``sink`` above them: a top-k keeps sinks, then recent tokens,
    then the best votes, without ties among the protected ones."""
    if pool < 1 or pool % 2 == 0:
        raise DynheadsError(f"the vote pooling is an odd number of keys, got {pool}")
    votes = votes.float()
    pooled = F.avg_pool1d(votes[None, None], pool, stride=1, padding=pool // 2)[0, 0] if pool > 1 else votes
    pooled = carried(pooled, span)
    scores = torch.cat([pooled, torch.zeros(length - len(votes), device=votes.device)])
    top = float(pooled.max()) + 1 if len(pooled) else 1.0
    positions = torch.arange(length, device=votes.device, dtype=torch.float32)
    protected = positions >= min(len(votes), length - recent)
    scores = torch.where(protected, top + 1 + positions / length, scores)
    return torch.where(positions < sink, top + 3 - positions / length, scores)


def carried(scores: torch.Tensor, span: int) -> torch.Tensor:
    """Each key's best score among itself and the ``span`` keys before it, along the last dimension (``span`` 0:
    the scores unchanged)."""
    if span < 0:
        raise DynheadsError(f"a vote's span is a number of keys >= 0, got {span}")
    if span == 0 or not scores.shape[-1]:
        return scores
    rows = scores.reshape(-1, 1, scores.shape[-1])
    padded = F.pad(rows, (span, 0), value=float(scores.min()))
    return F.max_pool1d(padded, span + 1, stride=1).reshape(scores.shape)


def keep(scores: torch.Tensor, ratio: float) -> list[int]:
    """The positions a top-k over ``scores`` keeps at compression ratio ``ratio``, ascending."""
    return sorted(scores.topk(kept_count(len(scores), ratio)).indices.tolist())


def window_votes(lm: LoadedModel, input_ids: Sequence[int], voters: Sequence[Head], window: int) -> torch.Tensor:
    """``[n - window]``: the voters' attention from the last ``window`` positions of the prefill (the prompt minus
    its last token, n tokens) on each key before them, averaged over those rows and over the voters."""
    if getattr(input_ids, "ndim", 1) != 1:  # a tokenizer's [1, n] tensor
        shape = tuple(getattr(input_ids, "shape", ()))
        raise DynheadsError(f"give the prompt's token ids as one sequence, not shape {shape} (ids[0])")
    length = len(input_ids) - 1
    check_votes(lm, length, voters, window)
    session = DecodingSession(lm, input_ids, max_new_tokens=1)
    measure = Measure(span=SpanScore.per_key((length - window, length), length))
    mass = session.forward(length, measure).stats.span_mass  # [L, H, n]: each key its own span
    assert mass is not None  # measured under the pass's span score
    layers, heads = zip(*voters, strict=True)
    return mass[list(layers), list(heads), : length - window].float().mean(0)


def check_votes(lm: LoadedModel, length: int, voters: Sequence[Head], window: int) -> None:
    """One-line errors for no voters, a head the model lacks, or a window the prefill cannot hold."""
    if not voters:
        raise DynheadsError("the head-guided token policy needs voting heads (a static head list: --static FILE)")
    bad = [h for h in voters if not (0 <= h[0] < lm.num_layers and 0 <= h[1] < lm.num_heads)]
    if bad:
        raise DynheadsError(f"voting head {bad[0]} is outside {lm.num_layers} layers x {lm.num_heads} heads")
    if not 0 < window < length:
        raise DynheadsError(f"the observation window ({window}) must be shorter than the prefill ({length} tokens)")


def head_tokens(
    lm: LoadedModel,
    input_ids: Sequence[int],
    voters: Sequence[Head],
    ratio: float,
    *,
    sink: int,
    recent: int,
    window: int = WINDOW,
    pool: int = POOL,
    span: int = 0,
) -> list[int]:
    """The prefill positions every KV head keeps under the head-guided token policy, ascending."""
    votes = window_votes(lm, input_ids, voters, window)
    return keep(token_scores(votes, len(input_ids) - 1, sink=sink, recent=recent, pool=pool, span=span), ratio)
