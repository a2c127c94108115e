"""Gemma-4's language model as transformers' modeling_gemma4.py builds it: layers whose
width differs (global layers with their own head_dim and KV heads, from per_layer_config or
global_head_dim), the last num_kv_shared_layers layers reusing an earlier layer's cache (no
k/v projections, no cache of their own, a double-wide MLP where use_double_wide_mlp), keys
that are the values on global layers (attention_k_eq_v), per-layer input embeddings, and an
optional block of experts beside the MLP; and its vision tower. The audio tower is not
counted: a config that carries one is refused, naming it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import EstimatorError
from ..model import MAX_EXPERTS, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB
from ..parsing import check_int, read_bool, read_int
from .counting import Reader, Tally
from .layers import embeddings_and_head, moe_fields, read_shape
from .layers import spec as decoder_spec


def _kinds(r: Reader, layers: int) -> list[str]:
    """layer_types, or Gemma4TextConfig's default (every sixth layer global); the last
    layer is always global, as the config class forces it."""
    value = r.data.get("layer_types")
    if value is None:
        kinds = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
    elif (
        isinstance(value, list)
        and len(value) == layers
        and all(v in ("sliding_attention", "full_attention") for v in value)
    ):
        kinds = list(value)
    else:
        raise EstimatorError(f"{r.field}.layer_types", f"expected {layers} attention kinds")
    kinds[-1] = "full_attention"
    return kinds


def _widths(r: Reader, kinds: list[str], head_dim: int, kv_heads: int) -> list[tuple[int, int]]:
    """(head_dim, KV heads) of every layer: per_layer_config overrides by layer index, or the
    global layers' global_head_dim and num_global_key_value_heads (the latter only with
    attention_k_eq_v, as the config class applies it)."""
    out = [(head_dim, kv_heads)] * len(kinds)
    overrides = r.data.get("per_layer_config")
    if overrides is None:
        g_dim = r.int("global_head_dim", "head_dim", default=512, maximum=MAX_HIDDEN)
        g_kv = r.int("num_global_key_value_heads", "num_kv_heads", default=None,
                     maximum=MAX_HEADS)  # fmt: skip
        g_kv = g_kv if g_kv and r.data.get("attention_k_eq_v") else kv_heads
        return [
            (g_dim, g_kv) if k == "full_attention" else w for k, w in zip(kinds, out, strict=True)
        ]
    if not isinstance(overrides, Mapping) or len(overrides) > len(kinds):
        raise EstimatorError(f"{r.field}.per_layer_config", "expected an object of layer indices")
    for key, layer in overrides.items():
        index = check_int(
            int(key) if str(key).isdigit() else key,
            f"{r.field}.per_layer_config",
            minimum=0,
            maximum=len(kinds) - 1,
        )
        if not isinstance(layer, Mapping) or set(layer) - {"head_dim", "num_key_value_heads"}:
            raise EstimatorError(
                f"{r.field}.per_layer_config",
                "only head_dim and num_key_value_heads per layer are counted exactly",
                code="unsupported_architecture",
            )
        dim = check_int(layer.get("head_dim", head_dim), f"{r.field}.per_layer_config",
                        maximum=MAX_HIDDEN)  # fmt: skip
        kv = check_int(layer.get("num_key_value_heads", kv_heads),
                       f"{r.field}.per_layer_config", maximum=MAX_HEADS)  # fmt: skip
        out[index] = (dim, kv)
    return out


def _shared(r: Reader, kinds: list[str]) -> list[bool]:
    """Which layers reuse an earlier layer's KV (the last num_kv_shared_layers)."""
    count = r.int("num_kv_shared_layers", "kv_layers", default=0, minimum=0, maximum=len(kinds))
    first = len(kinds) - count
    if count and count < len(kinds) and set(kinds[first:]) - set(kinds[:first]):
        raise EstimatorError(
            f"{r.field}.num_kv_shared_layers",
            "a layer kind that reuses a cache must have a layer of that kind producing it",
        )
    return [i >= first for i in range(len(kinds))]


