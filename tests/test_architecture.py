"""The shape of the house, checked statically (``shared/spec/ARCHITECTURE.md``).

The import graph is read from the source with :mod:`ast` (function-level imports included, nothing is
executed), so a cycle closed by an import hidden inside a function is found like any other. The rules:

* no import cycle among moelab's modules;
* paper folders (``afd``, ``dsd``, ``eldr``, ``hd``, ``balanceroute``) never import each other, nor
  ``bench/``, ``make/`` or ``sweep/``;
* the shared floor (``traces``, ``costmodel``, ``routing``, ``sim``, ``datasets`` and the private helpers)
  imports no paper folder and nothing above it; ``models/`` and ``sweep/`` import no paper folder;
* notebooks import nothing from ``moelab.bench`` or ``moelab.make``;
* an import inside a function is there to keep a heavy optional dependency (torch, vLLM, plotly, Ray, ...)
  lazy, and says so in a ``# lazy: ...`` comment on its line or just above its block.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "moelab"
PAPERS = ("afd", "dsd", "eldr", "hd", "balanceroute")
FLOOR = ("traces", "costmodel", "routing", "sim", "datasets", "_io", "_stats", "_validate")
ABOVE_PAPERS = ("bench", "make", "sweep")


def _module_names() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = _module_names()


def _resolve(name: str) -> str | None:
    """The moelab module a dotted name lives in (a module, or the package whose attribute it is)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        # `from pkg import sub` depends on the submodule when `sub` is one, else on `pkg` itself
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    out = []
    for name in names:
        if name == "moelab" or name.startswith("moelab."):
            target = _resolve(name)
            if target and target != module:
                out.append(target)
    return out


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str):
        self.module, self.depth = module, 0
        self.edges: set[str] = set()
        self.nested: list[ast.Import | ast.ImportFrom] = []

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.edges.update(_targets(node, self.module))
        if self.depth:
            self.nested.append(node)

    visit_Import = visit_ImportFrom = _import


def _scan() -> tuple[dict[str, set[str]], dict[str, list[tuple[int, str]]]]:
    graph, unexplained = {}, {}
    for module, path in MODULES.items():
        source = path.read_text()
        visitor = _Imports(module)
        visitor.visit(ast.parse(source))
        graph[module] = visitor.edges
        lines = source.splitlines()
        for node in visitor.nested:
            if not _explained(lines, node.lineno - 1):
                unexplained.setdefault(module, []).append((node.lineno, lines[node.lineno - 1].strip()))
    return graph, unexplained


def _explained(lines: list[str], i: int) -> bool:
    """A ``# lazy`` comment on the import's line, or on the comment line just above its block of imports."""
    if "# lazy" in lines[i]:
        return True
    j = i - 1
    while j >= 0 and lines[j].strip().startswith(("import ", "from ")):
        j -= 1
    return j >= 0 and lines[j].strip().startswith("# lazy")


GRAPH, UNEXPLAINED = _scan()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _violations(sources: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} -> {t}" for m, targets in GRAPH.items() if _top(m) in sources
                  for t in targets if _top(t) in forbidden and _top(t) != _top(m))


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    assert _cycles(GRAPH) == []


def test_papers_import_no_other_paper_and_nothing_above_them():
    assert _violations(PAPERS, PAPERS + ABOVE_PAPERS + ("viz", "serving", "cross", "cli", "app")) == []


def test_floor_imports_no_paper_and_nothing_above_it():
    above = PAPERS + ABOVE_PAPERS + ("viz", "serving", "cross", "cli", "app", "models", "capture", "routers")
    assert _violations(FLOOR, above) == []


def test_models_and_sweep_import_no_paper():
    assert _violations(("models", "sweep"), PAPERS + ("bench", "make")) == []


def test_function_level_imports_say_why():
    assert UNEXPLAINED == {}


@pytest.mark.parametrize("notebook", sorted((ROOT / "notebooks").glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebooks_import_nothing_from_bench_or_make(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    bad = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        try:
            tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            bad += [n for n in names if n.startswith(("moelab.bench", "moelab.make"))]
    assert bad == []
