"""A ModelSpec from a Hugging Face ``config.json``, read as data only: by family (Llama-style
decoders, GPT-2 style decoders, BERT-style encoders), with its quantization_config."""

from __future__ import annotations

from collections.abc import Mapping
from types import EllipsisType
from typing import Any, overload

from .architectures import READERS
from .architectures.generic import check_generic
from .architectures.vision import read_vision_language
from .errors import EstimatorError
from .families import (
    ARCHITECTURES,
    CLASSIC,
    ENCODER_FLAGS,
    ENCODERS,
    FAMILY_FLAGS,
    FAMILY_OF_MODEL_TYPE,
    GPT_FLAGS,
    GPT_LIKE,
    TIED_BY_DEFAULT,
    VISION_LANGUAGE,
)
from .model import (
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_INTERMEDIATE,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_VOCAB,
    ModelSpec,
)
from .parsing import check_int, parse_json_object, read_bool, read_int
from .quantization import quantization_fields as _quantization


class _Reader:
    """Reads config keys, remembering which config key fed which ModelSpec field."""

    def __init__(self, data: Mapping[str, Any], field: str) -> None:
        self.data = data
        self.field = field
        self.keys: dict[str, str] = {}

    @overload
    def int(self, key: str, spec_field: str, *, maximum: int, minimum: int = 1) -> int: ...
    @overload
    def int(
        self, key: str, spec_field: str, *, default: int, maximum: int, minimum: int = 1
    ) -> int: ...
    @overload
    def int(
        self, key: str, spec_field: str, *, default: int | None, maximum: int, minimum: int = 1
    ) -> int | None: ...
    def int(
        self,
        key: str,
        spec_field: str,
        *,
        default: int | None | EllipsisType = ...,
        maximum: int,
        minimum: int = 1,
    ) -> int | None:
        self.keys[spec_field] = key
        if isinstance(default, EllipsisType):
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


# What each family's reading covers, for the read_as line (the /fit/ page and the API).
FAMILY_READING = {
    "generic": "Llama-style decoder (generic reading of an unknown model_type)",
    "gpt_neox": "plain two-matrix MLP, fused biased qkv",
    "phi": "parallel attention and MLP, biases, partial rotary",
    "falcon": "multi-query or grouped KV heads, parallel attention",
    "olmo": "norms without parameters",
    "olmo2": "q/k norms over all heads",
    "gemma2": "interleaved sliding windows",
    "gemma3": "interleaved sliding windows, per-head q/k norms",
    "mixtral": "mixture of experts",
    "qwen2_moe": "mixture of experts with a shared expert",
    "qwen3_moe": "mixture of experts",
}

# Gemma3TextConfig's defaults, which gemma-3 checkpoints' text_config leaves out.
GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131072,
    "sliding_window": 4096,
}


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
    family = FAMILY_OF_MODEL_TYPE.get(model_type or "")
    nested = _nested_model(data, family, model_type, field=field, name=name, source=source)
    if nested is not None:
        return nested
    notes: list[str] = []
    if "auto_map" in data or "trust_remote_code" in data:
        notes.append("auto_map / remote code in config.json ignored: the file is read as data only")
    if family is None:
        family = _generic(data, field, model_type, notes)
    if family == "phi" and data.get("qk_layernorm"):
        raise EstimatorError(
            f"{field}.qk_layernorm",
            "Phi with per-head q/k LayerNorm is not counted exactly yet; give plain numbers",
            code="unsupported_architecture",
        )
    if family == "gemma3":
        data = {**GEMMA3_TEXT_DEFAULTS, **data}  # gemma-3 text_configs lean on them
    reader = _Reader(data, field)
    kwargs = _read_family(reader, family, notes)
    kwargs.update(_quantization(data, field, notes))
    kwargs.setdefault("name", name or _name_of(data) or model_type or "custom model")
    kwargs["source"] = source
    kwargs["notes"] = tuple(notes)
    reading = kwargs.get("read_as") or FAMILY_READING.get(family, "decoder layers")
    kwargs["read_as"] = f"{family}, read from config.json: {reading}"
    return reader.build(family=family, **kwargs)


