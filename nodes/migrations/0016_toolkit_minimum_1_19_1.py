"""Raise the default minimum NVIDIA Container Toolkit from 1.17.8 to 1.19.1: NVIDIA's June
2026 bulletin (https://nvidia.custhelp.com/app/answers/detail/a_id/5850) lists every
release up to 1.19.0 as affected by CVE-2026-24260 and 1.19.1 as the fix.

A policy row still at the old default is raised with it, and the change is kept in the
policy's history as the platform's (no one signed in made it). A row ops set to anything
else stays: a value they typed is their decision, and a lower one theirs to raise. Nodes
are judged against the new minimum at their next discovery.
"""

from django.db import migrations, models

OLD = "1.17.8"
NEW = "1.19.1"
FORWARD_REASON = (
    "The platform raised the default minimum: CVE-2026-24260 affects every NVIDIA "
    "Container Toolkit up to 1.19.0 and is fixed in 1.19.1 (NVIDIA security bulletin 5850, "
    "June 2026)."
)
BACKWARD_REASON = "The migration that raised the default minimum to 1.19.1 was reversed."


def forward(apps, schema_editor):  # type: ignore[no-untyped-def]
    policy = apps.get_model("nodes", "NodePolicy")
    change = apps.get_model("nodes", "NodePolicyChange")
    # Only rows at the default being replaced: a value ops typed is theirs.
    raised = policy.objects.filter(min_toolkit_version=OLD).update(min_toolkit_version=NEW)
    change.objects.bulk_create(
        change(field="min_toolkit_version", old_value=OLD, new_value=NEW, reason=FORWARD_REASON)
        for _ in range(raised)
    )


def backward(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Lower only what `forward` raised and ops have not changed since: a 1.19.1 that ops
    chose themselves is not this migration's to undo."""
    policy = apps.get_model("nodes", "NodePolicy")
    change = apps.get_model("nodes", "NodePolicyChange")
    last = (
        change.objects.filter(field="min_toolkit_version", node__isnull=True)
        .order_by("-changed_at", "-pk")
        .first()
    )
    if last is None or last.reason != FORWARD_REASON:
        return
    lowered = policy.objects.filter(min_toolkit_version=NEW).update(min_toolkit_version=OLD)
    change.objects.bulk_create(
        change(field="min_toolkit_version", old_value=NEW, new_value=OLD, reason=BACKWARD_REASON)
        for _ in range(lowered)
    )


class Migration(migrations.Migration):
    dependencies = [("nodes", "0015_partition_telemetry")]

    operations = [
        migrations.AlterField(
            model_name="nodepolicy",
            name="min_toolkit_version",
            field=models.CharField(
                default=NEW, max_length=32, verbose_name="minimum NVIDIA Container Toolkit"
            ),
        ),
        migrations.RunPython(forward, backward),
    ]
