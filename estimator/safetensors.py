"""Exact weight bytes from a ``.safetensors`` header or a ``model.safetensors.index.json``.

A safetensors file starts with an 8-byte little-endian header length and a JSON
header mapping each tensor name to its dtype, shape and byte offsets. That is
the best source there is: the bytes the weights take are exact. The sharded
index (``model.safetensors.index.json``) gives the exact ``total_size`` but only
tensor names, so it needs the model's ``config.json`` for the architecture.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from .config_json import model_from_config_json
from .errors import EstimatorError
from .model import MAX_PARAMS, ModelSpec
from .parsing import MAX_INPUT_BYTES, as_text, check_int, check_size, parse_json_object

FIELD = "safetensors_header"
INDEX_FIELD = "safetensors_index"

DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}
_FORMAT_OF_DTYPE = {
    "F32": "fp32",
    "F16": "fp16",
    "BF16": "bf16",
    "F8_E4M3": "fp8",
    "F8_E5M2": "fp8",
}
_LAYER_CONTAINERS = ("layers", "h", "layer", "blocks")
_MAX_DIMS = 8

Tensors = dict[str, tuple[str, tuple[int, ...], int]]  # name: (dtype, shape, bytes)


class HeaderSummary(TypedDict):
    """A safetensors header's tensors, validated, and their totals."""

    tensors: Tensors
    total_bytes: int
    elements: int
    bytes_by_dtype: dict[str, int]


class ExactFigures(TypedDict):
    """What a header tells exactly, as ModelSpec fields."""

    tensor_bytes: int
    stored_format: str | None
    param_count_override: int | None  # None: packed weights do not count elements


def _header_text(data: str | bytes | bytearray) -> str:
    if isinstance(data, str):
        check_size(data, FIELD)
        if not data.lstrip().startswith("{"):
            raise EstimatorError(
                FIELD, "expected the JSON header (text starting with '{') or the file's first bytes"
            )
        return data
    if not isinstance(data, bytes | bytearray):
        raise EstimatorError(FIELD, "expected text or bytes")
    data = bytes(data)
    if len(data) > MAX_INPUT_BYTES + 8:
        raise EstimatorError(
            FIELD, f"input is {len(data):,} bytes; the limit is {MAX_INPUT_BYTES:,}"
        )
    if data.lstrip()[:1] == b"{":
        return as_text(data, FIELD)
    if len(data) < 8:
        raise EstimatorError(FIELD, "too short: a safetensors file starts with an 8-byte length")
    length = int.from_bytes(data[:8], "little")
    if length > MAX_INPUT_BYTES:
        raise EstimatorError(
            FIELD, f"declares a {length:,}-byte header; the limit is {MAX_INPUT_BYTES:,}"
        )
    if len(data) < 8 + length:
        raise EstimatorError(
            FIELD,
            f"holds {len(data) - 8:,} bytes of a {length:,}-byte header: send the first "
            f"{8 + length:,} bytes of the file",
        )
    return as_text(data[8 : 8 + length], FIELD)


def _layer_index(name: str) -> int | None:
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if part in _LAYER_CONTAINERS and nxt.isascii() and nxt.isdigit() and len(nxt) <= 6:
            return int(nxt)
    return None


def _expert_index(name: str) -> int | None:
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if part == "experts" and nxt.isascii() and nxt.isdigit() and len(nxt) <= 6:
            return int(nxt)
    return None


def read_safetensors_header(data: str | bytes | bytearray) -> HeaderSummary:
    """Tensors of a header: {name: (dtype, shape, nbytes)} plus totals, all validated."""
    return summarize_header(parse_json_object(_header_text(data), FIELD))


