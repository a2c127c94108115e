"""What the GPU tooling on an emulated node answers: the NVML sampler (`python3 -` with
the sampler on stdin, schema 1 per `nodes/telemetry.py`) and `nvidia-smi`."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from .agent import cmd_agent, is_agent
from .faults import xid_raw
from .gpus import GpuState
from .shell import Invocation
from .state import NodeState

SAMPLER_MARKER = "# GPUPLATFORM_SAMPLER schema=1"
_MARKER_RE = re.compile(rb"(?m)^[ \t]*" + re.escape(SAMPLER_MARKER.encode()) + rb"[ \t]*\r?$")
PYTHON_VERSION = "Python 3.10.12"


# --- the sampler


def sampler_document(node: NodeState, *, discover: bool) -> dict[str, Any]:
    """Schema-1 document from the node's current state (caller holds node.lock)."""
    node.refresh()
    now = node.clock.now()
    gpus = [_sampler_gpu(node, gpu) for gpu in node.gpus]
    processes = [
        {
            "gpu_uuid": node.gpus[p.gpu_index].uuid,
            "pid": p.pid,
            "used_memory_mb": p.used_mb,
            "name": p.name,
            "container_id": p.container_id,
            "sm_utilization": p.sm,
            "memory_utilization": p.mem,
        }
        for p in sorted(node.processes, key=lambda p: (p.gpu_index, p.pid))
    ]
    doc: dict[str, Any] = {
        "schema": 1,
        "source": "nvml",
        "hostname": node.name,
        "taken_at": datetime.fromtimestamp(now, UTC).isoformat(),
        "driver_version": node.driver_version,
        "cuda_version": node.cuda_version,
        "gpus": gpus,
        "processes": processes,
        "xid_events": _fresh_xid_events(node),
    }
    books = node.quota_books()
    if books is not None:
        doc["quota_usage"] = books
    if discover:
        doc["capabilities"] = _capabilities(node)
    doc["errors"] = []
    return doc


def _sampler_gpu(node: NodeState, gpu: GpuState) -> dict[str, Any]:
    used = node.gpu_used_mb(gpu)
    total = gpu.model.memory_mb
    util_gpu: int | None
    util_mem: int | None
    if gpu.mig_enabled:
        util_gpu = util_mem = None
    else:
        util_gpu, util_mem = node.gpu_util(gpu)
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.model.name,
        "pci_bus_id": gpu.pci_bus_id,
        "memory_total_mb": total,
        "memory_used_mb": used,
        "memory_free_mb": total - used,
        "utilization_gpu": util_gpu,
        "utilization_memory": util_mem,
        "temperature_c": node.gpu_temperature(gpu),
        "power_w": node.gpu_power(gpu),
        "mig_capable": gpu.model.mig_capable,
        "mig_enabled": gpu.mig_enabled,
        "mig_devices": [
            {
                "uuid": mig.uuid,
                "gi_id": mig.gi_id,
                "ci_id": mig.ci_id,
                "profile": mig.profile.name,
                "memory_total_mb": mig.profile.memory_mb,
                "memory_used_mb": node.mig_used_mb(gpu, k),
            }
            for k, mig in enumerate(gpu.mig_devices)
        ]
        if gpu.mig_enabled
        else [],
        "ecc_uncorrected_volatile": gpu.ecc_uncorrected if gpu.model.ecc else None,
        "retired_pages_pending": gpu.retired_pages_pending,
        "remapped_rows_pending": gpu.remapped_rows_pending,
        "remapped_rows_failure": gpu.remapped_rows_failure,
    }


def _fresh_xid_events(node: NodeState) -> list[dict[str, Any]]:
    """The Xid events since the sampler last read them (each is read once)."""
    fresh = [x for x in node.xids if x.seq > node.sampler_xid_cursor]
    if fresh:
        node.sampler_xid_cursor = fresh[-1].seq
    return [
        {
            "pci_bus_id": node.gpus[x.gpu_index].kernel_pci,
            "xid": x.code,
            "pid": x.pid,
            "raw": xid_raw(node.gpus[x.gpu_index], x),
        }
        for x in fresh
    ]


