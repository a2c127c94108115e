"""Qwen3-Next and Qwen3.5 (dense and MoE) as transformers' modeling_qwen3_next.py and
modeling_qwen3_5(_moe).py build them: gated DeltaNet linear-attention layers, which cache
nothing per token but keep a fixed state per sequence, between gated full-attention layers;
experts with a gated shared expert."""

from __future__ import annotations

from typing import Any

from ..errors import EstimatorError
from ..model import MAX_EXPERTS, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS
from .counting import Reader, Tally
from .layers import (
    Shape,
    attention,
    embeddings_and_head,
    fused_experts,
    layer_types,
    moe_fields,
    read_shape,
)
from .layers import spec as decoder_spec

# model_type -> (experts on the MLP layers, fused in_proj_qkvz/ba (Next) or split (3.5),
# the config class's num_key_value_heads where the config leaves it out)
VARIANTS = {
    "qwen3_next": (True, True, 2),
    "qwen3_5_text": (False, False, 4),
    "qwen3_5_moe_text": (True, False, 2),
}


def _mixers(r: Reader, layers: int) -> list[str]:
    kinds = layer_types(r, layers)
    if kinds is None:
        interval = r.int("full_attention_interval", "num_layers", default=4, maximum=MAX_LAYERS)
        kinds = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(layers)
        ]
    unknown = sorted(set(kinds) - {"full_attention", "linear_attention"})
    if unknown:
        raise EstimatorError(f"{r.field}.layer_types", f"unknown layer kind {unknown[0]!r}")
    return kinds


def _delta_net(t: Tally, r: Reader, h: int, count: int, *, fused: bool) -> int:
    """Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet on ``count`` layers; returns the state
    one layer keeps per sequence (elements), as vLLM allocates it: the conv state
    ((kernel - 1) x conv_dim) and the recurrent state (v heads x k dim x v dim)."""
    k_heads = r.int("linear_num_key_heads", "num_kv_heads", default=16, maximum=MAX_HEADS)
    v_heads = r.int("linear_num_value_heads", "num_kv_heads", default=32, maximum=MAX_HEADS)
    k_dim = r.int("linear_key_head_dim", "head_dim", default=128, maximum=MAX_HIDDEN)
    v_dim = r.int("linear_value_head_dim", "head_dim", default=128, maximum=MAX_HIDDEN)
    kernel = r.int("linear_conv_kernel_dim", "state_elements", default=4, maximum=64)
    key, value = k_heads * k_dim, v_heads * v_dim
    conv_dim = 2 * key + value
    if fused:
        t.linear("linear_attention", "in_proj_qkvz", h, 2 * key + 2 * value, count, bias=False)
        t.linear("linear_attention", "in_proj_ba", h, 2 * v_heads, count, bias=False)
    else:
        t.linear("linear_attention", "in_proj_qkv", h, conv_dim, count, bias=False)
        t.linear("linear_attention", "in_proj_z", h, value, count, bias=False)
        t.linear("linear_attention", "in_proj_b", h, v_heads, count, bias=False)
        t.linear("linear_attention", "in_proj_a", h, v_heads, count, bias=False)
    t.add("linear_attention", count * (conv_dim * kernel + 2 * v_heads))  # conv1d, dt_bias, A_log
    t.add("norms", count * v_dim)  # the gated RMSNorm over a value head
    t.linear("linear_attention", "out_proj", value, h, count, bias=False)
    return (kernel - 1) * conv_dim + v_heads * k_dim * v_dim


def _mlps(t: Tally, r: Reader, s: Shape, moe: bool, fused: bool) -> dict[str, Any]:
    """Experts with a gated shared expert where the family has them, else Qwen's MLP; dense
    layers by decoder_sparse_step and mlp_only_layers in Qwen3-Next (``fused``) only."""
    if not moe:
        t.gated_mlp("mlp", s.h, s.inter, s.layers)
        return {}
    experts = r.int("num_experts", "num_experts", maximum=MAX_EXPERTS)
    per_token = r.int("num_experts_per_tok", "experts_per_token", maximum=experts)
    e_inter = r.int("moe_intermediate_size", "moe_intermediate_size", maximum=MAX_INTERMEDIATE)
    s_inter = r.int("shared_expert_intermediate_size", "shared_expert_intermediate_size",
                    default=0, minimum=0, maximum=MAX_INTERMEDIATE)  # fmt: skip
    step = r.int("decoder_sparse_step", "num_moe_layers", default=1, maximum=MAX_LAYERS)
    dense_only = r.data.get("mlp_only_layers") or []
    if not fused:  # modeling_qwen3_5_moe.py builds experts on every layer, whatever these say
        step, dense_only = 1, []
    if not isinstance(dense_only, list):
        raise EstimatorError(f"{r.field}.mlp_only_layers", "expected a list of layer indices")
    moe_layers = sum(1 for i in range(s.layers) if (i + 1) % step == 0 and i not in dense_only)
    if moe_layers < s.layers and "intermediate_size" not in r.data:
        raise EstimatorError(f"{r.field}.intermediate_size", "required for the dense layers")
    t.gated_mlp("mlp", s.h, s.inter, s.layers - moe_layers)
    t.add("router", moe_layers * experts * s.h)
    fused_experts(t, s.h, e_inter, experts, moe_layers, per_token)
    t.gated_mlp("shared_expert", s.h, s_inter, moe_layers if s_inter else 0)
    t.add("shared_expert", moe_layers * s.h)  # shared_expert_gate (h -> 1), built even at 0
    return {
        **moe_fields(experts, per_token, e_inter, moe_layers),
        "shared_expert_intermediate_size": s_inter,
    }


def read_qwen3_next(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    moe, fused, kv_default = VARIANTS[family]
    # Qwen3.5-MoE puts experts on every layer and leaves intermediate_size out.
    fallback = r.int("moe_intermediate_size", "moe_intermediate_size", default=None,
                     maximum=MAX_INTERMEDIATE) if moe else None  # fmt: skip
    s = read_shape(
        r, tied=False, inter_default=fallback, kv_default=kv_default, head_dim_default=256
    )
    kinds = _mixers(r, s.layers)
    full = sum(1 for k in kinds if k == "full_attention")
    t = Tally()
    # Gated attention: q_proj doubled for the output gate; per-head q/k RMSNorms.
    bias = r.bool("attention_bias", "attention_bias", default=False)
    attention(t, s, full, qkv_bias=bias, o_bias=bias, gate=True)
    t.add("norms", full * 2 * s.head_dim)
    per_layer_state = _delta_net(t, r, s.h, s.layers - full, fused=fused)
    extra = _mlps(t, r, s, moe, fused)
    t.add("norms", s.layers * 2 * s.h)
    embeddings_and_head(t, s, final_norm=s.h)
    return decoder_spec(
        s, t, r,
        f"{full} gated-attention + {s.layers - full} gated DeltaNet layers (KV cache on the "
        "attention layers only; a fixed state per sequence on the others)",
        kv_layers=full, state_elements=(s.layers - full) * per_layer_state, **extra,
    )  # fmt: skip
