"""Presentation: plotly figures and ipywidgets panels, one module per notebook's story.

Systems never import this package; notebooks call ``moelab.<system>`` for numbers and
``moelab.viz`` for pictures."""

from moelab.viz.common import PALETTE, readable, refresh, save_figure, slider, untitled_axes, write_results

__all__ = ["PALETTE", "readable", "refresh", "save_figure", "slider", "untitled_axes", "write_results"]
