"""Training terms: the weights (trained, or frozen under LoRA adapters), gradients, fp32 master
weights, optimizer states, activations (with or without checkpointing), logits and the loss."""

from __future__ import annotations

from .errors import EstimatorError
from .inference import mlp_width
from .model import ModelSpec, param_count
from .request import ALL_LINEAR, FOUR_BIT_BNB, LORA_MODULES, EstimateRequest
from .terms import MIB, Core, Term, finish
from .weights import WEIGHT_LABELS, dequant_term


def training_terms(
    r: EstimateRequest,
    m: ModelSpec,
    terms: list[Term],
    notes: list[str],
    act: int,
    w_bytes: int,
    w_basis: str,
    source: str,
    kv_per_token: float,
) -> Core:
    """Every term of a training request (full, LoRA, QLoRA), from what peak.compute read."""
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
        label = f"Weights ({WEIGHT_LABELS[r.weights_dtype]}, trained)"
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
        label = f"Base weights ({WEIGHT_LABELS[r.weights_dtype]}, frozen)"
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
        term = dequant_term(m, act, "")
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
    per_layer = tokens * act * (4 * h + 2 * m.q_dim + 2 * m.kv_dim + mlp_width(m, training=True))
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
    return finish(r, terms, notes, dynamic, w_bytes, kv_per_token)
