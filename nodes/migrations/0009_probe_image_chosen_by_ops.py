"""The probe image has no default: ops choose one from the allowlist. A policy still on
the lab's image name (0008's default) is cleared, so the gate says a choice is missing
instead of running whatever that name resolves to on a real node."""

from django.db import migrations, models

LAB_IMAGE = "gpuplatform-lab/workload:1"  # 0008's default, written out: it is history


def clear_the_lab_default(apps, schema_editor):  # type: ignore[no-untyped-def]
    NodePolicy = apps.get_model("nodes", "NodePolicy")
    NodePolicy.objects.filter(probe_image=LAB_IMAGE).update(probe_image="")


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0008_preflight_gate"),
    ]

    operations = [
        migrations.AlterField(
            model_name="nodepolicy",
            name="probe_image",
            field=models.CharField(
                blank=True,
                help_text="An allowlisted image with sh and a CUDA allocation command, as it "
                "runs (reference, or reference@digest). Empty: none chosen, every node fails "
                "the gate.",
                max_length=255,
                verbose_name="probe image",
            ),
        ),
        # Not reversed: which image to run is ops' choice, never restored to a lab name.
        migrations.RunPython(clear_the_lab_default, migrations.RunPython.noop, elidable=True),
    ]
