"""``dynheads doctor``: what this machine has that dynheads uses, and how to fix what is missing.

Every check returns a ``Check`` (never raises): the doctor reports, it does not stop at the first problem.
The thread default of every command (``dynheads --threads``) is decided here too, from the machine's cores and load.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dynheads.distributed import usable_cores
from dynheads.errors import DynheadsError

SPACY_MODEL = "en_core_web_sm"  # RIND form 'dragin' (dynheads.rag.trigger); the default form 'paper' needs none
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# More threads than this rarely speed up decoding (small per-step matrix products at batch 1) and slow every other
# job on a shared machine; torch's own default is one thread per core.
MAX_DEFAULT_THREADS = 4


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""  # how to fix it, when not ok
    warning: bool = False  # not ok, but nothing is missing (a busy machine)


def machine_busy(load: float, cores: int) -> bool:
    """Whether other jobs already keep every core busy: the 1-minute load average is at least the core count."""
    return load >= cores


def default_threads() -> int:
    """Threads of a command without ``--threads``: ``OMP_NUM_THREADS`` where the user set it; else 1 while the
    machine is busy (more threads would only wait for cores: a NIAH sample took 90 s at torch's default and 9 s at
    one thread on a shared machine), else one per usable core up to ``MAX_DEFAULT_THREADS``."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    cores = usable_cores()
    return 1 if machine_busy(os.getloadavg()[0], cores) else min(MAX_DEFAULT_THREADS, cores)


