"""HD's drafters for a batching engine (vLLM): the stores and the per-row drafters of an adapter config.

The HF engine's drafters come from :func:`moelab.hd.methods.make_hf_drafter`; both follow the one method
table (:data:`moelab.hd.methods.METHODS`), so a method name means the same store walk in both engines.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from moelab._validate import check_instance, check_int
from moelab.costmodel.verify import OnlineVerifyCost, VerifyCost
from moelab.hd.drafters import (
    COST_AWARE_CONTEXT_KEYS,
    CostAwareDrafter,
    Draft,
    Drafter,
    HierarchyDrafter,
    check_order,
)
from moelab.hd.policy import EngineAcceptance, PolicyChoice, check_acceptance, check_budget
from moelab.hd.rows import RowDrafters
from moelab.hd.stores import load_default_model_store, load_default_statistics_store, load_store


@lru_cache(maxsize=4)
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer  # lazy: transformers pulls in torch


    return AutoTokenizer.from_pretrained(path)


def load_stores(tokenizer: Any, *, s_path: str | None = None, l_max_tokens: int | None = None,
                need: str = "SL") -> tuple[Any, Any]:
    """S (n-gram table; the shipped file unless ``s_path``) and L (the ShareGPT suffix index), checked
    against ``tokenizer``; only the letters in ``need`` are loaded (the others are None)."""
    check_instance("tokenizer", tokenizer, None, "a tokenizer (e.g. transformers.AutoTokenizer)", methods=("get_vocab",))
    S = L = None
    if "S" in need:
        S = load_store(s_path, tokenizer, "model") if s_path else load_default_model_store(tokenizer)
    if "L" in need:
        L = load_default_statistics_store(tokenizer, max_tokens=l_max_tokens)
    return S, L


class _Probe(Drafter):
    """A fixed-length chain of one token id that the target almost never picks (measures verify cost)."""

    name = "probe"
    letters = "P"

    def __init__(self, length: int, token: int) -> None:
        super().__init__()
        self.length, self.token = length, token

    def draft(self) -> Draft:
        return Draft([(self.token,) * self.length], ["P" * self.length if self.length > 1 else "P"])


#: The methods a drafter of the user's must have (the protocol of :class:`~moelab.hd.drafters.Drafter`).
DRAFTER_METHODS = ("start", "accept", "draft", "observe")


def drafter_factory(spec: Any) -> Callable[[], Drafter]:
    """The callable named by ``spec`` (``"package.module:name"``, a :class:`~moelab.hd.drafters.Drafter`
    subclass or any function returning a drafter): how a vLLM engine, which passes nothing but its own config to
    the proposer, is told to run a drafter of yours (``adapter_config("custom", drafter="mymod:MyDrafter")``).
    The module is imported in the engine's process, so it must be importable there (installed, or on
    ``PYTHONPATH``).

    A class is checked here for the drafter protocol (callable ``start``, ``accept``, ``draft`` and
    ``observe``: a :class:`~moelab.hd.drafters.Drafter` subclass has them); what a function returns is
    checked when a request first calls it."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"drafter must name a callable as 'package.module:name'; got {spec!r}")
    module, name = spec.split(":")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"drafter {spec!r} cannot be imported: {exc}") from None
    if not callable(obj):
        raise ValueError(f"drafter {spec!r} is not callable (a Drafter subclass or a function returning one)")
    if isinstance(obj, type):
        missing = [m for m in DRAFTER_METHODS if not callable(getattr(obj, m, None))]
        if missing:
            raise ValueError(f"drafter {spec!r} is a class without {', '.join(missing)}: not a drafter (subclass "
                             f"moelab.hd.Drafter, or define {', '.join(DRAFTER_METHODS)})")
    return obj


def _user_drafter(factory: Callable[[], Any]) -> Drafter:
    d = factory()
    return check_instance("drafter", d, None, "a drafter (start, accept, draft, observe)",
                          methods=DRAFTER_METHODS)


def _first_chain(drafter: Any, max_len: int) -> Draft:
    """A drafter's first candidate, cut to ``max_len``: the one chain a row proposes to vLLM."""
    draft = drafter.draft()
    if not isinstance(draft, Draft):
        raise ValueError(f"drafter {getattr(drafter, 'name', type(drafter).__name__)!r} must return a Draft from "
                         f"draft(); got {type(draft).__name__}")
    if not draft.candidates or max_len <= 0:
        return Draft([], [])
    return Draft([tuple(draft.candidates[0][:max_len])], [draft.sources[0] if draft.sources else "?"])


