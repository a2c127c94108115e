"""Whether a total fits a tier: what the tier leaves for the job (under vLLM, its reserved
share plus the CUDA context), in whole MiB, and whether the engine starts in it."""

from __future__ import annotations

import math

from .request import EstimateRequest


def usable_in_tier(r: EstimateRequest, tier: int) -> tuple[float, bool]:
    """What the tier leaves for the job, in whole MiB (rounded down: a fraction of a MiB
    is not there), and whether the engine can start in it. Whole MiB keep the verdict and
    the pages' figures in one rule: a total fits when its figure rounded up is at most
    this one (7884.9 needed against 7884.8 usable reads "7885 of 7884": does not fit)."""
    if r.engine != "vllm":
        return float(tier), True
    reserved = r.gpu_memory_utilization * tier
    starts = reserved + r.cuda_context_mib <= tier
    return float(math.floor(min(reserved + r.cuda_context_mib, float(tier)))), starts


def fits_in_tier(r: EstimateRequest, total: float, tier: int) -> bool:
    """Whether ``total`` MiB fits ``tier``: the engine starts, and the total is at most usable."""
    usable, starts = usable_in_tier(r, tier)
    return starts and total <= usable
