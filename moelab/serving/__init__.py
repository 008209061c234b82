"""Serving in front of live vLLM servers: ``moelab serve-router`` (an asyncio HTTP proxy that routes
with moelab's routers). Speaks HTTP only; never imports torch or vLLM."""

from moelab.serving.proxy import RouterProxy, SignatureSource, validate_payload

__all__ = ["RouterProxy", "SignatureSource", "validate_payload"]
