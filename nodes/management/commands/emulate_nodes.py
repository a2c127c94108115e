"""Run the emulated GPU fleet until Ctrl-C: `manage.py emulate_nodes --count 4 --base-port 2201`.

Prints one line per node (name, address, port, known_hosts line) and writes
<state-dir>/fleet.json, so `make run` can register the nodes and pin their host keys.
"""

from django.core.management.base import BaseCommand

from nodes.emulator import cli


class Command(BaseCommand):
    help = "Run emulated GPU nodes (SSH servers on 127.0.0.1) until interrupted."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        cli.add_serve_arguments(parser)

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        cli.serve(options, out=self.stdout)
