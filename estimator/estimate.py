"""The estimate: ``estimate()`` and its result, ``Estimate``: the terms and their total, the
verdict against the tier, the smallest tier that fits, and the suggestions (JSON-ready).

The terms come from peak.py (with inference.py, training.py and weights.py), the rule of
what fits from verdict.py, the suggestions from suggestions.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import EstimatorError
from .inference import kv_dtype
from .model import param_count
from .peak import compute
from .request import EstimateRequest, request_settings
from .rounding import up_to_tenth
from .suggestions import Suggestion, suggest
from .terms import Core, Term
from .verdict import fits_in_tier, usable_in_tier


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
                "read_as": m.read_as or f"{m.family}, from the estimator's catalog",
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
            "kv_cache_dtype": kv_dtype(r),
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


def estimate(request: EstimateRequest, *, suggestions: bool = True) -> Estimate:
    """Estimate the peak VRAM of ``request``, the verdict against its tier, and (unless
    ``suggestions=False``) the changes that would make it fit, each itself estimated."""
    if not isinstance(request, EstimateRequest):
        raise EstimatorError("request", "expected an EstimateRequest")
    core = compute(request)
    result = _verdict(request, core)
    if suggestions:
        result.suggestions = suggest(request, core, result.fits)
    return result


def _verdict(r: EstimateRequest, core: Core) -> Estimate:
    notes = list(core.notes)
    tier = r.tier_mib
    usable = fits = None
    if tier is not None:
        usable, starts = usable_in_tier(r, tier)
        fits = fits_in_tier(r, core.total_mib, tier)
        if not starts:
            notes.append(
                f"vLLM reserves {r.gpu_memory_utilization:g} x {tier:,} MiB on top of a "
                f"{r.cuda_context_mib:g} MiB CUDA context: more than the tier, "
                "so it refuses to start"
            )
    smallest = next((t for t in sorted(r.tiers_mib) if fits_in_tier(r, core.total_mib, t)), None)
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
