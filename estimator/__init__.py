"""Pre-launch VRAM estimator (pure Python, stdlib only; no Django).

Before a slice launches, estimate the job's peak VRAM from the model and its
settings, compare it with the purchased tier, and say how to make it fit.

    from estimator import EstimateRequest, estimate, model_from_catalog

    request = EstimateRequest(model=model_from_catalog("meta-llama/Llama-3.1-8B"),
                              context_tokens=8192, tier_mib=24576)
    result = estimate(request)          # result.fits, result.terms, result.suggestions
    result.to_dict()                    # JSON-ready

Choices, and why:

- Quantized weights (int8, nf4/int4, GPTQ, AWQ, fp8) chosen at load time convert only
  the linear layers of attention and the MLP/experts. Embeddings, the LM head, norms,
  biases and the MoE router stay 16-bit: transformers' bitsandbytes integration skips the
  output embedding (and nn.Embedding is no Linear). Layouts: int8 = 1 B/weight + an fp32
  scale per output row; nf4/int4 = 0.5 B/weight + an fp32 absmax per 64-weight block
  (bitsandbytes default, no double quantization); fp8 = 1 B/weight + one fp32 scale per
  matrix; GPTQ/AWQ = 0.5 B/weight + per group of ``quant_group_size`` (default 128) input
  columns an fp16 scale and a 4-bit zero point per output, GPTQ also an int32 g_idx per
  input column.
- A quantized checkpoint (config.json's ``quantization_config``: mxfp4, fp8 per-tensor or
  in blocks, compressed-tensors fp8, GPTQ/AWQ, bitsandbytes) is sized as it is stored,
  matrix by matrix (estimator/quantization.py; docs/estimator.md, "Quantized checkpoints"):
  gpt-oss's MXFP4 experts at 4.25 bits, DeepSeek-V3's fp8 with a scale per 128x128 block.
  It loads as stored whatever other quantized format is asked (a note says so); a 16-bit
  ``weights_dtype`` dequantizes it. A config it cannot size is refused
  (``unsupported_quantization``), never counted at 16 bits.
- KV cache = batch x sum over layers of min(context, that layer's window) x 2 x
  KV heads x head_dim x bytes (vLLM: rounded up to 16-token blocks). "auto"
  KV dtype is 16-bit, fp32 with fp32 weights.
- vLLM reserves ``gpu_memory_utilization`` x the slice for weights, activations,
  CUDA graphs and KV cache; the CUDA context sits outside that share, so
  utilization x slice + context must fit in the slice or vLLM will not start.
  Its activations are a profile run of ``prefill_chunk`` tokens (default 2048,
  i.e. set it to your --max-num-batched-tokens).
- CUDA context: 512 MiB by default (driver, kernels, cuBLAS workspace; typically
  0.3 to 0.6 GiB on current cards). Configurable.
- Fragmentation: 10% of the tensors that are allocated and freed while the job
  runs (activations, logits, a growing transformers KV cache, gradients). The
  PyTorch caching allocator rounds blocks up and keeps freed blocks cached, so
  memory_reserved runs above memory_allocated by roughly that much; weights,
  optimizer states and vLLM's preallocated KV cache are allocated once and waste
  little. Configurable.
- Training sums the resident terms (weights, gradients, fp32 master weights,
  optimizer states, activations, logits and loss): the peak of a step holds
  them all at once. Per trainable parameter: mixed-precision AdamW 16 B
  (2 + 2 + 4 master + 8), pure bf16 AdamW 8, 8-bit Adam 10, SGD with momentum
  12. LoRA adapters are fp32 (PEFT's default), so they carry no master copy.
"""

from .catalog import CATALOG, model_from_catalog
from .config_json import model_from_config, model_from_config_json
from .errors import EstimatorError
from .estimate import Estimate, estimate
from .model import ModelSpec, ParamBreakdown, param_breakdown, param_count
from .plain_numbers import model_from_numbers
from .request import DEFAULT_TIERS_MIB, EstimateRequest
from .rounding import whole_mib, whole_terms
from .safetensors import model_from_safetensors_header, model_from_safetensors_index
from .suggestions import Suggestion
from .terms import Term
from .weights import weights_bytes

__all__ = [
    "CATALOG",
    "DEFAULT_TIERS_MIB",
    "Estimate",
    "EstimateRequest",
    "EstimatorError",
    "ModelSpec",
    "ParamBreakdown",
    "Suggestion",
    "Term",
    "estimate",
    "model_from_catalog",
    "model_from_config",
    "model_from_config_json",
    "model_from_numbers",
    "model_from_safetensors_header",
    "model_from_safetensors_index",
    "param_breakdown",
    "param_count",
    "weights_bytes",
    "whole_mib",
    "whole_terms",
]
