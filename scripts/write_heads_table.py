"""The results page's tables from ``write_heads_study.py`` folders: W_t's Table 1 row beside D_t's, how the two meet
step by step, the teacher-forced operating point (drops and paired differences with 95 % intervals), and the write
contrast read by its rule (``report.claims.write_contrast``, checked against known truth by ``dynheads rules``).

    python scripts/write_heads_table.py LABEL=ROOT [LABEL=ROOT ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dynheads.analysis.evidence import EvidenceSettings, Interval
from dynheads.report.claims import write_contrast


def interval(value: dict) -> str:
    return f"{value['effect']:+.3f} [{value['low']:+.3f}, {value['high']:+.3f}]"


def table1_row(label: str, name: str, stats: dict | None) -> str:
    if stats is None:
        return f"| {label} | {name} | – | – | – | – | – | – |"
    return (
        f"| {label} | {name} | {stats['mean_size']:.2f} ± {stats['std_size']:.2f} | {stats['unique_heads']} / "
        f"{stats['total_heads']} | {stats['jaccard_static_k20']:.3f} | {stats['adjacent_jaccard']:.3f} "
        f"(other sample {stats['cross_sample_jaccard']:.3f}, static profile {stats['static_profile_jaccard']:.3f}) | "
        f"{stats['entropy']:.3f} | {stats['empty_steps']} / {stats['num_steps']} |"
    )


def main(pairs: list[str]) -> None:
    studies = {label: json.loads((Path(root) / "write-study.json").read_text()) for label, root in map(_split, pairs)}
    print("| model, task | set | Mean ± Std | Unique / Total | Jaccard w/ static | Adj. Jaccard | Entropy | empty |")
    print("|---|---|---|---|---|---|---|---|")
    for label, study in studies.items():
        print(table1_row(label, f"W_t (write > {float(study['threshold']):.3g})", study["write_stats"]))
        print(table1_row(label, "D_t (Eq. 1)", study["copy_stats"]))
    print()
    size, share = "mean \\|W_t\\| | mean \\|D_t\\|", "\\|W ∩ D\\| / \\|W\\| | \\|W ∩ D\\| / \\|D\\|"
    print(f"| model, task | steps | {size} | {share} | W_t, no D_t | D_t, no W_t |")
    print("|---|---|---|---|---|---|---|---|")
    for label, study in studies.items():
        b = study["beside_copy"]
        if b is None:  # an ablation-only study: no evaluated trace
            continue
        print(
            f"| {label} | {b['steps']} | {b['mean_size_first']:.2f} | {b['mean_size_second']:.2f} | "
            f"{_num(b['first_in_second'])} | {_num(b['second_in_first'])} | {b['first_only_steps']} | "
            f"{b['second_only_steps']} |"
        )
    print()
    arms = ("dynamic", "static", "static_outside", "random", "contrast")
    print(
        "| model, task | n (correct / all) | mean W_t, D_t per step |"
        + " | ".join(f"drop: {arm}" for arm in arms)
        + " |"
    )
    print("|---|---|---|" + "---|" * len(arms))
    for label, study in studies.items():
        drops = " | ".join(interval(study["drop"][arm]) for arm in arms)
        sizes = study.get("clean_sizes") or {}
        size = f"{_num(sizes.get('w_t'), '.1f')}, {_num(sizes.get('d_t'), '.1f')}"
        print(f"| {label} | {study['deciding_samples']} / {study['samples']} | {size} | {drops} |")
    print()
    contrasts = ("contrast", "static_outside", "random", "static")
    print(
        "| model, task | "
        + " | ".join(f"dynamic − {arm}" for arm in contrasts)
        + " | overlap with W_t: contrast, static | Wu's top 10 / 20 in the pooled write list's |"
    )
    print("|---|" + "---|" * len(contrasts) + "---|---|")
    for label, study in studies.items():
        gaps = " | ".join(interval(study["dynamic_minus"][arm]) for arm in contrasts)
        overlap, top = study["overlap"], study.get("top_overlap") or {}
        shared = f"{top.get('10', '–')} / {top.get('20', '–')}"
        print(f"| {label} | {gaps} | {_num(overlap.get('contrast'))}, {_num(overlap.get('static'))} | {shared} |")
    print()
    print("| model, task | W_t − as many Eq. 1 heads | rule | reading (`dynheads rules --claim write`) |")
    print("|---|---|---|---|")
    for label, study in studies.items():
        effect = write_contrast(Interval(**study["dynamic_minus"]["contrast"]))
        status, why = effect.decide(EvidenceSettings().floor)
        print(f"| {label} | {effect.interval.text()} | {effect.rule} | {status}: {why} |")


def _split(pair: str) -> tuple[str, str]:
    label, _, root = pair.partition("=")
    return label, root


def _num(value: float | None, spec: str = ".3f") -> str:
    return "–" if value is None or value != value else f"{value:{spec}}"


if __name__ == "__main__":
    main(sys.argv[1:])
