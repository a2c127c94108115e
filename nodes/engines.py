"""Engines that size themselves from the device's total memory, told the slice instead:
the flag each takes, computed from the slice's budget and what CUDA reports as the
device's total on the node it landed on (docs/templates.md). Pure Python: no Django.

vLLM's `--gpu-memory-utilization` and SGLang's `--mem-fraction-static` are fractions of
the total memory CUDA reports. On a card without a quota library that answers with the
slice's size, that is the whole card: vLLM at its default 0.9 on an 8 GB slice of a 24 GB
card would take about 21.6 GB. The platform appends the flag at container start, after the
tenant's own arguments (both engines take the last one given), so the budget holds whatever
the command says."""

from __future__ import annotations

# engine -> the flag that takes a fraction of the device's reported total memory
FRACTION_FLAGS = {
    "vllm": "--gpu-memory-utilization",
    "sglang": "--mem-fraction-static",
}
ENGINES = ("", "vllm", "sglang", "ollama", "pytorch")


def reported_total_mb(*, vram_mb: int, device_mb: int, quota_library: bool, mig: bool) -> int:
    """What `cudaMemGetInfo` answers as total in the container: the MIG device's memory, the
    slice's quota where the node's library intercepts the call (it answers with the limit,
    as HAMi-core does), else the whole card."""
    if mig:
        return device_mb
    return min(vram_mb, device_mb) if quota_library else device_mb


def fraction(budget_mb: int, total_mb: int) -> str:
    """budget/total rounded down to hundredths (never over the budget), 0.01 at least."""
    if total_mb <= 0:
        raise ValueError(f"the device's total must be positive, not {total_mb}")
    hundredths = max(1, min(100, budget_mb * 100 // total_mb))
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def engine_flags(engine: str, *, budget_mb: int, total_mb: int) -> list[str]:
    """The arguments that hold `engine` to `budget_mb` of a device reporting `total_mb`
    ([] for an engine that sizes itself from free memory or a program told by variable)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; one of {', '.join(e for e in ENGINES if e)}")
    flag = FRACTION_FLAGS.get(engine)
    if flag is None or budget_mb <= 0:
        return []
    return [flag, fraction(budget_mb, total_mb)]


def explain(engine: str, *, budget_mb: int, total_mb: int) -> str:
    """One line on what the flag means, for the pages."""
    flags = engine_flags(engine, budget_mb=budget_mb, total_mb=total_mb)
    if not flags:
        return ""
    value = float(flags[1])
    return (
        f"{flags[0]} {flags[1]}: {value * total_mb:,.0f} MiB of the {total_mb:,} MiB the "
        f"device reports, inside the slice's budget of {budget_mb:,} MiB"
    )
