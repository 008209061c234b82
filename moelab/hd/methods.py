"""The drafting methods by name: ONE table for both engines.

Each :class:`Method` says how it drafts in HF transformers (:func:`make_hf_drafter`, tree verification)
and in vLLM (:func:`vllm_speculative_config`: vLLM's own speculator, or HD's ``custom_class`` proposer
with the row drafter :func:`moelab.hd.engine.make_row_drafters` builds). A method name means the same
store walk in both engines, at an equal verification budget (draft tokens per forward).

``name``    the method's name in code and on the command line (``"hd"``, ``"hd_fixed"``, ...)
``label``   its label in result tables and cached results (``"HD-cost"``, ``"HD-fixed"``, ...): stable, like
            the bench's metric names, because committed tables and hours of cached vLLM runs carry it. No
            label is plain ``"HD"``: that name belongs to the paper's method, which is ``"HD-fixed"`` here
``display`` how figures and notes name it

``"hd"`` is the project's cost-aware drafter (the default); ``"hd_fixed"`` is the paper's method, the fixed
hierarchy tree (``budget // 4`` candidates of 4 tokens; 28 = the paper's 7x4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moelab._validate import check_instance, check_int
from moelab.costmodel.verify import VerifyCost
from moelab.hd.drafters import (
    COST_AWARE_CONTEXT_KEYS,
    CostAwareDrafter,
    Drafter,
    HierarchyDrafter,
    NoDrafter,
    PLDDrafter,
)
from moelab.hd.policy import COST_AWARE_LABEL, EngineAcceptance, check_budget
from moelab.hd.vllm_adapter import adapter_config, speculative_config


@dataclass(frozen=True)
class Method:
    """One drafting method (see the module docstring for the three names).

    ``hf``: whether HF transformers runs it (:func:`make_hf_drafter`); ``vllm_native``: vLLM's own
    speculator it maps to; ``vllm_adapter``: HD's ``custom_class`` method it maps to; ``order``: the store
    walk of the hierarchy methods."""

    name: str
    label: str
    display: str
    hf: bool
    vllm_native: str | None = None
    vllm_adapter: str | None = None
    order: str = ""


#: Every drafting method by name (:class:`Method`): which engines run it and how it maps to vLLM.
METHODS: dict[str, Method] = {m.name: m for m in (
    Method("ar", "AR", "AR (no drafting)", hf=True),
    Method("pld", "PLD", "PLD (prompt lookup)", hf=True),
    Method("rest", "REST", "REST (L alone)", hf=True, vllm_adapter="rest", order="L"),
    Method("ngram", "ngram", "vLLM ngram (prompt lookup)", hf=False, vllm_native="ngram"),
    Method("suffix", "suffix", "vLLM suffix decoding", hf=False, vllm_native="suffix"),
    Method("hd_fixed", "HD-fixed", "HD (paper, fixed)", hf=True, vllm_adapter="hd-fixed", order="WSL"),
    Method("hd", COST_AWARE_LABEL, "HD (cost-aware)", hf=True, vllm_adapter="hd", order="WSL"),
)}
DEFAULT_METHOD = "hd"
_BY_LABEL = {m.label: m for m in METHODS.values()}


def get_method(method: str) -> Method:
    """The :class:`Method` of a name (``"hd"``) or of its result label (``"HD-cost"``, as result tables carry it)."""
    m = (METHODS.get(method) or _BY_LABEL.get(method)) if isinstance(method, str) else None  # unhashables, named
    if m is None:
        raise ValueError(f"method must be one of {list(METHODS)} (or their result labels {list(_BY_LABEL)}); "
                         f"got {method!r}")
    return m


def vllm_methods() -> tuple[str, ...]:
    """Result labels of the methods vLLM runs (AR, its own speculators and HD's proposer)."""
    return tuple(m.label for m in METHODS.values() if m.name == "ar" or m.vllm_native or m.vllm_adapter)


def make_hf_drafter(method: str, S: Any, L: Any, *, budget: int = 8, cost: VerifyCost | None = None,
                    engine: EngineAcceptance | None = None, seed: int = 0) -> Drafter:
    """A drafter for one request in the HF engine at an equal verification ``budget`` (draft tokens per forward).

    ``method``: a name or result label of :data:`METHODS` that HF runs: ``"hd"`` = cost-aware HD (needs
    ``cost``; its acceptance model starts from ``engine``'s prior when given, else from the cold-start prior;
    ``seed`` seeds its exploration), ``"hd_fixed"`` = the hierarchy's tree with ``budget // 4`` candidates of 4 tokens (28 = the
    paper's 7x4), ``"pld"`` = a chain of ``budget`` tokens, ``"rest"`` = L alone (as hd_fixed), ``"ar"`` =
    nothing."""
    if cost is not None:
        check_instance("cost", cost, VerifyCost, "a VerifyCost or None (e.g. moelab.costmodel.fit_verify_cost(qs, ms))")
    m = get_method(method)
    budget = check_budget(budget)
    if not m.hf:
        raise ValueError(f"method must be one HF runs ({[x.name for x in METHODS.values() if x.hf]}); "
                         f"{m.name!r} is vLLM's own speculator")
    if m.name == "ar":
        return NoDrafter()
    if m.name == "pld":
        return PLDDrafter(num_pred_tokens=budget)
    length = min(4, budget)
    n_cand = max(1, budget // length)
    if m.name in ("hd_fixed", "rest"):
        return HierarchyDrafter(S if "S" in m.order else None, L if "L" in m.order else None, order=m.order,
                                max_candidates=n_cand, length=length)
    if cost is None:
        raise ValueError("method 'hd' (cost-aware) needs the measured verify-cost curve `cost`")
    # candidates the plan could keep (one more than the budget fills, so it has a choice); more would
    # only make the walk reach L for candidates that are then cut
    inner = HierarchyDrafter(S, L, order=m.order, max_candidates=min(7, n_cand + 1), length=length,
                             context_key_lengths=COST_AWARE_CONTEXT_KEYS)
    return CostAwareDrafter(inner, cost, budget=budget, seed=seed,
                            acceptance=engine.new_request() if engine is not None else None)


def vllm_speculative_config(method: str, budget: int, *, cost: VerifyCost | None = None,
                            l_max_tokens: int | None = None,
                            timing: bool = False) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """vLLM's ``speculative_config`` of ``method`` at ``budget`` draft tokens per step, and the HD adapter's
    config (None unless the method is HD's ``custom_class`` proposer; the engine's process publishes it
    with :func:`moelab.hd.vllm_adapter.publish_adapter_config` before building the engine). AR: ``(None, None)``.

    ``timing`` asks HD's row drafters to time every proposal (off on the hot path otherwise)."""
    m = get_method(method)
    budget = check_budget(budget)
    if m.name == "ar":
        return None, None
    if m.vllm_native == "ngram":  # vLLM's prompt lookup (PLD): match the last 1..3 tokens
        return {"method": "ngram", "num_speculative_tokens": budget, "prompt_lookup_min": 1,
                "prompt_lookup_max": 3}, None
    if m.vllm_native == "suffix":
        return {"method": "suffix", "num_speculative_tokens": budget, "suffix_decoding_max_tree_depth": budget}, None
    if m.vllm_adapter is None:
        raise ValueError(f"method {m.name!r} has no vLLM drafter; vLLM runs {list(vllm_methods())}")
    opts: dict[str, Any] = {"timing": bool(timing)}
    if l_max_tokens:
        opts["l_max_tokens"] = check_int("l_max_tokens", int(l_max_tokens), low=1)
    if m.name == "hd":
        if cost is None:
            raise ValueError("method 'hd' (cost-aware) needs the measured vLLM verify-cost curve `cost`")
        opts["cost"] = cost.as_dict()
    return speculative_config(budget), adapter_config(m.vllm_adapter, **opts)


__all__ = ["DEFAULT_METHOD", "METHODS", "Method", "get_method", "make_hf_drafter", "vllm_methods",
           "vllm_speculative_config"]
