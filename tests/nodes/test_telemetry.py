"""The node telemetry parsers and the NVML sampler script. Pure: no database.

The sampler runs in a subprocess with its source on stdin, against a fake `pynvml` module (no GPU
here), a fake `dmesg` and a fake `docker` on PATH.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodes import preflight, sampler
from nodes.smi import (
    APP_QUERY_FIELDS,
    GPU_QUERY_FIELDS,
    app_query_argv,
    gpu_query_argv,
    parse_nvidia_smi,
)
from nodes.telemetry import (
    SAMPLER_MARKER,
    GpuReading,
    NodeSample,
    ParseError,
    SamplerUnavailable,
    parse_sampler_output,
    sampler_serve_argv,
    sampler_serve_preamble,
    sampler_source,
)
from tests.nodes.xid import parse_xid_lines, pci_bus_key

FIXTURES = Path(__file__).with_name("fixtures")


def gpu_for_uuid(sample: NodeSample, uuid: str) -> GpuReading | None:
    """The physical GPU of a GPU uuid or of one of its MIG devices' uuids."""
    for gpu in sample.gpus:
        if gpu.uuid == uuid or any(m.uuid == uuid for m in gpu.mig_devices):
            return gpu
    return None


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def smi(name: str, **kwargs) -> NodeSample:
    return parse_nvidia_smi(
        fixture(f"smi/{name}_gpu.csv"), fixture(f"smi/{name}_apps.csv"), **kwargs
    )


def sampler_doc(name: str) -> dict:
    return json.loads(fixture(f"sampler/{name}.json"))


# ============================================================================ nvidia-smi


def test_query_argv_match_the_documented_fields():
    assert gpu_query_argv() == [
        "nvidia-smi",
        "--query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,"
        "utilization.gpu,utilization.memory,temperature.gpu,power.draw,mig.mode.current,"
        "driver_version",
        "--format=csv,noheader,nounits",
    ]
    assert app_query_argv() == [
        "nvidia-smi",
        "--query-compute-apps=gpu_uuid,pid,used_memory,process_name",
        "--format=csv,noheader,nounits",
    ]


def test_smi_eight_gpu_a100_node():
    taken = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)
    sample = smi("a100x8", taken_at=taken)

    assert sample.source == "nvidia-smi"
    assert sample.taken_at == taken
    assert sample.driver_version == "535.161.08"
    assert [g.index for g in sample.gpus] == list(range(8))
    assert {g.name for g in sample.gpus} == {"NVIDIA A100-SXM4-80GB"}
    first = sample.gpus[0]
    assert first.uuid == "GPU-5a1c0f3e-8d2b-4c47-9e6a-0b3f1d2c4e01"
    assert first.pci_bus_id == "00000000:07:00.0"
    assert (first.memory_total_mb, first.memory_used_mb, first.memory_free_mb) == (
        81920,
        40123,
        40914,
    )
    assert (first.utilization_gpu, first.utilization_memory) == (87, 45)
    assert first.temperature_c == 62
    assert first.power_w == pytest.approx(312.45)
    assert (first.mig_capable, first.mig_enabled) == (True, False)
    assert sample.gpus[4].memory_used_mb == 78850

    assert len(sample.processes) == 8
    proc = sample.processes[1]
    assert (proc.gpu_uuid, proc.pid, proc.used_memory_mb, proc.name) == (
        "GPU-5a1c0f3e-8d2b-4c47-9e6a-0b3f1d2c4e02",
        21943,
        36002,
        "/opt/conda/bin/python",
    )
    # nvidia-smi knows nothing of containers or per-process utilization.
    assert {(p.container_id, p.sm_utilization) for p in sample.processes} == {(None, None)}
    assert sample.errors == ()
    assert sample.capabilities is None


def test_smi_a30_in_mig_mode_keeps_mig_uuids_on_processes():
    sample = smi("a30_mig")

    mig_gpu, plain_gpu = sample.gpus
    assert (mig_gpu.mig_capable, mig_gpu.mig_enabled) == (True, True)
    assert (plain_gpu.mig_capable, plain_gpu.mig_enabled) == (True, False)
    # A GPU in MIG mode reports no whole-GPU utilization.
    assert (mig_gpu.utilization_gpu, mig_gpu.utilization_memory) == (None, None)
    assert (plain_gpu.utilization_gpu, plain_gpu.utilization_memory) == (41, 17)
    assert mig_gpu.mig_devices == ()  # --query-gpu does not list MIG devices

    by_pid = {p.pid: p for p in sample.processes}
    assert by_pid[18821].gpu_uuid == "MIG-2f0c8d55-6b1e-5a3f-9d47-1e0a6c3b8f01"
    assert by_pid[18821].used_memory_mb == 5800
    assert by_pid[19377].used_memory_mb == 0  # "[N/A]"
    assert by_pid[19377].name == "tritonserver"
    assert by_pid[20110].gpu_uuid == plain_gpu.uuid


def test_smi_rtx4090_unsupported_fields_are_null():
    sample = smi("rtx4090")

    busy, idle = sample.gpus
    assert busy.name == "NVIDIA GeForce RTX 4090"
    assert busy.memory_total_mb == 24564
    assert busy.utilization_gpu == 96
    assert busy.utilization_memory is None  # [Not Supported]
    assert busy.power_w is None  # [N/A]
    assert busy.temperature_c == 71
    assert idle.temperature_c is None  # [Unknown Error]
    assert (busy.mig_capable, busy.mig_enabled) == (False, False)  # mig.mode.current [N/A]
    assert sample.driver_version == "550.90.07"  # trailing spaces stripped

    assert [(p.pid, p.used_memory_mb, p.name) for p in sample.processes] == [
        (7781, 17998, "/home/render/.venv/bin/python"),
        (7790, 0, "comfyui"),  # [Insufficient Permissions]
    ]


