"""`make run`'s last step: the demo fleet, web, worker and beat as real processes on the
embedded defaults (SQLite, filesystem broker), a task flowing from web-side code to the
worker, and Ctrl-C stopping all of them. Twice: against the node lab (a demo slice is a
real container in the lab node's Docker Engine) and against the emulator."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from nodelab import problems
from tests.lab_support import unavailable

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
def embedded_env(tmp_path):
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


# A demo tenant's slice, launched as the demo would (seed_demo ran first): on the lab it
# must become a real container.
LAUNCH = """
from tenants import services
from tenants.models import Image, Membership, Tier, Slice
m = Membership.objects.get(user__username="demo@example.com")
p, _ = services.purchase_create(membership=m, tier=Tier.objects.get(vram_mb=4096), hours=1)
s, _ = services.slice_launch(
    membership=m, purchase=p, image=Image.objects.get(reference="gpuplatform-lab/workload:1"),
    model_request={"model": {"catalog": "Qwen/Qwen2.5-0.5B"}, "context_tokens": 1024},
    environment={"WORKLOAD_MB": "600"},
)
print(s.pk)
"""
STATE = (
    "from tenants.models import Slice; s = Slice.objects.get(pk={pk}); "
    "print(s.state, s.container_id)"
)


def _shell(env: dict, script: str) -> str:
    result = subprocess.run(
        [PY, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    return lines[-1] if lines else ""  # what the script printed last (kombu warns first)


@pytest.mark.parametrize(
    "far_end", [pytest.param("lab", marks=pytest.mark.lab), "emulator"], ids=["lab", "emulator"]
)
def test_run_stack_serves_runs_tasks_and_stops_everything_on_ctrl_c(
    far_end, embedded_env, tmp_path
):
    if far_end == "lab" and problems():
        unavailable(problems()[0])
    port = _free_port()
    log = tmp_path / "stack.log"
    env = {
        **embedded_env,
        "GPUPLATFORM_DEMO_FAR_END": far_end,
        "GPUPLATFORM_GATEWAY_ADDRESS": f"127.0.0.1:{_free_port()}",
    }
    if far_end == "lab":
        seeded = subprocess.run(
            [PY, "manage.py", "seed_demo"], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert seeded.returncode == 0, seeded.stderr
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
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    docker_host = None
    try:
        deadline = time.monotonic() + 90
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
        _shell(
            env,
            "from tenants import services; "
            "m = services.tenant_sign_up(email='o@stack.test', "
            "password='stack-passphrase-long-1', tenant_name='Stack'); "
            "services.invitation_create(actor_membership=m, email='new@stack.test', "
            "role='member')",
        )
        while "To: new@stack.test" not in log.read_text():
            assert time.monotonic() < deadline + 30, log.read_text()
            time.sleep(0.5)
        # The demo fleet is registered, says which far end it is, and the worker
        # discovers its GPUs over SSH.
        text = log.read_text()
        assert f"demo fleet: 2 {far_end} nodes registered" in text
        which = "lab nodes (real sshd and Docker Engine" if far_end == "lab" else "emulated nodes"
        assert f"demo fleet: {which}" in text
        count = "from nodes.models import Gpu; print(Gpu.objects.filter(present=True).count())"
        while _shell(env, count) in ("", "0"):
            assert time.monotonic() < deadline + 60, log.read_text()
            time.sleep(1)
        if far_end == "lab":
            fleet = json.loads((tmp_path / "lab" / "fleet.json").read_text())
            docker_host = fleet["nodes"][0]["docker_host"]
            pk = _shell(env, LAUNCH)
            while not _shell(env, STATE.format(pk=pk)).startswith(("running", "failed")):
                assert time.monotonic() < deadline + 90, log.read_text()
                time.sleep(0.5)
            state, container = _shell(env, STATE.format(pk=pk)).split()
            assert state == "running", log.read_text()
            # the demo's slice is a real container in a lab node's Docker Engine
            hosts = [n["docker_host"] for n in fleet["nodes"]]
            listed = [
                subprocess.run(
                    ["docker", "--host", h, "ps", "--quiet", "--no-trunc"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                for h in hosts
            ]
            assert [container] in listed, listed
        # the embedded database (SQLite) takes a sample and the telemetry rollup too
        rollup = (
            "from datetime import timedelta; from django.utils import timezone; "
            "from nodes import services; from nodes.models import Node; "
            "services.nodes_sample(node_ids=list(Node.objects.values_list('pk', flat=True))); "
            "print(services.samples_rollup_and_prune(now=timezone.now() + timedelta(minutes=10))"
            "['rollups'])"
        )
        assert int(_shell(env, rollup)) > 0
        children = _children(stack.pid)
    finally:
        stack.send_signal(signal.SIGINT)
        try:
            code = stack.wait(timeout=60)
        except subprocess.TimeoutExpired:
            stack.kill()
            raise
    assert code == 0, log.read_text()
    text = log.read_text()
    for name in (far_end, "web", "worker", "beat", "gateway", "edge"):
        assert f"stopped {name}" in text
    time.sleep(0.5)
    alive = [pid for pid in children if _running(pid)]
    assert alive == [], f"left running: {alive}"
    if docker_host:  # the lab's daemons are gone with it, and its files
        assert not Path(docker_host.removeprefix("unix://")).exists()
