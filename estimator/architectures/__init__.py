"""Readers for the architectures whose layers the generic count in model.py does not cover:
latent attention with experts (DeepSeek), state-space layers (Mamba, Jamba), vision towers."""

from .decoders import (
    read_arcee,
    read_cohere,
    read_ernie4_5,
    read_ernie4_5_moe,
    read_exaone4,
    read_glm4_moe,
    read_gpt_oss,
    read_internlm3,
    read_llama4_text,
    read_minimax_m2,
    read_olmoe,
    read_seed_oss,
    read_smollm3,
)
from .deepseek import read_deepseek
from .gemma4 import read_gemma4_text
from .hybrid import read_qwen3_next
from .mamba_hybrid import read_falcon_h1, read_granitemoehybrid, read_nemotron_h
from .ssm import read_jamba, read_mamba, read_mamba2

# model_type -> reader: each returns the ModelSpec fields, the exact count among them.
READERS = {
    "deepseek_v2": read_deepseek,
    "deepseek_v3": read_deepseek,
    "deepseek_v32": read_deepseek,
    "glm_moe_dsa": read_deepseek,
    "mamba": read_mamba,
    "mamba2": read_mamba2,
    "jamba": read_jamba,
    "smollm3": read_smollm3,
    "internlm3": read_internlm3,
    "arcee": read_arcee,
    "seed_oss": read_seed_oss,
    "ernie4_5": read_ernie4_5,
    "exaone4": read_exaone4,
    "cohere": read_cohere,
    "cohere2": read_cohere,
    "gpt_oss": read_gpt_oss,
    "glm4_moe": read_glm4_moe,
    "minimax_m2": read_minimax_m2,
    "olmoe": read_olmoe,
    "ernie4_5_moe": read_ernie4_5_moe,
    "llama4_text": read_llama4_text,
    "qwen3_next": read_qwen3_next,
    "qwen3_5_text": read_qwen3_next,
    "qwen3_5_moe_text": read_qwen3_next,
    "nemotron_h": read_nemotron_h,
    "granitemoehybrid": read_granitemoehybrid,
    "falcon_h1": read_falcon_h1,
    "gemma4_text": read_gemma4_text,
}

__all__ = ["READERS"]
