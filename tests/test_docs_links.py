"""Every relative link of the documentation map, the extending page and the README points at a file that exists,
and every guide in docs/ is on the map (a page nobody can find is a page nobody reads)."""

from __future__ import annotations

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


def test_every_guide_is_on_the_map():
    listed = set(LINK.findall((ROOT / "docs" / "README.md").read_text(encoding="utf-8")))
    guides = {p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert guides <= listed, sorted(guides - listed)


def test_every_test_file_the_extending_page_names_exists():
    named = re.findall(r"`(tests/test_\w+\.py)`", (ROOT / "docs" / "extending.md").read_text(encoding="utf-8"))
    assert named and all((ROOT / name).is_file() for name in named)