def _capabilities(node: NodeState) -> dict[str, Any]:
    """What `--discover` adds: the node's runtime, its quota library, its preflight facts."""
    return {
        "docker": True,
        "nvidia_runtime": True,
        "mig": any(g.model.mig_capable for g in node.gpus),
        "vram_quota_library": node.quota_library,
        "preflight": {
            "os": "Ubuntu 22.04.4 LTS",
            "kernel": "5.15.0-105-generic",
            "docker_version": "26.1.4",
            "cgroup_version": "2",
            "runc_version": node.runc_version,
            # a distribution's runc prints its build as its commit
            "runc_commit": node.runc_build or node.runc_version,
            "runc_path": node.runc_path,
            "runc_package": node.runc_package if node.runc_build else "",
            "runc_build": node.runc_build if node.runc_package else "",
            "userns_remap": "true" if node.userns_remap else "false",
            "toolkit_version": node.toolkit_version,
            "toolkit_build": f"{node.toolkit_version}-1" if node.toolkit_version else "",
            "toolkit_source": "nvidia-ctk" if node.toolkit_version else "",
        },
    }


def cmd_python3(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    if args[:1] in (["--version"], ["-V"]):
        inv.out(PYTHON_VERSION + "\n")
        return 0
    if is_agent(inv.argv):
        return cmd_agent(node.agent, inv)
    if args and args[0] == "-c":
        inv.err("[emulator] python3 -c is not emulated on this node\n")
        return 1
    if args and args[0] != "-" and not args[0].startswith("-"):
        path = inv.shell.path(args[0])
        inv.err(f"{inv.argv[0]}: can't open file '{path}': [Errno 2] No such file or directory\n")
        return 2
    source = inv.stdin.read()
    if not _MARKER_RE.search(source):
        if b"# GPUPLATFORM_SAMPLER" in source:
            inv.err("[emulator] unsupported sampler schema (this emulator speaks schema=1)\n")
        else:
            inv.err(
                "[emulator] python3 on an emulated node runs only the gpuplatform sampler "
                f"(stdin must contain the line {SAMPLER_MARKER!r})\n"
            )
        return 1
    discover = "--discover" in args[1:]
    with node.lock:
        if not node.driver_loaded or not node.nvml_available:
            error = node.nvml_error if node.driver_loaded else "NVML: Driver Not Loaded"
            inv.out(json.dumps({"schema": 1, "source": "unavailable", "error": error}) + "\n")
            return 3
        doc = sampler_document(node, discover=discover)
    inv.out(json.dumps(doc) + "\n")
    return 0


# --- the sampler kept running (`--serve`)

PYTHON_NAMES = {"python3", "python", "python3.10", "python3.11", "python3.12"}


def is_sampler_serve(argv: list[str]) -> bool:
    """`python3 -u -c <bootstrap> --serve`: the bootstrap reads a length line and that
    many bytes of sampler source from stdin, then the sampler answers request lines."""
    if not argv or argv[0].rsplit("/", 1)[-1] not in PYTHON_NAMES:
        return False
    if "-c" not in argv or argv[-1] != "--serve":
        return False
    code = argv[argv.index("-c") + 1] if argv.index("-c") + 1 < len(argv) else ""
    return "readline()" in code and "exec(compile(" in code


class SamplerSession:
    """The emulated side of a sampler stream: feed it bytes, get reply lines back."""

    def __init__(self, node: NodeState):
        self.node = node
        self.buffer = bytearray()
        self.source_len: int | None = None
        self.ready = False
        self.finished: int | None = None  # exit status once the session ends

    def feed(self, data: bytes) -> list[bytes]:
        self.buffer += data
        replies: list[bytes] = []
        while self.finished is None:
            if self.source_len is None:
                end = self.buffer.find(b"\n")
                if end < 0:
                    break
                try:
                    self.source_len = int(self.buffer[:end])
                except ValueError:
                    replies.append(b"ValueError: invalid literal for int()\n")
                    self.finished = 1
                    break
                del self.buffer[: end + 1]
            if not self.ready:
                if len(self.buffer) < self.source_len:
                    break
                source = bytes(self.buffer[: self.source_len])
                del self.buffer[: self.source_len]
                if not _MARKER_RE.search(source):
                    replies.append(b"[emulator] only the gpuplatform sampler is emulated\n")
                    self.finished = 1
                    break
                with self.node.lock:
                    if not self.node.driver_loaded or not self.node.nvml_available:
                        error = (
                            self.node.nvml_error
                            if self.node.driver_loaded
                            else "NVML: Driver Not Loaded"
                        )
                        doc = {"schema": 1, "source": "unavailable", "error": error}
                        replies.append(json.dumps(doc).encode() + b"\n")
                        self.finished = 3
                        break
                self.ready = True
            end = self.buffer.find(b"\n")
            if end < 0:
                break
            request = bytes(self.buffer[:end]).strip()
            del self.buffer[: end + 1]
            if request not in (b"sample", b"discover"):
                doc = {"schema": 1, "source": "error", "error": "unknown request"}
            else:
                with self.node.lock:
                    if not self.node.driver_loaded or not self.node.nvml_available:
                        # what the real sampler answers when NVML calls start failing
                        doc = {
                            "schema": 1,
                            "source": "unavailable",
                            "error": f"sampling failed: NVMLError: {self.node.nvml_error}",
                        }
                    else:
                        doc = sampler_document(self.node, discover=request == b"discover")
            replies.append(json.dumps(doc).encode() + b"\n")
        return replies


# --- nvidia-smi

NA = "[N/A]"
SMI_DRIVER_FAILED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n\n"
)

