"""The docker CLI subset an emulated node answers (Docker 26 output formats).

run, create/start, inspect, ps, stop, kill, pause/unpause, rm, logs, port, info, version,
images, pull.
Containers are `state.Container`s; one with a GPU runs an emulated workload whose VRAM
follows its GPUPLATFORM_EMULATOR_PROFILE (see state.Workload).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from . import gotemplate
from .shell import Invocation
from .state import Container, NodeState, Workload, parse_size_mb

DOCKER_VERSION = "26.1.4"
API_VERSION = "1.45"
IMAGE_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_CMD = ["python3", "/app/main.py"]
ZERO_TIME = "0001-01-01T00:00:00Z"
_NAME_RE = re.compile(r"^/?[a-zA-Z0-9][a-zA-Z0-9_.-]+$")


class UsageError(Exception):
    def __init__(self, message: str, status: int = 125):
        super().__init__(message)
        self.status = status


# --- formatting helpers


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


def _image_ref(image: str) -> str:
    last = image.rsplit("/", 1)[-1]
    return image if (":" in last or "@" in image) else f"{image}:latest"


def _image_id(image: str) -> str:
    return "sha256:" + hashlib.sha256(_image_ref(image).encode()).hexdigest()


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


_PS_HEADERS = {
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
_PS_DEFAULT = (
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
    exposed = {cport: {} for cport, _, _ in c.ports}
    port_map: dict[str, Any] = {}
    for cport, hip, hport in c.ports:
        entries = port_map.setdefault(cport, [])
        if c.running:
            if hip in ("", "0.0.0.0"):  # noqa: S104 - text docker prints, not a bind
                entries.append({"HostIp": "0.0.0.0", "HostPort": str(hport)})  # noqa: S104
                entries.append({"HostIp": "::", "HostPort": str(hport)})
            else:
                entries.append({"HostIp": hip, "HostPort": str(hport)})
    ip_last = int(c.id[:2], 16) % 250 + 2
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
    if exposed:
        config["ExposedPorts"] = exposed
    public_hc = {k: v for k, v in hc.items() if not k.startswith("_")}
    return {
        "Id": c.id,
        "Created": rfc3339(c.created),
        "Path": c.cmd[0] if c.cmd else "",
        "Args": c.cmd[1:],
        "State": {
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
        },
        "Image": _image_id(c.image),
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
        "Config": config,
        "NetworkSettings": {
            "Bridge": "",
            "SandboxID": hashlib.sha256(c.id.encode()).hexdigest() if c.running else "",
            "Ports": port_map,
            "Gateway": "172.17.0.1" if c.running else "",
            "IPAddress": f"172.17.0.{ip_last}" if c.running else "",
            "IPPrefixLen": 16 if c.running else 0,
            "MacAddress": f"02:42:ac:11:00:{ip_last:02x}" if c.running else "",
        },
    }


# --- option parsing


@dataclass
class Flag:
    names: tuple[str, ...]
    takes_value: bool
    repeat: bool = False


@dataclass
class Parsed:
    values: dict[str, list[str]] = field(default_factory=dict)
    positional: list[str] = field(default_factory=list)

    def get(self, key: str, default: str | None = None) -> str | None:
        v = self.values.get(key)
        return v[-1] if v else default

    def all(self, key: str) -> list[str]:
        return self.values.get(key, [])

    def has(self, key: str) -> bool:
        return key in self.values


def parse_flags(cmd: str, args: list[str], flags: list[Flag], interspersed: bool) -> Parsed:
    by_name: dict[str, Flag] = {}
    for f in flags:
        for n in f.names:
            by_name[n] = f
    out = Parsed()
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            out.positional += args[i + 1 :]
            break
        if a.startswith("--") and len(a) > 2:
            name, eq, val = a[2:].partition("=")
            f = by_name.get(name)
            if f is None:
                raise UsageError(f"unknown flag: --{name}\nSee 'docker {cmd} --help'.")
            key = f.names[0]
            if f.takes_value:
                if not eq:
                    if i + 1 >= len(args):
                        raise UsageError(
                            f"flag needs an argument: --{name}\nSee 'docker {cmd} --help'."
                        )
                    i += 1
                    val = args[i]
                out.values.setdefault(key, []).append(val)
            else:
                out.values.setdefault(key, []).append(val if eq else "true")
        elif a.startswith("-") and len(a) > 1:
            j = 1
            while j < len(a):
                ch = a[j]
                f = by_name.get(ch)
                if f is None:
                    raise UsageError(
                        f"unknown shorthand flag: '{ch}' in {a}\nSee 'docker {cmd} --help'."
                    )
                key = f.names[0]
                if f.takes_value:
                    rest = a[j + 1 :]
                    if rest.startswith("="):
                        rest = rest[1:]
                    if not rest:
                        if i + 1 >= len(args):
                            raise UsageError(
                                f"flag needs an argument: '{ch}' in -{ch}\n"
                                f"See 'docker {cmd} --help'."
                            )
                        i += 1
                        rest = args[i]
                    out.values.setdefault(key, []).append(rest)
                    break
                out.values.setdefault(key, []).append("true")
                j += 1
        else:
            if not interspersed:
                out.positional += args[i:]
                break
            out.positional.append(a)
        i += 1
    return out


_V = True
_B = False
RUN_FLAGS = [
    Flag(("name",), _V),
    Flag(("gpus",), _V),
    Flag(("cpus",), _V),
    Flag(("cpu-period",), _V),
    Flag(("cpu-quota",), _V),
    Flag(("memory", "m"), _V),
    Flag(("memory-swap",), _V),
    Flag(("memory-reservation",), _V),
    Flag(("pids-limit",), _V),
    Flag(("cap-drop",), _V),
    Flag(("cap-add",), _V),
    Flag(("security-opt",), _V),
    Flag(("label", "l"), _V),
    Flag(("env", "e"), _V),
    Flag(("publish", "p"), _V),
    Flag(("runtime",), _V),
    Flag(("restart",), _V),
    Flag(("network", "net"), _V),
    Flag(("shm-size",), _V),
    Flag(("ulimit",), _V),
    Flag(("user", "u"), _V),
    Flag(("workdir", "w"), _V),
    Flag(("entrypoint",), _V),
    Flag(("hostname", "h"), _V),
    Flag(("ipc",), _V),
    Flag(("volume", "v"), _V),
    Flag(("mount",), _V),
    Flag(("log-driver",), _V),
    Flag(("log-opt",), _V),
    Flag(("stop-timeout",), _V),
    Flag(("stop-signal",), _V),
    Flag(("device",), _V),
    Flag(("tmpfs",), _V),
    Flag(("cpu-shares", "c"), _V),
    Flag(("cpuset-cpus",), _V),
    Flag(("pull",), _V),
    Flag(("platform",), _V),
    Flag(("add-host",), _V),
    Flag(("oom-score-adj",), _V),
    Flag(("group-add",), _V),
    Flag(("expose",), _V),
    Flag(("sysctl",), _V),
    Flag(("detach", "d"), _B),
    Flag(("rm",), _B),
    Flag(("interactive", "i"), _B),
    Flag(("tty", "t"), _B),
    Flag(("init",), _B),
    Flag(("read-only",), _B),
    Flag(("privileged",), _B),
    Flag(("publish-all", "P"), _B),
    Flag(("quiet", "q"), _B),
    Flag(("oom-kill-disable",), _B),
    Flag(("no-healthcheck",), _B),
]


def _parse_gpus(value: str) -> tuple[int | None, list[str] | None]:
    """docker's --gpus: (count, device ids). count -1 = all."""
    # a CSV record: `"device=0,1"` keeps its comma
    fields: list[str] = []
    cur, quoted = "", False
    for ch in value:
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            fields.append(cur)
            cur = ""
        else:
            cur += ch
    fields.append(cur)
    count: int | None = None
    devices: list[str] | None = None
    for k, f in enumerate(fields):
        key, eq, val = f.partition("=")
        if not eq:
            if k == 0 and (key == "all" or key.isdigit()):
                count = -1 if key == "all" else int(key)
                continue
            raise UsageError(
                f"invalid argument \"{value}\" for \"--gpus\" flag: unexpected key '{key}' in '{f}'"
            )
        if key == "count":
            count = -1 if val == "all" else int(val) if val.isdigit() else None
            if count is None:
                raise UsageError(
                    f'invalid argument "{value}" for "--gpus" flag: strconv.Atoi: '
                    f'parsing "{val}": invalid syntax'
                )
        elif key == "device":
            devices = [d for d in val.split(",") if d]
        elif key in ("driver", "capabilities", "options"):
            continue
        else:
            raise UsageError(
                f"invalid argument \"{value}\" for \"--gpus\" flag: unexpected key '{key}' in '{f}'"
            )
    if count is not None and devices is not None:
        raise UsageError(
            f'invalid argument "{value}" for "--gpus" flag: '
            "cannot set both Count and DeviceIDs on device request"
        )
    return count, devices


