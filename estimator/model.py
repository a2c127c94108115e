"""Model architecture: ``ModelSpec``, its validation and its parameter count.

The parameter count is derived from the architecture the way the Hugging Face
implementations build the model:

- token embeddings once, plus an LM head of the same size unless the embeddings
  are tied (encoders have no LM head);
- attention with separate query and key/value head counts (GQA/MQA):
  q: hidden x heads*head_dim, k and v: hidden x kv_heads*head_dim,
  o: heads*head_dim x hidden, with the biases the family has (Qwen2: q/k/v only;
  GPT-2, StarCoder, BERT: all);
- the MLP gated (gate, up, down) or not (fc, proj), with biases where the
  family has them;
- for a mixture of experts every expert is counted for the weights (and the
  router, and a shared expert where there is one); only the active experts
  count for compute and activations;
- every norm (RMSNorm: weight; LayerNorm: weight and bias), and learned
  position / token-type embeddings where the family has them.

The builders from user input are in config_json.py, plain_numbers.py,
safetensors.py and catalog.py; every builder raises ``EstimatorError`` for bad
input, never anything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .errors import EstimatorError
from .families import FAMILIES
from .parsing import check_bool, check_choice, check_int
from .quantization import UNSUPPORTED, Quantization, check_skip_patterns, role

NORMS = ("rmsnorm", "layernorm")
WEIGHT_FORMATS = ("fp32", "fp16", "bf16", "fp8", "int8", "nf4", "int4", "gptq", "awq", "mxfp4")

MAX_PARAMS = 10**13
MAX_HIDDEN = 10**6
MAX_LAYERS = 10**4
MAX_HEADS = 10**5
MAX_INTERMEDIATE = 10**7
MAX_VOCAB = 10**7
MAX_EXPERTS = 10**5
MAX_POSITIONS = 10**8


@dataclass(frozen=True)
class ParamBreakdown:
    """Parameters by component; ``linears`` are the matrices a quantizer converts."""

    components: dict[str, int]
    linears: tuple[tuple[str, int, int, int], ...]  # (module, in_features, out_features, count)
    linear_params: int  # weights of the quantizable matrices
    other_params: int  # embeddings, LM head, norms, biases, router, pooler: stay 16-bit
    total: int
    active: int  # per token: a mixture of experts touches only experts_per_token experts


@dataclass(frozen=True)
class ModelSpec:
    """One model's architecture, as far as memory is concerned."""

    name: str
    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    # Mixture of experts (num_experts 0: dense).
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int | None = None  # None: intermediate_size
    shared_expert_intermediate_size: int = 0
    num_moe_layers: int | None = None  # None: every layer when num_experts > 0
    # Sliding-window attention: the window, and which layers use it (None: all).
    sliding_window: int | None = None
    sliding_layers: tuple[int, ...] | None = None
    # Structure flags.
    attention_bias: bool = False  # bias on q, k, v and o
    qkv_bias: bool = False  # bias on q, k and v only (Qwen2)
    mlp_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3)
    gated_mlp: bool = True
    norm: str = "rmsnorm"
    norms_per_layer: int = 2
    final_norm: bool = True
    lm_head_bias: bool = False  # a bias on the output projection (Phi)
    # OPT: token embeddings narrower than the model, projected in and out (None: hidden)
    embed_dim: int | None = None
    learned_positions: int = 0  # rows of a learned position-embedding table
    token_types: int = 0  # rows of a token-type embedding table (BERT)
    embedding_norm: bool = False
    pooler: bool = False
    encoder_only: bool = False
    max_position_embeddings: int | None = None
    qk_norm_full: bool = False  # q and k RMSNorm over all heads at once (OLMo-2), not per head
    # KV cache where it is not 2 x kv_heads x head_dim on every layer (docs/estimator.md).
    kv_layers: int | None = None  # layers that cache keys and values (None: every layer)
    kv_width: int | None = None  # elements per token and caching layer (None: 2 x kv_dim)
    state_elements: int = 0  # fixed state per sequence (SSM convolution and scan state)
    # Bytes per token whatever the KV dtype, on every layer that keeps them: the DSA
    # indexer's fp8 key cache with its scales (docs/estimator.md).
    index_bytes_per_token: int = 0
    # Elements each layer caches per token where layers differ (Gemma-4: wider global layers,
    # layers that reuse another's cache); None: kv_width (or 2 x kv_dim) on kv_layers layers.
    kv_layer_widths: tuple[int, ...] | None = None
    # Counted by an estimator/architectures module (latent attention, SSM, vision towers).
    exact: ParamBreakdown | None = None
    read_as: str = ""  # the family the model was read as, and from what
    # Provenance and exact figures.
    source: str = ""
    published_params: int | None = None
    published_source: str = ""
    tensor_bytes: int | None = None  # exact bytes of the stored checkpoint
    stored_format: str | None = None  # format of those bytes, e.g. "bf16", "gptq"
    quantization: Quantization | None = None  # a quantized checkpoint's layout (quantization.py)
    param_count_override: int | None = None  # exact element count (safetensors, or given)
    quant_group_size: int | None = None  # from a GPTQ/AWQ quantization_config
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _validate_spec(self)

    # -- derived figures ------------------------------------------------------

    @cached_property
    def breakdown(self) -> ParamBreakdown:
        return _count(self)

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def moe_layers(self) -> int:
        if not self.is_moe:
            return 0
        return self.num_layers if self.num_moe_layers is None else self.num_moe_layers

    @property
    def expert_intermediate(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def sliding_layer_count(self) -> int:
        if self.sliding_window is None:
            return 0
        return self.num_layers if self.sliding_layers is None else len(self.sliding_layers)

    @property
    def kv_layer_count(self) -> int:
        if self.encoder_only:
            return 0
        if self.kv_layer_widths is not None:
            return sum(1 for width in self.kv_layer_widths if width)
        return self.num_layers if self.kv_layers is None else self.kv_layers

    @property
    def kv_elements_per_slot(self) -> int:
        """Cached elements per token and layer: K and V of every KV head, or the latent."""
        return 2 * self.kv_dim if self.kv_width is None else self.kv_width

    def kv_bytes_per_token(self, bytes_per_element: float = 2) -> float:
        """KV cache per token over the caching layers (uncapped by any window)."""
        if self.kv_layer_widths is not None:
            elements = sum(self.kv_layer_widths)
        else:
            elements = self.kv_elements_per_slot * self.kv_layer_count
        return elements * bytes_per_element + self.index_bytes_per_token

    def state_bytes_per_sequence(self, bytes_per_element: float = 2) -> float:
        """Fixed recurrent state per sequence, whatever its length (SSM layers)."""
        return self.state_elements * bytes_per_element

    def kv_token_slots(self, context: int, block: int = 1) -> int:
        """Sum over layers of min(context, that layer's window), each rounded up to blocks."""
        layers = self.kv_layer_count
        if not layers:
            return 0
        full = -(-context // block) * block
        sliding = self.sliding_layer_count
        if not sliding:
            return layers * full
        capped = -(-min(context, self.sliding_window or context) // block) * block
        return sliding * capped + (layers - sliding) * full

    def kv_cache_elements(self, context: int, block: int = 1) -> int:
        """Elements one sequence of ``context`` tokens caches over every layer, each layer
        capped at its window, rounded up to blocks."""
        if self.kv_layer_widths is None:
            return self.kv_token_slots(context, block) * self.kv_elements_per_slot
        full = -(-context // block) * block
        capped = -(-min(context, self.sliding_window or context) // block) * block
        sliding = set(self.sliding_layers or ()) if self.sliding_window else set()
        return sum(
            width * (capped if i in sliding else full)
            for i, width in enumerate(self.kv_layer_widths)
        )


def param_count(model: ModelSpec) -> int:
    """Total parameters: exact when a checkpoint gave them, else derived."""
    if model.param_count_override is not None:
        return model.param_count_override
    return model.breakdown.total


def param_breakdown(model: ModelSpec) -> dict[str, int]:
    """Derived parameters by component (embeddings, attention, mlp/experts, norms, lm_head...)."""
    return dict(model.breakdown.components)


# -- counting ------------------------------------------------------------------

Linear = tuple[str, int, int, int]  # (module, in_features, out_features, count)


def _count(m: ModelSpec) -> ParamBreakdown:
    """Parameters by component, each counted as the Hugging Face implementation builds it;
    ``linears`` collects the quantizable matrices in the order the counts meet them."""
    if m.exact is not None:
        return m.exact
    h = m.hidden_size
    linears: list[Linear] = []
    width = m.embed_dim or h
    components = {
        "embeddings": m.vocab_size * width,
        "position_embeddings": (m.learned_positions + m.token_types) * h,
        "projections": 2 * width * h if width != h else 0,  # in to the model's width, and back
        "attention": _attention(m, linears),
        "mlp": _dense_mlp(m, linears),
        **_mixture(m, linears),
        "norms": _norms(m),
        "lm_head": _lm_head(m, width),
        "pooler": h * h + h if m.pooler else 0,
    }
    components = {k: v for k, v in components.items() if v}
    total = sum(components.values())
    linear_params = sum(i * o * c for _, i, o, c in linears)
    inactive = 0
    if m.moe_layers:
        inactive = (
            (m.num_experts - m.experts_per_token) * m.moe_layers * 3 * h * m.expert_intermediate
        )
    return ParamBreakdown(
        components=components,
        linears=tuple(linears),
        linear_params=linear_params,
        other_params=total - linear_params,
        total=total,
        active=total - inactive,
    )


def _attention(m: ModelSpec, linears: list[Linear]) -> int:
    """q, k, v and o on every layer, with the biases the family has."""
    h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
    layers = m.num_layers
    linears += [
        ("q_proj", h, q, layers),
        ("k_proj", h, kv, layers),
        ("v_proj", h, kv, layers),
        ("o_proj", q, h, layers),
    ]
    attn_bias = (q + 2 * kv + h) if m.attention_bias else (q + 2 * kv) if m.qkv_bias else 0
    return layers * (2 * h * q + 2 * h * kv + attn_bias)


def _dense_mlp(m: ModelSpec, linears: list[Linear]) -> int:
    """The MLP of every layer without experts: gated (gate, up, down) or plain (up, down)."""
    h, inter = m.hidden_size, m.intermediate_size
    dense_layers = m.num_layers - m.moe_layers
    if not dense_layers:
        return 0
    if m.gated_mlp:
        linears += [
            ("gate_proj", h, inter, dense_layers),
            ("up_proj", h, inter, dense_layers),
            ("down_proj", inter, h, dense_layers),
        ]
        bias = (2 * inter + h) if m.mlp_bias else 0
        return dense_layers * (3 * h * inter + bias)
    linears += [("up_proj", h, inter, dense_layers), ("down_proj", inter, h, dense_layers)]
    bias = (inter + h) if m.mlp_bias else 0
    return dense_layers * (2 * h * inter + bias)


def _mixture(m: ModelSpec, linears: list[Linear]) -> dict[str, int]:
    """Every expert of every MoE layer, the router, and a shared expert where there is one."""
    moe_layers = m.moe_layers
    if not moe_layers:
        return {"experts": 0, "router": 0, "shared_expert": 0}
    h, e_inter = m.hidden_size, m.expert_intermediate
    count = m.num_experts * moe_layers
    linears += [
        ("experts.gate_proj", h, e_inter, count),
        ("experts.up_proj", h, e_inter, count),
        ("experts.down_proj", e_inter, h, count),
    ]
    shared = 0
    if m.shared_expert_intermediate_size:
        s_inter = m.shared_expert_intermediate_size
        linears += [
            ("shared_expert.gate_proj", h, s_inter, moe_layers),
            ("shared_expert.up_proj", h, s_inter, moe_layers),
            ("shared_expert.down_proj", s_inter, h, moe_layers),
        ]
        shared = moe_layers * (3 * h * s_inter + h)  # + the shared expert's gate (h -> 1)
    return {
        "experts": count * 3 * h * e_inter,
        "router": moe_layers * h * m.num_experts,
        "shared_expert": shared,
    }


def _norms(m: ModelSpec) -> int:
    """RMSNorm: a weight; LayerNorm: a weight and a bias; q/k norms per head or over all."""
    h, layers = m.hidden_size, m.num_layers
    norm_size = h if m.norm == "rmsnorm" else 2 * h
    norms = layers * m.norms_per_layer * norm_size
    if m.qk_norm:
        norms += layers * (m.q_dim + m.kv_dim if m.qk_norm_full else 2 * m.head_dim)
    norms += norm_size if m.final_norm else 0
    norms += norm_size if m.embedding_norm else 0
    return norms


def _lm_head(m: ModelSpec, width: int) -> int:
    """An untied decoder's output projection (and its bias, where the family has one)."""
    lm_head = 0 if (m.tie_word_embeddings or m.encoder_only) else m.vocab_size * width
    lm_head += m.vocab_size if m.lm_head_bias and not m.encoder_only else 0
    return lm_head


# -- validation ----------------------------------------------------------------

_FLAGS = (
    "tie_word_embeddings",
    "attention_bias",
    "qkv_bias",
    "mlp_bias",
    "qk_norm",
    "gated_mlp",
    "final_norm",
    "embedding_norm",
    "pooler",
    "encoder_only",
    "lm_head_bias",
    "qk_norm_full",
)


def _validate_spec(m: ModelSpec) -> None:
    """Every field checked, in this order (the first problem is the one reported), then the
    parameter count, which is kept."""
    _validate_shape(m, "model")
    _validate_structure(m, "model")
    _validate_experts(m, "model")
    _validate_attention_span(m, "model")
    _validate_provenance(m, "model")
    breakdown = _count(m)
    if breakdown.total > MAX_PARAMS:
        raise EstimatorError(
            "model.hidden_size", f"{breakdown.total:,} parameters is over the 10^13 limit"
        )
    m.__dict__["breakdown"] = breakdown  # fills the cached_property once
    if m.quantization is not None:
        _validate_quantization(m, m.quantization, breakdown, "model")


def _validate_shape(m: ModelSpec, f: str) -> None:
    if not isinstance(m.name, str) or not m.name or len(m.name) > 200:
        raise EstimatorError(f"{f}.name", "expected a name of 1 to 200 characters")
    check_choice(m.family, f"{f}.family", FAMILIES)
    check_choice(m.norm, f"{f}.norm", NORMS)
    check_int(m.hidden_size, f"{f}.hidden_size", maximum=MAX_HIDDEN)
    check_int(m.num_layers, f"{f}.num_layers", maximum=MAX_LAYERS)
    check_int(m.num_heads, f"{f}.num_heads", maximum=MAX_HEADS)
    check_int(m.num_kv_heads, f"{f}.num_kv_heads", maximum=MAX_HEADS)
    check_int(m.head_dim, f"{f}.head_dim", maximum=MAX_HIDDEN)
    check_int(m.intermediate_size, f"{f}.intermediate_size", maximum=MAX_INTERMEDIATE)
    check_int(m.vocab_size, f"{f}.vocab_size", maximum=MAX_VOCAB)
    if m.num_heads % m.num_kv_heads:
        raise EstimatorError(
            f"{f}.num_kv_heads",
            f"{m.num_kv_heads} KV heads do not divide {m.num_heads} attention heads",
        )


def _validate_structure(m: ModelSpec, f: str) -> None:
    for name in _FLAGS:
        check_bool(getattr(m, name), f"{f}.{name}")
    check_int(m.norms_per_layer, f"{f}.norms_per_layer", minimum=0, maximum=16)
    check_int(m.learned_positions, f"{f}.learned_positions", minimum=0, maximum=MAX_POSITIONS)
    check_int(m.token_types, f"{f}.token_types", minimum=0, maximum=MAX_VOCAB)


def _validate_experts(m: ModelSpec, f: str) -> None:
    check_int(m.num_experts, f"{f}.num_experts", minimum=0, maximum=MAX_EXPERTS)
    check_int(m.experts_per_token, f"{f}.experts_per_token", minimum=0, maximum=MAX_EXPERTS)
    check_int(
        m.shared_expert_intermediate_size,
        f"{f}.shared_expert_intermediate_size",
        minimum=0,
        maximum=MAX_INTERMEDIATE,
    )
    if not m.num_experts:
        if m.experts_per_token:
            raise EstimatorError(f"{f}.experts_per_token", "set, but the model has no experts")
        return
    if not 1 <= m.experts_per_token <= m.num_experts:
        raise EstimatorError(
            f"{f}.experts_per_token",
            f"must be between 1 and num_experts ({m.num_experts})",
        )
    if m.moe_intermediate_size is not None:
        check_int(m.moe_intermediate_size, f"{f}.moe_intermediate_size", maximum=MAX_INTERMEDIATE)
    if m.num_moe_layers is not None:
        check_int(m.num_moe_layers, f"{f}.num_moe_layers", minimum=0, maximum=m.num_layers)


def _validate_attention_span(m: ModelSpec, f: str) -> None:
    """The sliding window and its layers, the KV cache's layers and width, the SSM state."""
    if m.sliding_window is not None:
        check_int(m.sliding_window, f"{f}.sliding_window", maximum=MAX_POSITIONS)
    if m.sliding_layers is not None:
        if not isinstance(m.sliding_layers, tuple) or len(m.sliding_layers) > m.num_layers:
            raise EstimatorError(f"{f}.sliding_layers", "expected at most one index per layer")
        seen: set[int] = set()
        for index in m.sliding_layers:
            check_int(index, f"{f}.sliding_layers", minimum=0, maximum=m.num_layers - 1)
            if index in seen:
                raise EstimatorError(f"{f}.sliding_layers", f"layer {index} listed twice")
            seen.add(index)
    if m.kv_layers is not None:
        check_int(m.kv_layers, f"{f}.kv_layers", minimum=0, maximum=m.num_layers)
    if m.kv_width is not None:
        check_int(m.kv_width, f"{f}.kv_width", maximum=MAX_HIDDEN)
    check_int(m.state_elements, f"{f}.state_elements", minimum=0, maximum=MAX_PARAMS)
    check_int(m.index_bytes_per_token, f"{f}.index_bytes_per_token", minimum=0, maximum=MAX_PARAMS)


def _validate_quantization(m: ModelSpec, q: Quantization, b: ParamBreakdown, f: str) -> None:
    """A quantized checkpoint's layout: it must convert something this model has, and name
    no single layer of a module it converts (the breakdown counts modules over all layers)."""
    if not isinstance(q, Quantization):
        raise EstimatorError(f"{f}.quantization", "expected a Quantization")
    modules = [name for name, *_ in b.linears]
    if q.experts_only and not any(role(name) == "experts" for name in modules):
        raise EstimatorError(
            f"{f}.quantization",
            f"{q.method} converts only MoE experts, and {m.name} has none",
            code=UNSUPPORTED,
        )
    check_skip_patterns(q, modules, f"{f}.quantization")


def _validate_provenance(m: ModelSpec, f: str) -> None:
    """How the model was read and the exact figures a checkpoint gave."""
    if m.exact is not None and not isinstance(m.exact, ParamBreakdown):
        raise EstimatorError(f"{f}.exact", "expected a ParamBreakdown")
    if not isinstance(m.read_as, str) or len(m.read_as) > 300:
        raise EstimatorError(f"{f}.read_as", "expected a string of at most 300 characters")
    if m.max_position_embeddings is not None:
        check_int(m.max_position_embeddings, f"{f}.max_position_embeddings", maximum=MAX_POSITIONS)
    if m.published_params is not None:
        check_int(m.published_params, f"{f}.published_params", maximum=MAX_PARAMS)
    if m.param_count_override is not None:
        check_int(m.param_count_override, f"{f}.params", maximum=MAX_PARAMS)
    if m.tensor_bytes is not None:
        check_int(m.tensor_bytes, f"{f}.tensor_bytes", maximum=MAX_PARAMS * 8)
    if m.stored_format is not None:
        check_choice(m.stored_format, f"{f}.stored_format", WEIGHT_FORMATS)
    if m.quant_group_size is not None:
        check_int(m.quant_group_size, f"{f}.quant_group_size", maximum=1 << 20)
    if not isinstance(m.notes, tuple):
        raise EstimatorError(f"{f}.notes", "expected a tuple of strings")
