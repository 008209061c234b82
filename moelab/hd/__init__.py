"""Hierarchy Drafting (HD): lossless speculative decoding with drafts from three n-gram databases
(W context, S model, L statistics) walked like a cache hierarchy, verified by the real target model.

One drafter, two engines: HF transformers (:mod:`moelab.hd.decode`, tree verification, exact per-store
accounting) and vLLM (:mod:`moelab.hd.vllm_adapter`, a ``custom_class`` proposer, one chain per step).
Stores: W per request (:class:`ContextStore`), S from the target's own outputs on ShareGPT
(:mod:`moelab.hd.builders`, ``moelab build-hd-stores``), L = REST's suffix index over ShareGPT
(:class:`SuffixStore`). The default drafter is cost-aware (:class:`CostAwareDrafter`,
:mod:`moelab.hd.policy`); the paper's fixed 7x4 hierarchy stays available (:class:`HierarchyDrafter`).

Spec: ``shared/spec/hd.md``; paper arXiv 2502.05609. torch is only touched through
:mod:`moelab.models.lm` and vLLM only through :mod:`moelab.models.vllm_engine` (both imported lazily)."""

from moelab.hd.builders import build_model_store, build_statistics_store
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
from moelab.hd.evaluate import DEFAULT_METHODS, SpecBenchRun, compare_published, make_drafter, run_specbench
from moelab.hd.ngram import NGramTable, StoreFileError
from moelab.hd.policy import BUDGETS, AcceptanceModel, VerifyCost
from moelab.hd.specbench import spec_bench_split
from moelab.hd.stores import (
    ContextStore,
    default_model_store_path,
    load_default_model_store,
    load_default_statistics_store,
    load_store,
    tokenizer_identity,
)
from moelab.hd.suffix import SuffixStore

__all__ = ["BUDGETS", "AcceptanceModel", "CostAwareDrafter", "VerifyCost",
    "DEFAULT_METHODS", "SpecBenchRun", "compare_published", "make_drafter", "run_specbench", "load_default_model_store",
    "STORE_LETTERS", "ContextStore", "Draft", "Drafter", "GenerationResult", "HierarchyDrafter", "NGramTable",
    "NoDrafter", "PLDDrafter", "StepRecord", "StoreCounters", "TokenTree", "build_model_store",
    "build_statistics_store", "build_tree", "check_order", "default_model_store_path", "generate",
    "load_default_statistics_store", "load_store", "replay_greedy", "StoreFileError", "SuffixStore",
    "spec_bench_split", "tokenizer_identity",
]
