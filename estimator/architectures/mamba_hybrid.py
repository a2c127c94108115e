"""Mamba-2 hybrids as transformers' modeling_nemotron_h.py and modeling_granitemoehybrid.py
build them: each layer's mixer is a Mamba-2 block (no KV cache, a fixed conv and scan state
per sequence) or attention, beside plain MLPs, experts and shared experts."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..errors import EstimatorError
from ..model import MAX_EXPERTS, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS
from .counting import Reader, Tally
from .layers import Shape, attention, embeddings_and_head, moe_fields, plain_mlp, read_shape
from .layers import spec as decoder_spec

# Old names of layer kinds, as transformers' remap_legacy_layer_types renames them, and
# Nemotron-H's hybrid_override_pattern characters.
LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}
PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}


@dataclass(frozen=True)
class Mamba2:
    """A Mamba-2 mixer's widths: heads x head_dim is its inner width."""

    heads: int
    head_dim: int
    groups: int
    state: int
    kernel: int
    bias: bool
    conv_bias: bool

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state

    @property
    def state_elements(self) -> int:
        """What vLLM keeps per sequence: the conv state and the SSM state."""
        return (self.kernel - 1) * self.conv_dim + self.heads * self.head_dim * self.state


def mamba2_mixer(t: Tally, h: int, m: Mamba2, count: int) -> None:
    """in_proj (x, z, B, C, dt), the depthwise conv1d, dt_bias, A_log, D, the gated
    RMSNorm and out_proj, on ``count`` layers."""
    t.linear("mixer", "in_proj", h, m.inner + m.conv_dim + m.heads, count, bias=m.bias)
    t.add("mixer", count * (m.conv_dim * m.kernel + (m.conv_dim if m.conv_bias else 0)))
    t.add("mixer", count * 3 * m.heads)
    t.add("norms", count * m.inner)
    t.linear("mixer", "out_proj", m.inner, h, count, bias=m.bias)


def _kinds(r: Reader, keys: tuple[str, ...]) -> list[str]:
    """The per-layer kinds, from the first of ``keys`` the config has (a list, or
    Nemotron-H's pattern string), old names renamed."""
    for key in keys:
        value = r.data.get(key)
        if value is None:
            continue
        if isinstance(value, str) and key == "hybrid_override_pattern":
            if len(value) > MAX_LAYERS or any(c not in PATTERN for c in value):
                raise EstimatorError(f"{r.field}.{key}", "expected a pattern of M, E, * and -")
            return [PATTERN[c] for c in value]
        if not isinstance(value, list) or not 0 < len(value) <= MAX_LAYERS:
            raise EstimatorError(f"{r.field}.{key}", "expected a list of layer kinds")
        if not all(isinstance(v, str) for v in value):
            raise EstimatorError(f"{r.field}.{key}", "expected strings")
        return [str(LEGACY.get(v, v)) for v in value]
    raise EstimatorError(f"{r.field}.{keys[0]}", "required", code="required")


def _unknown(r: Reader, kinds: list[str], known: set[str]) -> None:
    unknown = sorted(set(kinds) - known)
    if unknown:
        raise EstimatorError(
            f"{r.field}.layer_types",
            f"layer kind {unknown[0]!r} is not counted exactly",
            code="unsupported_architecture",
        )


