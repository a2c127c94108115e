"""The pieces this year's decoders are built from, counted as transformers builds them:
grouped-query attention (biases, gates, sinks, q/k norms), gated and plain MLPs, experts
stored fused (``gate_up_proj``), routers and shared experts; and the shape every decoder
reader reads the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import EstimatorError
from ..model import MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB
from ..parsing import check_int
from .counting import Reader, Tally


@dataclass(frozen=True)
class Shape:
    """The widths every decoder config states, its config class's defaults filled in."""

    h: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    tied: bool

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


def read_shape(
    r: Reader,
    *,
    tied: bool,
    inter_default: int | None = None,
    kv_default: int | None = None,
    head_dim_default: int | None = None,
    layers: int | None = None,
) -> Shape:
    """hidden, layers, heads, KV heads, head_dim (hidden / heads when null), the MLP width
    (``inter_default`` where a family with experts everywhere may leave it out), the
    vocabulary and whether the head is tied (``tied``: the config class's default).
    ``kv_default`` and ``head_dim_default``: the config class's fixed defaults for a key
    the config leaves out (an explicit null falls back to heads and hidden / heads).
    ``layers``: the layer count where a family takes it from its per-layer kinds."""
    h = r.int("hidden_size", "hidden_size", maximum=MAX_HIDDEN)
    heads = r.int("num_attention_heads", "num_heads", maximum=MAX_HEADS)
    absent = "head_dim" not in r.data
    head_dim = r.int(
        "head_dim", "head_dim", default=head_dim_default if absent else None, maximum=MAX_HIDDEN
    )
    if head_dim is None:
        head_dim = h // heads
        if not head_dim:
            raise EstimatorError(f"{r.field}.num_attention_heads", f"more heads than {h} widths")
    return Shape(
        h=h,
        layers=layers or r.int("num_hidden_layers", "num_layers", maximum=MAX_LAYERS),
        heads=heads,
        kv_heads=r.int(
            "num_key_value_heads",
            "num_kv_heads",
            default=absent_default(r, "num_key_value_heads", kv_default, heads),
            maximum=MAX_HEADS,
        ),  # fmt: skip
        head_dim=head_dim,
        inter=r.int(
            "intermediate_size",
            "intermediate_size",
            default=inter_default,
            maximum=MAX_INTERMEDIATE,
        )  # fmt: skip
        if inter_default is not None
        else r.int("intermediate_size", "intermediate_size", maximum=MAX_INTERMEDIATE),
        vocab=r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB),
        tied=r.bool("tie_word_embeddings", "tie_word_embeddings", default=tied),
    )


def absent_default(r: Reader, key: str, fixed: int | None, fallback: int) -> int:
    """A config class's default for ``key``: ``fixed`` (its dataclass default, where it has
    one) when the config leaves the key out, ``fallback`` (what its __post_init__ computes
    from None) when the key is absent without a fixed default or set to null."""
    return fixed if fixed is not None and key not in r.data else fallback


def attention(
    t: Tally,
    s: Shape,
    count: int,
    *,
    qkv_bias: bool = False,
    o_bias: bool = False,
    gate: bool = False,
) -> None:
    """q, k, v and o (``gate``: q_proj doubled for the output gate of gated attention)."""
    q_out = s.q_dim * (2 if gate else 1)
    t.linear("attention", "q_proj", s.h, q_out, count, bias=qkv_bias)
    t.linear("attention", "k_proj", s.h, s.kv_dim, count, bias=qkv_bias)
    t.linear("attention", "v_proj", s.h, s.kv_dim, count, bias=qkv_bias)
    t.linear("attention", "o_proj", s.q_dim, s.h, count, bias=o_bias)


def fused_experts(
    t: Tally, h: int, inter: int, experts: int, layers: int, per_token: int, *, bias: bool = False
) -> None:
    """Routed experts as transformers stores them now: one fused gate_up_proj (h -> 2 x
    inter) and one down_proj per expert; a token touches ``per_token`` of them."""
    count = experts * layers
    t.linear("experts", "experts.gate_up_proj", h, 2 * inter, count, bias=bias)
    t.linear("experts", "experts.down_proj", inter, h, count, bias=bias)
    per_expert = 3 * h * inter + ((2 * inter + h) if bias else 0)
    t.inactive += (experts - per_token) * layers * per_expert


def plain_mlp(t: Tally, component: str, h: int, inter: int, count: int, *, bias: bool) -> None:
    """An ungated MLP: up_proj and down_proj."""
    t.linear(component, f"{component}.up_proj", h, inter, count, bias=bias)
    t.linear(component, f"{component}.down_proj", inter, h, count, bias=bias)


