"""Architecture families: their names, the Hugging Face model types each covers, and what
each family's config class and modeling code in transformers fix (tied embeddings, biases,
norms, encoder structure)."""

from __future__ import annotations

from typing import Any

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
    "gpt_neox",
    "phi",
    "opt",
    "bloom",
    "falcon",
    "bert",
    "roberta",
    "generic",
)

FAMILY_OF_MODEL_TYPE = {
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
    "gpt_neox": "gpt_neox",
    "phi": "phi",
    "opt": "opt",
    "bloom": "bloom",
    "falcon": "falcon",
    "RefinedWeb": "falcon",  # the first Falcon checkpoints' model types
    "RefinedWebModel": "falcon",
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
}

# Family defaults, from each family's transformers config class and modeling code.
TIED_BY_DEFAULT = {"gemma", "gemma2", "gpt2", "gpt_bigcode", "opt", "bloom", "falcon"}
# Decoders whose config names fields their own way, read by their own reader.
CLASSIC = {"opt", "bloom", "falcon"}
GPT_LIKE = {"gpt2", "gpt_bigcode"}
ENCODERS = {"bert", "roberta"}

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

# GPT-2 style decoders: biased attention and MLP, an ungated MLP, LayerNorm.
GPT_FLAGS: dict[str, Any] = {
    "attention_bias": True,
    "mlp_bias": True,
    "gated_mlp": False,
    "norm": "layernorm",
}

# What a family fixes whatever its config says (a config or plain numbers fill in the rest).
FAMILY_FLAGS: dict[str, dict[str, Any]] = {
    "qwen2": {"qkv_bias": True},
    "qwen2_moe": {"qkv_bias": True},
    "qwen3": {"qk_norm": True},
    "qwen3_moe": {"qk_norm": True},
    "gemma2": {"norms_per_layer": 4},
    "gpt2": GPT_FLAGS,
    "gpt_bigcode": GPT_FLAGS,
    # GPT-NeoX (Pythia): fused biased qkv and dense, a plain biased two-matrix MLP,
    # LayerNorm before attention and before the MLP, an untied embed_out.
    "gpt_neox": GPT_FLAGS,
    # Phi-1/1.5/2: attention and MLP in parallel from one LayerNorm, biases everywhere,
    # and a biased lm_head.
    "phi": {**GPT_FLAGS, "norms_per_layer": 1, "lm_head_bias": True},
    "bert": ENCODER_FLAGS,
    "roberta": ENCODER_FLAGS,
}
