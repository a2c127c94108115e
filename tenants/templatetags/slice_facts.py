"""Facts of the slice page said in words.

`{{ quota|mig_instance_line }}`: what a slice's MIG instance gives beside its tier
("MIG instance 1g.10gb: 9,728 MiB (your tier: 8 GB)"), "" off MIG: the watchdog holds a
MIG slice to its instance, so the page says how much that is.

`{{ slice.allocation|library_count_note }}`: why the slice page shows NVML's count of a
running slice's VRAM and not the node's quota library's beside it.

The sampler reports the library's books per container (`Allocation.library_mb`) only
where the node's sampler reads its per-container accounting and only for a container
with GPU processes; a MIG device's slice runs without the library (the device holds the
quota). So a missing count means different things, and the note says which."""

from __future__ import annotations

from django import template

from nodes.devices import VramQuota
from nodes.models import Allocation

register = template.Library()


@register.filter
def mig_instance_line(quota: VramQuota | None) -> str:
    if quota is None or quota.instance is None:
        return ""
    tier = quota.tier_mb
    tier_text = f"{tier // 1024} GB" if tier % 1024 == 0 else f"{tier:,} MiB"
    instance = quota.instance
    return f"MIG instance {instance.profile}: {instance.memory_mb:,} MiB (your tier: {tier_text})"


@register.filter
def library_count_note(allocation: Allocation | None) -> str:
    if allocation is None:
        return ""
    if allocation.mig_device_uuid:
        return "no quota library count: a MIG device holds this slice's quota, not the library"
    capabilities = allocation.gpu.node.capabilities or {}
    if not capabilities.get("vram_quota_library"):
        return "no quota library count: this node has no quota library"
    if not allocation.nvml_mb:
        return (
            "the node's quota library enforces the quota; it has nothing to count yet "
            "(no GPU process in the container)"
        )
    return (
        "the node's quota library enforces the quota; its own count for this container "
        "is not sampled (the node reports no books for it)"
    )
