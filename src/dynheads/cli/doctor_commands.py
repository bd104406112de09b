"""``dynheads doctor`` and the options of every command: ``--version``, ``--threads`` and ``--plugin``."""

from __future__ import annotations

from typing import Annotated

import typer

from dynheads.cli import checks
from dynheads.cli.app import app
from dynheads.plugins import import_plugins, import_recorded_plugins


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
            show_default=False,
            help="a module (dotted name) or .py file imported before the command, so the variants it registers (a "
            "task, score, strategy, policy, press, stage: docs/extending.md) are names the command takes "
            "(dynheads --plugin my_heads.py ablate --fractions '' --strategies last-layer ...); repeat it for "
            "several, or set DYNHEADS_PLUGINS (names separated by ':')",
        ),
    ] = None,
) -> None:
    """Per-step retrieval heads: trace, ablate, probe and use them for in-context RAG."""
    from dynheads.doctor import apply_threads, default_threads

    checks.value("--threads", "threads", checks.at_least(1), threads)
    apply_threads(threads or default_threads())
    import_recorded_plugins()  # DYNHEADS_PLUGINS
    import_plugins(plugins or ())


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
