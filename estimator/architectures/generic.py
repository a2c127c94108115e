"""The "never a guess" rule: an unknown model_type is read as a Llama-style decoder only if
its config has every field that needs and none that changes the layer shape (else refused)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import EstimatorError

# Fields a Llama-style config class writes out, each fixing one count of the generic reading:
# the widths, the KV heads, tied or untied head, biases and RMSNorm.
REQUIRED = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "rms_norm_eps",
)

# Fields that, set, say the layers are not Llama-shaped: experts, latent attention, SSM
# mixers, parallel or plain MLPs, extra norms, cross-attention, other towers.
SHAPE_CHANGING = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_intermediate_size",
    "kv_lora_rank",
    "q_lora_rank",
    "state_size",
    "ssm_state_size",
    "mamba_d_state",
    "layers_block_type",
    "parallel_attn",
    "use_parallel_residual",
    "new_decoder_architecture",
    "qk_layernorm",
    "use_qk_norm",
    "qk_norm",
    "ffn_dim",
    "n_inner",
    "rotary_pct",
    "partial_rotary_factor",
    "cross_attention_layers",
    "vision_config",
    "audio_config",
    "text_config",
    "hidden_act_gated",
    "mlp_type",
    "ffn_type",
)


# Activations a Llama-style MLP gates with (gate_proj, up_proj, down_proj): any other may
# be a plain two-matrix MLP (Arcee's relu2, GPT's gelu) and reads a third too high.
GATED_ACTIVATIONS = ("silu", "swish")
# Bias and norm keys the generic reading models (and keys that merely name them).
UNDERSTOOD = {"attention_bias", "mlp_bias", "rms_norm_eps"}
# Lists that say nothing about the layers.
HARMLESS_LISTS = {
    "architectures",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "bad_words_ids",
    "suppress_tokens",
    "begin_suppress_tokens",
}


def _set(value: Any) -> bool:
    return value not in (None, False, 0, [], {}, "")


def _unread(data: Mapping[str, Any]) -> list[str]:
    """What the generic reading would have to ignore: an activation not known to be gated,
    a bias or norm flag it does not model, a per-layer list it does not read."""
    reasons = []
    for key in ("hidden_act", "hidden_activation", "activation_function"):
        value = data.get(key)
        if value is not None and value not in GATED_ACTIVATIONS:
            reasons.append(f"its {key} {str(value)[:40]!r} is not known to gate the MLP")
    flags = sorted(
        key for key, value in data.items()
        # present at all: attention_out_bias false still says attention_bias skips o_proj
        if ("bias" in key or "norm" in key) and key not in UNDERSTOOD and value is not None
    )  # fmt: skip
    if flags:
        reasons.append(f"it sets {', '.join(flags)}, a bias or norm the reading does not model")
    lists = sorted(
        key for key, value in data.items()
        if isinstance(value, list) and key not in HARMLESS_LISTS and key != "layer_types"
    )  # fmt: skip
    if lists:
        reasons.append(f"its {', '.join(lists)} may make the layers differ")
    quant = data.get("quantization_config")
    if _set(quant):
        reasons.append("its quantization_config is sized only for the families counted exactly")
    return reasons


def check_generic(data: Mapping[str, Any], field: str, model_type: Any, known: list[str]) -> None:
    """Raise unsupported_architecture unless ``data`` can be read by the generic reading."""
    missing = [key for key in REQUIRED if key not in data]
    changing = [key for key in SHAPE_CHANGING if _set(data.get(key))]
    unread = _unread(data)
    if not missing and not changing and not unread and data.get("layer_types") is None:
        return
    shown = "no model_type" if model_type is None else f"model_type {str(model_type)[:40]!r}"
    reasons = []
    if changing:
        reasons.append(f"it sets {', '.join(changing)}, which change the layer shape")
    if missing:
        reasons.append(f"it lacks {', '.join(missing)}")
    if data.get("layer_types") is not None:
        reasons.append("its layer_types make the layers differ")
    reasons += unread
    raise EstimatorError(
        f"{field}.model_type",
        f"{shown} is not an architecture the estimator counts exactly ({', '.join(known)}), "
        f"and it cannot be read as a Llama-style decoder: {'; '.join(reasons)}. Give the "
        "checkpoint's model.safetensors.index.json (its metadata.total_size and tensor names) "
        "or a safetensors header, or the parameter count and shape as plain numbers",
        code="unsupported_architecture",
    )
