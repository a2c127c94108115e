"""What a node reports, and how its raw output is parsed. Pure Python: no Django.

Two sources, one result (`NodeSample`):

1. The NVML sampler (`nodes/sampler.py`), run on the node as `python3 - [--discover]`
   with its source on stdin. It prints one JSON document, schema version 1:

   {
     "schema": 1,
     "source": "nvml",
     "hostname": "gpu-node-7",
     "taken_at": "2026-11-30T04:00:00.123456+00:00",      # UTC, ISO 8601
     "driver_version": "550.54.15",
     "cuda_version": "12.4",                               # from nvmlSystemGetCudaDriverVersion
     "gpus": [
       {"index": 0, "uuid": "GPU-...", "name": "NVIDIA A30", "pci_bus_id": "00000000:3B:00.0",
        "memory_total_mb": 24576, "memory_used_mb": 1234, "memory_free_mb": 23342,
        "utilization_gpu": 37, "utilization_memory": 12,     # percent, null if not supported
        "temperature_c": 45, "power_w": 88.5,                # null if not supported
        "mig_capable": true, "mig_enabled": false,
        "mig_devices": [{"uuid": "MIG-...", "gi_id": 1, "ci_id": 0, "profile": "1g.6gb",
                          "memory_total_mb": 5952, "memory_used_mb": 0}],
        "ecc_uncorrected_volatile": 0,                        # null if not supported
        "retired_pages_pending": false, "remapped_rows_pending": false,
        "remapped_rows_failure": false}
     ],
     "processes": [
       {"gpu_uuid": "GPU-...", "pid": 4242, "used_memory_mb": 2048, "name": "python3",
        "container_id": "<64 hex>" | null,                   # from /proc/<pid>/cgroup
        "sm_utilization": 30 | null, "memory_utilization": 10 | null}
     ],
     "xid_events": [{"pci_bus_id": "0000:3b:00", "xid": 79, "pid": null,
                      "raw": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."}],
     "quota_usage": [{"container_id": "<64 hex>", "used_mb": 2048}],  # only where the
                              # node's VRAM quota library keeps per-container accounting
     "capabilities": {                                     # only with --discover
       "docker": true, "nvidia_runtime": true, "mig": true,
       "vram_quota_library": "/usr/lib/gpuplatform/libvramquota.so" | null,
       "preflight": {"os": "...", "kernel": "...", "docker_version": "...",   # text; "" =
                     "runc_version": "...", "runc_build": "...",            # unknown
                     "runc_path": "/usr/sbin/runc", "runc_commit": "...",   # runc: the
                     "runc_package": "runc", "userns_remap": "false",       # binary dockerd runs
                     "toolkit_version": "...", "toolkit_build": "...",
                     "toolkit_source": "nvidia-ctk", "cgroup_version": "2"}},
     "errors": ["human-readable problems that did not stop the sample"]
   }

   When pynvml is missing or NVML cannot initialise, the sampler prints
   {"schema": 1, "source": "unavailable", "error": "..."} and exits with code 3: the
   caller then falls back to nvidia-smi.

2. `nvidia-smi` CSV (fallback): its queries and parser are in `nodes/smi.py`.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

SAMPLER_SCHEMA_VERSION = 1
SAMPLER_UNAVAILABLE_EXIT = 3


class ParseError(ValueError):
    """The node's output is not in the expected format (never a crash in the caller)."""


@dataclass(frozen=True)
class MigDevice:
    uuid: str
    memory_total_mb: int
    memory_used_mb: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None
    profile: str | None = None


@dataclass(frozen=True)
class GpuReading:
    index: int
    uuid: str
    name: str
    memory_total_mb: int
    memory_used_mb: int
    memory_free_mb: int | None = None
    pci_bus_id: str | None = None
    utilization_gpu: int | None = None
    utilization_memory: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool = False
    remapped_rows_pending: bool = False
    remapped_rows_failure: bool = False


