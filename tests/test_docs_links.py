"""Every relative link of the documentation map, the extending page and the README points at a file that exists,
every guide in docs/ is on the map (a page nobody can find is a page nobody reads), and every dynheads name the
README and the guides cite in backticks exists (modules move; the pages must follow)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", ["README.md", "docs/README.md", "docs/extending.md"])
def test_relative_links_point_at_files(page):
    path = ROOT / page
    targets = [t for t in LINK.findall(path.read_text(encoding="utf-8")) if "://" not in t]
    assert targets, page
    missing = [t for t in targets if not (path.parent / t).exists()]
    assert not missing, (page, missing)


ANCHOR_LINK = re.compile(r"\]\(([^)\s#]*)#([^)\s]+)\)")
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``path``: lower case, punctuation dropped, spaces as hyphens, a
    repeated heading numbered (``-1``, ``-2``); headings inside fenced code are none."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        fenced ^= line.startswith("```")
        heading = None if fenced else re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading[1].strip())  # a link in a heading: its text
            slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
            anchors.add(f"{slug}-{seen[slug]}" if seen.get(slug) else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_anchor_a_page_links_to_is_a_heading_there():
    """``[x](page.md#anchor)`` and ``[x](#anchor)`` in the README, BENCHMARKS and every page under docs/ land on a
    heading (a renamed heading breaks its links silently otherwise)."""
    broken = []
    for page in PAGES:
        for target, anchor in ANCHOR_LINK.findall(page.read_text(encoding="utf-8")):
            linked = page.parent / target if target else page
            if "://" not in target and linked.suffix == ".md" and linked.is_file():
                if anchor not in heading_anchors(linked):
                    broken.append(f"{page.relative_to(ROOT)} -> {target}#{anchor}")
    assert len(PAGES) > 20 and not broken, broken


def test_every_guide_is_on_the_map():
    listed = set(LINK.findall((ROOT / "docs" / "README.md").read_text(encoding="utf-8")))
    guides = {p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert guides <= listed, sorted(guides - listed)


def test_every_test_file_the_extending_page_names_exists():
    named = re.findall(r"`(tests/test_\w+\.py)`", (ROOT / "docs" / "extending.md").read_text(encoding="utf-8"))
    assert named and all((ROOT / name).is_file() for name in named)


DOTTED = re.compile(r"`((?:dynheads\.)?([a-z_]+)(?:\.[A-Za-z_][A-Za-z_0-9]*)+)(?:\([^`]*\))?`")
FILE_NAME = re.compile(r"\.(json|jsonl|csv|md|toml|py|png|html|parquet|npz|pt|tsv|gguf)$")
MANIFEST_KEYS = {"config.task", "config.data", "config.model"}  # keys of a run's manifest.json, not Python names


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def test_every_dynheads_name_the_guides_cite_exists():
    """A backticked dotted name whose first part is ``dynheads`` or one of its modules (``kv.retention.KVPolicy``,
    ``dynheads.trace``) resolves to a module or attribute; file names and manifest keys are not names."""
    import dynheads

    modules = {module.name for module in pkgutil.iter_modules(dynheads.__path__)}
    cited, missing = 0, []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for match in DOTTED.finditer(line):
                name, first = match.group(1), match.group(2)
                if (first != "dynheads" and first not in modules) or FILE_NAME.search(name) or name in MANIFEST_KEYS:
                    continue
                cited += 1
                if not _resolves(name if name.startswith("dynheads.") else f"dynheads.{name}"):
                    missing.append(f"{page.relative_to(ROOT)}:{number}: {name}")
    assert cited > 100  # the pages cite the code throughout
    assert not missing, missing


# What a command in a guide writes: ``--out PATH``, ``--config PATH`` it reads after a ``cat > PATH`` writes it
WRITTEN = re.compile(r"(?:--out|cat >) +([^\s`'\"]+)")


def test_the_guides_commands_write_under_runs_not_into_the_checkout():
    """A reader who pastes a guide's commands in the checkout gets their files under runs/ (ignored by git), never
    beside the sources: lower-case paths only (``DIR``, ``FIT`` and ``R/main`` are placeholders)."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    written = [
        (page.name, path)
        for page in pages
        for path in WRITTEN.findall(page.read_text(encoding="utf-8"))
        if path[0].islower()
    ]
    assert written and all(path.startswith("runs/") for _, path in written), [
        (page, path) for page, path in written if not path.startswith("runs/")
    ]
