"""Lecture mode: a notebook's lesson part, with its results read from a run that already computed them.

Every lab notebook is a **lesson** (the problem, the mechanism, a worked example, a headline figure, the
exercises) followed by a **research part** that checks the paper's claim at length. The research part
starts at the first cell tagged :data:`RESEARCH_TAG` (its heading is "Does the paper's claim hold here?");
a notebook without that tag is all lesson. This is the one place that boundary is defined.

``moelab app`` serves the lesson part in Voila. To be instant it does not recompute it: it reads the
outputs of an executed copy of the notebook (a **precomputed run**) and

* re-displays the recorded outputs of every code cell (text, tables, computed prose, plotly figures);
* executes live only the cells the interactive panels need: the parameters cell, every cell whose recorded
  outputs hold an ipywidgets panel, and (transitively) the latest earlier cell that binds a name one of
  those cells reads. Heavy cells no panel depends on are never run.

A precomputed run is ``RUNS/<name>.ipynb`` (``moelab notebooks run``, whose lesson outputs are used even
when its research part failed) or ``RUNS/lecture/<name>.ipynb`` (the lesson part alone, written by
``moelab app NAME --precompute``). It is used only when the source of every lesson code cell is unchanged
since it ran (matched cell by cell), every one of those cells ran without an error, and the parameters it ran
with are the ones asked for; otherwise the page says why and computes the lesson live (slowly), naming the
command that precomputes it.

A cell that mutates an object another cell made (``fig.update_layout(...)``) is not a dependency in this
analysis: in the lab's lesson parts only live cells mutate what live cells read.
"""

from __future__ import annotations

import ast
import builtins
import copy
import html
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moelab._io import read_json
from moelab._outputs import check_output_dir, claim_output_dir, record_outputs
from moelab.notebooks import (
    _kernel_config,
    check_parameters,
    figures_location,
    notebooks_dir,
    parse_cell_source,
)
from moelab.parameters import assignments

#: Cell tag that starts a notebook's research part (lecture mode serves the cells before it).
RESEARCH_TAG = "research"
PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
#: the folder under the runs folder where ``--precompute`` writes lesson-only runs
LECTURE_SUBDIR = "lecture"
#: the writer's name in that folder's output marker (``.moelab-output.json``)
PRECOMPUTE_WRITER = "app --precompute"
_BUILTINS = frozenset(dir(builtins))


def _source(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _tags(cell: dict[str, Any]) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def load(name: str) -> dict[str, Any]:
    """The committed notebook ``notebooks/<name>.ipynb`` as JSON."""
    return json.loads((notebooks_dir() / f"{name}.ipynb").read_text())


def research_start(nb: dict[str, Any]) -> int:
    """Index of the first cell of the research part (the first cell tagged :data:`RESEARCH_TAG`);
    ``len(cells)`` when the notebook has none (it is all lesson)."""
    for i, cell in enumerate(nb.get("cells", [])):
        if RESEARCH_TAG in _tags(cell):
            return i
    return len(nb.get("cells", []))


def lesson_cells(nb: dict[str, Any]) -> list[dict[str, Any]]:
    """The cells of the lesson part, in order (copies)."""
    return copy.deepcopy(nb.get("cells", [])[:research_start(nb)])


# --- which cells the live panels need -----------------------------------------------------------------


def _bound_names(node: ast.AST) -> set[str]:
    """Names a top-level statement binds in the notebook's namespace."""
    out: set[str] = set()
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        for a in node.names:
            out.add((a.asname or a.name).split(".")[0])
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        out.add(node.name)
    else:
        for sub in ast.walk(node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)) and sub is not node:
                continue
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                out.add(sub.id)
    return out


