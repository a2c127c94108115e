"""Watchdog quality: precision and recall over a scripted fleet day.

A day of a small fleet, with time accelerated: emulated GPU nodes (the node emulator over
real SSH, its clock moved forward in 30 s steps; the platform's clock follows it), the
platform's own sampling, watchdog hook, minute sweep, reconcile and metering, with Celery
eager. Hundreds of ordinary slices come and go, and a known list of faults is injected.
Every incident is then matched against the faults: one with no fault behind it is false;
a fault with no incident is missed; two open incidents for one fault are a duplicate.

Ordinary (none of this may file an incident):
- steady inference within its quota; bursty inference (bursts under 2.5 GB, within quota);
- training that ramps to a plateau within its quota;
- a slice idle for ten minutes, then computing again;
- stops by the tenant; launches that queue at the busy hour and are placed later;
- a tenant suspended by ops (its slices stop); a node drained by ops, and undrained.

Faults (each must be caught once, by the rule in brackets):
- leak past its quota on a node without a quota library [quota_breach];
- burst past its quota, long enough for two samples [quota_breach];
- out of memory: a job that grows until its allocation fails [oom_exit];
- idle past 15 minutes [idle_slice];
- an orphan process its container left behind [orphan_process];
- memory used with no process [unattributed_memory];
- Xid 79 on a card [hardware_fault];
- a bandwidth hog, 90% of the card's memory bandwidth [bandwidth_hog];
- a node that stops answering for five minutes [node_unreachable];
- a node whose host key changes (ops then pin the new one) [node_unreachable].

Prints, per rule and overall:
  RESULT false_incidents=<n> incidents          (target 0)
  RESULT missed_faults=<n> faults               (target 0)
  RESULT duplicate_incidents=<n> incidents      (target 0)
  RESULT detect_p95_s=<s> s                     (fault start to incident, simulated)
  RESULT neighbours_hurt=<n> slices             (target 0)

    .venv/bin/python bench/watchdog_quality.py [--slices 300] [--hours 6] [--nodes 8] [--verbose]
"""

from __future__ import annotations

import argparse
import heapq
import logging
import random
import statistics
import tempfile
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

# bench/ is on sys.path (tests/incidents/test_watchdog_quality.py puts it there too);
# importing _db sets Django up, so it comes before the platform's imports below
from _db import throwaway_database

# isort: split
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from emulator import EmulatedFleet
from emulator.catalog import DEFAULT_QUOTA_LIBRARY, GpuSpec, NodeSpec
from gpuplatform.celery import app
from incidents import services as incident_services
from incidents import throttle
from incidents.models import Incident, IncidentEvent, SliceWatch
from nodes import services as node_services
from nodes import ssh
from nodes.models import Gpu, Node
from tenants import services
from tenants.models import Image, Slice, SliceTransition, Tenant, Tier

STEP_S = 30  # the sampling interval
# How long after its start a fault may take to be caught: one sampling interval plus the
# rule's own window (and the sweep or reconcile that acts on it).
WINDOW_S = {
    "quota_breach": STEP_S,
    "oom_exit": 3 * 60,  # reconcile finds the dead container, the next sweep files it
    "idle_slice": 15 * 60 + 60,
    "orphan_process": 2 * 60 + STEP_S,  # two sweeps' samples in a row
    "unattributed_memory": 60,
    "hardware_fault": STEP_S,
    "bandwidth_hog": STEP_S,
    "node_unreachable": 3 * STEP_S + 60,  # three failed samples, then the sweep
}
# Card-level rules a slice fault may also set off on its own card (a leak fills it).
CARD_RULES = {"vram_high", "vram_critical", "fleet_sweep"}


@dataclass
class Fault:
    kind: str
    rules: set[str]  # any of these catches it (the first in `primary`)
    primary: str
    at: float = 0.0  # emulated epoch when the condition began
    after_start: float | None = None  # or: this long after its slice started (it may queue)
    slice_id: int | None = None
    gpu_id: int | None = None
    node_id: int | None = None
    incidents: list[int] = field(default_factory=list)


