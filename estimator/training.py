"""Training terms: the weights (trained, or frozen under LoRA adapters), gradients, fp32 master
weights, optimizer states, activations (with or without checkpointing), logits and the loss."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import EstimatorError
from .inference import mlp_width
from .model import ModelSpec, param_count
from .request import ALL_LINEAR, LORA_MODULES, EstimateRequest
from .terms import MIB, Core, Part, Term, finish_parts, note_past_positions
from .weights import dequant_part, weights_label, weights_term

# Bytes per trainable parameter of each optimizer's state, and what they hold.
OPTIMIZER_STATES = {
    "adamw": (8, "two fp32 moments"),
    "adamw_bf16": (4, "two bf16 moments"),
    "adam8bit": (2, "two 8-bit moments (block statistics ignored, <2%)"),
    "sgd_momentum": (4, "one fp32 momentum"),
}


@dataclass(frozen=True)
class Trained:
    """What a step updates: every weight (full), or LoRA adapters on ``targets``."""

    params: int
    bytes_each: int  # of a trained weight and of its gradient
    weights_label: str
    targets: frozenset[str] | None  # None: full training


@dataclass(frozen=True)
class Activations:
    """What the forward pass keeps for backward: layer activations and unfused scores."""

    kept: int
    scores: int
    detail: str


def training_terms(
    r: EstimateRequest,
    m: ModelSpec,
    terms: list[Term],
    notes: list[str],
    act: int,
    w_bytes: int,
    kv_per_token: float,
) -> Core:
    """Every term of a training request (full, LoRA, QLoRA), from what peak.compute read, in
    the order the estimate lists them."""
    note_past_positions(m, r.train_seq_len, f"{r.train_seq_len:,}-token sequences", notes)
    trained = _trained(r, m)
    kept = _activation_figures(r, m, act, trained)
    parts = (
        Part(weights_term(r, trained.weights_label)),
        _lora_adapters(r, trained),
        dequant_part(r, m, act, ""),
        _gradients(trained),
        _master_weights(r, trained),
        _optimizer_states(r, trained),
        _activations(kept),
        _attention_scores(r, m, kept),
        _logits(r, m, act),
    )
    return finish_parts(r, terms, parts, notes, w_bytes, kv_per_token)


def _trained(r: EstimateRequest, m: ModelSpec) -> Trained:
    if r.method == "full":
        return Trained(
            params=param_count(m),
            bytes_each=4 if r.weights_dtype == "fp32" else 2,
            weights_label=f"Weights ({weights_label(r)}, trained)",
            targets=None,
        )
    targets = set(r.lora_targets)
    if ALL_LINEAR in targets:
        targets = set(LORA_MODULES)
    params = sum(
        r.lora_rank * (n_in + n_out) * count
        for name, n_in, n_out, count in m.breakdown.linears
        if name.rsplit(".", 1)[-1] in targets
    )
    if not params:
        raise EstimatorError("lora_targets", f"none of these modules exist in {m.name}")
    return Trained(
        params=params,
        bytes_each=4,  # PEFT keeps adapter weights in fp32
        weights_label=f"Base weights ({weights_label(r)}, frozen)",
        targets=frozenset(targets),
    )


def _lora_adapters(r: EstimateRequest, trained: Trained) -> Part | None:
    if trained.targets is None:
        return None
    return Part(
        Term(
            "lora_adapters",
            "LoRA adapters (fp32)",
            trained.params * 4 / MIB,
            "derived",
            f"{trained.params:,} trainable: rank {r.lora_rank} x (in + out) "
            f"on {', '.join(sorted(trained.targets))}",
        )
    )


def _gradients(trained: Trained) -> Part:
    grads = trained.params * trained.bytes_each
    detail = f"{trained.params:,} x {trained.bytes_each} B"
    return Part(Term("gradients", "Gradients", grads / MIB, "derived", detail), churn=grads)


def _master_weights(r: EstimateRequest, trained: Trained) -> Part | None:
    """Mixed precision keeps an fp32 copy of 16-bit trained weights (not under pure bf16)."""
    if trained.bytes_each != 2 or r.optimizer == "adamw_bf16":
        return None
    return Part(
        Term(
            "master_weights",
            "fp32 master weights",
            trained.params * 4 / MIB,
            "derived",
            f"{trained.params:,} x 4 B (mixed precision)",
        )
    )


def _optimizer_states(r: EstimateRequest, trained: Trained) -> Part:
    state_bytes, state_detail = OPTIMIZER_STATES[r.optimizer]
    return Part(
        Term(
            "optimizer_states",
            f"Optimizer states ({r.optimizer})",
            trained.params * state_bytes / MIB,
            "derived",
            f"{trained.params:,} x {state_bytes} B: {state_detail}",
        )
    )


def _activation_figures(
    r: EstimateRequest, m: ModelSpec, act: int, trained: Trained
) -> Activations:
    """Every layer's activations kept for backward, or with checkpointing only each layer's
    input and one layer recomputed; the same for unfused attention scores."""
    seq, micro = r.train_seq_len, r.train_micro_batch
    h = m.hidden_size
    tokens = seq * micro
    per_layer = tokens * act * (4 * h + 2 * m.q_dim + 2 * m.kv_dim + mlp_width(m, training=True))
    if trained.targets is not None:
        adapters_per_layer = sum(
            1 for name, *_ in m.breakdown.linears[:7] if name in trained.targets
        )
        per_layer += tokens * act * r.lora_rank * adapters_per_layer
    scores_per_layer = 0 if r.fused_attention else micro * m.num_heads * seq * seq * (act + 4)
    ends = 2 * tokens * h * act  # embedding output, final norm input
    if r.gradient_checkpointing:
        return Activations(
            kept=m.num_layers * tokens * h * act + per_layer + ends,
            scores=scores_per_layer,
            detail=f"{m.num_layers} checkpointed layer inputs + one layer recomputed, "
            f"{micro} x {seq:,} tokens",
        )
    return Activations(
        kept=m.num_layers * per_layer + ends,
        scores=m.num_layers * scores_per_layer,
        detail=f"{m.num_layers} layers x {micro} x {seq:,} tokens, all kept for backward",
    )


def _activations(kept: Activations) -> Part:
    term = Term("activations", "Activations", kept.kept / MIB, "modelled", kept.detail)
    # The scores churn as the activations do; counted here, once, as one sum.
    return Part(term, churn=kept.kept + kept.scores)


def _attention_scores(r: EstimateRequest, m: ModelSpec, kept: Activations) -> Part | None:
    if not kept.scores:
        return None
    seq, micro = r.train_seq_len, r.train_micro_batch
    return Part(
        Term(
            "attention_scores",
            "Attention scores (unfused)",
            kept.scores / MIB,
            "modelled",
            f"{micro} x {m.num_heads} heads x {seq:,}^2, 16-bit + fp32 softmax, kept for backward",
        )
    )


def _logits(r: EstimateRequest, m: ModelSpec, act: int) -> Part | None:
    if m.encoder_only:
        return None
    seq, micro = r.train_seq_len, r.train_micro_batch
    logits = seq * micro * m.vocab_size * (act + 8)
    term = Term(
        "logits",
        "Logits and loss",
        logits / MIB,
        "modelled",
        f"{micro} x {seq:,} x {m.vocab_size:,}: logits, fp32 upcast and its gradient",
    )
    return Part(term, churn=logits)
