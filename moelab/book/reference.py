"""The API reference of the book: one page per public package, generated from the NumPy docstrings.

Public means: a module or package directly under :mod:`moelab` whose name does not start with ``_`` and
that declares ``__all__``; every name in that ``__all__`` gets an entry (Sphinx ``autodoc`` with
``napoleon`` reading the NumPy-style sections, an ``autosummary`` table at the top of each page). Private
modules (``moelab._io``, ``moelab.sim._cluster_jit``, ...) and names outside ``__all__`` stay out.

:func:`undocumented` lists the public names without a docstring (a function or class without its own
``__doc__``, a dataclass with only the generated signature, a constant without a ``#:`` comment): the test
suite fails on any, and ``moelab bench notebooks`` reports their count (``api_public_names_undocumented``).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType

import moelab

#: the Sphinx extensions and settings the reference needs (added to the book's ``conf.py``)
SPHINX_CONF = '''
import re

extensions += ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon"]
autosummary_generate = False  # the tables link to the entries on the same page; no stub pages
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# numpy's ArrayLike by its name: expanded, it filled nine lines per signature and named bytes and str as accepted
autodoc_type_aliases = {"ArrayLike": "numpy.typing.ArrayLike"}
autodoc_default_options = {"show-inheritance": True}
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_rtype = False
suppress_warnings += ["autodoc", "autosummary", "ref.python", "docutils", "autodoc.import_object"]


def _top_level_parts(text):
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _parseable_signature(app, what, name, obj, options, signature, return_annotation):
    if not signature or not (signature.startswith("(") and signature.endswith(")")):
        return signature, return_annotation
    # a dataclass field with a default factory shows as "=<factory>", a lambda default as "=<function X.<lambda>>":
    # neither is Python, so Sphinx printed the whole signature raw, "~typing.Any" prefixes and all
    signature = re.sub(r"<(?:factory|function [\\w.]*(?:<lambda>)?)>", "...", signature)
    # Sphinx's own forms that are not Python: an aliased type inside a union ("TypeAliasForwardRef('X') | None")
    # and a callable taking any arguments ("Callable[[...], Y]" for Callable[..., Y])
    signature = re.sub(r"TypeAliasForwardRef\\('([^']+)'\\)", r"\\1", signature)
    signature = re.sub(r"Callable\\[\\[\\.\\.\\.\\],", "Callable[...,", signature)
    # a parameter named with a leading "_" is one moelab fills itself (a dataclass's private state): not shown
    params = [p for p in _top_level_parts(signature[1:-1]) if not p.strip().lstrip("*").startswith("_")]
    if params and params[-1].strip() == "*":  # every keyword-only parameter was private
        params.pop()
    return "(" + ",".join(params).strip() + ")", return_annotation


def _public_reference(app, env, node, contnode):
    # a docstring names an object by the module that defines it (moelab.hd.policy.PolicyChoice), or by its bare
    # name (ExpertTrace on moelab.eldr's page); its entry is under the public package that exports it
    # (moelab.hd.PolicyChoice, moelab.traces.ExpertTrace): resolve to that (reference_target), else leave it unlinked
    target = node.get("reftarget", "").lstrip("~.")
    if node.get("refdomain") != "py" or not target:
        return None
    from moelab.book.reference import reference_target

    entry = reference_target(target, module=node.get("py:module"))
    if entry is None or entry == target:
        return None
    return env.get_domain("py").resolve_xref(env, node["refdoc"], app.builder, "obj", entry, node, contnode)


def _public_bases(app, name, obj, options, bases):
    # "Bases: object" on every plain class is a dead link (no intersphinx offline) and says nothing; a private
    # base (a leading underscore) is an implementation detail with no entry of its own
    bases[:] = [b for b in bases if b is not object and not getattr(b, "__name__", "").startswith("_")]


def setup(app):
    app.connect("autodoc-process-signature", _parseable_signature)
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("missing-reference", _public_reference)
'''
#: the folder of the reference pages inside the book's source
FOLDER = "api"


def public_modules() -> list[str]:
    """Names of the public modules and packages directly under :mod:`moelab` (those with ``__all__``).

    Returns
    -------
    list of str
        Sorted, e.g. ``["moelab.afd", "moelab.balanceroute", ...]``.
    """
    out = []
    for info in pkgutil.iter_modules(moelab.__path__):
        if info.name.startswith("_"):
            continue
        name = f"moelab.{info.name}"
        if hasattr(_import(name), "__all__"):
            out.append(name)
    return sorted(out)


def _import(name: str) -> ModuleType:
    return importlib.import_module(name)


def public_names() -> dict[str, list[str]]:
    """Every public name, by module: the ``__all__`` of each of :func:`public_modules`.

    Returns
    -------
    dict of str to list of str
    """
    return {m: list(_import(m).__all__) for m in public_modules()}


@cache
def _public_names_cached() -> dict[str, tuple[str, ...]]:
    return {m: tuple(n) for m, n in public_names().items()}


@cache
def _attr_docs(module: str) -> dict[str, str]:
    """``#:`` comments and attribute docstrings of ``module``'s top-level names (as Sphinx reads them)."""
    try:
        from sphinx.pycode import ModuleAnalyzer  # lazy: Sphinx is the docs extra
    except ImportError:  # without Sphinx, read the ``#:`` lines ourselves
        return _hash_colon_docs(module)
    try:
        docs = ModuleAnalyzer.for_module(module).find_attr_docs()
    except Exception:  # noqa: BLE001 - a module Sphinx cannot parse documents nothing
        return {}
    return {name: "\n".join(lines) for (scope, name), lines in docs.items() if scope == ""}