def test_smi_idle_node_has_no_processes():
    sample = smi("idle")

    assert len(sample.gpus) == 4
    assert {g.memory_used_mb for g in sample.gpus} == {1}
    assert {g.mig_capable for g in sample.gpus} == {False}
    assert sample.gpus[3].pci_bus_id == "00000000:3E:00.0"
    assert sample.processes == ()


GPU_ROW = (
    "0, GPU-11111111-2222-4333-8444-555555555555, NVIDIA H100 80GB HBM3, 00000000:18:00.0, "
    "81559, {used}, 80000, 5, 1, 40, 120.5, Disabled, 550.54.15"
)


def test_smi_no_running_processes_line_means_no_processes():
    sample = parse_nvidia_smi(GPU_ROW.format(used=0), "No running processes found\n")
    assert sample.processes == ()
    assert len(sample.gpus) == 1


def test_smi_commas_in_gpu_and_process_names_are_joined_back():
    # nvidia-smi does not quote cells; the name is the only free-text column, so extra cells
    # belong to it.
    row = GPU_ROW.format(used=0).replace("NVIDIA H100 80GB HBM3", "Lab GPU, slot 3")
    apps = "GPU-11111111-2222-4333-8444-555555555555, 4242, 100, /srv/a,b/python3\n"

    sample = parse_nvidia_smi(row, apps)

    assert sample.gpus[0].name == "Lab GPU, slot 3"
    assert sample.gpus[0].memory_total_mb == 81559
    assert sample.processes[0].name == "/srv/a,b/python3"


def test_smi_lost_gpu_is_left_out_with_an_error():
    gpu_csv = (
        GPU_ROW.format(used=10)
        + "\nUnable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n"
    )
    sample = parse_nvidia_smi(gpu_csv, "")
    assert len(sample.gpus) == 1
    assert sample.errors == (
        "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error",
    )


def test_smi_gpu_without_memory_reading_is_skipped_with_an_error():
    row = GPU_ROW.format(used="[N/A]").replace(", 81559,", ", [N/A],")
    sample = parse_nvidia_smi(
        GPU_ROW.format(used=1) + "\n" + row.replace("0, GPU-1", "1, GPU-2"), ""
    )
    assert [g.index for g in sample.gpus] == [0]
    assert len(sample.errors) == 1
    assert "GPU 1" in sample.errors[0]


def test_smi_no_devices_found_is_a_node_without_gpus():
    sample = parse_nvidia_smi("No devices were found\n", "")
    assert sample.gpus == ()


def test_smi_used_memory_within_one_percent_over_total_is_accepted():
    sample = parse_nvidia_smi(GPU_ROW.format(used=81559 + 815), "")
    assert sample.gpus[0].memory_used_mb == 82374


@pytest.mark.parametrize(
    ("gpu_csv", "apps_csv", "message"),
    [
        ("", "", "printed nothing"),
        ("bash: nvidia-smi: command not found", "", "expected 13"),
        ("0, GPU-1, A100, 00000000:07:00.0, 81920", "", "expected 13"),
        (GPU_ROW.format(used=-5), "", "below 0"),
        (GPU_ROW.format(used=81559 + 816), "", "exceeds memory_total_mb"),
        (GPU_ROW.format(used="lots"), "", "memory.used is not a number"),
        (GPU_ROW.format(used=1).replace(", 5, 1,", ", 101, 1,"), "", "utilization_gpu"),
        (GPU_ROW.format(used=1).replace("Disabled", "Maybe"), "", "mig.mode.current"),
        (GPU_ROW.format(used=1) + "\n" + GPU_ROW.format(used=2), "", "duplicate GPU index"),
        (GPU_ROW.format(used=1), "GPU-1, 4242, 100", "expected 4"),
        (GPU_ROW.format(used=1), "GPU-1, x, 100, python", "pid is not a number"),
        (GPU_ROW.format(used=1), "GPU-1, 0, 100, python", "pid is 0"),
        (GPU_ROW.format(used=1), "GPU-1, 42, nan, python", "used_memory is not a number"),
        (GPU_ROW.format(used=1).replace("120.5", "inf"), "", "power.draw is not a number"),
    ],
)
def test_smi_garbage_is_a_parse_error(gpu_csv, apps_csv, message):
    with pytest.raises(ParseError, match=message):
        parse_nvidia_smi(gpu_csv, apps_csv)


def test_query_fields_are_in_row_order():
    # The parser maps cells by position; the fixtures are written in this order.
    assert GPU_QUERY_FIELDS[2] == "name" and GPU_QUERY_FIELDS[-1] == "driver_version"
    assert APP_QUERY_FIELDS[-1] == "process_name"


# ============================================================================ sampler JSON


