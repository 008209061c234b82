"""One sequence's KV cache with tree-shaped forwards (the verification primitive), and chat prompts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


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
        from transformers import DynamicCache  # lazy: transformers pulls in torch

        self.model = model
        self.device = next(model.parameters()).device
        self.cache = DynamicCache(config=model.config)
        self.length = 0  # committed tokens in the cache
        self._pending = 0  # tree nodes appended by the last forward_tree, not yet committed
        self.forwards = 0

    def _forward(self, ids, positions, mask):
        import torch  # lazy: torch is heavy and optional

        with torch.inference_mode():
            out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask,
                             past_key_values=self.cache, use_cache=True)
        self.forwards += 1
        logits = out.logits[0]
        return logits.float().cpu().numpy() if logits.dtype == torch.bfloat16 or self.device.type != "cpu" \
            else logits.numpy()

    def prefill(self, ids: Sequence[int]) -> np.ndarray | None:
        """Append ``ids`` to the cache (causal); returns the logits of the last position (None if empty)."""
        import torch  # lazy: torch is heavy and optional

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
        import torch  # lazy: torch is heavy and optional

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
        import torch  # lazy: torch is heavy and optional

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


__all__ = ["LMSession", "chat_prompt_ids"]