def _local_names(node: ast.AST) -> set[str]:
    """Names bound *inside* a statement for its own use: loop and comprehension variables, function and
    lambda arguments and locals, ``with ... as`` and ``except ... as`` names."""
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, (ast.For, ast.AsyncFor, ast.comprehension)):
            out |= {n.id for n in ast.walk(sub.target) if isinstance(n, ast.Name)}
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = sub.args
            out |= {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if a}
            out |= {a.arg for a in (args.vararg, args.kwarg) if a}
            if not isinstance(sub, ast.Lambda):
                out |= {n.id for b in sub.body for n in ast.walk(b)
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        elif isinstance(sub, ast.withitem) and sub.optional_vars is not None:
            out |= {n.id for n in ast.walk(sub.optional_vars) if isinstance(n, ast.Name)}
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            out.add(sub.name)
    return out


@dataclass(frozen=True)
class CellNames:
    """What one code cell reads from the namespace before binding it itself, and what it binds."""

    reads: frozenset[str]
    binds: frozenset[str]


def cell_names(source: str) -> CellNames:
    """The names a cell reads from earlier cells and the names it binds (see :class:`CellNames`).

    A name read by a statement after an earlier statement of the same cell bound it is not read from
    earlier cells; an augmented assignment reads its target. Unparseable source reads and binds nothing."""
    tree = parse_cell_source(source)
    if tree is None:
        return CellNames(frozenset(), frozenset())
    reads: set[str] = set()
    bound: set[str] = set()
    for stmt in tree.body:
        loads = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        loads |= {n.target.id for n in ast.walk(stmt) if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)}
        reads |= loads - bound - _local_names(stmt) - _BUILTINS
        bound |= _bound_names(stmt)
    return CellNames(frozenset(reads), frozenset(bound))


def live_cells(sources: list[str], seeds: set[int]) -> set[int]:
    """Indices (into ``sources``, the code cells in order) that must run so that the ``seeds`` run: the seeds
    and, transitively, for every name a live cell reads, the latest earlier cell that binds it."""
    names = [cell_names(s) for s in sources]
    live, todo = set(seeds), list(seeds)
    while todo:
        i = todo.pop()
        for name in names[i].reads:
            j = next((j for j in range(i - 1, -1, -1) if name in names[j].binds), None)
            if j is not None and j not in live:
                live.add(j)
                todo.append(j)
    return live


# --- precomputed runs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Precomputed:
    """A run whose outputs can stand in for the lesson part: where it is, the parameters it ran with, when
    it finished, and the recorded outputs of each lesson code cell (by position among the code cells)."""

    path: Path
    parameters: dict[str, Any]
    finished: str
    outputs: dict[int, list[dict[str, Any]]] = field(repr=False)


def candidates(name: str, runs: str | Path) -> list[Path]:
    """Where a precomputed run of ``name`` may be, in the order they are tried."""
    runs = Path(runs).expanduser().resolve()
    return [runs / LECTURE_SUBDIR / f"{name}.ipynb", runs / f"{name}.ipynb"]


def match_run(name: str, executed: dict[str, Any], params: dict[str, Any]) -> tuple[dict[int, list], str]:
    """Match an executed notebook's code cells to ``name``'s lesson code cells.

    Returns
    -------
    (outputs, why_not)
        ``outputs`` maps each lesson code cell's position to its recorded outputs when every lesson cell
        matched (``why_not`` empty); otherwise ``{}`` and the reason, for the page and the log.
    """
    ran_with = executed.get("metadata", {}).get("papermill", {}).get("parameters") or {}
    differ = {k: (ran_with.get(k), v) for k, v in params.items() if ran_with.get(k) != v}
    if differ:
        return {}, "it ran with other parameters (" + ", ".join(
            f"{k}={a!r}, asked {b!r}" for k, (a, b) in sorted(differ.items())) + ")"
    ran = [c for c in executed.get("cells", []) if c.get("cell_type") == "code" and INJECTED_TAG not in _tags(c)]
    lesson = [c for c in lesson_cells(load(name)) if c.get("cell_type") == "code"]
    outputs: dict[int, list] = {}
    at = 0
    for k, cell in enumerate(lesson):
        src = _source(cell)
        while at < len(ran) and _source(ran[at]) != src:
            at += 1
        if at == len(ran):
            return {}, f"lesson code cell {k + 1} has changed since it ran"
        if ran[at].get("execution_count") is None and src.strip():
            return {}, f"lesson code cell {k + 1} did not run"
        if any(o.get("output_type") == "error" for o in ran[at].get("outputs", [])):
            return {}, f"lesson code cell {k + 1} failed in that run"
        outputs[k] = ran[at].get("outputs", [])
        at += 1
    return outputs, ""


