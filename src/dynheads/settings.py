"""The settings of every model-loading command, composed from small frozen pieces declared once.

Pieces: ``ModelSettings`` (model, dtype, device), ``Seeded`` (seed), ``NiahCells`` / ``NiahGrid`` (the NIAH
lengths x depths (x runs) grid), ``QaGrid`` (a question stream over a context-length x depth grid) and
``TracingSettings`` (chat template, Eq. 2 windows). A command's config inherits the pieces it takes and declares
its own fields; a piece's field with another default is ``redefault(Piece, name, value)`` (same help).

This module imports nothing heavy (no torch): the CLI builds its options from these fields at start-up.
Configs whose runners need more than their fields (``KVConfig``, ``RagConfig``, ``RerankConfig``) subclass the
``*Fields`` classes here in their experiment module; the two ablations' configs (``AblationConfig``,
``ProgressiveConfig``) live here, since both Claim 2 designs (the matched grid and the dose-response) read them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from dynheads.ablation.strategies import ABLATION_STRATEGIES, MATCHINGS, counting_strategy, dose_key
from dynheads.analysis.evidence import DEFAULT_FLOOR, DEFAULT_RESAMPLES
from dynheads.analysis.kvheads import AGGREGATIONS
from dynheads.analysis.settings import FEATURE_SETS
from dynheads.config import pieces_of, redefault, setting
from dynheads.errors import DynheadsError, did_you_mean
from dynheads.kv.policies import KV_POLICIES
from dynheads.kv.press_registry import KVPRESS_PRESSES, TRACKS
from dynheads.rag.rerank_strategies import RERANK_STRATEGIES
from dynheads.rag.strategies import PAPER_STRATEGIES, RAG_STRATEGIES
from dynheads.rag.trigger import TriggerConfig
from dynheads.rag.windows import RetrievalConfig
from dynheads.tasks.questions import QuestionStream
from dynheads.thresholds import DEFAULT_REASONING_THRESHOLD, FITTED, LOCAL_WINDOW, SINK_SIZE, ReasoningThreshold

if TYPE_CHECKING:
    from dynheads.engine.probe import AblationMode
    from dynheads.scores import ScoreKind
    from dynheads.tasks.registry import Task

STATIC_SPLIT = "static"  # the seed / question stream static heads are scored on


# ---- pieces ----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSettings:
    model: str | None = setting(
        None,
        "hub id, local folder, .gguf file, qwen2.5-coder-0.5b or qwen2.5-coder-1.5b (packaged); None = the embedded "
        "SmolLM2",
    )
    dtype: str = setting("auto", "model dtype: auto (the checkpoint's), float32, bfloat16, float16")
    device: str | None = setting(None, "cpu or cuda; None picks cuda when available")


@dataclass(frozen=True)
class Seeded:
    seed: int = setting(0, "master seed; every sample (and random head draw) derives its seed from it")


@dataclass(frozen=True)
class NiahCells(Seeded):
    lengths: tuple[int, ...] = setting((500, 1000, 2000), "haystack lengths in tokens, e.g. 500,1000,2000")
    depths: tuple[float, ...] = setting((0.0, 0.25, 0.5, 0.75, 1.0), "needle depths in [0, 1], e.g. 0,0.5,1")
    max_new_tokens: int = setting(48, "generation budget per sample (a UUID is ~35 tokens)")
    haystack: str | None = setting(None, "folder of .txt files; None = Paul Graham essays")


@dataclass(frozen=True)
class NiahGrid(NiahCells):
    runs: int = setting(1, "samples (different needle and seed) per (length, depth) cell")


@dataclass(frozen=True)
class QaGrid(Seeded):
    data: str | None = setting(
        None,
        "the task's data. hotpotqa: a HotpotQA JSON/JSONL file or saved dataset, hotpotqa-dev = the official dev set "
        "(packaged), None = synthetic questions; custom: your JSONL, one {id, context, question, answer, spans?} "
        "per line (docs/own-data.md); multihop / kv_lookup: multihop[:hops=2,...]; variable_tracking / vt_lookup / "
        "multikey_niah: variable_tracking[:hops=1,chains=3,...] or multikey_niah[:...] (docs/ruler.md); niah reads "
        "none",
    )
    questions: int = setting(45, "questions of the stream, spread over the grid cells")
    first: int = setting(0, "index of the stream's first question in the data (streams must not overlap)")
    lengths: tuple[int, ...] = setting((250, 500, 1000), "context lengths in tokens, e.g. 250,500,1000")
    depths: tuple[float, ...] = setting((0.05, 0.5, 0.95), "gold paragraphs' depths in [0, 1], e.g. 0.05,0.5,0.95")
    max_new_tokens: int = setting(24, "generation budget per question")
    pad: bool = setting(
        True,
        "HotpotQA: place the gold paragraphs at each depth among distractors, padded to each length; "
        "--no-pad traces each record's own paragraphs as written (lengths and depths do not apply)",
    )


@dataclass(frozen=True)
class WriteScoreSetting:
    write_score: bool = setting(
        False,
        "also record the write score (LOCOS, per step; any registered score that reads the heads' outputs): "
        "measures each head's output at every step, 2-5 % of a traced step on a CPU (BENCHMARKS.md)",
    )


@dataclass(frozen=True)
class TracingSettings(WriteScoreSetting):
    chat_template_kwargs: str = setting(
        "",
        "JSON object of chat-template variables over the pinned ones "
        '(enable_thinking false, date_string "26 Jul 2024"), '
        "e.g. '{\"enable_thinking\": true}'",
    )
    sink_size: int = setting(SINK_SIZE, "Eq. 2: first tokens excluded as attention sink")
    local_window: int = setting(LOCAL_WINDOW, "Eq. 2: last tokens excluded as local attention")


# ---- tracing: niah, hotpotqa -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NiahConfig(TracingSettings, NiahGrid, ModelSettings):
    distractor_depth: float | None = setting(
        None, "depth of a 'The secret word is <similar UUID>' distractor; None = none"
    )
    distractor_prefix: int = setting(8, "characters the distractor UUID shares with the needle")
    split: str = setting("analysis", "seed stream; 'static' samples are disjoint")


@dataclass(frozen=True)
class HotpotConfig(TracingSettings, QaGrid, ModelSettings):
    split: str = setting("analysis", "name of the question stream (recorded)")

    def stream(self) -> QuestionStream:
        """Questions ``first .. first + questions - 1`` of the data, named ``split``."""
        return QuestionStream(self.split, self.first, self.questions)


# ---- static heads: static, static-reasoning ------------------------------------------------------------------------
@dataclass(frozen=True)
class StaticConfig(WriteScoreSetting, NiahCells, ModelSettings):
    """Settings of a static-head run; ``niah_config()`` is the NIAH grid it traces."""

    samples: int = setting(20, "NIAH tests, rounded up to whole passes of the grid")
    success_threshold: float = setting(
        0.5, "a test counts if the ROUGE-1 recall of the answer (a task without it: its first metric) exceeds this"
    )
    task: str = setting("niah", "the needle task whose static stream is traced (niah, spelled_niah, ...)")
    score: str = setting(
        "copy",
        "copy: Wu et al.'s retrieval score (static_heads.json); another registered score (write: LOCOS-style pooled "
        "write heads) ranks heads by its mean over steps, then over counted tests (static_heads-<score>.json)",
    )

    def niah_config(self) -> NiahConfig:
        """The NIAH grid this config traces (``runs`` = ceil(samples / cells)), with the heads' outputs when
        asked for or when ``score`` reads them (the write score: one static run scored by several scores is
        traced with ``--write-score`` once)."""
        from dynheads.scores import reads_head_outputs  # torch: not at the CLI's start-up

        cells = len(self.lengths) * len(self.depths)
        if self.samples < 1 or cells == 0:
            raise DynheadsError("static heads need --samples >= 1 and at least one length and one depth")
        return NiahConfig(
            **pieces_of(self, NiahCells, ModelSettings),
            runs=math.ceil(self.samples / cells),
            split=STATIC_SPLIT,
            write_score=self.write_score or reads_head_outputs(self.score),
        )


@dataclass(frozen=True)
class StaticReasoningConfig(QaGrid, ModelSettings):
    """Settings of a static reasoning-head run: a HotpotQA stream traced with Eq. 2, averaged per head."""

    success_f1: float = setting(-1.0, "a question counts if its F1 exceeds this; -1 = all")

    def hotpot_config(self) -> HotpotConfig:
        """The HotpotQA stream this config traces (named ``static``)."""
        return HotpotConfig(**pieces_of(self, QaGrid, ModelSettings), split=STATIC_SPLIT)


# ---- a registered task's grid: ablate, ablate-progressive, kv ---------------------------------------------------
class TaskGridChoice:
    """What a config that names a registered ``task`` (with the NIAH grid and question-stream pieces) derives: the
    task, its grid's config and the check of a user's data file. Each config says which NIAH seed stream it reads
    (``niah_config``); a question task's stream is named ``split``."""

    task: str
    data: str | None
    split: str

    def niah_config(self) -> NiahConfig:
        raise NotImplementedError

    def task_entry(self) -> Task:
        """The registered task of ``task`` (and ``data``: HotpotQA with multihop data is the multi-hop task)."""
        from dynheads.tasks.registry import task_of  # its score vocabulary imports torch: not at the CLI's start-up

        return task_of(self.task, self.data)

    def hotpot_config(self) -> HotpotConfig:
        """The question stream the task reads (as ``dynheads hotpotqa``), named ``split``."""
        return HotpotConfig(**pieces_of(self, QaGrid, ModelSettings), split=self.split)

    def task_config(self) -> NiahConfig | HotpotConfig:
        """The config of the task's grid: a question stream's, or runs per cell."""
        return self.hotpot_config() if self.task_entry().questions else self.niah_config()

    def check_task(self) -> None:
        """An unknown task fails before any work; a user's data file is checked, every record, before a model loads."""
        task = self.task_entry()
        if task.check_data is not None:
            task.check_data(self.task_config())


