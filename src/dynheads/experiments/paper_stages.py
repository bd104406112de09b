"""The stages of the paper's study, one function each: ``run(study)`` builds the stage's config from the study's
preset table (``Study.settings``) and runs it into ``study.folder(name)``. ``dynheads.stages`` registers each one
under its stage name (``Stage.run``, ``"dynheads.experiments.paper_stages:<function>"``), in the study's order;
``reproduce`` imports this module when it runs them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Unpack

from dynheads import stages
from dynheads.ablation.strategies import DOSE_ARMS
from dynheads.analysis.settings import CCAConfig
from dynheads.errors import DynheadsError
from dynheads.experiments.ablation import AblationConfig, ProgressiveConfig, run_ablation, run_progressive
from dynheads.experiments.dose import run_doses
from dynheads.experiments.hotpotqa import HotpotConfig, run_hotpotqa
from dynheads.experiments.niah import NiahConfig, run_niah
from dynheads.experiments.rag import RagConfig, run_rag
from dynheads.experiments.reproduce import Study
from dynheads.experiments.static import StaticConfig, StaticReasoningConfig, run_static, run_static_reasoning
from dynheads.outputs import Outputs, write_outputs
from dynheads.runs import RunDir, RunOptions
from dynheads.views.analyses import cca_report, dynamism_report, plot_heads
from dynheads.views.probing import train_probe_on_run
from dynheads.views.threshold_fit import ThresholdFit

DEFAULT_STRATEGIES = AblationConfig().strategies  # what --strategies is when not given


def run_claim2(config: AblationConfig, out: str | Path, **options: Unpack[RunOptions]) -> RunDir:
    """Claim 2 in the design the config names: the dose-response when fractions are given (the study's
    ``run_doses``), else the matched grid (``run_ablation``); retired fixed doses are refused by the check."""
    dosed = config.fractions or config.doses
    config.run_strategies()  # an unknown name first
    if dosed and config.strategies != DEFAULT_STRATEGIES:  # the dose-response runs its own arms: not read there
        raise DynheadsError(
            f"--strategies {','.join(config.strategies)} picks the matched grid's strategies: add --fractions '' to "
            f"run them (the dose-response runs its own arms, {', '.join(DOSE_ARMS)}; more with --panel or --contrast)"
        )
    return run_doses(config, out, **options) if dosed else run_ablation(config, out, **options)


# ---- NIAH: the traced grid, the static list, dynamism and Figure 1, the ablations, CCA and the probe -------------
def niah(study: Study) -> object:
    return run_niah(NiahConfig(**study.settings(stages.NIAH)), study.folder(stages.NIAH), **study.options)


def static(study: Study) -> object:
    return run_static(StaticConfig(**study.settings(stages.STATIC)), study.folder(stages.STATIC), **study.options)


def dynamism(study: Study) -> object:
    traced, out = study.folder(stages.NIAH), study.folder(stages.DYNAMISM)
    dynamism_report(traced, study.static_file, static_kind="copy", out_dir=out)
    return plot_heads(traced, _best_samples(traced, 2), out_dir=out)


def ablation(study: Study) -> object:
    settings = study.settings(stages.ABLATION, static=str(study.static_file))
    return run_claim2(AblationConfig(**settings), study.folder(stages.ABLATION), **study.options)


def progressive(study: Study) -> object:
    config = ProgressiveConfig(**study.settings(stages.PROGRESSIVE, static=str(study.static_file)))
    return run_progressive(config, study.folder(stages.PROGRESSIVE), **study.options)


def cca(study: Study) -> object:
    cca = CCAConfig(seed=study.config.seed)
    return cca_report(study.folder(stages.NIAH), study.offsets, cca, out_dir=study.folder(stages.CCA))


def probe(study: Study) -> object:
    return train_probe_on_run(
        study.folder(stages.NIAH),
        study.probe_config,
        out_dir=study.folder(stages.PROBE),
        device=str(study.lm.device),
        progress=study.progress,
    )


# ---- HotpotQA: the reasoning static list, the traced analysis stream, its dynamism, CCA and probe ----------------
def hotpotqa_static(study: Study) -> object:
    config = StaticReasoningConfig(**study.questions.grid(study, stages.HOTPOTQA_STATIC, "static"))
    return run_static_reasoning(config, study.folder(stages.HOTPOTQA_STATIC), **study.options)


def hotpotqa(study: Study) -> object:
    config = HotpotConfig(**study.questions.grid(study, stages.HOTPOTQA, "analysis", split="analysis"))
    return run_hotpotqa(config, study.folder(stages.HOTPOTQA), **study.options)


def hotpotqa_dynamism(study: Study) -> object:
    qa, traced, out = study.questions, study.folder(stages.HOTPOTQA), study.folder(stages.HOTPOTQA_DYNAMISM)
    # Claim 1 compares with the task's own static list (the reasoning list for Eq. 2 tasks), issue 21 item 4
    static = {"copy": study.static_file, "reasoning": qa.reasoning_file}[qa.task.static_kind]
    score = qa.task.score_kind
    dynamism_report(
        traced,
        static,
        score=score,
        threshold=qa.threshold,
        fit_run=qa.fit_stream,
        static_kind=qa.task.static_kind,
        out_dir=out,
    )
    return plot_heads(traced, _best_samples(traced, 1, metric="f1"), score=score, out_dir=out)


def hotpotqa_cca(study: Study) -> object:
    cca, score = CCAConfig(seed=study.config.seed), study.questions.task.score_kind
    return cca_report(
        study.folder(stages.HOTPOTQA), study.offsets, cca, score=score, out_dir=study.folder(stages.HOTPOTQA_CCA)
    )


def hotpotqa_probe(study: Study) -> object:
    """Claim 3's head predictor on HotpotQA (and RAG's): a regressor of the Eq. 2 scores."""
    return _qa_probe(study, stages.HOTPOTQA_PROBE, None)


def hotpotqa_set_probe(study: Study) -> object:
    """Claim 1's head predictor on HotpotQA: a classifier of D_t, the Eq. 2 sets at the threshold the dynamism
    stage applies (fitted on the static stream), ranked within each step as NIAH's Eq. 1 sets are."""
    return _qa_probe(study, stages.HOTPOTQA_SET_PROBE, study.questions.fit())