def test_sampler_normal_document():
    sample = parse_sampler_output(fixture("sampler/normal.json"))

    assert sample.source == "nvml"
    assert sample.hostname == "gpu-node-7"
    assert sample.taken_at == datetime(2026, 11, 30, 4, 0, 0, 123456, tzinfo=UTC)
    assert (sample.driver_version, sample.cuda_version) == ("550.54.15", "12.4")
    gpu = sample.gpus[0]
    assert (gpu.index, gpu.name, gpu.pci_bus_id) == (0, "NVIDIA A10", "00000000:17:00.0")
    assert (gpu.memory_total_mb, gpu.memory_used_mb, gpu.memory_free_mb) == (23028, 18435, 4170)
    assert gpu.power_w == pytest.approx(121.4)
    assert gpu.ecc_uncorrected_volatile == 0
    assert not gpu.remapped_rows_failure

    python, vllm, mps = sample.processes
    assert python.container_id == (
        "3f4e2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
    )
    assert (python.sm_utilization, python.memory_utilization) == (48, 22)
    assert vllm.name == "vllm"
    assert mps.used_memory_mb == 0  # null: the driver could not tell
    assert (mps.container_id, mps.sm_utilization) == (None, None)

    caps = sample.capabilities
    assert caps is not None
    assert (caps.docker, caps.nvidia_runtime, caps.mig) == (True, True, False)
    assert caps.vram_quota_library == "/usr/lib/gpuplatform/libvramquota.so"
    assert sample.xid_events == () and sample.errors == ()


def test_sampler_mig_document_maps_mig_processes_to_their_gpu():
    sample = parse_sampler_output(fixture("sampler/mig.json"))

    mig_gpu = sample.gpus[0]
    assert (mig_gpu.mig_capable, mig_gpu.mig_enabled) == (True, True)
    assert [m.profile for m in mig_gpu.mig_devices] == ["1g.6gb"] * 4
    assert [m.gi_id for m in mig_gpu.mig_devices] == [3, 4, 5, 6]
    assert mig_gpu.mig_devices[0].memory_used_mb == 5813
    assert mig_gpu.utilization_gpu is None
    assert sample.capabilities is None  # not a --discover run

    first = sample.processes[0]
    assert first.gpu_uuid.startswith("MIG-")
    assert gpu_for_uuid(sample, first.gpu_uuid) is mig_gpu
    assert gpu_for_uuid(sample, sample.processes[3].gpu_uuid) is sample.gpus[1]
    assert gpu_for_uuid(sample, "GPU-not-here") is None


def test_sampler_xid_and_memory_failure_document():
    sample = parse_sampler_output(fixture("sampler/xid_ecc.json"))

    failing, healthy = sample.gpus
    assert failing.ecc_uncorrected_volatile == 3
    assert (failing.remapped_rows_pending, failing.remapped_rows_failure) == (True, True)
    assert not failing.retired_pages_pending
    assert healthy.power_w is None
    assert [(x.xid, x.pid, x.pci_bus_id) for x in sample.xid_events] == [
        (48, 7001, "0000:3b:00"),
        (63, None, "0000:3b:00"),
    ]
    assert pci_bus_key(sample.xid_events[0].pci_bus_id) == pci_bus_key(failing.pci_bus_id)
    assert len(sample.errors) == 1 and "nvmlDeviceGetPowerUsage" in sample.errors[0]


def test_sampler_unavailable_document_is_a_distinct_parse_error():
    with pytest.raises(SamplerUnavailable) as raised:
        parse_sampler_output(fixture("sampler/unavailable.json"))
    assert raised.value.reason == "nvmlInit failed: Driver Not Loaded"
    assert isinstance(raised.value, ParseError)


def test_sampler_document_tolerates_nulls_and_unknown_keys():
    doc = sampler_doc("normal")
    gpu = doc["gpus"][0]
    for key in ("memory_free_mb", "pci_bus_id", "utilization_gpu", "temperature_c", "power_w"):
        gpu[key] = None
    for key in ("mig_capable", "retired_pages_pending", "ecc_uncorrected_volatile"):
        gpu[key] = None
    gpu["fan_percent"] = 40  # a later optional field
    doc["capabilities"] = None
    for key in ("processes", "xid_events", "errors", "hostname", "cuda_version"):
        doc[key] = None

    sample = parse_sampler_output(json.dumps(doc))

    parsed = sample.gpus[0]
    assert parsed.memory_free_mb is None and parsed.power_w is None
    assert parsed.mig_capable is False and parsed.ecc_uncorrected_volatile is None
    assert sample.processes == () and sample.errors == () and sample.hostname == ""
    assert sample.capabilities is None


def test_sampler_naive_timestamp_is_read_as_utc():
    doc = sampler_doc("normal")
    doc["taken_at"] = "2026-11-30T04:00:00"
    sample = parse_sampler_output(json.dumps(doc))
    assert sample.taken_at == datetime(2026, 11, 30, 4, 0, tzinfo=UTC)


def test_sampler_used_within_one_percent_over_total_is_accepted():
    doc = sampler_doc("normal")
    doc["gpus"][0]["memory_used_mb"] = 23028 + 230
    assert parse_sampler_output(json.dumps(doc)).gpus[0].memory_used_mb == 23258


def _broken(mutate) -> str:
    doc = sampler_doc("normal")
    mutate(doc)
    return json.dumps(doc)


