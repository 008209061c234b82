"""What every HD store file records about its origin: the tokenizer's identity and build metadata."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from moelab._validate import check_instance


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """Name, vocabulary size and a sha256 of the (token, id) vocabulary — what store files record."""
    check_instance("tokenizer", tokenizer, None, "a tokenizer (e.g. transformers.AutoTokenizer.from_pretrained(...))",
                   methods=("get_vocab",))
    cached = getattr(tokenizer, "_moelab_identity", None)
    if cached is not None:
        return cached
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()
    name = getattr(tokenizer, "moelab_name", None) or str(getattr(tokenizer, "name_or_path", ""))
    ident = {"name": name, "vocab_size": len(vocab), "sha256": digest}
    try:
        tokenizer._moelab_identity = ident
    except AttributeError:  # some tokenizers refuse new attributes; then it is recomputed next time
        pass
    return ident


def store_meta(kind: str, tokenizer: Any, source: str, extra: dict[str, Any]) -> dict[str, Any]:
    """Metadata every S/L file records: kind, tokenizer identity, source, creation time, build details."""
    return {"kind": kind, "tokenizer": tokenizer_identity(tokenizer), "source": source,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra}


__all__ = ["store_meta", "tokenizer_identity"]
