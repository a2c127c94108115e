"""The architecture readers beyond the truth table: latent KV, SSM state, per-layer windows,
vision towers, the never-a-guess rule and the read_as line."""

import json
from pathlib import Path

import pytest

from estimator import (
    EstimateRequest,
    EstimatorError,
    estimate,
    model_from_config,
    model_from_safetensors_index,
    param_count,
)

CONFIGS = Path(__file__).parent / "fixtures" / "configs"


def _config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def _estimate(config: dict, context: int = 8192, engine: str = "vllm") -> dict:
    request = EstimateRequest.from_mapping(
        {"model": {"config_json": json.dumps(config)}, "context_tokens": context,
         "engine": engine, "tier_mib": 81920}
    )  # fmt: skip
    return estimate(request, suggestions=False).to_dict()


def _term(result: dict, key: str) -> dict | None:
    return next((t for t in result["terms"] if t["key"] == key), None)


def test_latent_attention_caches_the_compressed_latent_not_the_heads() -> None:
    config = _config("deepseek-v2-lite-chat")
    model = model_from_config(config)
    latent = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    assert model.kv_bytes_per_token(2) == latent * config["num_hidden_layers"] * 2
    expanded = 2 * config["num_attention_heads"] * (128 + 64) * config["num_hidden_layers"] * 2
    assert model.kv_bytes_per_token(2) < expanded / 10  # the expanded heads would be 21x more
    assert "latent" in _term(_estimate(config), "kv_cache")["detail"]


def test_compressed_query_adds_exactly_its_two_projections_and_norm() -> None:
    config = _config("deepseek-v2-lite-chat")
    h, heads, layers, rank = 2048, 16, 27, 1536
    qk = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    plain = param_count(model_from_config({**config, "q_lora_rank": None}))  # V2-Lite's own
    compressed = param_count(model_from_config({**config, "q_lora_rank": rank}))
    per_layer = h * rank + rank + rank * heads * qk - h * heads * qk
    assert compressed - plain == layers * per_layer


def test_moe_every_other_layer_is_refused_not_counted_as_every_layer() -> None:
    with pytest.raises(EstimatorError) as refused:
        model_from_config({**_config("deepseek-v2-lite-chat"), "moe_layer_freq": 2})
    assert refused.value.field == "config_json.moe_layer_freq"
    assert refused.value.code == "unsupported_architecture"


def test_ssm_keeps_a_fixed_state_and_no_kv_cache_whatever_the_context() -> None:
    # its time_step_limit holds Infinity, which the JSON reader refuses; it counts for nothing
    config = {
        k: v for k, v in _config("mamba2-codestral-defaults").items() if k != "time_step_limit"
    }
    short, long = _estimate(config, 2048), _estimate(config, 32768)
    assert _term(short, "kv_cache") is None and _term(long, "kv_cache") is None
    assert _term(short, "ssm_state")["mib"] == _term(long, "ssm_state")["mib"] > 0
    assert short["kv_bytes_per_token"] == 0


def test_hybrid_caches_keys_and_values_on_its_attention_layers_only() -> None:
    config = _config("jamba-v0-1")
    model = model_from_config(config)
    attention = sum(
        1 for i in range(config["num_hidden_layers"])
        if i % config["attn_layer_period"] == config["attn_layer_offset"]
    )  # fmt: skip
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    assert (
        model.kv_bytes_per_token(2) == attention * 2 * config["num_key_value_heads"] * head_dim * 2
    )
    assert model.state_elements > 0 and model.is_moe


def test_interleaved_windows_cap_the_sliding_layers_only() -> None:
    config = _config("gemma-3-1b-it")
    model = model_from_config(config)
    layers, window = config["num_hidden_layers"], config["sliding_window"]
    global_layers = layers // config["sliding_window_pattern"]
    assert model.kv_token_slots(32768) == global_layers * 32768 + (layers - global_layers) * window


def test_vision_language_counts_the_tower_beside_the_language_model() -> None:
    config = _config("qwen2-5-vl-7b-instruct")
    whole = model_from_config(config)
    text_only = model_from_config(
        {k: v for k, v in config.items() if k != "vision_config"} | {"model_type": "qwen2"}
    )
    assert (
        param_count(whole) - param_count(text_only)
        == whole.breakdown.components.get("vision_tower", 0)
        + whole.breakdown.components.get("projector", 0)
        > 600_000_000
    )
    assert whole.kv_bytes_per_token(2) == text_only.kv_bytes_per_token(2)


