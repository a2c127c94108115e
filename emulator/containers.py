"""The node's containers and processes: the Container record, docker's id, name and
lookup rules, the VRAM caps a container is given, and its start, exit, stop and pause."""

from __future__ import annotations

import contextlib
import re
import secrets
import shlex
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .catalog import QUOTA_FROM_NODE
from .gpus import GpuProcess, GpuState
from .workload import ENV_PREFIX, TENANT_PREFIXES, Workload

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


def library_size_mb(value: str) -> float | None:
    """A size as HAMi-core reads it: '8192m', '80g', '512k'; a bare number is MiB."""
    v = value.strip().lower()
    if v.isdigit():
        return float(v)
    return parse_size_mb(v) if v[-1:] in ("k", "m", "g", "t") else None


# --- the environment the container's program really runs with
#
# The container's configured environment is the platform's (docker run -e); the program
# may change its own before it starts CUDA: an `env` wrapper in its command, a shell
# script's export/unset, or (the workload knobs below) its own setenv/unsetenv calls, a
# shell opened inside the slice doing the same. Only the quota library decides whether
# any of that matters (LibraryView).

PROCESS_ENV_KNOB = "PROCESS_ENV"  # "NAME=value NAME=value": set by the program itself
PROCESS_UNSET_KNOB = "PROCESS_UNSET"  # "NAME NAME": unset by the program itself
# "static": a statically linked job, or one that drives the device without libcuda (its
# own ioctls): no preload of any kind reaches it, so no quota library sees its memory.
LINKAGE_KNOB = "LINKAGE"
SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh", "busybox"})
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_STATEMENT_SPLIT_RE = re.compile(r"\n|;|&&|\|\|")


def knob(env: dict[str, str], name: str) -> str:
    """A workload knob as the tenant's program reads it: GPUPLATFORM_EMULATOR_<name>, or
    the tenant's own EMULATOR_<name> / WORKLOAD_<name>."""
    for prefix in (ENV_PREFIX, *TENANT_PREFIXES):
        if prefix + name in env:
            return env[prefix + name]
    return ""


def _assignment(word: str) -> tuple[str, str] | None:
    name, eq, value = word.partition("=")
    return (name, value) if eq and _NAME_RE.match(name) else None


def _env_wrapper(argv: list[str], env: dict[str, str]) -> list[str]:
    """`env [-i] [-u NAME]... [NAME=value]... program...`, applied to `env` in place;
    returns the program's argv (which may be another wrapper, or empty)."""
    while argv and argv[0].rsplit("/", 1)[-1] == "env":
        rest = argv[1:]
        while rest:
            word = rest[0]
            if word in ("-i", "-", "--ignore-environment"):
                env.clear()
            elif word in ("-u", "--unset") and len(rest) > 1:
                env.pop(rest[1], None)
                rest = rest[1:]
            elif word.startswith("--unset="):
                env.pop(word.partition("=")[2], None)
            elif word.startswith("-u") and len(word) > 2:
                env.pop(word[2:], None)
            elif word == "--":
                rest = rest[1:]
                break
            elif not word.startswith("-"):
                break
            rest = rest[1:]
        while rest and (pair := _assignment(rest[0])) is not None:
            env[pair[0]] = pair[1]
            rest = rest[1:]
        argv = rest
    return argv


def _shell_script(script: str, args: list[str], env: dict[str, str]) -> dict[str, str]:
    """The environment a `sh -c SCRIPT $0 ARGS...` gives its job: the program it runs as
    `"$@"` (ARGS) where it does, else its last one; through `export` and `unset`
    statements, `NAME=value program` prefixes, `exec` and `env` wrappers. A reading of
    the plain forms, not a shell: what it cannot read it leaves alone."""
    env = dict(env)
    last = env
    job: dict[str, str] | None = None
    for statement in _STATEMENT_SPLIT_RE.split(script):
        try:
            words = shlex.split(statement, comments=True)
        except ValueError:
            continue
        if words[:1] == ["exec"]:
            words = words[1:]
        if not words:
            continue
        if words[0] in ("export", "unset"):
            for w in words[1:]:
                if words[0] == "unset" and _NAME_RE.match(w):
                    env.pop(w, None)
                elif words[0] == "export" and (pair := _assignment(w)) is not None:
                    env[pair[0]] = pair[1]
            last = env
            continue
        if "$@" in words:
            # inside whatever plumbing the script wraps it in, the job is ARGS
            local = dict(env)
            _env_wrapper(list(args), local)
            job = local
            continue
        local = dict(env)
        while words and (pair := _assignment(words[0])) is not None:
            local[pair[0]] = pair[1]
            words = words[1:]
        if not words:
            # a bare assignment changes the environment only for a name already in it
            env.update({k: v for k, v in local.items() if k in env})
            last = env
            continue
        _env_wrapper(words, local)
        last = local
    return dict(job if job is not None else last)


def process_environment(cmd: list[str], configured: dict[str, str]) -> dict[str, str]:
    """The environment the container's program runs with: its configured environment as
    its command (and its own knobs) change it."""
    env = dict(configured)
    argv = _env_wrapper(list(cmd), env)
    if argv and argv[0].rsplit("/", 1)[-1] == "busybox":
        argv = argv[1:]
    base = argv[0].rsplit("/", 1)[-1] if argv else ""
    if base in SHELLS and len(argv) > 2 and argv[1] in ("-c", "-lc", "-ec"):
        env = _shell_script(argv[2], argv[4:], env)
    for item in knob(env, PROCESS_ENV_KNOB).split():
        if (pair := _assignment(item)) is not None:
            env[pair[0]] = pair[1]
    for name in knob(env, PROCESS_UNSET_KNOB).replace(",", " ").split():
        env.pop(name, None)
    return env


