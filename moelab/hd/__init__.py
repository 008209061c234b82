"""Hierarchy Drafting (HD): lossless speculative decoding with drafts from three n-gram databases
(W context, S model, L statistics) walked like a cache hierarchy, verified by the real target model.

One drafter, two engines: HF transformers (:mod:`moelab.hd.decode`, tree verification, exact per-store
accounting) and vLLM (:mod:`moelab.hd.vllm_adapter`, a ``custom_class`` proposer, one chain per step).
Stores: W per request (:class:`ContextStore`), S from the target's own outputs on ShareGPT
(:mod:`moelab.make.hd_stores`, ``moelab build-hd-stores``), L = REST's suffix index over ShareGPT
(:class:`SuffixStore`). The methods by name, for both engines: :mod:`moelab.hd.methods` (the default
``"hd"`` is cost-aware, :class:`CostAwareDrafter`, :mod:`moelab.hd.policy`; ``"hd_fixed"`` is the paper's
fixed hierarchy tree, :class:`HierarchyDrafter`). The paper's experiment: :mod:`moelab.hd.experiments`;
measuring in vLLM: :mod:`moelab.bench.specbench`.

Spec: ``shared/spec/hd.md``; paper arXiv 2502.05609. torch is only touched through
:mod:`moelab.models.lm` and vLLM only through :mod:`moelab.models.vllm_engine` (both imported lazily)."""

from moelab.hd.decode import GenerationResult, StepRecord, TokenTree, build_tree, generate, replay_greedy
from moelab.hd.drafters import (
    STORE_LETTERS,
    CostAwareDrafter,
    Draft,
    Drafter,
    HierarchyDrafter,
    NoDrafter,
    PLDDrafter,
    StoreCounters,
    check_order,
)
from moelab.hd.experiments import SpecBenchRun, compare_published, run_hf, run_specbench
from moelab.hd.methods import METHODS, Method, get_method, make_hf_drafter
from moelab.hd.ngram import NGramTable, StoreFileError
from moelab.hd.policy import BUDGETS, AcceptanceModel, EngineAcceptance, PolicyChoice
from moelab.hd.specbench import spec_bench_split
from moelab.hd.stores import (
    ContextStore,
    Store,
    default_model_store_path,
    load_default_model_store,
    load_default_statistics_store,
    load_store,
    tokenizer_identity,
)
from moelab.hd.suffix import SuffixStore

__all__ = ["BUDGETS", "METHODS", "STORE_LETTERS", "AcceptanceModel", "ContextStore", "CostAwareDrafter", "Draft",
           "Drafter", "EngineAcceptance", "GenerationResult", "Method", "PolicyChoice", "Store", "HierarchyDrafter", "NGramTable", "NoDrafter", "PLDDrafter", "SpecBenchRun",
           "StepRecord", "StoreCounters", "StoreFileError", "SuffixStore", "TokenTree", "build_tree", "check_order",
           "compare_published", "default_model_store_path", "generate", "get_method", "load_default_model_store",
           "load_default_statistics_store", "load_store", "make_hf_drafter", "replay_greedy", "run_hf",
           "run_specbench", "spec_bench_split", "tokenizer_identity"]