def read_nemotron_h(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """Nemotron-H (Nemotron-3): one mixer per layer (Mamba-2, attention, a plain MLP or
    non-gated experts with a shared expert), each after one RMSNorm."""
    kinds = _kinds(r, ("layers_block_type", "layer_types", "hybrid_override_pattern"))
    _unknown(r, kinds, {"linear_attention", "full_attention", "mlp", "moe"})
    # NemotronHForCausalLM ties nothing (_tied_weights_keys is empty), whatever the flag says
    s = replace(
        read_shape(r, tied=False, kv_default=8, head_dim_default=128, layers=len(kinds)),
        tied=False,
    )
    m = Mamba2(
        heads=r.int("mamba_num_heads", "num_heads", default=128, maximum=MAX_HEADS),
        head_dim=r.int("mamba_head_dim", "head_dim", default=64, maximum=MAX_HIDDEN),
        groups=r.int("n_groups", "num_kv_heads", default=8, maximum=MAX_HEADS),
        state=r.int("ssm_state_size", "state_elements", default=128, maximum=MAX_HIDDEN),
        kernel=r.int("conv_kernel", "state_elements", default=4, maximum=64),
        bias=r.bool("use_bias", "mlp_bias", default=False),
        conv_bias=r.bool("use_conv_bias", "mlp_bias", default=True),
    )
    count = {kind: kinds.count(kind) for kind in ("linear_attention", "full_attention", "mlp")}
    moe = kinds.count("moe")
    mlp_bias = r.bool("mlp_bias", "mlp_bias", default=False)
    t = Tally()
    mamba2_mixer(t, s.h, m, count["linear_attention"])
    attention(t, s, count["full_attention"])
    plain_mlp(t, "mlp", s.h, s.inter, count["mlp"], bias=mlp_bias)
    extra = _nemotron_experts(t, r, s, moe, mlp_bias) if moe else {}
    t.add("norms", s.layers * s.h)
    embeddings_and_head(t, s, final_norm=s.h)
    return decoder_spec(
        s, t, r,
        f"{count['linear_attention']} Mamba-2 + {count['full_attention']} attention + "
        f"{count['mlp']} MLP + {moe} MoE layers (KV cache on the attention layers only)",
        gated_mlp=False, kv_layers=count["full_attention"],
        state_elements=count["linear_attention"] * m.state_elements, **extra,
    )  # fmt: skip


def _nemotron_experts(t: Tally, r: Reader, s: Shape, moe: int, bias: bool) -> dict[str, Any]:
    """Non-gated experts (up, down) on an optional latent width, a router, a shared MLP."""
    experts = r.int("n_routed_experts", "num_experts", default=8, maximum=MAX_EXPERTS)
    per_token = r.int("num_experts_per_tok", "experts_per_token", default=2, maximum=experts)
    e_inter = r.int("moe_intermediate_size", "moe_intermediate_size", default=7688,
                    maximum=MAX_INTERMEDIATE)  # fmt: skip
    s_inter = r.int("moe_shared_expert_intermediate_size", "shared_expert_intermediate_size",
                    default=7688, maximum=MAX_INTERMEDIATE)  # fmt: skip
    latent = r.int("moe_latent_size", "moe_intermediate_size", default=None, maximum=MAX_HIDDEN)
    width = latent or s.h
    if latent:
        t.linear("experts", "fc1_latent_proj", s.h, latent, moe, bias=bias)
        t.linear("experts", "fc2_latent_proj", latent, s.h, moe, bias=bias)
    t.linear("experts", "experts.up_proj", width, e_inter, experts * moe, bias=False)
    t.linear("experts", "experts.down_proj", e_inter, width, experts * moe, bias=False)
    t.inactive += (experts - per_token) * moe * 2 * width * e_inter
    t.add("router", moe * experts * s.h)
    plain_mlp(t, "shared_expert", s.h, s_inter, moe, bias=bias)
    return moe_fields(experts, per_token, e_inter, moe)


def read_granitemoehybrid(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """Granite-4.0-H: Mamba-2 or attention per layer, each followed by experts (where
    num_local_experts > 0) and a gated shared MLP; two RMSNorms a layer."""
    layers = r.int("num_hidden_layers", "num_layers", maximum=MAX_LAYERS)
    has_kinds = any(r.data.get(k) is not None for k in ("layer_types", "layers_block_type"))
    # GraniteMoeHybridConfig: every layer Mamba-2 where the config lists no kinds
    kinds = (
        _kinds(r, ("layer_types", "layers_block_type"))
        if has_kinds
        else ["linear_attention"] * layers
    )
    if len(kinds) != layers:
        raise EstimatorError(f"{r.field}.layer_types", f"expected {layers} entries")
    _unknown(r, kinds, {"linear_attention", "full_attention"})
    s = read_shape(r, tied=False, layers=layers)
    expand = r.int("mamba_expand", "intermediate_size", default=2, maximum=64)
    m = _mamba_n(r, expand * s.h, "mamba_expand x hidden_size")
    ssm = kinds.count("linear_attention")
    experts = r.int("num_local_experts", "num_experts", default=8, minimum=0, maximum=MAX_EXPERTS)
    per_token = r.int("num_experts_per_tok", "experts_per_token", default=2, minimum=0,
                      maximum=max(experts, 1)) if experts else 0  # fmt: skip
    shared = r.int("shared_intermediate_size", "shared_expert_intermediate_size",
                   default=1024, minimum=0, maximum=MAX_INTERMEDIATE)  # fmt: skip
    t = Tally()
    mamba2_mixer(t, s.h, m, ssm)
    attention(t, s, layers - ssm, qkv_bias=(bias := r.bool("attention_bias", "attention_bias",
              default=False)), o_bias=bias)  # fmt: skip
    if experts:
        t.add("router", layers * experts * s.h)
        t.linear("experts", "experts.gate_up_proj", s.h, 2 * s.inter, experts * layers, bias=False)
        t.linear("experts", "experts.down_proj", s.inter, s.h, experts * layers, bias=False)
        t.inactive += (experts - per_token) * layers * 3 * s.h * s.inter
    t.linear("shared_expert", "shared_mlp.input_linear", s.h, 2 * shared, layers, bias=False)
    t.linear("shared_expert", "shared_mlp.output_linear", shared, s.h, layers, bias=False)
    t.add("norms", layers * 2 * s.h)
    embeddings_and_head(t, s, final_norm=s.h)
    moe = moe_fields(experts, per_token, s.inter, layers)
    return decoder_spec(
        s, t, r,
        f"{ssm} Mamba-2 + {layers - ssm} attention layers, each with "
        f"{experts} experts and a shared MLP (KV cache on the attention layers only)",
        kv_layers=layers - ssm, state_elements=ssm * m.state_elements,
        shared_expert_intermediate_size=shared, **(moe if experts else {}),
    )  # fmt: skip


def _mamba_n(r: Reader, inner: int, width: str) -> Mamba2:
    """Granite-4.0-H's and Falcon-H1's Mamba-2 keys (``mamba_n_heads``, ``mamba_d_head``
    "auto": the width over the heads, ...) for a mixer ``inner`` wide."""
    heads = r.int("mamba_n_heads", "num_heads", default=128, maximum=MAX_HEADS)
    head_dim = r.data.get("mamba_d_head", "auto")
    head_dim = (
        inner // heads if head_dim in ("auto", None)
        else r.int("mamba_d_head", "head_dim", maximum=MAX_HIDDEN)
    )  # fmt: skip
    if head_dim * heads != inner:
        raise EstimatorError(
            f"{r.field}.mamba_d_head", f"mamba_d_head x mamba_n_heads must be {width}"
        )
    return Mamba2(
        heads=heads, head_dim=head_dim,
        groups=r.int("mamba_n_groups", "num_kv_heads", default=1, maximum=MAX_HEADS),
        state=r.int("mamba_d_state", "state_elements", default=256, maximum=MAX_HIDDEN),
        kernel=r.int("mamba_d_conv", "state_elements", default=4, maximum=64),
        bias=r.bool("mamba_proj_bias", "mlp_bias", default=False),
        conv_bias=r.bool("mamba_conv_bias", "mlp_bias", default=True),
    )  # fmt: skip


def read_falcon_h1(r: Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """Falcon-H1: attention and a Mamba-2 mixer in parallel on every layer, then a gated
    MLP; the mixer's width is mamba_d_ssm (or mamba_expand x hidden), its gated norm only
    where mamba_rms_norm; the multipliers are constants, not weights."""
    layers = r.int("num_hidden_layers", "num_layers", maximum=MAX_LAYERS)
    s = read_shape(r, tied=False, kv_default=8, layers=layers)
    expand = r.int("mamba_expand", "intermediate_size", default=2, maximum=64)
    inner = r.int("mamba_d_ssm", "intermediate_size", default=expand * s.h, maximum=MAX_HIDDEN)
    m = _mamba_n(r, inner, "the mixer's width (mamba_d_ssm)")
    out_bias = r.bool("projectors_bias", "mlp_bias", default=False)
    t = Tally()
    t.linear("mixer", "in_proj", s.h, m.inner + m.conv_dim + m.heads, layers, bias=m.bias)
    t.add("mixer", layers * (m.conv_dim * m.kernel + (m.conv_dim if m.conv_bias else 0)))
    t.add("mixer", layers * 3 * m.heads)
    if r.bool("mamba_rms_norm", "norm", default=False):
        t.add("norms", layers * m.inner)
    t.linear("mixer", "out_proj", m.inner, s.h, layers, bias=out_bias)
    bias = r.bool("attention_bias", "attention_bias", default=False)
    attention(t, s, layers, qkv_bias=bias, o_bias=bias)
    t.gated_mlp("mlp", s.h, s.inter, layers, bias=r.bool("mlp_bias", "mlp_bias", default=False))
    t.add("norms", layers * 2 * s.h)
    embeddings_and_head(t, s, final_norm=s.h)
    return decoder_spec(
        s, t, r, "attention and a Mamba-2 mixer in parallel on every layer",
        state_elements=layers * m.state_elements,
    )  # fmt: skip
