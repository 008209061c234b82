"""Presentation: plotly figures and ipywidgets panels, one module per notebook's story.

Systems never import this package; notebooks call ``moelab.<system>`` for numbers and
``moelab.viz`` for pictures."""

from moelab.viz.common import PALETTE, save_figure, slider, write_results

__all__ = ["PALETTE", "save_figure", "slider", "write_results"]
