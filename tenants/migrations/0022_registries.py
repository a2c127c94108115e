"""Images renters bring (docs/images.md): the registry policy's rules and their history,
tenants' sealed registry logins, and what a slice keeps of a brought image (how the
policy allowed it, the digest every start runs, the ports its configuration declares)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0021_slice_runs"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="RegistryCredential",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "registry",
                    models.CharField(
                        help_text="Host or host:port, e.g. ghcr.io.",
                        max_length=255,
                        verbose_name="registry",
                    ),
                ),
                ("sealed", models.TextField(editable=False, verbose_name="sealed login")),
                ("created_at", models.DateTimeField(auto_now_add=True, verbose_name="set")),
                ("updated_at", models.DateTimeField(auto_now=True, verbose_name="changed")),
                (
                    "last_used_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="last used"),
                ),
            ],
            options={
                "verbose_name": "registry credential",
                "ordering": ["registry"],
            },
        ),
        migrations.CreateModel(
            name="RegistryRule",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "pattern",
                    models.CharField(
                        help_text="*, a registry (ghcr.io), a path under one (ghcr.io/acme/*) or one repository (docker.io/library/python).",
                        max_length=255,
                        unique=True,
                        verbose_name="pattern",
                    ),
                ),
                (
                    "mode",
                    models.CharField(
                        choices=[
                            ("allowlist", "allowlist only"),
                            ("registry", "any image from here"),
                            ("any", "any image, on nodes whose agent runs"),
                        ],
                        max_length=16,
                        verbose_name="mode",
                    ),
                ),
                ("note", models.CharField(blank=True, max_length=500, verbose_name="why")),
                ("created_at", models.DateTimeField(auto_now_add=True, verbose_name="added")),
                ("updated_at", models.DateTimeField(auto_now=True, verbose_name="changed")),
            ],
            options={
                "verbose_name": "registry rule",
                "ordering": ["pattern"],
            },
        ),
        migrations.CreateModel(
            name="RegistryRuleChange",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("changed_at", models.DateTimeField(auto_now_add=True, verbose_name="changed")),
                ("pattern", models.CharField(max_length=255, verbose_name="pattern")),
                ("old_mode", models.CharField(blank=True, max_length=16, verbose_name="before")),
                ("new_mode", models.CharField(blank=True, max_length=16, verbose_name="after")),
                ("reason", models.CharField(max_length=500, verbose_name="why")),
            ],
            options={
                "verbose_name": "registry policy change",
                "ordering": ["-changed_at", "-pk"],
            },
        ),
        migrations.AddField(
            model_name="slice",
            name="image_digest",
            field=models.CharField(
                blank=True,
                help_text="What every start runs: sha256:…",
                max_length=71,
                verbose_name="image digest",
            ),
        ),
        migrations.AddField(
            model_name="slice",
            name="image_policy",
            field=models.CharField(
                blank=True,
                help_text="registry or any: the registry policy's mode that let the renter bring this image; blank for an allowlisted image.",
                max_length=16,
                verbose_name="brought under",
            ),
        ),
        migrations.AddField(
            model_name="slice",
            name="image_ports",
            field=models.JSONField(
                blank=True, default=list, verbose_name="ports the image declares"
            ),
        ),
        migrations.AddConstraint(
            model_name="slice",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("image_policy", ""), ("image_entry__isnull", True), _connector="OR"
                ),
                name="tenants_slice_brought_or_allowlisted",
                violation_error_message="A slice runs an allowlisted image or a brought one.",
            ),
        ),
        migrations.AddConstraint(
            model_name="slice",
            constraint=models.CheckConstraint(
                condition=models.Q(("image_policy__in", ["", "registry", "any"])),
                name="tenants_slice_image_policy_known",
                violation_error_message="An image is brought under the registry or any mode.",
            ),
        ),
        migrations.AddField(
            model_name="registrycredential",
            name="created_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
                verbose_name="set by",
            ),
        ),
        migrations.AddField(
            model_name="registrycredential",
            name="tenant",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE,
                related_name="registry_credentials",
                to="tenants.tenant",
                verbose_name="tenant",
            ),
        ),
        migrations.AddField(
            model_name="registryrule",
            name="updated_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
                verbose_name="changed by",
            ),
        ),
        migrations.AddField(
            model_name="registryrulechange",
            name="changed_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
                verbose_name="by",
            ),
        ),
        migrations.AddConstraint(
            model_name="registrycredential",
            constraint=models.UniqueConstraint(
                fields=("tenant", "registry"),
                name="tenants_registrycredential_one_per_registry",
                violation_error_message="The tenant has a login for this registry already.",
            ),
        ),
        migrations.AddConstraint(
            model_name="registrycredential",
            constraint=models.CheckConstraint(
                condition=models.Q(("sealed", ""), _negated=True),
                name="tenants_registrycredential_sealed_given",
                violation_error_message="A registry login is stored sealed.",
            ),
        ),
        migrations.AddConstraint(
            model_name="registryrule",
            constraint=models.CheckConstraint(
                condition=models.Q(("mode__in", ["allowlist", "registry", "any"])),
                name="tenants_registryrule_mode_known",
                violation_error_message="Unknown registry mode.",
            ),
        ),
        migrations.AddConstraint(
            model_name="registryrule",
            constraint=models.CheckConstraint(
                condition=models.Q(("pattern", ""), _negated=True),
                name="tenants_registryrule_pattern_given",
                violation_error_message="A rule has a pattern.",
            ),
        ),
        migrations.AddConstraint(
            model_name="registryrulechange",
            constraint=models.CheckConstraint(
                condition=models.Q(("reason", ""), _negated=True),
                name="tenants_registryrulechange_reason_given",
                violation_error_message="A registry policy change needs a reason.",
            ),
        ),
    ]