def _parse_ports(specs: list[str], node: NodeState) -> list[tuple[str, str, int]]:
    out = []
    for spec in specs:
        proto = "tcp"
        body = spec
        if "/" in body:
            body, proto = body.rsplit("/", 1)
        parts = body.split(":")
        if len(parts) == 1:
            hip, hport, cport = "", "", parts[0]
        elif len(parts) == 2:
            hip, hport, cport = "", parts[0], parts[1]
        else:
            hip, hport, cport = ":".join(parts[:-2]), parts[-2], parts[-1]
        if not cport.isdigit() or (hport and not hport.isdigit()):
            raise UsageError(
                f'invalid argument "{spec}" for "-p, --publish" flag: '
                f"Invalid containerPort: {cport}"
            )
        if not hport:
            hport = str(node_next_port(node))
        out.append((f"{cport}/{proto}", hip, int(hport)))
    return out


def node_next_port(node: NodeState) -> int:
    used = {p for c in node.containers.values() for _, _, p in c.ports}
    port = 32768
    while port in used:
        port += 1
    return port


# --- subcommands


def _no_such(inv: Invocation, ref: str) -> None:
    inv.err(f"Error response from daemon: No such container: {ref}\n")


def _run_error(inv: Invocation, message: str, status: int = 125, cmd: str = "run") -> int:
    inv.err(f"docker: {message}.\nSee 'docker {cmd} --help'.\n")
    return status


