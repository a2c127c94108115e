"""The readers on configs that set flags other than their family's defaults: each case is a
committed fixture config with keys changed or left out, where a reader once returned a
number transformers does not build. The expected figures come from transformers 5.25.0
building each variant on the meta device (bench/estimator_truth.py's ``build``: the
parameters ``model.parameters()`` yields, and ``kv_layout``'s KV bytes per token, fixed
state bytes per sequence, windowed layers and window, at 2 bytes an element)."""

import json
from pathlib import Path
from typing import Any

import pytest

from estimator import model_from_config, param_count

CONFIGS = Path(__file__).parent / "fixtures" / "configs"


def _config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def _without(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k not in keys}


def _text(data: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**data, "text_config": {**data["text_config"], **changes}}


def _vision(data: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**data, "vision_config": {**data["vision_config"], **changes}}


QWEN3_NEXT = "qwen3-next-80b-a3b-instruct-defaults"
LLAMA4 = "llama-4-scout-17b-16e-defaults"
QWEN3_VL = "qwen3-vl-class-defaults"
DSA_INDEXERS = ["full", "shared"] * 30 + ["full"]

# name -> (config, (params, KV bytes a token, state bytes a sequence, windowed layers, window))
CASES: dict[str, tuple[dict[str, Any], tuple[int, int, int, int, int | None]]] = {
    # GptOssConfig's 128-token window on every other layer when the config names neither
    "gpt-oss-no-layer-types-or-window": (
        _without(_config("gpt-oss-20b"), "layer_types", "sliding_window"),
        (20_914_757_184, 49_152, 0, 12, 128),
    ),
    # the config classes' fixed head_dim / num_key_value_heads, not hidden / heads and heads
    "qwen3-next-no-head-dim": (
        _without(_config(QWEN3_NEXT), "head_dim"),
        (79_674_391_296, 24_576, 39_518_208, 0, None),
    ),
    "minimax-m2-no-head-dim": (
        _without(_config("minimax-m2-class-defaults"), "head_dim"),
        (228_689_748_992, 253_952, 0, 0, None),
    ),
    "glm-4-5-no-kv-heads": (
        _without(_config("glm-4-5-defaults"), "num_key_value_heads"),
        (103_481_200_640, 61_824, 0, 0, None),
    ),
    "seed-oss-no-kv-heads-or-head-dim": (
        {
            **_without(_config("seed-oss-class-defaults"), "num_key_value_heads", "head_dim"),
            "num_attention_heads": 64,
        },
        (27_847_168_000, 262_144, 0, 0, None),
    ),
    "qwen3-vl-no-kv-heads-or-head-dim": (
        {
            **_config(QWEN3_VL),
            "text_config": {
                **_without(_config(QWEN3_VL)["text_config"], "num_key_value_heads", "head_dim"),
                "num_attention_heads": 64,
            },
        },
        (13_690_152_176, 524_288, 0, 0, None),
    ),
    # the shared expert's gate is built even where the shared expert has no width
    "qwen3-next-no-shared-expert": (
        {**_config(QWEN3_NEXT), "shared_expert_intermediate_size": 0},
        (79_523_396_352, 24_576, 39_518_208, 0, None),
    ),
    # Llama-4 ties by text_config's flag; its projector is unbiased whatever the flag says
    "llama4-text-tied": (
        _text(_config(LLAMA4), tie_word_embeddings=True),
        (107_190_553_600, 196_608, 0, 36, 8192),
    ),
    "llama4-projector-bias": (
        _vision(_config(LLAMA4), multi_modal_projector_bias=True),
        (108_225_039_360, 196_608, 0, 36, 8192),
    ),
    # modeling_qwen3_5_moe.py puts experts on every layer whatever these keys say
    "qwen3-5-moe-sparse-step": (
        _text(_config("qwen3-5-35b-a3b-defaults"), decoder_sparse_step=2, mlp_only_layers=[0]),
        (35_114_261_360, 20_480, 32_931_840, 0, None),
    ),
    # DeepSeek-V3.2 builds an indexer on every layer; vLLM caches keys on the "full" ones
    "deepseek-v32-shared-indexer": (
        {**_config("deepseek-v3-2-exp-defaults"), "indexer_types": DSA_INDEXERS},
        (671_877_929_216, 74_364, 0, 0, None),
    ),
    # layer_types built by the config classes from sliding_window_pattern / no_rope_layers
    "cohere2-window-pattern": (
        {
            **_without(_config("cohere2-class-defaults"), "layer_types", "sliding_window"),
            "sliding_window_pattern": 2,
        },
        (34_980_831_232, 1_310_720, 0, 20, 4096),
    ),
    "exaone4-no-layer-types": (
        _without(_config("exaone4-class-defaults"), "layer_types", "sliding_window"),
        (9_429_069_824, 524_288, 0, 24, 4096),
    ),
    "smollm3-window-no-layer-types": (
        {
            **_without(_config("smollm3-3b"), "layer_types"),
            "use_sliding_window": True,
            "sliding_window": 4096,
        },
        (3_075_098_624, 73_728, 0, 9, 4096),
    ),
    # NemotronHForCausalLM ties nothing, whatever tie_word_embeddings says
    "nemotron-h-tie-flag": (
        {**_config("nemotron-h-class-defaults"), "tie_word_embeddings": True},
        (1_968_355_712, 4_096, 2_158_592, 0, None),
    ),
    # GraniteMoeHybridConfig: every layer Mamba-2 where the config lists no layer kinds
    "granite-hybrid-no-layer-types": (
        _without(_config("granitemoehybrid-class-defaults"), "layer_types"),
        (38_601_064_448, 0, 135_888_896, 0, None),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_variant_config_is_counted_as_transformers_builds_it(name: str) -> None:
    data, expected = CASES[name]
    model = model_from_config(data, name=name)
    window = model.sliding_window if model.sliding_layer_count else None
    got = (
        param_count(model),
        model.kv_bytes_per_token(2),
        model.state_bytes_per_sequence(2),
        model.sliding_layer_count,
        window,
    )
    assert got == expected
