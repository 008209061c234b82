"""moelab.sweep: grids, the content-addressed cache (reruns, resume, corrupt entries), the serial /
local / Ray backends giving identical rows, the suite adapters and the ``moelab sweep`` command."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from moelab.cli import main
from moelab.sweep import SweepCacheWarning, expand_grid, parse_grid_args, run_sweep

# Every call of the grid functions leaves a file here, so calls are counted across processes (the
# variable is set before any pool or Ray worker starts, and they inherit it).
CALLS_ENV = "MOELAB_TEST_SWEEP_CALLS"
os.environ.setdefault(CALLS_ENV, tempfile.mkdtemp(prefix="moelab-sweep-calls-"))
FAIL_ENV = "MOELAB_TEST_SWEEP_FAIL_AT"


def _mark(tag: str) -> None:
    Path(os.environ[CALLS_ENV], f"{tag}.{os.getpid()}.{time.perf_counter_ns()}").touch()


def calls(tag: str) -> int:
    return sum(1 for p in Path(os.environ[CALLS_ENV]).iterdir() if p.name.startswith(f"{tag}."))


def poly(x: int, y: float = 1.0, tag: str = "t") -> dict:
    """A small deterministic point function: two rows' worth of types (int, float, str, bool)."""
    _mark(tag)
    if os.environ.get(FAIL_ENV) == f"{tag}:{x}" or (tag == "raise" and x == 2):
        raise ValueError(f"poly refuses x={x}")
    return {"z": x * x + y, "ratio": x / 3.0, "label": f"{x}/{y:g}", "even": x % 2 == 0}


def per_method(x: int, tag: str = "m") -> list[dict]:
    """Several rows per point (as the HD suite returns one row per method)."""
    _mark(tag)
    return [{"method": m, "score": x * k} for k, m in enumerate(("a", "b"), start=1)]


GRID = {"x": [1, 2, 3], "y": [0.5, 2.0]}


def _grid(tag: str) -> dict:
    return {**GRID, "tag": [tag]}


# ---------------------------------------------------------------------------------------- grids

def test_grid_expansion_and_parsing():
    pts = expand_grid({"a": [1, 2], "b": ["x"]})
    assert pts == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    assert parse_grid_args(["rate=20,60.5", "router=jsq,eldr", "flag=True,None"]) == {
        "rate": [20, 60.5], "router": ["jsq", "eldr"], "flag": [True, None]}


