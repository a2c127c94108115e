"""Vision-language models: the language model from its config plus the vision tower and
projector, as transformers' modeling_siglip/gemma3.py and modeling_qwen2_5_vl.py build them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from ..errors import EstimatorError
from ..model import MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, ModelSpec, ParamBreakdown
from ..parsing import read_bool, read_int
from .counting import Tally
from .gemma4 import gemma4_vision


def _mapping(data: Mapping[str, Any], key: str, field: str) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise EstimatorError(f"{field}.{key}", "expected a JSON object")
    return value


def _siglip(t: Tally, v: Mapping[str, Any], field: str) -> int:
    """SiglipVisionModel (SiglipVisionConfig's defaults where the config leaves them out)."""
    h = read_int(v, "hidden_size", field, default=768, maximum=MAX_HIDDEN)
    inter = read_int(v, "intermediate_size", field, default=3072, maximum=MAX_INTERMEDIATE)
    layers = read_int(v, "num_hidden_layers", field, default=12, maximum=MAX_LAYERS)
    channels = read_int(v, "num_channels", field, default=3, maximum=64)
    image = read_int(v, "image_size", field, default=224, maximum=MAX_HIDDEN)
    patch = read_int(v, "patch_size", field, default=16, maximum=image)
    t.add("vision_tower", channels * patch * patch * h + h)  # patch_embedding conv, biased
    t.add("vision_tower", (image // patch) ** 2 * h)  # position_embedding
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        t.linear("vision_tower", f"vision.{name}", h, h, layers, bias=True)
    t.linear("vision_tower", "vision.fc1", h, inter, layers, bias=True)
    t.linear("vision_tower", "vision.fc2", inter, h, layers, bias=True)
    t.add("vision_tower", layers * 2 * 2 * h + 2 * h)  # two LayerNorms a layer, post_layernorm
    if read_bool(v, "vision_use_head", field, default=True):
        # attention-pooling head: probe, nn.MultiheadAttention, LayerNorm, MLP
        t.add("vision_tower", h + 3 * h * h + 3 * h + h * h + h + 2 * h)
        t.linear("vision_tower", "vision.head.fc1", h, inter, 1, bias=True)
        t.linear("vision_tower", "vision.head.fc2", inter, h, 1, bias=True)
    return h


def _qwen25_vision(t: Tally, v: Mapping[str, Any], field: str) -> int:
    """Qwen2_5_VisionTransformerPretrainedModel (Qwen2_5_VLVisionConfig's defaults)."""
    h = read_int(v, "hidden_size", field, default=1280, maximum=MAX_HIDDEN)
    inter = read_int(v, "intermediate_size", field, default=3420, maximum=MAX_INTERMEDIATE)
    depth = read_int(v, "depth", field, default=32, maximum=MAX_LAYERS)
    channels = read_int(v, "in_channels", field, default=None, maximum=64)
    channels = channels or read_int(v, "in_chans", field, default=3, maximum=64)
    patch = read_int(v, "patch_size", field, default=14, maximum=MAX_HIDDEN)
    temporal = read_int(v, "temporal_patch_size", field, default=2, maximum=64)
    merge = read_int(v, "spatial_merge_size", field, default=2, maximum=64)
    out = read_int(v, "out_hidden_size", field, default=3584, maximum=MAX_HIDDEN)
    t.add("vision_tower", channels * temporal * patch * patch * h)  # Conv3d, no bias
    t.linear("vision_tower", "vision.qkv", h, 3 * h, depth, bias=True)
    t.linear("vision_tower", "vision.proj", h, h, depth, bias=True)
    t.gated_mlp("vision_tower", h, inter, depth, bias=True)
    t.add("vision_tower", depth * 2 * h)  # norm1, norm2 (RMSNorm)
    merged = h * merge * merge
    t.add("projector", h)  # the merger's ln_q
    t.linear("projector", "merger.fc1", merged, merged, 1, bias=True)
    t.linear("projector", "merger.fc2", merged, out, 1, bias=True)
    return out


def _combined(base: ParamBreakdown, extra: ParamBreakdown) -> ParamBreakdown:
    """The language model's breakdown with the tower's added (every tower weight active)."""
    components = dict(base.components)
    for key, value in extra.components.items():
        components[key] = components.get(key, 0) + value
    return ParamBreakdown(
        components=components,
        linears=base.linears + extra.linears,
        linear_params=base.linear_params + extra.linear_params,
        other_params=base.other_params + extra.other_params,
        total=base.total + extra.total,
        active=base.active + extra.total,
    )


def read_vision_language(
    data: Mapping[str, Any],
    family: str,
    *,
    field: str,
    name: str | None,
    source: str,
    read_text: Callable[..., ModelSpec],
) -> ModelSpec:
    vision = _mapping(data, "vision_config", field)
    t = Tally()
    if family in TOWERED:
        text, t, tower = _towered(
            data,
            family,
            field,
            lambda d, field: read_text(d, field=field, name=name, source=source),
        )
    elif family == "gemma3_vl":
        text_data = {**_mapping(data, "text_config", field), "model_type": "gemma3_text"}
        # Gemma3ForConditionalGeneration ties its head to the text embeddings by default.
        text_data.setdefault("tie_word_embeddings", data.get("tie_word_embeddings", True))
        text = read_text(text_data, field=f"{field}.text_config", name=name, source=source)
        v_hidden = _siglip(t, vision, f"{field}.vision_config")
        # Gemma3MultiModalProjector: one projection matrix and an RMSNorm on the vision side
        t.linear("projector", "mm_input_projection", v_hidden, text.hidden_size, 1, bias=False)
        t.add("projector", v_hidden)
        tower = "SigLIP vision tower"
    else:
        nested = data.get("text_config")
        text_data = dict(nested) if isinstance(nested, Mapping) else {
            k: v for k, v in data.items() if k != "vision_config"
        }  # fmt: skip
        text_data["model_type"] = "qwen2"  # Qwen2.5-VL's language model is Qwen2's decoder
        text = read_text(text_data, field=field, name=name, source=source)
        out = _qwen25_vision(t, vision, f"{field}.vision_config")
        if out != text.hidden_size:
            raise EstimatorError(
                f"{field}.vision_config.out_hidden_size",
                f"{out} is not the language model's hidden_size ({text.hidden_size})",
            )
        tower = "Qwen2.5-VL vision tower and patch merger"
    extra = t.breakdown()
    combined = _combined(text.breakdown, extra)
    return replace(
        text,
        family=family,
        exact=combined,
        read_as=f"{family}, read from config.json: {text.read_as.split(': ', 1)[-1]}, "
        f"plus the {tower} ({extra.total:,} parameters)",
    )


def _qwen3_vision(t: Tally, v: Mapping[str, Any], field: str, *, deepstack: bool) -> int:
    """Qwen3-VL's and Qwen3.5's vision tower (Qwen3VLVisionConfig's defaults): a biased
    Conv3d patch embedding, learned positions, LayerNorm blocks with a plain MLP, the patch
    merger and, in Qwen3-VL, one more merger per deepstack layer."""
    h = read_int(v, "hidden_size", field, default=1152, maximum=MAX_HIDDEN)
    inter = read_int(v, "intermediate_size", field, default=4304, maximum=MAX_INTERMEDIATE)
    depth = read_int(v, "depth", field, default=27, maximum=MAX_LAYERS)
    channels = read_int(v, "in_channels", field, default=3, maximum=64)
    patch = read_int(v, "patch_size", field, default=16, maximum=MAX_HIDDEN)
    temporal = read_int(v, "temporal_patch_size", field, default=2, maximum=64)
    merge = read_int(v, "spatial_merge_size", field, default=2, maximum=64)
    out = read_int(v, "out_hidden_size", field, default=3584, maximum=MAX_HIDDEN)
    positions = read_int(v, "num_position_embeddings", field, default=2304, maximum=MAX_HIDDEN)
    t.add("vision_tower", channels * temporal * patch * patch * h + h + positions * h)
    t.linear("vision_tower", "vision.qkv", h, 3 * h, depth, bias=True)
    t.linear("vision_tower", "vision.proj", h, h, depth, bias=True)
    t.linear("vision_tower", "vision.linear_fc1", h, inter, depth, bias=True)
    t.linear("vision_tower", "vision.linear_fc2", inter, h, depth, bias=True)
    t.add("vision_tower", depth * 2 * 2 * h)  # norm1, norm2 (LayerNorm)
    merged = h * merge * merge
    stacks = 0
    if deepstack:
        indexes = v.get("deepstack_visual_indexes", [8, 16, 24])
        if not isinstance(indexes, list) or len(indexes) > depth:
            raise EstimatorError(f"{field}.deepstack_visual_indexes", "expected a list of layers")
        stacks = len(indexes)
    t.add("projector", 2 * h + stacks * 2 * merged)  # LayerNorms before each merger
    t.linear("projector", "merger.linear_fc1", merged, merged, 1 + stacks, bias=True)
    t.linear("projector", "merger.linear_fc2", merged, out, 1 + stacks, bias=True)
    return out


def _llama4_vision(t: Tally, v: Mapping[str, Any], field: str, text_hidden: int) -> None:
    """Llama4VisionModel and the multimodal projector (Llama4VisionConfig's defaults)."""
    h = read_int(v, "hidden_size", field, default=768, maximum=MAX_HIDDEN)
    inter = read_int(v, "intermediate_size", field, default=5632, maximum=MAX_INTERMEDIATE)
    layers = read_int(v, "num_hidden_layers", field, default=34, maximum=MAX_LAYERS)
    channels = read_int(v, "num_channels", field, default=3, maximum=64)
    image = read_int(v, "image_size", field, default=448, maximum=MAX_HIDDEN)
    patch = read_int(v, "patch_size", field, default=14, maximum=image)
    p_in = read_int(v, "projector_input_dim", field, default=4096, maximum=MAX_HIDDEN)
    p_out = read_int(v, "projector_output_dim", field, default=4096, maximum=MAX_HIDDEN)
    output = read_int(v, "vision_output_dim", field, default=7680, maximum=MAX_HIDDEN)
    t.add("vision_tower", h + ((image // patch) ** 2 + 1) * h)  # class and position embeddings
    t.linear("vision_tower", "vision.patch_embedding", channels * patch * patch, h, 1, bias=False)
    t.add("vision_tower", 2 * 2 * h + layers * 2 * 2 * h)  # LayerNorms pre/post and per layer
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        t.linear("vision_tower", f"vision.{name}", h, h, layers, bias=True)
    t.linear("vision_tower", "vision.fc1", h, inter, layers, bias=True)
    t.linear("vision_tower", "vision.fc2", inter, h, layers, bias=True)
    t.linear("projector", "vision_adapter.fc1", inter, p_in, 1, bias=False)
    t.linear("projector", "vision_adapter.fc2", p_out, p_out, 1, bias=False)
    # Llama4MultiModalProjector is unbiased whatever multi_modal_projector_bias says
    t.linear("projector", "multi_modal_projector", output, text_hidden, 1, bias=False)


# Vision-language families read through their text model: (text model_type, tower label).
TOWERED = {
    "llama4_vl": ("llama4_text", "Llama-4 vision tower and projector"),
    "qwen3_vl": ("qwen3", "Qwen3-VL vision tower, merger and deepstack mergers"),
    "qwen3_5_vl": ("qwen3_5_text", "Qwen3.5 vision tower and merger"),
    "qwen3_5_moe_vl": ("qwen3_5_moe_text", "Qwen3.5 vision tower and merger"),
    "gemma4_vl": ("gemma4_text", "Gemma-4 vision tower and its projection"),
}


# Qwen3VLTextConfig's fixed defaults where they differ from Qwen3's reading (kv heads = heads,
# head_dim = hidden / heads).
TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_vl": {"num_key_value_heads": 32, "head_dim": 128},
}


def _towered(
    data: Mapping[str, Any], family: str, field: str, read: Callable[..., ModelSpec]
) -> tuple[ModelSpec, Tally, str]:
    """The text model from text_config and the tower counted into a Tally."""
    text_type, tower = TOWERED[family]
    if family == "gemma4_vl" and data.get("audio_config"):
        raise EstimatorError(
            f"{field}.audio_config",
            "Gemma-4's audio tower is not counted exactly yet; give the model's Hub id (its "
            "safetensors headers give the exact weights) instead",
            code="unsupported_architecture",
        )
    text_data = {**TEXT_DEFAULTS.get(family, {}), **_mapping(data, "text_config", field)}
    text_data["model_type"] = text_type
    # Qwen3-VL and Qwen3.5 tie by the top-level flag; Llama-4's inner Llama4ForCausalLM by
    # text_config's own.
    if "tie_word_embeddings" in data and family != "llama4_vl":
        text_data["tie_word_embeddings"] = data["tie_word_embeddings"]
    text = read(text_data, field=f"{field}.text_config")
    vision = _mapping(data, "vision_config", field)
    t = Tally()
    if family == "llama4_vl":
        _llama4_vision(t, vision, f"{field}.vision_config", text.hidden_size)
    elif family == "gemma4_vl":
        if vision:  # Gemma-4 E2B/E4B configs may leave the tower out
            gemma4_vision(t, vision, f"{field}.vision_config", text.hidden_size)
    else:
        _qwen3_vision(t, vision, f"{field}.vision_config", deepstack=family == "qwen3_vl")
    return text, t, tower
