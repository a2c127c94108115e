# GPUPLATFORM_AGENT schema=1
"""The node agent: runs as root on every GPU node, outside every container, and holds each
platform container to its VRAM quota within about a second (docs/isolation.md).

Python 3.8+, the standard library and pynvml only, like the sampler: a plain GPU host
already has `python3` for the sampler and the relay, so nothing else is installed. It
opens no port and holds no platform credential; the platform pulls its journal over the
SSH it already uses (`report`), installs and upgrades it the same way (`install`).

Modes (`python3 agent.py MODE`, or with the source on stdin after a length line through
BOOTSTRAP, which is how the platform sends it):
  run        the loop: NVML every `interval_s`, enforce, record harm, write the journal
  supervise  detached: keep `run` running, restart it when it dies (nodes without systemd)
  install    write this source and the config into the agent directory, (re)start it
  report     print the status and the journal entries after `--since N`, as one JSON line
  stop       stop the supervisor and the loop (the lab's teardown; an uninstall)
Directory: GPUPLATFORM_AGENT_DIR (default /var/lib/gpuplatform/agent), root's, mode 0700.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone

TYPE_CHECKING = False  # typing's, without importing it on the node: mypy reads it as True
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Doc = dict[str, Any]

VERSION = "1.0.0"
SCHEMA = 1
MIB = 1024 * 1024
DEFAULT_DIR = "/var/lib/gpuplatform/agent"
LABEL_MANAGED = "gpuplatform.managed"
LABEL_VRAM = "gpuplatform.vram_mb"
UNIT_NAME = "gpuplatform-agent.service"
UNIT_PATH = "/etc/systemd/system/" + UNIT_NAME
# What the platform may set in config.json; anything else is ignored.
DEFAULTS = {
    "interval_s": 0.5,  # one NVML reading every half second
    "confirm_readings": 2,  # a breach is acted on when this many readings in a row see it
    "margin_mb": 512,  # over the quota by more than this (a CUDA context the library misses)
    "kill_strays": False,  # processes on a card in no platform container: report, or end
    "harm_report_s": 10.0,  # an ongoing harm is reported again this often
}
JOURNAL_MAX_BYTES = 4 * MIB  # then it rotates to journal.1.jsonl (one generation kept)
REPORT_LIMIT = 500  # journal entries per report; the platform asks again for the rest
UNKNOWN_RECHECK_S = 5.0  # a container docker did not list as the platform's: asked again after
HARM_GAP_S = 2.0  # a harm back within this long is the one before, not a new one
CONTAINER_ID_RE = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
# The bootstrap the platform runs: a length line, that many bytes of this source, then
# the mode's own arguments on the command line. The source is kept for `install`.
BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;n=int(b.readline());AGENT_SOURCE=b.read(n);"
    "exec(compile(AGENT_SOURCE,'gpuplatform-agent','exec'))"
)

nv: Any = None  # the pynvml module, once imported


def now_iso(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, timezone.utc).isoformat()


def agent_dir() -> str:
    return os.environ.get("GPUPLATFORM_AGENT_DIR") or DEFAULT_DIR


def read_text(path: str) -> str | None:
    with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()
    return None


def write_atomic(path: str, text: str, mode: int = 0o600) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def load_config(directory: str) -> Doc:
    config = dict(DEFAULTS)
    with contextlib.suppress(ValueError, TypeError):
        given = json.loads(read_text(os.path.join(directory, "config.json")) or "{}")
        config.update({k: type(DEFAULTS[k])(v) for k, v in given.items() if k in DEFAULTS})
    config["interval_s"] = min(1.0, max(0.1, config["interval_s"]))  # at least once a second
    config["confirm_readings"] = max(1, config["confirm_readings"])
    return config


# ----------------------------------------------------------------------------- journal


class Journal:
    """Append-only JSON lines with a sequence number, so the platform can pull what it has
    not seen (`report --since N`) and nothing is reported twice or lost across restarts."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, "journal.jsonl")
        self.old = os.path.join(directory, "journal.1.jsonl")
        id_path = os.path.join(directory, "journal.id")
        self.id = (read_text(id_path) or "").strip()
        if not self.id:
            self.id = uuid.uuid4().hex
            write_atomic(id_path, self.id)
        last = self.read_since(-1)
        self.seq = last[-1]["seq"] if last else 0
        self.lost, self.last_error = 0, ""

    def note(self, kind: str, **fields: Any) -> None:
        """append, for the loop: a full disk must not stop the enforcing (the kill has
        happened; only its record is lost, and the status says so)."""
        try:
            self.append(kind, **fields)
        except OSError as exc:
            self.lost += 1
            self.last_error = f"journal: {exc}"

    def append(self, kind: str, **fields: Any) -> Doc:
        self.seq += 1
        entry = {"seq": self.seq, "at": now_iso(), "kind": kind, **fields}
        with contextlib.suppress(OSError):
            if os.path.getsize(self.path) > JOURNAL_MAX_BYTES:
                os.replace(self.path, self.old)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())  # a kill is evidence: it outlives a crash of the node
        return entry

    def read_since(self, since: int) -> list[Doc]:
        """Entries after `since`, in order. The current file is read before the old one:
        a rotation between the two reads then shows a generation twice, never not at all."""
        out: dict[int, Doc] = {}
        for path in (self.path, self.old):
            for line in (read_text(path) or "").splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if isinstance(entry, dict) and isinstance(entry.get("seq"), int):
                        out.setdefault(entry["seq"], entry)
        return [out[seq] for seq in sorted(out) if seq > since]


