"""Quantized checkpoints: a ``quantization_config`` read into a ``Quantization`` (which
matrices it converts, how each is stored), and the bytes of one stored matrix.

The layouts (docs/estimator.md, "Quantized checkpoints", says where each comes from):

- **mxfp4** (gpt-oss): the MoE experts only, as 4-bit E2M1 values two to a byte
  (``*_blocks``) plus one E8M0 scale byte per 32 values along the input (``*_scales``):
  17 bytes per 32 weights, 4.25 bits. Attention, router, embeddings, LM head, norms and the
  experts' biases stay 16-bit.
- **fp8**: one byte a weight, plus fp32 scales: one per matrix (per-tensor, and an input
  scale where activations are static) or one per ``weight_block_size`` block
  (``weight_scale_inv``: ceil(out / 128) x ceil(in / 128)).
- **compressed-tensors** fp8 (``float-quantized``): per-tensor, per-channel or per-block
  scales, fp32 as vLLM holds them, an fp32 input scale where activations are static.
- **GPTQ / AWQ**: ``bits``-wide weights packed in int32 (``qweight``), per group of
  ``group_size`` input columns (-1: one group) an fp16 scale and a packed zero point per
  output, GPTQ also an int32 ``g_idx`` per input column (written whatever ``desc_act``).
- **bitsandbytes**: 8-bit = int8 weights + an fp32 scale per output row (``SCB``); 4-bit
  (nf4/fp4) = two weights a byte + per 64 weights an fp32 absmax, or with
  ``bnb_4bit_use_double_quant`` a uint8 absmax plus an fp32 absmax per 256 of them.

Routers are never converted (checkpoints store them 16-bit). A config the estimator cannot
size is refused with ``unsupported_quantization``, naming the key: never counted 16-bit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import EstimatorError
from .parsing import check_int

MXFP4_BLOCK = 32  # values per E8M0 scale
BNB_BLOCK = 64  # bitsandbytes 4-bit blocksize; one absmax per block
BNB_NESTED_BLOCK = 256  # double quantization: absmax values per fp32 nested absmax
GPTQ_BITS = (2, 3, 4, 8)
UNSUPPORTED = "unsupported_quantization"

_TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_ATTENTION = {
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "qkv_proj",
    "q_a_proj",
    "q_b_proj",
    "kv_a_proj_with_mqa",
    "kv_b_proj",
    "query_key_value",
    "c_attn",
    "c_proj_attn",
    "dense",
    "qkv",
}
_MIXER = {"in_proj", "x_proj", "dt_proj", "out_proj"}
_TOWER_PREFIXES = ("vision", "vision_tower", "visual", "merger", "projector")


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint (or a load-time quantizer) stores its converted matrices."""

    method: str  # quant_method: mxfp4, fp8, compressed-tensors, gptq, awq, bitsandbytes
    fmt: str  # the weights format it amounts to (model.WEIGHT_FORMATS)
    label: str  # as the estimate names it, e.g. "MXFP4", "fp8, 128x128 blocks"
    bits: int = 8
    group: int = -1  # GPTQ/AWQ input columns per group (-1: all of them)
    g_idx: bool = False  # GPTQ: an int32 group index per input column
    block: tuple[int, int] | None = None  # fp8: (out, in) per scale
    channel: bool = False  # one scale per output row
    scale_bytes: int = 4
    input_scale: bool = False  # static activations: one fp32 input scale per matrix
    double_quant: bool = False  # bitsandbytes 4-bit nested absmax
    experts_only: bool = False  # mxfp4: only the MoE experts
    head: bool = False  # the LM head is converted too
    towers: bool = True  # vision-tower linears are converted
    skip: tuple[str, ...] = ()  # module patterns left unconverted
    unquantized: str = "bf16"  # what the rest is stored in (2 bytes)


# -- which matrices ----------------------------------------------------------------------