# ---- ablation: ablate, ablate-progressive --------------------------------------------------------------------------
@dataclass(frozen=True)
class AblationGrid(NiahGrid, QaGrid, ModelSettings):
    """Settings shared by both ablations: the task's grid (NIAH's lengths and depths by default; the question
    stream for HotpotQA), the model, the static list and the masking mode."""

    task: str = setting(
        "niah", "a registered task (docs/tasks.md): niah (D_t by Eq. 1), hotpotqa or multihop (Eq. 2 above --threshold)"
    )
    threshold: str = setting(
        DEFAULT_REASONING_THRESHOLD,
        "hotpotqa: a head is dynamic above this Eq. 2 score ('0.1') or multiple of chance ('relative:3')",
    )
    split: str = setting("ablation", "hotpotqa: name of the question stream (recorded)")
    fit_run: str | None = setting(
        None,
        "the traced run a fitted --threshold (calibrated:M, or null:Q on a decoy run such as 'dynheads trace --task "
        "niah_decoy') is fitted on; refused where it shares a sample seed or question with this run's (the fit is "
        "recorded in the manifest)",
    )
    score: str | None = setting(
        None,
        "the head score that decides D_t (default: the task's, Eq. 1 copy on NIAH, Eq. 2 on HotpotQA); write "
        "(W_t) takes an absolute --threshold, or null:0.1 with --fit-run DECOY_RUN",
    )
    runs: int = redefault(NiahGrid, "runs", 2)
    static: str | None = setting(None, "static head list (Wu et al. JSON or ranked list)")
    mode: str = setting(
        "zero",
        "masked value: zero (remove the head's output), uniform (flat attention) or mean (the head's mean output "
        "over the sample's prompt)",
    )


