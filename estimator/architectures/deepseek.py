"""DeepSeek-V2/V3 (and Kimi-K2, read as V3) as transformers' modeling_deepseek_v2/v3.py build
them: latent attention, dense first layers, shared and routed experts; the cached latent per
docs/estimator.md. DeepSeek-V3.2 and GLM-5 (``deepseek_v32``, ``glm_moe_dsa``) add the DSA
indexer: its weights, and its fp8 key cache per token."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..errors import EstimatorError
from ..model import (
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_INTERMEDIATE,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_VOCAB,
)
from .counting import Reader, Tally


@dataclass(frozen=True)
class DeepSeekShape:
    """What a DeepSeek-V2/V3 config says, its config classes' defaults filled in."""

    h: int
    layers: int
    heads: int
    vocab: int
    inter: int
    q_rank: int | None  # None: a plain q_proj, no compressed query
    kv_rank: int
    nope: int
    rope: int
    v_dim: int
    experts: int
    shared: int
    per_token: int
    e_inter: int
    dense: int
    bias: bool
    mlp_bias: bool
    tied: bool
    index_heads: int = 0  # the DSA indexer's heads (0: no indexer)
    index_dim: int = 0
    index_layers: int = 0  # layers that run their own indexer (and cache its keys)
    index_built: int = 0  # layers whose indexer weights transformers builds

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense


