"""The estimator against the truth table (bench/estimator_truth.py): transformers' exact
parameter counts and vLLM's KV bytes per token for real public configs; no torch here."""

import json
from pathlib import Path

import pytest

from estimator import EstimatorError, model_from_config, param_count
from tests.bench_support import load_bench

FIXTURES = Path(__file__).parent / "fixtures"
TRUTH = json.loads((FIXTURES / "truth.json").read_text())
ENTRIES = TRUTH["entries"]
KV_BYTES = TRUTH["kv_bytes_per_element"]

# The families issue 23 names, as transformers' model_type spells them.
REQUIRED_FAMILIES = {
    "gpt2", "gptj", "gpt_neox", "opt", "bloom", "falcon", "phi", "starcoder2", "olmo",
    "olmo2", "gemma", "gemma3_text", "llama", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "mistral", "mixtral", "deepseek_v2", "deepseek_v3", "mamba", "mamba2", "jamba",
    "gemma3", "qwen2_5_vl", "gemma2", "phi3", "gpt_bigcode",
}  # fmt: skip


def _config(entry: dict) -> dict:
    return json.loads((FIXTURES / "configs" / f"{entry['name']}.json").read_text())


def test_the_table_covers_forty_real_configs_across_the_families() -> None:
    assert len(ENTRIES) >= 40
    assert {e["model_type"] for e in ENTRIES} >= REQUIRED_FAMILIES
    for entry in ENTRIES:
        assert entry["source"] and entry["model"], entry["name"]
        assert _config(entry)["model_type"] == entry["model_type"]
    # every config file is in the table, and the table was built by transformers
    assert {p.stem for p in (FIXTURES / "configs").glob("*.json")} == {e["name"] for e in ENTRIES}
    assert TRUTH["transformers"] and TRUTH["generated_by"].startswith("bench/estimator_truth.py")


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_parameters_are_exact_to_the_unit(entry: dict) -> None:
    assert param_count(model_from_config(_config(entry))) == entry["params"]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_kv_cache_and_state_per_token_are_exact(entry: dict) -> None:
    model = model_from_config(_config(entry))
    assert model.kv_bytes_per_token(KV_BYTES) == entry["kv_bytes_per_token"]
    assert model.state_bytes_per_sequence(KV_BYTES) == entry["state_bytes"]
    assert model.sliding_layer_count == entry["sliding_layers"]
    if entry["sliding_layers"]:
        assert model.sliding_window == entry["sliding_window"]


# The families issue 36 adds, as transformers' model_type spells them (Kimi-K2 is read as
# DeepSeek-V3; Qwen3.5, Qwen3-VL and Llama-4 with their vision towers).
NEW_FAMILIES = {
    "gpt_oss", "llama4", "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_vl", "glm4_moe",
    "minimax_m2", "deepseek_v32", "glm_moe_dsa", "smollm3", "cohere", "cohere2", "olmoe",
    "arcee", "seed_oss", "ernie4_5", "ernie4_5_moe", "exaone4", "internlm3", "nemotron_h",
    "granitemoehybrid", "falcon_h1", "gemma4", "kimi_k2",
}  # fmt: skip


def test_the_table_covers_this_years_families() -> None:
    assert {e["model_type"] for e in ENTRIES} >= NEW_FAMILIES


def _renamed(data: dict) -> dict:
    """The config with every model_type (nested ones too) renamed to one nobody knows."""
    out = {k: _renamed(v) if isinstance(v, dict) else v for k, v in data.items()}
    if "model_type" in out:
        out["model_type"] = f"renamed_{out['model_type']}"
    return out


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_a_renamed_family_is_exact_or_refused_never_silently_wrong(entry: dict) -> None:
    """The generic route reads only what it understands: fed any real config under a
    model_type it does not know, it either counts it exactly or refuses, naming why."""
    try:
        model = model_from_config(_renamed(_config(entry)))
    except EstimatorError as exc:
        assert exc.code == "unsupported_architecture", exc.message
        assert exc.field.startswith("config_json"), exc.field
        return
    assert param_count(model) == entry["params"]
    assert model.kv_bytes_per_token(KV_BYTES) == entry["kv_bytes_per_token"]
    assert model.state_bytes_per_sequence(KV_BYTES) == entry["state_bytes"]
    assert model.sliding_layer_count == entry["sliding_layers"]


def test_the_benchmark_counts_the_families_read_exactly() -> None:
    bench = load_bench("estimate")
    exact, families = bench.families_exact()
    assert families == len({e["model_type"] for e in ENTRIES})
    assert exact == families  # every family of the table is read exactly
