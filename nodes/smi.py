"""nvidia-smi, the fallback when the NVML sampler cannot run on a node: the two query
commands, and their CSV parsed into the same `NodeSample` the sampler gives (each row
checked by the sampler's own readers, so both sources refuse the same things). Pure
Python: no Django."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

from .telemetry import (
    MAX_OUTPUT_CHARS,
    GpuReading,
    NodeSample,
    ParseError,
    ProcessReading,
    gpu_reading,
    process_reading,
    require_unique,
)

T = TypeVar("T")

# nvidia-smi --query-gpu=<GPU_QUERY_FIELDS> --format=csv,noheader,nounits
GPU_QUERY_FIELDS = [
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "memory.free",
    "utilization.gpu",
    "utilization.memory",
    "temperature.gpu",
    "power.draw",
    "mig.mode.current",
    "driver_version",
]
# nvidia-smi --query-compute-apps=<APP_QUERY_FIELDS> --format=csv,noheader,nounits
APP_QUERY_FIELDS = ["gpu_uuid", "pid", "used_memory", "process_name"]


SMI_NULLS = {"", "n/a", "[n/a]", "not supported", "[not supported]"}
SMI_NO_PROCESSES = "no running processes found"
SMI_NO_DEVICES = "no devices were found"
SMI_LOST_GPU_PREFIX = "unable to determine the device handle"


def gpu_query_argv() -> list[str]:
    """argv of the nvidia-smi call whose output parse_nvidia_smi() reads as gpu_csv."""
    return [
        "nvidia-smi",
        "--query-gpu=" + ",".join(GPU_QUERY_FIELDS),
        "--format=csv,noheader,nounits",
    ]


def app_query_argv() -> list[str]:
    """argv of the nvidia-smi call whose output parse_nvidia_smi() reads as apps_csv."""
    return [
        "nvidia-smi",
        "--query-compute-apps=" + ",".join(APP_QUERY_FIELDS),
        "--format=csv,noheader,nounits",
    ]


def _smi_value(raw: str) -> str | None:
    """A CSV cell, or None for nvidia-smi's "no value" spellings: "[N/A]", "N/A",
    "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", "[GPU is lost]", ..."""
    value = raw.strip()
    if value.lower() in SMI_NULLS or (value.startswith("[") and value.endswith("]")):
        return None
    return value


def _smi_number(raw: str | None, field_name: str, where: str, cast: Callable[[str], T]) -> T | None:
    if raw is None:
        return None
    try:
        value = cast(raw)
    except ValueError:
        raise ParseError(f"{where}: {field_name} is not a number: {raw!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ParseError(f"{where}: {field_name} is not a number: {raw!r}")
    return value


def _smi_rows(text: str, width: int, free_text_column: int, what: str) -> list[list[str]]:
    """Rows of a `--format=csv,noheader,nounits` output.

    nvidia-smi does not quote cells. Only one column is free text (the GPU name, the process
    name) and every other column is comma-free, so a row with too many cells has commas in that
    column and they are joined back; a row with too few cells is not ours.
    """
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        cells = line.split(",")
        extra = len(cells) - width
        if extra < 0:
            raise ParseError(
                f"{what} line {number}: expected {width} comma-separated fields, "
                f"got {len(cells)}: {line.strip()[:200]!r}"
            )
        if extra:
            end = free_text_column + extra + 1
            cells[free_text_column:end] = [",".join(cells[free_text_column:end])]
        rows.append([c.strip() for c in cells])
    return rows


def _smi_gpu(cells: list[str], where: str) -> GpuReading | str:
    """A GpuReading, or the reason to skip a GPU whose memory nvidia-smi cannot read."""
    values = dict(zip(GPU_QUERY_FIELDS, (_smi_value(c) for c in cells), strict=True))

    def number(name: str) -> int | None:
        return _smi_number(values[name], name, where, int)

    index, uuid = number("index"), values["uuid"]
    if index is None or uuid is None:
        raise ParseError(f"{where}: index and uuid are required, got {cells[:2]!r}")
    if number("memory.total") is None or number("memory.used") is None:
        return f"GPU {index} ({uuid}): memory not reported by nvidia-smi, skipped"
    mig_mode = (values["mig.mode.current"] or "").lower()
    if mig_mode not in ("", "enabled", "disabled"):
        raise ParseError(f"{where}: mig.mode.current is {values['mig.mode.current']!r}")
    # Through the sampler's validation, so that both sources obey the same bounds.
    return gpu_reading(
        {
            "index": index,
            "uuid": uuid,
            "name": values["name"] or "",
            "pci_bus_id": values["pci.bus_id"],
            "memory_total_mb": number("memory.total"),
            "memory_used_mb": number("memory.used"),
            "memory_free_mb": number("memory.free"),
            "utilization_gpu": number("utilization.gpu"),
            "utilization_memory": number("utilization.memory"),
            "temperature_c": number("temperature.gpu"),
            "power_w": _smi_number(values["power.draw"], "power.draw", where, float),
            # A GPU without MIG answers "[N/A]"; one that says Enabled or Disabled has MIG.
            "mig_capable": mig_mode in ("enabled", "disabled"),
            "mig_enabled": mig_mode == "enabled",
        },
        f"{where} (GPU {index})",
    )


def _smi_process(cells: list[str], where: str) -> ProcessReading:
    values = dict(zip(APP_QUERY_FIELDS, (_smi_value(c) for c in cells), strict=True))
    gpu_uuid, pid = values["gpu_uuid"], _smi_number(values["pid"], "pid", where, int)
    if gpu_uuid is None or pid is None:
        raise ParseError(f"{where}: gpu_uuid and pid are required, got {cells[:2]!r}")
    used = _smi_number(values["used_memory"], "used_memory", where, int)
    return process_reading(
        {
            "gpu_uuid": gpu_uuid,
            "pid": pid,
            "used_memory_mb": used,
            "name": values["process_name"] or "",
        },
        where,
    )


def parse_nvidia_smi(
    gpu_csv: str, apps_csv: str, *, taken_at: datetime | None = None
) -> NodeSample:
    """The two nvidia-smi outputs (gpu_query_argv(), app_query_argv()) as a NodeSample.

    A GPU whose memory nvidia-smi cannot read, and its "Unable to determine the device handle
    ..." line, are left out with a note in errors; any other malformed line is a ParseError.
    nvidia-smi does not report the CUDA version, containers or per-process utilization here.
    """
    if len(gpu_csv) + len(apps_csv) > MAX_OUTPUT_CHARS:
        raise ParseError("nvidia-smi output is too large")
    if not gpu_csv.strip():
        raise ParseError("nvidia-smi GPU query printed nothing")
    errors: list[str] = []
    gpu_lines = []
    for line in gpu_csv.splitlines():
        lowered = line.strip().lower()
        if lowered.startswith(SMI_LOST_GPU_PREFIX):
            errors.append(line.strip())
        elif lowered != SMI_NO_DEVICES:
            gpu_lines.append(line)
    gpus = []
    driver_version = ""
    rows = _smi_rows("\n".join(gpu_lines), len(GPU_QUERY_FIELDS), 2, "GPU query")
    for number, cells in enumerate(rows, start=1):
        gpu = _smi_gpu(cells, f"GPU query row {number}")
        if isinstance(gpu, str):
            errors.append(gpu)
            continue
        gpus.append(gpu)
        driver_version = driver_version or (_smi_value(cells[-1]) or "")
    require_unique((g.index for g in gpus), "GPU index")
    require_unique((g.uuid for g in gpus), "GPU uuid")

    app_lines = [line for line in apps_csv.splitlines() if line.strip().lower() != SMI_NO_PROCESSES]
    processes = tuple(
        _smi_process(cells, f"compute-apps query row {number}")
        for number, cells in enumerate(
            _smi_rows("\n".join(app_lines), len(APP_QUERY_FIELDS), 3, "compute-apps query"), 1
        )
    )
    return NodeSample(
        source="nvidia-smi",
        taken_at=taken_at,
        gpus=tuple(gpus),
        processes=processes,
        driver_version=driver_version,
        errors=tuple(errors),
    )
