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
    from dynheads.decoding import trace
    from dynheads.experiments.reproduce import reproduce
    from dynheads.tasks import multihop

    assert dynheads.trace is trace and dynheads.multihop is multihop
    assert dynheads.experiments.run_reproduce is reproduce


def test_import_does_not_load_torch():
    code = "import sys, dynheads, dynheads.experiments; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
