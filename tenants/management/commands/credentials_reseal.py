"""Seal every tenant's registry login again under the first of GPUPLATFORM_CREDENTIALS_KEYS,
after a new key was put first (docs/images.md); the old key can then be dropped."""

from typing import Any

from django.core.management.base import BaseCommand

from tenants import services


class Command(BaseCommand):
    help = "Seal every saved registry login again under the first credentials key."

    def handle(self, *args: Any, **options: Any) -> None:
        done, unreadable = services.registry_credentials_reseal()
        self.stdout.write(f"{done} registry login(s) sealed again under the first key.")
        if unreadable:
            self.stderr.write(
                f"{unreadable} could not be read with any configured key: their tenants "
                "must save them again."
            )
