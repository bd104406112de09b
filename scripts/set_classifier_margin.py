"""Per-study intervals of Claim 3's deciding rule on Eq. 2 sets (HotpotQA): the head predictor, a classifier of D_t,
minus the better of the frequency and step-index profiles (AUPRC), on ``dynheads rules``' simulated studies, so a
margin can be chosen on some seeds and tested on others.

    python scripts/set_classifier_margin.py draw --seed 1 --studies 200 --out calib.csv \
        --scenario "no signal" --scenario "position only" --scenario "lift 2.5" --scenario "lift 1.5"
    python scripts/set_classifier_margin.py count calib.csv [more.csv ...] --margin 0 --margin 0.0025

``draw`` runs the studies ``dynheads rules --seed S --scenario NAME`` runs (the same generator, the same draws, the
same classifier; the CCA and the shares' regressor, which draw nothing, are skipped) and appends one row per study
(the classifier's gap: effect, 95 % interval, test samples); re-running it continues after the rows already written.
The scenarios, by the short names used here, are ``WORLDS``. ``count`` reads each study's interval against each margin
with the verdict code's own ``Effect`` at the rule studies' floor (``EVIDENCE.floor``): how many read "supported",
with the exact 95 % interval.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
import pandas as pd

from dynheads.analysis.evidence import Effect, Interval
from dynheads.analysis.head_predictor import fit_head_predictor
from dynheads.report.rule_studies import (
    EVIDENCE,
    QA_PREDICTOR,
    QA_STEPS,
    SCENARIOS,
    SHARES_NO_SIGNAL,
    SHARES_PLANNING,
    SHARES_PLANNING_WEAK,
    SHARES_POSITION_ONLY,
)
from dynheads.report.rules import exact_bounds, standard_counts
from dynheads.report.simulated import WorldSpec, simulate_study

WORLDS = {  # short name: the Claim 3 scenario on Eq. 2 shares (``report.rule_studies.SCENARIOS``) and its world
    "no signal": ("Eq. 2 shares, no signal", SHARES_NO_SIGNAL),
    "position only": ("Eq. 2 shares, position in the answer only", SHARES_POSITION_ONLY),
    "lift 2.5": (
        "Eq. 2 shares, hidden state encodes this step's and the next step's contexts (lift 2.5)",
        SHARES_PLANNING,
    ),
    "lift 1.5": (
        "Eq. 2 shares, hidden state encodes this step's and the next step's contexts (lift 1.5)",
        SHARES_PLANNING_WEAK,
    ),
}
COLUMNS = ["scenario", "seed", "study", "effect", "low", "high", "n"]


def world_of(short: str) -> tuple[WorldSpec, int]:
    """The scenario's world and its index (the generator's seed is [seed, index], as in ``report.rules``)."""
    if short not in WORLDS:
        raise SystemExit(f"no scenario {short!r}; these: {', '.join(WORLDS)}")
    name, spec = WORLDS[short]
    return spec, [scenario.name for scenario in SCENARIOS].index(name)


def draw(names: list[str], seed: int, studies: int, out: Path) -> None:
    counts = standard_counts()
    written = pd.read_csv(out) if out.exists() else pd.DataFrame(columns=COLUMNS)
    mine = written[written["seed"] == seed]
    done = {name: int(group["study"].max()) + 1 for name, group in mine.groupby("scenario")}
    with out.open("a", newline="") as handle:
        writer = csv.writer(handle)
        if not out.stat().st_size:
            writer.writerow(COLUMNS)
        for name in names:
            spec, index = world_of(name)
            rng = np.random.default_rng([seed, index])
            for study_index in range(studies):
                study = simulate_study(spec, counts.niah, rng, steps=QA_STEPS)
                if study_index < done.get(name, 0):
                    continue  # drawn again only to move the generator on
                classifier = fit_head_predictor(
                    study.set_samples(), QA_PREDICTOR, task="binary", shape=study.shape, progress=False
                )
                gap = classifier.position_gap(EVIDENCE)
                writer.writerow([name, seed, study_index, repr(gap.effect), repr(gap.low), repr(gap.high), gap.n])
                handle.flush()
                print(name, study_index, f"{gap.effect:+.4f} [{gap.low:+.4f}, {gap.high:+.4f}] n={gap.n}", flush=True)


def count(files: list[Path], margins: list[float]) -> None:
    rows = pd.concat([pd.read_csv(file) for file in files])
    print("| scenario | seed | studies | margin | supported | share | exact 95 % |")
    print("|---|---|---|---|---|---|---|")
    groups = rows.groupby(["scenario", "seed"])
    for (name, seed), group in groups:
        for margin in margins:
            supported = sum(decision(row, margin) == "supported" for row in group.itertuples())
            low, high = exact_bounds(supported, len(group))
            print(
                f"| {name} | {seed} | {len(group)} | {margin:g} | {supported} | {supported / len(group):.3f} | "
                f"[{low:.3f}, {high:.3f}] |"
            )
    for (name, seed), group in groups:
        ends = np.percentile(group["low"].dropna(), [95, 97.5, 99])
        print(f"{name}, seed {seed}: the interval's low end, 95th / 97.5th / 99th percentile", end=" ")
        print(" / ".join(f"{value:+.4f}" for value in ends))


def decision(row, margin: float) -> str:
    interval = Interval(row.effect, row.low, row.high, int(row.n))
    return Effect("set classifier", interval, margin).decide(EVIDENCE.floor)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    drawing = commands.add_parser("draw")
    drawing.add_argument("--scenario", action="append", required=True)
    drawing.add_argument("--seed", type=int, required=True)
    drawing.add_argument("--studies", type=int, required=True)
    drawing.add_argument("--out", type=Path, required=True)
    counting = commands.add_parser("count")
    counting.add_argument("files", type=Path, nargs="+")
    counting.add_argument("--margin", type=float, action="append", required=True)
    args = parser.parse_args()
    if args.command == "draw":
        draw(args.scenario, args.seed, args.studies, args.out)
    else:
        count(args.files, args.margin)


if __name__ == "__main__":
    main()
