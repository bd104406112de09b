"""The ``Trace`` of one generation, and its columnar file format.

File format (documented in docs/formats.md): one Parquet file per sample, one row per generated token.

| column | type | meaning |
|---|---|---|
| ``step`` | int32 | 0-based generation step |
| ``token_id`` / ``token`` | int64 / str | the emitted token and its text |
| ``argmax_pos`` | list<int32>[L*H] | absolute position of each head's most-attended key |
| ``copy_score`` | list<bool>[L*H] | Eq. 1 |
| ``needle_mass`` | list<float32>[L*H] | attention mass on the needle positions |
| ``reasoning_score`` | list<float32>[L*H] | Eq. 2 |
| ``write_score`` | list<float32>[L*H] | the write score (logits; ``dynheads.scores.write_scores``; when asked for) |
| ``<name>_score`` | list<bool or float32>[L*H] | every other registered head score (``dynheads.scores.HEAD_SCORES``) |
| ``max_prob`` | list<float32>[L*H] | attention weight on the argmax key |
| ``hidden`` | list<float32>[D] | final-layer hidden state of the last input position |
| ``context_mass`` | list<float32>[L*H] | attention mass on the prompt positions (optional: newer traces) |
| ``context_entropy`` | list<float32>[L*H] | entropy (nats) of the attention renormalised over the prompt (optional) |
| ``token_entropy`` / ``token_max_prob`` | float32 | entropy (nats) / top probability of the step's softmax (optional) |
| ``token_prob`` | float32 | probability the step's softmax gives the emitted token (optional; < max under forcing) |
| ``chance`` | float32 | Eq. 2 score of a uniform head: needle keys / keys outside sink and local (optional) |

Head vectors are layer-major: element ``l * H + h`` is head ``L{l}-H{h}``. The file's schema metadata holds
``format_version`` (``TRACE_FORMAT_VERSION``; absent = 1), ``num_layers``, ``num_heads``, ``prompt_length``,
``stop_reason``, the generated ``text``, ``scores``, the names of the head-score columns (absent: ``copy`` and
``reasoning``, the two every trace holds) and ``prompt_ids``, the prompt's token ids (absent in traces written
before it was kept). A score column is bool for a binary score, float32 otherwise.

``Trace.looked_at`` reads a trace the way a person asks it: at each generated token, which heads retrieved (D_t)
and which position and token each one attended.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dynheads.errors import DynheadsError
from dynheads.io import atomic_path, format_version
from dynheads.scores import DEFAULT_REASONING_THRESHOLD, ScoreKind, ScoreSpec, active_heads

# 1: no format_version key, no optional columns (files before they existed); 2: the optional columns may be present
TRACE_FORMAT_VERSION = 2
HEAD_FIELDS = ("argmax_pos", "needle_mass", "max_prob")
OPTIONAL_HEAD_FIELDS = ("context_mass", "context_entropy")  # absent from older traces: loaded as None
OPTIONAL_STEP_FIELDS = ("token_entropy", "token_max_prob", "chance", "token_prob")
_DTYPES = {
    "argmax_pos": np.int32,
    "needle_mass": np.float32,
    "max_prob": np.float32,
    "context_mass": np.float32,
    "context_entropy": np.float32,
}
FIRST_SCORES = ("copy", "reasoning")  # the scores of files written before the ``scores`` key


class LookedAt(NamedTuple):
    """One active head at one generated token: where it looked (its most-attended key) and what token is there."""

    step: int  # 0-based generation step
    generated: str  # the token emitted at that step
    head: str  # "layer-head", e.g. "12-3"
    position: int  # absolute key position (at or past ``prompt_length``: a generated token)
    token_id: int | None  # the token at that position (None: the prompt's ids are not in this trace)
    token: str | None  # its text (None without a tokenizer for a prompt position, or without the ids)


@dataclass
class Trace:
    """Per-step measurements of one greedy generation. T = generated tokens (stop token excluded)."""

    tokens: np.ndarray  # [T] int64
    token_texts: list[str]  # [T]
    text: str
    argmax_pos: np.ndarray  # [T, L, H] int32, absolute key position
    scores: dict[str, np.ndarray]  # head score name -> [T, L, H], bool (binary) or float32; "copy" and "reasoning"
    needle_mass: np.ndarray  # [T, L, H] float32
    max_prob: np.ndarray  # [T, L, H] float32, attention weight on argmax_pos
    hidden: np.ndarray  # [T, D] float32
    prompt_length: int
    stop_reason: str  # "eos" | "max_new_tokens" | "forced" (teacher-forced response)
    context_mass: np.ndarray | None = None  # [T, L, H] float32, attention mass on the prompt positions
    token_entropy: np.ndarray | None = None  # [T] float32, entropy (nats) of the step's next-token softmax
    token_max_prob: np.ndarray | None = None  # [T] float32, largest probability of that softmax
    chance: np.ndarray | None = None  # [T] float32, Eq. 2 chance share; None in files written before it existed
    context_entropy: np.ndarray | None = None  # [T, L, H] float32, entropy of the attention over the prompt
    token_prob: np.ndarray | None = None  # [T] float32, probability of the emitted token (teacher forcing: < max)
    prompt_ids: np.ndarray | None = None  # [prompt_length] int64, the prompt's tokens; None in older files

    @property
    def num_steps(self) -> int:
        """T, the generated tokens (the stop token excluded)."""
        return int(self.tokens.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, heads)."""
        return int(self.argmax_pos.shape[1]), int(self.argmax_pos.shape[2])

    @property
    def copy_scores(self) -> np.ndarray:
        """``[T, L, H]`` bool, Eq. 1."""
        return self.scores["copy"]

    @property
    def reasoning_scores(self) -> np.ndarray:
        """``[T, L, H]`` float32, Eq. 2."""
        return self.scores["reasoning"]

    def prompt_digest(self) -> str | None:
        """The first 16 hex digits of the SHA-256 of the prompt's token ids: the same prompt, whatever was generated
        from it, has the same digest (what a detector records of the traces it was fitted on); None in a trace
        written before it held the prompt's ids."""
        if self.prompt_ids is None:
            return None
        return hashlib.sha256(np.asarray(self.prompt_ids, dtype=np.int64).tobytes()).hexdigest()[:16]

    def dynamic_heads(self, step: int) -> list[tuple[int, int]]:
        """D_t of Eq. 1: the ``(layer, head)`` pairs whose copy score is 1 at ``step`` (negative: from the end, as
        a list index), in layer-major order; a step outside the trace is refused in one line."""
        return active_heads(self.copy_scores[self._step_index(step)])

    def _step_index(self, step: int) -> int:
        """``step`` as an index into this trace's steps, or one line saying it is none."""
        if isinstance(step, bool) or not isinstance(step, int | np.integer):
            raise DynheadsError(f"step must be an integer, got {type(step).__name__} {step!r}")
        if not -self.num_steps <= step < self.num_steps:
            raise DynheadsError(f"step {step} is outside this trace's {self.num_steps} generated tokens")
        return int(step) % self.num_steps

    def looked_at(
        self,
        step: int | None = None,
        tokenizer: Any = None,
        *,
        score: ScoreKind = "copy",
        threshold: str = DEFAULT_REASONING_THRESHOLD,
    ) -> list[LookedAt]:
        """Per active head of ``step`` (None: of every step, in order), the position and token it attended most.

        Active = Eq. 1 copy score 1 (``score="copy"``, D_t) or another registered score above ``threshold``.
        ``tokenizer`` gives the text of prompt tokens (generated ones are named without it): a tokenizer, or what
        holds one (``dynheads.load_tokenizer()``, a loaded model);
        ``pandas.DataFrame(trace.looked_at(tokenizer=lm.tokenizer))`` is the table of heads per generated token."""
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a LoadedTokenizer or LoadedModel: the one it holds
        if tokenizer is not None and not callable(getattr(tokenizer, "decode", None)):
            raise DynheadsError(
                "looked_at(tokenizer=...) takes a tokenizer (or dynheads.load_tokenizer()), "
                f"got {type(tokenizer).__name__}"
            )
        steps = range(self.num_steps) if step is None else [self._step_index(step)]
        active = ScoreSpec(score, threshold).active(self.scores, self.chance)
        return [self._looked(t, layer, head, tokenizer) for t in steps for layer, head in active_heads(active[t])]

    def _looked(self, step: int, layer: int, head: int, tokenizer: Any) -> LookedAt:
        position = int(self.argmax_pos[step, layer, head])
        token_id: int | None
        if position >= self.prompt_length:  # a generated token: its id and text are in this trace
            token_id = int(self.tokens[position - self.prompt_length])
            text: str | None = self.token_texts[position - self.prompt_length]
        else:
            token_id = None if self.prompt_ids is None else int(self.prompt_ids[position])
            text = None if token_id is None or tokenizer is None else tokenizer.decode([token_id])
        return LookedAt(step, self.token_texts[step], f"{layer}-{head}", position, token_id, text)

    def save(self, path: str | Path) -> None:
        """Write the trace as Parquet, atomically (a crash never leaves a half-written file)."""
        steps, layers, heads = self.argmax_pos.shape
        columns = {
            "step": pa.array(np.arange(steps, dtype=np.int32)),
            "token_id": pa.array(self.tokens.astype(np.int64)),
            "token": pa.array(self.token_texts, type=pa.string()),
        }
        for name in HEAD_FIELDS:
            columns[name] = _list_column(getattr(self, name).reshape(steps, layers * heads).astype(_DTYPES[name]))
        for name, values in self.scores.items():
            dtype = np.bool_ if values.dtype == np.bool_ else np.float32
            columns[f"{name}_score"] = _list_column(values.reshape(steps, layers * heads).astype(dtype))
        for name in OPTIONAL_HEAD_FIELDS:
            if getattr(self, name) is not None:
                columns[name] = _list_column(getattr(self, name).reshape(steps, layers * heads).astype(np.float32))
        for name in OPTIONAL_STEP_FIELDS:
            if getattr(self, name) is not None:
                columns[name] = pa.array(np.asarray(getattr(self, name), dtype=np.float32).reshape(steps))
        columns["hidden"] = _list_column(self.hidden.astype(np.float32))
        meta = {
            "format_version": TRACE_FORMAT_VERSION,
            "num_layers": layers,
            "num_heads": heads,
            "prompt_length": self.prompt_length,
            "stop_reason": self.stop_reason,
            "text": self.text,
            "scores": list(self.scores),
            **({"prompt_ids": [int(i) for i in self.prompt_ids]} if self.prompt_ids is not None else {}),
        }
        table = pa.table(columns).replace_schema_metadata({"dynheads": json.dumps(meta)})
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace file written by ``save`` (docs/formats.md). A path that is no file, a file that is not
        Parquet, a Parquet file without dynheads' schema metadata or of a newer format version is refused in one
        line (``DynheadsError``)."""
        table, meta = _read_trace_table(path)
        format_version(meta.get("format_version"), TRACE_FORMAT_VERSION, "trace file", path)
        layers, heads = meta["num_layers"], meta["num_heads"]
        steps = table.num_rows

        def head_array(name: str, dtype=None) -> np.ndarray:
            flat = _flatten(table.column(name), dtype or _DTYPES[name])
            return flat.reshape(steps, layers, heads)

        def score_array(name: str) -> np.ndarray:
            binary = pa.types.is_boolean(table.schema.field(f"{name}_score").type.value_type)
            return head_array(f"{name}_score", np.bool_ if binary else np.float32)

        hidden = _flatten(table.column("hidden"), np.float32)
        names = set(table.column_names)
        optional = {name: head_array(name) if name in names else None for name in OPTIONAL_HEAD_FIELDS}
        optional |= {
            name: table.column(name).to_numpy().astype(np.float32) if name in names else None
            for name in OPTIONAL_STEP_FIELDS
        }
        return cls(
            tokens=table.column("token_id").to_numpy().astype(np.int64),
            token_texts=table.column("token").to_pylist(),
            text=meta["text"],
            argmax_pos=head_array("argmax_pos"),
            scores={name: score_array(name) for name in meta.get("scores", FIRST_SCORES)},
            needle_mass=head_array("needle_mass"),
            max_prob=head_array("max_prob"),
            hidden=hidden.reshape(steps, -1) if steps else np.zeros((0, _width(table, "hidden")), np.float32),
            prompt_length=meta["prompt_length"],
            stop_reason=meta["stop_reason"],
            prompt_ids=np.asarray(meta["prompt_ids"], dtype=np.int64) if "prompt_ids" in meta else None,
            **optional,
        )


def _width(table: pa.Table, name: str) -> int:
    """The width of a fixed-width list column (what a trace of no steps still records of its hidden size)."""
    kind = table.schema.field(name).type
    return int(kind.list_size) if isinstance(kind, pa.FixedSizeListType) else 0


def _read_trace_table(path: str | Path) -> tuple[pa.Table, dict]:
    """The Parquet table of a trace file and its ``dynheads`` metadata, or one line saying why it is none."""
    if not Path(path).is_file():
        raise DynheadsError(f"no trace file {path}" + (" (it is a folder)" if Path(path).is_dir() else ""))
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DynheadsError(f"{path} is not a readable Parquet file: {reason}") from None
    raw = (table.schema.metadata or {}).get(b"dynheads")
    try:
        meta = json.loads(raw) if raw is not None else None
    except ValueError:
        meta = None
    if not isinstance(meta, dict):
        raise DynheadsError(f"{path} is not a dynheads trace file (no readable 'dynheads' schema metadata)")
    return table, meta


def _list_column(values: np.ndarray) -> pa.Array:
    """``[rows, width]`` numpy array to a fixed-width list column."""
    rows, width = values.shape
    return (
        pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), width)
        if rows
        else pa.array([], type=pa.list_(pa.from_numpy_dtype(values.dtype), width))
    )


def _flatten(column: pa.ChunkedArray, dtype) -> np.ndarray:
    if column.num_chunks == 0 or len(column) == 0:
        return np.zeros(0, dtype=dtype)
    return np.concatenate([chunk.flatten().to_numpy(zero_copy_only=False) for chunk in column.chunks]).astype(dtype)
