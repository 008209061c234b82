"""The project's own MoEs (``moelab train-moe``), loaded with plain ``AutoModelForCausalLM.from_pretrained``.

* ``tiny-moe`` (``data/models/tiny-moe``): 6 layers x 32 experts, top-2, four separable corpora.
* ``sharegpt-moe`` (``data/models/sharegpt-moe``): OLMoE-like routing geometry (8 layers x 64 experts,
  top-8) trained on ShareGPT chats, code and prose; its real traces of held-out ShareGPT requests and
  Spec-Bench questions are in ``data/traces/sharegpt-moe-*`` (compact encoding, :mod:`moelab.traces.compact`).

This module loads them, builds held-out prompts (corpus windows) and writes the tiny MoE's card from the
locality statistics :mod:`moelab.make.tiny_moe_trace` measures; training and trace capture are in
:mod:`moelab.make`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from moelab._io import atomic_write_text, read_json
from moelab._validate import check_int
from moelab.datasets import repo_root
from moelab.models.corpus import iter_domain_texts

#: Folder of the bundled tiny MoE (``data/models/tiny-moe``).
TINY_MOE_PATH = repo_root() / "data" / "models" / "tiny-moe"
#: Folder of the bundled OLMoE-like MoE trained on ShareGPT (``data/models/sharegpt-moe``).
SHAREGPT_MOE_PATH = repo_root() / "data" / "models" / "sharegpt-moe"
#: The bundled MoE models by name: ``tiny-moe`` and ``sharegpt-moe``.
MOE_MODELS = {"tiny-moe": TINY_MOE_PATH, "sharegpt-moe": SHAREGPT_MOE_PATH}


def load_tiny_moe(path: str | Path | None = None, *, dtype: str = "float32") -> tuple[Any, Any]:
    """Load the tiny MoE and its tokenizer (offline), in ``dtype`` (float32 default: exact on CPU).

    Parameters
    ----------
    path : path, optional
        Checkpoint folder (default :data:`TINY_MOE_PATH`).
    dtype : {"float32", "float16", "bfloat16"}
        The weights' and activations' dtype (float32: the outputs the tests compare are exact on CPU).

    Returns
    -------
    (model, tokenizer)
        ``Qwen3MoeForCausalLM`` in eval mode and its fast tokenizer.
    """
    # lazy: torch / transformers / vLLM load only when this runs; import moelab needs none
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path) if path is not None else TINY_MOE_PATH
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"no MoE checkpoint in {folder} (config.json missing); train one with `moelab train-moe`")
    torch_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        raise ValueError(f"dtype must be one of ['float32', 'float16', 'bfloat16']; got {dtype!r}")
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model.eval()
    return model, tok


def load_moe(name: str | Path = "sharegpt-moe", *, dtype: str = "float32") -> tuple[Any, Any]:
    """Load a project MoE by name (``"tiny-moe"``, ``"sharegpt-moe"``) or checkpoint folder; see :func:`load_tiny_moe`."""
    if isinstance(name, str) and name in MOE_MODELS:
        return load_tiny_moe(MOE_MODELS[name], dtype=dtype)
    if isinstance(name, str) and not Path(name).exists():
        raise ValueError(f"name must be one of {sorted(MOE_MODELS)} or a checkpoint folder; got {name!r}")
    return load_tiny_moe(name, dtype=dtype)


def heldout_prompts(
    tokenizer: Any,
    n_per_domain: int = 100,
    *,
    min_len: int = 96,
    max_len: int = 256,
    domains: Sequence[str] | None = None,
    seed: int = 0,
) -> tuple[list[list[int]], list[str]]:
    """Token-id prompts cut from the corpus's held-out split: ``n_per_domain`` per domain.

    Each prompt is a window of a held-out document (documents of one domain concatenated), with a
    length drawn uniformly from ``[min_len, max_len]`` and a start drawn at random; seeded.

    Returns
    -------
    (prompts, domains)
    """
    check_int("n_per_domain", n_per_domain, low=1)
    check_int("min_len", min_len, low=1)
    check_int("max_len", max_len, low=min_len)
    streams: dict[str, list[int]] = {}
    for dom, text in iter_domain_texts(domains, split="heldout", seed=seed):
        streams.setdefault(dom, []).extend(tokenizer(text, add_special_tokens=False)["input_ids"])
    rng = np.random.default_rng(seed)
    prompts, labels = [], []
    for dom in sorted(streams):
        ids = np.asarray(streams[dom], dtype=np.int64)
        if len(ids) < max_len + 1:
            raise ValueError(f"held-out split of domain {dom!r} has only {len(ids)} tokens (< max_len={max_len})")
        lens = rng.integers(min_len, max_len + 1, size=n_per_domain)
        starts = rng.integers(0, len(ids) - lens)
        prompts += [ids[s:s + n].tolist() for s, n in zip(starts, lens)]
        labels += [dom] * n_per_domain
    return prompts, labels


def _fmt_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def write_model_card(model_dir: str | Path, stats: dict[str, Any], trace_info: dict[str, Any]) -> Path:
    """Write ``MODEL_CARD.md`` from the checkpoint's config, ``training.json`` and measured locality stats.

    Parameters
    ----------
    model_dir : path
        The exported checkpoint (with ``config.json`` and ``training.json``).
    stats : dict
        :func:`moelab.traces.analysis.locality_stats` of the bundled trace.
    trace_info : dict
        ``file``, ``n_per_domain``, ``prompt_len`` (min, max), ``max_new_tokens`` of that trace.
    """
    folder = Path(model_dir)
    cfg = read_json(folder / "config.json")
    cfg.setdefault("num_experts", cfg.get("num_local_experts"))  # transformers 5 writes the attribute-map alias
    tr = read_json(folder / "training.json")
    weights = folder / "model.safetensors"
    held = tr["final_heldout_loss"]
    corpus_rows = [[f["domain"], f["split"], f["documents"], f["bytes"], f["sha256"][:16]] for f in tr["corpus"]["files"]]
    L = len(stats["mi_prefill"])
    layer_rows = [[i, f"{stats['mi_prefill'][i]:.3f}", f"{stats['mi_decode'][i]:.3f}", f"{stats['activation_share_per_layer'][i]:.3f}",
                   f"{stats['baseline_per_layer'][i]:.3f}"] for i in range(L)]
    conf = np.asarray(stats["kmeans_confusion"])
    conf_rows = [[d, *row] for d, row in zip(stats["domains"], conf.tolist())]
    shared = [" + ".join(stats["domains"][i] for i in np.flatnonzero(col >= 0.25 * conf.sum(axis=1))) for col in conf.T]
    merged = [m for m in shared if " + " in m]
    bars = {"MI >= 0.3 nats in some layer": stats["mi_max"] >= 0.3, "activation share gain >= 0.10": stats["gain"] >= 0.10,
            "ARI >= 0.6": stats["ari"] >= 0.6}
    bar_text = "; ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in bars.items())
    text = f"""# moelab-tiny-moe

