"""Known truth for every rule a verdict can rest on (issue 59): each rule's power on simulated studies where its
claim is true by construction, its false alarms on studies where it is false, and what it says of the paper's own
published rows.

``check_rules`` runs the project's own verdict code (``report.claims``: the same functions, margins and intervals
the report uses) on ``studies`` simulated studies per scenario (``report.simulated`` for head sets and hidden
states; paired per-sample arrays for ablation harms and RAG F1), at the sample counts of the standard preset, and
reads the paper's rows from ``paper_rows.csv`` (each number with the table it comes from). A rule **decides** only
when its power is at least ``POWER_MIN``, its false-alarm rate at most ``FALSE_ALARM_MAX`` (the worst of its false
scenarios) and it calls none of the paper's rows "not supported" where the paper reports the claim; otherwise it is
descriptive. ``report.claims`` declares which rules decide; tests/test_rules.py checks the declaration against this.

Power is the share of true studies a rule calls "supported"; false alarm the share of false studies it calls
"supported" (the worst false scenario); false rejection the share of true studies it calls "not supported" (the
worst true scenario: a rule that says "not supported" of true studies cannot tell a false claim from a weak test).
All are estimates over ``studies`` studies: their standard error is about sqrt(p (1 - p) / studies), and each row
carries the end of the exact (Clopper-Pearson) two-sided 95 % interval on the side that matters: the lowest power
and the highest false-alarm rate its counts allow (``power_low``, ``false_alarm_high``). A rule decides on the
estimates; the bounds say how far more studies could move them. ``scenarios`` runs only the scenarios named, each
from its own seed: a scenario's first ``studies`` studies are the same whatever else runs, so a rule's power or
false alarm can be pinned with more studies of one scenario.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from dynheads.errors import DynheadsError
from dynheads.io import atomic_path
from dynheads.report import claims
from dynheads.report.rule_paper import PaperCheck, paper_checks
from dynheads.report.rule_studies import QA_SETS, SCENARIOS, StudyCounts
from dynheads.tables import Cell, Table, to_markdown

POWER_MIN = 0.8
FALSE_ALARM_MAX = 0.05
DEFAULT_STUDIES = 40
BOUND_LEVEL = 0.95  # the exact bounds on power (lower) and false alarm (upper)


@dataclass(frozen=True)
class RuleCheck:
    """One rule's row of ``rules.csv``."""

    claim: str
    rule: str
    n: int  # samples (or questions) per study, the standard preset's
    studies: int  # simulated studies per scenario
    power: float  # true scenarios: share called "supported" (the lowest over them)
    false_alarm: float  # false scenarios: share called "supported" (the highest over them)
    false_rejection: float  # true scenarios: share called "not supported" (the highest over them)
    power_low: float  # low end of the exact two-sided 95 % interval of ``power`` (its count of ``studies``)
    false_alarm_high: float  # high end of the exact two-sided 95 % interval of ``false_alarm``
    paper_rows: int  # the paper's rows the rule can be read on
    paper_supported: int  # of them, called supported (or within the paper's range)
    paper_not_supported: int  # of them, called "not supported" although the paper reports the claim there
    decides: bool
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def standard_counts() -> StudyCounts:
    """The standard preset's sample counts: NIAH samples, their 30 % test splits (probe and CCA), the ablation
    grid's samples per arm and the RAG questions."""
    with resources.files("dynheads").joinpath("presets/standard.toml").open("rb") as handle:
        preset = tomllib.load(handle)

    def grid(table: dict) -> int:
        return len(table["lengths"]) * len(table["depths"]) * int(table.get("runs", 1))

    niah = grid(preset["niah"])
    return StudyCounts(
        niah=niah,
        test_split=round(preset["probe"]["split"][2] * niah),
        ablation=grid(preset["ablation"]),
        rag=int(preset["rag"]["questions"]),
    )


