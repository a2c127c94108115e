"""GPU nodes, their GPUs, VRAM allocations and telemetry samples.

`nodes` knows nothing of tenants: an allocation carries an opaque owner key.
"""

from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from .placement import Candidate
from .preflight import TOOLKIT_MINIMUM


class GateStatus(models.TextChoices):
    UNCHECKED = "unchecked", "not checked yet"
    PASSED = "passed", "passed"
    FAILED = "failed", "failed"


class Node(models.Model):
    GateStatus = GateStatus

    class Status(models.TextChoices):
        PENDING = "pending", "pending host-key approval"
        ACTIVE = "active", "active"
        DRAINING = "draining", "draining"
        UNREACHABLE = "unreachable", "unreachable"

    name = models.SlugField("name", max_length=64, unique=True)
    address = models.CharField("address", max_length=255, help_text="Host name or IP address.")
    port = models.PositiveIntegerField("SSH port", default=22)
    ssh_user = models.CharField("SSH user", max_length=64, default="gpuplatform")
    container_network = models.CharField(
        "container network",
        max_length=64,
        default="bridge",
        help_text="The Docker network slices join (`docker run --network`). `bridge` "
        "publishes their ports on the node; `none` keeps them on their own loopback "
        "(no published ports: reach them another way).",
    )

    class Access(models.TextChoices):
        GATEWAY = "gateway", "through the platform's SSH gateway (nothing published)"
        DIRECT = "direct", "published ports on the node's address"

    access = models.CharField(
        "how renters reach its slices",
        max_length=16,
        choices=Access.choices,
        default=Access.GATEWAY,
        help_text="gateway: no port is published on the node, renters go through the "
        "platform's SSH gateway; direct: the slices' ports are published on the node's "
        "address (a random host port each, reachable by anyone who reaches the node).",
    )
    host_key = models.TextField(
        "pinned host key",
        blank=True,
        help_text="The node's SSH host public key (known_hosts format), approved by ops.",
    )
    host_key_fingerprint = models.CharField("host-key fingerprint", max_length=128, blank=True)
    pending_host_key = models.TextField(
        "host key awaiting approval",
        blank=True,
        help_text="Read from the node at first contact; used only after ops approve it.",
    )
    status = models.CharField(
        "status", max_length=16, choices=Status.choices, default=Status.PENDING
    )
    status_reason = models.CharField("status reason", max_length=500, blank=True)
    capabilities = models.JSONField(
        "enforcement capabilities",
        default=dict,
        blank=True,
        help_text="What the node can enforce: nvidia runtime, MIG, software VRAM quota.",
    )
    driver_version = models.CharField("driver version", max_length=32, blank=True)
    cuda_version = models.CharField("CUDA version", max_length=32, blank=True)
    consecutive_failures = models.PositiveSmallIntegerField("consecutive failed samples", default=0)
    last_seen_at = models.DateTimeField("last seen", null=True, blank=True)
    last_error = models.CharField("last error", max_length=500, blank=True)
    last_error_at = models.DateTimeField("last error at", null=True, blank=True)
    discovered_at = models.DateTimeField("last discovery", null=True, blank=True)
    drained_at = models.DateTimeField(
        "drained", null=True, blank=True, help_text="Set while ops keep new placements off."
    )
    drain_reason = models.CharField("drain reason", max_length=500, blank=True)
    sample_source = models.CharField(
        "telemetry source", max_length=16, blank=True, help_text="nvml or nvidia-smi"
    )
    created_at = models.DateTimeField("created", auto_now_add=True)
    # The preflight gate (nodes.preflight): a node takes placements only once it passed.
    gate_status = models.CharField(
        "preflight gate", max_length=16, choices=GateStatus.choices, default=GateStatus.UNCHECKED
    )
    gate_reason = models.CharField("why the gate holds it", max_length=1000, blank=True)
    gate_checked_at = models.DateTimeField("last preflight", null=True, blank=True)
    preflight = models.JSONField(
        "preflight result",
        default=dict,
        blank=True,
        help_text="What the last preflight read (versions), its checks and its probes.",
    )
    images = models.JSONField(
        "images held",
        default=list,
        blank=True,
        help_text="The image references the node's Docker Engine holds (repo:tag and "
        "repo@digest), from `docker image ls` at the last preflight or reconcile.",
    )
    images_read_at = models.DateTimeField("images read", null=True, blank=True)
    watchdog_only_accepted_at = models.DateTimeField(
        "watchdog-only enforcement accepted", null=True, blank=True
    )
    watchdog_only_accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="accepted by",
    )
    watchdog_only_reason = models.CharField(
        "why watchdog-only enforcement is accepted", max_length=500, blank=True
    )

    class Meta:
        ordering = ["name"]
        verbose_name = "node"
        constraints = [
            models.CheckConstraint(
                condition=Q(access__in=["gateway", "direct"]),
                name="%(app_label)s_%(class)s_access_known",
                violation_error_message="A node is reached through the gateway or directly.",
            ),
            models.CheckConstraint(
                condition=Q(port__gte=1) & Q(port__lte=65535),
                name="%(app_label)s_%(class)s_port_range",
                violation_error_message="The SSH port must be between 1 and 65535.",
            ),
            models.UniqueConstraint(
                fields=["address", "port"],
                name="%(app_label)s_%(class)s_unique_endpoint",
                violation_error_message="A node with this address and port is already registered.",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def reachable_status(self) -> str:
        """The status a node returns to once it answers again: ops' drain still holds."""
        return self.Status.DRAINING if self.drained_at else self.Status.ACTIVE

    def absence_reason(self, now: datetime) -> str:
        """'unreachable for N minutes' for a node unreachable since longer than the setting
        (away: since it last answered), '' otherwise."""
        if self.status != self.Status.UNREACHABLE or self.last_seen_at is None:
            return ""
        away = now - self.last_seen_at
        if away <= timedelta(minutes=settings.NODES_REJUDGE_AFTER_ABSENCE_MINUTES):
            return ""
        return f"unreachable for {int(away.total_seconds() // 60)} minutes"


# A node whose agent is absent, old or not answering takes no new slices (a node not yet
# reached is the preflight gate's to hold). The agent's models are at the end of the file.
AGENT_BLOCKS = ("absent", "old", "silent")


class GpuQuerySet(models.QuerySet):
    def taking_placements(self) -> "GpuQuerySet":
        """GPUs a new reservation may land on: present, accepting, on an active, undrained
        node that passed the preflight gate (placement and the tier catalog share it)."""
        return self.filter(
            present=True,
            accepting_placements=True,
            node__status=Node.Status.ACTIVE,
            node__drained_at__isnull=True,
            node__gate_status=GateStatus.PASSED,
        ).exclude(node__agent__state__in=AGENT_BLOCKS)


class Gpu(models.Model):
    node = models.ForeignKey(
        "nodes.Node", on_delete=models.CASCADE, related_name="gpus", verbose_name="node"
    )
    uuid = models.CharField("GPU UUID", max_length=96, unique=True)
    index = models.PositiveSmallIntegerField("index")
    model = models.CharField("model", max_length=128)
    vram_total_mb = models.PositiveIntegerField("total VRAM (MiB)")
    mig_capable = models.BooleanField("MIG capable", default=False)
    mig_enabled = models.BooleanField("MIG mode on", default=False)
    overcommit_ratio = models.DecimalField(
        "overcommit ratio",
        max_digits=4,
        decimal_places=2,
        default=Decimal("1.00"),
        help_text="Allocatable VRAM = total x ratio. Above 1.0 only from measured peaks.",
    )
    accepting_placements = models.BooleanField("accepting placements", default=True)
    whole_card_only = models.BooleanField(
        "sold whole only",
        default=False,
        help_text="No proven VRAM quota on this card (not MIG): one slice of the whole card.",
    )
    # Kept equal to the sum of live allocations, under this row's lock: placement then
    # reads one row per GPU instead of aggregating every allocation on every launch.
    allocated_mb = models.PositiveIntegerField("allocated VRAM (MiB)", default=0)
    not_accepting_reason = models.CharField("why not accepting", max_length=500, blank=True)
    present = models.BooleanField(
        "present", default=True, help_text="False when rediscovery no longer finds this GPU."
    )
    pci_bus_id = models.CharField("PCI bus ID", max_length=32, blank=True)
    mig_devices = models.JSONField("MIG devices", default=list, blank=True)
    discovered_at = models.DateTimeField("discovered", auto_now_add=True)
    # The latest reading, kept on the row so the fleet view needs no time-series scan.
    last_memory_used_mb = models.PositiveIntegerField("VRAM used (MiB)", null=True, blank=True)
    last_utilization_gpu = models.PositiveSmallIntegerField(
        "utilization (%)", null=True, blank=True
    )
    last_utilization_memory = models.PositiveSmallIntegerField(
        "memory-bandwidth utilization (%)", null=True, blank=True
    )
    last_temperature_c = models.SmallIntegerField("temperature (°C)", null=True, blank=True)
    last_power_w = models.FloatField("power (W)", null=True, blank=True)
    last_processes_mb = models.PositiveIntegerField(
        "VRAM held by processes (MiB)",
        null=True,
        blank=True,
        help_text="Every process on the card, of a slice or not: placement counts it.",
    )
    last_sample_at = models.DateTimeField("last sample", null=True, blank=True)

    objects = GpuQuerySet.as_manager()

    class Meta:
        ordering = ["node__name", "index"]
        verbose_name = "GPU"
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"],
                condition=Q(present=True),
                name="%(app_label)s_%(class)s_unique_index_per_node",
                violation_error_message="Two present GPUs cannot share an index on one node.",
            ),
            models.CheckConstraint(
                condition=Q(overcommit_ratio__gte=Decimal("1.00"))
                & Q(overcommit_ratio__lte=Decimal("4.00")),
                name="%(app_label)s_%(class)s_overcommit_ratio_range",
                violation_error_message="The overcommit ratio must be between 1.00 and 4.00.",
            ),
            models.CheckConstraint(
                condition=Q(vram_total_mb__gt=0),
                name="%(app_label)s_%(class)s_vram_positive",
                violation_error_message="A GPU must have some VRAM.",
            ),
            models.CheckConstraint(
                condition=Q(mig_enabled=False) | Q(mig_capable=True),
                name="%(app_label)s_%(class)s_mig_needs_capable",
                violation_error_message="MIG mode can only be on for a MIG-capable GPU.",
            ),
            models.CheckConstraint(
                # A backstop for placement's exact rule, which sells a card by its nominal
                # size (nominal <= reported / 0.98: see placement.nominal_mb).
                condition=Q(
                    allocated_mb__lte=F("vram_total_mb") * F("overcommit_ratio") * Decimal("1.021")
                ),
                name="%(app_label)s_%(class)s_allocated_within_capacity",
                violation_error_message="Allocated VRAM cannot exceed total x overcommit ratio.",
            ),
            models.CheckConstraint(
                condition=Q(mig_enabled=False) | Q(overcommit_ratio=Decimal("1.00")),
                name="%(app_label)s_%(class)s_no_overcommit_with_mig",
                violation_error_message="MIG partitions and overcommit exclude each other.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index} ({self.model})"

    @property
    def label(self) -> str:
        """How pages, incidents and messages name the card: "gpu-host-1 GPU 3" (its node
        must be loaded with it, or this costs a query)."""
        return f"{self.node.name} GPU {self.index}"

    @property
    def capacity_mb(self) -> int:
        """What placement may sell on the card: its nominal size times its overcommit ratio
        (placement.Candidate's rule, for this row)."""
        return Candidate(
            gpu_id=self.pk,
            total_mb=self.vram_total_mb,
            allocated_mb=self.allocated_mb,
            overcommit_ratio=self.overcommit_ratio,
        ).capacity_mb

    @property
    def held_mb(self) -> int:
        """What the card holds for placement: what was sold on it, or what its processes hold
        when that is more (nodes.placement_sql.ROOM_SQL's rule, for one row)."""
        return max(self.allocated_mb, self.last_processes_mb or 0)


class Allocation(models.Model):
    class State(models.TextChoices):
        RESERVED = "reserved", "reserved"
        ACTIVE = "active", "active"
        RELEASED = "released", "released"

    gpu = models.ForeignKey(
        "nodes.Gpu", on_delete=models.PROTECT, related_name="allocations", verbose_name="GPU"
    )
    vram_mb = models.PositiveIntegerField("VRAM (MiB)")
    owner_key = models.CharField(
        "owner key", max_length=128, help_text="Opaque key of whoever holds this VRAM."
    )
    mig_device_uuid = models.CharField("MIG device UUID", max_length=96, blank=True)
    container_id = models.CharField("container ID", max_length=128, blank=True)
    guaranteed = models.BooleanField(
        "guaranteed",
        default=True,
        help_text="Never placed on, nor left on, an overcommitted GPU.",
    )
    interruptible = models.BooleanField(
        "interruptible",
        default=False,
        help_text="Sold at a discount on an overcommitted GPU: given up first when the card "
        "runs short.",
    )
    state = models.CharField("state", max_length=16, choices=State.choices, default=State.RESERVED)
    created_at = models.DateTimeField("created", auto_now_add=True)
    released_at = models.DateTimeField("released", null=True, blank=True)
    preempted_at = models.DateTimeField(
        "preempted",
        null=True,
        blank=True,
        help_text="When the watchdog took it back because its card reached the warning line.",
    )
    # Two counts of what its container holds, from the latest sample of its node: NVML's
    # (its processes) and the node's quota library's books, which miss what the library
    # does not intercept. Null: not known (no sample yet, no library on the node).
    nvml_mb = models.PositiveIntegerField("VRAM held, by NVML (MiB)", null=True, blank=True)
    library_mb = models.PositiveIntegerField(
        "VRAM held, by the quota library (MiB)", null=True, blank=True
    )
    counted_at = models.DateTimeField("counted", null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "VRAM allocation"
        indexes = [models.Index(fields=["gpu", "state"], name="nodes_alloc_gpu_state_idx")]
        constraints = [
            models.CheckConstraint(
                condition=Q(vram_mb__gt=0),
                name="%(app_label)s_%(class)s_vram_positive",
                violation_error_message="An allocation must reserve some VRAM.",
            ),
            models.UniqueConstraint(
                fields=["owner_key"],
                condition=~Q(state="released"),
                name="%(app_label)s_%(class)s_one_live_per_owner",
                violation_error_message="This owner already holds a live allocation.",
            ),
            models.CheckConstraint(
                condition=Q(state="released", released_at__isnull=False)
                | (~Q(state="released") & Q(released_at__isnull=True)),
                name="%(app_label)s_%(class)s_released_at_iff_released",
                violation_error_message="Only a released allocation has a release time.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.vram_mb} MiB on {self.gpu_id} for {self.owner_key}"


class GpuSample(models.Model):
    """One reading of one GPU. Bulk-inserted (COPY); kept raw for the retention (48 h by
    default), rolled up to five minutes first. Time-partitioned on PostgreSQL
    (nodes/partitions.py)."""

    # no index of its own: nodes_gpusample_gpu_time_idx leads with the GPU (one index
    # fewer to keep up on the hottest insert path)
    gpu = models.ForeignKey(
        "nodes.Gpu",
        on_delete=models.CASCADE,
        related_name="samples",
        verbose_name="GPU",
        db_index=False,
    )
    taken_at = models.DateTimeField("taken at")
    memory_used_mb = models.PositiveIntegerField("memory used (MiB)")
    memory_total_mb = models.PositiveIntegerField("memory total (MiB)")
    utilization_gpu = models.PositiveSmallIntegerField("GPU utilization (%)", null=True)
    utilization_memory = models.PositiveSmallIntegerField("memory utilization (%)", null=True)
    temperature_c = models.SmallIntegerField("temperature (°C)", null=True)
    power_w = models.FloatField("power (W)", null=True)

    class Meta:
        ordering = ["-taken_at"]
        verbose_name = "GPU sample"
        indexes = [models.Index(fields=["gpu", "-taken_at"], name="nodes_gpusample_gpu_time_idx")]
        constraints = [
            models.CheckConstraint(
                condition=Q(memory_used_mb__lte=F("memory_total_mb")),
                name="%(app_label)s_%(class)s_used_within_total",
                violation_error_message="Used memory cannot exceed total memory.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id} @ {self.taken_at:%Y-%m-%d %H:%M:%S}: {self.memory_used_mb} MiB"


class ProcessSample(models.Model):
    """One reading of one GPU process, with the container it runs in. Kept raw as long
    as the GPU samples, time-partitioned alike."""

    gpu = models.ForeignKey(
        "nodes.Gpu",
        on_delete=models.CASCADE,
        related_name="process_samples",
        verbose_name="GPU",
        db_index=False,  # nodes_procsample_gpu_time_idx leads with it
    )
    taken_at = models.DateTimeField("taken at")
    pid = models.PositiveIntegerField("PID")
    used_memory_mb = models.PositiveIntegerField("used memory (MiB)")
    container_id = models.CharField("container ID", max_length=128, blank=True)
    sm_utilization = models.PositiveSmallIntegerField("SM utilization (%)", null=True)
    memory_utilization = models.PositiveSmallIntegerField("memory utilization (%)", null=True)

    class Meta:
        ordering = ["-taken_at"]
        verbose_name = "process sample"
        indexes = [
            models.Index(fields=["gpu", "-taken_at"], name="nodes_procsample_gpu_time_idx"),
            # the watchdog's per-slice windows (leaks, idle) and the slice's VRAM chart
            models.Index(
                fields=["container_id", "-taken_at"], name="nodes_procsample_cont_time_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.gpu_id}: {self.used_memory_mb} MiB"


class GpuSampleRollup(models.Model):
    """Five-minute max and mean of a GPU's samples, kept 30 days for capacity planning;
    on PostgreSQL partitioned by day, so retention drops a day at a time."""

    gpu = models.ForeignKey(
        "nodes.Gpu",
        on_delete=models.CASCADE,
        related_name="rollups",
        verbose_name="GPU",
        db_index=False,  # the one-per-bucket key leads with it
    )
    bucket_start = models.DateTimeField("bucket start")
    samples = models.PositiveIntegerField("samples")
    memory_total_mb = models.PositiveIntegerField("memory total (MiB)")
    memory_used_max_mb = models.PositiveIntegerField("memory used, max (MiB)")
    memory_used_mean_mb = models.FloatField("memory used, mean (MiB)")
    utilization_gpu_max = models.PositiveSmallIntegerField("utilization, max (%)", null=True)
    utilization_gpu_mean = models.FloatField("utilization, mean (%)", null=True)

    class Meta:
        ordering = ["-bucket_start"]
        verbose_name = "GPU sample rollup"
        constraints = [
            models.UniqueConstraint(
                fields=["gpu", "bucket_start"],
                name="%(app_label)s_%(class)s_one_per_bucket",
                violation_error_message="This GPU already has a rollup for that bucket.",
            ),
            models.CheckConstraint(
                condition=Q(samples__gt=0),
                name="%(app_label)s_%(class)s_samples_positive",
                violation_error_message="A rollup summarises at least one sample.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id} @ {self.bucket_start:%Y-%m-%d %H:%M}"


class GpuDayRollup(models.Model):
    """A GPU's highest VRAM use in one UTC day, folded from its five-minute rollups: what
    the overcommit advisor reads (30 rows per GPU where the rollups hold 8,640)."""

    gpu = models.ForeignKey(
        "nodes.Gpu", on_delete=models.CASCADE, related_name="day_rollups", verbose_name="GPU"
    )
    day = models.DateField("day (UTC)")
    memory_total_mb = models.PositiveIntegerField("memory total (MiB)")
    memory_used_max_mb = models.PositiveIntegerField("memory used, max (MiB)")
    first_bucket_start = models.DateTimeField("first bucket")
    last_bucket_start = models.DateTimeField("last bucket")

    class Meta:
        ordering = ["-day"]
        verbose_name = "GPU day rollup"
        constraints = [
            models.UniqueConstraint(
                fields=["gpu", "day"],
                name="%(app_label)s_%(class)s_one_per_day",
                violation_error_message="This GPU already has a rollup for that day.",
            ),
            models.CheckConstraint(
                condition=Q(first_bucket_start__lte=F("last_bucket_start")),
                name="%(app_label)s_%(class)s_buckets_in_order",
                violation_error_message="The first bucket cannot be after the last.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id} on {self.day}"


class RollupProgress(models.Model):
    """How far the raw samples have been rolled up: the next run starts here (minus one
    bucket, for rows committed late), and raw rows are pruned only behind it."""

    series = models.CharField("series", max_length=32, unique=True)
    rolled_through = models.DateTimeField("rolled up through")

    class Meta:
        verbose_name = "rollup progress"
        verbose_name_plural = "rollup progress"

    def __str__(self) -> str:
        return f"{self.series} through {self.rolled_through:%Y-%m-%d %H:%M}"


class ContainerEvent(models.Model):
    """What the platform did to a container on its own: orphans stopped by reconcile."""

    node = models.ForeignKey(
        "nodes.Node", on_delete=models.CASCADE, related_name="container_events", verbose_name="node"
    )
    container_id = models.CharField("container ID", max_length=128)
    owner_key = models.CharField("owner key", max_length=128, blank=True)
    action = models.CharField("action", max_length=32)
    detail = models.CharField("detail", max_length=500, blank=True)
    at = models.DateTimeField("at", auto_now_add=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name = "container event"

    def __str__(self) -> str:
        return f"{self.action} {self.container_id[:12]} on {self.node_id}"


def _default_branches() -> list[str]:
    return list(DEFAULT_DRIVER_BRANCHES)


def _default_known_fixed() -> list[dict[str, str]]:
    return [dict(k) for k in DEFAULT_KNOWN_FIXED]


def _default_probe_command() -> list[str]:
    return list(DEFAULT_PROBE_COMMAND)


def _default_probe_env() -> dict[str, str]:
    return dict(DEFAULT_PROBE_ENVIRONMENT)


# NVIDIA's production and long-term branches for datacenter GPUs.
DEFAULT_DRIVER_BRANCHES = ("535", "550", "570", "580")
DEFAULT_KNOWN_FIXED = (
    {
        "component": "runc",
        "build": "1.1.5+ds1-1+deb12u1",
        "reason": "Debian bookworm's security update (DSA-5615-1) backports the CVE-2024-21626 fix",
    },
)
# The probe image has no default: ops choose one from the image allowlist (a lab name
# here would make a real node fail the gate, or run whatever that name resolves to).
# The command and environment fit the lab's workload image (nodelab.IMAGE): it
# allocates MB MiB and exits 0 a moment later, or 1 when the allocation is refused (not
# cooperative: WORKLOAD_* are its knobs); ops set their own with another image.
DEFAULT_PROBE_COMMAND = ("/usr/bin/gpu-workload",)
DEFAULT_PROBE_ENVIRONMENT = {
    "WORKLOAD_PROFILE": "steady",
    "WORKLOAD_COOPERATIVE": "0",
    "WORKLOAD_MB": "{alloc_mb}",
    "WORKLOAD_EXIT_AFTER_S": "0.2",  # it allocates at once, then holds it this long
}


class NodePolicy(models.Model):
    """What a node must have to take placements (one row, ops edit it; every change is
    a NodePolicyChange)."""

    min_toolkit_version = models.CharField(
        "minimum NVIDIA Container Toolkit", max_length=32, default=TOOLKIT_MINIMUM
    )
    min_runc_version = models.CharField("minimum runc", max_length=32, default="1.1.12")
    driver_branches = models.JSONField(
        "driver branches",
        default=_default_branches,
        blank=True,
        help_text="Driver branches a node may run (e.g. 550); empty: any.",
    )
    known_fixed_builds = models.JSONField(
        "known-fixed builds",
        default=_default_known_fixed,
        blank=True,
        help_text="Distribution builds that carry a fix under an older version number: "
        "{component: runc | toolkit, build, reason}.",
    )
    probe_image = models.CharField(
        "probe image",
        max_length=255,
        blank=True,
        help_text="An allowlisted image with sh and a CUDA allocation command, as it runs "
        "(reference, or reference@digest). Empty: none chosen, every node fails the gate.",
    )
    probe_command = models.JSONField(
        "probe allocation command (argv)", default=_default_probe_command, blank=True
    )
    probe_environment = models.JSONField(
        "probe environment",
        default=_default_probe_env,
        blank=True,
        help_text="{alloc_mb} in a value is replaced by the MiB the probe tries to allocate.",
    )
    require_userns_remap = models.BooleanField(
        "require user-namespace remapping",
        default=False,
        help_text="A node passes only when its dockerd remaps user namespaces "
        "(userns-remap), so a container's root is not the node's root.",
    )
    updated_at = models.DateTimeField("changed", auto_now=True)

    class Meta:
        verbose_name = "node policy"
        verbose_name_plural = "node policy"

    def __str__(self) -> str:
        return "node policy"


class NodePolicyChange(models.Model):
    """One change to the node policy, one node's watchdog-only acceptance, or one node
    put back to an unchecked gate (a changed machine is judged again): who (none when
    the platform did it), when, what, and why."""

    changed_at = models.DateTimeField("changed", auto_now_add=True)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="by",
    )
    node = models.ForeignKey(
        "nodes.Node",
        on_delete=models.SET_NULL,  # the audit outlives the node
        null=True,
        blank=True,
        related_name="policy_changes",
        verbose_name="node",
    )
    field = models.CharField("setting", max_length=64)
    old_value = models.JSONField("before", null=True, blank=True)
    new_value = models.JSONField("after", null=True, blank=True)
    reason = models.CharField("why", max_length=500)

    class Meta:
        ordering = ["-changed_at", "-pk"]
        verbose_name = "node policy change"
        constraints = [
            models.CheckConstraint(
                condition=~Q(reason=""),
                name="%(app_label)s_%(class)s_reason_given",
                violation_error_message="A policy change needs a reason.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.field} changed {self.changed_at:%Y-%m-%d %H:%M}"


# Django finds an app's models in its models module; the agent's live beside it.
from .agent_models import AgentEntry, AgentState, NodeAgent  # noqa: E402, F401
