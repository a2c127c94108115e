"""Slices, the tier-sized containers tenants launch, their state changes, and the
images ops allow them to run."""

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import Q

from nodes.models import Node

from ..money import round_half_up
from .accounts import TenantScopedQuerySet
from .runs import SliceRun


class Image(models.Model):
    """A container image ops allow tenants to launch."""

    class Connect(models.TextChoices):
        SSH = "ssh", "SSH with the tenant's public key"
        JUPYTER = "jupyter", "Jupyter with a token"
        SERVICE = "service", "the image's own service"

    name = models.CharField("name", max_length=64, unique=True)
    reference = models.CharField(
        "reference", max_length=255, help_text="Repository and tag, e.g. pytorch/pytorch:2.4.0"
    )
    digest = models.CharField(
        "digest",
        max_length=71,
        blank=True,
        help_text="sha256:… to pin the exact image; the launch then runs reference@digest.",
    )
    description = models.CharField("description", max_length=300, blank=True)
    default_command = models.JSONField("default command (argv)", default=list, blank=True)
    ports = models.JSONField("exposed ports", default=list, blank=True)
    connect = models.CharField(
        "how the tenant connects", max_length=16, choices=Connect.choices, default=Connect.SSH
    )
    # Who the image's own sshd lets in with the renter's key (PUBLIC_KEY): the user in
    # the `ssh -J` command a slice page gives. Many images log in as root; an image whose
    # sshd runs as an ordinary user (as under --cap-drop ALL it must) names that user.
    ssh_user = models.CharField(
        "SSH user",
        max_length=32,
        default="root",
        help_text="The user the image's sshd logs in with the renter's key.",
    )
    is_active = models.BooleanField("allowed", default=True)
    # Its configuration as a node had it when ops added or changed it (a start checks
    # again on the node it runs on).
    inspected_at = models.DateTimeField("inspected", null=True, blank=True)
    inspected_on = models.CharField("inspected on node", max_length=64, blank=True)
    inspected_image_id = models.CharField("image id", max_length=80, blank=True)
    inspection_note = models.CharField("inspection", max_length=300, blank=True)
    created_at = models.DateTimeField("added", auto_now_add=True)
    updated_at = models.DateTimeField("changed", auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "image"
        constraints = [
            models.CheckConstraint(
                condition=Q(connect__in=["ssh", "jupyter", "service"]),
                name="%(app_label)s_%(class)s_connect_known",
                violation_error_message="Unknown connection kind.",
            ),
            models.CheckConstraint(
                condition=Q(ssh_user__regex=r"^[a-z_][a-z0-9_-]{0,31}$"),
                name="%(app_label)s_%(class)s_ssh_user_portable",
                violation_error_message="An SSH user is a portable user name (a-z, 0-9, _ and -).",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def pinned_reference(self) -> str:
        return f"{self.reference}@{self.digest}" if self.digest else self.reference


# Spelled here because Slice.Meta's constraints cannot see Slice's class attributes;
# everything else reads them as Slice.LIVE_STATES and Slice.MUST_HOLD_ALLOCATION_STATES.
_LIVE_STATES = ("requested", "queued", "provisioning", "running", "stopping")


_MUST_HOLD_ALLOCATION_STATES = ("running", "stopping")


class Slice(models.Model):
    """A tenant's tier-sized container: the launch lifecycle lives here.

    Each start (the launch, then every resume) is a `SliceRun` row of its own, with its
    placement, container, times, end, minutes and cost (`run_rows`; `runs` counts them).
    The run fields here (allocation, container_id, connection, started_at, stopped_at,
    exit_code, ended_by, last_metered_at, ...) are the current run's working copy: a
    resume clears them for the new run, whose history then lives in its SliceRun row."""

    class State(models.TextChoices):
        REQUESTED = "requested", "requested"
        REFUSED = "refused", "refused"
        QUEUED = "queued", "queued"
        PROVISIONING = "provisioning", "provisioning"
        RUNNING = "running", "running"
        STOPPING = "stopping", "stopping"
        STOPPED = "stopped", "stopped"
        COMPLETED = "completed", "completed"
        FAILED = "failed", "failed"

    class EndedBy(models.TextChoices):
        """Who ended a completed or failed run: what the KPIs hold against the platform."""

        JOB = "job", "the job itself"
        PLATFORM = "platform", "the platform, its node or a neighbour"

    FINAL_STATES = (State.REFUSED, State.STOPPED, State.COMPLETED, State.FAILED)
    # Not final: the slice uses its purchase (one at a time, no refund meanwhile).
    LIVE_STATES = _LIVE_STATES
    # Live and past the queue: VRAM is reserved on a node, so its container is no orphan.
    HOLDS_VRAM_STATES = (State.PROVISIONING, State.RUNNING, State.STOPPING)
    # Started: the database refuses these without an allocation (provisioning may lack one).
    MUST_HOLD_ALLOCATION_STATES = _MUST_HOLD_ALLOCATION_STATES

    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="slices", verbose_name="tenant"
    )
    purchase = models.ForeignKey(
        "tenants.Purchase",
        on_delete=models.PROTECT,
        related_name="slices",
        verbose_name="purchase",
    )
    image = models.CharField("image reference", max_length=255)
    image_entry = models.ForeignKey(
        "tenants.Image",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="slices",
        verbose_name="image",
    )
    # An image on no allowlist (image_entry is None), brought as the registry policy
    # allowed it (docs/images.md): how it was allowed, the digest its first authorised
    # pull resolved (every later start runs exactly that, after asking the registry again
    # with the tenant's own login), and the ports its configuration declares.
    image_policy = models.CharField(
        "brought under",
        max_length=16,
        blank=True,
        help_text="registry or any: the registry policy's mode that let the renter bring "
        "this image; blank for an allowlisted image.",
    )
    image_digest = models.CharField(
        "image digest", max_length=71, blank=True, help_text="What every start runs: sha256:…"
    )
    image_ports = models.JSONField("ports the image declares", default=list, blank=True)
    vram_mb = models.PositiveIntegerField("VRAM quota (MiB)", default=0)
    guaranteed = models.BooleanField(
        "guaranteed",
        default=True,
        help_text="Never on an overcommitted GPU (online inference, hardware isolation).",
    )
    ssh_public_key = models.TextField("SSH public key", blank=True)
    model_request = models.JSONField("estimate input", default=dict, blank=True)
    template = models.ForeignKey(
        "tenants.LaunchTemplate",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="template",
    )
    engine = models.CharField(
        "engine",
        max_length=16,
        blank=True,
        help_text="An engine that sizes itself from the device: told the slice at start.",
    )
    engine_budget_mb = models.PositiveIntegerField(
        "engine budget (MiB)",
        null=True,
        blank=True,
        help_text="What the estimate let the engine take of the slice.",
    )
    engine_args = models.JSONField(
        "engine arguments",
        default=list,
        blank=True,
        help_text="What the platform appended to the command at the last start.",
    )
    command = models.JSONField("command (argv)", default=list, blank=True)
    environment = models.JSONField("environment", default=dict, blank=True)
    estimate_mb = models.PositiveIntegerField("estimated VRAM (MiB)", null=True, blank=True)
    estimate = models.JSONField("estimate breakdown", default=dict, blank=True)
    state = models.CharField(
        "state",
        max_length=16,
        choices=State.choices,
        default=State.REQUESTED,
        help_text="Final states: refused (the VRAM check said no), stopped (by the tenant, "
        "ops, the watchdog or its time running out), completed (its job exited 0 by itself), "
        "failed (it did not start, or its job ended otherwise: the reason says how).",
    )
    state_reason = models.CharField("state reason", max_length=500, blank=True)
    ended_by = models.CharField(
        "ended by",
        max_length=16,
        choices=EndedBy.choices,
        blank=True,
        help_text="For a completed or failed run: whether its job ended it (an exit, its own "
        "out-of-memory) or something else did (blank: not recorded, or stopped).",
    )
    allocation = models.OneToOneField(
        "nodes.Allocation",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="slice",
        verbose_name="VRAM allocation",
    )
    container_id = models.CharField("container ID", max_length=128, blank=True)
    connection = models.JSONField("connection details", default=dict, blank=True)
    idempotency_key = models.CharField("idempotency key", max_length=128, blank=True)
    idempotency_fingerprint = models.CharField(
        "request fingerprint",
        max_length=64,
        blank=True,
        help_text="SHA-256 of what the keyed request asked for: a replay must match it.",
    )
    resume_idempotency_key = models.CharField(
        "last resume's idempotency key",
        max_length=128,
        blank=True,
        help_text="A resume retried with this key returns the slice and starts nothing again.",
    )
    resume_idempotency_fingerprint = models.CharField(
        "last resume's request fingerprint", max_length=64, blank=True
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        related_name="slices",
        verbose_name="launched by",
    )
    created_at = models.DateTimeField("requested", auto_now_add=True)
    queued_at = models.DateTimeField("queued", null=True, blank=True)
    provision_attempts = models.PositiveSmallIntegerField("provisioning attempts", default=0)
    provision_started_at = models.DateTimeField("provisioning since", null=True, blank=True)
    started_at = models.DateTimeField("started", null=True, blank=True)
    stopped_at = models.DateTimeField("stopped", null=True, blank=True)
    last_metered_at = models.DateTimeField("metered up to", null=True, blank=True)
    minutes_used = models.PositiveIntegerField("minutes metered", default=0)
    exit_code = models.IntegerField("exit code", null=True, blank=True)
    runs = models.PositiveIntegerField(
        "runs", default=1, help_text="1, then one more each time it is resumed."
    )
    terminated_at = models.DateTimeField(
        "terminated",
        null=True,
        blank=True,
        help_text="Ended for good: a terminated slice cannot be resumed (a stopped one can).",
    )
    peak_vram_mb = models.PositiveIntegerField("measured peak VRAM (MiB)", null=True, blank=True)
    # The slice's own SSH host key, made once and given to every run's container, so a
    # resumed slice answers with the key the renter's known_hosts already pins. The private
    # half never leaves the platform except to the node that starts the container.
    ssh_host_key = models.TextField("SSH host key (private)", blank=True, editable=False)
    ssh_host_key_public = models.CharField("SSH host key", max_length=200, blank=True)
    # An interruptible run told to make room: when the notice was given and when it ends
    # (the slice is stopped then, whatever it did meanwhile).
    preempt_notice_at = models.DateTimeField("preemption notice given", null=True, blank=True)
    preempt_deadline = models.DateTimeField("preempted at the latest", null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "slice"
        indexes = [
            models.Index(fields=["tenant", "state"], name="tenants_slice_tenant_state_idx"),
            models.Index(fields=["state", "queued_at"], name="tenants_slice_state_queue_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["purchase"],
                condition=Q(state__in=_LIVE_STATES),
                name="%(app_label)s_%(class)s_one_live_per_purchase",
                violation_error_message="This purchase already has a slice that is not stopped.",
            ),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~Q(idempotency_key=""),
                name="%(app_label)s_%(class)s_unique_idempotency_key",
                violation_error_message="A launch with this idempotency key already exists.",
            ),
            models.CheckConstraint(
                condition=Q(image_policy="") | Q(image_entry__isnull=True),
                name="%(app_label)s_%(class)s_brought_or_allowlisted",
                violation_error_message="A slice runs an allowlisted image or a brought one.",
            ),
            models.CheckConstraint(
                condition=Q(image_policy__in=["", "registry", "any"]),
                name="%(app_label)s_%(class)s_image_policy_known",
                violation_error_message="An image is brought under the registry or any mode.",
            ),
            models.CheckConstraint(
                condition=Q(state__in=_MUST_HOLD_ALLOCATION_STATES, allocation__isnull=False)
                | ~Q(state__in=_MUST_HOLD_ALLOCATION_STATES),
                name="%(app_label)s_%(class)s_running_has_allocation",
                violation_error_message="A running slice must hold a VRAM allocation.",
            ),
        ]

    def __str__(self) -> str:
        return f"slice {self.pk} ({self.state})"

    @property
    def owner_key(self) -> str:
        """The opaque key `nodes` labels this slice's allocation and container with."""
        return f"slice-{self.pk}"

    @property
    def is_final(self) -> bool:
        return self.state in self.FINAL_STATES

    @property
    def brought(self) -> bool:
        """An image the renter brought (on no allowlist), not an allowlist entry."""
        return self.image_entry_id is None and bool(self.image_policy)

    @property
    def declared_ports(self) -> list[int]:
        """The ports the slice's image declares: the allowlist entry's, or what a brought
        image's configuration exposes (read at its start). The gateway and the edge reach
        these only."""
        if self.image_entry_id is not None and self.image_entry is not None:
            return sorted(int(p) for p in self.image_entry.ports or [])
        return sorted(int(p) for p in self.image_ports or [])

    @property
    def container_name(self) -> str:
        return f"gpp-slice-{self.pk}"

    @property
    def node_answers(self) -> bool:
        """False while the slice's node is unreachable (its minutes are not charged)."""
        allocation = self.allocation
        return allocation is None or allocation.gpu.node.status != Node.Status.UNREACHABLE

    @property
    def peak_mb(self) -> int | None:
        """The measured peak VRAM (MiB): stored when the slice ends; while it runs, the
        highest so far (`peak_so_far_mb`, which the slice list selectors annotate)."""
        if self.peak_vram_mb is not None:
            return self.peak_vram_mb
        return getattr(self, "peak_so_far_mb", None)

    @property
    def cost_so_far(self) -> Decimal:
        """Credits the minutes metered so far are worth: each run's minutes at its own
        purchase's price per minute (what was paid over what was bought), rounded half up
        to the cent like every amount shown (`tenants.money.round_half_up`). Minutes no
        run holds (an unsaved slice, or one kept before runs were) are priced at the
        current purchase. Nothing is charged by it: a purchase is paid in full when bought."""
        cost, counted = Decimal("0.00"), 0
        if self.pk is not None:
            totals = SliceRun.objects.filter(slice_id=self.pk).aggregate(
                cost=models.Sum("cost"), minutes=models.Sum("minutes")
            )
            cost, counted = totals["cost"] or Decimal("0.00"), totals["minutes"] or 0
        rest = max(0, self.minutes_used - counted)
        purchase = self.purchase if self.purchase_id is not None else None
        if not rest or purchase is None or not purchase.minutes_total:
            return round_half_up(cost)
        per_minute = purchase.price_paid / Decimal(purchase.minutes_total)
        return round_half_up(cost) + round_half_up(per_minute * rest)


class SliceTransition(models.Model):
    slice = models.ForeignKey(
        "tenants.Slice",
        on_delete=models.CASCADE,
        related_name="transitions",
        verbose_name="slice",
    )
    from_state = models.CharField("from", max_length=16, blank=True)
    to_state = models.CharField("to", max_length=16)
    reason = models.CharField("reason", max_length=500, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
        verbose_name="by",
    )
    at = models.DateTimeField("at", auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]
        verbose_name = "slice transition"

    def __str__(self) -> str:
        return f"{self.from_state or '-'} -> {self.to_state}"


class SliceLogLine(models.Model):
    """A line the slice's container printed (stdout and stderr, in time order), kept so
    the page and the API read it without the node, and after the container is gone."""

    slice = models.ForeignKey(
        "tenants.Slice", on_delete=models.CASCADE, related_name="log_lines", verbose_name="slice"
    )
    seq = models.PositiveIntegerField("line number")
    at = models.DateTimeField("printed at")
    text = models.CharField("text", max_length=2000, blank=True)

    class Meta:
        ordering = ["slice", "seq"]
        verbose_name = "slice log line"
        constraints = [
            models.UniqueConstraint(
                fields=["slice", "seq"],
                name="%(app_label)s_%(class)s_one_line_per_number",
                violation_error_message="A slice's log has one line per number.",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.slice_id}:{self.seq}"