def _hash_colon_docs(module: str) -> dict[str, str]:
    path = getattr(_import(module), "__file__", None)
    if not path:
        return {}
    out, pending = {}, []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("#:"):
            pending.append(line[2:].strip())
            continue
        head = line.split("=", 1)[0].split(":", 1)[0].strip()
        if pending and head.isidentifier() and not line.startswith((" ", "\t")):
            out[head] = " ".join(pending)
        pending = []
    return out


def _own_doc(obj: object) -> str | None:
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    if inspect.isclass(obj):
        if any(doc is getattr(base, "__doc__", None) for base in obj.__mro__[1:]):
            return None  # inherited, not its own
        if doc.startswith(f"{obj.__name__}("):  # the signature a dataclass writes when it has no docstring
            return None
    return doc


def _is_code(obj: object) -> bool:
    """A class, function or module (documented by its docstring), not a constant (documented by ``#:``)."""
    return inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)


def _data_doc(module: str, name: str, obj: object) -> str | None:
    """The ``#:`` documentation of a constant, looked up in every moelab module that holds the same object."""
    for modname in [module, *sorted(m for m in sys.modules if m.startswith("moelab."))]:
        mod = sys.modules.get(modname)
        if mod is None or getattr(mod, name, _MISSING) is not obj:
            continue
        doc = _attr_docs(modname).get(name)
        if doc:
            return doc
    return None


_MISSING = object()


def docstring(module: str, name: str) -> str | None:
    """The documentation of the public name ``module.name``, or None when it has none.

    Parameters
    ----------
    module : str
        A public module, e.g. ``"moelab.afd"``.
    name : str
        A name of its ``__all__``.

    Returns
    -------
    str or None
    """
    obj = getattr(_import(module), name)
    if _is_code(obj):
        return _own_doc(obj)
    return _data_doc(module, name, obj)


def undocumented() -> list[str]:
    """Every public name without documentation, as ``"module.name"`` (goal: none).

    Returns
    -------
    list of str
    """
    return [f"{m}.{n}" for m, names in public_names().items() for n in names if not docstring(m, n)]


#: the NumPy docstring sections whose entries are ``name : type`` lines, each with an indented description
FIELD_SECTIONS = ("Parameters", "Other Parameters", "Attributes")


