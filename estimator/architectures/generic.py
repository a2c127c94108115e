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


def _set(value: Any) -> bool:
    return value not in (None, False, 0, [], {}, "")


def check_generic(data: Mapping[str, Any], field: str, model_type: Any, known: list[str]) -> None:
    """Raise unsupported_architecture unless ``data`` can be read by the generic reading."""
    missing = [key for key in REQUIRED if key not in data]
    changing = [key for key in SHAPE_CHANGING if _set(data.get(key))]
    if not missing and not changing and data.get("layer_types") is None:
        return
    shown = "no model_type" if model_type is None else f"model_type {str(model_type)[:40]!r}"
    reasons = []
    if changing:
        reasons.append(f"it sets {', '.join(changing)}, which change the layer shape")
    if missing:
        reasons.append(f"it lacks {', '.join(missing)}")
    if data.get("layer_types") is not None:
        reasons.append("its layer_types make the layers differ")
    raise EstimatorError(
        f"{field}.model_type",
        f"{shown} is not an architecture the estimator counts exactly ({', '.join(known)}), "
        f"and it cannot be read as a Llama-style decoder: {'; '.join(reasons)}. Give the "
        "checkpoint's model.safetensors.index.json (its metadata.total_size and tensor names) "
        "or a safetensors header, or the parameter count and shape as plain numbers",
        code="unsupported_architecture",
    )