def test_a_nested_language_model_beside_an_uncounted_tower_is_refused() -> None:
    llava = {"model_type": "llava", "text_config": _config("llama-2-7b-hf"),
             "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024}}  # fmt: skip
    with pytest.raises(EstimatorError) as refused:
        model_from_config(llava)
    assert refused.value.code == "unsupported_architecture"
    assert "vision_config" in refused.value.message and "safetensors" in refused.value.message


def test_an_unknown_model_type_with_every_llama_field_is_read_as_llama() -> None:
    llama = _config("llama-3.1-8b")
    fork = model_from_config({**llama, "model_type": "my_llama_fork"})
    assert fork.family == "generic" and param_count(fork) == param_count(model_from_config(llama))
    assert "my_llama_fork" in " ".join(fork.notes) and "Llama-style" in fork.read_as


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"n_routed_experts": 64}, "n_routed_experts"),
        ({"kv_lora_rank": 512}, "kv_lora_rank"),
        ({"state_size": 16}, "state_size"),
        ({"parallel_attn": True}, "parallel_attn"),
        ({"mlp_bias": None}, None),
    ],
)
def test_an_unknown_model_type_that_changes_the_layer_shape_is_refused(change, named) -> None:
    config = {**_config("llama-3.1-8b"), "model_type": "my_fork", **change}
    if named is None:
        del config["mlp_bias"]
    with pytest.raises(EstimatorError) as refused:
        model_from_config(config)
    message = refused.value.message
    assert refused.value.code == "unsupported_architecture"
    assert (named or "lacks mlp_bias") in message
    assert "model.safetensors.index.json" in message and "my_fork" in message


def test_every_reading_says_its_family_and_how_it_was_read() -> None:
    deepseek = _estimate(_config("deepseek-v3"))["model"]
    assert deepseek["family"] == "deepseek_v3"
    assert "config.json" in deepseek["read_as"] and "latent attention" in deepseek["read_as"]
    config = _config("mistral-7b-instruct-v0-3")
    tensor = "model.layers.31.mlp.up_proj.weight"
    index = json.dumps({"metadata": {"total_size": 14_496_047_104}, "weight_map": {tensor: "a"}})
    from_index = model_from_safetensors_index(index, config_json=json.dumps(config))
    assert "safetensors.index.json" in from_index.read_as and from_index.family == "mistral"


def test_a_mamba2_config_as_transformers_writes_it_with_infinity_is_read_as_text() -> None:
    from pathlib import Path  # noqa: PLC0415 - only this test reads a fixture file

    from estimator.config_json import model_from_config_json  # noqa: PLC0415 - the text path
    from estimator.errors import EstimatorError  # noqa: PLC0415 - the refusal it names

    text = (Path(__file__).parent / "fixtures/configs/mamba2-codestral-defaults.json").read_text()
    assert "Infinity" in text  # time_step_limit, as transformers' to_json_string writes it
    spec = model_from_config_json(text)
    assert spec.family and spec.hidden_size == 4096
    bad = text.replace('"hidden_size": 4096', '"hidden_size": Infinity')
    assert bad != text
    with pytest.raises(EstimatorError) as refused:
        model_from_config_json(bad)
    assert "hidden_size" in str(refused.value.field)
    with pytest.raises(EstimatorError, match="NaN"):
        model_from_config_json(text.replace('"hidden_size": 4096', '"hidden_size": NaN'))


@pytest.mark.parametrize("period", ["attn_layer_period", "expert_layer_period"])
def test_a_hybrid_period_of_zero_is_refused_naming_it_not_a_crash(period: str) -> None:
    # every layer index modulo 0: with its offset 0 too (an offset past the period is
    # refused before) it used to raise ZeroDivisionError, a 500 from the API
    config = _config("jamba-v0-1") | {period: 0, period.replace("period", "offset"): 0}
    with pytest.raises(EstimatorError) as refused:
        model_from_config(config)
    assert refused.value.code == "min_value"
    assert period in refused.value.field and "at least 1" in str(refused.value)


def test_a_context_past_the_trained_positions_is_noted_for_inference_and_training() -> None:
    config = _config("llama-2-7b-hf")  # its config says 2,048 positions
    model = {"config_json": json.dumps(config)}
    within = estimate(EstimateRequest.from_mapping({"model": model, "context_tokens": 2048}))
    assert not [n for n in within.notes if "positions" in n]
    past = estimate(EstimateRequest.from_mapping({"model": model, "context_tokens": 4096}))
    assert "4,096 tokens exceed the 2,048 positions" in " ".join(past.notes)
    training = estimate(
        EstimateRequest.from_mapping(
            {"model": model, "workload": "training", "seq_len": 3072, "method": "lora"}
        )
    )
    assert "3,072-token sequences exceed the 2,048 positions" in " ".join(training.notes)
