"""make: the scripts that produce ``data/`` — nothing in the library's import path reads them.

* :mod:`moelab.make.train` — ``moelab train-moe``: train a project MoE (corpus, tokenizer, model);
  :mod:`moelab.make.tiny_moe` — ``moelab train-tiny-moe`` (the same with ``--preset tiny-moe``).
* :mod:`moelab.make.tiny_moe_trace` — capture the tiny MoE's bundled trace and write its card.
* :mod:`moelab.make.deployment_trace` — record notebook 06's requests through a live vLLM engine (the capture
  the book shows 06 from where no live engine is installed).
* :mod:`moelab.make.sharegpt_moe` — capture the ShareGPT-MoE's real traces, their locality statistics
  and its model card.
* :mod:`moelab.make.calibrate` — ``moelab calibrate``: measure a GPU's step costs into the tables the
  cost models fit on.

Notebooks and the paper folders import nothing from here.
"""

from __future__ import annotations

import re
from pathlib import Path

from moelab._io import atomic_write_text


def write_readme_section(readme: str | Path, name: str, section: str, *, title: str = "# Bundled expert traces") -> Path:
    """Replace (or append) the section ``name`` of ``readme``, between ``<!-- name: begin -->`` and
    ``<!-- name: end -->``, leaving every other section as it is: one folder's README describes files that
    different scripts make (the tiny MoE's trace, notebook 06's recorded capture, hand-written notes), and
    regenerating one must not drop the others. A README without the markers gets the section appended;
    a missing README starts with ``title``."""
    readme = Path(readme)
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    block = f"{begin}\n{section.strip(chr(10))}\n{end}\n"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else title + "\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + block
    atomic_write_text(readme, text)
    return readme
