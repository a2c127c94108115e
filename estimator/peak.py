"""``compute``: every term of one request and their sum, inference or training.

Peak memory is the *sum* of what is resident at the peak (weights, KV cache,
gradients, optimizer states, the activations of the step, the CUDA context),
not the largest of the stages.
"""

from __future__ import annotations

from .inference import KV_BYTES, inference_terms, kv_dtype
from .request import EstimateRequest
from .terms import Core, Term
from .training import training_terms
from .weights import weights_bytes


def compute(r: EstimateRequest) -> Core:
    """Every term of ``r`` and their sum: training.py's terms for training, else inference.py's."""
    m = r.model
    notes = list(m.notes)
    terms: list[Term] = []
    act = 4 if r.weights_dtype == "fp32" else 2
    kv_elem = KV_BYTES[kv_dtype(r)]
    kv_per_token = m.kv_bytes_per_token(kv_elem)
    w_bytes, w_basis = weights_bytes(m, r.weights_dtype, r.quant_group_size)
    source = "safetensors" if w_basis == "exact" else "architecture"

    if (
        m.stored_format in ("gptq", "awq", "nf4", "int8", "fp8")
        and r.weights_dtype != m.stored_format
    ):
        notes.append(
            f"the checkpoint is stored as {m.stored_format}; "
            f"estimated as if loaded in {r.weights_dtype}"
        )

    if r.training:
        return training_terms(r, m, terms, notes, act, w_bytes, w_basis, source, kv_per_token)
    return inference_terms(r, m, terms, notes, act, kv_elem, w_bytes, w_basis, source, kv_per_token)
