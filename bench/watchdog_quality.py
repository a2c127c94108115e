"""Watchdog quality: precision and recall over a scripted fleet day.

A day of a small fleet, with time accelerated: emulated GPU nodes (the node emulator over
real SSH, its clock moved forward in 30 s steps; the platform's clock follows it), the
platform's own sampling, watchdog hook, minute sweep, reconcile and metering, with Celery
eager. Hundreds of ordinary slices come and go, and a known list of faults is injected.
Every incident is then matched against the faults (`Matcher`), strictly:
- an incident is explained only by a fault on the rule's own target (the slice, the card
  or the node the rule is about), filed within that rule's own detection window after
  the fault's condition began (derived from the thresholds: `rule_windows`) plus two
  sampling intervals;
- a card alarm (vram_high, vram_critical, fleet_sweep) on a faulty slice's card is the
  fault's only when the fault's own memory (the slice's beyond its quota, an orphan's,
  memory no process holds) is what took the card over that alarm's line, read from what
  the emulated card really held at the time; a card there anyway is the neighbours'
  alarm, and false;
- one that has no such fault behind it is false; a fault with no incident by its
  expected rule is missed; a second incident of one rule for one fault (filed while the
  first was open, or again after it resolved) is a duplicate.

Ordinary (none of this may file an incident):
- steady inference within its quota; bursty inference (bursts under 2.5 GB, within quota);
- training that ramps to a plateau within its quota;
- a slice idle for ten minutes, then computing again;
- stops by the tenant; launches that queue at the busy hour and are placed later;
- a tenant suspended by ops (its slices stop); a node drained by ops, and undrained.

Faults (each must be caught by the rule in brackets, once):
- leak past its quota on a node without a quota library [quota_breach];
- burst past its quota, long enough for two samples [quota_breach];
- out of memory: a job that grows until its allocation fails [oom_exit];
- idle for 15 minutes [idle_slice];
- an orphan process its container left behind [orphan_process];
- memory used with no process [unattributed_memory];
- Xid 79 on a card [hardware_fault];
- a bandwidth hog, 90% of the card's memory bandwidth [bandwidth_hog];
- a node that stops answering for five minutes [node_unreachable];
- a node whose host key changes (ops then pin the new one) [node_unreachable];
- a process that sets CUDA_DISABLE_CONTROL=true in its own environment, one that sets its
  own 80 GB limit, one that unsets LD_PRELOAD, each then allocating past its tier on a
  node whose library takes its settings from the node (/overrideEnv, a read-only
  /etc/ld.so.preload): refused inside the container, the job ends on CUDA's OOM
  [oom_exit]; never past its quota (a quota_breach would be false);
- a statically linked job allocating past its tier: the library never sees it, NVML
  does [accounting_drift, which stops it alone].
No neighbour may be stopped, throttled or failed, nor hold less memory than its program
wants within its own caps (what the emulated device really gives it, every step). Every
step each card is also judged by the node agent's harm rule (nodes.agent.harm_on_card,
what the emulated card really holds: each container's quota and memory, the card's free
memory): a slice is harmed while the card has less free than its unused quota because
another container is over its own.

Prints, per rule and overall:
  RESULT false_incidents=<n> incidents          (target 0)
  RESULT missed_faults=<n> faults               (target 0)
  RESULT duplicate_incidents=<n> incidents      (target 0)
  RESULT detect_p95_s=<s> s                     (condition start to incident, simulated)
  RESULT neighbours_hurt=<n> slices             (target 0)
  RESULT neighbours_harmed=<n> slices           (by the agent's harm rule)
Then the preemption scenario (bench/_preemption.py), on a database of its own: one card at
ratio 2.0, full-price slices bursting within their quotas over the warning line, absorbed
by preempting interruptible slices only, newest first:
  RESULT preemption_guaranteed_hurt=<n> slices  (target 0)
  RESULT preemption_interruptible_preempted=<n> slices
  RESULT preemption_short_of_memory=<n> containers (target 0)
  RESULT preemption_billed_after_notice=<n> minutes (target 0)
Then preemption for room (bench/_preemption.py): interruptible slices fill an idle card
sold at its memory, and a full-price launch takes back the newest one's room with notice:
  RESULT preemption_interruptible_ran_idle=<n> slices (target: all launched, 3)
  RESULT preemption_fullprice_wait_s=<s> s baseline=<notice> ratio=<wait/notice>
                                     (queued to placed; target ratio <= 1)
Then the day against the node lab (bench/_agent_lab.py: real sshd, Docker Engine and
containers, the node agent enforcing): each round a statically linked job and a job with
zeroed quota-library books, each to be killed by the agent, and a job that lifts its own
limit (refused by the node's library: the honest control), each beside an honest
neighbour that keeps allocating inside its quota; and an honest MIG job using its whole
instance:
  RESULT lab_breach_to_kill_p95_ms=<ms> ms baseline=<ms> ratio=<r>
                                     (the agent's kill entries, killed_at - crossed_at;
                                      baseline: the 30 s watchdog's worst case, the
                                      sampling interval x (quota_grace_samples + 1))
  RESULT lab_missed_kills=<n> jobs              (target 0)
  RESULT lab_neighbour_short_s_max=<s> s        (target 2 s: the longest refusal of a
                                      neighbour's probes, or its NeighbourHarm rows)
  RESULT lab_neighbours_hurt=<n> slices         (NeighbourHarm rows: the agent's rule)
  RESULT lab_false_stops=<n> stops              (target 0: an honest slice, MIG included,
                                      stopped, killed or with a quota_breach)
Where the lab cannot start it says why and prints no lab RESULT line; under CI (any CI
but empty, false or 0) that fails the run.

    .venv/bin/python bench/watchdog_quality.py [--slices 300] [--hours 6] [--nodes 8]
                                               [--lab-rounds 2] [--no-lab] [--verbose]
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import logging
import random
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
from incidents import rules as watchdog_rules
from incidents import services as incident_services
from incidents import throttle
from incidents.models import Incident, IncidentEvent, SliceWatch, Thresholds
from nodes import services as node_services
from nodes import ssh
from nodes.agent import harm_on_card
from nodes.models import Allocation, Gpu, Node
from tenants import services
from tenants.models import Image, Slice, SliceTransition, Tenant, Tier

STEP_S = 30  # the sampling interval
SWEEP_S = 2 * STEP_S  # the minute's reconcile, sweep, metering and queue
SLACK_S = 2 * STEP_S  # what a rule may take beyond its own window: two sampling intervals
EPS_S = 1e-3

# What each rule is about: an incident is explained only by a fault on that same target.
RULE_TARGET = {
    "quota_breach": "slice",
    "process_jump": "slice",  # a process's jump, named by the slice that runs it
    "oom_exit": "slice",
    "idle_slice": "slice",
    "bandwidth_hog": "slice",
    "accounting_drift": "slice",
    "slow_leak": "slice",
    "orphan_process": "card",
    "unattributed_memory": "card",
    "hardware_fault": "card",
    "vram_high": "card",
    "vram_critical": "card",
    "fleet_sweep": "card",
    "node_unreachable": "node",
    "node_gate_failed": "node",
    "quota_not_effective": "node",
}
# Card alarms: the card's own reading against a line, whoever's memory it is.
CARD_ALARMS = ("vram_high", "vram_critical", "fleet_sweep")
RESERVE = "kept for the day's faults that need a quota library"
BYPASSES = ("env_control", "env_limit", "env_preload", "static")
# A job's own changes to its environment (the emulator's knobs for its setenv/unsetenv),
# each of which HAMi-core upstream obeys (HAMi#723).
BYPASS_FAULTS = {
    "fault_env_control": {"EMULATOR_PROCESS_ENV": "CUDA_DISABLE_CONTROL=true"},
    "fault_env_limit": {
        "EMULATOR_PROCESS_ENV": "CUDA_DEVICE_MEMORY_LIMIT=80g CUDA_DEVICE_MEMORY_LIMIT_0=80g"
    },
    "fault_env_preload": {"EMULATOR_PROCESS_UNSET": "LD_PRELOAD"},
}


def rule_windows(th: watchdog_rules.Thresholds, *, unreachable_after: int) -> dict[str, float]:
    """How long after its condition begins each rule may take to file its incident,
    from the rule's own thresholds (the matcher adds SLACK_S)."""
    return {
        # filed on the first sample over the quota (the stop comes quota_grace_samples on)
        "quota_breach": STEP_S,
        "process_jump": STEP_S,  # the sample after the jump
        "bandwidth_hog": STEP_S,
        "hardware_fault": STEP_S,
        "vram_high": STEP_S,
        "vram_critical": STEP_S,
        "accounting_drift": th.drift_samples * STEP_S,
        # the minute's reconcile finds the dead container; the sweep right after files it
        "oom_exit": SWEEP_S,
        "idle_slice": th.idle_after_s + SWEEP_S,
        # the sweeps judge each card's latest sample, once a minute
        "orphan_process": STEP_S + SWEEP_S,
        "unattributed_memory": STEP_S + SWEEP_S,
        "fleet_sweep": th.sweep_window_s + SWEEP_S,
        "slow_leak": th.leak_window_s + SWEEP_S,
        # that many failed samples in a row (a changed host key: the first), then the sweep
        "node_unreachable": unreachable_after * STEP_S + SWEEP_S,
    }