def _field_faults(doc: str) -> list[str]:
    """The entries of ``doc``'s :data:`FIELD_SECTIONS` that napoleon cannot read as NumPy fields: an entry
    without an indented description below it (``"num_layers : decoder layers"`` shows the description as
    the type), or one whose type after ``" :"`` is empty."""
    lines = doc.splitlines()
    faults, section = [], None
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and re.fullmatch(r"-{3,}", lines[i + 1].strip()) and line.strip():
            section = line.strip()
            continue
        if re.fullmatch(r"-{3,}", line.strip()) or section not in FIELD_SECTIONS:
            continue
        if not line.strip() or line[0].isspace():
            continue
        below = next((x for x in lines[i + 1:] if x.strip()), "")
        if not below[:1].isspace() or line.rstrip().endswith(" :"):
            faults.append(f"{section}: {line.strip()}")
    return faults


def _public_code() -> Iterator[tuple[str, object]]:
    """``("module.name", obj)`` for every public class and function (once, where the reference documents it),
    and ``("module.Class.member", function)`` for each class's ``__init__`` and public methods and properties."""
    for name, obj in _entries_by_object().values():
        yield name, obj
        if inspect.isclass(obj):
            members = [("__init__", obj.__init__), *((a, v) for a, v in vars(obj).items() if not a.startswith("_"))]
            for attr, value in members:
                value = getattr(value, "fget", None) or getattr(value, "__func__", value)  # a property, a classmethod
                if inspect.isroutine(value):
                    yield f"{name}.{attr}", value


def malformed_fields() -> list[str]:
    """Every NumPy field entry of a public name (or of its public methods and properties) that napoleon
    would render wrongly, as ``"module.name: Section: entry"`` (goal: none).

    Returns
    -------
    list of str
    """
    # a member's own docstring only (inspect.getdoc would repeat a base class's under every subclass)
    return [f"{name}: {fault}" for name, obj in _public_code()
            for fault in _field_faults(inspect.cleandoc(getattr(obj, "__doc__", None) or ""))]


def _summary(module: ModuleType) -> str:
    doc = inspect.getdoc(module) or ""
    return doc.strip().split("\n\n", 1)[0].replace("\n", " ")


def page(module: str, seen: set[int] | None = None) -> str:
    """The reStructuredText reference page of one public module: its docstring, a table of its names
    with their one-line summaries, then every name's full entry.

    Parameters
    ----------
    module : str
        One of :func:`public_modules`.
    seen : set of int, optional
        ``id`` of the objects already documented on earlier pages: a name re-exported here (e.g.
        :class:`moelab.routing.RouterCalibration` in :mod:`moelab.routers`) gets its entry without a second
        index target. Updated in place.

    Returns
    -------
    str
    """
    seen = set() if seen is None else seen
    mod = _import(module)
    names = list(mod.__all__)
    title = f"``{module}``"
    lines = [title, "=" * len(title), "", f".. automodule:: {module}", "   :no-members:", ""]
    # autosummary would summarise a constant by its type's docstring (a dict's "dict(**kwargs) -> ..."): constants
    # get a table of their own ``#:`` lines instead
    code = [n for n in names if _is_code(getattr(mod, n))]
    if code:
        lines += [".. autosummary::", "   :nosignatures:", ""] + [f"   {module}.{n}" for n in code] + [""]
    constants = [n for n in names if n not in code]
    if constants:
        lines += [".. list-table:: Constants", "   :widths: 1 3", ""]
        for n in constants:
            first = (_data_doc(module, n, getattr(mod, n)) or "").strip().split("\n\n", 1)[0].replace("\n", " ")
            lines += [f"   * - :py:data:`{n} <{module}.{n}>`", f"     - {first}"]
        lines.append("")
    for n in names:
        obj = getattr(mod, n)
        again = ["   :no-index:"] if id(obj) in seen and (inspect.isclass(obj) or inspect.isroutine(obj)) else []
        seen.add(id(obj))
        if inspect.isclass(obj):
            lines += [f".. autoclass:: {module}.{n}", "   :members:", *again, ""]
        elif inspect.isroutine(obj):
            lines += [f".. autofunction:: {module}.{n}", *again, ""]
        elif inspect.ismodule(obj):
            lines += [f".. rubric:: {n}", "", f"Module :mod:`{obj.__name__}`: {_summary(obj)}", ""]
        else:
            doc = _data_doc(module, n, obj) or ""
            # the bare name: automodule made ``module`` current (a dotted name was registered as module.module.n,
            # so every reference to a constant was dead text)
            lines += [f".. py:data:: {n}", "", *(f"   {ln}" for ln in doc.splitlines()), ""]
    return "\n".join(lines)


