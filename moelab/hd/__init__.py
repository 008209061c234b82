"""Hierarchy Drafting (HD): lossless speculative decoding with drafts from three n-gram databases
(W context, S model, L statistics) walked like a cache hierarchy, verified by the real target model.

Spec: ``shared/spec/hd.md``; paper arXiv 2502.05609. torch is only touched through
:mod:`moelab.models.lm` (imported lazily when decoding)."""

from moelab.hd.builders import build_model_store, build_statistics_store
from moelab.hd.decode import GenerationResult, StepRecord, TokenTree, build_tree, generate, replay_greedy
from moelab.hd.drafters import (
    STORE_LETTERS,
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

__all__ = [
    "DEFAULT_METHODS", "SpecBenchRun", "compare_published", "make_drafter", "run_specbench", "load_default_model_store",
    "STORE_LETTERS", "ContextStore", "Draft", "Drafter", "GenerationResult", "HierarchyDrafter", "NGramTable",
    "NoDrafter", "PLDDrafter", "StepRecord", "StoreCounters", "TokenTree", "build_model_store",
    "build_statistics_store", "build_tree", "check_order", "default_model_store_path", "generate",
    "load_default_statistics_store", "load_store", "replay_greedy", "StoreFileError", "SuffixStore",
    "spec_bench_split", "tokenizer_identity",
]
