"""Regenerate the bundled tiny-MoE traces (``data/traces/``) and the model card's locality statistics.

``python -m moelab.make.tiny_moe_trace [--n-per-domain 100] [--max-new-tokens 64]``: held-out prompts of every
corpus domain -> HF capture of the shipped tiny MoE -> ``data/traces/tiny-moe-heldout.{npz,json}`` ->
:func:`moelab.traces.analysis.locality_stats` -> ``data/traces/README.md`` and
``data/models/tiny-moe/MODEL_CARD.md``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from moelab._io import atomic_write_json, read_json
from moelab.capture import capture
from moelab.datasets import repo_root
from moelab.make import write_readme_section
from moelab.models.corpus import BUILTIN_DOMAINS
from moelab.models.tiny_moe import TINY_MOE_PATH, heldout_prompts, load_tiny_moe, write_model_card
from moelab.traces.analysis import locality_stats

TRACE_NAME = "tiny-moe-heldout"


def main(argv: list[str] | None = None) -> int:
    """Capture the bundled traces and write the card; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m moelab.make.tiny_moe_trace", description=__doc__.splitlines()[0])
    p.add_argument("--n-per-domain", type=int, default=100)
    p.add_argument("--min-len", type=int, default=96)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--k", type=int, default=4, help="top-k of the activation-share statistic")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="trace folder (default data/traces)")
    args = p.parse_args(argv)

    out = Path(args.out) if args.out else repo_root() / "data" / "traces"
    model, tok = load_tiny_moe()
    # held-out prompts of exactly the built-in domains the model was trained on
    training = read_json(TINY_MOE_PATH / "training.json")
    trained = sorted({f["domain"] for f in training["corpus"]["files"]} & set(BUILTIN_DOMAINS))
    prompts, domains = heldout_prompts(tok, args.n_per_domain, min_len=args.min_len, max_len=args.max_len,
                                       domains=trained, seed=args.seed)
    ids = [f"{d}-{i % args.n_per_domain:04d}" for i, d in enumerate(domains)]
    t0 = time.time()
    trace = capture((model, tok), prompts, args.max_new_tokens, domains=domains, request_ids=ids,
                    batch_size=args.batch_size, model_name="moelab-tiny-moe")
    minutes = (time.time() - t0) / 60
    path = trace.save(out / TRACE_NAME)
    stats = locality_stats(trace, k=args.k, seed=args.seed)
    atomic_write_json(out / f"{TRACE_NAME}.stats.json", stats)
    info = {"file": f"data/traces/{path.name}", "n_per_domain": args.n_per_domain, "prompt_len": (args.min_len, args.max_len),
            "max_new_tokens": args.max_new_tokens}
    if out == repo_root() / "data" / "traces":  # the card describes the bundled trace only
        write_model_card(TINY_MOE_PATH, stats, info)
    # only this script's section: the README also describes files other scripts make (notebook 06's capture)
    write_readme_section(out / "README.md", "tiny-moe-trace", f"""`{path.name}` + `{path.with_suffix('.json').name}`: a `moelab.traces.ExpertTrace` (load with
`ExpertTrace.load(moelab.datasets.bundled_path("traces", "{path.name}"))`).

- model: moelab-tiny-moe (`data/models/tiny-moe`, {trace.geometry.num_layers} MoE layers x
  {trace.geometry.num_experts} experts, top-{trace.geometry.top_k}), float32 on CPU, HF router-hook backend,
  self-checked against `output_router_logits` on every token
- requests: {len(trace)} = {args.n_per_domain} per domain x {len(set(domains))} domains
  ({', '.join(sorted(set(domains)))}; `arithmetic` is synthetic), prompts cut from the corpus's held-out split
  (`moelab.models.tiny_moe.heldout_prompts`, seed {args.seed}), {args.min_len}-{args.max_len} tokens each
- decode: {args.max_new_tokens} greedy tokens per request (no stop at EOS); `decode_ids[t]` is the routing
  of the step whose input is `decode_tokens[t]`
- arrays: prompt tokens, prefill counts `[N, L, E]`, per-token prefill top-k ids, summed router
  probabilities, decode top-k ids and tokens; provenance in the JSON sidecar
- captured in {minutes:.1f} min (batch {args.batch_size}); locality statistics in
  `{TRACE_NAME}.stats.json` and the model card

Regenerate: `python -m moelab.make.tiny_moe_trace` (deterministic prompts; same routing up to float near-ties).
""")
    print(f"wrote {path} ({len(trace)} requests) and the model card; MI max {stats['mi_max']:.3f}, "
          f"activation share {stats['activation_share']:.3f} vs {stats['baseline']:.3f}, ARI {stats['ari']:.3f}", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
