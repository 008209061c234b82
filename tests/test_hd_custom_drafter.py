"""A drafter of the user's in HD's batching engine (the vLLM adapter's ``custom`` method): named by
``package.module:name``, one instance per request, its first candidate proposed, bad names and bad drafters
refused by name before an engine starts."""

from __future__ import annotations

import re

import numpy as np
import pytest

from moelab import hd
from moelab.hd.engine import make_row_drafters
from moelab.hd.vllm_adapter import adapter_config


class RepeatLast(hd.Drafter):
    """The token after the last occurrence of the current token comes again (four tokens)."""

    name = "repeat-last"
    letters = "R"

    def draft(self):
        ctx = self.context
        for j in range(len(ctx) - 2, -1, -1):
            if ctx[j] == ctx[-1]:
                return hd.Draft([tuple(ctx[j + 1:j + 5])], ["R"])
        return hd.Draft([], [])


class NotADrafter:
    pass


class HalfADrafter:
    """Drafts, but has no start/accept/observe."""

    def draft(self):
        return hd.Draft([], [])


def not_a_drafter():
    """A factory whose product is no drafter: only a request's first call can tell."""
    return NotADrafter()


def test_a_user_drafter_runs_in_the_row_drafters_a_vllm_engine_uses():
    cfg = adapter_config("custom", drafter="tests.test_hd_custom_drafter:RepeatLast")
    rows = make_row_drafters(cfg, tokenizer_path="unused", budget=3)
    assert rows.propose(0, np.array([5, 6, 7, 8, 5]), 3) == [6, 7, 8]  # cut to the budget
    assert rows.propose(1, np.array([1, 2, 3]), 3) == []  # its own instance per row: nothing to repeat here
    assert rows.propose(0, np.array([5, 6, 7, 8, 5, 6]), 3) == [7, 8, 5]  # the row's context grew by one


@pytest.mark.parametrize("spec, says", [
    ("tests.test_hd_custom_drafter", "must name a callable as 'package.module:name'"),
    ("no_such_module_xyz:D", "cannot be imported"),
    ("tests.test_hd_custom_drafter:Missing", "cannot be imported"),
    (None, "must name a callable"),
])
def test_a_bad_drafter_name_is_refused_before_an_engine(spec, says):
    with pytest.raises(ValueError, match=says):
        adapter_config("custom", drafter=spec)


def test_an_object_that_is_no_drafter_is_refused_by_name():
    rows = make_row_drafters({"method": "custom", "drafter": "tests.test_hd_custom_drafter:not_a_drafter"},
                             tokenizer_path="unused", budget=3)
    with pytest.raises(ValueError, match="drafter must be a drafter"):
        rows.propose(0, np.array([1, 2]), 3)


@pytest.mark.parametrize("name, missing", [("NotADrafter", "start, accept, draft, observe"),
                                           ("HalfADrafter", "start, accept, observe")])
def test_a_class_that_is_no_drafter_is_refused_at_config_time(name, missing):
    """The module docstring's promise: a bad drafter is refused before an engine starts (issue 38)."""
    with pytest.raises(ValueError, match=f"drafter 'tests.test_hd_custom_drafter:{name}' is a class without "
                                         f"{missing}: not a drafter"):
        adapter_config("custom", drafter=f"tests.test_hd_custom_drafter:{name}")
    with pytest.raises(ValueError, match="is a class without"):  # and by the engine side, for a hand-made config
        make_row_drafters({"method": "custom", "drafter": f"tests.test_hd_custom_drafter:{name}"},
                          tokenizer_path="unused", budget=3)


@pytest.mark.parametrize("method, options, bad", [
    ("hd", {"drafter": "tests.test_hd_custom_drafter:RepeatLast"}, "drafter"),
    ("custom", {"drafter": "tests.test_hd_custom_drafter:RepeatLast", "order": "WSL"}, "order"),
    ("hd-fixed", {"cost": {"qs": [1], "ms": [1.0]}}, "cost"),
    ("rest", {"order": "WSL"}, "order"),
    ("probe", {"s_path": "x.npz"}, "s_path"),
    ("hd", {"oder": "WSL"}, "oder"),
])
def test_an_option_that_does_not_apply_to_the_method_is_refused_by_name(method, options, bad):
    with pytest.raises(ValueError, match=re.escape(f"option(s) ['{bad}'] do not apply to method '{method}'; it takes")):
        adapter_config(method, **options)


def test_the_options_that_apply_are_accepted_and_help_names_the_server_variable():
    from moelab.hd import vllm_adapter

    assert adapter_config("hd-fixed", order="WS", timing=True, l_max_tokens=1000) == {
        "method": "hd-fixed", "order": "WS", "timing": True, "l_max_tokens": 1000}
    assert adapter_config("probe", probe_len=1, probe_token=0)["probe_len"] == 1
    for fn in (vllm_adapter.adapter_config, vllm_adapter.publish_adapter_config):
        assert "vllm serve" in fn.__doc__ and "MOELAB_HD_VLLM" in fn.__doc__
    assert vllm_adapter.CONFIG_ENV == "MOELAB_HD_VLLM"


