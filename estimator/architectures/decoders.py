"""This year's dense and mixture-of-experts decoders, each counted module by module as its
transformers modeling file (``modeling_<model_type>.py``) builds it: SmolLM3, Cohere
(Command-R, Aya) and Cohere2, Arcee, Seed-OSS, ERNIE-4.5, EXAONE-4, InternLM3, gpt-oss,
GLM-4.5 (``glm4_moe``), MiniMax-M2, OLMoE, ERNIE-4.5-MoE and Llama-4's text model."""

from __future__ import annotations

from typing import Any

from ..model import MAX_EXPERTS, MAX_INTERMEDIATE, MAX_LAYERS
from .counting import Reader, Tally
from .layers import (
    Shape,
    attention,
    embeddings_and_head,
    fused_experts,
    int_flags,
    layer_types,
    moe_fields,
    pattern_kinds,
    plain_mlp,
    read_shape,
    rope_flags,
    spec,
    windowed,
)

SLIDING = ("sliding_attention",)


def _experts(r: Reader, key: str, per_token_key: str, default_k: int) -> tuple[int, int]:
    """The routed experts and how many a token takes (``default_k``: the class's)."""
    experts = r.int(key, "num_experts", maximum=MAX_EXPERTS)
    per_token = r.int(per_token_key, "experts_per_token", default=default_k, maximum=experts)
    return experts, per_token


def _dense(
    r: Reader,
    s: Shape,
    read_as: str,
    *,
    qkv_bias: bool = False,
    o_bias: bool = False,
    mlp_bias: bool = False,
    gated: bool = True,
    norms_per_layer: int = 2,
    qk_norm: int = 0,
    window: tuple[int | None, tuple[int, ...] | None] = (None, None),
    head_bias: bool = False,
) -> dict[str, Any]:
    """A dense decoder: attention, the MLP, ``norms_per_layer`` hidden-wide RMSNorms and
    ``qk_norm`` q/k norm parameters per layer."""
    t = Tally()
    attention(t, s, s.layers, qkv_bias=qkv_bias, o_bias=o_bias)
    if gated:
        t.gated_mlp("mlp", s.h, s.inter, s.layers, bias=mlp_bias)
    else:
        plain_mlp(t, "mlp", s.h, s.inter, s.layers, bias=mlp_bias)
    t.add("norms", s.layers * (norms_per_layer * s.h + qk_norm))
    embeddings_and_head(t, s, final_norm=s.h, head_bias=head_bias)
    return spec(
        s, t, r, read_as, gated_mlp=gated, sliding_window=window[0], sliding_layers=window[1]
    )


