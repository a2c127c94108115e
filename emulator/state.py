"""The emulated state of one GPU host (NodeState): GPUs, MIG devices, files, kernel log,
audit log, and the parts it mixes in: containers and processes (emulator.containers), GPU
memory accounting and readings (emulator.vram), faults (emulator.faults).

State is evaluated lazily from an emulated clock (emulator.clock): a container's VRAM is a
function of (emulated) time since it started (emulator.workload), so nothing ticks in the
background and a test can move time forward or speed it up.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass

from . import catalog
from .agent import EmulatedAgent
from .catalog import GpuSpec, NodeSpec
from .clock import Clock
from .containers import Container, ContainerOps
from .faults import Faults, XidRecord
from .gpus import GpuProcess, GpuState, MigState
from .vram import VramAccounting


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


class NodeState(ContainerOps, VramAccounting, Faults):
    """Everything one emulated node knows. All mutation happens under `self.lock`."""

    def __init__(
        self,
        spec: NodeSpec,
        clock: Clock,
        *,
        audit_limit: int = 200_000,
        boot_uptime_s: float = 3 * 86400 + 4321.5,
    ):
        super().__init__()
        self.spec = spec
        self.name = spec.name
        self.clock = clock
        self.lock = threading.RLock()
        self.driver_version = spec.driver_version
        self.cuda_version = spec.cuda_version
        self.quota_library = spec.quota_library
        # What the preflight gate reads (nodes.preflight.FACT_KEYS); tests change them.
        self.toolkit_version = spec.extra.get("toolkit_version", "1.19.1")
        self.runc_version = spec.extra.get("runc_version", "1.1.12")
        self.runc_build = spec.extra.get("runc_build", "1.1.12-0ubuntu2~22.04.1")
        # the binary dockerd's default runtime names, and the package that owns it
        self.runc_path = spec.extra.get("runc_path", "/usr/sbin/runc")
        self.runc_package = spec.extra.get("runc_package", "runc")
        # dockerd runs containers in a remapped user namespace (userns-remap)
        self.userns_remap = bool(spec.extra.get("userns_remap", False))
        # programs this node does not have (its shell says "command not found"): e.g.
        # "nsenter" or "python3", which the SSH gateway's relay runs
        self.missing_tools: set[str] = set(spec.extra.get("missing_tools", ()))
        # False: the library is installed but does not enforce (not loaded by the hook)
        self.quota_library_enforces = True
        # catalog.QUOTA_FROM_NODE or QUOTA_FROM_ENVIRONMENT (tests change it)
        self.quota_library_config = spec.quota_library_config
        # image reference -> the Env of its configuration (beyond PATH)
        self.image_env: dict[str, list[str]] = dict(spec.extra.get("image_env", {}))
        # what the node's runtime adds to every container on its own (a daemon default, a
        # plugin, a tag re-pushed between the check and the start): "NAME=value" items
        self.run_env_extra: list[str] = []
        self.gpus: list[GpuState] = [self._new_gpu(i, g) for i, g in enumerate(spec.gpus)]
        self.containers: dict[str, Container] = {}
        self.host_processes: dict[int, GpuProcess] = {}
        self.processes: list[GpuProcess] = []
        self.images: set[str] | None = None  # None: every image is present / pullable
        self.volumes: dict[str, dict[str, str]] = {}  # docker volume name -> its labels
        self.volume_bytes: dict[str, int] = {}  # what each holds (`du`), set by tests
        self.nvml_available, self.agent = True, EmulatedAgent()  # the platform's node agent
        self.nvml_error = "NVML Shared Library Not Found"
        self.driver_loaded = True
        self.boot_time = clock.now() - boot_uptime_s
        self.kernel_log: list[tuple[float, str]] = []
        self.xids: list[XidRecord] = []
        self.sampler_xid_cursor = 0
        seed = int.from_bytes(spec.name.encode()[-4:].rjust(4, b"\0"), "big")
        self._next_pid = 2000 + seed % 50000
        self.audit: deque[AuditEntry] = deque(maxlen=audit_limit)
        self.execs: deque[ExecRecord] = deque(maxlen=audit_limit)
        self._audit_seq = itertools.count(1)
        self._exec_seq = itertools.count(1)
        self.files: dict[str, bytes] = self._first_files()
        self.boot_files = dict(self.files)
        self._boot_messages()

    # ------------------------------------------------------------------ basics
    def _new_gpu(self, index: int, g: GpuSpec) -> GpuState:
        gpu = GpuState(
            index=index,
            uuid=catalog.stable_uuid(self.name, index),
            model=catalog.model(g.model),
            pci_bus=catalog.PCI_BUSES[index % len(catalog.PCI_BUSES)] + 0x100 * (index // 14),
        )
        layout = g.mig_layout()
        if layout is not None:
            self._apply_mig(gpu, layout)
        return gpu

    def _first_files(self) -> dict[str, bytes]:
        """The files the node boots with."""
        files = {
            "/etc/hostname": f"{self.name}\n".encode(),
            "/etc/os-release": b'PRETTY_NAME="Ubuntu 22.04.4 LTS"\nNAME="Ubuntu"\n'
            b'VERSION_ID="22.04"\nID=ubuntu\n',
            "/proc/driver/nvidia/version": (
                f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {self.driver_version}  "
                "Fri Feb  9 20:22:46 UTC 2024\nGCC version:  gcc version 12.3.0 "
                "(Ubuntu 12.3.0-1ubuntu1~22.04)\n"
            ).encode(),
        }
        if self.quota_library:
            files[self.quota_library] = b"\x7fELF"
        return files

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
