"""The emulated state of one GPU host: GPUs, MIG devices, containers and their VRAM
workloads, GPU processes, kernel log (Xid), files, audit log.

State is evaluated lazily from an emulated clock: a container's VRAM is a function of
(emulated) time since it started, so nothing ticks in the background and a test can move
time forward (`Clock.advance`) or speed it up (`Clock(speed=...)`).
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from . import catalog
from .catalog import GpuModel, MigProfile, NodeSpec

PROFILES = ("steady", "ramp", "leak", "burst", "oom", "idle")
# Profiles that size themselves to the framework cap (GPUPLATFORM_VRAM_LIMIT_MB, the XLA
# fraction...): a serving engine sizing its cache, PyTorch's per-process memory fraction.
# The others (a leak, a ramp, a burst) allocate regardless: only a hard limit (a MIG device,
# the quota library) or a full card stops them, with a CUDA OOM. GPUPLATFORM_EMULATOR_
# COOPERATIVE=0/1 overrides the profile's default.
COOPERATIVE_PROFILES = ("steady", "idle", "oom")
ENV_PREFIX = "GPUPLATFORM_EMULATOR_"
# What an uncaught torch.OutOfMemoryError exits with (a Python exception, not a signal).
CUDA_OOM_EXIT = 1


class Clock:
    """Emulated wall clock (epoch seconds): real time x speed, plus manual advances."""

    def __init__(self, speed: float = 1.0):
        self._lock = threading.Lock()
        self._base = time.time()
        self._mono = time.monotonic()
        self._speed = float(speed)

    def now(self) -> float:
        return self._base + (time.monotonic() - self._mono) * self._speed

    @property
    def speed(self) -> float:
        return self._speed

    def set_speed(self, speed: float) -> None:
        with self._lock:
            self._base, self._mono, self._speed = self.now(), time.monotonic(), float(speed)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._base += float(seconds)


# --- workloads

_PROFILE_DEFAULTS: dict[str, dict[str, float]] = {
    # base MiB, growth MiB/min, sm %, memory-bandwidth %
    "steady": {"mb": 2048, "rate": 0, "sm": 60, "mem": 25},
    "ramp": {"mb": 1024, "rate": 1024, "sm": 70, "mem": 30},
    "leak": {"mb": 1024, "rate": 256, "sm": 40, "mem": 15},
    "burst": {"mb": 2048, "rate": 0, "sm": 50, "mem": 20},
    "oom": {"mb": 1024, "rate": 2048, "sm": 80, "mem": 40},
    "idle": {"mb": 1024, "rate": 0, "sm": 0, "mem": 0},
}


# The tenant's own names for the workload: EMULATOR_*, or WORKLOAD_* as the node lab's
# workload program reads them (so one scenario runs against either far end).
TENANT_PREFIXES = ("EMULATOR_", "WORKLOAD_")


def _num(env: dict[str, str], key: str, default: float | None) -> float | None:
    raw = env.get(ENV_PREFIX + key)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        return default


@dataclass
class Workload:
    """What an emulated container does with its GPU (chosen by GPUPLATFORM_EMULATOR_* env)."""

    profile: str = "steady"
    base_mb: float = 2048
    rate_mb_per_min: float = 0
    peak_mb: float | None = None
    burst_mb: float = 4096
    period_s: float = 60
    burst_s: float = 10
    sm: int = 60
    mem: int = 25
    exit_after_s: float | None = None
    exit_code: int = 0
    idle_from_s: float | None = None  # no kernels between these (the lab workload's knobs)
    idle_until_s: float | None = None
    speed: float = 1.0
    unknown_profile: str | None = None
    cooperative: bool = True  # honours the framework cap (see COOPERATIVE_PROFILES)

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Workload:
        # The workload stands for the tenant's own program, so a tenant's launch may set it
        # with EMULATOR_* or WORKLOAD_* (the platform reserves GPUPLATFORM_* for itself).
        env = {
            **{
                ENV_PREFIX + k[len(prefix) :]: v
                for k, v in env.items()
                for prefix in TENANT_PREFIXES
                if k.startswith(prefix)
            },
            **env,
        }
        raw = env.get(ENV_PREFIX + "PROFILE", "steady").strip().lower() or "steady"
        profile = raw if raw in PROFILES else "steady"
        d = _PROFILE_DEFAULTS[profile]
        base = _num(env, "MB", d["mb"]) or 0.0
        peak = _num(env, "PEAK_MB", base * 4 if profile == "ramp" else None)
        coop_raw = env.get(ENV_PREFIX + "COOPERATIVE", "").strip().lower()
        cooperative = (
            coop_raw in ("1", "true", "yes", "on") if coop_raw else profile in COOPERATIVE_PROFILES
        )
        return cls(
            profile=profile,
            base_mb=max(0.0, base),
            rate_mb_per_min=_num(env, "RATE_MB_PER_MIN", d["rate"]) or 0.0,
            peak_mb=peak,
            burst_mb=_num(env, "BURST_MB", 4096) or 0.0,
            period_s=max(1.0, _num(env, "PERIOD_S", 60) or 60),
            burst_s=max(0.0, _num(env, "BURST_S", 10) or 0.0),
            sm=int(_num(env, "SM_UTIL", d["sm"]) or 0),
            mem=int(_num(env, "MEM_UTIL", d["mem"]) or 0),
            exit_after_s=_num(env, "EXIT_AFTER_S", None),
            exit_code=int(_num(env, "EXIT_CODE", 0) or 0),
            idle_from_s=_num(env, "IDLE_FROM_S", None),
            idle_until_s=_num(env, "IDLE_UNTIL_S", None),
            speed=_num(env, "SPEED", 1.0) or 1.0,
            unknown_profile=None if raw in PROFILES else raw,
            cooperative=cooperative,
        )

    def in_burst(self, t: float) -> bool:
        return self.profile == "burst" and (t % self.period_s) >= self.period_s - self.burst_s

    def demand(self, t: float) -> float:
        """MiB the workload wants after t emulated seconds."""
        p = self.profile
        if p in ("ramp", "leak", "oom"):
            d = self.base_mb + self.rate_mb_per_min * t / 60.0
            if self.peak_mb is not None and p == "ramp":
                d = min(d, max(self.peak_mb, self.base_mb))
            return d
        if p == "burst":
            return self.base_mb + (self.burst_mb if self.in_burst(t) else 0.0)
        return self.base_mb

    def crossing(self, limit: float) -> float | None:
        """Earliest t at which demand(t) > limit, for monotonic profiles (else None)."""
        if self.base_mb > limit:
            return 0.0
        if self.profile in ("leak", "oom", "ramp") and self.rate_mb_per_min > 0:
            if self.profile == "ramp" and self.peak_mb is not None and self.peak_mb <= limit:
                return None
            return (limit - self.base_mb) * 60.0 / self.rate_mb_per_min
        return None

    def util(self, t: float) -> tuple[int, int]:
        idle_over = self.idle_until_s is not None and t >= self.idle_until_s
        if self.idle_from_s is not None and t >= self.idle_from_s and not idle_over:
            return 0, 0
        if self.in_burst(t):
            return min(100, max(self.sm, 95)), min(100, max(self.mem, 60))
        return self.sm, self.mem


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


# --- GPUs


@dataclass
class MigState:
    uuid: str
    profile: MigProfile
    gi_id: int
    ci_id: int = 0


@dataclass
class GpuState:
    index: int
    uuid: str
    model: GpuModel
    pci_bus: int
    mig_enabled: bool = False
    mig_devices: list[MigState] = field(default_factory=list)
    ecc_uncorrected: int = 0
    retired_pages_pending: bool = False
    remapped_rows_pending: bool = False
    remapped_rows_failure: bool = False
    power_supported: bool = True
    fallen_off: bool = False
    held_mb: int = 0  # used with no process: the driver did not release it

    @property
    def pci_bus_id(self) -> str:  # nvidia-smi / NVML form
        return f"00000000:{self.pci_bus:02X}:00.0"

    @property
    def kernel_pci(self) -> str:  # the form in NVRM kernel messages
        return f"0000:{self.pci_bus:02x}:00"


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


@dataclass
class GpuProcess:
    gpu_index: int
    mig_index: int | None
    pid: int
    used_mb: int
    name: str
    exe: str
    container_id: str | None
    sm: int | None
    mem: int | None
    sm_raw: int = 0  # utilisation that counts towards the GPU's totals (also in MIG mode)
    mem_raw: int = 0


@dataclass
class XidRecord:
    seq: int
    at: float
    gpu_index: int
    code: int
    pid: int | None
    process_name: str | None
    message: str


XID_MESSAGES = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "Ch 00000010, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
    "0x7f12_34560000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000008, engmask 00000101",
    45: "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x3c001",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
    "at partition 6, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap a row, reset gpu to activate.",
    74: "NVLink: fatal error detected on link 0(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error.",
    95: "Uncontained ECC error.",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 "
    "(GSP_RM_CONTROL) (0x20801702 0x4).",
}

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


@dataclass
class AuditEntry:
    seq: int
    at: float
    argv: tuple[str, ...]
    exec_id: int
    user: str


@dataclass
class ExecRecord:
    exec_id: int
    at: float
    command: str
    user: str
    status: int | None = None


class NodeState:
    """Everything one emulated node knows. All mutation happens under `self.lock`."""

    def __init__(
        self,
        spec: NodeSpec,
        clock: Clock,
        *,
        audit_limit: int = 200_000,
        boot_uptime_s: float = 3 * 86400 + 4321.5,
    ):
        self.spec = spec
        self.name = spec.name
        self.clock = clock
        self.lock = threading.RLock()
        self.driver_version = spec.driver_version
        self.cuda_version = spec.cuda_version
        self.quota_library = spec.quota_library
        # What the preflight gate reads (nodes.preflight.FACT_KEYS); tests change them.
        self.toolkit_version = spec.extra.get("toolkit_version", "1.17.8")
        self.runc_version = spec.extra.get("runc_version", "1.1.12")
        self.runc_build = spec.extra.get("runc_build", "1.1.12-0ubuntu2~22.04.1")
        # False: the library is installed but does not enforce (not loaded by the hook)
        self.quota_library_enforces = True
        # image reference -> the Env of its configuration (beyond PATH)
        self.image_env: dict[str, list[str]] = dict(spec.extra.get("image_env", {}))
        # what the node's runtime adds to every container on its own (a daemon default, a
        # plugin, a tag re-pushed between the check and the start): "NAME=value" items
        self.run_env_extra: list[str] = []
        self.gpus: list[GpuState] = []
        for i, g in enumerate(spec.gpus):
            m = catalog.model(g.model)
            gpu = GpuState(
                index=i,
                uuid=catalog.stable_uuid(spec.name, i),
                model=m,
                pci_bus=catalog.PCI_BUSES[i % len(catalog.PCI_BUSES)] + 0x100 * (i // 14),
            )
            layout = g.mig_layout()
            if layout is not None:
                self._apply_mig(gpu, layout)
            self.gpus.append(gpu)
        self.containers: dict[str, Container] = {}
        self.host_processes: dict[int, GpuProcess] = {}
        self.processes: list[GpuProcess] = []
        self._agg: dict[tuple[int, int | None], list[int]] = {}
        self._agg_for: list[GpuProcess] | None = None
        self.images: set[str] | None = None  # None: every image is present / pullable
        self.nvml_available = True
        self.nvml_error = "NVML Shared Library Not Found"
        self.driver_loaded = True
        self.boot_time = clock.now() - boot_uptime_s
        self.kernel_log: list[tuple[float, str]] = []
        self.xids: list[XidRecord] = []
        self._xid_seq = itertools.count(1)
        self.sampler_xid_cursor = 0
        seed = int.from_bytes(spec.name.encode()[-4:].rjust(4, b"\0"), "big")
        self._next_pid = 2000 + seed % 50000
        self.audit: deque[AuditEntry] = deque(maxlen=audit_limit)
        self.execs: deque[ExecRecord] = deque(maxlen=audit_limit)
        self._audit_seq = itertools.count(1)
        self._exec_seq = itertools.count(1)
        self.files: dict[str, bytes] = {
            "/etc/hostname": f"{spec.name}\n".encode(),
            "/etc/os-release": b'PRETTY_NAME="Ubuntu 22.04.4 LTS"\nNAME="Ubuntu"\n'
            b'VERSION_ID="22.04"\nID=ubuntu\n',
            "/proc/driver/nvidia/version": (
                f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {self.driver_version}  "
                "Fri Feb  9 20:22:46 UTC 2024\nGCC version:  gcc version 12.3.0 "
                "(Ubuntu 12.3.0-1ubuntu1~22.04)\n"
            ).encode(),
        }
        if self.quota_library:
            self.files[self.quota_library] = b"\x7fELF"
        self.boot_files = dict(self.files)
        self._boot_messages()

    # ------------------------------------------------------------------ basics
    def _apply_mig(self, gpu: GpuState, layout: tuple[str, ...]) -> None:
        gpu.mig_enabled = True
        gpu.mig_devices = []
        used: set[int] = set()
        for k, pname in enumerate(layout):
            prof = gpu.model.profile(pname)
            gi = next((g for g in prof.gi_ids if g not in used), 20 + k)
            used.add(gi)
            gpu.mig_devices.append(
                MigState(
                    uuid=catalog.stable_uuid(self.name, gpu.index, "mig", k, prefix="MIG"),
                    profile=prof,
                    gi_id=gi,
                )
            )

    def _boot_messages(self) -> None:
        b = self.boot_time
        self.kernel_log += [
            (
                b + 0.0,
                "Linux version 5.15.0-105-generic (buildd@lcy02-amd64-007) (gcc (Ubuntu "
                "11.4.0-1ubuntu1~22.04) 11.4.0, GNU ld (GNU Binutils for Ubuntu) 2.38)",
            ),
            (b + 4.81, "nvidia: module license 'NVIDIA' taints kernel."),
            (
                b + 4.93,
                f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {self.driver_version}  "
                "Fri Feb  9 20:22:46 UTC 2024",
            ),
            (b + 5.02, "nvidia-uvm: Loaded the UVM driver, major device number 508."),
        ]

    def new_pid(self) -> int:
        self._next_pid += 1 + secrets.randbelow(97)
        if self._next_pid > 4_000_000:
            self._next_pid = 3000
        return self._next_pid

    def record_audit(self, argv: list[str], exec_id: int, user: str) -> None:
        self.audit.append(
            AuditEntry(next(self._audit_seq), time.time(), tuple(argv), exec_id, user)
        )

    def record_exec(self, command: str, user: str) -> ExecRecord:
        rec = ExecRecord(next(self._exec_seq), time.time(), command, user)
        self.execs.append(rec)
        return rec

    def gpu_by_id(self, ident: str) -> tuple[GpuState, MigState | None] | None:
        """Resolve a --gpus device id: index, GPU UUID or MIG UUID."""
        ident = ident.strip()
        for gpu in self.gpus:
            if ident == str(gpu.index) or ident.lower() == gpu.uuid.lower():
                return gpu, None
            for mig in gpu.mig_devices if gpu.mig_enabled else ():
                if ident.lower() == mig.uuid.lower():
                    return gpu, mig
        return None

    # ------------------------------------------------------------------ kernel log / faults
    def add_xid(
        self, gpu_index: int, code: int, pid: int | None = None, message: str | None = None
    ) -> XidRecord:
        with self.lock:
            gpu = self.gpus[gpu_index]
            name = None
            if pid is not None:
                self.refresh()
                name = next((p.name for p in self.processes if p.pid == pid), "python3")
            rec = XidRecord(
                next(self._xid_seq),
                self.clock.now(),
                gpu_index,
                int(code),
                pid,
                name,
                message or XID_MESSAGES.get(int(code), "Unknown error"),
            )
            self.xids.append(rec)
            self.kernel_log.append((rec.at, xid_raw(gpu, rec)))
            return rec

    def add_ecc(
        self,
        gpu_index: int,
        *,
        uncorrected: int = 1,
        retired_pages_pending: bool | None = None,
        remapped_rows_pending: bool | None = None,
        remapped_rows_failure: bool | None = None,
        xid: int | None = None,
    ) -> None:
        with self.lock:
            gpu = self.gpus[gpu_index]
            gpu.ecc_uncorrected += int(uncorrected)
            if retired_pages_pending is not None:
                gpu.retired_pages_pending = retired_pages_pending
            if remapped_rows_pending is not None:
                gpu.remapped_rows_pending = remapped_rows_pending
            if remapped_rows_failure is not None:
                gpu.remapped_rows_failure = remapped_rows_failure
        if xid:
            self.add_xid(gpu_index, xid)

    def clear_ecc(self, gpu_index: int) -> None:
        with self.lock:
            gpu = self.gpus[gpu_index]
            gpu.ecc_uncorrected = 0
            gpu.retired_pages_pending = gpu.remapped_rows_pending = False
            gpu.remapped_rows_failure = False

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

    def _cuda_oom_text(self, c: Container, gpu: GpuState, want: float, free: float) -> str:
        total = (
            gpu.mig_devices[c.device[1]].profile.memory_mb  # type: ignore[index]
            if c.device and c.device[1] is not None
            else gpu.model.memory_mb
        )
        step = max(want - c.used_mb, 512.0)
        return (
            "Traceback (most recent call last):\n"
            '  File "/app/main.py", line 42, in <module>\n'
            "    block = torch.empty(n, dtype=torch.uint8, device='cuda')\n"
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {step:.2f} MiB. "
            f"GPU 0 has a total capacity of {total / 1024:.2f} GiB of which "
            f"{max(free, 0) / 1024:.2f} GiB is free. Process {c.pid} has "
            f"{c.used_mb / 1024:.2f} GiB memory in use. Of the allocated memory "
            f"{c.used_mb * 0.93 / 1024:.2f} GiB is allocated by PyTorch, and "
            f"{c.used_mb * 0.07:.2f} MiB is reserved by PyTorch but unallocated."
        )

    def _cuda_oom(self, c: Container, at: float, held: float, want: float, free: float) -> None:
        """The workload's allocation failed: torch raises OutOfMemoryError, uncaught.
        The "oom" profile keeps its historical exit 137; any other exits 1, as Python
        does on an uncaught exception."""
        gpu = self.gpus[c.device[0]]  # type: ignore[index]
        c.used_mb = int(held)
        w = c.workload
        code = 137 if w is not None and w.profile == "oom" else CUDA_OOM_EXIT
        self.container_exit(c, at, code, stream_text=self._cuda_oom_text(c, gpu, want, free))

    def _cap_for(self, c: Container) -> float | None:
        """The limit a workload's allocations run into before the card's own size: every
        cap for a cooperative workload, only the hard one for the others."""
        w = c.workload
        if w is not None and not w.cooperative:
            return c.hard_limit_mb
        return c.limit_mb

    def refresh(self) -> None:
        """Bring containers and GPU processes up to the clock's now.

        Memory already held stays held: a container's growth comes out of what is free
        on its device, first come first served, and never out of a neighbour. A workload
        that cannot get what it wants dies with a CUDA OOM (or, when it is cooperative,
        holds at its cap)."""
        with self.lock:
            now = self.clock.now()
            running = sorted(
                (c for c in self.containers.values() if c.running and c.workload is not None),
                key=lambda c: (c.started or 0.0, c.id),
            )
            # 1. time-determined exits (exit-after; OOM when the demand crosses the cap)
            for c in running:
                w = c.workload
                assert w is not None and c.started is not None
                if c.paused:
                    continue  # frozen: its clock does not move
                candidates: list[tuple[float, str]] = []
                if w.exit_after_s is not None:
                    candidates.append((c.wall_time(w.exit_after_s / w.speed), "exit"))
                cap = self._cap_for(c)
                if cap is not None and (w.profile == "oom" or not w.cooperative):
                    t = w.crossing(cap)
                    if t is not None:
                        candidates.append((c.wall_time(t / w.speed), "oom"))
                due = [x for x in candidates if x[0] <= now]
                if not due:
                    continue
                at, why = min(due)
                if why == "exit":
                    c.log(at, "stdout", "gpu-workload: finished")
                    self.container_exit(c, at, w.exit_code)
                else:
                    assert cap is not None
                    self._cuda_oom(c, at, cap, cap + 1, 0)
            # 2. memory on each device
            remaining: dict[tuple[int, int | None], float] = {}
            for gpu in self.gpus:
                if gpu.mig_enabled:
                    for k, mig in enumerate(gpu.mig_devices):
                        remaining[(gpu.index, k)] = float(mig.profile.memory_mb)
                remaining[(gpu.index, None)] = float(gpu.model.memory_mb - gpu.held_mb)
            procs: list[GpuProcess] = []
            for hp in self.host_processes.values():
                key = (hp.gpu_index, None)
                hp.used_mb = int(max(0.0, min(hp.used_mb, remaining[key])))
                remaining[key] -= hp.used_mb
                procs.append(hp)

            def free_for(dev: tuple[int, int | None]) -> float:
                if dev[1] is None:
                    return remaining[dev]
                return min(remaining[dev], remaining[(dev[0], None)])

            def take(dev: tuple[int, int | None], mb: float) -> None:
                remaining[dev] -= mb
                if dev[1] is not None:  # a MIG device's memory also comes out of the card
                    remaining[(dev[0], None)] -= mb

            live = [c for c in running if c.running]
            wants: dict[str, tuple[float, float]] = {}  # id -> (workload t, demand)
            held: dict[str, float] = {}
            # 2a. what each container already holds (up to what it still wants) stays its own
            for c in live:
                w = c.workload
                assert w is not None and c.device is not None
                t = c.run_s(now) * w.speed
                want = w.demand(t)
                wants[c.id] = (t, want)
                keep = max(0.0, min(want, float(c.used_mb), free_for(c.device)))
                held[c.id] = keep
                take(c.device, keep)
            # 2b. growth, in start order, from what is free
            for c in live:
                w = c.workload
                assert w is not None and c.device is not None and c.started is not None
                gpu = self.gpus[c.device[0]]
                t, want = wants[c.id]
                dev_key = c.device
                physical = held[c.id] + free_for(dev_key)
                limit = self._cap_for(c)
                cap = physical if limit is None else min(physical, limit)
                if want > cap:
                    if w.profile == "oom" or not w.cooperative:
                        take(dev_key, -held[c.id])  # its memory is freed at once
                        at = now
                        crossing = w.crossing(cap) if not c.paused else None
                        if crossing is not None:
                            at = min(now, max(c.started, c.wall_time(crossing / w.speed)))
                        self._cuda_oom(c, at, cap, want, physical - cap)
                        continue
                    if not c.quota_hit_logged:
                        c.quota_hit_logged = True
                        c.log(
                            now,
                            "stderr",
                            (
                                f"gpu-workload: allocation refused at {int(cap)} MiB "
                                f"(wanted {int(want)} MiB): "
                                + (
                                    "VRAM quota"
                                    if limit is not None and cap >= limit
                                    else "device memory exhausted"
                                )
                                + ", holding"
                            ),
                        )
                    want = cap
                used = int(want)
                c.used_mb = used
                take(dev_key, used - held[c.id])
                sm, mem = (0, 0) if c.paused else w.util(t)
                if gpu.mig_enabled:  # per-process utilisation is not reported in MIG mode
                    sm_v, mem_v = None, None
                else:
                    sm_v, mem_v = sm, mem
                name = _process_name(c.cmd)
                procs.append(
                    GpuProcess(
                        gpu.index,
                        dev_key[1],
                        c.pid,
                        used,
                        name,
                        _exe(c.cmd),
                        c.id,
                        sm_v,
                        mem_v,
                        sm,
                        mem,
                    )
                )
            self.processes = procs
            # 3. `docker run --rm`: exited containers go away
            for c in [
                c for c in self.containers.values() if c.auto_remove and c.status == "exited"
            ]:
                del self.containers[c.id]

    # ------------------------------------------------------------------ GPU readings
    def _aggregates(self) -> dict[tuple[int, int | None], list[int]]:
        """{(gpu, None): [used, sm, mem], (gpu, mig): [used, 0, 0]} for the current processes."""
        if self._agg_for is not self.processes:
            agg: dict[tuple[int, int | None], list[int]] = {}
            for p in self.processes:
                a = agg.setdefault((p.gpu_index, None), [0, 0, 0])
                a[0] += p.used_mb
                a[1] += p.sm_raw
                a[2] += p.mem_raw
                if p.mig_index is not None:
                    agg.setdefault((p.gpu_index, p.mig_index), [0, 0, 0])[0] += p.used_mb
            self._agg, self._agg_for = agg, self.processes
        return self._agg

    def gpu_used_mb(self, gpu: GpuState) -> int:
        return self._aggregates().get((gpu.index, None), [0, 0, 0])[0] + gpu.held_mb

    def mig_used_mb(self, gpu: GpuState, k: int) -> int:
        return self._aggregates().get((gpu.index, k), [0, 0, 0])[0]

    def gpu_util(self, gpu: GpuState) -> tuple[int, int]:
        _, sm, mem = self._aggregates().get((gpu.index, None), [0, 0, 0])
        return min(sm, 100), min(mem, 100)

    def gpu_temperature(self, gpu: GpuState) -> int:
        return int(31 + 0.4 * self.gpu_util(gpu)[0] + (gpu.index % 3))

    def gpu_power(self, gpu: GpuState) -> float | None:
        if not gpu.power_supported:
            return None
        sm, _ = self.gpu_util(gpu)
        m = gpu.model
        return round(m.idle_w + (m.tdp_w - m.idle_w) * 0.85 * sm / 100.0 + 0.37 * gpu.index, 2)


def _process_name(cmd: list[str]) -> str:
    if not cmd:
        return "python3"
    base = cmd[0].rsplit("/", 1)[-1]
    if base in ("sh", "bash", "sleep", "tail", "true"):
        return "python3"
    return base[:15]


def _exe(cmd: list[str]) -> str:
    name = _process_name(cmd)
    if cmd and cmd[0].startswith("/") and cmd[0].rsplit("/", 1)[-1] == name:
        return cmd[0]
    if name.startswith("python"):
        return f"/usr/bin/{name}"
    return f"/usr/local/bin/{name}"


def xid_raw(gpu: GpuState, rec: XidRecord) -> str:
    who = f"pid={rec.pid}, name={rec.process_name}, " if rec.pid is not None else ""
    return f"NVRM: Xid (PCI:{gpu.kernel_pci}): {rec.code}, {who}{rec.message}"
