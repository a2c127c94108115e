"""The watchdog-quality day against the node lab (issue 34): real sshd, real Docker Engine,
real containers, only the GPU emulated; the node agent installed by discovery, as on any
node. bench/watchdog_quality.py runs it after the emulator day.

Two lab nodes: one A30 (24 GB) with the quota library, and one A100 80GB partitioned into
one 1g.10gb MIG instance. Each round:
- on the MIG node, an honest 8 GB slice that takes its whole instance (9,728 MiB, past its
  tier, within what the hardware gives it), running through the whole round;
- on the A30, one after the other, each beside an honest neighbour (8 GB; it holds
  1,000 MiB and asks for 6,000 MiB more every 100 ms, always inside its own quota, and
  says whether it got it: the probe):
  - a statically linked job (no loader, so no quota library) that takes 20,000 MiB;
  - a job whose quota-library books are zeroed: two processes of 7,000 MiB each;
  - a job that lifts its own limit (CUDA_DISABLE_CONTROL=true and its own
    CUDA_DEVICE_MEMORY_LIMIT=80g): the node's library is configured by the node, so it is
    refused at its quota. The honest control: it must be neither killed nor filed.
The first two must be killed by the agent; nothing else may be stopped or filed against.

Measured:
- breach to kill at the node: each kill entry's killed_at - crossed_at (the agent's own
  clock: the first reading over the quota to the kill);
- how long each neighbour was short: the longest run of its refused probes, from inside
  it, and the NeighbourHarm rows the platform filed from the agent's harm entries (their
  duration and the most MiB missing); a neighbour's figure is the longer of the two;
- neighbours hurt: slices with a NeighbourHarm row (the agent's rule,
  nodes.agent.harm_on_card);
- false stops: an honest slice (a neighbour, the job that lifts its own limit, the MIG
  job) that was stopped, lost its container, was killed by the agent or had a
  quota_breach incident.
"""

from __future__ import annotations

import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from emulator.catalog import GpuSpec
from gpuplatform.celery import app
from incidents.models import Incident, NeighbourHarm, Thresholds
from nodelab import (
    CONTAINER_NETWORK,
    IMAGE,
    PROBING_NEIGHBOUR,
    SSH_USER,
    Lab,
    LabNode,
    LabNodeSpec,
    LabUnavailable,
    longest_refusal,
    probe_readings,
)
from nodes import services as node_services
from nodes import ssh
from nodes.models import AgentEntry, AgentState, Node
from tenants import services
from tenants.models import Image, Membership, Slice, Tier
from tests.worker_harness import wait_for