def cmd_run(node: NodeState, inv: Invocation, args: list[str], *, create_only: bool = False) -> int:
    sub = "create" if create_only else "run"
    try:
        p = parse_flags(sub, args, RUN_FLAGS, interspersed=False)
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    if not p.positional:
        inv.err(
            f"\"docker {sub}\" requires at least 1 argument.\nSee 'docker {sub} --help'.\n\n"
            f"Usage:  docker {sub} [OPTIONS] IMAGE [COMMAND] [ARG...]\n\n"
            + (
                "Create and run a new container from an image\n"
                if sub == "run"
                else "Create a new container\n"
            )
        )
        return 1
    image, cmd = p.positional[0], p.positional[1:]
    host_config: dict[str, Any] = {
        "Binds": p.all("volume") or None,
        "NetworkMode": p.get("network", "bridge"),
        "PortBindings": {},
        "RestartPolicy": {"Name": p.get("restart", "no"), "MaximumRetryCount": 0},
        "AutoRemove": p.has("rm"),
        "CapAdd": p.all("cap-add") or None,
        "CapDrop": p.all("cap-drop") or None,
        "SecurityOpt": p.all("security-opt") or None,
        "Privileged": p.has("privileged"),
        "ReadonlyRootfs": p.has("read-only"),
        "Runtime": p.get("runtime", "runc"),
        "ShmSize": 67108864,
        "NanoCpus": 0,
        "CpuPeriod": 0,
        "CpuQuota": 0,
        "Memory": 0,
        "MemorySwap": 0,
        "PidsLimit": None,
        "DeviceRequests": None,
        "Init": True if p.has("init") else None,
        "_Detach": p.has("detach") or create_only,
        "_User": p.get("user", ""),
        "_WorkingDir": p.get("workdir", ""),
    }
    cpus = p.get("cpus")
    if cpus is not None:
        try:
            host_config["NanoCpus"] = int(round(float(cpus) * 1e9))
        except ValueError:
            return _run_error(
                inv,
                f'invalid argument "{cpus}" for "--cpus" flag: '
                f"failed to parse {cpus} as a rational number",
                cmd=sub,
            )
    for flag, key in (("cpu-period", "CpuPeriod"), ("cpu-quota", "CpuQuota")):
        value = p.get(flag)
        if value is not None:
            try:
                host_config[key] = int(value)
            except ValueError:
                return _run_error(
                    inv,
                    f'invalid argument "{value}" for "--{flag}" flag: '
                    f'strconv.ParseInt: parsing "{value}": invalid syntax',
                    cmd=sub,
                )
    if host_config["NanoCpus"] and (host_config["CpuPeriod"] or host_config["CpuQuota"]):
        return _run_error(
            inv,
            "Error response from daemon: Conflicting options: Nano CPUs and CPU Period "
            "cannot both be set",
            cmd=sub,
        )
    mem = p.get("memory")
    if mem is not None:
        mb = parse_size_mb(mem if mem[-1:].isalpha() else mem + "b")
        if mb is None:
            return _run_error(
                inv,
                f'invalid argument "{mem}" for "-m, --memory" flag: invalid size: \'{mem}\'',
                cmd=sub,
            )
        host_config["Memory"] = int(mb * 1024 * 1024)
        host_config["MemorySwap"] = host_config["Memory"] * 2
    pids = p.get("pids-limit")
    if pids is not None:
        try:
            host_config["PidsLimit"] = int(pids)
        except ValueError:
            return _run_error(
                inv,
                f'invalid argument "{pids}" for "--pids-limit" flag: '
                f'strconv.ParseInt: parsing "{pids}": invalid syntax',
                cmd=sub,
            )
    env: list[str] = []
    for e in p.all("env"):
        if "=" in e:
            env.append(e)
    labels: dict[str, str] = {}
    for lab in p.all("label"):
        k, _, v = lab.partition("=")
        labels[k] = v
    gpu_request = p.get("gpus")
    count = devices = None
    if gpu_request is not None:
        try:
            count, devices = _parse_gpus(gpu_request)
        except UsageError as e:
            inv.err(f"{e}\nSee 'docker {sub} --help'.\n")
            return 125
        host_config["DeviceRequests"] = [
            {
                "Driver": "",
                "Count": count if count is not None else 0,
                "DeviceIDs": devices,
                "Capabilities": [["gpu"]],
                "Options": {},
            }
        ]
    name = p.get("name")
    with node.lock:
        node.refresh()
        try:
            ports = _parse_ports(p.all("publish"), node)
        except UsageError as e:
            inv.err(f"{e}\nSee 'docker {sub} --help'.\n")
            return 125
        for cport, hip, hport in ports:
            host_config["PortBindings"].setdefault(cport, []).append(
                {"HostIp": hip, "HostPort": str(hport) if hport else ""}
            )
        if name is not None:
            if not _NAME_RE.match(name):
                return _run_error(
                    inv,
                    f"Error response from daemon: Invalid container name ({name}), only "
                    "[a-zA-Z0-9][a-zA-Z0-9_.-] are allowed",
                    cmd=sub,
                )
            name = name.lstrip("/")
            clash = next((c for c in node.containers.values() if c.name == name), None)
            if clash is not None:
                return _run_error(
                    inv,
                    "Error response from daemon: Conflict. The container name "
                    f'"/{name}" is already '
                    f'in use by container "{clash.id}". You have to remove (or rename) that '
                    "container to be able to reuse that name",
                    cmd=sub,
                )
        if (
            node.images is not None
            and image not in node.images
            and _image_ref(image) not in {_image_ref(i) for i in node.images}
        ):
            repo = _image_ref(image).rsplit(":", 1)[0]
            inv.err(f"Unable to find image '{_image_ref(image)}' locally\n")
            return _run_error(
                inv,
                f"Error response from daemon: pull access denied for {repo}, repository does not "
                "exist or may require 'docker login': denied: requested access to the resource "
                "is denied",
                cmd=sub,
            )
        now = node.clock.now()
        # docker's merge: the image's configuration first, `--env` replaces a name in it
        given = {e.partition("=")[0] for e in env}
        own = node.image_env.get(_image_ref(image), node.image_env.get(image, []))
        env = [e for e in own if e.partition("=")[0] not in given] + env + node.run_env_extra
        c = Container(
            id=node.new_container_id(),
            name=name or node.random_name(),
            image=image,
            cmd=cmd or list(DEFAULT_CMD),
            env=env,
            labels=labels,
            created=now,
            host_config=host_config,
            ports=ports,
            gpu_request=gpu_request,
            auto_remove=p.has("rm"),
        )
        node.containers[c.id] = c
        if create_only:
            inv.out(c.id + "\n")
            return 0
        err = _resolve_device(node, c, count, devices)
        if err:
            c.exit_code = 128
            c.error = err
            return _run_error(inv, "Error response from daemon: " + err, cmd=sub)
        node.start_container(c)
        _instant_commands(node, c)
        node.refresh()
        detached = p.has("detach")
        if detached:
            inv.out(c.id + "\n")
            return 0
    # attached: wait (bounded) for the container to exit, then show its output
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with node.lock:
            node.refresh()
            if not c.running:
                break
        time.sleep(0.05)
    with node.lock:
        for _, stream, line in c.logs:
            (inv.out if stream == "stdout" else inv.err)(line + "\n")
        status = c.exit_code if not c.running else 0
        if c.auto_remove and not c.running:
            node.containers.pop(c.id, None)
    return status