def _set(path: str, value):
    """A mutation that sets doc[a][0][b]... for path "a.0.b"."""

    def mutate(doc):
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        target = doc
        for key in keys[:-1]:
            target = target[key]
        if value is KeyError:
            del target[keys[-1]]
        else:
            target[keys[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("Traceback (most recent call last):\n  File ...", "not one JSON document"),
        ('{"schema": 1, "source": "nvml", "gpus": [{"index": 0', "not one JSON document"),
        (fixture("sampler/normal.json") + "{}", "not one JSON document"),
        ("[1, 2]", "must be a JSON object"),
        ('{"source": "nvml"}', "missing required key 'schema'"),
        (_broken(_set("schema", 2)), "unsupported sampler schema 2"),
        (_broken(_set("schema", "1")), "unsupported sampler schema '1'"),
        (_broken(_set("schema", True)), "unsupported sampler schema True"),
        (_broken(_set("source", "dcgm")), "unknown sampler source"),
        (_broken(_set("gpus", KeyError)), "missing required key 'gpus'"),
        (_broken(_set("gpus", {})), "gpus must be a list"),
        (_broken(_set("taken_at", KeyError)), "missing required key 'taken_at'"),
        (_broken(_set("taken_at", "yesterday")), "not ISO 8601"),
        (_broken(_set("gpus.0.memory_total_mb", KeyError)), r"gpus\[0\]: missing required"),
        (_broken(_set("gpus.0.memory_used_mb", -1)), "memory_used_mb is -1, below 0"),
        (_broken(_set("gpus.0.memory_total_mb", -24)), "below 1"),
        (_broken(_set("gpus.0.memory_used_mb", 23028 + 231)), "exceeds memory_total_mb"),
        (_broken(_set("gpus.0.memory_free_mb", 30000)), "memory_free_mb .* exceeds"),
        (_broken(_set("gpus.0.memory_total_mb", 10**9)), "not a plausible reading"),
        (_broken(_set("gpus.0.memory_used_mb", None)), "memory_used_mb must not be null"),
        (_broken(_set("gpus.0.index", "0")), "index must be an integer"),
        (_broken(_set("gpus.1.index", 0)), "duplicate GPU index 0"),
        (_broken(_set("gpus.1.uuid", "GPU-0d6a5c1e-2b7f-4e39-a8c4-51f0e9d2b370")), "duplicate"),
        (_broken(_set("gpus.0.uuid", "")), "uuid must not be empty"),
        (_broken(_set("gpus.0.utilization_gpu", 150)), "utilization_gpu is 150"),
        (_broken(_set("gpus.0.temperature_c", 500)), "temperature_c is 500"),
        (_broken(_set("gpus.0.power_w", -3.5)), "power_w is -3.5"),
        (_broken(_set("gpus.0.power_w", "88 W")), "power_w must be a number"),
        (_broken(_set("gpus.0.mig_enabled", "yes")), "mig_enabled must be true or false"),
        (_broken(_set("gpus.0.mig_devices", [{"uuid": "MIG-1"}])), "memory_total_mb"),
        (_broken(_set("gpus.0", "A10")), r"gpus\[0\]: must be an object"),
        (_broken(_set("processes.0.pid", 0)), r"processes\[0\]: pid is 0, below 1"),
        (_broken(_set("processes.0.pid", 10**9)), "pid is 1000000000"),
        (_broken(_set("processes.0.used_memory_mb", -2048)), "used_memory_mb is -2048"),
        (_broken(_set("processes.0.sm_utilization", 101)), "sm_utilization is 101"),
        (_broken(_set("xid_events", [{"xid": 79}])), "missing required key 'raw'"),
        (_broken(_set("errors", ["ok", 3])), "errors must be a list of strings"),
        (_broken(_set("capabilities", "all")), "capabilities must be an object"),
        (_broken(_set("capabilities.docker", 1)), "docker must be true or false"),
    ],
)
def test_sampler_garbage_is_a_parse_error(text, message):
    with pytest.raises(ParseError, match=message):
        parse_sampler_output(text)


def test_sampler_oversized_output_is_a_parse_error():
    with pytest.raises(ParseError, match="characters, over"):
        parse_sampler_output(" " * (8 * 1024 * 1024 + 1))


# ============================================================================ kernel log


def test_xid_lines_from_a_kernel_log():
    events = parse_xid_lines(fixture("kern_xid.log"))

    assert [(e.xid, e.pid, e.pci_bus_id) for e in events] == [
        (48, 7001, "0000:3b:00"),
        (13, None, "0000:5e:00"),
        (13, None, "0000:5e:00"),
        (31, 13332, "0000:5e:00"),
        (79, None, "0000:3b:00"),  # pid=0: kernel context
    ]
    assert events[4].raw == "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus."
    assert all(e.raw.startswith("NVRM: Xid") for e in events)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:CB:00): 109, pid=1797828, "
            "name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
            (109, 1797828, "0000:cb:00"),
        ),
        (
            "Jan 15 14:30:45 dgx-01 kernel: NVRM: Xid (PCI:0000:10:00.0): 79, GPU has fallen off",
            (79, None, "0000:10:00.0"),
        ),
        (
            "[14328.198504] NVRM: Xid (PCI:0000:03:00): 31, pid='1234', name='python3', fault",
            (31, 1234, "0000:03:00"),
        ),
        ("[  9.1] NVRM: Xid (0000:03:00): 13, 0001 00000000 0000a0c0", (13, None, "0000:03:00")),
        (
            "NVRM: Xid (PCI:0000:b9:00): 74, pid=<unknown>, name=<unknown>, NVLink: fatal error",
            (74, None, "0000:b9:00"),
        ),
    ],
)
def test_xid_line_formats(line, expected):
    (event,) = parse_xid_lines(line)
    assert (event.xid, event.pid, event.pci_bus_id) == expected


