"""Model architecture: ``ModelSpec``, its parameter count, and builders from user input.

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

Every builder raises ``EstimatorError`` for bad input, never anything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from ._parse import check_bool, check_choice, check_int, read_bool, read_int
from .errors import EstimatorError, unknown_field

FAMILIES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "phi3",
    "gpt2",
    "gpt_bigcode",
    "bert",
    "roberta",
    "generic",
)
NORMS = ("rmsnorm", "layernorm")
WEIGHT_FORMATS = ("fp32", "fp16", "bf16", "fp8", "int8", "nf4", "int4", "gptq", "awq")

MAX_PARAMS = 10**13
MAX_HIDDEN = 10**6
MAX_LAYERS = 10**4
MAX_HEADS = 10**5
MAX_INTERMEDIATE = 10**7
MAX_VOCAB = 10**7
MAX_EXPERTS = 10**5
MAX_POSITIONS = 10**8

# Family defaults, from each family's transformers config class and modeling code.
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gpt2", "gpt_bigcode"}
_GPT_LIKE = {"gpt2", "gpt_bigcode"}
_ENCODERS = {"bert", "roberta"}


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
    learned_positions: int = 0  # rows of a learned position-embedding table
    token_types: int = 0  # rows of a token-type embedding table (BERT)
    embedding_norm: bool = False
    pooler: bool = False
    encoder_only: bool = False
    max_position_embeddings: int | None = None
    # Provenance and exact figures.
    source: str = ""
    published_params: int | None = None
    published_source: str = ""
    tensor_bytes: int | None = None  # exact bytes of the stored checkpoint
    stored_format: str | None = None  # format of those bytes, e.g. "bf16", "gptq"
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

    def kv_bytes_per_token(self, bytes_per_element: float = 2) -> float:
        """KV cache per token over all layers: 2 x kv_heads x head_dim x bytes per layer."""
        if self.encoder_only:
            return 0
        return 2 * self.kv_dim * bytes_per_element * self.num_layers

    def kv_token_slots(self, context: int, block: int = 1) -> int:
        """Sum over layers of min(context, that layer's window), each rounded up to blocks."""
        if self.encoder_only:
            return 0
        full = -(-context // block) * block
        sliding = self.sliding_layer_count
        if not sliding:
            return self.num_layers * full
        capped = -(-min(context, self.sliding_window or context) // block) * block
        return sliding * capped + (self.num_layers - sliding) * full


# BERT-style encoders: biased attention and MLP, post-LayerNorm with an embedding norm,
# a pooler, no final norm and no LM head.
ENCODER_FLAGS: dict[str, Any] = {
    "attention_bias": True,
    "mlp_bias": True,
    "gated_mlp": False,
    "norm": "layernorm",
    "final_norm": False,
    "embedding_norm": True,
    "pooler": True,
    "encoder_only": True,
}


def param_count(model: ModelSpec) -> int:
    """Total parameters: exact when a checkpoint gave them, else derived."""
    if model.param_count_override is not None:
        return model.param_count_override
    return model.breakdown.total


def param_breakdown(model: ModelSpec) -> dict[str, int]:
    """Derived parameters by component (embeddings, attention, mlp/experts, norms, lm_head...)."""
    return dict(model.breakdown.components)


# -- counting ------------------------------------------------------------------


def _count(m: ModelSpec) -> ParamBreakdown:
    h, q, kv = m.hidden_size, m.q_dim, m.kv_dim
    layers = m.num_layers
    norm_size = h if m.norm == "rmsnorm" else 2 * h

    linears: list[tuple[str, int, int, int]] = [
        ("q_proj", h, q, layers),
        ("k_proj", h, kv, layers),
        ("v_proj", h, kv, layers),
        ("o_proj", q, h, layers),
    ]
    attn_bias = (q + 2 * kv + h) if m.attention_bias else (q + 2 * kv) if m.qkv_bias else 0
    attention = layers * (2 * h * q + 2 * h * kv + attn_bias)

    moe_layers = m.moe_layers
    dense_layers = layers - moe_layers
    inter = m.intermediate_size
    mlp = 0
    if dense_layers:
        if m.gated_mlp:
            linears += [
                ("gate_proj", h, inter, dense_layers),
                ("up_proj", h, inter, dense_layers),
                ("down_proj", inter, h, dense_layers),
            ]
            bias = (2 * inter + h) if m.mlp_bias else 0
            mlp = dense_layers * (3 * h * inter + bias)
        else:
            linears += [("up_proj", h, inter, dense_layers), ("down_proj", inter, h, dense_layers)]
            bias = (inter + h) if m.mlp_bias else 0
            mlp = dense_layers * (2 * h * inter + bias)

    experts = router = shared = 0
    if moe_layers:
        e_inter = m.expert_intermediate
        count = m.num_experts * moe_layers
        linears += [
            ("experts.gate_proj", h, e_inter, count),
            ("experts.up_proj", h, e_inter, count),
            ("experts.down_proj", e_inter, h, count),
        ]
        experts = count * 3 * h * e_inter
        router = moe_layers * h * m.num_experts
        if m.shared_expert_intermediate_size:
            s_inter = m.shared_expert_intermediate_size
            linears += [
                ("shared_expert.gate_proj", h, s_inter, moe_layers),
                ("shared_expert.up_proj", h, s_inter, moe_layers),
                ("shared_expert.down_proj", s_inter, h, moe_layers),
            ]
            shared = moe_layers * (3 * h * s_inter + h)  # + the shared expert's gate (h -> 1)

    norms = layers * m.norms_per_layer * norm_size
    norms += layers * 2 * m.head_dim if m.qk_norm else 0
    norms += norm_size if m.final_norm else 0
    norms += norm_size if m.embedding_norm else 0

    embeddings = m.vocab_size * h
    positions = (m.learned_positions + m.token_types) * h
    lm_head = 0 if (m.tie_word_embeddings or m.encoder_only) else m.vocab_size * h
    pooler = h * h + h if m.pooler else 0

    components = {
        "embeddings": embeddings,
        "position_embeddings": positions,
        "attention": attention,
        "mlp": mlp,
        "experts": experts,
        "router": router,
        "shared_expert": shared,
        "norms": norms,
        "lm_head": lm_head,
        "pooler": pooler,
    }
    components = {k: v for k, v in components.items() if v}
    total = sum(components.values())
    linear_params = sum(i * o * c for _, i, o, c in linears)
    inactive = 0
    if moe_layers:
        inactive = (
            (m.num_experts - m.experts_per_token) * moe_layers * 3 * h * m.expert_intermediate
        )
    return ParamBreakdown(
        components=components,
        linears=tuple(linears),
        linear_params=linear_params,
        other_params=total - linear_params,
        total=total,
        active=total - inactive,
    )


# -- validation ----------------------------------------------------------------


def _validate_spec(m: ModelSpec) -> None:
    f = "model"
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
    for name in (
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
    ):
        check_bool(getattr(m, name), f"{f}.{name}")
    check_int(m.norms_per_layer, f"{f}.norms_per_layer", minimum=0, maximum=16)
    check_int(m.learned_positions, f"{f}.learned_positions", minimum=0, maximum=MAX_POSITIONS)
    check_int(m.token_types, f"{f}.token_types", minimum=0, maximum=MAX_VOCAB)
    check_int(m.num_experts, f"{f}.num_experts", minimum=0, maximum=MAX_EXPERTS)
    check_int(m.experts_per_token, f"{f}.experts_per_token", minimum=0, maximum=MAX_EXPERTS)
    check_int(
        m.shared_expert_intermediate_size,
        f"{f}.shared_expert_intermediate_size",
        minimum=0,
        maximum=MAX_INTERMEDIATE,
    )
    if m.num_experts:
        if not 1 <= m.experts_per_token <= m.num_experts:
            raise EstimatorError(
                f"{f}.experts_per_token",
                f"must be between 1 and num_experts ({m.num_experts})",
            )
        if m.moe_intermediate_size is not None:
            check_int(
                m.moe_intermediate_size, f"{f}.moe_intermediate_size", maximum=MAX_INTERMEDIATE
            )
        if m.num_moe_layers is not None:
            check_int(m.num_moe_layers, f"{f}.num_moe_layers", minimum=0, maximum=m.num_layers)
    elif m.experts_per_token:
        raise EstimatorError(f"{f}.experts_per_token", "set, but the model has no experts")
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
    breakdown = _count(m)
    if breakdown.total > MAX_PARAMS:
        raise EstimatorError(
            f"{f}.hidden_size", f"{breakdown.total:,} parameters is over the 10^13 limit"
        )
    m.__dict__["breakdown"] = breakdown  # fills the cached_property once


# -- builders ------------------------------------------------------------------


class _Reader:
    """Reads config keys, remembering which config key fed which ModelSpec field."""

    def __init__(self, data: Mapping[str, Any], field: str) -> None:
        self.data = data
        self.field = field
        self.keys: dict[str, str] = {}

    def int(self, key: str, spec_field: str, *, default: Any = ..., maximum: int, minimum: int = 1):  # type: ignore[no-untyped-def]
        self.keys[spec_field] = key
        if default is ...:
            return read_int(self.data, key, self.field, minimum=minimum, maximum=maximum)
        return read_int(
            self.data, key, self.field, default=default, minimum=minimum, maximum=maximum
        )

    def bool(self, key: str, spec_field: str, *, default: bool) -> bool:
        self.keys[spec_field] = key
        return read_bool(self.data, key, self.field, default=default)

    def build(self, **kwargs: Any) -> ModelSpec:
        try:
            return ModelSpec(**kwargs)
        except EstimatorError as exc:
            spec_field = exc.field.removeprefix("model.")
            key = self.keys.get(spec_field)
            if key is None:
                raise EstimatorError(self.field, exc.message, code=exc.code) from exc
            raise EstimatorError(f"{self.field}.{key}", exc.message, code=exc.code) from exc


_FAMILY_OF_MODEL_TYPE = {
    "llama": "llama",
    "mistral": "mistral",
    "mixtral": "mixtral",
    "qwen2": "qwen2",
    "qwen2_moe": "qwen2_moe",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "phi3": "phi3",
    "gpt2": "gpt2",
    "gpt_bigcode": "gpt_bigcode",
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
}
_GENERIC_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)
_TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def model_from_config(
    data: Mapping[str, Any],
    *,
    field: str = "config_json",
    name: str | None = None,
    source: str = "",
) -> ModelSpec:
    """A ModelSpec from a parsed Hugging Face ``config.json`` (a dict; read as data only)."""
    if not isinstance(data, Mapping):
        raise EstimatorError(field, "expected a JSON object")
    model_type = data.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise EstimatorError(f"{field}.model_type", "expected a string")
    family = _FAMILY_OF_MODEL_TYPE.get(model_type or "")
    text_config = data.get("text_config")
    if family is None and isinstance(text_config, Mapping):
        inner_type = text_config.get("model_type")
        if isinstance(inner_type, str) and inner_type in _FAMILY_OF_MODEL_TYPE:
            return model_from_config(
                text_config,
                field=f"{field}.text_config",
                name=name or _name_of(data),
                source=source,
            )
    notes: list[str] = []
    if "auto_map" in data or "trust_remote_code" in data:
        notes.append("auto_map / remote code in config.json ignored: the file is read as data only")
    if family is None:
        if all(data.get(key) is not None for key in _GENERIC_KEYS):
            family = "generic"
            notes.append(
                f"unknown model_type {str(model_type)[:40]!r}: counted as a Llama-style decoder "
                "(gated MLP, RMSNorm, no biases)"
            )
        else:
            shown = "missing" if model_type is None else f"unknown model_type {model_type[:40]!r}"
            raise EstimatorError(
                f"{field}.model_type",
                f"{shown}, and the config lacks the generic fields ({', '.join(_GENERIC_KEYS)})",
            )
    reader = _Reader(data, field)
    if family in _GPT_LIKE:
        kwargs = _gpt_like(reader, family)
    elif family in _ENCODERS:
        kwargs = _encoder(reader, family)
    else:
        kwargs = _decoder(reader, family, notes)
    kwargs.update(_quantization(data, field, notes))
    kwargs.setdefault("name", name or _name_of(data) or model_type or "custom model")
    kwargs["source"] = source
    kwargs["notes"] = tuple(notes)
    return reader.build(family=family, **kwargs)


def _name_of(data: Mapping[str, Any]) -> str:
    value = data.get("_name_or_path")
    if isinstance(value, str) and 0 < len(value) <= 200:
        return value
    return ""


def _decoder(r: _Reader, family: str, notes: list[str]) -> dict[str, Any]:
    data = r.data
    hidden = r.int("hidden_size", "hidden_size", maximum=MAX_HIDDEN)
    layers = r.int("num_hidden_layers", "num_layers", maximum=MAX_LAYERS)
    heads = r.int("num_attention_heads", "num_heads", maximum=MAX_HEADS)
    kv_heads = r.int("num_key_value_heads", "num_kv_heads", default=heads, maximum=MAX_HEADS)
    head_dim = r.int("head_dim", "head_dim", default=None, maximum=MAX_HIDDEN)
    if head_dim is None:
        if hidden % heads:
            raise EstimatorError(
                f"{r.field}.hidden_size",
                f"{hidden} is not divisible by num_attention_heads ({heads}); give head_dim",
            )
        head_dim = hidden // heads
    kwargs: dict[str, Any] = {
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": r.int(
            "intermediate_size", "intermediate_size", maximum=MAX_INTERMEDIATE
        ),
        "vocab_size": r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB),
        "tie_word_embeddings": r.bool(
            "tie_word_embeddings", "tie_word_embeddings", default=family in _TIED_BY_DEFAULT
        ),
        "max_position_embeddings": r.int(
            "max_position_embeddings",
            "max_position_embeddings",
            default=None,
            maximum=MAX_POSITIONS,
        ),
    }
    if family in ("llama", "qwen3", "qwen3_moe", "generic"):
        kwargs["attention_bias"] = r.bool("attention_bias", "attention_bias", default=False)
    if family in ("llama", "generic"):
        kwargs["mlp_bias"] = r.bool("mlp_bias", "mlp_bias", default=False)
    if family in ("qwen2", "qwen2_moe"):
        kwargs["qkv_bias"] = True
    if family in ("qwen3", "qwen3_moe"):
        kwargs["qk_norm"] = True
    if family == "gemma2":
        kwargs["norms_per_layer"] = 4

    # Mixture of experts.
    if family == "mixtral":
        kwargs["num_experts"] = r.int("num_local_experts", "num_experts", maximum=MAX_EXPERTS)
        kwargs["experts_per_token"] = r.int(
            "num_experts_per_tok", "experts_per_token", default=2, maximum=MAX_EXPERTS
        )
    elif family in ("qwen2_moe", "qwen3_moe"):
        kwargs["num_experts"] = r.int("num_experts", "num_experts", maximum=MAX_EXPERTS)
        kwargs["experts_per_token"] = r.int(
            "num_experts_per_tok", "experts_per_token", maximum=MAX_EXPERTS
        )
        kwargs["moe_intermediate_size"] = r.int(
            "moe_intermediate_size", "moe_intermediate_size", maximum=MAX_INTERMEDIATE
        )
        if family == "qwen2_moe":
            kwargs["shared_expert_intermediate_size"] = r.int(
                "shared_expert_intermediate_size",
                "shared_expert_intermediate_size",
                default=0,
                minimum=0,
                maximum=MAX_INTERMEDIATE,
            )
        step = read_int(data, "decoder_sparse_step", r.field, default=1, maximum=MAX_LAYERS)
        dense_only = _int_list(data, "mlp_only_layers", r.field, layers)
        kwargs["num_moe_layers"] = sum(
            1 for i in range(layers) if (i + 1) % step == 0 and i not in dense_only
        )

    # Sliding-window attention, per family.
    window = r.int("sliding_window", "sliding_window", default=None, maximum=MAX_POSITIONS)
    sliding: tuple[int, ...] | None = None
    layer_types = data.get("layer_types")
    if family == "gemma2":
        window = window or 4096  # Gemma2Config's default
        sliding = tuple(range(0, layers, 2))  # even layers slide, odd layers are global
    elif family in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if read_bool(data, "use_sliding_window", r.field, default=False) and window:
            first = read_int(
                data, "max_window_layers", r.field, default=layers, minimum=0, maximum=MAX_LAYERS
            )
            sliding = tuple(range(min(first, layers), layers))
        else:
            window = None
    elif family in ("mistral", "mixtral", "phi3"):
        sliding = None  # every layer, when a window is set
    elif window is not None:
        notes.append(f"sliding_window {window} ignored: {family} attends over the full context")
        window = None
    if layer_types is not None:
        types = _str_list(data, "layer_types", r.field, layers)
        if len(types) != layers:
            raise EstimatorError(f"{r.field}.layer_types", f"expected {layers} entries")
        sliding = tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")
        if not sliding:
            window = None
    if window is None:
        sliding = None
    r.keys["sliding_layers"] = "layer_types"
    kwargs["sliding_window"] = window
    kwargs["sliding_layers"] = sliding
    return kwargs