PANEL_PREFIX = "list:"  # a panel list's arm name: list:NAME
# Claim 2 as a dose-response: what is measured under each arm's ceil(f |D_t|) heads per step
DOSE_METRICS = {
    "teacher": "teacher-forced: each step of the clean answer masked alone, drop in log p(clean token), argmax flips",
    "cascade": "greedy continues under masking: the task metric (accuracy / ROUGE-L, EM / F1)",
    "both": "teacher and cascade",
}


@dataclass(frozen=True)
class AblationFields(AblationGrid):
    fractions: tuple[float, ...] = setting(
        (0.25, 0.5, 0.75, 1.0),
        "dose-response: fractions f of each step's own |D_t|; at step t every arm (dynamic, static, static_outside, "
        "random) masks ceil(f |D_t|) heads (none where D_t is empty), f = 1 the paper's operating point, which "
        "decides Claim 2 and must be given; empty ('') = the matched grid of the strategies below (no compensation "
        "then)",
    )
    compensation: tuple[float, ...] = setting(
        (1.5, 2.0),
        "fractions above 1: every arm masks ceil(f |D_t|) heads (dynamic: D_t, then the step's next-ranked heads); "
        "what the network does without D_t's backups (the paper's Figure 3), its own figure, never decisive",
    )
    doses: tuple[int, ...] = setting(
        (), "retired: fixed k heads per step (k past |D_t| measures compensation, not D_t): give fractions instead"
    )
    metric: str = setting(
        "teacher", "dose-response metric: " + "; ".join(f"{name} = {text}" for name, text in DOSE_METRICS.items())
    )
    mode: str = redefault(AblationGrid, "mode", "mean")
    strategies: tuple[str, ...] = setting(
        ("dynamic", "static", "random"),
        f"some of {ABLATION_STRATEGIES.choices()} (none, no masking, always runs too)",
    )
    heads: tuple[str, ...] = setting((), "heads the fixed strategy masks at every step, e.g. 12-3,4-1")
    contrast: str | None = setting(
        None,
        "a second head score for the contrast arm (dose-response) or strategy: the step's top heads by it, its own "
        "active set first, as many as D_t (with --score write, --contrast copy masks as many Eq. 1 heads as W_t)",
    )
    panel: tuple[str, ...] = setting(
        (),
        "dose-response: more head lists as arms, NAME=FILE each (e.g. copy=static_heads.json): at step t each "
        "masks its top k_t heads as static does, so detectors compare at a matched count",
    )
    matching: str = setting(
        "per_step",
        "static/random head count: "
        + "; ".join(f"{entry.name} = {entry.help}" for entry in MATCHINGS)
        + " (mean: the paper's)",
    )


