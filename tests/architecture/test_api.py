"""The declared public API: every exported name resolves, and importing the packages stays cheap."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dynheads
import dynheads.experiments


@pytest.mark.parametrize("package", [dynheads, dynheads.experiments], ids=lambda p: p.__name__)
def test_every_exported_name_resolves(package):
    assert package.__all__, "the package declares no API"
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    assert set(package.__all__) <= set(dir(package))


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        dynheads.no_such_thing  # noqa: B018
    with pytest.raises(AttributeError, match="no_such_thing"):
        dynheads.experiments.no_such_thing  # noqa: B018


def test_exports_are_the_objects_of_their_modules():
    from dynheads.engine.tracing import trace
    from dynheads.experiments.reproduce import reproduce
    from dynheads.tasks import multihop

    assert dynheads.trace is trace and dynheads.multihop is multihop
    assert dynheads.experiments.run_reproduce is reproduce


def test_import_does_not_load_torch():
    code = "import sys, dynheads, dynheads.experiments; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _doc_imports() -> list[tuple[str, str, str]]:
    """(doc, module, names) of every ``from dynheads... import`` / ``import dynheads...`` line in a code block."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = []
    for doc in [root / "README.md", *sorted((root / "docs").rglob("*.md"))]:
        blocks = re.findall(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), flags=re.S)
        for block in blocks:
            for match in re.finditer(
                r"^\s*from (dynheads[\w.]*) import (\([^)]*\)|.*)$|^\s*import (dynheads[\w.]*)", block, flags=re.M
            ):
                module = match.group(1) or match.group(3)
                found.append((doc.name, module, (match.group(2) or "").strip("()")))
    return found


def test_docs_import_only_the_declared_api():
    imports = _doc_imports()
    assert imports, "no import found in the docs' code blocks"
    packages = {"dynheads": dynheads, "dynheads.experiments": dynheads.experiments}
    for doc, module, names in imports:
        assert module in packages, f"{doc} imports the deep module {module}"
        for name in (part.split(" as ")[0].strip() for part in names.replace("\n", ",").split(",")):
            if name and not name.startswith("#"):
                assert name in packages[module].__all__, f"{doc}: {name} is not exported by {module}"


def test_every_exported_name_has_its_own_docstring():
    """A dataclass without one gets ``Name(field: type = ...)`` from Python: that is not a docstring."""
    import inspect

    missing = []
    for name in dynheads.__all__:
        value = getattr(dynheads, name)
        doc = inspect.getdoc(value) or ""
        generated = inspect.isclass(value) and doc.startswith(f"{value.__name__}(")
        if not doc.strip() or generated:
            missing.append(name)
    assert missing == []