@dataclass(frozen=True)
class ProcessReading:
    gpu_uuid: str
    pid: int
    used_memory_mb: int
    name: str = ""
    container_id: str | None = None
    sm_utilization: int | None = None
    memory_utilization: int | None = None


@dataclass(frozen=True)
class XidEvent:
    xid: int
    raw: str
    pci_bus_id: str | None = None
    pid: int | None = None


@dataclass(frozen=True)
class QuotaUsage:
    """What the node's quota library counts a container as holding (its own books, which
    miss what it does not intercept: the platform compares them with NVML's)."""

    container_id: str
    used_mb: int


@dataclass(frozen=True)
class Capabilities:
    docker: bool = False
    nvidia_runtime: bool = False
    mig: bool = False
    vram_quota_library: str | None = None
    # the preflight gate's facts (nodes.preflight.FACT_KEYS), text, "" when unknown
    facts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeSample:
    source: str  # "nvml" or "nvidia-smi"
    taken_at: datetime | None
    gpus: tuple[GpuReading, ...]
    processes: tuple[ProcessReading, ...] = ()
    xid_events: tuple[XidEvent, ...] = ()
    driver_version: str = ""
    cuda_version: str = ""
    hostname: str = ""
    capabilities: Capabilities | None = None
    errors: tuple[str, ...] = field(default=())
    quota_usage: tuple[QuotaUsage, ...] | None = None  # None: the node keeps no such books


# --------------------------------------------------------------------------------------------
# Parsers. Every problem with the node's output is a ParseError that says what and where; the
# caller records it and never crashes on what a node prints.
#
# Choices the contract leaves open:
# - A GPU's memory_used_mb above memory_total_mb by more than 1% is rejected (a tiny overshoot
#   is tolerated: NVML and nvidia-smi round independently). The same holds for free memory
#   and for MIG devices.
# - A process's used memory that the driver does not report (null, "[N/A]") becomes 0, since
#   ProcessReading.used_memory_mb is an int.
# - A process on a MIG device carries the MIG device's uuid ("MIG-...") as gpu_uuid, from both
#   sources: `nvidia-smi --query-gpu` lists only physical GPUs, so the fallback cannot map it
#   back; the sampler lists the MIG devices under their GPU, so a MIG uuid names its parent.
# - Unknown keys in the sampler's JSON are ignored, so optional fields can be added later.
# --------------------------------------------------------------------------------------------

T = TypeVar("T")

SAMPLER_MARKER = "# GPUPLATFORM_SAMPLER schema=1"
MAX_OUTPUT_CHARS = 8 * 1024 * 1024
# Upper bounds past which a value is garbage, not a reading.
MAX_MEMORY_MB = 4 * 1024 * 1024  # 4 TiB of VRAM on one device
MAX_TEMPERATURE_C = 200
MIN_TEMPERATURE_C = -60
MAX_POWER_W = 10_000.0
MAX_PID = 4_194_304  # Linux PID_MAX_LIMIT on 64-bit
MAX_XID = 10_000
MAX_GPUS = 1024
USED_OVER_TOTAL_TOLERANCE = 0.01


