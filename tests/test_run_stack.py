"""`make run`'s last step: web, worker and beat as real processes on the embedded
defaults (SQLite, filesystem broker), a task flowing from web-side code to the worker,
and Ctrl-C stopping all of them."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _free_port(count: int = 1) -> int:
    """A port p with p .. p+count-1 all free on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            held = []
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return base
    raise RuntimeError("no free ports")


def _children(pid: int) -> set[int]:
    """Every live descendant of pid (from /proc; no extra dependency)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture
def embedded_env(tmp_path):  # type: ignore[no-untyped-def]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        GPUPLATFORM_EMULATOR_CONTROL_PORT="0",
        GPUPLATFORM_VAR_DIR=str(tmp_path),
        EMAIL_URL="consolemail://",
        DJANGO_SETTINGS_MODULE="gpuplatform.settings",
    )
    result = subprocess.run(
        [PY, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    return env


def test_run_stack_serves_runs_tasks_and_stops_everything_on_ctrl_c(embedded_env, tmp_path):  # type: ignore[no-untyped-def]
    port = _free_port()
    log = tmp_path / "stack.log"
    with log.open("w") as out:
        stack = subprocess.Popen(
            [
                PY,
                "manage.py",
                "run_stack",
                "--addr",
                f"127.0.0.1:{port}",
                "--fleet",
                "2",
                "--fleet-base-port",
                str(_free_port(2)),
            ],
            cwd=ROOT,
            env=embedded_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz/", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                assert stack.poll() is None, log.read_text()
                time.sleep(0.5)
        while "ready." not in log.read_text():  # the worker says so once consuming
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        assert len(_children(stack.pid)) >= 3  # web, worker, beat (and their helpers)

        # Code in another process dispatches after commit; the worker (filesystem
        # broker, no server) sends the invitation email to its console.
        script = (
            "from tenants import services; "
            "m = services.tenant_sign_up(email='o@stack.test', "
            "password='stack-passphrase-long-1', tenant_name='Stack'); "
            "services.invitation_create(actor_membership=m, email='new@stack.test', "
            "role='member')"
        )
        result = subprocess.run(
            [PY, "manage.py", "shell", "-c", script],
            cwd=ROOT,
            env=embedded_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        while "To: new@stack.test" not in log.read_text():
            assert time.monotonic() < deadline + 30, log.read_text()
            time.sleep(0.5)
        # The demo fleet is registered, and the worker discovers its GPUs over SSH.
        assert "demo fleet: 2 emulated nodes registered" in log.read_text()
        count = "from nodes.models import Gpu; print(Gpu.objects.filter(present=True).count())"
        while True:
            gpus = subprocess.run(
                [PY, "manage.py", "shell", "-c", count],
                cwd=ROOT,
                env=embedded_env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            if gpus.stdout.strip() not in ("", "0"):
                break
            assert time.monotonic() < deadline + 60, log.read_text()
            time.sleep(1)
        children = _children(stack.pid)
    finally:
        stack.send_signal(signal.SIGINT)
        try:
            code = stack.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stack.kill()
            raise
    assert code == 0, log.read_text()
    text = log.read_text()
    for name in ("emulator", "web", "worker", "beat"):
        assert f"stopped {name}" in text
    time.sleep(0.5)
    alive = [pid for pid in children if _running(pid)]
    assert alive == [], f"left running: {alive}"
