"""The presets of ``dynheads reproduce`` resolve to pinned stage settings.

Every stage runner is replaced by a recorder, so ``reproduce`` only builds the config of each stage; the
configs (and the CCA offsets / probe settings the analysis stages get) must equal ``fixtures/presets.json``,
written from the code before the presets were split per stage. Regenerate it only for a deliberate change:
``python tests/test_presets.py`` (writes that file).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import pytest

from dynheads.experiments import paper_stages
from dynheads.experiments import reproduce as reproduce_module
from dynheads.experiments.reproduce import ReproduceConfig, reproduce
from dynheads.views.threshold_fit import ThresholdFit

PINNED = Path(__file__).parent / "fixtures" / "presets.json"
FITTED_STAND_IN = "relative:4.5"  # what the Eq. 2 ablations get in place of a fitted threshold
RUNNERS = (
    "run_niah",
    "run_static",
    "dynamism_report",
    "plot_heads",
    "run_claim2",
    "run_progressive",
    "cca_report",
    "train_probe_on_run",
    "run_static_reasoning",
    "run_hotpotqa",
    "run_rag",
)


class _FakeRun:
    """Stands in for ``RunDir``: no manifest written, no records to rank."""

    def __init__(self, path):
        self.path = Path(path)

    def start(self, *args, **kwargs) -> dict:
        return {}

    def records(self) -> list:
        return []


def _fake_fit(rule, score, fit_run) -> ThresholdFit:
    """Stands in for fitting a calibrated Eq. 2 threshold (no traces here): a fixed stand-in value."""
    return ThresholdFit(str(rule), FITTED_STAND_IN, str(fit_run))


class _FakeModel:
    device = "cpu"


def _plain(value, out: Path):
    """JSON-ready, with the study folder written as <out>."""

    def encode(item):
        if dataclasses.is_dataclass(item):
            return {"type": type(item).__name__, **dataclasses.asdict(item)}
        return str(item)

    text = json.dumps(value, default=encode).replace(str(out), "<out>")
    return json.loads(text)


def resolved_settings(preset: str, patch) -> dict:
    """{stage folder: {runner, arguments}} of every stage ``reproduce`` would run for ``preset``."""
    calls: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "study"

        def recorder(name):
            def record(*args, **kwargs):
                stage = Path(kwargs.get("out_dir") or args[1]).relative_to(out)
                calls[f"{stage}:{name}"] = _plain(
                    {"args": list(args), "kwargs": {k: v for k, v in kwargs.items() if k not in ("lm", "progress")}},
                    out,
                )

            return record

        for name in RUNNERS:
            patch(paper_stages, name, recorder(name))
        patch(reproduce_module, "RunDir", _FakeRun)
        patch(paper_stages, "RunDir", _FakeRun)
        patch(reproduce_module, "fit_threshold", _fake_fit)
        reproduce(ReproduceConfig(preset=preset), out, lm=_FakeModel(), progress=False)
    return calls


@pytest.mark.parametrize("preset", ["smoke", "quick", "standard", "paper"])
def test_each_preset_resolves_to_the_pinned_stage_settings(preset, monkeypatch):
    pinned = json.loads(PINNED.read_text(encoding="utf-8"))[preset]
    resolved = resolved_settings(preset, monkeypatch.setattr)
    assert sorted(resolved) == sorted(pinned)
    for stage, settings in pinned.items():
        assert resolved[stage] == settings, stage


if __name__ == "__main__":  # writes the pinned settings of the code as it is
    saved = []

    def patch(module, name, value):
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    result = {}
    for name in ("smoke", "quick", "standard", "paper"):
        result[name] = resolved_settings(name, patch)
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)
        saved.clear()
    PINNED.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def test_a_run_written_before_a_setting_existed_resumes_while_the_setting_is_at_its_default(tmp_path):
    """``reproduce`` gained ``dtype``: a study started without it resumes at dtype auto, not at another dtype."""
    from dynheads.errors import DynheadsError
    from dynheads.io import read_json, write_json
    from dynheads.runs import RunDir

    run = RunDir(tmp_path / "study")
    run.start("reproduce", ReproduceConfig(preset="smoke"), None)
    manifest = read_json(run.manifest_path)
    del manifest["config"]["dtype"]  # as written before the field existed
    write_json(run.manifest_path, manifest)
    run.start("reproduce", ReproduceConfig(preset="smoke"), None)
    with pytest.raises(DynheadsError, match="different run"):
        run.start("reproduce", ReproduceConfig(preset="smoke", dtype="float32"), None)
    with pytest.raises(DynheadsError, match="different run"):
        run.start("reproduce", ReproduceConfig(preset="quick"), None)


def test_a_preset_table_must_name_a_registered_stage(tmp_path, monkeypatch):
    from dynheads.errors import DynheadsError
    from dynheads.stages import STAGES

    assert all(entry.help and entry.value.run for entry in STAGES)
    (tmp_path / "typo.toml").write_text(
        'qa_source = "multihop"\n[niah]\nruns = 1\n[sources.niah]\nruns = "x"\n[ablaton]\nruns = 1\n'
    )
    (tmp_path / "fine.toml").write_text('qa_source = "multihop"\n[niah]\nruns = 1\n[sources.rag]\nks = "x"\n')
    monkeypatch.setattr(reproduce_module, "PRESET_FOLDER", tmp_path)
    assert reproduce_module.load_preset("fine")["niah"] == {"runs": 1}
    with pytest.raises(DynheadsError, match="unknown stage 'ablaton': use one of niah, static, dynamism, ablation"):
        reproduce_module.load_preset("typo")