def _gpt_like(r: _Reader, family: str) -> dict[str, Any]:
    hidden = r.int("n_embd", "hidden_size", maximum=MAX_HIDDEN)
    heads = r.int("n_head", "num_heads", maximum=MAX_HEADS)
    if hidden % heads:
        raise EstimatorError(f"{r.field}.n_embd", f"{hidden} is not divisible by n_head ({heads})")
    positions = r.int("n_positions", "learned_positions", default=1024, maximum=MAX_POSITIONS)
    multi_query = family == "gpt_bigcode" and read_bool(
        r.data, "multi_query", r.field, default=True
    )
    return {
        "hidden_size": hidden,
        "num_layers": r.int("n_layer", "num_layers", maximum=MAX_LAYERS),
        "num_heads": heads,
        "num_kv_heads": 1 if multi_query else heads,
        "head_dim": hidden // heads,
        "intermediate_size": r.int(
            "n_inner", "intermediate_size", default=4 * hidden, maximum=MAX_INTERMEDIATE
        ),
        "vocab_size": r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB),
        "tie_word_embeddings": r.bool("tie_word_embeddings", "tie_word_embeddings", default=True),
        "attention_bias": True,
        "mlp_bias": True,
        "gated_mlp": False,
        "norm": "layernorm",
        "learned_positions": positions,
        "max_position_embeddings": positions,
    }


