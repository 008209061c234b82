"""Public extension points: a router defined here, outside ``moelab/``, runs unchanged in every driver.

The router below is registered from this test file (as a user's own module would) and then run in the
DP simulator, the decode-cluster simulator (instances and ranks), the cross-paper experiment and the
serving proxy's router choice; routers that break the contract are refused by every driver with a
:class:`~moelab.routing.RouterError` naming them and what they returned.
"""

from __future__ import annotations

import numpy as np
import pytest

from moelab.costmodel import DecodeStepModel
from moelab.routing import (
    ROUTERS,
    ClusterView,
    RequestBatch,
    Router,
    RouterError,
    call_router,
    make_router,
    register_router,
)
from moelab.sim.cluster import simulate
from moelab.sim.dp import route_to_ranks, simulate_dp
from moelab.traces import RequestTrace


class FewestKVTest(Router):
    """Fewest KV tokens among open workers (one request at a time, through the public ``choose``)."""

    name = "test_fewest_kv"
    requires = frozenset({"prompt_len", "free_slots", "kv_tokens"})

    def choose(self, batch, i, view, open_):
        return self.argmin_tiebreak(view.kv_tokens, open_)


class LongestFirstTest(Router):
    """A whole-batch policy through the public ``route_batch``: longest prompt to the emptiest worker."""

    name = "test_longest_first"
    requires = frozenset({"prompt_len", "free_slots", "kv_tokens"})

    def route_batch(self, batch, view):
        work = view.copy()
        out = np.full(len(batch), -1, np.int64)
        for i in np.argsort(-batch.prompt_len, kind="stable"):
            open_ = work.free_slots > 0
            if not open_.any():
                break
            w = self.argmin_tiebreak(work.kv_tokens, open_)
            out[i] = w
            work.admit(w, int(batch.prompt_len[i]))
        return out


for _cls in (FewestKVTest, LongestFirstTest):
    if _cls.name not in ROUTERS:  # a second import of this module (xdist, reruns) must not re-register
        register_router(_cls)


def _trace(n: int = 80, seed: int = 0) -> RequestTrace:
    rng = np.random.default_rng(seed)
    return RequestTrace(np.sort(rng.uniform(0, 2.0, n)), rng.integers(16, 512, n), rng.integers(4, 40, n))


def test_public_override_points_are_documented_in_help():
    for meth in ("route", "route_batch", "choose", "prepare", "prepare_state", "reset", "argmin_tiebreak"):
        assert getattr(Router, meth).__doc__, meth
    doc = ClusterView.__doc__ + RequestBatch.__doc__
    for field in ("active", "kv_tokens", "free_slots", "waiting", "time_s", "step", "active_requests",
                  "waited_steps", "waiting_tokens", "prompt_len", "signature", "domain", "output_len",
                  "request_id", "prompt_key", "prefix_hashes"):
        assert f"{field} :" in doc, field


@pytest.mark.parametrize("name", ["test_fewest_kv", "test_longest_first"])
def test_user_router_runs_in_the_dp_simulator(name):
    tr = _trace()
    res = simulate_dp(tr, make_router(name), n_workers=4, slots=8)
    # every request placed exactly once and finished
    assert np.isfinite(res.requests["finish_s"]).all()
    assert res.requests["worker"].between(0, 3).all() and len(res.requests) == len(tr)


@pytest.mark.parametrize("name", ["test_fewest_kv", "test_longest_first"])
def test_user_router_runs_in_the_decode_cluster_simulator(name):
    tr = _trace()
    cost = DecodeStepModel.h200()
    res = simulate(tr, make_router(name), cost, n_workers=3, slots=8)
    assert np.isfinite(res.requests["finish_s"]).all() and res.requests["worker"].between(0, 2).all()
    # as the instance router and as the rank router of DP groups
    res = simulate(tr, make_router("jsq"), cost, n_workers=2, slots=8, ranks=2, rank_router=make_router(name))
    assert np.isfinite(res.requests["finish_s"]).all()


