"""Leave room on nodes_gpu pages so the per-sample update of each GPU's latest reading
is a HOT update (no new index entries): every sample batch rewrites these rows."""

from django.db import migrations


def set_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE nodes_gpu SET (fillfactor = 50)")


def reset_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE nodes_gpu RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("nodes", "0002_fleet_telemetry")]
    operations = [migrations.RunPython(set_fillfactor, reset_fillfactor)]