def alarm_lines(th: watchdog_rules.Thresholds) -> dict[str, float]:
    """Each card alarm's line, in percent of the card."""
    return {
        "vram_high": th.vram_warning_pct,
        "vram_critical": th.vram_critical_pct,
        "fleet_sweep": th.sweep_high_pct,
    }


@dataclass
class Fault:
    kind: str
    # the rules that may catch it, each with the seconds after `at` its condition begins
    rules: dict[str, float]
    primary: str  # the rule expected to catch it (missed without it, where `strict`)
    at: float = 0.0  # emulated epoch when the fault began
    after_start: float | None = None  # or: this long after its slice started (it may queue)
    slice_id: int | None = None
    gpu_id: int | None = None
    node_id: int | None = None
    memory_mb: int = 0  # a card fault's own memory on its card (no slice's)
    strict: bool = False  # only `primary` catches it: another of `rules` is not enough
    library: str = ""  # the node's quota library as its slice's job met it (emulator's)
    incidents: list[int] = field(default_factory=list)

    def onset(self, rule: str) -> float:
        return self.at + self.rules.get(rule, 0.0)


@dataclass(frozen=True)
class Filed:
    """An incident as the matcher reads it."""

    pk: int
    rule: str
    at: float  # first seen, emulated epoch
    slice_id: int | None = None
    gpu_id: int | None = None
    node_id: int | None = None
    title: str = ""

    @classmethod
    def of(cls, i: Incident) -> Filed:
        return cls(
            pk=i.pk,
            rule=i.rule,
            at=i.first_seen_at.timestamp(),
            slice_id=i.slice_id,
            gpu_id=i.gpu_id,
            node_id=i.node_id,
            title=i.title,
        )