def _nested_model(
    data: Mapping[str, Any],
    family: str | None,
    model_type: str | None,
    *,
    field: str,
    name: str | None,
    source: str,
) -> ModelSpec | None:
    """A vision-language model, read with its tower; or a known language model nested in
    ``text_config`` (refused beside a tower the estimator does not count). None: neither."""
    if family in VISION_LANGUAGE:
        return read_vision_language(
            data, family, field=field, name=name or _name_of(data), source=source,
            read_text=model_from_config,
        )  # fmt: skip
    text_config = data.get("text_config")
    if family is not None or not isinstance(text_config, Mapping):
        return None
    inner_type = text_config.get("model_type")
    if not isinstance(inner_type, str) or inner_type not in FAMILY_OF_MODEL_TYPE:
        return None
    towers = sorted(k for k in data if k.endswith("_config") and k != "text_config")
    if any(isinstance(data[k], Mapping) for k in towers):
        # Counting the language model alone would leave the tower out: a low count.
        raise EstimatorError(
            f"{field}.model_type",
            f"model_type {str(model_type)[:40]!r} nests {inner_type!r} beside "
            f"{', '.join(towers)}, a tower the estimator does not count; give the "
            "checkpoint's model.safetensors.index.json (its metadata.total_size) or a "
            "safetensors header instead",
            code="unsupported_architecture",
        )
    return model_from_config(
        text_config,
        field=f"{field}.text_config",
        name=name or _name_of(data),
        source=source,
    )


def _generic(data: Mapping[str, Any], field: str, model_type: str | None, notes: list[str]) -> str:
    """An unknown model_type: never a guess. Counted as a Llama-style decoder, a plain MLP
    reads 30% high and latent attention with experts 80% low; so only a config that names
    every field the generic reading needs, and none that changes the layer shape, is read."""
    check_generic(data, field, model_type, sorted(FAMILY_OF_MODEL_TYPE))
    notes.append(
        f"model_type {str(model_type)[:40]!r} is not one the estimator knows: read as a "
        "Llama-style decoder, every field that reading needs being present and none that "
        "changes the layer shape"
    )
    return "generic"


def _read_family(reader: _Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """The ModelSpec fields, by the reading the family needs."""
    if family in ARCHITECTURES:
        return READERS[family](reader, family, notes)
    if family in GPT_LIKE:
        return _gpt_like(reader, family)
    if family in CLASSIC:
        return {"opt": _opt, "bloom": _bloom, "falcon": _falcon, "gptj": _gptj}[family](reader)
    if family in ENCODERS:
        return _encoder(reader, family)
    return _decoder(reader, family, notes)


def _name_of(data: Mapping[str, Any]) -> str:
    value = data.get("_name_or_path")
    if isinstance(value, str) and 0 < len(value) <= 200:
        return value
    return ""


def _decoder(r: _Reader, family: str, notes: list[str]) -> dict[str, Any]:
    """Llama-style decoders and their relatives: the shape and the biases the family has,
    its experts, and which layers attend over a sliding window."""
    kwargs = _decoder_shape(r, family)
    kwargs.update(FAMILY_FLAGS.get(family, {}))
    layers = kwargs["num_layers"]
    kwargs.update(_decoder_experts(r, family, layers))
    window, sliding = _sliding_window(r, family, layers, notes)
    r.keys["sliding_layers"] = "layer_types"
    kwargs["sliding_window"] = window
    kwargs["sliding_layers"] = sliding
    return kwargs


def _decoder_shape(r: _Reader, family: str) -> dict[str, Any]:
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
            "tie_word_embeddings", "tie_word_embeddings", default=family in TIED_BY_DEFAULT
        ),
        "max_position_embeddings": r.int(
            "max_position_embeddings",
            "max_position_embeddings",
            default=None,
            maximum=MAX_POSITIONS,
        ),
    }
    if family in ("llama", "qwen3", "qwen3_moe", "olmo", "olmo2", "gemma3", "generic"):
        kwargs["attention_bias"] = r.bool("attention_bias", "attention_bias", default=False)
    if family == "starcoder2":
        kwargs["attention_bias"] = r.bool("use_bias", "attention_bias", default=True)
        kwargs["mlp_bias"] = r.bool("use_bias", "mlp_bias", default=True)
    if family in ("llama", "generic"):
        kwargs["mlp_bias"] = r.bool("mlp_bias", "mlp_bias", default=False)
    return kwargs