def test_user_router_runs_in_the_cross_paper_experiment():
    from moelab import cross

    cs = cross.prepare(n_instances=2, ranks=2, slots=8, n_trace=120, output_len=32, n_pairs=400, n_domains=4,
                       lengths=None)
    df = cross.pair_grid(cs, rate=cross.rate_for_load(cs, 0.8), n_requests=60,
                         instance_routers=("jsq", "test_fewest_kv"), rank_routers=("jsq", "test_longest_first"))
    assert set(df["pair"]) == {"jsq x jsq", "jsq x test_longest_first", "test_fewest_kv x jsq",
                               "test_fewest_kv x test_longest_first"}
    assert np.isfinite(df["tpot_ms_p50"]).all()


def test_user_router_object_runs_in_serve_router():
    pytest.importorskip("aiohttp")
    from moelab.serving.proxy import RouterProxy

    proxy = RouterProxy(["http://127.0.0.1:9", "http://127.0.0.1:10"], router=FewestKVTest())
    assert proxy.router.name == "test_fewest_kv"
    view = ClusterView(np.zeros(2), np.array([100, 5]), np.array([4, 4]))
    assert call_router(proxy.router, RequestBatch([7]), view).tolist() == [1]


def test_user_router_registered_before_the_proxy_is_a_serve_router_choice():
    pytest.importorskip("aiohttp")
    from moelab.serving import proxy as proxy_mod

    assert "test_fewest_kv" in proxy_mod.router_choices()
    proxy = proxy_mod.RouterProxy(["http://127.0.0.1:9", "http://127.0.0.1:10"], router="test_fewest_kv")
    assert isinstance(proxy.router, FewestKVTest)


def test_user_router_registered_after_the_proxy_is_a_serve_router_choice():
    pytest.importorskip("aiohttp")
    from moelab.serving.proxy import RouterProxy

    class Late(FewestKVTest):
        name = "test_late_fewest_kv"

    if Late.name not in ROUTERS:
        register_router(Late)
    proxy = RouterProxy(["http://127.0.0.1:9", "http://127.0.0.1:10"], router=Late.name)
    assert isinstance(proxy.router, Late)


# ---------------------------------------------------------------- routers that break the contract
class _Answer(Router):
    name = "test_bad_answer"

    def __init__(self, answer=None, exc=None):
        super().__init__()
        self.answer, self.exc = answer, exc

    def route_batch(self, batch, view):
        if self.exc is not None:
            raise self.exc
        return self.answer


@pytest.mark.parametrize("answer, exc, match", [
    (None, ZeroDivisionError("boom"), r"'test_bad_answer' \(_Answer\) raised ZeroDivisionError: boom"),
    ([0], None, r"returned \[0\] \(list\) of shape \(1,\); expected one rank id per request, shape \(2,\)"),
    (np.int64(1), None, r"returned 1 \(int64\) of shape \(\); expected one rank id per request"),
    ([0, 7], None, r"invalid rank ids \[7\]"),
    (np.array([0.0, 1.5]), None, r"float64 values \[0.0, 1.5\]; rank ids must be integers"),
    ([0, 0], None, r"over-filled a rank: it placed 2 requests on rank 0, which has 1 free slot"),
])
def test_driver_names_a_bad_router_and_what_it_returned(answer, exc, match):
    batch = RequestBatch([5, 6])
    view = ClusterView(np.zeros(2), np.zeros(2), np.array([1, 1]))
    with pytest.raises(RouterError, match=match):
        route_to_ranks(_Answer(answer, exc), batch, view, np.array([1, 1]))


