"""The report of ``dynheads reproduce``: report.md and a self-contained report.html (docs/report.md); and the
comparison of several models' studies, compare.md and compare.html (docs/compare.md); and every verdict rule run on
studies whose answer is known, rules.csv (docs/report.md, "Rules against known truth")."""

from dynheads.report.build import write_report
from dynheads.report.compare_page import write_compare
from dynheads.report.rules import run_rules

__all__ = ["run_rules", "write_compare", "write_report"]