# canonical name -> (header, unit)
_GPU_FIELDS: dict[str, tuple[str, str]] = {
    "timestamp": ("timestamp", ""),
    "driver_version": ("driver_version", ""),
    "count": ("count", ""),
    "name": ("name", ""),
    "serial": ("serial", ""),
    "uuid": ("uuid", ""),
    "pci.bus_id": ("pci.bus_id", ""),
    "index": ("index", ""),
    "memory.total": ("memory.total [MiB]", "MiB"),
    "memory.reserved": ("memory.reserved [MiB]", "MiB"),
    "memory.used": ("memory.used [MiB]", "MiB"),
    "memory.free": ("memory.free [MiB]", "MiB"),
    "utilization.gpu": ("utilization.gpu [%]", "%"),
    "utilization.memory": ("utilization.memory [%]", "%"),
    "temperature.gpu": ("temperature.gpu", ""),
    "power.draw": ("power.draw [W]", "W"),
    "power.limit": ("power.limit [W]", "W"),
    "mig.mode.current": ("mig.mode.current", ""),
    "mig.mode.pending": ("mig.mode.pending", ""),
    "ecc.errors.uncorrected.volatile.total": ("ecc.errors.uncorrected.volatile.total", ""),
    "retired_pages.pending": ("retired_pages.pending", ""),
    "remapped_rows.pending": ("remapped_rows.pending", ""),
    "remapped_rows.failure": ("remapped_rows.failure", ""),
    "persistence_mode": ("persistence_mode", ""),
    "pstate": ("pstate", ""),
}
_GPU_ALIASES = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "temperature.gpu.tlimit": "temperature.gpu",
    "power.draw.instant": "power.draw",
    "power.draw.average": "power.draw",
    "enforced.power.limit": "power.limit",
    "persistence-mode": "persistence_mode",
}
_APP_FIELDS: dict[str, tuple[str, str]] = {
    "timestamp": ("timestamp", ""),
    "gpu_name": ("gpu_name", ""),
    "gpu_bus_id": ("gpu_bus_id", ""),
    "gpu_serial": ("gpu_serial", ""),
    "gpu_uuid": ("gpu_uuid", ""),
    "pid": ("pid", ""),
    "process_name": ("process_name", ""),
    "used_memory": ("used_gpu_memory [MiB]", "MiB"),
}
_APP_ALIASES = {"name": "process_name", "used_gpu_memory": "used_memory"}