def _encoder(r: _Reader, family: str) -> dict[str, Any]:
    hidden = r.int("hidden_size", "hidden_size", maximum=MAX_HIDDEN)
    heads = r.int("num_attention_heads", "num_heads", maximum=MAX_HEADS)
    if hidden % heads:
        raise EstimatorError(
            f"{r.field}.hidden_size", f"{hidden} is not divisible by num_attention_heads ({heads})"
        )
    positions = r.int(
        "max_position_embeddings", "learned_positions", default=512, maximum=MAX_POSITIONS
    )
    usable_positions = positions - 2 if family == "roberta" else positions  # RoBERTa pads 2 rows
    return {
        "hidden_size": hidden,
        "num_layers": r.int("num_hidden_layers", "num_layers", maximum=MAX_LAYERS),
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_size": r.int(
            "intermediate_size", "intermediate_size", maximum=MAX_INTERMEDIATE
        ),
        "vocab_size": r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB),
        "token_types": r.int(
            "type_vocab_size", "token_types", default=2, minimum=0, maximum=MAX_VOCAB
        ),
        **ENCODER_FLAGS,
        "learned_positions": positions,
        "max_position_embeddings": max(usable_positions, 1),
    }


def _quantization(data: Mapping[str, Any], field: str, notes: list[str]) -> dict[str, Any]:
    """Stored format of the checkpoint, from quantization_config or torch_dtype."""
    out: dict[str, Any] = {}
    dtype = data.get("torch_dtype", data.get("dtype"))
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in _TORCH_DTYPES:
        out["stored_format"] = _TORCH_DTYPES[dtype.removeprefix("torch.")]
    quant = data.get("quantization_config")
    if quant is None:
        return out
    if not isinstance(quant, Mapping):
        raise EstimatorError(f"{field}.quantization_config", "expected a JSON object")
    method = quant.get("quant_method")
    bits = quant.get("bits")
    if method in ("gptq", "awq") and bits in (None, 4):
        out["stored_format"] = method
        group = quant.get("group_size", quant.get("q_group_size"))
        if group not in (None, -1):
            out["quant_group_size"] = check_int(
                group, f"{field}.quantization_config.group_size", maximum=1 << 20
            )
    elif method == "fp8":
        out["stored_format"] = "fp8"
    elif method == "bitsandbytes":
        if quant.get("load_in_4bit") or quant.get("_load_in_4bit"):
            out["stored_format"] = "nf4"
        elif quant.get("load_in_8bit") or quant.get("_load_in_8bit"):
            out["stored_format"] = "int8"
    else:
        notes.append(f"quantization_config {str(method)[:40]!r} not modelled; choose weights_dtype")
    return out