@dataclass(frozen=True)
class ProgressiveFields(AblationGrid):
    ks: tuple[int, ...] = setting((0, 5, 10, 15, 20), "dynamic heads masked per step, e.g. 0,5,10,15,20")
    lengths: tuple[int, ...] = redefault(NiahCells, "lengths", (1000,))
    depths: tuple[float, ...] = redefault(NiahCells, "depths", (0.5,))
    runs: int = redefault(NiahGrid, "runs", 5)
    top_static: int = setting(20, "size of the static top set the compensation is compared with")


class AblationGridConfig(AblationGrid, TaskGridChoice):
    """Settings shared by both experiments (``settings.AblationGrid``) and what they derive from them."""

    def niah_config(self) -> NiahConfig:
        """The NIAH grid whose samples are ablated (the ``analysis`` seed stream, as ``dynheads niah``)."""
        return NiahConfig(**pieces_of(self, NiahGrid, ModelSettings))

    def ablation_mode(self) -> AblationMode:
        """``mode``, which ``check`` accepts only from ``probe.ABLATION_MODES``."""
        return cast("AblationMode", self.mode)

    def score_kind(self) -> ScoreKind:
        """The head score that decides D_t: ``score`` when given, else the task's."""
        from dynheads.scores import check_kind  # torch: not at the CLI's start-up

        return check_kind(self.score) if self.score is not None else self.task_entry().score_kind

    def check(self) -> None:
        from dynheads.engine.probe import ABLATION_MODES  # torch: not at the CLI's start-up
        from dynheads.scores import ScoreSpec

        if self.mode not in ABLATION_MODES:
            raise DynheadsError(f"unknown masking mode {self.mode!r}: use one of {', '.join(ABLATION_MODES)}")
        self.check_task()
        spec = ScoreSpec(self.score_kind(), self.threshold)  # an unknown score or a threshold it cannot take fails here
        fitted = not spec.score.binary and ReasoningThreshold.parse(self.threshold).mode in FITTED
        if self.fit_run is not None and not fitted:
            needs = "is binary and takes no threshold" if spec.score.binary else f"threshold {self.threshold} is fixed"
            raise DynheadsError(
                f"--fit-run fits a calibrated:M or null:Q --threshold, but the {spec.score.label} {needs}: drop it"
            )
        if fitted and self.fit_run is None:
            raise DynheadsError(
                f"the threshold {self.threshold} is fitted on a traced run: give it with --fit-run (null:Q: a decoy "
                "run, e.g. 'dynheads trace --task niah_decoy --split static'), or pass the value it fitted"
            )


