# GPUPLATFORM_SAMPLER schema=1
"""One NVML sample of this GPU node, printed as one JSON document (see nodes/telemetry.py).

Runs ON the node as `python3 - [--discover]` with this source on stdin, or kept running
with `--serve` (see nodes.telemetry.sampler_serve_argv): Python 3.8+, stdlib
and pynvml only, nothing installed. Exit 0 with the sample; exit 3 with
{"schema": 1, "source": "unavailable", "error": ...} when NVML cannot be used.
Environment: GPUPLATFORM_VRAM_QUOTA_LIBRARY (quota library path, checked first),
GPUPLATFORM_VRAM_QUOTA_ACCOUNTING (the quota library's books per container,
`<container id>/cudevshr.cache`: HAMi-core's shared region, read into quota_usage),
GPUPLATFORM_KERNEL_LOG (log file read before /var/log/kern.log when dmesg is not permitted).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

TYPE_CHECKING = False  # typing's, without importing it on the node: mypy reads it as True
if TYPE_CHECKING:
    from typing import Any, BinaryIO

    Doc = dict[str, Any]  # a JSON object as the sampler prints it
SCHEMA = 1
UNAVAILABLE_EXIT = 3
MIB = 1024 * 1024
KERNEL_LOG_TAIL_BYTES = 256 * 1024
QUOTA_LIBRARY_PATHS = (
    "/usr/lib/gpuplatform/libvramquota.so",
    "/usr/local/lib/gpuplatform/libvramquota.so",
    "/usr/local/vgpu/libvgpu.so",  # HAMi-core
)
XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+(?:\.[0-7])?)[^)]*\):"
    r"\s*(?P<xid>\d+)(?P<rest>.*)"
)
XID_PID_RE = re.compile(r"^\s*,\s*pid='?(?P<pid>\d+)'?")
FRACTION_RE = re.compile(r"[.,]\d+")
CONTAINER_ID_RE = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
MIG_PROFILE_RE = re.compile(r"\b(\d+g\.\d+gb(?:\+\w+)?)\b")

nv: Any = None  # the pynvml module, once imported
# Error codes that mean "this GPU or driver does not have it": the value is null, not an error.
NOT_SUPPORTED = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND
NOT_FOUND = 6  # NVML_ERROR_NOT_FOUND
# NVML enum values (stable C ABI), so that old or partial bindings need not define them.
TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
DEVICE_MIG_ENABLE = 1  # NVML_DEVICE_MIG_ENABLE
ERROR_TYPE_UNCORRECTED = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE_ECC = 0  # NVML_VOLATILE_ECC


def text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def nvml(
    errors: list[str], what: str, fn_name: str, *args: Any, quiet: tuple[int, ...] = ()
) -> Any:
    """Call pynvml.<fn_name>; None when unsupported (or quiet), else the error goes in errors."""
    fn = getattr(nv, fn_name, None)
    if fn is None:  # bindings older than the call
        return None
    try:
        return fn(*args)
    except nv.NVMLError as exc:
        code = getattr(exc, "value", None)
        if code not in NOT_SUPPORTED and code not in quiet:
            errors.append(f"{what}: {fn_name}: {exc}")
        return None


def container_id(cgroup_text: str) -> str | None:
    """The 64-hex container id in /proc/<pid>/cgroup (docker, containerd, cri-o, kubepods;
    cgroup v1 and v2), or None for a process outside a container."""
    found = CONTAINER_ID_RE.findall(cgroup_text)
    return found[-1] if found else None


def read_proc(pid: int, name: str) -> str | None:
    path = f"/proc/{pid}/{name}"
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()
    return None


def process_utilization(errors: list[str], what: str, handle: object) -> dict[int, Any] | None:
    """The latest utilisation sample per pid, or None when the device cannot tell (MIG
    devices, old GPUs). NVML returns a sample only for processes that had some
    utilisation in its last sample period, and NOT_FOUND when none had (pynvml may also
    raise NVMLError(SUCCESS) before the first sample): a process it leaves out computed
    nothing, which is what the idle rule needs to see as 0, not as unknown."""
    fn = getattr(nv, "nvmlDeviceGetProcessUtilization", None)
    if fn is None:  # bindings older than the call
        return None
    try:
        samples = fn(handle, 0)
    except nv.NVMLError as exc:
        code = getattr(exc, "value", None)
        if code in (0, NOT_FOUND):
            return {}
        if code not in NOT_SUPPORTED:
            errors.append(f"{what}: nvmlDeviceGetProcessUtilization: {exc}")
        return None
    # the most recent sample per pid: in time order, a later one replaces an earlier one
    return {s.pid: s for s in sorted(samples or [], key=lambda s: s.timeStamp)}


def sample_processes(errors: list[str], gpu_uuid: str, handle: object) -> list[Doc]:
    call = functools.partial(nvml, errors, gpu_uuid)
    found = call("nvmlDeviceGetComputeRunningProcesses", handle) or []
    latest = process_utilization(errors, gpu_uuid, handle)
    out = []
    for p in found:
        used = getattr(p, "usedGpuMemory", None)  # None when the driver cannot tell
        comm, cgroup = read_proc(p.pid, "comm"), read_proc(p.pid, "cgroup")
        util = None if latest is None else latest.get(p.pid)
        out.append(
            {
                "gpu_uuid": gpu_uuid,
                "pid": int(p.pid),
                "used_memory_mb": None if used is None else int(used) // MIB,
                "name": comm.strip() if comm else "",
                "container_id": container_id(cgroup) if cgroup else None,
                "sm_utilization": None if latest is None else int(util.smUtil) if util else 0,
                "memory_utilization": None if latest is None else int(util.memUtil) if util else 0,
            }
        )
    return out


def ns_pid(pid: int) -> int | None:
    """The PID a host process has inside its own PID namespace (NSpid's last field), as
    a quota library in its container records it; None when unknown."""
    status = read_proc(pid, "status") or ""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            return int(fields[-1]) if fields else None
    return None


# HAMi-core's shared region, the quota library's books (multiprocess_memory_limit.h at
# commit 8f3a89c, region 1.2, x86_64 glibc), read at these offsets (docs/isolation.md).
REGION_FILE = "cudevshr.cache"  # in the container's books directory
REGION_MAGIC = 19920718
REGION_VERSION = (1, 2)
REGION_LIMIT_OFFSET = 1600  # uint64_t limit[16]
REGION_PROCS_OFFSET = 1856  # shrreg_proc_slot_t procs[1024]
REGION_SLOT_SIZE = 1960
REGION_MAX_PROCS = 1024
REGION_PROC_NUM_OFFSET = 2008896  # int proc_num
REGION_SIZE = 2008952
# used[0].total: one aligned word atomic stores cannot tear (the slot's seqlock is not needed)
SLOT_TOTAL_OFFSET = 40
MAX_SLOT_BYTES = 1 << 40  # more than any device holds: a count written over from inside


class UnsupportedRegion(ValueError): ...  # another HAMi-core version: no count, not a wrong one


def region_usage(data: bytes, pids: set[int | None]) -> tuple[int, int]:
    """(bytes the container's `pids` (namespace or host PIDs; None: all) hold, the limit).
    ValueError: books the library cannot have written; UnsupportedRegion: another version."""
    if len(data) < REGION_SIZE:
        raise ValueError(f"{len(data)} bytes, not a shared region")
    magic, major, minor = struct.unpack_from("<iII", data, 0)
    if magic != REGION_MAGIC:
        return 0, 0  # not initialised: the library counts nothing before it initialises
    if (major, minor) != REGION_VERSION:
        raise UnsupportedRegion(f"region version {major}.{minor}, not the supported 1.2")
    (proc_num,) = struct.unpack_from("<i", data, REGION_PROC_NUM_OFFSET)
    if not 0 <= proc_num <= REGION_MAX_PROCS:
        raise ValueError(f"{proc_num} process slots")
    (limit,) = struct.unpack_from("<Q", data, REGION_LIMIT_OFFSET)
    total = 0
    for i in range(proc_num):
        slot = REGION_PROCS_OFFSET + i * REGION_SLOT_SIZE
        pid, hostpid = struct.unpack_from("<ii", data, slot)
        (used,) = struct.unpack_from("<Q", data, slot + SLOT_TOTAL_OFFSET)
        if None in pids or pid in pids or (hostpid and hostpid in pids):
            total += used
        if total > MAX_SLOT_BYTES:  # 0 for the container: what it holds, the books do not
            raise ValueError(f"its slots claim {total} bytes")
    return total, min(limit, MAX_SLOT_BYTES)


def read_books(books: str) -> bytes:
    """The region's bytes: no symlink followed, no FIFO waited on, a size cap."""
    fd = os.open(os.path.join(books, REGION_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("the books are not a regular file")
        return fh.read(REGION_SIZE)


def quota_usage(errors: list[str], processes: list[Doc]) -> list[Doc] | None:
    """The quota library's count per container with GPU processes (None: no books on the
    node). Missing books or books it cannot have written count 0 (never loaded, or written
    over from inside); another version's are left out (docs/isolation.md)."""
    root = os.environ.get("GPUPLATFORM_VRAM_QUOTA_ACCOUNTING")
    if not root:
        return None
    live: dict[str, set[int | None]] = {}
    for p in processes:
        if p["container_id"]:
            pids = live.setdefault(p["container_id"], set())
            pids.update((ns_pid(p["pid"]), p["pid"]))
    out = []
    for cid, pids in sorted(live.items()):
        books = os.path.join(root, cid)
        if not os.path.isdir(books):
            continue  # not a container the library was given
        row = {"container_id": cid, "used_mb": 0}
        try:
            used, limit = region_usage(read_books(books), pids)
            row.update(used_mb=used // MIB, limit_mb=limit // MIB)
        except FileNotFoundError:
            pass  # nothing counted: the library was never loaded in it
        except (OSError, ValueError, struct.error) as exc:
            errors.append(f"quota accounting: {cid[:12]}: {exc}")
            if isinstance(exc, UnsupportedRegion):
                continue
        out.append(row)
    return out


def sample_mig_devices(errors: list[str], what: str, handle: object) -> list[Doc]:
    call = functools.partial(nvml, errors, what)
    devices = []
    for i in range(call("nvmlDeviceGetMaxMigDeviceCount", handle) or 0):
        mig = call("nvmlDeviceGetMigDeviceHandleByIndex", handle, i, quiet=(NOT_FOUND,))
        uuid = mig is not None and call("nvmlDeviceGetUUID", mig)
        mem = uuid and call("nvmlDeviceGetMemoryInfo", mig)
        if not mem:  # an empty slot (NotFound) or an unreadable device (in errors)
            continue
        profile = MIG_PROFILE_RE.search(text(call("nvmlDeviceGetName", mig) or ""))
        devices.append(
            {
                "uuid": text(uuid),
                "gi_id": call("nvmlDeviceGetGpuInstanceId", mig),
                "ci_id": call("nvmlDeviceGetComputeInstanceId", mig),
                "profile": profile.group(1) if profile else None,
                "memory_total_mb": int(mem.total) // MIB,
                "memory_used_mb": int(mem.used) // MIB,
                "handle": mig,
            }
        )
    return devices


def sample_gpu(errors: list[str], index: int) -> tuple[Doc | None, list[Doc]]:
    """(gpu dict, processes), or (None, []) when the GPU cannot even say what it is."""
    what = f"gpu {index}"
    handle = nvml(errors, what, "nvmlDeviceGetHandleByIndex", index)
    uuid = handle is not None and nvml(errors, what, "nvmlDeviceGetUUID", handle)
    name = uuid and nvml(errors, what, "nvmlDeviceGetName", handle)
    mem = name and nvml(errors, what, "nvmlDeviceGetMemoryInfo", handle)
    if not mem:
        errors.append(f"{what}: skipped, no handle, uuid, name or memory information")
        return None, []
    uuid = text(uuid)
    call = functools.partial(nvml, errors, f"gpu {index} ({uuid})")
    pci = call("nvmlDeviceGetPciInfo", handle)
    util = call("nvmlDeviceGetUtilizationRates", handle)
    power = call("nvmlDeviceGetPowerUsage", handle)  # mW
    temp = call("nvmlDeviceGetTemperature", handle, TEMPERATURE_GPU)
    mig_mode = call("nvmlDeviceGetMigMode", handle)  # [current, pending]
    mig_enabled = bool(mig_mode) and mig_mode[0] == DEVICE_MIG_ENABLE
    migs = sample_mig_devices(errors, f"gpu {index} ({uuid})", handle) if mig_enabled else []
    ecc = call("nvmlDeviceGetTotalEccErrors", handle, ERROR_TYPE_UNCORRECTED, VOLATILE_ECC)
    retired = call("nvmlDeviceGetRetiredPagesPendingStatus", handle)
    remapped = call("nvmlDeviceGetRemappedRows", handle)  # corrected, uncorrected, pending, failed
    processes = []
    for target_uuid, target in [(m["uuid"], m.pop("handle")) for m in migs] or [(uuid, handle)]:
        processes.extend(sample_processes(errors, target_uuid, target))
    gpu = {
        "index": index,
        "uuid": uuid,
        "name": text(name),
        "pci_bus_id": text(pci.busId) if pci is not None else None,
        "memory_total_mb": int(mem.total) // MIB,
        "memory_used_mb": int(mem.used) // MIB,
        "memory_free_mb": int(mem.free) // MIB,
        "utilization_gpu": int(util.gpu) if util is not None else None,
        "utilization_memory": int(util.memory) if util is not None else None,
        "temperature_c": int(temp) if temp is not None else None,
        "power_w": round(power / 1000.0, 1) if power is not None else None,
        "mig_capable": mig_mode is not None,
        "mig_enabled": mig_enabled,
        "mig_devices": migs,
        "ecc_uncorrected_volatile": int(ecc) if ecc is not None else None,
        "retired_pages_pending": bool(retired),
        "remapped_rows_pending": bool(remapped and remapped[2]),
        "remapped_rows_failure": bool(remapped and remapped[3]),
    }
    return gpu, processes


def read_kernel_log(errors: list[str]) -> str:
    try:
        run = subprocess.run(  # noqa: S603
            ["dmesg", "--time-format", "iso"],  # noqa: S607
            capture_output=True,
            timeout=5,
            check=False,
        )
        if run.returncode == 0:
            return run.stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        pass  # not installed or not permitted: the log files below
    paths = [os.environ.get("GPUPLATFORM_KERNEL_LOG"), "/var/log/kern.log", "/var/log/messages"]
    for path in [p for p in paths if p]:
        try:
            with open(path, "rb") as fh:
                fh.seek(max(0, os.fstat(fh.fileno()).st_size - KERNEL_LOG_TAIL_BYTES))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            continue
    errors.append("xid: neither dmesg nor a kernel log file is readable")
    return ""


def new_xid_events(errors: list[str]) -> list[Doc]:
    """Xid lines not reported by an earlier run: the state file holds the hashes of the Xid lines
    seen last time (timestamps included), so each line is reported once while it is in the log.
    dmesg recomputes wall-clock stamps on every run, so the sub-second digits are left out."""
    state_dir = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    state_path = os.path.join(state_dir, f"gpuplatform-sampler-xid-{os.getuid()}.json")
    try:
        with open(state_path, encoding="utf-8") as fh:
            seen = set(json.load(fh).get("seen", []))
    except (OSError, ValueError, AttributeError):
        seen = set()
    events, current = [], []
    for line in read_kernel_log(errors).splitlines():
        match = XID_RE.search(line)
        if not match:
            continue
        key = FRACTION_RE.sub("", line[: match.start()]) + line[match.start() :]
        digest = hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()[:20]
        current.append(digest)
        if digest in seen:
            continue
        pid = XID_PID_RE.match(match.group("rest"))
        events.append(
            {
                "pci_bus_id": match.group("bus").lower(),
                "xid": int(match.group("xid")),
                "pid": int(pid.group("pid")) or None if pid else None,  # 0: the kernel
                "raw": line[match.start() :].strip(),
            }
        )
    try:
        fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=".gpuplatform-xid-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"seen": current}, fh)
        os.replace(tmp, state_path)
    except OSError as exc:
        errors.append(f"xid: cannot write state file {state_path}: {exc}")
    return events


def capabilities(errors: list[str], gpus: list[Doc]) -> Doc:
    docker = shutil.which("docker") is not None
    nvidia_runtime = False
    if docker:
        try:
            run = subprocess.run(  # noqa: S603
                ["docker", "info", "--format", "{{json .Runtimes}}"],  # noqa: S607
                capture_output=True,
                timeout=10,
                check=False,
            )
            nvidia_runtime = run.returncode == 0 and b"nvidia" in run.stdout
        except (OSError, subprocess.SubprocessError) as exc:
            errors.append(f"capabilities: docker info: {exc}")
    configured = os.environ.get("GPUPLATFORM_VRAM_QUOTA_LIBRARY")
    if configured and not os.path.isfile(configured):
        errors.append(f"capabilities: GPUPLATFORM_VRAM_QUOTA_LIBRARY={configured} does not exist")
    paths = ([configured] if configured else []) + list(QUOTA_LIBRARY_PATHS)
    library = next((path for path in paths if os.path.isfile(path)), None)
    return {
        "docker": docker,
        "nvidia_runtime": nvidia_runtime,
        "mig": any(g["mig_capable"] for g in gpus),
        "vram_quota_library": library,
        "preflight": preflight_facts(errors, docker),
    }


VERSION_RE = re.compile(r"\bversion:?\s+v?([0-9][0-9A-Za-z.+~:-]*)", re.IGNORECASE)
# the toolkit's CLIs, newest first; the hook is what dockerd runs, so it answers last
TOOLKIT_COMMANDS = (
    ["nvidia-ctk", "--version"],
    ["nvidia-container-toolkit", "--version"],
    ["nvidia-container-runtime-hook", "--version"],
)


def command_text(errors: list[str], argv: list[str], what: str) -> str:
    """stdout of a short command, "" when it is not installed or fails."""
    if shutil.which(argv[0]) is None:
        return ""
    try:
        run = subprocess.run(argv, capture_output=True, timeout=10, check=False)  # noqa: S603
    except (OSError, subprocess.SubprocessError) as exc:
        errors.append(f"preflight: {what}: {exc}")
        return ""
    return text(run.stdout).strip() if run.returncode == 0 else ""


def package_build(errors: list[str], names: list[str]) -> str:
    """The distribution's build string of the first installed package of `names`
    (Debian/Ubuntu dpkg, else RPM): distributions backport fixes into old numbers."""
    for name in names:
        out = command_text(errors, ["dpkg-query", "-W", "-f=${Version}", name], "dpkg-query")
        if out:
            return out
        out = command_text(errors, ["rpm", "-q", "--qf", "%{VERSION}-%{RELEASE}", name], "rpm")
        if out and "not installed" not in out:
            return out
    return ""


# runtime types whose binary is runc (or a drop-in for it, named by BinaryName)
RUNC_SHIMS = ("", "io.containerd.runc.v2", "io.containerd.runtime.v1.linux")
RUNC_LINE_RE = re.compile(r"^runc version:?\s+v?(\S+)", re.IGNORECASE)
COMMIT_LINE_RE = re.compile(r"^commit:\s*(\S+)", re.IGNORECASE)
RUNC_FACT_KEYS = ("runc_version", "runc_commit", "runc_path", "runc_build", "runc_package")


def json_command(errors: list[str], argv: list[str], what: str) -> Doc:
    out = command_text(errors, argv, what)
    try:
        doc = json.loads(out) if out else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def runtime_binary(info: Doc) -> str:
    """What dockerd runs containers with: its default runtime's program, as `docker info`
    names it (a bare name is looked up on PATH, as dockerd does); "" when that runtime is
    not runc."""
    runtimes = info["Runtimes"] if isinstance(info.get("Runtimes"), dict) else {}
    name = str(info.get("DefaultRuntime") or "runc")
    runtime = runtimes.get(name)
    if not isinstance(runtime, dict):
        return "runc" if name == "runc" else ""
    options = runtime["options"] if isinstance(runtime.get("options"), dict) else {}
    path = str(runtime.get("path") or options.get("BinaryName") or "")
    if not path and str(runtime.get("runtimeType") or "") in RUNC_SHIMS:
        path = "runc"
    return path


def runc_reading(output: str) -> tuple[str, str, bool]:
    """(version, commit, is_runc) from a runtime's `--version`: runc's own first line, or the
    "runc version" section a wrapper (nvidia-container-runtime) prints after its own."""
    lines = [line.strip() for line in output.splitlines()]
    for i, line in enumerate(lines):
        match = RUNC_LINE_RE.match(line)
        if not match:
            continue
        commit = ""
        for later in lines[i + 1 :]:
            if not later:
                break  # the section ends at a blank line
            found = COMMIT_LINE_RE.match(later)
            if found:
                commit = found.group(1)
                break
        return match.group(1), commit, i == 0
    return "", "", False


def owning_package(errors: list[str], path: str) -> tuple[str, str]:
    """(package, build) of the distribution package that installed exactly this file
    (dpkg, else RPM); ("", "") when none did, e.g. a binary copied there by hand."""
    real = os.path.realpath(path)
    candidates = [path] + ([real] if real != path else [])
    # a merged /usr: the package may have shipped /sbin/runc, found at /usr/sbin/runc
    for candidate in list(candidates):
        alias = candidate[4:] if candidate.startswith("/usr/") else "/usr" + candidate
        if os.path.exists(alias) and os.path.realpath(alias) == real:
            candidates.append(alias)
    for candidate in candidates:
        owners_out = command_text(errors, ["dpkg-query", "-S", candidate], "dpkg-query")
        for line in owners_out.splitlines():
            owners, sep, owned = line.partition(": ")
            if not sep or owned.strip() != candidate or owners.startswith("diversion "):
                continue
            package = owners.split(",")[0].strip()
            build = command_text(
                errors, ["dpkg-query", "-W", "-f=${Version}", package], "dpkg-query"
            )
            if build:
                return package, build
        out = command_text(
            errors, ["rpm", "-qf", "--qf", "%{NAME} %{VERSION}-%{RELEASE}\\n", candidate], "rpm"
        )
        words = out.splitlines()[0].split() if out else []
        if len(words) == 2:
            return words[0], words[1]
    return "", ""


def runc_facts(errors: list[str], info: Doc, server: Doc) -> dict[str, str]:
    """The runc dockerd runs containers with, read from that binary itself: its path (the
    default runtime's, from `docker info`), version and commit from `<path> --version`, and
    the distribution's build only from the package that owns that exact file. dockerd's
    own reading of its runtime (`docker version`'s runc component, `docker info`'s
    RuncCommit) must agree, or the binary found is not dockerd's and no build is read."""
    facts = dict.fromkeys(RUNC_FACT_KEYS, "")
    dockerd_version = dockerd_commit = ""
    for part in server.get("Components") or []:
        if isinstance(part, dict) and str(part.get("Name", "")).lower() == "runc":
            dockerd_version = str(part.get("Version") or "")
            details = part["Details"] if isinstance(part.get("Details"), dict) else {}
            dockerd_commit = str(details.get("GitCommit") or "")
    runc_commit = info["RuncCommit"] if isinstance(info.get("RuncCommit"), dict) else {}
    dockerd_commit = str(runc_commit.get("ID") or "") or dockerd_commit
    if dockerd_commit in ("N/A", "unknown"):
        dockerd_commit = ""
    # without `docker info` which binary dockerd runs is unknown: a runc on PATH is a guess
    name = runtime_binary(info) if info else ""
    path = shutil.which(name) if name else None
    version, commit, is_runc = (
        runc_reading(command_text(errors, [path, "--version"], name)) if path else ("", "", False)
    )
    if not version or not path:
        # dockerd's word for the version, but no binary to tie a package build to
        if info:
            runtime = name or f"{info.get('DefaultRuntime')} (not runc)"
            errors.append(f"preflight: runc: dockerd's runtime {runtime} could not be read")
        facts["runc_version"], facts["runc_commit"] = dockerd_version, dockerd_commit
        return facts
    if (dockerd_version and dockerd_version != version) or (
        dockerd_commit and commit and dockerd_commit != commit
    ):
        errors.append(
            f"preflight: runc: {path} is {version} ({commit or 'no commit'}) but dockerd runs "
            f"{dockerd_version or '?'} ({dockerd_commit or 'no commit'}): no build is read"
        )
        facts["runc_version"], facts["runc_commit"] = dockerd_version, dockerd_commit
        return facts
    facts.update(runc_version=version, runc_commit=commit, runc_path=path)
    if is_runc:  # a wrapper's package is not runc's
        facts["runc_package"], facts["runc_build"] = owning_package(errors, path)
    return facts


def userns_remap(info: Doc) -> str:
    """Whether dockerd remaps user namespaces (userns-remap): "true" or "false", "" when
    docker did not say."""
    options = info.get("SecurityOptions")
    if not isinstance(options, list):
        return ""
    names = [str(option).split(",")[0] for option in options]
    return "true" if "name=userns" in names else "false"


def preflight_facts(errors: list[str], docker: bool) -> dict[str, str]:
    """What the platform's preflight gate judges, as text: OS, kernel, Docker Engine and the
    runc it uses, user-namespace remapping, the NVIDIA Container Toolkit, cgroup version
    ("" where unknown)."""
    facts = {"kernel": os.uname().release, "os": ""}
    with contextlib.suppress(OSError), open("/etc/os-release", encoding="utf-8") as fh:
        for line in fh:
            if line.startswith("PRETTY_NAME="):
                facts["os"] = line.split("=", 1)[1].strip().strip('"')
    server = info = {}
    if docker:
        server = json_command(
            errors, ["docker", "version", "--format", "{{json .Server}}"], "docker version"
        )
        info = json_command(errors, ["docker", "info", "--format", "{{json .}}"], "docker info")
    facts["docker_version"] = str(server.get("Version") or "")
    facts["cgroup_version"] = str(info.get("CgroupVersion") or "")
    facts["userns_remap"] = userns_remap(info)
    facts.update(runc_facts(errors, info, server) if docker else {})
    for key in RUNC_FACT_KEYS:
        facts.setdefault(key, "")
    facts["toolkit_version"] = facts["toolkit_source"] = ""
    for argv in TOOLKIT_COMMANDS:
        match = VERSION_RE.search(command_text(errors, argv, argv[0]))
        if match:
            facts["toolkit_version"], facts["toolkit_source"] = match.group(1), argv[0]
            break
    facts["toolkit_build"] = package_build(
        errors, ["nvidia-container-toolkit", "nvidia-container-toolkit-base"]
    )
    if not facts["cgroup_version"]:
        v2 = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        facts["cgroup_version"] = "2" if v2 else "1"
    return facts


def emit(doc: Doc, code: int) -> int:
    sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return code


def unavailable(error: str) -> int:
    return emit({"schema": SCHEMA, "source": "unavailable", "error": error}, UNAVAILABLE_EXIT)


def sample(discover: bool) -> Doc:
    errors: list[str] = []
    count = nv.nvmlDeviceGetCount()  # no count, no sample: the caller falls back to nvidia-smi
    gpus, processes = [], []
    for index in range(count):
        gpu, procs = sample_gpu(errors, index)
        if gpu is not None:
            gpus.append(gpu)
            processes.extend(procs)
    cuda = nvml(errors, "system", "nvmlSystemGetCudaDriverVersion_v2")
    doc = {
        "schema": SCHEMA,
        "source": "nvml",
        "hostname": socket.gethostname(),
        "taken_at": datetime.now(timezone.utc).isoformat(),  # noqa: UP017 - Python 3.8
        "driver_version": text(nvml(errors, "system", "nvmlSystemGetDriverVersion") or ""),
        "cuda_version": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "",
        "gpus": gpus,
        "processes": processes,
        "xid_events": new_xid_events(errors),
    }
    books = quota_usage(errors, processes)
    if books is not None:
        doc["quota_usage"] = books
    if discover:
        doc["capabilities"] = capabilities(errors, gpus)
    doc["errors"] = errors
    return doc


def serve(requests: BinaryIO) -> int:
    """--serve: stay up with NVML initialised and answer one JSON line per request line
    ("sample" or "discover") until stdin closes. Saves a process start and nvmlInit per
    sample; the platform keeps the channel open between samples."""
    while True:
        line = requests.readline()
        if not line:
            return 0
        request = line.strip()
        if request not in (b"sample", b"discover"):
            emit({"schema": SCHEMA, "source": "error", "error": "unknown request"}, 0)
            continue
        try:
            doc = sample(request == b"discover")
        except Exception as exc:  # answer this request; the next one may succeed
            doc = {
                "schema": SCHEMA,
                "source": "unavailable",
                "error": f"sampling failed: {type(exc).__name__}: {exc}",
            }
        emit(doc, 0)


def main(argv: list[str]) -> int:
    global nv
    try:
        # Here: a node without NVML's Python binding still answers, saying why.
        import pynvml  # noqa: PLC0415
    except ImportError as exc:
        return unavailable(f"pynvml is not importable: {exc}")
    nv = pynvml
    try:
        nv.nvmlInit()
    except Exception as exc:  # NVMLError, or an OSError from a missing libnvidia-ml
        return unavailable(f"nvmlInit failed: {exc}")
    try:
        if "--serve" in argv:
            return serve(sys.stdin.buffer)
        doc = sample("--discover" in argv)
    except Exception as exc:  # a lost driver or a bug: no half sample, nvidia-smi instead
        return unavailable(f"sampling failed: {type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(Exception):  # nothing useful to do about a failed shutdown
            nv.nvmlShutdown()
    return emit(doc, 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
