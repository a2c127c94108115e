"""Mamba, Mamba-2 and the Jamba hybrid as transformers' modeling_mamba/mamba2/jamba.py build
them; SSM layers cache no KV, only a fixed state per sequence (docs/estimator.md)."""

from __future__ import annotations

import math
from typing import Any

from ..errors import EstimatorError
from ..model import MAX_EXPERTS, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB
from .counting import Reader, Tally


def _time_step_rank(r: Reader, key: str, hidden: int) -> int:
    value = r.data.get(key, "auto")
    if value == "auto" or value is None:
        return math.ceil(hidden / 16)  # the config classes' "auto"
    return r.int(key, "head_dim", maximum=MAX_HIDDEN)


def _mamba_mixer(t: Tally, h: int, inner: int, state: int, conv: int, rank: int, *,
                 proj_bias: bool, conv_bias: bool, count: int) -> None:  # fmt: skip
    t.linear("mixer", "in_proj", h, 2 * inner, count, bias=proj_bias)
    t.add("mixer", count * (inner * conv + (inner if conv_bias else 0)))  # depthwise conv1d
    t.linear("mixer", "x_proj", inner, rank + 2 * state, count, bias=False)
    t.linear("mixer", "dt_proj", rank, inner, count, bias=True)
    t.add("mixer", count * (inner * state + inner))  # A_log and D
    t.linear("mixer", "out_proj", inner, h, count, bias=proj_bias)


def _spec(h: int, layers: int, inner: int, vocab: int, tied: bool, t: Tally) -> dict[str, Any]:
    return {
        "hidden_size": h,
        "num_layers": layers,
        "num_heads": 1,
        "num_kv_heads": 1,
        "head_dim": h,
        "intermediate_size": inner,
        "vocab_size": vocab,
        "tie_word_embeddings": tied,
        "gated_mlp": False,
        "exact": t.breakdown(),
    }


def read_mamba(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    h = r.int("hidden_size", "hidden_size", maximum=MAX_HIDDEN)
    layers = r.int("num_hidden_layers", "num_layers", maximum=MAX_LAYERS)
    vocab = r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB)
    expand = r.int("expand", "intermediate_size", default=2, maximum=64)
    inner = r.int(
        "intermediate_size", "intermediate_size", default=expand * h, maximum=MAX_INTERMEDIATE
    )
    state = r.int("state_size", "state_elements", default=16, maximum=MAX_HIDDEN)
    conv = r.int("conv_kernel", "state_elements", default=4, maximum=64)
    rank = _time_step_rank(r, "time_step_rank", h)
    tied = r.bool("tie_word_embeddings", "tie_word_embeddings", default=True)
    t = Tally()
    t.add("embeddings", vocab * h)
    _mamba_mixer(
        t, h, inner, state, conv, rank, count=layers,
        proj_bias=r.bool("use_bias", "mlp_bias", default=False),
        conv_bias=r.bool("use_conv_bias", "mlp_bias", default=True),
    )  # fmt: skip
    t.add("norms", layers * h + h)  # one RMSNorm per block, norm_f
    t.add("lm_head", 0 if tied else vocab * h)
    per_layer = (conv - 1) * inner + inner * state
    return {
        **_spec(h, layers, inner, vocab, tied, t),
        "kv_layers": 0,
        "state_elements": layers * per_layer,
        "read_as": f"{layers} SSM layers, no KV cache; conv and scan state per sequence",
    }


def read_mamba2(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    h = r.int("hidden_size", "hidden_size", maximum=MAX_HIDDEN)
    layers = r.int("num_hidden_layers", "num_layers", maximum=MAX_LAYERS)
    vocab = r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB)
    expand = r.int("expand", "intermediate_size", default=2, maximum=64)
    heads = r.int("num_heads", "num_heads", default=128, maximum=MAX_HEADS)
    head_dim = r.int("head_dim", "head_dim", default=64, maximum=MAX_HIDDEN)
    groups = r.int("n_groups", "num_kv_heads", default=8, maximum=MAX_HEADS)
    state = r.int("state_size", "state_elements", default=128, maximum=MAX_HIDDEN)
    conv = r.int("conv_kernel", "state_elements", default=4, maximum=64)
    inner = expand * h
    if inner != heads * head_dim:
        raise EstimatorError(
            f"{r.field}.num_heads",
            f"hidden_size x expand ({inner}) must equal num_heads x head_dim ({heads * head_dim})",
        )
    tied = r.bool("tie_word_embeddings", "tie_word_embeddings", default=False)
    bias = r.bool("use_bias", "mlp_bias", default=False)
    conv_bias = r.bool("use_conv_bias", "mlp_bias", default=True)
    conv_dim = inner + 2 * groups * state
    t = Tally()
    t.add("embeddings", vocab * h)
    t.linear("mixer", "in_proj", h, inner + conv_dim + heads, layers, bias=bias)
    t.add("mixer", layers * (conv_dim * conv + (conv_dim if conv_bias else 0)))
    t.add("mixer", layers * 3 * heads)  # dt_bias, A_log, D
    t.add("norms", layers * inner)  # the gated RMSNorm before out_proj
    t.linear("mixer", "out_proj", inner, h, layers, bias=bias)
    t.add("norms", layers * h + h)
    t.add("lm_head", 0 if tied else vocab * h)
    per_layer = (conv - 1) * conv_dim + heads * head_dim * state
    return {
        **_spec(h, layers, inner, vocab, tied, t),
        "kv_layers": 0,
        "state_elements": layers * per_layer,
        "read_as": f"{layers} SSM layers, no KV cache; conv and scan state per sequence",
    }