def _decoder_experts(r: _Reader, family: str, layers: int) -> dict[str, Any]:
    """Mixture of experts: Mixtral's on every layer; Qwen's every decoder_sparse_step-th
    layer but those in mlp_only_layers, with Qwen2-MoE's shared expert."""
    if family == "mixtral":
        return {
            "num_experts": r.int("num_local_experts", "num_experts", maximum=MAX_EXPERTS),
            "experts_per_token": r.int(
                "num_experts_per_tok", "experts_per_token", default=2, maximum=MAX_EXPERTS
            ),
        }
    if family not in ("qwen2_moe", "qwen3_moe"):
        return {}
    kwargs: dict[str, Any] = {
        "num_experts": r.int("num_experts", "num_experts", maximum=MAX_EXPERTS),
        "experts_per_token": r.int("num_experts_per_tok", "experts_per_token", maximum=MAX_EXPERTS),
        "moe_intermediate_size": r.int(
            "moe_intermediate_size", "moe_intermediate_size", maximum=MAX_INTERMEDIATE
        ),
    }
    if family == "qwen2_moe":
        kwargs["shared_expert_intermediate_size"] = r.int(
            "shared_expert_intermediate_size",
            "shared_expert_intermediate_size",
            default=0,
            minimum=0,
            maximum=MAX_INTERMEDIATE,
        )
    step = read_int(r.data, "decoder_sparse_step", r.field, default=1, maximum=MAX_LAYERS)
    dense_only = _int_list(r.data, "mlp_only_layers", r.field, layers)
    kwargs["num_moe_layers"] = sum(
        1 for i in range(layers) if (i + 1) % step == 0 and i not in dense_only
    )
    return kwargs


def _sliding_window(
    r: _Reader, family: str, layers: int, notes: list[str]
) -> tuple[int | None, tuple[int, ...] | None]:
    """The window and the layers that slide (None: all of them), per family; an explicit
    layer_types list has the last word."""
    data = r.data
    # MistralConfig's default window applies when the key is absent (not when null).
    default_window = 4096 if family == "mistral" and "sliding_window" not in data else None
    window = r.int(
        "sliding_window", "sliding_window", default=default_window, maximum=MAX_POSITIONS
    )
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
    elif family == "gemma3" and layer_types is None:
        # Gemma3TextConfig: every sliding_window_pattern-th layer is global.
        pattern = read_int(data, "sliding_window_pattern", r.field, default=6, maximum=MAX_LAYERS)
        sliding = tuple(i for i in range(layers) if (i + 1) % pattern)
    elif family in ("mistral", "mixtral", "phi3", "starcoder2", "gemma3"):
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
    return window, sliding


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
        **GPT_FLAGS,
        "learned_positions": positions,
        "max_position_embeddings": positions,
    }


def _gptj(r: _Reader) -> dict[str, Any]:
    """GPT-J: attention and MLP in parallel from one LayerNorm, unbiased q/k/v/out, a biased
    plain MLP, rotary positions (no table), an untied head with a bias."""
    hidden = r.int("n_embd", "hidden_size", maximum=MAX_HIDDEN)
    heads = r.int("n_head", "num_heads", maximum=MAX_HEADS)
    if hidden % heads:
        raise EstimatorError(f"{r.field}.n_embd", f"{hidden} is not divisible by n_head ({heads})")
    return {
        "hidden_size": hidden,
        "num_layers": r.int("n_layer", "num_layers", maximum=MAX_LAYERS),
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_size": r.int(
            "n_inner", "intermediate_size", default=4 * hidden, maximum=MAX_INTERMEDIATE
        ),
        "vocab_size": r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB),
        "tie_word_embeddings": r.bool("tie_word_embeddings", "tie_word_embeddings", default=False),
        **GPT_FLAGS,
        "attention_bias": False,
        "norms_per_layer": 1,
        "lm_head_bias": True,
        "max_position_embeddings": r.int(
            "n_positions", "max_position_embeddings", default=2048, maximum=MAX_POSITIONS
        ),
    }


def _heads_of(r: _Reader, hidden_key: str, heads_key: str) -> tuple[int, int]:
    hidden = r.int(hidden_key, "hidden_size", maximum=MAX_HIDDEN)
    heads = r.int(heads_key, "num_heads", maximum=MAX_HEADS)
    if hidden % heads:
        raise EstimatorError(
            f"{r.field}.{hidden_key}", f"{hidden} is not divisible by {heads_key} ({heads})"
        )
    return hidden, heads