@dataclass
class Report:
    false: list[tuple[str, str]]
    missed: list[str]
    duplicates: int
    detect_s: dict[str, list[float]]
    hurt: list[int]
    slices: int
    incidents: int
    faults: int
    faults_seen: list[Fault] = field(default_factory=list)

    def lines(self) -> list[str]:
        all_detect = [d for ds in self.detect_s.values() for d in ds]
        p95 = _p95(all_detect)
        out = [
            f"slices={self.slices} faults={self.faults} incidents={self.incidents}",
        ]
        for rule in sorted(self.detect_s):
            ds = self.detect_s[rule]
            out.append(
                f"  {rule}: caught {len(ds)}, detect p95 {_p95(ds):.0f} s "
                f"(window {WINDOW_S.get(rule, STEP_S)} s)"
            )
        for rule, title in self.false:
            out.append(f"  false: {rule}: {title}")
        for kind in self.missed:
            out.append(f"  missed: {kind}")
        out += [
            f"RESULT false_incidents={len(self.false)} incidents",
            f"RESULT missed_faults={len(self.missed)} faults",
            f"RESULT duplicate_incidents={self.duplicates} incidents",
            f"RESULT detect_p95_s={p95:.0f} s",
            f"RESULT neighbours_hurt={len(self.hurt)} slices",
        ]
        return out


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[18]


@contextmanager
def emulated_time(clock):  # type: ignore[no-untyped-def]
    """The platform's clock is the fleet's: every timezone.now() reads it."""
    real = timezone.now
    timezone.now = lambda: datetime.fromtimestamp(clock.now(), UTC)
    try:
        yield
    finally:
        timezone.now = real