def read_jamba(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    h = r.int("hidden_size", "hidden_size", maximum=MAX_HIDDEN)
    layers = r.int("num_hidden_layers", "num_layers", maximum=MAX_LAYERS)
    vocab = r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB)
    heads = r.int("num_attention_heads", "num_heads", maximum=MAX_HEADS)
    kv_heads = r.int("num_key_value_heads", "num_kv_heads", default=heads, maximum=MAX_HEADS)
    inter = r.int("intermediate_size", "intermediate_size", maximum=MAX_INTERMEDIATE)
    experts = r.int("num_experts", "num_experts", default=16, maximum=MAX_EXPERTS)
    per_token = r.int("num_experts_per_tok", "experts_per_token", default=2, maximum=experts)
    attention, moe = _jamba_layers(r, layers, experts)
    state = r.int("mamba_d_state", "state_elements", default=16, maximum=MAX_HIDDEN)
    conv = r.int("mamba_d_conv", "state_elements", default=4, maximum=64)
    expand = r.int("mamba_expand", "intermediate_size", default=2, maximum=64)
    rank = _time_step_rank(r, "mamba_dt_rank", h)
    inner = expand * h
    head_dim = h // heads
    tied = r.bool("tie_word_embeddings", "tie_word_embeddings", default=False)
    ssm = layers - len(attention)
    t = Tally()
    t.add("embeddings", vocab * h)
    for name, width in (("q_proj", heads), ("k_proj", kv_heads), ("v_proj", kv_heads)):
        t.linear("attention", name, h, width * head_dim, len(attention), bias=False)
    t.linear("attention", "o_proj", heads * head_dim, h, len(attention), bias=False)
    _mamba_mixer(
        t, h, inner, state, conv, rank, count=ssm,
        proj_bias=r.bool("mamba_proj_bias", "mlp_bias", default=False),
        conv_bias=r.bool("mamba_conv_bias", "mlp_bias", default=True),
    )  # fmt: skip
    t.add("norms", ssm * (rank + 2 * state))  # dt, B and C RMSNorms in each mixer
    t.gated_mlp("mlp", h, inter, layers - len(moe))
    t.gated_mlp("experts", h, inter, experts * len(moe))
    t.add("router", len(moe) * experts * h)
    t.inactive = (experts - per_token) * len(moe) * 3 * h * inter
    t.add("norms", layers * 2 * h + h)
    t.add("lm_head", 0 if tied else vocab * h)
    return {
        **_spec(h, layers, inter, vocab, tied, t),
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "gated_mlp": True,
        "num_experts": experts if moe else 0,
        "experts_per_token": per_token if moe else 0,
        "num_moe_layers": len(moe) if moe else None,
        "kv_layers": len(attention),
        "state_elements": ssm * ((conv - 1) * inner + inner * state),
        "read_as": (
            f"{len(attention)} attention + {ssm} SSM layers (KV cache on the attention "
            f"layers only), {len(moe)} MoE layers of {experts} experts"
        ),
    }


def _jamba_layers(r: Reader, layers: int, experts: int) -> tuple[list[int], list[int]]:
    """The attention layers and the MoE layers: every period-th layer from its offset."""
    periods = {}
    for key, default in (("attn_layer_period", 8), ("attn_layer_offset", 4),
                         ("expert_layer_period", 2), ("expert_layer_offset", 1)):  # fmt: skip
        # a layer's kind is its index modulo the period: a period is at least 1
        least = 1 if key.endswith("_period") else 0
        periods[key] = r.int(key, "num_layers", default=default, minimum=least, maximum=MAX_LAYERS)
    for kind in ("attn", "expert"):
        if periods[f"{kind}_layer_offset"] >= periods[f"{kind}_layer_period"]:
            raise EstimatorError(
                f"{r.field}.{kind}_layer_offset", f"must be below {kind}_layer_period"
            )
    attention = [
        i for i in range(layers)
        if i % periods["attn_layer_period"] == periods["attn_layer_offset"]
    ]  # fmt: skip
    moe = [
        i for i in range(layers)
        if experts > 1 and i % periods["expert_layer_period"] == periods["expert_layer_offset"]
    ]  # fmt: skip
    return attention, moe