@dataclass(frozen=True)
class AblationConfig(AblationFields, AblationGridConfig):
    def run_strategies(self) -> tuple[str, ...]:
        """The strategies to decode, in run order: none, dynamic (needed by static and random), the rest."""
        baselines = {entry.name for entry in ABLATION_STRATEGIES if entry.value.baseline}
        choices = ", ".join(name for name in ABLATION_STRATEGIES.names() if name not in baselines)
        unknown = [s for s in self.strategies if s not in ABLATION_STRATEGIES]
        if unknown:
            hint = did_you_mean(unknown[0], ABLATION_STRATEGIES.names())
            raise DynheadsError(
                f"unknown ablation strategy {', '.join(map(repr, unknown))}: use some of {choices}{hint}"
            )
        if not self.strategies:
            raise DynheadsError(f"give at least one ablation strategy: {choices}")
        # mean-matched controls read their head count from the dynamic run
        controls = [s for s in self.strategies if ABLATION_STRATEGIES.get(s).matched]
        given = MATCHINGS.get(self.matching).given_count
        wanted = {*baselines, *self.strategies} | ({counting_strategy()} if controls and given else set())
        return tuple(s for s in ABLATION_STRATEGIES.names() if s in wanted)

    def check(self) -> None:
        super().check()
        self.check_doses()
        self.panel_lists()
        if self.metric not in DOSE_METRICS:
            raise DynheadsError(f"unknown dose-response metric {self.metric!r}: use one of {', '.join(DOSE_METRICS)}")
        MATCHINGS.check([self.matching])
        strategies = [ABLATION_STRATEGIES.entry(s) for s in self.run_strategies()]
        for entry in strategies:
            if entry.value.needs_static and not self.static:
                raise DynheadsError(f"the {entry.name} strategy needs a static head list: pass --static FILE")
        if self.contrast is not None:
            from dynheads.scores import ScoreSpec  # torch: not at the CLI's start-up

            ScoreSpec(self.contrast)  # ranks at its default threshold: copy, or an attention share such as Eq. 2
        elif any(entry.value.needs_contrast for entry in strategies):
            raise DynheadsError("the contrast strategy needs a second head score to rank by: pass --contrast copy")
        given = [entry.name for entry in strategies if entry.value.needs_heads]
        if bool(given) != bool(self.heads):
            readers = given or [entry.name for entry in ABLATION_STRATEGIES if entry.value.needs_heads]
            raise DynheadsError(f"the {' / '.join(readers)} strategy and --heads go together: give both or neither")

    def panel_lists(self) -> dict[str, str]:
        """The panel's head lists by arm name (``list:NAME``), in the order given; a malformed or repeated entry is
        refused, and so is a panel outside the dose-response."""
        lists: dict[str, str] = {}
        for entry in self.panel:
            name, sep, path = entry.partition("=")
            if not sep or not name.strip() or not path.strip():
                raise DynheadsError(f"--panel takes NAME=FILE entries (copy=static_heads.json), got {entry!r}")
            if not Path(path.strip()).is_file():
                raise DynheadsError(f"--panel: head list not found: {path.strip()}")
            arm = f"{PANEL_PREFIX}{name.strip()}"
            if arm in lists:
                raise DynheadsError(f"--panel names {name.strip()!r} twice")
            lists[arm] = path.strip()
        if lists and not self.fractions:
            raise DynheadsError("--panel adds arms to the dose-response: give --fractions (e.g. 1)")
        return lists

    def check_doses(self) -> None:
        """Fractions in (0, 1] with 1 among them (the operating point), compensation above 1, no fixed doses."""
        if self.doses:
            raise DynheadsError(
                f"fixed doses (doses = {list(self.doses)}) are retired: past |D_t| the dynamic arm masks D_t plus "
                "inert heads while static masks D_t's backups, so k measures compensation; give fractions of each "
                "step's |D_t| (fractions = [0.25, 0.5, 0.75, 1.0], compensation = [1.5, 2.0]; docs/ablation.md)"
            )
        if self.fractions and not all(0 < f <= 1 for f in self.fractions):
            raise DynheadsError(f"dose fractions lie in (0, 1] (--fractions), got {list(self.fractions)}")
        if self.fractions and 1.0 not in self.fractions:
            raise DynheadsError(
                f"the fractions must hold 1 (mask exactly D_t: Claim 2's operating point), got {list(self.fractions)}"
            )
        if not all(f > 1 for f in self.compensation):
            raise DynheadsError(f"compensation fractions lie above 1 (--compensation), got {list(self.compensation)}")
        keys = [dose_key(float(f)) for f in (*self.fractions, *self.compensation)]
        repeated = sorted({key for key in keys if keys.count(key) > 1}, key=float)
        if repeated:  # one name would hold two doses' numbers: the later would overwrite the earlier (f = 1 too)
            raise DynheadsError(
                f"each dose once: {', '.join(repeated)} is given more than once in --fractions / --compensation "
                f"(or as two fractions that agree to 6 digits, which name one dose), got "
                f"{list(self.fractions)} and {list(self.compensation)}"
            )

    def dose_fractions(self) -> tuple[float, ...]:
        """Every fraction the dose-response runs, ascending: the doses, then the compensation part."""
        return tuple(sorted({float(f) for f in (*self.fractions, *self.compensation)}))


