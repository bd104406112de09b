"""``dynheads reproduce`` end to end on a tiny model (the 'smoke' preset), interrupted and resumed."""

from __future__ import annotations

import itertools
import shutil
import sys

import pytest

from dynheads import stages
from dynheads.errors import DynheadsError
from dynheads.experiments import paper_stages
from dynheads.experiments import reproduce as reproduce_module
from dynheads.experiments.reproduce import ReproduceConfig, reproduce
from dynheads.io import read_json
from dynheads.registry import Registry
from dynheads.report import claims, write_report
from dynheads.report.sections import ReportSection, StudyFolder
from dynheads.runs import RunDir
from dynheads.stages import Stage


def test_reproduce_writes_every_stage_and_resumes_to_the_same_report(tiny_lm, tiny_model_dir, tmp_path, monkeypatch):
    config = ReproduceConfig(model=str(tiny_model_dir), preset="smoke")
    out = tmp_path / "study"

    # Interrupt the study in the middle: the CCA stage fails once, as a kill would stop it.
    real_cca = paper_stages.cca_report

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(paper_stages, "cca_report", crash)
    with pytest.raises(KeyboardInterrupt):
        reproduce(config, out, lm=tiny_lm, progress=False)
    done_before = set(read_json(out / "stages.json"))
    assert {"niah", "static", "dynamism"} <= done_before and "cca" not in done_before

    monkeypatch.setattr(paper_stages, "cca_report", real_cca)
    _, html = write_report(reproduce(config, out, lm=tiny_lm, progress=False))  # as the CLI's reproduce does
    logged = read_json(out / "stages.json")
    assert set(logged) >= done_before | {"cca", "probe", "hotpotqa", "rag"}
    assert {name: logged[name] for name in done_before} == {n: s for n, s in logged.items() if n in done_before}
    first_report = (out / "report.md").read_text()
    # Every stage ran; one a random model cannot support (CCA of constant head scores) says why in the report.
    for stage in ("niah", "static", "ablation", "progressive", "cca", "probe", "hotpotqa", "rag"):
        assert (out / stage).is_dir() or logged[stage].get("error"), stage
        if logged[stage].get("error"):
            assert logged[stage]["error"].replace(f"{out}/", "") in first_report  # paths inside: relative
    assert html.is_file() and "Verdicts" in first_report

    # Every HotpotQA consumer took its own questions: the recorded ids never overlap, and the static reasoning
    # heads (not the NIAH copy list) serve the HotpotQA ablation, progressive ablation and RAG.
    hotpot_stages = ("hotpotqa-static", "hotpotqa", "hotpotqa-ablation", "hotpotqa-progressive", "rag")
    ids = {stage: set(read_json(out / stage / "manifest.json")["questions"]["ids"]) for stage in hotpot_stages}
    for first, second in itertools.combinations(hotpot_stages, 2):
        assert not ids[first] & ids[second], (first, second)
    reasoning_list = str(out / "hotpotqa-static" / "static_heads.json")
    for stage in ("hotpotqa-ablation", "hotpotqa-progressive", "rag"):
        assert read_json(out / stage / "manifest.json")["config"]["static"] == reasoning_list
    for probe in ("hotpotqa-probe", "hotpotqa-set-probe"):  # Claim 3's regressor and Claim 1's set classifier
        probe_ids = read_json(out / probe / "questions.json")
        assert set(probe_ids["train"]) | set(probe_ids["validation"]) <= ids["hotpotqa"]
    assert read_json(out / "hotpotqa-set-probe" / "metrics.json")["task"] == "binary"
    # Eq. 2 sets: the preset's calibrated threshold is fitted on the static stream alone, recorded, and applied by
    # the dynamism stage and both Eq. 2 ablations alike
    fit = read_json(out / "hotpotqa-dynamism" / "dynamism.json")["threshold_fit"]
    assert fit["rule"] == "calibrated:10" and fit["fit_run"] == str(out / "hotpotqa-static")
    assert set(fit["fit_questions"]) == ids["hotpotqa-static"] and fit["applied"].startswith("relative:")
    for stage in ("hotpotqa-ablation", "hotpotqa-progressive"):
        assert read_json(out / stage / "manifest.json")["config"]["threshold"] == fit["applied"]
        assert read_json(out / stage / "threshold_fit.json") == fit

    # A third run has nothing left to do and writes the same report.
    write_report(reproduce(config, out, lm=tiny_lm, progress=False))
    assert (out / "report.md").read_text() == first_report
    # A finished stage whose folder was deleted runs again (stages.json logged it; nothing else reruns).
    shutil.rmtree(out / "rag")
    reproduce(config, out, lm=tiny_lm, progress=False)
    again = read_json(out / "stages.json")
    assert (out / "rag").is_dir() and {n: s for n, s in again.items() if n != "rag"} == {
        n: s for n, s in logged.items() if n != "rag"
    }