def _resolve_device(
    node: NodeState, c: Container, count: int | None, devices: list[str] | None
) -> str:
    if c.gpu_request is None:
        return ""
    if devices is not None:
        picked = []
        for d in devices:
            hit = node.gpu_by_id(d)
            if hit is None:
                return (
                    "failed to create task for container: failed to create shim task: OCI runtime "
                    "create failed: runc create failed: unable to start container process: error "
                    "during container init: error running hook #0: error running hook: exit status "
                    "1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: "
                    f"device error: {d}: unknown device: unknown"
                )
            gpu, mig = hit
            picked.append((gpu.index, None if mig is None else gpu.mig_devices.index(mig)))
        if not picked:
            return ""
        c.device = picked[0]
        return ""
    n = len(node.gpus) if count in (None, -1) else count
    if n > len(node.gpus):
        return (
            "failed to create task for container: failed to create shim task: OCI runtime create "
            "failed: runc create failed: unable to start container process: error during container "
            "init: error running hook #0: error running hook: exit status 1, stdout: , stderr: "
            f"Auto-detected mode as 'legacy'\nnvidia-container-cli: device error: {n - 1}: "
            "unknown device: unknown"
        )
    if n > 0 and node.gpus:
        gpu = node.gpus[0]
        c.device = (0, 0 if gpu.mig_enabled and gpu.mig_devices else None)
    return ""


PROBE_MARKER = "# gpuplatform-probe v1"  # nodes.preflight's probe script


def _probe(node: NodeState, c: Container) -> None:
    """The platform's preflight probe: what the container would read of its own
    confinement, then its allocation of WORKLOAD_MB MiB (the workload's knob) against
    the caps the container really got."""
    hc = c.host_config
    caps = "0000000000000000" if "ALL" in (hc.get("CapDrop") or []) else "00000000a80425fb"
    nnp = "1" if "no-new-privileges" in (hc.get("SecurityOpt") or []) else "0"
    memory = str(hc.get("Memory") or "max")
    pids = str(hc.get("PidsLimit") or "max")
    quota, period = hc.get("CpuQuota") or 0, hc.get("CpuPeriod") or 100000
    cpu = f"{quota} {period}" if quota else f"max {period}"
    now = node.clock.now()
    c.log(
        now,
        "stdout",
        f"CapEff:\t{caps}\nNoNewPrivs:\t{nnp}\nmemory.max:\t{memory}\n"
        f"pids.max:\t{pids}\ncpu.max:\t{cpu}",
    )
    want = Workload.from_env(c.env_dict).base_mb
    hard = node.hard_limit(c)
    total = 0.0
    if c.device is not None:
        gpu = node.gpus[c.device[0]]
        total = float(gpu.model.memory_mb)
    code = 1 if c.device is None or want > total or (hard is not None and want > hard) else 0
    if code:
        c.log(now, "stderr", f"gpu-workload: CUDA out of memory. Tried to allocate {want:.0f} MiB")
    c.log(now, "stdout", f"alloc_exit:\t{code}")
    c.workload = None
    node.container_exit(c, now, 0)


