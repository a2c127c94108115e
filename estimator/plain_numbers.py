"""A ModelSpec from plain numbers (layers, hidden size, heads, ... and/or ``params``), the
rest assumed from the family."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import EstimatorError, unknown_field
from .families import ENCODERS, FAMILIES, FAMILY_FLAGS, GPT_LIKE, TIED_BY_DEFAULT
from .model import (
    MAX_EXPERTS,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_INTERMEDIATE,
    MAX_LAYERS,
    MAX_PARAMS,
    MAX_POSITIONS,
    MAX_VOCAB,
    ModelSpec,
)
from .parsing import check_bool, check_choice, read_int

NUMBER_FIELDS = (
    "name",
    "family",
    "params",
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
    "num_experts",
    "experts_per_token",
    "sliding_window",
    "max_position_embeddings",
)


def model_from_numbers(mapping: Mapping[str, Any], *, field: str = "model") -> ModelSpec:
    """A ModelSpec from plain numbers: layers, hidden size, heads, ... and/or ``params``.

    Required: ``num_layers``, ``hidden_size``, ``num_heads``, and either ``params``
    or both ``intermediate_size`` and ``vocab_size``. With ``params`` the weights
    use that exact count; missing shape fields are then assumed (and noted).
    """
    if not isinstance(mapping, Mapping):
        raise EstimatorError(field, "expected an object of numbers")
    for key in mapping:
        if key not in NUMBER_FIELDS:
            raise unknown_field(f"{field}.{str(key)[:60]}")
    family = check_choice(mapping.get("family", "generic"), f"{field}.family", FAMILIES)
    name = mapping.get("name", "custom model")
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        raise EstimatorError(f"{field}.name", "expected a name of 1 to 200 characters")
    params = read_int(mapping, "params", field, default=None, maximum=MAX_PARAMS)
    notes: list[str] = []
    shape = _attention_shape(mapping, field)
    shape.update(_widths(mapping, field, family, params, shape["hidden_size"], notes))
    shape.update(_experts(mapping, field))
    tied = mapping.get("tie_word_embeddings", family in TIED_BY_DEFAULT)
    kwargs: dict[str, Any] = {
        "name": name,
        "family": family,
        **shape,
        "tie_word_embeddings": check_bool(tied, f"{field}.tie_word_embeddings"),
        "sliding_window": read_int(
            mapping, "sliding_window", field, default=None, maximum=MAX_POSITIONS
        ),
        "max_position_embeddings": read_int(
            mapping, "max_position_embeddings", field, default=None, maximum=MAX_POSITIONS
        ),
        "param_count_override": params,
        "notes": tuple(notes),
    }
    kwargs.update(_family_flags(family, kwargs["max_position_embeddings"]))
    try:
        return ModelSpec(**{"read_as": f"{family}, from plain numbers", **kwargs})
    except EstimatorError as exc:
        raise exc.prefixed(field) from exc


def _attention_shape(mapping: Mapping[str, Any], field: str) -> dict[str, int]:
    hidden = read_int(mapping, "hidden_size", field, maximum=MAX_HIDDEN)
    layers = read_int(mapping, "num_layers", field, maximum=MAX_LAYERS)
    heads = read_int(mapping, "num_heads", field, maximum=MAX_HEADS)
    kv_heads = read_int(mapping, "num_kv_heads", field, default=heads, maximum=MAX_HEADS)
    head_dim = read_int(mapping, "head_dim", field, default=None, maximum=MAX_HIDDEN)
    if head_dim is None:
        if hidden % heads:
            raise EstimatorError(
                f"{field}.head_dim",
                f"hidden_size {hidden} is not divisible by {heads} heads; give head_dim",
            )
        head_dim = hidden // heads
    return {
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
    }


def _widths(
    mapping: Mapping[str, Any],
    field: str,
    family: str,
    params: int | None,
    hidden: int,
    notes: list[str],
) -> dict[str, int]:
    """The MLP width and the vocabulary: given, or (with ``params``) assumed and noted."""
    inter = read_int(mapping, "intermediate_size", field, default=None, maximum=MAX_INTERMEDIATE)
    vocab = read_int(mapping, "vocab_size", field, default=None, maximum=MAX_VOCAB)
    if params is None and (inter is None or vocab is None):
        missing = "intermediate_size" if inter is None else "vocab_size"
        raise EstimatorError(
            f"{field}.{missing}", "required unless params is given", code="required"
        )
    if inter is None:
        gpt_like = family in GPT_LIKE or family in ENCODERS
        inter = 4 * hidden if gpt_like else -(-(8 * hidden) // (3 * 256)) * 256
        notes.append(f"intermediate_size not given: assumed {inter}")
    if vocab is None:
        vocab = 32000
        notes.append(
            "vocab_size not given: assumed 32000 (affects logits only; weights use params)"
        )
    return {"intermediate_size": inter, "vocab_size": vocab}


def _experts(mapping: Mapping[str, Any], field: str) -> dict[str, int]:
    experts = read_int(mapping, "num_experts", field, default=0, minimum=0, maximum=MAX_EXPERTS)
    per_token = read_int(
        mapping,
        "experts_per_token",
        field,
        default=2 if experts else 0,
        minimum=0,
        maximum=MAX_EXPERTS,
    )
    return {"num_experts": experts, "experts_per_token": per_token}


def _family_flags(family: str, positions: int | None) -> dict[str, Any]:
    flags = dict(FAMILY_FLAGS.get(family, {}))
    if family in GPT_LIKE:
        flags["learned_positions"] = positions or 1024
    elif family in ENCODERS:
        flags["learned_positions"] = positions or 512
        flags["token_types"] = 2 if family == "bert" else 1
    return flags