def make_row_drafters(cfg: dict[str, Any], *, tokenizer_path: str, budget: int) -> RowDrafters:
    """Per-row drafters for a batching engine from an adapter config (see :mod:`moelab.hd.vllm_adapter`).

    For ``"hd"`` (cost-aware), ``cfg["acceptance_prior"]`` (in [0, 1]) overrides the cold-start prior of
    :func:`moelab.hd.policy.cold_start_prior` and ``cfg["seed"]`` seeds the exploration (:func:`cost_aware_rows`)."""
    method = cfg.get("method", "hd")
    budget = check_budget(budget)
    if method == "custom":  # a drafter of the user's: no stores, no tokenizer; each row gets its own instance
        factory = drafter_factory(cfg.get("drafter"))
        return RowDrafters(lambda: _user_drafter(factory), _first_chain)
    # checked before the stores load (L takes seconds): a bad config fails at once
    prior = cfg.get("acceptance_prior")
    prior = None if prior is None else check_acceptance("acceptance_prior", prior)
    seed = check_int("seed", cfg.get("seed", 0), low=0)
    if method == "probe":
        length = check_int("probe_len", int(cfg.get("probe_len", budget)), low=0, high=budget)
        token = int(cfg.get("probe_token", 0))
        if length == 0:  # the spec-decode engine drafting nothing: the q = 1 point
            return RowDrafters(lambda: _Probe(1, token), lambda d, m: Draft([], []))
        return RowDrafters(lambda: _Probe(length, token), lambda d, m: Draft(
            [d.draft().candidates[0][:m]], ["P"]) if m > 0 else Draft([], []))
    order = check_order(cfg.get("order", "L" if method == "rest" else "WSL"))
    if method == "rest":
        order = "L"
    tok = _tokenizer(tokenizer_path)
    tok.moelab_name = cfg.get("tokenizer_name", "smollm2-135m-instruct")
    S, L = load_stores(tok, s_path=cfg.get("s_path"), l_max_tokens=cfg.get("l_max_tokens"),
                       need="".join(c for c in "SL" if c in order))
    length = int(cfg.get("length", 4))
    if method in ("hd-fixed", "rest"):
        return RowDrafters(lambda: HierarchyDrafter(S, L, order=order, length=length), HierarchyDrafter.draft_chain)
    if method != "hd":
        raise ValueError(f"method must be one of ['hd', 'hd-fixed', 'rest', 'probe']; got {method!r}")
    c = cfg.get("cost")
    if not isinstance(c, dict):
        raise ValueError("method 'hd' (cost-aware) needs cfg['cost'] = {'qs': [...], 'ms': [...]}, the measured "
                         "verify-cost curve (moelab.bench.specbench.measure_vllm_cost)")
    cost = VerifyCost(c["qs"], c["ms"], c.get("source", ""))
    # a live engine times its steps: the curve follows the machine and the policy is chosen on tokens/s
    # ("online": false keeps the probed curve and the plan, as a replay must)
    online = cfg.get("online", True)
    if not isinstance(online, bool):
        raise ValueError(f"online must be true or false; got {online!r}")
    return cost_aware_rows(S, L, cost, budget=budget, order=order, length=length, engine=EngineAcceptance(prior),
                           seed=seed, online=online)


def cost_aware_rows(S: Any, L: Any, cost: VerifyCost, *, budget: int, order: str = "WSL", length: int = 4,
                    engine: EngineAcceptance | None = None, seed: int = 0, online: bool = False) -> RowDrafters:
    """Per-row cost-aware HD chains (vLLM's HD): each request gets its own acceptance model, started from
    ``engine``'s prior (a fresh :class:`EngineAcceptance` by default), and its own exploration stream
    ``(seed, request number)``.

    Parameters
    ----------
    S, L : Store or None
        The shared stores (needed when their letter is in ``order``).
    cost : VerifyCost
        The engine's measured verify-cost curve.
    budget : int
        Draft tokens per step at most (1..64).
    order, length : str, int
        The store walk and the tokens per lookup.
    engine : EngineAcceptance, optional
        The prior shared by the engine's requests.
    seed : int
        Base seed of the requests' exploration draws.
    online : bool
        A live engine (vLLM): every request's drafter times the engine's steps
        (:class:`~moelab.hd.drafters.CostAwareDrafter`'s ``timed``), the engine's verify-cost curve is
        re-estimated from them (:class:`~moelab.costmodel.verify.OnlineVerifyCost`, seeded by ``cost``) and the
        step policy, plan or full chain, is chosen on the tokens/s each delivers
        (:class:`~moelab.hd.policy.PolicyChoice`). Off for a replay (no forward runs between steps). The
        returned rows carry both as ``cost_model`` and ``policy_choice`` (None when off).
    """
    check_instance("cost", cost, VerifyCost, "a VerifyCost (e.g. moelab.costmodel.fit_verify_cost(qs, ms))")
    budget = check_budget(budget)
    engine = engine if engine is not None else EngineAcceptance()
    numbers = itertools.count()
    base = check_int("seed", seed, low=0)
    online = bool(online)
    model = OnlineVerifyCost(cost) if online else cost  # one per engine: every request's steps correct it
    choice = PolicyChoice() if online else None

    def new_request() -> CostAwareDrafter:
        # a row's drafter is made when a request arrives in it, so one drafter (and one model) per request;
        # the stream seed is distinct per request (and per base seed for the first million requests)
        inner = HierarchyDrafter(S, L, order=order, length=length, context_key_lengths=COST_AWARE_CONTEXT_KEYS)
        return CostAwareDrafter(inner, model, budget=budget, chain=True, acceptance=engine.new_request(),
                                seed=base * 1_000_003 + next(numbers), timed=online, choice=choice)

    rows = RowDrafters(new_request, CostAwareDrafter.draft)  # (the method itself: no lambda frame per step)
    rows.cost_model = model if online else None
    rows.policy_choice = choice
    return rows


__all__ = ["cost_aware_rows", "load_stores", "make_row_drafters"]