_SYMBOL = re.compile(r"`(moelab(?:\.[A-Za-z_]\w*)+)`")


def symbol_url(symbol: str) -> str | None:
    """The reference page (and anchor) of a dotted name such as ``moelab.afd.simulate_measured``, relative
    to the book's root; None when the name has no entry (a private module, a name outside ``__all__``).

    Parameters
    ----------
    symbol : str
        ``moelab.<package>`` or ``moelab.<package>[.<module>...].<name>``.

    Returns
    -------
    str or None
    """
    parts = symbol.split(".")
    if len(parts) < 2 or any(p.startswith("_") for p in parts):
        return None
    package = ".".join(parts[:2])
    names = _public_names_cached().get(package)
    if names is None:
        return None
    if len(parts) == 2:
        return f"{FOLDER}/{package}.html"
    name = parts[-1]
    if name not in names:
        return None
    try:  # a re-export: the name the package exports must be the object the dotted path names
        obj = _import(".".join(parts[:-1]))
        if getattr(obj, name) is not getattr(_import(package), name):
            return None
    except (ImportError, AttributeError):
        return None
    home = canonical_name(package, name)
    return f"{FOLDER}/{home.rsplit('.', 1)[0]}.html#{home}"


def canonical_name(package: str, name: str) -> str:
    """The dotted name under which the reference documents ``package.name``: the first public module (in the
    reference's order) that exports the same object; a name re-exported later (``moelab.routers.RouterCalibration``)
    has its entry there (``moelab.routing.RouterCalibration``).

    Parameters
    ----------
    package : str
        A public module.
    name : str
        A name of its ``__all__``.

    Returns
    -------
    str
    """
    obj = getattr(_import(package), name)
    if inspect.isclass(obj) or inspect.isroutine(obj):
        for module, names in _public_names_cached().items():
            for other in names:
                if getattr(_import(module), other, _MISSING) is obj:
                    return f"{module}.{other}"
    return f"{package}.{name}"


@cache
def _entries_by_object() -> dict[int, tuple[str, object]]:
    """``id`` of every public class and function -> (the dotted name of its reference entry, the object): the
    first public module, in the reference's order, that exports it (:func:`canonical_name`)."""
    out: dict[int, tuple[str, object]] = {}
    for module, names in _public_names_cached().items():
        for name in names:
            obj = getattr(_import(module), name)
            if inspect.isclass(obj) or inspect.isroutine(obj):
                out.setdefault(id(obj), (f"{module}.{name}", obj))
    return out


def reference_target(dotted: str, module: str | None = None) -> str | None:
    """The reference entry a docstring's name means, where it names the object by the module that defines it
    (``moelab.hd.policy.PolicyChoice``, ``moelab.sim.cluster.simulate``, a method such as
    ``moelab.hd.policy.EngineAcceptance.new_request``) rather than by the public package that exports it, or
    by its bare name (``MAX_CLIENTS``); None when it has no entry (a private helper, a module, a name outside
    every ``__all__``, a bare name that two packages export and ``module`` does not).

    Parameters
    ----------
    dotted : str
        ``moelab.<module>[.<module>...].<name>[.<member>]``, or a bare name (``MAX_CLIENTS``) or a member of
        one (``Router.prepare``).
    module : str, optional
        The public module whose page holds the reference: its own entry of a bare name comes first.

    Returns
    -------
    str or None
        E.g. ``"moelab.hd.PolicyChoice"``, ``"moelab.hd.EngineAcceptance.new_request"``.
    """
    parts = dotted.split(".")
    if parts[0] != "moelab":  # a bare name, or a member of one (Router.prepare)
        head = parts[0]
        homes = {canonical_name(m, n) for m, names in _public_names_cached().items() for n in names if n == head}
        if module is not None and f"{module}.{head}" in homes:
            homes = {f"{module}.{head}"}
        return ".".join([homes.pop(), *parts[1:]]) if len(homes) == 1 else None
    for i in range(len(parts) - 1, 0, -1):  # the longest importable module prefix, then attributes
        try:
            obj = _import(".".join(parts[:i]))
        except ImportError:
            continue
        for j in range(i, len(parts)):
            obj = getattr(obj, parts[j], _MISSING)
            if obj is _MISSING:
                return None
            entry = _entries_by_object().get(id(obj))
            if entry is not None:
                return ".".join([entry[0], *parts[j + 1:]])
        return None
    return None