def find_precomputed(name: str, runs: str | Path, params: dict[str, Any] | None = None) -> tuple[Precomputed | None, str]:
    """The first usable precomputed run of ``name`` under ``runs`` (see the module docstring), or ``None``
    and why none could be used."""
    reasons = []
    for path in candidates(name, runs):
        if not path.is_file():
            reasons.append(f"{path} does not exist")
            continue
        try:
            executed = read_json(path)  # size and nesting checked before parsing
            if not isinstance(executed, dict):
                raise ValueError("not a notebook")
            meta = executed.get("metadata", {}).get("papermill", {})
            ran_with = _run_parameters(name, meta.get("parameters") or {})
        except (OSError, ValueError, AttributeError) as exc:
            reasons.append(f"{path} cannot be used ({exc})")
            continue
        outputs, why = match_run(name, executed, dict(params or {}))
        if why:
            reasons.append(f"{path}: {why}")
            continue
        return Precomputed(path, ran_with, _timestamp(meta.get("end_time")), outputs), ""
    return None, "; ".join(reasons)


def _run_parameters(name: str, ran_with: Any) -> dict[str, Any]:
    """The parameters a precomputed run records, checked like new ones: a run is outputs only, so what its
    metadata says is data that must pass ``name``'s parameter model before it is shown or set in a kernel."""
    if not isinstance(ran_with, dict):
        raise ValueError("its papermill parameters are not a dict")
    return check_parameters(name, ran_with)


_ISO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?")


def _timestamp(value: Any) -> str:
    """A run's finishing time as shown on the page: an ISO timestamp, or "unknown time" (never free text)."""
    return value if isinstance(value, str) and _ISO_TIME.fullmatch(value) else "unknown time"


# --- the notebook Voila serves --------------------------------------------------------------------------


class OutputReplay:
    """Re-displays recorded cell outputs in a running kernel (the served notebook's replayed cells call it)."""

    def __init__(self, outputs: dict[str, list[dict[str, Any]]]):
        self.outputs = outputs

    @classmethod
    def load(cls, path: str | Path) -> OutputReplay:
        return cls(read_json(path))

    def __call__(self, key: int) -> None:
        # lazy: IPython is only present (and needed) inside a kernel
        from IPython.display import display

        for out in self.outputs[str(key)]:
            kind = out.get("output_type")
            if kind == "stream":
                stream = sys.stderr if out.get("name") == "stderr" else sys.stdout
                stream.write(_source({"source": out.get("text", "")}))
                stream.flush()
            elif kind in ("display_data", "execute_result"):
                data = {k: _source({"source": v}) if isinstance(v, list) else v for k, v in out.get("data", {}).items()}
                display(data, metadata=out.get("metadata", {}), raw=True)


def _code(source: str, tags: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"cell_type": "code", "execution_count": None, "metadata": {"tags": list(tags)}, "outputs": [],
            "source": source}


def _markdown(source: str) -> dict[str, Any]:
    return {"cell_type": "markdown", "metadata": {}, "source": source}


def precompute_command(name: str, runs: str | Path) -> str:
    """The command that writes a precomputed run of ``name``'s lesson part."""
    return f"moelab app {name} --precompute" + ("" if str(runs) == "runs" else f" --from {runs}")


@dataclass(frozen=True)
class LectureNotebook:
    """The notebook to serve, which of its lesson code cells run live, and where its outputs came from."""

    notebook: dict[str, Any]
    live: tuple[int, ...]
    replayed: tuple[int, ...]
    precomputed: Precomputed | None
    why_not: str = ""