@dataclass(frozen=True)
class CardSnapshot:
    """What one card really held at one moment (the emulator's truth, not the platform's
    samples of it)."""

    total_mb: int
    used_mb: int
    slices: dict[int, tuple[int, int]]  # slice id -> (MiB its container holds, its quota)


class CardLedger:
    """Every card's snapshots through the day, by GPU id."""

    def __init__(self) -> None:
        self._times: dict[int, list[float]] = defaultdict(list)
        self._snaps: dict[int, list[CardSnapshot]] = defaultdict(list)

    def record(self, gpu_id: int, t: float, snap: CardSnapshot) -> None:
        self._times[gpu_id].append(t)
        self._snaps[gpu_id].append(snap)

    def at(self, gpu_id: int, t: float) -> CardSnapshot | None:
        """The latest snapshot at or before `t`."""
        k = bisect.bisect_right(self._times[gpu_id], t + 1e-6)
        return self._snaps[gpu_id][k - 1] if k else None

    def between(self, gpu_id: int, start: float, end: float) -> list[CardSnapshot]:
        times = self._times[gpu_id]
        lo = bisect.bisect_left(times, start - 1e-6)
        hi = bisect.bisect_right(times, end + 1e-6)
        return self._snaps[gpu_id][lo:hi]


@dataclass
class Match:
    false: list[Filed]
    duplicates: list[Filed]  # each one beyond the first of its rule for its fault
    by_fault: dict[int, list[Filed]]  # index into the faults -> what it explains