def _moelab_types(annotation: object) -> Iterator[type]:
    """The moelab classes an evaluated annotation names (inside unions, generics and callables too)."""
    if isinstance(annotation, type) and annotation.__module__.startswith("moelab"):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _moelab_types(arg)


def unlisted_types() -> dict[str, list[str]]:
    """The moelab classes that public signatures name (a parameter, a field, a return value) but that have
    no reference entry of their own, each with the public names that use it (goal: none): a reader of the
    signature could not look the type up, and a user could not import it from a public package.

    Returns
    -------
    dict of str to list of str
        ``"module.Class"`` -> the public functions, classes and methods naming it.
    """
    entries = _entries_by_object()
    out: dict[str, set[str]] = {}
    for name, obj in _public_code():
        if not inspect.isroutine(obj):
            continue  # a class's types are its __init__'s
        try:
            hints = typing.get_type_hints(obj)
        except Exception:  # noqa: BLE001 - an annotation that does not evaluate names no type we can check
            continue
        for hint in hints.values():
            for t in _moelab_types(hint):
                if id(t) not in entries:
                    out.setdefault(f"{t.__module__}.{t.__qualname__}", set()).add(name)
    return {k: sorted(v) for k, v in sorted(out.items())}


def link_symbols(markdown: str) -> str:
    """``markdown`` with every backticked public name (e.g. ``moelab.afd.simulate_measured`` in backticks) linked to its
    reference entry (:func:`symbol_url`) by a Sphinx role (``{py:obj}`` or ``{py:mod}``), which Sphinx resolves to
    the entry's page and anchor; other code spans are left as they are.

    Parameters
    ----------
    markdown : str

    Returns
    -------
    str
    """
    def fix(m: re.Match) -> str:
        start = m.start()
        if start > 0 and markdown[start - 1] in "[}":  # already a link's text or a role's target
            return m.group(0)
        url = symbol_url(m.group(1))
        if url is None:
            return m.group(0)
        if "#" not in url:  # a package: its page
            return f"{{py:mod}}`{m.group(1)}`"
        target = url.split("#", 1)[1]  # Sphinx resolves the role to the entry's page and anchor
        return f"{{py:obj}}`{m.group(1)} <{target}>`"

    return _SYMBOL.sub(fix, markdown)


def write_reference(src: str | Path) -> list[str]:
    """Write the reference pages into the book's source folder ``src`` (``src/api/``).

    Parameters
    ----------
    src : path
        The Sphinx source folder of the book.

    Returns
    -------
    list of str
        The page names to list in the book's table of contents (``["api/index"]``).
    """
    folder = Path(src) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    modules = public_modules()
    index = ["API reference", "=============", "",
             "Every public name of moelab: the ``__all__`` of each package below, from its NumPy docstrings. "
             "The user guide (*Using moelab as a library*) shows them at work.", "",
             ".. toctree::", "   :maxdepth: 1", ""]
    seen: set[int] = set()
    for m in modules:
        (folder / f"{m}.rst").write_text(page(m, seen), encoding="utf-8")
        index.append(f"   {m}")
    (folder / "index.rst").write_text("\n".join(index) + "\n", encoding="utf-8")
    return [f"{FOLDER}/index"]


__all__ = ["FIELD_SECTIONS", "FOLDER", "SPHINX_CONF", "canonical_name", "docstring", "link_symbols", "malformed_fields",
           "page", "public_modules", "public_names", "reference_target", "symbol_url", "undocumented", "unlisted_types",
           "write_reference"]
