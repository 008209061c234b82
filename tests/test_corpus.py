"""The offline multi-domain corpus: determinism, splits, manifest, user domains, bad inputs."""

from __future__ import annotations

import hashlib
import itertools
import json

import pytest

from moelab.models.corpus import (
    BUILTIN_DOMAINS,
    available_domains,
    build_corpus,
    iter_domain_texts,
    read_corpus,
    render_roff,
)


def _user_folder(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(10):
        (folder / f"n{i}.txt").write_text(f"note {i}: " + "the quick brown fox jumps over the lazy dog. " * (20 + i))
    (folder / "blob.bin").write_bytes(b"\x00\x01\x02")
    return folder


def test_at_least_four_domains_available_offline():
    avail = available_domains()
    assert len(avail) >= 4 and "arithmetic" in avail and "python" in avail and set(avail) <= set(BUILTIN_DOMAINS)
    # every available built-in domain actually yields text, and the domains look different
    firsts = {d: next(iter_domain_texts([d], max_bytes=2000))[1] for d in avail}
    assert all(len(t) > 50 for t in firsts.values())
    assert len({t[:200] for t in firsts.values()}) == len(avail)


def test_deterministic_and_split():
    take = lambda **kw: list(itertools.islice(iter_domain_texts(["arithmetic"], max_bytes=20_000, **kw), 20))  # noqa: E731
    a, b = take(seed=0), take(seed=0)
    assert a == b and all(d == "arithmetic" for d, _ in a)
    assert take(seed=1) != a
    held = take(seed=0, split="heldout")
    assert held and not set(t for _, t in held) & set(t for _, t in a)
    line = a[0][1].splitlines()[1]
    lhs, rhs = line.split(" = ")
    if " r " not in rhs:  # exact arithmetic (division lines read "q r remainder")
        assert eval(lhs) == int(rhs)


def test_build_corpus_manifest_and_user_domain(tmp_path):
    folder = _user_folder(tmp_path)
    man = build_corpus(tmp_path / "c", domains=["arithmetic"], extra_paths=[folder, f"fox={folder / 'n3.txt'}"],
                       seed=0, max_bytes=10_000, heldout_fraction=0.2)
    assert man["domains"] == ["arithmetic", "fox", "notes"]
    on_disk = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert on_disk["files"] == man["files"]
    for f in man["files"]:
        raw = (tmp_path / "c" / f["file"]).read_bytes()
        assert hashlib.sha256(raw).hexdigest() == f["sha256"] and len(raw) == f["bytes"]
    notes = [s for s in man["sources"] if s["domain"] == "notes"]
    train, held = {s["path"] for s in notes if s["split"] == "train"}, {s["path"] for s in notes if s["split"] == "heldout"}
    assert len(held) == 2 and len(train) == 8 and not train & held  # split by source file, binary file skipped
    docs = read_corpus(tmp_path / "c", "heldout")
    assert set(docs) == {"arithmetic", "notes"}  # a one-file domain has nothing to hold out
    (tmp_path / "c" / "notes.train.txt").write_text("tampered")
    with pytest.raises(ValueError, match="sha256"):
        read_corpus(tmp_path / "c", "train")


def test_render_roff():
    src = '.TH LS 1\n.SH NAME\nls \\- list directory contents\n.SH SYNOPSIS\n.B ls\n[\\fIOPTION\\fR]...\n.\\" a comment\n.PP\nList info.\n'
    text = render_roff(src)
    assert "NAME\nls - list directory contents" in text and "[OPTION]..." in text
    assert ".TH" not in text and "comment" not in text and "\\f" not in text


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="split"):
        next(iter_domain_texts(["arithmetic"], split="test"))
    with pytest.raises(ValueError, match="domains entry"):
        next(iter_domain_texts(["klingon"]))
    with pytest.raises(ValueError, match="does not exist"):
        next(iter_domain_texts([], extra_paths=[tmp_path / "missing"]))
    with pytest.raises(ValueError, match="max_bytes"):
        next(iter_domain_texts(["arithmetic"], max_bytes=0))
    with pytest.raises(ValueError, match="unique"):
        next(iter_domain_texts(["arithmetic", "arithmetic"]))
    with pytest.raises(ValueError, match="not a moelab corpus"):
        read_corpus(tmp_path)