def summarize_header(header: Mapping[str, Any], field: str = FIELD) -> HeaderSummary:
    """A parsed header's tensors (``{name: {dtype, shape, data_offsets}}``), validated, with
    their totals; errors name ``field``."""
    tensors: Tensors = {}
    total_bytes = 0
    elements = 0
    bytes_by_dtype: dict[str, int] = {}
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict):
                raise EstimatorError(f"{field}.__metadata__", "expected a JSON object")
            continue
        dtype, dims, nbytes = _tensor(f"{field}.{name[:80]}", info)
        tensors[name] = (dtype, dims, nbytes)
        total_bytes += nbytes
        elements += math.prod(dims)
        bytes_by_dtype[dtype] = bytes_by_dtype.get(dtype, 0) + nbytes
    if not tensors:
        raise EstimatorError(field, "the header lists no tensors")
    return {
        "tensors": tensors,
        "total_bytes": total_bytes,
        "elements": elements,
        "bytes_by_dtype": bytes_by_dtype,
    }


def _tensor(where: str, info: object) -> tuple[str, tuple[int, ...], int]:
    """One tensor's entry, validated: (dtype, shape, bytes)."""
    if not isinstance(info, dict):
        raise EstimatorError(where, "expected an object with dtype, shape and data_offsets")
    dtype = info.get("dtype")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        shown = dtype if isinstance(dtype, str) and len(dtype) <= 20 else type(dtype).__name__
        raise EstimatorError(f"{where}.dtype", f"unknown dtype {shown!r}")
    shape = info.get("shape")
    if not isinstance(shape, list | tuple) or len(shape) > _MAX_DIMS:
        raise EstimatorError(f"{where}.shape", f"expected a list of at most {_MAX_DIMS} sizes")
    dims = tuple(check_int(d, f"{where}.shape", minimum=0, maximum=MAX_PARAMS) for d in shape)
    numel = math.prod(dims)
    if numel > MAX_PARAMS:
        raise EstimatorError(f"{where}.shape", "over 10^13 elements")
    nbytes = numel * DTYPE_BYTES[dtype]
    offsets = info.get("data_offsets")
    if offsets is not None:
        if not isinstance(offsets, list | tuple) or len(offsets) != 2:
            raise EstimatorError(f"{where}.data_offsets", "expected [begin, end]")
        begin, end = (
            check_int(o, f"{where}.data_offsets", minimum=0, maximum=MAX_PARAMS * 8)
            for o in offsets
        )
        if end - begin != nbytes:
            raise EstimatorError(
                f"{where}.data_offsets",
                f"span {end - begin:,} bytes, but {dtype} {list(dims)} needs {nbytes:,}",
            )
    return dtype, dims, nbytes


def checkpoint_format(tensors: Tensors, by_dtype: dict[str, int]) -> str | None:
    """The format the tensors are stored in: a packed 4-bit layout by its tensor names, else
    the dtype holding the most bytes (None: one the estimator has no format for)."""
    names = tensors.keys()
    if any(n.endswith(".qweight") for n in names):
        return "gptq" if any(n.endswith(".g_idx") for n in names) else "awq"
    if any(n.endswith((".absmax", ".quant_map")) or ".quant_state." in n for n in names):
        return "nf4"
    if any(n.endswith(".SCB") for n in names):
        return "int8"
    if any(n.endswith("_blocks") for n in names) and any(n.endswith("_scales") for n in names):
        return "mxfp4"  # gpt-oss: MXFP4 experts (*_blocks, *_scales), the rest bf16
    dominant = max(by_dtype, key=lambda d: by_dtype[d])
    return _FORMAT_OF_DTYPE.get(dominant)


def model_from_safetensors_header(
    data: str | bytes | bytearray,
    *,
    config_json: str | bytes | None = None,
    name: str | None = None,
    source: str = "",
) -> ModelSpec:
    """A ModelSpec with exact tensor bytes from a safetensors header (text, or the file's
    first bytes: 8-byte little-endian length + header).

    With ``config_json`` the architecture comes from it; without, it is inferred
    from Llama-style tensor names and shapes (KV width exact, head split assumed).
    """
    summary = read_safetensors_header(data)
    exact = exact_figures(summary)
    if config_json is not None:
        spec = model_from_config_json(config_json, name=name, source=source)
        return with_exact_figures(spec, summary, exact, "the safetensors header")
    fmt = exact["stored_format"]
    packed = exact["param_count_override"] is None
    if packed:
        raise EstimatorError(
            FIELD, f"a {fmt} checkpoint packs its weights: send config.json with the header"
        )
    return _infer_from_names(summary["tensors"], exact, name=name, source=source)


