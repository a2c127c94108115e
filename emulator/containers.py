"""The node's containers and processes: the Container record, docker's id, name and
lookup rules, the VRAM caps a container is given, and its start, exit, stop and pause."""

from __future__ import annotations

import contextlib
import secrets
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .gpus import GpuProcess, GpuState
from .workload import Workload

if TYPE_CHECKING:
    from .clock import Clock


def parse_size_mb(value: str) -> float | None:
    """'4096m', '4g', '512M', '1073741824' (bytes) -> MiB."""
    v = value.strip().lower()
    if not v:
        return None
    units = {"k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0 * 1024}
    try:
        if v.endswith("b") and v[:-1][-1:] in units:
            v = v[:-1]
        if v[-1] in units:
            return float(v[:-1]) * units[v[-1]]
        if v.endswith("b"):
            v = v[:-1]
        return float(v) / (1024 * 1024)
    except (ValueError, IndexError):
        return None


@dataclass
class Container:
    id: str
    name: str
    image: str
    cmd: list[str]
    env: list[str]
    labels: dict[str, str]
    created: float
    host_config: dict[str, Any]
    ports: list[tuple[str, str, int]]  # (container port "8888/tcp", host ip, host port)
    gpu_request: str | None  # the raw --gpus value
    device: tuple[int, int | None] | None = None  # (gpu index, mig index)
    workload: Workload | None = None
    limit_mb: float | None = None  # the tightest cap it was given, enforced or not
    limit_source: str | None = None
    hard_limit_mb: float | None = None  # what stops any allocation: MIG, the quota library
    status: str = "created"  # created | running | exited (paused: running + `paused`)
    paused: bool = False
    paused_at: float | None = None  # emulated time of the current pause
    paused_s: float = 0.0  # emulated seconds spent paused in earlier pauses
    started: float | None = None
    finished: float | None = None
    exit_code: int = 0
    oom_killed: bool = False
    error: str = ""
    pid: int = 0
    restart_count: int = 0
    used_mb: int = 0
    quota_hit_logged: bool = False
    auto_remove: bool = False
    logs: list[tuple[float, str, str]] = field(default_factory=list)  # (time, stream, line)

    @property
    def env_dict(self) -> dict[str, str]:
        out = {}
        for item in self.env:
            k, _, v = item.partition("=")
            out[k] = v
        return out

    @property
    def running(self) -> bool:
        """Docker's State.Running: a paused container is still running (and holds its
        memory)."""
        return self.status == "running"

    @property
    def state(self) -> str:
        """Docker's State.Status: created | running | paused | exited."""
        return "paused" if self.paused and self.running else self.status

    def run_s(self, now: float) -> float:
        """Emulated wall seconds the workload has run (paused time excluded)."""
        if self.started is None:
            return 0.0
        held = self.paused_s
        if self.paused and self.paused_at is not None:
            held += now - self.paused_at
        return max(0.0, now - self.started - held)

    def wall_time(self, run_s: float) -> float:
        """The emulated time at which the workload will have run `run_s` seconds (while
        it is not paused again)."""
        return (self.started or 0.0) + self.paused_s + run_s

    def log(self, t: float, stream: str, text: str) -> None:
        for line in text.splitlines():
            self.logs.append((t, stream, line))


_ADJECTIVES = (
    "admiring",
    "brave",
    "clever",
    "eager",
    "focused",
    "gallant",
    "happy",
    "jolly",
    "keen",
    "loving",
    "nifty",
    "quirky",
    "serene",
    "vibrant",
    "wizardly",
    "zealous",
)
_SURNAMES = (
    "hopper",
    "turing",
    "lovelace",
    "curie",
    "noether",
    "dijkstra",
    "knuth",
    "ritchie",
    "shannon",
    "babbage",
    "galois",
    "hamilton",
    "kepler",
    "euler",
    "gauss",
    "tesla",
)


class ContainerOps:
    """NodeState's containers and processes (mixed in by emulator.state, whose __init__
    sets the attributes declared here)."""

    lock: threading.RLock
    clock: Clock
    gpus: list[GpuState]
    containers: dict[str, Container]
    host_processes: dict[int, GpuProcess]
    quota_library: str | None
    quota_library_enforces: bool

    if TYPE_CHECKING:

        def new_pid(self) -> int: ...  # emulator.state.NodeState

        def refresh(self) -> None: ...  # emulator.vram.VramAccounting

    # ------------------------------------------------------------------ processes
    def add_host_process(
        self,
        gpu_index: int,
        used_mb: int,
        name: str = "python3",
        sm: int = 0,
        mem: int = 0,
        container_id: str | None = None,
    ) -> int:
        """A GPU process no container of this node runs: a bare one, or (with
        `container_id`) one its container left behind, whose cgroup still names it."""
        with self.lock:
            pid = self.new_pid()
            self.host_processes[pid] = GpuProcess(
                gpu_index,
                None,
                pid,
                int(used_mb),
                name,
                f"/usr/bin/{name}",
                container_id,
                sm,
                mem,
                sm,
                mem,
            )
            return pid

    def kill_pid(self, pid: int) -> bool:
        with self.lock:
            if self.host_processes.pop(pid, None):
                return True
            for c in self.containers.values():
                if c.running and c.pid == pid:
                    self.stop_container(c, 137, "killed")
                    return True
            return False

    # ------------------------------------------------------------------ containers
    def new_container_id(self) -> str:
        while True:
            cid = secrets.token_hex(32)
            if cid not in self.containers and not cid[:12].isdigit():
                return cid

    def random_name(self) -> str:
        names = {c.name for c in self.containers.values()}
        while True:
            n = (
                f"{_ADJECTIVES[secrets.randbelow(len(_ADJECTIVES))]}_"
                f"{_SURNAMES[secrets.randbelow(len(_SURNAMES))]}"
            )
            if n not in names:
                return n

    def find_container(self, ref: str) -> Container | None:
        """Docker's lookup order: full id, name, unique id prefix."""
        if not ref:
            return None
        c = self.containers.get(ref)
        if c:
            return c
        name = ref[1:] if ref.startswith("/") else ref
        for c in self.containers.values():
            if c.name == name:
                return c
        matches = [c for cid, c in self.containers.items() if cid.startswith(ref.lower())]
        return matches[0] if len(matches) == 1 else None

    def _limits(self, c: Container) -> list[tuple[float, str]]:
        """Every VRAM cap the container was given: (MiB, "mig" | "framework" |
        "quota-library")."""
        env = c.env_dict
        limits: list[tuple[float, str]] = []
        if c.device is not None:
            gpu = self.gpus[c.device[0]]
            if c.device[1] is not None:
                limits.append((float(gpu.mig_devices[c.device[1]].profile.memory_mb), "mig"))
        fw = env.get("GPUPLATFORM_VRAM_LIMIT_MB")
        if fw:
            with contextlib.suppress(ValueError):
                limits.append((float(fw), "framework"))
        if self._quota_library_loaded(env):
            for key in ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0"):
                if key in env:
                    mb = parse_size_mb(env[key])
                    if mb is not None:
                        limits.append((mb, "quota-library"))
        return limits

    def _quota_library_loaded(self, env: dict[str, str]) -> bool:
        """The node's quota library intercepts CUDA only when it is preloaded
        (LD_PRELOAD names it; the separator is a colon or a space)."""
        if not self.quota_library or not self.quota_library_enforces:
            return False
        preload = env.get("LD_PRELOAD", "").replace(":", " ").split()
        return self.quota_library in preload

    def effective_limit(self, c: Container) -> tuple[float | None, str | None]:
        """The tightest cap the container was given, enforced or advisory."""
        limits = self._limits(c)
        return min(limits) if limits else (None, None)

    def hard_limit(self, c: Container) -> float | None:
        """The cap that stops any allocation: a MIG device's size or the quota library's
        limit. The framework cap is advisory: only cooperative code honours it."""
        hard = [mb for mb, source in self._limits(c) if source != "framework"]
        return min(hard) if hard else None

    def start_container(self, c: Container) -> None:
        now = self.clock.now()
        c.status = "running"
        c.started = now
        c.finished = None
        c.exit_code = 0
        c.oom_killed = False
        c.error = ""
        c.pid = self.new_pid()
        c.quota_hit_logged = False
        c.paused, c.paused_at, c.paused_s = False, None, 0.0
        c.used_mb = 0
        c.limit_mb, c.limit_source = self.effective_limit(c)
        c.hard_limit_mb = self.hard_limit(c)
        if c.device is not None:
            c.workload = Workload.from_env(c.env_dict)
            w = c.workload
            gpu = self.gpus[c.device[0]]
            target = gpu.mig_devices[c.device[1]].uuid if c.device[1] is not None else gpu.uuid
            if w.unknown_profile:
                c.log(
                    now,
                    "stderr",
                    f"gpu-workload: unknown profile {w.unknown_profile!r}, using steady",
                )
            c.log(
                now,
                "stdout",
                f"gpu-workload: profile={w.profile} base={int(w.base_mb)}MiB "
                f"device={target} quota="
                + (f"{int(c.limit_mb)}MiB ({c.limit_source})" if c.limit_mb else "none")
                + (
                    f" enforced={int(c.hard_limit_mb)}MiB"
                    if c.hard_limit_mb is not None
                    else " enforced=none"
                )
                + ("" if w.cooperative else " cooperative=no"),
            )
            if gpu.mig_enabled and c.device[1] is None:
                self.container_exit(
                    c,
                    now,
                    1,
                    stream_text=(
                        "Traceback (most recent call last):\n"
                        '  File "/app/main.py", line 3, in <module>\n'
                        "    torch.cuda.init()\n"
                        "RuntimeError: CUDA error: no CUDA-capable device is detected"
                    ),
                )
        else:
            c.workload = None
            c.log(now, "stdout", "gpu-workload: started without a GPU")

    def container_exit(
        self, c: Container, at: float, code: int, *, oom_killed: bool = False, stream_text: str = ""
    ) -> None:
        if stream_text:
            c.log(at, "stderr", stream_text)
        c.status = "exited"
        c.finished = at
        c.exit_code = code
        c.oom_killed = oom_killed
        c.pid = 0
        c.used_mb = 0
        c.paused, c.paused_at = False, None

    def stop_container(self, c: Container, code: int = 137, why: str = "stopped") -> None:
        if c.running:
            self.refresh()
            if c.running:
                self.container_exit(c, self.clock.now(), code)

    def pause_container(self, c: Container) -> str:
        """`docker pause`: the processes are frozen (cgroup freezer): they keep their
        memory, compute nothing, and the workload's clock stops. Returns docker's error
        text, "" when done."""
        with self.lock:
            self.refresh()
            if not c.running:
                return f"Container {c.id} is not running"
            if c.paused:
                return f"Container {c.id} is already paused"
            c.paused, c.paused_at = True, self.clock.now()
            self.refresh()
            return ""

    def unpause_container(self, c: Container) -> str:
        with self.lock:
            self.refresh()
            if not c.paused or not c.running:
                return f"Container {c.id} is not paused"
            now = self.clock.now()
            c.paused_s += now - (c.paused_at if c.paused_at is not None else now)
            c.paused, c.paused_at = False, None
            self.refresh()
            return ""