@dataclass(frozen=True)
class ProgressiveConfig(ProgressiveFields, AblationGridConfig):
    def check(self) -> None:
        super().check()
        if not self.ks or min(self.ks) < 0:
            raise DynheadsError(f"give one or more k >= 0 (--ks), got {list(self.ks)}")
        if not self.static:
            raise DynheadsError("progressive ablation compares with the static top heads: pass --static FILE")
        if self.top_static < 1:
            raise DynheadsError(f"top_static must be at least 1, got {self.top_static}")


# ---- kv --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KVFields(NiahGrid, QaGrid, ModelSettings):
    task: str = setting(
        "niah",
        "a registered task (docs/tasks.md) whose samples are decoded: niah, or a question task such as "
        "variable_tracking (--data variable_tracking:hops=1,chains=3), multikey_niah or hotpotqa (--data hotpotqa-dev)",
    )
    policies: tuple[str, ...] = setting(
        ("full", "none", "static", "probe", "random", "oracle", "true"),
        f"some of {KV_POLICIES.choices()} or kvpress:<press> (a press of {KVPRESS_PRESSES.choices()}; "
        "'dynheads list kvpress-presses' says what each does)",
    )
    budgets: tuple[float, ...] = setting(
        (0.05, 0.1, 0.25, 0.5), "fractions of the KV heads kept whole, e.g. 0.05,0.1,0.25,0.5"
    )
    ratios: tuple[float, ...] = setting(
        (),
        "kvpress presses at these compression ratios (kvpress's leaderboard: 0.25,0.5,0.75,0.875), the share of the "
        "compressed tokens removed, instead of at each budget's bytes; the dynheads policies keep --budgets",
    )
    sink: int = setting(4, "sink tokens of streaming heads (DuoAttention's code default 4; its patterns 128)")
    recent: int = setting(64, "recent window of streaming heads, current token included")
    static: str | None = setting(None, "static head list (Wu et al. JSON or ranked list)")
    outside_heads: bool = setting(
        False,
        "accept a --static list with no run beside it (a published or trained list, not written by "
        "'dynheads static'): its disjointness from the "
        "evaluation samples is not checked, and the manifest and summary say so",
    )
    probe: str | None = setting(
        None, "trained head predictor folder ('dynheads predictor train'), for the probe policy"
    )
    probe_select: str = setting("top", "probe policy: top (k heads) or threshold")
    track: str = setting(
        "question-aware",
        "what the kvpress presses compress (kvpress's leaderboard tracks): "
        + "; ".join(f"{name} = {text}" for name, text in TRACKS.items())
        + " (the dynheads policies act while decoding and see the whole prompt either way)",
    )
    lengths: tuple[int, ...] = redefault(NiahCells, "lengths", (1000,))
    runs: int = redefault(NiahGrid, "runs", 2)
    split: str = setting("analysis", "seed stream of the evaluation samples (a question task: the stream's name)")
    max_new_tokens: int = redefault(NiahCells, "max_new_tokens", 40)


