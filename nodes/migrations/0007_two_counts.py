from django.db import migrations, models

# The room placement orders cards by now counts what their processes hold
# (nodes.services.ROOM_SQL); its index follows (see 0004).
ROOM = (
    "(FLOOR((CASE WHEN ((vram_total_mb + 512) / 1024 * 1024) >= vram_total_mb AND "
    "(((vram_total_mb + 512) / 1024 * 1024) - vram_total_mb) * 50 <= "
    "((vram_total_mb + 512) / 1024 * 1024) THEN ((vram_total_mb + 512) / 1024 * 1024) "
    "ELSE vram_total_mb END) * overcommit_ratio)::integer - "
    "GREATEST(allocated_mb, COALESCE(last_processes_mb, 0)))"
)
OLD_ROOM = (
    "(FLOOR((CASE WHEN ((vram_total_mb + 512) / 1024 * 1024) >= vram_total_mb AND "
    "(((vram_total_mb + 512) / 1024 * 1024) - vram_total_mb) * 50 <= "
    "((vram_total_mb + 512) / 1024 * 1024) THEN ((vram_total_mb + 512) / 1024 * 1024) "
    "ELSE vram_total_mb END) * overcommit_ratio)::integer - allocated_mb)"
)
WHERE = "WHERE present AND accepting_placements AND NOT mig_enabled"


def room_index(expression):  # type: ignore[no-untyped-def]
    def rebuild(apps, schema_editor):  # type: ignore[no-untyped-def]
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute("DROP INDEX IF EXISTS nodes_gpu_room_idx")
            schema_editor.execute(
                f"CREATE INDEX nodes_gpu_room_idx ON nodes_gpu ({expression}, id) {WHERE}"
            )

    return rebuild


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0006_container_network"),
    ]

    operations = [
        migrations.AddField(
            model_name="allocation",
            name="counted_at",
            field=models.DateTimeField(blank=True, null=True, verbose_name="counted"),
        ),
        migrations.AddField(
            model_name="allocation",
            name="library_mb",
            field=models.PositiveIntegerField(
                blank=True, null=True, verbose_name="VRAM held, by the quota library (MiB)"
            ),
        ),
        migrations.AddField(
            model_name="allocation",
            name="nvml_mb",
            field=models.PositiveIntegerField(
                blank=True, null=True, verbose_name="VRAM held, by NVML (MiB)"
            ),
        ),
        migrations.AddField(
            model_name="gpu",
            name="last_processes_mb",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Every process on the card, of a slice or not: placement counts it.",
                null=True,
                verbose_name="VRAM held by processes (MiB)",
            ),
        ),
        migrations.RunPython(room_index(ROOM), room_index(OLD_ROOM)),
    ]
