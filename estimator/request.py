"""What to estimate: ``EstimateRequest``, validated, and built from a plain dict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .catalog import model_from_catalog
from .config_json import model_from_config_json
from .errors import EstimatorError, unknown_field
from .hub import HUB_FIELD, HubReader, hub_ref_from_mapping
from .model import WEIGHT_FORMATS, ModelSpec
from .parsing import (
    MAX_INPUT_BYTES,
    as_int,
    as_text,
    check_bool,
    check_choice,
    check_float,
    check_int,
    parse_json_object,
)
from .plain_numbers import NUMBER_FIELDS, model_from_numbers
from .safetensors import model_from_safetensors_header, model_from_safetensors_index

WORKLOADS = ("inference", "training")
WEIGHT_DTYPES = WEIGHT_FORMATS  # one list: the formats a checkpoint is stored or loaded in
KV_DTYPES = ("auto", "fp32", "fp16", "bf16", "fp8")
ENGINES = ("transformers", "vllm")
METHODS = ("full", "lora", "qlora")
OPTIMIZERS = ("adamw", "adamw_bf16", "adam8bit", "sgd_momentum")
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL_LINEAR = "all-linear"
DEFAULT_TIERS_MIB = (4096, 8192, 12288, 24576)
FLOAT_DTYPES = ("fp32", "fp16", "bf16")
FOUR_BIT_BNB = ("nf4", "int4")

MAX_CONTEXT = 10**7
DEFAULT_CONTEXT = 4096
MAX_BATCH = 10**5
MAX_TIER_MIB = 10**7

# The ways a request may describe its model; "config_json" may accompany either safetensors key.
# "hub" (a Hugging Face model id, with an optional "revision") is read by the platform.
MODEL_SOURCES = ("catalog", "config_json", "hub", "safetensors_header", "safetensors_index")


@dataclass(frozen=True)
class EstimateRequest:
    """One job to estimate. Defaults are documented in ``estimator/__init__.py``.

    Inference uses ``batch`` and ``context_tokens`` (prompt + generated);
    training uses ``micro_batch`` and ``seq_len`` (None: the inference values).
    GPTQ/AWQ scales and zero points use ``quant_group_size`` columns per group
    (128, the usual default); bitsandbytes 4-bit uses blocks of 64 with an fp32
    absmax each (its default, no double quantization).
    """

    model: ModelSpec
    workload: str = "inference"
    weights_dtype: str = "bf16"
    kv_cache_dtype: str = "auto"  # auto: 16-bit, or fp32 with fp32 weights
    batch: int = 1
    context_tokens: int = 4096  # from_mapping: min(4096, learned positions) when not given
    prefill_chunk: int | None = None  # None: whole prompt (transformers), 2048 (vLLM)
    engine: str = "transformers"
    fused_attention: bool = True  # flash/SDPA kernels: no attention-score matrix
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    quant_group_size: int = 128
    method: str = "full"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")  # PEFT's default for Llama-style models
    optimizer: str = "adamw"
    gradient_checkpointing: bool = False
    seq_len: int | None = None
    micro_batch: int | None = None
    cuda_context_mib: float = 512.0
    fragmentation: float = 0.10
    tier_mib: int | None = None
    tiers_mib: tuple[int, ...] = DEFAULT_TIERS_MIB

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def training(self) -> bool:
        return self.workload == "training"

    @property
    def train_seq_len(self) -> int:
        return self.seq_len if self.seq_len is not None else self.context_tokens

    @property
    def train_micro_batch(self) -> int:
        return self.micro_batch if self.micro_batch is not None else self.batch

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], *, hub: HubReader | None = None
    ) -> EstimateRequest:
        """Validate a plain dict (as an API sends it), with defaults.

        ``{"model": {"catalog": name} | {"config_json": text} |
        {"safetensors_header": text[, "config_json": text]} |
        {"safetensors_index": text, "config_json": text} |
        {"hub": model_id[, "revision": rev]} | {numbers...}, "workload": ..., ...}``.
        Every problem is an ``EstimatorError`` with a dotted field name; unknown keys are
        refused. A Hub id is checked here and read by ``hub`` (the platform's reader);
        without one it is refused.
        """
        return request_from_mapping(data, hub=hub)

    @classmethod
    def from_json(cls, text: str | bytes) -> EstimateRequest:
        """``from_mapping`` on JSON text, with the 1 MB limit and bounded parsing."""
        return request_from_mapping(parse_json_object(text, "request"))


_FIELDS = tuple(f.name for f in fields(EstimateRequest))


def request_settings(r: EstimateRequest) -> dict[str, Any]:
    """The request's settings (everything but the model), JSON-ready."""
    out: dict[str, Any] = {}
    for name in _FIELDS:
        if name != "model":
            value = getattr(r, name)
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def _validate(r: EstimateRequest) -> None:
    if not isinstance(r.model, ModelSpec):
        raise EstimatorError("model", "expected a ModelSpec")
    check_choice(r.workload, "workload", WORKLOADS)
    check_choice(r.weights_dtype, "weights_dtype", WEIGHT_DTYPES)
    check_choice(r.kv_cache_dtype, "kv_cache_dtype", KV_DTYPES)
    check_choice(r.engine, "engine", ENGINES)
    check_choice(r.method, "method", METHODS)
    check_choice(r.optimizer, "optimizer", OPTIMIZERS)
    check_int(r.batch, "batch", maximum=MAX_BATCH)
    check_int(r.context_tokens, "context_tokens", maximum=MAX_CONTEXT)
    if r.prefill_chunk is not None:
        check_int(r.prefill_chunk, "prefill_chunk", maximum=MAX_CONTEXT)
    if r.seq_len is not None:
        check_int(r.seq_len, "seq_len", maximum=MAX_CONTEXT)
    if r.micro_batch is not None:
        check_int(r.micro_batch, "micro_batch", maximum=MAX_BATCH)
    for name in ("fused_attention", "enforce_eager", "gradient_checkpointing"):
        check_bool(getattr(r, name), name)
    check_float(r.gpu_memory_utilization, "gpu_memory_utilization", minimum=0.05, maximum=1.0)
    check_int(r.quant_group_size, "quant_group_size", minimum=16, maximum=1 << 20)
    check_int(r.lora_rank, "lora_rank", maximum=65536)
    if not isinstance(r.lora_targets, tuple) or not 1 <= len(r.lora_targets) <= len(LORA_MODULES):
        raise EstimatorError("lora_targets", "expected 1 to 7 module names")
    for target in r.lora_targets:
        check_choice(target, "lora_targets", (*LORA_MODULES, ALL_LINEAR))
    check_float(r.cuda_context_mib, "cuda_context_mib", minimum=0, maximum=65536)
    check_float(r.fragmentation, "fragmentation", minimum=0, maximum=1)
    if r.tier_mib is not None:
        check_int(r.tier_mib, "tier_mib", maximum=MAX_TIER_MIB)
    if not isinstance(r.tiers_mib, tuple) or not 1 <= len(r.tiers_mib) <= 32:
        raise EstimatorError("tiers_mib", "expected 1 to 32 tier sizes")
    for tier in r.tiers_mib:
        check_int(tier, "tiers_mib", maximum=MAX_TIER_MIB)

    model = r.model
    _check_mxfp4(r)
    if r.training:
        if r.engine != "transformers":
            raise EstimatorError("engine", "vLLM serves inference only; train with transformers")
        if r.method == "full" and r.weights_dtype not in FLOAT_DTYPES:
            raise EstimatorError(
                "weights_dtype",
                "full fine-tuning trains the weights themselves: use fp32, bf16 or fp16",
            )
        if r.method == "lora" and r.weights_dtype not in (*FLOAT_DTYPES, "int8"):
            raise EstimatorError(
                "weights_dtype", "LoRA on a 4-bit base is QLoRA: set method to qlora"
            )
        if r.method == "qlora" and r.weights_dtype not in FOUR_BIT_BNB:
            raise EstimatorError("weights_dtype", "QLoRA quantizes the base to nf4 or int4")
    positions = model.max_position_embeddings
    if model.learned_positions and positions is not None:
        length = r.train_seq_len if r.training else r.context_tokens
        if length > positions:
            field = "seq_len" if r.training and r.seq_len is not None else "context_tokens"
            raise EstimatorError(
                field,
                f"{model.name} has {positions:,} learned positions; {length:,} tokens do not fit",
            )


def _check_mxfp4(r: EstimateRequest) -> None:
    """MXFP4 is a checkpoint's own format: loaded as stored, never quantized to, not trained."""
    if r.weights_dtype != "mxfp4":
        return
    if r.model.stored_format != "mxfp4":
        raise EstimatorError(
            "weights_dtype",
            "mxfp4 is the format gpt-oss checkpoints ship in; transformers and vLLM do not "
            "quantize other checkpoints to it: choose fp8, int8 or nf4",
        )
    if r.training:
        raise EstimatorError(
            "weights_dtype", "transformers does not train MXFP4 weights: use bf16 (dequantized)"
        )


# -- from a plain dict -----------------------------------------------------------


def request_from_mapping(
    data: Mapping[str, Any], *, hub: HubReader | None = None
) -> EstimateRequest:
    if not isinstance(data, Mapping):
        raise EstimatorError("request", "expected a JSON object")
    for key in data:
        if key not in _FIELDS:
            raise unknown_field(str(key)[:60])
    if "model" not in data:
        raise EstimatorError("model", "required", code="required")
    model = model_from_mapping(data["model"], hub=hub)
    kwargs: dict[str, Any] = {"model": model}
    for key, value in data.items():
        if key == "model" or (value is None and key in _NULLABLE):
            continue
        kwargs[key] = _coerce(key, value)
    workload = kwargs.get("workload", "inference")
    if "weights_dtype" not in kwargs:
        if workload == "training" and kwargs.get("method") == "qlora":
            kwargs["weights_dtype"] = "nf4"
        elif model.stored_format == "mxfp4" and workload == "training":
            kwargs["weights_dtype"] = "bf16"  # transformers trains MXFP4 weights dequantized
        elif model.stored_format in ("gptq", "awq", "fp8", "int8", "nf4", "int4", "mxfp4"):
            kwargs["weights_dtype"] = model.stored_format  # a pre-quantized checkpoint
    positions = model.max_position_embeddings
    if "context_tokens" not in kwargs and model.learned_positions and positions:
        kwargs["context_tokens"] = min(DEFAULT_CONTEXT, positions)  # GPT-2: 1024, BERT: 512
    if model.quant_group_size is not None and "quant_group_size" not in kwargs:
        kwargs["quant_group_size"] = model.quant_group_size
    return EstimateRequest(**kwargs)


_NULLABLE = {"prefill_chunk", "seq_len", "micro_batch", "tier_mib"}
_INT_FIELDS = {
    "batch",
    "context_tokens",
    "prefill_chunk",
    "quant_group_size",
    "lora_rank",
    "seq_len",
    "micro_batch",
    "tier_mib",
}
_BOOL_FIELDS = {"fused_attention", "enforce_eager", "gradient_checkpointing"}
_FLOAT_FIELDS = {"gpu_memory_utilization", "cuda_context_mib", "fragmentation"}


def _coerce(key: str, value: Any) -> Any:
    if key in _INT_FIELDS:
        return as_int(value, key)
    if key in _BOOL_FIELDS:
        return check_bool(value, key)
    if key in _FLOAT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise EstimatorError(key, "expected a number")
        return float(value)
    if key in ("lora_targets", "tiers_mib"):
        if not isinstance(value, list | tuple) or len(value) > 32:
            raise EstimatorError(key, "expected a list")
        if key == "lora_targets" and ALL_LINEAR in value:
            return LORA_MODULES
        return tuple(value)
    if not isinstance(value, str):
        raise EstimatorError(key, "expected a string")
    return value


def model_from_mapping(value: Any, *, hub: HubReader | None = None) -> ModelSpec:
    """The ``model`` part of a request: catalog name, config.json, safetensors, a Hub id
    (read by ``hub``), or numbers."""
    if isinstance(value, ModelSpec):
        return value
    if isinstance(value, str):
        return model_from_catalog(value)
    if not isinstance(value, Mapping):
        raise EstimatorError("model", "expected an object")
    sources = [key for key in MODEL_SOURCES if key in value]
    try:
        if not sources:
            return model_from_numbers(value, field="model")
        if HUB_FIELD in sources:
            return _model_from_hub(value, sources, hub)
        extra = [key for key in value if key not in (*MODEL_SOURCES, "name")]
        if extra:
            raise unknown_field(f"model.{str(extra[0])[:60]}")
        name = value.get("name")
        if name is not None and (not isinstance(name, str) or not 0 < len(name) <= 200):
            raise EstimatorError("model.name", "expected a name of 1 to 200 characters")
        _check_total_size(value)
        combo = set(sources)
        if combo == {"catalog"}:
            return model_from_catalog(value["catalog"])
        if combo == {"config_json"}:
            return model_from_config_json(_text(value, "config_json"), name=name)
        if combo <= {"safetensors_header", "config_json"}:
            return model_from_safetensors_header(
                _text_or_bytes(value, "safetensors_header"),
                config_json=_text(value, "config_json") if "config_json" in value else None,
                name=name,
            )
        if combo <= {"safetensors_index", "config_json"}:
            config = _text(value, "config_json") if "config_json" in value else None
            return model_from_safetensors_index(
                _text(value, "safetensors_index"), config_json=config, name=name
            )
        raise EstimatorError(
            "model",
            f"give one of catalog, config_json, hub, safetensors_header, safetensors_index, "
            f"or numbers ({', '.join(NUMBER_FIELDS[:4])}...); not {' + '.join(sources)}",
        )
    except EstimatorError as exc:
        raise exc.prefixed("model") from exc


def _model_from_hub(
    value: Mapping[str, Any], sources: list[str], hub: HubReader | None
) -> ModelSpec:
    if sources != [HUB_FIELD]:
        raise EstimatorError("model", f"a Hub id stands alone; not {' + '.join(sources)}")
    ref = hub_ref_from_mapping(value)  # checked before any request
    if hub is None:
        raise EstimatorError(HUB_FIELD, "a model id is read from the Hub by the platform")
    return hub(ref)


def _text(value: Mapping[str, Any], key: str) -> str:
    return as_text(value[key], key)


def _text_or_bytes(value: Mapping[str, Any], key: str) -> str | bytes:
    item = value[key]
    if isinstance(item, bytes | bytearray):
        return bytes(item)
    return as_text(item, key)


def _check_total_size(value: Mapping[str, Any]) -> None:
    total = 0
    for key in MODEL_SOURCES:
        item = value.get(key)
        if isinstance(item, str | bytes | bytearray):
            total += len(item)
    if total > MAX_INPUT_BYTES + 8:
        raise EstimatorError(
            "model", f"inputs total {total:,} bytes; the limit is {MAX_INPUT_BYTES:,}"
        )