def check_rules(
    studies: int = DEFAULT_STUDIES,
    seed: int = 0,
    counts: StudyCounts | None = None,
    claims_to_check: Iterable[str] | None = None,
    progress: Callable[[str], None] | None = None,
    scenarios: Iterable[str] | None = None,
) -> list[RuleCheck]:
    """Every rule's power, false alarms and paper rows (see the module docstring), claim by claim; ``scenarios``:
    only the scenarios of these names (``scenario_names``)."""
    counts = counts or standard_counts()
    wanted = set(claims_to_check) if claims_to_check else None
    named = _known_scenarios(scenarios)
    decisions: dict[tuple[str, str], dict[str, list[tuple[str, int]]]] = {}
    for scenario in SCENARIOS:
        if (wanted is not None and scenario.claim not in wanted) or (named is not None and scenario.name not in named):
            continue
        if progress:
            progress(f"{scenario.claim}: {scenario.name} ({studies} studies)")
        rng = np.random.default_rng([seed, SCENARIOS.index(scenario)])
        for _ in range(studies):
            for rule, decided in scenario.decide(counts, rng).items():
                decisions.setdefault((scenario.claim, rule), {}).setdefault(scenario.key, []).append(decided)
    papers = paper_checks()
    return [
        _row(claim, rule, by_scenario, studies, papers.get((claim, rule)))
        for (claim, rule), by_scenario in decisions.items()
    ]


def scenario_names() -> list[str]:
    """Every scenario's name, in run order."""
    return [scenario.name for scenario in SCENARIOS]


def _known_scenarios(names: Iterable[str] | None) -> set[str] | None:
    if names is None:
        return None
    named = set(names)
    unknown = sorted(named - set(scenario_names()))
    if unknown:
        raise DynheadsError(f"no scenario {unknown[0]!r}; the scenarios: {'; '.join(scenario_names())}")
    return named


def exact_bounds(count: int, studies: int) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided ``BOUND_LEVEL`` interval of ``count`` of ``studies``."""
    interval = binomtest(count, studies).proportion_ci(confidence_level=BOUND_LEVEL, method="exact")
    return float(interval.low), float(interval.high)


def _row(
    claim: str,
    rule: str,
    by_scenario: dict[str, list[tuple[str, int]]],
    studies: int,
    paper: PaperCheck | None,
) -> RuleCheck:
    scenarios = {scenario.key: scenario for scenario in SCENARIOS}
    supported = _shares(by_scenario, "supported")
    rejected = _shares(by_scenario, "not supported")
    true = [share for key, share in supported.items() if scenarios[key].truth]
    false = [share for key, share in supported.items() if not scenarios[key].truth]
    power, false_alarm = (min(true) if true else math.nan), (max(false) if false else math.nan)
    false_rejection = max((share for key, share in rejected.items() if scenarios[key].truth), default=math.nan)
    paper = paper or PaperCheck(0, 0, 0, "the paper reports no number this rule reads")
    decides = power >= POWER_MIN and false_alarm <= FALSE_ALARM_MAX and paper.not_supported == 0
    worst = ", ".join(
        f"{scenarios[key].name}: {share:.2f}" for key, share in sorted(supported.items(), key=lambda kv: kv[0])
    )
    return RuleCheck(
        claim=claim,
        rule=rule,
        n=max(n for decided in by_scenario.values() for _, n in decided),
        studies=studies,
        power=power,
        false_alarm=false_alarm,
        false_rejection=false_rejection,
        power_low=exact_bounds(round(power * studies), studies)[0] if true else math.nan,
        false_alarm_high=exact_bounds(round(false_alarm * studies), studies)[1] if false else math.nan,
        paper_rows=paper.rows,
        paper_supported=paper.supported,
        paper_not_supported=paper.not_supported,
        decides=bool(decides),
        note=f"called supported: {worst}; paper: {paper.note}",
    )


def _shares(by_scenario: dict[str, list[tuple[str, int]]], status: str) -> dict[str, float]:
    """Per scenario, the share of its studies a rule gave ``status``."""
    return {key: float(np.mean([s == status for s, _ in decided])) for key, decided in by_scenario.items()}


RULE_COLUMNS = {
    "claim": "claim",
    "rule": "rule",
    "n": "n",
    "power": "power",
    "power_low": "power, 95 % low",
    "false_alarm": "false alarm",
    "false_alarm_high": "false alarm, 95 % high",
    "false_rejection": "true called not supported",
    "paper_rows": "paper rows",
    "paper_supported": "paper supported",
    "decides": "decides",
}


def rules_table(checks: list[RuleCheck]) -> Table:
    """The rules as a table: claim, rule, n, power, false alarm, the paper's rows and whether the rule decides."""
    rows: list[list[Cell]] = [
        [
            check.claim,
            check.rule,
            check.n,
            check.power,
            check.power_low,
            check.false_alarm,
            check.false_alarm_high,
            check.false_rejection,
            check.paper_rows,
            check.paper_supported,
            _decides_text(check),
        ]
        for check in checks
    ]
    return Table(list(RULE_COLUMNS.values()), rows, float_format=".2f", missing="–")