def read_gemma4_text(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    s = read_shape(r, tied=True)
    kinds = _kinds(r, s.layers)
    widths = _widths(r, kinds, s.head_dim, s.kv_heads)
    shared = _shared(r, kinds)
    bias = r.bool("attention_bias", "attention_bias", default=False)
    k_eq_v = r.bool("attention_k_eq_v", "attention_bias", default=False)
    double = r.bool("use_double_wide_mlp", "intermediate_size", default=False)
    t = Tally()
    cached = []
    for kind, (dim, kv), reuse in zip(kinds, widths, shared, strict=True):
        t.linear("attention", "q_proj", s.h, s.heads * dim, 1, bias=bias)
        t.linear("attention", "o_proj", s.heads * dim, s.h, 1, bias=bias)
        t.add("norms", dim)  # q_norm
        if not reuse:
            t.linear("attention", "k_proj", s.h, kv * dim, 1, bias=bias)
            if not (k_eq_v and kind == "full_attention"):
                t.linear("attention", "v_proj", s.h, kv * dim, 1, bias=bias)
            t.add("norms", dim)  # k_norm (v_norm has no weight)
        cached.append(0 if reuse else 2 * kv * dim)
        t.gated_mlp("mlp", s.h, s.inter * (2 if double and reuse else 1), 1)
    t.add("norms", s.layers * 4 * s.h)
    _per_layer_inputs(t, r, s.h, s.layers)
    extra = _experts(t, r, s.h, s.layers)
    embeddings_and_head(t, s, final_norm=s.h)
    window = r.int("sliding_window", "sliding_window", default=512, maximum=MAX_HIDDEN * 100)
    sliding = tuple(i for i, k in enumerate(kinds) if k == "sliding_attention" and cached[i])
    return decoder_spec(
        s, t, r,
        f"{kinds.count('full_attention')} global + {kinds.count('sliding_attention')} sliding "
        f"layers, {sum(shared)} reusing an earlier layer's cache",
        kv_layer_widths=tuple(cached), sliding_window=window if sliding else None,
        sliding_layers=sliding or None, **extra,
    )  # fmt: skip


def _per_layer_inputs(t: Tally, r: Reader, h: int, layers: int) -> None:
    """Per-layer input embeddings, their projection from the model and, in every layer, the
    gate, projection and norm that mix them in."""
    width = r.int("hidden_size_per_layer_input", "hidden_size", default=256, minimum=0,
                  maximum=MAX_HIDDEN)  # fmt: skip
    if not width:
        return
    vocab = r.int("vocab_size_per_layer_input", "vocab_size", default=262144, maximum=MAX_VOCAB)
    t.add("embeddings", vocab * layers * width)
    t.linear("per_layer_inputs", "per_layer_model_projection", h, layers * width, 1, bias=False)
    t.add("norms", width)
    t.linear("per_layer_inputs", "per_layer_input_gate", h, width, layers, bias=False)
    t.linear("per_layer_inputs", "per_layer_projection", width, h, layers, bias=False)
    t.add("norms", layers * h)


def _experts(t: Tally, r: Reader, h: int, layers: int) -> dict[str, Any]:
    """The block of experts beside the MLP on every layer, where enable_moe_block."""
    if not r.bool("enable_moe_block", "num_experts", default=False):
        return {}
    experts = r.int("num_experts", "num_experts", maximum=MAX_EXPERTS)
    per_token = r.int("top_k_experts", "experts_per_token", maximum=experts)
    e_inter = r.int("moe_intermediate_size", "moe_intermediate_size", maximum=MAX_INTERMEDIATE)
    t.add("router", layers * (experts * h + h + experts))  # proj, scale, per_expert_scale
    t.linear("experts", "experts.gate_up_proj", h, 2 * e_inter, experts * layers, bias=False)
    t.linear("experts", "experts.down_proj", e_inter, h, experts * layers, bias=False)
    t.inactive += (experts - per_token) * layers * 3 * h * e_inter
    t.add("norms", layers * 3 * h)
    return moe_fields(experts, per_token, e_inter, layers)


def gemma4_vision(t: Tally, v: Mapping[str, Any], field: str, text_hidden: int) -> None:
    """Gemma4VisionModel (Gemma4VisionConfig's defaults): a 2-D learned position table and a
    patch projection, Gemma-style layers (q/k norms per head, four norms, a gated MLP, no
    biases), and the projection into the text model (embed_vision)."""
    h = read_int(v, "hidden_size", field, default=768, maximum=MAX_HIDDEN)
    inter = read_int(v, "intermediate_size", field, default=3072, maximum=MAX_INTERMEDIATE)
    layers = read_int(v, "num_hidden_layers", field, default=16, maximum=MAX_LAYERS)
    heads = read_int(v, "num_attention_heads", field, default=12, maximum=MAX_HEADS)
    kv_heads = read_int(v, "num_key_value_heads", field, default=heads, maximum=MAX_HEADS)
    head_dim = read_int(v, "head_dim", field, default=64, maximum=MAX_HIDDEN)
    patch = read_int(v, "patch_size", field, default=16, maximum=MAX_HIDDEN)
    positions = read_int(v, "position_embedding_size", field, default=10240, maximum=MAX_VOCAB)
    if read_bool(v, "attention_bias", field, default=False):
        raise EstimatorError(
            f"{field}.attention_bias",
            "a biased Gemma-4 vision tower is not counted exactly",
            code="unsupported_architecture",
        )
    t.add("vision_tower", 2 * positions * h)
    t.linear("vision_tower", "vision.input_proj", 3 * patch * patch, h, 1, bias=False)
    t.linear("vision_tower", "vision.q_proj", h, heads * head_dim, layers, bias=False)
    t.linear("vision_tower", "vision.k_proj", h, kv_heads * head_dim, layers, bias=False)
    t.linear("vision_tower", "vision.v_proj", h, kv_heads * head_dim, layers, bias=False)
    t.linear("vision_tower", "vision.o_proj", heads * head_dim, h, layers, bias=False)
    t.gated_mlp("vision_tower", h, inter, layers)
    t.add("vision_tower", layers * (2 * head_dim + 4 * h))  # q/k norms, four norms
    t.linear("projector", "embed_vision.embedding_projection", h, text_hidden, 1, bias=False)
