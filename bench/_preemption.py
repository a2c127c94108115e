"""The watchdog-quality benchmark's preemption scenario: one overcommitted card (ratio 2.0)
carries full-price slices and interruptible ones; the full-price neighbours burst within
their quotas, the card crosses its warning line (85%), and the watchdog must absorb each
burst by preempting interruptible slices only, newest first, with docker's grace stop,
never a full-price one, and no slice may be short of memory. The day runs on the fleet's
emulated clock through the platform's own sampling, sweep and disposition, as the day of
watchdog_quality.py does."""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model

from emulator import EmulatedFleet
from emulator.catalog import DEFAULT_QUOTA_LIBRARY, GpuSpec, NodeSpec
from gpuplatform.celery import app
from incidents import services as incident_services
from incidents.models import Incident
from nodes import services as node_services
from nodes import ssh
from nodes.models import Allocation, Gpu
from tenants import services
from tenants.models import Image, Slice, Tier

STEP_S = 30


@dataclass
class PreemptionReport:
    full_price: int = 0  # slices bought at full price on the card
    interruptible: int = 0
    preempted: list[int] = field(default_factory=list)  # slice ids, in the order preempted
    newest_first: bool = True
    hurt: list[str] = field(default_factory=list)  # full-price slices stopped, failed or short
    short_of_memory: list[str] = field(default_factory=list)
    resumable: bool = True  # every preempted slice can be resumed (volumes kept, purchase ok)
    # minutes billed to preempted slices after their notice (the grace stop is not billed)
    billed_after_notice: int = 0
    peak_pct: float = 0.0

    def lines(self) -> list[str]:
        order = "newest first" if self.newest_first else "OUT OF ORDER"
        return [
            f"preemption: {self.full_price} full-price and {self.interruptible} interruptible "
            f"slices on one card at ratio 2.0; peak {self.peak_pct:.0f}% of the card; "
            f"preempted {self.preempted} ({order})",
            f"RESULT preemption_guaranteed_hurt={len(self.hurt)} slices",
            f"RESULT preemption_interruptible_preempted={len(self.preempted)} slices",
            f"RESULT preemption_short_of_memory={len(self.short_of_memory)} containers",
            f"RESULT preemption_billed_after_notice={self.billed_after_notice} minutes",
        ]


def preemption_day(workdir: Path, *, emulated_time, minutes: int = 40) -> PreemptionReport:
    """The scenario on the database Django is set up with (empty, migrated)."""
    with ExitStack() as stack:
        settings.NODES_SSH_KEY_PATH = str(workdir / "id_ed25519")
        settings.NODES_CONTAINER_SETTLE_S = 0
        ssh.reset_pool()
        stack.callback(ssh.reset_pool)
        app.conf.task_always_eager = True
        app.conf.task_eager_propagates = False
        stack.callback(setattr, app.conf, "task_always_eager", False)
        public = ssh.public_key_line(ssh.get_pool().private_key)
        fleet = EmulatedFleet.start(
            nodes=[NodeSpec("pre-00", (GpuSpec("NVIDIA A30"),), DEFAULT_QUOTA_LIBRARY)],
            authorized_keys=[public],
            state_dir=workdir / "emu",
            speed=0.0,
        )
        stack.callback(fleet.stop)
        stack.enter_context(emulated_time(fleet.clock))
        return _run(fleet, minutes)