def test_unknown_preset_is_refused(tiny_lm, tmp_path):
    from dynheads.errors import DynheadsError

    with pytest.raises(DynheadsError, match="unknown preset"):
        reproduce(ReproduceConfig(preset="huge"), tmp_path, lm=tiny_lm)


def test_the_paper_preset_says_where_every_value_comes_from():
    from dynheads.experiments.reproduce import PAPER_PRESET_SOURCES, PRESETS

    paper = PRESETS["paper"]
    stage_tables = {key: table for key, table in paper.items() if key not in ("sources", "qa_source")}
    assert set(PAPER_PRESET_SOURCES) == {*stage_tables, "qa_source"}
    for stage, table in stage_tables.items():  # every value has a source, and every source a value
        assert set(PAPER_PRESET_SOURCES[stage]) == (set(table) or {"defaults"}), stage
    texts = [PAPER_PRESET_SOURCES["qa_source"], *(t for s in stage_tables for t in PAPER_PRESET_SOURCES[s].values())]
    assert all(
        text.split(":")[0] in ("paper", "inferred") or text.startswith(("Wu et al.", "paper range")) for text in texts
    )


def count_steps(run: reproduce_module.Study) -> None:
    """A stage of our own: the traced steps of the NIAH grid, as a number and a bar."""
    import matplotlib.pyplot as plt

    records = RunDir(run.folder(stages.NIAH)).records()
    run.folder("count-steps").mkdir()
    (run.folder("count-steps") / "steps.txt").write_text(str(sum(r["steps"] for r in records)))
    plt.figure(figsize=(1, 1))
    plt.bar([0], [sum(r["steps"] for r in records)])
    plt.savefig(run.folder("count-steps") / "steps.png")
    plt.close()


def always_fails(run: reproduce_module.Study) -> None:
    raise DynheadsError("no support on this model")


def _steps_section(folder: StudyFolder) -> list:  # the section's parts and its claim's verdict
    steps = int((folder.root / "count-steps" / "steps.txt").read_text())
    return [f"{steps} steps in all.", claims.failed("Claim 4, steps", "NIAH", f"{steps} steps decide nothing")]


STEPS = ReportSection("steps", "Steps per sample", _steps_section, None, ("count-steps", ("steps.png",)))


def test_a_stage_registered_in_a_test_file_runs_in_the_study(tiny_lm, tiny_model_dir, tmp_path, monkeypatch):
    """Issue 35, issue 62: a study stage is one entry of ``stages.STAGES`` (in the order registered): its runner and
    its report section, ``"module:attribute"`` strings; ``reproduce`` is a loop over them, logging each one's time or
    why it failed. The report shows the section and, on its first screen, its claim's card with the stage's figure."""
    study = Registry(stages.STAGES.kind)  # this study: the registered NIAH trace, then two stages of ours
    study.register(stages.NIAH, stages.STAGES.get(stages.NIAH), help="the traced grid")
    monkeypatch.setattr(stages, "STAGES", study)
    steps_stage = Stage(f"{__name__}:count_steps", section=f"{__name__}:STEPS")
    stages.STAGES.register("count-steps", steps_stage, help="steps per traced sample")
    stages.STAGES.register("always-fails", Stage(f"{__name__}:always_fails"), help="a stage this model cannot support")

    out = reproduce(ReproduceConfig(model=str(tiny_model_dir), preset="smoke"), tmp_path / "s", lm=tiny_lm)
    log = read_json(out / "stages.json")
    assert list(log) == [stages.NIAH, "count-steps", "always-fails"]
    steps = int((out / "count-steps" / "steps.txt").read_text())
    assert steps > 0
    assert log["always-fails"]["error"] == "no support on this model"
    report = write_report(out)[0].read_text()
    assert f"## Steps per sample\n\n{steps} steps in all." in report
    card = report[report.index("### Claim 4, steps, NIAH: inconclusive") :]
    assert card.index("count-steps/steps.png)") < card.index("## Steps per sample")  # the card, on the first screen
    assert f"{steps} steps decide nothing" in report

    # Run again after a fix: the failed stage is tried again, the finished ones are not (count-steps would find its
    # folder there and fail).
    monkeypatch.setattr(sys.modules[__name__], "always_fails", lambda run: run.folder("always-fails").mkdir())
    again = read_json(
        reproduce(ReproduceConfig(model=str(tiny_model_dir), preset="smoke"), out, lm=tiny_lm) / "stages.json"
    )
    assert list(again) == list(log) and "error" not in again["always-fails"] and (out / "always-fails").is_dir()
    assert {name: again[name] for name in (stages.NIAH, "count-steps")} == {
        n: log[n] for n in (stages.NIAH, "count-steps")
    }


