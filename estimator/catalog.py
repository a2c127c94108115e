"""About fifteen popular open models, their architecture copied from each public config.json.

``published_params`` is the count the publisher reports: the Hugging Face Hub's
``safetensors.total`` for the checkpoint (https://huggingface.co/api/models/<id>),
or the paper's figure where that is all there is. ``tests/tenants/test_estimator.py``
checks that the derived count matches it (exactly for the dense Llama, Qwen2
and Mistral families, within 0.5% for all).
"""

from __future__ import annotations

from .errors import EstimatorError
from .model import ModelSpec


def _hub(model_id: str) -> str:
    return f"https://huggingface.co/{model_id}/blob/main/config.json"


def _total(model_id: str) -> str:
    return f"https://huggingface.co/api/models/{model_id} (safetensors.total)"


def _llama(model_id: str, **kw: object) -> ModelSpec:
    return ModelSpec(name=model_id, source=_hub(model_id), published_source=_total(model_id), **kw)  # type: ignore[arg-type]


_MODELS = (
    _llama(
        "meta-llama/Llama-3.1-8B",
        family="llama",
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        published_params=8_030_261_248,
    ),
    _llama(
        "meta-llama/Llama-3.2-1B",
        family="llama",
        hidden_size=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=8192,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        published_params=1_235_814_400,
    ),
    _llama(
        "meta-llama/Llama-3.2-3B",
        family="llama",
        hidden_size=3072,
        num_layers=28,
        num_heads=24,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=8192,
        vocab_size=128256,
        tie_word_embeddings=True,
        max_position_embeddings=131072,
        published_params=3_212_749_824,
    ),
    _llama(
        "meta-llama/Llama-3.1-70B",
        family="llama",
        hidden_size=8192,
        num_layers=80,
        num_heads=64,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        published_params=70_553_706_496,
    ),
    _llama(
        "mistralai/Mistral-7B-v0.1",
        family="mistral",
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32000,
        tie_word_embeddings=False,
        sliding_window=4096,  # every layer
        published_params=7_241_732_096,
    ),
    _llama(
        "mistralai/Mixtral-8x7B-v0.1",
        family="mixtral",
        hidden_size=4096,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32000,
        tie_word_embeddings=False,
        num_experts=8,
        experts_per_token=2,
        max_position_embeddings=32768,
        published_params=46_702_792_704,
    ),
    _llama(
        "Qwen/Qwen2.5-0.5B",
        family="qwen2",
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
        qkv_bias=True,
        max_position_embeddings=32768,
        published_params=494_032_768,
    ),
    _llama(
        "Qwen/Qwen2.5-1.5B",
        family="qwen2",
        hidden_size=1536,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        head_dim=128,
        intermediate_size=8960,
        vocab_size=151936,
        tie_word_embeddings=True,
        qkv_bias=True,
        published_params=1_543_714_304,
    ),
    _llama(
        "Qwen/Qwen2.5-7B",
        family="qwen2",
        hidden_size=3584,
        num_layers=28,
        num_heads=28,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=18944,
        vocab_size=152064,
        tie_word_embeddings=False,
        qkv_bias=True,
        max_position_embeddings=131072,
        published_params=7_615_616_512,
    ),
    _llama(
        "Qwen/Qwen2.5-14B",
        family="qwen2",
        hidden_size=5120,
        num_layers=48,
        num_heads=40,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=13824,
        vocab_size=152064,
        tie_word_embeddings=False,
        qkv_bias=True,
        max_position_embeddings=131072,
        published_params=14_770_033_664,
    ),
    _llama(
        "google/gemma-2-2b",
        family="gemma2",
        hidden_size=2304,
        num_layers=26,
        num_heads=8,
        num_kv_heads=4,
        head_dim=256,
        intermediate_size=9216,
        vocab_size=256000,
        tie_word_embeddings=True,
        norms_per_layer=4,
        sliding_window=4096,
        sliding_layers=tuple(range(0, 26, 2)),  # even layers slide, odd ones are global
        published_params=2_614_341_888,
    ),
    _llama(
        "google/gemma-2-9b",
        family="gemma2",
        hidden_size=3584,
        num_layers=42,
        num_heads=16,
        num_kv_heads=8,
        head_dim=256,
        intermediate_size=14336,
        vocab_size=256000,
        tie_word_embeddings=True,
        norms_per_layer=4,
        sliding_window=4096,
        sliding_layers=tuple(range(0, 42, 2)),
        max_position_embeddings=8192,
        published_params=9_241_705_984,
    ),
    _llama(
        "microsoft/Phi-3-mini-4k-instruct",
        family="phi3",
        hidden_size=3072,
        num_layers=32,
        num_heads=32,
        num_kv_heads=32,
        head_dim=96,
        intermediate_size=8192,
        vocab_size=32064,
        tie_word_embeddings=False,
        sliding_window=2047,  # as its config.json states, every layer
        max_position_embeddings=4096,
        published_params=3_821_079_552,
    ),
    ModelSpec(
        name="openai-community/gpt2",
        family="gpt2",
        hidden_size=768,
        num_layers=12,
        num_heads=12,
        num_kv_heads=12,
        head_dim=64,
        intermediate_size=3072,  # n_inner null: 4 x n_embd
        vocab_size=50257,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
        gated_mlp=False,
        norm="layernorm",
        learned_positions=1024,
        max_position_embeddings=1024,
        source=_hub("openai-community/gpt2"),
        published_params=124_439_808,
        published_source="GPT2LMHeadModel parameter count in transformers (the model card's 124M)",
    ),
    ModelSpec(
        name="google-bert/bert-base-uncased",
        family="bert",
        hidden_size=768,
        num_layers=12,
        num_heads=12,
        num_kv_heads=12,
        head_dim=64,
        intermediate_size=3072,
        vocab_size=30522,
        attention_bias=True,
        mlp_bias=True,
        gated_mlp=False,
        norm="layernorm",
        final_norm=False,
        embedding_norm=True,
        pooler=True,
        encoder_only=True,
        learned_positions=512,
        token_types=2,
        max_position_embeddings=512,
        source=_hub("google-bert/bert-base-uncased"),
        published_params=109_482_240,
        published_source=(
            "BertModel.from_pretrained('bert-base-uncased') parameter count "
            "(the BERT paper, https://arxiv.org/abs/1810.04805, rounds it to 110M)"
        ),
    ),
    ModelSpec(
        name="bigcode/octocoder",
        family="gpt_bigcode",
        hidden_size=6144,
        num_layers=40,
        num_heads=48,
        num_kv_heads=1,  # multi_query: true
        head_dim=128,
        intermediate_size=24576,
        vocab_size=49152,
        tie_word_embeddings=True,
        attention_bias=True,
        mlp_bias=True,
        gated_mlp=False,
        norm="layernorm",
        learned_positions=8192,
        max_position_embeddings=8192,
        source=_hub("bigcode/octocoder"),
        published_params=15_500_000_000,
        published_source=(
            "https://huggingface.co/docs/transformers/llm_tutorial_optimization "
            "(bigcode/starcoder, of which octocoder is a fine-tune: 15.5B)"
        ),
    ),
)

CATALOG: dict[str, ModelSpec] = {model.name: model for model in _MODELS}
_BY_LOWER = {name.lower(): name for name in CATALOG}
_BY_SHORT = {name.split("/", 1)[1].lower(): name for name in CATALOG}


def model_from_catalog(name: str) -> ModelSpec:
    """The catalog model by Hugging Face id (``meta-llama/Llama-3.1-8B``), case-insensitive;
    the part after the slash alone also works."""
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        raise EstimatorError("model.catalog", "expected a model name")
    key = name.strip().lower()
    found = _BY_LOWER.get(key) or _BY_SHORT.get(key)
    if found is None:
        raise EstimatorError(
            "model.catalog",
            f"unknown model {name[:80]!r}; the catalog has {', '.join(sorted(CATALOG))}",
        )
    return CATALOG[found]