class Day:
    """One scripted day. Needs Django set up on an empty database."""

    def __init__(self, *, slices: int, hours: float, nodes: int, seed: int, workdir: Path):
        self.n_slices = slices
        self.day_s = hours * 3600
        self.n_nodes = max(4, nodes)
        self.rng = random.Random(seed)
        self.workdir = workdir
        self.events: list[tuple[float, int, str, dict]] = []
        self.faults: list[Fault] = []
        self.offenders: set[int] = set()
        self.ordinary: set[int] = set()
        self._seq = 0

    # -- the fleet and the tenants
    def setup(self, stack: ExitStack) -> None:
        settings.NODES_SSH_KEY_PATH = str(self.workdir / "id_ed25519")
        settings.NODES_CONTAINER_SETTLE_S = 0
        ssh.reset_pool()
        app.conf.task_always_eager = True
        app.conf.task_eager_propagates = False
        stack.callback(setattr, app.conf, "task_always_eager", False)
        # throttling pauses for real seconds; the emulated clock does not move meanwhile
        for name, value in (("DUTY_PAUSE_S", 0.0), ("DUTY_RUN_S", 0.0), ("_cycles", lambda: 1)):
            stack.callback(setattr, throttle, name, getattr(throttle, name))
            setattr(throttle, name, value)
        stack.callback(ssh.reset_pool)
        public = ssh.public_key_line(ssh.get_pool().private_key)
        specs = [
            NodeSpec(
                f"day-{i:02d}",
                (GpuSpec("NVIDIA A30"), GpuSpec("NVIDIA A30")),
                DEFAULT_QUOTA_LIBRARY if i % 2 == 0 else None,
            )
            for i in range(self.n_nodes)
        ]
        self.fleet = EmulatedFleet.start(
            nodes=specs, authorized_keys=[public], state_dir=self.workdir / "emu", speed=0.0
        )
        stack.callback(self.fleet.stop)
        stack.enter_context(emulated_time(self.fleet.clock))
        self.nodes = []
        for emu in self.fleet.nodes:
            node = node_services.node_register(
                name=emu.name, address="127.0.0.1", port=emu.port, host_key=emu.host_key_line()
            )
            self.nodes.append(node_services.node_discover(node_id=node.pk))
        User = get_user_model()
        self.ops = User.objects.create_user(
            username="ops@day.test", email="ops@day.test", password="x" * 20, is_staff=True
        )
        # Half the fleet has no quota library: ops accept the watchdog as the only VRAM
        # enforcement there (without that those cards are sold whole only).
        self.nodes = [
            node
            if node.capabilities.get("vram_quota_library")
            else node_services.node_accept_watchdog_only(
                node=node, actor=self.ops, accept=True, reason="the watchdog alone, measured"
            )
            for node in self.nodes
        ]
        self.members = []
        for i in range(8):
            m = services.tenant_sign_up(
                email=f"t{i}@day.test", password=f"day-passphrase-{i}-long", tenant_name=f"T{i}"
            )
            services.credit_grant(tenant=m.tenant, amount="100000.00", actor=self.ops, memo="day")
            self.members.append(m)
        self.image = Image.objects.create(
            name="job", reference="x/job:1", ports=[], connect="service"
        )
        self.tiers = {t.vram_mb // 1024: t for t in Tier.objects.all()}
        # one card takes no slices: its orphan and its lost memory are nobody's
        self.spare = node_services.gpu_set_accepting(
            gpu=Gpu.objects.get(node=self.nodes[0], index=1),
            accepting=False,
            reason="kept for the day's card faults",
        )
        self.start = self.fleet.clock.now()

    # -- the script
    def at(self, t: float, kind: str, **data: object) -> None:
        self._seq += 1
        heapq.heappush(self.events, (self.start + t, self._seq, kind, data))

    def script(self) -> None:
        rng = self.rng
        quiet_until = self.day_s - 1800  # the last half hour: slices end, nothing starts
        for _ in range(self.n_slices):
            t = rng.uniform(0, quiet_until)
            gb = rng.choice([4, 8, 8, 12])
            q = gb * 1024
            kind = rng.choice(["steady", "steady", "burst", "training", "idle-resumed"])
            if kind == "steady":
                env = {"EMULATOR_MB": str(int(q * rng.uniform(0.4, 0.7)))}
            elif kind == "burst":
                base = int(q * 0.35)
                env = {
                    "EMULATOR_PROFILE": "burst",
                    "EMULATOR_MB": str(base),
                    "EMULATOR_BURST_MB": str(min(2500, int(q * 0.3))),
                    "EMULATOR_PERIOD_S": "300",
                    "EMULATOR_BURST_S": "60",
                    "EMULATOR_COOPERATIVE": "1",
                }
            elif kind == "training":
                env = {
                    "EMULATOR_PROFILE": "ramp",
                    "EMULATOR_MB": str(int(q * 0.2)),
                    "EMULATOR_PEAK_MB": str(int(q * 0.7)),
                    "EMULATOR_RATE_MB_PER_MIN": "1500",
                    "EMULATOR_COOPERATIVE": "1",
                }
            else:
                env = {
                    "EMULATOR_MB": str(int(q * 0.4)),
                    "EMULATOR_IDLE_FROM_S": "60",
                    "EMULATOR_IDLE_UNTIL_S": "660",  # ten minutes idle, then it computes
                }
            duration = rng.uniform(600, 3 * 3600)
            self.at(t, "launch", gb=gb, env=env, stop_after=duration, ordinary=True)
        # ops' ordinary work
        self.at(self.day_s * 0.3, "suspend", tenant=7)
        self.at(self.day_s * 0.32, "reactivate", tenant=7)
        self.at(self.day_s * 0.5, "drain", node=1)
        self.at(self.day_s * 0.55, "undrain", node=1)
        # the faults, spread over the day
        spots = iter(sorted(rng.uniform(0.05, 0.85) * self.day_s for _ in range(10)))
        self.at(next(spots), "fault_leak")
        self.at(next(spots), "fault_burst")
        self.at(next(spots), "fault_oom")
        self.at(next(spots), "fault_idle")
        self.at(next(spots), "fault_orphan")
        self.at(next(spots), "fault_unattributed")
        self.at(next(spots), "fault_xid")
        self.at(next(spots), "fault_bandwidth")
        self.at(next(spots), "fault_down")
        self.at(next(spots), "fault_hostkey")

    # -- acting
    def launch(self, gb: int, env: dict, *, member=None, guaranteed: bool = True, node=None):  # type: ignore[no-untyped-def]
        member = member or self.rng.choice(self.members[:7])
        if member.tenant.status != "active":
            return None
        purchase, _ = services.purchase_create(membership=member, tier=self.tiers[gb], hours=6)
        s, _ = services.slice_launch(
            membership=member,
            purchase=purchase,
            image=self.image,
            model_request={"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 1024},
            environment=env,
        )
        return Slice.objects.get(pk=s.pk)

    def fault_slice(self, kind: str, gb: int, env: dict, *, library: bool | None = None):  # type: ignore[no-untyped-def]
        """A slice for a fault, on a node with (or without) a quota library, alone on an
        emptyish card where possible."""
        if library is not None:
            # steer it: drain the nodes of the other kind for the one launch
            other = [
                n.pk
                for n in self.nodes
                if bool(n.capabilities.get("vram_quota_library")) != library
            ]
            Node.objects.filter(pk__in=other, drained_at__isnull=True).update(status="draining")
            try:
                s = self.launch(gb, env, member=self.members[0])
            finally:
                Node.objects.filter(
                    pk__in=other, status="draining", drained_at__isnull=True
                ).update(status="active")
        else:
            s = self.launch(gb, env, member=self.members[0])
        if s is None or s.state not in ("provisioning", "running", "queued"):
            return None
        s.refresh_from_db()
        self.offenders.add(s.pk)
        return s

    def emu_of(self, gpu):  # type: ignore[no-untyped-def]
        return self.fleet.node(gpu.node.name)

    def do(self, now: float, kind: str, data: dict) -> None:  # noqa: C901 - a script
        if kind == "launch":
            s = self.launch(data["gb"], data["env"])
            if s is not None:
                self.ordinary.add(s.pk)
                self.at(now - self.start + data["stop_after"], "stop", slice=s.pk)
        elif kind == "stop":
            s = Slice.objects.get(pk=data["slice"])
            if not s.is_final:
                services.slice_stop(slice=s, actor=s.created_by)
        elif kind in ("suspend", "reactivate"):
            tenant = Tenant.objects.get(pk=self.members[data["tenant"]].tenant_id)
            services.tenant_set_status(
                tenant=tenant,
                actor=self.ops,
                status="suspended" if kind == "suspend" else "active",
                reason="unpaid invoice" if kind == "suspend" else "",
            )
            self.members[data["tenant"]].tenant.refresh_from_db()
        elif kind == "drain":
            node_services.node_drain(node=self.nodes[data["node"]], reason="firmware update")
        elif kind == "undrain":
            node_services.node_undrain(node=Node.objects.get(pk=self.nodes[data["node"]].pk))
        elif kind == "fault_leak":
            s = self.fault_slice(
                kind,
                8,
                {
                    "EMULATOR_PROFILE": "leak",
                    "EMULATOR_MB": "6000",
                    "EMULATOR_RATE_MB_PER_MIN": "600",
                },
                library=False,
            )
            if s is not None:  # crosses 8192 MiB after (8192 - 6000) / 600 minutes
                # placed later from the queue, it may land under a quota library, which
                # fails its allocation at the quota: an OOM exit is then the catch
                self.note(Fault("leak", {"quota_breach", "slow_leak", "oom_exit"}, "quota_breach",
                                after_start=(8192 - 6000) * 60 / 600, slice_id=s.pk))  # fmt: skip
        elif kind == "fault_burst":
            s = self.fault_slice(
                kind,
                4,
                {
                    "EMULATOR_PROFILE": "burst",
                    "EMULATOR_MB": "2500",
                    "EMULATOR_BURST_MB": "3500",
                    "EMULATOR_PERIOD_S": "600",
                    "EMULATOR_BURST_S": "150",
                    "EMULATOR_COOPERATIVE": "0",
                },
                library=False,
            )
            if s is not None:  # the first burst starts period - burst_s in
                rules = {"quota_breach", "process_jump", "oom_exit"}
                self.note(Fault("burst", rules, "quota_breach", after_start=450, slice_id=s.pk))
                self.at(now - self.start + 700, "stop", slice=s.pk)
        elif kind == "fault_oom":
            s = self.fault_slice(
                kind, 4, {"EMULATOR_PROFILE": "oom", "EMULATOR_MB": "2000",
                          "EMULATOR_RATE_MB_PER_MIN": "1000"}, library=True,
            )  # fmt: skip
            if s is not None:  # dies at its cap, (4096 - 2000) / 1000 minutes in
                self.note(Fault("oom", {"oom_exit"}, "oom_exit", after_start=126, slice_id=s.pk))
        elif kind == "fault_idle":
            s = self.fault_slice(kind, 4, {"EMULATOR_PROFILE": "idle", "EMULATOR_MB": "1500"})
            if s is not None:
                self.note(
                    Fault("idle", {"idle_slice"}, "idle_slice", after_start=900, slice_id=s.pk)
                )
        elif kind == "fault_orphan":
            gpu = self.spare
            pid = self.emu_of(gpu).add_gpu_process(gpu.index, 1500, container_id="e" * 64)
            self.note(Fault("orphan", {"orphan_process"}, "orphan_process", at=now, gpu_id=gpu.pk))
            self.at(now - self.start + 900, "kill_pid", gpu=gpu.pk, pid=pid)
        elif kind == "kill_pid":
            gpu = Gpu.objects.get(pk=data["gpu"])
            self.emu_of(gpu).kill_pid(data["pid"])
        elif kind == "fault_unattributed":
            gpu = self.spare
            if gpu is not None:
                self.emu_of(gpu).hold_memory(gpu.index, 2000)
                self.note(Fault("unattributed", {"unattributed_memory"}, "unattributed_memory",
                                at=now, gpu_id=gpu.pk))  # fmt: skip
                self.at(now - self.start + 900, "release_memory", gpu=gpu.pk)
        elif kind == "release_memory":
            gpu = Gpu.objects.get(pk=data["gpu"])
            self.emu_of(gpu).hold_memory(gpu.index, 0)
        elif kind == "fault_xid":
            gpu = Gpu.objects.filter(present=True).order_by("?").first()
            self.emu_of(gpu).inject_xid(gpu=gpu.index, code=79)
            self.note(Fault("xid", {"hardware_fault"}, "hardware_fault", at=now, gpu_id=gpu.pk))
        elif kind == "fault_bandwidth":
            s = self.fault_slice(
                kind,
                8,
                {"EMULATOR_MB": "2000", "EMULATOR_MEM_UTIL": "90", "EMULATOR_SM_UTIL": "70"},
            )
            if s is not None:
                self.note(Fault("bandwidth", {"bandwidth_hog"}, "bandwidth_hog", after_start=0,
                                slice_id=s.pk))  # fmt: skip
                self.at(now - self.start + 600, "stop", slice=s.pk)
        elif kind == "fault_down":
            node = self.nodes[2]
            self.fleet.node(node.name).set_down(True)
            self.note(Fault("down", {"node_unreachable"}, "node_unreachable", at=now,
                            node_id=node.pk))  # fmt: skip
            self.at(now - self.start + 300, "node_up", node=node.name)
        elif kind == "node_up":
            self.fleet.node(data["node"]).set_down(False)
        elif kind == "fault_hostkey":
            node = self.nodes[3]
            key = self.fleet.node(node.name).rotate_host_key()
            self.note(Fault("hostkey", {"node_unreachable"}, "node_unreachable", at=now,
                            node_id=node.pk))  # fmt: skip
            self.at(now - self.start + 600, "repin", node=node.pk, key=key)
        elif kind == "repin":
            node = Node.objects.get(pk=data["node"])
            node_services.node_update(node=node, host_key=data["key"])
            node_services.node_discover(node_id=node.pk)

    def note(self, fault: Fault) -> None:
        self.faults.append(fault)

    # -- the day
    def run(self) -> Report:
        self.script()
        end = self.start + self.day_s
        step = 0
        while self.fleet.clock.now() < end:
            now = self.fleet.clock.now()
            while self.events and self.events[0][0] <= now:
                _, _, kind, data = heapq.heappop(self.events)
                self.do(now, kind, data)
            self.fleet.advance(STEP_S)
            ssh.get_pool()._backoff.clear()  # each beat would try again after its backoff
            ids = list(Node.objects.exclude(host_key="").values_list("pk", flat=True))
            node_services.nodes_sample(node_ids=ids)
            step += 1
            if step % 2 == 0:  # every minute: the sweep, reconcile, metering, the queue
                services.slices_reconcile()
                incident_services.watch_sweep()
                services.slices_meter()
                services.slices_dispatch_queue()
        return self.score()

    def score(self) -> Report:
        for f in self.faults:
            if f.after_start is not None:
                started = Slice.objects.get(pk=f.slice_id).started_at
                f.at = started.timestamp() + f.after_start if started else float("inf")
        self.faults = [f for f in self.faults if f.at != float("inf")]
        incidents = list(Incident.objects.order_by("first_seen_at", "pk"))
        false = []
        for i in incidents:
            fault = self._explains(i)
            if fault is None:
                false.append((i.rule, i.title))
            else:
                fault.incidents.append(i.pk)
        missed = []
        duplicates = 0
        detect: dict[str, list[float]] = {}
        by_pk = {i.pk: i for i in incidents}
        for f in self.faults:
            caught = [by_pk[pk] for pk in f.incidents if by_pk[pk].rule == f.primary]
            if not caught:
                if not [pk for pk in f.incidents if by_pk[pk].rule in f.rules]:
                    missed.append(f.kind)
                    continue
                caught = [by_pk[pk] for pk in f.incidents if by_pk[pk].rule in f.rules]
            first = min(caught, key=lambda i: i.first_seen_at)
            detect.setdefault(first.rule, []).append(
                max(0.0, first.first_seen_at.timestamp() - f.at)
            )
            # one fault, several incidents of one rule open at the same time
            for rule in {i.rule for i in caught}:
                same = sorted((i for i in caught if i.rule == rule), key=lambda i: i.first_seen_at)
                for a, b in zip(same, same[1:], strict=False):
                    if a.resolved_at is None or a.resolved_at > b.first_seen_at:
                        duplicates += 1
        # neighbours hurt: an ordinary slice the watchdog stopped, throttled or failed
        stopped_by_watchdog = set(
            SliceTransition.objects.filter(
                slice_id__in=self.ordinary, to_state="stopping", reason__icontains="watchdog"
            ).values_list("slice_id", flat=True)
        )
        failed = set(
            Slice.objects.filter(pk__in=self.ordinary, state="failed").values_list("pk", flat=True)
        )
        throttled = set(
            IncidentEvent.objects.filter(
                incident__rule="bandwidth_hog", incident__slice_id__in=self.ordinary
            ).values_list("incident__slice_id", flat=True)
        ) | set(
            SliceWatch.objects.filter(
                slice_id__in=self.ordinary, throttled_at__isnull=False
            ).values_list("slice_id", flat=True)
        )
        hurt = sorted(stopped_by_watchdog | failed | throttled)
        return Report(
            false=false,
            missed=missed,
            duplicates=duplicates,
            detect_s=detect,
            hurt=hurt,
            slices=len(self.ordinary) + len(self.offenders),
            incidents=len(incidents),
            faults=len(self.faults),
            faults_seen=self.faults,
        )

    def _explains(self, incident) -> Fault | None:  # type: ignore[no-untyped-def]
        window = timedelta(seconds=3600)
        for f in self.faults:
            began = datetime.fromtimestamp(f.at, UTC) - timedelta(seconds=STEP_S * 4)
            if not began <= incident.first_seen_at <= began + window + timedelta(seconds=900):
                continue
            own = incident.rule in f.rules or incident.rule in ("process_jump", "oom_exit")
            if f.slice_id is not None and incident.slice_id == f.slice_id and own:
                return f
            if f.gpu_id is not None and incident.gpu_id == f.gpu_id and incident.rule in f.rules:
                return f
            if f.node_id is not None and incident.node_id == f.node_id and incident.rule in f.rules:
                return f
            # a slice fault may also fill its own card
            if f.slice_id is not None and incident.rule in CARD_RULES:
                s = Slice.objects.select_related("allocation").get(pk=f.slice_id)
                if s.allocation is not None and incident.gpu_id == s.allocation.gpu_id:
                    return f
        return None


def simulate(*, slices: int, hours: float, nodes: int, seed: int = 7) -> Report:
    """One scripted day on the database Django is set up with (empty, migrated)."""
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        day = Day(slices=slices, hours=hours, nodes=nodes, seed=seed, workdir=Path(tmp))
        day.setup(stack)
        return day.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", type=int, default=300)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--verbose", action="store_true", help="list every incident")
    args = parser.parse_args()
    if not args.verbose:  # the faults make the platform log, as it should; not the figures
        logging.disable(logging.CRITICAL)
    with throwaway_database("watchdog_quality"):
        report = simulate(slices=args.slices, hours=args.hours, nodes=args.nodes, seed=args.seed)
        if args.verbose:
            for i in Incident.objects.order_by("first_seen_at"):
                where = f"slice={i.slice_id} gpu={i.gpu_id} node={i.node_id}"
                print(f"  {i.first_seen_at:%H:%M:%S} {i.rule} {where} {i.status}: {i.title}")
            for f in report.faults_seen:
                when = datetime.fromtimestamp(f.at, UTC)
                where = f"slice={f.slice_id} gpu={f.gpu_id} node={f.node_id}"
                print(f"  fault {f.kind} at {when:%H:%M:%S} {where} -> {f.incidents}")
    for line in report.lines():
        print(line)


if __name__ == "__main__":
    main()
