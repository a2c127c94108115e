"""Architecture families: their names, the Hugging Face model types each covers, and what
each family's config class and modeling code in transformers fix (tied embeddings, biases,
norms, encoder structure)."""

from __future__ import annotations

from typing import Any

# This year's families, each read by its own reader in estimator/architectures: the model
# type names the family.
READ_BY_OWN_READER = (
    "smollm3",
    "internlm3",
    "arcee",
    "seed_oss",
    "ernie4_5",
    "exaone4",
    "cohere",
    "cohere2",
    "gpt_oss",
    "glm4_moe",
    "minimax_m2",
    "olmoe",
    "ernie4_5_moe",
    "llama4_text",
    "qwen3_next",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "deepseek_v32",
    "glm_moe_dsa",
    "nemotron_h",
    "granitemoehybrid",
    "falcon_h1",
    "gemma4_text",
)

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
    "gemma3",
    "olmo",
    "olmo2",
    "starcoder2",
    "gptj",
    "deepseek_v2",
    "deepseek_v3",
    "mamba",
    "mamba2",
    "jamba",
    "gemma3_vl",
    "qwen2_5_vl",
    "gpt2",
    "gpt_bigcode",
    "gpt_neox",
    "phi",
    "opt",
    "bloom",
    "falcon",
    "bert",
    "roberta",
    *READ_BY_OWN_READER,
    "llama4_vl",
    "qwen3_vl",
    "qwen3_5_vl",
    "qwen3_5_moe_vl",
    "gemma4_vl",
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
    "gemma3_text": "gemma3",
    "olmo": "olmo",
    "olmo2": "olmo2",
    "starcoder2": "starcoder2",
    "gptj": "gptj",
    "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v3",
    "mamba": "mamba",
    "mamba2": "mamba2",
    "jamba": "jamba",
    "gemma3": "gemma3_vl",  # Gemma3ForConditionalGeneration: text_config + vision_config
    "qwen2_5_vl": "qwen2_5_vl",
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
    "llama4": "llama4_vl",
    "qwen3_vl": "qwen3_vl",
    "qwen3_5": "qwen3_5_vl",
    "qwen3_5_moe": "qwen3_5_moe_vl",
    "gemma4": "gemma4_vl",  # Gemma4ForConditionalGeneration: text_config + vision_config
    "kimi_k2": "deepseek_v3",  # Kimi-K2 is DeepSeek-V3's architecture
    **{name: name for name in READ_BY_OWN_READER},
}

# Family defaults, from each family's transformers config class and modeling code.
TIED_BY_DEFAULT = {
    "gemma",
    "gemma2",
    "gemma3",
    "starcoder2",
    "gpt2",
    "gpt_bigcode",
    "opt",
    "bloom",
    "falcon",
}
# Decoders whose config names fields their own way, read by their own reader.
CLASSIC = {"opt", "bloom", "falcon", "gptj"}
# Counted by estimator/architectures (latent attention, SSM layers, vision towers).
ARCHITECTURES = {"deepseek_v2", "deepseek_v3", "mamba", "mamba2", "jamba", *READ_BY_OWN_READER}
VISION_LANGUAGE = {
    "gemma3_vl",
    "qwen2_5_vl",
    "llama4_vl",
    "qwen3_vl",
    "qwen3_5_vl",
    "qwen3_5_moe_vl",
    "gemma4_vl",
}
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
    # Gemma-3: Gemma-2's four norms per layer plus a per-head RMSNorm on q and k.
    "gemma3": {"norms_per_layer": 4, "qk_norm": True},
    # OLMo: LayerNorm without weights or biases, so no norm parameters at all.
    "olmo": {"norms_per_layer": 0, "final_norm": False},
    # OLMo-2: norms after attention and after the MLP, q and k normed over all heads.
    "olmo2": {"qk_norm": True, "qk_norm_full": True},
    # StarCoder2: biased LayerNorm, a plain two-matrix MLP (biases where use_bias says).
    "starcoder2": {"gated_mlp": False, "norm": "layernorm"},
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
