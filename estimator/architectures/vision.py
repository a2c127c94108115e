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
    if family == "gemma3_vl":
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
    base = text.breakdown
    extra = t.breakdown()
    components = dict(base.components)
    for key, value in extra.components.items():
        components[key] = components.get(key, 0) + value
    combined = ParamBreakdown(
        components=components,
        linears=base.linears + extra.linears,
        linear_params=base.linear_params + extra.linear_params,
        other_params=base.other_params + extra.other_params,
        total=base.total + extra.total,
        active=base.active + extra.total,
    )
    return replace(
        text,
        family=family,
        exact=combined,
        read_as=f"{family}, read from config.json: {text.read_as.split(': ', 1)[-1]}, "
        f"plus the {tower} ({extra.total:,} parameters)",
    )
