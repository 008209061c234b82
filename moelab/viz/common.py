"""Figure output and widget helpers shared by every notebook."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from moelab._io import atomic_write_json, atomic_write_text

PALETTE = {
    "eldr": "#d62728", "hd": "#d62728", "br0": "#d62728", "brh": "#9467bd",
    "round_robin": "#7f7f7f", "random": "#bcbd22", "jsq": "#1f77b4", "p2c": "#17becf",
    "least_kv": "#2ca02c", "vllm_dp": "#ff7f0e", "domain_oracle": "#8c564b",
    "theory": "#1f77b4", "simulation": "#d62728",
}
FIGURES_ENV = "MOELAB_FIGURES"
PNG_ENV = "MOELAB_PNG"  # "0": HTML only (fast, for CI); "1": PNG required; unset: PNG when a Chromium exists


def figures_dir(out_dir: str | os.PathLike | None = None) -> Path:
    """Where figures go: ``out_dir``, else ``$MOELAB_FIGURES``, else ``figures/`` at the repo root."""
    if out_dir is None:
        out_dir = os.environ.get(FIGURES_ENV)
    if out_dir is None:
        from moelab.datasets import repo_root

        out_dir = repo_root() / "figures"
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def save_figure(fig: Any, name: str, out_dir: str | os.PathLike | None = None, *, png: bool | None = None) -> dict[str, Path]:
    """Write ``fig`` as an HTML file (always) and a PNG (when kaleido finds a Chromium; ``png=True``
    or ``$MOELAB_PNG=1`` makes a failed export an error, ``$MOELAB_PNG=0`` skips it). Returns the paths."""
    out = figures_dir(out_dir)
    written = {"html": atomic_write_text(out / f"{name}.html", fig.to_html(include_plotlyjs="cdn", full_html=True))}
    if png is None and os.environ.get(PNG_ENV) in ("0", "1"):
        png = os.environ[PNG_ENV] == "1"
    want_png = png if png is not None else _chromium() is not None
    if want_png:
        try:
            import plotly.io as pio

            written["png"] = out / f"{name}.png"
            data = pio.to_image(fig, format="png", width=1000, height=560, scale=1)
            from moelab._io import atomic_write_bytes

            atomic_write_bytes(written["png"], data)
        except Exception as exc:  # kaleido or Chromium missing/broken
            written.pop("png", None)
            if png:
                raise RuntimeError(f"PNG export failed ({exc}); install kaleido and Debian's chromium") from exc
    return written


def write_results(name: str, results: dict[str, Any], out_dir: str | os.PathLike | None = None) -> Path:
    """Record a notebook's key numbers as ``<name>.json`` next to its figures (tests read it)."""
    return atomic_write_json(figures_dir(out_dir) / f"{name}.json", results)


def refresh(widget: Any, fig: Any) -> None:
    """Make a ``FigureWidget`` show a freshly built figure in one redraw: traces updated in place when
    the trace list has the same length (so legends and widget state stay), replaced otherwise; layout
    merged (titles, shapes, annotations, axes)."""
    with widget.batch_update():
        if len(widget.data) == len(fig.data):
            for old, new in zip(widget.data, fig.data):
                old.update({k: v for k, v in new.to_plotly_json().items() if k != "type"})
        else:
            widget.data = []
            widget.add_traces(list(fig.data))
        widget.layout.update(fig.layout.to_plotly_json())


def slider(description: str, value: float, low: float, high: float, step: float, *, integer: bool = False, **kw: Any):
    """An ipywidgets slider with a readable label width (ipywidgets imported lazily)."""
    import ipywidgets as w

    cls = w.IntSlider if integer else w.FloatSlider
    return cls(value=value, min=low, max=high, step=step, description=description, continuous_update=False,
               style={"description_width": "initial"}, layout=w.Layout(width="420px"), **kw)
