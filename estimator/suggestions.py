"""Suggestions: changes to a request that would make it fit its tier (settings, shorter
sequences, smaller batches, several together), each itself estimated."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from .errors import EstimatorError
from .inference import VLLM_DEFAULT_BATCHED_TOKENS, kv_dtype
from .peak import compute
from .request import EstimateRequest
from .terms import Core
from .verdict import fits_in_tier, usable_in_tier


@dataclass(frozen=True)
class Suggestion:
    """A change to the request (field -> value), itself estimated."""

    label: str
    changes: dict[str, Any]
    total_mib: float
    fits: bool | None


def _try(r: EstimateRequest, changes: dict[str, Any]) -> tuple[EstimateRequest, float] | None:
    try:
        changed = replace(r, **changes)
        return changed, compute(changed).total_mib
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
    out.extend(_weight_formats(r))
    if kv_dtype(r) != "fp8" and not r.model.encoder_only:
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


def _weight_formats(r: EstimateRequest) -> list[tuple[str, dict[str, Any]]]:
    """Smaller weight formats; a quantized checkpoint is not quantized again on load, so for
    one only loading it as stored (where the request dequantizes it)."""
    stored = r.model.quantization
    if stored is not None:
        if r.weights_dtype == stored.fmt:
            return []
        return [(f"Load the checkpoint as stored ({stored.label})", {"weights_dtype": stored.fmt})]
    out: list[tuple[str, dict[str, Any]]] = []
    if r.weights_dtype in ("fp32", "fp16", "bf16"):
        out.append(("Load the weights in 8-bit (bitsandbytes)", {"weights_dtype": "int8"}))
    if r.weights_dtype in ("fp32", "fp16", "bf16", "int8", "fp8"):
        out.append(("Load the weights in nf4 (bitsandbytes 4-bit)", {"weights_dtype": "nf4"}))
    return out


def _largest_fitting(
    r: EstimateRequest, name: str, upper: int, upper_total: float, step: int, tier: int
) -> int | None:
    """Largest multiple of ``step`` below ``upper`` (which does not fit) for field ``name``
    that fits the tier.

    Totals grow with lengths and batches, nearly linearly, so a few secant guesses land
    next to the answer and bisection finishes; at most 40 estimates either way.
    """
    usable, starts = usable_in_tier(r, tier)
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


def suggest(r: EstimateRequest, core: Core, fits: bool | None) -> list[Suggestion]:
    """Up to 10 changes that would make ``r`` fit, those that fit first (none when it fits)."""
    if fits:
        return []
    tier = r.tier_mib
    found: list[Suggestion] = []
    singles: list[tuple[float, str, dict[str, Any]]] = []
    for label, changes in _candidates(r):
        tried = _try(r, changes)
        if tried is None or tried[1] > core.total_mib - 0.1:  # saves under 0.1 MiB: noise
            continue
        ok = None if tier is None else fits_in_tier(tried[0], tried[1], tier)
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
    core: Core,
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
            if fits_in_tier(changed, core.total_mib, tier):
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
    current, total = r, compute(r).total_mib
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
        if fits_in_tier(current, total, tier):
            break
    if not applied:
        return None
    if not fits_in_tier(current, total, tier):
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
    return Suggestion(label, applied, total, fits_in_tier(current, total, tier))
