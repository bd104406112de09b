"""The one stage registry (issue 62 item 5): ``stages.STAGES`` gives the study's run order (the keys of
stages.json), how each stage runs, what a verdict reads of it and the section that shows it; the report keeps the
paper's section order."""

from __future__ import annotations

import pytest

from dynheads import stages
from dynheads.errors import DynheadsError
from dynheads.registry import Registry
from dynheads.report.sections import ReportSection, report_sections

RUN_ORDER = [
    "niah",
    "static",
    "dynamism",
    "ablation",
    "progressive",
    "cca",
    "probe",
    "hotpotqa-static",
    "hotpotqa",
    "hotpotqa-dynamism",
    "hotpotqa-cca",
    "hotpotqa-probe",
    "hotpotqa-set-probe",
    "hotpotqa-ablation",
    "hotpotqa-progressive",
    "rag",
]
SECTION_ANCHORS = [
    "static",
    "niah",
    "claim1-niah",
    "claim2-niah",
    "claim3-niah",
    "hotpotqa",
    "claim1-hotpotqa",
    "claim2-hotpotqa",
    "claim3-hotpotqa",
    "rag",
]


def test_the_study_runs_the_registered_stages_in_the_papers_order():
    assert stages.study_stages() == stages.STAGES.names() == RUN_ORDER
    dealt = [entry.name for entry in stages.STAGES if entry.value.deals_samples]
    assert dealt == ["niah", "static", "ablation", "progressive", "hotpotqa-static", "hotpotqa"] + RUN_ORDER[-3:]
    assert not any(entry.value.optional for entry in stages.STAGES)


def test_every_stage_runs_a_function_of_the_study_and_its_section_is_a_report_section():
    for entry in stages.STAGES:
        assert callable(entry.value.runner()), entry.name
        section = entry.value.report_section()
        assert section is None or isinstance(section, ReportSection), entry.name


def test_the_report_keeps_the_papers_section_order_not_the_run_order():
    assert [section.anchor for section in report_sections(stages.study_stages())] == SECTION_ANCHORS
    reversed_run = list(reversed(RUN_ORDER))  # the report's order does not follow the stages'
    assert [section.anchor for section in report_sections(reversed_run)] == SECTION_ANCHORS


def test_evidence_and_preset_tables():
    evidence = {entry.name: entry.value.evidence for entry in stages.STAGES if entry.value.evidence}
    assert evidence == {
        "dynamism": "dynamism.md",
        "ablation": "summary.md",
        "cca": "cca.md",
        "probe": "metrics.md",
        "hotpotqa-dynamism": "dynamism.md",
        "hotpotqa-cca": "cca.md",
        "hotpotqa-probe": "metrics.md",
        "hotpotqa-set-probe": "metrics.md",
        "hotpotqa-ablation": "summary.md",
        "rag": "rag.md",
    }
    assert stages.evidence_of(stages.RAG) == "rag.md"
    with pytest.raises(DynheadsError, match="publishes no numbers"):
        stages.evidence_of(stages.NIAH)
    with pytest.raises(DynheadsError, match="publishes no numbers"):
        stages.evidence_of("no-such-stage")
    shared = {name: stages.preset_table(name) for name in RUN_ORDER if stages.preset_table(name) != name}
    assert shared == {"hotpotqa-cca": "cca", "hotpotqa-probe": "probe", "hotpotqa-set-probe": "probe"}


def test_an_optional_stage_joins_a_study_only_with_its_preset_table(monkeypatch):
    registry = Registry(stages.STAGES.kind)
    registry.register("first", stages.Stage("m:first"), help="always")
    registry.register("extra", stages.Stage("m:extra", optional=True), help="when the preset has [extra]")
    registry.register("last", stages.Stage("m:last"), help="always")
    monkeypatch.setattr(stages, "STAGES", registry)
    assert stages.study_stages() == stages.study_stages(["first", "qa_source"]) == ["first", "last"]
    assert stages.study_stages(["extra"]) == ["first", "extra", "last"]  # in the registry's order
