"""The stage registry's lazy entries keep the floors (issue 62 item 5): ``dynheads.stages`` sits on the lowest floor
and names each stage's runner and report section as ``"module:attribute"`` strings, never importing them; the runners
are functions of ``dynheads.experiments``, the sections ``ReportSection``s of ``dynheads.report``, and writing a
report resolves only sections, so the report still never imports experiments."""

from __future__ import annotations

import subprocess
import sys

from dynheads.stages import STAGES


def test_runners_are_experiments_and_sections_are_the_reports():
    for entry in STAGES:
        assert entry.value.run.startswith("dynheads.experiments."), entry.name
        assert entry.value.section is None or entry.value.section.startswith("dynheads.report."), entry.name


def test_writing_a_report_imports_no_experiment(tmp_path):
    code = (
        "import sys; from dynheads.report import write_report; write_report(sys.argv[1]); "
        "print(sorted(name for name in sys.modules if name.startswith('dynheads.experiments')))"
    )
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"
    assert "## Claim 1, dynamism, on NIAH" in (tmp_path / "report.md").read_text()  # every section, "not run"