def apply_threads(threads: int) -> None:
    """Use ``threads`` CPU threads in torch before any model work: ``torch.set_num_threads`` where torch is loaded,
    else ``OMP_NUM_THREADS``, from which torch sets its thread count as it loads (capped at the core count), so
    that a command's ``--help`` still loads no torch."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def run_checks() -> list[Check]:
    checks: list[Callable[[], Check]] = [
        _torch,
        _device,
        _load,
        _embedded_model,
        _packaged,
        _named_models,
        _haystack,
        _cache,
        _spacy_model,
        _chromium,
        _kvpress,
    ]
    results = []
    for check in checks:
        try:
            results.append(check())
        except (OSError, ImportError, RuntimeError, DynheadsError) as error:  # a broken check is reported, too
            results.append(Check(check.__name__.strip("_").replace("_", " "), False, f"check failed: {error}"))
    return results


def _torch() -> Check:
    import torch

    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
    return Check("torch", True, f"{torch.__version__} ({build} build)")


def _device() -> Check:
    import torch

    count = torch.get_num_threads()
    threads = f"{count} CPU thread{'' if count == 1 else 's'}"
    if torch.cuda.is_available():
        return Check("device", True, f"cuda: {torch.cuda.get_device_name(0)} (default); {threads}")
    fix = (
        "this torch build cannot use the GPU: reinstall torch with CUDA (pip install torch)"
        if shutil.which("nvidia-smi") and not torch.version.cuda
        else ""
    )
    return Check("device", not fix, f"cpu (no usable CUDA GPU); {threads}", fix)


def _load() -> Check:
    load, cores = os.getloadavg()[0], usable_cores()
    detail = f"1-minute load average {load:.1f} on {cores} usable cores"
    if machine_busy(load, cores):
        return Check(
            "machine load",
            False,
            f"{detail}: busy (other jobs hold every core)",
            "commands default to 1 thread while it stays busy; more (--threads N) would wait for cores and "
            "slow every job",
            warning=True,
        )
    return Check("machine load", True, f"{detail}; commands default to {default_threads()} threads (--threads N)")


def _embedded_model() -> Check:
    import transformers

    from dynheads.models import cache_root, embedded_gguf_path

    try:
        path = embedded_gguf_path()
    except DynheadsError as error:
        return Check("embedded model", False, "SmolLM2-135M-Instruct GGUF not found", str(error).split(": ", 1)[-1])
    cached = list((cache_root() / "gguf").glob(f"*-transformers{transformers.__version__}/config.json"))
    note = "de-quantised copy cached" if cached else "de-quantised on first use (about a minute), then cached"
    return Check("embedded model", True, f"{path} ({path.stat().st_size / 1e6:.0f} MB); {note}")


def _packaged() -> Check:
    """Real data sets and models read from pinned wheels (--data hotpotqa-dev, --model qwen2.5-coder-0.5b): optional,
    each fetched on first use, so this only says which are in the cache already."""
    from dynheads.packaged import PACKAGED, cache_root

    cached = [name for name, entry in PACKAGED.items() if (cache_root() / "packaged" / name / entry.filename).is_file()]
    later = [name for name in PACKAGED if name not in cached]
    return Check(
        "packaged files",
        True,
        f"cached: {', '.join(cached) or 'none'}"
        + (f"; fetched from PyPI on first use: {', '.join(later)}" if later else ""),
    )


def _named_models() -> Check:
    """The models ``--model`` takes by name (``PACKAGED_MODELS``), each with what the cache holds of it."""
    from dynheads.models import PACKAGED_MODELS

    parts = [f"{name} ({_cached_size(name)})" for name in PACKAGED_MODELS]
    return Check("named models", True, "; ".join(parts) + "; delete one's files: dynheads doctor --clean NAME")


def _cached_size(name: str) -> str:
    from dynheads.models import model_cache_paths

    paths = model_cache_paths(name)
    return f"{sum(map(_size, paths)) / 1e6:.0f} MB in the cache" if paths else "not in the cache"


def clean_model(name: str) -> tuple[list[Path], int]:
    """Delete what the cache holds of packaged model ``name`` (its GGUF, wheels, de-quantised copies); returns the
    paths deleted and the bytes freed. A later ``--model name`` fetches it again."""
    from dynheads.models import PACKAGED_MODELS, model_cache_paths

    if name not in PACKAGED_MODELS:
        raise DynheadsError(f"unknown model {name!r} for --clean; named models: {', '.join(PACKAGED_MODELS)}")
    paths = model_cache_paths(name)
    freed = sum(map(_size, paths))
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return paths, freed


def _size(path: Path) -> int:
    """Bytes of a file, or of the files under a folder (links not followed)."""
    if path.is_file():
        return path.stat().st_size
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file() and not item.is_symlink())


def _haystack() -> Check:
    from dynheads.tasks.niah import default_haystack_dir

    try:
        folder = default_haystack_dir()
    except DynheadsError as error:
        return Check("NIAH haystack", False, "Paul Graham essays not found", f"run bash scripts/install.sh ({error})")
    return Check("NIAH haystack", True, f"{len(list(folder.glob('*.txt')))} essays in {folder}")


def _cache() -> Check:
    from dynheads.models import cache_root

    root = cache_root()
    if not root.is_dir():
        return Check("cache", True, f"{root} (not created yet; set DYNHEADS_CACHE to move it)")
    return Check("cache", True, f"{root}, {_size(root) / 1e6:.0f} MB (set DYNHEADS_CACHE to move it)")


def _spacy_model() -> Check:
    if importlib.util.find_spec("spacy") is None:
        return Check(
            "spaCy model",
            False,
            "spaCy not installed (only RIND form 'dragin' of dynheads rag needs it)",
            f"pip install 'dynheads[rag]' && python -m spacy download {SPACY_MODEL}",
        )
    if importlib.util.find_spec(SPACY_MODEL) is None:
        return Check(
            "spaCy model",
            False,
            f"{SPACY_MODEL} not installed (only RIND form 'dragin' of dynheads rag "
            "needs it; the default form 'paper' does not)",
            f"python -m spacy download {SPACY_MODEL}",
        )
    return Check("spaCy model", True, f"{SPACY_MODEL} installed")


def _chromium() -> Check:
    found = next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)
    if found is None:
        return Check(
            "Chromium",
            False,
            "not found (only the browser test tests/test_report_browser.py needs it; report.html opens in any browser)",
            "apt-get install -y chromium && pip install playwright",
        )
    playwright = importlib.util.find_spec("playwright") is not None
    note = "" if playwright else " (playwright not installed: pip install playwright)"
    return Check("Chromium", True, f"{found}{note}")


def _kvpress() -> Check:
    """kvpress is optional (the ``kvpress:<press>`` policies of ``dynheads kv``) and lives in a side venv."""
    from dynheads.kv.press_registry import KVPRESS_ROUTE

    if importlib.util.find_spec("kvpress") is not None:
        return Check("kvpress", True, f"{importlib.metadata.version('kvpress')} in this environment")
    return Check("kvpress", True, f"not in this environment (optional, for kvpress:<press> policies): {KVPRESS_ROUTE}")


def render(checks: list[Check]) -> str:
    """One line per check, ``ok``, ``warning`` or ``missing``, each not ok followed by its fix."""
    width = max(len(check.name) for check in checks)
    lines = []
    for check in checks:
        status = "ok" if check.ok else "warning" if check.warning else "missing"
        lines.append(f"{status:8}{check.name:{width}}  {check.detail}")
        if not check.ok and check.fix:
            lines.append(f"{'':8}{'':{width}}  fix: {check.fix}")
    return "\n".join(lines)


def installed_path() -> Path:
    import dynheads

    return Path(os.path.dirname(dynheads.__file__))
