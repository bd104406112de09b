"""The task registry: everything the runners, the report and the plots need to know about a task, in one entry.

Each task module registers its ``Task`` itself when it is imported (``register``; the entries hold the module's
own grid, score and prompt, and the ``data`` values that select it); runners look a task up by name
(``get_task``) or by a run's config (``task_of``, which reads those declarations: this module imports no task).
A task named X that is not registered yet is looked for in the module ``dynheads.tasks.X``: adding a task is
that one module, a config/preset entry and a report section (docs/tasks.md, "Adding a task"). Built in (their
modules are imported on the first lookup): ``niah`` (Eq. 1, Section 3), ``spelled_niah`` and
``spelled_niah_paraphrased`` (a needle whose answer is never written in it), ``hotpotqa`` (Eq. 2, Section 4),
``multihop`` and its one-hop form ``kv_lookup`` (the synthetic key-value task, which stands for HotpotQA on small
models), RULER's ``variable_tracking``, ``vt_lookup`` and ``multikey_niah``, and ``custom`` (a user's JSONL file,
each context traced as written). The multi-hop task keeps its
historical spelling: ``task="hotpotqa"`` with ``data="multihop[:options]"`` selects it.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynheads.errors import DynheadsError
from dynheads.registry import Registry
from dynheads.scores import ScoreKind, check_kind

if TYPE_CHECKING:
    from dynheads.tasks.grid import TaskGrid
    from dynheads.tasks.sample import Sample

BUILTIN_MODULES = (
    "niah",
    "spelled",
    "hotpotqa",
    "multihop",
    "ruler",
    "decoy",
    "custom",
)  # task modules of this package, in listing order


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
    help: str = ""  # one line for listings and --help ("": the label)
    ignores: tuple[str, ...] = ()  # config fields of its shape it does not read (refused when given: not ignored)
    # config -> None: checks the user's data file the config names, before any model loads (None: nothing to check)
    check_data: Callable[[Any], None] | None = None
    # The ``data`` values that select it, declared here so that ``task_of`` reads them and imports no task:
    data_source: str = ""  # the source its data values spell, ``<source>`` or ``<source>:options`` ("": none)
    selects: Callable[[str], bool] | None = None  # of a data value of that source: is it this task's form (None: any)
    default_data: str | None = None  # the data value that selects it when none is given (the CLI's --data default)
    implied_data: str | None = None  # what a config of it with no data reads (None: ``default_data``)
    data_selects_task: bool = False  # HotpotQA's spelling: data of another task's source selects that task
    # data value -> the share of samples a guess scores 1 on the first metric (a KV cell's full cache is read as
    # evidence only above it); None: not known
    chance: Callable[[str | None], float | None] | None = None

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
        paper = TASKS.get(self.paper_name) if self.paper_name in TASKS else None
        return paper.label if paper is not None else self.label


def _listing_rank(task: Task) -> int:
    """Built-in tasks list in ``BUILTIN_MODULES`` order whichever module was imported first; others after them."""
    module = getattr(task.grid, "__module__", "") or ""
    package, _, short = module.rpartition(".")
    builtin = package == __package__ and short in BUILTIN_MODULES
    return BUILTIN_MODULES.index(short) if builtin else len(BUILTIN_MODULES)


TASKS = Registry[Task]("task", order=_listing_rank)


def register(task: Task, *, replace: bool = False) -> Task:
    """Add ``task`` to the registry (``replace=True`` overwrites an entry of that name, e.g. in a test)."""
    TASKS.register(task.name, task, help=task.help or task.label, replace=replace)
    return task


def unregister(name: str) -> None:
    TASKS.unregister(name)


def load_builtin_tasks() -> None:
    """Import the task modules of this package (each registers its tasks; a module is imported once)."""
    for module in BUILTIN_MODULES:
        importlib.import_module(f"{__package__}.{module}")


def task_names() -> list[str]:
    load_builtin_tasks()
    return TASKS.names()


def get_task(name: str) -> Task:
    """The task registered as ``name`` (importing ``dynheads.tasks.<name>`` first when that module exists and the
    name is not registered yet); an unknown name is a one-line error listing the registered ones."""
    load_builtin_tasks()
    if name not in TASKS and name.isidentifier() and importlib.util.find_spec(f"{__package__}.{name}"):
        importlib.import_module(f"{__package__}.{name}")  # a task module registers itself on import
    return TASKS.get(name)


def task_of(name: str, data: str | None = None) -> Task:
    """The task a config selects: ``name``, except that data of a task's ``data_source`` selects the task of that
    source whose form it is (``selects``), when ``name`` reads that source or is HotpotQA (``data_selects_task``).
    So HotpotQA with ``multihop[:options]`` data is the multi-hop task (its one-hop form, the default, the
    key-value lookup: one retrieval is not multi-hop, and runs written as ``multihop`` with no data read so too),
    and with ``variable_tracking[:options]`` or ``multikey_niah[:options]`` data that RULER task."""
    asked = get_task(name)
    if data is None:
        data = asked.implied_data or asked.default_data
    source = data_source_of(data)
    if not source or not (asked.data_selects_task or asked.data_source == source):
        return asked
    assert data is not None  # a source is only found in data
    for entry in TASKS:
        task = entry.value
        if task.data_source == source and (task.selects is None or task.selects(data)):
            return task
    return asked


def data_source_of(data: str | None) -> str:
    """The registered data source ``data`` spells (``<source>`` or ``<source>:options``), or ""."""
    sources = {entry.value.data_source for entry in TASKS} - {""}
    return next((s for s in sorted(sources) if data is not None and (data == s or data.startswith(s + ":"))), "")


def grid_task(manifest: Mapping) -> Task:
    """The registered task a finished grid run (KV, ablation) decoded, from its manifest's ``config`` (runs written
    before ``--task`` existed decoded NIAH)."""
    config = manifest["config"]
    return task_of(config.get("task", "niah"), config.get("data"))


def task_of_manifest(manifest: Mapping) -> Task | None:
    """The task of a run from its manifest (``config.task`` or the run's ``kind``; ``config.data``), or None."""
    config = manifest.get("config") or {}
    name = config.get("task") or manifest.get("kind")
    try:
        return task_of(name, config.get("data")) if isinstance(name, str) else None
    except DynheadsError:  # a run of no task (ablation runs name theirs in config.task; rag, static, ...)
        return None