def _int_list(data: Mapping[str, Any], key: str, field: str, limit: int) -> set[int]:
    value = data.get(key)
    if value is None:
        return set()
    if not isinstance(value, list) or len(value) > limit:
        raise EstimatorError(f"{field}.{key}", f"expected a list of at most {limit} layer indices")
    return {check_int(v, f"{field}.{key}", minimum=0, maximum=limit) for v in value}


def _str_list(data: Mapping[str, Any], key: str, field: str, limit: int) -> list[str]:
    value = data.get(key)
    if not isinstance(value, list) or len(value) > limit:
        raise EstimatorError(f"{field}.{key}", f"expected a list of at most {limit} strings")
    if not all(isinstance(v, str) for v in value):
        raise EstimatorError(f"{field}.{key}", "expected strings")
    return value


def model_from_config_json(
    text: str | bytes, *, name: str | None = None, source: str = ""
) -> ModelSpec:
    """A ModelSpec from the text of a ``config.json`` (``json.loads`` only; nothing executed)."""
    from ._parse import parse_json_object

    return model_from_config(parse_json_object(text, "config_json"), name=name, source=source)


# -- plain numbers -------------------------------------------------------------

NUMBER_FIELDS = (
    "name",
    "family",
    "params",
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
    "num_experts",
    "experts_per_token",
    "sliding_window",
    "max_position_embeddings",
)


