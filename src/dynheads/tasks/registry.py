"""The task registry: everything the runners, the report and the plots need to know about a task, in one entry.

A task is registered once (``register``) and looked up by name (``get_task``) or by a run's config
(``task_of``). A task named X that is not registered yet is looked for in the module ``dynheads.tasks.X``,
which registers itself when imported: adding a task is that one module (samples, grid, score, its ``Task``
entry), a config/preset entry and a report section (docs/tasks.md, "Adding a task"). Registered here: ``niah``
(Eq. 1, Section 3), ``hotpotqa`` (Eq. 2, Section 4) and ``multihop`` (the synthetic multi-hop key-value task,
which stands for HotpotQA on small models). The multi-hop task keeps its historical spelling:
``task="hotpotqa"`` with ``data="multihop[:options]"`` selects it.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from dynheads.errors import DynheadsError
from dynheads.scores import ScoreKind, check_kind
from dynheads.tasks import hotpotqa, multihop, niah, ruler
from dynheads.tasks.grid import TaskGrid, hotpotqa_grid, multihop_grid, niah_grid, ruler_grid
from dynheads.tasks.sample import Sample


@dataclass(frozen=True)
class Task:
    """One task. ``metrics``: record metric key -> label, in order (the first one decides Claim 2)."""

    name: str  # the key in configs, manifests (a run's ``kind``) and this registry
    label: str  # how headings, verdict cards and figure titles name it
    score_kind: ScoreKind  # how D_t is found: Eq. 1 copies or Eq. 2 above a threshold
    static_kind: str  # which static heads it is compared with: "copy" (retrieval) or "reasoning"
    metrics: Mapping[str, str]
    score: Callable[[Sample, str], dict[str, float]]  # (sample, generated text) -> metrics
    grid: Callable[[Any, Any], TaskGrid]  # (config, tokenizer) -> the grid's samples
    prompt: Callable[[Any], dict]  # config -> the prompt manifest a run records
    paper_task: str = ""  # the registered name of the paper's task it stands for ("": itself, or none)
    questions: bool = False  # the grid spreads a question stream over its cells (configs: questions, first, data)
    fade_sparse_cells: bool = False  # heat maps fade cells with few samples (questions spread over cells)

    def __post_init__(self) -> None:
        check_kind(self.score_kind)
        check_kind(self.static_kind)
        if not self.metrics:
            raise DynheadsError(f"task {self.name!r} declares no metrics")

    @property
    def paper_name(self) -> str:
        """The name of the task whose published numbers this one is set beside."""
        return self.paper_task or self.name

    @property
    def paper_label(self) -> str:
        """That task's label (the paper's numbers in ``dynheads.paper`` are keyed by name or by label)."""
        paper = _TASKS.get(self.paper_name)
        return paper.label if paper is not None else self.label


_TASKS: dict[str, Task] = {}


def register(task: Task, *, replace: bool = False) -> Task:
    """Add ``task`` to the registry (``replace=True`` overwrites an entry of that name, e.g. in a test)."""
    if task.name in _TASKS and not replace:
        raise DynheadsError(f"task {task.name!r} is already registered")
    _TASKS[task.name] = task
    return task


def unregister(name: str) -> None:
    _TASKS.pop(name, None)


def task_names() -> list[str]:
    return list(_TASKS)


def get_task(name: str) -> Task:
    """The task registered as ``name`` (importing ``dynheads.tasks.<name>`` first when that module exists and the
    name is not registered yet); an unknown name is a one-line error listing the registered ones."""
    if name not in _TASKS and name.isidentifier() and importlib.util.find_spec(f"{__package__}.{name}"):
        importlib.import_module(f"{__package__}.{name}")  # a task module registers itself on import
    task = _TASKS.get(name)
    if task is None:
        raise DynheadsError(f"unknown task {name!r}: use one of {', '.join(_TASKS)}")
    return task


def task_of(name: str, data: str | None = None) -> Task:
    """The task a config selects: ``name``, except that HotpotQA with ``multihop[:options]`` data is the multi-hop
    task (the spelling commands and TOML files have always used; its one-hop form, the default, is the
    key-value lookup: one retrieval is not multi-hop, and runs written as ``multihop`` read so too), and with
    ``variable_tracking[:options]`` or ``multikey_niah[:options]`` data that RULER task."""
    if name in (MULTIHOP_NAME, KV_LOOKUP_NAME) and data is None:
        data = multihop.SOURCE  # the form its grid builds
    if name in ("hotpotqa", MULTIHOP_NAME, KV_LOOKUP_NAME) and multihop.is_source(data):
        return get_task(MULTIHOP_NAME if multihop.parse_source(data).hops == 2 else KV_LOOKUP_NAME)
    if name in ("hotpotqa", ruler.VT_SOURCE, VT_LOOKUP_NAME) and ruler.source_of(data) == ruler.VT_SOURCE:
        return get_task(VT_LOOKUP_NAME if ruler.parse_source(data).hops == 0 else ruler.VT_SOURCE)
    if name == "hotpotqa" and ruler.source_of(data):
        return get_task(ruler.source_of(data))
    return get_task(name)


def task_of_manifest(manifest: Mapping) -> Task | None:
    """The task of a run from its manifest (``config.task`` or the run's ``kind``; ``config.data``), or None."""
    config = manifest.get("config") or {}
    name = config.get("task") or manifest.get("kind")
    try:
        return task_of(name, config.get("data")) if isinstance(name, str) else None
    except DynheadsError:  # a run of no task (ablation runs name theirs in config.task; rag, static, ...)
        return None


# ---- the registered tasks ---------------------------------------------------------------------------------------
def _niah_prompt(config: Any) -> dict:
    return {"system": niah.SYSTEM_PROMPT, "user": niah.USER_TEMPLATE, "needle": niah.NEEDLE_TEMPLATE,
            "question": niah.QUESTION, "distractor": niah.DISTRACTOR_TEMPLATE}


def _hotpotqa_prompt(config: Any) -> dict:
    return {"system": hotpotqa.SYSTEM_PROMPT, "user": hotpotqa.USER_TEMPLATE, "paragraph": hotpotqa.PARAGRAPH_TEMPLATE,
            "data": config.data or "synthetic (dynheads.tasks.hotpotqa.synthetic_hotpotqa)"}


def _multihop_prompt(config: Any) -> dict:
    data = config.data or multihop.SOURCE
    form = multihop.parse_source(data)
    return {"system": multihop.SYSTEM_PROMPT, "user": multihop.USER_TEMPLATE, "data": data, "form": asdict(form),
            "label": form.label}


QA_METRICS = {"em": "EM", "f1": "F1"}
NIAH = register(Task(
    name="niah", label="NIAH", score_kind="copy", static_kind="copy",
    metrics={"accuracy": "accuracy", "rouge_l": "ROUGE-L"},
    score=lambda sample, text: niah.score(sample.answer, text), grid=niah_grid, prompt=_niah_prompt))
HOTPOTQA = register(Task(
    name="hotpotqa", label="HotpotQA", score_kind="reasoning", static_kind="reasoning", metrics=QA_METRICS,
    score=lambda sample, text: hotpotqa.score(sample.answer, text), grid=hotpotqa_grid, prompt=_hotpotqa_prompt,
    questions=True, fade_sparse_cells=True))
MULTIHOP_NAME, KV_LOOKUP_NAME = "multihop", "kv_lookup"


def _multihop_score(sample: Sample, text: str) -> dict[str, float]:
    return multihop.score(sample.answer, text, sample.meta.get("candidates"))


MULTIHOP = register(Task(
    name=MULTIHOP_NAME, label="Multi-hop", score_kind="reasoning", static_kind="reasoning", metrics=QA_METRICS,
    score=_multihop_score, grid=multihop_grid, prompt=_multihop_prompt,
    paper_task="hotpotqa", questions=True, fade_sparse_cells=True))
KV_LOOKUP = register(Task(  # the multihop task's one-hop form (multihop:hops=1, its default)
    name=KV_LOOKUP_NAME, label="Key-value lookup", score_kind="reasoning", static_kind="reasoning",
    metrics=QA_METRICS, score=_multihop_score, grid=multihop_grid, prompt=_multihop_prompt,
    paper_task="hotpotqa", questions=True, fade_sparse_cells=True))


def _ruler_prompt(name: str, default: str | None = None) -> Callable[[Any], dict]:
    def prompt(config: Any) -> dict:
        data = config.data or default or name
        user = ruler.NIAH_USER if name == ruler.MK_SOURCE else (
            ruler.VT_ALL if ruler.parse_source(data).query == "all" else ruler.VT_VALUE)
        return {"system": ruler.SYSTEM_PROMPT, "user": user, "data": data, "form": ruler.describe_form(data),
                "haystack": ruler.NOISE, "metric": "RULER string match (share of the reference values in the output)"}
    return prompt


RULER_METRICS = {"string_match": "string match", "em": "EM", "f1": "F1"}
VARIABLE_TRACKING = register(Task(
    name=ruler.VT_SOURCE, label="Variable tracking", score_kind="reasoning", static_kind="reasoning",
    metrics=RULER_METRICS, score=ruler.score, grid=ruler_grid(ruler.VT_SOURCE), prompt=_ruler_prompt(ruler.VT_SOURCE),
    paper_task="hotpotqa", questions=True, fade_sparse_cells=True))
VT_LOOKUP_NAME, VT_LOOKUP_DATA = "vt_lookup", "variable_tracking:hops=0"
VT_LOOKUP = register(Task(  # variable tracking with no links: one VAR statement to find, not multi-hop
    name=VT_LOOKUP_NAME, label="Key-value lookup (VAR statements)", score_kind="reasoning", static_kind="reasoning",
    metrics=RULER_METRICS, score=ruler.score, grid=ruler_grid(ruler.VT_SOURCE, VT_LOOKUP_DATA),
    prompt=_ruler_prompt(ruler.VT_SOURCE, VT_LOOKUP_DATA), paper_task="hotpotqa", questions=True,
    fade_sparse_cells=True))
MULTIKEY_NIAH = register(Task(
    name=ruler.MK_SOURCE, label="Multi-key NIAH", score_kind="reasoning", static_kind="reasoning",
    metrics=RULER_METRICS, score=ruler.score, grid=ruler_grid(ruler.MK_SOURCE), prompt=_ruler_prompt(ruler.MK_SOURCE),
    questions=True, fade_sparse_cells=True))