def read_smollm3(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """SmolLM3: Llama's layers (NoPE every few layers changes no weight); a window only
    where use_sliding_window is set and layer_types says so."""
    s = read_shape(r, tied=True, kv_default=4)
    bias = r.bool("attention_bias", "attention_bias", default=False)
    kinds = layer_types(r, s.layers)
    use_window = r.bool("use_sliding_window", "sliding_window", default=False)
    if kinds is None:  # SmolLM3Config windows the NoPE layers where a window is used
        flags = rope_flags(r, s.layers, empty_is_default=False)
        kinds = ["full_attention" if f else "sliding_attention" for f in flags]
    window = windowed(r, kinds, SLIDING) if use_window else (None, None)
    return _dense(
        r, s, "Llama-style layers, no-RoPE every few layers", qkv_bias=bias, o_bias=bias,
        mlp_bias=r.bool("mlp_bias", "mlp_bias", default=False), window=window,
    )  # fmt: skip


def read_internlm3(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """InternLM3: Llama's layers; ``qkv_bias`` and ``bias`` are its names for Llama's
    attention_bias and mlp_bias (the config class refuses them differing)."""
    s = read_shape(r, tied=False, kv_default=2, head_dim_default=128)
    bias = r.bool("attention_bias", "attention_bias", default=bool(r.data.get("qkv_bias")))
    mlp_bias = r.bool("mlp_bias", "mlp_bias", default=bool(r.data.get("bias")))
    return _dense(r, s, "Llama-style layers", qkv_bias=bias, o_bias=bias, mlp_bias=mlp_bias)


def read_arcee(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """Arcee (AFM): Llama's attention, a plain two-matrix MLP (ReLU squared)."""
    s = read_shape(r, tied=False)
    bias = r.bool("attention_bias", "attention_bias", default=False)
    return _dense(
        r, s, "plain two-matrix MLP (ReLU squared)", qkv_bias=bias, o_bias=bias,
        mlp_bias=r.bool("mlp_bias", "mlp_bias", default=False), gated=False,
    )  # fmt: skip


def read_seed_oss(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """Seed-OSS: q/k/v biases from attention_bias, o's from attention_out_bias."""
    s = read_shape(r, tied=False, kv_default=8, head_dim_default=128)
    return _dense(
        r, s, "q/k/v biases, separate output bias",
        qkv_bias=r.bool("attention_bias", "attention_bias", default=True),
        o_bias=r.bool("attention_out_bias", "attention_bias", default=False),
        mlp_bias=r.bool("mlp_bias", "mlp_bias", default=False),
    )  # fmt: skip


def read_ernie4_5(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """ERNIE-4.5 (dense): use_bias on every attention and MLP projection."""
    s = read_shape(r, tied=True, kv_default=2, head_dim_default=128)
    bias = r.bool("use_bias", "attention_bias", default=False)
    return _dense(r, s, "biases from use_bias", qkv_bias=bias, o_bias=bias, mlp_bias=bias)


def read_exaone4(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """EXAONE-4: norms after attention and after the MLP (none before), per-head q/k
    RMSNorms, windows where layer_types (or sliding_window_pattern) says."""
    s = read_shape(r, tied=False, kv_default=32)
    return _dense(
        r, s, "post-norms, per-head q/k norms, interleaved windows", qk_norm=2 * s.head_dim,
        window=_window_pattern(r, s.layers, 4096),
    )  # fmt: skip


def _window_pattern(
    r: Reader, layers: int, default: int
) -> tuple[int | None, tuple[int, ...] | None]:
    """Windows where layer_types says, else every sliding_window_pattern-th layer global
    (the config classes' default of 4); ``default``: the class's window."""
    absent = "sliding_window" not in r.data
    kinds = layer_types(r, layers)
    if kinds is None and (absent or r.data["sliding_window"] is not None):
        kinds = pattern_kinds(r, layers, 4)
    return windowed(r, kinds, SLIDING, default=default)


def read_cohere(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """Cohere (Command-R, Aya) and Cohere2: one LayerNorm without bias per layer before
    attention and MLP in parallel, q/k LayerNorms per head where use_qk_norm, a tied head;
    Cohere2's windows where layer_types says."""
    s = read_shape(r, tied=True)
    bias = r.bool("attention_bias", "attention_bias", default=False)
    qk = r.bool("use_qk_norm", "qk_norm", default=False) if family == "cohere" else False
    window: tuple[int | None, tuple[int, ...] | None] = (None, None)
    if family == "cohere2":
        window = _window_pattern(r, s.layers, 4096)
    return _dense(
        r, s, "parallel attention and MLP from one bias-free LayerNorm", qkv_bias=bias,
        o_bias=bias, norms_per_layer=1, qk_norm=s.q_dim + s.kv_dim if qk else 0, window=window,
    )  # fmt: skip


def read_gpt_oss(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """gpt-oss: biased attention with a learned sink per head, alternating windows, a
    biased router and experts with biases on every layer."""
    s = read_shape(r, tied=False, kv_default=8, head_dim_default=64)
    experts, per_token = _experts(r, "num_local_experts", "num_experts_per_tok", 4)
    bias = r.bool("attention_bias", "attention_bias", default=True)
    t = Tally()
    attention(t, s, s.layers, qkv_bias=bias, o_bias=bias)
    t.add("attention", s.layers * s.heads)  # sinks
    t.add("router", s.layers * (experts * s.h + experts))
    fused_experts(t, s.h, s.inter, experts, s.layers, per_token, bias=True)
    t.add("norms", s.layers * 2 * s.h)
    embeddings_and_head(t, s, final_norm=s.h)
    # GptOssConfig: a 128-token window on every other layer where the config says nothing
    kinds = layer_types(r, s.layers) or [
        "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(s.layers)
    ]
    window = windowed(r, kinds, SLIDING, default=128)
    return spec(
        s, t, r, f"{experts} experts with biases on every layer, attention sinks, "
        "alternating sliding windows", sliding_window=window[0], sliding_layers=window[1],
        **moe_fields(experts, per_token, s.inter, s.layers),
    )  # fmt: skip


def read_glm4_moe(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """GLM-4.5/4.6/4.7: q/k/v biases from attention_bias (o unbiased), per-head q/k norms
    where use_qk_norm, first_k_dense_replace dense layers, then routed and shared experts
    (the score-correction bias is a buffer); the MTP layer is not built."""
    s = read_shape(r, tied=False, kv_default=8)
    experts, per_token = _experts(r, "n_routed_experts", "num_experts_per_tok", 8)
    e_inter = r.int("moe_intermediate_size", "moe_intermediate_size", maximum=MAX_INTERMEDIATE)
    shared = r.int("n_shared_experts", "num_experts", default=1, minimum=0, maximum=MAX_EXPERTS)
    dense = r.int("first_k_dense_replace", "num_moe_layers", default=1, minimum=0, maximum=s.layers)
    qk = r.bool("use_qk_norm", "qk_norm", default=False)
    moe = s.layers - dense
    t = Tally()
    attention(t, s, s.layers, qkv_bias=r.bool("attention_bias", "attention_bias", default=False))
    t.gated_mlp("mlp", s.h, s.inter, dense)
    t.add("router", moe * experts * s.h)
    fused_experts(t, s.h, e_inter, experts, moe, per_token)
    t.gated_mlp("shared_expert", s.h, e_inter * shared, moe if shared else 0)
    t.add("norms", s.layers * (2 * s.h + (2 * s.head_dim if qk else 0)))
    embeddings_and_head(t, s, final_norm=s.h)
    _mtp_note(r, notes)
    return spec(
        s, t, r, f"{dense} dense + {moe} MoE layers of {experts} routed + {shared} shared experts",
        **moe_fields(experts, per_token, e_inter, moe),
    )  # fmt: skip


def _mtp_note(r: Reader, notes: list[str]) -> None:
    mtp = r.data.get("num_nextn_predict_layers") or 0
    if mtp:
        notes.append(
            f"{mtp} multi-token-prediction layer(s) in the checkpoint are not built for "
            "inference by transformers and are not counted"
        )


def read_minimax_m2(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """MiniMax-M2: unbiased attention with q and k RMSNorms over all heads, experts on
    every layer, no shared expert (the score-correction bias is a buffer)."""
    s = read_shape(r, tied=False, kv_default=8, head_dim_default=128)
    experts, per_token = _experts(r, "num_local_experts", "num_experts_per_tok", 8)
    t = Tally()
    attention(t, s, s.layers)
    t.add("router", s.layers * experts * s.h)
    fused_experts(t, s.h, s.inter, experts, s.layers, per_token)
    t.add("norms", s.layers * (2 * s.h + s.q_dim + s.kv_dim))
    embeddings_and_head(t, s, final_norm=s.h)
    return spec(
        s, t, r, f"{experts} experts on every layer, q/k norms over all heads",
        **moe_fields(experts, per_token, s.inter, s.layers),
    )  # fmt: skip


def read_olmoe(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """OLMoE: q normed over the hidden width and k over the KV width, experts everywhere."""
    s = read_shape(r, tied=False)
    experts, per_token = _experts(r, "num_experts", "num_experts_per_tok", 8)
    bias = r.bool("attention_bias", "attention_bias", default=False)
    t = Tally()
    attention(t, s, s.layers, qkv_bias=bias, o_bias=bias)
    t.add("router", s.layers * experts * s.h)
    fused_experts(t, s.h, s.inter, experts, s.layers, per_token)
    k_norm = (s.h // s.heads) * s.kv_heads
    t.add("norms", s.layers * (2 * s.h + s.h + k_norm))
    embeddings_and_head(t, s, final_norm=s.h)
    return spec(
        s, t, r, f"{experts} experts on every layer, q/k norms over all heads",
        **moe_fields(experts, per_token, s.inter, s.layers),
    )  # fmt: skip


def read_ernie4_5_moe(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """ERNIE-4.5-MoE: experts every moe_layer_interval-th layer between the start and end
    indices, shared experts, a score-correction bias per expert (a parameter here), biases
    from use_bias, the head biased too."""
    s = read_shape(r, tied=True, kv_default=4)
    experts, per_token = _experts(r, "moe_num_experts", "moe_k", 6)
    e_inter = r.int("moe_intermediate_size", "moe_intermediate_size", maximum=MAX_INTERMEDIATE)
    shared = r.int(
        "moe_num_shared_experts", "num_experts", default=0, minimum=0, maximum=MAX_EXPERTS
    )
    start = r.int("moe_layer_start_index", "num_moe_layers", default=1, minimum=0,
                  maximum=MAX_LAYERS)  # fmt: skip
    end = r.int("moe_layer_end_index", "num_moe_layers", default=s.layers - 1, minimum=0,
                maximum=MAX_LAYERS)  # fmt: skip
    step = r.int("moe_layer_interval", "num_moe_layers", default=1, maximum=MAX_LAYERS)
    moe = sum(1 for i in range(s.layers) if (i + 1) % step == 0 and start <= i <= end)
    bias = r.bool("use_bias", "attention_bias", default=False)
    t = Tally()
    attention(t, s, s.layers, qkv_bias=bias, o_bias=bias)
    t.gated_mlp("mlp", s.h, s.inter, s.layers - moe, bias=bias)
    t.add("router", moe * (experts * s.h + experts))
    fused_experts(t, s.h, e_inter, experts, moe, per_token)
    t.gated_mlp("shared_expert", s.h, e_inter * shared, moe if shared else 0, bias=bias)
    t.add("norms", s.layers * 2 * s.h)
    embeddings_and_head(t, s, final_norm=s.h, head_bias=bias)
    _mtp_note(r, notes)
    return spec(
        s, t, r, f"{moe} MoE layers of {experts} routed + {shared} shared experts",
        **moe_fields(experts, per_token, e_inter, moe),
    )  # fmt: skip


def read_llama4_text(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """Llama-4's text model: experts with a shared expert on the moe_layers (every
    interleave_moe_layer_step-th), dense layers of intermediate_size_mlp between, weightless
    q/k norms; RoPE layers attend in chunks of attention_chunk_size, NoPE layers globally."""
    s = read_shape(r, tied=False, kv_default=8, head_dim_default=128)
    experts, per_token = _experts(r, "num_local_experts", "num_experts_per_tok", 1)
    dense_inter = r.int(
        "intermediate_size_mlp", "intermediate_size", default=16384, maximum=MAX_INTERMEDIATE
    )
    step = r.int("interleave_moe_layer_step", "num_moe_layers", default=1, maximum=MAX_LAYERS)
    listed = int_flags(r, "moe_layers", s.layers)
    moe_layers = set(listed) if listed is not None else set(range(step - 1, s.layers, step))
    moe = sum(1 for i in moe_layers if i < s.layers)
    bias = r.bool("attention_bias", "attention_bias", default=False)
    t = Tally()
    attention(t, s, s.layers, qkv_bias=bias, o_bias=bias)
    t.gated_mlp("mlp", s.h, dense_inter, s.layers - moe)
    t.add("router", moe * experts * s.h)
    fused_experts(t, s.h, s.inter, experts, moe, per_token)
    t.gated_mlp("shared_expert", s.h, s.inter, moe)
    t.add("norms", s.layers * 2 * s.h)
    embeddings_and_head(t, s, final_norm=s.h)
    window = _chunked_layers(r, s.layers)
    return spec(
        s, t, r, f"{moe} MoE layers of {experts} experts + a shared expert, chunked attention",
        sliding_window=window[0], sliding_layers=window[1],
        **moe_fields(experts, per_token, s.inter, moe),
    )  # fmt: skip


def _chunked_layers(r: Reader, layers: int) -> tuple[int | None, tuple[int, ...] | None]:
    """Llama-4's chunked layers cache at most one chunk: vLLM sizes them like a window."""
    kinds = layer_types(r, layers)
    if kinds is None:
        flags = rope_flags(r, layers, empty_is_default=True)
        kinds = ["chunked_attention" if f else "full_attention" for f in flags]
    return windowed(
        r, kinds, ("chunked_attention",), window_key="attention_chunk_size", default=8192
    )
