"""Drive a running emulator: `manage.py emulator_ctl xid emu-01 --gpu 0 --code 79`,
`... down emu-02`, `... up emu-02`, `... rotate-host-key emu-01`, `... advance 600`."""

from django.core.management.base import BaseCommand, CommandError

from nodes.emulator import cli


class Command(BaseCommand):
    help = "Inject faults into / inspect a running node emulator through its control API."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        cli.add_ctl_arguments(parser)

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        if cli.ctl(options, out=self.stdout, err=self.stderr) != 0:
            raise CommandError("emulator control request failed")
