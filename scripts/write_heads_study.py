"""Issue 63's study of per-step write heads W_t on one model and one needle task, with the commands a user runs.

    python scripts/write_heads_study.py --model qwen2.5-coder-0.5b --task niah --root RUNS/write-qwen05-niah

Stages (each a ``dynheads`` command into its own folder under ``--root``, resumable; a finished one is skipped):

1. ``static``: the task's static stream (``--samples`` tests, ``static`` split), Wu's copy list and the pooled write
   list (``static --score write``: LOCOS-style, mean write score over steps, then over counted tests), and the
   detector panel's other lists of the same tests: the pooled Eq. 2 list (``static --score reasoning``) and
   QRHead's (``static-qrhead``);
2. ``decoy``: the same static prompts traced as the task's decoy twin (``<task>_decoy``): the write score at a
   needle-free span of the needle's length, the null W_t's threshold is fitted on (``null:Q``: Q heads per step
   expected there); fitting data only, disjoint from what is evaluated;
3. ``trace``: the evaluated stream (``analysis`` split, the same lengths and depths, one sample per static one);
4. ``probe-write`` (``--probe``): the hidden-state predictor of W_t, the per-step sets above the decoy null
   (``predictor train --threshold``; the standard preset's probe, five seeded splits): Claim 1's ranking rule;
   ``dyn-write``: Table 1 statistics of W_t against the pooled write list, beside Eq. 1's D_t (``--beside copy``);
   ``dyn-copy``: D_t's against Wu's list (tasks whose answer is copied);
5. ``ablate-write``: teacher-forced operating point on the evaluated stream, W_t's ``null:Q`` threshold fitted by
   the ablation itself on the decoy run (``--fit-run``, recorded in its manifest): W_t (dynamic) against the pooled
   write list's top |W_t| (static), its top outside W_t (static_outside), |W_t| random heads, and as many heads
   ranked by Eq. 1 (contrast: D_t first, then by attention on the needle), at f = 0.5 and 1; and the panel
   (``--panel``): Wu's, the pooled Eq. 2 and QRHead's lists, each at the step's |W_t|.

Then ``write-study.json`` and ``write-study.md``: the W_t threshold and its size per step, the dynamism rows, and the
operating-point contrasts on the non-empty steps of correct answers (paired bootstrap over samples, the project's
Claim 2 rule for dynamic − static_outside and dynamic − random; dynamic − contrast is issue 63's "more than as many
D_t heads").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dynheads.analysis.evidence import EvidenceSettings, mean_interval, paired_difference
from dynheads.analysis.headlists import load_head_list
from dynheads.report.claim_parts import operating_point
from dynheads.report.claims import operating_point_verdict
from dynheads.runs import RunDir
from dynheads.tables import read_summaries
from dynheads.views.threshold_fit import fit_threshold

LENGTH_DEPTHS = ("--depths", "0.1,0.3,0.5,0.7,0.9")
# the traces record the write score (off by default: it measures every head's output at every step); the static run
# is traced with it once and scored by copy, write and reasoning
WRITE = ("--write-score",)
# the standard preset's head predictor ([probe] in presets/standard.toml): five seeded splits, pooled
PROBE_SETTINGS = ("--hidden-sizes", "512,256", "--epochs", "60", "--early-stopping", "8", "--split", "0.5,0.2,0.3")
PROBE_SETTINGS += ("--splits", "5")
CONTRASTS = ("static", "static_outside", "random", "contrast", "static_mean", "random_mean")


def dynheads(*args: str) -> None:
    command = [sys.executable, "-m", "dynheads", *args]
    print("+ dynheads", " ".join(args), flush=True)
    subprocess.run(command, check=True)


def run_stages(args: argparse.Namespace, root: Path) -> None:
    grid = ("--model", args.model, "--lengths", str(args.length), *LENGTH_DEPTHS)
    runs = str(-(-args.samples // 5))  # samples spread over 5 depths, as the static grid rounds them
    fit = args.fit_samples or args.samples  # the fitting stream: static lists and the decoy null
    static = root / "static"
    if not (static / "static_heads.json").exists():
        dynheads("static", "--task", args.task, *grid, "--samples", str(fit), *WRITE, "--out", str(static))
    for score in ("write", "reasoning"):  # the pooled write list (LOCOS) and the pooled Eq. 2 list: same traces
        if not (static / f"static_heads-{score}.json").exists():
            dynheads(
                "static",
                "--task",
                args.task,
                *grid,
                "--samples",
                str(fit),
                "--score",
                score,
                *WRITE,
                "--out",
                str(static),
            )
    qrhead = root / "static-qrhead"  # QRHead's list of the same static tests (prefill only)
    if not (qrhead / "static_heads-qrhead.json").exists():
        dynheads("static-qrhead", "--task", args.task, *grid, "--samples", str(fit), "--out", str(qrhead))
    decoy = root / "decoy"
    if not (decoy / "results.csv").exists():
        dynheads(
            "trace",
            "--task",
            f"{args.task}_decoy",
            "--split",
            "static",
            *grid,
            "--runs",
            str(-(-fit // 5)),
            *WRITE,
            "--out",
            str(decoy),
        )
    if not args.ablation_only:  # --ablation-only: no evaluated trace, no Table 1
        table1_stages(args, root, grid, runs)
    ablate = root / "ablate-write"
    if not (ablate / "dose.csv").exists():
        dynheads(
            "ablate",
            "--task",
            args.task,
            *grid,
            "--runs",
            runs,
            "--score",
            "write",
            "--threshold",
            f"null:{args.null}",
            "--fit-run",
            str(decoy),
            "--contrast",
            "copy",
            "--static",
            str(static / "static_heads-write.json"),
            "--panel",
            ",".join(f"{name}={path}" for name, path in panel_lists(root).items()),
            "--fractions",
            args.fractions,
            "--compensation",
            "",
            "--metric",
            "teacher",
            "--batch-size",
            "1",
            "--out",
            str(ablate),
        )


def panel_lists(root: Path) -> dict[str, Path]:
    """The detector panel's lists beside the pooled write list (the static arm): Wu's copy list, the pooled Eq. 2
    list and QRHead's, all fitted on the same static tests."""
    static = root / "static"
    return {
        "copy": static / "static_heads.json",
        "reasoning": static / "static_heads-reasoning.json",
        "qrhead": root / "static-qrhead" / "static_heads-qrhead.json",
    }