def _instant_commands(node: NodeState, c: Container) -> None:
    """Containers whose command finishes at once (true, echo, nvidia-smi -L ...)."""
    if not c.cmd:
        return
    base = c.cmd[0].rsplit("/", 1)[-1]
    probe = base in ("sh", "bash") and len(c.cmd) > 2 and c.cmd[1] == "-c"
    if probe and c.cmd[2].startswith(PROBE_MARKER):
        _probe(node, c)
        return
    now = node.clock.now()
    if base in ("true", "false", "echo", "nvidia-smi", "exit"):
        text = ""
        code = 1 if base == "false" else 0
        if base == "echo":
            text = " ".join(c.cmd[1:])
        elif base == "nvidia-smi" and c.device is not None:
            gpu = node.gpus[c.device[0]]
            text = f"GPU 0: {gpu.model.name} (UUID: {gpu.uuid})"
            if c.device[1] is not None:
                mig = gpu.mig_devices[c.device[1]]
                text += f"\n  MIG {mig.profile.name:<11} Device  0: (UUID: {mig.uuid})"
        elif base == "nvidia-smi":
            c.log(now, "stderr", "bash: nvidia-smi: command not found")
            code = 127
        c.workload = None
        if text:
            c.log(now, "stdout", text)
        node.container_exit(c, now, code)


