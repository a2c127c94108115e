"""The estimate: peak VRAM as a sum of terms, the verdict against a tier, and suggestions.

Every term says where its number comes from:

- ``exact``: bytes read from the checkpoint (a safetensors header or index);
- ``derived``: arithmetic on the architecture (weights from the parameter
  count, the KV cache from layers x KV heads x head_dim);
- ``modelled``: a model of memory that depends on kernels and allocators
  (activations, logits, CUDA graphs, the CUDA context, fragmentation).

Peak memory is the *sum* of what is resident at the peak (weights, KV cache,
gradients, optimizer states, the activations of the step, the CUDA context),
not the largest of the stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from .errors import EstimatorError
from .model import ModelSpec, param_count
from .request import ALL_LINEAR, FOUR_BIT_BNB, LORA_MODULES, EstimateRequest, request_settings
from .rounding import up_to_tenth

MIB = 1 << 20
VLLM_BLOCK_TOKENS = 16  # vLLM's default KV block size
VLLM_DEFAULT_BATCHED_TOKENS = 2048  # our default for --max-num-batched-tokens
VLLM_MAX_GRAPH_TOKENS = 512  # vLLM's default largest CUDA-graph capture size
BNB_BLOCK = 64  # bitsandbytes 4-bit blocksize; one fp32 absmax per block
KV_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}

_LABELS = {
    "fp32": "fp32",
    "fp16": "fp16",
    "bf16": "bf16",
    "fp8": "fp8",
    "int8": "int8 (bitsandbytes LLM.int8)",
    "nf4": "nf4 (bitsandbytes 4-bit)",
    "int4": "int4 (bitsandbytes 4-bit)",
    "gptq": "GPTQ 4-bit",
    "awq": "AWQ 4-bit",
}


@dataclass(frozen=True)
class Term:
    """One part of the peak: ``basis`` is exact, derived or modelled."""

    key: str
    label: str
    mib: float
    basis: str
    detail: str = ""


@dataclass(frozen=True)
class Suggestion:
    """A change to the request (field -> value), itself estimated."""

    label: str
    changes: dict[str, Any]
    total_mib: float
    fits: bool | None


@dataclass
class Estimate:
    request: EstimateRequest
    terms: list[Term]
    total_mib: float
    tier_mib: int | None
    usable_mib: float | None
    fits: bool | None
    smallest_fitting_tier_mib: int | None
    suggestions: list[Suggestion] = field(default_factory=list)
    param_count: int = 0
    weights_bytes: int = 0
    kv_bytes_per_token: float = 0.0
    notes: list[str] = field(default_factory=list)

    def term(self, key: str) -> Term | None:
        return next((t for t in self.terms if t.key == key), None)

    def mib(self, key: str) -> float:
        found = self.term(key)
        return found.mib if found else 0.0

    def to_dict(self) -> dict[str, Any]:
        r = self.request
        m = r.model
        return {
            "model": {
                "name": m.name,
                "family": m.family,
                "params": self.param_count,
                "active_params": m.breakdown.active if m.is_moe else self.param_count,
                "breakdown": dict(m.breakdown.components),
                "source": m.source,
                "published_params": m.published_params,
            },
            "request": request_settings(r),
            "workload": r.workload,
            "engine": r.engine,
            "weights_dtype": r.weights_dtype,
            "kv_cache_dtype": _kv_dtype(r),
            "terms": [
                {
                    "key": t.key,
                    "label": t.label,
                    "mib": round(t.mib, 1),
                    "basis": t.basis,
                    "detail": t.detail,
                }
                for t in self.terms
            ],
            "total_mib": up_to_tenth(self.total_mib),  # rounded up: see rounding.py
            "tier_mib": self.tier_mib,
            "usable_mib": None if self.usable_mib is None else round(self.usable_mib, 1),
            "fits": self.fits,
            "smallest_fitting_tier_mib": self.smallest_fitting_tier_mib,
            "suggestions": [
                {
                    "label": s.label,
                    "changes": dict(s.changes),
                    "total_mib": up_to_tenth(s.total_mib),
                    "fits": s.fits,
                }
                for s in self.suggestions
            ],
            "param_count": self.param_count,
            "weights_bytes": self.weights_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "notes": list(self.notes),
        }


# -- weights ---------------------------------------------------------------------


def weights_bytes(model: ModelSpec, dtype: str, group_size: int = 128) -> tuple[int, str]:
    """Bytes of the weights in ``dtype`` and the basis ("exact" or "derived").

    Quantized formats convert only the linear layers of attention and MLP/experts;
    embeddings, the LM head, norms, biases and the router stay 16-bit (what the
    transformers bitsandbytes integration skips by default, and what GPTQ/AWQ
    checkpoints leave unquantized).
    """
    cache: dict[tuple[str, int], tuple[int, str]] = model.__dict__.setdefault("_weights", {})
    key = (dtype, group_size)
    if key not in cache:
        if len(cache) >= 32:  # group sizes come from users: keep the cache bounded
            cache.clear()
        cache[key] = _weights_bytes(model, dtype, group_size)
    return cache[key]


def _weights_bytes(model: ModelSpec, dtype: str, group: int) -> tuple[int, str]:
    if model.tensor_bytes is not None and model.stored_format == dtype:
        return model.tensor_bytes, "exact"
    b = model.breakdown
    linear, other = b.linear_params, b.other_params
    scale = 1.0
    exact_count = model.param_count_override is not None and model.tensor_bytes is not None
    if model.param_count_override is not None and model.param_count_override != b.total:
        exact_linear = max(model.param_count_override - other, 0)
        scale = exact_linear / linear if linear else 0.0
    if dtype in ("fp32", "fp16", "bf16"):
        size = 4 if dtype == "fp32" else 2
        total = param_count(model) * size
        return total, "exact" if exact_count else "derived"
    lin = 0.0
    for _, n_in, n_out, count in b.linears:
        n = n_in * n_out
        if dtype == "fp8":
            per = n + 4  # one fp32 scale per matrix
        elif dtype == "int8":
            per = n + 4 * n_out  # one fp32 scale per output row
        elif dtype in FOUR_BIT_BNB:
            per = -(-n // 2) + -(-n // BNB_BLOCK) * 4
        else:  # gptq / awq: 4-bit weights, fp16 scales and 4-bit zeros per group
            groups = -(-n_in // group)
            per = n // 2 + groups * n_out * 2 + groups * n_out // 2
            if dtype == "gptq":
                per += n_in * 4  # g_idx, int32 per input column
        lin += per * count
    return int(lin * scale + other * 2), "derived"


def _kv_dtype(r: EstimateRequest) -> str:
    if r.kv_cache_dtype != "auto":
        return r.kv_cache_dtype
    return "fp32" if r.weights_dtype == "fp32" else "bf16"


# -- the terms -------------------------------------------------------------------


@dataclass
class _Core:
    terms: list[Term]
    total_mib: float
    weights_bytes: int
    kv_bytes_per_token: float
    notes: list[str]


def _layer_working_set(m: ModelSpec, tokens: int, act: int) -> float:
    """Inference, one layer at a time: the residual stream (plus an fp32 norm upcast) and
    the wider of the attention block (q, k, v, output) and the MLP block."""
    attn = 2 * m.q_dim + 2 * m.kv_dim
    mlp = _mlp_width(m, training=False)
    return tokens * (m.hidden_size * (2 * act + 4) + max(attn, mlp) * act)


def _mlp_width(m: ModelSpec, *, training: bool) -> int:
    """Intermediate activations per token, in elements; active experts only."""
    per = (4 if training else 3) if m.gated_mlp else 2
    if m.is_moe:
        width = m.experts_per_token * (
            per * m.expert_intermediate + (m.hidden_size if training else 0)
        )
        width += per * m.shared_expert_intermediate_size
        return width
    return per * m.intermediate_size


def _largest_linear(m: ModelSpec) -> int:
    return max((i * o for _, i, o, _ in m.breakdown.linears), default=0)


def _compute(r: EstimateRequest) -> _Core:
    m = r.model
    notes = list(m.notes)
    terms: list[Term] = []
    act = 4 if r.weights_dtype == "fp32" else 2
    kv_elem = KV_BYTES[_kv_dtype(r)]
    kv_per_token = m.kv_bytes_per_token(kv_elem)
    w_bytes, w_basis = weights_bytes(m, r.weights_dtype, r.quant_group_size)
    source = "safetensors" if w_basis == "exact" else "architecture"
    dynamic = 0.0  # bytes the caching allocator churns through (fragmentation applies)

    if (
        m.stored_format in ("gptq", "awq", "nf4", "int8", "fp8")
        and r.weights_dtype != m.stored_format
    ):
        notes.append(
            f"the checkpoint is stored as {m.stored_format}; "
            f"estimated as if loaded in {r.weights_dtype}"
        )

    if r.training:
        return _training(r, m, terms, notes, act, w_bytes, w_basis, source, kv_per_token)

    terms.append(
        Term(
            "weights",
            f"Weights ({_LABELS[r.weights_dtype]})",
            w_bytes / MIB,
            w_basis,
            f"{param_count(m):,} parameters, from the {source}",
        )
    )
    if r.weights_dtype in FOUR_BIT_BNB:
        term = _dequant_term(m, act, " during prefill")
        dynamic += term.mib * MIB
        terms.append(term)
    context = r.context_tokens
    positions = m.max_position_embeddings
    if positions is not None and context > positions and not m.learned_positions:
        notes.append(
            f"{context:,} tokens exceed the {positions:,} positions {m.name} was trained on"
        )
    vllm = r.engine == "vllm"
    if not m.encoder_only:
        block = VLLM_BLOCK_TOKENS if vllm else 1
        slots = m.kv_token_slots(context, block)
        kv = r.batch * slots * 2 * m.kv_dim * kv_elem
        detail = (
            f"{r.batch} x {slots:,} token-layers x 2 x {m.num_kv_heads} KV heads x "
            f"{m.head_dim} x {kv_elem} B"
        )
        if m.sliding_layer_count:
            detail += (
                f"; {m.sliding_layer_count} layers capped at their "
                f"{m.sliding_window:,}-token window"
            )
        if vllm:
            detail += f"; {VLLM_BLOCK_TOKENS}-token blocks"
        else:
            dynamic += kv
        terms.append(Term("kv_cache", f"KV cache ({_kv_dtype(r)})", kv / MIB, "derived", detail))
        if r.kv_cache_dtype == "fp8" and not vllm:
            notes.append("an 8-bit KV cache in transformers needs a quantized cache implementation")

    if vllm:
        tokens = r.prefill_chunk or VLLM_DEFAULT_BATCHED_TOKENS
        chunk_detail = f"profile run of {tokens:,} batched tokens (max_num_batched_tokens)"
    elif m.encoder_only:
        tokens = r.batch * context
        chunk_detail = f"{r.batch} x {context:,} tokens in one pass"
    else:
        chunk = min(r.prefill_chunk or context, context)
        tokens = r.batch * chunk
        chunk_detail = f"prefill of {r.batch} x {chunk:,} tokens"
    work = _layer_working_set(m, tokens, act)
    dynamic += work
    terms.append(Term("activations", "Activations", work / MIB, "modelled", chunk_detail))
    if not r.fused_attention and not vllm:
        q_len = context if m.encoder_only else min(r.prefill_chunk or context, context)
        scores = r.batch * m.num_heads * q_len * context * (act + 4)
        dynamic += scores
        terms.append(
            Term(
                "attention_scores",
                "Attention scores (unfused)",
                scores / MIB,
                "modelled",
                f"{r.batch} x {m.num_heads} heads x {q_len:,} x {context:,}, 16-bit + fp32 softmax",
            )
        )
    if not m.encoder_only:
        logits = r.batch * m.vocab_size * 4 * 2
        dynamic += logits
        terms.append(
            Term(
                "logits",
                "Logits and sampling",
                logits / MIB,
                "modelled",
                f"{r.batch} x {m.vocab_size:,} vocabulary, fp32 logits and probabilities",
            )
        )
    if vllm and not r.enforce_eager:
        graph_tokens = min(VLLM_MAX_GRAPH_TOKENS, max(8, -(-2 * r.batch // 8) * 8))
        width = 2 * m.hidden_size + 2 * m.q_dim + 2 * m.kv_dim
        graphs = m.num_layers * graph_tokens * width * act
        dynamic += graphs
        terms.append(
            Term(
                "cuda_graphs",
                "CUDA graphs",
                graphs / MIB,
                "modelled",
                f"buffers kept between {m.num_layers} layers' graph pieces, captured up to "
                f"{graph_tokens} tokens",
            )
        )
    return _finish(r, terms, notes, dynamic, w_bytes, kv_per_token)


def _training(
    r: EstimateRequest,
    m: ModelSpec,
    terms: list[Term],
    notes: list[str],
    act: int,
    w_bytes: int,
    w_basis: str,
    source: str,
    kv_per_token: float,
) -> _Core:
    seq, micro = r.train_seq_len, r.train_micro_batch
    positions = m.max_position_embeddings
    if positions is not None and seq > positions and not m.learned_positions:
        notes.append(
            f"{seq:,}-token sequences exceed the {positions:,} positions {m.name} was trained on"
        )
    dynamic = 0.0
    full = r.method == "full"
    if full:
        trainable = param_count(m)
        train_bytes = 4 if r.weights_dtype == "fp32" else 2
        label = f"Weights ({_LABELS[r.weights_dtype]}, trained)"
    else:
        targets = set(r.lora_targets)
        if ALL_LINEAR in targets:
            targets = set(LORA_MODULES)
        trainable = sum(
            r.lora_rank * (n_in + n_out) * count
            for name, n_in, n_out, count in m.breakdown.linears
            if name.rsplit(".", 1)[-1] in targets
        )
        if not trainable:
            raise EstimatorError("lora_targets", f"none of these modules exist in {m.name}")
        train_bytes = 4  # PEFT keeps adapter weights in fp32
        label = f"Base weights ({_LABELS[r.weights_dtype]}, frozen)"
    terms.append(
        Term(
            "weights",
            label,
            w_bytes / MIB,
            w_basis,
            f"{param_count(m):,} parameters, from the {source}",
        )
    )
    if not full:
        terms.append(
            Term(
                "lora_adapters",
                "LoRA adapters (fp32)",
                trainable * 4 / MIB,
                "derived",
                f"{trainable:,} trainable: rank {r.lora_rank} x (in + out) "
                f"on {', '.join(sorted(targets))}",
            )
        )
    if r.weights_dtype in FOUR_BIT_BNB:
        term = _dequant_term(m, act, "")
        dynamic += term.mib * MIB
        terms.append(term)
    grads = trainable * train_bytes
    dynamic += grads
    terms.append(
        Term("gradients", "Gradients", grads / MIB, "derived", f"{trainable:,} x {train_bytes} B")
    )
    mixed = train_bytes == 2 and r.optimizer != "adamw_bf16"
    if mixed:
        terms.append(
            Term(
                "master_weights",
                "fp32 master weights",
                trainable * 4 / MIB,
                "derived",
                f"{trainable:,} x 4 B (mixed precision)",
            )
        )
    state_bytes = {"adamw": 8, "adamw_bf16": 4, "adam8bit": 2, "sgd_momentum": 4}[r.optimizer]
    state_detail = {
        "adamw": "two fp32 moments",
        "adamw_bf16": "two bf16 moments",
        "adam8bit": "two 8-bit moments (block statistics ignored, <2%)",
        "sgd_momentum": "one fp32 momentum",
    }[r.optimizer]
    terms.append(
        Term(
            "optimizer_states",
            f"Optimizer states ({r.optimizer})",
            trainable * state_bytes / MIB,
            "derived",
            f"{trainable:,} x {state_bytes} B: {state_detail}",
        )
    )

    h = m.hidden_size
    tokens = seq * micro
    per_layer = tokens * act * (4 * h + 2 * m.q_dim + 2 * m.kv_dim + _mlp_width(m, training=True))
    if not full:
        adapters_per_layer = sum(1 for name, *_ in m.breakdown.linears[:7] if name in targets)
        per_layer += tokens * act * r.lora_rank * adapters_per_layer
    scores_per_layer = 0 if r.fused_attention else micro * m.num_heads * seq * seq * (act + 4)
    ends = 2 * tokens * h * act  # embedding output, final norm input
    if r.gradient_checkpointing:
        activations = m.num_layers * tokens * h * act + per_layer + ends
        scores = scores_per_layer
        detail = (
            f"{m.num_layers} checkpointed layer inputs + one layer recomputed, "
            f"{micro} x {seq:,} tokens"
        )
    else:
        activations = m.num_layers * per_layer + ends
        scores = m.num_layers * scores_per_layer
        detail = f"{m.num_layers} layers x {micro} x {seq:,} tokens, all kept for backward"
    dynamic += activations + scores
    terms.append(Term("activations", "Activations", activations / MIB, "modelled", detail))
    if scores:
        terms.append(
            Term(
                "attention_scores",
                "Attention scores (unfused)",
                scores / MIB,
                "modelled",
                f"{micro} x {m.num_heads} heads x {seq:,}^2, 16-bit + fp32 softmax, "
                "kept for backward",
            )
        )
    if not m.encoder_only:
        logits = tokens * m.vocab_size * (act + 8)
        dynamic += logits
        terms.append(
            Term(
                "logits",
                "Logits and loss",
                logits / MIB,
                "modelled",
                f"{micro} x {seq:,} x {m.vocab_size:,}: logits, fp32 upcast and its gradient",
            )
        )
    return _finish(r, terms, notes, dynamic, w_bytes, kv_per_token)


def _finish(
    r: EstimateRequest,
    terms: list[Term],
    notes: list[str],
    dynamic: float,
    w_bytes: int,
    kv_per_token: float,
) -> _Core:
    terms.append(
        Term(
            "cuda_context",
            "CUDA context",
            r.cuda_context_mib,
            "modelled",
            "driver, kernels and cuBLAS workspace; configurable",
        )
    )
    fragmentation = dynamic * r.fragmentation / MIB
    terms.append(
        Term(
            "fragmentation",
            "Allocator margin",
            fragmentation,
            "modelled",
            f"{r.fragmentation:.0%} of the tensors allocated and freed while running",
        )
    )
    total = sum(t.mib for t in terms)
    return _Core(terms, total, w_bytes, kv_per_token, notes)


# -- verdict ----------------------------------------------------------------------


def _usable(r: EstimateRequest, tier: int) -> tuple[float, bool]:
    """What the tier leaves for the job, in whole MiB (rounded down: a fraction of a MiB
    is not there), and whether the engine can start in it. Whole MiB keep the verdict and
    the pages' figures in one rule: a total fits when its figure rounded up is at most
    this one (7884.9 needed against 7884.8 usable reads "7885 of 7884": does not fit)."""
    if r.engine != "vllm":
        return float(tier), True
    reserved = r.gpu_memory_utilization * tier
    starts = reserved + r.cuda_context_mib <= tier
    return float(math.floor(min(reserved + r.cuda_context_mib, float(tier)))), starts


def _fits(r: EstimateRequest, total: float, tier: int) -> bool:
    usable, starts = _usable(r, tier)
    return starts and total <= usable


def estimate(request: EstimateRequest, *, suggestions: bool = True) -> Estimate:
    """Estimate the peak VRAM of ``request``, the verdict against its tier, and (unless
    ``suggestions=False``) the changes that would make it fit, each itself estimated."""
    if not isinstance(request, EstimateRequest):
        raise EstimatorError("request", "expected an EstimateRequest")
    core = _compute(request)
    result = _verdict(request, core)
    if suggestions:
        result.suggestions = _suggest(request, core, result.fits)
    return result


def _verdict(r: EstimateRequest, core: _Core) -> Estimate:
    notes = list(core.notes)
    tier = r.tier_mib
    usable = fits = None
    if tier is not None:
        usable, starts = _usable(r, tier)
        fits = starts and core.total_mib <= usable
        if not starts:
            notes.append(
                f"vLLM reserves {r.gpu_memory_utilization:g} x {tier:,} MiB on top of a "
                f"{r.cuda_context_mib:g} MiB CUDA context: more than the tier, "
                "so it refuses to start"
            )
    smallest = next((t for t in sorted(r.tiers_mib) if _fits(r, core.total_mib, t)), None)
    return Estimate(
        request=r,
        terms=core.terms,
        total_mib=core.total_mib,
        tier_mib=tier,
        usable_mib=usable,
        fits=fits,
        smallest_fitting_tier_mib=smallest,
        param_count=param_count(r.model),
        weights_bytes=core.weights_bytes,
        kv_bytes_per_token=core.kv_bytes_per_token,
        notes=notes,
    )


# -- suggestions ------------------------------------------------------------------


def _try(r: EstimateRequest, changes: dict[str, Any]) -> tuple[EstimateRequest, float] | None:
    try:
        changed = replace(r, **changes)
        return changed, _compute(changed).total_mib
    except EstimatorError:
        return None


def _candidates(r: EstimateRequest) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if r.training:
        if not r.gradient_checkpointing:
            out.append(("Turn on gradient checkpointing", {"gradient_checkpointing": True}))
        if r.method == "full":
            out.append(("Train LoRA adapters instead of all the weights", {"method": "lora"}))
        if r.method != "qlora":
            out.append(
                ("QLoRA: LoRA adapters on an nf4 base", {"method": "qlora", "weights_dtype": "nf4"})
            )
        if r.optimizer in ("adamw", "adamw_bf16", "sgd_momentum"):
            out.append(("8-bit Adam (bitsandbytes)", {"optimizer": "adam8bit"}))
        if r.optimizer == "adamw" and r.method == "full":
            out.append(("Pure bf16 AdamW, no fp32 master weights", {"optimizer": "adamw_bf16"}))
        if r.train_micro_batch > 1:
            out.append(("Micro-batch 1", {"micro_batch": 1}))
        if not r.fused_attention:
            out.append(("Use fused (flash/SDPA) attention", {"fused_attention": True}))
        return out
    if r.weights_dtype in ("fp32", "fp16", "bf16"):
        out.append(("Load the weights in 8-bit (bitsandbytes)", {"weights_dtype": "int8"}))
    if r.weights_dtype in ("fp32", "fp16", "bf16", "int8", "fp8"):
        out.append(("Load the weights in nf4 (bitsandbytes 4-bit)", {"weights_dtype": "nf4"}))
    if _kv_dtype(r) != "fp8" and not r.model.encoder_only:
        out.append(("Store the KV cache in fp8", {"kv_cache_dtype": "fp8"}))
    if r.batch > 1:
        out.append(("Serve one request at a time (batch 1)", {"batch": 1}))
    if not r.fused_attention and r.engine == "transformers":
        out.append(("Use fused (flash/SDPA) attention", {"fused_attention": True}))
    chunk = r.prefill_chunk or (
        VLLM_DEFAULT_BATCHED_TOKENS if r.engine == "vllm" else r.context_tokens
    )
    if chunk > 512 and not r.model.encoder_only:
        out.append(("Prefill in chunks of 512 tokens", {"prefill_chunk": 512}))
    if r.engine == "vllm" and not r.enforce_eager:
        out.append(("Run vLLM in eager mode (no CUDA graphs)", {"enforce_eager": True}))
    return out


def _largest_fitting(
    r: EstimateRequest, name: str, upper: int, upper_total: float, step: int, tier: int
) -> int | None:
    """Largest multiple of ``step`` below ``upper`` (which does not fit) for field ``name``
    that fits the tier.

    Totals grow with lengths and batches, nearly linearly, so a few secant guesses land
    next to the answer and bisection finishes; at most 40 estimates either way.
    """
    usable, starts = _usable(r, tier)
    if not starts or upper <= step:
        return None
    tried = _try(r, {name: step})
    if tried is None or tried[1] > usable:
        return None
    x_lo, t_lo = step, tried[1]
    x_hi, t_hi = upper, upper_total
    for attempt in range(40):
        top = (x_hi - 1) // step * step  # largest multiple of step below x_hi
        if top <= x_lo:
            break
        if attempt < 3 and t_hi > t_lo:
            guess = x_lo + (usable - t_lo) * (x_hi - x_lo) / (t_hi - t_lo)
        else:
            guess = (x_lo + x_hi) / 2
        candidate = min(max(int(guess) // step * step, x_lo + step), top)
        tried = _try(r, {name: candidate})
        total = math.inf if tried is None else tried[1]
        if total <= usable:
            x_lo, t_lo = candidate, total
        else:
            x_hi, t_hi = candidate, total
    return x_lo


def _suggest(r: EstimateRequest, core: _Core, fits: bool | None) -> list[Suggestion]:
    if fits:
        return []
    tier = r.tier_mib
    found: list[Suggestion] = []
    singles: list[tuple[float, str, dict[str, Any]]] = []
    for label, changes in _candidates(r):
        tried = _try(r, changes)
        if tried is None or tried[1] > core.total_mib - 0.1:  # saves under 0.1 MiB: noise
            continue
        ok = None if tier is None else _fits(tried[0], tried[1], tier)
        found.append(Suggestion(label, changes, tried[1], ok))
        singles.append((tried[1], label, changes))

    length_field = "seq_len" if r.training else "context_tokens"
    length = r.train_seq_len if r.training else r.context_tokens
    if tier is None:
        if length >= 512:
            half = max(256, length // 2 // 256 * 256)
            tried = _try(r, {length_field: half})
            if tried is not None and tried[1] < core.total_mib:
                found.append(
                    Suggestion(
                        f"Halve the sequence to {half:,} tokens",
                        {length_field: half},
                        tried[1],
                        None,
                    )
                )
    else:
        _tier_specific(r, core, tier, length_field, length, found)
        if not any(s.fits for s in found) and singles:
            combined = _combine(r, tier, singles, length_field)
            if combined is not None:
                found.append(combined)

    found.sort(key=lambda s: (not s.fits, s.total_mib))
    return found[:10]


def _tier_specific(
    r: EstimateRequest,
    core: _Core,
    tier: int,
    length_field: str,
    length: int,
    found: list[Suggestion],
) -> None:
    step = 256 if length > 256 else 1
    best = _largest_fitting(r, length_field, length, core.total_mib, step, tier)
    if best:
        tried = _try(r, {length_field: best})
        if tried is not None:
            noun = "sequences" if r.training else "the context"
            found.append(
                Suggestion(
                    f"Shorten {noun} to {best:,} tokens", {length_field: best}, tried[1], True
                )
            )
    batch_field = "micro_batch" if r.training else "batch"
    batch = r.train_micro_batch if r.training else r.batch
    if batch > 2:
        best = _largest_fitting(r, batch_field, batch, core.total_mib, 1, tier)
        if best and best > 1:
            tried = _try(r, {batch_field: best})
            if tried is not None:
                found.append(
                    Suggestion(
                        f"Batch {best} instead of {batch}", {batch_field: best}, tried[1], True
                    )
                )
    if r.engine == "vllm":
        ceiling = math.floor((tier - r.cuda_context_mib) / tier * 100) / 100
        if 0.05 <= ceiling != r.gpu_memory_utilization:
            changed = replace(r, gpu_memory_utilization=ceiling)
            if _fits(changed, core.total_mib, tier):
                verb = "Lower" if ceiling < r.gpu_memory_utilization else "Raise"
                found.append(
                    Suggestion(
                        f"{verb} gpu_memory_utilization to {ceiling:g} "
                        "(leaves room for the CUDA context)",
                        {"gpu_memory_utilization": ceiling},
                        core.total_mib,
                        True,
                    )
                )


def _combine(
    r: EstimateRequest,
    tier: int,
    singles: list[tuple[float, str, dict[str, Any]]],
    length_field: str,
) -> Suggestion | None:
    """Apply the single changes together, best first, until it fits (or nothing helps)."""
    current, total = r, _compute(r).total_mib
    applied: dict[str, Any] = {}
    labels: list[str] = []
    for _, label, changes in sorted(singles, key=lambda item: item[0]):
        if any(key in applied for key in changes):
            continue
        tried = _try(current, changes)
        if tried is None or tried[1] >= total:
            continue
        current, total = tried
        applied.update(changes)
        labels.append(label if label[1:2].isupper() else label[:1].lower() + label[1:])
        if _fits(current, total, tier):
            break
    if not applied:
        return None
    if not _fits(current, total, tier):
        length = current.train_seq_len if current.training else current.context_tokens
        step = 256 if length > 256 else 1
        best = _largest_fitting(current, length_field, length, total, step, tier)
        if best:
            tried = _try(current, {length_field: best})
            if tried is not None:
                current, total = tried
                applied[length_field] = best
                labels.append(f"{length_field.replace('_', ' ')} {best:,}")
    label = "Together: " + "; ".join(labels)
    return Suggestion(label, applied, total, _fits(current, total, tier))


def _dequant_term(m: ModelSpec, act: float, when: str) -> Term:
    """bitsandbytes 4-bit: one matrix at a time is dequantized to 16-bit for its matmul."""
    return Term(
        "dequant_workspace",
        "Dequantization workspace",
        _largest_linear(m) * act / MIB,
        "modelled",
        f"bitsandbytes dequantizes one 4-bit matrix to 16-bit per matmul{when}",
    )
