"""The estimator's truth table: exact parameter counts and KV bytes per token of real public
model configs, from transformers building each model on the meta device (no weights).

Regenerate the fixture (in a throwaway environment outside the repository; the suite's
venv never gets torch or transformers):

    python3 -m venv /tmp/truthenv
    /tmp/truthenv/bin/pip install torch==2.13.0 transformers accelerate
    /tmp/truthenv/bin/python bench/estimator_truth.py --write

Compare the estimator with the committed fixture (no torch needed; the suite does the same
in tests/estimator/test_truth_table.py):

    .venv/bin/python bench/estimator_truth.py

Inputs: tests/estimator/fixtures/configs/*.json (config.json files as published, their
sources in tests/estimator/fixtures/sources.json). Output: tests/estimator/fixtures/truth.json.
How each figure is derived is in docs/estimator.md ("The truth table").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import estimator  # noqa: E402  (after the path set-up)

FIXTURES = ROOT / "tests" / "estimator" / "fixtures"
CONFIGS = FIXTURES / "configs"
TRUTH = FIXTURES / "truth.json"
KV_BYTES = 2  # bf16 cache, the figure vLLM caches with "auto" for 16-bit weights

# Model types whose transformers model is built with the image-text-to-text Auto class.
VISION_LANGUAGE = {
    "gemma3",
    "qwen2_5_vl",
    "mllama",
    "llama4",
    "qwen3_vl",
    "qwen3_5",
    "qwen3_5_moe",
    "gemma4",
}
# Model types transformers has no class for, built as the architecture their config names
# (Kimi-K2's config.json: "architectures": ["DeepseekV3ForCausalLM"], remote code that is
# DeepSeek-V3's modeling file).
BUILT_AS = {"kimi_k2": "deepseek_v3"}
# Attention over a window on every layer when the config sets one (transformers passes
# config.sliding_window to every layer's attention in these modeling files).
WINDOW_ON_EVERY_LAYER = {"mistral", "mixtral", "phi3", "starcoder2"}


def text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


HYBRIDS = {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "nemotron_h", "granitemoehybrid",
           "falcon_h1"}  # fmt: skip


def _hybrid_layout(c: Any, kind: str, layers: int) -> dict[str, Any]:
    """Layers that cache nothing per token but keep a fixed state per sequence, as vLLM v0.11
    allocates it (vllm/model_executor/layers/mamba/mamba_utils.py): gated DeltaNet's conv
    state ((kernel - 1) x conv_dim) and recurrent state (v heads x k dim x v dim,
    gated_delta_net_state_shape); Mamba-2's conv state and SSM state (heads x head_dim x
    state, mamba2_state_shape). KV on the attention layers."""
    if kind == "falcon_h1":  # attention beside a Mamba-2 mixer on every layer
        full, mamba = layers, layers
        heads, head, groups = c.mamba_n_heads, c.mamba_d_head, c.mamba_n_groups
        state, kernel = c.mamba_d_state, c.mamba_d_conv
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    elif kind in ("nemotron_h", "granitemoehybrid"):
        types = c.layers_block_type if kind == "nemotron_h" else c.layer_types
        mamba = sum(1 for t in types if t == "linear_attention")
        full = sum(1 for t in types if t == "full_attention")
        if kind == "nemotron_h":
            heads, head, groups = c.mamba_num_heads, c.mamba_head_dim, c.n_groups
            state, kernel, head_dim = c.ssm_state_size, c.conv_kernel, c.head_dim
        else:
            heads, head, groups = c.mamba_n_heads, c.mamba_d_head, c.mamba_n_groups
            state, kernel = c.mamba_d_state, c.mamba_d_conv
            head_dim = c.hidden_size // c.num_attention_heads
    else:  # Qwen3-Next, Qwen3.5: gated DeltaNet
        mamba = sum(1 for t in c.layer_types if t == "linear_attention")
        full, head_dim = layers - mamba, c.head_dim
        key = c.linear_num_key_heads * c.linear_key_head_dim
        conv_dim = 2 * key + c.linear_num_value_heads * c.linear_value_head_dim
        per_layer = (c.linear_conv_kernel_dim - 1) * conv_dim + (
            c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim
        )
    if kind not in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
        conv_dim = heads * head + 2 * groups * state
        per_layer = (kernel - 1) * conv_dim + heads * head * state
    return {
        "kv_bytes_per_token": full * 2 * c.num_key_value_heads * head_dim * KV_BYTES,
        "kv_layers": full,
        "kv_heads": c.num_key_value_heads,
        "head_dim": head_dim,
        "state_bytes": mamba * per_layer * KV_BYTES,
    }


def _gemma4_layout(c: Any) -> dict[str, Any]:
    """Gemma-4: each layer's own head_dim and KV heads (per_layer_config). transformers keeps
    no per-layer truth of a shared-KV layer; vLLM v0.11 does: a layer with a
    kv_sharing_target_layer_name allocates no KV cache of its own and reads its target's
    (vllm/v1/worker/utils.py, initialize_kv_cache_for_kv_sharing), so "reuse" layers cache
    nothing. vLLM's Attention writes K and V both, so attention_k_eq_v changes no bytes."""
    modes = c.kv_sharing_modes
    elements, caching, sliding = 0, 0, 0
    for i, kind in enumerate(c.layer_types):
        if modes[i] == "reuse":
            continue
        layer = c.per_layer_config[i]
        elements += 2 * layer.num_key_value_heads * layer.head_dim
        caching += 1
        sliding += kind == "sliding_attention"
    return {
        "kv_bytes_per_token": elements * KV_BYTES,
        "kv_layers": caching,
        "sliding_layers": sliding,
        "sliding_window": c.sliding_window if sliding else None,
    }


