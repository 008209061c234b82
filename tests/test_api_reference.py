"""The book's API reference: every public name (the ``__all__`` of every public package) has documentation
and an entry, private modules stay out, and the pages render with autodoc + napoleon."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from moelab.book import reference


def test_no_public_name_is_undocumented():
    missing = reference.undocumented()
    assert missing == [], f"public names without a docstring (or #: comment for a constant): {missing}"


def test_every_field_entry_reads_as_a_numpy_field():
    # "num_layers : decoder layers" rendered the description as the type (ModelShape, DecodeLayerModel,
    # ExpertTrace, SignatureBuilder: seventeenth read of the book)
    assert reference.malformed_fields() == []
    bad = "Parameters\n----------\nnum_layers : decoder layers\nhidden : int\n    Width.\nB, N :\n    The load.\n"
    assert reference._field_faults(bad) == ["Parameters: num_layers : decoder layers", "Parameters: B, N :"]


def test_a_dotted_name_by_its_defining_module_finds_the_public_entry():
    assert reference.reference_target("moelab.sim.cluster.simulate") == "moelab.sim.simulate"
    assert reference.reference_target("moelab.sweep.core.run_sweep") == "moelab.sweep.run_sweep"
    assert reference.reference_target("moelab.routing.base.Router.prepare_state") == \
        "moelab.routing.Router.prepare_state"
    assert reference.reference_target("moelab._io.FileFormatError") == "moelab.traces.FileFormatError"
    # a bare name: the one public entry of that name, or the current module's where several packages export one
    assert reference.reference_target("ExpertTrace") == "moelab.traces.ExpertTrace"
    assert reference.reference_target("simulate") is None  # afd, eldr and sim each export one
    assert reference.reference_target("simulate", module="moelab.sim") == "moelab.sim.simulate"
    assert reference.reference_target("Router.prepare") == "moelab.routing.Router.prepare"
    for private in ("moelab._io.check_file", "moelab.eldr.calibration", "moelab.nowhere.x", "numpy.mean"):
        assert reference.reference_target(private) is None, private


def test_every_type_a_public_signature_names_has_an_entry():
    # a parameter, field or return type a reader could not look up nor import from a public package (VerifyCost,
    # Predictor, Store, SignatureSource: the hooks users implement; ServerResult, RatioTerms: what users read).
    # ELDRSetup stays in moelab.eldr.experiments: importing that module with moelab.eldr costs every import 0.65 s
    assert set(reference.unlisted_types()) == {"moelab.eldr.experiments.ELDRSetup"}


def test_the_reference_lists_every_public_name_and_no_private_module(tmp_path):
    pages = reference.write_reference(tmp_path)
    assert pages == ["api/index"]
    index = (tmp_path / "api" / "index.rst").read_text()
    names = reference.public_names()
    assert {"moelab.routing", "moelab.afd", "moelab.eldr", "moelab.sweep", "moelab.datasets"} <= set(names)
    for module, public in names.items():
        assert not any(part.startswith("_") for part in module.split(".")), module
        assert f"   {module}\n" in index + "\n"
        text = (tmp_path / "api" / f"{module}.rst").read_text()
        for name in public:
            assert f"{module}.{name}" in text, f"{module}.{name} has no entry"
    assert not list((tmp_path / "api").glob("moelab._*"))


@pytest.mark.slow
def test_a_reference_page_renders_with_napoleon(tmp_path):
    if importlib.util.find_spec("sphinx") is None:
        if os.environ.get("CI"):
            pytest.fail("sphinx (the docs extra) is required under CI")
        pytest.skip("needs the docs extra (sphinx)")
    from moelab.book import CONF

    src = tmp_path / "src"
    (src / "api").mkdir(parents=True)
    (src / "_static").mkdir()
    (src / "conf.py").write_text(CONF + reference.SPHINX_CONF)
    # dict constants; |z| and a wrapped literal once broke; sweep and sim hold dataclasses with factory defaults
    pages = ("moelab.routing", "moelab.dsd", "moelab.eldr", "moelab.sweep", "moelab.sim", "moelab.traces")
    seen: set[int] = set()
    for name in pages:
        (src / "api" / f"{name}.rst").write_text(reference.page(name, seen))
    (src / "index.md").write_text("# t\n\n```{toctree}\n" + "".join(f"api/{n}\n" for n in pages) + "```\n")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", str(src), str(tmp_path / "html")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    html = (tmp_path / "html" / "api" / "moelab.routing.html").read_text()
    # napoleon turned the NumPy sections into field lists; the override points and the view's fields are there
    for text in ("route_batch", "choose", "prepare_state", "free_slots", "waiting_tokens", "RouterError"):
        assert text in html, text
    assert "Parameters" in html and "Returns" in html
    # no reStructuredText error rendered into a page (a type's docstring such as dict's "dict(**kwargs)" read as
    # markup, a stray |...| substitution, a literal broken across lines): each shows as a "problematic" span
    for name in pages:
        page = (tmp_path / "html" / "api" / f"{name}.html").read_text()
        assert 'class="problematic"' not in page and not re.search(r"(?<![\w.])dict\(", page), name
    assert "Constants" in html  # the constants' own table, with their #: lines
    # a signature Sphinx can parse: a default factory ("=<factory>") or a lambda default made it print the raw
    # text, "~typing.Any" prefixes and all (fifteenth read of the book)
    for name in ("moelab.sweep", "moelab.sim", "moelab.dsd"):
        page = (tmp_path / "html" / "api" / f"{name}.html").read_text()
        assert not re.search(r"~[a-z_]+\.[A-Za-z_.]+", page), name  # "~typing.Any", not "~/.cache"
        assert "&lt;factory&gt;" not in page and "&lt;lambda&gt;" not in page, name
    # sixteenth read: numpy's ArrayLike printed expanded ("_Buffer | _SupportsArray[...] | ... | bytes | str"),
    # a dataclass's private fields shown as constructor arguments, constants registered as moelab.x.moelab.x.NAME
    # (so every :data: reference to one was dead text)
    dsd = (tmp_path / "html" / "api" / "moelab.dsd.html").read_text()
    assert "_SupportsArray" not in dsd and "ArrayLike" in dsd and "TypeAliasForwardRef" not in dsd
    assert "Callable[[...]" not in (tmp_path / "html" / "api" / "moelab.sweep.html").read_text()  # read 17
    eldr = (tmp_path / "html" / "api" / "moelab.eldr.html").read_text()
    assert "ConversationWorkload" in eldr and "_sys_ids" not in eldr and "_conv_ids" not in eldr
    for name in pages:
        page = (tmp_path / "html" / "api" / f"{name}.html").read_text()
        assert f'id="{name}.{name}.' not in page, name
    sweep = (tmp_path / "html" / "api" / "moelab.sweep.html").read_text()
    assert 'id="moelab.sweep.BACKENDS"' in sweep and 'href="#moelab.sweep.BACKENDS"' in sweep
    # a docstring naming an object by its defining module (moelab.sim.cluster.simulate, moelab.sweep.core.run_sweep)
    # links to the entry of the package that exports it; before, it was dead text
    sim = (tmp_path / "html" / "api" / "moelab.sim.html").read_text()
    assert 'href="#moelab.sim.simulate"' in sim and 'href="#moelab.sweep.run_sweep"' in sweep
    # a bare name another package exports (ExpertTrace in moelab.eldr's generate) links to that package's entry
    assert '<span class="pre">object</span>' not in eldr  # "Bases: object" on every plain class, a dead link
    assert re.search(r'href="moelab\.traces\.html#moelab\.traces\.ExpertTrace"[^>]*><code[^>]*><span class="pre">'
                     r'ExpertTrace</span></code></a> \(prefill counts', eldr)


def test_lessons_link_public_symbols_to_their_reference_entry():
    md = "see `moelab.afd.simulate_measured`, `moelab.eldr.routing.ELDRRouter`, `moelab.hd`, `moelab._io`, `x`"
    out = reference.link_symbols(md)
    # Sphinx roles: resolved to the entry's page and anchor (a plain link to api/....html#... is not)
    assert "{py:obj}`moelab.afd.simulate_measured <moelab.afd.simulate_measured>`" in out
    assert "{py:obj}`moelab.eldr.routing.ELDRRouter <moelab.eldr.ELDRRouter>`" in out
    assert "{py:mod}`moelab.hd`" in out
    assert reference.symbol_url("moelab.eldr.routing.ELDRRouter") == "api/moelab.eldr.html#moelab.eldr.ELDRRouter"
    assert "`moelab._io`, `x`" in out  # private modules and other code spans stay as they are
    assert reference.link_symbols(out) == out