def exact_figures(summary: HeaderSummary) -> ExactFigures:
    """What the header's tensors say exactly: their bytes, their format and, unless the
    weights are packed (GPTQ, AWQ, bitsandbytes 4-bit), the parameter count."""
    fmt = checkpoint_format(summary["tensors"], summary["bytes_by_dtype"])
    packed = fmt in ("gptq", "awq", "nf4", "mxfp4")
    return {
        "tensor_bytes": summary["total_bytes"],
        "stored_format": fmt,
        "param_count_override": None if packed else summary["elements"],
    }


def with_exact_figures(
    spec: ModelSpec, summary: HeaderSummary, exact: ExactFigures, where: str
) -> ModelSpec:
    """``spec`` (read from config.json) with the exact figures of the headers read from
    ``where``, and a note when the element count differs from the derived one."""
    notes = list(spec.notes)
    derived = spec.breakdown.total
    packed = exact["param_count_override"] is None
    if not packed and abs(derived - summary["elements"]) > 0.01 * derived:
        notes.append(
            f"config.json derives {derived:,} parameters; {where} holds "
            f"{summary['elements']:,} elements (the header's figure is used)"
        )
    read_as = f"{spec.read_as}; parameters and bytes exact from {where}"
    return replace(spec, notes=tuple(notes), read_as=read_as, **exact)


# The first tensor named with each suffix gives its shape.
_SHAPE_SUFFIXES = (
    "embed_tokens.weight",
    "lm_head.weight",
    "q_proj.weight",
    "k_proj.weight",
    "gate_proj.weight",
    "up_proj.weight",
    "w1.weight",
)


