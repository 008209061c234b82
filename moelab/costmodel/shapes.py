"""The one registry of model geometry: every cost model, calibration, workload and simulator looks
shapes up here (:data:`MODEL_SHAPES`, :func:`model_shape`).

A :class:`ModelShape` is a whole decoder: layers, hidden size, the attention layout (GQA/MHA heads
or an MLA latent), the MoE layers' experts (routed and shared), the dense FFN of dense layers and the
vocabulary. :attr:`ModelShape.moe` is the expert shape (:class:`MoEShape`) the MoE kernel tables are
keyed by. Nothing mutates the registry at run time: code that fits a table of custom shapes passes
them as an argument (``MoEStepModel.from_table(table, shapes=...)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

from moelab._io import read_json
from moelab._validate import check_int


@dataclass(frozen=True)
class MoEShape:
    """One MoE layer's expert shape: hidden ``H``, expert FFN ``F``, experts ``E``, ``top_k``; bf16."""

    hidden: int
    ffn: int
    num_experts: int
    top_k: int
    bytes_per_param: int = 2

    def __post_init__(self) -> None:
        for name in ("hidden", "ffn", "num_experts", "top_k", "bytes_per_param"):
            check_int(name, getattr(self, name), low=1)
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={self.num_experts}]; got {self.top_k}")

    @property
    def expert_bytes(self) -> int:
        """Weight bytes of one SwiGLU expert (w1, w3: H x F; w2: F x H)."""
        return 3 * self.hidden * self.ffn * self.bytes_per_param


