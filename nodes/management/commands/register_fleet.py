"""Register (or update) the nodes listed in a demo fleet file, keys pinned.

`make run` uses it for the demo fleet: the node lab (var/lab/fleet.json) or the emulator
(var/emulator/fleet.json) writes each node's address, port, SSH user, container network
and host key, and this command trusts those keys because the file was written by a
process this machine started.
"""

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from gpuplatform.dispatch import enqueue
from nodes import services, ssh
from nodes.models import Node


class Command(BaseCommand):
    help = "Register the nodes of an emulator fleet file with their host keys pinned."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("fleet_file", type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["fleet_file"]
        try:
            described = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read {path}: {exc}") from exc
        for entry in described.get("nodes", []):
            key = ssh.normalise_host_key(entry["host_key"])
            where = {
                "address": entry["address"],
                "port": entry["port"],
                "ssh_user": entry.get("ssh_user", "gpuplatform"),
                "container_network": entry.get("container_network", "bridge"),
            }
            with transaction.atomic():
                node = Node.objects.filter(name=entry["name"]).first()
                if node is None:
                    node = services.node_register(name=entry["name"], host_key=key, **where)
                    verb = "registered"
                else:
                    node = services.node_update(node=node, host_key=key, **where)
                    enqueue("telemetry.discover_node", node.pk)
                    verb = "updated"
            self.stdout.write(
                f"{verb} {node.name} at {node.address}:{node.port} ({ssh.fingerprint(key)})"
            )
