"""The trace data models every system reads: request traces and expert-activation traces, and the one
loader of expert-trace files (:func:`load_trace`, whichever format wrote them)."""

from moelab._io import FileFormatError
from moelab.traces.compact import load_compact_trace, save_compact_trace
from moelab.traces.expert import (
    ExpertTrace,
    Geometry,
    TraceFieldError,
    concat_traces,
    default_provenance,
    expert_counts,
    recorded_with,
)
from moelab.traces.files import bundled_trace_path, load_trace, real_trace_path, traces_dir
from moelab.traces.requests import RequestRowError, RequestTrace, load_azure_trace, replay_requests

__all__ = ["ExpertTrace", "FileFormatError", "Geometry", "RequestRowError", "RequestTrace", "TraceFieldError", "bundled_trace_path", "concat_traces", "default_provenance",
           "expert_counts", "load_azure_trace", "load_compact_trace", "load_trace", "real_trace_path", "recorded_with",
           "replay_requests", "save_compact_trace", "traces_dir"]
