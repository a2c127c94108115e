"""Test support for the watchdog: a running slice as provisioning leaves it, without a
node to talk to (the per-batch rules only read what ingest stored)."""

from django.utils import timezone

from nodes import services as node_services
from nodes.models import Allocation, Node
from tenants.models import Image, Purchase, Slice, Tier

CID = "c" * 64


def running_slice(owner, gpu, cid: str = CID, quota_gb: int = 8) -> Slice:
    tier = Tier.objects.get(vram_mb=quota_gb * 1024)
    purchase = Purchase.objects.create(
        tenant=owner.tenant, tier=tier, hours=1, price_paid=0, minutes_total=60, minutes_left=60
    )
    image = Image.objects.get_or_create(name="img", defaults={"reference": "x/y:1"})[0]
    allocation = node_services.allocation_reserve(owner_key="slice-pending", vram_mb=tier.vram_mb)
    s = Slice.objects.create(
        tenant=owner.tenant,
        purchase=purchase,
        image="x/y:1",
        image_entry=image,
        vram_mb=tier.vram_mb,
        state="running",
        allocation=allocation,
        container_id=cid,
        started_at=timezone.now(),
        last_metered_at=timezone.now(),
    )
    Allocation.objects.filter(pk=allocation.pk).update(owner_key=s.owner_key)
    return s


def placeable_node(name: str, address: str) -> Node:
    """A node that passed its gate and is sampled over NVML: slices may be placed on it."""
    return Node.objects.create(
        gate_status="passed",
        name=name,
        address=address,
        status="active",
        host_key="k",
        sample_source="nvml",
    )
