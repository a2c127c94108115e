"""A large, realistic GPU fleet for benchmarks and scale tests of the fleet pages and
/metrics: nodes past the preflight gate (a few draining or unreachable), GPUs of the
models a rental fleet runs, a few in MIG mode, each with a latest reading on its row and
VRAM reserved by slices. Bulk inserts: 1,000 nodes of 8 GPUs take about a second.

Deterministic for a given prefix, so two runs seed the same fleet."""

from __future__ import annotations

import random
import zlib
from datetime import timedelta

from django.utils import timezone

from nodes.models import Gpu, Node

# (model as nvidia-smi names it, total MiB it reports, MIG capable): the mix of a fleet.
MODELS = [
    ("NVIDIA H100 80GB HBM3", 81559, True),
    ("NVIDIA A100-SXM4-80GB", 81920, True),
    ("NVIDIA A100-SXM4-40GB", 40960, True),
    ("NVIDIA L40S", 46068, False),
    ("NVIDIA GeForce RTX 4090", 24564, False),
]
# One A100 40GB in MIG mode, split as 3g.20gb + 2g.10gb + 1g.5gb x 2.
MIG_LAYOUT = [
    {"profile": "3g.20gb", "memory_total_mb": 19968},
    {"profile": "2g.10gb", "memory_total_mb": 9856},
    {"profile": "1g.5gb", "memory_total_mb": 4864},
    {"profile": "1g.5gb", "memory_total_mb": 4864},
]
BATCH = 2000


def seed_fleet(*, nodes: int, gpus_per_node: int = 8, prefix: str = "scale") -> list[int]:
    """Create `nodes` nodes of `gpus_per_node` GPUs each; returns the nodes' ids."""
    rng = random.Random(prefix)
    now = timezone.now()
    # Each prefix its own SSH port, so that fleets of two prefixes sit side by side.
    port = 1024 + zlib.crc32(prefix.encode()) % 60000
    # Nodes take one model each (a machine is built of one kind of card).
    rows = []
    for k in range(nodes):
        status, drained_at, drain_reason, status_reason = Node.Status.ACTIVE, None, "", ""
        if k % 97 == 13:
            status, drained_at = Node.Status.DRAINING, now - timedelta(hours=2)
            drain_reason = "PSU replacement"
        elif k % 131 == 29:
            status, status_reason = Node.Status.UNREACHABLE, "ssh: connection timed out"
        rows.append(
            Node(
                name=f"{prefix}-{k:05d}",
                address=f"10.{200 + k // 65025 % 50}.{k // 255 % 255}.{k % 255 + 1}",
                port=port + k // (65025 * 50),
                host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIbench",
                host_key_fingerprint="SHA256:bench",
                status=status,
                status_reason=status_reason,
                drained_at=drained_at,
                drain_reason=drain_reason,
                gate_status=Node.GateStatus.PASSED,
                gate_checked_at=now - timedelta(days=1),
                driver_version="550.90.07",
                cuda_version="12.4",
                sample_source="nvml",
                last_seen_at=now - timedelta(seconds=rng.randint(1, 30)),
                capabilities={"nvidia_runtime": True, "mig": True, "quota_library": True},
            )
        )
    made = Node.objects.bulk_create(rows, batch_size=BATCH)
    gpus = []
    for k, node in enumerate(made):
        model, total_mb, mig_capable = MODELS[k % len(MODELS)]
        sampled = node.status != Node.Status.UNREACHABLE
        taken_at = now - timedelta(seconds=rng.randint(1, 30), microseconds=rng.randint(0, 10**6))
        for i in range(gpus_per_node):
            mig = mig_capable and total_mb == 40960 and i == 0 and k % 10 == 2
            # slices of 4 to 24 GB, never more than three quarters of the card
            sizes = [mb for mb in (0, 0, 4096, 8192, 12288, 24576) if mb <= total_mb * 0.75]
            allocated = rng.choice(sizes) if not mig else 19968
            used = min(total_mb, allocated + rng.randint(300, 4000)) if sampled else None
            if sampled and rng.random() < 0.03:  # a few hot cards over the warning line
                used = int(total_mb * rng.uniform(0.86, 0.99))
            if sampled and k % 53 == 7 and i == gpus_per_node - 1:
                used = None  # a card that has not been read yet
            gpus.append(
                Gpu(
                    node=node,
                    uuid=f"GPU-{prefix}-{k:05d}-{i:02d}-{rng.getrandbits(64):016x}",
                    index=i,
                    model=model,
                    vram_total_mb=total_mb,
                    mig_capable=mig_capable,
                    mig_enabled=mig,
                    mig_devices=MIG_LAYOUT if mig else [],
                    pci_bus_id=f"0000:{0x17 + 0x10 * i:02x}:00.0",
                    allocated_mb=allocated,
                    accepting_placements=not (k % 41 == 3 and i == 1),
                    not_accepting_reason="VRAM breaker: 96% used" if k % 41 == 3 and i == 1 else "",
                    last_memory_used_mb=used,
                    last_utilization_gpu=rng.randint(0, 100) if used is not None else None,
                    last_utilization_memory=rng.randint(0, 60) if used is not None else None,
                    last_temperature_c=rng.randint(30, 85) if used is not None else None,
                    last_power_w=round(rng.uniform(60, 700), 2) if used is not None else None,
                    last_processes_mb=used,
                    last_sample_at=taken_at if used is not None else None,
                )
            )
    Gpu.objects.bulk_create(gpus, batch_size=BATCH)
    return [node.pk for node in made]