@pytest.mark.parametrize("answer", [[-1], [3], [1.0], [[0]], "0"])
def test_every_simulator_refuses_a_bad_answer_before_placing(answer):
    tr = _trace(20)
    with pytest.raises(RouterError, match="test_bad_answer"):
        simulate(tr, _Answer(np.asarray(answer) if not isinstance(answer, str) else answer), DecodeStepModel.h200(),
                 n_workers=3, slots=8)
    # the DP simulator's pooled path: a whole pool answered with one bad value
    with pytest.raises(RouterError, match="test_bad_answer"):
        simulate_dp(tr, _Answer(np.full(20, 9)), n_workers=2, slots=4, pool_view=20)


def test_a_router_writing_to_the_drivers_view_is_refused():
    class Scribbler(Router):
        name = "test_scribbler"

        def route_batch(self, batch, view):
            view.active[0] += 1  # books onto the driver's live state instead of view.copy()
            return np.zeros(len(batch), np.int64)

    with pytest.raises(RouterError, match="test_scribbler.*read-only"):
        simulate(_trace(10), Scribbler(), DecodeStepModel.h200(), n_workers=2, slots=8)


def test_serve_router_imports_a_router_module_before_choosing(tmp_path, monkeypatch):
    """``moelab serve-router --router-module mymod --router myname``: a file outside moelab registers a router
    that the command line then names."""
    pytest.importorskip("aiohttp")
    from moelab.serving.proxy import build_parser, build_proxy

    (tmp_path / "my_routers_for_test.py").write_text(
        "from moelab.routing import ROUTERS, register_router\n"
        "from moelab.routing.baselines import JoinShortestQueue\n"
        "class Mine(JoinShortestQueue):\n"
        "    name = 'test_module_router'\n"
        "if Mine.name not in ROUTERS:\n"
        "    register_router(Mine)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = build_parser().parse_args(["-b", "http://127.0.0.1:9", "-b", "http://127.0.0.1:10",
                                      "--router-module", "my_routers_for_test", "--router", "test_module_router"])
    try:
        assert build_proxy(args).router.name == "test_module_router"
    finally:
        ROUTERS.pop("test_module_router", None)  # the registry is the process's: leave it as it was
    bad = build_parser().parse_args(["-b", "http://127.0.0.1:9", "--router-module", "no_such_module_xyz"])
    with pytest.raises(ValueError, match="--router-module 'no_such_module_xyz' cannot be imported"):
        build_proxy(bad)
    unknown = build_parser().parse_args(["-b", "http://127.0.0.1:9", "--router", "no_such_router"])
    with pytest.raises(ValueError, match="--router must be one of"):
        build_proxy(unknown)


@pytest.mark.parametrize("answer, shown", [
    (99, "99 (int)"), (7, "7 (int)"), (np.int64(7), "7 (int64)"), (-1, "-1 (int)"), (1.0, "1.0 (float)"),
    ([1], "[1] (list)"), (np.array([1]), "[1] (ndarray)"), (None, "None"), ("0", "'0' (str)"), (True, "True (bool)"),
])
def test_a_choose_router_answering_out_of_range_is_named_not_an_index_error(answer, shown):
    """The error shows what choose() returned as it returned it: a plain 7 is "7 (int)", not "[7]"."""
    class Far(Router):
        name = "test_far"

        def choose(self, batch, i, view, open_):
            return answer

    view = ClusterView(np.zeros(2), np.zeros(2), np.array([4, 4]))
    with pytest.raises(RouterError) as err:
        call_router(Far(), RequestBatch([7]), view)
    assert f"choose() returned {shown} for request 0; expected one integer worker id in [0, 2)" in str(err.value)


class _ReadsSignatures(Router):
    """Declares the signatures it reads (ELDR-like)."""

    name = "test_reads_signatures"
    requires = frozenset({"prompt_len", "free_slots", "signature"})

    def choose(self, batch, i, view, open_):
        return int(np.argmax(batch.signature[i][: view.n_workers]))


class _ReadsUndeclared(_ReadsSignatures):
    """Reads the signatures without declaring them."""

    name = "test_reads_undeclared"
    requires = frozenset({"prompt_len", "free_slots"})


