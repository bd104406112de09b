"""Lazy re-exports for the public packages: a name's module is imported on first use, so importing them is cheap;
and ``imported``, what a registry's lazy ``"module:attribute"`` entry names."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def imported(target: str) -> Any:
    """What ``"module:attribute"`` names, its module imported now (a registry's lazy entries: a stage's runner and
    report section, ``dynheads.stages``)."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def exports_by_name(by_module: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """``{module: ("name", "public=attribute", ...)}`` -> ``{public name: "module:attribute"}``."""
    exports = {}
    for module, names in by_module.items():
        for name in names:
            public, _, attribute = name.partition("=")
            exports[public] = f"{module}:{attribute or public}"
    return exports


def lazy_exports(
    package: str, namespace: dict[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose globals are ``namespace``. ``exports`` maps a public
    name to ``"module:attribute"``; an attribute that is a submodule not imported yet is imported."""

    def getattr_(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module_name, _, attribute = exports[name].partition(":")
        module = importlib.import_module(module_name)
        try:
            value = getattr(module, attribute)
        except AttributeError:  # a submodule, such as dynheads.tasks.niah
            value = importlib.import_module(f"{module_name}.{attribute}")
        namespace[name] = value  # later look-ups skip __getattr__
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return getattr_, dir_
