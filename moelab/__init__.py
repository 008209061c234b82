"""moelab — a lab for Mixture-of-Experts LLM serving research.

Five systems reproduced end to end, one sub-package each (``afd``, ``dsd``, ``eldr``, ``hd``,
``balanceroute``), on a shared floor (``traces``, ``costmodel``, ``routing``, ``sim``, ``datasets``).
Importing :mod:`moelab` never imports torch, transformers, vllm, plotly or ipywidgets.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("moelab")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
