"""Property-based hostile input (issue 29): every file loader and the public simulator entries, fed
hypothesis-chosen hostile inputs, either load/run correctly or raise the project's clear errors
(``ValueError``: FileFormatError and StoreFileError are ValueErrors), never anything else.

Kept fast: few examples per property, a deadline, tiny inputs (the whole file runs in well under a minute)."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from moelab._io import FileFormatError, loads_json
from moelab.bench.files import LOADERS, MUTATIONS, load_outcome, mutate

FAST = settings(max_examples=12, deadline=5000, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture],
                derandomize=True)
CLEAR = (ValueError,)


# ------------------------------------------------------------------------------- file loaders

_PRISTINE: dict[str, tuple[Path, dict[Path, bytes]]] = {}
_TMP = tempfile.TemporaryDirectory(prefix="moelab-hyp-")


def _pristine(name: str) -> tuple[Path, dict[Path, bytes]]:
    """Each loader's valid file, written once per session (mutations restore it before each example)."""
    if name not in _PRISTINE:
        loader = next(x for x in LOADERS if x.name == name)
        folder = Path(_TMP.name) / name
        folder.mkdir()
        target = loader.make(folder)
        _PRISTINE[name] = (target, {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()})
    return _PRISTINE[name]


def _edits():
    """A list of hostile edits: a battery mutation (seeded), or a splice of arbitrary bytes at a position."""
    battery = st.tuples(st.just("battery"), st.sampled_from(MUTATIONS), st.integers(0, 2**32 - 1))
    splice = st.tuples(st.just("splice"), st.integers(0, 10_000), st.binary(min_size=0, max_size=32))
    return st.lists(st.one_of(battery, splice), min_size=1, max_size=3)


@pytest.mark.parametrize("name", [x.name for x in LOADERS])
@FAST
@given(edits=_edits())
def test_every_loader_loads_or_refuses_clearly(name, edits):
    loader = next(x for x in LOADERS if x.name == name)
    target, pristine = _pristine(name)
    for p, data in pristine.items():
        p.write_bytes(data)
    data = pristine[target]
    for edit in edits:
        if edit[0] == "battery":
            data = mutate(data, edit[1], np.random.default_rng(edit[2]))
        else:
            i = edit[1] % (len(data) + 1)
            data = data[:i] + edit[2] + data[i + len(edit[2]):]
    target.write_bytes(data)
    outcome = load_outcome(loader, target)
    assert not outcome.startswith("unexpected"), f"{name}: {outcome}"


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
                     max_leaves=20)


