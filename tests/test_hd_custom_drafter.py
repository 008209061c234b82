"""A drafter of the user's in HD's batching engine (the vLLM adapter's ``custom`` method): named by
``package.module:name``, one instance per request, its first candidate proposed, bad names and bad drafters
refused by name before an engine starts."""

from __future__ import annotations

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
    rows = make_row_drafters({"method": "custom", "drafter": "tests.test_hd_custom_drafter:NotADrafter"},
                             tokenizer_path="unused", budget=3)
    with pytest.raises(ValueError, match="drafter must be a drafter"):
        rows.propose(0, np.array([1, 2]), 3)
