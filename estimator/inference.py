"""Inference terms: the KV cache (GQA, sliding windows, vLLM's 16-token blocks), one layer's
activations, unfused attention scores, logits and sampling, and vLLM's CUDA graphs."""

from __future__ import annotations

from .model import ModelSpec
from .request import EstimateRequest
from .terms import MIB, Core, Part, Term, finish_parts, note_past_positions
from .weights import dequant_part, weights_label, weights_term

VLLM_BLOCK_TOKENS = 16  # vLLM's default KV block size
VLLM_DEFAULT_BATCHED_TOKENS = 2048  # our default for --max-num-batched-tokens
VLLM_MAX_GRAPH_TOKENS = 512  # vLLM's default largest CUDA-graph capture size
KV_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def kv_dtype(r: EstimateRequest) -> str:
    """The KV cache dtype: as asked; "auto" is 16-bit, or fp32 with fp32 weights."""
    if r.kv_cache_dtype != "auto":
        return r.kv_cache_dtype
    return "fp32" if r.weights_dtype == "fp32" else "bf16"


def _layer_working_set(m: ModelSpec, tokens: int, act: int) -> float:
    """Inference, one layer at a time: the residual stream (plus an fp32 norm upcast) and
    the wider of the attention block (q, k, v, output) and the MLP block."""
    attn = 2 * m.q_dim + 2 * m.kv_dim
    mlp = mlp_width(m, training=False)
    return tokens * (m.hidden_size * (2 * act + 4) + max(attn, mlp) * act)


def mlp_width(m: ModelSpec, *, training: bool) -> int:
    """Intermediate activations per token, in elements; active experts only."""
    per = (4 if training else 3) if m.gated_mlp else 2
    if m.is_moe:
        width = m.experts_per_token * (
            per * m.expert_intermediate + (m.hidden_size if training else 0)
        )
        width += per * m.shared_expert_intermediate_size
        return width
    return per * m.intermediate_size


def inference_terms(
    r: EstimateRequest,
    m: ModelSpec,
    terms: list[Term],
    notes: list[str],
    act: int,
    kv_elem: int,
    w_bytes: int,
    kv_per_token: float,
) -> Core:
    """Every term of an inference request, from what peak.compute read, in the order the
    estimate lists them."""
    note_past_positions(m, r.context_tokens, f"{r.context_tokens:,} tokens", notes)
    parts = (
        Part(weights_term(r, f"Weights ({weights_label(r)})")),
        dequant_part(r, m, act, " during prefill"),
        _kv_cache(r, m, kv_elem, notes),
        _ssm_state(r, m, kv_elem),
        _activations(r, m, act),
        _attention_scores(r, m, act),
        _logits(r, m),
        _cuda_graphs(r, m, act),
    )
    return finish_parts(r, terms, parts, notes, w_bytes, kv_per_token)


