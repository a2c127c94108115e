"""Run the demo fleet, web, Celery worker, Celery beat, the SSH gateway and the edge as
real processes; Ctrl-C stops them all.

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
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from gpuplatform.workers import worker_argv
from nodes import ssh

LAB_DIR = settings.VAR_DIR / "lab"
EMULATOR_DIR = settings.VAR_DIR / "emulator"

Popen = subprocess.Popen[bytes]  # a started process: its output is not read here
Commands = dict[str, list[str]]  # a process's name -> its argv


def _worker_argv() -> list[str]:
    queues = ",".join(settings.CELERY_QUEUE_NAMES)
    if settings.CELERY_BROKER_URL.startswith("filesystem"):
        # The filesystem transport has no fanout: no remote control or gossip.
        return worker_argv(queues=queues, hostname="worker@%h", pool="solo", without_peers=True)
    return worker_argv(queues=queues, hostname="worker@%h", concurrency=2)


def _fleet_commands(*, count: int, base_port: int) -> Commands:
    """The node lab's and the emulator's command lines for `count` demo nodes."""
    key = ssh.load_or_create_platform_key(Path(settings.NODES_SSH_KEY_PATH))
    python = sys.executable
    fleet = [
        "--count",
        str(count),
        "--base-port",
        str(base_port),
        "--authorized-key",
        ssh.public_key_line(key),
    ]
    return {
        "lab": [python, "-m", "nodelab", *fleet, "--state-dir", str(LAB_DIR)],
        "emulator": [python, "-m", "emulator", *fleet, "--state-dir", str(EMULATOR_DIR)],
    }


def _service_commands(addr: str) -> Commands:
    """Web, worker, beat, the gateway and the edge, in the order they start."""
    python = sys.executable
    return {
        "web": [python, "manage.py", "runserver", addr, "--noreload"],
        "worker": _worker_argv(),
        # Beat's scheduler (django-celery-beat, in the database) comes from settings.
        "beat": [python, "-m", "celery", "-A", "gpuplatform", "beat", "--loglevel", "INFO"],
        # renters reach their slices through it (GPUPLATFORM_GATEWAY_ADDRESS)
        "gateway": [python, "manage.py", "run_gateway"],
        # the web terminal's WebSockets and the slices' port addresses
        # (GPUPLATFORM_EDGE_ADDRESS, GPUPLATFORM_PROXY_DOMAIN)
        "edge": [python, "manage.py", "run_edge"],
    }


class Command(BaseCommand):
    help = (
        "Start the demo fleet (node lab or emulator), web, a Celery worker, beat, the gateway "
        "and the edge."
    )

    def add_arguments(self, parser: CommandParser) -> None:
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

    def handle(self, *args: Any, **options: Any) -> None:
        fleet_commands = (
            _fleet_commands(count=options["fleet"], base_port=options["fleet_base_port"])
            if options["fleet"] > 0
            else {}
        )
        commands = _service_commands(options["addr"])
        procs: dict[str, Popen] = {}
        self._stopping = False
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGTERM, self._stop)
        exit_code = 0
        try:
            if fleet_commands:
                self._start_fleet(procs, fleet_commands, options["far_end"])
            self._start_services(procs, commands, options["addr"])
            exit_code = self._watch(procs)
        finally:
            self._stop_all(procs)
        if exit_code:
            sys.exit(exit_code)

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        """SIGINT and SIGTERM: leave the watch loop, which stops every process."""
        self._stopping = True

    def _start_services(self, procs: dict[str, Popen], commands: Commands, addr: str) -> None:
        for name, argv in commands.items():
            # Own session: the terminal's Ctrl-C reaches us, and we stop children in order.
            procs[name] = subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
                argv, cwd=settings.BASE_DIR, start_new_session=True
            )
            self.stdout.write(f"started {name} (pid {procs[name].pid})")
        self.stdout.write(
            self.style.SUCCESS(
                f"gpuplatform is up at http://{addr}/ (Ctrl-C stops {', '.join(procs)})"
            )
        )

    def _watch(self, procs: dict[str, Popen]) -> int:
        """Until a signal or a process's exit: the exit code the command ends with."""
        exit_code = 0
        while not self._stopping:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    self.stderr.write(f"{name} exited with {proc.returncode}; stopping all")
                    exit_code = proc.returncode or 1
                    self._stopping = True
                    break
            time.sleep(0.5)
        return exit_code

    def _stop_all(self, procs: dict[str, Popen]) -> None:
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

    def _start_fleet(self, procs: dict[str, Popen], commands: Commands, far_end: str) -> None:
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

    def _spawn_fleet(
        self, procs: dict[str, Popen], name: str, argv: list[str], state: Path
    ) -> Popen:
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
        self, proc: Popen, fleet_file: Path, name: str, *, required: bool
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
