"""The widget front end the live panels run on.

plotly's ``FigureWidget`` is an anywidget. From anywidget 0.9.17 on (0.11.0 is the latest release), the browser
side rejects a model's readiness when its module takes more than 2 s to initialise, and from then on every message
from the kernel to that model is dropped, for the life of the page. Plotly's module is a 5 MB bundle; on a busy
2-core machine, or a loaded laptop in a classroom, it takes longer than that, and the panel shows its first figure
but never redraws: the sliders move and the kernel recomputes (its status line changes), the figures do not. That
was the browser tests' intermittent failure, reproduced by throttling Chromium's CPU while the lesson loads.
anywidget 0.9.15 and 0.9.16 wait for the module instead; the project pins them (pyproject.toml) until a release
without the timeout exists, and this test fails if the front end that JupyterLab and Voila serve has it again.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest


def _served_front_end() -> Path:
    """The anywidget JupyterLab extension JupyterLab and Voila load (the environment's share folder)."""
    for root in (Path(sys.prefix), Path(sys.base_prefix)):
        static = root / "share" / "jupyter" / "labextensions" / "anywidget" / "static"
        if static.is_dir():
            return static
    pytest.fail("anywidget's JupyterLab extension is not installed under share/jupyter/labextensions: the live "
                "panels' figures cannot render (pip install 'anywidget>=0.9.15,<0.9.17')")


def test_anywidget_front_end_waits_for_a_slow_module():
    static = _served_front_end()
    timed_out = sorted(p.name for p in static.glob("*.js")
                       if "Failed to initialize model" in p.read_text(encoding="utf-8", errors="replace"))
    assert not timed_out, (
        f"the anywidget front end in {static} ({', '.join(timed_out)}) gives up on a model whose module loads in "
        "over 2 s and then drops every message to it: live figures stop redrawing on a busy machine. Install a "
        "release that waits (pyproject.toml pins anywidget>=0.9.15,<0.9.17) or one that fixed the timeout.")


def test_anywidget_front_end_holds_messages_until_the_module_is_ready():
    """The other half of the contract: a model's incoming messages wait for its module (the early-message loss
    0.9.15 fixed: a panel updated right after it was displayed would keep its first figure)."""
    static = _served_front_end()
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in static.glob("*.js"))
    # the override of _handle_comm_msg that awaits the model's runtime before handling the message
    assert re.search(r"_handle_comm_msg\([^)]*\)\s*\{[^}]{0,200}?await[^}]{0,80}?\.ready", text), \
        f"the anywidget front end in {static} does not wait for its module before handling a message"
