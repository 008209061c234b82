"""The shared router interface and the load-balancing baselines."""

from __future__ import annotations

import numpy as np
import pytest

from moelab.routers import available_routers, make_router
from moelab.routing import ClusterView, RequestBatch, RouterCalibration

BASELINES = ["round_robin", "random", "jsq", "p2c", "least_kv", "vllm_dp"]


def test_registry_lists_every_system():
    names = available_routers()
    for name in BASELINES + ["eldr", "domain_oracle", "br0", "brh"]:
        assert name in names
    with pytest.raises(ValueError, match="router must be one of"):
        make_router("fastest")


@pytest.mark.parametrize("name", BASELINES)
def test_baselines_respect_free_slots_and_are_seeded(name):
    view = ClusterView(active=[3, 0, 1, 0], kv_tokens=[300, 0, 50, 10], free_slots=[0, 2, 1, 0])
    batch = RequestBatch(prompt_len=np.full(5, 10))
    a = make_router(name, seed=3).reset(4).route(batch, view)
    b = make_router(name, seed=3).reset(4).route(batch, view)
    assert np.array_equal(a, b)
    placed = a[a >= 0]
    assert placed.size == 3 and set(placed.tolist()) <= {1, 2}  # only 3 free slots, on workers 1 and 2
    assert (a[3:] == -1).all()
    assert np.bincount(placed, minlength=4)[1] <= 2


def test_jsq_and_least_kv_pick_the_least_loaded():
    view = ClusterView(active=[2, 1, 5], kv_tokens=[10, 900, 20], free_slots=[9, 9, 9])
    one = RequestBatch(prompt_len=[4])
    assert make_router("jsq").reset(3).route(one, view).tolist() == [1]
    assert make_router("least_kv").reset(3).route(one, view).tolist() == [0]


def test_round_robin_cycles():
    view = ClusterView.idle(3)
    rr = make_router("round_robin").reset(3)
    assert rr.route(RequestBatch(prompt_len=np.ones(7)), view).tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_jsq_balances_a_batch_exactly():
    out = make_router("jsq", seed=0).reset(4).route(RequestBatch(prompt_len=np.ones(8)), ClusterView.idle(4))
    assert np.bincount(out, minlength=4).tolist() == [2, 2, 2, 2]


def test_vllm_dp_uses_stale_counts_plus_own_assignments():
    router = make_router("vllm_dp", refresh_s=1.0).reset(2)
    view = ClusterView(active=[0, 5], kv_tokens=[0, 0], free_slots=[99, 99], waiting=[0, 0], time_s=0.0)
    first = router.route(RequestBatch(prompt_len=np.ones(5)), view)
    # scores 4*waiting + running: worker 1 runs 5, so worker 0 takes requests until 4*waiting passes 5
    assert first.tolist() == [0, 0, 1, 0, 1]
    # before the next refresh the stale snapshot plus own increments decide (w0: 12 < w1: 13) ...
    stale = ClusterView(active=[0, 9], kv_tokens=[0, 0], free_slots=[99, 99], waiting=[0, 0], time_s=0.5)
    assert router.route(RequestBatch(prompt_len=[1]), stale).tolist() == [0]
    # ... and after it the published counts do
    fresh = ClusterView(active=[3, 0], kv_tokens=[0, 0], free_slots=[99, 99], waiting=[0, 0], time_s=1.0)
    assert router.route(RequestBatch(prompt_len=[1]), fresh).tolist() == [1]
    with pytest.raises(ValueError, match="refresh_s"):
        make_router("vllm_dp", refresh_s=-1)


def test_view_and_batch_validation():
    with pytest.raises(ValueError, match="kv_tokens must have one entry per worker"):
        ClusterView(active=[0, 0], kv_tokens=[0], free_slots=[1, 1])
    with pytest.raises(ValueError, match="signature must have shape"):
        RequestBatch(prompt_len=[1, 2], signature=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="n_workers"):
        make_router("jsq").reset(0)


# ---------------------------------------------------------------- prepare, calibration, registry
def _signatures(n: int = 60, d: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, d))


def test_prepare_fits_eldr_centroids_and_counts_the_oracles_domains():
    from moelab.eldr.partition import spherical_kmeans

    sig = _signatures()
    eldr = make_router("eldr", RouterCalibration(n_workers=3, signatures=sig, seed=4), tau=0.2, balanced=False)
    expected = spherical_kmeans(sig, 3, balanced=False, seed=4).centroids
    assert np.allclose(eldr.centroids, expected / np.linalg.norm(expected, axis=1, keepdims=True))
    assert eldr.n_workers == 3 and not eldr.calibration_needs
    assert eldr.route(RequestBatch([5], signature=sig[:1]), ClusterView.idle(3)).shape == (1,)
    # a driver's cached centroids (fitted on the same signatures) are taken as they are, no K-means again
    cached = make_router("eldr", RouterCalibration(n_workers=3, signatures=sig, centroids=expected[::-1]))
    assert np.allclose(cached.centroids, eldr.centroids[::-1])
    with pytest.raises(ValueError, match="centroids must have one row per worker"):
        RouterCalibration(n_workers=2, signatures=sig, centroids=expected)
    oracle = make_router("domain_oracle", RouterCalibration(domains=["code", "chat", "code", "math"]))
    assert oracle.n_domains == 3
    # the online refitter by its window: sized for the calibration's workers (4 signatures per worker)
    refit = make_router("eldr", RouterCalibration(n_workers=5, signatures=sig), refit_window_s=2.0)
    assert refit.refit is not None and refit.refit.min_points == 20 and refit.refit.window_s == 2.0
    # the engine's KV capacity of vLLM >= 0.32 comes from the calibration too
    assert make_router("vllm_dp@0.32", RouterCalibration(kv_capacity_tokens=5e3)).kv_capacity_tokens == 5e3