@pytest.mark.parametrize("grid, match", [
    ({"x": []}, "'x' has an empty value list"),
    ({"x": [1, 1]}, "repeats the value 1"),
    ({"x": [[1, 2]]}, "must be numbers, strings"),
    ({"x": [float("nan")]}, "finite"),
    ({"x": 3}, "needs a list of values"),
    ({"x": [1], "w": [2]}, r"unknown grid parameter\(s\) \['w'\]"),
])
def test_bad_grids_are_refused(grid, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        run_sweep(poly, grid, cache_dir=tmp_path, backend="serial", allowed=("x", "y", "tag"), progress=False)


@pytest.mark.parametrize("pairs, match", [
    (["rate="], "'rate' has an empty value list"),
    (["rate=1,,2"], "empty value"),
    (["rate"], "name=v1,v2"),
    (["rate=1", "rate=2"], "twice"),
])
def test_bad_grid_arguments_are_refused(pairs, match):
    with pytest.raises(ValueError, match=match):
        parse_grid_args(pairs)


def test_bad_functions_and_backends_are_refused(tmp_path):
    with pytest.raises(ValueError, match="module-level"):
        run_sweep(lambda x: {"x": x}, {"x": [1]}, cache_dir=tmp_path, backend="serial", progress=False)
    with pytest.raises(ValueError, match="backend must be one of"):
        run_sweep(poly, {"x": [1]}, cache_dir=tmp_path, backend="threads", progress=False)
    with pytest.raises(ValueError, match="only for the ray backend"):
        run_sweep(poly, {"x": [1], "tag": ["addr"]}, cache_dir=tmp_path, backend="serial", address="127.0.0.1:1",
                  progress=False)


# ---------------------------------------------------------------------------------------- cache

def test_second_run_is_served_from_the_cache(tmp_path):
    first = run_sweep(poly, _grid("cache"), cache_dir=tmp_path, backend="serial", progress=False)
    assert (first.computed, first.cached, calls("cache")) == (6, 0, 6)
    assert list(first.frame.columns[:3]) == ["x", "y", "tag"] and len(first.frame) == 6
    again = run_sweep(poly, _grid("cache"), cache_dir=tmp_path, backend="local", workers=2, progress=False)
    assert (again.computed, again.cached, calls("cache")) == (0, 6, 6)  # no call at all, not even a pool
    pd.testing.assert_frame_equal(first.frame, again.frame)
    # a new value computes only the new points; a new code version starts afresh
    more = run_sweep(poly, {**_grid("cache"), "x": [1, 2, 3, 4]}, cache_dir=tmp_path, backend="serial", progress=False)
    assert (more.computed, more.cached, calls("cache")) == (2, 6, 8)
    other = run_sweep(poly, _grid("cache"), cache_dir=tmp_path, backend="serial", code="v2", progress=False)
    assert other.computed == 6


def test_interrupted_run_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv(FAIL_ENV, "resume:3")  # serial order: x=1 (two y), x=2 (two y), then x=3 fails
    with pytest.raises(ValueError, match="refuses x=3"):
        run_sweep(poly, _grid("resume"), cache_dir=tmp_path, backend="serial", progress=False)
    assert calls("resume") == 5
    monkeypatch.delenv(FAIL_ENV)
    # a look at the progress computes nothing: the four finished points, two missing
    peek = run_sweep(poly, _grid("resume"), cache_dir=tmp_path, backend="serial", progress=False, compute=False)
    assert (peek.computed, peek.cached, peek.missing, calls("resume")) == (0, 4, 2, 5)
    assert sorted(set(peek.frame["x"])) == [1, 2] and len(peek.frame) == 4
    res = run_sweep(poly, _grid("resume"), cache_dir=tmp_path, backend="serial", progress=False)
    assert (res.computed, res.cached, res.missing) == (2, 4, 0)
    pd.testing.assert_frame_equal(res.frame.iloc[:4], peek.frame)


def test_corrupt_entries_are_recomputed_with_a_warning_naming_them(tmp_path):
    res = run_sweep(poly, _grid("corrupt"), cache_dir=tmp_path, backend="serial", progress=False)
    cache = res.frame  # reference rows
    from moelab.sweep import ResultCache

    rc = ResultCache(tmp_path)
    truncated, foreign = rc.path(res.keys[1]), rc.path(res.keys[4])
    truncated.write_bytes(truncated.read_bytes()[:40])
    foreign.write_bytes(rc.path(res.keys[0]).read_bytes())  # a valid entry, but for another point
    with pytest.warns(SweepCacheWarning) as record:
        again = run_sweep(poly, _grid("corrupt"), cache_dir=tmp_path, backend="serial", progress=False)
    named = " ".join(str(w.message) for w in record)
    assert str(truncated) in named and str(foreign) in named
    assert (again.computed, again.cached) == (2, 4) and sorted(again.recomputed) == sorted([res.keys[1], res.keys[4]])
    pd.testing.assert_frame_equal(cache, again.frame)
    third = run_sweep(poly, _grid("corrupt"), cache_dir=tmp_path, backend="serial", progress=False)
    assert third.computed == 0  # repaired


def test_several_rows_per_point_and_result_columns_must_agree_with_parameters(tmp_path):
    res = run_sweep(per_method, {"x": [1, 2], "tag": ["rows"]}, cache_dir=tmp_path, backend="serial", progress=False)
    assert res.frame[["x", "method", "score"]].values.tolist() == [[1, "a", 1], [1, "b", 2], [2, "a", 2], [2, "b", 4]]
    with pytest.raises(ValueError, match="must hold the parameter's value"):
        run_sweep(_echo_wrong, {"x": [1]}, cache_dir=tmp_path, backend="serial", progress=False)


def _echo_wrong(x: int) -> dict:
    return {"x": x + 1}


def test_serial_and_local_backends_agree(tmp_path):
    serial = run_sweep(poly, _grid("agree"), cache_dir=tmp_path / "s", backend="serial", progress=False)
    local = run_sweep(poly, _grid("agree"), cache_dir=tmp_path / "l", backend="local", workers=2, progress=False)
    assert local.computed == 6
    pd.testing.assert_frame_equal(serial.frame, local.frame)
    assert serial.keys == local.keys  # same content address whatever ran it


# ------------------------------------------------------------------------------------------ Ray

@pytest.fixture(scope="module")
def ray_local():
    """One local 2-CPU Ray for the module (starting Ray takes 10-20 s)."""
    if importlib.util.find_spec("ray") is None:
        if os.environ.get("CI"):
            pytest.fail("ray is not installed, but CI must run the Ray backend (pip install -e '.[ray]')")
        pytest.skip("ray is not installed (pip install 'moelab[ray]')")
    import ray

    attempts = 3  # a loaded machine can make Ray's agents miss their 15 s start-up deadline (twice seen here)
    for attempt in range(attempts):
        try:
            ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
            break
        except Exception:
            ray.shutdown()
            if attempt == attempts - 1:
                raise
            time.sleep(5)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # this test module is not importable there
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_backend_matches_serial_and_local(ray_local, tmp_path):
    serial = run_sweep(poly, _grid("ray"), cache_dir=tmp_path / "s", backend="serial", progress=False)
    n = calls("ray")
    ray = run_sweep(poly, _grid("ray"), cache_dir=tmp_path / "r", backend="ray", progress=False)
    assert ray.computed == 6 and calls("ray") == n + 6
    pd.testing.assert_frame_equal(serial.frame, ray.frame)
    local = run_sweep(poly, _grid("ray"), cache_dir=tmp_path / "l", backend="local", workers=2, progress=False)
    pd.testing.assert_frame_equal(local.frame, ray.frame)
    again = run_sweep(poly, _grid("ray"), cache_dir=tmp_path / "r", backend="ray", progress=False)
    assert (again.computed, again.cached, calls("ray")) == (0, 6, n + 12)
    # a point's own error comes back as itself, not wrapped in Ray's
    with pytest.raises(ValueError, match="refuses x=2"):
        run_sweep(poly, {"x": [1, 2], "tag": ["raise"]}, cache_dir=tmp_path / "f", backend="ray", progress=False)
    assert ray_local.is_initialized()  # a session opened by the caller is left open


@pytest.mark.slow
def test_cli_joins_a_running_ray_cluster_by_address(ray_local, tmp_path):
    """A second driver (the CLI in its own process) joins the module's Ray by --address, runs its
    points there and disconnects, leaving the cluster up."""
    import subprocess

    address = ray_local.get_runtime_context().gcs_address
    argv = [sys.executable, "-m", "moelab.cli", "sweep", "balanceroute", "--backend", "ray", "--address", address,
            "--grid", "shape=qwen3-30b-a3b", "context_scale=1", "slots=16", "G=2", "requests_per_slot=2",
            "--out", str(tmp_path), "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "1 points: 1 computed, 0 from the cache" in out.stdout and "on ray" in out.stdout
    assert pd.read_parquet(tmp_path / "balanceroute.parquet")["n_requests"].tolist() == [2 * 2 * 16]
    assert ray_local.is_initialized() and ray_local.cluster_resources().get("CPU") == 2


@pytest.mark.slow
def test_unreachable_ray_address_is_a_clear_error(ray_local, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="cannot reach the Ray cluster at '127.0.0.1:1'"):
        run_sweep(poly, {"x": [1], "tag": ["addr"]}, cache_dir=tmp_path, backend="ray", address="127.0.0.1:1",
                  progress=False)
    monkeypatch.setenv("RAY_ADDRESS", "ray://127.0.0.1:1")
    with pytest.raises(ValueError, match="cannot reach"):
        run_sweep(poly, {"x": [1], "tag": ["addr"]}, cache_dir=tmp_path, backend="ray", progress=False)
    with pytest.raises(ValueError, match="host:port"):
        run_sweep(poly, {"x": [1], "tag": ["addr"]}, cache_dir=tmp_path, backend="ray", address="nohost",
                  progress=False)
    assert calls("addr") == 0


# ------------------------------------------------------------------------------- suites and CLI

@pytest.mark.parametrize("argv, match", [
    (["sweep", "nope"], "sweep suite must be one of"),
    (["sweep", "eldr", "--grid", "foo=1"], r"has no parameter\(s\) \['foo'\]"),
    (["sweep", "eldr", "--grid", "rate="], "'rate' has an empty value list"),
    (["sweep", "eldr", "--grid", "router=jsq,teleport"], "router must be one of"),
    (["sweep", "eldr", "--grid", "K=two"], "takes int values"),
    (["sweep", "balanceroute", "--grid", "G=0"], "G must be an integer"),
])
def test_cli_bad_input_is_an_error_without_traceback(argv, match, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    import re

    assert re.search(match, err), err


def test_cli_unreachable_address(tmp_path, capsys):
    if importlib.util.find_spec("ray") is None and not os.environ.get("CI"):
        pytest.skip("ray is not installed")
    argv = ["sweep", "balanceroute", "--backend", "ray", "--address", "127.0.0.1:1", "--grid", "shape=qwen3-30b-a3b",
            "context_scale=1", "slots=16", "G=2", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: cannot reach the Ray cluster at '127.0.0.1:1'" in err and "Traceback" not in err


def test_cli_balanceroute_suite_runs_and_reruns_from_cache(tmp_path, capsys):
    argv = ["sweep", "balanceroute", "--backend", "serial", "--grid", "shape=qwen3-30b-a3b", "context_scale=1,4",
            "slots=16", "G=2", "requests_per_slot=3", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 points: 2 computed, 0 from the cache" in out
    df = pd.read_parquet(tmp_path / "balanceroute.parquet")
    assert df["context_scale"].tolist() == [1.0, 4.0] and (df["G"] == 2).all() and (df["slots"] == 16).all()
    assert df["attention_share"].between(0, 1).all() and df["n_requests"].eq(3 * 2 * 16).all()
    assert df["attention_share"].iloc[1] > df["attention_share"].iloc[0]  # 4x longer prompts: more attention
    assert main(argv) == 0
    assert "2 points: 0 computed, 2 from the cache" in capsys.readouterr().out
    # --cached-only with one more point: shows the two cached, runs nothing, writes no results file
    (tmp_path / "balanceroute.parquet").unlink()
    assert main([*argv[:6], "context_scale=1,4,16", *argv[7:], "--cached-only"]) == 0
    assert "3 points: 2 cached, 1 not yet computed" in capsys.readouterr().out
    assert not (tmp_path / "balanceroute.parquet").exists()


@pytest.mark.slow
def test_eldr_suite_adapter_runs_a_small_point(tmp_path):
    from moelab.bench.suites import run_named_suite as run_suite

    res = run_suite("eldr", {"rate": [60.0], "K": [4], "router": ["jsq", "eldr"], "n_trace": [128], "n_pairs": [500],
                             "n_requests": [150], "output_len": [64]}, out=tmp_path, backend="serial", progress=False)
    df = res.frame
    assert df["router"].tolist() == ["jsq", "eldr"] and (df["n_workers"] == 4).all()
    assert (df["sim_rate"] == 60.0 * 4 / 16).all()  # hold_load: per-worker load of the 16-worker cluster
    assert df["tpot_ms_p50"].gt(0).all() and df["distinct_per_layer_step"].gt(0).all()


@pytest.mark.slow
def test_hd_suite_adapter_runs_one_question(tmp_path):
    pytest.importorskip("torch")
    from moelab.bench.suites import _hd_questions
    from moelab.bench.suites import run_named_suite as run_suite
    from moelab.hd.experiments import HF_METHODS
    from moelab.hd.policy import BUDGETS

    qs = _hd_questions()
    qid = int(qs.loc[qs["prompt"].str.len().idxmin(), "question_id"])  # the shortest prompt: a short prefill
    res = run_suite("hd", {"question_id": [qid], "max_new_tokens": [3]}, out=tmp_path, backend="serial", progress=False)
    df = res.frame
    # the equal-budget experiment of `moelab bench hd`: AR + every method at every budget
    assert len(df) == 1 + len(HF_METHODS) * len(BUDGETS) and (df["question_id"] == qid).all()
    assert df.loc[df["method"] == "AR", "mean_accepted"].iloc[0] == pytest.approx(1.0)
    assert df.loc[df["method"] == "HD-cost@8", "identical"].iloc[0]  # lossless: the measured cost-aware run equals AR
    with pytest.raises(ValueError, match="evaluation id"):
        run_suite("hd", {"question_id": [-1]}, out=tmp_path, backend="serial", progress=False)


def test_cli_eldr_sweeps_a_real_trace_file(tmp_path, capsys):
    """``moelab sweep eldr --trace FILE``: a real expert trace, rates in ELDR's unit (req/s at 16 workers)."""
    trace = Path(__file__).resolve().parents[1] / "data" / "traces" / "tiny-moe-heldout.npz"
    argv = ["sweep", "eldr", "--trace", str(trace), "--backend", "serial", "--grid", "rate=60", "K=4",
            "router=jsq,eldr", "n_requests=120", "output_len=16", "n_pairs=300", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    assert "2 points: 2 computed" in capsys.readouterr().out
    df = pd.read_parquet(tmp_path / "eldr-trace.parquet")
    assert df["router"].tolist() == ["jsq", "eldr"] and (df["n_workers"] == 4).all()
    assert (df["sim_rate"] == 60.0 * 4 / 16).all() and df["tpot_ms_p50"].gt(0).all()
    assert main(argv) == 0 and "0 computed, 2 from the cache" in capsys.readouterr().out
    # a bundled trace by name (what a wheel user has): the same file, so the same points, from the cache
    by_name = [a if a != str(trace) else "tiny-moe-heldout" for a in argv]
    assert main(by_name) == 0 and "0 computed, 2 from the cache" in capsys.readouterr().out
    assert main([a if a != str(trace) else "tiny-moe-heldout.npz" for a in argv]) == 0
    capsys.readouterr()
    for neither in (str(tmp_path / "none.npz"), "no-such-trace"):
        assert main(["sweep", "eldr", "--trace", neither, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --trace must be an ExpertTrace file (.npz) or the name of a bundled trace")
        assert "tiny-moe-heldout" in err and f"{neither!r} is neither" in err
    assert main(["sweep", "balanceroute", "--trace", str(trace), "--out", str(tmp_path)]) == 2
    assert "for the eldr suite only" in capsys.readouterr().err


def test_cli_help_lists_the_trace_suite_and_how_to_pick_its_rate(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    out = capsys.readouterr().out
    block = out[out.index("  eldr-trace"):]
    names = re.findall(r"(?:^|\s)(\w+)=", block[:block.index("like: the registry")].replace("load=...", ""))
    assert names == ["rate", "K", "tau", "router", "n_requests", "output_len", "n_pairs", "like", "seed"]
    assert "(or load=...)" in block
    assert "no slots" in block  # the synthetic suite's slots-free parameters are not the trace suite's
    assert "rate_for_load" in out and "--grid load=" in out
    assert "moelab sweep eldr --trace tiny-moe-heldout --grid load=" in out


def test_cli_trace_sweep_takes_a_load_and_prints_rates_readably(tmp_path, capsys):
    """``--grid load=...`` on a trace: the rate rate_for_load gives (on the trace's own setup), printed without
    an exponent, and a load column beside it."""
    from moelab.bench.sweep_cli import _fmt, trace_rates_for_load
    from moelab.eldr import experiments as ex
    from moelab.traces import bundled_trace_path, load_trace

    argv = ["sweep", "eldr", "--trace", "tiny-moe-heldout", "--backend", "serial", "--grid", "load=0.5", "K=4",
            "router=jsq", "n_requests=100", "output_len=16", "n_pairs=300", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    tr = load_trace(bundled_trace_path("tiny-moe-heldout"))
    want = ex.rate_for_load(ex.prepare(tr, ex.projection_cost(tr), 4, n_pairs=300), 0.5, output_len=16)
    assert trace_rates_for_load("tiny-moe-heldout", [0.5], K=4, output_len=16, n_pairs=300) == [pytest.approx(want)]
    df = pd.read_parquet(tmp_path / "eldr-trace.parquet")
    assert df["rate"].tolist() == [pytest.approx(want)] and df["load"].tolist() == [0.5]
    assert want > 10_000 and f"{want:,.0f}" in out and "e+0" not in out
    assert f"0.5 -> {want:,.0f}" in out
    assert _fmt(22_229.4) == "22,229" and _fmt(0.7639) == "0.7639" and _fmt(60.0) == "60"
    for bad, match in ((["load=0.5", "rate=60"], "load=... or rate=..., not both"),
                       (["load=9"], r"load must be .*4"),
                       (["load=0.5", "output_len=16,32"], r"needs one value of \['output_len'\]")):
        assert main(["sweep", "eldr", "--trace", "tiny-moe-heldout", "--grid", *bad, "--out", str(tmp_path)]) == 2
        assert re.search(match, capsys.readouterr().err)
    assert main(["sweep", "eldr", "--grid", "load=0.5", "--out", str(tmp_path)]) == 2
    assert "is for eldr --trace" in capsys.readouterr().err


def test_local_backend_runs_from_a_plain_script(tmp_path):
    """A point function defined in a script without an ``if __name__ == "__main__":`` guard (the spawn
    rule is handled for the caller: such a function's workers are forked)."""
    import subprocess

    script = tmp_path / "plain.py"
    script.write_text(
        "from moelab.sweep import run_sweep\n\n"
        "def square(x):\n    return {'y': x * x}\n\n"
        f"res = run_sweep(square, {{'x': [1, 2, 3]}}, backend='local', workers=2, cache_dir={str(tmp_path / 'c')!r},"
        " progress=False)\n"
        "print(sorted(res.frame['y'].tolist()))\n")
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("[1, 4, 9]")


def test_start_method_spawns_importable_functions_and_forks_script_ones():
    from moelab.sweep.backends import start_method

    assert start_method(poly) == "spawn"

    def f(x):
        return {"x": x}

    f.__module__ = "__main__"
    assert start_method(f) == "fork"


def test_eldr_rate_has_one_meaning_req_s_at_16_workers():
    """A real-trace report offers K workers rate * K / 16, as the synthetic sweeps and the CLI do."""
    from moelab.eldr import experiments as ex
    from moelab.traces import load_trace

    assert ex.paper_rate_scale(4) == 0.25 and ex.PAPER_DECODE_WORKERS == 16
    trace = load_trace(Path(__file__).resolve().parents[1] / "data" / "traces" / "tiny-moe-heldout.npz")
    stats, df = ex.real_trace_report(trace, n_workers=4, rates=[60.0], n_requests=60, output_len=8, n_pairs=300,
                                     routers=("jsq",))
    assert stats["rate_scale"] == 0.25 and df["rate"].tolist() == [60.0] and df["sim_rate"].tolist() == [15.0]
    # rate_sweep / run_one take the same unit, K from the setup: no scale factor to forget
    setup = ex.prepare(trace, ex.projection_cost(trace), 4, n_pairs=300)
    sweep = ex.rate_sweep(setup, rates=[60.0], routers=("jsq",), n_requests=60, output_len=8)
    assert sweep["rate"].tolist() == [60.0] and sweep["sim_rate"].tolist() == [15.0]
    assert sweep["tpot_ms_p50"].tolist() == df["tpot_ms_p50"].tolist()  # the same run as the report's
    with pytest.raises(TypeError, match="rate_scale"):
        ex.run_one(setup, "jsq", rate=60.0, rate_scale=0.25)
    # the one function that takes the cluster's own req/s names it so
    from moelab.eldr import poisson_requests

    reqs = poisson_requests(setup.pool, sim_rate=15.0, n_requests=2000, output_len=8)
    assert 13.5 < (len(reqs) - 1) / reqs.arrival_s[-1] < 16.5
    with pytest.raises(TypeError, match="rate"):
        poisson_requests(setup.pool, rate=15.0, n_requests=10)
    # rate_for_load: ELDR's unit, linear in the load, and the same per-worker load at every K
    r1, r2 = ex.rate_for_load(setup, 0.25, output_len=8), ex.rate_for_load(setup, 0.5, output_len=8)
    assert r2 == pytest.approx(2 * r1)
    assert ex.rate_for_load(ex.with_workers(setup, 8), 0.5, output_len=8) == pytest.approx(r2)
    for bad in (0.0, 5.0):
        with pytest.raises(ValueError, match=r"load must be"):
            ex.rate_for_load(setup, bad)


def test_cli_help_shows_suite_defaults_and_explains_like(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    out = capsys.readouterr().out
    assert "rate=20,40,60,80,100" in out and "K=16" in out and "n_requests=2000" in out and "output_len=512" in out
    assert "tau=0.1" in out and "output_len=128" in out and "like=qwen3-30b-a3b" in out
    assert "like: the registry MoE model whose expert, attention and head sizes price" in out
    assert "--router-module MODULE" in out


def test_cli_refused_grid_leaves_no_new_output_folder(tmp_path, capsys):
    out = tmp_path / "new"
    for bad in (["tau=-1"], ["router=no_such_router"]):
        assert main(["sweep", "eldr", "--grid", *bad, "--out", str(out), "--no-progress"]) == 2
        assert "error: " in capsys.readouterr().err and not out.exists()
    assert main(["sweep", "eldr", "--workers", "0", "--out", str(out)]) == 2
    assert "--workers" in capsys.readouterr().err and not out.exists()


def test_cli_router_module_registers_a_router_the_grid_names(tmp_path, monkeypatch, capsys):
    """``moelab sweep eldr --router-module mymod --grid router=myname``, as serve-router's flag; local workers
    import it too (through the environment); Ray is refused with it."""
    import os

    from moelab.bench.suites import ROUTER_MODULES_ENV
    from moelab.routing import ROUTERS

    (tmp_path / "my_sweep_routers_for_test.py").write_text(
        "from moelab.routing import ROUTERS, register_router\n"
        "from moelab.routing.baselines import JoinShortestQueue\n"
        "class Mine(JoinShortestQueue):\n"
        "    name = 'test_sweep_module_router'\n"
        "if Mine.name not in ROUTERS:\n"
        "    register_router(Mine)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # spawned local workers find it as a user's PYTHONPATH=. would
    base = ["sweep", "eldr", "--trace", "tiny-moe-heldout", "--router-module", "my_sweep_routers_for_test", "--grid",
            "load=0.5", "K=4", "router=test_sweep_module_router", "n_requests=60", "output_len=8", "n_pairs=300",
            "--no-progress"]
    try:
        assert main([*base, "--backend", "local", "--workers", "1", "--out", str(tmp_path / "o")]) == 0, \
            capsys.readouterr().err
        out = capsys.readouterr().out
        assert "test_sweep_module_router" in out or "1 computed" in out
        assert ROUTER_MODULES_ENV not in os.environ  # restored
        assert main([*base, "--backend", "ray", "--out", str(tmp_path / "r")]) == 2
        assert "--backend serial or local" in capsys.readouterr().err and not (tmp_path / "r").exists()
    finally:
        ROUTERS.pop("test_sweep_module_router", None)
    bad = ["sweep", "eldr", "--router-module", "no_such_module_xyz", "--out", str(tmp_path / "b")]
    assert main(bad) == 2
    assert "--router-module 'no_such_module_xyz' cannot be imported" in capsys.readouterr().err
    assert main(["sweep", "balanceroute", "--router-module", "my_sweep_routers_for_test", "--out",
                 str(tmp_path / "c")]) == 2
    assert "for the eldr suites" in capsys.readouterr().err
    ROUTERS.pop("test_sweep_module_router", None)


def test_cache_key_covers_the_function_module_file_not_the_code_it_calls(tmp_path):
    """What ``help(run_sweep)`` and the guide say the key covers (issue 38): by default the whole file of
    the function's module (a comment edit recomputes every point), not the modules it calls; a
    ``code=code_version(...)`` naming them covers those too."""
    import subprocess

    (tmp_path / "helper.py").write_text("def value(x):\n    return x + 1\n")
    script = tmp_path / "run.py"
    body = ("import os\nimport helper\nfrom moelab.sweep import code_version, run_sweep\n\n"
            "def f(x):\n    return {'y': helper.value(x)}\n\n"
            "code = code_version('__main__', 'helper') if os.environ.get('COVER') else None\n"
            f"res = run_sweep(f, {{'x': [1, 2]}}, backend='serial', cache_dir={str(tmp_path / 'c')!r}, code=code,"
            " progress=False)\n"
            "print(res.computed, res.frame['y'].tolist())\n")

    def run(cover: bool = False) -> str:
        env = {**os.environ, "COVER": "1" if cover else ""}
        out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip().splitlines()[-1]

    script.write_text(body)
    assert run() == "2 [2, 3]"
    assert run() == "0 [2, 3]"
    script.write_text("# an unrelated comment\n" + body)
    assert run() == "2 [2, 3]"  # any edit of the script's file is a new code version
    (tmp_path / "helper.py").write_text("def value(x):\n    return x + 10\n")
    assert run() == "0 [2, 3]"  # the helper module is not in the default key: stale rows
    assert run(cover=True) == "2 [11, 12]"  # code_version naming it covers it
