"""A model named by its Hugging Face Hub id: the id and revision checked before anything is
asked of the Hub, and a ModelSpec from what the platform read there (pure: no I/O here).

The platform reads the repository's ``config.json`` and the header of every safetensors file
(``estimator/hub_fetch.py``, through ``huggingface_hub``), never the weights, and keeps the
result as ``HubFacts``: a JSON-ready dict it can cache. ``model_from_hub`` turns those facts
into a ModelSpec: the architecture from ``config.json`` (the readers of a pasted config), the
weights' bytes and, unpacked, the parameter count exact from the headers. A ``model_type``
the estimator does not count still gets exact weights; its KV cache comes from the config's
attention fields, or the estimate is refused naming the ones it cannot read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from .config_json import model_from_config
from .errors import EstimatorError, unknown_field
from .model import MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB, ModelSpec
from .safetensors import (
    ExactFigures,
    HeaderSummary,
    exact_figures,
    summarize_header,
    with_exact_figures,
)

HUB_FIELD = "hub"
REVISION_FIELD = "revision"
DEFAULT_REVISION = "main"
MAX_REPO_ID = 96
MAX_REVISION = 100
# A safetensors header's 8-byte length prefix above this is refused before the header is
# fetched (huggingface_hub's own limit, SAFETENSORS_MAX_HEADER_LENGTH, is the same 25 MB).
MAX_HEADER_BYTES = 25_000_000
MAX_SHARDS = 256  # Llama-3.1-405B has 191, DeepSeek-V3 163
MAX_TENSORS = 300_000  # over every shard; DeepSeek-V3 stores about 92,000
MAX_JSON_FILE_BYTES = 16 * 1024 * 1024  # config.json, model.safetensors.index.json

_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_HEX = frozenset("0123456789abcdef")
_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight")


@dataclass(frozen=True)
class HubRef:
    """A model repository on the Hub and the revision to read (branch, tag or commit)."""

    repo_id: str
    revision: str = DEFAULT_REVISION

    @property
    def pinned(self) -> bool:
        """The revision is a full commit sha: what it names never changes."""
        return is_commit(self.revision)


HubReader = Callable[[HubRef], ModelSpec]


class HubFacts(TypedDict):
    """What the platform read of a repository at one commit: JSON-ready, cacheable."""

    repo_id: str
    revision: str
    commit: str
    config: dict[str, Any]
    files: int
    tensors: int
    tensor_bytes: int
    elements: int
    bytes_by_dtype: dict[str, int]
    stored_format: str | None
    packed: bool
    embedding_shape: list[int] | None


def is_commit(revision: str) -> bool:
    return len(revision) == 40 and all(c in _HEX for c in revision)


def check_repo_id(value: object, field: str = HUB_FIELD) -> str:
    """A Hub model id: ``name`` or ``namespace/name``, each of letters, digits, ``.``, ``_``
    and ``-``, neither starting nor ending with ``.`` or ``-``, no ``..``; 96 characters."""
    if not isinstance(value, str) or not value:
        raise EstimatorError(field, "expected a Hugging Face model id, e.g. Qwen/Qwen3-8B")
    shown = value[:MAX_REPO_ID]
    if len(value) > MAX_REPO_ID:
        raise EstimatorError(field, f"a model id is at most {MAX_REPO_ID} characters")
    parts = value.split("/")
    if len(parts) > 2 or not all(_hub_name(p) for p in parts):
        raise EstimatorError(
            field,
            f"{shown!r} is not a Hugging Face model id: namespace/name of letters, digits, "
            "'.', '_' and '-', not starting or ending with '.' or '-', without '..'",
        )
    return value


def _hub_name(part: str) -> bool:
    return (
        bool(part)
        and all(c in _NAME_CHARS for c in part)
        and part[0] not in ".-"
        and part[-1] not in ".-"
        and ".." not in part
        and "--" not in part
    )


def check_revision(value: object, field: str = REVISION_FIELD) -> str:
    """A branch or tag name (``main``, ``v1.0``, ``refs/pr/3``) or a 40-hex commit sha:
    letters, digits, ``.``, ``_``, ``-`` and ``/`` between names; 100 characters."""
    if not isinstance(value, str) or not value:
        raise EstimatorError(field, "expected a branch, tag or commit sha, e.g. main")
    if len(value) > MAX_REVISION:
        raise EstimatorError(field, f"a revision is at most {MAX_REVISION} characters")
    parts = value.split("/")
    if not all(p and all(c in _NAME_CHARS for c in p) for p in parts) or any(
        p[0] in ".-" or p.endswith((".", ".lock")) or ".." in p for p in parts
    ):
        raise EstimatorError(
            field,
            f"{value!r} is not a revision: a branch or tag name of letters, digits, '.', '_', "
            "'-' and '/' (no '..', no spaces), or a commit sha",
        )
    return value


def hub_ref_from_mapping(value: Mapping[str, Any]) -> HubRef:
    """``{"hub": id, "revision": r}`` (revision optional: main), checked before any request."""
    for key in value:
        if key not in (HUB_FIELD, REVISION_FIELD):
            raise unknown_field(str(key)[:60])
    revision = value.get(REVISION_FIELD)
    return HubRef(
        check_repo_id(value.get(HUB_FIELD)),
        DEFAULT_REVISION if revision is None else check_revision(revision),
    )


def hub_error(code: str, ref: HubRef, message: str, *, field: str = HUB_FIELD) -> EstimatorError:
    """A refusal about reading ``ref`` from the Hub, naming the model id."""
    return EstimatorError(field, f"{ref.repo_id} (revision {ref.revision}): {message}", code=code)


# -- facts from the headers ------------------------------------------------------------------


def merge_headers(headers: Mapping[str, Mapping[str, Any]]) -> HeaderSummary:
    """Every shard's header (``{file: {tensor: {dtype, shape, data_offsets}}}``), each
    validated by the safetensors reader, as one summary."""
    merged: HeaderSummary = {"tensors": {}, "total_bytes": 0, "elements": 0, "bytes_by_dtype": {}}
    for filename, header in headers.items():
        part = summarize_header(header, f"{HUB_FIELD}.{filename[:80]}")
        merged["tensors"].update(part["tensors"])
        merged["total_bytes"] += part["total_bytes"]
        merged["elements"] += part["elements"]
        for dtype, size in part["bytes_by_dtype"].items():
            merged["bytes_by_dtype"][dtype] = merged["bytes_by_dtype"].get(dtype, 0) + size
    return merged


def hub_facts(
    ref: HubRef, commit: str, config: dict[str, Any], headers: Mapping[str, Mapping[str, Any]]
) -> HubFacts:
    """The facts to keep from a repository's config.json and safetensors headers."""
    summary = merge_headers(headers)
    exact = exact_figures(summary)
    embedding = next(
        (
            list(dims)
            for name, (_, dims, _) in summary["tensors"].items()
            if name.endswith(_EMBEDDINGS)
        ),
        None,
    )
    return {
        "repo_id": ref.repo_id,
        "revision": ref.revision,
        "commit": commit,
        "config": config,
        "files": len(headers),
        "tensors": len(summary["tensors"]),
        "tensor_bytes": summary["total_bytes"],
        "elements": summary["elements"],
        "bytes_by_dtype": dict(summary["bytes_by_dtype"]),
        "stored_format": exact["stored_format"],
        "packed": exact["param_count_override"] is None,
        "embedding_shape": embedding,
    }


