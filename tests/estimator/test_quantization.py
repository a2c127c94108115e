"""Quantized checkpoints at their real size: each quantization_config's stored layout, computed
here by hand for small configs, the MXFP4 and block-fp8 checkpoints against their published
sizes, refusals, and the request's own weights_dtype beside a quantized checkpoint."""

import json
from pathlib import Path

import pytest

from estimator import (
    EstimateRequest,
    EstimatorError,
    ModelSpec,
    estimate,
    model_from_config,
    weights_bytes,
)
from estimator.architectures.counting import Tally

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
H, INTER, LAYERS, VOCAB = 256, 512, 2, 1000
# (in, out) of every linear of one layer of the small Llama below: q, k, v, o, gate, up, down
LLAMA = {
    "q_proj": (H, 256),
    "k_proj": (H, 128),
    "v_proj": (H, 128),
    "o_proj": (256, H),
    "gate_proj": (H, INTER),
    "up_proj": (H, INTER),
    "down_proj": (INTER, H),
}
LINEAR_PARAMS = LAYERS * sum(i * o for i, o in LLAMA.values())


def _config(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def _llama(quant: dict | None) -> dict:
    config = _config("llama-3-2-1b-instruct")
    config.update(
        hidden_size=H, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, vocab_size=VOCAB, tie_word_embeddings=False,
    )  # fmt: skip
    if quant is not None:
        config["quantization_config"] = quant
    return config


def _rest(model: ModelSpec, unconverted: int = 0) -> int:
    """16-bit bytes of everything but the converted linears."""
    return (model.breakdown.total - LINEAR_PARAMS + unconverted) * 2


def _stored(quant: dict) -> tuple[ModelSpec, int]:
    model = model_from_config(_llama(quant))
    assert model.quantization is not None
    return model, weights_bytes(model, model.stored_format)[0]


def _gptq(n_in: int, n_out: int, bits: int, group: int, g_idx: bool) -> int:
    groups = 1 if group == -1 else -(-n_in // group)
    qweight = -(-n_in * bits // 32) * 4 * n_out  # int32 [in * bits / 32, out]
    qzeros = groups * -(-n_out * bits // 32) * 4  # int32 [groups, out * bits / 32]
    scales = groups * n_out * 2  # fp16 [groups, out]
    return qweight + qzeros + scales + (n_in * 4 if g_idx else 0)  # g_idx int32 [in]


@pytest.mark.parametrize(("bits", "group"), [(4, 128), (3, -1), (2, 64), (8, 128)])
def test_gptq_stores_packed_weights_zeros_scales_and_g_idx(bits: int, group: int) -> None:
    quant = {"quant_method": "gptq", "bits": bits, "group_size": group, "desc_act": True,
             "sym": True}  # fmt: skip
    model, stored = _stored(quant)
    expected = LAYERS * sum(_gptq(i, o, bits, group, True) for i, o in LLAMA.values())
    assert stored == expected + _rest(model)
    assert model.stored_format == "gptq"


def test_awq_has_no_g_idx_and_only_four_bits() -> None:
    model, stored = _stored({"quant_method": "awq", "bits": 4, "group_size": 128,
                             "version": "gemm", "zero_point": True})  # fmt: skip
    assert stored == LAYERS * sum(_gptq(i, o, 4, 128, False) for i, o in LLAMA.values()) + _rest(
        model
    )
    with pytest.raises(EstimatorError) as refused:
        model_from_config(_llama({"quant_method": "awq", "bits": 8, "group_size": 128}))
    assert refused.value.code == "unsupported_quantization"
    assert refused.value.field.endswith("quantization_config.bits")


def test_modules_to_not_convert_and_the_gptq_lm_head() -> None:
    quant = {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 128,
        "modules_to_not_convert": ["model.layers.*.mlp.down_proj"],
        "lm_head": True,
    }
    model, stored = _stored(quant)
    down = LAYERS * INTER * H
    converted = {k: v for k, v in LLAMA.items() if k != "down_proj"}
    expected = LAYERS * sum(_gptq(i, o, 4, 128, True) for i, o in converted.values())
    expected += _gptq(H, VOCAB, 4, 128, True)  # lm_head: true quantizes the head too
    assert stored == expected + _rest(model, down) - H * VOCAB * 2


def _nf4(n: int, double: bool) -> int:
    blocks = -(-n // 64)
    absmax = blocks + -(-blocks // 256) * 4 if double else blocks * 4
    return -(-n // 2) + absmax


@pytest.mark.parametrize("double", [False, True])
def test_bitsandbytes_4bit_absmax_with_and_without_double_quantization(double: bool) -> None:
    quant = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
             "bnb_4bit_use_double_quant": double}  # fmt: skip
    model, stored = _stored(quant)
    assert stored == LAYERS * sum(_nf4(i * o, double) for i, o in LLAMA.values()) + _rest(model)
    assert model.stored_format == "nf4"


def test_bitsandbytes_8bit_and_its_skip_modules() -> None:
    model, stored = _stored({"quant_method": "bitsandbytes", "load_in_8bit": True})
    assert stored == LAYERS * sum(i * o + 4 * o for i, o in LLAMA.values()) + _rest(model)
    # a skip list replaces transformers' default (the LM head): the head is quantized too
    model, stored = _stored({"quant_method": "bitsandbytes", "load_in_8bit": True,
                             "llm_int8_skip_modules": ["o_proj"]})  # fmt: skip
    kept = {k: v for k, v in LLAMA.items() if k != "o_proj"}
    expected = LAYERS * sum(i * o + 4 * o for i, o in kept.values()) + H * VOCAB + 4 * VOCAB
    assert stored == expected + _rest(model, LAYERS * 256 * H) - H * VOCAB * 2


def test_fp8_per_tensor_with_static_activation_scales() -> None:
    model, stored = _stored({"quant_method": "fp8", "activation_scheme": "static"})
    assert stored == LAYERS * sum(i * o + 4 + 4 for i, o in LLAMA.values()) + _rest(model)
    model, stored = _stored({"quant_method": "fp8", "activation_scheme": "dynamic"})
    assert stored == LAYERS * sum(i * o + 4 for i, o in LLAMA.values()) + _rest(model)


def test_fp8_blocks_keep_one_fp32_scale_per_block_and_honour_ignored_layers() -> None:
    quant = {"quant_method": "fp8", "activation_scheme": "dynamic",
             "weight_block_size": [128, 128], "ignored_layers": ["gate_proj"]}  # fmt: skip
    model, stored = _stored(quant)
    kept = {k: v for k, v in LLAMA.items() if k != "gate_proj"}
    scales = {k: -(-o // 128) * -(-i // 128) * 4 for k, (i, o) in kept.items()}
    expected = LAYERS * sum(i * o + scales[k] for k, (i, o) in kept.items())
    assert stored == expected + _rest(model, LAYERS * H * INTER)


def test_compressed_tensors_fp8_per_channel() -> None:
    quant = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                  "dynamic": True},
        }},
        "ignore": ["lm_head"],
    }  # fmt: skip
    model, stored = _stored(quant)
    assert stored == LAYERS * sum(i * o + 4 * o for i, o in LLAMA.values()) + _rest(model)
    quant["format"] = "pack-quantized"
    with pytest.raises(EstimatorError) as refused:
        model_from_config(_llama(quant))
    assert refused.value.code == "unsupported_quantization"
    assert refused.value.field.endswith("quantization_config.format")


@pytest.mark.parametrize("method", ["hqq", "exl2", "quanto", None])
def test_a_method_it_cannot_size_is_refused_naming_the_key(method: str | None) -> None:
    with pytest.raises(EstimatorError) as refused:
        model_from_config(_llama({"quant_method": method, "bits": 4}))
    assert refused.value.code == "unsupported_quantization"
    assert refused.value.field == "config_json.quantization_config.quant_method"


def test_a_pattern_naming_one_layer_of_a_quantized_module_is_refused() -> None:
    quant = {"quant_method": "fp8", "modules_to_not_convert": ["model.layers.1.self_attn"]}
    with pytest.raises(EstimatorError) as refused:
        model_from_config(_llama(quant))
    assert refused.value.code == "unsupported_quantization"
    # one layer's router is never converted anyway
    quant = {"quant_method": "fp8", "modules_to_not_convert": ["model.layers.1.mlp.gate"]}
    model_from_config(_llama(quant))


# -- MXFP4 -------------------------------------------------------------------------------


def _gpt_oss_20b() -> ModelSpec:
    """gpt-oss-20b as the gpt-oss reader names its matrices (experts.gate_up_proj fused,
    router), counted by hand from modeling_gpt_oss.py."""
    hidden, inter, layers, experts, vocab = 2880, 2880, 24, 32, 201088
    q, kv = 64 * 64, 8 * 64
    t = Tally()
    t.add("embeddings", vocab * hidden)
    for name, n_in, n_out in (("q_proj", hidden, q), ("k_proj", hidden, kv),
                              ("v_proj", hidden, kv), ("o_proj", q, hidden)):  # fmt: skip
        t.linear("attention", name, n_in, n_out, layers, bias=True)
    t.add("attention", layers * 64)  # sinks
    t.linear("router", "router", hidden, experts, layers, bias=True)
    t.linear("experts", "experts.gate_up_proj", hidden, 2 * inter, experts * layers, bias=True)
    t.linear("experts", "experts.down_proj", inter, hidden, experts * layers, bias=True)
    t.add("norms", (2 * layers + 1) * hidden)
    t.add("lm_head", vocab * hidden)
    return ModelSpec(
        name="gpt-oss-20b", family="mixtral", hidden_size=hidden, num_layers=layers,
        num_heads=64, num_kv_heads=8, head_dim=64, intermediate_size=inter, vocab_size=vocab,
        num_experts=experts, experts_per_token=4, exact=t.breakdown(), stored_format="mxfp4",
        quantization=model_from_config(_moe({"quant_method": "mxfp4"})).quantization,
    )  # fmt: skip


def _moe(quant: dict | None) -> dict:
    config = _config("qwen3-30b-a3b")
    config.update(
        hidden_size=H, moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2,
        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        vocab_size=VOCAB,
    )  # fmt: skip
    if quant is not None:
        config["quantization_config"] = quant
    return config


def test_mxfp4_converts_only_the_experts_at_4_25_bits() -> None:
    quant = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    model = model_from_config(_moe(quant))
    experts = 8 * LAYERS * 3 * H * 128
    stored = weights_bytes(model, "mxfp4")[0]
    # 16 bytes of E2M1 pairs + 1 E8M0 scale byte per 32 weights along the input
    blocks = 8 * LAYERS * (2 * 128 * (H // 32) + H * (128 // 32)) * 17
    assert blocks * 8 / experts == 4.25
    assert stored == blocks + (model.breakdown.total - experts) * 2


def test_gpt_oss_20b_loads_in_about_13_8_gb() -> None:
    model = _gpt_oss_20b()
    assert model.breakdown.total == pytest.approx(20.91e9, rel=0.002)
    request = EstimateRequest.from_mapping({"model": model, "engine": "vllm"})
    assert request.weights_dtype == "mxfp4"
    result = estimate(request, suggestions=False)
    # the published checkpoint's three shards total 13.76 GB (the estimator: the same layout)
    assert result.weights_bytes == pytest.approx(13.76e9, rel=0.005)
    weights = result.term("weights")
    assert weights is not None
    assert weights.label == "Weights (MXFP4)"
    assert "experts: 19.1 B params in MXFP4" in weights.detail
    assert "attention, router, embeddings, norms, biases: 1.8 B params in bf16" in weights.detail


def test_mxfp4_on_a_model_without_experts_is_refused() -> None:
    with pytest.raises(EstimatorError) as refused:
        model_from_config(_llama({"quant_method": "mxfp4"}))
    assert refused.value.code == "unsupported_quantization"


# -- DeepSeek-V3's block fp8 -------------------------------------------------------------


def test_deepseek_v3_block_fp8_comes_out_near_its_published_checkpoint() -> None:
    config = _config("deepseek-v3")
    config["quantization_config"] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    }
    model = model_from_config(config)
    stored = weights_bytes(model, "fp8")[0]
    # The checkpoint also holds the multi-token-prediction layer the estimator leaves out:
    # one MoE decoder layer in fp8, its own embeddings and head (bf16), eh_proj (bf16, 2h -> h).
    h, inter, experts = 7168, 2048, 256
    moe = (experts + 1) * 3 * h * inter + 3 * (h // 128) * (inter // 128) * 4 * (experts + 1)
    attention = h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h
    mtp = moe + attention + 2 * 129280 * h * 2 + 2 * h * h * 2
    assert stored + mtp == pytest.approx(688.6e9, rel=0.002)
    # about one byte a parameter: nowhere near 2 x 671 B
    assert stored < 1.01 * model.breakdown.total


# -- the request's own choice ------------------------------------------------------------


def test_the_request_still_quantizes_a_16_bit_checkpoint() -> None:
    model = model_from_config(_llama(None))
    nf4 = weights_bytes(model, "nf4")[0]
    assert nf4 == LAYERS * sum(_nf4(i * o, False) for i, o in LLAMA.values()) + _rest(model)
    assert weights_bytes(model, "fp8")[0] == LAYERS * sum(
        i * o + 4 for i, o in LLAMA.values()
    ) + _rest(model)
    with pytest.raises(EstimatorError) as refused:
        EstimateRequest(model=model, weights_dtype="mxfp4")
    assert refused.value.field == "weights_dtype"


def test_another_format_on_a_quantized_checkpoint_keeps_the_stored_size() -> None:
    model = _gpt_oss_20b()
    stored = weights_bytes(model, "mxfp4")[0]
    result = estimate(EstimateRequest(model=model, weights_dtype="fp8"), suggestions=False)
    assert result.weights_bytes == stored
    assert any("already smaller than fp8" in note for note in result.notes)
    # a 16-bit dtype dequantizes it
    bf16 = estimate(EstimateRequest(model=model, weights_dtype="bf16"), suggestions=False)
    assert bf16.weights_bytes == 2 * model.breakdown.total
    assert any("estimated as if loaded in bf16" in note for note in bf16.notes)


def test_training_a_mxfp4_checkpoint_defaults_to_dequantized_weights() -> None:
    config = _moe({"quant_method": "mxfp4"})
    request = EstimateRequest.from_mapping(
        {"model": {"config_json": json.dumps(config)}, "workload": "training", "method": "lora"}
    )
    assert request.weights_dtype == "bf16"
    with pytest.raises(EstimatorError):
        EstimateRequest(model=request.model, workload="training", method="lora",
                        weights_dtype="mxfp4")  # fmt: skip