TIER_GB = 8
QUOTA_MB = TIER_GB * 1024
INSTANCE_MB = 9728  # what the A100 80GB's 1g.10gb instance gives CUDA
A30 = LabNodeSpec("wq-a30", (GpuSpec("NVIDIA A30"),))
MIG = LabNodeSpec("wq-mig", (GpuSpec("NVIDIA A100-SXM4-80GB", mig=("1g.10gb",)),))
SPECS = (A30, MIG)
MODEL = {"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 2048}
NEIGHBOUR = PROBING_NEIGHBOUR
GREEDY = {
    "WORKLOAD_PROFILE": "steady",
    "WORKLOAD_MB": "20000",  # past the tier, and past what the card can give both
    "WORKLOAD_STEP_MB": "1000",
    "WORKLOAD_COOPERATIVE": "1",  # holds at a refusal instead of dying
}
# A job that ignores the framework cap the platform sets; the launch's courtesy check
# reads the command, not a value the shell runs later. It begins after the slice is
# running, as a job loads its model first.
EVAL = ["sh", "-c", 'eval "$JOB"']
UNCAPPED = "sleep 3; env -u GPUPLATFORM_VRAM_LIMIT_MB"
JOBS: dict[str, dict[str, str]] = {
    "static": {"JOB": f"{UNCAPPED} gpu-workload-static"},
    # the books are the container's to write (the library keeps them from inside): the
    # first process takes 7,000 MiB, the books are zeroed, a second one takes 7,000 more
    "books-zeroed": {
        "JOB": (
            f"({UNCAPPED} gpu-workload &); sleep 5; dd if=/dev/zero bs=1M count=2 "
            "conv=notrunc of=/run/vramquota/cudevshr.cache 2>/dev/null; "
            "exec env -u GPUPLATFORM_VRAM_LIMIT_MB gpu-workload"
        ),
        "WORKLOAD_MB": "7000",
    },
    # HAMi-core upstream obeys these (HAMi#723); the node's /overrideEnv overrides them
    "own-limit": {
        "JOB": (
            f"{UNCAPPED} CUDA_DISABLE_CONTROL=true CUDA_DEVICE_MEMORY_LIMIT=80g "
            "CUDA_DEVICE_MEMORY_LIMIT_0=80g gpu-workload"
        )
    },
}
OFFENDERS = ("static", "books-zeroed")
REFUSED_RE = re.compile(r"gpu-workload: allocation refused at (?P<mb>[0-9]+) MiB")
KILL_WAIT_S = 25.0  # the zeroed books' second process starts about 9 s in
HONEST_WATCH_S = 3.0  # after the library refused the control: six agent readings


def in_ci(environ: dict[str, str] | None = None) -> bool:
    """As the suite reads it (tests/ci.py): any CI but empty, false or 0."""
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() not in ("", "false", "0")


@dataclass
class Neighbour:
    beside: str  # the job it ran beside
    round: int
    slice_id: int
    refused_s: float  # the longest run of refused probes, from inside it
    probes: int
    still_refused: bool  # its last probe was refused
    harms: list[tuple[float, int]]  # its NeighbourHarm rows: (seconds, most MiB missing)

    @property
    def short_s(self) -> float:
        return max([self.refused_s, *(s for s, _ in self.harms)])


@dataclass
class LabReport:
    rounds: int
    baseline_ms: float  # the 30 s watchdog's worst case: interval x (grace + 1)
    kills_ms: list[float] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)  # offenders the agent did not kill
    neighbours: list[Neighbour] = field(default_factory=list)
    hurt: list[int] = field(default_factory=list)  # slices with a NeighbourHarm row
    false_stops: list[str] = field(default_factory=list)
    honest: int = 0  # honest slices checked (neighbours, own-limit jobs, MIG jobs)
    notes: list[str] = field(default_factory=list)

    @property
    def p95_ms(self) -> float:
        ks = sorted(self.kills_ms)
        if len(ks) < 2:
            return ks[0] if ks else 0.0
        return statistics.quantiles(ks, n=20, method="inclusive")[18]

    @property
    def short_s_max(self) -> float:
        return max((n.short_s for n in self.neighbours), default=0.0)

    def lines(self) -> list[str]:
        out = [
            f"lab: {self.rounds} round(s); {len(self.kills_ms)} kill(s) by the node agent, "
            f"{self.honest} honest slice(s) watched"
        ]
        out += [f"  {note}" for note in self.notes]
        for n in self.neighbours:
            harms = ", ".join(f"{s:.1f} s / {mb} MiB" for s, mb in n.harms) or "none"
            still = " (still refused at its last probe)" if n.still_refused else ""
            out.append(
                f"  neighbour of {n.beside} (round {n.round}, slice {n.slice_id}): "
                f"longest refusal {n.refused_s:.1f} s over {n.probes} probes{still}; "
                f"harm rows: {harms}"
            )
        out += [f"  missed: {m}" for m in self.missed]
        out += [f"  false stop: {f}" for f in self.false_stops]
        if self.kills_ms:
            out.append(
                f"RESULT lab_breach_to_kill_p95_ms={self.p95_ms:.0f} ms "
                f"baseline={self.baseline_ms:.0f} ratio={self.p95_ms / self.baseline_ms:.4f}"
            )
        out += [
            f"RESULT lab_missed_kills={len(self.missed)} jobs",
            f"RESULT lab_neighbour_short_s_max={self.short_s_max:.1f} s",
            f"RESULT lab_neighbours_hurt={len(self.hurt)} slices",
            f"RESULT lab_false_stops={len(self.false_stops)} stops",
        ]
        return out