def model_from_numbers(mapping: Mapping[str, Any], *, field: str = "model") -> ModelSpec:
    """A ModelSpec from plain numbers: layers, hidden size, heads, ... and/or ``params``.

    Required: ``num_layers``, ``hidden_size``, ``num_heads``, and either ``params``
    or both ``intermediate_size`` and ``vocab_size``. With ``params`` the weights
    use that exact count; missing shape fields are then assumed (and noted).
    """
    if not isinstance(mapping, Mapping):
        raise EstimatorError(field, "expected an object of numbers")
    for key in mapping:
        if key not in NUMBER_FIELDS:
            raise unknown_field(f"{field}.{str(key)[:60]}")
    notes: list[str] = []
    family = mapping.get("family", "generic")
    check_choice(family, f"{field}.family", FAMILIES)
    name = mapping.get("name", "custom model")
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        raise EstimatorError(f"{field}.name", "expected a name of 1 to 200 characters")
    params = read_int(mapping, "params", field, default=None, maximum=MAX_PARAMS)
    hidden = read_int(mapping, "hidden_size", field, maximum=MAX_HIDDEN)
    layers = read_int(mapping, "num_layers", field, maximum=MAX_LAYERS)
    heads = read_int(mapping, "num_heads", field, maximum=MAX_HEADS)
    kv_heads = read_int(mapping, "num_kv_heads", field, default=heads, maximum=MAX_HEADS)
    head_dim = read_int(mapping, "head_dim", field, default=None, maximum=MAX_HIDDEN)
    if head_dim is None:
        if hidden % heads:
            raise EstimatorError(
                f"{field}.head_dim",
                f"hidden_size {hidden} is not divisible by {heads} heads; give head_dim",
            )
        head_dim = hidden // heads
    gpt_like = family in _GPT_LIKE or family in _ENCODERS
    inter = read_int(mapping, "intermediate_size", field, default=None, maximum=MAX_INTERMEDIATE)
    vocab = read_int(mapping, "vocab_size", field, default=None, maximum=MAX_VOCAB)
    if params is None and (inter is None or vocab is None):
        missing = "intermediate_size" if inter is None else "vocab_size"
        raise EstimatorError(
            f"{field}.{missing}", "required unless params is given", code="required"
        )
    if inter is None:
        inter = 4 * hidden if gpt_like else -(-(8 * hidden) // (3 * 256)) * 256
        notes.append(f"intermediate_size not given: assumed {inter}")
    if vocab is None:
        vocab = 32000
        notes.append(
            "vocab_size not given: assumed 32000 (affects logits only; weights use params)"
        )
    experts = read_int(mapping, "num_experts", field, default=0, minimum=0, maximum=MAX_EXPERTS)
    per_token = read_int(
        mapping,
        "experts_per_token",
        field,
        default=2 if experts else 0,
        minimum=0,
        maximum=MAX_EXPERTS,
    )
    default_tied = family in _TIED_BY_DEFAULT
    tied = mapping.get("tie_word_embeddings", default_tied)
    kwargs: dict[str, Any] = {
        "name": name,
        "family": family,
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "tie_word_embeddings": check_bool(tied, f"{field}.tie_word_embeddings"),
        "num_experts": experts,
        "experts_per_token": per_token,
        "sliding_window": read_int(
            mapping, "sliding_window", field, default=None, maximum=MAX_POSITIONS
        ),
        "max_position_embeddings": read_int(
            mapping, "max_position_embeddings", field, default=None, maximum=MAX_POSITIONS
        ),
        "param_count_override": params,
        "notes": tuple(notes),
    }
    kwargs.update(_family_flags(family, kwargs["max_position_embeddings"]))
    try:
        return ModelSpec(**kwargs)
    except EstimatorError as exc:
        raise exc.prefixed(field) from exc


def _family_flags(family: str, positions: int | None) -> dict[str, Any]:
    if family in ("qwen2", "qwen2_moe"):
        return {"qkv_bias": True}
    if family in ("qwen3", "qwen3_moe"):
        return {"qk_norm": True}
    if family == "gemma2":
        return {"norms_per_layer": 4}
    if family in _GPT_LIKE:
        return {
            "attention_bias": True,
            "mlp_bias": True,
            "gated_mlp": False,
            "norm": "layernorm",
            "learned_positions": positions or 1024,
        }
    if family in _ENCODERS:
        return {
            **ENCODER_FLAGS,
            "learned_positions": positions or 512,
            "token_types": 2 if family == "bert" else 1,
        }
    return {}