def test_xid_ignores_other_lines():
    text = "NVRM: GPU at PCI:0000:3b:00: GPU-1\nXid (PCI:0000:3b:00): 79\nNVRM: Xid () 12\n"
    assert parse_xid_lines(text) == []


# ============================================================================ sampler script


def test_sampler_source_carries_the_marker_and_parses_as_python38():
    source = sampler_source()
    assert source.splitlines()[0] == SAMPLER_MARKER == "# GPUPLATFORM_SAMPLER schema=1"
    assert source == Path(sampler.__file__).read_text(encoding="utf-8")
    ast.parse(source, feature_version=(3, 8))  # no match, no 3.9+ grammar


CID = "3f4e2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
POD = "0b1c2d3e-4f5a-6b7c-8d9e-0f1a2b3c4d5e"
POD_UNIT = POD.replace("-", "_")


@pytest.mark.parametrize(
    ("cgroup", "container"),
    [
        (f"12:memory:/docker/{CID}\n11:cpu,cpuacct:/docker/{CID}\n", CID),  # v1, docker
        (f"0::/system.slice/docker-{CID}.scope\n", CID),  # v2, docker (systemd driver)
        (  # v2, kubernetes with containerd
            "0::/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{POD_UNIT}.slice/cri-containerd-{CID}.scope\n",
            CID,
        ),
        (f"4:memory:/kubepods/besteffort/pod{POD}/crio-{CID}\n", CID),  # v1, k8s with cri-o
        (f"0::/machine.slice/libpod-{CID}.scope/container\n", CID),  # v2, podman
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),  # not in a container
        ("4:memory:/process_api/1ede83887bd38ea91680fa7c7dbb3792\n", None),  # 32 hex: not an id
        (f"0::/docker/{CID}0\n", None),  # 65 hex: not an id
    ],
)
def test_sampler_container_id_from_cgroup(cgroup, container):
    assert sampler.container_id(cgroup) == container


# A fake pynvml with the calls the sampler makes. Each device attribute is a value or _Err(code),
# which the matching call raises as NVMLError. PIDs are far above the default pid_max so that no
# /proc entry can exist for them.
FAKE_PYNVML = r"""
import os

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
_MESSAGES = {3: "Not Supported", 6: "Not Found", 9: "Driver Not Loaded", 15: "GPU is lost",
             999: "Unknown Error"}
MIB = 1024 * 1024
SCENARIO = os.environ.get("FAKE_NVML_SCENARIO", "ok")


class NVMLError(Exception):
    def __init__(self, value):
        Exception.__init__(self, value)
        self.value = value

    def __str__(self):
        return _MESSAGES.get(self.value, "code %d" % self.value)


class _Err:
    def __init__(self, code):
        self.code = code


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _get(handle, attr):
    value = getattr(handle, attr)
    if isinstance(value, _Err):
        raise NVMLError(value.code)
    return value


_MIG0 = _Obj(uuid="MIG-00000000-0000-5000-8000-000000000001", name="NVIDIA A30 MIG 1g.6gb",
             memory=(5952, 5813, 139), gi=3, ci=0, procs=[(4190005, 5800)], samples=_Err(3))
_MIG2 = _Obj(uuid="MIG-00000000-0000-5000-8000-000000000002", name="NVIDIA A30 MIG 2g.12gb",
             memory=(11968, 3085, 8883), gi=5, ci=0, procs=[(4190006, None)], samples=_Err(3))
_GPUS = [
    _Obj(uuid=b"GPU-aaaaaaaa-0000-4000-8000-000000000000", name=b"NVIDIA A30",
         bus=b"00000000:3B:00.0", memory=(24576, 8900, 15200), util=_Err(3), temp=38,
         power=_Err(999), mig_mode=[1, 1], max_mig=4, migs={0: _MIG0, 2: _MIG2}, ecc=2,
         retired=1, remapped=(0, 2, 1, 0),
         procs=[(4190099, 1)], samples=_Err(6)),  # aggregate: must not be reported in MIG mode
    _Obj(uuid="GPU-bbbbbbbb-0000-4000-8000-000000000001", name="NVIDIA L4",
         bus="00000000:41:00.0", memory=(23034, 10240, 12500), util=(77, 35), temp=51,
         power=72500, mig_mode=_Err(3), ecc=_Err(3), retired=_Err(3), remapped=_Err(3),
         procs=[(4190007, 10000)],
         samples=[_Obj(pid=4190007, timeStamp=200, smUtil=66, memUtil=30),
                  _Obj(pid=4190007, timeStamp=100, smUtil=10, memUtil=5),
                  _Obj(pid=4190008, timeStamp=150, smUtil=1, memUtil=1)]),
    _Obj(uuid="GPU-cccccccc-0000-4000-8000-000000000002", name="NVIDIA L4",
         memory=_Err(15)),  # fell off the bus
]


def nvmlInit():
    if SCENARIO == "init_fails":
        raise NVMLError(9)


def nvmlShutdown():
    open(os.environ["FAKE_NVML_SHUTDOWN_MARK"], "w").close()


def nvmlDeviceGetCount():
    if SCENARIO == "count_fails":
        raise NVMLError(999)
    return len(_GPUS)


def nvmlDeviceGetHandleByIndex(index):
    return _GPUS[index]


def nvmlDeviceGetUUID(h): return _get(h, "uuid")
def nvmlDeviceGetName(h): return _get(h, "name")
def nvmlDeviceGetPciInfo(h): return _Obj(busId=_get(h, "bus"))
def nvmlDeviceGetPowerUsage(h): return _get(h, "power")
def nvmlDeviceGetMigMode(h): return _get(h, "mig_mode")
def nvmlDeviceGetMaxMigDeviceCount(h): return _get(h, "max_mig")
def nvmlDeviceGetGpuInstanceId(h): return _get(h, "gi")
def nvmlDeviceGetComputeInstanceId(h): return _get(h, "ci")
def nvmlDeviceGetRetiredPagesPendingStatus(h): return _get(h, "retired")
def nvmlDeviceGetRemappedRows(h): return _get(h, "remapped")
def nvmlSystemGetDriverVersion(): return b"550.54.15"
def nvmlSystemGetCudaDriverVersion_v2(): return 12040


def nvmlDeviceGetMemoryInfo(h):
    total, used, free = _get(h, "memory")
    return _Obj(total=total * MIB, used=used * MIB, free=free * MIB)


def nvmlDeviceGetUtilizationRates(h):
    gpu, memory = _get(h, "util")
    return _Obj(gpu=gpu, memory=memory)


def nvmlDeviceGetTemperature(h, sensor):
    assert sensor == 0, sensor
    return _get(h, "temp")


def nvmlDeviceGetTotalEccErrors(h, error_type, counter_type):
    assert (error_type, counter_type) == (1, 0), (error_type, counter_type)
    return _get(h, "ecc")


def nvmlDeviceGetMigDeviceHandleByIndex(h, index):
    migs = _get(h, "migs")
    if index not in migs:
        raise NVMLError(6)
    return migs[index]


def nvmlDeviceGetComputeRunningProcesses(h):
    return [_Obj(pid=pid, usedGpuMemory=None if mib is None else mib * MIB)
            for pid, mib in _get(h, "procs")]


def nvmlDeviceGetProcessUtilization(h, last_seen):
    assert last_seen == 0
    if SCENARIO == "no_process_computed" and h is _GPUS[1]:
        raise NVMLError(6)  # NOT_FOUND: no process had utilisation in the sample period
    if SCENARIO == "other_process_computed" and h is _GPUS[1]:
        return [_Obj(pid=4190008, timeStamp=150, smUtil=40, memUtil=10)]
    return _get(h, "samples")
"""


