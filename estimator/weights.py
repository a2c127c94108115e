"""Weights by format: their bytes in each dtype (quantized formats convert only the linear
layers), and the workspace bitsandbytes needs to dequantize 4-bit weights."""

from __future__ import annotations

from .model import ModelSpec, param_count
from .request import FOUR_BIT_BNB, EstimateRequest
from .terms import MIB, Part, Term

BNB_BLOCK = 64  # bitsandbytes 4-bit blocksize; one fp32 absmax per block

WEIGHT_LABELS = {
    "fp32": "fp32",
    "fp16": "fp16",
    "bf16": "bf16",
    "fp8": "fp8",
    "int8": "int8 (bitsandbytes LLM.int8)",
    "nf4": "nf4 (bitsandbytes 4-bit)",
    "int4": "int4 (bitsandbytes 4-bit)",
    "gptq": "GPTQ 4-bit",
    "awq": "AWQ 4-bit",
}


def weights_bytes(model: ModelSpec, dtype: str, group_size: int = 128) -> tuple[int, str]:
    """Bytes of the weights in ``dtype`` and the basis ("exact" or "derived").

    Quantized formats convert only the linear layers of attention and MLP/experts;
    embeddings, the LM head, norms, biases and the router stay 16-bit (what the
    transformers bitsandbytes integration skips by default, and what GPTQ/AWQ
    checkpoints leave unquantized).
    """
    cache: dict[tuple[str, int], tuple[int, str]] = model.__dict__.setdefault("_weights", {})
    key = (dtype, group_size)
    if key not in cache:
        if len(cache) >= 32:  # group sizes come from users: keep the cache bounded
            cache.clear()
        cache[key] = _weights_bytes(model, dtype, group_size)
    return cache[key]


def _weights_bytes(model: ModelSpec, dtype: str, group: int) -> tuple[int, str]:
    if model.tensor_bytes is not None and model.stored_format == dtype:
        return model.tensor_bytes, "exact"
    b = model.breakdown
    linear, other = b.linear_params, b.other_params
    scale = 1.0
    exact_count = model.param_count_override is not None and model.tensor_bytes is not None
    if model.param_count_override is not None and model.param_count_override != b.total:
        exact_linear = max(model.param_count_override - other, 0)
        scale = exact_linear / linear if linear else 0.0
    if dtype in ("fp32", "fp16", "bf16"):
        size = 4 if dtype == "fp32" else 2
        total = param_count(model) * size
        return total, "exact" if exact_count else "derived"
    lin = 0.0
    for _, n_in, n_out, count in b.linears:
        n = n_in * n_out
        if dtype == "fp8":
            per = n + 4  # one fp32 scale per matrix
        elif dtype == "int8":
            per = n + 4 * n_out  # one fp32 scale per output row
        elif dtype in FOUR_BIT_BNB:
            per = -(-n // 2) + -(-n // BNB_BLOCK) * 4
        else:  # gptq / awq: 4-bit weights, fp16 scales and 4-bit zeros per group
            groups = -(-n_in // group)
            per = n // 2 + groups * n_out * 2 + groups * n_out // 2
            if dtype == "gptq":
                per += n_in * 4  # g_idx, int32 per input column
        lin += per * count
    return int(lin * scale + other * 2), "derived"


def _largest_linear(m: ModelSpec) -> int:
    return max((i * o for _, i, o, _ in m.breakdown.linears), default=0)


def weights_term(m: ModelSpec, label: str, w_bytes: int, basis: str, source: str) -> Term:
    """The weights as loaded: ``w_bytes`` from ``weights_bytes``, read from ``source``."""
    return Term(
        "weights", label, w_bytes / MIB, basis, f"{param_count(m):,} parameters, from the {source}"
    )


def dequant_part(r: EstimateRequest, m: ModelSpec, act: float, when: str) -> Part | None:
    """bitsandbytes 4-bit: one matrix at a time is dequantized to 16-bit for its matmul."""
    if r.weights_dtype not in FOUR_BIT_BNB:
        return None
    term = Term(
        "dequant_workspace",
        "Dequantization workspace",
        _largest_linear(m) * act / MIB,
        "modelled",
        f"bitsandbytes dequantizes one 4-bit matrix to 16-bit per matmul{when}",
    )
    return Part(term, churn=term.mib * MIB)