def _opt(r: _Reader) -> dict[str, Any]:
    """OPT: biased attention and MLP, LayerNorm, learned positions with an offset of 2, a
    narrower token embedding projected in and out where word_embed_proj_dim says, and a
    final LayerNorm only when the norms come before each block."""
    hidden, heads = _heads_of(r, "hidden_size", "num_attention_heads")
    positions = r.int("max_position_embeddings", "max_position_embeddings", maximum=MAX_POSITIONS)
    before = r.bool("do_layer_norm_before", "final_norm", default=True)
    removed = read_bool(r.data, "_remove_final_layer_norm", r.field, default=False)
    return {
        "hidden_size": hidden,
        "num_layers": r.int("num_hidden_layers", "num_layers", maximum=MAX_LAYERS),
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_size": r.int("ffn_dim", "intermediate_size", maximum=MAX_INTERMEDIATE),
        "vocab_size": r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB),
        "tie_word_embeddings": r.bool("tie_word_embeddings", "tie_word_embeddings", default=True),
        "embed_dim": r.int("word_embed_proj_dim", "embed_dim", default=hidden, maximum=MAX_HIDDEN),
        **GPT_FLAGS,
        "attention_bias": r.bool("enable_bias", "attention_bias", default=True),
        "mlp_bias": r.bool("enable_bias", "mlp_bias", default=True),
        "final_norm": before and not removed,
        "learned_positions": positions + 2,  # OPTLearnedPositionalEmbedding's offset
        "max_position_embeddings": positions,
    }


def _bloom(r: _Reader) -> dict[str, Any]:
    """BLOOM: ALiBi (no position table), a LayerNorm on the word embeddings, fused biased
    qkv, a 4x plain MLP with biases, tied head."""
    hidden, heads = _heads_of(
        r, "n_embed" if "n_embed" in r.data else "hidden_size",
        "n_head" if "n_head" in r.data else "num_attention_heads",
    )  # fmt: skip
    layers_key = "n_layer" if "n_layer" in r.data else "num_hidden_layers"
    return {
        "hidden_size": hidden,
        "num_layers": r.int(layers_key, "num_layers", maximum=MAX_LAYERS),
        "num_heads": heads,
        "num_kv_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_size": 4 * hidden,
        "vocab_size": r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB),
        "tie_word_embeddings": r.bool("tie_word_embeddings", "tie_word_embeddings", default=True),
        **GPT_FLAGS,
        "embedding_norm": True,
    }


def _falcon(r: _Reader) -> dict[str, Any]:
    """Falcon: fused qkv with one shared KV head when multi_query (whatever num_kv_heads
    says), or num_kv_heads groups in the new decoder architecture; attention and MLP in
    parallel from one LayerNorm (two in the new architecture); a 4x plain MLP; biases only
    where `bias` says; ALiBi or rotary, neither with parameters; tied head."""
    hidden, heads = _heads_of(
        r, "hidden_size", "num_attention_heads" if "num_attention_heads" in r.data else "n_head"
    )
    layers_key = "num_hidden_layers" if "num_hidden_layers" in r.data else "n_layer"
    new = read_bool(r.data, "new_decoder_architecture", r.field, default=False)
    multi_query = read_bool(r.data, "multi_query", r.field, default=True)
    parallel = read_bool(r.data, "parallel_attn", r.field, default=True)
    if new:
        kv_heads = r.int("num_kv_heads", "num_kv_heads", default=heads, maximum=MAX_HEADS)
        norms = read_int(r.data, "num_ln_in_parallel_attn", r.field, default=2, maximum=2)
    else:
        kv_heads = 1 if multi_query else heads
        norms = 1 if parallel else 2
    bias = r.bool("bias", "attention_bias", default=False)
    return {
        "hidden_size": hidden,
        "num_layers": r.int(layers_key, "num_layers", maximum=MAX_LAYERS),
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": hidden // heads,
        "intermediate_size": r.int(
            "ffn_hidden_size", "intermediate_size", default=4 * hidden, maximum=MAX_INTERMEDIATE
        ),
        "vocab_size": r.int("vocab_size", "vocab_size", maximum=MAX_VOCAB),
        "tie_word_embeddings": r.bool("tie_word_embeddings", "tie_word_embeddings", default=True),
        "attention_bias": bias,
        "mlp_bias": bias,
        "gated_mlp": False,
        "norm": "layernorm",
        "norms_per_layer": norms,
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
    data = parse_json_object(text, "config_json", infinity=True)
    return model_from_config(data, name=name, source=source)
