"""Readers for the architectures whose layers the generic count in model.py does not cover:
latent attention with experts (DeepSeek), state-space layers (Mamba, Jamba), vision towers."""

from .deepseek import read_deepseek
from .ssm import read_jamba, read_mamba, read_mamba2

# model_type -> reader: each returns the ModelSpec fields, the exact count among them.
READERS = {
    "deepseek_v2": read_deepseek,
    "deepseek_v3": read_deepseek,
    "mamba": read_mamba,
    "mamba2": read_mamba2,
    "jamba": read_jamba,
}

__all__ = ["READERS"]
