"""The ``dynheads`` Typer application; command modules register themselves on ``app``."""

from __future__ import annotations

import importlib
import inspect
import sys

import typer

from dynheads.errors import DynheadsError

app = typer.Typer(
    name="dynheads",
    help="Per-step retrieval heads: trace, ablate, probe and use them for in-context RAG.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
plot_app = typer.Typer(help="Figures from run directories.", no_args_is_help=True)
predictor_app = typer.Typer(
    help="The MLP head predictor: from the hidden state to every head's score.", no_args_is_help=True
)
app.add_typer(plot_app, name="plot")
app.add_typer(predictor_app, name="predictor")
app.add_typer(predictor_app, name="probe", hidden=True)  # its older name ("probe" names the attention probe now)


COMMAND_MODULES = (
    "trace_commands",
    "commands",
    "analysis_commands",
    "ablation_commands",
    "detect_commands",
    "doctor_commands",
    "kv_commands",
)


def register_commands() -> None:
    """Import the command modules; each registers its commands on ``app``."""
    for name in COMMAND_MODULES:
        importlib.import_module(f"dynheads.cli.{name}")
    for typer_app in (app, plot_app, predictor_app):
        for command in typer_app.registered_commands:
            command.short_help = command.short_help or _first_paragraph(command.callback)


def _first_paragraph(callback) -> str | None:
    """A command's line in ``dynheads --help``: its docstring's first paragraph as one line (Typer's rich mode
    keeps the docstring's line breaks there, cutting sentences mid-line)."""
    doc = inspect.getdoc(callback) if callback is not None else None
    return " ".join(doc.split("\n\n")[0].split()) if doc else None


INTERRUPTED = 130  # the exit code of a command stopped by Ctrl-C (Typer's)
RESUME_LINE = "stopped: every finished sample is saved; run the same command to continue where it stopped"


def main() -> None:
    """Console entry point: bad input becomes one line on stderr and exit code 2, never a traceback; Ctrl-C says
    how to continue (runs are resumable) and exits 130."""
    register_commands()

    try:
        app()
    except DynheadsError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except SystemExit as stop:
        if stop.code == INTERRUPTED:
            print(RESUME_LINE, file=sys.stderr)
        raise