def embeddings_and_head(t: Tally, s: Shape, *, final_norm: int, head_bias: bool = False) -> None:
    """Token embeddings, the final norm's ``final_norm`` parameters and an untied head."""
    t.add("embeddings", s.vocab * s.h)
    t.add("norms", final_norm)
    t.add("lm_head", (0 if s.tied else s.vocab * s.h) + (s.vocab if head_bias else 0))


def layer_types(r: Reader, layers: int) -> list[str] | None:
    """The config's ``layer_types`` (one string per layer), or None when absent."""
    value = r.data.get("layer_types")
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != layers:
        raise EstimatorError(f"{r.field}.layer_types", f"expected {layers} entries")
    if not all(isinstance(v, str) and len(v) <= 40 for v in value):
        raise EstimatorError(f"{r.field}.layer_types", "expected short strings")
    return value


def int_flags(r: Reader, key: str, layers: int) -> list[int] | None:
    """A per-layer list of integers (0/1 flags or indices), or None when absent."""
    value = r.data.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > layers:
        raise EstimatorError(f"{r.field}.{key}", f"expected at most {layers} entries")
    return [check_int(v, f"{r.field}.{key}", minimum=0, maximum=MAX_LAYERS) for v in value]


def rope_flags(r: Reader, layers: int, *, empty_is_default: bool) -> list[int]:
    """``no_rope_layers`` (1: the layer uses RoPE), else the config class's: every
    ``no_rope_layer_interval``-th layer without (SmolLM3, Llama-4). ``empty_is_default``:
    an empty list also takes the default (Llama4TextConfig), not only an absent one."""
    flags = int_flags(r, "no_rope_layers", layers)
    if flags is None or (empty_is_default and not flags):
        interval = r.int("no_rope_layer_interval", "num_layers", default=4, maximum=MAX_LAYERS)
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if len(flags) != layers:
        raise EstimatorError(f"{r.field}.no_rope_layers", f"expected {layers} entries")
    return flags


def moe_fields(experts: int, per_token: int, e_inter: int, moe_layers: int) -> dict[str, Any]:
    """The ModelSpec's mixture-of-experts fields."""
    return {
        "num_experts": experts,
        "experts_per_token": per_token,
        "moe_intermediate_size": e_inter,
        "num_moe_layers": moe_layers,
    }


def windowed(
    r: Reader,
    kinds: list[str] | None,
    names: tuple[str, ...],
    window_key: str = "sliding_window",
    default: int | None = None,
) -> tuple[int | None, tuple[int, ...] | None]:
    """The window (``default`` when the key is absent) and the layers whose ``layer_types``
    entry is one of ``names``; (None, None) when no layer is windowed or no window is set."""
    absent = window_key not in r.data  # an explicit null switches the window off
    window = r.int(
        window_key, "sliding_window", default=default if absent else None, maximum=MAX_POSITIONS
    )
    if window is None or kinds is None:
        return None, None
    sliding = tuple(i for i, kind in enumerate(kinds) if kind in names)
    return (window, sliding) if sliding else (None, None)


def pattern_kinds(
    r: Reader, layers: int, every: int, key: str = "sliding_window_pattern"
) -> list[str]:
    """The ``layer_types`` a config class builds when the config leaves them out: every
    ``every``-th layer full attention, the others windowed (``key``: the config's period)."""
    period = r.data.get(key, every)
    if not isinstance(period, int) or isinstance(period, bool) or period < 1:
        raise EstimatorError(
            f"{r.field}.{key}",
            f"{key}={period!r} without layer_types is not counted exactly",
            code="unsupported_architecture",
        )
    return ["sliding_attention" if (i + 1) % period else "full_attention" for i in range(layers)]


def spec(s: Shape, t: Tally, r: Reader, read_as: str, **extra: Any) -> dict[str, Any]:
    """The ModelSpec fields of a decoder counted into ``t``."""
    out: dict[str, Any] = {
        "hidden_size": s.h,
        "num_layers": s.layers,
        "num_heads": s.heads,
        "num_kv_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "intermediate_size": s.inter,
        "vocab_size": s.vocab,
        "tie_word_embeddings": s.tied,
        "exact": t.breakdown(),
        "read_as": read_as,
        "max_position_embeddings": r.int(
            "max_position_embeddings", "max_position_embeddings", default=None,
            maximum=MAX_POSITIONS,
        ),
    }  # fmt: skip
    out.update(extra)
    return out
