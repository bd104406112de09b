"""Modules of one's own imported before a command runs (``dynheads --plugin FILE.py|module``): the variants they
register (a task, score, strategy, policy, press, stage: docs/extending.md) become names the command takes.

The names imported are kept in ``DYNHEADS_PLUGINS``, so the processes ``distributed.spawn`` starts (which run no
command line) import them too before they run their share of a study.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from dynheads.errors import DynheadsError

PLUGINS_VARIABLE = "DYNHEADS_PLUGINS"  # the plugins, separated by os.pathsep


def import_plugins(names: Iterable[str]) -> None:
    """Import each of ``names`` (``import_plugin``) and record them, beside those recorded before, for the
    processes this one starts."""
    names = list(names)
    for name in names:
        import_plugin(name)
    recorded = recorded_plugins()
    if names:
        os.environ[PLUGINS_VARIABLE] = os.pathsep.join(dict.fromkeys([*recorded, *names]))


def recorded_plugins() -> list[str]:
    return [name for name in os.environ.get(PLUGINS_VARIABLE, "").split(os.pathsep) if name]


def import_recorded_plugins() -> None:
    """Import the plugins ``DYNHEADS_PLUGINS`` names (set by hand, or by the command that started this process)."""
    for name in recorded_plugins():
        import_plugin(name)


def import_plugin(name: str) -> None:
    """Import ``name``: a ``.py`` file (as a module named after its stem) or a dotted module name; a module already
    imported is not run again, and a file whose stem names another module already imported (``json.py``) is refused
    rather than skipped; one line naming the plugin if it fails."""
    path = Path(name)
    module_name = path.stem if path.suffix == ".py" else name
    loaded = sys.modules.get(module_name)
    if loaded is not None:
        if path.suffix == ".py" and Path(getattr(loaded, "__file__", "") or "").resolve() != path.resolve():
            raise DynheadsError(
                f"cannot import plugin {name!r}: its name {module_name!r} is already a module "
                f"({getattr(loaded, '__file__', None) or 'built in'}): rename the file"
            )
        return
    try:
        if path.suffix == ".py":
            if not path.is_file():
                raise FileNotFoundError(f"no such file: {path}")
            spec = importlib.util.spec_from_file_location(module_name, path)
            assert spec is not None and spec.loader is not None  # a .py file always has a source loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[module_name]
                raise
        else:
            importlib.import_module(name)
    except Exception as error:  # a plugin's own error, whatever it is, is one line naming the plugin
        raise DynheadsError(f"cannot import plugin {name!r}: {type(error).__name__}: {error}") from None