class SamplerUnavailable(ParseError):
    """The sampler ran but NVML could not be used (exit code 3): fall back to nvidia-smi."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"NVML sampler unavailable: {reason}")
        self.reason = reason


# ----------------------------------------------------------------------------- commands


# Serve mode: the sampler stays running on the node. Its source cannot come on stdin
# as a whole (stdin then carries the requests), so a one-line bootstrap reads a length
# line and that many bytes of source, then runs it with `--serve`: each request line
# ("sample" or "discover") is answered with one JSON line on the open channel.
SERVE_BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;n=int(b.readline());"
    "exec(compile(b.read(n),'gpuplatform-sampler','exec'))"
)
SERVE_REQUEST_SAMPLE = b"sample\n"
SERVE_REQUEST_DISCOVER = b"discover\n"


def sampler_serve_argv() -> list[str]:
    return ["python3", "-u", "-c", SERVE_BOOTSTRAP, "--serve"]


@functools.lru_cache(maxsize=1)
def sampler_serve_preamble() -> bytes:
    source = sampler_source().encode("utf-8")
    return str(len(source)).encode() + b"\n" + source


@functools.lru_cache(maxsize=1)
def sampler_source() -> str:
    """The sampler script, to send on stdin to `python3 - [--discover]` on the node."""
    return Path(__file__).with_name("sampler.py").read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- helpers


def _where(path: str, message: str) -> ParseError:
    return ParseError(f"{path}: {message}" if path else message)


def _get(obj: dict[str, Any], key: str, path: str, *, required: bool) -> Any:
    if key not in obj:
        if required:
            raise _where(path, f"missing required key {key!r}")
        return None
    return obj[key]


def _int(
    obj: dict[str, Any],
    key: str,
    path: str,
    *,
    required: bool = False,
    low: int = 0,
    high: int | None = None,
) -> int | None:
    value: object = _get(obj, key, path, required=required)  # JSON: narrowed below
    if value is None:
        if required:
            raise _where(path, f"{key} must not be null")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _where(path, f"{key} must be an integer, got {value!r}")
    _check_bounds(value, key, path, low, high)
    return value


def _float(
    obj: dict[str, Any], key: str, path: str, *, low: float = 0.0, high: float
) -> float | None:
    value = _get(obj, key, path, required=False)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _where(path, f"{key} must be a number, got {value!r}")
    _check_bounds(value, key, path, low, high)
    return float(value)


def _check_bounds(value: float, key: str, path: str, low: float, high: float | None) -> None:
    if value < low:
        raise _where(path, f"{key} is {value}, below {low}")
    if high is not None and value > high:
        raise _where(path, f"{key} is {value}, above {high}: not a plausible reading")


def _str(obj: dict[str, Any], key: str, path: str, *, required: bool = False) -> str | None:
    value = _get(obj, key, path, required=required)
    if value is None:
        if required:
            raise _where(path, f"{key} must not be null")
        return None
    if not isinstance(value, str):
        raise _where(path, f"{key} must be a string, got {value!r}")
    if required and not value.strip():
        raise _where(path, f"{key} must not be empty")
    return value


def _bool(obj: dict[str, Any], key: str, path: str) -> bool:
    value = _get(obj, key, path, required=False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _where(path, f"{key} must be true or false, got {value!r}")
    return value


def _list(obj: dict[str, Any], key: str, path: str, *, required: bool = False) -> list[Any]:
    value = _get(obj, key, path, required=required)
    if value is None:
        if required:
            raise _where(path, f"{key} must be a list, got null")
        return []
    if not isinstance(value, list):
        raise _where(path, f"{key} must be a list, got {type(value).__name__}")
    return value


def _objects(
    obj: dict[str, Any],
    key: str,
    path: str,
    parse: Callable[[dict[str, Any], str], T],
    *,
    required: bool = False,
) -> tuple[T, ...]:
    out = []
    for i, item in enumerate(_list(obj, key, path, required=required)):
        where = f"{path}.{key}[{i}]" if path else f"{key}[{i}]"
        if not isinstance(item, dict):
            raise _where(where, f"must be an object, got {type(item).__name__}")
        out.append(parse(item, where))
    return tuple(out)


def _check_used(used: int | None, total: int, what: str, path: str) -> None:
    if used is not None and used > total * (1 + USED_OVER_TOTAL_TOLERANCE):
        raise _where(path, f"{what} ({used} MiB) exceeds memory_total_mb ({total} MiB)")


def _datetime(value: Any, path: str) -> datetime:
    if not isinstance(value, str):
        raise _where(path, f"taken_at must be an ISO 8601 string, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise _where(path, f"taken_at is not ISO 8601: {value!r}") from None
    # The contract says UTC; a naive timestamp is read as UTC rather than as local time.
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def require_unique(items: Iterable[T], what: str) -> None:
    seen: set[T] = set()
    for item in items:
        if item in seen:
            raise ParseError(f"duplicate {what} {item!r}")
        seen.add(item)


# ----------------------------------------------------------------------------- sampler JSON


def _mig_device(obj: dict[str, Any], path: str) -> MigDevice:
    total = _int(obj, "memory_total_mb", path, required=True, high=MAX_MEMORY_MB)
    assert total is not None  # required
    used = _int(obj, "memory_used_mb", path, high=MAX_MEMORY_MB)
    _check_used(used, total, "memory_used_mb", path)
    return MigDevice(
        uuid=_str(obj, "uuid", path, required=True) or "",
        memory_total_mb=total,
        memory_used_mb=used,
        gi_id=_int(obj, "gi_id", path, high=MAX_GPUS),
        ci_id=_int(obj, "ci_id", path, high=MAX_GPUS),
        profile=_str(obj, "profile", path),
    )


def gpu_reading(obj: dict[str, Any], path: str) -> GpuReading:
    total = _int(obj, "memory_total_mb", path, required=True, low=1, high=MAX_MEMORY_MB)
    used = _int(obj, "memory_used_mb", path, required=True, high=MAX_MEMORY_MB)
    free = _int(obj, "memory_free_mb", path, high=MAX_MEMORY_MB)
    assert total is not None and used is not None  # required
    _check_used(used, total, "memory_used_mb", path)
    _check_used(free, total, "memory_free_mb", path)
    mig_devices = _objects(obj, "mig_devices", path, _mig_device)
    require_unique((m.uuid for m in mig_devices), f"{path} MIG device uuid")
    return GpuReading(
        index=_int(obj, "index", path, required=True, high=MAX_GPUS - 1) or 0,
        uuid=_str(obj, "uuid", path, required=True) or "",
        name=_str(obj, "name", path, required=True) or "",
        memory_total_mb=total,
        memory_used_mb=used,
        memory_free_mb=free,
        pci_bus_id=_str(obj, "pci_bus_id", path),
        utilization_gpu=_int(obj, "utilization_gpu", path, high=100),
        utilization_memory=_int(obj, "utilization_memory", path, high=100),
        temperature_c=_int(
            obj, "temperature_c", path, low=MIN_TEMPERATURE_C, high=MAX_TEMPERATURE_C
        ),
        power_w=_float(obj, "power_w", path, high=MAX_POWER_W),
        mig_capable=_bool(obj, "mig_capable", path),
        mig_enabled=_bool(obj, "mig_enabled", path),
        mig_devices=mig_devices,
        ecc_uncorrected_volatile=_int(obj, "ecc_uncorrected_volatile", path),
        retired_pages_pending=_bool(obj, "retired_pages_pending", path),
        remapped_rows_pending=_bool(obj, "remapped_rows_pending", path),
        remapped_rows_failure=_bool(obj, "remapped_rows_failure", path),
    )


def process_reading(obj: dict[str, Any], path: str) -> ProcessReading:
    return ProcessReading(
        gpu_uuid=_str(obj, "gpu_uuid", path, required=True) or "",
        pid=_int(obj, "pid", path, required=True, low=1, high=MAX_PID) or 0,
        used_memory_mb=_int(obj, "used_memory_mb", path, high=MAX_MEMORY_MB) or 0,
        name=_str(obj, "name", path) or "",
        container_id=_str(obj, "container_id", path) or None,
        sm_utilization=_int(obj, "sm_utilization", path, high=100),
        memory_utilization=_int(obj, "memory_utilization", path, high=100),
    )


def _xid(obj: dict[str, Any], path: str) -> XidEvent:
    return XidEvent(
        xid=_int(obj, "xid", path, required=True, high=MAX_XID) or 0,
        raw=_str(obj, "raw", path, required=True) or "",
        pci_bus_id=_str(obj, "pci_bus_id", path),
        pid=_int(obj, "pid", path, low=0, high=MAX_PID),
    )


def _quota_usage(obj: dict[str, Any], path: str) -> QuotaUsage:
    cid = _str(obj, "container_id", path, required=True) or ""
    if not re.fullmatch(r"[0-9a-f]{64}", cid):
        raise _where(f"{path}.container_id", f"is not a container id: {cid[:80]!r}")
    return QuotaUsage(
        container_id=cid, used_mb=_int(obj, "used_mb", path, required=True, high=MAX_MEMORY_MB) or 0
    )


def _capabilities(obj: dict[str, Any]) -> Capabilities | None:
    value = obj.get("capabilities")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ParseError(f"capabilities must be an object, got {type(value).__name__}")
    return Capabilities(
        docker=_bool(value, "docker", "capabilities"),
        nvidia_runtime=_bool(value, "nvidia_runtime", "capabilities"),
        mig=_bool(value, "mig", "capabilities"),
        vram_quota_library=_str(value, "vram_quota_library", "capabilities") or None,
        facts=_facts(value.get("preflight")),
    )


MAX_FACT_CHARS = 200


def _facts(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ParseError(f"capabilities.preflight must be an object, got {type(value).__name__}")
    out = {}
    for key, item in value.items():
        if not isinstance(item, str):
            raise _where("capabilities.preflight", f"{key} must be a string, got {item!r}")
        out[str(key)[:64]] = item.strip()[:MAX_FACT_CHARS]
    return out


def parse_sampler_output(text: str) -> NodeSample:
    """The sampler's stdout (one JSON document, schema 1) as a NodeSample.

    Raises SamplerUnavailable for the {"source": "unavailable"} document, ParseError for
    anything else that is not a valid schema-1 sample.
    """
    if not isinstance(text, str):
        raise ParseError(f"sampler output must be text, got {type(text).__name__}")
    if len(text) > MAX_OUTPUT_CHARS:
        raise ParseError(f"sampler output is {len(text)} characters, over {MAX_OUTPUT_CHARS}")
    if not text.strip():
        raise ParseError("sampler output is empty")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ParseError(f"sampler output is not one JSON document: {exc}") from None
    if not isinstance(doc, dict):
        raise ParseError(f"sampler output must be a JSON object, got {type(doc).__name__}")
    schema = _get(doc, "schema", "", required=True)
    if schema != SAMPLER_SCHEMA_VERSION or isinstance(schema, bool):
        raise ParseError(
            f"unsupported sampler schema {schema!r}, expected {SAMPLER_SCHEMA_VERSION}"
        )
    source = _str(doc, "source", "", required=True)
    if source == "unavailable":
        raise SamplerUnavailable(_str(doc, "error", "") or "no reason given")
    if source != "nvml":
        raise ParseError(f"unknown sampler source {source!r}, expected 'nvml'")

    gpus = _objects(doc, "gpus", "", gpu_reading, required=True)
    require_unique((g.index for g in gpus), "GPU index")
    require_unique((g.uuid for g in gpus), "GPU uuid")
    errors = _list(doc, "errors", "")
    if not all(isinstance(e, str) for e in errors):
        raise ParseError("errors must be a list of strings")
    return NodeSample(
        source="nvml",
        taken_at=_datetime(_get(doc, "taken_at", "", required=True), ""),
        gpus=gpus,
        processes=_objects(doc, "processes", "", process_reading),
        xid_events=_objects(doc, "xid_events", "", _xid),
        driver_version=_str(doc, "driver_version", "") or "",
        cuda_version=_str(doc, "cuda_version", "") or "",
        hostname=_str(doc, "hostname", "") or "",
        capabilities=_capabilities(doc),
        errors=tuple(errors),
        quota_usage=(
            _objects(doc, "quota_usage", "", _quota_usage) if "quota_usage" in doc else None
        ),
    )
