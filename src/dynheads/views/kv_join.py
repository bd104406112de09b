"""One KV table of several KV runs of the same samples (``dynheads kv-join``).

A KV comparison is often measured in pieces: more budgets later, presses in their own environment, the predictor's
arms once it is trained. Each piece is its own run folder; ``join_kv_runs`` checks that the pieces decoded the
same prompts with the same model and settings (everything but ``ARM_SETTINGS``: the policies, the budgets and the
fits they read, which must agree where two runs both name one: by checksum where every manifest records one, so
one list at two paths joins; library versions on those both manifests record), keeps the samples finished under
every (policy, budget) of every run, and writes ``write_policy_tables``'s tables over the union, the Pareto front
marked over all rows (one run alone: its own tables again, with the paired differences below), and ``join.json``:

- ``runs``: each run folder with its policies and budgets, in the order given,
- ``arms``: each (policy, budget) with the run whose records it uses (the first run listed that has it) and, for an
  arm measured by more than one run, on how many of the joined samples their generated texts are equal (a batched
  run can differ from a one-sample run in fp32 rounding; the table says so rather than hide it),
- ``paired``: for every ``pairs`` entry (treated, control), at every budget where both were measured (a budget-free
  control, ``full`` or ``none``, at its own), the mean per-sample difference of the task's first metric with its 95 %
  interval (``analysis.evidence.paired_difference``) over the joined samples,
- ``full_cache``: whether the full cache scores above the task's chance (``kv.full_cache_evidence``); where it does
  not, summary.md says "full cache at chance: not evidence" above the table and above the paired differences, and
  marks no row of the Pareto front.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dynheads.analysis.evidence import EvidenceSettings, paired_difference
from dynheads.errors import DynheadsError
from dynheads.io import read_json
from dynheads.kv.policies import is_budget_free
from dynheads.outputs import Outputs, write_outputs
from dynheads.runs import RunDir
from dynheads.tables import Block, Table
from dynheads.tasks.registry import grid_task
from dynheads.views.kv_tables import AT_CHANCE, full_cache_evidence, policy_tables, run_chance

# what may differ between joined runs
ARM_SETTINGS = ("policies", "budgets", "ratios", "static", "probe", "probe_select")
FITS = ("static", "probe", "probe_select")  # must agree between runs that both name one
SAME = ("model", "versions", "prompt", "prompt_template", "questions", "evaluation_samples", "seed")  # must agree

KIND = "kv-join"  # the joined folder's manifest kind: tables of other runs' records, no samples of its own
Arm = tuple[str, float]  # (policy, budget); full 1, none 0


@dataclass(frozen=True)
class KVPiece:
    """One KV run folder: its manifest and records."""

    path: Path
    manifest: dict
    records: list[dict]

    @classmethod
    def read(cls, folder: str | Path) -> KVPiece:
        run = RunDir(folder)
        if not run.exists():
            raise DynheadsError(f"{folder} is not a run folder (no manifest.json)")
        manifest = run.manifest()
        if manifest.get("kind") != "kv":
            raise DynheadsError(f"{folder} is a {manifest.get('kind')!r} run, not a KV run ('dynheads kv')")
        records = run.records()
        if not records:
            raise DynheadsError(f"{folder} has no finished samples yet")
        return cls(Path(folder), manifest, records)


def arm(policy: str, budget: float | None) -> Arm:
    """A policy at a budget; a budget-free policy at its own (``full`` 1, ``none`` 0), whatever budget is given."""
    if is_budget_free(policy):
        return policy, 0.0 if policy == "none" else 1.0
    if budget is None:
        raise DynheadsError(f"a {policy} record without its budget: not a KV run's record")
    return policy, float(budget)


def arm_of(record: dict) -> Arm:
    return arm(record["policy"], record["budget"])


def join_kv_runs(folders: Sequence[str | Path], out: str | Path, pairs: Sequence[tuple[str, str]] = ()) -> dict:
    """Join the KV runs ``folders`` into ``out`` (module docstring); returns join.json's content."""
    if not folders:
        raise DynheadsError("kv-join needs a KV run folder (one, for its paired differences, or several to join)")
    if len({Path(folder).resolve() for folder in folders}) < len(folders):
        raise DynheadsError("a run folder is given twice: join each run once")
    _check_out(Path(out), folders)
    pieces = [KVPiece.read(folder) for folder in folders]
    check_joinable(pieces)
    check_sized_alike(pieces)
    kept, arms = _first_run_per_arm(pieces)
    samples = _complete_samples(kept, set(arms))
    if not samples:
        raise DynheadsError(
            "no sample was finished under every (policy, budget) of the runs: "
            + ", ".join(
                f"{piece.path} ({len({r['grid_sample_id'] for r in piece.records})} samples)" for piece in pieces
            )
        )
    records = [r for r in kept if r["grid_sample_id"] in samples]
    manifest = _joined_manifest(pieces, arms)
    first_metric = next(iter(grid_task(manifest).metrics))
    evidence = EvidenceSettings(seed=manifest["seed"])
    joined = {
        "runs": [
            {"path": str(p.path), **{k: p.manifest["config"][k] for k in ("policies", "budgets")}} for p in pieces
        ],
        "samples": len(samples),
        "arms": [_arm_entry(arm, source, pieces, samples) for arm, source in arms.items()],
        "paired": [row for pair in pairs for row in _paired_rows(records, pair, first_metric, evidence)],
        "metric": first_metric,
        "full_cache": full_cache_evidence(
            np.array([r["metrics"][first_metric] for r in records if r["policy"] == "full"], dtype=float),
            run_chance(manifest),
            evidence,
        ).to_dict(),
    }
    outputs = Outputs().add("join.json", joined).add("manifest.json", manifest)
    write_outputs(out, outputs.extend(policy_tables(records, manifest, notes=_notes(joined))))
    return joined