# ---- rag -----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RagFields(QaGrid, ModelSettings):
    task: str = setting(
        "hotpotqa",
        "hotpotqa (and the tasks its --data names select) or custom (your JSONL of {id, context, question, answer, "
        "spans?}, each context as written; docs/own-data.md)",
    )
    probe: str | None = setting(
        None, "trained head predictor folder ('dynheads predictor train'), for the 'dynamic' strategy"
    )
    static: str | None = setting(None, "static head list JSON, for the 'static' strategy")
    strategies: tuple[str, ...] = setting(PAPER_STRATEGIES, f"some of {RAG_STRATEGIES.choices()}")
    rerank_top: int = setting(
        2,
        "rerank: paragraphs shown (the top of ICR's ranking over every head); the rest "
        "stay hidden for the whole answer",
    )
    rerank_tokens: int | None = setting(
        None,
        "rerank: show exactly this many context tokens instead (paragraphs in rank order, the last one cut), "
        "to match the windows' visible tokens per retrieval; None = the --rerank-top whole paragraphs",
    )
    ks: tuple[int, ...] = setting((5,), "heads per retrieval, e.g. 5,10,20 (paper: 5, 10, 20)")
    questions: int = redefault(QaGrid, "questions", 50)
    split: str = setting("rag", "name of the question stream (recorded)")
    lengths: tuple[int, ...] = redefault(QaGrid, "lengths", (500,))
    depths: tuple[float, ...] = redefault(QaGrid, "depths", (0.5,))
    max_new_tokens: int = redefault(QaGrid, "max_new_tokens", 32)
    draft_tokens: int = setting(16, "tokens drafted before RIND checks them")
    max_retrievals: int = setting(3, "retrievals per answer at most")
    threshold: float = setting(TriggerConfig.threshold, "RIND threshold θ")
    trigger_form: str = setting("paper", "'paper' (stop words) or 'dragin' (POS)")
    top_n: int = setting(RetrievalConfig.top_n, "top attended context positions that are clustered")
    window: int = setting(RetrievalConfig.window, "tokens shown around each cluster")
    gap: int = setting(RetrievalConfig.gap, "cluster gap in tokens")


# ---- rerank --------------------------------------------------------------------------------------------------------
RERANK_DEFAULTS = tuple(RERANK_STRATEGIES.names())  # the registered strategies when settings are first read


@dataclass(frozen=True)
class RerankFields(Seeded, ModelSettings):
    data: str = setting(
        "hotpotqa-dev",
        "HotpotQA JSON/JSONL file (10 candidates per question in the distractor "
        "setting) or hotpotqa-dev, the official dev-distractor set",
    )
    first: int = setting(100, "index of the evaluation stream's first question")
    questions: int = setting(200, "questions of the evaluation stream")
    fit_first: int = setting(0, "index of the fitting stream's first question (QRHead's head choice)")
    fit_questions: int = setting(50, "questions of the fitting stream; must not overlap the evaluation stream")
    strategies: tuple[str, ...] = setting(
        RERANK_DEFAULTS,
        ",".join(RERANK_DEFAULTS) + " (static needs "
        "--static, predictor --predictor; without them they are skipped and noted); rrf:S or mix:S fuses head "
        "strategy S with bm25 (reciprocal ranks, or a weight fitted on the fitting stream)",
    )
    k: int = setting(16, "heads of each head-subset strategy (qrhead, static, predictor, random)")
    static: str | None = setting(None, "Wu et al. static head list (a 'static' run's file), for 'static'")
    probe: str | None = setting(None, "trained head predictor folder ('dynheads predictor train'), for 'predictor'")
    bootstrap: int = setting(2000, "bootstrap resamples (of questions) for the intervals")


# ---- analyses of a run: dynamism, plot heads, cca, predictor train (their other settings: analysis.settings) --------
@dataclass(frozen=True)
class ScoreChoice:
    score: str = setting(
        "copy", "head score: copy (Eq. 1, NIAH), reasoning (Eq. 2, HotpotQA) or another registered one"
    )


@dataclass(frozen=True)
class PredictorTarget(ScoreChoice):
    """What the head predictor learns: a score's values, or (``threshold``) the per-step sets it decides."""

    threshold: str | None = setting(
        None,
        "continuous scores: learn the per-step sets above this threshold (a value such as 0.86, or null:0.1 / "
        "calibrated:M fitted on --fit-run) as a classifier, instead of regressing the score",
    )
    fit_run: str | None = setting(None, "the traced run a fitted --threshold is fitted on (null:Q: a decoy run)")


@dataclass(frozen=True)
class DynamismSettings(ScoreChoice):
    threshold: str = setting(
        DEFAULT_REASONING_THRESHOLD,
        "continuous scores: a head is active above this score (0.1), multiple of chance (relative:3), a value "
        "fitted on --fit-run to a mean set size (calibrated:10), or to Q heads per step on decoy spans (null:0.1)",
    )
    fit_run: str | None = setting(
        None,
        "calibrated thresholds: a traced run on other questions to fit on (refused if they overlap); null:Q: a "
        "traced decoy run (trace --task niah_decoy --split static)",
    )
    beside: str | None = setting(
        None, "a second head score whose per-step sets are set beside these (write sets beside copy's D_t: copy)"
    )