def _smi_timestamp(now: float) -> str:
    dt = datetime.fromtimestamp(now, UTC)
    return dt.strftime("%Y/%m/%d %H:%M:%S.") + f"{dt.microsecond // 1000:03d}"


def _gpu_value(node: NodeState, gpu: GpuState, field: str, now: float) -> tuple[str, bool]:
    """(value, has_unit): has_unit False for [N/A] and unit-less fields."""
    used = node.gpu_used_mb(gpu)
    m = gpu.model
    if field == "timestamp":
        return _smi_timestamp(now), False
    if field == "driver_version":
        return node.driver_version, False
    if field == "count":
        return str(len(node.gpus)), False
    if field == "name":
        return m.name, False
    if field == "serial":
        return (str(1320000000000 + int(gpu.uuid[4:12], 16) % 10**9) if m.ecc else NA), False
    if field == "uuid":
        return gpu.uuid, False
    if field == "pci.bus_id":
        return gpu.pci_bus_id, False
    if field == "index":
        return str(gpu.index), False
    if field == "memory.total":
        return str(m.memory_mb), True
    if field == "memory.reserved":
        return "0", True
    if field == "memory.used":
        return str(used), True
    if field == "memory.free":
        return str(m.memory_mb - used), True
    if field in ("utilization.gpu", "utilization.memory"):
        if gpu.mig_enabled:
            return NA, False
        sm, mem = node.gpu_util(gpu)
        return str(sm if field == "utilization.gpu" else mem), True
    if field == "temperature.gpu":
        return str(node.gpu_temperature(gpu)), False
    if field == "power.draw":
        p = node.gpu_power(gpu)
        return (NA, False) if p is None else (f"{p:.2f}", True)
    if field == "power.limit":
        return (f"{m.tdp_w:.2f}", True) if gpu.power_supported else (NA, False)
    if field in ("mig.mode.current", "mig.mode.pending"):
        if not m.mig_capable:
            return NA, False
        return ("Enabled" if gpu.mig_enabled else "Disabled"), False
    if field == "ecc.errors.uncorrected.volatile.total":
        return (str(gpu.ecc_uncorrected) if m.ecc else NA), False
    if field == "retired_pages.pending":
        return (
            NA if m.mig_capable or not m.ecc else ("Yes" if gpu.retired_pages_pending else "No")
        ), False
    if field == "remapped_rows.pending":
        return (("Yes" if gpu.remapped_rows_pending else "No") if m.ecc else NA), False
    if field == "remapped_rows.failure":
        return (("Yes" if gpu.remapped_rows_failure else "No") if m.ecc else NA), False
    if field == "persistence_mode":
        return "Enabled", False
    if field == "pstate":
        return ("P0" if node.gpu_util(gpu)[0] else "P8"), False
    return NA, False


def _parse_format(value: str) -> tuple[bool, bool, bool]:
    """--format=csv[,noheader][,nounits] -> (csv, header, units)."""
    opts = [o.strip() for o in value.split(",")]
    return "csv" in opts, "noheader" not in opts, "nounits" not in opts


def _select(node: NodeState, ids: str | None) -> list[GpuState] | None:
    if ids is None:
        return list(node.gpus)
    out = []
    for ident in ids.split(","):
        ident = ident.strip()
        found = None
        for gpu in node.gpus:
            if ident in (str(gpu.index), gpu.uuid, gpu.pci_bus_id) or (
                ident.lower() == gpu.pci_bus_id.lower()
            ):
                found = gpu
        if found is None:
            return None
        out.append(found)
    return out