def lab_main(*, rounds: int, database: Callable | None = None) -> list[str]:
    """Start the lab, run the rounds on a database of their own, stop the lab: the lines
    to print. Where the lab cannot start, the reason alone; under CI that ends the run."""
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        settings.NODES_SSH_KEY_PATH = str(Path(tmp) / "id_ed25519")
        ssh.reset_pool()
        stack.callback(ssh.reset_pool)
        public = ssh.public_key_line(ssh.get_pool().private_key)
        try:
            lab = Lab.start(list(SPECS), authorized_keys=[public])
        except LabUnavailable as exc:
            if in_ci():
                raise SystemExit(f"the node lab cannot start under CI: {exc}") from exc
            return [f"no lab run: the node lab cannot start here: {exc}"]
        stack.callback(_stop, lab)
        if database is not None:
            stack.enter_context(database("watchdog_lab"))
        # the preflight's probe runs an image ops chose from the allowlist
        node_services.preflight_policy_update(
            actor=ops_user(), reason="the lab day's probe image", probe_image=lab_image().reference
        )
        nodes = [register(n) for n in lab.nodes]
        return run_rounds(lab, nodes, rounds=rounds).lines()


def _stop(lab: Lab) -> None:
    left = lab.stop()
    if left:
        print(f"the lab left behind: {left}")


def ops_user():
    User = get_user_model()
    return User.objects.filter(is_staff=True).first() or User.objects.create_user(
        username="ops@lab.test", email="ops@lab.test", password="x" * 20, is_staff=True
    )


def lab_image() -> Image:
    """The lab's workload image (built on every lab node at start), on the allowlist."""
    return Image.objects.filter(reference=IMAGE).first() or Image.objects.create(
        name="lab workload", reference=IMAGE, ports=[], connect="service"
    )


def register(lab_node: LabNode) -> Node:
    node = node_services.node_register(
        name=lab_node.name,
        address="127.0.0.1",
        port=lab_node.port,
        ssh_user=SSH_USER,
        host_key=lab_node.host_key_line(),
        container_network=CONTAINER_NETWORK,
    )
    return node_services.node_discover(node_id=node.pk)


def run_rounds(lab: Lab, nodes: list[Node], *, rounds: int) -> LabReport:
    """The rounds on registered, discovered lab nodes (SPECS), on the database Django is
    set up with; Celery eager meanwhile, as the emulator day."""
    with ExitStack() as stack:
        for name, value in (("task_always_eager", True), ("task_eager_propagates", True)):
            stack.callback(setattr, app.conf, name, getattr(app.conf, name))
            setattr(app.conf, name, value)
        stack.callback(
            setattr, settings, "NODES_CONTAINER_SETTLE_S", settings.NODES_CONTAINER_SETTLE_S
        )
        settings.NODES_CONTAINER_SETTLE_S = 0.3  # a lab container's start, seen still running
        return Rounds(lab, nodes).run(rounds)


