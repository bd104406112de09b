"""Sharding a run over processes: ``torchrun`` and ``accelerate launch`` with two CPU ranks (gloo) write the same
run as one process.

Also the share arithmetic itself (disjoint, covering, deterministic) without a launcher.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from dynheads import distributed
from dynheads.runs import RunDir


def test_shares_are_disjoint_and_cover_the_samples(monkeypatch):
    items = list(range(11))
    shares = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        shares.append(distributed.shard(items))
    assert sorted(sum(shares, [])) == items and shares[1] == [1, 4, 7, 10]
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(distributed.DynheadsError):
        distributed.shard(items)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert distributed.shard(items) == items and distributed.is_main()


def niah_args(model_dir, out) -> list[str]:
    return [
        "-m",
        "dynheads",
        "niah",
        "--model",
        str(model_dir),
        "--lengths",
        "120",
        "--depths",
        "0,0.5,1",
        "--runs",
        "1",
        "--max-new-tokens",
        "5",
        "--seed",
        "3",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]


LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
    # accelerate's multi-process launcher runs torch.distributed.run itself; without GPUs the ranks use CPU + gloo
    "accelerate": [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "dynheads",
    ],
}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_two_process_run_equals_one_process_run(tiny_model_dir, tmp_path, launcher):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    one = subprocess.run(
        [sys.executable, *niah_args(tiny_model_dir, tmp_path / "one")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    args = niah_args(tiny_model_dir, tmp_path / "two")
    if launcher == "accelerate":  # it takes the module after its own -m
        args = args[2:]
    two = subprocess.run([*LAUNCHERS[launcher], *args], env=env, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.count("samples in") == 1  # only rank 0 summarises
    single, sharded = RunDir(tmp_path / "one"), RunDir(tmp_path / "two")
    assert sharded.manifest()["processes"] == 2 and single.manifest()["processes"] == 1
    assert sharded.manifest()["config"] == single.manifest()["config"]
    assert [r["sample_id"] for r in sharded.records()] == [r["sample_id"] for r in single.records()]
    assert sharded.records() == single.records() and len(single.records()) == 3
    for record in single.records():
        a, b = single.load_trace(record["sample_id"]), sharded.load_trace(record["sample_id"])
        for name in ("tokens", "argmax_pos", "copy_scores", "needle_mass", "reasoning_scores", "hidden"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
    pd.testing.assert_frame_equal(
        pd.read_csv(tmp_path / "one" / "results.csv"), pd.read_csv(tmp_path / "two" / "results.csv")
    )
    assert not list((tmp_path / "two").rglob("*.tmp"))


def _normalised_report(folder) -> list[str]:
    """report.md without what differs between two launches by design: the folder's path, the stage-time table
    (which ends the report), the probes' training seconds and how many processes ran the study."""
    text = (folder / "report.md").read_text().replace(str(folder), "STUDY")
    text = text[: text.index("| stage | seconds |")]
    return [line for line in text.splitlines() if "train_seconds" not in line and "| processes |" not in line]