def table1_stages(args: argparse.Namespace, root: Path, grid: tuple[str, ...], runs: str) -> None:
    """The evaluated trace, W_t's and D_t's Table 1 rows and (``--probe``) the write score's predictor."""
    static, decoy, trace, write = root / "static", root / "decoy", root / "trace", root / "dyn-write"
    if not (trace / "results.csv").exists():
        dynheads("trace", "--task", args.task, *grid, "--runs", runs, *WRITE, "--out", str(trace))
    if not (write / "dynamism.json").exists():
        dynheads(
            "dynamism",
            str(trace),
            "--static",
            str(static / "static_heads-write.json"),
            "--score",
            "write",
            "--threshold",
            f"null:{args.null}",
            "--fit-run",
            str(decoy),
            "--beside",
            "copy",
            "--out",
            str(write),
        )
    if args.task == "niah" and not (root / "dyn-copy" / "dynamism.json").exists():
        dynheads("dynamism", str(trace), "--static", str(static / "static_heads.json"), "--out", str(root / "dyn-copy"))
    if args.probe and not (root / "probe-write" / "metrics.md").exists():  # W_t's sets, the standard preset's probe
        dynheads(
            "predictor",
            "train",
            str(trace),
            "--score",
            "write",
            "--threshold",
            f"null:{args.null}",
            "--fit-run",
            str(root / "decoy"),
            *PROBE_SETTINGS,
            "--out",
            str(root / "probe-write"),
        )


def _ablation_threshold(ablate: Path, null: float) -> str:
    """The threshold the ablation decided W_t with: the fit its manifest records (``--fit-run``), else (a folder
    written before the ablation fitted it) the same rule fitted again on the decoy run beside it."""
    fit = json.loads((ablate / "manifest.json").read_text()).get("threshold_fit")
    return fit["applied"] if fit else fit_threshold(f"null:{null}", "write", ablate.parent / "decoy").applied


def _panel(ablate: Path) -> dict | None:
    """The detector panel's rows (panel.csv) and top-k overlaps (panel-overlap.csv), where the ablation ran one."""
    if not (ablate / "panel.csv").exists():
        return None
    effects, overlap = (pd.read_csv(ablate / name) for name in ("panel.csv", "panel-overlap.csv"))
    return {"effects": effects.to_dict("records"), "overlap": overlap.to_dict("records")}


