"""Print the platform's SSH public key (made on first use) for nodes' authorized_keys."""

from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from nodes import ssh


class Command(BaseCommand):
    help = "Print the platform's SSH public key, creating the key pair if needed."

    def handle(self, *args: Any, **options: Any) -> None:
        key = ssh.load_or_create_platform_key(Path(settings.NODES_SSH_KEY_PATH))
        self.stdout.write(f"{ssh.public_key_line(key)} gpuplatform")
        self.stderr.write(
            f"fingerprint {ssh.fingerprint(key)}; add the line above to "
            "~<ssh user>/.ssh/authorized_keys on each GPU node"
        )
