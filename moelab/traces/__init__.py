"""The trace data models every system reads: request traces and expert-activation traces."""

from moelab.traces.expert import ExpertTrace, Geometry, default_provenance, expert_counts
from moelab.traces.requests import RequestTrace, load_azure_trace, replay_requests

__all__ = ["ExpertTrace", "Geometry", "RequestTrace", "default_provenance", "expert_counts", "load_azure_trace",
           "replay_requests"]
