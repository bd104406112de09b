"""The report of ``dynheads reproduce``: report.md and a self-contained report.html (docs/report.md); and the
comparison of several models' studies, compare.md and compare.html (docs/compare.md)."""

from dynheads.report.build import write_report
from dynheads.report.compare_page import write_compare

__all__ = ["write_compare", "write_report"]