def _drivers():
    """Every driver a user router runs in, on data that carries no signatures."""
    from moelab import eldr
    from moelab.eldr.experiments import projection_cost
    from moelab.traces import bundled_trace_path, load_trace

    expert = load_trace(bundled_trace_path("tiny-moe-heldout"))
    reqs = eldr.poisson_requests(expert, sim_rate=50.0, n_requests=20, output_len=4)
    cost = projection_cost(expert)
    return {
        "the BalanceRoute DP simulator": lambda r: simulate_dp(_trace(), r, n_workers=2, slots=4),
        "the decode-cluster simulator": lambda r: simulate(reqs, r, cost, n_workers=2, trace=expert),
        "eldr.simulate": lambda r: eldr.simulate(reqs, r, cost, n_workers=2, trace=expert),
        "the DP group of the decode-cluster simulator": lambda r: simulate(
            reqs, make_router("jsq"), cost, n_workers=1, trace=expert, ranks=2, rank_router=r),
    }


def test_every_driver_refuses_a_router_requiring_a_field_it_cannot_supply_by_name():
    """requires is enforced before anything runs: the driver names the router and the missing field."""
    for run in _drivers().values():
        with pytest.raises(ValueError, match=r"router 'test_reads_signatures' requires \['signature'\], which "
                                             r"the .* does not supply"):
            run(_ReadsSignatures())


def test_a_router_reading_a_field_it_does_not_declare_is_told_to_declare_it():
    for run in _drivers().values():
        with pytest.raises(RouterError, match=r"router 'test_reads_undeclared' .*raised TypeError: .*NoneType.*"
                                              r"RequestBatch\.signature.* None, and the router does not declare "
                                              r"them in its requires"):
            run(_ReadsUndeclared())


@pytest.mark.parametrize("requires, exc, match", [
    ("signature", TypeError, r"requires must be a set of field names .*got str 'signature'"),
    (frozenset({"prompt_len", "signatures"}), ValueError, r"requires unknown field\(s\) \['signatures'\]; fields:"),
    (frozenset({"prompt_len", 3}), TypeError, r"requires must be a set of field names"),
])
def test_a_malformed_requires_is_refused_by_every_driver_and_by_register_router(requires, exc, match):
    bad = type("Malformed", (_ReadsSignatures,), {"name": "test_malformed", "requires": requires})
    for run in _drivers().values():
        with pytest.raises(exc, match=rf"router 'test_malformed'.*{match}"):
            run(bad())
    with pytest.raises(exc, match=match):
        register_router(bad)
    assert "test_malformed" not in ROUTERS


def test_the_simulators_share_one_positional_order():
    """(requests, router, cost) positionally everywhere, the rest by keyword: the old orders fail loudly."""
    import inspect

    from moelab import eldr
    from moelab.eldr.experiments import projection_cost
    from moelab.traces import bundled_trace_path, load_trace

    for fn in (eldr.simulate, simulate, simulate_dp):
        params = inspect.signature(fn).parameters.values()
        positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert positional[1:] == ["router", "cost"] and positional[0] in ("requests", "trace"), fn
        assert {"n_workers"} <= {p.name for p in params if p.kind is p.KEYWORD_ONLY}, fn
    expert = load_trace(bundled_trace_path("tiny-moe-heldout"))
    reqs = eldr.poisson_requests(expert, sim_rate=50.0, n_requests=5, output_len=2)
    cost = projection_cost(expert)
    with pytest.raises(TypeError, match="positional"):
        eldr.simulate(expert, reqs, make_router("jsq"), cost, n_workers=2)  # the old order
    with pytest.raises(TypeError, match="positional"):
        simulate_dp(_trace(), make_router("jsq"), 2, 4)  # the old order
    assert eldr.simulate(reqs, make_router("jsq"), cost, n_workers=2, trace=expert).metrics()["tpot_ms_p50"] > 0