def _kv_cache(r: EstimateRequest, m: ModelSpec, kv_elem: int, notes: list[str]) -> Part | None:
    """Batch x the token-layers cached x the cached width: vLLM preallocates it in blocks;
    transformers grows it as the sequence does, so it churns."""
    if not m.kv_layer_count:
        return None
    vllm = r.engine == "vllm"
    block = VLLM_BLOCK_TOKENS if vllm else 1
    slots = m.kv_token_slots(r.context_tokens, block)
    kv = r.batch * m.kv_cache_elements(r.context_tokens, block) * kv_elem
    full = -(-r.context_tokens // block) * block
    index = r.batch * full * m.index_bytes_per_token  # the DSA indexer's keys: every token
    if m.kv_layer_widths is not None:
        widths = sorted({w for w in m.kv_layer_widths if w})
        width = f"{' or '.join(map(str, widths))} elements a layer"
    elif m.kv_width is None:
        width = f"2 x {m.num_kv_heads} KV heads x {m.head_dim}"
    else:
        width = f"a {m.kv_width}-wide latent"  # latent attention caches one vector
    detail = f"{r.batch} x {slots:,} token-layers x {width} x {kv_elem} B"
    if m.sliding_layer_count:
        detail += (
            f"; {m.sliding_layer_count} layers capped at their {m.sliding_window:,}-token window"
        )
    if index:
        detail += (
            f"; plus the sparse-attention indexer's fp8 keys, {m.index_bytes_per_token:,} B a token"
        )
    if vllm:
        detail += f"; {VLLM_BLOCK_TOKENS}-token blocks"
    if r.kv_cache_dtype == "fp8" and not vllm:
        notes.append("an 8-bit KV cache in transformers needs a quantized cache implementation")
    kv += index
    term = Term("kv_cache", f"KV cache ({kv_dtype(r)})", kv / MIB, "derived", detail)
    return Part(term, churn=0.0 if vllm else kv)


def _ssm_state(r: EstimateRequest, m: ModelSpec, kv_elem: int) -> Part | None:
    if not m.state_elements:
        return None
    state = r.batch * m.state_bytes_per_sequence(kv_elem)
    return Part(
        Term(
            "ssm_state",
            "SSM state",
            state / MIB,
            "derived",
            f"{r.batch} x {m.state_elements:,} conv and scan state elements x {kv_elem} B, "
            "fixed per sequence whatever its length",
        )
    )


def _activations(r: EstimateRequest, m: ModelSpec, act: int) -> Part:
    """One layer's working set over the tokens of one forward pass: vLLM's profile run, an
    encoder's whole input, or a prefill chunk."""
    context = r.context_tokens
    if r.engine == "vllm":
        tokens = r.prefill_chunk or VLLM_DEFAULT_BATCHED_TOKENS
        detail = f"profile run of {tokens:,} batched tokens (max_num_batched_tokens)"
    elif m.encoder_only:
        tokens = r.batch * context
        detail = f"{r.batch} x {context:,} tokens in one pass"
    else:
        chunk = min(r.prefill_chunk or context, context)
        tokens = r.batch * chunk
        detail = f"prefill of {r.batch} x {chunk:,} tokens"
    work = _layer_working_set(m, tokens, act)
    return Part(Term("activations", "Activations", work / MIB, "modelled", detail), churn=work)


def _attention_scores(r: EstimateRequest, m: ModelSpec, act: int) -> Part | None:
    """Unfused attention (transformers without flash/SDPA) materializes the score matrix."""
    if r.fused_attention or r.engine == "vllm" or not (m.kv_layer_count or m.encoder_only):
        return None
    context = r.context_tokens
    q_len = context if m.encoder_only else min(r.prefill_chunk or context, context)
    scores = r.batch * m.num_heads * q_len * context * (act + 4)
    term = Term(
        "attention_scores",
        "Attention scores (unfused)",
        scores / MIB,
        "modelled",
        f"{r.batch} x {m.num_heads} heads x {q_len:,} x {context:,}, 16-bit + fp32 softmax",
    )
    return Part(term, churn=scores)


def _logits(r: EstimateRequest, m: ModelSpec) -> Part | None:
    if m.encoder_only:
        return None
    logits = r.batch * m.vocab_size * 4 * 2
    term = Term(
        "logits",
        "Logits and sampling",
        logits / MIB,
        "modelled",
        f"{r.batch} x {m.vocab_size:,} vocabulary, fp32 logits and probabilities",
    )
    return Part(term, churn=logits)


def _cuda_graphs(r: EstimateRequest, m: ModelSpec, act: int) -> Part | None:
    """vLLM captures CUDA graphs unless eager: buffers kept between the layers' pieces."""
    if r.engine != "vllm" or r.enforce_eager:
        return None
    graph_tokens = min(VLLM_MAX_GRAPH_TOKENS, max(8, -(-2 * r.batch // 8) * 8))
    width = 2 * m.hidden_size + 2 * m.q_dim + 2 * m.kv_dim
    graphs = m.num_layers * graph_tokens * width * act
    term = Term(
        "cuda_graphs",
        "CUDA graphs",
        graphs / MIB,
        "modelled",
        f"buffers kept between {m.num_layers} layers' graph pieces, captured up to "
        f"{graph_tokens} tokens",
    )
    return Part(term, churn=graphs)
