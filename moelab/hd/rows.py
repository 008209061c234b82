"""HD for a batching engine: one drafter per batch row (W and the running acceptance per request), S, L
and the engine's acceptance prior shared by every request. Engine-neutral: an engine adapter
(:mod:`moelab.hd.vllm_adapter`) hands over, per row, the tokens known so far (prompt + accepted output) and
gets one draft chain back.

A batching engine reuses rows for new requests and may reorder them; a row's drafter is kept only while
the row's tokens extend exactly what it has seen (checked token for token), otherwise it starts afresh
from the row's tokens. The verification outcome of the previous chain is read off the tokens that follow
it (accepted = the longest prefix of the chain that the engine kept), which feeds the cost-aware policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from moelab._validate import check_int
from moelab.hd.drafters import Draft, Drafter

#: proposal timings kept at most (a ring buffer: a vLLM process lives for hours of proposals)
TIMING_WINDOW = 4096


@dataclass
class RowStats:
    """What the shared drafter did: steps, drafted / accepted tokens, and (when timing is on) the drafting
    time of the last :data:`TIMING_WINDOW` calls (us) in a ring buffer; ``timed`` counts every timed call."""

    proposals: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    resets: int = 0
    timed: int = 0
    _us: np.ndarray = field(default_factory=lambda: np.empty(TIMING_WINDOW), repr=False)

    def record_us(self, us: float) -> None:
        """One proposal's drafting time (overwrites the oldest beyond the window)."""
        self._us[self.timed % TIMING_WINDOW] = us
        self.timed += 1

    def draft_us_since(self, mark: int) -> np.ndarray:
        """Timings of the calls after the ``mark``-th timed call (a past :attr:`timed`), at most the window."""
        n = min(self.timed - check_int("mark", mark, low=0, high=self.timed), TIMING_WINDOW)
        idx = np.arange(self.timed - n, self.timed) % TIMING_WINDOW
        return self._us[idx]

    def as_dict(self) -> dict[str, Any]:
        us = self.draft_us_since(max(0, self.timed - TIMING_WINDOW))
        if not us.size:
            us = np.array([np.nan])
        return {"proposals": self.proposals, "drafted_tokens": self.drafted_tokens,
                "accepted_tokens": self.accepted_tokens, "resets": self.resets, "timed": self.timed,
                "draft_us_p50": float(np.median(us)), "draft_us_p90": float(np.percentile(us, 90))}


@dataclass(slots=True)
class _Row:
    drafter: Drafter
    # the tokens seen so far, as the engine's array bytes, their dtype and count: the per-step check that a row
    # still holds the same request is one memcmp (numpy's elementwise comparison, or a copy of the row kept
    # as an array, costs several microseconds of call overhead on every step, far more with cold caches)
    raw: bytes
    dtype: np.dtype
    n: int
    last: Draft


def _same_prefix(tokens: np.ndarray, st: _Row) -> bool:
    """Whether ``tokens`` starts with exactly the tokens ``st`` has seen (token for token)."""
    n = st.n
    if n > tokens.size:
        return False
    head = tokens[:n]
    if head.dtype == st.dtype:
        return head.tobytes() == st.raw
    return bool(np.array_equal(head, np.frombuffer(st.raw, dtype=st.dtype)))


class RowDrafters:
    """Per-row drafters over shared stores.

    Parameters
    ----------
    factory : callable
        ``factory() -> Drafter`` making one request's drafter (sharing S, L and the acceptance model).
    chain : callable
        ``chain(drafter, max_len) -> Draft`` with at most one candidate (the chain to propose).
    max_rows : int
        Rows remembered at most (the engine's batch size); the oldest is dropped beyond it.
    timing : bool
        Time every proposal into :attr:`stats` (off by default: two clock reads per call on the hot path).
    """

    def __init__(self, factory: Callable[[], Drafter], chain: Callable[[Drafter, int], Draft], *,
                 max_rows: int = 256, timing: bool = False) -> None:
        self.factory = factory
        self.chain = chain
        self.max_rows = check_int("max_rows", max_rows, low=1)
        self.rows: dict[int, _Row] = {}
        self.stats = RowStats()
        self.timing = bool(timing)
        # what a live engine's drafters share beyond the stores (set by moelab.hd.engine.cost_aware_rows):
        # the online verify-cost curve and the plan-or-full-chain choice; None where not used
        self.cost_model: Any = None
        self.policy_choice: Any = None

    def propose(self, row: int, tokens: np.ndarray, max_len: int) -> list[int]:
        """One chain (``<= max_len`` tokens, possibly empty) after ``tokens`` for batch row ``row``."""
        t0 = time.perf_counter() if self.timing else 0.0
        if type(tokens) is not np.ndarray:
            tokens = np.asarray(tokens)
        st = self.rows.get(row)
        raw = tokens.tobytes()
        if st is not None and (raw.startswith(st.raw) if tokens.dtype is st.dtype and tokens.ndim == 1
                               else _same_prefix(tokens, st)):
            # (one row's bytes, one memcmp: the same dtype makes a byte prefix a token prefix)
            new = tokens[st.n:].tolist() if tokens.size > st.n else []
            if new:
                if st.last.candidates:
                    cand = st.last.candidates[0]
                    a = 0
                    while a < len(cand) and a < len(new) - 1 and new[a] == cand[a]:
                        a += 1
                    st.drafter.observe(st.last, list(cand[:a]))
                    self.stats.accepted_tokens += a
                st.drafter.accept(new)
                st.raw, st.dtype, st.n = raw, tokens.dtype, tokens.size
        else:
            if st is not None:
                self.stats.resets += 1
            d = self.factory()
            d.start(tokens.tolist())
            st = _Row(d, raw, tokens.dtype, tokens.size, Draft([], []))
            self.rows[row] = st
            if len(self.rows) > self.max_rows:
                self.rows.pop(next(iter(self.rows)))
        out: list[int] = []
        if max_len > 0:
            st.last = self.chain(st.drafter, max_len)
            out = list(st.last.candidates[0][:max_len]) if st.last.candidates else []
        else:
            st.last = Draft([], [])
        self.stats.proposals += 1
        self.stats.drafted_tokens += len(out)
        if self.timing:  # RowStats.record_us inline (every step)
            stats = self.stats
            stats._us[stats.timed % TIMING_WINDOW] = (time.perf_counter() - t0) * 1e6
            stats.timed += 1
        return out


__all__ = ["TIMING_WINDOW", "RowDrafters", "RowStats"]
