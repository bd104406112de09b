"""The generic registry every variant kind uses (tasks, KV policies, ablation and RAG strategies, stages)."""

from __future__ import annotations

import pytest

from dynheads.errors import DynheadsError
from dynheads.registry import Entry, Registry


def test_entries_keep_registration_order_value_and_help():
    colours = Registry[str]("colour")
    colours.register("red", "#f00", help="the first")
    colours.register("green", "#0f0", help="the second")
    assert colours.names() == ["red", "green"] and len(colours) == 2
    assert colours.get("green") == "#0f0" and colours.help("red") == "the first"
    assert list(colours) == [Entry("red", "#f00", "the first"), Entry("green", "#0f0", "the second")]
    assert "red" in colours and "blue" not in colours
    assert colours.choices() == "red, green" and colours.choices(",") == "red,green"


def test_register_works_as_a_decorator_returning_what_it_decorates():
    shapes = Registry[type]("shape")

    @shapes.register("square", help="four equal sides")
    class Square:
        pass

    assert shapes.get("square") is Square and Square.__name__ == "Square"


def test_an_unknown_name_is_one_line_listing_the_known_ones():
    colours = Registry[str]("colour")
    colours.register("red", "#f00", help="the first")
    colours.register("green", "#0f0", help="the second")
    with pytest.raises(DynheadsError) as error:
        colours.get("blue")
    assert str(error.value) == "unknown colour 'blue': use one of red, green"
    with pytest.raises(DynheadsError, match="unknown colour 'pink'"):
        colours.check(["red", "pink", "grey"])
    colours.check(["green", "red"])  # known names pass


def test_duplicates_and_bad_entries_are_errors_unless_replacing():
    colours = Registry[str]("colour")
    colours.register("red", "#f00", help="the first")
    with pytest.raises(DynheadsError, match="colour 'red' is already registered"):
        colours.register("red", "#e00", help="again")
    colours.register("red", "#e00", help="a darker red", replace=True)
    assert colours.get("red") == "#e00" and colours.names() == ["red"]
    with pytest.raises(DynheadsError, match="one-line help"):
        colours.register("blue", "#00f", help="")
    with pytest.raises(DynheadsError, match="one-line help"):
        colours.register("blue", "#00f", help="two\nlines")
    with pytest.raises(DynheadsError, match="one word"):
        colours.register("light blue", "#aaf", help="spaced")
    colours.unregister("red")
    assert colours.names() == [] and "blue" not in colours