A small mixture-of-experts causal LM that moelab trains itself (`moelab train-tiny-moe`) so that real
expert activations can be captured on a CPU without downloading any weights. It is a research fixture for
expert-locality experiments (ELDR), not a useful language model.

Load it with plain transformers: `AutoModelForCausalLM.from_pretrained("data/models/tiny-moe")`
(or `moelab.models.load_tiny_moe()`).

## Architecture
- `Qwen3MoeForCausalLM`, {cfg['num_hidden_layers']} decoder layers, **every layer MoE**:
  {cfg['num_experts']} experts per layer, top-{cfg['num_experts_per_tok']} routing (normalised top-k weights),
  expert FFN width {cfg['moe_intermediate_size']}
- hidden size {cfg['hidden_size']}, {cfg['num_attention_heads']} attention heads ({cfg['num_key_value_heads']} KV heads),
  vocabulary {cfg['vocab_size']} (byte-level BPE trained on the corpus with `tokenizers`), tied embeddings
- {tr['parameters'] / 1e6:.2f}M parameters, stored as float16 safetensors ({weights.stat().st_size / 1e6:.1f} MB)

## Training
- corpus: offline, {len({f['domain'] for f in tr['corpus']['files']})} domains built by `moelab.models.corpus.build_corpus`
  (seed {tr['corpus']['seed']}, {tr['corpus']['n_sources']} source files; held-out split by source file;
  synthetic domains: {', '.join(tr['corpus']['synthetic']) or 'none'}). Corpus files (manifest with every source
  file's path, size and sha256: `data/corpus/manifest.json`):

{_fmt_table(['domain', 'split', 'documents', 'bytes', 'sha256 (prefix)'], corpus_rows)}

- objective: next-token cross-entropy + load-balancing aux loss (coefficient {tr['aux_coef']}); AdamW,
  lr {tr['lr']} (warm-up, cosine to 10%), batch {tr['batch']} x {tr['seq_len']} tokens of one domain each,
  domain-balanced sampling
- {tr['steps']} steps, {tr['tokens']:,} training tokens, {tr['train_minutes']} min of wall-clock training on
  {tr['device']} ({tr['threads']} torch threads, a 2-core CPU shared with other jobs), experts implementation
  `{tr['experts_impl']}`

## Held-out loss per domain (nats/token, {tr.get('eval_windows', 8)} windows of {tr['seq_len']} tokens each)

{_fmt_table(['domain', 'held-out loss'], [[d, f'{v:.3f}'] for d, v in sorted(held.items())])}

## Expert locality (measured by `moelab.traces.analysis.locality_stats`)

On the bundled trace `{trace_info['file']}`: {stats['n_requests']} held-out prompts
({trace_info['n_per_domain']} per domain, {trace_info['prompt_len'][0]}-{trace_info['prompt_len'][1]} tokens),
{trace_info['max_new_tokens']} greedy decode tokens each, captured with the HF hook backend.

- max per-layer mutual information between domain and expert: **MI = {stats['mi_max']:.3f} nats**
  (upper bound log {len(stats['domains'])} = {stats['log_n_domains']:.3f})
- activation share: the share of decode expert activations that fall in each request's top-{stats['k']} prefill experts per layer:
  **activation share@{stats['k']} = {stats['activation_share']:.3f}** vs global top-{stats['k']} baseline **{stats['baseline']:.3f}**
  (gain {stats['gain']:.3f})
- K-means ({len(stats['domains'])} clusters) on prefill signatures vs domain: **ARI = {stats['ari']:.3f}**

{_fmt_table(['layer', 'MI prefill (nats)', 'MI decode (nats)', f"activation share@{stats['k']}", 'baseline'], layer_rows)}

K-means clusters of the prefill signatures (columns) against domains (rows):

{_fmt_table(['domain'] + [f'c{j}' for j in range(conf.shape[1])], conf_rows)}

Bars set by the project's issue for this model: {bar_text}.
{('Clusters holding a large share (>= 25%) of two or more domains: ' + ', '.join(merged) + '.') if merged else ''}

`tests/test_tiny_moe.py` recomputes these numbers from the bundled trace.

## Limitations
Tiny and briefly trained: text it generates is mostly locally plausible gibberish. Domain locality in its
routing is real (measured above) but comes from a deliberately domain-separated corpus. Licence of the
weights: the corpus mixes Python (PSF), system headers, man pages and licence texts of their respective
projects; the weights are shipped for research use within moelab.
"""
    return atomic_write_text(folder / "MODEL_CARD.md", text)