# -- a ModelSpec from the facts --------------------------------------------------------------


def model_from_hub(facts: HubFacts) -> ModelSpec:
    """The model the facts describe: its family's reading of config.json (unknown families
    by their attention fields), with the weights' bytes exact from the headers."""
    ref = HubRef(facts["repo_id"], facts["revision"])
    source = f"Hugging Face Hub: {ref.repo_id} at {facts['commit'][:12]}"
    where = f"the safetensors headers on the Hub ({facts['files']} files)"
    summary: HeaderSummary = {
        "tensors": {},
        "total_bytes": facts["tensor_bytes"],
        "elements": facts["elements"],
        "bytes_by_dtype": facts["bytes_by_dtype"],
    }
    exact: ExactFigures = {
        "tensor_bytes": facts["tensor_bytes"],
        "stored_format": facts["stored_format"],
        "param_count_override": None if facts["packed"] else facts["elements"],
    }
    try:
        spec = model_from_config(facts["config"], name=ref.repo_id, source=source)
    except EstimatorError as exc:
        if exc.code != "unsupported_architecture":
            raise
        return _unknown_family(facts, exact, source, where)
    return with_exact_figures(spec, summary, exact, where)


# Where the attention of an unknown family is read: the first key present wins.
_ATTENTION_KEYS = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
}
_LIMITS = {"hidden_size": MAX_HIDDEN, "num_layers": MAX_LAYERS, "num_heads": MAX_HEADS}