def read_deepseek(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    s = _read_shape(r, family)
    _check_layers(r, notes)
    t = _tally(s)
    r.keys["num_moe_layers"] = "first_k_dense_replace"
    index = s.index_layers * (s.index_dim + s.index_dim // INDEX_QUANT_BLOCK * 4)
    return {
        "hidden_size": s.h,
        "num_layers": s.layers,
        "num_heads": s.heads,
        "num_kv_heads": s.heads,
        "head_dim": s.nope + s.rope,
        "intermediate_size": s.inter,
        "vocab_size": s.vocab,
        "tie_word_embeddings": s.tied,
        "num_experts": s.experts,
        "experts_per_token": s.per_token,
        "moe_intermediate_size": s.e_inter,
        "shared_expert_intermediate_size": s.e_inter * s.shared,
        "num_moe_layers": s.moe_layers,
        "kv_width": s.kv_rank + s.rope,
        "index_bytes_per_token": index,
        "exact": t.breakdown(),
        "read_as": (
            f"latent attention (kv_lora_rank {s.kv_rank} + rope {s.rope} cached per "
            f"token), {s.dense} dense + {s.moe_layers} MoE layers of {s.experts} routed + "
            f"{s.shared} shared experts"
            + (f"; DSA indexer on {s.index_layers} layers ({index:,} B a token)" if index else "")
        ),
        "max_position_embeddings": r.int(
            "max_position_embeddings",
            "max_position_embeddings",
            default=None,
            maximum=MAX_POSITIONS,
        ),
    }


# vLLM's DSA indexer cache (vllm/model_executor/models/deepseek_v2.py, DeepseekV32IndexerCache,
# v0.11): fp8 keys with one fp32 scale per 128 values, uint8 whatever the KV dtype.
INDEX_QUANT_BLOCK = 128
DSA = ("deepseek_v32", "glm_moe_dsa")


def _read_shape(r: Reader, family: str) -> DeepSeekShape:
    # The config classes' defaults are DeepSeek-V2's and V3's own shapes.
    v3 = family in ("deepseek_v3", *DSA)
    h = r.int("hidden_size", "hidden_size", maximum=MAX_HIDDEN)
    layers = r.int("num_hidden_layers", "num_layers", maximum=MAX_LAYERS)
    heads = r.int("num_attention_heads", "num_heads", maximum=MAX_HEADS)
    vocab = r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB)
    inter = r.int("intermediate_size", "intermediate_size", maximum=MAX_INTERMEDIATE)
    # q_lora_rank null (DeepSeek-V2-Lite): a plain q_proj, no compressed query
    uncompressed = "q_lora_rank" in r.data and r.data["q_lora_rank"] is None
    q_rank = (
        None if uncompressed else r.int("q_lora_rank", "head_dim", default=1536, maximum=MAX_HIDDEN)
    )
    kv_rank = r.int("kv_lora_rank", "kv_width", default=512, maximum=MAX_HIDDEN)
    nope = r.int("qk_nope_head_dim", "head_dim", default=128, maximum=MAX_HIDDEN)
    rope = r.int("qk_rope_head_dim", "head_dim", default=64, maximum=MAX_HIDDEN)
    v_dim = r.int("v_head_dim", "head_dim", default=128, maximum=MAX_HIDDEN)
    experts = r.int(
        "n_routed_experts", "num_experts", default=256 if v3 else 64, maximum=MAX_EXPERTS
    )
    shared = r.int(
        "n_shared_experts", "num_experts", default=1 if v3 else 2, minimum=0, maximum=MAX_EXPERTS
    )
    per_token = r.int(
        "num_experts_per_tok", "experts_per_token", default=8 if v3 else 6, maximum=experts
    )
    e_inter = r.int(
        "moe_intermediate_size",
        "moe_intermediate_size",
        default=2048 if v3 else 1407,
        maximum=MAX_INTERMEDIATE,
    )
    dense = r.int(
        "first_k_dense_replace", "num_moe_layers", default=3 if v3 else 0, minimum=0, maximum=layers
    )
    kinds = r.data.get("mlp_layer_types")
    if family in DSA and kinds is not None:
        dense = _dense_prefix(r, kinds, layers)
    bias = r.bool("attention_bias", "attention_bias", default=False)
    mlp_bias = not v3 and r.bool("mlp_bias", "mlp_bias", default=False)
    tied = r.bool("tie_word_embeddings", "tie_word_embeddings", default=False)
    shape = DeepSeekShape(
        h, layers, heads, vocab, inter, q_rank, kv_rank, nope, rope, v_dim,
        experts, shared, per_token, e_inter, dense, bias, mlp_bias, tied,
    )  # fmt: skip
    if family not in DSA:
        return shape
    return replace(
        shape,
        index_heads=r.int("index_n_heads", "num_heads", default=64, maximum=MAX_HEADS),
        index_dim=r.int("index_head_dim", "head_dim", default=128, maximum=MAX_HIDDEN),
        index_layers=(index_layers := _indexer_layers(r, layers)),
        # modeling_deepseek_v32.py builds an indexer on every layer whatever indexer_types
        # says; GLM-5 builds none on its "shared" layers.
        index_built=layers if family == "deepseek_v32" else index_layers,
    )


def _dense_prefix(r: Reader, kinds: Any, layers: int) -> int:
    """mlp_layer_types: the dense layers must come first, as first_k_dense_replace says."""
    if not isinstance(kinds, list) or len(kinds) != layers:
        raise EstimatorError(f"{r.field}.mlp_layer_types", f"expected {layers} entries")
    dense = sum(1 for kind in kinds if kind == "dense")
    if any(kind not in ("dense", "sparse") for kind in kinds) or "sparse" in kinds[:dense]:
        raise EstimatorError(
            f"{r.field}.mlp_layer_types",
            "only dense layers followed by sparse ones are counted exactly",
            code="unsupported_architecture",
        )
    return dense


def _indexer_layers(r: Reader, layers: int) -> int:
    """GLM-5's ``indexer_types``: "shared" layers reuse the previous layer's selection and
    build no indexer; DeepSeek-V3.2 runs one on every layer."""
    kinds = r.data.get("indexer_types")
    if kinds is None:
        return layers
    if not isinstance(kinds, list) or len(kinds) != layers:
        raise EstimatorError(f"{r.field}.indexer_types", f"expected {layers} entries")
    if any(kind not in ("full", "shared") for kind in kinds):
        raise EstimatorError(f"{r.field}.indexer_types", 'expected "full" or "shared"')
    return sum(1 for kind in kinds if kind == "full")


def _check_layers(r: Reader, notes: list[str]) -> None:
    """Experts on every layer past the dense ones, as transformers builds them; the
    multi-token-prediction layers are not loaded."""
    freq = r.data.get("moe_layer_freq", 1)
    if freq not in (1, None):
        # transformers builds experts on every layer from first_k_dense_replace on
        raise EstimatorError(
            f"{r.field}.moe_layer_freq",
            f"experts every {freq!r} layers is not counted exactly; give the safetensors index",
            code="unsupported_architecture",
        )
    mtp = r.data.get("num_nextn_predict_layers") or 0
    if mtp:
        notes.append(
            f"{mtp} multi-token-prediction layer(s) in the checkpoint are not loaded for "
            "inference (transformers and vLLM build the main model only) and are not counted"
        )


def _tally(s: DeepSeekShape) -> Tally:
    h, layers, heads = s.h, s.layers, s.heads
    qk_dim = s.nope + s.rope
    moe_layers = s.moe_layers
    t = Tally()
    t.add("embeddings", s.vocab * h)
    if s.q_rank is None:
        t.linear("attention", "q_proj", h, heads * qk_dim, layers, bias=False)
    else:
        t.linear("attention", "q_a_proj", h, s.q_rank, layers, bias=s.bias)
        t.add("norms", layers * s.q_rank)  # q_a_layernorm
        t.linear("attention", "q_b_proj", s.q_rank, heads * qk_dim, layers, bias=False)
    t.linear("attention", "kv_a_proj_with_mqa", h, s.kv_rank + s.rope, layers, bias=s.bias)
    t.add("norms", layers * s.kv_rank)  # kv_a_layernorm
    t.linear("attention", "kv_b_proj", s.kv_rank, heads * (s.nope + s.v_dim), layers, bias=False)
    t.linear("attention", "o_proj", heads * s.v_dim, h, layers, bias=s.bias)
    if s.index_built:
        n, d, count = s.index_heads, s.index_dim, s.index_built
        t.linear("indexer", "indexer.wq_b", s.q_rank or h, n * d, count, bias=False)
        t.linear("indexer", "indexer.wk", h, d, count, bias=False)
        t.add("indexer", count * 2 * d)  # k_norm, a LayerNorm
        t.linear("indexer", "indexer.weights_proj", h, n, count, bias=False)
    t.gated_mlp("mlp", h, s.inter, s.dense, bias=s.mlp_bias)
    t.gated_mlp("experts", h, s.e_inter, s.experts * moe_layers)
    t.add("router", moe_layers * s.experts * h)  # no bias; V3's correction bias is a buffer
    t.gated_mlp(
        "shared_expert", h, s.e_inter * s.shared, moe_layers if s.shared else 0, bias=s.mlp_bias
    )
    t.inactive = (s.experts - s.per_token) * moe_layers * 3 * h * s.e_inter
    t.add("norms", layers * 2 * h + h)
    t.add("lm_head", 0 if s.tied else s.vocab * h)
    return t
