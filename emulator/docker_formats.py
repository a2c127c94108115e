"""What the emulated docker CLI prints, in Docker 26's formats: timestamps and durations,
image references, `ps` rows and table, the `inspect` and `info` documents, errors."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from .containers import Container
from .shell import Invocation
from .state import NodeState

DOCKER_VERSION = "26.1.4"
API_VERSION = "1.45"
IMAGE_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_CMD = ["python3", "/app/main.py"]
ZERO_TIME = "0001-01-01T00:00:00Z"


def rfc3339(ts: float | None) -> str:
    if ts is None:
        return ZERO_TIME
    dt = datetime.fromtimestamp(ts, UTC)
    frac = f"{dt.microsecond * 1000:09d}".rstrip("0")
    return dt.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def human_duration(seconds: float) -> str:
    """github.com/docker/go-units HumanDuration."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    minutes = int(seconds / 60)
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = int(seconds / 3600 + 0.5)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{hours // 24 // 365} years"


def image_ref(image: str) -> str:
    last = image.rsplit("/", 1)[-1]
    return image if (":" in last or "@" in image) else f"{image}:latest"


def image_id(image: str) -> str:
    return "sha256:" + hashlib.sha256(image_ref(image).encode()).hexdigest()


def _status_text(c: Container, now: float) -> str:
    if c.status == "running":
        up = "Up " + human_duration(now - (c.started or now))
        return up + " (Paused)" if c.paused else up
    if c.status == "exited":
        return f"Exited ({c.exit_code}) {human_duration(now - (c.finished or now))} ago"
    return "Created"


def _ports_text(c: Container) -> str:
    parts = []
    for cport, hip, hport in c.ports:
        if hip in ("", "0.0.0.0"):  # noqa: S104 - text docker prints, not a bind
            parts.append(f"0.0.0.0:{hport}->{cport}")
            parts.append(f":::{hport}->{cport}")
        else:
            parts.append(f"{hip}:{hport}->{cport}")
    return ", ".join(parts)


def _command_text(c: Container, trunc: bool) -> str:
    cmd = " ".join(c.cmd)
    if trunc and len(cmd) > 20:
        cmd = cmd[:19] + "…"
    return '"' + cmd.replace("\\", "\\\\").replace('"', '\\"') + '"'


def ps_context(c: Container, now: float, trunc: bool) -> dict[str, Any]:
    created = datetime.fromtimestamp(int(c.created), UTC).strftime("%Y-%m-%d %H:%M:%S +0000 UTC")
    return {
        "Command": _command_text(c, trunc),
        "CreatedAt": created,
        "ID": c.id[:12] if trunc else c.id,
        "Image": c.image,
        "Labels": ",".join(f"{k}={v}" for k, v in sorted(c.labels.items())),
        "LocalVolumes": "0",
        "Mounts": "",
        "Names": c.name,
        "Networks": "bridge",
        "Ports": _ports_text(c),
        "RunningFor": human_duration(now - c.created) + " ago",
        "Size": "0B",
        "State": c.state,
        "Status": _status_text(c, now),
    }


PS_HEADERS = {
    "Command": "COMMAND",
    "CreatedAt": "CREATED AT",
    "ID": "CONTAINER ID",
    "Image": "IMAGE",
    "Labels": "LABELS",
    "LocalVolumes": "LOCAL VOLUMES",
    "Mounts": "MOUNTS",
    "Names": "NAMES",
    "Networks": "NETWORKS",
    "Ports": "PORTS",
    "RunningFor": "CREATED",
    "Size": "SIZE",
    "State": "STATE",
    "Status": "STATUS",
}
PS_DEFAULT = (
    "table {{.ID}}\t{{.Image}}\t{{.Command}}\t{{.RunningFor}}\t{{.Status}}\t{{.Ports}}\t{{.Names}}"
)


def tabwrite(rows: list[list[str]], minwidth: int = 10, padding: int = 3) -> str:
    """Go text/tabwriter as docker configures it (minwidth 10, padding 3)."""
    if not rows:
        return ""
    ncols = max(len(r) for r in rows)
    widths = [0] * ncols
    for r in rows:
        for k, cell in enumerate(r[:-1]):
            widths[k] = max(widths[k], len(cell) + padding, minwidth)
    out = []
    for r in rows:
        line = "".join(
            cell.ljust(widths[k]) if k < len(r) - 1 else cell for k, cell in enumerate(r)
        )
        out.append(line)
    return "\n".join(out) + "\n"


def inspect_doc(node: NodeState, c: Container) -> dict[str, Any]:
    hc = c.host_config
    public_hc = {k: v for k, v in hc.items() if not k.startswith("_")}
    return {
        "Id": c.id,
        "Created": rfc3339(c.created),
        "Path": c.cmd[0] if c.cmd else "",
        "Args": c.cmd[1:],
        "State": _inspect_state(c),
        "Image": image_id(c.image),
        "ResolvConfPath": f"/var/lib/docker/containers/{c.id}/resolv.conf",
        "HostnamePath": f"/var/lib/docker/containers/{c.id}/hostname",
        "HostsPath": f"/var/lib/docker/containers/{c.id}/hosts",
        "LogPath": f"/var/lib/docker/containers/{c.id}/{c.id}-json.log",
        "Name": "/" + c.name,
        "RestartCount": c.restart_count,
        "Driver": "overlay2",
        "Platform": "linux",
        "MountLabel": "",
        "ProcessLabel": "",
        "AppArmorProfile": "docker-default",
        "ExecIDs": None,
        "HostConfig": public_hc,
        "Mounts": [],
        "Config": _inspect_config(c),
        "NetworkSettings": _network_settings(c),
    }


def _inspect_state(c: Container) -> dict[str, Any]:
    return {
        "Status": c.state,
        "Running": c.running,
        "Paused": c.paused,
        "Restarting": False,
        "OOMKilled": c.oom_killed,
        "Dead": False,
        "Pid": c.pid if c.running else 0,
        "ExitCode": c.exit_code,
        "Error": c.error,
        "StartedAt": rfc3339(c.started),
        "FinishedAt": rfc3339(c.finished),
    }


def _inspect_config(c: Container) -> dict[str, Any]:
    hc = c.host_config
    config: dict[str, Any] = {
        "Hostname": c.id[:12],
        "Domainname": "",
        "User": hc.get("_User", ""),
        "AttachStdin": False,
        "AttachStdout": not hc.get("_Detach", True),
        "AttachStderr": not hc.get("_Detach", True),
        "Tty": False,
        "OpenStdin": False,
        "StdinOnce": False,
        "Env": c.env + [IMAGE_PATH],
        "Cmd": c.cmd,
        "Image": c.image,
        "Volumes": None,
        "WorkingDir": hc.get("_WorkingDir", ""),
        "Entrypoint": None,
        "OnBuild": None,
        "Labels": dict(c.labels),
    }
    exposed: dict[str, dict[str, Any]] = {cport: {} for cport, _, _ in c.ports}
    if exposed:
        config["ExposedPorts"] = exposed
    return config


def _network_settings(c: Container) -> dict[str, Any]:
    """The bridge network's view: an address and published ports only while it runs."""
    port_map: dict[str, list[dict[str, str]]] = {}
    for cport, hip, hport in c.ports:
        entries = port_map.setdefault(cport, [])
        if c.running:
            if hip in ("", "0.0.0.0"):  # noqa: S104 - text docker prints, not a bind
                entries.append({"HostIp": "0.0.0.0", "HostPort": str(hport)})  # noqa: S104
                entries.append({"HostIp": "::", "HostPort": str(hport)})
            else:
                entries.append({"HostIp": hip, "HostPort": str(hport)})
    ip_last = int(c.id[:2], 16) % 250 + 2
    return {
        "Bridge": "",
        "SandboxID": hashlib.sha256(c.id.encode()).hexdigest() if c.running else "",
        "Ports": port_map,
        "Gateway": "172.17.0.1" if c.running else "",
        "IPAddress": f"172.17.0.{ip_last}" if c.running else "",
        "IPPrefixLen": 16 if c.running else 0,
        "MacAddress": f"02:42:ac:11:00:{ip_last:02x}" if c.running else "",
    }


def info_doc(node: NodeState) -> dict[str, Any]:
    cs = list(node.containers.values())
    return {
        "ID": "ZQ7N:" + node.name.upper(),
        "Containers": len(cs),
        "ContainersRunning": sum(c.running and not c.paused for c in cs),
        "ContainersPaused": sum(c.paused for c in cs),
        "ContainersStopped": sum(not c.running for c in cs),
        "Images": len({c.image for c in cs} | (node.images or set())),
        "Driver": "overlay2",
        "DockerRootDir": "/var/lib/docker",
        "CgroupDriver": "systemd",
        "CgroupVersion": "2",
        "KernelVersion": "5.15.0-105-generic",
        "OperatingSystem": "Ubuntu 22.04.4 LTS",
        "OSType": "linux",
        "Architecture": "x86_64",
        "NCPU": 64,
        "MemTotal": 540_965_625_856,
        "Name": node.name,
        "ServerVersion": DOCKER_VERSION,
        "Runtimes": {
            "io.containerd.runc.v2": {"path": "runc"},
            "nvidia": {"path": "nvidia-container-runtime"},
            "runc": {"path": "runc"},
        },
        "DefaultRuntime": "runc",
        "Swarm": {"LocalNodeState": "inactive"},
        "RuncCommit": {"ID": node.runc_build or node.runc_version},
        "SecurityOptions": [
            "name=apparmor",
            "name=seccomp,profile=builtin",
            *(["name=userns"] if node.userns_remap else []),
            "name=cgroupns",
        ],
    }


def no_such_container(inv: Invocation, ref: str) -> None:
    inv.err(f"Error response from daemon: No such container: {ref}\n")
