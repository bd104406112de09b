"""The report of ``dynheads reproduce``: report.md and a self-contained report.html (docs/report.md)."""

from dynheads.report.build import write_report

__all__ = ["write_report"]
