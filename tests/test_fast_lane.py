"""The fast lane (``pytest -m "not embedded"``, ``scripts/test.sh --fast``): a test is marked ``embedded`` when one
of its fixtures, directly or through another fixture, reads the embedded model's GGUF."""

from __future__ import annotations

import pytest
from conftest import pytest_collection_modifyitems


class Item:
    """What the hook reads of a collected test: its fixture closure; what it writes: markers."""

    def __init__(self, *fixturenames: str):
        self.fixturenames = list(fixturenames)
        self.marks: list[str] = []

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.marks.append(mark.name)


def test_tests_reading_the_embedded_gguf_are_marked_and_others_are_not():
    items = [
        Item("tmp_path"),
        Item("embedded"),
        Item("tmp_path", "tiny_model_dir", "tmp_path_factory", "embedded"),  # a closure holds what fixtures use
        Item("tok", "embedded_tokenizer"),
        Item("random_lm", "tmp_path"),  # a tiny model built in the test (not conftest's tiny_lm): fast
    ]
    pytest_collection_modifyitems(items)
    assert [item.marks for item in items] == [[], ["embedded"], ["embedded"], ["embedded"], []]