def cmd_nvidia_smi(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    opts: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and "=" in a:
            key, _, value = a.partition("=")
            opts[key] = value
        elif a in ("--query-gpu", "--query-compute-apps", "--format", "-i", "--id"):
            if i + 1 >= len(args):
                inv.out(f'Option "{a}" requires an argument.\n')
                return 2
            opts[a] = args[i + 1]
            i += 1
        elif a.startswith("-i") and len(a) > 2:
            opts["-i"] = a[2:]
        else:
            flags.add(a)
        i += 1
    ids = opts.get("-i", opts.get("--id"))
    if flags & {"-h", "--help"}:
        inv.out(f"NVIDIA System Management Interface -- v{node.driver_version}\n")
        return 0
    if "--version" in flags:
        inv.out(
            f"NVIDIA-SMI version  : {node.driver_version}\nNVML version        : "
            f"{node.driver_version.split('.')[0]}.{node.driver_version.split('.', 1)[1]}\n"
            f"DRIVER version      : {node.driver_version}\nCUDA Version        : "
            f"{node.cuda_version}\n"
        )
        return 0
    with node.lock:
        if not node.driver_loaded:
            inv.out(SMI_DRIVER_FAILED)
            return 9
        node.refresh()
        now = node.clock.now()
        gpus = _select(node, ids)
        if gpus is None:
            inv.out("No devices were found\n")
            return 6
        unknown = sorted(flags - {"-L", "--list-gpus", "-q", "--query"})
        if unknown:
            inv.out(
                "\nInvalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n"
            )
            return 2
        if "--query-gpu" in opts or "--query-compute-apps" in opts:
            return _csv(node, inv, opts, gpus, now)
        if flags & {"-L", "--list-gpus"}:
            for gpu in gpus:
                inv.out(f"GPU {gpu.index}: {gpu.model.name} (UUID: {gpu.uuid})\n")
                if gpu.mig_enabled:
                    for k, mig in enumerate(gpu.mig_devices):
                        inv.out(f"  MIG {mig.profile.name:<11} Device {k:>2}: (UUID: {mig.uuid})\n")
            return 0
        inv.out(_summary_table(node, gpus, now))
        return 0


def _csv(
    node: NodeState, inv: Invocation, opts: dict[str, str], gpus: list[GpuState], now: float
) -> int:
    fmt = opts.get("--format")
    if fmt is None:
        inv.out(
            '"--format" option is required with query options. '
            "Please run 'nvidia-smi -h' for help.\n"
        )
        return 2
    is_csv, header, units = _parse_format(fmt)
    if not is_csv:
        inv.out(f"\"{fmt}\" is not a valid format. Please run 'nvidia-smi -h' for help.\n")
        return 2
    apps = "--query-compute-apps" in opts
    raw_fields = opts["--query-compute-apps" if apps else "--query-gpu"]
    table, aliases = (_APP_FIELDS, _APP_ALIASES) if apps else (_GPU_FIELDS, _GPU_ALIASES)
    fields = []
    for f in raw_fields.split(","):
        f = f.strip()
        canon = aliases.get(f, f)
        if canon not in table:
            inv.out(f'Field "{f}" is not a valid field to query.\n\n')
            return 2
        fields.append(canon)
    lines = []
    if header:
        lines.append(", ".join(table[f][0] for f in fields))
    if apps:
        lines += _app_lines(node, gpus, fields, units, now)
    else:
        lines += _gpu_lines(node, gpus, fields, units, now)
    if lines:
        inv.out("\n".join(lines) + "\n")
    return 0


def _app_lines(
    node: NodeState, gpus: list[GpuState], fields: list[str], units: bool, now: float
) -> list[str]:
    """--query-compute-apps: one line per process on the selected GPUs."""
    lines = []
    wanted = {g.index for g in gpus}
    for p in sorted(node.processes, key=lambda p: (p.gpu_index, p.pid)):
        if p.gpu_index not in wanted:
            continue
        gpu = node.gpus[p.gpu_index]
        row = []
        for f in fields:
            value = {
                "timestamp": _smi_timestamp(now),
                "gpu_name": gpu.model.name,
                "gpu_bus_id": gpu.pci_bus_id,
                "gpu_serial": _gpu_value(node, gpu, "serial", now)[0],
                "gpu_uuid": gpu.uuid,
                "pid": str(p.pid),
                "process_name": p.exe,
                "used_memory": str(p.used_mb),
            }[f]
            if f == "used_memory" and units:
                value += " MiB"
            row.append(value)
        lines.append(", ".join(row))
    return lines


def _gpu_lines(
    node: NodeState, gpus: list[GpuState], fields: list[str], units: bool, now: float
) -> list[str]:
    """--query-gpu: one line per selected GPU."""
    lines = []
    for gpu in gpus:
        row = []
        for f in fields:
            value, has_unit = _gpu_value(node, gpu, f, now)
            if units and has_unit and _GPU_FIELDS[f][1]:
                value = f"{value} {_GPU_FIELDS[f][1]}"
            row.append(value)
        lines.append(", ".join(row))
    return lines


_BAR = "+" + "-" * 89 + "+"
_SEP = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"


def _row(*cells: str) -> str:
    """One line of the screen: three columns, or one across the width."""
    widths = (39, 22, 20) if len(cells) == 3 else (87,)
    return "| " + " | ".join(c[:w].ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"


def _summary_table(node: NodeState, gpus: list[GpuState], now: float) -> str:
    """The human-readable default `nvidia-smi` screen (approximate; nothing parses it)."""
    out = [
        datetime.fromtimestamp(now, UTC).strftime("%a %b %d %H:%M:%S %Y"),
        _BAR,
        _row(
            f"NVIDIA-SMI {node.driver_version:<19}Driver Version: {node.driver_version:<15}"
            f"CUDA Version: {node.cuda_version}"
        ),
        _SEP,
        _row(
            "GPU  Name                 Persistence-M",
            "Bus-Id          Disp.A",
            "Volatile Uncorr. ECC",
        ),
        _row(
            "Fan  Temp   Perf          Pwr:Usage/Cap",
            "          Memory-Usage",
            "GPU-Util  Compute M.",
        ),
        _row("", "", "              MIG M."),
        _SEP.replace("-", "="),
    ]
    for gpu in gpus:
        out += _summary_gpu(node, gpu)
    out += [
        "",
        _BAR,
        _row("Processes:"),
        _row(" GPU   GI   CI        PID   Type   Process name" + " " * 30 + "GPU Memory"),
        _row("       ID   ID" + " " * 63 + "Usage"),
        _BAR.replace("-", "="),
    ]
    out += _summary_processes(node, gpus)
    out.append(_BAR)
    return "\n".join(out) + "\n"


def _summary_gpu(node: NodeState, gpu: GpuState) -> list[str]:
    used = node.gpu_used_mb(gpu)
    p = node.gpu_power(gpu)
    pw = f"{p:.0f}W / {gpu.model.tdp_w:.0f}W" if p is not None else "N/A /  N/A"
    ecc = str(gpu.ecc_uncorrected) if gpu.model.ecc else "N/A"
    mig = ("Enabled" if gpu.mig_enabled else "Disabled") if gpu.model.mig_capable else "N/A"
    util = "N/A" if gpu.mig_enabled else f"{node.gpu_util(gpu)[0]}%"
    return [
        _row(f"{gpu.index:>3}  {gpu.model.name[:27]:<27}     On",
             f"{gpu.pci_bus_id:<16} Off", f"{ecc:>20}"),
        _row(f"N/A   {node.gpu_temperature(gpu):>2}C    P0 {pw:>23}",
             f"{used}MiB / {gpu.model.memory_mb}MiB".rjust(22),
             f"{util:>8}      Default"),
        _row("", "", f"{mig:>20}"),
        _SEP,
    ]  # fmt: skip


def _summary_processes(node: NodeState, gpus: list[GpuState]) -> list[str]:
    procs = [p for p in node.processes if p.gpu_index in {g.index for g in gpus}]
    if not procs:
        return [_row(" No running processes found")]
    out = []
    for p in sorted(procs, key=lambda p: (p.gpu_index, p.pid)):
        gpu = node.gpus[p.gpu_index]
        gi = ci = "N/A"
        if p.mig_index is not None:
            gi, ci = str(gpu.mig_devices[p.mig_index].gi_id), "0"
        out.append(_row(f" {p.gpu_index:>3}  {gi:>4} {ci:>4} {p.pid:>10}      C   "
                        f"{p.exe[:40]:<40} {f'{p.used_mb}MiB':>9}"))  # fmt: skip
    return out