class Rounds:
    def __init__(self, lab: Lab, nodes: list[Node]):
        by_name = {n.name: n for n in nodes}
        self.lab = {n.name: n for n in lab.nodes}
        self.a30, self.mig = by_name[A30.name], by_name[MIG.name]
        th = Thresholds.current().as_rules()
        baseline = settings.NODES_SAMPLE_INTERVAL * (th.quota_grace_samples + 1) * 1000
        self.report = LabReport(rounds=0, baseline_ms=float(baseline))
        self.honest: list[tuple[str, Slice]] = []
        self.ops, self.image = ops_user(), lab_image()
        self.members = [self._member(i) for i in range(2)]

    def _member(self, i: int) -> Membership:
        m = services.tenant_sign_up(
            email=f"lab{i}@wq.test", password=f"lab-passphrase-{i}-long", tenant_name=f"Lab {i}"
        )
        services.credit_grant(tenant=m.tenant, amount="10000.00", actor=self.ops, memo="lab")
        return m

    def run(self, rounds: int) -> LabReport:
        for node in (self.a30, self.mig):
            node.refresh_from_db()
            if node.gate_status != "passed":
                raise SystemExit(f"{node.name} did not pass its preflight: {node.gate_reason}")
            state = node_services.node_agent_check(node_id=node.pk).state
            if state != AgentState.OK:
                raise SystemExit(f"the node agent on {node.name} is {state} after discovery")
        for r in range(1, rounds + 1):
            self.round(r)
            self.report.rounds = r
        report = self.report
        report.honest = len(self.honest)
        report.hurt = sorted(
            set(NeighbourHarm.objects.exclude(slice=None).values_list("slice_id", flat=True))
        )
        return report

    # -- launching
    def launch(self, member: Membership, node: Node, env: dict[str, str], **kw) -> Slice:
        tier = Tier.objects.get(vram_mb=QUOTA_MB)
        purchase, _ = services.purchase_create(membership=member, tier=tier, hours=1)
        with only(node):
            s, _ = services.slice_launch(
                membership=member,
                purchase=purchase,
                image=self.image,
                model_request=MODEL,
                environment=env,
                **kw,
            )
        s.refresh_from_db()
        if s.state != Slice.State.RUNNING:
            raise SystemExit(f"a lab slice did not start ({s.state}): {s.state_reason}")
        return s

    def stop(self, s: Slice) -> None:
        s.refresh_from_db()
        if not s.is_final:
            services.slice_stop(slice=s, actor=self.ops, reason="the round is over", force=True)

    # -- a round
    def round(self, r: int) -> None:
        mig_lab = self.lab[self.mig.name]
        # not cooperative: it ignores the framework cap and takes what CUDA gives
        mig_job = self.launch(
            self.members[0],
            self.mig,
            {"WORKLOAD_MB": str(INSTANCE_MB), "WORKLOAD_STEP_MB": "512",
             "WORKLOAD_COOPERATIVE": "0"},
        )  # fmt: skip
        if not wait_for(lambda: held_mb(mig_lab, mig_job) >= INSTANCE_MB, timeout=15):
            self.report.notes.append(
                f"round {r}: the MIG job held {held_mb(mig_lab, mig_job)} MiB, "
                f"not its instance's {INSTANCE_MB}"
            )
        for kind in JOBS:
            self.beside(r, kind)
            node_services.nodes_sample(node_ids=[self.mig.pk])  # the 30 s watchdog, too
        self.judge_honest(f"the MIG job (round {r})", mig_job, mig_lab, self.mig)
        self.stop(mig_job)

    def beside(self, r: int, kind: str) -> None:
        lab = self.lab[self.a30.name]
        neighbour = self.launch(self.members[0], self.a30, NEIGHBOUR)
        wait_for(lambda: len(probes(lab, neighbour)) > 5, timeout=10)
        env = {**GREEDY, **JOBS[kind]}
        job = self.launch(self.members[1], self.a30, env, command=EVAL)
        if kind in OFFENDERS:
            self.expect_kill(r, kind, job)
        else:
            self.expect_refusal(r, kind, job, lab)
        time.sleep(1.0)  # probes after the kill: the neighbour has its memory again
        self.harms_ended(neighbour)
        node_services.nodes_sample(node_ids=[self.a30.pk])  # the 30 s watchdog, too
        readings = probes(lab, neighbour)
        refused_s, still = longest_refusal(readings)
        # one still open when the round moves on counts until now
        harms = [
            (((h.ended_at or timezone.now()) - h.started_at).total_seconds(), h.short_mb)
            for h in NeighbourHarm.objects.filter(slice=neighbour).order_by("started_at")
        ]
        self.report.neighbours.append(
            Neighbour(kind, r, neighbour.pk, refused_s, len(readings), still, harms)
        )
        self.judge_honest(f"the neighbour of {kind} (round {r})", neighbour, lab, self.a30)
        if kind not in OFFENDERS:
            self.judge_honest(f"{kind} (round {r})", job, lab, self.a30)
        self.stop(job)
        self.stop(neighbour)

    def expect_kill(self, r: int, kind: str, job: Slice) -> None:
        def found() -> AgentEntry | None:
            node_services.node_agent_check(node_id=self.a30.pk)
            return AgentEntry.objects.filter(
                node=self.a30, kind=AgentEntry.Kind.KILL, container_id=job.container_id
            ).first()

        entry = wait_for(found, timeout=KILL_WAIT_S, interval=0.5)
        if entry is None:
            self.report.missed.append(f"{kind} (round {r}, slice {job.pk}): no kill entry")
            return
        e = entry.payload
        self.report.kills_ms.append(seconds(e["crossed_at"], e["killed_at"]) * 1000)
        self.report.notes.append(
            f"{kind} (round {r}): {e['used_mb']} MiB of a {e['quota_mb']} MiB quota, killed "
            f"by {e['method']} {seconds(e['crossed_at'], e['killed_at']) * 1000:.0f} ms after "
            "it crossed"
        )
        job.refresh_from_db()
        if not job.is_final:
            self.report.notes.append(f"{kind} (round {r}): its slice was not stopped")

    def expect_refusal(self, r: int, kind: str, job: Slice, lab: LabNode) -> None:
        """The control: the library refuses it at its quota; then a few more readings."""
        refused = wait_for(lambda: REFUSED_RE.search(lab.logs(job.container_id)), timeout=15)
        if refused:
            self.report.notes.append(
                f"{kind} (round {r}): refused by the quota library at {refused['mb']} MiB"
            )
        else:
            self.report.notes.append(f"{kind} (round {r}): never refused by the quota library")
        time.sleep(HONEST_WATCH_S)
        node_services.node_agent_check(node_id=self.a30.pk)

    def harms_ended(self, neighbour: Slice) -> None:
        def ended() -> bool:
            node_services.node_agent_check(node_id=self.a30.pk)
            return not NeighbourHarm.objects.filter(slice=neighbour, ended_at=None).exists()

        wait_for(ended, timeout=10, interval=0.5)

    def judge_honest(self, what: str, s: Slice, lab: LabNode, node: Node) -> None:
        """An honest slice must still run, hold its container, and have nothing against it."""
        self.honest.append((what, s))
        node_services.node_agent_check(node_id=node.pk)
        s.refresh_from_db()
        info = lab.container(s.container_id) if s.container_id else None
        why = []
        if s.state != Slice.State.RUNNING:
            why.append(f"{s.state}: {s.state_reason}")
        if info is None or not info.running:
            why.append("its container is not running")
        if AgentEntry.objects.filter(
            kind=AgentEntry.Kind.KILL, container_id=s.container_id
        ).exists():
            why.append("killed by the node agent")
        filed = Incident.objects.filter(slice=s, rule__in=("quota_breach", "accounting_drift"))
        why += [f"{i.rule}: {i.title}" for i in filed]
        if why:
            self.report.false_stops.append(f"{what}, slice {s.pk}: {'; '.join(why)}")


@contextmanager
def only(node: Node):
    """Placement sees this node alone for one launch: the others drain meanwhile."""
    other = list(Node.objects.exclude(pk=node.pk).filter(drained_at__isnull=True))
    ids = [n.pk for n in other if n.status == Node.Status.ACTIVE]
    Node.objects.filter(pk__in=ids).update(status=Node.Status.DRAINING)
    try:
        yield
    finally:
        Node.objects.filter(pk__in=ids, status=Node.Status.DRAINING).update(
            status=Node.Status.ACTIVE
        )


def held_mb(lab: LabNode, s: Slice) -> int:
    return sum(p["used"] for p in lab.gpu_processes(s.container_id)) >> 20


def probes(lab: LabNode, s: Slice) -> list[tuple[float, bool]]:
    return probe_readings(lab.logs(s.container_id))


def seconds(a: str, b: str) -> float:
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()
