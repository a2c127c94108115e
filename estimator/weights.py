"""Weights by format: their bytes in each dtype (quantized formats convert only the linear
layers), and the workspace bitsandbytes needs to dequantize 4-bit weights."""

from __future__ import annotations

from dataclasses import dataclass

from .model import ModelSpec, param_count
from .quantization import Quantization, converts, matrix_bytes, request_scheme, role
from .request import FOUR_BIT_BNB, EstimateRequest
from .terms import MIB, Part, Term

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
    "mxfp4": "MXFP4 experts",
}
FLOAT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class Sized:
    """The weights in one format: bytes, basis, the layout used and its itemisation."""

    bytes: int
    basis: str
    scheme: Quantization | None  # None: every weight in a float dtype
    detail: str


def weights_bytes(model: ModelSpec, dtype: str, group_size: int = 128) -> tuple[int, str]:
    """Bytes of the weights in ``dtype`` and the basis ("exact" or "derived").

    A quantized checkpoint (``model.quantization``) is sized as it is stored, whatever
    quantized ``dtype`` is asked (a quantized checkpoint loads as stored); a float ``dtype``
    dequantizes it. Otherwise quantized formats convert only the linear layers of attention
    and MLP/experts; embeddings, the LM head, norms, biases and the router stay 16-bit.
    """
    sized = sized_weights(model, dtype, group_size)
    return sized.bytes, sized.basis


def sized_weights(model: ModelSpec, dtype: str, group_size: int = 128) -> Sized:
    """``weights_bytes`` with the layout and the itemisation, cached on the model."""
    cache: dict[tuple[str, int], Sized] = model.__dict__.setdefault("_weights", {})
    key = (dtype, group_size)
    if key not in cache:
        if len(cache) >= 32:  # group sizes come from users: keep the cache bounded
            cache.clear()
        cache[key] = _sized(model, dtype, group_size)
    return cache[key]


def loaded_scheme(model: ModelSpec, dtype: str, group: int) -> Quantization | None:
    """The layout the weights load in: the checkpoint's own when it is quantized and a
    quantized format is asked, else ``dtype``'s (None: a float dtype)."""
    if dtype in FLOAT_BYTES:
        return None
    if model.quantization is not None:
        return model.quantization
    return request_scheme(dtype, group)


def _sized(model: ModelSpec, dtype: str, group: int) -> Sized:
    scheme = loaded_scheme(model, dtype, group)
    fmt = dtype if scheme is None else scheme.fmt
    count = param_count(model)
    if model.tensor_bytes is not None and model.stored_format == fmt:
        detail = f"{count:,} parameters, from the safetensors"
        return Sized(model.tensor_bytes, "exact", scheme, detail)
    if scheme is None:
        exact_count = model.param_count_override is not None and model.tensor_bytes is not None
        size = FLOAT_BYTES[dtype]
        detail = f"{count:,} parameters x {size} B, from the architecture"
        return Sized(count * size, "exact" if exact_count else "derived", None, detail)
    total, items = _itemised(model, scheme)
    return Sized(total, "derived", scheme, f"from the architecture: {items}")


def _itemised(m: ModelSpec, q: Quantization) -> tuple[int, str]:
    """Bytes of every matrix as ``q`` stores it or leaves it 16-bit, and the itemisation:
    what is converted, and what is not, with their parameters and bytes."""
    b = m.breakdown
    linears = list(b.linears)
    other = b.other_params
    head = b.components.get("lm_head", 0)
    if q.head and head and not m.tie_word_embeddings:
        width = head // m.vocab_size
        linears.append(("lm_head", width, m.vocab_size, 1))
        other -= width * m.vocab_size
    scale = 1.0  # an exact element count (safetensors) scales the linear layers to it
    if m.param_count_override is not None and m.param_count_override != b.total:
        linear = sum(i * o * c for _, i, o, c in linears)
        scale = max(m.param_count_override - other, 0) / linear if linear else 0.0
    kept: dict[str, int] = {}
    converted: dict[str, list[float]] = {}
    for module, n_in, n_out, count in linears:
        kind = role(module)
        if converts(q, module):
            entry = converted.setdefault(kind, [0.0, 0.0])
            entry[0] += n_in * n_out * count * scale
            entry[1] += matrix_bytes(q, n_in, n_out) * count * scale
        else:
            kept[kind] = kept.get(kind, 0) + int(n_in * n_out * count * scale)
    rest_params = other + sum(kept.values())
    total = int(sum(v[1] for v in converted.values())) + rest_params * 2
    parts = [
        f"{kind}: {_b(params)} params in {q.label} = {_gib(size)}"
        for kind, (params, size) in converted.items()
    ]
    router = ", router" if m.is_moe and "router" not in kept else ""
    rest = [*kept, f"embeddings, norms, biases{router}"]
    parts.append(
        f"{', '.join(rest)}: {_b(rest_params)} params in {q.unquantized} = {_gib(rest_params * 2)}"
    )
    return total, "; ".join(parts)


def _b(params: float) -> str:
    if params >= 1e9:
        return f"{params / 1e9:.1f} B"
    return f"{params / 1e6:.1f} M"


def _gib(size: float) -> str:
    return f"{size / (1 << 30):.2f} GiB"


def _largest_linear(m: ModelSpec) -> int:
    return max((i * o for _, i, o, _ in m.breakdown.linears), default=0)


def weights_term(r: EstimateRequest, label: str) -> Term:
    """The weights as loaded, itemised: converted and unconverted matrices, or every
    parameter in one float dtype, or the exact bytes of the checkpoint."""
    sized = sized_weights(r.model, r.weights_dtype, r.quant_group_size)
    return Term("weights", label, sized.bytes / MIB, sized.basis, sized.detail)


def weights_label(r: EstimateRequest) -> str:
    """The format the weights load in: the checkpoint's own layout when it is quantized."""
    scheme = loaded_scheme(r.model, r.weights_dtype, r.quant_group_size)
    if scheme is None or r.model.quantization is None:
        return WEIGHT_LABELS[r.weights_dtype]
    return scheme.label


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
