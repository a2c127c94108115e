"""``Term``, one part of the peak, and the two terms every estimate ends with: the CUDA
context and the allocator margin.

Every term says where its number comes from:

- ``exact``: bytes read from the checkpoint (a safetensors header or index);
- ``derived``: arithmetic on the architecture (weights from the parameter
  count, the KV cache from layers x KV heads x head_dim);
- ``modelled``: a model of memory that depends on kernels and allocators
  (activations, logits, CUDA graphs, the CUDA context, fragmentation).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .model import ModelSpec
from .request import EstimateRequest

MIB = 1 << 20


@dataclass(frozen=True)
class Term:
    """One part of the peak: ``basis`` is exact, derived or modelled."""

    key: str
    label: str
    mib: float
    basis: str
    detail: str = ""


@dataclass(frozen=True)
class Part:
    """A term, with the bytes of it the caching allocator churns through: the allocator
    margin applies to those (activations, logits, a growing cache), not to what is allocated
    once (weights, optimizer states, vLLM's preallocated cache)."""

    term: Term
    churn: float = 0.0


@dataclass
class Core:
    """The terms of one request and their total, before the verdict."""

    terms: list[Term]
    total_mib: float
    weights_bytes: int
    kv_bytes_per_token: float
    notes: list[str]


def finish(
    r: EstimateRequest,
    terms: list[Term],
    notes: list[str],
    dynamic: float,
    w_bytes: int,
    kv_per_token: float,
) -> Core:
    """Add the CUDA context and the allocator margin (on the ``dynamic`` bytes), and sum."""
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
    return Core(terms, total, w_bytes, kv_per_token, notes)


def finish_parts(
    r: EstimateRequest,
    terms: list[Term],
    parts: Iterable[Part | None],
    notes: list[str],
    w_bytes: int,
    kv_per_token: float,
) -> Core:
    """The parts the request has (None: a term it does not have) added to ``terms`` in order,
    then ``finish`` on the bytes they churn."""
    dynamic = 0.0
    for part in parts:
        if part is not None:
            terms.append(part.term)
            dynamic += part.churn  # in order, one at a time: the same float sum every run
    return finish(r, terms, notes, dynamic, w_bytes, kv_per_token)


def note_past_positions(m: ModelSpec, tokens: int, what: str, notes: list[str]) -> None:
    """A note when `tokens` (`what` says of which) run past the positions the model was
    trained on, unless it learned its positions."""
    positions = m.max_position_embeddings
    if positions is not None and tokens > positions and not m.learned_positions:
        notes.append(f"{what} exceed the {positions:,} positions {m.name} was trained on")