def role(module: str) -> str:
    """What a linear of ``ParamBreakdown.linears`` is, by the last parts of its name:
    experts, shared expert, router, vision tower, attention, SSM mixer, or MLP."""
    parts = module.split(".")
    if module.startswith("experts.") or ".experts." in module:
        return "experts"
    if parts[0] in ("shared_expert", "shared_experts") or ".shared_expert" in module:
        return "shared expert"
    if parts[-1] in ("router", "gate", "shared_expert_gate"):
        return "router"
    if module == "lm_head":
        return "LM head"
    if parts[0] in _TOWER_PREFIXES or module.startswith("mm_"):
        return "vision tower"
    if parts[-1] in _ATTENTION or parts[0] in ("attn", "self_attn", "attention"):
        return "attention"
    if parts[-1] in _MIXER or parts[0] == "mixer":
        return "SSM mixer"
    return "MLP"


_PARENT = {
    "experts": "mlp",
    "shared expert": "mlp",
    "router": "mlp",
    "MLP": "mlp",
    "attention": "self_attn",
    "SSM mixer": "mixer",
}


def module_path(module: str, layer: str = "0") -> str:
    """The module's full name as transformers builds a decoder layer, for the patterns of
    ``modules_to_not_convert`` / ``ignore`` (``model.layers.0.self_attn.q_proj``)."""
    kind = role(module)
    if kind == "LM head":
        return "lm_head"
    if kind == "vision tower":
        return f"model.visual.{module.split('.', 1)[-1]}"
    parent = _PARENT[kind]
    if module.split(".")[0] == parent:
        return f"model.layers.{layer}.{module}"
    return f"model.layers.{layer}.{parent}.{module}"


def _matches(pattern: str, name: str) -> bool:
    """transformers' ``should_convert_module``: a pattern skips a module when it matches
    from the start up to a module boundary (as a regex), or as a suffix; compressed-tensors
    and vLLM write regexes as ``re:...``."""
    if pattern.startswith("re:"):
        try:
            return re.match(pattern[3:], name) is not None
        except re.error:
            return False
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    try:
        hit = re.match(rf"(?:{pattern}){boundary}", name) is not None
    except re.error:
        hit = False
    return hit or name.endswith(pattern)


_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def converts(q: Quantization, module: str) -> bool:
    """Whether ``q`` stores ``module`` quantized (routers never; mxfp4 only experts)."""
    kind = role(module)
    if kind == "router" or (q.experts_only and kind != "experts"):
        return False
    if kind == "LM head" and not q.head:
        return False
    if kind == "vision tower" and not q.towers:
        return False
    name = module_path(module)
    return not any(_matches(p, name) for p in q.skip)


def check_skip_patterns(q: Quantization, modules: list[str], where: str) -> None:
    """Refuse a pattern that leaves one layer's quantized module unconverted: the breakdown
    counts each module over all its layers at once."""
    for pattern in q.skip:
        index = _LAYER_INDEX.search(pattern.removeprefix("re:"))
        if index is None:
            continue
        for module in modules:
            if converts(q, module) and _matches(pattern, module_path(module, index.group(1))):
                raise EstimatorError(
                    where,
                    f"{pattern[:80]!r} leaves one layer's {module} unquantized; the estimator "
                    "sizes each module over all its layers at once",
                    code=UNSUPPORTED,
                )


# -- how many bytes ----------------------------------------------------------------------


