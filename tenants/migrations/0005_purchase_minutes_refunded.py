from django.db import migrations, models


def backfill(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Refunds made before the field existed: their minutes, from the refund's audit
    record (which names them)."""
    Purchase = apps.get_model("tenants", "Purchase")
    AuditEvent = apps.get_model("tenants", "AuditEvent")
    refunded: dict[int, int] = {}
    for data in AuditEvent.objects.filter(action="purchase.refund").values_list("data", flat=True):
        try:
            pk, minutes = int(data["purchase"]), int(data["minutes"])
        except (KeyError, TypeError, ValueError):
            continue
        refunded[pk] = refunded.get(pk, 0) + minutes
    for pk, minutes in refunded.items():
        Purchase.objects.filter(pk=pk, refunded_at__isnull=False).update(minutes_refunded=minutes)


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0004_grant_idempotency"),
    ]

    operations = [
        migrations.AddField(
            model_name="purchase",
            name="minutes_refunded",
            field=models.PositiveIntegerField(default=0, verbose_name="minutes refunded"),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