def summarise(root: Path, null: float) -> dict:
    """What the page reads: W_t's threshold and sizes, the dynamism rows, the operating-point contrasts."""
    evidence = EvidenceSettings()
    write_file = root / "dyn-write" / "dynamism.json"
    write = json.loads(write_file.read_text()) if write_file.exists() else {}
    copy_file = root / "dyn-copy" / "dynamism.json"
    summary = read_summaries(root / "ablate-write").get("summary.md")
    point = operating_point(summary.numbers) if summary is not None else None
    if point is None:
        raise SystemExit(f"{root / 'ablate-write'} has no teacher-forced numbers at f = 1")
    keep = point.decided()
    dynamic = np.asarray(point.drop["dynamic"], dtype=float)
    contrasts = {
        arm: paired_difference(dynamic[keep], np.asarray(point.drop[arm], dtype=float)[keep], evidence).to_dict()
        for arm in CONTRASTS
        if arm in point.drop
    }
    verdict = operating_point_verdict(point, "write heads", evidence)
    wu, pooled = (
        load_head_list(root / "static" / name).heads for name in ("static_heads.json", "static_heads-write.json")
    )
    probe = read_summaries(root / "probe-write").get("metrics.md")
    return {
        "root": str(root),
        "threshold": write.get("threshold") or _ablation_threshold(root / "ablate-write", null),
        "write_stats": write.get("stats"),
        "beside_copy": write.get("beside"),
        "copy_stats": json.loads(copy_file.read_text())["stats"] if copy_file.exists() else None,
        "samples": int(len(point.correct)),
        "correct": int(np.sum(point.correct)),
        "deciding_samples": int(keep.sum()),
        "drop": {
            arm: mean_interval(np.asarray(v, dtype=float)[keep], evidence).to_dict() for arm, v in point.drop.items()
        },
        "overlap": {arm: point.mean(point.overlap, arm, keep) for arm in point.overlap},
        "dynamic_minus": contrasts,
        "claim2_rule": {"status": verdict.status, "reason": verdict.reason},
        "clean_sizes": clean_sizes(root / "ablate-write"),
        "top_overlap": {k: len(set(wu[:k]) & set(pooled[:k])) for k in (10, 20)},  # LOCOS: 2 of 10 on Qwen3-8B
        "panel": _panel(root / "ablate-write"),
        "probe": None
        if probe is None
        else {k: probe.numbers.get(k) for k in ("task", "gap", "position_gap", "step_gap")},
    }


def clean_sizes(folder: Path) -> dict:
    """Mean |W_t| and Eq. 1's mean |D_t| (the contrast's own set) per step of the clean answers the ablation
    decoded, averaged over samples: the sizes where no evaluated trace was kept."""
    teacher = [r for r in RunDir(folder).records() if r.get("kind") == "teacher" and r["steps"]]
    return {
        "w_t": float(np.mean([r["mean_dynamic"] for r in teacher])),
        "d_t": float(np.mean([r["mean_contrast"] for r in teacher]))
        if teacher[0].get("mean_contrast") is not None
        else None,
        "steps": int(np.mean([r["steps"] for r in teacher])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--task", default="niah")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=30, help="evaluated samples (trace, ablation)")
    parser.add_argument(
        "--fit-samples", type=int, default=None, help="fitting samples (static, decoy); default --samples"
    )
    parser.add_argument("--length", type=int, default=1000)
    parser.add_argument("--fractions", default="0.5,1", help="doses of the ablation (fractions of |W_t|)")
    parser.add_argument("--ablation-only", action="store_true", help="no evaluated trace and no Table 1 (saves time)")
    parser.add_argument("--probe", action="store_true", help="also train the predictor of W_t (Claim 1)")
    parser.add_argument("--null", type=float, default=0.1, help="heads per step allowed on decoy spans")
    args = parser.parse_args()
    run_stages(args, args.root)
    result = summarise(args.root, args.null)
    (args.root / "write-study.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("threshold", "correct", "deciding_samples", "claim2_rule")}, indent=1))
    for arm, gap in result["dynamic_minus"].items():
        print(f"dynamic - {arm}: {gap['effect']:+.3f} [{gap['low']:+.3f}, {gap['high']:+.3f}] n={gap['n']}")


if __name__ == "__main__":
    main()