def _interpreters() -> list[str]:
    # The nodes may run Python 3.8; use a real one (not a pyenv shim) when this machine has it.
    py38 = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3")))
    return [sys.executable, *py38[:1]]


def _version(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import sys; print('py%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture(params=_interpreters(), ids=_version)
def node(request, tmp_path):
    return FakeNode(tmp_path, request.param)


class FakeNode:
    """A directory standing in for a GPU node: fake pynvml, dmesg and docker, a state dir."""

    def __init__(self, root: Path, python: str) -> None:
        self.python = python
        self.lib = root / "lib"
        self.bin = root / "bin"
        self.state = root / "run"
        for d in (self.lib, self.bin, self.state):
            d.mkdir()
        (self.lib / "pynvml.py").write_text(FAKE_PYNVML, encoding="utf-8")
        self.kernel_log = root / "dmesg.txt"
        self.kernel_log.write_text(fixture("kern_xid.log"), encoding="utf-8")
        self.shutdown_mark = root / "nvml-shut-down"
        self.dmesg(ok=True)
        self.env = {
            "PATH": str(self.bin),
            "PYTHONPATH": str(self.lib),
            "XDG_RUNTIME_DIR": str(self.state),
            "HOME": str(root),
            "FAKE_NVML_SHUTDOWN_MARK": str(self.shutdown_mark),
        }

    def script(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text("#!/bin/sh\n" + body + "\n", encoding="utf-8")
        path.chmod(0o755)

    def dmesg(self, *, ok: bool) -> None:
        self.script("dmesg", f'/bin/cat "{self.kernel_log}"' if ok else "exit 1")

    def docker(self, runtimes: str) -> None:
        self.script("docker", f"echo '{runtimes}'")

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        # -S: no site-packages, so the only pynvml is the fake on PYTHONPATH (or none at all).
        return subprocess.run(
            [self.python, "-S", "-", *args],
            input=sampler_source(),
            capture_output=True,
            text=True,
            env={**self.env, **env},
            timeout=60,
            check=False,
        )

    def sample(self, *args: str, **env: str) -> tuple[dict, NodeSample]:
        done = self.run(*args, **env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout), parse_sampler_output(done.stdout)


def test_sampler_reports_what_nvml_says(node):
    raw, sample = node.sample()

    assert sample.source == "nvml"
    assert sample.hostname == socket.gethostname()
    assert sample.taken_at is not None
    assert abs(datetime.now(UTC) - sample.taken_at) < timedelta(minutes=1)
    assert (sample.driver_version, sample.cuda_version) == ("550.54.15", "12.4")
    assert sample.capabilities is None and "capabilities" not in raw

    a30, l4 = sample.gpus  # GPU 2 fell off the bus: left out
    assert (a30.index, a30.uuid, a30.name) == (
        0,
        "GPU-aaaaaaaa-0000-4000-8000-000000000000",
        "NVIDIA A30",
    )
    assert a30.pci_bus_id == "00000000:3B:00.0"
    assert (a30.memory_total_mb, a30.memory_used_mb, a30.memory_free_mb) == (24576, 8900, 15200)
    assert (a30.utilization_gpu, a30.power_w, a30.temperature_c) == (None, None, 38)
    assert (a30.mig_capable, a30.mig_enabled) == (True, True)
    assert [(m.uuid[-1], m.gi_id, m.ci_id, m.profile) for m in a30.mig_devices] == [
        ("1", 3, 0, "1g.6gb"),
        ("2", 5, 0, "2g.12gb"),
    ]
    assert [(m.memory_total_mb, m.memory_used_mb) for m in a30.mig_devices] == [
        (5952, 5813),
        (11968, 3085),
    ]
    assert a30.ecc_uncorrected_volatile == 2
    assert a30.retired_pages_pending is True
    assert (a30.remapped_rows_pending, a30.remapped_rows_failure) == (True, False)

    assert (l4.utilization_gpu, l4.utilization_memory, l4.temperature_c) == (77, 35, 51)
    assert l4.power_w == pytest.approx(72.5)
    assert (l4.mig_capable, l4.mig_enabled, l4.mig_devices) == (False, False, ())
    assert l4.ecc_uncorrected_volatile is None  # NotSupported: null, not an error
    assert (l4.retired_pages_pending, l4.remapped_rows_pending) == (False, False)

    procs = {p.pid: p for p in sample.processes}
    assert set(procs) == {4190005, 4190006, 4190007}  # not the MIG parent's aggregate 4190099
    assert procs[4190005].gpu_uuid == "MIG-00000000-0000-5000-8000-000000000001"
    assert procs[4190005].used_memory_mb == 5800
    assert procs[4190006].gpu_uuid == "MIG-00000000-0000-5000-8000-000000000002"
    assert [p["used_memory_mb"] for p in raw["processes"] if p["pid"] == 4190006] == [None]
    assert (procs[4190007].sm_utilization, procs[4190007].memory_utilization) == (66, 30)
    assert (procs[4190005].sm_utilization, procs[4190005].container_id) == (None, None)
    assert {p.name for p in sample.processes} == {""}  # no /proc entry for these pids
    assert gpu_for_uuid(sample, procs[4190006].gpu_uuid) is a30

    assert any(
        "gpu 0" in e and "nvmlDeviceGetPowerUsage: Unknown Error" in e for e in sample.errors
    )
    assert any(e.startswith("gpu 2: ") and "GPU is lost" in e for e in sample.errors)
    assert not any("Not Supported" in e or "Not Found" in e for e in sample.errors)
    assert node.shutdown_mark.exists()


def test_sampler_output_has_exactly_the_contract_keys(node):
    raw, _ = node.sample("--discover")
    assert set(raw) == {
        "schema", "source", "hostname", "taken_at", "driver_version", "cuda_version", "gpus",
        "processes", "xid_events", "capabilities", "errors",
    }  # fmt: skip
    assert set(raw["gpus"][0]) == {
        "index", "uuid", "name", "pci_bus_id", "memory_total_mb", "memory_used_mb",
        "memory_free_mb", "utilization_gpu", "utilization_memory", "temperature_c", "power_w",
        "mig_capable", "mig_enabled", "mig_devices", "ecc_uncorrected_volatile",
        "retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure",
    }  # fmt: skip
    assert set(raw["gpus"][0]["mig_devices"][0]) == {
        "uuid", "gi_id", "ci_id", "profile", "memory_total_mb", "memory_used_mb",
    }  # fmt: skip
    assert set(raw["processes"][0]) == {
        "gpu_uuid", "pid", "used_memory_mb", "name", "container_id", "sm_utilization",
        "memory_utilization",
    }  # fmt: skip
    assert set(raw["xid_events"][0]) == {"pci_bus_id", "xid", "pid", "raw"}
    assert set(raw["capabilities"]) == {
        "docker", "nvidia_runtime", "mig", "vram_quota_library", "preflight",
    }  # fmt: skip
    # the preflight gate's facts, text each ("" where the node does not have it)
    assert set(raw["capabilities"]["preflight"]) == set(preflight.FACT_KEYS)
    assert all(isinstance(v, str) for v in raw["capabilities"]["preflight"].values())


def test_sampler_reports_each_xid_once(node):
    _, first = node.sample()
    assert [x.xid for x in first.xid_events] == [48, 13, 13, 31, 79]
    assert first.xid_events == tuple(parse_xid_lines(fixture("kern_xid.log")))

    _, second = node.sample()
    assert second.xid_events == ()

    # dmesg recomputes wall-clock stamps each run: wobbling microseconds are not new events.
    log = node.kernel_log.read_text(encoding="utf-8")
    node.kernel_log.write_text(log.replace(",300114+", ",300131+"), encoding="utf-8")
    _, wobbled = node.sample()
    assert wobbled.xid_events == ()

    with node.kernel_log.open("a", encoding="utf-8") as log:
        log.write(
            "2026-11-30T04:10:00,000001+00:00 NVRM: Xid (PCI:0000:5e:00): 94, pid=4321, "
            "name=python3, Contained ECC error\n"
        )
    _, third = node.sample()
    assert [(x.xid, x.pid, x.pci_bus_id) for x in third.xid_events] == [(94, 4321, "0000:5e:00")]


def test_sampler_reads_the_kernel_log_file_when_dmesg_is_not_permitted(node, tmp_path):
    node.dmesg(ok=False)
    log = tmp_path / "kern.log"
    log.write_text(
        "Nov 30 04:10:00 gpu-node-7 kernel: [ 9.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, "
        "GPU has fallen off the bus.\n",
        encoding="utf-8",
    )
    _, sample = node.sample(GPUPLATFORM_KERNEL_LOG=str(log))
    assert [(x.xid, x.pci_bus_id) for x in sample.xid_events] == [(79, "0000:3b:00")]


def test_sampler_discover_adds_capabilities(node, tmp_path):
    node.docker(
        '{"io.containerd.runc.v2":{"path":"runc"},"nvidia":{"path":"nvidia-container-runtime"}}'
    )
    library = tmp_path / "libvramquota.so"
    library.write_bytes(b"\x7fELF")

    _, sample = node.sample("--discover", GPUPLATFORM_VRAM_QUOTA_LIBRARY=str(library))

    caps = sample.capabilities
    assert caps is not None
    assert (caps.docker, caps.nvidia_runtime, caps.mig) == (True, True, True)
    assert caps.vram_quota_library == str(library)


def test_sampler_discover_without_docker_or_nvidia_runtime(node, tmp_path):
    _, without_docker = node.sample("--discover")
    caps = without_docker.capabilities
    assert caps is not None and (caps.docker, caps.nvidia_runtime) == (False, False)

    node.docker('{"runc":{"path":"runc"}}')
    missing = tmp_path / "nowhere.so"
    _, plain_docker = node.sample("--discover", GPUPLATFORM_VRAM_QUOTA_LIBRARY=str(missing))
    caps = plain_docker.capabilities
    assert caps is not None and (caps.docker, caps.nvidia_runtime) == (True, False)
    assert caps.vram_quota_library is None or caps.vram_quota_library != str(missing)
    assert any("GPUPLATFORM_VRAM_QUOTA_LIBRARY" in e for e in plain_docker.errors)


def test_sampler_exits_3_when_nvml_init_fails(node):
    done = node.run(FAKE_NVML_SCENARIO="init_fails")

    assert done.returncode == 3
    assert json.loads(done.stdout) == {
        "schema": 1,
        "source": "unavailable",
        "error": "nvmlInit failed: Driver Not Loaded",
    }
    with pytest.raises(SamplerUnavailable, match="Driver Not Loaded"):
        parse_sampler_output(done.stdout)


def test_sampler_exits_3_and_shuts_nvml_down_when_it_cannot_count_gpus(node):
    done = node.run(FAKE_NVML_SCENARIO="count_fails")

    assert done.returncode == 3
    assert json.loads(done.stdout)["source"] == "unavailable"
    assert "Unknown Error" in json.loads(done.stdout)["error"]
    assert node.shutdown_mark.exists()


def test_sampler_exits_3_without_pynvml(node):
    (node.lib / "pynvml.py").unlink()

    done = node.run()

    assert done.returncode == 3
    doc = json.loads(done.stdout)
    assert doc["source"] == "unavailable"
    assert "pynvml" in doc["error"]
    assert done.stdout.count("\n") == 1  # one document, nothing else on stdout


def test_sampler_serve_mode_answers_one_line_per_request(node):
    """The sampler kept running: bootstrap + source on stdin, then request lines."""
    argv = sampler_serve_argv()
    assert argv[:4] == ["python3", "-u", "-c", argv[3]] and argv[-1] == "--serve"
    stdin = sampler_serve_preamble() + b"sample\ndiscover\nbogus\nsample\n"
    done = subprocess.run(
        [node.python, "-S", *argv[1:]],
        input=stdin,
        capture_output=True,
        env=node.env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().splitlines()
    assert len(lines) == 4
    first, discover, bogus, again = lines
    assert parse_sampler_output(first).capabilities is None
    assert parse_sampler_output(discover).capabilities is not None
    assert json.loads(bogus)["source"] == "error"
    assert [g.uuid for g in parse_sampler_output(again).gpus] == [
        g.uuid for g in parse_sampler_output(first).gpus
    ]
    assert node.shutdown_mark.exists()  # NVML shut down when stdin closed


def test_sampler_serve_mode_without_nvml_says_unavailable(node):
    done = subprocess.run(
        [node.python, "-S", *sampler_serve_argv()[1:]],
        input=sampler_serve_preamble() + b"sample\n",
        capture_output=True,
        env={**node.env, "PYTHONPATH": ""},
        timeout=60,
        check=False,
    )
    assert done.returncode == 3
    with pytest.raises(SamplerUnavailable):
        parse_sampler_output(done.stdout.decode())


@pytest.mark.parametrize("scenario", ["no_process_computed", "other_process_computed"])
def test_a_process_nvml_leaves_out_of_its_utilisation_samples_computed_nothing(node, scenario):
    """NVML returns a utilisation sample only for processes that computed in its last
    period (NOT_FOUND when none did): an idle process must read 0, or the idle rule
    would never see it on a real card. Where the call is unsupported (MIG) it stays
    unknown."""
    _, sample = node.sample(FAKE_NVML_SCENARIO=scenario)
    procs = {p.pid: p for p in sample.processes}
    assert (procs[4190007].sm_utilization, procs[4190007].memory_utilization) == (0, 0)
    assert procs[4190005].sm_utilization is None  # a MIG device: not supported, unknown
    assert not any("Not Found" in e for e in sample.errors)
