"""``moelab notebooks copy DIR`` writes a folder that works on its own (issue 38): every relative link of
the copied markdown (COURSE.md, NOTATION.md, the notebooks' markdown cells) resolves inside DIR, and
``moelab lab --help`` says which folder it opens."""

from __future__ import annotations

import json
import re
from pathlib import Path

from moelab.cli import main
from moelab.datasets import repo_root
from moelab.notebooks import copy_notebooks, relink_markdown

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _bad_links(text: str, folder: Path) -> list[str]:
    bad = []
    for target in LINK.findall(text):
        if target.startswith("#") or re.match(r"^https?://", target):
            continue
        path = target.partition("#")[0]
        if not (folder / path).resolve().is_file() or folder.resolve() not in (folder / path).resolve().parents:
            bad.append(target)
    return bad


def test_every_relative_link_of_the_copy_resolves_inside_it(tmp_path):
    out = tmp_path / "nbs"
    written = copy_notebooks(out)
    assert {"COURSE.md", "NOTATION.md"} <= {p.name for p in written}
    for md in ("COURSE.md", "NOTATION.md"):
        text = (out / md).read_text(encoding="utf-8")
        assert LINK.search(text), md
        assert not _bad_links(text, out), (md, _bad_links(text, out))
    course = (out / "COURSE.md").read_text(encoding="utf-8")
    assert "](01_eldr.ipynb)" in course and "](NOTATION.md#glossary)" in course
    for nb in sorted(out.glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        md = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        assert not _bad_links(md, out), (nb.name, _bad_links(md, out))


def test_the_committed_files_links_resolve_in_the_checkout_layout():
    root = repo_root()
    for md in ("COURSE.md", "notebooks/NOTATION.md"):
        path = root / md
        bad = [t for t in LINK.findall(path.read_text(encoding="utf-8"))
               if not t.startswith("#") and not re.match(r"^https?://", t)
               and not (path.parent / t.partition("#")[0]).resolve().exists()]
        assert not bad, (md, bad)


def test_relink_keeps_urls_and_anchors_and_unlinks_files_not_copied(tmp_path):
    src = tmp_path / "COURSE.md"
    copied = {(tmp_path / "notebooks" / "a.ipynb").resolve(): "a.ipynb", src.resolve(): "COURSE.md"}
    text = "[A](notebooks/a.ipynb#x) [R](README.md) [U](https://example.org/x.md) [H](#here) ![i](notebooks/a.ipynb)"
    assert relink_markdown(text, src, copied) == (
        "[A](a.ipynb#x) R (`README.md` in moelab's source tree) [U](https://example.org/x.md) [H](#here) "
        "![i](a.ipynb)")


def test_lab_help_says_which_folder_it_opens(capsys):
    try:
        main(["lab", "--help"])
    except SystemExit:
        pass
    out = " ".join(capsys.readouterr().out.split())
    assert "moelab notebooks copy" in out and "current folder" in out and "notebooks/" in out