def _check_out(out: Path, folders: Sequence[str | Path]) -> None:
    """The joined tables go into a folder of their own: never into a run (its table.csv and manifest are its own)."""
    if out.resolve() in {Path(folder).resolve() for folder in folders}:
        raise DynheadsError(f"--out {out} is one of the runs joined: give a folder of its own")
    manifest = out / "manifest.json"
    if manifest.is_file() and read_json(manifest).get("kind") != KIND:
        raise DynheadsError(f"--out {out} holds a {read_json(manifest).get('kind')!r} run: give a folder of its own")


def check_joinable(pieces: Sequence[KVPiece]) -> None:
    """Refuse runs that did not decode the same prompts with the same model and settings (module docstring)."""
    first = pieces[0]
    for piece in pieces[1:]:
        for key in SAME:
            if _differ(key, first.manifest.get(key), piece.manifest.get(key)):
                raise DynheadsError(
                    f"{first.path} and {piece.path} differ in {key}: they decoded other prompts or "
                    "with another model or library; only runs of the same samples join"
                )
        config_a, config_b = (_shared_config(p.manifest["config"]) for p in (first, piece))
        differing = sorted(k for k in config_a.keys() | config_b.keys() if config_a.get(k) != config_b.get(k))
        if differing:
            raise DynheadsError(
                f"{first.path} and {piece.path} differ in {', '.join(differing)}; only the policies, budgets and "
                "fits may differ between joined runs"
            )
    for key in FITS:
        named = _fit_identities([p.manifest for p in pieces if p.manifest["config"].get(key) is not None], key)
        if len(named) > 1:
            raise DynheadsError(
                f"the runs read different {key} settings ({', '.join(sorted(named))}): their arms "
                "would not be the same policy"
            )


def check_sized_alike(pieces: Sequence[KVPiece]) -> None:
    """Refuse an arm sized one way in one run and another way in another: a press at compression ratio r
    (``--ratios``) carries the kept share 1 - r as its budget, so it shares its (policy, budget) with the same press
    at that budget's bytes (``--budgets``: the static policy's bytes, another cache), and only one run's records
    would be kept."""
    sized: dict[Arm, tuple[float | None, Path]] = {}
    for piece in pieces:
        for record in piece.records:
            ratio, (policy, budget) = record.get("ratio"), arm_of(record)
            first_ratio, first_path = sized.setdefault((policy, budget), (ratio, piece.path))
            if (ratio is None) != (first_ratio is None):
                ratio_at, ratio_path, budget_path = (
                    (ratio, piece.path, first_path) if first_ratio is None else (first_ratio, first_path, piece.path)
                )
                raise DynheadsError(
                    f"{policy} at budget {budget:g} in {budget_path} (sized by that budget's bytes) and at compression "
                    f"ratio {ratio_at:g} in {ratio_path} (kept share {budget:g}) are two caches under one (policy, "
                    "budget): join the --ratios runs apart from the --budgets runs"
                )


def _differ(key: str, mine, theirs) -> bool:
    """Whether two manifests' ``key`` disagree; ``versions`` on the libraries both record (a manifest written before
    a library was recorded, kvpress's and bm25s's since 2026-12-04, does not say it differed)."""
    if key == "versions" and isinstance(mine, dict) and isinstance(theirs, dict):
        return any(mine[library] != theirs[library] for library in mine.keys() & theirs.keys())
    return mine != theirs


def _fit_identities(manifests: Sequence[dict], key: str) -> set[str]:
    """What names the runs' fit ``key``: the checksums of the head list or predictor they read when every run
    records one (``fit_record`` does since it was added), else the settings as given (paths, or ``probe_select``'s
    value), so a run with a checksum still joins an older run of the same path."""
    digests = [((m.get("fit_samples") or {}).get(key) or {}).get("sha256") for m in manifests]
    if all(digests):
        return {f"sha256:{digest}" for digest in digests}
    return {str(m["config"][key]) for m in manifests}


def _shared_config(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in ARM_SETTINGS}


def _first_run_per_arm(pieces: Sequence[KVPiece]) -> tuple[list[dict], dict[Arm, KVPiece]]:
    """The records of each arm from the first run that measured it, and that run per arm."""
    sources: dict[Arm, KVPiece] = {}
    for piece in pieces:
        for record in piece.records:
            sources.setdefault(arm_of(record), piece)
    kept = [r for piece in pieces for r in piece.records if sources[arm_of(r)] is piece]
    return kept, sources


