"""API token scopes, client networks and last address; existing tokens keep every scope."""

from django.db import migrations, models

# Before scopes a token did all its user's role allowed; every scope, still bounded by the
# role at each use, keeps exactly that, so no existing script breaks.
ALL_SCOPES = ["read", "launch", "billing", "admin"]


def grant_existing_tokens_every_scope(apps, schema_editor):  # type: ignore[no-untyped-def]
    ApiToken = apps.get_model("tenants", "ApiToken")
    ApiToken.objects.filter(scopes=[]).update(scopes=ALL_SCOPES)


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0014_spend_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="scopes",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="What the token may do: read, launch, billing, admin.",
                verbose_name="scopes",
            ),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="allowed_networks",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text="CIDR networks the token may be used from; empty: anywhere.",
                verbose_name="allowed client networks",
            ),
        ),
        migrations.AddField(
            model_name="apitoken",
            name="last_used_address",
            field=models.GenericIPAddressField(
                blank=True, null=True, verbose_name="last used from"
            ),
        ),
        migrations.RunPython(grant_existing_tokens_every_scope, migrations.RunPython.noop),
    ]
