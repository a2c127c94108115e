"""Run the emulated demo fleet, web, Celery worker and Celery beat as real processes;
Ctrl-C stops them all.

If one of them dies, the others are stopped too, so a broken stack never looks alive.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from nodes import ssh


class Command(BaseCommand):
    help = "Start the demo fleet emulator, web, a Celery worker and beat; Ctrl-C stops all."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("--addr", default=os.environ.get("GPUPLATFORM_ADDR", "127.0.0.1:8000"))
        parser.add_argument(
            "--fleet",
            type=int,
            default=int(os.environ.get("GPUPLATFORM_DEMO_NODES", "4")),
            help="emulated demo nodes to start and register (0: none)",
        )
        parser.add_argument(
            "--fleet-base-port",
            type=int,
            default=int(os.environ.get("GPUPLATFORM_DEMO_BASE_PORT", "2201")),
        )

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        python = sys.executable
        queues = ",".join(settings.CELERY_QUEUE_NAMES)
        worker = [
            python,
            "-m",
            "celery",
            "-A",
            "gpuplatform",
            "worker",
            "-Q",
            queues,
            "--loglevel",
            "INFO",
            "-n",
            "worker@%h",
        ]
        if settings.CELERY_BROKER_URL.startswith("filesystem"):
            # The filesystem transport has no fanout: no remote control or gossip.
            worker += ["--without-gossip", "--without-mingle", "--without-heartbeat", "-P", "solo"]
        else:
            worker += ["--concurrency", "2"]
        commands = {}
        if options["fleet"] > 0:
            key = ssh.load_or_create_platform_key(Path(settings.NODES_SSH_KEY_PATH))
            state = settings.VAR_DIR / "emulator"
            commands["emulator"] = [
                python,
                "-m",
                "nodes.emulator",
                "--count",
                str(options["fleet"]),
                "--base-port",
                str(options["fleet_base_port"]),
                "--state-dir",
                str(state),
                "--authorized-key",
                ssh.public_key_line(key),
            ]
        commands.update(
            {
                "web": [python, "manage.py", "runserver", options["addr"], "--noreload"],
                "worker": worker,
                # Beat's scheduler (django-celery-beat, in the database) comes from settings.
                "beat": [python, "-m", "celery", "-A", "gpuplatform", "beat", "--loglevel", "INFO"],
            }
        )
        procs: dict[str, subprocess.Popen] = {}
        stopping = False

        def stop(*_):  # type: ignore[no-untyped-def]
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        exit_code = 0
        try:
            for name, argv in commands.items():
                if name == "emulator":
                    (settings.VAR_DIR / "emulator" / "fleet.json").unlink(missing_ok=True)
                # Own session: the terminal's Ctrl-C reaches us, and we stop children in order.
                procs[name] = subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
                    argv, cwd=settings.BASE_DIR, start_new_session=True
                )
                self.stdout.write(f"started {name} (pid {procs[name].pid})")
                if name == "emulator":
                    self._register_fleet(procs[name])
            self.stdout.write(
                self.style.SUCCESS(
                    f"gpuplatform is up at http://{options['addr']}/ "
                    f"(Ctrl-C stops {', '.join(procs)})"
                )
            )
            while not stopping:
                for name, proc in procs.items():
                    if proc.poll() is not None:
                        self.stderr.write(f"{name} exited with {proc.returncode}; stopping all")
                        exit_code = proc.returncode or 1
                        stopping = True
                        break
                time.sleep(0.5)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            for name, proc in procs.items():
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                self.stdout.write(f"stopped {name}")
        if exit_code:
            sys.exit(exit_code)

    def _register_fleet(self, emulator: subprocess.Popen) -> None:
        fleet_file = settings.VAR_DIR / "emulator" / "fleet.json"
        deadline = time.monotonic() + 30
        while not fleet_file.exists():
            if emulator.poll() is not None or time.monotonic() > deadline:
                raise CommandError("the node emulator did not start (is its port taken?)")
            time.sleep(0.2)
        count = len(json.loads(fleet_file.read_text()).get("nodes", []))
        call_command("register_fleet", str(fleet_file), stdout=self.stdout)
        self.stdout.write(f"demo fleet: {count} emulated nodes registered")
