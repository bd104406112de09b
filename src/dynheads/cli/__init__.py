"""Command-line interface: a thin layer over the Python API (see ``dynheads --help``)."""

from dynheads.cli.app import app, main

__all__ = ["app", "main"]