class Matcher:
    """Which fault, if any, explains each incident (see the module's docstring)."""

    def __init__(
        self,
        faults: list[Fault],
        *,
        windows: dict[str, float],
        th: watchdog_rules.Thresholds,
        ledger: CardLedger | None = None,
        slice_gpu: dict[int, int] | None = None,
    ):
        self.faults = faults
        self.windows = windows
        self.th = th
        self.lines = alarm_lines(th)
        self.ledger = ledger or CardLedger()
        self.slice_gpu = slice_gpu or {}

    def explains(self, f: Fault, i: Filed) -> bool:
        if i.rule in CARD_ALARMS and i.rule not in f.rules:
            return self._fault_took_the_card_over(f, i)
        if i.rule not in f.rules:
            return False
        target = RULE_TARGET.get(i.rule)
        if target == "slice":
            same = f.slice_id is not None and i.slice_id == f.slice_id
        elif target == "card":
            same = f.gpu_id is not None and i.gpu_id == f.gpu_id
        elif target == "node":
            same = f.node_id is not None and i.node_id == f.node_id
        else:
            same = False
        onset = f.onset(i.rule)
        window = self.windows.get(i.rule, STEP_S)
        # the database keeps microseconds: an incident filed by the very sample that saw
        # the condition begin may read a hair before it
        return same and onset - EPS_S <= i.at <= onset + window + SLACK_S

    def _fault_took_the_card_over(self, f: Fault, i: Filed) -> bool:
        """A card alarm is the fault's only when the fault's own memory is what took the
        card over the alarm's line: the card really was over it, and would not have
        been without that memory (or, for the sweep, that memory rose by more than the
        sweep's rise within its window)."""
        gpu = f.gpu_id if f.slice_id is None else self.slice_gpu.get(f.slice_id)
        if gpu is None or i.gpu_id != gpu or i.at < f.at - EPS_S:
            return False
        snap = self.ledger.at(gpu, i.at)
        if snap is None:
            return False
        own = self._own_mb(f, snap)
        line = self.lines[i.rule] * snap.total_mb / 100
        if snap.used_mb >= line and snap.used_mb - own < line:
            return True
        if i.rule == "fleet_sweep":
            earlier = self.ledger.between(gpu, i.at - self.th.sweep_window_s, i.at)
            low = min((self._own_mb(f, s) for s in earlier), default=own)
            return own - low > self.th.sweep_rise_mb
        return False

    @staticmethod
    def _own_mb(f: Fault, snap: CardSnapshot) -> int:
        if f.slice_id is None:
            # a card fault's memory (an orphan, memory of no process) only while the card
            # still holds memory no slice does: once it is ended or freed it explains nothing
            of_slices = sum(used for used, _ in snap.slices.values())
            return min(f.memory_mb, max(0, snap.used_mb - of_slices))
        used, quota = snap.slices.get(f.slice_id, (0, 0))
        return max(0, used - quota)  # within its quota it was sold that memory

    def match(self, incidents: Iterable[Filed]) -> Match:
        false: list[Filed] = []
        by_fault: dict[int, list[Filed]] = defaultdict(list)
        for i in sorted(incidents, key=lambda i: (i.at, i.pk)):
            candidates = [k for k, f in enumerate(self.faults) if self.explains(f, i)]
            if not candidates:
                false.append(i)
                continue
            # the fault whose condition began last before it: the nearest cause
            k = max(candidates, key=lambda k: self.faults[k].onset(i.rule))
            by_fault[k].append(i)
        duplicates = []
        for explained in by_fault.values():
            seen: set[str] = set()
            for i in explained:
                if i.rule in seen:
                    duplicates.append(i)
                seen.add(i.rule)
        return Match(false=false, duplicates=duplicates, by_fault=dict(by_fault))

    def caught(self, f: Fault, explained: list[Filed]) -> Filed | None:
        """The incident that caught the fault: the first by its expected rule, else (where
        that is not `strict`) the first by another of its rules."""
        own = [i for i in explained if i.rule == f.primary]
        if not own and not f.strict:
            own = [i for i in explained if i.rule in f.rules and i.rule not in CARD_ALARMS]
        return min(own, key=lambda i: i.at) if own else None


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
    windows: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    short_of_memory: list[int] = field(default_factory=list)  # among `hurt`
    harmed: list[int] = field(default_factory=list)  # by the agent's rule (harm_on_card)

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
                f"(window {self.windows.get(rule, STEP_S):.0f} s + {SLACK_S} s)"
            )
        for rule, title in self.false:
            out.append(f"  false: {rule}: {title}")
        for kind in self.missed:
            out.append(f"  missed: {kind}")
        out += [f"  {note}" for note in self.notes]
        if self.short_of_memory:
            out.append(f"  short of memory: slices {self.short_of_memory}")
        if self.harmed:
            out.append(f"  harmed by the agent's rule: slices {self.harmed}")
        out += [
            f"RESULT false_incidents={len(self.false)} incidents",
            f"RESULT missed_faults={len(self.missed)} faults",
            f"RESULT duplicate_incidents={self.duplicates} incidents",
            f"RESULT detect_p95_s={p95:.0f} s",
            f"RESULT neighbours_hurt={len(self.hurt)} slices",
            f"RESULT neighbours_harmed={len(self.harmed)} slices",
        ]
        return out


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=20, method="inclusive")[18]