def three_steps(run: reproduce_module.Study) -> None:
    """An optional stage of our own that needs no other stage."""
    run.folder("count-steps").mkdir()
    (run.folder("count-steps") / "steps.txt").write_text("3")


def test_an_optional_stage_joins_a_study_whose_preset_has_its_table(tiny_lm, tiny_model_dir, tmp_path, monkeypatch):
    """KV, re-rank or detection may join a study as an optional stage: registered like any other, it runs (and the
    report shows it and counts it among the study's stages) only in a study whose preset has a table for it."""
    from dynheads.report.study import study_stage_names

    monkeypatch.setattr(stages, "STAGES", Registry(stages.STAGES.kind))
    optional = Stage(f"{__name__}:three_steps", optional=True, section=f"{__name__}:STEPS")
    stages.STAGES.register("count-steps", optional, help="three steps, when the preset asks")
    config = ReproduceConfig(model=str(tiny_model_dir), preset="smoke")
    without = reproduce(config, tmp_path / "without", lm=tiny_lm, progress=False)
    assert not (without / "count-steps").exists() and study_stage_names(without) == []
    assert "Steps per sample" not in write_report(without)[0].read_text()

    monkeypatch.setitem(reproduce_module.PRESETS, "smoke", {**reproduce_module.PRESETS["smoke"], "count-steps": {}})
    joined = reproduce(config, tmp_path / "joined", lm=tiny_lm, progress=False)
    assert list(read_json(joined / "stages.json")) == ["count-steps"] and study_stage_names(joined) == ["count-steps"]
    report = write_report(joined)[0].read_text()
    assert "## Steps per sample\n\n3 steps in all." in report and "stages not run yet" not in report
    (joined / "stages.json").unlink()  # as if it had not run yet
    shutil.rmtree(joined / "count-steps")
    assert "**1 of 1 stages not run yet" in write_report(joined)[0].read_text()


def test_a_batched_study_records_its_batch_size_and_generates_what_batch_1_does(tiny_lm, tiny_model_dir, tmp_path):
    config = ReproduceConfig(model=str(tiny_model_dir), preset="smoke")
    one = reproduce(config, tmp_path / "one", lm=tiny_lm, progress=False)
    three = reproduce(config, tmp_path / "three", lm=tiny_lm, progress=False, batch_size=3)
    assert read_json(one / "manifest.json")["batch_size"] == 1
    assert read_json(three / "manifest.json")["batch_size"] == 3
    decoding = ("niah", "static", "ablation", "progressive", "hotpotqa-static", "hotpotqa", "rag")
    ran = [stage for stage in decoding if (one / stage / "manifest.json").is_file()]  # a random model fails some
    assert {"niah", "static", "hotpotqa", "rag"} <= set(ran)
    for stage in ran:
        assert read_json(three / stage / "manifest.json")["batch_size"] == 3, stage
        records = sorted((one / stage / "samples").glob("*.json"))
        assert records, stage
        for path in records:
            batched = read_json(three / stage / "samples" / path.name)
            assert batched.get("generated") == read_json(path).get("generated"), (stage, path.name)
    with pytest.raises(DynheadsError, match="batch size"):
        reproduce(config, tmp_path / "zero", lm=tiny_lm, progress=False, batch_size=0)


