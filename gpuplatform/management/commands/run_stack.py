"""Run web, Celery worker and Celery beat as real processes; Ctrl-C stops them all.

If one of them dies, the others are stopped too, so a broken stack never looks alive.
"""

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Start web (runserver), a Celery worker and Celery beat; stop all on Ctrl-C."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("--addr", default=os.environ.get("GPUPLATFORM_ADDR", "127.0.0.1:8000"))

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
        commands = {
            "web": [python, "manage.py", "runserver", options["addr"], "--noreload"],
            "worker": worker,
            # Beat's scheduler (django-celery-beat, in the database) comes from settings.
            "beat": [python, "-m", "celery", "-A", "gpuplatform", "beat", "--loglevel", "INFO"],
        }
        procs: dict[str, subprocess.Popen] = {}
        stopping = False

        def stop(*_):  # type: ignore[no-untyped-def]
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        for name, argv in commands.items():
            # Own process group: the terminal's Ctrl-C reaches us, and we stop children in order.
            procs[name] = subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
                argv, cwd=settings.BASE_DIR, start_new_session=True
            )
            self.stdout.write(f"started {name} (pid {procs[name].pid})")
        self.stdout.write(
            self.style.SUCCESS(
                f"gpuplatform is up at http://{options['addr']}/ (Ctrl-C stops web, worker, beat)"
            )
        )
        exit_code = 0
        try:
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