def cmd_ps(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags(
            "ps",
            args,
            [
                Flag(("all", "a"), _B),
                Flag(("quiet", "q"), _B),
                Flag(("no-trunc",), _B),
                Flag(("size", "s"), _B),
                Flag(("latest", "l"), _B),
                Flag(("last", "n"), _V),
                Flag(("filter", "f"), _V),
                Flag(("format",), _V),
            ],
            interspersed=True,
        )
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    if p.positional:
        inv.err(
            "\"docker ps\" accepts no arguments.\nSee 'docker ps --help'.\n\n"
            "Usage:  docker ps [OPTIONS]\n\nList containers\n"
        )
        return 1
    filters: dict[str, list[str]] = {}
    for f in p.all("filter"):
        k, eq, v = f.partition("=")
        if not eq:
            inv.err("Error response from daemon: bad format of filter (expected name=value)\n")
            return 1
        if k not in ("label", "status", "name", "id", "ancestor", "exited"):
            inv.err(f"Error response from daemon: invalid filter '{k}'\n")
            return 1
        filters.setdefault(k, []).append(v)
    trunc = not p.has("no-trunc")
    with node.lock:
        node.refresh()
        now = node.clock.now()
        items = sorted(node.containers.values(), key=lambda c: c.created, reverse=True)
        show_all = p.has("all") or "status" in filters or "exited" in filters
        if not show_all:
            items = [c for c in items if c.running]
        items = [c for c in items if _matches(c, filters)]
        if p.has("latest"):
            items = items[:1]
        elif p.get("last"):
            items = items[: int(p.get("last") or 0)]
        contexts = [(c, ps_context(c, now, trunc)) for c in items]
    fmt = p.get("format")
    if p.has("quiet") and not fmt:
        for _, ctx in contexts:
            inv.out(ctx["ID"] + "\n")
        return 0
    if fmt in (None, "", "table"):
        fmt = _PS_DEFAULT
    if fmt == "json":
        fmt = "{{json .}}"
    fmt = gotemplate.unescape_format(fmt)
    try:
        if fmt.startswith("table"):
            body = fmt[len("table") :].lstrip()
            header = gotemplate.render(body, _PS_HEADERS, {"Label": lambda k: "LABEL"})
            rows = [header.split("\t")]
            for c, ctx in contexts:
                rows.append(gotemplate.render(body, ctx, _ps_methods(c)).split("\t"))
            inv.out(tabwrite(rows))
        else:
            for c, ctx in contexts:
                inv.out(gotemplate.render(fmt, ctx, _ps_methods(c)) + "\n")
    except gotemplate.TemplateError as e:
        inv.err(f"template parsing error: template: :1: {e}\n")
        return 64
    return 0


def _ps_methods(c: Container) -> dict[str, Any]:
    return {"Label": lambda key: c.labels.get(key, "")}


def _matches(c: Container, filters: dict[str, list[str]]) -> bool:
    """Docker's filter semantics: every `label` filter must hold (AND); several values
    of any other key are alternatives (OR)."""
    for k, values in filters.items():
        if k == "label":
            for v in values:
                lk, eq, lv = v.partition("=")
                if lk not in c.labels or (eq and c.labels[lk] != lv):
                    return False
            continue
        ok = False
        for v in values:
            if k == "status":
                ok = c.state == v
            elif k == "name":
                ok = re.search(v, c.name) is not None
            elif k == "id":
                ok = c.id.startswith(v)
            elif k == "ancestor":
                ok = _image_ref(c.image) == _image_ref(v)
            elif k == "exited":
                ok = c.status == "exited" and str(c.exit_code) == v
            if ok:
                break
        if not ok:
            return False
    return True


def cmd_inspect(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags(
            "inspect",
            args,
            [Flag(("format", "f"), _V), Flag(("type",), _V), Flag(("size", "s"), _B)],
            interspersed=True,
        )
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    if not p.positional:
        inv.err(
            "\"docker inspect\" requires at least 1 argument.\nSee 'docker inspect --help'.\n\n"
            "Usage:  docker inspect [OPTIONS] NAME|ID [NAME|ID...]\n\n"
            "Return low-level information on Docker objects\n"
        )
        return 1
    docs, missing = [], []
    with node.lock:
        node.refresh()
        for ref in p.positional:
            c = node.find_container(ref)
            if c is None:
                missing.append(ref)
            else:
                docs.append(inspect_doc(node, c))
    fmt = p.get("format")
    if fmt:
        fmt = gotemplate.unescape_format(fmt)
        try:
            for d in docs:
                inv.out(gotemplate.render(fmt, d) + "\n")
        except gotemplate.TemplateError as e:
            inv.err(f"template parsing error: template: :1: {e}\n")
            return 1
    else:
        inv.out(gotemplate.go_json(docs, indent=4) + "\n" if docs else "[]\n")
    for ref in missing:
        inv.err(f"Error: No such object: {ref}\n")
    return 1 if missing else 0


def _each(node: NodeState, inv: Invocation, cmd: str, refs: list[str], action) -> int:  # type: ignore[no-untyped-def]
    if not refs:
        inv.err(f"\"docker {cmd}\" requires at least 1 argument.\nSee 'docker {cmd} --help'.\n")
        return 1
    status = 0
    with node.lock:
        node.refresh()
        for ref in refs:
            c = node.find_container(ref)
            if c is None:
                _no_such(inv, ref)
                status = 1
                continue
            err = action(c)
            if err:
                inv.err(err + "\n")
                status = 1
            else:
                inv.out(ref + "\n")
    return status


def cmd_stop(node: NodeState, inv: Invocation, args: list[str], *, kill: bool = False) -> int:
    flags = [Flag(("signal", "s"), _V)] + ([] if kill else [Flag(("time", "t"), _V)])
    try:
        p = parse_flags("kill" if kill else "stop", args, flags, interspersed=True)
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status

    def action(c: Container) -> str:
        if kill and not c.running:
            return (
                f"Error response from daemon: cannot kill container: {c.id}: "
                f"container {c.id} is not running"
            )
        node.stop_container(c, 137)
        if c.auto_remove:
            node.containers.pop(c.id, None)
        return ""

    return _each(node, inv, "kill" if kill else "stop", p.positional, action)


def cmd_start(node: NodeState, inv: Invocation, args: list[str], *, restart: bool = False) -> int:
    try:
        p = parse_flags(
            "restart" if restart else "start",
            args,
            [Flag(("attach", "a"), _B), Flag(("interactive", "i"), _B), Flag(("time", "t"), _V)],
            interspersed=True,
        )
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status

    def action(c: Container) -> str:
        if c.paused and not restart:
            return (
                "Error response from daemon: cannot start a paused container, try unpause "
                "instead\nError: failed to start containers: " + c.id
            )
        if c.running and not restart:
            return ""
        if c.running:
            node.stop_container(c, 137)
        count, devices = (None, None)
        if c.gpu_request:
            count, devices = _parse_gpus(c.gpu_request)
        err = _resolve_device(node, c, count, devices)
        if err:
            c.error = err
            return (
                "Error response from daemon: "
                + err
                + "\nError: failed to start containers: "
                + c.id
            )
        node.start_container(c)
        _instant_commands(node, c)
        return ""

    return _each(node, inv, "restart" if restart else "start", p.positional, action)


def cmd_pause(node: NodeState, inv: Invocation, args: list[str], *, unpause: bool = False) -> int:
    """`docker pause` / `docker unpause` (the cgroup freezer): a paused container keeps
    its memory, computes nothing, and its workload's clock stands still."""
    cmd = "unpause" if unpause else "pause"
    try:
        p = parse_flags(cmd, args, [], interspersed=True)
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status

    def action(c: Container) -> str:
        err = node.unpause_container(c) if unpause else node.pause_container(c)
        return f"Error response from daemon: {err}" if err else ""

    return _each(node, inv, cmd, p.positional, action)


def cmd_rm(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags(
            "rm",
            args,
            [Flag(("force", "f"), _B), Flag(("volumes", "v"), _B), Flag(("link", "l"), _B)],
            interspersed=True,
        )
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    force = p.has("force")

    def action(c: Container) -> str:
        if c.running and not force:
            return (
                f'Error response from daemon: cannot remove container "/{c.name}": container is '
                "running: stop the container before removing or force remove"
            )
        if c.running:
            node.stop_container(c, 137)
        node.containers.pop(c.id, None)
        return ""

    if force and not p.positional:
        return 0
    return _each(node, inv, "rm", p.positional, action)


def cmd_logs(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags(
            "logs",
            args,
            [
                Flag(("tail", "n"), _V),
                Flag(("timestamps", "t"), _B),
                Flag(("follow", "f"), _B),
                Flag(("since",), _V),
                Flag(("until",), _V),
                Flag(("details",), _B),
            ],
            interspersed=True,
        )
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    if len(p.positional) != 1:
        inv.err(
            "\"docker logs\" requires exactly 1 argument.\nSee 'docker logs --help'.\n\n"
            "Usage:  docker logs [OPTIONS] CONTAINER\n\nFetch the logs of a container\n"
        )
        return 1
    with node.lock:
        node.refresh()
        c = node.find_container(p.positional[0])
        if c is None:
            _no_such(inv, p.positional[0])
            return 1
        lines = list(c.logs)
    tail = p.get("tail", "all")
    if tail not in ("all", "-1", None):
        try:
            n = int(tail)
        except ValueError:
            inv.err(f'invalid argument "{tail}" for "-n, --tail" flag\n')
            return 125
        lines = lines[-n:] if n > 0 else []
    for at, stream, text in lines:
        prefix = rfc3339(at) + " " if p.has("timestamps") else ""
        (inv.out if stream == "stdout" else inv.err)(prefix + text + "\n")
    return 0


def cmd_port(node: NodeState, inv: Invocation, args: list[str]) -> int:
    if not args:
        inv.err("\"docker port\" requires at least 1 argument.\nSee 'docker port --help'.\n")
        return 1
    with node.lock:
        node.refresh()
        c = node.find_container(args[0])
        if c is None:
            inv.err(f"Error: No such container: {args[0]}\n")
            return 1
        want = args[1] if len(args) > 1 else None
        if want and "/" not in want:
            want += "/tcp"
        found = False
        for cport, hip, hport in c.ports if c.running else []:
            if want and cport != want:
                continue
            found = True
            head = "" if want else f"{cport} -> "
            if hip in ("", "0.0.0.0"):  # noqa: S104 - text docker prints, not a bind
                inv.out(f"{head}0.0.0.0:{hport}\n{head}[::]:{hport}\n")
            else:
                inv.out(f"{head}{hip}:{hport}\n")
        if want and not found:
            inv.err(f"Error: No public port '{want}' published for {args[0]}\n")
            return 1
    return 0


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
        "SecurityOptions": ["name=apparmor", "name=seccomp,profile=builtin", "name=cgroupns"],
    }


def cmd_info(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags("info", args, [Flag(("format", "f"), _V)], interspersed=True)
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    with node.lock:
        node.refresh()
        doc = info_doc(node)
    fmt = p.get("format")
    if fmt:
        if fmt == "json":
            fmt = "{{json .}}"
        try:
            inv.out(gotemplate.render(gotemplate.unescape_format(fmt), doc) + "\n")
        except gotemplate.TemplateError as e:
            inv.err(f"template parsing error: template: :1: {e}\n")
            return 1
        return 0
    inv.out(
        "Client: Docker Engine - Community\n Version:    "
        + DOCKER_VERSION
        + "\n Context:    default\n\n"
        "Server:\n"
        f" Containers: {doc['Containers']}\n  Running: {doc['ContainersRunning']}\n"
        f"  Paused: {doc['ContainersPaused']}\n"
        f"  Stopped: {doc['ContainersStopped']}\n Images: {doc['Images']}\n"
        f" Server Version: {DOCKER_VERSION}\n Storage Driver: overlay2\n Cgroup Driver: systemd\n"
        " Cgroup Version: 2\n Runtimes: io.containerd.runc.v2 nvidia runc\n Default Runtime: runc\n"
        f" Kernel Version: {doc['KernelVersion']}\n Operating System: {doc['OperatingSystem']}\n"
        f" Architecture: x86_64\n CPUs: 64\n Name: {node.name}\n"
    )
    return 0


def cmd_version(node: NodeState, inv: Invocation, args: list[str]) -> int:
    try:
        p = parse_flags("version", args, [Flag(("format", "f"), _V)], interspersed=True)
    except UsageError as e:
        inv.err(f"{e}\n")
        return e.status
    doc = {
        "Client": {
            "Version": DOCKER_VERSION,
            "ApiVersion": API_VERSION,
            "Os": "linux",
            "Arch": "amd64",
        },
        "Server": {
            "Version": DOCKER_VERSION,
            "ApiVersion": API_VERSION,
            "MinAPIVersion": "1.24",
            "Os": "linux",
            "Arch": "amd64",
            "KernelVersion": "5.15.0-105-generic",
        },
    }
    fmt = p.get("format")
    if fmt:
        inv.out(gotemplate.render(gotemplate.unescape_format(fmt), doc) + "\n")
        return 0
    inv.out(
        f"Client: Docker Engine - Community\n Version:           {DOCKER_VERSION}\n"
        f" API version:       {API_VERSION}\n\nServer: Docker Engine - Community\n Engine:\n"
        f"  Version:          {DOCKER_VERSION}\n"
        f"  API version:      {API_VERSION} (minimum version 1.24)\n"
    )
    return 0


def cmd_images(node: NodeState, inv: Invocation, args: list[str]) -> int:
    quiet = "-q" in args or "--quiet" in args
    with node.lock:
        images = sorted(
            {_image_ref(c.image) for c in node.containers.values()}
            | {_image_ref(i) for i in (node.images or set())}
        )
    rows = [["REPOSITORY", "TAG", "IMAGE ID", "CREATED", "SIZE"]]
    for ref in images:
        repo, _, tag = ref.rpartition(":")
        iid = _image_id(ref)[7:19]
        if quiet:
            inv.out(iid + "\n")
        rows.append([repo, tag, iid, "2 weeks ago", "8.52GB"])
    if not quiet:
        inv.out(tabwrite(rows))
    return 0


def cmd_image_inspect(node: NodeState, inv: Invocation, args: list[str]) -> int:
    refs = [a for a in args if not a.startswith("-")]
    if not refs:
        inv.err('"docker image inspect" requires at least 1 argument.\n')
        return 1
    docs, status = [], 0
    with node.lock:
        present = None if node.images is None else {_image_ref(i) for i in node.images}
        for raw in refs:
            ref = _image_ref(raw)
            if present is not None and ref not in present:
                inv.err(f"Error response from daemon: No such image: {raw}\n")
                status = 1
                continue
            own = node.image_env.get(ref, node.image_env.get(raw, []))
            docs.append(
                {
                    "Id": _image_id(ref),
                    "RepoTags": [ref],
                    "RepoDigests": [
                        f"{ref.rsplit(':', 1)[0]}@sha256:{hashlib.sha256(ref.encode()).hexdigest()}"
                    ],
                    "Config": {"Env": [IMAGE_PATH, *own], "Cmd": list(DEFAULT_CMD)},
                }
            )
    fmt = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--format", "-f")), None)
    if fmt:
        for doc in docs:
            inv.out(gotemplate.render(gotemplate.unescape_format(fmt), doc) + "\n")
    else:
        inv.out(json.dumps(docs, indent=4) + "\n")
    return status


def cmd_pull(node: NodeState, inv: Invocation, args: list[str]) -> int:
    refs = [a for a in args if not a.startswith("-")]
    if len(refs) != 1:
        inv.err("\"docker pull\" requires exactly 1 argument.\nSee 'docker pull --help'.\n")
        return 1
    ref = _image_ref(refs[0])
    with node.lock:
        if node.images is not None and ref not in {_image_ref(i) for i in node.images}:
            repo = ref.rsplit(":", 1)[0]
            inv.err(
                f"Error response from daemon: pull access denied for {repo}, repository does "
                "not exist or may require 'docker login': denied: requested access to the "
                "resource is denied\n"
            )
            return 1
    tag = ref.rsplit(":", 1)[1]
    digest = hashlib.sha256(ref.encode()).hexdigest()
    inv.out(
        f"{tag}: Pulling from {ref.rsplit(':', 1)[0]}\nDigest: sha256:{digest}\n"
        f"Status: Image is up to date for {ref}\n"
        f"{ref if '/' in ref else 'docker.io/library/' + ref}\n"
    )
    return 0


_SUBCOMMANDS = {
    "run": cmd_run,
    "ps": cmd_ps,
    "inspect": cmd_inspect,
    "stop": cmd_stop,
    "kill": lambda n, i, a: cmd_stop(n, i, a, kill=True),
    "rm": cmd_rm,
    "pause": cmd_pause,
    "unpause": lambda n, i, a: cmd_pause(n, i, a, unpause=True),
    "logs": cmd_logs,
    "start": cmd_start,
    "restart": lambda n, i, a: cmd_start(n, i, a, restart=True),
    "create": lambda n, i, a: cmd_run(n, i, a, create_only=True),
    "port": cmd_port,
    "info": cmd_info,
    "version": cmd_version,
    "images": cmd_images,
    "pull": cmd_pull,
    "image inspect": cmd_image_inspect,
}
_CONTAINER_ALIASES = {"ls": "ps", "list": "ps"}


def cmd_docker(node: NodeState, inv: Invocation) -> int:
    args = inv.argv[1:]
    while args and args[0] in ("--debug", "-D"):
        args = args[1:]
    if not args or args[0] in ("--help", "-h", "help"):
        inv.out("\nUsage:  docker [OPTIONS] COMMAND\n\nA self-sufficient runtime for containers\n")
        return 0
    if args[0] in ("--version", "-v"):
        inv.out(f"Docker version {DOCKER_VERSION}, build 5650f9b\n")
        return 0
    sub, rest = args[0], args[1:]
    if sub == "container" and rest:
        sub, rest = _CONTAINER_ALIASES.get(rest[0], rest[0]), rest[1:]
    elif sub == "image" and rest:
        sub, rest = (
            {"ls": "images", "list": "images", "pull": "pull"}.get(rest[0], "image " + rest[0]),
            rest[1:],
        )
    handler = _SUBCOMMANDS.get(sub)
    if handler is None:
        inv.err(f"docker: '{sub}' is not a docker command.\nSee 'docker --help'\n")
        return 1
    return handler(node, inv, rest)
