"""The simulators reproduce, on fixed seeds, what they computed before their speed-ups.

``tests/data/sim_reference.json`` was recorded with ``python tests/test_sim_reference.py --record`` (first at
commit 0da606d, before the issue 28 speed work; re-recorded at f7fd463 when the digests became rounded, with
the simulators unchanged). Integer records (worker, rank, batch, distinct experts, step counts) must match
exactly. Float columns are compared on a digest of their values rounded to :data:`FLOAT_DECIMALS` decimals
(microseconds for times in seconds), sums and metrics to a relative 1e-12: a speed-up that changes any time
fails here, while the last-bit noise of a new numpy or pandas release (seen with numpy 2.3.5 / pandas 3.1.1:
1.1476079549155287 vs 1.147607954915526) does not.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from moelab.balanceroute import experiments as ex
from moelab.balanceroute.routers import BR0
from moelab.costmodel import DecodeStepModel
from moelab.costmodel.dp import DPCost
from moelab.eldr.experiments import prepare
from moelab.eldr.routing import ELDRRouter
from moelab.eldr.sim import poisson_requests, simulate
from moelab.eldr.workload import SyntheticConfig, generate
from moelab.routers import make_router
from moelab.sim import SimResult
from moelab.sim.dp import simulate_dp

REFERENCE = Path(__file__).parent / "data" / "sim_reference.json"
#: the routers' measured decision times are wall clock, never reproducible
WALL_CLOCK = ("decision_ms", "decision_us")
#: float columns are digested at this many decimals: a last-bit difference (~1e-16 relative) flips a rounded
#: value with probability ~1e-8 per value, while any real change of a time moves it by far more than 1e-6
FLOAT_DECIMALS = 6
#: relative tolerance of sums and metrics: library float noise, never a changed result
REL = 1e-12


def _digest(values: np.ndarray) -> str:
    """sha256 of a column's bytes: equal digests mean bit-identical records."""
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()[:16]


def _record(res: SimResult) -> dict:
    """What a run is compared on: every per-request and per-step column (digest and sum) and its metrics."""
    out: dict = {"n_steps": len(res.steps)}
    for frame_name, frame in (("requests", res.requests), ("steps", res.steps)):
        for col in frame.columns:
            v = frame[col].to_numpy()
            if v.dtype.kind not in "biuf" or col in WALL_CLOCK:
                continue
            out[f"{frame_name}.{col}.digest"] = _digest(np.round(v, FLOAT_DECIMALS) if v.dtype.kind == "f" else v)
            out[f"{frame_name}.{col}.sum"] = float(np.nansum(v))
    out["metrics"] = {k: float(v) for k, v in res.metrics().items()
                      if isinstance(v, (int, float, np.number)) and not k.startswith(WALL_CLOCK)}
    return out


def _cluster_cases() -> dict[str, SimResult]:
    """The decode-cluster simulator on the bench's geometry (Qwen3-30B-A3B-shaped, 48 x 128, top-8), small:
    queues form (16 slots), ELDR and two baselines, and one DP-group run (2 ranks per instance)."""
    wl = generate(160, SyntheticConfig(), seed=0)
    setup = prepare(wl.trace, DecodeStepModel.h200("qwen3-30b-a3b"), 4, n_pairs=2000)
    sig = setup.signatures().astype(np.float32)
    reqs = poisson_requests(setup.pool, sim_rate=400.0, n_requests=300, output_len=48, seed=1)
    out = {}
    for name, router in (("eldr", ELDRRouter(setup.centroids(), tau=0.1)), ("round_robin", make_router("round_robin")),
                         ("jsq", make_router("jsq"))):
        out[f"cluster_{name}"] = simulate(reqs, router, setup.cost, n_workers=4, trace=setup.pool, slots=16,
                                          signatures=sig if "signature" in router.requires else None, bits=setup.bits)
    from moelab.sim.cluster import simulate as simulate_cluster
    out["cluster_jsq_x_jsq_ranks2"] = simulate_cluster(reqs, make_router("jsq"), setup.cost, n_workers=2, slots=8,
                                                       trace=setup.pool, bits=setup.bits, ranks=2,
                                                       rank_router=make_router("jsq"))
    return out


def _dp_cases() -> dict[str, SimResult]:
    """The BalanceRoute DP simulator on a slice of the Azure conversation trace, pooled and engine queues."""
    trace = ex.workload("azure-conv")
    _, held = ex.split_trace(trace, 0.3)
    cost = DPCost.h200(4, 16)
    tr, _ = ex.at_load(held, cost, 1.2, n_requests=400)
    out = {"dp_br0": simulate_dp(tr, BR0(), cost, n_workers=4, slots=16), "dp_jsq": simulate_dp(tr, make_router("jsq"), cost, n_workers=4, slots=16)}
    return out


@pytest.fixture(scope="module")
def reference() -> dict:
    return json.loads(REFERENCE.read_text())


@pytest.mark.parametrize("cases", [_cluster_cases, _dp_cases], ids=["cluster", "dp"])
def test_simulators_reproduce_recorded_runs(cases, reference):
    for name, res in cases().items():
        got, want = _record(res), reference[name]
        assert got.keys() == want.keys(), name
        for key in want:
            if key == "metrics":
                assert got[key].keys() == want[key].keys(), name
                for m, v in want[key].items():
                    assert got[key][m] == pytest.approx(v, rel=REL, abs=0, nan_ok=True), f"{name} metric {m}"
            elif key.endswith(".sum"):
                assert got[key] == pytest.approx(want[key], rel=REL, abs=0, nan_ok=True), f"{name} {key}"
            else:
                assert got[key] == want[key] or (got[key] != got[key] and want[key] != want[key]), f"{name} {key}"


if __name__ == "__main__" and "--record" in sys.argv:
    recorded = {name: _record(res) for cases in (_cluster_cases, _dp_cases) for name, res in cases().items()}
    REFERENCE.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(recorded)} runs to {REFERENCE}")
