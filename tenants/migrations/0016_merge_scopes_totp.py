# Two changes made side by side: scoped API tokens and two-factor sign-in.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0015_api_token_scopes"),
        ("tenants", "0015_totp_devices"),
    ]

    operations = []