def test_a_preset_sets_the_batch_size_unless_the_command_gives_one(tiny_lm, tiny_model_dir, tmp_path, monkeypatch):
    """Issue 36: ``standard`` decodes in batches of four (its cost); a preset without the key decodes at batch 1,
    the reference path (``quick``: its report stays identical); ``--batch-size`` wins over the preset's."""
    assert reproduce_module.PRESETS["standard"]["batch_size"] == 4
    assert "batch_size" not in reproduce_module.PRESETS["quick"]
    monkeypatch.setattr(stages, "STAGES", Registry(stages.STAGES.kind))  # no stage: the manifest alone
    config = ReproduceConfig(model=str(tiny_model_dir), preset="smoke")

    def batch_size(out: str, **given) -> int:
        return read_json(reproduce(config, tmp_path / out, lm=tiny_lm, progress=False, **given) / "manifest.json")[
            "batch_size"
        ]

    assert batch_size("plain") == 1
    monkeypatch.setitem(reproduce_module.PRESETS, "smoke", {**reproduce_module.PRESETS["smoke"], "batch_size": 3})
    assert batch_size("preset") == 3
    assert batch_size("given", batch_size=1) == 1


def _reads_niah(study) -> None:
    reproduce_module.stage_settings(study.preset, "niah")  # as a stage builds its config: every key of its table


def _reads_ablation_runs(study) -> None:
    if study.preset["ablation"]["runs"] < 2:
        raise DynheadsError("this stage needs runs >= 2")  # a valid value this stage cannot work with


def _two_stage_study(monkeypatch, tiny_model_dir, tmp_path):
    registry = Registry(stages.STAGES.kind)
    registry.register("niah", Stage(f"{__name__}:_reads_niah"), help="reads its table")
    registry.register("ablation", Stage(f"{__name__}:_reads_ablation_runs"), help="reads one key")
    monkeypatch.setattr(stages, "STAGES", registry)
    return ReproduceConfig(model=str(tiny_model_dir), preset="smoke"), tmp_path / "study"


def _edit_smoke(monkeypatch, table: str, **values) -> None:
    """The packaged smoke preset with ``values`` in ``table``: as an edited preset file, or a newer dynheads."""
    smoke = reproduce_module.PRESETS["smoke"]
    monkeypatch.setitem(reproduce_module.PRESETS, "smoke", {**smoke, table: {**smoke[table], **values}})


def test_a_study_resumes_under_a_preset_changed_only_where_no_finished_stage_read_it(
    tiny_lm, tiny_model_dir, tmp_path, monkeypatch
):
    """A stage failed for a value of its table; the table is edited and the study resumed: the failed stage runs
    under the new value, the manifest records it; a change a finished stage read is refused, naming what it read."""
    config, out = _two_stage_study(monkeypatch, tiny_model_dir, tmp_path)
    _edit_smoke(monkeypatch, "ablation", runs=1)
    reproduce(config, out, lm=tiny_lm, progress=False)
    logged = read_json(out / "stages.json")
    assert "error" in logged["ablation"] and "error" not in logged["niah"]
    assert logged["ablation"]["reads"] == ["ablation", "ablation.runs"]
    assert "niah.*" in logged["niah"]["reads"] and "niah.runs" in logged["niah"]["reads"]

    _edit_smoke(monkeypatch, "ablation", runs=2, max_new_tokens=3)  # only the failed stage read the table
    reproduce(config, out, lm=tiny_lm, progress=False)
    assert "error" not in read_json(out / "stages.json")["ablation"]
    recorded = read_json(out / "manifest.json")["preset_settings"]["ablation"]
    assert recorded["runs"] == 2 and recorded["max_new_tokens"] == 3  # the manifest describes what ran

    niah_runs = reproduce_module.PRESETS["smoke"]["niah"]["runs"]
    _edit_smoke(monkeypatch, "niah", runs=niah_runs + 1)
    with pytest.raises(
        DynheadsError, match=r"the tables niah differ now.*finished stage niah read niah\.\*, niah\.runs"
    ):
        reproduce(config, out, lm=tiny_lm, progress=False)
    _edit_smoke(monkeypatch, "niah", runs=niah_runs)
    reproduce(config, out, lm=tiny_lm, progress=False)  # set back: resumes
    _edit_smoke(monkeypatch, "ablation", runs=3)  # read by the finished ablation stage now
    with pytest.raises(DynheadsError, match=r"finished stage ablation read ablation\.runs"):
        reproduce(config, out, lm=tiny_lm, progress=False)


