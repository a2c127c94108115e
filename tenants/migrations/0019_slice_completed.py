"""A slice whose job exits 0 by itself is `completed`, not `failed`; every completed or
failed run records who ended it (`ended_by`: the job itself, or the platform, its node or a
neighbour), which is what the KPIs hold against the platform.

Runs recorded before keep their state and transitions. Those the stored facts show the
job ended itself (exit 0, the kernel's OOM killer in the tier's own host RAM, a plain exit
code that was not a kill from outside or a GPU out-of-memory) get `ended_by = job`, so the
KPIs stop counting them against the platform; the rest stay blank and count as before."""

from django.db import migrations, models
from django.db.models import Q


def own_ends_backfill(apps, schema_editor):
    Slice = apps.get_model("tenants", "Slice")
    plain_exit = (
        Q(state_reason__startswith="The container exited with code")
        & ~Q(exit_code__in=(137, 143))
        & ~Q(state_reason__icontains="out of GPU memory")
    )
    own = Q(exit_code=0) | Q(state_reason__startswith="The container was killed out of memory")
    Slice.objects.filter(state="failed", ended_by="").filter(own | plain_exit).update(
        ended_by="job"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0018_idempotency_fingerprints"),
    ]

    operations = [
        migrations.AddField(
            model_name="slice",
            name="ended_by",
            field=models.CharField(
                blank=True,
                choices=[
                    ("job", "the job itself"),
                    ("platform", "the platform, its node or a neighbour"),
                ],
                help_text="For a completed or failed run: whether its job ended it (an exit, "
                "its own out-of-memory) or something else did (blank: not recorded, or "
                "stopped).",
                max_length=16,
                verbose_name="ended by",
            ),
        ),
        migrations.AlterField(
            model_name="slice",
            name="state",
            field=models.CharField(
                choices=[
                    ("requested", "requested"),
                    ("refused", "refused"),
                    ("queued", "queued"),
                    ("provisioning", "provisioning"),
                    ("running", "running"),
                    ("stopping", "stopping"),
                    ("stopped", "stopped"),
                    ("completed", "completed"),
                    ("failed", "failed"),
                ],
                default="requested",
                help_text="Final states: refused (the VRAM check said no), stopped (by the "
                "tenant, ops, the watchdog or its time running out), completed (its job "
                "exited 0 by itself), failed (it did not start, or its job ended otherwise: "
                "the reason says how).",
                max_length=16,
                verbose_name="state",
            ),
        ),
        migrations.RunPython(own_ends_backfill, migrations.RunPython.noop),
    ]
