"""``compute``: every term of one request and their sum, inference or training.

Peak memory is the *sum* of what is resident at the peak (weights, KV cache,
gradients, optimizer states, the activations of the step, the CUDA context),
not the largest of the stages.
"""

from __future__ import annotations

from dataclasses import replace

from .inference import KV_BYTES, inference_terms, kv_dtype
from .model import ModelSpec
from .request import EstimateRequest
from .terms import Core, Term
from .training import training_terms
from .weights import FLOAT_BYTES, weights_bytes

QUANTIZED = ("gptq", "awq", "nf4", "int4", "int8", "fp8", "mxfp4")
GIB = 1 << 30


def compute(r: EstimateRequest) -> Core:
    """Every term of ``r`` and their sum: training.py's terms for training, else inference.py's."""
    m = r.model
    notes = list(m.notes)
    terms: list[Term] = []
    act = 4 if r.weights_dtype == "fp32" else 2
    kv_elem = KV_BYTES[kv_dtype(r)]
    kv_per_token = m.kv_bytes_per_token(kv_elem)
    w_bytes, _ = weights_bytes(m, r.weights_dtype, r.quant_group_size)
    _note_stored_format(r, w_bytes, notes)
    if r.training:
        return training_terms(r, m, terms, notes, act, w_bytes, kv_per_token)
    return inference_terms(r, m, terms, notes, act, kv_elem, w_bytes, kv_per_token)


def _note_stored_format(r: EstimateRequest, w_bytes: int, notes: list[str]) -> None:
    """Say how a quantized checkpoint loads when the request asks another format: a float
    dtype dequantizes it; another quantized format does not apply (it loads as stored)."""
    m = r.model
    stored = m.stored_format
    if stored not in QUANTIZED or r.weights_dtype == stored:
        return
    if r.weights_dtype in FLOAT_BYTES or m.quantization is None:
        notes.append(
            f"the checkpoint is stored as {stored}; estimated as if loaded in {r.weights_dtype}"
        )
        return
    asked = _as_if_16_bit(m, r.weights_dtype, r.quant_group_size)
    smaller = "already smaller than" if w_bytes <= asked else "larger than"
    notes.append(
        f"the checkpoint is already quantized ({m.quantization.label}, {w_bytes / GIB:.1f} "
        f"GiB), {smaller} {r.weights_dtype} would be ({asked / GIB:.1f} GiB from 16-bit "
        "weights): a quantized checkpoint loads as stored (transformers keeps its "
        "quantization_config over another, vLLM refuses a different --quantization), so "
        "its stored size is used"
    )


def _as_if_16_bit(m: ModelSpec, dtype: str, group: int) -> int:
    """The bytes ``dtype`` would take on this model's 16-bit weights."""
    return weights_bytes(replace(m, quantization=None, tensor_bytes=None), dtype, group)[0]