@pytest.mark.parametrize(
    ("threads", "processes", "cores", "pooled"),
    [(1, 2, 2, 2), (2, 2, 2, 2), (2, 2, 8, 4), (3, 1, 8, 3), (4, 1, 2, 4), (1, 4, 3, 3)],
)
def test_pooled_threads_are_every_local_process_threads_up_to_the_cores(monkeypatch, threads, processes, cores, pooled):
    """What rank 0 runs alone gets the launch's threads, capped at the cores like OMP_NUM_THREADS at torch's load
    (two two-thread processes on two cores analysed with four threads, which differ in the last digits from the
    two threads of a one-process study and only wait for cores); one process keeps its own."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(processes))
    monkeypatch.setattr(distributed, "usable_cores", lambda: cores)
    assert distributed.pooled_threads(threads) == pooled


def test_two_process_study_equals_one_process_study(tiny_model_dir, tmp_path):
    """``reproduce`` under torchrun, and with ``--processes 2`` (which starts the two processes itself): the sample
    stages deal their samples over both ranks, rank 0 runs the analyses alone (with both processes' threads) and
    the report is written once; the study equals a one-process study."""
    from dynheads.io import read_json

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    args = ["-m", "dynheads", "reproduce", "--model", str(tiny_model_dir), "--preset", "smoke", "--device", "cpu"]
    # Every launch has two threads in all (the analyses' last digits depend on torch's thread count): one process
    # with two; two processes of one thread each, started by torchrun or by --processes from a two-thread process.
    launches = {
        "one": ([sys.executable, *args], "2"),
        "torchrun": ([*LAUNCHERS["torchrun"], *args], "1"),
        "processes": ([sys.executable, *args, "--processes", "2"], "2"),
    }
    folders = {name: tmp_path / f"study{i}" for i, name in enumerate(launches)}  # one path length: one truncation
    for name, (command, threads) in launches.items():
        done = subprocess.run(
            [*command, "--out", str(folders[name])],
            env={**env, "OMP_NUM_THREADS": threads},
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, (name, done.stderr[-2000:])
        assert done.stdout.count("report: ") == 1, name  # rank 0 (or the starting process) alone writes the report
    single = folders["one"]
    for shared in (folders["torchrun"], folders["processes"]):
        assert list(read_json(shared / "stages.json")) == list(read_json(single / "stages.json"))
        assert read_json(shared / "manifest.json")["processes"] == 2
        cca = read_json(shared / "stages.json")["cca"]["error"]
        assert cca == read_json(single / "stages.json")["cca"]["error"]
        for stage in ("niah", "hotpotqa", "hotpotqa-ablation", "rag"):  # (a random model has no NIAH static list)
            assert RunDir(shared / stage).manifest()["processes"] == 2
            assert RunDir(shared / stage).records() == RunDir(single / stage).records(), stage
        assert _normalised_report(shared) == _normalised_report(single)
        assert not list(shared.rglob("*.tmp"))


def test_processes_refuse_a_loaded_model_and_report_a_failed_process_in_one_line(tmp_path):
    from dynheads.errors import DynheadsError
    from dynheads.experiments.reproduce import ReproduceConfig, reproduce

    with pytest.raises(DynheadsError, match="pass no lm"):
        reproduce(ReproduceConfig(preset="smoke"), tmp_path / "a", lm=object(), processes=2)
    with pytest.raises(DynheadsError, match="processes must be at least 1"):
        reproduce(ReproduceConfig(preset="smoke"), tmp_path / "b", processes=0)
    with pytest.raises(DynheadsError, match=r"^a process failed: .*no-such-model"):
        reproduce(ReproduceConfig(model=str(tmp_path / "no-such-model"), preset="smoke"), tmp_path / "c", processes=2)


def test_rag_under_torchrun_prints_its_table_once(tiny_model_dir, tmp_path):
    """Rank 0 alone writes and prints a RAG run's table (rank 1 once read rag.md before rank 0 wrote it, and the
    launch failed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    args = ["-m", "dynheads", "rag", "--model", str(tiny_model_dir), "--device", "cpu", "--questions", "4"]
    args += ["--lengths", "200", "--depths", "0.5", "--strategies", "none,full-context", "--max-new-tokens", "4"]
    done = subprocess.run(
        [*LAUNCHERS["torchrun"], *args, "--out", str(tmp_path / "rag")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("| strategy | k | questions |") == 1
    assert len(RunDir(tmp_path / "rag").records()) == 8


def test_detect_with_data_under_a_launcher_detects_on_rank_0_alone(tmp_path, monkeypatch):
    """``detect --data`` under torchrun: every rank traces its share (run_jobs ends at a barrier), then rank 0 alone
    fits the detectors; before, every rank ran the detection and wrote the same files at once."""
    from typer.testing import CliRunner

    from dynheads.cli.app import app, register_commands
    from dynheads.experiments import halueval
    from dynheads.views import detect

    register_commands()
    detected = []
    traced = type("Traced", (), {"path": tmp_path / "out" / "trace"})()
    monkeypatch.setattr(halueval, "trace_halueval", lambda *args, **kwargs: traced)
    monkeypatch.setattr(detect, "run_detect", lambda source, cfg, out: detected.append(source))
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        (tmp_path / "out" / "detect").mkdir(parents=True, exist_ok=True)
        (tmp_path / "out" / "results.md").write_text("table\n")
        result = CliRunner().invoke(app, ["detect", "--data", "halueval:qa", "--out", str(tmp_path / "out")])
        assert result.exit_code == 0, result.output
        assert detected == ([] if rank == 1 else [traced.path])


def test_ablate_under_a_launcher_prints_its_summary_on_rank_0_alone(tmp_path, monkeypatch):
    """Rank 1 of a torchrun ``ablate`` returned before rank 0 had written summary.md and read it: the launch failed
    with a traceback after every record was done (seen on a two-process CPU run). Now rank 0 alone prints it."""
    from typer.testing import CliRunner

    from dynheads.cli.app import app, register_commands
    from dynheads.experiments import paper_stages

    register_commands()
    out = tmp_path / "ablation"
    monkeypatch.setattr(paper_stages, "run_claim2", lambda cfg, path, batch_size: RunDir(path))
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        if rank == 0:  # what rank 0 writes once every rank is done
            out.mkdir(parents=True, exist_ok=True)
            (out / "summary.md").write_text("| arm | drop |\n")
        result = CliRunner().invoke(app, ["ablate", "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert ("| arm | drop |" in result.output) == (rank == 0)