def _complete_samples(records: Sequence[dict], arms: set[Arm]) -> set[str]:
    seen: dict[str, set[Arm]] = {}
    for record in records:
        seen.setdefault(record["grid_sample_id"], set()).add(arm_of(record))
    return {sample for sample, measured in seen.items() if measured == arms}


def _joined_manifest(pieces: Sequence[KVPiece], arms: dict[Arm, KVPiece]) -> dict:
    """The first run's manifest with every run's arms and fits: what the tables are written under."""
    manifest = {**pieces[0].manifest, "kind": KIND}
    config = dict(manifest["config"])
    config["policies"] = list(dict.fromkeys(policy for policy, _ in arms))
    config["budgets"] = sorted({b for p in pieces for b in p.manifest["config"]["budgets"]})
    for key in FITS:
        config[key] = next((p.manifest["config"][key] for p in pieces if p.manifest["config"].get(key)), config[key])
    manifest["config"] = config
    manifest["heads_per_budget"] = {k: v for p in pieces for k, v in p.manifest.get("heads_per_budget", {}).items()}
    with_probe = [p.manifest for p in pieces if p.manifest.get("probe_threshold") is not None]
    manifest["probe_threshold"] = with_probe[0]["probe_threshold"] if with_probe else None
    manifest["joined_from"] = [str(p.path) for p in pieces]
    return manifest


def _arm_entry(arm: Arm, source: KVPiece, pieces: Sequence[KVPiece], samples: set[str]) -> dict:
    """Where an arm's records come from and, measured by several runs, on how many samples they generated alike."""
    texts = {
        str(piece.path): {r["grid_sample_id"]: r["generated"] for r in piece.records if arm_of(r) == arm}
        for piece in pieces
    }
    measured = [path for path, by_sample in texts.items() if by_sample]
    entry: dict = {"policy": arm[0], "budget": arm[1], "from": str(source.path), "measured_by": measured}
    if len(measured) > 1:
        kept = texts[str(source.path)]
        entry["equal_generations"] = {
            path: sum(texts[path].get(s) == kept.get(s) for s in samples) for path in measured[1:]
        }
    return entry


def _paired_rows(records: Sequence[dict], pair: tuple[str, str], metric: str, evidence: EvidenceSettings) -> list:
    treated, control = pair
    by_arm: dict[Arm, dict[str, float]] = {}
    for record in records:
        by_arm.setdefault(arm_of(record), {})[record["grid_sample_id"]] = float(record["metrics"][metric])
    rows = []
    for (policy, budget), values in sorted(by_arm.items(), key=lambda item: item[0][1]):
        if policy != treated:
            continue
        control_arm = arm(control, budget)
        if control_arm not in by_arm:
            continue
        ids = sorted(values)
        a = np.array([values[i] for i in ids])
        b = np.array([by_arm[control_arm][i] for i in ids])
        interval = paired_difference(a, b, evidence, bounds=(-1.0, 1.0))
        rows.append(
            {
                "treated": treated,
                "control": control,
                "budget": budget,
                "samples": len(ids),
                "difference": interval.effect,
                "low": interval.low,
                "high": interval.high,
            }
        )
    if not rows:
        raise DynheadsError(f"--pair {treated},{control}: no budget has both arms in the joined runs")
    return rows


def _notes(joined: dict) -> list[Block]:
    """summary.md's lines on the join: the runs, arms measured twice, and the paired differences."""
    runs = joined["runs"]
    notes: list[Block] = [
        f"Joined from {len(runs)} KV runs ({', '.join(r['path'] for r in runs)}) on the {joined['samples']} samples "
        "finished under every arm; each arm's records from the first run listed that measured it (join.json)."
        if len(runs) > 1
        else f"The tables of the KV run {runs[0]['path']} on its {joined['samples']} samples finished under every arm."
    ]
    twice = [a for a in joined["arms"] if "equal_generations" in a]
    if twice:
        notes.append(
            "Arms measured by more than one run (generated text equal on n of the joined samples): "
            + "; ".join(
                f"{a['policy']}@{a['budget']:g}: " + ", ".join(f"{n} in {p}" for p, n in a["equal_generations"].items())
                for a in twice
            )
        )
    if joined["paired"] and not joined["full_cache"]["evidence"]:
        notes.append(f"Paired differences below, {AT_CHANCE} ({joined['full_cache']['reason']}): none is a finding.")
    if joined["paired"]:
        notes.append(
            Table(
                ["budget", "treated - control", "samples", f"{joined['metric']} difference [95 % CI]"],
                [
                    [
                        f"{row['budget']:g}",
                        f"{row['treated']} - {row['control']}",
                        row["samples"],
                        f"{row['difference']:+.3f} [{row['low']:+.2f}, {row['high']:+.2f}]",
                    ]
                    for row in joined["paired"]
                ],
            )
        )
    return notes