def kv_layout(config: Any) -> dict[str, Any]:
    """KV cache per token and fixed state per sequence, as vLLM caches them, from the
    transformers config object (its defaults filled in)."""
    c = text_config(config)
    kind = c.model_type
    layers = c.num_hidden_layers
    out: dict[str, Any] = {"sliding_window": None, "sliding_layers": 0, "state_bytes": 0}
    if kind in ("mamba", "falcon_mamba"):
        per_layer = (c.conv_kernel - 1) * c.intermediate_size + c.intermediate_size * c.state_size
        return {
            **out,
            "kv_bytes_per_token": 0,
            "kv_layers": 0,
            "state_bytes": layers * per_layer * KV_BYTES,
        }
    if kind == "mamba2":
        inner = c.expand * c.hidden_size
        conv_dim = inner + 2 * c.n_groups * c.state_size
        per_layer = (c.conv_kernel - 1) * conv_dim + c.num_heads * c.head_dim * c.state_size
        return {
            **out,
            "kv_bytes_per_token": 0,
            "kv_layers": 0,
            "state_bytes": layers * per_layer * KV_BYTES,
        }
    if kind in HYBRIDS:
        return {**out, **_hybrid_layout(c, kind, layers)}
    if kind == "gemma4_text":
        return {**out, **_gemma4_layout(c)}
    if kind in ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm_moe_dsa"):
        # Multi-head latent attention: vLLM and SGLang cache the compressed latent and the
        # shared rope key, one vector per token and layer, not the expanded heads.
        width = c.kv_lora_rank + c.qk_rope_head_dim
        kv = layers * width * KV_BYTES
        if kind in ("deepseek_v32", "glm_moe_dsa"):
            # The DSA indexer's key cache, which transformers does not keep apart: vLLM v0.11
            # vllm/model_executor/models/deepseek_v2.py DeepseekV32IndexerCache, head_dim =
            # index_head_dim + index_head_dim // 128 * 4 bytes (fp8 keys, an fp32 scale per
            # 128), dtype uint8, on every layer that builds an indexer.
            kinds = getattr(c, "indexer_types", None) or ["full"] * layers
            indexed = sum(1 for k in kinds if k == "full")
            kv += indexed * (c.index_head_dim + c.index_head_dim // 128 * 4)
        return {**out, "kv_bytes_per_token": kv, "kv_layers": layers}
    heads = getattr(c, "num_attention_heads", None) or c.n_head
    hidden = getattr(c, "hidden_size", None) or c.n_embd
    head_dim = getattr(c, "head_dim", None) or hidden // heads
    kv_heads = getattr(c, "num_key_value_heads", None) or heads
    if kind == "falcon":
        kv_heads = c.num_kv_heads if c.new_decoder_architecture else 1 if c.multi_query else heads
    elif kind == "gpt_bigcode":
        kv_heads = 1 if c.multi_query else heads
    attention_layers = layers
    if kind == "jamba":
        attention_layers = sum(1 for t in c.layers_block_type if t == "attention")
        inner = c.mamba_expand * c.hidden_size
        per_layer = (c.mamba_d_conv - 1) * inner + inner * c.mamba_d_state
        out["state_bytes"] = (layers - attention_layers) * per_layer * KV_BYTES
    out["kv_bytes_per_token"] = attention_layers * 2 * kv_heads * head_dim * KV_BYTES
    out["kv_layers"] = attention_layers
    out["kv_heads"] = kv_heads
    out["head_dim"] = head_dim
    window = getattr(c, "sliding_window", None)
    types = getattr(c, "layer_types", None)
    if kind == "llama4_text" and c.attention_chunk_size:
        # Chunked local attention: vLLM's ChunkedLocalAttentionSpec keeps at most one chunk
        # per chunked layer, sized like a sliding window of attention_chunk_size tokens.
        window = c.attention_chunk_size
        out["sliding_layers"] = sum(1 for t in types if t == "chunked_attention")
    elif kind == "smollm3" and not c.use_sliding_window:
        window = None  # SmolLM3Attention sets a window only with use_sliding_window
    elif window and types is not None:
        out["sliding_layers"] = sum(1 for t in types if t == "sliding_attention")
    elif window and kind in WINDOW_ON_EVERY_LAYER:
        out["sliding_layers"] = layers
    if out["sliding_layers"]:
        out["sliding_window"] = window
    return out


def _cross_check(model: Any, layout: dict[str, Any], config: Any) -> None:
    """The KV widths derived from the config must be the widths transformers built."""
    c = text_config(config)
    inner = getattr(model, "model", model)
    language_model = getattr(inner, "language_model", None) or inner
    for module in language_model.modules():
        if hasattr(module, "kv_a_proj_with_mqa"):
            assert module.kv_a_proj_with_mqa.out_features == c.kv_lora_rank + c.qk_rope_head_dim
            return
        k_proj = getattr(module, "k_proj", None)
        if k_proj is not None and hasattr(k_proj, "out_features") and "kv_heads" in layout:
            assert k_proj.out_features == layout["kv_heads"] * layout["head_dim"], type(module)
            return


def build(data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Parameters of the model transformers builds from ``data``, and its KV layout."""
    import torch  # noqa: PLC0415 - only the regenerating run has torch
    import transformers  # noqa: PLC0415 - only the regenerating run has transformers

    kwargs = {k: v for k, v in data.items() if k not in ("auto_map", "model_type")}
    model_type = BUILT_AS.get(data["model_type"], data["model_type"])
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    auto = (
        transformers.AutoModelForImageTextToText
        if config.model_type in VISION_LANGUAGE
        else transformers.AutoModelForCausalLM
    )
    with torch.device("meta"):
        model = auto.from_config(config)
    # parameters() yields a tied weight once: the count of distinct tensors, as loaded.
    params = sum(p.numel() for p in model.parameters())
    layout = kv_layout(config)
    _cross_check(model, layout, config)
    return params, layout


def write() -> list[dict[str, Any]]:
    import transformers  # noqa: PLC0415 - only the regenerating run has transformers

    sources = json.loads((FIXTURES / "sources.json").read_text())
    entries = []
    for path in sorted(CONFIGS.glob("*.json")):
        name = path.stem
        data = json.loads(path.read_text())
        params, layout = build(data)
        layout.pop("kv_heads", None)
        layout.pop("head_dim", None)
        entries.append(
            {"name": name, **sources[name], "model_type": data["model_type"], "params": params}
            | layout
        )
        print(f"{name:36} {data['model_type']:14} {params:>16,}", flush=True)
    fixture = {
        "generated_by": "bench/estimator_truth.py --write",
        "transformers": transformers.__version__,
        "kv_bytes_per_element": KV_BYTES,
        "entries": entries,
    }
    TRUTH.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    return entries


def compare(entry: dict[str, Any]) -> list[str]:
    """Where the estimator differs from one truth entry (empty when exact)."""
    data = json.loads((CONFIGS / f"{entry['name']}.json").read_text())
    try:
        model = estimator.model_from_config(data, name=entry["name"])
    except estimator.EstimatorError as exc:
        return [f"refused: {exc}"]
    got = {
        "params": estimator.param_count(model),
        "kv_bytes_per_token": model.kv_bytes_per_token(KV_BYTES),
        "state_bytes": model.state_bytes_per_sequence(KV_BYTES),
        "sliding_layers": model.sliding_layer_count,
        "sliding_window": model.sliding_window if model.sliding_layer_count else None,
    }
    return [f"{k} {got[k]!r} != {entry[k]!r}" for k in got if got[k] != entry[k]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rebuild the fixture (torch)")
    args = parser.parse_args()
    entries = write() if args.write else json.loads(TRUTH.read_text())["entries"]
    exact = 0
    for entry in entries:
        diffs = compare(entry)
        exact += not diffs
        if diffs:
            print(f"DIFF {entry['name']}: {'; '.join(diffs)}")
    families = sorted({e["model_type"] for e in entries})
    print(f"RESULT truth_entries={len(entries)} configs families={len(families)}")
    ratio = exact / len(entries) if entries else 0.0
    print(f"RESULT estimator_exact={exact} entries baseline={len(entries)} ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
