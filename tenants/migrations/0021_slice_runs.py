"""Each start of a slice becomes a run of its own (tenants.SliceRun), and every existing
slice is split into its runs: boundaries at its transitions to "requested" (the launch,
then one per "Resumed: run N"), each run's minutes and purchase from the usage records
whose period starts in it (else the purchase its resume named, else the slice's), the
last run taking the slice's current fields. Usage records and the ledger are not touched.
Reverse: the runs are deleted."""

import bisect
import re
from decimal import ROUND_HALF_UP, Decimal

import django.db.models.deletion
from django.db import migrations, models

CHUNK = 500
FINAL = ("refused", "stopped", "completed", "failed")
KEPT = ("kind", "host", "ports", "port", "user")
PAID_FROM = re.compile(r"paid from purchase (\d+)")


def _cost(minutes, purchase):
    if purchase is None or not purchase.minutes_total:
        return Decimal("0.00")
    amount = purchase.price_paid / Decimal(purchase.minutes_total) * minutes
    return Decimal(str(amount)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


def _bounds(slice, transitions):
    """[(requested at, purchase named or None)] of each run, oldest first."""
    out = []
    for t in transitions:
        if t.to_state == "requested":
            named = PAID_FROM.search(t.reason or "")
            out.append((t.at, int(named.group(1)) if named else None))
    first = next((t for t in transitions if t.to_state == "requested"), None)
    if first is None or (first.reason or "").startswith("Resumed"):
        out.insert(0, (slice.created_at, None))  # the launch's own was not recorded
    return out


def _run_rows(slice, transitions, usage, purchases, SliceRun):
    bounds = _bounds(slice, transitions)
    starts = [at for at, _ in bounds]
    minutes = [0] * len(bounds)
    paid = [named for _, named in bounds]
    for record in usage:
        i = max(0, bisect.bisect_right(starts, record.period_start) - 1)
        minutes[i] += record.minutes
        paid[i] = paid[i] or record.purchase_id
    rows = []
    for i, (at, _) in enumerate(bounds):
        last = i == len(bounds) - 1
        until = None if last else starts[i + 1]
        inside = [t for t in transitions if t.at >= at and (until is None or t.at < until)]
        purchase = purchases.get(paid[i] or slice.purchase_id) or purchases[slice.purchase_id]
        run = SliceRun(
            slice_id=slice.pk, tenant_id=slice.tenant_id, number=i + 1, purchase=purchase,
            interruptible=purchase.interruptible, guaranteed=slice.guaranteed,
            vram_mb=slice.vram_mb, requested_at=at, minutes=minutes[i],
            cost=_cost(minutes[i], purchase),
        )  # fmt: skip
        started = next((t.at for t in inside if t.to_state == "running"), None)
        ended = [t for t in inside if t.to_state in FINAL]
        if ended:
            run.ended_at, run.end_state = ended[-1].at, ended[-1].to_state
            run.end_reason = ended[-1].reason
        elif not last:
            run.ended_at, run.end_state = until, "stopped"
        run.started_at = started
        if last:
            _current(run, slice)
        rows.append(run)
    return rows


def _current(run, slice):
    """The last run: the slice's own fields are its facts."""
    allocation = slice.allocation
    if allocation is not None:
        gpu = allocation.gpu
        run.node_name, run.gpu_uuid, run.gpu_model = gpu.node.name, gpu.uuid, gpu.model
        run.gpu_label = f"{gpu.node.name} GPU {gpu.index}"[:120]
        run.mig_device_uuid = allocation.mig_device_uuid
    run.container_id = slice.container_id
    run.connection = {k: v for k, v in (slice.connection or {}).items() if k in KEPT}
    run.started_at = slice.started_at or run.started_at
    run.exit_code, run.ended_by = slice.exit_code, slice.ended_by
    run.peak_vram_mb = slice.peak_vram_mb
    if slice.state in FINAL:
        run.end_state, run.end_reason = slice.state, slice.state_reason
        run.ended_at = slice.stopped_at or run.ended_at or slice.created_at
        if run.started_at is not None and run.ended_at < run.started_at:
            run.ended_at = run.started_at
    else:
        run.ended_at, run.end_state, run.end_reason = None, "", ""


def split_into_runs(apps, schema_editor):
    Slice = apps.get_model("tenants", "Slice")
    SliceRun = apps.get_model("tenants", "SliceRun")
    SliceTransition = apps.get_model("tenants", "SliceTransition")
    UsageRecord = apps.get_model("tenants", "UsageRecord")
    Purchase = apps.get_model("tenants", "Purchase")
    after = 0
    while True:
        chunk = list(
            Slice.objects.filter(pk__gt=after)
            .select_related("allocation__gpu__node")
            .order_by("pk")[:CHUNK]
        )
        if not chunk:
            break
        after = chunk[-1].pk
        ids = [s.pk for s in chunk]
        transitions, usage = {}, {}
        for t in SliceTransition.objects.filter(slice_id__in=ids).order_by("at", "id"):
            transitions.setdefault(t.slice_id, []).append(t)
        for r in UsageRecord.objects.filter(slice_id__in=ids).order_by("period_start", "id"):
            usage.setdefault(r.slice_id, []).append(r)
        wanted = {s.purchase_id for s in chunk} | {
            r.purchase_id for rs in usage.values() for r in rs
        }
        for ts in transitions.values():
            wanted |= {int(m.group(1)) for t in ts if (m := PAID_FROM.search(t.reason or ""))}
        purchases = Purchase.objects.in_bulk(wanted)
        rows = []
        for s in chunk:
            rows += _run_rows(
                s, transitions.get(s.pk, []), usage.get(s.pk, []), purchases, SliceRun
            )
        SliceRun.objects.bulk_create(rows, batch_size=CHUNK)


def delete_runs(apps, schema_editor):
    apps.get_model("tenants", "SliceRun").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0020_slice_host_key_preemption"),
    ]

    operations = [
        migrations.CreateModel(
            name="SliceRun",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "number",
                    models.PositiveIntegerField(
                        help_text="1 for the launch, then one per resume.", verbose_name="run"
                    ),
                ),
                ("interruptible", models.BooleanField(default=False, verbose_name="interruptible")),
                ("guaranteed", models.BooleanField(default=True, verbose_name="guaranteed")),
                (
                    "vram_mb",
                    models.PositiveIntegerField(default=0, verbose_name="VRAM quota (MiB)"),
                ),
                ("node_name", models.CharField(blank=True, max_length=64, verbose_name="node")),
                ("gpu_uuid", models.CharField(blank=True, max_length=96, verbose_name="GPU UUID")),
                ("gpu_label", models.CharField(blank=True, max_length=120, verbose_name="GPU")),
                (
                    "gpu_model",
                    models.CharField(blank=True, max_length=128, verbose_name="GPU model"),
                ),
                (
                    "mig_device_uuid",
                    models.CharField(blank=True, max_length=96, verbose_name="MIG device UUID"),
                ),
                (
                    "container_id",
                    models.CharField(blank=True, max_length=128, verbose_name="container ID"),
                ),
                (
                    "connection",
                    models.JSONField(
                        blank=True,
                        default=dict,
                        help_text="How it was reached (kind, host, ports, user): never a token or a key.",
                        verbose_name="connection summary",
                    ),
                ),
                ("requested_at", models.DateTimeField(verbose_name="requested")),
                ("started_at", models.DateTimeField(blank=True, null=True, verbose_name="started")),
                ("ended_at", models.DateTimeField(blank=True, null=True, verbose_name="ended")),
                (
                    "end_state",
                    models.CharField(
                        blank=True,
                        choices=[
                            ("stopped", "stopped"),
                            ("completed", "completed"),
                            ("failed", "failed"),
                            ("refused", "refused"),
                        ],
                        max_length=16,
                        verbose_name="end",
                    ),
                ),
                (
                    "end_reason",
                    models.CharField(blank=True, max_length=500, verbose_name="why it ended"),
                ),
                ("exit_code", models.IntegerField(blank=True, null=True, verbose_name="exit code")),
                ("ended_by", models.CharField(blank=True, max_length=16, verbose_name="ended by")),
                ("minutes", models.PositiveIntegerField(default=0, verbose_name="minutes metered")),
                (
                    "cost",
                    models.DecimalField(
                        decimal_places=2,
                        default=Decimal("0.00"),
                        help_text="Its minutes at its purchase's price per minute, rounded half up.",
                        max_digits=12,
                        verbose_name="cost (credits)",
                    ),
                ),
                (
                    "peak_vram_mb",
                    models.PositiveIntegerField(
                        blank=True, null=True, verbose_name="measured peak VRAM (MiB)"
                    ),
                ),
                (
                    "purchase",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="slice_runs",
                        to="tenants.purchase",
                        verbose_name="paid from",
                    ),
                ),
                (
                    "slice",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="run_rows",
                        to="tenants.slice",
                        verbose_name="slice",
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="tenants.tenant",
                        verbose_name="tenant",
                    ),
                ),
            ],
            options={
                "verbose_name": "slice run",
                "ordering": ["slice", "number"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("slice", "number"),
                        name="tenants_slicerun_one_per_number",
                        violation_error_message="A slice has one run per number.",
                    ),
                    models.UniqueConstraint(
                        condition=models.Q(("ended_at__isnull", True)),
                        fields=("slice",),
                        name="tenants_slicerun_one_open_per_slice",
                        violation_error_message="A slice has at most one run that has not ended.",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("number__gte", 1)),
                        name="tenants_slicerun_number_positive",
                        violation_error_message="Runs are numbered from 1.",
                    ),
                ],
            },
        ),
        migrations.RunPython(split_into_runs, delete_runs),
    ]