def _qa_probe(study: Study, stage: str, sets: ThresholdFit | None) -> object:
    """The head predictor of the traced QA stream's scores (``sets``: of the sets a threshold decides) into
    ``stage``'s folder."""
    return train_probe_on_run(
        study.folder(stages.HOTPOTQA),
        study.probe_config,
        score=study.questions.task.score_kind,
        out_dir=study.folder(stage),
        device=str(study.lm.device),
        progress=study.progress,
        **({"sets": sets} if sets else {}),
    )


# ---- HotpotQA: the Eq. 2 ablations (at the fitted threshold) and RAG, each on its own question stream ------------
def _qa_ablation(study: Study, stage: str, stream: str, config_type: type, run: Callable[..., object]) -> None:
    """An Eq. 2 ablation stage (``run``: ``run_claim2`` or ``run_progressive``) on its own question stream, with the
    reasoning list as its static list and the fitted threshold (``fitted_ablation``)."""
    qa, threshold = study.questions, study.questions.fit()
    extra = dict(split=stream, task=qa.task.name, static=str(qa.reasoning_file))
    settings = qa.grid(study, stage, stream, **extra)
    fitted_ablation(run, config_type(**settings), threshold, study.folder(stage), **study.options)


def hotpotqa_ablation(study: Study) -> None:
    _qa_ablation(study, stages.HOTPOTQA_ABLATION, "ablation", AblationConfig, run_claim2)


def hotpotqa_progressive(study: Study) -> None:
    _qa_ablation(study, stages.HOTPOTQA_PROGRESSIVE, "progressive", ProgressiveConfig, run_progressive)


def rag(study: Study) -> object:
    qa = study.questions
    probe = str(study.folder(stages.HOTPOTQA_PROBE))
    config = RagConfig(**qa.grid(study, stages.RAG, "rag", probe=probe, static=str(qa.reasoning_file)))
    return run_rag(config, study.folder(stages.RAG), **study.options)


def fitted_ablation(
    run: Callable[..., object],
    config: AblationConfig | ProgressiveConfig,
    fit: ThresholdFit,
    out: Path,
    **options: Unpack[RunOptions],
) -> None:
    """An Eq. 2 ablation (``run``: ``run_ablation`` or ``run_progressive``) with the threshold ``fit`` applies; the
    fit is written beside the run's manifest (``threshold_fit.json``). Its static list comes from the fitting run,
    so the ablation's refusal of a static list scored on its questions refuses a mixed fit too."""
    run(replace(config, threshold=fit.applied), out, **options)
    write_outputs(out, Outputs().add("threshold_fit.json", fit.to_dict()))


def _best_samples(run_dir: Path, count: int, metric: str = "accuracy") -> list[str]:
    """Samples worth a heat map: the longest generations among those that got the answer (if any did)."""
    records = [r for r in RunDir(run_dir).records() if r["steps"]]  # an empty trace (EOS first) has no map
    ranked = sorted(records, key=lambda r: (-r["metrics"].get(metric, 0), -r["steps"], r["sample_id"]))
    return [r["sample_id"] for r in ranked[:count]]