# The quota library's own settings, HAMi-core's names.
LIBRARY_LIMITS = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0")
LIBRARY_BOOKS = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
LIBRARY_OFF = "CUDA_DISABLE_CONTROL"


@dataclass(frozen=True)
class LibraryView:
    """The node's quota library as the container's program meets it."""

    given: bool = False  # the hook gave the container the library and its books
    loaded: bool = False  # it is in the program (preloaded, by LD_PRELOAD or ld.so.preload)
    enforcing: bool = False
    limit_mb: float | None = None
    counted: bool = False  # the program's memory is in the container's books
    state: str = "none"  # none | not loaded | bypassed | switched off | enforcing | no limit


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
    library: LibraryView = field(default_factory=LibraryView)  # as its program met it
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
    quota_library_config: str
    processes: list[GpuProcess]

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
        """Every VRAM cap the container's program was given: (MiB, "mig" | "framework" |
        "quota-library")."""
        env = process_environment(c.cmd, c.env_dict)
        limits: list[tuple[float, str]] = []
        if c.device is not None:
            gpu = self.gpus[c.device[0]]
            if c.device[1] is not None:
                limits.append((float(gpu.mig_devices[c.device[1]].profile.memory_mb), "mig"))
        fw = env.get("GPUPLATFORM_VRAM_LIMIT_MB")
        if fw:
            with contextlib.suppress(ValueError):
                limits.append((float(fw), "framework"))
        library = self.library_view(c)
        if library.enforcing and library.limit_mb is not None:
            limits.append((library.limit_mb, "quota-library"))
        return limits

    def _preloads(self, env: dict[str, str]) -> bool:
        """LD_PRELOAD names the node's quota library (a colon or a space separates)."""
        preload = env.get("LD_PRELOAD", "").replace(":", " ").split()
        return bool(self.quota_library) and self.quota_library in preload

    def library_view(self, c: Container) -> LibraryView:
        """The node's quota library as the container's program meets it.

        The hook gives the library (and its books) to the containers the platform
        preloads it into, by their configured environment. Where the node gives the
        limits (QUOTA_FROM_NODE), a read-only /etc/ld.so.preload loads it into every
        dynamically linked process and a read-only /overrideEnv replaces the process's
        own settings with the container's: limits, books, CUDA_DISABLE_CONTROL=false.
        Elsewhere (QUOTA_FROM_ENVIRONMENT, HAMi-core upstream) the program's own
        environment decides: unset LD_PRELOAD and it is not loaded, CUDA_DISABLE_CONTROL
        =true and it neither enforces nor keeps books (as the lab's stand-in), its own
        limit and that is the limit, its own books path and the node's books miss it."""
        if not self.quota_library or not self.quota_library_enforces:
            return LibraryView()
        configured = c.env_dict
        given = self._preloads(configured)
        env = process_environment(c.cmd, configured)
        if knob(env, LINKAGE_KNOB).strip().lower() == "static":
            return LibraryView(given=given, state="bypassed")
        from_node = given and self.quota_library_config == QUOTA_FROM_NODE
        if from_node:
            node_limits = {k: configured[k] for k in LIBRARY_LIMITS if k in configured}
            settings = {**env, **node_limits, LIBRARY_OFF: "false"}
        elif self._preloads(env):
            settings = env
        else:
            return LibraryView(given=given, state="not loaded")
        if settings.get(LIBRARY_OFF, "").strip().lower() == "true":
            return LibraryView(given=given, loaded=True, state="switched off")
        limit = None
        for key in ("CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_MEMORY_LIMIT"):
            if settings.get(key, "").strip():  # the device's own limit first, as HAMi-core
                limit = library_size_mb(settings[key])
                break
        # the node's override names the books the hook mounted; a process's own names
        # somewhere else, which the node's sampler never reads
        counted = from_node or (given and env.get(LIBRARY_BOOKS) == configured.get(LIBRARY_BOOKS))
        enforcing = limit is not None and limit > 0
        return LibraryView(
            given=given,
            loaded=True,
            enforcing=enforcing,
            limit_mb=limit if enforcing else None,
            counted=counted,
            state="enforcing" if enforcing else "no limit",
        )

    def quota_books(self) -> list[dict[str, Any]] | None:
        """What the node's quota library counts each container with GPU processes as
        holding, as the sampler reads its books (`quota_usage`); None where the node
        keeps none. A program the library is not in adds nothing to its container's."""
        if not self.quota_library:
            return None
        with_processes = {p.container_id for p in self.processes if p.container_id}
        books = []
        for c in sorted(self.containers.values(), key=lambda c: c.id):
            if c.running and c.id in with_processes and c.library.given:
                books.append(
                    {"container_id": c.id, "used_mb": c.used_mb if c.library.counted else 0}
                )
        return books

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
        c.library = self.library_view(c) if c.device is not None else LibraryView()
        c.limit_mb, c.limit_source = self.effective_limit(c)
        c.hard_limit_mb = self.hard_limit(c)
        if c.device is not None:
            # the program reads its knobs from its own environment, as it runs
            c.workload = Workload.from_env(process_environment(c.cmd, c.env_dict))
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
            if c.library.state == "switched off":  # what the lab's stand-in prints
                c.log(now, "stderr", "[vramquota] CUDA_DISABLE_CONTROL=true: not enforcing")
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