@dataclass
class NameScan:
    """What Llama-style tensor names and shapes say of the architecture."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    last_layer: int = -1
    last_expert: int = -1
    norms_in_first: int = 0
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False


def _scan_names(tensors: Tensors) -> NameScan:
    scan = NameScan()
    for tensor_name, (_, dims, _) in tensors.items():
        layer = _layer_index(tensor_name)
        if layer is not None:
            scan.last_layer = max(scan.last_layer, layer)
        expert = _expert_index(tensor_name)
        if expert is not None:
            scan.last_expert = max(scan.last_expert, expert)
        for suffix in _SHAPE_SUFFIXES:
            if tensor_name.endswith(suffix) and suffix not in scan.shapes:
                scan.shapes[suffix] = dims
        scan.qkv_bias |= tensor_name.endswith("q_proj.bias")
        scan.o_bias |= tensor_name.endswith("o_proj.bias")
        scan.qk_norm |= tensor_name.endswith(("q_norm.weight", "k_norm.weight"))
        if (
            layer == 0
            and tensor_name.endswith("norm.weight")
            and not tensor_name.endswith(("q_norm.weight", "k_norm.weight"))
        ):
            scan.norms_in_first += 1
    return scan


def _infer_from_names(
    tensors: Tensors, exact: ExactFigures, *, name: str | None, source: str
) -> ModelSpec:
    scan = _scan_names(tensors)
    shapes = scan.shapes
    embed = shapes.get("embed_tokens.weight")
    q = shapes.get("q_proj.weight")
    k = shapes.get("k_proj.weight")
    mlp = shapes.get("gate_proj.weight") or shapes.get("w1.weight") or shapes.get("up_proj.weight")
    if not (embed and q and k and mlp and scan.last_layer >= 0) or any(
        len(s) != 2 for s in (embed, q, k, mlp)
    ):
        raise EstimatorError(
            FIELD,
            "cannot infer the architecture from these tensor names (expected Llama-style "
            "embed_tokens / q_proj / k_proj / gate_proj): send config.json with the header",
        )
    vocab, hidden = embed
    q_rows, k_rows = q[0], k[0]
    head_dim = next(
        (d for d in (128, 64, 256, 96, 80, 160, 112) if not q_rows % d and not k_rows % d), 0
    )
    head_dim = head_dim or math.gcd(q_rows, k_rows)
    notes = [
        f"architecture inferred from tensor names; head_dim assumed {head_dim} "
        "(KV cache width is exact, the head split is not)"
    ]
    experts = scan.last_expert + 1
    if experts:
        notes.append("experts per token not in the header: assumed 2")
    return ModelSpec(
        name=name or "checkpoint",
        family="generic",
        hidden_size=hidden,
        num_layers=scan.last_layer + 1,
        num_heads=q_rows // head_dim,
        num_kv_heads=k_rows // head_dim,
        head_dim=head_dim,
        intermediate_size=mlp[0],
        vocab_size=vocab,
        tie_word_embeddings="lm_head.weight" not in shapes,
        num_experts=experts,
        experts_per_token=min(2, experts),
        qkv_bias=scan.qkv_bias and not scan.o_bias,
        attention_bias=scan.o_bias,
        qk_norm=scan.qk_norm,
        norms_per_layer=max(scan.norms_in_first, 1),
        source=source,
        notes=tuple(notes),
        read_as="generic, inferred from the safetensors header's tensor names and shapes "
        "(parameters and bytes exact)",
        **exact,
    )


def model_from_safetensors_index(
    text: str | bytes,
    *,
    config_json: str | bytes | None = None,
    name: str | None = None,
    source: str = "",
) -> ModelSpec:
    """A ModelSpec whose weights take exactly ``metadata.total_size`` bytes.

    The index lists tensor names and the total only, so ``config_json`` is
    required for the architecture (KV cache, activations).
    """
    data = parse_json_object(text, INDEX_FIELD)
    metadata = data.get("metadata")
    if not isinstance(metadata, dict):
        raise EstimatorError(f"{INDEX_FIELD}.metadata", "expected an object with total_size")
    total = metadata.get("total_size")
    if total is None:
        raise EstimatorError(f"{INDEX_FIELD}.metadata.total_size", "required", code="required")
    total = check_int(total, f"{INDEX_FIELD}.metadata.total_size", maximum=MAX_PARAMS * 8)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise EstimatorError(f"{INDEX_FIELD}.weight_map", "expected an object of tensor names")
    for key, shard in weight_map.items():
        if not isinstance(shard, str):
            raise EstimatorError(f"{INDEX_FIELD}.weight_map.{key[:80]}", "expected a file name")
    if config_json is None:
        raise EstimatorError(
            "config_json",
            "model.safetensors.index.json lists only tensor names and total bytes: "
            "send the model's config.json with it",
        )
    spec = model_from_config_json(config_json, name=name, source=source)
    notes = list(spec.notes)
    layer_indices = [i for i in map(_layer_index, weight_map) if i is not None]
    if layer_indices and max(layer_indices) + 1 != spec.num_layers:
        notes.append(
            f"the index names {max(layer_indices) + 1} layers, config.json {spec.num_layers}"
        )
    has_head = "lm_head.weight" in weight_map
    if has_head == spec.tie_word_embeddings and not spec.encoder_only:
        notes.append(
            "the index "
            + ("stores" if has_head else "lacks")
            + " lm_head.weight but config.json says the embeddings are "
            + ("tied" if spec.tie_word_embeddings else "untied")
        )
    fmt = spec.stored_format
    if fmt is None:
        fmt = "bf16"
        notes.append("config.json gives no torch_dtype: the index bytes are taken as bf16")
    read_as = f"{spec.read_as}; weight bytes exact from model.safetensors.index.json"
    return replace(spec, tensor_bytes=total, stored_format=fmt, notes=tuple(notes), read_as=read_as)