def test_a_study_whose_stages_were_logged_without_their_reads_resumes_only_under_its_tables(
    tiny_lm, tiny_model_dir, tmp_path, monkeypatch
):
    """A newer dynheads may change a preset (the ablation's doses did): a study whose finished stages did not log
    what they read (an older dynheads) resumes only with the tables it started under, else its finished stages and
    the rest would follow two designs."""
    from dynheads.io import write_json

    config, out = _two_stage_study(monkeypatch, tiny_model_dir, tmp_path)
    reproduce(config, out, lm=tiny_lm, progress=False)
    reproduce(config, out, lm=tiny_lm, progress=False)  # the same tables: resumes
    write_json(out / "stages.json", {"niah": {"seconds": 1.0}})  # as an older version logged it
    manifest = read_json(out / "manifest.json")
    manifest["preset_settings"]["ablation"]["doses"] = [1, 2, 3, 5, 8]  # as an older version wrote it
    write_json(out / "manifest.json", manifest)
    with pytest.raises(
        DynheadsError, match="other settings of preset 'smoke' .the tables ablation differ.*niah read the whole preset"
    ):
        reproduce(config, out, lm=tiny_lm, progress=False)


def test_a_preset_file_changes_the_tables_it_gives_over_its_base(tmp_path):
    from dynheads.experiments.reproduce import PRESETS, resolve_preset

    own = tmp_path / "more-questions.toml"
    own.write_text('base = "smoke"\n\n[hotpotqa]\nquestions = 7\n')
    preset = resolve_preset(str(own))
    smoke = PRESETS["smoke"]
    assert preset["hotpotqa"] == {**smoke["hotpotqa"], "questions": 7}  # one key changed, the table's others kept
    assert {key: value for key, value in preset.items() if key != "hotpotqa"} == {
        key: value for key, value in smoke.items() if key != "hotpotqa"
    }
    assert smoke["hotpotqa"]["questions"] == 4  # the packaged preset is left as it was
    assert resolve_preset("smoke") is smoke


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[hotpotqa]\nquestions = 7\n", "must name its base"),
        ('base = "huge"\n', "must name its base, one of smoke, quick, standard, paper"),
        ('base = "smoke"\n[hotpotqa\n', "is not valid TOML"),
        ('base = "smoke"\n[hotpotqa-questions]\nquestions = 7\n', "hotpotqa-questions"),
    ],
)
def test_a_bad_preset_file_is_refused_saying_why(tmp_path, text, says):
    from dynheads.experiments.reproduce import resolve_preset

    own = tmp_path / "mine.toml"
    own.write_text(text)
    with pytest.raises(DynheadsError, match=says):
        resolve_preset(str(own))
    unknown = r"unknown preset 'mine\.yaml': use smoke, quick, standard, paper or a \.toml"
    with pytest.raises(DynheadsError, match=unknown):
        resolve_preset("mine.yaml")


def test_a_study_runs_some_stages_now_and_the_rest_later_into_its_folder(tiny_lm, tiny_model_dir, tmp_path):
    """``--stages``: a study in pieces (e.g. its HotpotQA half in another session) under a preset file of one's own,
    which the manifest records table by table; an unknown stage is refused before any model loads."""
    own = tmp_path / "mine.toml"
    own.write_text('base = "smoke"\n\n[hotpotqa]\nquestions = 5\n')
    config, out = ReproduceConfig(model=str(tiny_model_dir), preset=str(own)), tmp_path / "study"
    reproduce(config, out, lm=tiny_lm, progress=False, only=["hotpotqa-static", "hotpotqa"])
    assert set(read_json(out / "stages.json")) == {"hotpotqa-static", "hotpotqa"}
    manifest = read_json(out / "manifest.json")
    assert manifest["config"]["preset"] == str(own) and manifest["preset_settings"]["hotpotqa"]["questions"] == 5
    assert len(read_json(out / "hotpotqa" / "manifest.json")["questions"]["ids"]) == 5
    reproduce(config, out, lm=tiny_lm, progress=False, only=["hotpotqa-dynamism"])
    assert set(read_json(out / "stages.json")) == {"hotpotqa-static", "hotpotqa", "hotpotqa-dynamism"}
    with pytest.raises(DynheadsError, match="no stage 'hotpot' in this study: its stages are niah, "):
        reproduce(ReproduceConfig(model=str(tmp_path / "no-model"), preset="smoke"), out, only=["hotpot"])
    with pytest.raises(DynheadsError, match="no stage named to run: name some of niah, "):
        reproduce(ReproduceConfig(model=str(tmp_path / "no-model"), preset="smoke"), out, only=[])
