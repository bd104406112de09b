"""Crash-safe file writing (everything a run writes goes to a temporary sibling first, then is renamed), and the
checksums that name a file or folder by its content."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dynheads.errors import DynheadsError

_UMASK = os.umask(0)
os.umask(_UMASK)


# The temporary sibling ``atomic_path`` writes: ``.<name>.<8 characters of mkstemp>.tmp``.
_TEMPORARY = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the same folder; on success it replaces ``path`` in one rename. A process killed
    before the rename (SIGKILL, power loss) leaves the temporary file: ``remove_temporaries`` clears it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the file the permissions open() would
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def remove_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files that ``atomic_path`` left anywhere under ``folder`` (a killed process's half-written
    files, never renamed into place); return them. Only while no process writes into ``folder``."""
    root = Path(folder)
    stale = [p for p in root.rglob("*.tmp") if p.is_file() and _TEMPORARY.fullmatch(p.name)] if root.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=False, default=_jsonable) + "\n")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def read_user_text(path: str | Path, what: str) -> str:
    """The text of a user's UTF-8 file (a leading byte-order mark dropped, as editors on Windows write one), or a
    one-line ``DynheadsError`` naming ``what`` and ``path``: missing, a folder, unreadable, or not UTF-8."""
    path = Path(path)
    if not path.is_file():
        raise DynheadsError(f"{what} not found: {path}" + (" (a folder, not a file)" if path.is_dir() else ""))
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:
        raise DynheadsError(
            f"{what} {path} is not UTF-8 text: byte {error.object[error.start]:#04x} at byte offset {error.start} "
            "(save it as UTF-8)"
        ) from None
    except OSError as error:
        raise DynheadsError(f"cannot read {what} {path}: {error.strerror or error}") from None


def read_json_if_any(path: str | Path) -> Any:
    """The JSON in ``path``, or None where there is no such file or it is not JSON (a folder read as it may be)."""
    try:
        return read_json(path) if Path(path).is_file() else None
    except ValueError:
        return None


def _jsonable(value: Any) -> Any:
    """numpy scalars/arrays and paths in results become plain JSON."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def format_version(found: Any, known: int, what: str, path: str | Path) -> int:
    """The format version a file declares (``None``: written before versions existed, read as 1); a version newer
    than ``known`` is refused, since its columns or keys may mean something this code does not know."""
    version = 1 if found is None else int(found)
    if version > known:
        raise DynheadsError(
            f"{path} is a version {version} {what}; this dynheads reads versions 1 to {known}: "
            "upgrade dynheads to read it"
        )
    return version


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def content_sha256(path: str | Path) -> str:
    """A file's sha256, or a folder's: of its files' relative names and sha256s, in name order (what a run read
    from a head list or a trained predictor, whatever path it was given by)."""
    source = Path(path)
    if source.is_file():
        return file_sha256(source)
    if not source.is_dir():
        raise DynheadsError(f"no file or folder at {path}")
    digest = hashlib.sha256()
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        digest.update(f"{file.relative_to(source).as_posix()}\0{file_sha256(file)}\n".encode())
    return digest.hexdigest()
