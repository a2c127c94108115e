"""The ledger at scale (issue 25): an index per order of the ledger and for its status
filters, and when the condition began as a column of its own (the KPIs read it there, not
from the evidence), filled from the evidence of the incidents recorded before."""

import re
from datetime import UTC, datetime

from django.db import migrations, models

# The rule the KPIs used on the evidence: an ISO time, as incident_record writes it.
ISO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}", re.ASCII)
BATCH = 5000


def condition_since_of(evidence):  # type: ignore[no-untyped-def]
    """When the condition began, from the frozen evidence; None where it says nothing
    readable (an incident without it had a time to detect of zero, and still has)."""
    value = evidence.get("condition_since") if isinstance(evidence, dict) else None
    if not isinstance(value, str) or not ISO_TIME.match(value):
        return None
    try:
        began = datetime.fromisoformat(value)
    except ValueError:
        return None
    # PostgreSQL read a time without an offset in the connection's zone: UTC
    return began if began.tzinfo is not None else began.replace(tzinfo=UTC)


def backfill_condition_since(apps, schema_editor):  # type: ignore[no-untyped-def]
    """Read each incident's evidence once and write the times in batches: one UPDATE per
    batch, so a ledger of a million takes a minute, not an hour of single updates."""
    Incident = apps.get_model("incidents", "Incident")
    db = schema_editor.connection.alias
    table = schema_editor.quote_name(Incident._meta.db_table)
    rows = (
        Incident.objects.using(db)
        .filter(evidence__has_key="condition_since", condition_since__isnull=True)
        .values_list("pk", "evidence__condition_since")
        .order_by("pk")
    )
    ids: list[int] = []
    times: list[datetime] = []

    def flush() -> None:
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} AS i SET condition_since = v.began "  # noqa: S608
                "FROM unnest(%s::bigint[], %s::timestamptz[]) AS v(id, began) WHERE i.id = v.id",
                [ids, times],
            )
        ids.clear()
        times.clear()

    for pk, value in rows.iterator(chunk_size=BATCH):
        began = condition_since_of({"condition_since": value})
        if began is not None:
            ids.append(pk)
            times.append(began)
            if len(ids) >= BATCH:
                flush()
    if ids:
        flush()


class Migration(migrations.Migration):
    dependencies = [
        ("incidents", "0006_accounting_drift"),
    ]

    operations = [
        migrations.AddField(
            model_name="incident",
            name="condition_since",
            field=models.DateTimeField(
                blank=True,
                help_text='When the condition began as far as the samples show (evidence "condition_since"): the KPIs\' time to detect reads it here, not from the evidence.',
                null=True,
                verbose_name="condition began",
            ),
        ),
        # before the indexes: the first-seen index carries the column, filled once
        migrations.RunPython(backfill_condition_since, migrations.RunPython.noop, elidable=True),
        migrations.RemoveIndex(
            model_name="incident",
            name="incidents_status_seen_idx",
        ),
        migrations.AddIndex(
            model_name="incident",
            index=models.Index(fields=["-last_seen_at", "-id"], name="incidents_seen_idx"),
        ),
        migrations.AddIndex(
            model_name="incident",
            index=models.Index(
                fields=["status", "-last_seen_at", "-id"], name="incidents_status_seen_id_idx"
            ),
        ),
        migrations.AddIndex(
            model_name="incident",
            index=models.Index(
                condition=models.Q(("status", "resolved"), _negated=True),
                fields=["-last_seen_at", "-id"],
                name="incidents_unresolved_seen_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="incident",
            index=models.Index(
                fields=["-first_seen_at", "-id"],
                include=("root_cause", "node", "gpu", "resolved_at", "condition_since"),
                name="incidents_first_seen_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="incident",
            index=models.Index(
                models.Case(
                    models.When(severity="critical", then=models.Value(0)),
                    models.When(severity="warning", then=models.Value(1)),
                    default=models.Value(2),
                    output_field=models.IntegerField(),
                ),
                models.OrderBy(models.F("id"), descending=True),
                name="incidents_severity_rank_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="incident",
            index=models.Index(fields=["-occurrences", "-id"], name="incidents_occurrences_idx"),
        ),
    ]
