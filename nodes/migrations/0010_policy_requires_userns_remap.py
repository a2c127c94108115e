"""The node policy can require that dockerd remaps user namespaces (off by default)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0009_probe_image_chosen_by_ops"),
    ]

    operations = [
        migrations.AddField(
            model_name="nodepolicy",
            name="require_userns_remap",
            field=models.BooleanField(
                default=False,
                help_text="A node passes only when its dockerd remaps user namespaces "
                "(userns-remap), so a container's root is not the node's root.",
                verbose_name="require user-namespace remapping",
            ),
        ),
    ]
