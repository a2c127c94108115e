"""The Python API of the emulator: `EmulatedFleet.start(...)` and its `EmulatedNode`s."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from . import catalog, keys
from .catalog import NodeSpec
from .clock import Clock
from .containers import Container
from .control import ControlServer
from .server import SSH_LOG_CHANNEL, Acceptor, NodeServer
from .shell import Result, StdinSource
from .state import NodeState


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    image: str
    status: str  # docker's State.Status: created | running | paused | exited
    exit_code: int
    oom_killed: bool
    pid: int
    gpu_uuid: str | None
    device_uuid: str | None  # the MIG UUID when on a MIG device, else the GPU UUID
    used_mb: int
    limit_mb: float | None  # the tightest cap it was given (the framework's is advisory)
    limit_source: str | None
    profile: str | None
    env: dict[str, str]
    labels: dict[str, str]
    cmd: tuple[str, ...]
    host_config: dict[str, Any]
    logs: tuple[str, ...]
    hard_limit_mb: float | None = None  # the cap that stops any allocation (MIG, quota lib)
    paused: bool = False
    sm_utilization: int | None = None  # what NVML reports for its process now
    memory_utilization: int | None = None
    started: float | None = None  # emulated time it (last) started
    # the node's quota library as its program met it (containers.LibraryView.state), and
    # what the library's books count for it (None: not a container it was given)
    library: str = "none"
    library_mb: int | None = None


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    memory_total_mb: int
    pci_bus_id: str
    mig_capable: bool
    mig_enabled: bool
    mig_devices: tuple[dict[str, Any], ...]


class EmulatedNode:
    def __init__(self, state: NodeState, server: NodeServer, address: str):
        self.state = state
        self.server = server
        self.address = address
        self.on_change: Callable[[], object] | None = None

    def execute(self, command: str, stdin: bytes = b"", user: str = "gpuplatform") -> Result:
        """Run a command on the node without SSH (same shell, same audit log)."""
        rec = self.state.record_exec(command, user)
        result = self.server.execute(command, StdinSource(data=stdin), user, rec.exec_id)
        rec.status = result.status
        return result

    def reset(self, *, audit: bool = True) -> None:
        """Back to a freshly booted node: no containers or stray processes, no faults.
        The host key stays."""
        self.set_down(False)
        self.set_delay(0)
        with self.state.lock:
            self.state.containers.clear()
            self.state.host_processes.clear()
            self.state.processes = []
            self.state.images = None
            self.state.missing_tools = set(self.state.spec.extra.get("missing_tools", ()))
            self.state.quota_library_config = self.state.spec.quota_library_config
            self.state.nvml_available = True
            self.state.driver_loaded = True
            self.state.files.clear()
            self.state.files.update(self.state.boot_files)
            self.state.sampler_xid_cursor = self.state.xids[-1].seq if self.state.xids else 0
            for g in self.state.gpus:
                g.power_supported = True
                g.held_mb = 0
        for g in self.state.gpus:
            self.state.clear_ecc(g.index)
        if audit:
            self.clear_audit()

    # ------------------------------------------------------------------ identity
    @property
    def name(self) -> str:
        return self.state.name

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def host_key(self) -> paramiko.PKey:
        return self.server.host_key

    def host_key_line(self) -> str:
        """known_hosts line: `[127.0.0.1]:PORT ssh-ed25519 AAAA...`."""
        return keys.known_hosts_line(self.address, self.port, self.host_key)

    def host_key_fingerprint(self) -> str:
        return keys.fingerprint(self.host_key)

    def host_public_key(self) -> str:
        """`ssh-ed25519 AAAA...` (no host part)."""
        return keys.public_line(self.host_key)

    # ------------------------------------------------------------------ inspection
    @property
    def audit_log(self) -> list[list[str]]:
        """Every simple command executed on the node, as argv lists, oldest first."""
        return [list(e.argv) for e in list(self.state.audit)]

    @property
    def audit_entries(self) -> list[Any]:
        return list(self.state.audit)

    @property
    def exec_log(self) -> list[str]:
        """The raw exec strings the node received, oldest first."""
        return [r.command for r in list(self.state.execs)]

    def clear_audit(self) -> None:
        self.state.audit.clear()
        self.state.execs.clear()

    @property
    def files(self) -> dict[str, bytes]:
        with self.state.lock:
            return dict(self.state.files)

    @property
    def gpus(self) -> list[GpuInfo]:
        return [
            GpuInfo(
                g.index,
                g.uuid,
                g.model.name,
                g.model.memory_mb,
                g.pci_bus_id,
                g.model.mig_capable,
                g.mig_enabled,
                tuple(
                    {
                        "uuid": m.uuid,
                        "profile": m.profile.name,
                        "memory_mb": m.profile.memory_mb,
                        "gi_id": m.gi_id,
                        "ci_id": m.ci_id,
                    }
                    for m in g.mig_devices
                ),
            )
            for g in self.state.gpus
        ]

    def _info(self, c: Container) -> ContainerInfo:
        proc = next((p for p in self.state.processes if p.container_id == c.id), None)
        gpu_uuid = dev_uuid = None
        if c.device is not None:
            gpu = self.state.gpus[c.device[0]]
            gpu_uuid = dev_uuid = gpu.uuid
            if c.device[1] is not None:
                dev_uuid = gpu.mig_devices[c.device[1]].uuid
        return ContainerInfo(
            id=c.id,
            name=c.name,
            image=c.image,
            status=c.state,
            exit_code=c.exit_code,
            oom_killed=c.oom_killed,
            pid=c.pid,
            gpu_uuid=gpu_uuid,
            device_uuid=dev_uuid,
            used_mb=c.used_mb if c.running else 0,
            limit_mb=c.limit_mb,
            limit_source=c.limit_source,
            profile=c.workload.profile if c.workload else None,
            env=c.env_dict,
            labels=dict(c.labels),
            cmd=tuple(c.cmd),
            host_config={k: v for k, v in c.host_config.items() if not k.startswith("_")},
            logs=tuple(line for _, _, line in c.logs),
            hard_limit_mb=c.hard_limit_mb,
            paused=c.paused,
            sm_utilization=proc.sm_raw if proc else None,
            memory_utilization=proc.mem_raw if proc else None,
            started=c.started,
            library=c.library.state,
            library_mb=(c.used_mb if c.library.counted and c.running else 0)
            if c.library.given
            else None,
        )

    @property
    def containers(self) -> list[ContainerInfo]:
        with self.state.lock:
            self.state.refresh()
            return [
                self._info(c)
                for c in sorted(self.state.containers.values(), key=lambda c: c.created)
            ]

    def container(self, ref: str) -> ContainerInfo | None:
        with self.state.lock:
            self.state.refresh()
            c = self.state.find_container(ref)
            return self._info(c) if c else None

    # ------------------------------------------------------------------ faults and knobs
    def inject_xid(
        self, gpu: int = 0, code: int = 79, *, pid: int | None = None, message: str | None = None
    ) -> str:
        """An Xid error: in the next sampler output's xid_events and in `dmesg`. Returns the
        kernel line."""
        rec = self.state.add_xid(gpu, code, pid, message)
        return self.state.kernel_log[-1][1] if rec else ""

    def inject_ecc(
        self,
        gpu: int = 0,
        *,
        uncorrected: int = 1,
        retired_pages_pending: bool | None = None,
        remapped_rows_pending: bool | None = None,
        remapped_rows_failure: bool | None = None,
        xid: int | None = None,
    ) -> None:
        self.state.add_ecc(
            gpu,
            uncorrected=uncorrected,
            retired_pages_pending=retired_pages_pending,
            remapped_rows_pending=remapped_rows_pending,
            remapped_rows_failure=remapped_rows_failure,
            xid=xid,
        )

    def clear_ecc(self, gpu: int = 0) -> None:
        self.state.clear_ecc(gpu)

    def set_down(self, down: bool = True, mode: str = "refuse") -> None:
        """Node unreachable: 'refuse' closes the port (connection refused) and drops
        sessions; 'hang' accepts TCP but never answers (and stalls open sessions)."""
        self.server.set_down(down, mode)

    @property
    def is_down(self) -> bool:
        return self.server.down is not None

    def set_delay(self, seconds: float) -> None:
        """Every exec waits this long before it runs."""
        self.server.delay = max(0.0, float(seconds))

    def rotate_host_key(self) -> str:
        """A new host key (saved in the state dir); open connections drop. Returns the new
        known_hosts line."""
        self.server.rotate_host_key()
        if self.on_change:
            self.on_change()
        return self.host_key_line()

    def set_nvml_available(self, available: bool, error: str | None = None) -> None:
        """Off: the sampler answers {"source": "unavailable"} with exit 3 (nvidia-smi works)."""
        with self.state.lock:
            self.state.nvml_available = available
            if error:
                self.state.nvml_error = error

    def set_driver_loaded(self, loaded: bool) -> None:
        """Off: NVML and nvidia-smi both fail (nvidia-smi exit 9)."""
        with self.state.lock:
            self.state.driver_loaded = loaded

    def set_quota_library_config(self, config: str) -> None:
        """Where the node's quota library takes its limits from for containers started
        from now on: catalog.QUOTA_FROM_NODE (the hook's read-only /overrideEnv and
        /etc/ld.so.preload) or QUOTA_FROM_ENVIRONMENT (each process's own, HAMi-core
        upstream)."""
        if config not in catalog.QUOTA_CONFIGS:
            raise ValueError(f"quota library config must be one of {catalog.QUOTA_CONFIGS}")
        with self.state.lock:
            self.state.quota_library_config = config

    def quota_books(self) -> list[dict[str, Any]] | None:
        """What the sampler reads from the quota library's books (`quota_usage`)."""
        with self.state.lock:
            self.state.refresh()
            return self.state.quota_books()

    def memory_used(self) -> dict[str, int]:
        """What each GPU's memory really holds now, by GPU UUID: its processes' and any
        memory no process holds."""
        with self.state.lock:
            self.state.refresh()
            return {g.uuid: self.state.gpu_used_mb(g) for g in self.state.gpus}

    def short_of_memory(self) -> list[str]:
        """Running containers that hold less than their program wants within its own
        caps: memory that someone else on the device took from them, or never left."""
        with self.state.lock:
            self.state.refresh()
            now = self.state.clock.now()
            short = []
            for c in self.state.containers.values():
                w = c.workload
                if not c.running or w is None or c.paused:
                    continue
                want = w.demand(c.run_s(now) * w.speed)
                cap = self.state.cap_for(c)
                if c.used_mb < int(want if cap is None else min(want, cap)):
                    short.append(c.id)
            return sorted(short)

    def set_missing_tools(self, names: list[str]) -> None:
        """Programs the node lacks from now on (its shell: "command not found")."""
        with self.state.lock:
            self.state.missing_tools = set(names)

    def set_images(self, images: list[str] | None) -> None:
        """Images the node has / can pull (None: any image)."""
        with self.state.lock:
            self.state.images = None if images is None else set(images)

    def container_print(self, ref: str, text: str, stream: str = "stdout") -> None:
        """The container's job prints `text` (each line timestamped now), as docker logs
        will show it."""
        with self.state.lock:
            c = self.state.find_container(ref)
            if c is None:
                raise KeyError(ref)
            c.log(self.state.clock.now(), stream, text)

    def set_volume_bytes(self, name: str, size: int) -> None:
        """What a docker volume holds, as `du` will say."""
        with self.state.lock:
            self.state.volume_bytes[name] = size

    def volumes(self) -> dict[str, dict[str, str]]:
        with self.state.lock:
            return dict(self.state.volumes)

    def set_power_supported(self, gpu: int, supported: bool) -> None:
        with self.state.lock:
            self.state.gpus[gpu].power_supported = supported

    def add_gpu_process(
        self,
        gpu: int,
        used_mb: int,
        name: str = "python3",
        sm: int = 0,
        container_id: str | None = None,
    ) -> int:
        """A GPU process outside any running container (an orphan; with `container_id`,
        one its container left behind). Returns its pid."""
        return self.state.add_host_process(gpu, used_mb, name, sm=sm, container_id=container_id)

    def hold_memory(self, gpu: int, mb: int) -> None:
        """Memory used on the card with no process holding it (0: released)."""
        with self.state.lock:
            self.state.gpus[gpu].held_mb = int(mb)

    def kill_pid(self, pid: int) -> bool:
        return self.state.kill_pid(pid)

    def kill_container(
        self, ref: str, exit_code: int = 137, *, oom_killed: bool = False, log: str | None = None
    ) -> bool:
        """The container dies (a crash, the kernel OOM killer with oom_killed=True...)."""
        with self.state.lock:
            self.state.refresh()
            c = self.state.find_container(ref)
            if c is None or not c.running:
                return False
            self.state.container_exit(
                c, self.state.clock.now(), exit_code, oom_killed=oom_killed, stream_text=log or ""
            )
            return True

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "address": self.address,
            "port": self.port,
            "host_key": self.host_key_line(),
            "host_key_fingerprint": self.host_key_fingerprint(),
            "down": self.server.down,
            "delay_s": self.server.delay,
            "nvml_available": self.state.nvml_available,
            "driver_loaded": self.state.driver_loaded,
            "quota_library": self.state.quota_library,
            "quota_library_config": self.state.quota_library_config,
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "memory_total_mb": g.memory_total_mb,
                    "mig_enabled": g.mig_enabled,
                    "mig_devices": list(g.mig_devices),
                }
                for g in self.gpus
            ],
        }