class _Undeclared(hd.Drafter):
    """Drafts from a store letter it never declared."""

    name = "undeclared"
    letters = "R"

    def draft(self):
        return hd.Draft([tuple(self.context[-2:])], ["Q"])


class _Unpaired(hd.Drafter):
    """Two candidates, one source."""

    name = "unpaired"
    letters = "R"

    def draft(self):
        return hd.Draft([(1,), (2,)], ["R"])


class _NotADraft(hd.Drafter):
    name = "not-a-draft"

    def draft(self):
        return [(1, 2)]


@pytest.mark.parametrize("drafter, says", [
    (_Undeclared(), "named source 'Q', not made of its declared store letters 'R'"),
    (_Unpaired(), "returned 2 candidates but 1 sources"),
    (_NotADraft(), "returned list; it must return a moelab.hd.Draft"),
])
def test_a_draft_a_drafter_cannot_account_for_is_refused_by_name(drafter, says):
    with pytest.raises(ValueError, match=re.escape(says)) as err:
        hd.replay_greedy(drafter, [1, 2, 3, 1, 2], [3, 1, 2, 3])
    assert repr(drafter.name) in str(err.value)


def test_credit_to_an_undeclared_store_is_refused():
    d = hd.PLDDrafter()
    with pytest.raises(ValueError, match=r"credited for store 'W', which is not one of its declared letters 'P'"):
        d.credit("W", 2)
    d.credit("P", 2)
    assert (d.counters["P"].accept_steps, d.counters["P"].accepted_tokens) == (1, 2)


def test_the_drafter_protocol_is_documented_where_help_shows_it():
    assert "Returns" in hd.Drafter.draft.__doc__ and "sources" in hd.Drafter.draft.__doc__
    for field in ("queries", "lookup_hits", "candidates", "accept_steps", "accepted_tokens"):
        assert field in hd.StoreCounters.__doc__
    for attr in ("name", "letters", "context", "counters"):
        assert f"{attr} :" in hd.Drafter.__doc__


class _Knows(hd.Drafter):
    """Drafts the reference's next tokens (every one accepted), plus many decoys."""

    name = "knows"
    letters = "K"

    def __init__(self, reference, decoys=0):
        super().__init__()  # creates context and counters
        self.reference, self.decoys = list(reference), decoys

    def start(self, prompt_ids):
        super().start(prompt_ids)
        self.n_prompt = len(self.context)

    def draft(self):
        done = len(self.context) - self.n_prompt
        true = tuple(self.reference[done:done + 3])
        decoys = [(1000 + i, 7) for i in range(self.decoys)]
        cands = [true, *decoys] if true else decoys
        return hd.Draft(cands, ["K"] * len(cands))


def test_step_records_document_their_fields_and_the_replay_bonus_minus_one():
    doc = hd.StepRecord.__doc__
    for field in ("tree_size", "n_candidates", "accepted", "sources", "bonus", "draft_us", "verify_ms"):
        assert f"{field} :" in doc, field
    assert "-1" in doc and "reference ran out" in doc
    for field in ("prompt_len", "tokens", "steps", "prefill_s", "decode_s"):
        assert f"{field} :" in hd.GenerationResult.__doc__, field
    ref = [4, 5, 6, 7, 8, 9, 10]
    res = hd.replay_greedy(_Knows(ref), [1, 2, 3], ref)
    # 3 accepted drafts + the bonus per step; the last step's drafts reach the reference's end: no bonus (-1)
    assert [(s.accepted, s.bonus) for s in res.steps] == [([4, 5, 6], 7), ([8, 9, 10], -1)]
    assert res.tokens == ref and all(s.sources == ["K"] * 3 and s.verify_ms == 0.0 for s in res.steps)
    assert res.prefill_s == res.decode_s == 0.0


def test_the_engine_verifies_every_candidate_a_drafter_returns():
    # no cap on candidates per step: the HF engine (and the replay) merge them all into one tree
    ref = [4, 5, 6, 7]
    res = hd.replay_greedy(_Knows(ref, decoys=40), [1, 2, 3], ref)
    first = res.steps[0]
    assert first.n_candidates == 41 and first.tree_size == 1 + 3 + 40 * 2


@pytest.mark.parametrize("order, says", [
    ("WSL", r"order 'WSL' uses S but model_store is None: pass moelab.hd.load_default_model_store\(tokenizer\)"),
    ("WL", r"order 'WL' uses L but statistics_store is None: pass moelab.hd.load_default_statistics_store\(tokenizer\)"),
])
def test_a_hierarchy_without_its_stores_says_how_to_load_them(order, says):
    with pytest.raises(ValueError, match=says):
        hd.HierarchyDrafter(order=order)