def test_a_router_without_fitted_state_prepares_as_a_no_op():
    router = make_router("jsq")
    assert router.prepare(RouterCalibration(n_workers=2)) is router and not router.calibration_needs
    assert router.prepare() is router


def test_a_router_whose_calibration_lacks_what_it_needs_names_it():
    with pytest.raises(ValueError, match=r"'eldr' cannot be prepared: the calibration lacks \['signatures'\]"):
        make_router("eldr", RouterCalibration(n_workers=3))
    with pytest.raises(ValueError, match="holds 2 signatures, fewer than its n_workers=3"):
        make_router("eldr", RouterCalibration(n_workers=3, signatures=_signatures(2)))
    with pytest.raises(ValueError, match=r"lacks \['domains'\]"):
        make_router("domain_oracle", RouterCalibration(n_workers=3))
    with pytest.raises(ValueError, match=r"lacks \['kv_capacity_tokens'\]"):
        make_router("vllm_dp@0.32", RouterCalibration(n_workers=3))
    # built without a calibration it comes back unprepared, and route() says what prepare needs
    with pytest.raises(ValueError, match=r"'domain_oracle' is not prepared.*\['domains'\]"):
        make_router("domain_oracle").route(RequestBatch([1], domain=[0]), ClusterView.idle(2))
    with pytest.raises(ValueError, match="calibration must be a RouterCalibration"):
        make_router("jsq").prepare({"n_workers": 2})
    with pytest.raises(ValueError, match="signatures must be a finite"):
        RouterCalibration(signatures=np.full((2, 3), np.nan))
    with pytest.raises(ValueError, match="n_workers"):
        RouterCalibration(n_workers=0)


def test_make_router_takes_only_known_parameters_and_shares_options():
    with pytest.raises(ValueError, match=r"'jsq' takes no parameter\(s\) \['tau'\]"):
        make_router("jsq", tau=0.1)
    # a sweep's shared settings reach only the routers that take them
    assert make_router("jsq", options={"tau": 0.3}).seed == 0
    assert make_router("eldr", centroids=np.eye(2), options={"tau": 0.3}).tau == 0.3


def test_the_registry_lists_every_router_as_a_class_and_the_floor_imports_no_paper():
    import ast
    import pathlib

    import moelab.routing
    from moelab.routers import ROUTERS, router_names
    from moelab.routing import Router

    assert {"eldr", "domain_oracle", "br0", "brh", "vllm_dp@0.32", "sglang_total_tokens", *BASELINES} <= set(ROUTERS)
    for name, cls in ROUTERS.items():
        assert isinstance(cls, type) and issubclass(cls, Router) and cls.name == name
    assert router_names() == tuple(sorted(ROUTERS))
    floor = pathlib.Path(moelab.routing.__file__).parent
    for path in floor.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom | ast.Import):
                mods = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(m.startswith(("moelab.eldr", "moelab.balanceroute", "importlib")) or m == "importlib"
                               for m in mods), (path.name, mods)
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert ":" not in node.value or not node.value.startswith("moelab."), (path.name, node.value)


def test_engine_queues_are_declared_and_a_driver_without_them_refuses_such_routers():
    from moelab.routers import check_supplies, router_class, router_names

    assert router_class("sglang_round_robin").engine_queues and not router_class("jsq").engine_queues
    pooled = router_names(engine_queues=False)
    assert "jsq" in pooled and "vllm_dp@0.32" not in pooled and "sglang_total_tokens" not in pooled
    with pytest.raises(ValueError, match="engine's own queue"):
        check_supplies(router_class("sglang_round_robin"), {"prompt_len", "active", "waiting", "time_s"}, "a test driver",
                       engine_queues=False)
    check_supplies(router_class("sglang_round_robin"), {"prompt_len", "active", "waiting", "time_s"}, "a DP driver",
                   engine_queues=True)
    # what a driver can calibrate is a filter too: the oracle needs domain labels
    assert "domain_oracle" not in router_names(calibration={"n_workers", "signatures", "seed"})


def test_brh_routes_through_the_one_worker_guard_of_router_route():
    from moelab.balanceroute.routers import BR0, BRH
    from moelab.routing import Router

    assert "route" not in vars(BRH) and "route" not in vars(BR0) and BRH.route is Router.route
    brh = make_router("brh", horizon=0, gamma=1.0, beta=None).reset(2)
    view = ClusterView(active=[0, 0, 0], kv_tokens=[0, 0, 0], free_slots=[2, 2, 2])
    with pytest.raises(ValueError, match="view has 3 workers but the router was reset for 2"):
        brh.route(RequestBatch([4]), view)
    fresh = make_router("br0")
    assert fresh.route(RequestBatch([4, 5]), view).tolist() != [-1, -1] and fresh.n_workers == 3