@FAST
@given(value=_json, junk=st.text(max_size=20))
def test_loads_json_parses_or_refuses_clearly(value, junk):
    text = json.dumps(value)
    assert loads_json(text) == json.loads(text)
    try:
        loads_json(text[: len(text) // 2] + junk)
    except FileFormatError:
        pass


@FAST
@given(depth=st.integers(1, 5000))
def test_json_depth_is_bounded_not_recursion(depth):
    text = "[" * depth + "]" * depth
    try:
        assert loads_json(text) is not None
    except FileFormatError as exc:
        assert "max_depth" in str(exc)


# ------------------------------------------------------------------------------- simulators

_HOSTILE_INTS = st.one_of(st.integers(-3, 40), st.sampled_from([0, -1, 2**24, 2**24 + 1, 2**62, 2**63 - 1, 2**70]),
                          st.sampled_from([1.5, 2.0, math.nan, math.inf, -math.inf]))
_HOSTILE_REALS = st.one_of(st.floats(-5, 50), st.sampled_from([0.0, -1.0, math.nan, math.inf, 1e308, "x", None]))


def _small_cost():
    from moelab.costmodel import DecodeStepModel, ModelShape

    return DecodeStepModel.h200(ModelShape(2, 128, 4, 2, 32, 500, num_experts=8, top_k=2, expert_ffn=64))


_COST = None


def _cost():
    global _COST
    if _COST is None:
        _COST = _small_cost()
    return _COST


@FAST
@given(arrivals=st.lists(_HOSTILE_REALS, min_size=1, max_size=4), plens=st.lists(_HOSTILE_INTS, min_size=1, max_size=4),
       olens=st.lists(_HOSTILE_INTS, min_size=1, max_size=4), workers=_HOSTILE_INTS, slots=_HOSTILE_INTS)
def test_decode_cluster_runs_or_refuses_clearly(arrivals, plens, olens, workers, slots):
    from moelab.routers import make_router
    from moelab.sim.cluster import simulate
    from moelab.traces import RequestTrace

    try:
        reqs = RequestTrace(arrivals, plens, olens)
    except CLEAR:
        return
    assume(int(reqs.output_len.sum()) <= 400 or int(reqs.output_len.sum()) > 10**7)  # runs stay fast
    try:
        res = simulate(reqs, make_router("jsq"), _cost(), n_workers=workers, slots=slots)
    except CLEAR:
        return
    m = res.metrics()
    assert np.isfinite(res.steps["step_ms"]).all() and m["throughput_tok_s"] > 0
    assert (res.requests["finish_s"] >= res.requests["arrival_s"]).all()


@FAST
@given(plens=st.lists(_HOSTILE_INTS, min_size=1, max_size=4), olens=st.lists(_HOSTILE_INTS, min_size=1, max_size=4),
       G=_HOSTILE_INTS, slots=_HOSTILE_INTS)
def test_dp_simulator_runs_or_refuses_clearly(plens, olens, G, slots):
    from moelab.routers import make_router
    from moelab.sim.dp import simulate_dp
    from moelab.traces import RequestTrace

    n = min(len(plens), len(olens))
    try:
        reqs = RequestTrace(np.zeros(n), plens[:n], olens[:n])
    except CLEAR:
        return
    assume(int(reqs.output_len.sum()) <= 400)
    try:
        res = simulate_dp(reqs, make_router("jsq"), n_workers=G, slots=slots, max_steps=2000)
    except CLEAR:
        return
    assert np.isfinite(res.steps["step_ms"]).all()


@FAST
@given(r=st.one_of(_HOSTILE_REALS, st.lists(_HOSTILE_REALS, max_size=3)), B=_HOSTILE_INTS, mu_P=_HOSTILE_REALS,
       mu_D=_HOSTILE_REALS)
def test_afd_theory_computes_or_refuses_clearly(r, B, mu_P, mu_D):
    from moelab.afd.theory import optimal_ratio, stage_times

    try:
        out = stage_times(r, B, mu_P, mu_D)
        for v in (out.values() if isinstance(out, dict) else [out]):
            assert np.all(np.isfinite(np.asarray(v, dtype=np.float64)))
    except CLEAR:
        pass
    try:
        assert math.isfinite(float(optimal_ratio(B, mu_P, mu_D)))
    except CLEAR:
        pass


@FAST
@given(r=_HOSTILE_INTS, B=_HOSTILE_INTS, mu_P=_HOSTILE_REALS, mu_D=_HOSTILE_REALS, steps=_HOSTILE_INTS)
def test_afd_simulator_runs_or_refuses_clearly(r, B, mu_P, mu_D, steps):
    from moelab.afd.sim import simulate

    assume(not isinstance(B, int) or B <= 64)
    assume(not isinstance(steps, int) or steps <= 200)
    try:
        res = simulate(r, B, mu_P, mu_D, steps=steps, seed=0)
    except CLEAR:
        return
    assert res is not None


@FAST
@given(mode=st.sampled_from(["sync", "async", "pipelined", "nope"]), acc=st.lists(_HOSTILE_INTS, min_size=1, max_size=5),
       t_ar=_HOSTILE_REALS, t_d=_HOSTILE_REALS, verify=_HOSTILE_REALS)
def test_dsd_measured_simulator_runs_or_refuses_clearly(mode, acc, t_ar, t_d, verify):
    from moelab.dsd.measured import simulate

    rounds = {"accepted": acc, "nodes": [4] * len(acc), "valid_next": [True] * len(acc)}
    try:
        res = simulate(mode, rounds, t_ar=t_ar, t_d=t_d, verify_ms=verify, n_rounds=200)
    except CLEAR:
        return
    assert math.isfinite(res.latency_per_token) and res.latency_per_token > 0
