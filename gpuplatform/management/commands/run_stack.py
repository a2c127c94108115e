"""Run the demo fleet, web, Celery worker, Celery beat and the SSH gateway as real
processes; Ctrl-C stops them all.

The demo fleet is the node lab (real sshd and dockerd per node, emulated GPUs) wherever
it can start (root, Docker Engine and OpenSSH installed), else the pure-Python node
emulator; the start-up says which, and why. GPUPLATFORM_DEMO_FAR_END=lab|emulator forces
one. If one process dies, the others are stopped too, so a broken stack never looks
alive.
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

from gpuplatform.workers import worker_argv
from nodes import ssh

LAB_DIR = settings.VAR_DIR / "lab"
EMULATOR_DIR = settings.VAR_DIR / "emulator"


class Command(BaseCommand):
    help = "Start the demo fleet (node lab or emulator), web, a Celery worker, beat, the gateway."

    def add_arguments(self, parser):
        parser.add_argument("--addr", default=os.environ.get("GPUPLATFORM_ADDR", "127.0.0.1:8000"))
        parser.add_argument(
            "--fleet",
            type=int,
            default=int(os.environ.get("GPUPLATFORM_DEMO_NODES", "4")),
            help="demo nodes to start and register (0: none)",
        )
        parser.add_argument(
            "--far-end",
            choices=["auto", "lab", "emulator"],
            default=os.environ.get("GPUPLATFORM_DEMO_FAR_END", "auto"),
            help="lab nodes, emulated nodes, or the lab where it can start (default)",
        )
        parser.add_argument(
            "--fleet-base-port",
            type=int,
            default=int(os.environ.get("GPUPLATFORM_DEMO_BASE_PORT", "2201")),
        )

    def handle(self, *args, **options):
        python = sys.executable
        queues = ",".join(settings.CELERY_QUEUE_NAMES)
        if settings.CELERY_BROKER_URL.startswith("filesystem"):
            # The filesystem transport has no fanout: no remote control or gossip.
            worker = worker_argv(
                queues=queues, hostname="worker@%h", pool="solo", without_peers=True
            )
        else:
            worker = worker_argv(queues=queues, hostname="worker@%h", concurrency=2)
        fleet_commands = {}
        if options["fleet"] > 0:
            key = ssh.load_or_create_platform_key(Path(settings.NODES_SSH_KEY_PATH))
            fleet = [
                "--count",
                str(options["fleet"]),
                "--base-port",
                str(options["fleet_base_port"]),
                "--authorized-key",
                ssh.public_key_line(key),
            ]
            fleet_commands["lab"] = [python, "-m", "nodelab", *fleet, "--state-dir", str(LAB_DIR)]
            fleet_commands["emulator"] = [
                python,
                "-m",
                "emulator",
                *fleet,
                "--state-dir",
                str(EMULATOR_DIR),
            ]
        commands = {
            "web": [python, "manage.py", "runserver", options["addr"], "--noreload"],
            "worker": worker,
            # Beat's scheduler (django-celery-beat, in the database) comes from settings.
            "beat": [python, "-m", "celery", "-A", "gpuplatform", "beat", "--loglevel", "INFO"],
            # renters reach their slices through it (GPUPLATFORM_GATEWAY_ADDRESS)
            "gateway": [python, "manage.py", "run_gateway"],
        }
        procs: dict[str, subprocess.Popen] = {}
        stopping = False

        def stop(*_):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        exit_code = 0
        try:
            if fleet_commands:
                self._start_fleet(procs, fleet_commands, options["far_end"])
            for name, argv in commands.items():
                # Own session: the terminal's Ctrl-C reaches us, and we stop children in order.
                procs[name] = subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
                    argv, cwd=settings.BASE_DIR, start_new_session=True
                )
                self.stdout.write(f"started {name} (pid {procs[name].pid})")
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
            # the lab removes its containers and stops its daemons: give it longer
            deadline = time.monotonic() + (45 if "lab" in procs else 15)
            for name, proc in procs.items():
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                self.stdout.write(f"stopped {name}")
        if exit_code:
            sys.exit(exit_code)

    def _start_fleet(self, procs: dict, commands: dict, far_end: str) -> None:  # type: ignore[type-arg]
        """Start the lab (or, where it cannot start and none was forced, the emulator),
        register its nodes and say which far end the demo runs against."""
        if far_end in ("auto", "lab"):
            proc = self._spawn_fleet(procs, "lab", commands["lab"], LAB_DIR)
            reason = self._register_fleet(proc, LAB_DIR / "fleet.json", "lab", required=False)
            if reason is None:
                self.stdout.write(
                    "demo fleet: lab nodes (real sshd and Docker Engine per node, emulated "
                    "GPUs); the demo's slices are real containers: `docker --host "
                    "unix://<node's docker.sock above> ps` lists them"
                )
                return
            procs.pop("lab")
            if far_end == "lab":
                raise CommandError(f"the node lab cannot start: {reason}")
            self.stdout.write(f"the node lab cannot start here ({reason}): using the emulator")
        proc = self._spawn_fleet(procs, "emulator", commands["emulator"], EMULATOR_DIR)
        self._register_fleet(proc, EMULATOR_DIR / "fleet.json", "emulator", required=True)
        self.stdout.write("demo fleet: emulated nodes (the pure-Python node emulator)")

    def _spawn_fleet(self, procs: dict, name: str, argv: list[str], state: Path):  # type: ignore[no-untyped-def, type-arg]
        state.mkdir(parents=True, exist_ok=True)
        (state / "fleet.json").unlink(missing_ok=True)
        log = (state / "start.log").open("wb")
        procs[name] = subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
            argv, cwd=settings.BASE_DIR, start_new_session=True, stderr=log
        )
        log.close()
        self.stdout.write(f"started {name} (pid {procs[name].pid})")
        return procs[name]

    def _register_fleet(
        self, proc: subprocess.Popen, fleet_file: Path, name: str, *, required: bool
    ) -> str | None:
        """Register the fleet once its file appears; the reason it did not, otherwise."""
        deadline = time.monotonic() + 120
        while not fleet_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log = fleet_file.parent / "start.log"
                lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
                reason = lines[-1] if lines else f"{name} exited with {proc.returncode}"
                reason = reason.removeprefix("the node lab cannot start: ")
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                if required:
                    raise CommandError(f"the {name} did not start: {reason}")
                return reason
            time.sleep(0.2)
        count = len(json.loads(fleet_file.read_text()).get("nodes", []))
        call_command("register_fleet", str(fleet_file), stdout=self.stdout)
        self.stdout.write(f"demo fleet: {count} {name} nodes registered")
        return None
