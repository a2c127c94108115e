"""DeepSeek-V2/V3 as transformers' modeling_deepseek_v2/v3.py build them: latent attention,
dense first layers, shared and routed experts; the cached latent per docs/estimator.md."""

from __future__ import annotations

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


def read_deepseek(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    data = r.data
    h = r.int("hidden_size", "hidden_size", maximum=MAX_HIDDEN)
    layers = r.int("num_hidden_layers", "num_layers", maximum=MAX_LAYERS)
    heads = r.int("num_attention_heads", "num_heads", maximum=MAX_HEADS)
    vocab = r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB)
    inter = r.int("intermediate_size", "intermediate_size", maximum=MAX_INTERMEDIATE)
    # The config classes' defaults are DeepSeek-V2's and V3's own shapes.
    v3 = family == "deepseek_v3"
    # q_lora_rank null (DeepSeek-V2-Lite): a plain q_proj, no compressed query
    uncompressed = "q_lora_rank" in data and data["q_lora_rank"] is None
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
    bias = r.bool("attention_bias", "attention_bias", default=False)
    mlp_bias = not v3 and r.bool("mlp_bias", "mlp_bias", default=False)
    tied = r.bool("tie_word_embeddings", "tie_word_embeddings", default=False)
    freq = data.get("moe_layer_freq", 1)
    if freq not in (1, None):
        # transformers builds experts on every layer from first_k_dense_replace on
        raise EstimatorError(
            f"{r.field}.moe_layer_freq",
            f"experts every {freq!r} layers is not counted exactly; give the safetensors index",
            code="unsupported_architecture",
        )
    mtp = data.get("num_nextn_predict_layers") or 0
    if mtp:
        notes.append(
            f"{mtp} multi-token-prediction layer(s) in the checkpoint are not loaded for "
            "inference (transformers and vLLM build the main model only) and are not counted"
        )

    qk_dim = nope + rope
    moe_layers = layers - dense
    t = Tally()
    t.add("embeddings", vocab * h)
    if q_rank is None:
        t.linear("attention", "q_proj", h, heads * qk_dim, layers, bias=False)
    else:
        t.linear("attention", "q_a_proj", h, q_rank, layers, bias=bias)
        t.add("norms", layers * q_rank)  # q_a_layernorm
        t.linear("attention", "q_b_proj", q_rank, heads * qk_dim, layers, bias=False)
    t.linear("attention", "kv_a_proj_with_mqa", h, kv_rank + rope, layers, bias=bias)
    t.add("norms", layers * kv_rank)  # kv_a_layernorm
    t.linear("attention", "kv_b_proj", kv_rank, heads * (nope + v_dim), layers, bias=False)
    t.linear("attention", "o_proj", heads * v_dim, h, layers, bias=bias)
    t.gated_mlp("mlp", h, inter, dense, bias=mlp_bias)
    t.gated_mlp("experts", h, e_inter, experts * moe_layers)
    t.add("router", moe_layers * experts * h)  # no bias; V3's correction bias is a buffer
    t.gated_mlp("shared_expert", h, e_inter * shared, moe_layers if shared else 0, bias=mlp_bias)
    t.inactive = (experts - per_token) * moe_layers * 3 * h * e_inter
    t.add("norms", layers * 2 * h + h)
    t.add("lm_head", 0 if tied else vocab * h)
    r.keys["num_moe_layers"] = "first_k_dense_replace"  # type: ignore[attr-defined]
    return {
        "hidden_size": h,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": qk_dim,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "num_experts": experts,
        "experts_per_token": per_token,
        "moe_intermediate_size": e_inter,
        "shared_expert_intermediate_size": e_inter * shared,
        "num_moe_layers": moe_layers,
        "kv_width": kv_rank + rope,
        "exact": t.breakdown(),
        "read_as": (
            f"latent attention (kv_lora_rank {kv_rank} + rope {rope} cached per "
            f"token), {dense} dense + {moe_layers} MoE layers of {experts} routed + {shared} "
            "shared experts"
        ),
        "max_position_embeddings": r.int(
            "max_position_embeddings",
            "max_position_embeddings",
            default=None,
            maximum=MAX_POSITIONS,
        ),
    }