@dataclass(frozen=True)
class HeadPlotSettings(ScoreChoice):
    top: int = setting(10, "heads shown: the ones whose score varies most")


# ---- kv-export -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class KVExportSettings(ModelSettings):
    aggregation: str = setting("max", "query heads -> KV head: max or mean")
    sink: int = setting(128, "sink tokens of streaming heads (DuoAttention's patterns and kvpress: 128)")
    recent: int = setting(256, "recent window of streaming heads (DuoAttention and kvpress: 256)")
    full_heads: int | None = setting(
        None,
        "write a 0/1 pattern of this many KV heads kept whole (positive-score heads only; a shortfall is "
        "recorded); None = scores normalised to [0, 1]",
    )

    def __post_init__(self) -> None:
        if self.aggregation not in AGGREGATIONS:
            raise DynheadsError(f"--aggregation takes one of {', '.join(AGGREGATIONS)}, got {self.aggregation!r}")


# ---- detect (hallucination detection; HaluEval tracing) -------------------------------------------------------------
@dataclass(frozen=True)
class DetectConfig:
    """The hallucination detectors: logistic regression per feature set, grouped cross-validation."""

    static: str | None = setting(
        None,
        "static head list (Wu et al. JSON or ranked list); None = heads ranked by Eq. 1 frequency on each training "
        "fold only",
    )
    static_k: int = setting(10, "static top-k heads used by the retrieval features")
    probe: str | None = setting(
        None, "trained head predictor folder ('dynheads predictor train'), for the probe feature sets"
    )
    feature_sets: tuple[str, ...] = setting(
        FEATURE_SETS, "detectors to train, e.g. retrieval_no_needle,lookback,entropy"
    )
    folds: int = setting(5, "folds of the cross-validation grouped by question / sample")
    repeats: int = setting(3, "cross-validation repeats, seeds seed .. seed + repeats - 1")
    seed: int = setting(0, "seed of the first repeat's folds and of the bootstrap")
    bootstrap: int = setting(1000, "bootstrap resamples (of groups) for the confidence intervals")
    regularisation: float = setting(1.0, "inverse L2 strength C of the logistic regression")
    match_length: bool = setting(
        False,
        "teacher-forced runs: use only the first m tokens of every answer of a question, m = its shortest answer's "
        "length (kept for comparison, not a length control: it leaves pairs of one token whose attention features "
        "are identical; read the within-question win rate by answer length instead)",
    )


BOUNDARIES = ("prompt", "lookback-lens")  # where the context ends for the lookback ratio


@dataclass(frozen=True)
class HaluevalConfig(ModelSettings):
    data: str = setting(
        "halueval:qa", "halueval:qa or halueval:dialogue (knowledge in the prompt, both answers teacher-forced)"
    )
    questions: int = setting(24, "questions of the stream (two responses each)")
    first: int = setting(0, "index of the stream's first question in the HaluEval file (streams must not overlap)")
    context_boundary: str = setting(
        "prompt",
        "where the context ends for the lookback ratio: 'prompt' (the whole "
        "prompt) or 'lookback-lens' (the assistant header counts as generated)",
    )


# ---- reproduce -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReproduceConfig(Seeded, ModelSettings):
    preset: str = setting(
        "quick",
        "smoke (seconds, any model), quick (2-core CPU, minutes; verdicts may be below the "
        "sample floor), standard (every verdict at the sample floor; docs/results), paper "
        "(the paper's sizes, GPU), or a .toml file of your own: base = one of these, and the tables you change "
        "(docs/report.md)",
    )
    hotpotqa: str | None = setting(
        None,
        "real HotpotQA file or hotpotqa-dev; None = the preset's question "
        "source (quick, standard: a variable-tracking key-value lookup; paper: "
        "hotpotqa-dev; smoke: synthetic)",
    )
    floor: int = setting(
        DEFAULT_FLOOR, "fewest samples (per compared arm) a verdict is decided on; below it the verdict is inconclusive"
    )
    resamples: int = setting(
        DEFAULT_RESAMPLES, "bootstrap resamples for every verdict's 95 % interval (seeded by --seed)"
    )