def _unknown_family(facts: HubFacts, exact: ExactFigures, source: str, where: str) -> ModelSpec:
    """A model_type the estimator does not count: the weights exact from the headers, the
    KV cache from the config's attention fields (refused when they cannot be read)."""
    config = facts["config"]
    shape = attention_shape(config)
    hidden = shape["hidden_size"]
    intermediate = _config_int(
        config, ("intermediate_size", "ffn_dim", "n_inner"), MAX_INTERMEDIATE
    )
    embedding = facts["embedding_shape"] or []
    vocab = _config_int(config, ("vocab_size",), MAX_VOCAB) or (
        embedding[0] if len(embedding) == 2 else 0
    )
    notes = [
        f"model_type {str(config.get('model_type'))[:40]!r} is not one the estimator counts: "
        f"the weights are exact from {where}, the KV cache is read from config.json's "
        "attention fields, activations are modelled as a Llama-style decoder's"
    ]
    if not intermediate:
        intermediate = 4 * hidden
        notes.append("config.json gives no intermediate_size: activations assume 4 x hidden")
    if exact["param_count_override"] is None:
        notes.append("packed weights: the parameter count is the decoder reading's, not exact")
    model_type = str(config.get("model_type") or "unknown")[:40]
    return ModelSpec(
        name=facts["repo_id"],
        family="generic",
        hidden_size=hidden,
        num_layers=shape["num_layers"],
        num_heads=shape["num_heads"],
        num_kv_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"],
        intermediate_size=min(intermediate, MAX_INTERMEDIATE),
        vocab_size=max(1, min(vocab or 32000, MAX_VOCAB)),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        source=source,
        notes=tuple(notes),
        read_as=f"{model_type} (not counted by family): parameters and bytes exact from "
        f"{where}; KV cache from config.json's attention fields",
        tensor_bytes=exact["tensor_bytes"],
        stored_format=exact["stored_format"],
        param_count_override=exact["param_count_override"],
    )


# Keys that say the layers do not all cache 2 x KV heads x head_dim for every token: latent
# attention, SSM or linear-attention layers, windows, chunks, shared or per-layer caches,
# multi-query flags, a nested language model. Set, the KV cache cannot be read from the
# top-level attention fields: refused rather than guessed (the weights alone are not enough
# for a verdict that holds).
KV_SHAPE_KEYS = (
    "kv_lora_rank",
    "index_head_dim",
    "state_size",
    "ssm_state_size",
    "mamba_d_state",
    "linear_num_value_heads",
    "layers_block_type",
    "layer_types",
    "hybrid_override_pattern",
    "attn_layer_period",
    "sliding_window",
    "attention_chunk_size",
    "num_kv_shared_layers",
    "per_layer_config",
    "cross_attention_layers",
    "multi_query",
    "new_decoder_architecture",
    "text_config",
)


def attention_shape(config: Mapping[str, Any]) -> dict[str, int]:
    """hidden_size, num_layers, num_heads, num_kv_heads and head_dim from a config's
    attention fields, or an EstimatorError naming the fields it lacks or the keys that say
    its layers cache otherwise."""
    changing = [k for k in KV_SHAPE_KEYS if config.get(k) not in (None, False, 0, [], {}, "")]
    if changing:
        raise EstimatorError(
            "config_json.model_type",
            f"model_type {str(config.get('model_type'))[:40]!r} is not one the estimator "
            f"counts, and its KV cache cannot be read from its attention fields: it sets "
            f"{', '.join(changing)}, so its layers do not all cache the same per token",
            code="unsupported_architecture",
        )
    found: dict[str, int] = {}
    missing = []
    for spec_field, keys in _ATTENTION_KEYS.items():
        value = _config_int(config, keys, _LIMITS[spec_field])
        if value:
            found[spec_field] = value
        else:
            missing.append(" or ".join(keys[:2]))
    if missing:
        raise EstimatorError(
            "config_json.model_type",
            f"model_type {str(config.get('model_type'))[:40]!r} is not one the estimator "
            f"counts, and its KV cache cannot be read: config.json lacks {', '.join(missing)}",
            code="unsupported_architecture",
        )
    heads = found["num_heads"]
    kv_heads = _config_int(config, ("num_key_value_heads", "n_head_kv", "num_kv_heads"), MAX_HEADS)
    head_dim = _config_int(config, ("head_dim",), MAX_HIDDEN)
    if not head_dim:
        if found["hidden_size"] % heads:
            raise EstimatorError(
                "config_json.head_dim",
                f"hidden size {found['hidden_size']} is not divisible by {heads} heads and "
                "config.json gives no head_dim: the KV cache cannot be read",
                code="unsupported_architecture",
            )
        head_dim = found["hidden_size"] // heads
    return {**found, "num_kv_heads": kv_heads or heads, "head_dim": head_dim}


def _config_int(config: Mapping[str, Any], keys: tuple[str, ...], maximum: int) -> int:
    """The first of ``keys`` the config sets to a positive integer (0: none)."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= maximum:
            return value
        if isinstance(value, float) and value.is_integer() and 0 < value <= maximum:
            return int(value)
    return 0