def _run(fleet, minutes: int) -> PreemptionReport:
    ops = get_user_model().objects.create_user(
        username="ops@pre.test", email="ops@pre.test", password="x" * 20, is_staff=True
    )
    image = Image.objects.create(name="job", reference="x/job:1", ports=[], connect="service")
    node_services.preflight_policy_update(actor=ops, reason="probe", probe_image=image.reference)
    emu = fleet.nodes[0]
    node = node_services.node_register(
        name=emu.name, address="127.0.0.1", port=emu.port, host_key=emu.host_key_line()
    )
    node = node_services.node_discover(node_id=node.pk)
    gpu = Gpu.objects.get(node=node)
    # ops' choice from measured history, set here directly: 2.0 sells 48 GB of a 24 GB card
    Gpu.objects.filter(pk=gpu.pk).update(overcommit_ratio=Decimal("2.0"))
    tier = Tier.objects.get(vram_mb=8192)
    members = []
    for i in range(2):
        m = services.tenant_sign_up(
            email=f"p{i}@pre.test", password=f"pre-passphrase-{i}-long", tenant_name=f"P{i}"
        )
        services.credit_grant(tenant=m.tenant, amount="1000.00", actor=ops, memo="pre")
        members.append(m)
    model = {"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 1024}

    def launch(member, *, interruptible: bool, env: dict) -> Slice:
        purchase, _ = services.purchase_create(
            membership=member, tier=tier, hours=2, interruptible=interruptible
        )
        s, _ = services.slice_launch(
            membership=member, purchase=purchase, image=image, model_request=model,
            environment=env, guaranteed=False,
        )  # fmt: skip
        s.refresh_from_db()
        if s.state not in (Slice.State.PROVISIONING, Slice.State.RUNNING):
            raise RuntimeError(f"slice {s.pk} did not start: {s.state} ({s.state_reason})")
        return s

    # two full-price neighbours: steady at 2.5 GB, each bursting by 5 GB (inside its
    # 8 GB quota) for five minutes of every twenty, the second ten minutes after the first
    full = [
        launch(
            members[0],
            interruptible=False,
            env={
                "EMULATOR_PROFILE": "burst",
                "EMULATOR_MB": "2500",
                "EMULATOR_BURST_MB": "5000",
                "EMULATOR_PERIOD_S": "1200",
                "EMULATOR_BURST_S": "300",
            },
        ),  # fmt: skip
    ]
    interruptible = []
    for k in range(3):  # 4.5 GB each: the card at 16 GB of 24 (66%) between bursts
        fleet.advance(STEP_S)
        interruptible.append(launch(members[1], interruptible=True, env={"EMULATOR_MB": "4500"}))
        if k == 0:
            fleet.advance(600)
            full.append(launch(members[0], interruptible=False, env={
                "EMULATOR_PROFILE": "burst", "EMULATOR_MB": "1000", "EMULATOR_BURST_MB": "5000",
                "EMULATOR_PERIOD_S": "1200", "EMULATOR_BURST_S": "300",
            }))  # fmt: skip
    report = PreemptionReport(full_price=len(full), interruptible=len(interruptible))
    short: set[str] = set()
    for step in range(minutes * 60 // STEP_S):
        fleet.advance(STEP_S)
        # what the card holds as the sample reads it (the watchdog acts within the sample)
        used = emu.memory_used().get(gpu.uuid, 0)
        report.peak_pct = max(report.peak_pct, 100.0 * used / gpu.vram_total_mb)
        ssh.get_pool()._backoff.clear()
        node_services.nodes_sample(node_ids=[node.pk])
        short.update(emu.short_of_memory())
        if step % 2 == 1:
            services.slices_reconcile()
            incident_services.watch_sweep()
            services.running_slices_meter()
    ids = {s.pk for s in full} | {s.pk for s in interruptible}
    preempted = (
        Incident.objects.filter(rule="slice_preempted", slice_id__in=ids)
        .order_by("first_seen_at", "pk")
        .values_list("slice_id", flat=True)
    )
    report.preempted = list(preempted)
    order = [s.pk for s in sorted(interruptible, key=lambda s: (s.started_at, s.pk), reverse=True)]
    report.newest_first = report.preempted == order[: len(report.preempted)]
    for s in full:
        s.refresh_from_db()
        if s.state != Slice.State.RUNNING or s.pk in report.preempted:
            report.hurt.append(f"slice {s.pk}: {s.state} ({s.state_reason})")
    container_of = {s.container_id: s.pk for s in [*full, *interruptible]}
    report.short_of_memory = sorted(f"slice {container_of.get(c, c)}" for c in short)
    for pk in report.preempted:
        s = Slice.objects.select_related("purchase").get(pk=pk)
        notice = Incident.objects.filter(rule="slice_preempted", slice_id=pk).earliest("pk")
        ran_s = (notice.first_seen_at - s.started_at).total_seconds()
        report.billed_after_notice += max(0, s.purchase.minutes_used - math.ceil(ran_s / 60))
        allocation = Allocation.objects.filter(pk=s.allocation_id).first()
        report.resumable &= s.state == Slice.State.STOPPED and s.terminated_at is None
        report.resumable &= allocation is not None and allocation.preempted_at is not None
    return report