def lecture_notebook(name: str, params: dict[str, Any], runs: str | Path, replay_file: Path) -> LectureNotebook:
    """Build the notebook ``moelab app`` serves for ``name``: its lesson part, a note saying where the
    results come from, and (given a precomputed run) replayed outputs for every cell the panels do not need.
    The recorded outputs are written to ``replay_file`` (read by the served notebook's kernel)."""
    nb = load(name)
    pre, why_not = find_precomputed(name, runs, params)
    cells = lesson_cells(nb)
    code = [c for c in cells if c.get("cell_type") == "code"]
    effective = dict(pre.parameters) if pre else dict(params)
    if pre is None:
        why = html.escape(why_not).replace("`", "'")  # names files and values a run's metadata holds: text only
        note = (f"**Lecture mode: no precomputed results** for `{name}` ({why}). This page computes the "
                f"lesson now, which can take minutes. To make it instant, run `{precompute_command(name, runs)}` "
                f"(or `moelab notebooks run {name}`) once, then serve it again.")
        live = set(range(len(code)))
    else:
        shown = html.escape(", ".join(f"{k}={v!r}" for k, v in sorted(pre.parameters.items())).replace("`", "'"))
        note = (f"**Lecture mode.** The results on this page were computed by an earlier run "
                f"(`{html.escape(pre.path.name)}`, finished {pre.finished}, with "
                f"{f'<code>{shown}</code>' if shown else 'the notebook defaults'}); the interactive panels run live.")
        seeds = {k for k, c in enumerate(code) if PARAMETERS_TAG in _tags(c)
                 or any(WIDGET_MIME in o.get("data", {}) for o in pre.outputs.get(k, []))}
        live = live_cells([_source(c) for c in code], seeds)
        replay_file.write_text(json.dumps({str(k): v for k, v in pre.outputs.items()}))
    served: list[dict[str, Any]] = [_markdown(note)]
    if pre is not None:
        served.append(_code("from moelab.lecture import OutputReplay as _Replay\n"
                            f"_moelab_replay = _Replay.load({str(replay_file)!r})"))
    k = -1
    for cell in cells:
        if cell.get("cell_type") != "code":
            served.append(cell)
            continue
        k += 1
        if k in live:
            cell["outputs"], cell["execution_count"] = [], None
            served.append(cell)
        else:
            served.append(_code(f"_moelab_replay({k})", tags=("replayed",)))
        if PARAMETERS_TAG in _tags(cell) and effective:
            served.append(_code(assignments(effective, header="# parameters of this lecture"), tags=(INJECTED_TAG,)))
    for i, cell in enumerate(served):
        cell.setdefault("id", f"moelab-lecture-{i}")
    out = {k: v for k, v in nb.items() if k != "cells"}
    out["cells"] = served
    return LectureNotebook(out, tuple(sorted(live)), tuple(sorted(set(range(len(code))) - live)), pre, why_not)


def lesson_only(name: str) -> dict[str, Any]:
    """``name``'s lesson part as a notebook of its own (what ``--precompute`` executes)."""
    nb = load(name)
    out = {k: v for k, v in nb.items() if k != "cells"}
    out["cells"] = lesson_cells(nb)
    return out


def precompute(name: str, params: dict[str, Any], runs: str | Path, *, timeout_s: int = 1800) -> Path:
    """Execute ``name``'s lesson part with papermill into ``RUNS/lecture/<name>.ipynb`` (the precomputed run
    ``moelab app`` reads first). Figures go to ``$MOELAB_FIGURES`` or ``RUNS/lecture/figures``.

    Raises
    ------
    ValueError
        When a parameter is unknown or a lesson cell fails (the message names the cell's error).
    """
    # lazy: papermill pulls in the whole notebook runner (nbclient, jupyter_client, zmq)
    import papermill as pm

    params = _run_parameters(name, params)
    out_dir = check_output_dir(Path(runs).expanduser() / LECTURE_SUBDIR, writer=PRECOMPUTE_WRITER, name="--from",
                               overwrites=[f"{name}.ipynb"])
    claim_output_dir(out_dir, PRECOMPUTE_WRITER)
    source, output = out_dir / f".{name}.lesson.ipynb", out_dir / f"{name}.ipynb"
    source.write_text(json.dumps(lesson_only(name)))
    before = os.environ.get("MOELAB_FIGURES")
    os.environ["MOELAB_FIGURES"] = str(figures_location(out_dir))
    try:
        pm.execute_notebook(str(source), str(output), parameters=params, cwd=str(notebooks_dir()),
                            progress_bar=False, execution_timeout=timeout_s, kernel_name="python3",
                            config=_kernel_config())
    except Exception as exc:  # papermill re-raises the cell's error: name it
        raise ValueError(f"precomputing {name}'s lesson failed: {str(exc).strip().splitlines()[-1][:300]} "
                         f"(the partial run is {output})") from None
    finally:
        source.unlink(missing_ok=True)
        if before is None:
            os.environ.pop("MOELAB_FIGURES", None)
        else:
            os.environ["MOELAB_FIGURES"] = before
        if output.is_file():
            record_outputs(out_dir, PRECOMPUTE_WRITER, [output])
    return output


__all__ = ["LECTURE_SUBDIR", "RESEARCH_TAG", "CellNames", "LectureNotebook", "OutputReplay", "Precomputed",
           "candidates", "cell_names", "find_precomputed", "lecture_notebook", "lesson_cells", "lesson_only",
           "live_cells", "match_run", "precompute", "precompute_command", "research_start"]
