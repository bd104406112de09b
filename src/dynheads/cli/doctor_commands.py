"""``dynheads doctor`` and ``dynheads --version``."""

from __future__ import annotations

from typing import Annotated

import typer

from dynheads.cli.app import app


def _print_version(value: bool) -> None:
    if value:
        from dynheads import __version__

        typer.echo(f"dynheads {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[bool, typer.Option("--version", callback=_print_version, is_eager=True,
                                          help="print the version and exit")] = False,
) -> None:
    """Per-step retrieval heads: trace, ablate, probe and use them for in-context RAG."""


@app.command()
def doctor() -> None:
    """Check this machine: torch build, device, embedded model, packaged data and models, haystack, cache, spaCy model,
    Chromium (exit 0)."""
    from dynheads import __version__
    from dynheads.doctor import installed_path, render, run_checks

    typer.echo(f"dynheads {__version__} ({installed_path()})")
    checks = run_checks()
    typer.echo(render(checks))
    missing = sum(not check.ok for check in checks)
    typer.echo("all found" if not missing else f"{missing} missing: the fix is below each (dynheads runs without "
               "them unless the line says otherwise)")