@dataclass(frozen=True)
class ModelShape:
    """Geometry of one decoder-only (MoE or dense) transformer, bf16 by default.

    Parameters
    ----------
    num_layers : int
        Decoder layers.
    hidden : int
        Model width.
    q_heads, kv_heads, head_dim : int
        Attention heads (GQA/MHA); for MLA ``kv_heads`` is the number of query heads and ``kv_latent`` +
        ``rope_dim`` give the cached latent per token.
    vocab : int
        Vocabulary (LM-head rows).
    num_experts, top_k, expert_ffn : int
        Routed experts per MoE layer, experts picked per token, and an expert's FFN width (0 for a dense
        model).
    shared_experts : int
        Always-active experts of FFN width ``expert_ffn`` per MoE layer.
    dense_ffn : int
        FFN width of the dense layers (all layers of a dense model; the first ``first_dense_layers`` of a
        MoE model).
    first_dense_layers : int
        Leading dense layers of a MoE model (DeepSeek's ``first_k_dense_replace``).
    kv_latent, rope_dim : int
        MLA's compressed KV (``kv_lora_rank``) and decoupled RoPE key per token (0 without MLA).
    bytes_per_param : int
        Bytes per weight and per cached value (2: bf16).
    source : str
        Where the numbers come from (a config file).
    """

    num_layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    num_experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0
    dense_ffn: int = 0
    first_dense_layers: int = 0
    kv_latent: int = 0
    rope_dim: int = 0
    bytes_per_param: int = 2
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden", "q_heads", "kv_heads", "head_dim", "bytes_per_param"):
            check_int(name, getattr(self, name), low=1)
        for name in ("vocab", "num_experts", "top_k", "expert_ffn", "shared_experts", "dense_ffn", "kv_latent",
                     "rope_dim"):
            check_int(name, getattr(self, name), low=0)
        check_int("first_dense_layers", self.first_dense_layers, low=0, high=self.num_layers)
        if self.num_experts:
            check_int("top_k", self.top_k, low=1, high=self.num_experts)
            check_int("expert_ffn", self.expert_ffn, low=1)
        elif self.dense_ffn < 1:
            raise ValueError("a dense shape (num_experts=0) needs dense_ffn >= 1")

    # ------------------------------------------------------------------ derived geometry
    @property
    def is_moe(self) -> bool:
        """Whether the model has routed experts."""
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        """Whether attention caches an MLA latent instead of per-head K/V."""
        return self.kv_latent > 0

    @property
    def num_moe_layers(self) -> int:
        """Layers with routed experts (the layers an expert trace records)."""
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        """Layers without routed experts."""
        return self.num_layers - self.num_moe_layers

    @property
    def moe(self) -> MoEShape:
        """The routed-expert shape of one MoE layer (what the MoE kernel tables are keyed by)."""
        if not self.is_moe:
            raise ValueError("a dense shape has no MoE layer (num_experts=0)")
        return MoEShape(self.hidden, self.expert_ffn, self.num_experts, self.top_k, self.bytes_per_param)

    @property
    def kv_bytes_per_token(self) -> int:
        """Cache bytes one token occupies in one layer: K+V of ``kv_heads`` heads, or MLA's latent."""
        if self.is_mla:
            return (self.kv_latent + self.rope_dim) * self.bytes_per_param
        return 2 * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def proj_params(self) -> int:
        """Attention projections (Q, K, V, O) and the router of one layer. MLA: Q, the latent
        down-projection, the K/V up-projections and O."""
        h, d = self.hidden, self.head_dim
        if self.is_mla:
            attn = h * self.q_heads * (d + self.rope_dim) + h * (self.kv_latent + self.rope_dim) \
                + self.kv_latent * self.q_heads * 2 * d + self.q_heads * d * h
        else:
            attn = h * (self.q_heads + 2 * self.kv_heads) * d + self.q_heads * d * h
        return attn + h * self.num_experts

    @property
    def proj_bytes(self) -> int:
        """Weight bytes of :attr:`proj_params`."""
        return self.proj_params * self.bytes_per_param

    @property
    def shared_bytes(self) -> int:
        """Weight bytes of the shared experts of one MoE layer (read every step)."""
        return self.shared_experts * 3 * self.hidden * self.expert_ffn * self.bytes_per_param

    @property
    def dense_ffn_bytes(self) -> int:
        """Weight bytes of one dense layer's SwiGLU FFN."""
        return 3 * self.hidden * self.dense_ffn * self.bytes_per_param

    @property
    def head_bytes(self) -> int:
        """LM-head weight bytes (read once per decode step)."""
        return self.vocab * self.hidden * self.bytes_per_param

    def with_(self, **changes: int | str) -> ModelShape:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)

    @classmethod
    def from_hf_config(cls, config: Mapping | str) -> ModelShape:
        """The shape of a Hugging Face config (a dict or a ``config.json`` path; Qwen2/3-MoE, OLMoE,
        Mixtral, DeepSeek-V2/V3, GPT-OSS and Llama key names). Dense layers of Qwen-MoE configs
        (``mlp_only_layers`` / ``decoder_sparse_step``) are supported only as leading layers."""
        if not isinstance(config, Mapping):
            config = read_json(config)
        c = config

        def get(*names: str, default: int | None = None) -> int:
            for nm in names:
                if c.get(nm) is not None:
                    return int(c[nm])
            if default is None:
                raise ValueError(f"config lacks {names[0]!r} (also tried {list(names[1:])})")
            return default

        hidden = get("hidden_size")
        q = get("num_attention_heads")
        n_layers = get("num_hidden_layers")
        experts = get("n_routed_experts", "num_experts", "num_local_experts", default=0)
        first_dense = get("first_k_dense_replace", default=0)
        dense = set(c.get("mlp_only_layers") or [])
        step = int(c.get("decoder_sparse_step") or 1)
        if experts and (dense or step != 1):
            sparse = [i for i in range(n_layers) if i not in dense and (i + 1) % step == 0]
            first_dense = n_layers - len(sparse)
        ffn = get("moe_intermediate_size", "intermediate_size", default=0) if experts else 0
        shared = get("n_shared_experts", default=0)
        if experts and not shared and c.get("shared_expert_intermediate_size"):
            shared = max(1, int(c["shared_expert_intermediate_size"]) // max(ffn, 1))
        return cls(
            num_layers=n_layers, hidden=hidden, q_heads=q, kv_heads=get("num_key_value_heads", default=q),
            head_dim=get("v_head_dim", "head_dim", default=hidden // q), vocab=get("vocab_size", default=0),
            num_experts=experts, top_k=get("num_experts_per_tok") if experts else 0, expert_ffn=ffn,
            shared_experts=shared, dense_ffn=get("intermediate_size", default=0) if (first_dense or not experts) else 0,
            first_dense_layers=first_dense, kv_latent=get("kv_lora_rank", default=0),
            rope_dim=get("qk_rope_head_dim", default=0) if c.get("kv_lora_rank") else 0,
            source=f"Hugging Face config ({c.get('model_type', 'unknown model_type')})")


def _project_moe(name: str, copy: ModelShape) -> ModelShape:
    """One of the project's own MoEs, read from its bundled ``data/models/<name>/config.json`` so the
    registry cannot drift from the model; ``copy`` holds that config's values for an install without
    the data folder."""
    path = Path(__file__).resolve().parents[2] / "data" / "models" / name / "config.json"
    if path.is_file():
        return replace(ModelShape.from_hf_config(str(path)), source=f"data/models/{name}/config.json")
    return replace(copy, source=f"data/models/{name}/config.json (copy)")


_SHAPES: dict[str, ModelShape] = {
    # Qwen/Qwen3-30B-A3B config.json: 48 layers, hidden 2048, 32 q / 4 kv heads of 128, 128 experts
    # (moe_intermediate_size 768), top-8, vocab 151936.
    "qwen3-30b-a3b": ModelShape(48, 2048, 32, 4, 128, 151936, num_experts=128, top_k=8, expert_ffn=768,
                                source="huggingface.co/Qwen/Qwen3-30B-A3B/config.json"),
    # allenai/OLMoE-1B-7B-0924 config.json: 16 layers, hidden 2048, 16 heads of 128 (MHA), 64 experts of
    # FFN 1024, top-8, vocab 50304.
    "olmoe-1b-7b": ModelShape(16, 2048, 16, 16, 128, 50304, num_experts=64, top_k=8, expert_ffn=1024,
                              source="huggingface.co/allenai/OLMoE-1B-7B-0924/config.json"),
    # mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, hidden 4096, 32 q / 8 kv heads of 128, 8 experts of
    # FFN 14336, top-2, vocab 32000.
    "mixtral-8x7b": ModelShape(32, 4096, 32, 8, 128, 32000, num_experts=8, top_k=2, expert_ffn=14336,
                               source="huggingface.co/mistralai/Mixtral-8x7B-v0.1/config.json"),
    # Qwen/Qwen1.5-MoE-A2.7B config.json: 24 layers, hidden 2048, 16 heads of 128, 60 experts of FFN 1408,
    # top-4, shared expert FFN 5632 (= 4 experts' width), vocab 151936.
    "qwen1.5-moe-a2.7b": ModelShape(24, 2048, 16, 16, 128, 151936, num_experts=60, top_k=4, expert_ffn=1408,
                                    shared_experts=4, source="huggingface.co/Qwen/Qwen1.5-MoE-A2.7B/config.json"),
    # deepseek-ai/DeepSeek-V2-Lite config.json: 27 layers (first dense, intermediate 10944), hidden 2048,
    # 16 heads, MLA kv_lora_rank 512 + qk_rope_head_dim 64, v_head_dim 128, 64 routed experts of FFN 1408,
    # top-6, 2 shared experts, vocab 102400.
    "deepseek-v2-lite": ModelShape(27, 2048, 16, 16, 128, 102400, num_experts=64, top_k=6, expert_ffn=1408,
                                   shared_experts=2, dense_ffn=10944, first_dense_layers=1, kv_latent=512,
                                   rope_dim=64, source="huggingface.co/deepseek-ai/DeepSeek-V2-Lite/config.json"),
    # openai/gpt-oss-120b config.json (also transformers' GptOssConfig defaults): 36 layers, hidden 2880,
    # 64 q / 8 kv heads of 64, 128 experts of FFN 2880, top-4, vocab 201088. Half the layers use a
    # 128-token sliding window, which this shape does not model (attention is priced at full context).
    "gpt-oss-120b": ModelShape(36, 2880, 64, 8, 64, 201088, num_experts=128, top_k=4, expert_ffn=2880,
                               source="huggingface.co/openai/gpt-oss-120b/config.json"),
    # google/gemma-4-26B-A4B: 128 experts, top-8 (model card). The remaining dimensions are NOT verified
    # against the released config.json (unavailable offline): 30 layers, hidden 2816, 16 q / 8 kv heads
    # of 256, expert FFN 704, vocab 262144 are an estimate of a ~4B-active, ~26B-total model.
    "gemma-4-26b-a4b": ModelShape(30, 2816, 16, 8, 256, 262144, num_experts=128, top_k=8, expert_ffn=704,
                                  source="google/gemma-4-26B-A4B model card (E, top-k); other dims UNVERIFIED"),
    # A DeepSeek-V3-like MLA shape, from deepseek-ai/DeepSeek-V3 config.json: 61 layers (3 dense, FFN
    # 18432), hidden 7168, 128 heads, kv_lora_rank 512 + rope 64, v_head_dim 128, 256 routed experts of
    # FFN 2048, top-8, 1 shared expert, vocab 129280.
    "deepseek-v3": ModelShape(61, 7168, 128, 128, 128, 129280, num_experts=256, top_k=8, expert_ffn=2048,
                              shared_experts=1, dense_ffn=18432, first_dense_layers=3, kv_latent=512, rope_dim=64,
                              source="huggingface.co/deepseek-ai/DeepSeek-V3/config.json"),
    # A dense 70B GQA shape, from meta-llama/Llama-3.1-70B config.json: 80 layers, hidden 8192,
    # 64 q / 8 kv heads of 128, FFN 28672, vocab 128256.
    "llama-3.1-70b": ModelShape(80, 8192, 64, 8, 128, 128256, dense_ffn=28672,
                                source="huggingface.co/meta-llama/Llama-3.1-70B/config.json"),
    # Dense Llama-style models whose verify forwards `moelab calibrate` measures (dense_verify.csv):
    # meta-llama/Llama-2-7b-hf, TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T and JackFram/llama-160m
    # config.json files.
    "llama2-7b": ModelShape(32, 4096, 32, 32, 128, 32000, dense_ffn=11008,
                            source="huggingface.co/meta-llama/Llama-2-7b-hf/config.json"),
    "tinyllama-1.1b": ModelShape(22, 2048, 32, 4, 64, 32000, dense_ffn=5632,
                                 source="huggingface.co/TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T/config.json"),
    "llama-160m": ModelShape(12, 768, 12, 12, 64, 32000, dense_ffn=3072,
                             source="huggingface.co/JackFram/llama-160m/config.json"),
    # The project's own MoEs (data/models/, trained by `moelab train-moe`).
    "tiny-moe": _project_moe("tiny-moe", ModelShape(6, 128, 4, 2, 32, 4096, num_experts=32, top_k=2, expert_ffn=128)),
    "sharegpt-moe": _project_moe("sharegpt-moe", ModelShape(8, 128, 4, 2, 32, 8192, num_experts=64, top_k=8,
                                                            expert_ffn=64)),
}

#: name -> :class:`ModelShape`; read-only (a table fit of other shapes takes them as an argument).
MODEL_SHAPES: Mapping[str, ModelShape] = MappingProxyType(_SHAPES)


def model_shape(shape: ModelShape | str) -> ModelShape:
    """``shape`` itself, or the registry's shape of that name (``ValueError`` listing the registry)."""
    if isinstance(shape, ModelShape):
        return shape
    if not isinstance(shape, str) or shape not in MODEL_SHAPES:
        raise ValueError(f"shape must be one of {sorted(MODEL_SHAPES)} or a ModelShape; got {shape!r}")
    return MODEL_SHAPES[shape]


def moe_shape(shape: ModelShape | MoEShape | str, shapes: Mapping[str, MoEShape] | None = None) -> MoEShape:
    """The expert shape of ``shape``: a :class:`MoEShape` as is, a name looked up in ``shapes`` first
    (when given) and then in :data:`MODEL_SHAPES`."""
    if isinstance(shape, MoEShape):
        return shape
    if isinstance(shape, str) and shapes is not None and shape in shapes:
        return shapes[shape]
    s = model_shape(shape)
    if not s.is_moe:
        raise ValueError(f"shape {shape!r} is dense (no experts); MoE shapes: "
                         f"{sorted(n for n, m in MODEL_SHAPES.items() if m.is_moe)}")
    return s.moe


__all__ = ["MODEL_SHAPES", "ModelShape", "MoEShape", "model_shape", "moe_shape"]
