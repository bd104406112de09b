"""``dynheads reproduce``: every stage of the paper in order, into sub-folders of one directory.

Each stage is resumable on its own (run directories skip finished samples; analysis stages are skipped when
their output exists), so an interrupted ``reproduce`` continues where it stopped and ends with the same
stage outputs. Stage wall times are recorded in ``stages.json``. The report (``dynheads.report.write_report``)
is written from the finished folder by the caller (the CLI's ``reproduce`` command): experiments never import
the report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from dynheads import stages
from dynheads.analysis.cca import CCAConfig
from dynheads.analysis.mlp_probe import ProbeConfig
from dynheads.errors import DynheadsError
from dynheads.experiments.ablation import AblationConfig, ProgressiveConfig, run_ablation, run_progressive
from dynheads.experiments.analyses import cca_report, dynamism_report, plot_heads
from dynheads.experiments.hotpotqa import HotpotConfig, run_hotpotqa
from dynheads.experiments.niah import NiahConfig, run_niah
from dynheads.experiments.probing import train_probe_on_run
from dynheads.experiments.rag import RagConfig, run_rag
from dynheads.experiments.static import StaticConfig, StaticReasoningConfig, run_static, run_static_reasoning
from dynheads.io import read_json, write_json
from dynheads.models import LoadedModel, load_model
from dynheads.runs import RunDir
from dynheads.tasks.questions import QuestionStream, disjoint_streams
from dynheads.tasks.registry import HOTPOTQA, task_of


@dataclass(frozen=True)
class Preset:
    """Sizes of every stage. ``quick`` fits a 2-core CPU in minutes; ``paper`` uses the paper's settings where it
    states them and our choices where it does not (``PAPER_PRESET_SOURCES`` says which is which)."""

    niah_lengths: tuple[int, ...]
    niah_depths: tuple[float, ...]
    niah_runs: int
    static_samples: int
    static_success_threshold: float  # Wu et al.'s ROUGE-1 filter; below 0 every test counts
    max_new_tokens: int
    ablation_lengths: tuple[int, ...]
    ablation_depths: tuple[float, ...]
    ablation_runs: int
    progressive_ks: tuple[int, ...]
    progressive_length: int
    progressive_runs: int
    cca_offsets: tuple[int, ...]
    probe: ProbeConfig
    hotpot_questions: int
    hotpot_lengths: tuple[int, ...]
    hotpot_depths: tuple[float, ...]
    hotpot_max_new_tokens: int
    hotpot_ablation_lengths: tuple[int, ...]
    hotpot_ablation_depths: tuple[float, ...]
    hotpot_ablation_questions: int
    rag_questions: int
    rag_ks: tuple[int, ...]
    rag_length: int
    hotpot_static_questions: int  # the stream static reasoning heads are scored on
    qa_source: str | None = None  # questions of the multi-hop and RAG stages when no HotpotQA file is given


PRESETS = {
    # Seconds, on any model: checks an installation end to end (the test suite uses it on a tiny model).
    "smoke": Preset(
        niah_lengths=(200,), niah_depths=(0.0, 1.0), niah_runs=2, static_samples=2, max_new_tokens=4,
        static_success_threshold=-1.0,  # a random model never retrieves: let every test count
        ablation_lengths=(200,), ablation_depths=(0.5,), ablation_runs=1, progressive_ks=(0, 2), progressive_length=200,
        progressive_runs=1, cca_offsets=(0, 1), probe=ProbeConfig(hidden_sizes=(16,), epochs=2),
        hotpot_questions=4, hotpot_lengths=(300,), hotpot_depths=(0.5,), hotpot_max_new_tokens=3,
        hotpot_ablation_lengths=(300,), hotpot_ablation_depths=(0.5,), hotpot_ablation_questions=1,
        rag_questions=1, rag_ks=(2,), rag_length=300, hotpot_static_questions=2,
    ),
    "quick": Preset(
        niah_lengths=(500, 1000), niah_depths=(0.0, 0.25, 0.5, 0.75, 1.0), niah_runs=2, static_samples=10,
        static_success_threshold=0.5, max_new_tokens=44, ablation_lengths=(500, 1000),
        ablation_depths=(0.0, 0.5, 1.0), ablation_runs=1, progressive_ks=(0, 2, 5), progressive_length=1000,
        progressive_runs=2, cca_offsets=tuple(range(11)),
        probe=ProbeConfig(hidden_sizes=(512, 256), epochs=60, early_stopping=8),
        hotpot_questions=18, hotpot_lengths=(250, 500, 1000), hotpot_depths=(0.05, 0.5, 0.95),
        hotpot_max_new_tokens=16, hotpot_ablation_lengths=(250, 500), hotpot_ablation_depths=(0.05, 0.95),
        hotpot_ablation_questions=6, rag_questions=6, rag_ks=(5,), rag_length=500, hotpot_static_questions=9,
        qa_source="multihop",  # the embedded model solves it; synthetic HotpotQA is noise on it (docs/multihop.md)
    ),
    "paper": Preset(
        niah_lengths=(1000, 2000, 4000, 8000), niah_depths=(0.0, 0.25, 0.5, 0.75, 1.0), niah_runs=5,
        static_samples=100, static_success_threshold=0.5, max_new_tokens=64, ablation_lengths=(1000, 2000, 4000, 8000),
        ablation_depths=(0.0, 0.25, 0.5, 0.75, 1.0), ablation_runs=5, progressive_ks=(0, 5, 10, 15, 20),
        progressive_length=5000, progressive_runs=20, cca_offsets=tuple(range(11)), probe=ProbeConfig(),
        hotpot_questions=500, hotpot_lengths=(250, 1000, 2000, 3750), hotpot_depths=(0.05, 0.25, 0.5, 0.75, 0.95),
        hotpot_max_new_tokens=32, hotpot_ablation_lengths=(250, 1000, 2000, 3750),
        hotpot_ablation_depths=(0.05, 0.25, 0.5, 0.75, 0.95), hotpot_ablation_questions=500,
        rag_questions=500, rag_ks=(5, 10, 20), rag_length=2000, hotpot_static_questions=100,
    ),
}


# Where each value of the ``paper`` preset comes from: "paper" = stated in the paper (section / appendix named),
# "inferred" = the paper is silent and this is our choice (why given). Recorded in the manifest of a paper run.
PAPER_PRESET_SOURCES = {
    "niah_lengths": "inferred: the text gives no haystack lengths for the NIAH grid; 1k-8k chosen",
    "niah_depths": "inferred: depths 0-100 % in quarters (Wu et al.'s grid style)",
    "niah_runs": "inferred: 5 per cell, as the paper states for the ablation grid",
    "static_samples": "inferred: the paper does not say how many NIAH tests found its static heads",
    "static_success_threshold": "Wu et al.'s reference filter (ROUGE-1 recall > 0.5), not stated by the paper",
    "max_new_tokens": "inferred: enough for a UUID answer (~35 tokens) with room",
    "ablation_lengths": "inferred: same as niah_lengths",
    "ablation_depths": "inferred: same as niah_depths",
    "ablation_runs": "paper: 5 independent runs per grid cell (appendix, Figure 2)",
    "progressive_ks": "paper: k at intervals of 5 up to 20 (Section 4.2.2, appendix)",
    "progressive_length": "paper: haystack fixed at 5000 tokens (appendix, Figure 3)",
    "progressive_runs": "paper: 20 independent runs (appendix, Figure 3)",
    "cca_offsets": "paper: temporal offset k from 0 to 10 (appendix)",
    "probe": "paper: [8192, 4096, 4096], dropout 0.1, Adam 3e-4, plateau patience 3, 100 epochs, batch 128, "
             "clip 1.0, asymmetric loss, 70/20/10 split (appendix)",
    "hotpot_questions": "inferred: 500, as for RAG",
    "hotpot_lengths": "paper: range 250-3750 tokens (Figure 6); the points 1000 and 2000 between are ours",
    "hotpot_depths": "paper: range 5-95 % (Figure 6); the points 25, 50, 75 % between are ours",
    "hotpot_max_new_tokens": "inferred: short answers",
    "hotpot_ablation_lengths": "paper range as hotpot_lengths; points ours",
    "hotpot_ablation_depths": "paper range as hotpot_depths; points ours",
    "hotpot_ablation_questions": "inferred: 500",
    "rag_questions": "inferred: 500 (every EM in Table 4 is a multiple of 0.002)",
    "rag_ks": "paper: k = 5 (Table 4) and 5, 10, 20 (Table 6)",
    "rag_length": "inferred: the paper does not state the RAG context length",
    "hotpot_static_questions": "inferred: the paper does not say how static reasoning heads were found; 100 "
                               "questions on their own stream",
    "qa_source": "inferred: None = synthetic HotpotQA questions; the paper uses the real HotpotQA files (--hotpotqa)",
}


@dataclass(frozen=True)
class ReproduceConfig:
    model: str | None = field(default=None, metadata={"help": "hub id, folder or .gguf; None = embedded SmolLM2"})
    preset: str = field(default="quick", metadata={"help": "smoke (seconds), quick (CPU, minutes), paper (GPU)"})
    hotpotqa: str | None = field(default=None, metadata={
        "help": "real HotpotQA file; None = the preset's question source (quick: multihop; else synthetic)"})
    seed: int = field(default=0, metadata={"help": "master seed of every stage"})
    device: str | None = field(default=None, metadata={"help": "cpu / cuda; None picks cuda when available"})


class _Stages:
    """Runs named stages once each. A stage is logged in ``stages.json`` (with the wall time of the attempt that
    finished it) only after it completes, so a re-run skips finished stages and resumes the interrupted one."""

    def __init__(self, out: Path):
        self.log_path = out / "stages.json"
        self.log: dict = read_json(self.log_path) if self.log_path.is_file() else {}

    def run(self, name: str, fn: Callable[[], object]) -> None:
        """Run ``fn`` unless logged; a stage this model cannot support (a ``DynheadsError``, e.g. constant head
        scores for CCA) is logged with its reason, which the report shows, and the study goes on."""
        if name in self.log:
            return
        print(f"[reproduce] {name}", flush=True)
        start = time.perf_counter()
        try:
            fn()
            entry: dict = {"seconds": round(time.perf_counter() - start, 1)}
        except DynheadsError as error:
            print(f"[reproduce] {name} failed: {error}", flush=True)
            entry = {"seconds": round(time.perf_counter() - start, 1), "error": str(error)}
        self.log[name] = entry
        write_json(self.log_path, self.log)


def reproduce(config: ReproduceConfig, out: str | Path, *, lm: LoadedModel | None = None,
              progress: bool = True) -> Path:
    """Run the whole study into ``out`` (one sub-folder per stage); returns ``out``, ready for ``write_report``."""
    if config.preset not in PRESETS:
        raise DynheadsError(f"unknown preset {config.preset!r}: use {', '.join(PRESETS)}")
    preset, out = PRESETS[config.preset], Path(out)
    lm = lm or load_model(config.model, device=config.device)
    RunDir(out).start("reproduce", config, lm, {"preset_settings": _jsonable(preset), **(
        {"preset_sources": PAPER_PRESET_SOURCES} if config.preset == "paper" else {})})
    study = _Stages(out)
    common = dict(model=config.model, seed=config.seed, device=config.device)
    static_file = out / stages.STATIC / "static_heads.json"

    niah = NiahConfig(lengths=preset.niah_lengths, depths=preset.niah_depths, runs=preset.niah_runs,
                      max_new_tokens=preset.max_new_tokens, **common)
    study.run(stages.NIAH, lambda: run_niah(niah, out / stages.NIAH, lm=lm, progress=progress))
    static = StaticConfig(samples=preset.static_samples, lengths=preset.niah_lengths, depths=preset.niah_depths,
                          max_new_tokens=preset.max_new_tokens, success_threshold=preset.static_success_threshold,
                          **common)
    study.run(stages.STATIC, lambda: run_static(static, out / stages.STATIC, lm=lm, progress=progress))
    study.run(stages.DYNAMISM, lambda: (
        dynamism_report(out / stages.NIAH, static_file, out_dir=out / stages.DYNAMISM),
        plot_heads(out / stages.NIAH, _best_samples(out / stages.NIAH, 2), out_dir=out / stages.DYNAMISM)))
    ablation = AblationConfig(lengths=preset.ablation_lengths, depths=preset.ablation_depths,
                              runs=preset.ablation_runs, max_new_tokens=preset.max_new_tokens,
                              static=str(static_file), **common)
    study.run(stages.ABLATION, lambda: run_ablation(ablation, out / stages.ABLATION, lm=lm, progress=progress))
    progressive = ProgressiveConfig(ks=preset.progressive_ks, lengths=(preset.progressive_length,), depths=(0.5,),
                                    runs=preset.progressive_runs, max_new_tokens=preset.max_new_tokens,
                                    static=str(static_file), **common)
    study.run(stages.PROGRESSIVE, lambda: run_progressive(progressive, out / stages.PROGRESSIVE, lm=lm,
                                                          progress=progress))
    cca = CCAConfig(seed=config.seed)
    study.run(stages.CCA, lambda: cca_report(out / stages.NIAH, preset.cca_offsets, cca, out_dir=out / stages.CCA))
    probe_config = replace(preset.probe, seed=config.seed)
    study.run(stages.PROBE, lambda: train_probe_on_run(
        out / stages.NIAH, probe_config, out_dir=out / stages.PROBE, device=str(lm.device), progress=progress))

    qa_data = config.hotpotqa or preset.qa_source  # a HotpotQA file, when given, always wins
    qa = task_of(HOTPOTQA.name, qa_data)  # HotpotQA, or the multi-hop task standing for it
    streams = hotpot_streams(preset)  # disjoint question ranges: nothing is fitted and evaluated on one question
    hotpot_grid = dict(lengths=preset.hotpot_lengths, depths=preset.hotpot_depths,
                       max_new_tokens=preset.hotpot_max_new_tokens, **common)
    reasoning = StaticReasoningConfig(data=qa_data, questions=streams["static"].count,
                                      first=streams["static"].first, **hotpot_grid)
    study.run(stages.HOTPOTQA_STATIC, lambda: run_static_reasoning(reasoning, out / stages.HOTPOTQA_STATIC, lm=lm,
                                                             progress=progress))
    reasoning_file = out / stages.HOTPOTQA_STATIC / "static_heads.json"
    hotpot = HotpotConfig(data=qa_data, questions=streams["analysis"].count, first=streams["analysis"].first,
                          split="analysis", **hotpot_grid)
    study.run(stages.HOTPOTQA, lambda: run_hotpotqa(hotpot, out / stages.HOTPOTQA, lm=lm, progress=progress))
    study.run(stages.HOTPOTQA_DYNAMISM, lambda: (
        dynamism_report(out / stages.HOTPOTQA, static_file, score=qa.score_kind,
                        out_dir=out / stages.HOTPOTQA_DYNAMISM),
        plot_heads(out / stages.HOTPOTQA, _best_samples(out / stages.HOTPOTQA, 1, metric="f1"), score=qa.score_kind,
                   out_dir=out / stages.HOTPOTQA_DYNAMISM)))
    study.run(stages.HOTPOTQA_CCA, lambda: cca_report(
        out / stages.HOTPOTQA, preset.cca_offsets, cca, score=qa.score_kind, out_dir=out / stages.HOTPOTQA_CCA))
    study.run(stages.HOTPOTQA_PROBE, lambda: train_probe_on_run(
        out / stages.HOTPOTQA, probe_config, score=qa.score_kind, out_dir=out / stages.HOTPOTQA_PROBE,
        device=str(lm.device), progress=progress))
    hotpot_task = dict(task=qa.name, data=qa_data, max_new_tokens=preset.hotpot_max_new_tokens,
                       static=str(reasoning_file), **common)
    hotpot_ablation = AblationConfig(lengths=preset.hotpot_ablation_lengths, depths=preset.hotpot_ablation_depths,
                                     questions=streams["ablation"].count, first=streams["ablation"].first,
                                     split="ablation", **hotpot_task)
    study.run(stages.HOTPOTQA_ABLATION, lambda: run_ablation(hotpot_ablation, out / stages.HOTPOTQA_ABLATION, lm=lm,
                                                       progress=progress))
    hotpot_progressive = ProgressiveConfig(ks=preset.progressive_ks, lengths=preset.hotpot_ablation_lengths[:1],
                                           depths=(0.5,), questions=streams["progressive"].count,
                                           first=streams["progressive"].first, split="progressive", **hotpot_task)
    study.run(stages.HOTPOTQA_PROGRESSIVE, lambda: run_progressive(
        hotpot_progressive, out / stages.HOTPOTQA_PROGRESSIVE, lm=lm, progress=progress))
    rag = RagConfig(probe=str(out / stages.HOTPOTQA_PROBE), static=str(reasoning_file), ks=preset.rag_ks,
                    data=qa_data, questions=streams["rag"].count, first=streams["rag"].first,
                    lengths=(preset.rag_length,), **common)
    study.run(stages.RAG, lambda: run_rag(rag, out / stages.RAG, lm=lm, progress=progress))
    return out


def hotpot_streams(preset: Preset) -> dict[str, QuestionStream]:
    """The HotpotQA question streams of a study, end to end in this order: static reasoning heads, the traced
    analysis run (dynamism, CCA, probe), ablation, progressive ablation, RAG."""
    return disjoint_streams([("static", preset.hotpot_static_questions), ("analysis", preset.hotpot_questions),
                             ("ablation", preset.hotpot_ablation_questions),
                             ("progressive", preset.progressive_runs), ("rag", preset.rag_questions)])


def _best_samples(run_dir: Path, count: int, metric: str = "accuracy") -> list[str]:
    """Samples worth a heat map: the longest generations among those that got the answer (if any did)."""
    records = [r for r in RunDir(run_dir).records() if r["steps"]]  # an empty trace (EOS first) has no map
    ranked = sorted(records, key=lambda r: (-r["metrics"].get(metric, 0), -r["steps"], r["sample_id"]))
    return [r["sample_id"] for r in ranked[:count]]


def _jsonable(value) -> dict:
    return json.loads(json.dumps(asdict(value), default=str))
