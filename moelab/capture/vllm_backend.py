"""The vLLM backend of :func:`moelab.capture.capture`, in three modules with one job each:

* :mod:`moelab.capture.vllm_hooks` — what runs inside vLLM's worker (capture hooks);
* :mod:`moelab.capture.vllm_driver` — the capture itself (:func:`capture_vllm`, :func:`prefill_counts`);
* :mod:`moelab.capture.vllm_service` — the loopback prefill-count service for ELDR routing and its CLI.

This module re-exports their public names (``python -m moelab.capture.vllm_backend serve-counts`` works).
"""

from __future__ import annotations

from moelab.capture.vllm_driver import capture_vllm, prefill_counts, resolve_model_path
from moelab.capture.vllm_hooks import NoMoELayersError, install_hooks, remove_hooks
from moelab.capture.vllm_service import PrefillCountServer, main

__all__ = ["NoMoELayersError", "PrefillCountServer", "capture_vllm", "install_hooks", "main", "prefill_counts",
           "remove_hooks", "resolve_model_path"]

if __name__ == "__main__":
    import sys

    sys.exit(main())
