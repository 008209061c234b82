"""ELDR signatures for live routing: prefill counts from the prefill-count service -> unit vector.

The proxy never runs the model: it asks :class:`moelab.capture.vllm_service.PrefillCountServer`
(an engine with moelab's capture hooks) for a prompt's per-layer expert counts over HTTP, and turns
them into a signature with a :class:`moelab.eldr.SignatureBuilder` fitted on calibration requests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from moelab._validate import check_real
from moelab.serving.client import fetch_json


class ELDRSignatureClient:
    """Signature source for :class:`~moelab.serving.proxy.RouterProxy`: one prefill pass per request
    on the prefill-count service at ``url``, then ``builder.transform``. A broken or late reply raises one
    of :data:`moelab.serving.client.BACKEND_ERRORS` (the proxy answers 502)."""

    def __init__(self, url: str, builder: Any, *, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.builder = builder
        self.timeout_s = check_real("timeout_s", timeout_s, low=0, low_open=True)
        self.requests = 0

    async def counts(self, payload: dict[str, Any]) -> np.ndarray:
        """The prompt's prefill counts ``[L, E]``."""
        body = {k: payload[k] for k in ("prompt", "messages") if k in payload}
        status, data = await fetch_json(None, self.url, "POST", "/v1/prefill_counts", body, timeout_s=self.timeout_s)
        if status != 200 or not isinstance(data, dict) or "counts" not in data:
            msg = data.get("error", {}).get("message") if isinstance(data, dict) else str(data)[:200]
            raise ValueError(f"prefill-count service answered {status}: {msg}")
        try:
            counts = np.asarray(data["counts"], dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError("prefill-count service answered counts that are not a numeric [L, E] array") from None
        if counts.ndim != 2 or not np.isfinite(counts).all() or (counts.size and counts.min() < 0):
            raise ValueError(f"prefill-count service answered bad counts (need a finite, non-negative [L, E] array; "
                             f"got shape {counts.shape})")
        self.requests += 1
        return counts

    async def signature(self, payload: dict[str, Any]) -> np.ndarray:
        """The request's unit signature (refused with ``ValueError`` if not finite: it never reaches a router)."""
        sig = self.builder.transform(await self.counts(payload))[0]
        if not np.isfinite(sig).all():
            raise ValueError("signature is not finite (NaN/inf); refusing to route on it")
        return sig
