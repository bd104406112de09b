"""One small registry for everything that comes in named variants (tasks, KV policies, ablation and RAG
strategies, stages): a name maps to a value and a one-line help text, in registration order.

Help texts, CLI choices, plot styles and validation all read the registry, so a variant registered anywhere (its
own module, a test file) is offered, checked and drawn like the built-in ones, and an unknown name is one line
listing the known ones. In the manner of lm-evaluation-harness's ``Registry``, without its lazy placeholders::

    POLICIES = Registry[Policy]("KV policy")

    @POLICIES.register("first-layers", help="the KV heads of the first layers")
    def first_layers(...): ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from dynheads.errors import DynheadsError, did_you_mean

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    value: T
    help: str  # one line: what the CLI shows beside the name


class Registry(Generic[T]):
    """Named values of one kind (``kind`` names it in errors: "unknown KV policy 'x': use one of ...")."""

    def __init__(self, kind: str, order: Callable[[T], int] | None = None):
        """``order``: a listing rank per value (names, choices and iteration sort by it, ties in registration
        order); None lists in registration order."""
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}
        self._order = order

    def register(self, name: str, value: T | None = None, *, help: str, replace: bool = False) -> Callable[[T], T]:
        """Add ``value`` as ``name``; without ``value``, a decorator that adds what it decorates (and returns it
        unchanged). A name registered twice is an error unless ``replace`` (e.g. a test swapping an entry)."""
        if not name or any(c.isspace() for c in name):
            raise DynheadsError(f"a {self.kind} name is one word, got {name!r}")
        if not help.strip() or "\n" in help:
            raise DynheadsError(f"{self.kind} {name!r} needs a one-line help text")
        if name in self._entries and not replace:
            raise DynheadsError(f"{self.kind} {name!r} is already registered")

        def add(item: T) -> T:
            self._entries[name] = Entry(name, item, help)
            return item

        if value is not None:
            add(value)
        return add

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def entry(self, name: str) -> Entry[T]:
        """The entry of ``name``; an unknown name is a one-line error listing the registered ones."""
        found = self._entries.get(name)
        if found is None:
            raise DynheadsError(
                f"unknown {self.kind} {name!r}: use one of {self.choices()}{did_you_mean(name, self.names())}"
            )
        return found

    def get(self, name: str) -> T:
        return self.entry(name).value

    def help(self, name: str) -> str:
        return self.entry(name).help

    def names(self) -> list[str]:
        return [entry.name for entry in self._listed()]

    def _listed(self) -> list[Entry[T]]:
        entries = list(self._entries.values())
        order = self._order
        return entries if order is None else sorted(entries, key=lambda entry: order(entry.value))

    def check(self, names: Iterable[str]) -> None:
        """Raise the one-line error for the first unknown name of ``names``."""
        for name in names:
            self.entry(name)

    def choices(self, separator: str = ", ") -> str:
        """The registered names joined, for help texts and errors."""
        return separator.join(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        """The entries in listing order (``order``, else registration order)."""
        return iter(self._listed())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {self.choices()})"
