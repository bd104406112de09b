"""The one resumable job loop (``dynheads.runs.run_jobs``): batches, one record per job, resume after a crash,
and shares of whole groups across processes. No model: the batch function is plain Python."""

from __future__ import annotations

import pytest

from dynheads import distributed
from dynheads.errors import DynheadsError
from dynheads.runs import Finished, Job, RunDir, run_jobs


def squares(calls: list[list[int]], fail_on: int | None = None):
    def work(items: list[int]) -> list[Finished]:
        if fail_on in items:
            raise RuntimeError("crash")
        calls.append(list(items))
        return [Finished({"sample_id": "set by the loop", "value": item * item}) for item in items]

    return work


def started(tmp_path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.start("test", {"seed": 0}, None)
    return run


def test_batches_of_the_unfinished_jobs_give_one_record_each(tmp_path):
    run, calls = started(tmp_path), []
    jobs = [Job(f"job{i}", i) for i in range(5)]
    records = run_jobs(run, jobs, squares(calls), batch_size=2, desc="test", progress=False)
    assert calls == [[0, 1], [2, 3], [4]]
    assert [r["sample_id"] for r in records] == [f"job{i}" for i in range(5)]
    assert [r["value"] for r in records] == [0, 1, 4, 9, 16] and records == run.records()
    assert run_jobs(run, jobs, squares(calls), batch_size=2, desc="test", progress=False) == records
    assert len(calls) == 3  # everything was finished: nothing decoded again
    with pytest.raises(DynheadsError, match="at least 1"):
        run_jobs(run, jobs, squares(calls), batch_size=0, desc="test", progress=False)


def test_a_crash_loses_only_the_batch_in_flight_and_a_rerun_resumes(tmp_path):
    run, calls = started(tmp_path), []
    jobs = [Job(f"job{i}", i) for i in range(5)]
    with pytest.raises(RuntimeError, match="crash"):
        run_jobs(run, jobs, squares(calls, fail_on=3), batch_size=2, desc="test", progress=False)
    assert [r["sample_id"] for r in run.records()] == ["job0", "job1"]
    assert not list(run.path.rglob("*.tmp"))
    seen: list[dict] = []
    records = run_jobs(run, jobs, squares(calls), batch_size=2, desc="test", progress=False, on_record=seen.append)
    assert calls[1:] == [[2, 3], [4]] and [r["sample_id"] for r in seen] == ["job2", "job3", "job4"]
    clean = started(tmp_path / "clean")
    assert records == run_jobs(clean, jobs, squares([]), batch_size=3, desc="test", progress=False)


def test_each_process_takes_whole_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "barrier", lambda: None)  # the ranks run one after the other here
    monkeypatch.setenv("WORLD_SIZE", "2")
    jobs = [Job(f"{sample}-{policy}", (sample, policy), group=sample) for sample in "abc" for policy in "xy"]
    shares = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        done = run_jobs(
            started(tmp_path / str(rank)),
            jobs,
            lambda items: [Finished({"item": item}) for item in items],
            desc="test",
            progress=False,
        )
        shares.append([tuple(record["item"]) for record in done])
    assert shares == [[("a", "x"), ("a", "y"), ("c", "x"), ("c", "y")], [("b", "x"), ("b", "y")]]


def test_a_batch_a_crash_cut_short_is_decoded_whole_again(tmp_path):
    """Killed between two records of one batch (job2 saved, job3 not): the rerun decodes the batch [2, 3] the first
    run decoded, not [3, 4] (a batch's records depend on its other rows through fp32 rounding), and saves job3 alone."""
    run, calls = started(tmp_path), []
    jobs = [Job(f"job{i}", i) for i in range(5)]
    run_jobs(run, jobs, squares(calls), batch_size=2, desc="test", progress=False)
    run.record_path("job3").unlink()
    run.record_path("job4").unlink()
    seen: list[dict] = []
    records = run_jobs(run, jobs, squares(calls), batch_size=2, desc="test", progress=False, on_record=seen.append)
    assert calls[3:] == [[2, 3], [4]] and [r["sample_id"] for r in seen] == ["job3", "job4"]
    assert records == run.records() and len(records) == 5