# ----------------------------------------------------------------------------- readings


def text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def cgroup_of(pid: int) -> tuple[str | None, str | None]:
    """(container id, the container's cgroup path) of a host PID, read now; (None, None)
    for a process in no container."""
    found = None
    for line in (read_text(f"/proc/{pid}/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        ids = CONTAINER_ID_RE.findall(parts[-1]) if len(parts) == 3 else []
        if ids:
            # the outermost id is the container's: a child cgroup inside it, whatever its
            # name, is still that container's
            path = parts[2]
            cut = path.find(ids[0])
            found = (ids[0], path[: path.find("/", cut)] if "/" in path[cut:] else path)
            if parts[0] == "0":  # the unified hierarchy, where cgroup.kill lives
                return found
    return found if found else (None, None)


def start_time(pid: int) -> str:
    stat = read_text(f"/proc/{pid}/stat") or ""
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else ""


DEVICE_ERRORS: list[str] = []  # this reading's, for the status


def read_devices() -> tuple[list[Doc], list[Doc]]:
    """(devices, processes) from NVML now: each whole GPU, or each MIG device of a GPU in
    MIG mode (the device a process runs on), with its memory; each process's memory."""
    devices, procs = [], []
    DEVICE_ERRORS.clear()
    for index in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        gpu_uuid = text(nv.nvmlDeviceGetUUID(handle))
        targets = [(gpu_uuid, handle, False)]
        with contextlib.suppress(nv.NVMLError, AttributeError):
            if nv.nvmlDeviceGetMigMode(handle)[0] == 1:
                targets = []
                for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
                    with contextlib.suppress(nv.NVMLError):
                        mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
                        targets.append((text(nv.nvmlDeviceGetUUID(mig)), mig, True))
        for device_uuid, target, mig in targets:
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(target)
                found = nv.nvmlDeviceGetComputeRunningProcesses(target) or []
            except nv.NVMLError as exc:  # one lost card does not blind the node
                DEVICE_ERRORS.append(f"{device_uuid}: {exc}")
                continue
            devices.append(
                {"uuid": device_uuid, "gpu_uuid": gpu_uuid, "mig": mig,
                 "total_mb": int(mem.total) // MIB, "free_mb": int(mem.free) // MIB}
            )  # fmt: skip
            for p in found:
                used = getattr(p, "usedGpuMemory", None)
                procs.append(
                    {"pid": int(p.pid), "device": device_uuid, "used_mb": int(used or 0) // MIB}
                )
    return devices, procs


# ----------------------------------------------------------------------------- the rules


def over_quota(used_mb: int, quota_mb: int, margin_mb: int) -> bool:
    return used_mb > quota_mb + margin_mb


def harm_on_card(
    held: dict[str, tuple[int, int]], free_mb: int, margin_mb: int = 0
) -> dict[str, Doc]:
    """Who on one card is harmed now: a container is harmed while the card has less free
    memory than the container's unused quota because another container is over its own
    (by more than the margin a CUDA context may take, as the kill rule reads it). `held`
    is container id -> (quota, used) by NVML. Returns container id -> its shortfall (no
    more than what the offenders hold past their quotas: the rest is not theirs to owe)
    and the offenders. A job out of memory inside its own quota is not harmed: with no
    offender on the card there is no harm, whatever is free."""
    excess = {c: used - quota for c, (quota, used) in held.items() if used > quota + margin_mb}
    out: dict[str, Doc] = {}
    for cid, (quota, used) in held.items():
        others = sorted(o for o in excess if o != cid)
        short = min(quota - used - free_mb, sum(excess[o] for o in others))
        if others and short > 0:
            out[cid] = {"short_mb": short, "offenders": others}
    return out


# ----------------------------------------------------------------------------- containers


class Containers:
    """Platform containers on this node and their quotas, from docker's own record of
    each (its labels, set by the platform at `docker run`; a container cannot change its
    labels). Looked up when an unknown container shows on a card, never every reading."""

    def __init__(self) -> None:
        self.quota: dict[str, int] = {}
        self.managed: set[str] = set()  # every platform container, its quota known or not
        self.blind = False  # docker did not answer the last time it was asked
        self.unknown: dict[str, float] = {}  # container id -> when docker last did not know it

    def quota_of(self, cid: str) -> int | None:
        if cid not in self.quota and time.monotonic() - self.unknown.get(cid, -1e9) > (
            UNKNOWN_RECHECK_S
        ):
            self.refresh()
            if cid not in self.quota:
                self.unknown[cid] = time.monotonic()
        return self.quota.get(cid)

    def refresh(self) -> None:
        fmt = '{{.ID}} {{.Label "' + LABEL_VRAM + '"}}'
        argv = ["docker", "ps", "--no-trunc", "--filter", f"label={LABEL_MANAGED}=1"]
        try:
            out = subprocess.run(
                [*argv, "--format", fmt], capture_output=True, text=True, timeout=10, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError):
            self.blind = True
            return
        seen, managed = {}, set()
        for line in out.splitlines():
            cid, _, vram = line.partition(" ")
            if CONTAINER_ID_RE.fullmatch(cid):
                managed.add(cid)
                if vram.strip().isdigit():
                    seen[cid] = int(vram)
        self.quota, self.managed, self.blind = seen, managed, False


def cgroup_kill_file(cid: str, cgroup_path: str | None) -> str:
    """The container's own `cgroup.kill` (cgroup v2 at the root, or a hybrid host's unified
    hierarchy beside v1's), or "" where the node has none."""
    if not cgroup_path or cid not in cgroup_path.rsplit("/", 1)[-1]:
        return ""  # the path must name this container, not a parent or a sibling
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        path = os.path.join(root, cgroup_path.lstrip("/"), "cgroup.kill")
        if os.path.exists(path):
            return path
    return ""


def kill_container(cid: str, cgroup_path: str | None) -> tuple[str, str]:
    """Stop every process of one container at once: its cgroup's `cgroup.kill`, else
    `docker kill` by its id. Never a PID: one read earlier may have been reused.
    Returns (method, error)."""
    error = ""
    kill = cgroup_kill_file(cid, cgroup_path)
    if kill:
        try:
            with open(kill, "w", encoding="ascii") as fh:
                fh.write("1")
            return "cgroup.kill", ""
        except OSError as exc:
            error = f"cgroup.kill: {exc}; "
    try:
        done = subprocess.run(
            ["docker", "kill", "--signal", "KILL", cid], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return "docker kill", error + str(exc)
    return "docker kill", error + (done.stderr.strip() if done.returncode else "")


# ----------------------------------------------------------------------------- the loop


class Enforcer:
    """What the loop remembers between readings: each container's readings over its
    quota, the containers it has stopped, the harms under way, the strays it reported."""

    def __init__(self, journal: Journal, config: Doc, containers: Containers):
        self.journal, self.config, self.containers = journal, config, containers
        self.over: dict[str, list[Doc]] = {}  # container -> its readings over quota + margin
        self.crossed: dict[str, float] = {}  # container -> first reading over its quota
        self.killed: dict[str, float] = {}  # container -> when it was stopped
        self.harms: dict[str, Doc] = {}  # harmed container -> the harm under way
        self.strays: set[tuple[int, str]] = set()
        self.watched = 0

    def tick(self, devices: list[Doc], procs: list[Doc], t: float) -> None:
        by_uuid = {d["uuid"]: d for d in devices}
        held: dict[str, Doc] = {}  # container -> {device, used_mb, quota_mb, cgroup, pids}
        for p in procs:
            cid, cgroup = cgroup_of(p["pid"])
            quota = self.containers.quota_of(cid) if cid else None
            device = by_uuid.get(p["device"])
            if cid is None or quota is None or device is None:
                self.stray(p, cid)
                continue
            if device["mig"]:  # a MIG instance is the hardware's: all of it is the slice's
                quota = max(quota, device["total_mb"])
            entry = held.setdefault(
                cid,
                {"device": device, "used_mb": 0, "quota_mb": quota, "cgroup": cgroup, "pids": []},
            )
            entry["used_mb"] += p["used_mb"]
            entry["pids"].append(p["pid"])
        self.watched = len(held)
        for cid, entry in held.items():
            self.enforce(cid, entry, t)
        self.harm(held, devices, t)

    def enforce(self, cid: str, entry: Doc, t: float) -> None:
        if t - self.killed.get(cid, -1e9) < 10.0:  # dying: the driver frees it in a moment
            return
        used, quota = entry["used_mb"], entry["quota_mb"]
        # Readings over the line within the window count, not only readings in a row: a
        # job that pulses past its quota between readings is caught all the same.
        window = self.config["interval_s"] * (self.config["confirm_readings"] + 2)
        readings = [r for r in self.over.get(cid, []) if t - r["t"] <= window]
        self.over[cid] = readings
        if used > quota:
            self.crossed.setdefault(cid, t)
        elif not readings:
            self.crossed.pop(cid, None)
        if not over_quota(used, quota, self.config["margin_mb"]):
            return
        readings.append({"at": now_iso(t), "t": t, "used_mb": used})
        if len(readings) < self.config["confirm_readings"]:
            return
        method, error = kill_container(cid, entry["cgroup"])
        killed = time.time()
        crossed = self.crossed[cid] if cid in self.crossed else float(readings[0]["t"])
        self.killed[cid] = killed
        device = entry["device"]
        self.journal.note(
            "kill", container_id=cid, device_uuid=device["uuid"], gpu_uuid=device["gpu_uuid"],
            mig=device["mig"], quota_mb=quota, used_mb=used, margin_mb=self.config["margin_mb"],
            pids=entry["pids"], method=method, error=error,
            readings=[{"at": r["at"], "used_mb": r["used_mb"]} for r in readings],
            crossed_at=now_iso(crossed), killed_at=now_iso(killed),
            breach_to_kill_ms=round((killed - crossed) * 1000),  # from the first reading over
        )  # fmt: skip
        self.over.pop(cid, None)
        self.crossed.pop(cid, None)

    def harm(self, held: dict[str, Doc], devices: list[Doc], t: float) -> None:
        now: dict[str, Doc] = {}
        for device in devices:
            if device["mig"]:
                continue  # hardware partitions: nothing on one can take another's memory
            on_card = {
                cid: (e["quota_mb"], e["used_mb"])
                for cid, e in held.items()
                if e["device"]["uuid"] == device["uuid"]
            }
            free, margin = device["free_mb"], self.config["margin_mb"]
            for cid, found in harm_on_card(on_card, free, margin).items():
                now[cid] = {**found, "device_uuid": device["uuid"], "quota_mb": on_card[cid][0]}
        for cid, found in now.items():
            open_ = self.harms.get(cid)
            if open_ is None:
                open_ = self.harms[cid] = {
                    "harm_id": uuid.uuid4().hex, "container_id": cid, "started_at": now_iso(t),
                    "short_mb": 0, "offenders": [], "reported": 0.0,
                }  # fmt: skip
            open_.pop("gone_at", None)
            open_["short_mb"] = max(open_["short_mb"], found["short_mb"])
            open_["offenders"] = sorted(set(open_["offenders"]) | set(found["offenders"]))
            open_.update(device_uuid=found["device_uuid"], quota_mb=found["quota_mb"])
            if t - open_["reported"] >= self.config["harm_report_s"]:
                open_["reported"] = t
                self.report_harm(open_, ended_at=None)
        # A harm that comes back within HARM_GAP_S is the same one (an offender that pulses
        # is one harm, not one a second); it ended at the first reading that did not see it.
        for cid in [c for c in self.harms if c not in now]:
            gone = self.harms[cid].setdefault("gone_at", t)
            if t - gone >= HARM_GAP_S:
                self.report_harm(self.harms.pop(cid), ended_at=now_iso(gone))

    def report_harm(self, harm: Doc, *, ended_at: str | None) -> None:
        fields = {k: v for k, v in harm.items() if k not in ("reported", "gone_at")}
        self.journal.note("harm", ended_at=ended_at, **fields)

    def stray(self, p: Doc, cid: str | None) -> None:
        """A process on a card in no platform container: reported once; ended only where
        ops' policy for the node says so (their own maintenance may run there)."""
        key = (p["pid"], start_time(p["pid"]))
        if key in self.strays or not key[1]:
            return
        self.strays.add(key)
        action = "reported"
        # the platform's own container with no quota label (started before the label, or
        # docker could not be asked): never ended here; the 30 s watchdog holds it
        ours = cid is not None and (cid in self.containers.managed or self.containers.blind)
        if self.config["kill_strays"] and cid and not ours:
            # a container, by its id; a bare host process (ops' own) is never signalled
            error = kill_container(cid, None)[1]
            action = "ended" if not error else f"not ended: {error}"
        self.journal.note(
            "stray", pid=p["pid"], device_uuid=p["device"], used_mb=p["used_mb"],
            name=(read_text(f"/proc/{p['pid']}/comm") or "").strip(), container_id=cid,
            action=action,
        )  # fmt: skip


def read_smi() -> tuple[list[Doc], list[Doc]]:
    """The fallback where pynvml cannot be used: nvidia-smi's CSV queries (whole GPUs)."""

    def query(kind: str, fields: str) -> list[list[str]]:
        out = subprocess.run(
            ["nvidia-smi", f"--query-{kind}={fields}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        return [[f.strip() for f in line.split(",")] for line in out.splitlines() if line.strip()]

    devices = [
        {"uuid": u, "gpu_uuid": u, "mig": False, "total_mb": int(total), "free_mb": int(free)}
        for u, total, free in query("gpu", "uuid,memory.total,memory.free")
    ]
    procs = [
        {"pid": int(pid), "device": u, "used_mb": int(used) if used.isdigit() else 0}
        for pid, u, used in query("compute-apps", "pid,gpu_uuid,used_memory")
    ]
    return devices, procs


def open_reader() -> tuple[str, Callable[[], tuple[list[Doc], list[Doc]]]]:
    global nv
    try:
        import pynvml  # noqa: PLC0415 - on the node, only where the binding is installed

        nv = pynvml
        nv.nvmlInit()
        return "nvml", read_devices
    except Exception as exc:  # no binding, or no libnvidia-ml: nvidia-smi instead
        if shutil.which("nvidia-smi"):
            return f"nvidia-smi ({exc})", read_smi
        raise


def only_one(directory: str, name: str) -> Any:
    """An exclusive lock on `<directory>/<name>.lock`, held for the life of the process, or
    None where another holds it: two installs at once must not leave two loops."""
    fd = os.open(os.path.join(directory, f"{name}.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def run(directory: str) -> int:
    if only_one(directory, "run") is None:
        return 0  # another loop runs: this one is a second install's echo
    config = load_config(directory)
    journal = Journal(directory)
    write_atomic(os.path.join(directory, "agent.pid"), str(os.getpid()))
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    status: Doc = {"version": VERSION, "pid": os.getpid(), "started_at": time.time(), "loops": 0}
    status.update(source="", error="", error_since=None, config=config)
    reader = None
    enforcer = Enforcer(journal, config, Containers())
    journal.note("start", version=VERSION, pid=os.getpid(), config=config)
    while not stopping:
        t, tick = time.time(), time.monotonic()
        try:
            if reader is None:
                status["source"], reader = open_reader()
            devices, procs = reader()
            enforcer.tick(devices, procs, t)
            error = "; ".join(DEVICE_ERRORS) if not devices and DEVICE_ERRORS else ""
        except Exception as exc:  # keep going: the next reading may work; say so meanwhile
            error, reader = f"{type(exc).__name__}: {exc}", None
        if error and error != status["error"]:
            journal.note("error", error=error)
        status["error_since"] = (status["error_since"] or t) if error else None
        status.update(error=error, last_loop_at=t, loops=status["loops"] + 1)
        status.update(watched=enforcer.watched, lost_entries=journal.lost, warning=DEVICE_ERRORS)
        with contextlib.suppress(OSError):  # a full disk: the loop goes on enforcing
            write_atomic(os.path.join(directory, "status.json"), json.dumps(status))
        time.sleep(max(0.0, config["interval_s"] - (time.monotonic() - tick)))
    return 0


# ----------------------------------------------------------------------------- supervision


def agent_pid_alive(pid: int, directory: str) -> bool:
    """This agent's process (its own file named on its command line), not any agent.py."""
    return os.path.join(directory, "agent.py") in (read_text(f"/proc/{pid}/cmdline") or "")


def supervise(directory: str) -> int:
    """Where the node has no systemd (the lab's nodes): keep `run` running, restarting it
    with a growing pause when it dies, as a systemd unit with Restart=always would."""
    if only_one(directory, "supervise") is None:
        return 0
    write_atomic(os.path.join(directory, "supervisor.pid"), str(os.getpid()))
    stopping: list[int] = []
    child: list[subprocess.Popen] = []

    def stop(*_: object) -> None:
        stopping.append(1)
        for c in child:
            with contextlib.suppress(OSError):
                c.terminate()

    signal.signal(signal.SIGTERM, stop)
    pause = 1.0
    while not stopping:
        began = time.monotonic()
        child[:] = [subprocess.Popen([sys.executable, os.path.join(directory, "agent.py"), "run"])]
        code = child[0].wait()
        if stopping:
            break
        Journal(directory).note("exit", code=code)  # the loop is gone: an incident
        pause = 1.0 if time.monotonic() - began > 60 else min(pause * 2, 30.0)
        time.sleep(pause)
    return 0


def stop(directory: str) -> int:
    if use_systemd():
        subprocess.run(["systemctl", "stop", UNIT_NAME], capture_output=True, timeout=30)
    for name in ("supervisor.pid", "agent.pid"):
        pid_text = (read_text(os.path.join(directory, name)) or "").strip()
        if not pid_text.isdigit() or not agent_pid_alive(int(pid_text), directory):
            continue
        with contextlib.suppress(OSError):
            os.kill(int(pid_text), signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        while agent_pid_alive(int(pid_text), directory) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            if agent_pid_alive(int(pid_text), directory):
                os.kill(int(pid_text), signal.SIGKILL)
    return 0


def use_systemd() -> bool:
    if os.environ.get("GPUPLATFORM_AGENT_SUPERVISOR") == "self":
        return False
    return os.path.isdir("/run/systemd/system") and shutil.which("systemctl") is not None


def unit_text(directory: str) -> str:
    keep = ("GPUPLATFORM_AGENT_DIR", "PYTHONPATH", "DOCKER_HOST", "PATH")
    env = "".join(f'Environment="{k}={os.environ[k]}"\n' for k in keep if os.environ.get(k))
    return (
        "[Unit]\nDescription=gpuplatform node agent (VRAM quotas)\n"
        "After=docker.service\n\n[Service]\n"
        f"{env}ExecStart={sys.executable} {directory}/agent.py run\n"
        "Restart=always\nRestartSec=1\n\n[Install]\nWantedBy=multi-user.target\n"
    )


def install(directory: str, source: bytes, config: str) -> int:
    """Write this version and the platform's config, then (re)start the loop under
    systemd where the node has it, else under `supervise`."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    write_atomic(os.path.join(directory, "agent.py"), source.decode("utf-8"), 0o700)
    json.loads(config or "{}")  # refuse a broken config before anything is replaced
    write_atomic(os.path.join(directory, "config.json"), config or "{}")
    stop(directory)
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(directory, "status.json"))
    if use_systemd():
        write_atomic(UNIT_PATH, unit_text(directory), 0o644)
        for argv in (["daemon-reload"], ["enable", UNIT_NAME], ["restart", UNIT_NAME]):
            subprocess.run(["systemctl", *argv], capture_output=True, timeout=30, check=True)
        supervisor = "systemd"
    else:
        log = os.open(
            os.path.join(directory, "agent.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        subprocess.Popen(  # its own session: it outlives the SSH session that started it
            [sys.executable, os.path.join(directory, "agent.py"), "supervise"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            close_fds=True, cwd=directory,
        )  # fmt: skip
        os.close(log)
        supervisor = "self"
    deadline = time.monotonic() + 10.0
    status: Doc = {}
    while time.monotonic() < deadline and status.get("version") != VERSION:
        time.sleep(0.05)
        with contextlib.suppress(ValueError):
            status = json.loads(read_text(os.path.join(directory, "status.json")) or "{}")
    started = status.get("version") == VERSION
    said = {"schema": SCHEMA, "installed": VERSION, "started": started, "supervisor": supervisor}
    print(json.dumps(said))
    return 0 if started else 1


def report(directory: str, since: int) -> int:
    doc: Doc = {"schema": SCHEMA, "version": VERSION, "now": time.time(), "installed_version": ""}
    doc.update(status=None, alive=False, journal_id="", entries=[], more=False)
    installed = read_text(os.path.join(directory, "agent.py")) or ""
    found = re.search(r'^VERSION = "([^"]+)"', installed, re.M)
    doc["installed_version"] = found.group(1) if found else ""
    with contextlib.suppress(ValueError):
        status = json.loads(read_text(os.path.join(directory, "status.json")) or "null")
        doc["status"] = status
        alive = isinstance(status, dict) and agent_pid_alive(int(status.get("pid", 0)), directory)
        doc["alive"] = alive
    if os.path.exists(os.path.join(directory, "journal.id")):
        journal = Journal(directory)
        entries = journal.read_since(since)
        doc.update(journal_id=journal.id, entries=entries[:REPORT_LIMIT])
        doc["more"] = len(entries) > REPORT_LIMIT
    print(json.dumps(doc))
    return 0


def main(argv: list[str]) -> int:
    mode = argv[0] if argv else ""
    directory = agent_dir()
    option = {argv[i]: argv[i + 1] for i in range(1, len(argv) - 1) if argv[i].startswith("--")}
    if mode == "run":
        return run(directory)
    if mode == "supervise":
        return supervise(directory)
    if mode == "stop":
        return stop(directory)
    if mode == "report":
        return report(directory, int(option.get("--since", "0")))
    if mode == "install":
        source = globals().get("AGENT_SOURCE")
        if not isinstance(source, bytes):
            with open(os.path.abspath(__file__), "rb") as fh:
                source = fh.read()
        return install(directory, source, option.get("--config", "{}"))
    print(f"usage: agent.py run|supervise|install|report|stop (not {mode!r})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