def matrix_bytes(q: Quantization, n_in: int, n_out: int) -> int:
    """Bytes of one converted ``n_in`` x ``n_out`` matrix (weights and their scales)."""
    n = n_in * n_out
    if q.fmt == "mxfp4":
        return n_out * -(-n_in // MXFP4_BLOCK) * (MXFP4_BLOCK // 2 + 1)
    if q.fmt == "fp8":
        if q.block is not None:
            scales = -(-n_out // q.block[0]) * -(-n_in // q.block[1])
        else:
            scales = n_out if q.channel else 1
        return n + scales * q.scale_bytes + (4 if q.input_scale else 0)
    if q.fmt == "int8":
        return n + 4 * n_out  # int8 weights, an fp32 scale per output row (SCB)
    if q.fmt in ("nf4", "int4"):
        blocks = -(-n // BNB_BLOCK)
        # double quantization: a uint8 absmax per block, an fp32 one per 256 of those
        nested = blocks + -(-blocks // BNB_NESTED_BLOCK) * 4
        return -(-n // 2) + (nested if q.double_quant else blocks * 4)
    # gptq / awq: packed int32 weights and zero points, fp16 scales, GPTQ's g_idx
    groups = 1 if q.group <= 0 else -(-n_in // q.group)
    packed = -(-n_in * q.bits // 32) * 4 * n_out
    zeros = groups * -(-n_out * q.bits // 32) * 4
    return packed + zeros + groups * n_out * 2 + (n_in * 4 if q.g_idx else 0)


def request_scheme(dtype: str, group: int) -> Quantization:
    """The layout of a load-time choice (``weights_dtype``) on a 16-bit checkpoint:
    bitsandbytes int8/nf4/int4 (no double quantization), fp8 per-tensor (vLLM's
    ``--quantization fp8``), GPTQ/AWQ 4-bit in groups of ``group``."""
    if dtype == "fp8":
        return Quantization("fp8", "fp8", "fp8, one scale per matrix")
    if dtype == "int8":
        return Quantization("bitsandbytes", "int8", "int8 (bitsandbytes LLM.int8)")
    if dtype in ("nf4", "int4"):
        return Quantization("bitsandbytes", dtype, f"{dtype} (bitsandbytes 4-bit)", bits=4)
    if dtype in ("gptq", "awq"):
        label = f"{dtype.upper()} 4-bit, groups of {group}"
        return Quantization(dtype, dtype, label, bits=4, group=group, g_idx=dtype == "gptq")
    if dtype == "mxfp4":
        return Quantization("mxfp4", "mxfp4", "MXFP4", bits=4, experts_only=True)
    raise EstimatorError("weights_dtype", f"{dtype!r} is not a quantized format")


# -- reading quantization_config ---------------------------------------------------------


def quantization_fields(data: Mapping[str, Any], field: str, notes: list[str]) -> dict[str, Any]:
    """Stored format of the checkpoint, from quantization_config or torch_dtype, and the
    ``Quantization`` that sizes it (ModelSpec fields)."""
    out: dict[str, Any] = {}
    dtype = data.get("torch_dtype", data.get("dtype"))
    rest = "bf16"
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in _TORCH_DTYPES:
        out["stored_format"] = _TORCH_DTYPES[dtype.removeprefix("torch.")]
        rest = "fp16" if out["stored_format"] == "fp16" else "bf16"
    quant = data.get("quantization_config")
    if quant is None:
        return out
    where = f"{field}.quantization_config"
    if not isinstance(quant, Mapping):
        raise EstimatorError(where, "expected a JSON object")
    method = quant.get("quant_method")
    reader = _READERS.get(method) if isinstance(method, str) else None
    if reader is None:
        shown = str(method)[:40]
        raise EstimatorError(
            f"{where}.quant_method",
            f"{shown!r} is not a quantization the estimator can size (it sizes mxfp4, fp8, "
            "compressed-tensors fp8, gptq, awq and bitsandbytes); it is refused rather than "
            "counted at 16 bits",
            code=UNSUPPORTED,
        )
    scheme = reader(quant, where)
    scheme = Quantization(**{**scheme.__dict__, "unquantized": rest})
    out["stored_format"] = scheme.fmt
    out["quantization"] = scheme
    if scheme.fmt in ("gptq", "awq") and scheme.group > 0:
        out["quant_group_size"] = scheme.group
    if scheme.method == "mxfp4":
        notes.append(
            "MXFP4 experts stay 4-bit with the triton kernels (transformers: compute "
            "capability 7.5+, triton 3.4+ and the kernels package; vLLM: 8.0+); without them "
            "transformers dequantizes to bf16: estimate with weights_dtype bf16"
        )
    return out


def _skip_list(quant: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = quant.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > 4096:
        raise EstimatorError(f"{where}.{key}", "expected a list of at most 4096 module names")
    if not all(isinstance(v, str) and 0 < len(v) <= 300 for v in value):
        raise EstimatorError(f"{where}.{key}", "expected module names (strings)")
    return tuple(value)


def _refuse(where: str, key: str, value: Any, why: str) -> EstimatorError:
    return EstimatorError(f"{where}.{key}", f"{str(value)[:60]!r}: {why}", code=UNSUPPORTED)


def _mxfp4(quant: Mapping[str, Any], where: str) -> Quantization:
    skip = _skip_list(quant, "modules_to_not_convert", where)
    return Quantization("mxfp4", "mxfp4", "MXFP4", bits=4, experts_only=True, skip=skip)


def _fp8(quant: Mapping[str, Any], where: str) -> Quantization:
    skip = _skip_list(quant, "modules_to_not_convert", where) + _skip_list(
        quant, "ignored_layers", where
    )
    scheme = quant.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise _refuse(where, "activation_scheme", scheme, "expected dynamic or static")
    fmt = quant.get("fmt", "e4m3")
    if fmt not in ("e4m3", "e5m2", "float8_e4m3fn"):
        raise _refuse(where, "fmt", fmt, "an fp8 format the estimator does not know")
    block = quant.get("weight_block_size")
    if block is None:
        label = "fp8, one scale per matrix" + (" + input scale" if scheme == "static" else "")
        return Quantization("fp8", "fp8", label, input_scale=scheme == "static", skip=skip)
    if not isinstance(block, list) or len(block) != 2:
        raise _refuse(where, "weight_block_size", block, "expected [out, in]")
    out_b, in_b = (check_int(b, f"{where}.weight_block_size", maximum=1 << 16) for b in block)
    if scheme == "static":
        raise _refuse(where, "activation_scheme", scheme, "block-wise fp8 is dynamic only")
    label = f"fp8, {out_b}x{in_b} blocks"
    return Quantization("fp8", "fp8", label, block=(out_b, in_b), skip=skip)


def _gptq_awq(quant: Mapping[str, Any], where: str) -> Quantization:
    method = str(quant.get("quant_method"))
    bits = quant.get("bits", quant.get("w_bit", 4))
    allowed = GPTQ_BITS if method == "gptq" else (4,)
    if isinstance(bits, bool) or bits not in allowed:
        key = "bits" if "bits" in quant else "w_bit"
        raise _refuse(where, key, bits, f"{method} sizes {', '.join(map(str, allowed))} bits")
    key = "group_size" if "group_size" in quant else "q_group_size"
    group = quant.get(key, 128)
    if group != -1:
        group = check_int(group, f"{where}.{key}", maximum=1 << 20)
    if method == "gptq":
        if quant.get("dynamic"):
            raise _refuse(where, "dynamic", "{...}", "per-module GPTQ overrides are not sized")
        if quant.get("checkpoint_format", "gptq") not in ("gptq", "gptq_v2"):
            raise _refuse(
                where, "checkpoint_format", quant.get("checkpoint_format"), "not a GPTQ layout"
            )
    elif quant.get("version", "gemm") not in ("gemm", "gemv", "exllama", "ipex"):
        raise _refuse(where, "version", quant.get("version"), "an AWQ layout not sized")
    skip = _skip_list(quant, "modules_to_not_convert", where)
    grouping = "one group" if group == -1 else f"groups of {group}"
    return Quantization(
        method,
        method,
        f"{method.upper()} {bits}-bit, {grouping}",
        bits=bits,
        group=group,
        g_idx=method == "gptq",
        head=method == "gptq" and quant.get("lm_head") is True,
        towers=False,
        skip=skip,
    )


def _bitsandbytes(quant: Mapping[str, Any], where: str) -> Quantization:
    skip = _skip_list(quant, "llm_int8_skip_modules", where)
    head = "llm_int8_skip_modules" in quant and not any(_matches(p, "lm_head") for p in skip)
    if quant.get("load_in_4bit") or quant.get("_load_in_4bit"):
        kind = quant.get("bnb_4bit_quant_type", "fp4")
        if kind not in ("nf4", "fp4"):
            raise _refuse(where, "bnb_4bit_quant_type", kind, "expected nf4 or fp4")
        double = bool(quant.get("bnb_4bit_use_double_quant"))
        fmt = "nf4" if kind == "nf4" else "int4"
        label = f"{kind} (bitsandbytes 4-bit{', double quantization' if double else ''})"
        return Quantization(
            "bitsandbytes", fmt, label, bits=4, double_quant=double, head=head, skip=skip
        )
    if quant.get("load_in_8bit") or quant.get("_load_in_8bit"):
        label = "int8 (bitsandbytes LLM.int8)"
        return Quantization("bitsandbytes", "int8", label, head=head, skip=skip)
    raise _refuse(where, "load_in_4bit", False, "neither load_in_4bit nor load_in_8bit is set")


def _compressed_tensors(quant: Mapping[str, Any], where: str) -> Quantization:
    fmt = quant.get("format")
    if fmt not in ("float-quantized", "naive-quantized"):
        raise _refuse(where, "format", fmt, "only fp8 (float-quantized) compressed-tensors")
    groups = quant.get("config_groups")
    if not isinstance(groups, Mapping) or len(groups) != 1:
        raise _refuse(where, "config_groups", "...", "expected exactly one config group")
    name, group = next(iter(groups.items()))
    at = f"{where}.config_groups.{str(name)[:40]}"
    if not isinstance(group, Mapping) or group.get("targets") != ["Linear"]:
        raise EstimatorError(f"{at}.targets", 'expected ["Linear"]', code=UNSUPPORTED)
    weights = group.get("weights")
    if not isinstance(weights, Mapping) or weights.get("type") != "float":
        raise EstimatorError(f"{at}.weights.type", "only float weights", code=UNSUPPORTED)
    if weights.get("num_bits") != 8:
        raise EstimatorError(f"{at}.weights.num_bits", "only 8-bit floats", code=UNSUPPORTED)
    strategy = weights.get("strategy")
    block = None
    if strategy == "block":
        shape = weights.get("block_structure")
        if not isinstance(shape, list) or len(shape) != 2:
            raise EstimatorError(f"{at}.weights.block_structure", "expected [out, in]")
        block = (
            check_int(shape[0], f"{at}.weights.block_structure", maximum=1 << 16),
            check_int(shape[1], f"{at}.weights.block_structure", maximum=1 << 16),
        )
    elif strategy not in ("tensor", "channel"):
        raise EstimatorError(
            f"{at}.weights.strategy", f"{str(strategy)[:20]!r} not sized", code=UNSUPPORTED
        )
    static = _static_input(group.get("input_activations"), f"{at}.input_activations")
    skip = _skip_list(quant, "ignore", where)
    return Quantization(
        "compressed-tensors",
        "fp8",
        f"fp8 (compressed-tensors, per {strategy})",
        block=block,
        channel=strategy == "channel",
        input_scale=static,
        head=not any(_matches(p, "lm_head") for p in skip),
        skip=skip,
    )


def _static_input(acts: Any, at: str) -> bool:
    """compressed-tensors activations: none or dynamic (no stored scale), or static per
    tensor (one fp32 input scale per matrix)."""
    if acts is None or (isinstance(acts, Mapping) and acts.get("dynamic") is True):
        return False
    if isinstance(acts, Mapping) and acts.get("strategy") == "tensor":
        return True
    raise EstimatorError(at, "static activations other than per tensor", code=UNSUPPORTED)


_READERS = {
    "mxfp4": _mxfp4,
    "fp8": _fp8,
    "gptq": _gptq_awq,
    "awq": _gptq_awq,
    "bitsandbytes": _bitsandbytes,
    "compressed-tensors": _compressed_tensors,
}
