"""Building HD's shared stores S and L (``moelab build-hd-stores``).

* **S** (model-dependent, the paper's construction): the target's own greedy outputs on ShareGPT prompts
  that are disjoint from Spec-Bench, batched through vLLM when it is installed (HF transformers
  otherwise); the top-100k 5-grams (and 6-grams), counted once per output. Generation is resumable: each
  chunk of outputs is cached atomically, a rerun skips what is done.
* **L** (statistics-dependent, REST's construction): an exact suffix index
  (:class:`moelab.hd.suffix.SuffixStore`) over ShareGPT conversations tokenized by the target's tokenizer.

ShareGPT is split by conversation index: L takes conversations from the front of the file, S's prompts
come from the back, so no conversation feeds both; S's prompts that repeat a Spec-Bench question (exact
text or a 64-character overlap) are refused.

This module also holds the older builders (S from the Spec-Bench store split, L as an n-gram table over the
offline corpus) so that :mod:`moelab.hd.stores` needs neither decoding nor models (no import cycle).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from moelab._io import atomic_save_npz, load_npz
from moelab._outputs import check_output_file, record_output_file
from moelab._validate import check_choice, check_int
from moelab.datasets import cache_dir, load_spec_bench
from moelab.hd.decode import generate
from moelab.hd.ngram import NGramTable
from moelab.hd.stores import default_model_store_path, load_default_statistics_store, store_meta
from moelab.hd.suffix import L_MAX_TOKENS, S_RESERVED_TAIL, sharegpt_suffix_store_path
from moelab.models.corpus import sharegpt_conversations
from moelab.models.lm import DEFAULT_LM, chat_prompt_ids, greedy_generate_batch, lm_folder, load_lm
from moelab.models.vllm_engine import generate as vllm_generate
from moelab.models.vllm_engine import make_engine

S_PROMPTS = 1000
S_MAX_NEW_TOKENS = 128
S_MAX_PROMPT_TOKENS = 384
S_MAX_NGRAMS = 100_000
_OVERLAP_CHARS = 64


# ------------------------------------------------------------------------------------------ ShareGPT split
def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _spec_bench_texts() -> list[str]:
    df = load_spec_bench()
    out = []
    for turns in df["turns"]:
        for t in (turns if isinstance(turns, (list, tuple, np.ndarray)) else [turns]):
            out.append(_norm(str(t)))
    return out


def _overlaps(text: str, bench: set[str], short: list[str], bench_grams: set[str]) -> bool:
    """Exact match, a short Spec-Bench turn contained in ``text``, or any shared 64-character stretch."""
    t = _norm(text)
    if t in bench or any(b in t for b in short):
        return True
    w = _OVERLAP_CHARS
    return any(t[i:i + w] in bench_grams for i in range(0, max(1, len(t) - w + 1)))


def sharegpt_s_prompts(tokenizer: Any, *, n: int = S_PROMPTS, max_prompt_tokens: int = S_MAX_PROMPT_TOKENS,
                       conversations: list | None = None) -> tuple[list[list[int]], dict[str, Any]]:
    """Chat-template prompt ids for S: first human turns of the last ShareGPT conversations.

    Walks the conversations from the end of the file towards the front (at most :data:`S_RESERVED_TAIL`
    of them, the part L never reads) and keeps a first turn when it is non-empty, new (exact duplicates
    are skipped), at most ``max_prompt_tokens`` long in the chat template, and shares no 64-character
    stretch with any Spec-Bench turn. Returns the ids and provenance (conversation indices, counts of
    what was skipped and why); fewer than ``n`` prompts is reported, not padded.
    """
    check_int("n", n, low=1, high=S_RESERVED_TAIL)
    check_int("max_prompt_tokens", max_prompt_tokens, low=8, high=4096)
    prov: dict[str, Any] = {}
    if conversations is None:
        conversations, prov = sharegpt_conversations()
    texts = _spec_bench_texts()
    bench = set(texts)
    short = [b for b in texts if 0 < len(b) < _OVERLAP_CHARS]
    grams = {b[i:i + _OVERLAP_CHARS] for b in texts if len(b) >= _OVERLAP_CHARS
             for i in range(len(b) - _OVERLAP_CHARS + 1)}
    total = len(conversations)
    lo = max(0, total - S_RESERVED_TAIL)
    ids: list[list[int]] = []
    used: list[int] = []
    seen: set[str] = set()
    skipped = {"no_human_first_turn": 0, "duplicate": 0, "too_long": 0, "spec_bench_overlap": 0}
    for ci in range(total - 1, lo - 1, -1):
        conv = conversations[ci]
        if not conv or conv[0][0] != "human" or not conv[0][1].strip():
            skipped["no_human_first_turn"] += 1
            continue
        text = conv[0][1]
        key = _norm(text)
        if key in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(key)
        if len(text) > 8 * max_prompt_tokens:  # cheap pre-filter; the token count decides below
            skipped["too_long"] += 1
            continue
        p = chat_prompt_ids(tokenizer, text)
        if len(p) > max_prompt_tokens:
            skipped["too_long"] += 1
            continue
        if _overlaps(text, bench, short, grams):
            skipped["spec_bench_overlap"] += 1
            continue
        ids.append(p)
        used.append(ci)
        if len(ids) >= n:
            break
    info = {"sharegpt": prov, "conversations_total": total, "s_conversation_range": [lo, total],
            "prompts": len(ids), "prompts_requested": n, "max_prompt_tokens": max_prompt_tokens,
            "skipped": skipped, "conversation_indices_min": min(used) if used else None,
            "spec_bench_disjoint": f"no exact match and no shared {_OVERLAP_CHARS}-character stretch with any "
                                   "Spec-Bench turn"}
    return ids, info


# ------------------------------------------------------------------------------------------ S generation
def _gen_cache_dir(key: str) -> Path:
    return cache_dir() / "hd" / f"s-outputs-{key}"


def _prompt_key(prompts: Sequence[Sequence[int]], extra: Any) -> str:
    h = hashlib.sha256(json.dumps(extra, sort_keys=True).encode())
    for p in prompts:
        h.update(np.asarray(p, dtype=np.int32).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16]


def _save_chunk(path: Path, outs: list[list[int]]) -> None:
    lens = np.array([len(o) for o in outs], dtype=np.int64)
    flat = np.concatenate([np.asarray(o, dtype=np.int32) for o in outs]) if outs else np.zeros(0, np.int32)
    atomic_save_npz(path, lengths=lens, tokens=flat)


def _load_chunk(path: Path, expect: int) -> list[list[int]] | None:
    try:
        z = load_npz(path)
        lens, flat = z["lengths"], z["tokens"]
    except (ValueError, KeyError):
        return None  # a damaged chunk is regenerated, never trusted
    if lens.shape != (expect,) or int(lens.sum()) != flat.size:
        return None
    return [a.tolist() for a in np.split(flat, np.cumsum(lens)[:-1])]


def target_outputs_vllm(model_dir: str | Path, prompts: Sequence[Sequence[int]], *,
                        max_new_tokens: int = S_MAX_NEW_TOKENS, chunk: int = 64, max_num_seqs: int = 32,
                        kv_cache_gib: int = 2, cached_only: bool = False, progress: bool = True,
                        label: str = "S outputs") -> tuple[list[list[int]], dict[str, Any]]:
    """Greedy outputs of the model in ``model_dir`` for chat ``prompts`` (token ids), batched through vLLM.

    Float32, continuous batching of ``max_num_seqs`` sequences; outputs are cut after EOS. Results are
    cached per chunk of ``chunk`` prompts (atomic ``.npz``), so an interrupted build resumes where it stopped.
    ``cached_only`` returns only the chunks already generated (in order, stopping at the first missing one)
    without starting an engine: S from a partial run, its prompt count reported as it is. ``label`` names the
    outputs in the progress lines.
    """
    check_int("max_new_tokens", max_new_tokens, low=1, high=4096)
    check_int("chunk", chunk, low=1)
    if not prompts:
        raise ValueError("prompts must not be empty")
    key = _prompt_key(prompts, {"model": str(model_dir), "max_new_tokens": max_new_tokens, "engine": "vllm"})
    folder = _gen_cache_dir(key)
    out: list[list[int]] = []
    engine = None
    t0 = time.perf_counter()
    gen_tokens, cached = 0, 0
    for ci, start in enumerate(range(0, len(prompts), chunk)):
        part = [list(p) for p in prompts[start:start + chunk]]
        path = folder / f"chunk-{ci:05d}.npz"
        got = _load_chunk(path, len(part)) if path.is_file() else None
        if got is None and cached_only:
            break
        if got is None:
            if engine is None:
                engine = make_engine(model_dir, max_model_len=max(1024, max(len(p) for p in prompts) + max_new_tokens),
                                     max_num_seqs=max_num_seqs, kv_cache_gib=kv_cache_gib)
            gens = vllm_generate(engine, part, max_new_tokens, progress=False)
            got = [list(g.output_ids) for g in gens]
            _save_chunk(path, got)
            gen_tokens += sum(len(g) for g in got)
        else:
            cached += len(part)
        out.extend(got)
        if progress:
            el = time.perf_counter() - t0
            print(f"{label}: {len(out)}/{len(prompts)} prompts ({cached} cached), {gen_tokens} new tokens in "
                  f"{el:.0f} s ({gen_tokens / max(el, 1e-9):.1f} tok/s)", file=sys.stderr, flush=True)
    info = {"engine": "vllm", "dtype": "float32", "max_new_tokens": max_new_tokens, "cache": str(folder),
            "prompts_done": len(out), "prompts_requested": len(prompts), "cached_only": cached_only,
            "generated_tokens_this_run": gen_tokens, "seconds_this_run": time.perf_counter() - t0}
    return out, info


def target_greedy_outputs(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int = 80,
                          batch_size: int | None = None, progress: bool = False) -> list[list[int]]:
    """The target's greedy continuations of chat ``prompts`` with HF transformers (token ids, cut after EOS).

    ``batch_size=None`` decodes one prompt at a time with exact greedy decoding (what a CPU does best: no
    padding of long prompts); an int uses left-padded batches through ``transformers.generate`` (GPUs).
    """
    if not prompts:
        raise ValueError("prompts must not be empty")
    check_int("max_new_tokens", max_new_tokens, low=1)
    if batch_size is not None:
        return greedy_generate_batch(model, tokenizer, list(prompts), max_new_tokens=max_new_tokens,
                                     batch_size=batch_size, progress=progress)
    it: Iterable[str] = prompts
    if progress:
        it = tqdm(prompts, desc="target greedy outputs")
    return [generate(model, chat_prompt_ids(tokenizer, p), None, max_new_tokens=max_new_tokens,
                     eos_token_id=tokenizer.eos_token_id).tokens for p in it]


def model_store_from_outputs(outputs: Sequence[Sequence[int]], tokenizer: Any, *, key_lengths: Sequence[int] = (1, 2),
                             length: int = 4, per_key: int = 7, max_ngrams: int = S_MAX_NGRAMS, min_count: int = 1,
                             per_document: bool = True, source: str = "",
                             extra_meta: dict[str, Any] | None = None) -> NGramTable:
    """S from the target's outputs: the ``max_ngrams`` most frequent (key + continuation) n-grams per key
    length, each counted once per output (``per_document``)."""
    if not outputs:
        raise ValueError("outputs must not be empty")
    meta = store_meta("model", tokenizer, source or f"{len(outputs)} target outputs",
                      {"output_tokens": int(sum(len(o) for o in outputs)), "outputs": len(outputs),
                       **(extra_meta or {})})
    return NGramTable.build(outputs, key_lengths=key_lengths, length=length, per_key=per_key, min_count=min_count,
                            max_ngrams=max_ngrams, per_document=per_document, meta=meta)


def build_model_store(model: Any, tokenizer: Any, prompts: Sequence[str], *, max_new_tokens: int = 80,
                      batch_size: int | None = None, source: str = "", progress: bool = False,
                      **table_kw: Any) -> NGramTable:
    """S from HF greedy outputs on ``prompts`` (must be disjoint from the evaluation)."""
    outputs = target_greedy_outputs(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                    progress=progress)
    return model_store_from_outputs(outputs, tokenizer, source=source or f"{len(prompts)} prompts", extra_meta={
        "model": getattr(model.config, "_name_or_path", ""), "max_new_tokens": max_new_tokens}, **table_kw)


def build_statistics_store(texts: Iterable[str], tokenizer: Any, *, key_lengths: Sequence[int] = (1, 2),
                           length: int = 4, per_key: int = 7, min_count: int = 2, source: str = "",
                           batch: int = 256) -> NGramTable:
    """An n-gram-table L over any iterable of documents (the older, non-REST construction; tests, other corpora)."""
    seqs: list[list[int]] = []
    buf: list[str] = []
    n_docs = 0

    def flush() -> None:
        if buf:
            seqs.extend(tokenizer(buf, add_special_tokens=False)["input_ids"])
            buf.clear()

    for text in texts:
        if not isinstance(text, str):
            raise ValueError(f"texts must yield strings; got {type(text).__name__}")
        if text.strip():
            buf.append(text)
            n_docs += 1
        if len(buf) >= batch:
            flush()
    flush()
    if not n_docs:
        raise ValueError("texts must contain at least one non-empty document")
    meta = store_meta("statistics", tokenizer, source or f"{n_docs} documents", {"documents": n_docs})
    return NGramTable.build(seqs, key_lengths=key_lengths, length=length, per_key=per_key, min_count=min_count,
                            meta=meta)


# ------------------------------------------------------------------------------------------ CLI
#: the writer's name in the output marker (``.moelab-output.json``)
WRITER = "build-hd-stores"


def build_s_store(*, model: str | None = None, prompts: int = S_PROMPTS, max_new_tokens: int = S_MAX_NEW_TOKENS,
                  out: str | Path | None = None, engine: str = "vllm", cached_only: bool = False,
                  progress: bool = True) -> Path:
    """Generate the target's outputs on ShareGPT prompts and write S (default: ``data/hd/<lm>.S.npz``).

    The output file follows moelab's output policy (``.moelab-output.json``), checked before any generation:
    it must be new, or an S store this command wrote and nobody changed since."""
    check_choice("engine", engine, ("vllm", "hf"))
    path = check_output_file(Path(out) if out else default_model_store_path(), writer=WRITER, name="--out")
    name = model or DEFAULT_LM
    folder = lm_folder(name)
    from transformers import AutoTokenizer  # lazy: transformers pulls in torch

    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.moelab_name = name
    ids, info = sharegpt_s_prompts(tok, n=prompts)
    if not ids:
        raise ValueError("no ShareGPT prompt passed the filters; nothing to build S from")
    t0 = time.perf_counter()
    if engine == "vllm":
        outputs, gen = target_outputs_vllm(folder, ids, max_new_tokens=max_new_tokens, cached_only=cached_only,
                                           progress=progress)
        if not outputs:
            raise ValueError("no generated S outputs are cached yet; run without --cached-only first")
        info = {**info, "prompts_used": len(outputs)}
    else:
        m, tok = load_lm(name)
        outputs = [generate(m, p, None, max_new_tokens=max_new_tokens, eos_token_id=tok.eos_token_id).tokens
                   for p in ids]
        gen = {"engine": "hf", "dtype": "float32", "max_new_tokens": max_new_tokens}
    table = model_store_from_outputs(
        outputs, tok, source=f"target greedy outputs on {len(outputs)} ShareGPT first turns disjoint from Spec-Bench",
        extra_meta={"model": name, "generation": gen, "prompts": info, "generation_s": time.perf_counter() - t0})
    table.save(path)
    record_output_file(path, WRITER)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``moelab build-hd-stores``: build S (target outputs on ShareGPT) and/or L (ShareGPT suffix index)."""
    ap = argparse.ArgumentParser(prog="moelab build-hd-stores", description=main.__doc__)
    ap.add_argument("--stores", default="SL", help="which stores to build: S, L or SL (default SL)")
    ap.add_argument("--model", default=None, help="target LM (default: smollm2-135m-instruct)")
    ap.add_argument("--prompts", type=int, default=S_PROMPTS, help=f"ShareGPT prompts for S (default {S_PROMPTS})")
    ap.add_argument("--max-new-tokens", type=int, default=S_MAX_NEW_TOKENS, help="tokens per S output")
    ap.add_argument("--engine", default="vllm", help="engine for S's outputs: vllm (default) or hf")
    ap.add_argument("--out", default=None, help="S output file (default data/hd/<model>.S.npz)")
    ap.add_argument("--cached-only", action="store_true",
                    help="build S from the outputs generated so far (a partial run), without generating more")
    ap.add_argument("--l-max-tokens", type=int, default=L_MAX_TOKENS, help="ShareGPT tokens indexed by L")
    args = ap.parse_args(argv)
    try:
        stores = args.stores.upper()
        if not stores or set(stores) - set("SL"):
            raise ValueError(f"--stores must be S, L or SL; got {args.stores!r}")
        check_int("--prompts", args.prompts, low=1, high=S_RESERVED_TAIL)
        check_int("--max-new-tokens", args.max_new_tokens, low=1, high=4096)
        check_int("--l-max-tokens", args.l_max_tokens, low=1000)
        check_choice("--engine", args.engine, ("vllm", "hf"))
        if "L" in stores:
            from transformers import AutoTokenizer  # lazy: transformers pulls in torch

            tok = AutoTokenizer.from_pretrained(str(lm_folder(args.model or DEFAULT_LM)))
            tok.moelab_name = args.model or DEFAULT_LM
            t0 = time.perf_counter()
            store = load_default_statistics_store(tok, max_tokens=args.l_max_tokens, rebuild=True)
            print(f"L: {store.n_tokens} tokens, {store.nbytes / 2**20:.1f} MiB, built in {time.perf_counter() - t0:.0f} s "
                  f"-> {sharegpt_suffix_store_path(tok, args.l_max_tokens)}")
        if "S" in stores:
            path = build_s_store(model=args.model, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                                 out=args.out, engine=args.engine, cached_only=args.cached_only)
            meta = NGramTable.load(path).meta
            print(f"S: {meta['outputs']} outputs, {meta['output_tokens']} tokens, of {meta['prompts']['prompts']} prompts "
                  f"-> {path}")
    except (ValueError, FileNotFoundError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


__all__ = ["S_MAX_NEW_TOKENS", "S_PROMPTS", "build_model_store", "build_s_store", "build_statistics_store", "main",
           "model_store_from_outputs", "sharegpt_s_prompts", "target_greedy_outputs", "target_outputs_vllm"]