@contextmanager
def emulated_time(clock):
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
        self.ledger = CardLedger()
        self.short: set[str] = set()  # containers that ever held less than they wanted
        self.harmed: set[int] = set()  # slices harmed by the agent's rule, some step

    # -- the fleet and the tenants
    def setup(self, stack: ExitStack) -> None:
        settings.NODES_SSH_KEY_PATH = str(self.workdir / "id_ed25519")
        settings.NODES_CONTAINER_SETTLE_S = 0
        ssh.reset_pool()
        app.conf.task_always_eager = True
        app.conf.task_eager_propagates = False
        stack.callback(setattr, app.conf, "task_always_eager", False)
        # throttling pauses for real seconds; the emulated clock does not move meanwhile
        for name, value in (
            ("DUTY_PAUSE_S", 0.0),
            ("DUTY_RUN_S", 0.0),
            ("duty_cycles", lambda _interval: 1),
        ):
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
        User = get_user_model()
        self.ops = User.objects.create_user(
            username="ops@day.test", email="ops@day.test", password="x" * 20, is_staff=True
        )
        self.image = Image.objects.create(
            name="job", reference="x/job:1", ports=[], connect="service"
        )
        # the preflight's probe runs an image ops chose from the allowlist
        node_services.preflight_policy_update(
            actor=self.ops, reason="the day's probe image", probe_image=self.image.reference
        )
        self.nodes = []
        for emu in self.fleet.nodes:
            node = node_services.node_register(
                name=emu.name, address="127.0.0.1", port=emu.port, host_key=emu.host_key_line()
            )
            self.nodes.append(node_services.node_discover(node_id=node.pk))
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
        self.tiers = {t.vram_mb // 1024: t for t in Tier.objects.all()}
        # one card takes no slices: its orphan and its lost memory are nobody's
        self.spare = node_services.gpu_set_accepting(
            gpu=Gpu.objects.get(node=self.nodes[0], index=1),
            accepting=False,
            reason="kept for the day's card faults",
        )
        # and one under a quota library, for the faults that need one when the others
        # are full (a node that the day takes down for five minutes, never at that time)
        self.reserve = node_services.gpu_set_accepting(
            gpu=Gpu.objects.get(node=self.nodes[2], index=1), accepting=False, reason=RESERVE
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
        # the quota bypasses, drawn after the others so that those keep their times
        for kind in ("fault_env_control", "fault_env_limit", "fault_env_preload", "fault_static"):
            self.at(rng.uniform(0.05, 0.85) * self.day_s, kind)

    # -- acting
    def launch(self, gb: int, env: dict, *, member=None, guaranteed: bool = True, node=None):
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

    def fault_slice(self, kind: str, gb: int, env: dict, *, library: bool | None = None):
        """A slice for a fault, on a node with (or without) a quota library, alone on an
        emptyish card where possible. One that finds every card it may use full goes to
        the card kept for the day's faults, rather than queue for any card."""
        s = self._steered_launch(gb, env, library)
        # one that finds every card full (on a busy day the ordinary slices may hold them
        # all) would queue to the end and its fault never happen: it takes the kept card
        if library is not False and s is not None and s.state == "queued":
            services.slice_stop(slice=s, actor=s.created_by)
            node_services.gpu_set_accepting(gpu=self.reserve, accepting=True)
            try:
                s = self._steered_launch(gb, env, library)
            finally:
                node_services.gpu_set_accepting(
                    gpu=Gpu.objects.get(pk=self.reserve.pk), accepting=False, reason=RESERVE
                )
        if s is None or s.state not in ("provisioning", "running", "queued"):
            return None
        s.refresh_from_db()
        self.offenders.add(s.pk)
        return s

    def _steered_launch(self, gb: int, env: dict, library: bool | None):
        if library is None:
            return self.launch(gb, env, member=self.members[0])
        # steer it: drain the nodes of the other kind for the one launch
        other = [
            n.pk for n in self.nodes if bool(n.capabilities.get("vram_quota_library")) != library
        ]
        Node.objects.filter(pk__in=other, drained_at__isnull=True).update(status="draining")
        try:
            return self.launch(gb, env, member=self.members[0])
        finally:
            Node.objects.filter(pk__in=other, status="draining", drained_at__isnull=True).update(
                status="active"
            )

    def emu_of(self, gpu):
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
                self.note(Fault("leak", {"quota_breach": 0, "oom_exit": 0}, "quota_breach",
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
                rules = {"quota_breach": 0, "process_jump": 0, "oom_exit": 0}
                self.note(Fault("burst", rules, "quota_breach", after_start=450, slice_id=s.pk))
                self.at(now - self.start + 700, "stop", slice=s.pk)
        elif kind == "fault_oom":
            s = self.fault_slice(
                kind, 4, {"EMULATOR_PROFILE": "oom", "EMULATOR_MB": "2000",
                          "EMULATOR_RATE_MB_PER_MIN": "1000"}, library=True,
            )  # fmt: skip
            if s is not None:  # dies at its cap, (4096 - 2000) / 1000 minutes in
                self.note(Fault("oom", {"oom_exit": 0}, "oom_exit",
                                after_start=(4096 - 2000) * 60 / 1000, slice_id=s.pk))  # fmt: skip
        elif kind == "fault_idle":
            s = self.fault_slice(kind, 4, {"EMULATOR_PROFILE": "idle", "EMULATOR_MB": "1500"})
            if s is not None:  # no compute from its start: the rule waits idle_after_s
                self.note(Fault("idle", {"idle_slice": 0}, "idle_slice", after_start=0,
                                slice_id=s.pk))  # fmt: skip
        elif kind == "fault_orphan":
            gpu = self.spare
            pid = self.emu_of(gpu).add_gpu_process(gpu.index, 1500, container_id="e" * 64)
            self.note(Fault("orphan", {"orphan_process": 0}, "orphan_process", at=now,
                            gpu_id=gpu.pk, memory_mb=1500))  # fmt: skip
            self.at(now - self.start + 900, "kill_pid", gpu=gpu.pk, pid=pid)
        elif kind == "kill_pid":
            gpu = Gpu.objects.get(pk=data["gpu"])
            self.emu_of(gpu).kill_pid(data["pid"])
        elif kind == "fault_unattributed":
            gpu = self.spare
            if gpu is not None:
                self.emu_of(gpu).hold_memory(gpu.index, 2000)
                self.note(Fault("unattributed", {"unattributed_memory": 0}, "unattributed_memory",
                                at=now, gpu_id=gpu.pk, memory_mb=2000))  # fmt: skip
                self.at(now - self.start + 900, "release_memory", gpu=gpu.pk)
        elif kind == "release_memory":
            gpu = Gpu.objects.get(pk=data["gpu"])
            self.emu_of(gpu).hold_memory(gpu.index, 0)
        elif kind == "fault_xid":
            gpu = self.rng.choice(list(Gpu.objects.filter(present=True).order_by("pk")))
            self.emu_of(gpu).inject_xid(gpu=gpu.index, code=79)
            self.note(Fault("xid", {"hardware_fault": 0}, "hardware_fault", at=now,
                            gpu_id=gpu.pk))  # fmt: skip
        elif kind == "fault_bandwidth":
            s = self.fault_slice(
                kind,
                8,
                {"EMULATOR_MB": "2000", "EMULATOR_MEM_UTIL": "90", "EMULATOR_SM_UTIL": "70"},
            )
            if s is not None:
                self.note(Fault("bandwidth", {"bandwidth_hog": 0}, "bandwidth_hog",
                                after_start=0, slice_id=s.pk))  # fmt: skip
                self.at(now - self.start + 600, "stop", slice=s.pk)
        elif kind == "fault_down":
            node = self.nodes[2]
            self.fleet.node(node.name).set_down(True)
            self.note(Fault("down", {"node_unreachable": 0}, "node_unreachable", at=now,
                            node_id=node.pk))  # fmt: skip
            self.at(now - self.start + 300, "node_up", node=node.name)
        elif kind == "node_up":
            self.fleet.node(data["node"]).set_down(False)
        elif kind == "fault_hostkey":
            node = self.nodes[3]
            key = self.fleet.node(node.name).rotate_host_key()
            self.note(Fault("hostkey", {"node_unreachable": 0}, "node_unreachable", at=now,
                            node_id=node.pk))  # fmt: skip
            self.at(now - self.start + 600, "repin", node=node.pk, key=key)
        elif kind in BYPASS_FAULTS:
            # the job itself changes its environment before it starts CUDA (a setenv, a
            # shell inside the slice): no launch check can see it; the node's library
            # must refuse the allocation past the tier inside the container
            own = {"EMULATOR_PROFILE": "leak", "EMULATOR_MB": "3000",
                   "EMULATOR_RATE_MB_PER_MIN": "1000", **BYPASS_FAULTS[kind]}  # fmt: skip
            s = self.fault_slice(kind, 4, own, library=True)
            if s is not None:  # refused at its 4096 MiB, (4096 - 3000) / 1000 minutes in
                self.note(Fault(kind.removeprefix("fault_"), {"oom_exit": 0}, "oom_exit",
                                after_start=(4096 - 3000) * 60 / 1000, slice_id=s.pk,
                                strict=True))  # fmt: skip
        elif kind == "fault_static":
            # statically linked: no preload reaches it, so the library's books miss all of
            # what NVML sees from its start; past its tier (4096 MiB) 110 s in
            own = {"EMULATOR_PROFILE": "leak", "EMULATOR_MB": "3000",
                   "EMULATOR_RATE_MB_PER_MIN": "600", "EMULATOR_LINKAGE": "static"}  # fmt: skip
            s = self.fault_slice(kind, 4, own, library=True)
            if s is not None:
                rules = {"accounting_drift": 0, "quota_breach": (4096 - 3000) * 60 / 600}
                self.note(Fault("static", rules, "accounting_drift", after_start=0,
                                slice_id=s.pk, strict=True))  # fmt: skip
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
            self.observe()
            step += 1
            if step % 2 == 0:  # every minute: the sweep, reconcile, metering, the queue
                services.slices_reconcile()
                incident_services.watch_sweep()
                services.running_slices_meter()
                services.slices_dispatch_queue()
        return self.score()

    def observe(self) -> None:
        """What the emulated cards really hold now, as the platform has just sampled
        them: each card's memory and each slice's share of it with its quota; who holds
        less than its program wants; when each fault's slice really started."""
        t = self.fleet.clock.now()
        live = Allocation.objects.exclude(container_id="").filter(released_at__isnull=True)
        quota = dict(live.values_list("container_id", "vram_mb"))
        slice_of = dict(
            Slice.objects.filter(allocation__in=live).values_list("allocation__container_id", "pk")
        )
        gpus = dict(Gpu.objects.values_list("uuid", "pk"))
        for emu in self.fleet.nodes:
            held: dict[str, dict[int, tuple[int, int]]] = defaultdict(dict)
            for c in emu.containers:
                if c.status == "running" and c.gpu_uuid and c.id in slice_of:
                    held[c.gpu_uuid][slice_of[c.id]] = (c.used_mb, quota[c.id])
            used = emu.memory_used()
            for g in emu.gpus:
                if g.uuid in gpus:
                    snap = CardSnapshot(g.memory_total_mb, used[g.uuid], held[g.uuid])
                    self.ledger.record(gpus[g.uuid], t, snap)
                    self.harmed.update(harmed_on(snap))
            self.short.update(emu.short_of_memory())
        for f in self.faults:
            if f.after_start is not None and not f.at and f.slice_id is not None:
                cid = Slice.objects.filter(pk=f.slice_id).values_list("container_id", flat=True)
                info = self._container(cid.first() or "")
                if info is not None and info.started is not None:
                    f.at = info.started + f.after_start
                    f.library = info.library

    def _container(self, cid: str):
        for emu in self.fleet.nodes if cid else ():
            info = emu.container(cid)
            if info is not None:
                return info
        return None

    def matcher(self) -> Matcher:
        th = Thresholds.current().as_rules()
        windows = rule_windows(th, unreachable_after=settings.NODES_UNREACHABLE_AFTER)
        slice_gpu = dict(
            Slice.objects.filter(pk__in=[f.slice_id for f in self.faults if f.slice_id])
            .exclude(allocation__isnull=True)
            .values_list("pk", "allocation__gpu_id")
        )
        return Matcher(self.faults, windows=windows, th=th, ledger=self.ledger,
                       slice_gpu=slice_gpu)  # fmt: skip

    def score(self) -> Report:
        # a fault whose slice never started (it queued to the end) did not happen
        self.faults = [f for f in self.faults if f.at]
        matcher = self.matcher()
        incidents = [Filed.of(i) for i in Incident.objects.order_by("first_seen_at", "pk")]
        match = matcher.match(incidents)
        missed = []
        detect: dict[str, list[float]] = {}
        for k, f in enumerate(self.faults):
            explained = match.by_fault.get(k, [])
            f.incidents = [i.pk for i in explained]
            first = matcher.caught(f, explained)
            if first is None:
                missed.append(f"{f.kind} (by {f.primary})")
                continue
            detect.setdefault(first.rule, []).append(max(0.0, first.at - f.onset(first.rule)))
        notes = [
            f"{f.kind}: the quota library {f.library}; {self._beside(f, matcher)}"
            for f in self.faults
            if f.kind in BYPASSES
        ] + [self._stopped_by(f) for f in self.faults if f.kind == "static"]
        # neighbours hurt: an ordinary slice the watchdog stopped, throttled or failed, or
        # one whose container held less than its program wanted within its own caps
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
        short = set(
            Slice.objects.filter(pk__in=self.ordinary, container_id__in=self.short).values_list(
                "pk", flat=True
            )
        )
        hurt = sorted(stopped_by_watchdog | failed | throttled | short)
        return Report(
            false=[(i.rule, i.title) for i in match.false],
            missed=missed,
            duplicates=len(match.duplicates),
            detect_s=detect,
            hurt=hurt,
            slices=len(self.ordinary) + len(self.offenders),
            incidents=len(incidents),
            faults=len(self.faults),
            faults_seen=self.faults,
            windows=matcher.windows,
            notes=notes,
            short_of_memory=sorted(short),
            harmed=sorted(self.harmed),
        )

    def _beside(self, f: Fault, matcher: Matcher) -> str:
        """The slices that shared the fault's card while its slice ran, and whether any
        of them held less than it wanted."""
        gpu = matcher.slice_gpu.get(f.slice_id or 0)
        began = f.at - (f.after_start or 0.0)
        snaps = matcher.ledger.between(gpu, began, began + 600) if gpu else []
        around = {k for snap in snaps if f.slice_id in snap.slices for k in snap.slices} - {
            f.slice_id
        }
        short = Slice.objects.filter(pk__in=around, container_id__in=self.short).count()
        return f"{len(around)} neighbour(s) on its card, {short} short of memory"

    def _stopped_by(self, f: Fault) -> str:
        """Which rule's action stopped the fault's slice (the static job: the drift's)."""
        # the stop's own record on its incident: the slice's state when it was done
        stops = (
            IncidentEvent.objects.filter(incident__slice_id=f.slice_id, data__has_key="slice_state")
            .order_by("at", "pk")
            .values_list("incident__rule", flat=True)
        )
        first = stops.first()
        return f"{f.kind}: stopped by {first}" if first else f"{f.kind}: not stopped by a rule"


def harmed_on(snap: CardSnapshot) -> list[int]:
    """The slices on one card harmed now by the node agent's rule, judged on what the
    emulated card really holds."""
    held = {str(k): (quota, used) for k, (used, quota) in snap.slices.items()}
    return [int(k) for k in harm_on_card(held, snap.total_mb - snap.used_mb)]


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
    parser.add_argument(
        "--lab-rounds", type=int, default=2, help="rounds of the node lab's scenario"
    )
    parser.add_argument("--no-lab", action="store_true", help="skip the node lab's scenario")
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
    from _preemption import preemption_day  # noqa: PLC0415 - a scenario of its own, after the day

    with throwaway_database("watchdog_preemption"), tempfile.TemporaryDirectory() as tmp:
        pre = preemption_day(Path(tmp), emulated_time=emulated_time)
    for line in pre.lines():
        print(line)
    from _preemption import preemption_for_room_day  # noqa: PLC0415 - as above

    with throwaway_database("watchdog_for_room"), tempfile.TemporaryDirectory() as tmp:
        room = preemption_for_room_day(Path(tmp), emulated_time=emulated_time)
    for line in room.lines():
        print(line)
    if args.no_lab:
        return
    from _agent_lab import lab_main  # noqa: PLC0415 - a scenario of its own, after the day

    for line in lab_main(rounds=args.lab_rounds, database=throwaway_database):
        print(line)


if __name__ == "__main__":
    main()
