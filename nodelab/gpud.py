"""The lab node's emulated GPU: what the silicon and the driver keep, and nothing more.

One process per lab node. It keeps, per GPU and MIG device, the total memory, the memory
each CUDA context holds (a context is known by its process's host PID, read from the
device socket's peer credentials, which is the PID NVML reports), utilisation and
memory-bandwidth counters fed by the kernels jobs run, ECC and row-remapping counters,
and the driver's kernel messages (Xid). A context's memory is freed when its process
dies (the socket closes), as the driver frees a context at process exit; a MIG device
refuses allocations past its size, and a card past its own.

Everything else on a lab node is real: sshd, dockerd, containerd, runc, the kernel's
cgroups, the processes. Two sockets per device, both under the node's run directory:

- `<run>/gpu/<n>.sock` (mode 0666): the device, bind-mounted into a container at
  /dev/nvidia-emu0.sock by the stand-in toolkit hook; libcuda.so.1 speaks to it, one line
  per request (`hello`, `info`, `alloc <bytes>`, `free <handle>`, `run <sm> <mem> <ms>`).
- `<run>/gpu/control.sock` (mode 0600, root): JSON lines for the node's own tools (the
  stand-in NVML and nvidia-smi, the hook, dmesg) and for fault injection by the lab.

Run as `python -m nodelab.gpud --spec <node.json> --run-dir <dir> --kernel-log <file>`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from emulator import catalog
from emulator.faults import XID_MESSAGES

MIB = 1024 * 1024
UTIL_WINDOW_S = 1.0  # NVML averages utilisation over roughly its last sample period
MAX_LINE = 4096
ERR = "err"


@dataclass
class Context:
    """One process's CUDA context on one device."""

    pid: int
    device: Device
    name: str
    conn: socket.socket | None
    created: float
    allocations: dict[int, int] = field(default_factory=dict)  # handle -> bytes
    runs: deque[tuple[float, float, int, int]] = field(default_factory=lambda: deque(maxlen=64))
    stuck: bool = False  # the process is gone but the driver still holds its memory
    busy_s: float = 0.0  # kernel time so far (what NVML's accounting stats call time)

    @property
    def used(self) -> int:
        return sum(self.allocations.values())


@dataclass
class Device:
    """What a context attaches to: a whole GPU, or one MIG device of it."""

    key: str  # "0" for GPU 0, "0:1" for its MIG device in slot 1
    uuid: str
    total: int  # bytes
    gpu: Gpu
    profile: str | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    server: socket.socket | None = None

    @property
    def is_mig(self) -> bool:
        return self.profile is not None

    @property
    def socket_name(self) -> str:
        return self.key.replace(":", "-") + ".sock"


@dataclass
class Gpu:
    index: int
    uuid: str
    model: catalog.GpuModel
    pci_bus: int
    mig_enabled: bool = False
    migs: list[Device] = field(default_factory=list)
    whole: Device | None = None
    ecc_uncorrected: int = 0
    retired_pages_pending: bool = False
    remapped_rows: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # c, u, pending, fail
    held_unattributed: int = 0  # bytes used with no process (a driver-side leak)
    lost: bool = False  # fallen off the bus (Xid 79): NVML answers GPU_IS_LOST

    @property
    def pci_bus_id(self) -> str:
        return f"00000000:{self.pci_bus:02X}:00.0"

    @property
    def kernel_pci(self) -> str:
        return f"0000:{self.pci_bus:02x}:00"

    @property
    def reserved(self) -> int:
        return self.model.reserved_mb * MIB

    @property
    def devices(self) -> list[Device]:
        return [self.whole, *self.migs] if self.whole else list(self.migs)


