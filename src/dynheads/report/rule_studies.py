"""The scenarios ``report.rules`` runs each rule on: simulated studies whose answer is known, decided by the
verdict code of ``report.claims`` at the standard preset's sample counts.

- Claim 1 (false): a fixed static profile, concentrated or broad, and one whose hidden state knows *when* heads
  retrieve but not which; (true): step- and sample-specific heads at our models' set size and at the paper's.
- Claim 2 (true): masking D_t at the operating point costs 1 or 0.5 nats more than either control; (false): the
  controls cost as much, or less than the margin less, or the static list holds D_t (the arms overlap).
- Claim 3 (false): hidden states without signal, and hidden states and heads that share only the step's position
  in the answer; (true): the hidden state encodes the context that picks the step's heads.
- RAG (true): paired per-question F1 at the paper's own Table 4 effects; (false): no difference.
- Write heads (beyond the paper; true): masking W_t costs 1 or 0.5 nats more than masking as many Eq. 1 heads;
  (false): as much, less than the margin more, or as much with heavy-tailed harms.

Claim 1's ranking rule and Claim 3's predictor train the project's head predictor (``analysis.head_predictor``) with
a smaller network than the presets' (``PREDICTOR``) to keep a study to a few seconds; its split is the standard
preset's, so the test split holds the preset's number of samples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dynheads.analysis.cca import cca_offsets
from dynheads.analysis.dynamism import dynamism_stats, per_sample_dynamism
from dynheads.analysis.evidence import Effect, EvidenceSettings, paired_difference
from dynheads.analysis.head_predictor import FittedHeadPredictor, fit_head_predictor
from dynheads.analysis.settings import CCAConfig, HeadPredictorConfig
from dynheads.report import claims
from dynheads.report.simulated import WorldSpec, simulate_study

EVIDENCE = EvidenceSettings(resamples=400)
PREDICTOR = HeadPredictorConfig(hidden_sizes=(64,), epochs=30, early_stopping=5, split=(0.5, 0.2, 0.3))
# HotpotQA's answers are a few tokens: about 200 training steps, a few optimiser steps an epoch. There the rules
# train the standard preset's own network ([probe]: 512-256, 60 epochs, early stopping 8; one split of five).
QA_PREDICTOR = HeadPredictorConfig(hidden_sizes=(512, 256), epochs=60, early_stopping=8, split=(0.5, 0.2, 0.3))
QA_STEPS = 4  # steps per HotpotQA answer (395 of 100 traced answers on Qwen2.5-Coder-1.5B, 16 new tokens at most)
QA_SETS = " on Eq. 2 sets (HotpotQA)"  # the Claim 1 rules read on thresholded Eq. 2 shares: their own rows
QA_SHARES = " on Eq. 2 shares (HotpotQA)"  # the Claim 3 rules read on the shares themselves (the study's regressor)
QA_SHARES_RANKING = "ranking of the Eq. 2 shares themselves (HotpotQA, retired)"
CCA = CCAConfig(resamples=400)
RAG_DISCORDANT = 0.3  # share of questions whose F1 differs between the two strategies (paired)
WRITE_SAMPLES = 34  # the write study's deciding samples on each NIAH model (30 on the spelled needle)
RAG_EFFECTS = {"the paper's largest effect (+0.049 F1, llama3.1-8b)": 0.049, "the paper's median effect": 0.017}


@dataclass(frozen=True)
class StudyCounts:
    """Sample counts of a study: NIAH samples, the 30 % test split (probe, CCA), ablation samples per arm, RAG
    questions."""

    niah: int
    test_split: int
    ablation: int
    rag: int


Decisions = dict[str, tuple[str, int]]  # rule -> (status, n)


@dataclass(frozen=True)
class Scenario:
    """One kind of simulated study: its claim, whether the claim is true in it, and how a study is drawn and
    decided (rule -> status and n)."""

    claim: str
    name: str
    truth: bool
    run: Callable[[StudyCounts, np.random.Generator], Decisions]

    @property
    def key(self) -> str:
        return f"{self.claim}/{self.name}"

    def decide(self, counts: StudyCounts, rng: np.random.Generator) -> Decisions:
        return self.run(counts, rng)


def claim1_study(spec: WorldSpec, steps: int = 32) -> Callable[[StudyCounts, np.random.Generator], Decisions]:
    """Claim 1's rules on one simulated study of ``steps`` steps per answer. On sets (NIAH's Eq. 1) the predictor
    is trained on them; on Eq. 2 shares (HotpotQA) the rules read the sets above the fitted level, the predictor is
    trained on those sets (the study's ``hotpotqa-set-probe``), and the retired design, a regressor of the shares
    ranked by Spearman's correlation over every head, is decided beside it."""

    def run(counts: StudyCounts, rng: np.random.Generator) -> Decisions:
        study = simulate_study(spec, counts.niah, rng, steps=steps)
        sets = study.dynamic_sets()
        data = {
            "stats": dynamism_stats(sets, study.static_ranking).to_dict(),
            "per_sample": per_sample_dynamism(sets, study.static_ranking),
            "static_kind": "copy" if spec.targets == "sets" else "reasoning",
        }
        shares = spec.targets == "shares"
        config = QA_PREDICTOR if shares else PREDICTOR
        fitted = fit_head_predictor(study.set_samples(), config, task="binary", shape=study.shape, progress=False)
        effects = claims.claim1_effects(data, EVIDENCE, {"step_gap": _gap(fitted)})
        decided = {key + (QA_SETS if shares else ""): _decision(effect) for key, effect in effects.items()}
        if shares:
            regressor = fit_head_predictor(
                study.score_samples(), config, task="continuous", shape=study.shape, progress=False
            )
            retired = claims.claim1_effects(data, EVIDENCE, {"step_gap": _gap(regressor)})["ranking"]
            decided[QA_SHARES_RANKING] = _decision(retired)
        return decided

    return run


def _gap(fitted: FittedHeadPredictor) -> dict:
    return fitted.ranking_gap(EVIDENCE).to_dict()


def _decision(effect: Effect) -> tuple[str, int]:
    return effect.decide(EVIDENCE.floor)[0], effect.interval.n


def claim3_study(spec: WorldSpec, steps: int = 32) -> Callable[[StudyCounts, np.random.Generator], Decisions]:
    """Claim 3's rules on one simulated study of ``steps`` steps per answer: the held-out CCA at offset 1 and the
    head predictor against the frequency and step-index profiles. On sets (NIAH) the predictor is a classifier of
    them; on Eq. 2 shares (HotpotQA) two designs are decided side by side: the study's regressor of the shares
    (R², ``QA_SHARES``) and a classifier of D_t, the sets above the fitted level (``QA_SETS``)."""

    def run(counts: StudyCounts, rng: np.random.Generator) -> Decisions:
        study = simulate_study(spec, counts.niah, rng, steps=steps)
        samples = study.score_samples()
        table = cca_offsets(samples, [claims.CCA_OFFSET], CCA, progress=False)
        row = table[table["method"] == "held_out"].iloc[0].to_dict()
        if spec.targets == "sets":
            fitted = fit_head_predictor(samples, PREDICTOR, task="binary", shape=study.shape, progress=False)
            return {
                key: _decision(effect) for key, effect in claims.claim3_effects(row, _probe(fitted), "auprc").items()
            }
        regressor = fit_head_predictor(samples, QA_PREDICTOR, task="continuous", shape=study.shape, progress=False)
        decided = {
            key + QA_SHARES: _decision(effect)
            for key, effect in claims.claim3_effects(row, _probe(regressor), "r2").items()
        }
        classifier = fit_head_predictor(
            study.set_samples(), QA_PREDICTOR, task="binary", shape=study.shape, progress=False
        )
        effects = claims.claim3_effects(row, _probe(classifier), "auprc", claims.SET_PROBE_MARGIN)
        for key in ("predictor", "predictor_frequency"):
            decided[key + QA_SETS] = _decision(effects[key])
        return decided

    return run


def _probe(fitted: FittedHeadPredictor) -> dict:
    """The head predictor's gaps as ``claims.claim3_effects`` reads them."""
    return {"position_gap": fitted.position_gap(EVIDENCE).to_dict(), "gap": fitted.frequency_gap(EVIDENCE).to_dict()}


def claim2_study(effect: float, sd: float, overlap: float) -> Callable[[StudyCounts, np.random.Generator], Decisions]:
    """Per sample, the teacher-forced drop at f = 1: dynamic's mean ``1.0`` nats (sd 0.6), each control's
    ``effect`` nats less (paired noise of sd ``sd``); static masks ``overlap`` of D_t (its drop then moves toward
    dynamic's in that share); one sample in ten answered wrongly."""

    def run(counts: StudyCounts, rng: np.random.Generator) -> Decisions:
        n = counts.ablation
        dynamic = rng.normal(1.0, 0.6, n)
        outside, random = (dynamic - effect + rng.normal(0, sd, n) for _ in range(2))
        static = overlap * dynamic + (1 - overlap) * (dynamic - effect) + rng.normal(0, sd, n)
        drops = {"dynamic": dynamic, "static": static, "static_outside": outside, "random": random}
        shares = {"dynamic": np.ones(n), "static": np.full(n, overlap), "static_outside": np.zeros(n)}
        point = claims.OperatingPoint(drops, drops, {**shares, "random": np.zeros(n)}, rng.random(n) > 0.1)
        verdict = claims.operating_point_verdict(point, "NIAH", EVIDENCE)
        decided = int(point.decided().sum())
        readings = {
            f"dynamic - {arm}": verdict.contrasts.get(f"dynamic - {arm}", verdict.status) for arm in CLAIM2_ARMS
        }
        return {rule: (reading, decided) for rule, reading in readings.items()}

    return run


CLAIM2_ARMS = ("static_outside", "random", "static")


def write_study(
    effect: float, sd: float, heavy_tails: bool = False
) -> Callable[[StudyCounts, np.random.Generator], Decisions]:
    """Per sample of the write study's ``WRITE_SAMPLES``, the teacher-forced drop at f = 1 of masking W_t (mean 1.0
    nats, sd 0.6) and of masking as many Eq. 1-ranked heads, ``effect`` nats less with paired noise of sd ``sd``
    (``heavy_tails``: Student's t with 3 degrees of freedom scaled to that sd, a few samples far out). The two arms
    share heads in the measured studies (half or more); the shared heads' harm cancels from the difference the
    rule reads, so the noise here is that of the difference itself, above the sd the measured studies show
    (0.2-0.7 nats)."""

    def run(counts: StudyCounts, rng: np.random.Generator) -> Decisions:
        write = rng.normal(1.0, 0.6, WRITE_SAMPLES)
        noise = rng.standard_t(3, WRITE_SAMPLES) * sd / np.sqrt(3) if heavy_tails else rng.normal(0, sd, WRITE_SAMPLES)
        effect_ = claims.write_contrast(paired_difference(write, write - effect + noise, EVIDENCE))
        return {effect_.name: (effect_.decide(EVIDENCE.floor)[0], WRITE_SAMPLES)}

    return run


def rag_study(effect: float) -> Callable[[StudyCounts, np.random.Generator], Decisions]:
    """Per question two F1 values (each 0, 1 or partial); on ``RAG_DISCORDANT`` of the questions the strategies get
    different ones, the higher going to Dynamic with the probability that makes the mean difference ``effect``
    (0.5 at no difference: the two strategies are exchangeable, an exact null); the others get the same value."""

    def run(counts: StudyCounts, rng: np.random.Generator) -> Decisions:
        n = counts.rag
        first, second = _f1_values(rng, n), _f1_values(rng, n)
        high, low = np.maximum(first, second), np.minimum(first, second)
        discordant = rng.random(n) < RAG_DISCORDANT
        dynamic_better = rng.random(n) < 0.5 + effect / (2 * RAG_DISCORDANT * RAG_SPREAD)
        dynamic = np.where(discordant, np.where(dynamic_better, high, low), first)
        static = np.where(discordant, np.where(dynamic_better, low, high), first)
        verdict = claims.rag_verdict({5: (dynamic, static)}, "RAG", EVIDENCE)
        return {"rag": (verdict.effects[0].decide(EVIDENCE.floor)[0], n)}

    return run


def _f1_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """Per-question F1 as QA answers score: 0 or 1 (0.4 each), else partial (uniform)."""
    kind = rng.random(n)
    return np.where(kind < 0.4, 0.0, np.where(kind < 0.8, 1.0, rng.random(n)))


# E|u - v| of two such values: 2(0.4)(0.4) x 1 + 2(0.2)(0.8) x 1/2 + (0.2)^2 x 1/3 (exact)
RAG_SPREAD = 2 * 0.4 * 0.4 + 2 * 0.2 * 0.8 * 0.5 + 0.2**2 / 3


STATIC_CONCENTRATED = WorldSpec(alpha=1.5)
STATIC_BROAD = WorldSpec(alpha=0.7)
STATIC_TIMED = WorldSpec(alpha=1.0, timing="hidden")
DYNAMIC = WorldSpec(modes=12)
DYNAMIC_PAPER_SIZE = WorldSpec(modes=12, mean_size=13.0, mode_heads=30)
# HotpotQA's Eq. 2 shares (D_t: the heads above the level giving 10 per step, as calibrated:10), 4 steps an answer
SHARES_STATIC = WorldSpec(targets="shares", mean_size=10.0)
SHARES_TIMED = WorldSpec(targets="shares", mean_size=10.0, timing="hidden")
SHARES_DYNAMIC = WorldSpec(targets="shares", mean_size=10.0, modes=12)
SHARES_WEAK = WorldSpec(targets="shares", mean_size=10.0, modes=12, boost=1.5)
# Claim 3 on a smaller model (16 x 8 heads): the CCA's PCA of every head's scores dominates a study's time
POSITION_ONLY = WorldSpec(layers=16, heads=8, alpha=1.0, timing="position")
NO_SIGNAL = WorldSpec(layers=16, heads=8, alpha=1.0, signal=0.0)
PLANNING = WorldSpec(layers=16, heads=8, modes=12, lookahead=1.0)
# Claim 3 at HotpotQA's shape: Eq. 2 shares, 4 steps an answer, on the smaller model
SHARES_NO_SIGNAL = WorldSpec(layers=16, heads=8, targets="shares", mean_size=10.0, signal=0.0)
SHARES_POSITION_ONLY = WorldSpec(layers=16, heads=8, targets="shares", mean_size=10.0, timing="position")
SHARES_PLANNING = WorldSpec(layers=16, heads=8, targets="shares", mean_size=10.0, modes=12, lookahead=1.0)
SHARES_PLANNING_WEAK = WorldSpec(
    layers=16, heads=8, targets="shares", mean_size=10.0, modes=12, lookahead=1.0, boost=1.5
)

SCENARIOS: list[Scenario] = [
    Scenario(claims.CLAIM1, "static profile, concentrated", False, claim1_study(STATIC_CONCENTRATED)),
    Scenario(claims.CLAIM1, "static profile, broad", False, claim1_study(STATIC_BROAD)),
    Scenario(claims.CLAIM1, "static profile, hidden state knows when", False, claim1_study(STATIC_TIMED)),
    Scenario(claims.CLAIM1, "step- and sample-specific heads, |D_t| 5", True, claim1_study(DYNAMIC)),
    Scenario(claims.CLAIM1, "step- and sample-specific heads, |D_t| 13", True, claim1_study(DYNAMIC_PAPER_SIZE)),
    Scenario(claims.CLAIM2, "D_t irreplaceable by 1 nat", True, claim2_study(1.0, 1.0, 0.3)),
    Scenario(claims.CLAIM2, "D_t irreplaceable by 0.5 nats", True, claim2_study(0.5, 0.8, 0.3)),
    Scenario(claims.CLAIM2, "replaceable: controls cost as much", False, claim2_study(0.0, 0.8, 0.3)),
    Scenario(claims.CLAIM2, "replaceable within the margin (+0.05)", False, claim2_study(0.05, 0.8, 0.3)),
    Scenario(claims.CLAIM2, "static list holds D_t (overlap 0.8)", False, claim2_study(0.0, 0.8, 0.8)),
    Scenario(claims.CLAIM3, "no signal", False, claim3_study(NO_SIGNAL)),
    Scenario(claims.CLAIM3, "position in the answer only", False, claim3_study(POSITION_ONLY)),
    Scenario(claims.CLAIM3, "hidden state encodes this step's and the next step's heads", True, claim3_study(PLANNING)),
    *(Scenario(claims.RAG, name, True, rag_study(effect)) for name, effect in RAG_EFFECTS.items()),
    Scenario(claims.RAG, "no difference", False, rag_study(0.0)),
    # appended last: a scenario's seed is its index, so the rows above draw what they drew before these existed
    Scenario(claims.CLAIM1, "Eq. 2 shares, static profile", False, claim1_study(SHARES_STATIC, QA_STEPS)),
    Scenario(claims.CLAIM1, "Eq. 2 shares, hidden state knows when", False, claim1_study(SHARES_TIMED, QA_STEPS)),
    Scenario(claims.CLAIM1, "Eq. 2 shares, context lifts its heads 2.5", True, claim1_study(SHARES_DYNAMIC, QA_STEPS)),
    Scenario(claims.CLAIM1, "Eq. 2 shares, context lifts its heads 1.5", True, claim1_study(SHARES_WEAK, QA_STEPS)),
    Scenario(claims.CLAIM3, "Eq. 2 shares, no signal", False, claim3_study(SHARES_NO_SIGNAL, QA_STEPS)),
    Scenario(
        claims.CLAIM3, "Eq. 2 shares, position in the answer only", False, claim3_study(SHARES_POSITION_ONLY, QA_STEPS)
    ),
    Scenario(
        claims.CLAIM3,
        "Eq. 2 shares, hidden state encodes this step's and the next step's contexts (lift 2.5)",
        True,
        claim3_study(SHARES_PLANNING, QA_STEPS),
    ),
    Scenario(
        claims.CLAIM3,
        "Eq. 2 shares, hidden state encodes this step's and the next step's contexts (lift 1.5)",
        True,
        claim3_study(SHARES_PLANNING_WEAK, QA_STEPS),
    ),
    Scenario(claims.WRITE, "W_t costs 1 nat more than as many Eq. 1 heads", True, write_study(1.0, 1.0)),
    Scenario(claims.WRITE, "W_t costs 0.5 nats more than as many Eq. 1 heads", True, write_study(0.5, 0.8)),
    Scenario(claims.WRITE, "W_t costs as much as as many Eq. 1 heads", False, write_study(0.0, 0.8)),
    Scenario(claims.WRITE, "W_t costs as much, heavy-tailed harms (t, 3 df)", False, write_study(0.0, 0.8, True)),
    Scenario(claims.WRITE, "W_t costs within the margin more (+0.05)", False, write_study(0.05, 0.8)),
]