class EmulatedFleet:
    """Emulated GPU nodes, each an SSH server on 127.0.0.1, all in this process."""

    def __init__(self) -> None:
        self.nodes: list[EmulatedNode] = []
        self.clock = Clock()
        self.state_dir: Path | None = None
        self._own_state_dir = False
        self._acceptor: Acceptor | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.control: Any = None
        self.authorized: keys.AuthorizedKeys | None = None

    @classmethod
    def start(
        cls,
        count: int = 2,
        gpus_per_node: int | None = None,
        base_port: int = 0,
        authorized_keys: list[str] | str | None = None,
        state_dir: str | Path | None = None,
        *,
        authorized_key_files: Sequence[str | Path] | None = None,
        nodes: list[NodeSpec] | None = None,
        speed: float = 1.0,
        control_port: int | None = None,
        name_prefix: str = "emu",
        host: str = "127.0.0.1",
        users: set[str] | None = None,
        max_output: int = 4 * 1024 * 1024,
        max_exec_threads: int = 1024,
        control_port_fallback: bool = False,
        quiet_ssh_logs: bool = True,
    ) -> EmulatedFleet:
        """Start `count` nodes (or the given NodeSpecs). base_port 0: the OS picks each port;
        else node i listens on base_port + i. control_port: also serve the JSON control API
        (0 = any free port; with control_port_fallback a busy port falls back to a free one).
        authorized_keys: the platform's public key(s), OpenSSH lines."""
        fleet = cls()
        fleet.clock = Clock(speed)
        fleet._use_state_dir(state_dir)
        if isinstance(authorized_keys, str):
            authorized_keys = authorized_keys.splitlines()
        fleet.authorized = keys.AuthorizedKeys(
            list(authorized_keys or []), [Path(f) for f in authorized_key_files or []]
        )
        if quiet_ssh_logs:
            logging.getLogger(SSH_LOG_CHANNEL).setLevel(logging.CRITICAL)
        specs = (
            nodes if nodes is not None else catalog.default_fleet(count, gpus_per_node, name_prefix)
        )
        fleet._acceptor = Acceptor()
        # one thread per exec in flight (a command waiting for its stdin holds one), reused
        fleet._executor = ThreadPoolExecutor(
            max_workers=max_exec_threads, thread_name_prefix="emulator-exec"
        )
        try:
            for i, spec in enumerate(specs):
                port = base_port + i if base_port else 0
                fleet._add_node(spec, host=host, port=port, users=users, max_output=max_output)
            if control_port is not None:
                fleet._start_control(host, control_port, fallback=control_port_fallback)
        except BaseException:
            fleet.stop()
            raise
        fleet.write_fleet_file()
        return fleet

    def _use_state_dir(self, state_dir: str | Path | None) -> None:
        """Host keys and fleet.json go there; None: a temporary directory, removed on stop."""
        if state_dir is None:
            self.state_dir = Path(tempfile.mkdtemp(prefix="gpuplatform-emulator-"))
            self._own_state_dir = True
        else:
            self.state_dir = Path(state_dir)
            self.state_dir.mkdir(parents=True, exist_ok=True)

    def _add_node(
        self, spec: NodeSpec, *, host: str, port: int, users: set[str] | None, max_output: int
    ) -> None:
        """One node: its state, and its sshd listening on ``port`` (0: the OS picks)."""
        assert self.state_dir is not None and self.authorized is not None
        assert self._acceptor is not None and self._executor is not None
        state = NodeState(spec, self.clock)
        server = NodeServer(
            state,
            acceptor=self._acceptor,
            executor=self._executor,
            authorized=self.authorized,
            host_key_path=self.state_dir / spec.name / "ssh_host_ed25519_key",
            host=host,
            port=port,
            users=users,
            max_output=max_output,
        )
        server.start()
        node = EmulatedNode(state, server, host)
        node.on_change = self.write_fleet_file
        self.nodes.append(node)

    def _start_control(self, host: str, port: int, *, fallback: bool) -> None:
        """The JSON control API; with ``fallback`` a busy port falls back to a free one."""
        try:
            self.control = ControlServer(self, host=host, port=port)
        except OSError:
            if not fallback:
                raise
            self.control = ControlServer(self, host=host, port=0)  # see fleet.json
        self.control.start()

    # ------------------------------------------------------------------ access
    def node(self, name: str) -> EmulatedNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def __getitem__(self, i: int) -> EmulatedNode:
        return self.nodes[i]

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def control_port(self) -> int | None:
        return self.control.port if self.control else None

    def known_hosts(self) -> str:
        return "".join(n.host_key_line() + "\n" for n in self.nodes)

    def authorize(self, public_key_line: str) -> None:
        assert self.authorized is not None
        self.authorized.add(public_key_line)

    def advance(self, seconds: float) -> None:
        """Move emulated time forward (containers' profiles, timestamps, uptime)."""
        self.clock.advance(seconds)

    def set_speed(self, speed: float) -> None:
        self.clock.set_speed(speed)

    def describe(self) -> dict[str, Any]:
        return {
            "control_port": self.control_port,
            "clock": {"now": self.clock.now(), "speed": self.clock.speed},
            "nodes": [n.describe() for n in self.nodes],
        }

    def write_fleet_file(self) -> Path | None:
        """state_dir/fleet.json: nodes, ports, host keys, control port (for `make run`)."""
        if self.state_dir is None:
            return None
        path = self.state_dir / "fleet.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.describe(), indent=2) + "\n")
        tmp.replace(path)
        return path

    # ------------------------------------------------------------------ teardown
    def stop(self) -> None:
        if self.control is not None:
            self.control.stop()
            self.control = None
        for n in self.nodes:
            n.server.stop()
        if self._acceptor is not None:
            self._acceptor.stop()
            self._acceptor = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if self._own_state_dir and self.state_dir is not None:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> EmulatedFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