class GpuDaemon:
    def __init__(self, spec: dict[str, Any], run_dir: Path, kernel_log: Path):
        self.name = spec["name"]
        self.driver_version = spec.get("driver_version", catalog.DEFAULT_DRIVER_VERSION)
        major, minor = spec.get("cuda_version", catalog.DEFAULT_CUDA_VERSION).split(".")
        self.cuda_version = int(major) * 1000 + int(minor) * 10
        self.context_bytes = int(spec.get("context_mb", 0)) * MIB
        self.run_dir = run_dir
        self.kernel_log = kernel_log
        self.gpus: list[Gpu] = []
        for i, g in enumerate(spec["gpus"]):
            model = catalog.model(g["model"])
            gpu = Gpu(
                index=i,
                uuid=catalog.stable_uuid("lab", self.name, i),
                model=model,
                pci_bus=catalog.PCI_BUSES[i % len(catalog.PCI_BUSES)] + 0x100 * (i // 14),
            )
            layout = catalog.GpuSpec(g["model"], _mig_arg(g.get("mig"))).mig_layout()
            gpu.whole = Device(key=str(i), uuid=gpu.uuid, total=model.memory_mb * MIB, gpu=gpu)
            if layout is not None:
                gpu.mig_enabled = True
                taken: set[int] = set()
                for slot, name in enumerate(layout):
                    profile = model.profile(name)
                    gi = next(x for x in profile.gi_ids if x not in taken)
                    taken.add(gi)
                    gpu.migs.append(
                        Device(
                            key=f"{i}:{slot}",
                            uuid=catalog.stable_uuid(
                                "lab", self.name, i, "mig", slot, prefix="MIG"
                            ),
                            total=profile.memory_mb * MIB,
                            gpu=gpu,
                            profile=name,
                            gi_id=gi,
                            ci_id=0,
                        )
                    )
            self.gpus.append(gpu)
        self.contexts: list[Context] = []
        self.handles = itertools.count(0x7F0000000000, 0x200000)
        self.stuck_pids: set[int] = set()
        self.selector = selectors.DefaultSelector()
        self.buffers: dict[socket.socket, bytearray] = {}
        self.running = True
        self.started = time.time()

    # ---------------------------------------------------------------- memory
    def device(self, ident: str) -> Device | None:
        for gpu in self.gpus:
            for dev in gpu.devices:
                if ident in (dev.uuid, dev.key):
                    return dev
        return None

    def device_used(self, dev: Device) -> int:
        return sum(c.used for c in self.contexts if c.device is dev)

    def gpu_used(self, gpu: Gpu) -> int:
        """What NVML's v1 memory info calls used: the driver's reservation, every context
        on the card and its MIG devices, and memory no process accounts for."""
        held = sum(c.used for c in self.contexts if c.device.gpu is gpu)
        return gpu.reserved + held + gpu.held_unattributed

    def device_free(self, dev: Device) -> int:
        gpu = dev.gpu
        card_free = gpu.model.memory_mb * MIB - self.gpu_used(gpu)
        if dev.is_mig:
            return max(0, min(dev.total - self.device_used(dev), card_free))
        return max(0, card_free)

    # ---------------------------------------------------------------- utilisation
    @staticmethod
    def _busy(runs: deque[tuple[float, float, int, int]], now: float) -> tuple[float, float]:
        start = now - UTIL_WINDOW_S
        sm = mem = 0.0
        for a, b, s, m in runs:
            overlap = min(b, now) - max(a, start)
            if overlap > 0:
                sm += s * overlap / UTIL_WINDOW_S
                mem += m * overlap / UTIL_WINDOW_S
        return sm, mem

    def process_util(self, ctx: Context, now: float) -> tuple[int, int] | None:
        """The context's share over the last window, None when it ran no kernel in it
        (NVML lists only processes that had some utilisation in its sample period)."""
        sm, mem = self._busy(ctx.runs, now)
        if sm <= 0 and mem <= 0:
            return None
        return min(100, round(sm)), min(100, round(mem))

    def gpu_util(self, gpu: Gpu, now: float) -> tuple[int, int]:
        sm = mem = 0.0
        for ctx in self.contexts:
            if ctx.device.gpu is gpu:
                s, m = self._busy(ctx.runs, now)
                sm, mem = sm + s, mem + m
        return min(100, round(sm)), min(100, round(mem))

    # ---------------------------------------------------------------- the device protocol
    def on_device_request(self, conn: socket.socket, dev: Device, line: str) -> str:
        ctx = next((c for c in self.contexts if c.conn is conn), None)
        words = line.split()
        op = words[0] if words else ""
        if op == "hello":
            if dev.gpu.lost:
                return "err gpu is lost"
            if dev.gpu.mig_enabled and not dev.is_mig:
                return "err no device: MIG is enabled on this GPU; use a MIG device"
            if ctx is None:
                pid = _peer_pid(conn)
                ctx = Context(
                    pid=pid, device=dev, name=_process_name(pid), conn=conn, created=time.time()
                )
                if self.context_bytes:
                    if self.device_free(dev) < self.context_bytes:
                        return "err out of memory for a context"
                    ctx.allocations[next(self.handles)] = self.context_bytes
                self.contexts.append(ctx)
            return f"ok {dev.total} {dev.gpu.model.name}" + (
                f" MIG {dev.profile}" if dev.is_mig else ""
            )
        if ctx is None:
            return "err not initialised"
        if dev.gpu.lost:
            return "err gpu is lost"
        if op == "info":
            return f"ok {self.device_free(dev)} {dev.total}"
        if op == "alloc" and len(words) == 2 and words[1].isdigit():
            size = int(words[1])
            if size <= 0:
                return "err invalid value"
            if size > self.device_free(dev):
                return "oom"
            handle = next(self.handles)
            ctx.allocations[handle] = size
            return f"ok {handle}"
        if op == "free" and len(words) == 2 and words[1].isdigit():
            return "ok" if ctx.allocations.pop(int(words[1]), None) is not None else ERR
        if op == "run" and len(words) == 4 and all(w.isdigit() for w in words[1:]):
            sm, mem, ms = (int(w) for w in words[1:])
            now = time.time()
            ctx.runs.append((now, now + ms / 1000.0, min(sm, 100), min(mem, 100)))
            ctx.busy_s += ms / 1000.0
            return "ok"
        return "err invalid request"

    def on_device_closed(self, conn: socket.socket) -> None:
        for ctx in [c for c in self.contexts if c.conn is conn]:
            ctx.conn = None
            if ctx.pid in self.stuck_pids:
                ctx.stuck = True  # the driver keeps it: a process that did not go away
                ctx.runs.clear()
            else:
                self.contexts.remove(ctx)  # the driver frees the context at process exit

    # ---------------------------------------------------------------- the control protocol
    def state(self) -> dict[str, Any]:
        now = time.time()
        return {
            "name": self.name,
            "time": now,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "gpus": [self._gpu_state(gpu, now) for gpu in self.gpus],
        }

    def _gpu_state(self, gpu: Gpu, now: float) -> dict[str, Any]:
        """One card as the driver reads it now: memory, MIG devices, load, health, processes."""
        util = None if gpu.mig_enabled else self.gpu_util(gpu, now)
        total = gpu.model.memory_mb * MIB
        used = self.gpu_used(gpu)
        procs = self._processes_state(gpu, now)
        busy = util[0] if util else 0
        return {
            "index": gpu.index,
            "uuid": gpu.uuid,
            "name": gpu.model.name,
            "pci_bus_id": gpu.pci_bus_id,
            "total": total,
            "reserved": gpu.reserved,
            "used": used,
            "free": max(0, total - used),
            "mig_capable": gpu.model.mig_capable,
            "mig_enabled": gpu.mig_enabled,
            "max_mig": 7 if gpu.model.mig_capable and gpu.model.memory_mb > 40000 else 4,
            "migs": [
                {
                    "uuid": d.uuid,
                    "slot": int(d.key.split(":")[1]),
                    "gi_id": d.gi_id,
                    "ci_id": d.ci_id,
                    "profile": d.profile,
                    "total": d.total,
                    "used": self.device_used(d),
                }
                for d in gpu.migs
            ],
            "util": None if util is None else {"gpu": util[0], "memory": util[1]},
            "power_mw": int(
                (gpu.model.idle_w + (gpu.model.tdp_w - gpu.model.idle_w) * busy / 100) * 1000
            ),
            "temperature": 30 + busy * 45 // 100,
            "power_limit_w": gpu.model.tdp_w,
            "ecc": gpu.model.ecc,
            "ecc_uncorrected": gpu.ecc_uncorrected,
            "retired_pages_pending": gpu.retired_pages_pending,
            "remapped_rows": list(gpu.remapped_rows),
            "lost": gpu.lost,
            "processes": procs,
        }

    def _processes_state(self, gpu: Gpu, now: float) -> list[dict[str, Any]]:
        """The contexts on the card (or its MIG devices), with their memory and load."""
        procs = []
        for ctx in self.contexts:
            if ctx.device.gpu is not gpu:
                continue
            pu = None if ctx.device.is_mig else self.process_util(ctx, now)
            procs.append(
                {
                    "pid": ctx.pid,
                    "used": ctx.used,
                    "name": ctx.name,
                    "device": ctx.device.uuid,
                    "gi_id": ctx.device.gi_id,
                    "ci_id": ctx.device.ci_id,
                    "sm": None if pu is None else pu[0],
                    "mem": None if pu is None else pu[1],
                    "stuck": ctx.stuck,
                    "busy_s": round(ctx.busy_s, 3),
                }
            )
        return procs

    def kernel_message(self, text: str) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")
        with self.kernel_log.open("a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {text}\n")

    def on_control(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "state":
            return self.state()
        if op == "devices":
            return {
                "devices": [
                    {
                        "uuid": d.uuid,
                        "key": d.key,
                        "gpu_index": gpu.index,
                        "mig": d.is_mig,
                        "socket": str(self.run_dir / d.socket_name),
                    }
                    for gpu in self.gpus
                    for d in gpu.devices
                ]
            }
        gpu = self._gpu(request.get("gpu"))
        if op == "xid":
            code = int(request["code"])
            pid = request.get("pid")
            who = f"pid={pid}, name={_process_name(int(pid)) or '<unknown>'}, " if pid else ""
            message = request.get("message") or XID_MESSAGES.get(code, "Unknown Xid")
            self.kernel_message(f"NVRM: Xid (PCI:{gpu.kernel_pci}): {code}, {who}{message}")
            if code == 79 and request.get("lost", True):
                gpu.lost = True
            return {"ok": True}
        if op == "ecc":
            gpu.ecc_uncorrected += int(request.get("count", 1))
            if request.get("remap_failed"):
                gpu.remapped_rows[3] = 1
            if request.get("remap_pending"):
                gpu.remapped_rows[2] = 1
            return {"ok": True}
        if op == "hold":  # memory used with no process (a driver-side leak)
            gpu.held_unattributed = int(request.get("mb", 0)) * MIB
            return {"ok": True}
        if op == "stick":  # the process's memory outlives it
            self.stuck_pids.add(int(request["pid"]))
            return {"ok": True}
        if op == "release":  # ops (or a reset) reclaimed a stuck process's memory
            pid = int(request["pid"])
            self.stuck_pids.discard(pid)
            self.contexts = [c for c in self.contexts if not (c.pid == pid and c.stuck)]
            return {"ok": True}
        if op == "reset":  # the card after a reset: healthy and empty of stuck memory
            self.stuck_pids.clear()
            self.contexts = [c for c in self.contexts if not c.stuck]
            for g in self.gpus:
                g.lost = False
                g.ecc_uncorrected = 0
                g.retired_pages_pending = False
                g.remapped_rows = [0, 0, 0, 0]
                g.held_unattributed = 0
            return {"ok": True}
        raise ValueError(f"unknown request {op!r}")

    def _gpu(self, index: object) -> Gpu:
        if index is None:
            return self.gpus[0]
        if not isinstance(index, int) or not 0 <= index < len(self.gpus):
            raise ValueError(f"no GPU {index!r} on this node")
        return self.gpus[index]

    # ---------------------------------------------------------------- serving
    def listen(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for gpu in self.gpus:
            for dev in gpu.devices:
                dev.server = _unix_server(self.run_dir / dev.socket_name, 0o666)
                self.selector.register(dev.server, selectors.EVENT_READ, ("accept", dev))
        control = _unix_server(self.run_dir / "control.sock", 0o600)
        self.selector.register(control, selectors.EVENT_READ, ("accept", None))

    def serve_forever(self) -> None:
        while self.running:
            for key, _ in self.selector.select(timeout=0.5):
                kind, dev = key.data
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                if kind == "accept":
                    with contextlib.suppress(BlockingIOError):
                        conn, _ = sock.accept()
                        conn.setblocking(False)
                        self.buffers[conn] = bytearray()
                        role = "device" if dev is not None else "control"
                        self.selector.register(conn, selectors.EVENT_READ, (role, dev))
                    continue
                self._read(sock, kind, dev)

    def _read(self, conn: socket.socket, kind: str, dev: Device | None) -> None:
        try:
            data = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn, kind)
            return
        buf = self.buffers[conn]
        buf += data
        replies = []
        while (end := buf.find(b"\n")) >= 0:
            line = bytes(buf[:end]).decode("utf-8", "replace")
            del buf[: end + 1]
            if kind == "device":
                assert dev is not None
                replies.append(self.on_device_request(conn, dev, line.strip()))
            else:
                try:
                    replies.append(json.dumps(self.on_control(json.loads(line))))
                except (ValueError, KeyError, TypeError) as exc:
                    replies.append(json.dumps({"error": str(exc)}))
        if len(buf) > MAX_LINE * 16:
            self._close(conn, kind)
            return
        if replies:
            try:
                conn.setblocking(True)
                conn.sendall(("\n".join(replies) + "\n").encode())
                conn.setblocking(False)
            except OSError:
                self._close(conn, kind)

    def _close(self, conn: socket.socket, kind: str) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn)
        self.buffers.pop(conn, None)
        if kind == "device":
            self.on_device_closed(conn)
        conn.close()


def _mig_arg(value: object) -> tuple[str, ...] | bool | None:
    if isinstance(value, list):
        return tuple(value)
    return value  # type: ignore[return-value]


def _unix_server(path: Path, mode: int) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, mode)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _peer_pid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _, _ = struct.unpack("3i", creds)
    return pid


def _process_name(pid: int) -> str:
    """What nvidia-smi prints as process_name: the command as it was started (argv[0])."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--kernel-log", required=True, type=Path)
    args = parser.parse_args(argv)
    daemon = GpuDaemon(json.loads(args.spec.read_text()), args.run_dir, args.kernel_log)
    daemon.kernel_log.touch()

    def stop(*_: object) -> None:
        daemon.running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    daemon.listen()
    print(f"gpud {daemon.name}: {len(daemon.gpus)} GPU(s) ready", flush=True)
    daemon.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
