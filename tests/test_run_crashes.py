"""Runs killed for real (SIGKILL at a chosen file write, in a forked child) and resumed: the resumed run ends with the
files of an uninterrupted run, byte for byte, and no half-written file is kept."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from dynheads.experiments.niah import NiahConfig, run_niah
from dynheads.io import remove_temporaries


def small_config(model_dir) -> NiahConfig:
    return NiahConfig(model=str(model_dir), lengths=(60, 200), depths=(0.0, 1.0), runs=2, max_new_tokens=4, seed=5)


def run_killed(run, write: int, half_written: bool) -> None:
    """``run()`` in a forked child that SIGKILLs itself at its ``write``-th atomic rename: before it, with the
    temporary file cut to half its size (a kill while the file is written), or right after it."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            real, count = os.replace, [0]

            def replace(src, dst):
                count[0] += 1
                if count[0] == write and half_written:
                    os.truncate(src, os.path.getsize(src) // 2)
                    os.kill(os.getpid(), signal.SIGKILL)
                real(src, dst)
                if count[0] == write:
                    os.kill(os.getpid(), signal.SIGKILL)

            os.replace = replace
            run()
        finally:
            os._exit(3)  # not killed: the test fails below
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("write", "half_written"), [(1, True), (2, True), (3, True), (4, False), (9, True)])
def test_a_run_killed_mid_write_resumes_to_a_clean_runs_files(tiny_model_dir, tiny_lm, tmp_path, write, half_written):
    """Writes: 1 the manifest, then per sample its trace and its record; a kill leaves the half-written file's
    temporary sibling, which the resumed run deletes (it was kept before)."""
    config = small_config(tiny_model_dir)
    clean = run_niah(config, tmp_path / "clean", lm=tiny_lm, progress=False).write_results()
    crashed = tmp_path / "crashed"
    run_killed(lambda: run_niah(config, crashed, lm=tiny_lm, progress=False), write, half_written)
    assert len(list(crashed.rglob("*.tmp"))) == half_written  # the killed write's temporary file
    run_niah(config, crashed, lm=tiny_lm, progress=False).write_results()
    assert contents(crashed) == contents(tmp_path / "clean") and len(clean) == 8


def test_remove_temporaries_deletes_only_what_atomic_writes_leave(tmp_path):
    (tmp_path / "samples").mkdir()
    stale = [tmp_path / "samples" / ".a.json.k2_9xq0z.tmp", tmp_path / ".results.csv.abcdefgh.tmp"]
    kept = [tmp_path / "notes.tmp", tmp_path / ".hidden.tmp", tmp_path / "samples" / "a.json"]
    for path in stale + kept:
        path.write_text("x")
    assert sorted(remove_temporaries(tmp_path)) == sorted(stale)
    assert all(p.is_file() for p in kept) and not any(p.exists() for p in stale)
    assert remove_temporaries(tmp_path / "absent") == []


def test_a_run_that_recomputes_everything_restarts_clean_and_never_over_another_kind(tmp_path):
    from dynheads.errors import DynheadsError
    from dynheads.runs import RunDir

    run = RunDir(tmp_path / "detect")
    run.restart("detect", {"seed": 0}, None)
    stale = run.path / ".results.md.abcdefgh.tmp"  # a detect killed while writing its tables
    stale.write_text("half")
    assert run.restart("detect", {"seed": 1}, None)["config"] == {"seed": 1}  # its own run: replaced
    assert not stale.exists()
    other = RunDir(tmp_path / "niah")
    other.start("niah", {"seed": 0}, None)
    with pytest.raises(DynheadsError, match="holds a niah run: choose another --out"):
        other.restart("detect", {"seed": 0}, None)
    assert other.manifest()["kind"] == "niah"


def test_a_batched_run_killed_mid_batch_resumes_to_the_files_of_a_clean_run_of_that_batch_size(
    tiny_model_dir, tiny_lm, tmp_path
):
    """Killed after the record of the 4th of 8 samples at batch size 3 (batches 0-2, 3-5, 6-7): the resumed run
    decodes samples 3-5 together again, as the clean run did. It batched the unfinished samples as 4-6 and 7 before,
    and sample 7 alone (the batch-1 path) got a trace that differed from the clean run's in fp32 rounding."""
    config = small_config(tiny_model_dir)
    run_niah(config, tmp_path / "clean", lm=tiny_lm, progress=False, batch_size=3)
    crashed = tmp_path / "crashed"
    run_killed(lambda: run_niah(config, crashed, lm=tiny_lm, progress=False, batch_size=3), 9, False)
    assert len(list((crashed / "samples").glob("*.json"))) == 4
    saved = []
    run_niah(config, crashed, lm=tiny_lm, progress=False, batch_size=3, on_record=saved.append)
    assert len(saved) == 4  # the finished sample 3 is decoded again, not saved again
    assert contents(crashed) == contents(tmp_path / "clean")
