"""``dynheads doctor`` and the options of every command: ``--version``, ``--threads`` and ``--plugin``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Annotated

import typer

from dynheads.cli import checks
from dynheads.cli.app import app
from dynheads.errors import DynheadsError


def _print_version(value: bool) -> None:
    if value:
        from dynheads import __version__

        typer.echo(f"dynheads {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="print the version and exit")
    ] = False,
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            envvar="DYNHEADS_THREADS",
            show_default=False,
            help="CPU threads of torch for the command that follows (dynheads --threads 2 niah ...). "
            "Default: OMP_NUM_THREADS if set, else 1 while the machine is busy (1-minute load average >= usable "
            "cores; 'dynheads doctor' says), else one per usable core up to 4",
        ),
    ] = None,
    plugins: Annotated[
        list[str] | None,
        typer.Option(
            "--plugin",
            envvar="DYNHEADS_PLUGINS",
            show_default=False,
            help="a module (dotted name) or .py file imported before the command, so the variants it registers (a "
            "task, score, strategy, policy, press, stage: docs/extending.md) are names the command takes "
            "(dynheads --plugin my_heads.py ablate --strategies last-layer ...); repeat it for several",
        ),
    ] = None,
) -> None:
    """Per-step retrieval heads: trace, ablate, probe and use them for in-context RAG."""
    from dynheads.doctor import apply_threads, default_threads

    checks.value("--threads", "threads", checks.at_least(1), threads)
    apply_threads(threads or default_threads())
    for plugin in plugins or ():
        import_plugin(plugin)


def import_plugin(name: str) -> None:
    """Import ``name``: a ``.py`` file (run as a module of its stem) or a dotted module name; one line if it fails."""
    path = Path(name)
    try:
        if path.suffix == ".py":
            if not path.is_file():
                raise FileNotFoundError(f"no such file: {path}")
            spec = importlib.util.spec_from_file_location(path.stem, path)
            assert spec is not None and spec.loader is not None  # a .py file always has a source loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            spec.loader.exec_module(module)
        else:
            importlib.import_module(name)
    except Exception as error:  # a plugin's own error, whatever it is, is one line naming the plugin
        raise DynheadsError(f"cannot import plugin {name!r}: {type(error).__name__}: {error}") from None


@app.command()
def doctor(
    clean: Annotated[
        str | None,
        typer.Option(
            "--clean",
            metavar="MODEL",
            show_default=False,
            help="delete what the cache holds of a named model (the doctor's 'named models' line lists them): its "
            "GGUF, wheels and de-quantised copies, instead of checking; the next use fetches it again",
        ),
    ] = None,
) -> None:
    """Check this machine: what dynheads uses, how to fix what is missing, and whether it is busy (exit 0).

    Torch build, device and threads, machine load, embedded model, packaged data and models, the named models and
    their size in the cache, haystack, cache, spaCy model, Chromium."""
    from dynheads import __version__
    from dynheads.doctor import clean_model, installed_path, render, run_checks

    if clean is not None:
        paths, freed = clean_model(clean)
        typer.echo(
            f"{clean}: deleted {len(paths)} cache entries, {freed / 1e6:.0f} MB"
            if paths
            else f"{clean}: not in the cache"
        )
        return

    typer.echo(f"dynheads {__version__} ({installed_path()})")
    found = run_checks()
    typer.echo(render(found))
    missing = sum(not check.ok and not check.warning for check in found)
    warnings = "".join(f"; warning: {check.name}" for check in found if check.warning)
    typer.echo(
        (
            "all found"
            if not missing
            else f"{missing} missing: the fix is below each (dynheads runs without them unless the line says otherwise)"
        )
        + warnings
    )