def _decides_text(check: RuleCheck) -> str:
    if math.isnan(check.power) or math.isnan(check.false_alarm):  # a --scenario run of one side
        return "not judged: its true and false scenarios did not both run"
    return "yes" if check.decides else "no (descriptive)"


def write_rules(out: str | Path, checks: list[RuleCheck], *, studies: int, seed: int) -> Path:
    """``rules.csv`` (every column of ``RuleCheck``) and ``rules.md`` (the table, its rule and the notes) in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "rules.csv") as tmp:
        pd.DataFrame([check.to_dict() for check in checks]).to_csv(tmp, index=False)
    text = (
        "# Rules against known truth\n\n"
        f"{studies} simulated studies per scenario (seed {seed}) at the standard preset's sample counts. A rule "
        f"decides when its power >= {POWER_MIN}, its false-alarm rate <= {FALSE_ALARM_MAX} and it calls none of the "
        "paper's rows 'not supported' where the paper reports the claim; else it is descriptive. The 95 % columns "
        "are the ends of the exact (Clopper-Pearson) intervals of those shares at this many studies.\n\n"
        + to_markdown(rules_table(checks))
        + "\n\n"
        + "\n".join(f"- {check.claim}, {check.rule}: {check.note}" for check in checks)
        + "\n"
    )
    with atomic_path(out / "rules.md") as tmp:
        tmp.write_text(text)
    return out / "rules.csv"


def declared_deciding() -> dict[str, tuple[str, ...]]:
    """The rules ``report.claims`` lets decide, per claim (what tests/test_rules.py checks against the table);
    Claims 1 and 3 on both their shapes: NIAH's Eq. 1 sets and HotpotQA's Eq. 2 sets (the predictor trained on
    the sets above the fitted level; there Claim 3's CCA is descriptive); the write heads' contrast (beyond the
    paper, read by ``scripts/write_heads_table.py``)."""
    return {
        claims.CLAIM1: (*claims.CLAIM1_DECIDING, *(rule + QA_SETS for rule in claims.CLAIM1_DECIDING)),
        claims.CLAIM2: tuple(f"dynamic - {arm}" for arm in claims.IRREPLACEABILITY_CONTROLS),
        claims.CLAIM3: (*claims.CLAIM3_DECIDING, *(rule + QA_SETS for rule in claims.CLAIM3_QA_DECIDING)),
        claims.WRITE: claims.WRITE_DECIDING,
    }


def run_rules(
    out: str | Path,
    studies: int = DEFAULT_STUDIES,
    seed: int = 0,
    claims_to_check: Iterable[str] | None = None,
    progress: Callable[[str], None] | None = None,
    scenarios: Iterable[str] | None = None,
) -> list[RuleCheck]:
    """``check_rules`` at the standard preset's counts, written to ``out`` (``rules.csv``, ``rules.md``)."""
    checks = check_rules(studies, seed, claims_to_check=claims_to_check, progress=progress, scenarios=scenarios)
    write_rules(out, checks, studies=studies, seed=seed)
    return checks
